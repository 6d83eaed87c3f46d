//! AVX2 + FMA + F16C dot kernels, chosen at run time by `super::dot::kernel` only after
//! the CPU reported all three features. The only `unsafe` code of `quant`.
//!
//! Each kernel computes the same exact integer sums as its scalar twin (int8 products
//! through `maddubs`/`madd`, which cannot overflow for these code ranges), and scales
//! them in f32 lanes; only the order of the float additions differs from the scalar one.
//!
//! Loads go through bounds-checked slices, or through raw pointers into slices whose
//! length each kernel checked once at its entry (a short buffer panics there; the
//! dispatchers in `matmul` check sizes first, so it never happens).

use std::arch::x86_64::*;

mod grid;
mod kquant;
mod lowbit;
mod q32;
mod quantize;

/// The AVX2 activation quantizer for `ty` (Q8_0, Q8_1), if there is one. The caller
/// has checked the CPU; `src`/`dst` must be whole blocks of matching counts.
pub(crate) fn quantizer(ty: GgmlType) -> Option<fn(&[f32], &mut [u8])> {
    fn q8_0(src: &[f32], dst: &mut [u8]) {
        // SAFETY: reachable only through `quantizer`, which `matmul` calls only after
        // detecting AVX2, FMA and F16C.
        unsafe { quantize::quant_q8_0(src, dst) }
    }
    fn q8_1(src: &[f32], dst: &mut [u8]) {
        // SAFETY: as above.
        unsafe { quantize::quant_q8_1(src, dst) }
    }
    match ty {
        GgmlType::Q8_0 => Some(q8_0),
        GgmlType::Q8_1 => Some(q8_1),
        _ => None,
    }
}

use super::{DotFn, RowsFn};
use super::types::GgmlType;

/// The AVX2 kernels for `ty` (one row; many rows), if there are. The caller has checked
/// the CPU.
pub(crate) fn kernels(ty: GgmlType) -> Option<(DotFn, RowsFn)> {
    Some(match ty {
        GgmlType::F32 => (dot_f32, rows_f32),
        GgmlType::F16 => (dot_f16, rows_f16),
        GgmlType::BF16 => (dot_bf16, rows_bf16),
        GgmlType::Q4_0 => (dot_q4_0, rows_q4_0),
        GgmlType::Q4_1 => (dot_q4_1, rows_q4_1),
        GgmlType::Q5_0 => (dot_q5_0, rows_q5_0),
        GgmlType::Q5_1 => (dot_q5_1, rows_q5_1),
        GgmlType::Q8_0 => (dot_q8_0, rows_q8_0),
        GgmlType::Q4_K => (dot_q4_k, rows_q4_k),
        GgmlType::Q5_K => (dot_q5_k, rows_q5_k),
        GgmlType::Q6_K => (dot_q6_k, rows_q6_k),
        GgmlType::Q2_K => (dot_q2_k, rows_q2_k),
        GgmlType::Q3_K => (dot_q3_k, rows_q3_k),
        GgmlType::IQ4_NL => (dot_iq4_nl, rows_iq4_nl),
        GgmlType::IQ4_XS => (dot_iq4_xs, rows_iq4_xs),
        GgmlType::MXFP4 => (dot_mxfp4, rows_mxfp4),
        GgmlType::IQ3_S => (dot_iq3_s, rows_iq3_s),
        GgmlType::IQ3_XXS => (dot_iq3_xxs, rows_iq3_xxs),
        GgmlType::IQ2_XXS => (dot_iq2_xxs, rows_iq2_xxs),
        GgmlType::IQ2_XS => (dot_iq2_xs, rows_iq2_xs),
        GgmlType::IQ2_S => (dot_iq2_s, rows_iq2_s),
        GgmlType::IQ1_S => (dot_iq1_s, rows_iq1_s),
        GgmlType::IQ1_M => (dot_iq1_m, rows_iq1_m),
        _ => return None,
    })
}

