//! Q8_K (292 B: `f32 d; i8 qs[256]; i16 bsums[16]`), the activation format ggml's CPU
//! backend pairs with every K-quant weight. `bsums[k]` = Σ qs[16k..16k+16] lets the
//! weights' min term be applied without touching the codes (reference §2.4).

use super::fit::nearest_int;
use super::float::f32_at;

pub(crate) const QK_K: usize = 256;
pub(crate) const Q8_K_BYTES: usize = 292;
/// Byte offsets inside a Q8_K block.
pub(crate) const Q8K_QS: usize = 4;
pub(crate) const Q8K_BSUMS: usize = 4 + QK_K;

/// `quantize_row_q8_K_ref`: scale from the signed value of largest magnitude,
/// `iscale = −127/max`, codes `min(127, nearest_int(iscale·x))`, `d = 1/iscale`.
/// An all-zero block gets `d = 0` and zero codes and sums.
pub(crate) fn quant_q8_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q8_K_BYTES)) {
        let (mut max, mut amax) = (0f32, 0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            b.fill(0);
            continue;
        }
        let iscale = -127.0 / max;
        let mut q = [0i8; QK_K];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
        for (o, &q) in b[Q8K_QS..Q8K_BSUMS].iter_mut().zip(&q) {
            *o = q as u8;
        }
        for k in 0..QK_K / 16 {
            let s: i32 = q[16 * k..16 * k + 16].iter().map(|&v| v as i32).sum();
            b[Q8K_BSUMS + 2 * k..Q8K_BSUMS + 2 * k + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
    }
}

pub(crate) fn dequant_q8_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f32_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[Q8K_QS..Q8K_BSUMS]) {
            *y = d * q as i8 as f32;
        }
    }
}

/// `bsums[k]` of a Q8_K block.
#[inline(always)]
pub(crate) fn bsum(b: &[u8], k: usize) -> i32 {
    i16::from_le_bytes([b[Q8K_BSUMS + 2 * k], b[Q8K_BSUMS + 2 * k + 1]]) as i32
}
