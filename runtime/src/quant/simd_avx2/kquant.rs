//! AVX2 K-quant × Q8_K kernels (Q4_K, Q5_K, Q6_K). Per super-block: codes widened to
//! bytes, `maddubs` against the Q8_K codes (unsigned × signed pairs → i16), `madd` with
//! the sub-block scales (→ i32), one f32 FMA with `d·d8` per super-block; the Q4_K/Q5_K
//! min term comes from Q8_K's `bsums`. All integer steps are exact for these ranges.

use std::arch::x86_64::*;

use super::{f16_at, ld128, ld256};

const Q8K: usize = 292;

/// Q8_K's f32 `d`.
#[inline(always)]
fn d8(y: &[u8]) -> f32 {
    f32::from_le_bytes([y[0], y[1], y[2], y[3]])
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum128(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The 12 packed scale bytes → 16 i16: eight 6-bit scales (low 128 bits), then the
/// eight 6-bit mins (high 128 bits). Same unpacking as `kquant::scale_min`, on u32s.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scales_mins(s: &[u8]) -> __m256i {
    let u = |o: usize| u32::from_le_bytes([s[o], s[o + 1], s[o + 2], s[o + 3]]);
    let (s0, s1, s2) = (u(0), u(4), u(8));
    const LOW6: u32 = 0x3f3f_3f3f;
    let sc_lo = s0 & LOW6;
    let mn_lo = s1 & LOW6;
    let sc_hi = (s2 & 0x0f0f_0f0f) | (((s0 >> 6) & 0x0303_0303) << 4);
    let mn_hi = ((s2 >> 4) & 0x0f0f_0f0f) | (((s1 >> 6) & 0x0303_0303) << 4);
    let bytes = _mm_set_epi32(mn_hi as i32, mn_lo as i32, sc_hi as i32, sc_lo as i32);
    _mm256_cvtepu8_epi16(bytes)
}

/// Broadcast i16 lane `j` of each 128-bit half to all lanes of that half.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lane16(v: __m256i, j: i32) -> __m256i {
    let idx = ((2 * j + 1) << 8) | (2 * j);
    _mm256_shuffle_epi8(v, _mm256_set1_epi16(idx as i16))
}

/// `Σ_j m_j · (bsums[2j] + bsums[2j+1])` as 4 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn min_term(ms: __m256i, y: &[u8]) -> __m128i {
    let bs = ld256(&y[260..]);
    let q8s = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    _mm_madd_epi16(_mm256_extracti128_si256(ms, 1), q8s)
}

/// Shared Q4_K / Q5_K loop over `T` activation rows at once (the weight side of each
/// super-block is unpacked once for all of them; each row's arithmetic is the same as
/// with `T = 1`). `high(b, c)` gives the fifth bits (already at 0x10) of chunk `c`'s low
/// and high halves, or zeros for Q4_K; codes start at `qs_off`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k45_loop<const T: usize>(
    w: &[u8],
    xs: [&[u8]; T],
    n: usize,
    wb: usize,
    qs_off: usize,
    high: impl Fn(&[u8], i32) -> (__m256i, __m256i),
) -> [f32; T] {
    let nb = n / 256;
    let w = &w[..nb * wb];
    let xs = xs.map(|x| &x[..nb * Q8K]);
    let m4 = _mm256_set1_epi8(0x0f);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc_m = [_mm_setzero_ps(); T];
    for i in 0..nb {
        let b = &w[i * wb..(i + 1) * wb];
        let (dw, dminw) = (f16_at(b, 0), f16_at(b, 2));
        let ms = scales_mins(&b[4..16]);
        let sc = _mm256_permute2x128_si256(ms, ms, 0x00); // scales in both halves
        let mut sumi = [_mm256_setzero_si256(); T];
        for c in 0..4 {
            let q = ld256(&b[qs_off + 32 * c..]);
            let (hl, hh) = high(b, c as i32);
            let ql = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
            let qh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
            let (sl, sh) = (lane16(sc, 2 * c as i32), lane16(sc, 2 * c as i32 + 1));
            for t in 0..T {
                let y = &xs[t][i * Q8K..(i + 1) * Q8K];
                let yl = ld256(&y[4 + 64 * c..]);
                let yh = ld256(&y[4 + 64 * c + 32..]);
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, yl));
                let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, yh));
                sumi[t] = _mm256_add_epi32(sumi[t], _mm256_add_epi32(pl, ph));
            }
        }
        for t in 0..T {
            let y = &xs[t][i * Q8K..(i + 1) * Q8K];
            let dy = d8(y);
            let (d, dmin) = (dy * dw, dy * dminw);
            acc_m[t] = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(min_term(ms, y)), acc_m[t]);
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[t]), acc[t]);
        }
    }
    std::array::from_fn(|t| super::hsum(acc[t]) - hsum128(acc_m[t]))
}