/// Safe entry points for kernels written one row at a time: `dot_*` calls the body,
/// `rows_*` calls it per row.
macro_rules! row_entry {
    ($($dot:ident, $rows:ident => $body:path;)*) => {$(
        fn $dot(w: &[u8], x: &[u8], n: usize) -> f32 {
            // SAFETY: reachable only through `kernels`, which `dot::kernel` calls only
            // after detecting AVX2, FMA and F16C.
            unsafe { $body(w, x, n) }
        }
        fn $rows(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
            let rb = if out.is_empty() { 0 } else { w.len() / out.len() };
            for (o, wr) in out.iter_mut().zip(w.chunks(rb.max(1))) {
                *o = $dot(wr, x, n);
            }
        }
    )*};
}

/// Safe entry points for kernels written for many rows: `rows_*` calls the body, `dot_*`
/// is the one-row case.
macro_rules! rows_entry {
    ($($dot:ident, $rows:ident => $body:path;)*) => {$(
        fn $rows(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
            // SAFETY: reachable only through `kernels`, which `dot::kernel` calls only
            // after detecting AVX2, FMA and F16C.
            unsafe { $body(w, x, n, out) }
        }
        fn $dot(w: &[u8], x: &[u8], n: usize) -> f32 {
            let mut o = [0f32];
            $rows(w, x, n, &mut o);
            o[0]
        }
    )*};
}

row_entry! {
    dot_f32, rows_f32 => f32_body;
    dot_f16, rows_f16 => f16_body;
    dot_bf16, rows_bf16 => bf16_body;
    dot_q4_k, rows_q4_k => kquant::q4_k_body;
    dot_q5_k, rows_q5_k => kquant::q5_k_body;
    dot_q6_k, rows_q6_k => kquant::q6_k_body;
    dot_q2_k, rows_q2_k => lowbit::q2_k_body;
    dot_q3_k, rows_q3_k => lowbit::q3_k_body;
    dot_iq4_nl, rows_iq4_nl => lowbit::iq4_nl_body;
    dot_iq4_xs, rows_iq4_xs => lowbit::iq4_xs_body;
    dot_mxfp4, rows_mxfp4 => lowbit::mxfp4_body;
    dot_iq3_s, rows_iq3_s => grid::iq3_s_body;
    dot_iq3_xxs, rows_iq3_xxs => grid::iq3_xxs_body;
    dot_iq2_xxs, rows_iq2_xxs => grid::iq2_xxs_body;
    dot_iq2_xs, rows_iq2_xs => grid::iq2_xs_body;
    dot_iq2_s, rows_iq2_s => grid::iq2_s_body;
    dot_iq1_s, rows_iq1_s => grid::iq1_s_body;
    dot_iq1_m, rows_iq1_m => grid::iq1_m_body;
}

rows_entry! {
    dot_q4_0, rows_q4_0 => q32::q4_0_rows;
    dot_q4_1, rows_q4_1 => q32::q4_1_rows;
    dot_q5_0, rows_q5_0 => q32::q5_0_rows;
    dot_q5_1, rows_q5_1 => q32::q5_1_rows;
    dot_q8_0, rows_q8_0 => q32::q8_0_rows;
}

/// Safe entry points for the one-stream kernels of [`q32`].
macro_rules! stream_entry {
    ($($name:ident => $body:path;)*) => {$(
        fn $name(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
            // SAFETY: reachable only through `stream_kernel`, which `dot::stream_kernel`
            // calls only after detecting AVX2, FMA and F16C.
            unsafe { $body(w, x, n, out) }
        }
    )*};
}

stream_entry! {
    stream_q4_0 => q32::q4_0_stream;
    stream_q4_1 => q32::q4_1_stream;
    stream_q5_0 => q32::q5_0_stream;
    stream_q5_1 => q32::q5_1_stream;
    stream_q8_0 => q32::q8_0_stream;
}

