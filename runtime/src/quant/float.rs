//! The float element types: F32, F16 (IEEE binary16) and BF16 (upper half of an f32),
//! plus the little-endian field readers every block format uses.
//!
//! Conversions follow ggml: F16 rounds to nearest-even (what `_cvtss_sh` does); BF16
//! rounds to nearest-even and turns NaN into a quiet NaN (reference §2.2). The scalar
//! dots accumulate in f64 like ggml's generic `ggml_vec_dot_{f32,f16,bf16}`.

use half::f16;

/// The f16 field at byte `off` of `b`, widened to f32.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// The f32 field at byte `off` of `b`.
#[inline(always)]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// f32 → f16 bits, round to nearest-even (ggml's `GGML_FP32_TO_FP16`).
#[inline(always)]
pub(crate) fn f16_bits(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_bits().to_le_bytes()
}

/// f32 → bf16 bits, round to nearest-even; NaN becomes a quiet NaN (ggml's
/// `ggml_compute_fp32_to_bf16`).
#[inline(always)]
pub(crate) fn bf16_from_f32(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// bf16 bits → f32 (exact).
#[inline(always)]
pub(crate) fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

// ---- dequantize --------------------------------------------------------------------

pub(crate) fn dequant_f32(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

pub(crate) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f32();
    }
}

pub(crate) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = bf16_to_f32(u16::from_le_bytes([s[0], s[1]]));
    }
}

// ---- quantize ----------------------------------------------------------------------

pub(crate) fn quant_f32(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(4)) {
        d.copy_from_slice(&s.to_le_bytes());
    }
}

pub(crate) fn quant_f16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&f16_bits(*s));
    }
}

pub(crate) fn quant_bf16(src: &[f32], dst: &mut [u8]) {
    for (s, d) in src.iter().zip(dst.chunks_exact_mut(2)) {
        d.copy_from_slice(&bf16_from_f32(*s).to_le_bytes());
    }
}

// ---- dots (scalar reference) --------------------------------------------------------

/// Σ w·x over `n` f32 pairs, summed in f64 (ggml's generic `ggml_vec_dot_f32`).
pub(crate) fn dot_f32(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for (a, b) in w[..4 * n].chunks_exact(4).zip(x.chunks_exact(4)) {
        let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        s += (a * b) as f64;
    }
    s as f32
}

/// Σ w·x over `n` f16 pairs: products in f32, summed in f64 (`ggml_vec_dot_f16`).
pub(crate) fn dot_f16(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for (a, b) in w[..2 * n].chunks_exact(2).zip(x.chunks_exact(2)) {
        let a = f16::from_bits(u16::from_le_bytes([a[0], a[1]])).to_f32();
        let b = f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        s += (a * b) as f64;
    }
    s as f32
}

/// Σ w·x over `n` bf16 pairs: products in f32, summed in f64 (`ggml_vec_dot_bf16`).
pub(crate) fn dot_bf16(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut s = 0f64;
    for (a, b) in w[..2 * n].chunks_exact(2).zip(x.chunks_exact(2)) {
        let a = bf16_to_f32(u16::from_le_bytes([a[0], a[1]]));
        let b = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
        s += (a * b) as f64;
    }
    s as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        // 1.0 + 2^-8 lies exactly between two bf16 values: ties go to the even one (1.0).
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        // 1.0 + 3·2^-8 is a tie between 0x3f81 and 0x3f82: even is 0x3f82.
        assert_eq!(bf16_from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        let qnan = bf16_from_f32(f32::from_bits(0x7f80_0001));
        assert!(bf16_to_f32(qnan).is_nan());
        assert_eq!(qnan & 0x40, 0x40);
        assert_eq!(bf16_from_f32(f32::INFINITY), 0x7f80);
    }

    #[test]
    fn f16_round_trip_is_exact_for_halves() {
        for bits in [0u16, 1, 0x3c00, 0x7bff, 0x8001, 0xfbff, 0x7c00] {
            let b = bits.to_le_bytes();
            let x = f16_at(&b, 0);
            assert_eq!(f16_bits(x), b);
        }
    }
}
