//! AVX2 kernels for the 32-element block types, four weight rows at a time against one
//! activation row: each activation block is loaded, its scale converted and its code
//! sums formed once for the four rows, and the four rows give four independent FMA
//! chains. Decode (one token) is a long run of such dots, so this is its inner loop.
//!
//! Integer identities (exact, as in the scalar twins):
//! * Q8_0 · Q8_0: `Σ w·y = Σ |w| · (y·sign w)` (`maddubs` needs one unsigned side).
//! * Q4_0 / Q5_0 · Q8_0: codes kept unsigned, `Σ (q − o)·y = Σ q·y − o·Σ y`, with
//!   `Σ y` (per 4-byte lane) computed once per activation block for all rows.
//! * Q4_1 / Q5_1 · Q8_1: `Σ q·y` plus the min term `m·s`, both f16 pairs converted
//!   together: `(d_w, m_w)·(d_y, s_y)` = `(d, m·s)` in one multiply.

use std::arch::x86_64::*;

use super::{dot_u8i8, hsum};

/// 32 bytes at `p`.
///
/// # Safety
/// `p..p+32` must be readable.
#[inline(always)]
unsafe fn ldp256(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 32 readable bytes; `loadu` needs no alignment.
    unsafe { _mm256_loadu_si256(p as *const __m256i) }
}

/// The two f16 at `p` as the low two f32 lanes.
///
/// # Safety
/// `p..p+4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16x2(p: *const u8) -> __m128 {
    // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
    let v = unsafe { (p as *const i32).read_unaligned() };
    _mm_cvtph_ps(_mm_cvtsi32_si128(v))
}

/// 16 packed nibble bytes at `p` → 32 bytes: low nibbles (elements 0..15), then high.
///
/// # Safety
/// `p..p+16` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 16 readable bytes; `loadu` needs no alignment.
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0f))
}

/// The 32 bits at `p` (LE u32) → 32 bytes, 0x10 where the bit is set (a fifth code bit).
///
/// # Safety
/// `p..p+4` must be readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit4_32(p: *const u8) -> __m256i {
    // SAFETY: the caller guarantees 4 readable bytes; unaligned read.
    let h = unsafe { (p as *const i32).read_unaligned() };
    // byte k takes source byte k/8, keeps bit k%8, and becomes 0x10 if it was set.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(h),
        _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0,
        ),
    );
    let sel = _mm256_set1_epi64x(0x8040201008040201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, sel), sel);
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// What one activation block offers every weight row.
#[derive(Clone, Copy)]
struct Act {
    /// The 32 codes.
    q: __m256i,
    /// Per 4-byte lane `Σ y` times the weight type's code offset (Q4_0: 8, Q5_0: 16);
    /// unused (a copy of `q`) otherwise.
    aux: __m256i,
    /// (d, s) of the activation block (s only for Q8_1).
    ds: __m128,
}

/// `R` weight rows against one activation row. `yb`: activation block bytes (34 or
/// 36; codes at `yb − 32`); `wb`: weight block bytes; `isum(block, act)` = the per-lane
/// exact code sums of one weight block; `prep(act_block)` builds [`Act`]. With
/// `MIN_TERM` the second lane of `(d_w, m_w)·(d_y, s_y)` is added (the `_1` types).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn rows_r<const R: usize, const MIN_TERM: bool>(
    w: *const u8,
    row_bytes: usize,
    x: *const u8,
    nb: usize,
    wb: usize,
    yb: usize,
    prep: &impl Fn(*const u8) -> Act,
    isum: &impl Fn(*const u8, &Act) -> __m256i,
) -> [f32; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    let mut acc_m = [_mm_setzero_ps(); R];
    for i in 0..nb {
        // SAFETY: `rows` checked that x holds nb blocks of yb bytes.
        let y = unsafe { x.add(i * yb) };
        let a = prep(y);
        for k in 0..R {
            // SAFETY: `rows` checked that w holds R rows of row_bytes = nb·wb bytes.
            let b = unsafe { w.add(k * row_bytes + i * wb) };
            // SAFETY: a weight block is ≥ 18 bytes, so 4 bytes at its start are readable.
            let dm = _mm_mul_ps(unsafe { f16x2(b) }, a.ds);
            if MIN_TERM {
                acc_m[k] = _mm_add_ps(acc_m[k], dm);
            }
            let p = _mm256_cvtepi32_ps(isum(b, &a));
            acc[k] = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), p, acc[k]);
        }
    }
    let mut out = [0f32; R];
    for k in 0..R {
        out[k] = hsum(acc[k]);
        if MIN_TERM {
            out[k] += _mm_cvtss_f32(_mm_movehdup_ps(acc_m[k]));
        }
    }
    out
}