/// Q4_K in the order of llama.cpp's repacked Q4_K kernels (`q4_K_8x8`, which its CPU
/// backend uses for every Q4_K weight on an AVX2 machine): per output, one FMA chain of
/// `d·d8 × (exact integer sum)` and one of `dmin·d8 × (exact min sum)`, subtracted at the
/// end. Its one-row kernel (decode, and a batch's last `n % 4` rows) adds one term per
/// super-block; its four-row kernel one per 64 elements (`PER_64`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q4k_loop<const T: usize, const PER_64: bool>(w: &[u8], xs: [&[u8]; T], n: usize) -> [f32; T] {
    let nb = n / 256;
    let w = &w[..nb * 144];
    let xs = xs.map(|x| &x[..nb * Q8K]);
    let m4 = _mm256_set1_epi8(0x0f);
    let (mut acc, mut acc_m) = ([0f32; T], [0f32; T]);
    for i in 0..nb {
        let b = &w[i * 144..(i + 1) * 144];
        let (dw, dminw) = (f16_at(b, 0), f16_at(b, 2));
        let ms = scales_mins(&b[4..16]);
        let sc = _mm256_permute2x128_si256(ms, ms, 0x00); // scales in both halves
        // Exact integer sums per 64 elements (two sub-blocks), per token.
        let mut isum = [[0i32; 4]; T];
        for c in 0..4 {
            let q = ld256(&b[16 + 32 * c..]);
            let ql = _mm256_and_si256(q, m4);
            let qh = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let (sl, sh) = (lane16(sc, 2 * c as i32), lane16(sc, 2 * c as i32 + 1));
            for t in 0..T {
                let y = &xs[t][i * Q8K..(i + 1) * Q8K];
                let pl = _mm256_madd_epi16(sl, _mm256_maddubs_epi16(ql, ld256(&y[4 + 64 * c..])));
                let ph = _mm256_madd_epi16(sh, _mm256_maddubs_epi16(qh, ld256(&y[4 + 64 * c + 32..])));
                isum[t][c] = hsum_i32(_mm256_add_epi32(pl, ph));
            }
        }
        for t in 0..T {
            let y = &xs[t][i * Q8K..(i + 1) * Q8K];
            let dy = d8(y);
            let (d, dmin) = (dw * dy, dminw * dy);
            let mut mins = [0i32; 4];
            // SAFETY: `mins` is 4 writable i32 (16 bytes); unaligned store.
            unsafe { _mm_storeu_si128(mins.as_mut_ptr() as *mut __m128i, min_term(ms, y)) };
            if PER_64 {
                for c in 0..4 {
                    acc[t] = (isum[t][c] as f32).mul_add(d, acc[t]);
                    acc_m[t] = (mins[c] as f32).mul_add(dmin, acc_m[t]);
                }
            } else {
                acc[t] = (isum[t].iter().sum::<i32>() as f32).mul_add(d, acc[t]);
                acc_m[t] = (mins.iter().sum::<i32>() as f32).mul_add(dmin, acc_m[t]);
            }
        }
    }
    std::array::from_fn(|t| acc[t] - acc_m[t])
}

/// The sum of 8 i32 lanes (exact for these ranges).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// One token: llama.cpp's one-row order (see [`q4k_loop`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q4k_loop::<1, false>(w, [x], n)[0]
}

/// Four tokens: `[w·x0, w·x1, w·x2, w·x3]` in llama.cpp's four-row order (one FMA
/// term per 64 elements), so a prompt's rows round as its batched GEMM does.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q4_k_body4(w: &[u8], xs: [&[u8]; 4], n: usize) -> [f32; 4] {
    q4k_loop::<4, true>(w, xs, n)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_k_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q5_k_loop::<1>(w, [x], n)[0]
}

/// [`q5_k_body`] for four activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q5_k_body4(w: &[u8], xs: [&[u8]; 4], n: usize) -> [f32; 4] {
    q5_k_loop::<4>(w, xs, n)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5_k_loop<const T: usize>(w: &[u8], xs: [&[u8]; T], n: usize) -> [f32; T] {
    k45_loop::<T>(w, xs, n, 176, 48, |b, c| {
        let qh = ld256(&b[16..]);
        let one = _mm256_set1_epi8(1);
        let bit = |s: i32| {
            let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
            _mm256_slli_epi16(_mm256_and_si256(v, one), 4)
        };
        (bit(2 * c), bit(2 * c + 1))
    })
}

