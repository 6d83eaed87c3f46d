//! AVX2 dots of the grid types (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M)
//! against Q8_K. Each sub-block is unpacked by the scalar kernel's own `grid::sub` (the
//! grid words, sign bits and scales); the 32 products are `maddubs` of the unsigned grid
//! bytes with the activation codes, the signs applied as `Σ g·q − 2·Σ_neg g·q` (IQ1's
//! signed grid as `Σ (g + 1)·q − Σ q`), so the integer sums equal the scalar ones for any
//! codes; each super-block's float step is the scalar `grid::block_step`.

use std::arch::x86_64::*;

use super::super::grid::{block_step, final_scale, sub};
use super::super::types::GgmlType;
use super::ld256;
use super::lowbit::{halves16, hsum_i32};

const Q8K: usize = 292;

/// 0xff in byte e where bit e of `bits` is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bit_mask(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    let idx = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, idx), sel), sel)
}

/// Σ over the two 16-element halves of `a·q` (a unsigned bytes ≤ 127), times the halves'
/// scales, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scaled(a: __m256i, q: __m256i, sc: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, q), sc)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn body(ty: GgmlType, w: &[u8], x: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let nb = n / 256;
    let (w, x) = (&w[..nb * bb], &x[..nb * Q8K]);
    let iq1 = matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M);
    let one = _mm256_set1_epi8(1);
    let mut acc = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[bb * i..bb * (i + 1)], &x[Q8K * i..Q8K * (i + 1)]);
        let (mut isum, mut dsum) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let s = sub(ty, b, ib);
            let g = _mm256_set_epi64x(s.g[3] as i64, s.g[2] as i64, s.g[1] as i64, s.g[0] as i64);
            let q = ld256(&y[4 + 32 * ib..]);
            let sc = halves16(s.ls[0] as i16, s.ls[1] as i16);
            if iq1 {
                let qsum = scaled(one, q, sc);
                isum = _mm256_add_epi32(isum, _mm256_sub_epi32(scaled(_mm256_add_epi8(g, one), q, sc), qsum));
                let d = |l: usize| if (s.neg_delta >> l) & 1 != 0 { 0i64 } else { 0x0202_0202_0202_0202 };
                let dsel = _mm256_set_epi64x(d(3), d(2), d(1), d(0));
                dsum = _mm256_add_epi32(dsum, _mm256_sub_epi32(scaled(dsel, q, sc), qsum));
            } else {
                let neg = _mm256_and_si256(g, bit_mask(s.signs));
                let sc2 = _mm256_add_epi16(sc, sc);
                isum = _mm256_add_epi32(isum, _mm256_sub_epi32(scaled(g, q, sc), scaled(neg, q, sc2)));
            }
        }
        acc += block_step(ty, b, y, hsum_i32(isum), if iq1 { hsum_i32(dsum) } else { 0 });
    }
    final_scale(ty) * acc
}

macro_rules! bodies {
    ($($name:ident => $ty:ident;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $name(w: &[u8], x: &[u8], n: usize) -> f32 {
            body(GgmlType::$ty, w, x, n)
        }
    )*};
}

bodies! {
    iq3_s_body => IQ3_S;
    iq3_xxs_body => IQ3_XXS;
    iq2_xxs_body => IQ2_XXS;
    iq2_xs_body => IQ2_XS;
    iq2_s_body => IQ2_S;
    iq1_s_body => IQ1_S;
    iq1_m_body => IQ1_M;
}
