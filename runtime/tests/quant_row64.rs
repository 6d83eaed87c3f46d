//! row64 (reference §4.3): pack then unpack is the identity on random blocks; sizes are
//! unchanged for whole row groups and padded otherwise; and every code, scale and `d`
//! sits where the layout's address formulas say (read back here independently of `pack`).

use lode_runtime::quant::row64::{layout_name, pack, packed_len, padded_rows, unpack};
use lode_runtime::quant::GgmlType;
use proptest::prelude::*;

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 56) as u8
        })
        .collect()
}

/// Q4_K: code of element `e` (0..256) of K-block `b` of `row`, from the stored layout.
fn q4k_code_stored(src: &[u8], nkb: usize, row: usize, b: usize, e: usize) -> u8 {
    let blk = &src[(row * nkb + b) * 144..];
    let (c, l) = (e / 64, e % 64);
    let byte = blk[16 + 32 * c + l % 32];
    if l < 32 {
        byte & 15
    } else {
        byte >> 4
    }
}

/// Q4_K: the same code from the packed layout, by §4.3's address formula.
fn q4k_code_packed(p: &[u8], nkb: usize, row: usize, b: usize, e: usize) -> u8 {
    let (g, lane) = (row / 64, row % 64);
    let tile = (g * nkb + b) * 64 * 144;
    let (j, ej) = (e / 32, e % 32);
    let byte = p[tile + (1 + j) * 64 * 16 + lane * 16 + ej / 2];
    if ej % 2 == 0 {
        byte & 15
    } else {
        byte >> 4
    }
}

fn check_q4k_addresses(src: &[u8], p: &[u8], rows: usize, nkb: usize) -> Result<(), TestCaseError> {
    for row in 0..rows {
        for b in 0..nkb {
            let tile = ((row / 64) * nkb + b) * 64 * 144;
            let head = &p[tile + (row % 64) * 16..][..16];
            prop_assert_eq!(head, &src[(row * nkb + b) * 144..][..16]);
            for e in 0..256 {
                prop_assert_eq!(
                    q4k_code_stored(src, nkb, row, b, e),
                    q4k_code_packed(p, nkb, row, b, e)
                );
            }
        }
    }
    Ok(())
}

fn check_q6k_addresses(src: &[u8], p: &[u8], rows: usize, nkb: usize) -> Result<(), TestCaseError> {
    for row in 0..rows {
        for b in 0..nkb {
            let (g, lane) = (row / 64, row % 64);
            let tile = (g * nkb + b) * 64 * 210;
            let blk = &src[(row * nkb + b) * 210..][..210];
            prop_assert_eq!(&p[tile + lane * 2..][..2], &blk[208..210]);
            for s in 0..16 {
                let at = tile + 128 + ((s / 2) * 64 + lane) * 2 + s % 2;
                prop_assert_eq!(p[at], blk[192 + s]);
            }
            let raw = tile + 128 + 1024;
            for h in 0..2 {
                let fields = [
                    &blk[64 * h..][..32],
                    &blk[64 * h + 32..][..32],
                    &blk[128 + 32 * h..][..32],
                ];
                for (f, want) in fields.iter().enumerate() {
                    prop_assert_eq!(&p[raw + ((h * 3 + f) * 64 + lane) * 32..][..32], *want);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn pack_then_unpack_is_identity(rows in 1usize..200, kb in 1usize..4, seed in any::<u64>()) {
        for ty in [GgmlType::Q4_K, GgmlType::Q6_K] {
            let k = 256 * kb;
            let src = random_bytes(rows * kb * ty.block_bytes(), seed);
            let n = packed_len(ty, rows, k).unwrap();
            prop_assert_eq!(n, padded_rows(rows) * kb * ty.block_bytes());
            if rows % 64 == 0 {
                prop_assert_eq!(n, src.len());
            }
            let mut p = vec![0xAAu8; n];
            pack(ty, &src, rows, k, &mut p).unwrap();
            let mut back = vec![0u8; src.len()];
            unpack(ty, &p, rows, k, &mut back).unwrap();
            prop_assert_eq!(&back, &src);
            match ty {
                GgmlType::Q4_K => check_q4k_addresses(&src, &p, rows, kb)?,
                _ => check_q6k_addresses(&src, &p, rows, kb)?,
            }
            // Padding lanes are zero blocks.
            let bb = ty.block_bytes();
            let mut all = vec![0u8; padded_rows(rows) * kb * bb];
            unpack(ty, &p, padded_rows(rows), k, &mut all).unwrap();
            prop_assert!(all[rows * kb * bb..].iter().all(|&v| v == 0), "padding rows not zero");
        }
    }
}

#[test]
fn other_types_and_shapes_are_errors() {
    assert_eq!(layout_name(GgmlType::Q4_K), Some("q4k-i4-k32-row64"));
    assert_eq!(layout_name(GgmlType::Q6_K), Some("q6k-packed-k256-row64"));
    assert!(packed_len(GgmlType::Q5_K, 64, 256).is_err());
    assert!(packed_len(GgmlType::Q4_K, 64, 128).is_err());
    let mut d = vec![0u8; 144 * 64];
    assert!(pack(GgmlType::Q4_K, &[0u8; 100], 64, 256, &mut d).is_err());
    assert!(unpack(GgmlType::Q4_K, &[0u8; 100], 64, 256, &mut d).is_err());
}
