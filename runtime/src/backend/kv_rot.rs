//! The Walsh–Hadamard rotation of quantized KV caches, as llama.cpp applies it (its
//! `attn_rot_k` / `attn_rot_v`, on by default since its KV-rotation change).
//!
//! A quantized K cache stores every key head rotated by an orthonormal Hadamard matrix
//! `H` (per block of `k` values of the head), and the queries are rotated the same way,
//! so `q·k` is unchanged while the outliers of a few channels are spread over the block
//! before Q8_0 / Q4_0 rounds it. A quantized V cache stores `H v` (blocks of 64), and the
//! attention output (a weighted sum of those rows) is rotated back by `H` again (`H·H = I`).
//! The rotations sit after RoPE and before the cache store, so the attention kernels are
//! the same with or without them.
//!
//! `H` is Sylvester's: `H[i][j] = (-1)^popcount(i & j) / sqrt(n)`. [`hadamard_slice`] is the
//! arithmetic every backend follows (the GPU's `hadamard_f32` the same butterflies in the
//! same order, then the one scale), so the CPU and GPU rotations are bit-identical.

use super::KvTypes;

/// The rotation block sizes of a cache (`None`: that half is not rotated).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvRot {
    /// Keys and queries: the largest power of two dividing the K head dimension.
    pub k: Option<usize>,
    /// Values and the attention output: 64.
    pub v: Option<usize>,
}

impl KvRot {
    /// llama.cpp's rule: a quantized half whose head dimension is a multiple of 64 is
    /// rotated (K in blocks of the largest power of two dividing the head, V in blocks of 64).
    pub fn for_cache(ty: KvTypes, head_dim_k: usize, head_dim_v: usize) -> KvRot {
        let k = (ty.k.is_quantized() && head_dim_k % 64 == 0 && head_dim_k > 0).then(|| 1usize << head_dim_k.trailing_zeros());
        let v = (ty.v.is_quantized() && head_dim_v % 64 == 0 && head_dim_v > 0).then_some(64);
        KvRot { k, v }
    }

    pub fn any(self) -> bool {
        self.k.is_some() || self.v.is_some()
    }
}

/// `x = H x` for each block of `n` consecutive values of `x` (`n` a power of two,
/// `x.len()` a multiple of it): butterflies of width 1, 2, 4, … (`(a, b) → (a + b, a − b)`),
/// then every value times `1/sqrt(n)` (as f32).
pub fn hadamard_slice(x: &mut [f32], n: usize) {
    debug_assert!(n.is_power_of_two() && x.len() % n == 0);
    let scale = hadamard_scale(n);
    for b in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (b[j], b[j + h]);
                    b[j] = a + c;
                    b[j + h] = a - c;
                }
            }
            h *= 2;
        }
        for v in b.iter_mut() {
            *v *= scale;
        }
    }
}

/// The scale of a block of `n`: `1/sqrt(n)` rounded to f32 once (every backend uses this value).
pub fn hadamard_scale(n: usize) -> f32 {
    (1.0 / (n as f64).sqrt()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::KvType;

    #[test]
    fn block_sizes_follow_llama_cpp() {
        let q = |k, v| KvTypes { k, v };
        assert_eq!(KvRot::for_cache(q(KvType::F16, KvType::F16), 128, 128), KvRot::default());
        assert_eq!(KvRot::for_cache(q(KvType::Q4_0, KvType::Q4_0), 128, 128), KvRot { k: Some(128), v: Some(64) });
        assert_eq!(KvRot::for_cache(q(KvType::Q8_0, KvType::F16), 256, 256), KvRot { k: Some(256), v: None });
        assert_eq!(KvRot::for_cache(q(KvType::F16, KvType::Q8_0), 64, 64), KvRot { k: None, v: Some(64) });
        assert_eq!(KvRot::for_cache(q(KvType::Q8_0, KvType::Q8_0), 192, 192), KvRot { k: Some(64), v: Some(64) });
        // A head of 96 (a multiple of 32, not of 64) is quantized without the rotation.
        assert_eq!(KvRot::for_cache(q(KvType::Q8_0, KvType::Q8_0), 96, 96), KvRot::default());
    }

    /// The fast transform equals the matrix `H[i][j] = (-1)^popcount(i&j) / sqrt(n)`, keeps
    /// dot products (orthonormal) and undoes itself.
    #[test]
    fn fast_transform_is_the_orthonormal_sylvester_matrix() {
        for n in [64usize, 128, 256] {
            let x: Vec<f32> = (0..2 * n).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
            let y0: Vec<f32> = (0..2 * n).map(|i| ((i * 13 % 89) as f32 - 40.0) / 5.0).collect();
            let mut hx = x.clone();
            hadamard_slice(&mut hx, n);
            for blk in 0..2 {
                for i in 0..n {
                    let want: f64 = (0..n)
                        .map(|j| if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 } * x[blk * n + j] as f64)
                        .sum::<f64>()
                        / (n as f64).sqrt();
                    assert!((hx[blk * n + i] as f64 - want).abs() < 1e-4, "n {n} block {blk} row {i}: {} vs {want}", hx[blk * n + i]);
                }
            }
            let mut hy = y0.clone();
            hadamard_slice(&mut hy, n);
            let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| *p as f64 * *q as f64).sum::<f64>();
            assert!((dot(&hx, &hy) - dot(&x, &y0)).abs() < 1e-3 * dot(&x, &x).sqrt() * dot(&y0, &y0).sqrt());
            let mut back = hx.clone();
            hadamard_slice(&mut back, n);
            for (a, b) in back.iter().zip(&x) {
                assert!((a - b).abs() < 1e-4);
            }
        }
    }
}
