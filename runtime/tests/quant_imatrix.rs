//! The importance-weighted quantizers (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M,
//! IQ4_NL, IQ4_XS, Q4_0, Q5_0, Q4_1, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and Q8_0's weight
//! quantizer: byte-identical with llama.cpp's `quantize_iq3_xxs` / `quantize_q4_K` / … on the rows and
//! weights of `tests/data/quant-ref/` (`ci/llama_quant_ref.sh` wrote the reference hashes),
//! a round trip whose error the weights shape, and the refusals.

use std::path::PathBuf;

use lode_runtime::quant::{dequantize, quantize, quantize_weighted, GgmlType, QuantError};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/quant-ref")
}

fn f32s(name: &str) -> Vec<f32> {
    std::fs::read(dir().join(name)).unwrap().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn quant(ty: GgmlType, x: &[f32], w: Option<&[f32]>) -> Vec<u8> {
    let mut q = vec![0u8; x.len() / ty.block_elems() * ty.block_bytes()];
    assert!(quantize_weighted(ty, x, &mut q, w).unwrap());
    q
}

#[test]
fn grid_quantizers_match_llama_cpp() {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir().join("llama-ref.json")).unwrap()).unwrap();
    let mut checked = 0;
    for (key, e) in r["types"].as_object().unwrap() {
        let ty = GgmlType::from_name(e["type"].as_str().unwrap()).unwrap();
        let x = f32s(e["input"].as_str().unwrap());
        let w = e["weights"].as_str().map(f32s);
        assert_eq!(w.as_ref().map_or(1024, Vec::len), e["row_len"].as_u64().unwrap() as usize);
        let q = quant(ty, &x, w.as_deref());
        let got = format!("{:x}", Sha256::digest(&q));
        assert_eq!(got, e["quant_sha256"].as_str().unwrap(), "{key}");
        checked += 1;
    }
    assert_eq!(checked, 25);
}

/// Relative RMS error of the round trip, weighted by `w` per column.
fn werr(ty: GgmlType, x: &[f32], w: Option<&[f32]>, score: &[f32]) -> f64 {
    let q = quant(ty, x, w);
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    let (mut e, mut s) = (0f64, 0f64);
    for (i, (a, b)) in x.iter().zip(&y).enumerate() {
        let c = score[i % score.len()] as f64;
        e += c * (*a as f64 - *b as f64).powi(2);
        s += c * (*a as f64).powi(2);
    }
    (e / s).sqrt()
}

/// Gaussian rows: each type's error lands in its bit budget's band, and the importance
/// weights lower the error where they are large (scored by those same weights).
#[test]
fn weighted_round_trip_error() {
    let mut seed = 0x2545F4914F6CDD1Du64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 11) as f64 / (1u64 << 53) as f64
    };
    let x: Vec<f32> = (0..256 * 64).map(|_| ((-2.0 * next().max(1e-12).ln()).sqrt() * (6.283185307 * next()).cos()) as f32).collect();
    let w: Vec<f32> = (0..1024).map(|i| if i % 8 == 0 { 100.0 } else { 0.01 }).collect();
    let flat = vec![1f32; 1024];
    for (ty, lo, hi) in [(GgmlType::IQ3_XXS, 0.12, 0.22), (GgmlType::IQ2_S, 0.18, 0.33), (GgmlType::IQ2_XS, 0.2, 0.36), (GgmlType::IQ2_XXS, 0.24, 0.42), (GgmlType::IQ1_M, 0.3, 0.55), (GgmlType::IQ1_S, 0.33, 0.6)] {
        let plain = werr(ty, &x, Some(&flat), &flat);
        assert!(plain > lo && plain < hi, "{ty}: relative error {plain}");
        let (weighted, unweighted) = (werr(ty, &x, Some(&w), &w), werr(ty, &x, Some(&flat), &w));
        assert!(weighted < 0.9 * unweighted, "{ty}: weighted {weighted}, unweighted {unweighted}");
    }
}

#[test]
fn refusals_are_errors() {
    let x = vec![0.5f32; 256];
    let mut q = vec![0u8; 66];
    assert!(matches!(quantize(GgmlType::IQ2_XXS, &x, &mut q), Err(QuantError::NeedsImatrix(GgmlType::IQ2_XXS))));
    assert!(matches!(quantize(GgmlType::IQ1_S, &x, &mut [0u8; 50]), Err(QuantError::NeedsImatrix(GgmlType::IQ1_S))));
    let short = vec![1f32; 100];
    assert!(matches!(quantize_weighted(GgmlType::IQ2_XXS, &x, &mut q, Some(&short)), Err(QuantError::ImatrixLen { .. })));
    let mut bad = x.clone();
    bad[7] = f32::NAN;
    assert!(matches!(quantize_weighted(GgmlType::IQ2_XXS, &bad, &mut q, Some(&x)), Err(QuantError::NonFiniteInput { .. })));
    // IQ3_XXS, IQ2_S and IQ1_M work without weights, as llama.cpp's quantizers do.
    for ty in [GgmlType::IQ3_XXS, GgmlType::IQ2_S, GgmlType::IQ1_M] {
        quantize(ty, &x, &mut vec![0u8; ty.block_bytes()]).unwrap();
    }
}
