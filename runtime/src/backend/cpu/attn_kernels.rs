//! The inner loops of CPU attention: `q·k` scores over many keys (two summation orders,
//! one per llama.cpp kernel), the online-softmax V accumulation with an f16 accumulator,
//! and `o += w·v`. Each has a portable version and an AVX2+FMA+F16C one that computes
//! the same values bit for bit (8 keys side by side in the lanes, which the transposed K
//! layout makes contiguous; every key's own sum in the order the portable code uses).

use half::f16;

/// One KV head's K, transposed: element `(d, key)` at `d * stride + key`.
#[derive(Clone, Copy)]
pub enum KeysT<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl KeysT<'_> {
    #[inline]
    fn at(self, i: usize) -> f32 {
        match self {
            KeysT::F32(d) => d[i],
            KeysT::F16(d) => d[i].to_f32(),
        }
    }
}

/// V rows: row `key` of this head at `key * stride + off`, `dv` elements.
#[derive(Clone, Copy)]
pub enum Rows<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl Rows<'_> {
    pub fn load(self, at: usize, dst: &mut [f32]) {
        use half::slice::HalfFloatSliceExt;
        match self {
            Rows::F32(d) => dst.copy_from_slice(&d[at..at + dst.len()]),
            Rows::F16(d) => d[at..at + dst.len()].convert_to_f32_slice(dst),
        }
    }
}

fn avx2() -> bool {
    crate::quant::Isa::Avx2.available()
}

/// `out[j] = (Σ_d q[d]·K[d][lo+j]) · scale` for `j < out.len()`, each sum one chain of
/// fused multiply-adds in order of `d` from +0 — llama.cpp's tiled CPU flash attention
/// (prompt batches of ≥ 64 rows) forms its scores this way.
pub fn scores(q: &[f32], k: KeysT, stride: usize, lo: usize, scale: f32, out: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        done = unsafe { x86::scores(q, k, stride, lo, scale, out) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        let key = lo + j;
        let s = q.iter().enumerate().fold(0.0f32, |acc, (d, &a)| a.mul_add(k.at(d * stride + key), acc));
        *o = s * scale;
    }
}

/// Like [`scores`], but each sum in the order of ggml's vector dot products: `lanes`
/// (16 or 64) partial chains of fused multiply-adds (element `d` in chain `d % lanes`),
/// folded by [`fold_lanes`]; elements past the last whole `lanes` added in f64 after.
/// With 64 lanes this is `ggml_vec_dot_f16`/`_f32` on AVX-512 (flash attention's small
/// batches, and the f32-cache `K·Q` product); with 16 the f32 GEMM of one row.
pub fn scores_tree(q: &[f32], k: KeysT, stride: usize, lo: usize, scale: f32, lanes: usize, out: &mut [f32]) {
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if avx2() && q.len() % lanes == 0 {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        done = unsafe { x86::scores_tree(q, k, stride, lo, scale, lanes, out) };
    }
    for (j, o) in out.iter_mut().enumerate().skip(done) {
        *o = tree_dot(q, |d| k.at(d * stride + lo + j), lanes) * scale;
    }
}

/// One dot product in the order described at [`scores_tree`].
pub fn tree_dot(q: &[f32], k: impl Fn(usize) -> f32, lanes: usize) -> f32 {
    let np = q.len() / lanes * lanes;
    let mut p = [0f32; 64];
    for (l, pl) in p.iter_mut().enumerate().take(lanes) {
        *pl = (l..np).step_by(lanes).fold(0.0f32, |a, d| q[d].mul_add(k(d), a));
    }
    let r = fold_lanes(&p, lanes);
    if np == q.len() {
        return r;
    }
    (np..q.len()).fold(r as f64, |s, d| s + (q[d] * k(d)) as f64) as f32
}

/// Folds 16 or 64 partial sums as ggml's AVX-512 reductions do: 64 → 16 by
/// `(p[t] + p[t+32]) + (p[t+16] + p[t+48])`, then [`fold16`].
pub fn fold_lanes(p: &[f32], lanes: usize) -> f32 {
    let mut a = [0f32; 16];
    if lanes == 64 {
        for (t, at) in a.iter_mut().enumerate() {
            *at = (p[t] + p[t + 32]) + (p[t + 16] + p[t + 48]);
        }
    } else {
        a.copy_from_slice(&p[..16]);
    }
    fold16(&a)
}