/// All rows of `out`, four at a time, after checking the buffer sizes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn rows<const MIN_TERM: bool>(
    w: &[u8],
    x: &[u8],
    n: usize,
    out: &mut [f32],
    wb: usize,
    yb: usize,
    prep: impl Fn(*const u8) -> Act,
    isum: impl Fn(*const u8, &Act) -> __m256i,
) {
    let nb = n / 32;
    let row_bytes = nb * wb;
    let w = &w[..out.len() * row_bytes];
    let x = &x[..nb * yb];
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut r = 0;
    while r + 4 <= out.len() {
        // SAFETY: rows r..r+4 lie inside `w` (sliced above).
        let wr = unsafe { wp.add(r * row_bytes) };
        let v = rows_r::<4, MIN_TERM>(wr, row_bytes, xp, nb, wb, yb, &prep, &isum);
        out[r..r + 4].copy_from_slice(&v);
        r += 4;
    }
    while r < out.len() {
        // SAFETY: row r lies inside `w`.
        let wr = unsafe { wp.add(r * row_bytes) };
        out[r] = rows_r::<1, MIN_TERM>(wr, row_bytes, xp, nb, wb, yb, &prep, &isum)[0];
        r += 1;
    }
}

/// All rows of `out` one after another (one weight stream, which the hardware
/// prefetcher follows best when the weights come from memory), with every activation
/// block prepared once for all rows. Per row the same arithmetic as [`rows_r`] with
/// `R = 1`, so the same results.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn stream<const MIN_TERM: bool>(
    w: &[u8],
    x: &[u8],
    n: usize,
    out: &mut [f32],
    wb: usize,
    yb: usize,
    prep: impl Fn(*const u8) -> Act,
    isum: impl Fn(*const u8, &Act) -> __m256i,
) {
    let nb = n / 32;
    let row_bytes = nb * wb;
    let w = &w[..out.len() * row_bytes];
    let x = &x[..nb * yb];
    // SAFETY: block i of `x` lies inside `x` (sliced above).
    let acts: Vec<Act> = (0..nb).map(|i| prep(unsafe { x.as_ptr().add(i * yb) })).collect();
    for (o, wr) in out.iter_mut().zip(w.chunks_exact(row_bytes.max(1))) {
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        let wp = wr.as_ptr();
        for (i, a) in acts.iter().enumerate() {
            // SAFETY: block i of the row lies inside `wr` (nb blocks of wb bytes).
            let b = unsafe { wp.add(i * wb) };
            // SAFETY: a weight block is ≥ 18 bytes, so 4 bytes at its start are readable.
            let dm = _mm_mul_ps(unsafe { f16x2(b) }, a.ds);
            if MIN_TERM {
                acc_m = _mm_add_ps(acc_m, dm);
            }
            let p = _mm256_cvtepi32_ps(isum(b, a));
            acc = _mm256_fmadd_ps(_mm256_broadcastss_ps(dm), p, acc);
        }
        *o = hsum(acc);
        if MIN_TERM {
            *o += _mm_cvtss_f32(_mm_movehdup_ps(acc_m));
        }
    }
}

/// Activation block of Q8_0 (`d` at 0, codes at 2) with `Σ y · offset` per lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prep_q8_0(y: *const u8, offset_shift: i32) -> Act {
    // SAFETY: `rows` passes pointers to whole 34-byte blocks.
    let (q, ds) = unsafe { (ldp256(y.add(2)), f16x2(y)) };
    let sum = dot_u8i8(_mm256_set1_epi8(1), q);
    Act {
        q,
        aux: _mm256_sll_epi32(sum, _mm_cvtsi32_si128(offset_shift)),
        ds,
    }
}

