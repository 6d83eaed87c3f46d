//! Softmax and `p·V` for one query row in the two orders llama.cpp's CPU backend uses
//! for a prompt, so our logits round like its fixtures (`shared/fixtures/*/README.md`):
//!
//! * [`tiled`] — flash attention over an f16 cache for batches of ≥ 64 rows: keys in
//!   tiles of 64 from key 0; per tile the running max, the softmax numerators from
//!   ggml's vector `exp` ([`super::vexp`]) summed per 16 lanes in f64, and `V` added in
//!   one fused multiply-add chain per output element; divided by the sum at the end.
//! * [`no_fa`] — the f32 cache without flash attention: one softmax over all keys (the
//!   same `exp`, f64 sum, multiplied by the f32 reciprocal), then `p·V` as ggml's f32
//!   matrix product forms it: 16 lanes over keys (64 for a single row), folded at the end.
//!
//! In both, key `j` (absolute position) sits in tile `j / 64` and lane `j % lanes`, so
//! masked keys (outside the causal or sliding window) add nothing, as in llama.cpp.

use super::attn_kernels::{fma_row, fold16, fold_lanes, Rows};
use super::vexp;

/// Keys per tile of llama.cpp's tiled flash attention.
const TILE: usize = 64;

/// `scores[j]` belongs to key `lo + j`; V row of key `p` at `p * stride + off`; `row` is
/// scratch of `out.len()`.
#[allow(clippy::too_many_arguments)]
pub fn tiled(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, row: &mut [f32], out: &mut [f32]) {
    vexp::with_fma(|| {
        let hi = lo + scores.len();
        out.fill(0.0);
        let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
        let mut p = [0f32; TILE];
        let mut t0 = lo / TILE * TILE;
        while t0 < hi {
            // Keys of this tile that this row sees.
            let (a, b) = (t0.max(lo), (t0 + TILE).min(hi));
            let tile_max = scores[a - lo..b - lo].iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
            let m_new = m.max(tile_max);
            if m_new > m {
                let ms = (m - m_new).exp();
                out.iter_mut().for_each(|o| *o *= ms);
                s *= ms;
            }
            m = m_new;
            p.fill(0.0);
            for key in a..b {
                p[key - t0] = vexp::expf(scores[key - lo] - m);
            }
            let sum: f64 = p.chunks_exact(16).map(|c| fold16(c.try_into().unwrap()) as f64).sum();
            s = (s as f64 + sum) as f32;
            for key in a..b {
                fma_row(out, p[key - t0], v, key * stride + off, row);
            }
            t0 += TILE;
        }
        let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
        out.iter_mut().for_each(|o| *o *= inv);
    })
}

/// As [`tiled`]'s arguments; `lanes` is 16 for a prompt (llamafile's f32 GEMM) or 64 for
/// a single row (`ggml_vec_dot_f32`). `acc` is scratch of `lanes * out.len()`.
#[allow(clippy::too_many_arguments)]
pub fn no_fa(
    scores: &mut [f32],
    v: Rows,
    stride: usize,
    off: usize,
    lo: usize,
    lanes: usize,
    acc: &mut Vec<f32>,
    row: &mut [f32],
    out: &mut [f32],
) {
    vexp::with_fma(|| {
        let dv = out.len();
        let max = scores.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y));
        // Numerators, summed per 16 keys from key 0 (a masked key is a zero lane).
        let mut sum = 0.0f64;
        let mut lane16 = [0f32; 16];
        let n = scores.len();
        for (j, sc) in scores.iter_mut().enumerate() {
            *sc = vexp::expf(*sc - max);
            let key = lo + j;
            lane16[key % 16] = *sc;
            if key % 16 == 15 || j + 1 == n {
                sum += fold16(&lane16) as f64;
                lane16 = [0.0; 16];
            }
        }
        let inv = (1.0 / sum) as f32;
        acc.clear();
        acc.resize(lanes * dv, 0.0);
        for (j, &e) in scores.iter().enumerate() {
            let key = lo + j;
            fma_row(&mut acc[(key % lanes) * dv..][..dv], e * inv, v, key * stride + off, row);
        }
        let mut p = [0f32; 64];
        for (d, o) in out.iter_mut().enumerate() {
            for (l, pl) in p.iter_mut().enumerate().take(lanes) {
                *pl = acc[l * dv + d];
            }
            *o = fold_lanes(&p, lanes);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain softmax-weighted sum in f64, for comparison.
    fn reference(scores: &[f32], v: &[f32], dv: usize, lo: usize) -> Vec<f64> {
        let m = scores.iter().fold(f32::NEG_INFINITY, |x, &y| x.max(y)) as f64;
        let e: Vec<f64> = scores.iter().map(|&s| (s as f64 - m).exp()).collect();
        let z: f64 = e.iter().sum();
        (0..dv).map(|d| e.iter().enumerate().map(|(j, w)| w * v[(lo + j) * dv + d] as f64).sum::<f64>() / z).collect()
    }

    #[test]
    fn both_orders_compute_attention() {
        let dv = 8;
        for (lo, n) in [(0, 1), (0, 70), (37, 150), (64, 64), (5, 3)] {
            let v: Vec<f32> = (0..(lo + n) * dv).map(|i| ((i * 29 % 13) as f32 - 6.0) * 0.3).collect();
            let scores: Vec<f32> = (0..n).map(|j| ((j * 7 % 23) as f32) * 0.4 - 3.0).collect();
            let want = reference(&scores, &v, dv, lo);
            let mut row = vec![0.0; dv];
            let mut out = vec![0.0; dv];
            tiled(&scores, Rows::F32(&v), dv, 0, lo, &mut row, &mut out);
            for (a, b) in out.iter().zip(&want) {
                assert!((*a as f64 - b).abs() < 1e-5, "tiled {lo} {n}: {out:?} vs {want:?}");
            }
            for lanes in [16, 64] {
                let mut sc = scores.clone();
                let mut acc = Vec::new();
                no_fa(&mut sc, Rows::F32(&v), dv, 0, lo, lanes, &mut acc, &mut row, &mut out);
                for (a, b) in out.iter().zip(&want) {
                    assert!((*a as f64 - b).abs() < 1e-5, "no_fa {lanes} {lo} {n}: {out:?} vs {want:?}");
                }
            }
        }
    }
}
