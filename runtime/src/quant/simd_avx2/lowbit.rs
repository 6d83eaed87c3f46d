//! AVX2 kernels of the CPU-only weight types: Q2_K and Q3_K against Q8_K, IQ4_XS against
//! Q8_K, IQ4_NL and MXFP4 against Q8_0. The integer sums are vectorized (codes widened
//! to bytes, the 4-bit table indices looked up with `pshufb`, `maddubs`/`madd`); each
//! block's float step is the scalar kernel's own (`q23k`, `iq4`), so the results equal the
//! scalar ones bit for bit.

use std::arch::x86_64::*;

use super::super::iq4::{e8m0_half, xs_scales, K_IQ4, K_MXFP4};
use super::super::q23k::{block_sum, q3_scales, Q3K_D, Q3K_SCALES};
use super::super::q8k::bsum;
use super::{f16_at, ld128, ld256};

const Q8K: usize = 292;
const Q80: usize = 34;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

/// The i16 `lo` in the low 128 bits, `hi` in the high 128 bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn halves16(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// A 16-entry i8 table in both lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn table(k: &[i8; 16]) -> __m256i {
    let t = ld128(&k.map(|v| v as u8));
    _mm256_set_m128i(t, t)
}

/// Σ over 32 elements of `K[q]·u`, as 8 i32 lanes: `qs` 16 nibble bytes (element i < 16
/// the low nibble of byte i, i + 16 its high nibble), `u` 32 int8 codes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibble_dot(tab: __m256i, qs: &[u8], u: &[u8]) -> __m256i {
    let q = ld128(qs);
    let m4 = _mm_set1_epi8(0x0f);
    let idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m4), _mm_and_si128(q, m4));
    let v = _mm256_shuffle_epi8(tab, idx);
    let y = ld256(u);
    // Signed × signed through |v| × (u with v's sign): |v| ≤ 127, so maddubs is exact.
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(y, v));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_nl_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (w, x) = (&w[..nb * 18], &x[..nb * Q80]);
    let tab = table(&K_IQ4);
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[18 * i..18 * i + 18], &x[Q80 * i..Q80 * (i + 1)]);
        let s = hsum_i32(nibble_dot(tab, &b[2..], &y[2..]));
        acc += (f16_at(b, 0) * f16_at(y, 0)) * s as f32;
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn mxfp4_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / 32;
    let (w, x) = (&w[..nb * 17], &x[..nb * Q80]);
    let tab = table(&K_MXFP4);
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[17 * i..17 * i + 17], &x[Q80 * i..Q80 * (i + 1)]);
        let s = hsum_i32(nibble_dot(tab, &b[1..], &y[2..]));
        acc += (f16_at(y, 0) * e8m0_half(b[0])) * s as f32;
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn iq4_xs_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / 256;
    let (w, x) = (&w[..nb * 136], &x[..nb * Q8K]);
    let tab = table(&K_IQ4);
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[136 * i..136 * (i + 1)], &x[Q8K * i..Q8K * (i + 1)]);
        let ls = xs_scales(b);
        let mut sum = _mm256_setzero_si256();
        for (j, &l) in ls.iter().enumerate() {
            let p = nibble_dot(tab, &b[8 + 16 * j..], &y[4 + 32 * j..]);
            sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(p, _mm256_set1_epi32(l)));
        }
        acc += (f16_at(b, 0) * f32::from_le_bytes([y[0], y[1], y[2], y[3]])) * hsum_i32(sum) as f32;
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q2_k_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / 256;
    let (w, x) = (&w[..nb * 84], &x[..nb * Q8K]);
    let m3 = _mm256_set1_epi8(3);
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[84 * i..84 * (i + 1)], &x[Q8K * i..Q8K * (i + 1)]);
        let mut sum = _mm256_setzero_si256();
        for h in 0..2 {
            let q = ld256(&b[16 + 32 * h..]);
            for j in 0..4 {
                let c = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let s = 8 * h + 2 * j;
                let sc = halves16((b[s] & 15) as i16, (b[s + 1] & 15) as i16);
                let u = ld256(&y[4 + 128 * h + 32 * j..]);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c, u), sc));
            }
        }
        let msum: i32 = (0..16).map(|s| (b[s] >> 4) as i32 * bsum(y, s)).sum();
        acc += block_sum(b, y, hsum_i32(sum), msum);
    }
    acc
}

/// Q3_K with the codes made unsigned (`c = q + 4 ∈ 0..8`): `Σ q·u = Σ c·u − 4·bsum`
/// per 16 elements (Q8_K's `bsums` are the sums of its codes).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn q3_k_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / 256;
    let (w, x) = (&w[..nb * 110], &x[..nb * Q8K]);
    let (m3, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[110 * i..110 * (i + 1)], &x[Q8K * i..Q8K * (i + 1)]);
        let sc = q3_scales(&b[Q3K_SCALES..Q3K_SCALES + 12]);
        let hm = ld256(b);
        let mut sum = _mm256_setzero_si256();
        for h in 0..2 {
            let q = ld256(&b[32 + 32 * h..]);
            for j in 0..4 {
                let lo = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m3);
                let hb = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h as i32 + j as i32)), one);
                let c = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 2));
                let s = 8 * h + 2 * j;
                let scv = halves16(sc[s] as i16, sc[s + 1] as i16);
                let u = ld256(&y[4 + 128 * h + 32 * j..]);
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(c, u), scv));
            }
        }
        let corr: i32 = (0..16).map(|s| sc[s] as i32 * bsum(y, s)).sum();
        let isum = hsum_i32(sum) - 4 * corr;
        acc += (f16_at(b, Q3K_D) * f32::from_le_bytes([y[0], y[1], y[2], y[3]])) * isum as f32;
    }
    acc
}