/// The kernel that runs many rows of `ty` as one stream (decode), where there is one.
pub(crate) fn stream_kernel(ty: GgmlType) -> Option<RowsFn> {
    Some(match ty {
        GgmlType::Q4_0 => stream_q4_0,
        GgmlType::Q4_1 => stream_q4_1,
        GgmlType::Q5_0 => stream_q5_0,
        GgmlType::Q5_1 => stream_q5_1,
        GgmlType::Q8_0 => stream_q8_0,
        _ => return None,
    })
}

fn rows_u8_1(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
    // SAFETY: reachable only through `expanded_kernel`, which `dot::expanded_kernel`
    // calls only after detecting AVX2, FMA and F16C.
    unsafe { q32::u8_1_rows(w, x, n, out) }
}

/// Four tokens against rows of `ty` in their stored form (the K-quants: one unpack of
/// each weight super-block for the four), where there is such a kernel.
pub(crate) fn tokens4(ty: GgmlType) -> Option<super::Tokens4Fn> {
    macro_rules! per_row {
        ($name:ident, $body:path, $bytes:expr) => {
            fn $name(w: &[u8], xs: [&[u8]; 4], n: usize, out: &mut [f32]) {
                let rows = out.len() / 4;
                let rb = n / 256 * $bytes;
                for r in 0..rows {
                    // SAFETY: reachable only through `tokens4`, which `dot::tokens4` calls
                    // only after detecting AVX2, FMA and F16C.
                    let v = unsafe { $body(&w[r * rb..(r + 1) * rb], xs, n) };
                    for (t, v) in v.into_iter().enumerate() {
                        out[t * rows + r] = v;
                    }
                }
            }
        };
    }
    per_row!(q4_k, kquant::q4_k_body4, 144);
    per_row!(q5_k, kquant::q5_k_body4, 176);
    per_row!(q6_k, kquant::q6_k_body4, 210);
    match ty {
        GgmlType::Q4_K => Some(q4_k),
        GgmlType::Q5_K => Some(q5_k),
        GgmlType::Q6_K => Some(q6_k),
        _ => None,
    }
}

/// Kernels (one token; four tokens) that sum as llama.cpp's CPU backend does for a
/// batch of ≥ 8 tokens where that order differs from its one-token order (Q6_K: its
/// tiled GEMM), or `None`.
pub(crate) fn batch_order(ty: GgmlType) -> Option<(RowsFn, super::Tokens4Fn)> {
    fn rows_q6_k_tiled(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
        let rb = n / 256 * 210;
        for (o, wr) in out.iter_mut().zip(w.chunks(rb.max(1))) {
            // SAFETY: reachable only through `batch_order`, which `dot::batch_order`
            // calls only after detecting AVX2, FMA and F16C.
            *o = unsafe { kquant::q6_k_body_tiled(wr, x, n) };
        }
    }
    fn tokens4_q6_k_tiled(w: &[u8], xs: [&[u8]; 4], n: usize, out: &mut [f32]) {
        let rows = out.len() / 4;
        let rb = n / 256 * 210;
        for r in 0..rows {
            // SAFETY: as above.
            let v = unsafe { kquant::q6_k_body4_tiled(&w[r * rb..(r + 1) * rb], xs, n) };
            for (t, v) in v.into_iter().enumerate() {
                out[t * rows + r] = v;
            }
        }
    }
    match ty {
        GgmlType::Q6_K => Some((rows_q6_k_tiled, tokens4_q6_k_tiled)),
        _ => None,
    }
}

/// The many-row kernel for a band expanded by `q32::expand` from weights of type `ty`.
pub(crate) fn expanded_kernel(ty: GgmlType) -> Option<RowsFn> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 => Some(rows_q8_0),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some(rows_u8_1),
        _ => None,
    }
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

/// Σ over pairs of unsigned `a` (< 128) times signed `b`, as 8 i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_u8i8(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
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
