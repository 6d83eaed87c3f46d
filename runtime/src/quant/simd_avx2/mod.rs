//! AVX2 + FMA + F16C dot kernels, chosen at run time by [`super::dot::kernel`] only after
//! the CPU reported all three features. The only `unsafe` code of `quant`.
//!
//! Each kernel computes the same exact integer sums as its scalar twin (int8 products
//! through `maddubs`/`madd`, which cannot overflow for these code ranges), and scales
//! them in f32 lanes; only the order of the float additions differs from the scalar one.
//!
//! Callers pass `w`/`x` holding at least `n` elements' worth of blocks (the dispatchers
//! in `matmul` check sizes first); every load below goes through a bounds-checked slice.

use std::arch::x86_64::*;

mod kquant;

use super::dot::DotFn;
use super::types::GgmlType;

/// The AVX2 kernel for `ty`, if there is one. The caller has checked the CPU.
pub(crate) fn kernel(ty: GgmlType) -> Option<DotFn> {
    Some(match ty {
        GgmlType::F32 => dot_f32,
        GgmlType::F16 => dot_f16,
        GgmlType::BF16 => dot_bf16,
        GgmlType::Q4_0 => dot_q4_0,
        GgmlType::Q4_1 => dot_q4_1,
        GgmlType::Q5_0 => dot_q5_0,
        GgmlType::Q5_1 => dot_q5_1,
        GgmlType::Q8_0 => dot_q8_0,
        GgmlType::Q4_K => dot_q4_k,
        GgmlType::Q5_K => dot_q5_k,
        GgmlType::Q6_K => dot_q6_k,
        GgmlType::Q8_1 | GgmlType::Q8_K => return None,
    })
}

/// Safe entry points: each calls its `#[target_feature]` body.
macro_rules! entry {
    ($($name:ident => $body:path),* $(,)?) => {$(
        fn $name(w: &[u8], x: &[u8], n: usize) -> f32 {
            // SAFETY: these functions are reachable only through `kernel`, which
            // `dot::kernel` calls only after detecting AVX2, FMA and F16C.
            unsafe { $body(w, x, n) }
        }
    )*};
}

entry! {
    dot_f32 => f32_body, dot_f16 => f16_body, dot_bf16 => bf16_body,
    dot_q4_0 => q4_0_body, dot_q4_1 => q4_1_body, dot_q5_0 => q5_0_body,
    dot_q5_1 => q5_1_body, dot_q8_0 => q8_0_body,
    dot_q4_k => kquant::q4_k_body, dot_q5_k => kquant::q5_k_body,
    dot_q6_k => kquant::q6_k_body,
}

// ---- helpers --------------------------------------------------------------------------

/// 32 bytes from the start of `s` (bounds-checked).
#[inline(always)]
pub(crate) fn ld256(s: &[u8]) -> __m256i {
    let s = &s[..32];
    // SAFETY: `s` is 32 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// 16 bytes from the start of `s` (bounds-checked).
#[inline(always)]
pub(crate) fn ld128(s: &[u8]) -> __m128i {
    let s = &s[..16];
    // SAFETY: `s` is 16 readable bytes; `loadu` has no alignment requirement.
    unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) }
}

/// The f16 at `b[off..off+2]` as f32, through F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    let h = u16::from_le_bytes([b[off], b[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
}

/// Sum of the 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Σ over pairs of signed bytes `a·b`, as 8 i32 lanes (each lane: 4 products).
/// `maddubs` wants one unsigned operand: use |a| and b·sign(a).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_i8(a: __m256i, b: __m256i) -> __m256i {
    let p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

/// Σ over pairs of unsigned `a` (< 128) times signed `b`, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u8i8(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// 16 packed nibble bytes → 32 bytes: low nibbles (elements 0..15) then high (16..31).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles32(qs: &[u8]) -> __m256i {
    let t = ld128(qs);
    let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// The 32 bits of `qh` (LE u32) → 32 bytes, 0xFF where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bits32(qh: &[u8]) -> __m256i {
    let h = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    // byte k of the result takes source byte k/8 …
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(h),
        _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0),
    );
    // … and keeps only bit k%8.
    let sel = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel)
}

// ---- floats ---------------------------------------------------------------------------

#[target_feature(enable = "avx2,fma,f16c")]
fn f32_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let (w, x) = (&w[..4 * n], &x[..4 * n]);
    let mut acc = [_mm256_setzero_ps(); 4];
    let main = n / 32 * 32;
    for i in (0..main).step_by(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = 4 * (i + 8 * k);
            let wv = _mm256_castsi256_ps(ld256(&w[o..]));
            let xv = _mm256_castsi256_ps(ld256(&x[o..]));
            *a = _mm256_fmadd_ps(wv, xv, *a);
        }
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(acc);
    for i in main..n {
        s += super::float::dot_f32(&w[4 * i..], &x[4 * i..], 1);
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
fn f16_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let (w, x) = (&w[..2 * n], &x[..2 * n]);
    let mut acc = [_mm256_setzero_ps(); 4];
    let main = n / 32 * 32;
    for i in (0..main).step_by(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = 2 * (i + 8 * k);
            let wv = _mm256_cvtph_ps(ld128(&w[o..]));
            let xv = _mm256_cvtph_ps(ld128(&x[o..]));
            *a = _mm256_fmadd_ps(wv, xv, *a);
        }
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(acc);
    for i in main..n {
        s += super::float::dot_f16(&w[2 * i..], &x[2 * i..], 1);
    }
    s
}

