//! The codebooks of the IQ3 / IQ2 / IQ1 types as byte tables: entry `i` of a grid is one
//! word whose byte `j` is value `j` of the entry (IQ3: 4 values in a `u32`; IQ2 and IQ1:
//! 8 in a `u64`, IQ1's signed −1 / 0 / 1). Expanded at compile time from gguf-py 0.19.0's
//! packed form (`iq_grids_data.rs`, written by `ci/gguf_iq_grids.py`), which also writes
//! the GPU's copy (`kernels-hip/iq_grids.h`; the test below compares the two).

use super::iq_grids_data::*;

/// Entries of 4 values, a 4-bit level index each (bits 4j..4j+3).
const fn expand4<const N: usize>(p: &[u16; N], levels: &[i8; 8]) -> [u32; N] {
    let mut out = [0u32; N];
    let mut i = 0;
    while i < N {
        let mut j = 0;
        while j < 4 {
            let v = levels[((p[i] >> (4 * j)) & 7) as usize] as u8;
            out[i] |= (v as u32) << (8 * j);
            j += 1;
        }
        i += 1;
    }
    out
}

/// Entries of 8 values, a 2-bit level index each (bits 2j, 2j + 1).
const fn expand8<const N: usize>(p: &[u16; N], levels: &[i8; 3]) -> [u64; N] {
    let mut out = [0u64; N];
    let mut i = 0;
    while i < N {
        let mut j = 0;
        while j < 8 {
            let v = levels[((p[i] >> (2 * j)) & 3) as usize] as u8;
            out[i] |= (v as u64) << (8 * j);
            j += 1;
        }
        i += 1;
    }
    out
}

/// ggml's `iq3s_grid`: values 1, 3, …, 15.
pub(crate) static IQ3S_GRID: [u32; 512] = expand4(&IQ3S_PACKED, &IQ3S_LEVELS);
/// `iq3xxs_grid`: values 4, 12, …, 52, 62.
pub(crate) static IQ3XXS_GRID: [u32; 256] = expand4(&IQ3XXS_PACKED, &IQ3XXS_LEVELS);
/// `iq2xxs_grid`: values 8, 25, 43.
pub(crate) static IQ2XXS_GRID: [u64; 256] = expand8(&IQ2XXS_PACKED, &IQ2XXS_LEVELS);
/// `iq2xs_grid`.
pub(crate) static IQ2XS_GRID: [u64; 512] = expand8(&IQ2XS_PACKED, &IQ2XS_LEVELS);
/// `iq2s_grid`.
pub(crate) static IQ2S_GRID: [u64; 1024] = expand8(&IQ2S_PACKED, &IQ2S_LEVELS);
/// `iq1s_grid` (signed bytes −1, 0, 1).
pub(crate) static IQ1S_GRID: [u64; 2048] = expand8(&IQ1S_PACKED, &IQ1S_LEVELS);

/// `ksigns_iq2xs`: 7 sign bits and an eighth that makes the count of set bits even.
pub(crate) static KSIGNS: [u8; 128] = {
    let mut out = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        out[i] = i as u8 | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    out
};

/// Byte `j` of a grid word.
#[inline(always)]
pub(crate) fn byte(word: u64, j: usize) -> u8 {
    (word >> (8 * j)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words of the C array `name[...] = { ... };` in the GPU header.
    fn header_table(h: &str, name: &str) -> Vec<u64> {
        let start = h.find(&format!(" {name}[")).unwrap_or_else(|| panic!("{name} not in iq_grids.h"));
        let body = &h[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        body.split(',')
            .map(|t| t.trim().trim_end_matches("ull").trim_end_matches('u'))
            .filter(|t| !t.is_empty())
            .map(|t| u64::from_str_radix(t.trim_start_matches("0x"), 16).unwrap())
            .collect()
    }

    #[test]
    fn gpu_header_holds_the_same_tables() {
        let h = include_str!("../../../kernels-hip/iq_grids.h");
        let w32 = |t: &[u32]| t.iter().map(|&v| v as u64).collect::<Vec<_>>();
        assert_eq!(header_table(h, "iq3s_grid"), w32(&IQ3S_GRID));
        assert_eq!(header_table(h, "iq3xxs_grid"), w32(&IQ3XXS_GRID));
        assert_eq!(header_table(h, "iq2xxs_grid"), IQ2XXS_GRID.to_vec());
        assert_eq!(header_table(h, "iq2xs_grid"), IQ2XS_GRID.to_vec());
        assert_eq!(header_table(h, "iq2s_grid"), IQ2S_GRID.to_vec());
        assert_eq!(header_table(h, "iq1s_grid"), IQ1S_GRID.to_vec());
        assert_eq!(header_table(h, "iq_ksigns"), KSIGNS.iter().map(|&v| v as u64).collect::<Vec<_>>());
    }

    #[test]
    fn a_few_entries_by_hand() {
        // ggml-common.h's first entries, and sign bytes 0x00, 0x81, 0x82, 0x03.
        assert_eq!(&IQ3S_GRID[..3], &[0x01010101, 0x01010103, 0x01010105]);
        assert_eq!(IQ1S_GRID[1], 0xffffffffffffff01);
        assert_eq!(IQ2XXS_GRID[0], 0x0808080808080808);
        assert_eq!(&KSIGNS[..4], &[0x00, 0x81, 0x82, 0x03]);
    }
}