/// The horizontal sum of 16 lanes in the order of GCC's `_mm512_reduce_add_ps`: halves,
/// quarters, then `(t[0] + t[2]) + (t[1] + t[3])`.
pub fn fold16(a: &[f32; 16]) -> f32 {
    let t3: [f32; 8] = std::array::from_fn(|i| a[i + 8] + a[i]);
    let t6: [f32; 4] = std::array::from_fn(|j| t3[j + 4] + t3[j]);
    (t6[0] + t6[2]) + (t6[1] + t6[3])
}

/// One query head over keys `lo..lo + scores.len()` (scores precomputed) with an online
/// softmax whose V accumulator is kept in f16 (rounded after every key), as llama.cpp's
/// CPU flash attention does for small batches and decode with an f16 cache. V row of
/// key `p` at `p * stride + off`. `acc` is scratch of `out.len()`.
pub fn online_f16(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, acc: &mut [f32], out: &mut [f32]) {
    let (_, sum) = online_f16_part(scores, v, stride, off, lo, acc, out);
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    out.iter_mut().for_each(|o| *o *= inv);
}

/// [`online_f16`] before the division: `out` gets the f16 accumulator's values and the
/// result is `(max score, Σ exp)`, as llama.cpp keeps per chunk of keys when it splits
/// one row's keys across threads.
pub fn online_f16_part(
    scores: &[f32],
    v: Rows,
    stride: usize,
    off: usize,
    lo: usize,
    acc: &mut [f32],
    out: &mut [f32],
) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if avx2() && out.len() % 8 == 0 {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        return unsafe { x86::online_f16(scores, v, stride, off, lo, acc, out) };
    }
    online_f16_portable(scores, v, stride, off, lo, acc, out)
}

fn online_f16_portable(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, acc: &mut [f32], out: &mut [f32]) -> (f32, f32) {
    let dv = out.len();
    let mut a16 = vec![f16::ZERO; dv];
    let row = &mut acc[..dv];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for (j, &s) in scores.iter().enumerate() {
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            ms = (m - s).exp();
            m = s;
            a16.iter_mut().for_each(|a| *a = f16::from_f32(a.to_f32() * ms));
        } else {
            vs = (s - m).exp();
        }
        v.load((lo + j) * stride + off, row);
        a16.iter_mut().zip(row.iter()).for_each(|(a, &x)| *a = f16::from_f32(x.mul_add(vs, a.to_f32())));
        sum = sum.mul_add(ms, vs);
    }
    out.iter_mut().zip(&a16).for_each(|(o, a)| *o = a.to_f32());
    (m, sum)
}