#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    let (w, x) = (&w[..2 * n], &x[..2 * n]);
    let widen = |v: __m128i| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
    let mut acc = [_mm256_setzero_ps(); 4];
    let main = n / 32 * 32;
    for i in (0..main).step_by(32) {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = 2 * (i + 8 * k);
            *a = _mm256_fmadd_ps(widen(ld128(&w[o..])), widen(ld128(&x[o..])), *a);
        }
    }
    let acc = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(acc);
    for i in main..n {
        s += super::float::dot_bf16(&w[2 * i..], &x[2 * i..], 1);
    }
    s
}

// ---- 32-element blocks ------------------------------------------------------------------

/// Shared loop of the `_0` types against Q8_0 (34-byte blocks, codes at +2): `codes`
/// turns one weight block into 32 signed bytes `q − offset`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q_0_loop(w: &[u8], x: &[u8], n: usize, wb: usize, codes: impl Fn(&[u8]) -> __m256i) -> f32 {
    let nb = n / 32;
    let (w, x) = (&w[..nb * wb], &x[..nb * 34]);
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 1 < nb {
        let (b0, b1) = (&w[i * wb..], &w[(i + 1) * wb..]);
        let (y0, y1) = (&x[i * 34..], &x[(i + 1) * 34..]);
        let d0 = _mm256_set1_ps(f16_at(b0, 0) * f16_at(y0, 0));
        let d1 = _mm256_set1_ps(f16_at(b1, 0) * f16_at(y1, 0));
        let p0 = _mm256_cvtepi32_ps(dot_i8(codes(b0), ld256(&y0[2..])));
        let p1 = _mm256_cvtepi32_ps(dot_i8(codes(b1), ld256(&y1[2..])));
        acc0 = _mm256_fmadd_ps(d0, p0, acc0);
        acc1 = _mm256_fmadd_ps(d1, p1, acc1);
        i += 2;
    }
    if i < nb {
        let (b0, y0) = (&w[i * wb..], &x[i * 34..]);
        let d0 = _mm256_set1_ps(f16_at(b0, 0) * f16_at(y0, 0));
        acc0 = _mm256_fmadd_ps(d0, _mm256_cvtepi32_ps(dot_i8(codes(b0), ld256(&y0[2..]))), acc0);
    }
    hsum(_mm256_add_ps(acc0, acc1))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q8_0_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q_0_loop(w, x, n, 34, |b| ld256(&b[2..]))
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_0_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q_0_loop(w, x, n, 18, |b| {
        _mm256_sub_epi8(nibbles32(&b[2..]), _mm256_set1_epi8(8))
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_0_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q_0_loop(w, x, n, 22, |b| {
        // q − 16 as a signed byte: the low nibble, with 0xF0 OR-ed in where the fifth
        // bit is clear (x | 0xF0 = x − 16 in two's complement).
        let hi = _mm256_andnot_si256(bits32(&b[2..]), _mm256_set1_epi8(0xf0u8 as i8));
        _mm256_or_si256(nibbles32(&b[6..]), hi)
    })
}

/// Shared loop of the `_1` types against Q8_1 (36-byte blocks, `d`, `s`, codes at +4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q_1_loop(w: &[u8], x: &[u8], n: usize, wb: usize, codes: impl Fn(&[u8]) -> __m256i) -> f32 {
    let nb = n / 32;
    let (w, x) = (&w[..nb * wb], &x[..nb * 36]);
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for i in 0..nb {
        let (b, y) = (&w[i * wb..], &x[i * 36..]);
        let d = _mm256_set1_ps(f16_at(b, 0) * f16_at(y, 0));
        summs += f16_at(b, 2) * f16_at(y, 2);
        let p = _mm256_cvtepi32_ps(dot_u8i8(codes(b), ld256(&y[4..])));
        acc = _mm256_fmadd_ps(d, p, acc);
    }
    hsum(acc) + summs
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q4_1_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q_1_loop(w, x, n, 20, |b| {
        nibbles32(&b[4..])
    })
}

#[target_feature(enable = "avx2,fma,f16c")]
fn q5_1_body(w: &[u8], x: &[u8], n: usize) -> f32 {
    q_1_loop(w, x, n, 24, |b| {
        let hi = _mm256_and_si256(bits32(&b[4..]), _mm256_set1_epi8(0x10));
        _mm256_or_si256(nibbles32(&b[8..]), hi)
    })
}
