//! Attention over a quantized (Q8_0 / Q4_0) K or V cache, as llama.cpp's CPU flash
//! attention computes it (`ggml_compute_forward_flash_attn_ext_f16_one_chunk` in
//! `ggml-cpu/ops.cpp`). With a quantized K or V, llama.cpp takes neither its tiled
//! prompt kernel nor its split-keys decode path (both need f16 K and V of one type):
//! every query row runs one pass over its keys, which is what this follows:
//!
//! - K quantized: the query head is quantized to K's `vec_dot_type` (Q8_0 for both
//!   Q8_0 and Q4_0, with the x86 `quantize_row_q8_0` rounding `quant` uses), and each
//!   key's score is that type's dot product (`ggml_vec_dot_q8_0_q8_0` /
//!   `ggml_vec_dot_q4_0_q8_0`: exact integer sums per block, scaled by the two block
//!   scales) times the attention scale. An f16 K scores as the other f16 paths do.
//! - V quantized: the online softmax keeps an f32 accumulator (`VKQ32`): a new maximum
//!   scales it by `e^(M_old − M)`, otherwise the key's weight is `e^(s − M)`; the key's V
//!   row is dequantized (`v_to_float`) and added by fused multiply-adds
//!   (`ggml_vec_mad_f32`); the sum is `S·ms + vs`; the result is divided at the end. An
//!   f16 V keeps llama.cpp's f16 accumulator ([`super::attn_kernels::online_f16`]).
//!
//! Cache rows are slot-major: slot `p`'s `n_kv_head` heads of blocks at `p * row_bytes`.

use crate::quant::{self, GgmlType, Isa};

/// One quantized cache plane: `row_bytes` bytes per slot.
#[derive(Clone, Copy)]
pub struct QRows<'a> {
    pub ty: GgmlType,
    pub row_bytes: usize,
    pub data: &'a [u8],
}

impl QRows<'_> {
    /// The blocks of head `h` (of `d` values) in slot `p`.
    #[inline]
    fn head(&self, p: usize, h: usize, d: usize) -> &[u8] {
        let hb = d / 32 * self.ty.block_bytes();
        &self.data[p * self.row_bytes + h * hb..][..hb]
    }
}

/// `out[j] = (q · K[lo + j]) · scale` over head `h` of a quantized K: `q` (`d` values) is
/// quantized once into `q8` (scratch).
pub fn scores(q: &[f32], k: QRows, h: usize, lo: usize, scale: f32, q8: &mut Vec<u8>, out: &mut [f32]) {
    let d = q.len();
    let qt = quant::vec_dot_type(k.ty);
    q8.resize(qt.block_bytes() * d / qt.block_elems(), 0);
    // Sizes are whole blocks (checked when the cache was made), so neither call fails.
    let _ = quant::quantize(qt, q, q8);
    let dot = quant::kernel(k.ty, Isa::best()).expect("Q8_0 and Q4_0 have dot kernels");
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot(k.head(lo + j, h, d), q8, d) * scale;
    }
}

/// The online softmax over keys `lo..lo + scores.len()` with an f32 accumulator and V
/// head `h` of a quantized cache; `row` is scratch of `out.len()`.
pub fn online_f32(scores: &[f32], v: QRows, h: usize, lo: usize, row: &mut [f32], out: &mut [f32]) {
    let dv = out.len();
    let row = &mut row[..dv];
    out.fill(0.0);
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for (j, &s) in scores.iter().enumerate() {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            ms = (m - s).exp();
            m = s;
            out.iter_mut().for_each(|o| *o *= ms);
        } else {
            vs = (s - m).exp();
        }
        let _ = quant::dequantize(v.ty, v.head(lo + j, h, dv), row);
        out.iter_mut().zip(row.iter()).for_each(|(o, &x)| *o = x.mul_add(vs, *o));
        sum = sum.mul_add(ms, vs);
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    out.iter_mut().for_each(|o| *o *= inv);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax-weighted sum in f64 over dequantized rows.
    fn reference(scores: &[f32], v: &[f32], dv: usize) -> Vec<f64> {
        let m = scores.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y)) as f64;
        let e: Vec<f64> = scores.iter().map(|&s| (s as f64 - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..dv).map(|d| e.iter().enumerate().map(|(j, w)| w * v[j * dv + d] as f64).sum::<f64>() / z).collect()
    }

    #[test]
    fn quantized_scores_and_accumulation_match_the_dequantized_math() {
        let (d, n, heads) = (64, 37, 2);
        let vals: Vec<f32> = (0..n * heads * d).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.17).collect();
        let q: Vec<f32> = (0..d).map(|i| ((i * 13 % 7) as f32 - 3.0) * 0.3).collect();
        for ty in [GgmlType::Q8_0, GgmlType::Q4_0] {
            let rb = ty.block_bytes() * heads * d / 32;
            let mut data = vec![0u8; n * rb];
            quant::quantize(ty, &vals, &mut data).unwrap();
            let mut deq = vec![0f32; vals.len()];
            quant::dequantize(ty, &data, &mut deq).unwrap();
            let k = QRows { ty, row_bytes: rb, data: &data };
            let (lo, h) = (3, 1);
            let mut got = vec![0f32; n - lo];
            scores(&q, k, h, lo, 0.5, &mut Vec::new(), &mut got);
            // Q goes through Q8_0 too; the dot of the two dequantized vectors in f64.
            let mut q8 = vec![0u8; 34 * d / 32];
            quant::quantize(GgmlType::Q8_0, &q, &mut q8).unwrap();
            let mut qd = vec![0f32; d];
            quant::dequantize(GgmlType::Q8_0, &q8, &mut qd).unwrap();
            for (j, &g) in got.iter().enumerate() {
                let row = &deq[((lo + j) * heads + h) * d..][..d];
                let want = row.iter().zip(&qd).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * 0.5;
                assert!((g as f64 - want).abs() < 1e-4 * (1.0 + want.abs()), "{ty} key {j}: {g} vs {want}");
            }
            let mut out = vec![0f32; d];
            online_f32(&got, k, h, lo, &mut vec![0f32; d], &mut out);
            let rows: Vec<f32> = (lo..n).flat_map(|p| deq[(p * heads + h) * d..][..d].to_vec()).collect();
            let want = reference(&got, &rows, d);
            for (a, b) in out.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "{ty}: {a} vs {b}");
            }
        }
    }
}