/// `o[i] = fma(w, V[at + i], o[i])` for `i < o.len()` (one rounding per element, so the
/// AVX2 and portable forms agree bit for bit). `row` is scratch of `o.len()`.
pub fn fma_row(o: &mut [f32], w: f32, v: Rows, at: usize, row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx2() && o.len() % 8 == 0 {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        unsafe { x86::fma_row(o, w, v, at) };
        return;
    }
    let row = &mut row[..o.len()];
    v.load(at, row);
    o.iter_mut().zip(row.iter()).for_each(|(a, &x)| *a = w.mul_add(x, *a));
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{KeysT, Rows};
    use std::arch::x86_64::*;

    /// 8 lanes of `k` from `at` (bounds-checked slice, unaligned load).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ld(k: KeysT, at: usize) -> __m256 {
        match k {
            KeysT::F32(s) => {
                let s = &s[at..at + 8];
                // SAFETY: `s` is 8 readable f32.
                unsafe { _mm256_loadu_ps(s.as_ptr()) }
            }
            KeysT::F16(s) => {
                let s = &s[at..at + 8];
                // SAFETY: `s` is 8 readable f16 (16 bytes).
                _mm256_cvtph_ps(unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) })
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn ldv(v: Rows, at: usize) -> __m256 {
        match v {
            Rows::F32(s) => ld(KeysT::F32(s), at),
            Rows::F16(s) => ld(KeysT::F16(s), at),
        }
    }

    /// Rounds 8 lanes to f16 and back (round to nearest even, as `f16::from_f32`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn round16(x: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x))
    }

    /// The scores of whole groups of 8 keys; returns how many it wrote.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn scores(q: &[f32], k: KeysT, stride: usize, lo: usize, scale: f32, out: &mut [f32]) -> usize {
        let n = out.len();
        let sc = _mm256_set1_ps(scale);
        let mut j = 0;
        // Four groups at once so four add chains are in flight.
        while j + 32 <= n {
            let mut acc = [_mm256_setzero_ps(); 4];
            for (d, &qd) in q.iter().enumerate() {
                let qv = _mm256_set1_ps(qd);
                let at = d * stride + lo + j;
                for (g, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv, ld(k, at + 8 * g), *a);
                }
            }
            for (g, a) in acc.iter().enumerate() {
                store(&mut out[j + 8 * g..], _mm256_mul_ps(*a, sc));
            }
            j += 32;
        }
        // The last group may run past the wanted keys into later slots of the same rows
        // (each lane is its own key, so the extra lanes are computed and dropped).
        while j < n && lo + j + 8 <= stride {
            let mut a = _mm256_setzero_ps();
            for (d, &qd) in q.iter().enumerate() {
                a = _mm256_fmadd_ps(_mm256_set1_ps(qd), ld(k, d * stride + lo + j), a);
            }
            let a = _mm256_mul_ps(a, sc);
            store_upto(&mut out[j..], a);
            j += 8;
        }
        j.min(n)
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn fma_row(o: &mut [f32], w: f32, v: Rows, at: usize) {
        let wv = _mm256_set1_ps(w);
        for i in (0..o.len()).step_by(8) {
            let x = _mm256_fmadd_ps(wv, ldv(v, at + i), load(&o[i..]));
            store(&mut o[i..], x);
        }
    }

    /// [`super::scores_tree`] for whole groups of 8 keys (`q.len()` a multiple of
    /// `lanes`); returns how many it wrote.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn scores_tree(q: &[f32], k: KeysT, stride: usize, lo: usize, scale: f32, lanes: usize, out: &mut [f32]) -> usize {
        let n = out.len();
        let sc = _mm256_set1_ps(scale);
        let mut j = 0;
        while j < n && lo + j + 8 <= stride {
            let at = lo + j;
            // Lane l's chain: elements d ≡ l (mod lanes), in order of d.
            let mut p = [_mm256_setzero_ps(); 64];
            for (d, &qd) in q.iter().enumerate() {
                let l = d % lanes;
                p[l] = _mm256_fmadd_ps(_mm256_set1_ps(qd), ld(k, d * stride + at), p[l]);
            }
            let a: [__m256; 16] = std::array::from_fn(|t| {
                if lanes == 64 {
                    _mm256_add_ps(_mm256_add_ps(p[t], p[t + 32]), _mm256_add_ps(p[t + 16], p[t + 48]))
                } else {
                    p[t]
                }
            });
            let t3: [__m256; 8] = std::array::from_fn(|i| _mm256_add_ps(a[i + 8], a[i]));
            let t6: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(t3[i + 4], t3[i]));
            let r = _mm256_add_ps(_mm256_add_ps(t6[0], t6[2]), _mm256_add_ps(t6[1], t6[3]));
            let r = _mm256_mul_ps(r, sc);
            store_upto(&mut out[j..], r);
            j += 8;
        }
        j.min(n)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn store(o: &mut [f32], x: __m256) {
        let o = &mut o[..8];
        // SAFETY: `o` is 8 writable f32.
        unsafe { _mm256_storeu_ps(o.as_mut_ptr(), x) }
    }

    /// The first `min(8, o.len())` lanes of `x` into `o` (a key group at the end of a row).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn store_upto(o: &mut [f32], x: __m256) {
        if o.len() >= 8 {
            store(o, x);
        } else {
            let mut tmp = [0f32; 8];
            store(&mut tmp, x);
            let n = o.len();
            o.copy_from_slice(&tmp[..n]);
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn load(o: &[f32]) -> __m256 {
        ld(KeysT::F32(o), 0)
    }

    /// [`super::online_f16`] with `out.len()` a multiple of 8; `acc` holds the f16
    /// accumulator's values as f32.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn online_f16(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, acc: &mut [f32], out: &mut [f32]) -> (f32, f32) {
        let dv = out.len();
        let acc = &mut acc[..dv];
        acc.fill(0.0);
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for (j, &s) in scores.iter().enumerate() {
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if s > m {
                ms = (m - s).exp();
                m = s;
                let msv = _mm256_set1_ps(ms);
                for i in (0..dv).step_by(8) {
                    let x = round16(_mm256_mul_ps(load(&acc[i..]), msv));
                    store(&mut acc[i..], x);
                }
            } else {
                vs = (s - m).exp();
            }
            let vsv = _mm256_set1_ps(vs);
            let at = (lo + j) * stride + off;
            for i in (0..dv).step_by(8) {
                let x = ldv(v, at + i);
                let x = round16(_mm256_fmadd_ps(x, vsv, load(&acc[i..])));
                store(&mut acc[i..], x);
            }
            sum = sum.mul_add(ms, vs);
        }
        out.copy_from_slice(acc);
        (m, sum)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx2_scores_equal_the_sequential_sums() {
        let (dk, stride, lo) = (24, 77, 3);
        let q: Vec<f32> = (0..dk).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.37).collect();
        let k32: Vec<f32> = (0..dk * stride).map(|i| ((i * 53 % 17) as f32 - 8.0) * 0.113).collect();
        let k16: Vec<f16> = k32.iter().map(|&x| f16::from_f32(x)).collect();
        for kt in [KeysT::F32(&k32), KeysT::F16(&k16)] {
            // Every length: whole groups, a group cut short, the scalar tail at the end.
            for len in [stride - lo, stride - lo - 3, 13, 5] {
            let mut got = vec![0.0; len];
            scores(&q, kt, stride, lo, 0.125, &mut got);
            for (j, &g) in got.iter().enumerate() {
                let s = (0..dk).fold(0.0f32, |a, d| q[d].mul_add(kt.at(d * stride + lo + j), a));
                assert_eq!(g.to_bits(), (s * 0.125).to_bits(), "key {j}");
            }
            }
        }
    }

    #[test]
    fn avx2_tree_scores_equal_the_portable_ones() {
        for (dk, lanes) in [(64, 64), (256, 64), (64, 16), (80, 16), (72, 64)] {
            let (stride, lo) = (61, 5);
            let q: Vec<f32> = (0..dk).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.37).collect();
            let k32: Vec<f32> = (0..dk * stride).map(|i| ((i * 53 % 17) as f32 - 8.0) * 0.113).collect();
            let k16: Vec<f16> = k32.iter().map(|&x| f16::from_f32(x)).collect();
            for kt in [KeysT::F32(&k32), KeysT::F16(&k16)] {
                for len in [stride - lo, 13, 5] {
                    let mut got = vec![0.0; len];
                    scores_tree(&q, kt, stride, lo, 0.25, lanes, &mut got);
                    for (j, &g) in got.iter().enumerate() {
                        let want = tree_dot(&q, |d| kt.at(d * stride + lo + j), lanes) * 0.25;
                        assert_eq!(g.to_bits(), want.to_bits(), "dk {dk} lanes {lanes} key {j}");
                    }
                }
            }
        }
        // The fold itself: 64 ones in lane order give 64, and the pairing is as documented.
        let mut p = [0f32; 64];
        p[0] = 1e8;
        p[32] = 1.0;
        p[16] = -1e8;
        assert_eq!(fold_lanes(&p, 64), 1.0 - 1.0 + 0.0); // (1e8 + 1) + (-1e8) = 0 in f32
    }

    #[test]
    fn avx2_accumulation_equals_the_portable_one() {
        let (dv, stride, off, lo, n) = (16, 40, 8, 2, 9);
        let v32: Vec<f32> = (0..stride * (lo + n)).map(|i| ((i * 29 % 13) as f32 - 6.0) * 0.71).collect();
        let v16: Vec<f16> = v32.iter().map(|&x| f16::from_f32(x)).collect();
        let sc = [0.3f32, -1.0, 2.5, 2.4, 7.0, -3.0, 7.5, 0.0, 1.0];
        for v in [Rows::F32(&v32), Rows::F16(&v16)] {
            let (mut a, mut b) = (vec![0.0; dv], vec![0.0; dv]);
            let mut acc = vec![0.0; dv];
            let ra = online_f16_part(&sc, v, stride, off, lo, &mut acc, &mut a);
            let rb = online_f16_portable(&sc, v, stride, off, lo, &mut acc, &mut b);
            assert_eq!(a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), b.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            assert_eq!((ra.0.to_bits(), ra.1.to_bits()), (rb.0.to_bits(), rb.1.to_bits()));
        }
    }
}