/// Q6_K as llama.cpp's `ggml_vec_dot_q6_K_q8_K` (AVX2) sums: 8 lanes of exact integers
/// per super-block, one FMA per lane, the lanes added at the end. Its CPU backend uses
/// that for batches of fewer than 8 tokens (decode).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q6_k_loop::<1, false>(w, [x], n)[0]
}

/// [`q6_k_body`] for four activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_body4(w: &[u8], xs: [&[u8]; 4], n: usize) -> [f32; 4] {
    q6_k_loop::<4, false>(w, xs, n)
}

/// Q6_K as llama.cpp's tiled K-quant GEMM sums (its path for batches of ≥ 8 tokens):
/// per super-block the whole exact integer sum, times the weight scale (rounded), then
/// one FMA with the activation scale into a single accumulator.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_body_tiled(w: &[u8], x: &[u8], n: usize) -> f32 {
    q6_k_loop::<1, true>(w, [x], n)[0]
}

/// [`q6_k_body_tiled`] for four activation rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q6_k_body4_tiled(w: &[u8], xs: [&[u8]; 4], n: usize) -> [f32; 4] {
    q6_k_loop::<4, true>(w, xs, n)
}

/// Q6_K against `T` activation rows (weights unpacked once; per row the same
/// arithmetic as `T = 1`), in the vector-dot order or (`TILED`) the tiled GEMM's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q6_k_loop<const T: usize, const TILED: bool>(w: &[u8], xs: [&[u8]; T], n: usize) -> [f32; T] {
    let nb = n / 256;
    let w = &w[..nb * 210];
    let xs = xs.map(|x| &x[..nb * Q8K]);
    let m4 = _mm256_set1_epi8(0x0f);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = [_mm256_setzero_ps(); T];
    let mut acc1 = [0f32; T];
    for i in 0..nb {
        let b = &w[i * 210..(i + 1) * 210];
        let dw = f16_at(b, 208);
        let scales = ld128(&b[192..]);
        let mut sumi = [_mm256_setzero_si256(); T];
        for h in 0..2 {
            let ql1 = ld256(&b[64 * h..]);
            let ql2 = ld256(&b[64 * h + 32..]);
            let qh = ld256(&b[128 + 32 * h..]);
            let hi = |s: i32| {
                let v = _mm256_srl_epi16(qh, _mm_cvtsi32_si128(s));
                _mm256_slli_epi16(_mm256_and_si256(v, m3), 4)
            };
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql1, m4), hi(0)),
                _mm256_or_si256(_mm256_and_si256(ql2, m4), hi(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hi(4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql2, 4), m4), hi(6)),
            ];
            for (k, &qk) in q.iter().enumerate() {
                // group g's two scales: sc[2g] for the low 16 elements, sc[2g+1] for the high.
                let g = (4 * h + k) as i8;
                let (lo, hi) = (2 * g, 2 * g + 1);
                let pick = _mm_set_epi8(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
                let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pick));
                for t in 0..T {
                    let yk = ld256(&xs[t][i * Q8K + 4 + 128 * h + 32 * k..]);
                    let p = _mm256_maddubs_epi16(qk, yk);
                    sumi[t] = _mm256_add_epi32(sumi[t], _mm256_madd_epi16(sc, p));
                }
            }
        }
        // Σ (q − 32)·u·sc = Σ q·u·sc − 32·Σ_j sc_j·bsum_j, the second per lane as
        // llama.cpp's AVX2 kernel takes it (lane k: sub-blocks 2k and 2k+1), so every lane
        // holds the same integer as there before the f32 accumulation.
        let sc16 = _mm256_cvtepi8_epi16(scales);
        for t in 0..T {
            let y = &xs[t][i * Q8K..];
            let sub = _mm256_slli_epi32(_mm256_madd_epi16(ld256(&y[260..]), sc16), 5);
            let lanes = _mm256_sub_epi32(sumi[t], sub);
            if TILED {
                let r = hsum_i32(lanes) as f32 * dw;
                acc1[t] = r.mul_add(d8(y), acc1[t]);
            } else {
                let d = d8(y) * dw;
                acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(lanes), acc[t]);
            }
        }
    }
    std::array::from_fn(|t| if TILED { acc1[t] } else { super::hsum(acc[t]) })
}