/// Activation block of Q8_0 (`d` at 0, codes at 2), codes only.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prep_q8_0_codes(y: *const u8) -> Act {
    // SAFETY: `rows` passes pointers to whole 34-byte blocks.
    let (q, ds) = unsafe { (ldp256(y.add(2)), f16x2(y)) };
    Act { q, aux: q, ds }
}

/// Activation block of Q8_1 (`d`, `s` at 0, codes at 4).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn prep_q8_1(y: *const u8) -> Act {
    // SAFETY: `rows` passes pointers to whole 36-byte blocks.
    let (q, ds) = unsafe { (ldp256(y.add(4)), f16x2(y)) };
    Act { q, aux: q, ds }
}

/// One weight type's pair of kernels from one block recipe: `$rows` (many weight rows,
/// [`rows`]) and `$stream` (one weight stream for decode, [`stream`]). `$min`: the block
/// has a min term; `$wb` / `$yb`: weight / activation block bytes.
macro_rules! row_kernels {
    ($rows:ident, $stream:ident, $min:literal, $wb:literal, $yb:literal, $prep:expr, $isum:expr) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $rows(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
            rows::<$min>(w, x, n, out, $wb, $yb, $prep, $isum);
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $stream(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
            stream::<$min>(w, x, n, out, $wb, $yb, $prep, $isum);
        }
    };
}

// Σ w·y = Σ |w| · (y·sign w): |w| is read unsigned, so a weight code of −128 (never
// written by a quantizer, but legal in a file) still multiplies correctly; activation
// codes are within ±127.
row_kernels!(q8_0_rows, q8_0_stream, false, 34, 34, |y| prep_q8_0_codes(y), |b: *const u8, a: &Act| {
    // SAFETY: the kernels pass pointers to whole 34-byte weight blocks.
    let wq = unsafe { ldp256(b.add(2)) };
    dot_u8i8(_mm256_abs_epi8(wq), _mm256_sign_epi8(a.q, wq))
});

row_kernels!(q4_0_rows, q4_0_stream, false, 18, 34, |y| prep_q8_0(y, 3), |b: *const u8, a: &Act| {
    // SAFETY: the kernels pass pointers to whole 18-byte weight blocks.
    _mm256_sub_epi32(dot_u8i8(unsafe { nibbles32(b.add(2)) }, a.q), a.aux)
});

row_kernels!(q5_0_rows, q5_0_stream, false, 22, 34, |y| prep_q8_0(y, 4), |b: *const u8, a: &Act| {
    // SAFETY: the kernels pass pointers to whole 22-byte weight blocks.
    let q = unsafe { _mm256_or_si256(nibbles32(b.add(6)), bit4_32(b.add(2))) };
    _mm256_sub_epi32(dot_u8i8(q, a.q), a.aux)
});

row_kernels!(q4_1_rows, q4_1_stream, true, 20, 36, |y| prep_q8_1(y), |b: *const u8, a: &Act| {
    // SAFETY: the kernels pass pointers to whole 20-byte weight blocks.
    dot_u8i8(unsafe { nibbles32(b.add(4)) }, a.q)
});

row_kernels!(q5_1_rows, q5_1_stream, true, 24, 36, |y| prep_q8_1(y), |b: *const u8, a: &Act| {
    // SAFETY: the kernels pass pointers to whole 24-byte weight blocks.
    let q = unsafe { _mm256_or_si256(nibbles32(b.add(8)), bit4_32(b.add(4))) };
    dot_u8i8(q, a.q)
});

/// Expanded `_1` blocks (`f16 d`, `f16 m`, 32 × u8 codes; see `q32::expand`) · Q8_1.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn u8_1_rows(w: &[u8], x: &[u8], n: usize, out: &mut [f32]) {
    // SAFETY (closure): `rows` passes pointers to whole 36-byte weight blocks.
    let isum = |b: *const u8, a: &Act| dot_u8i8(unsafe { ldp256(b.add(4)) }, a.q);
    rows::<true>(w, x, n, out, 36, 36, |y| prep_q8_1(y), isum);
}
