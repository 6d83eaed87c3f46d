//! The non-linear 4-bit formats: IQ4_NL (18 B per 32), IQ4_XS (136 B per 256) and
//! MXFP4 (17 B per 32), each a 4-bit index into a 16-value table of signed integers
//! (ggml-common.h's `block_iq4_nl`, `block_iq4_xs`, `block_mxfp4`).
//!
//! ```text
//! IQ4_NL: f16 d | u8 qs[16]                                   y = d·K[q]
//! IQ4_XS: f16 d | u16 scales_h | u8 scales_l[4] | u8 qs[128]  y = d·(ls_j − 32)·K[q]
//! MXFP4:  u8 e  | u8 qs[16]                                   y = 2^(e−128)·M[q]
//! ```
//! In every 32 elements, element `i < 16` is the low nibble of byte `i`, element
//! `i + 16` its high nibble. IQ4_XS's sub-block `j` (32 elements) has the 6-bit scale
//! `ls_j = (scales_l[j/2] >> 4(j%2)) & 15 | ((scales_h >> 2j) & 3) << 4`. MXFP4's `e`
//! is an E8M0 exponent, read as half its value (`ggml_e8m0_to_fp32_half`) because `M`
//! holds the E2M1 values doubled. Quantizers follow `quantize_row_iq4_nl_impl` (IQ4_NL
//! with 3 scale trials, IQ4_XS with 7) and `quantize_row_mxfp4_ref`.

use super::fit::{nearest_int, GROUP_MAX_EPS};
use super::float::{f16_at, f16_bits, f32_at};
use super::q8::{isum_i8, Q8_0_BYTES};
use super::q8k::{Q8K_QS, Q8_K_BYTES, QK_K};

pub(crate) const IQ4_NL_BYTES: usize = 18;
pub(crate) const IQ4_XS_BYTES: usize = 136;
pub(crate) const MXFP4_BYTES: usize = 17;

/// `kvalues_iq4nl`.
pub(crate) const K_IQ4: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// `kvalues_mxfp4`: the E2M1 values times two.
pub(crate) const K_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `ggml_e8m0_to_fp32_half`: `2^(e − 128)` (subnormal for e < 2).
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { (e as u32 - 1) << 23 };
    f32::from_bits(bits)
}

/// The 32 table values of a 16-byte nibble block, in element order.
#[inline(always)]
fn values32(qs: &[u8], k: &[i8; 16]) -> [i8; 32] {
    let mut v = [0i8; 32];
    for i in 0..16 {
        v[i] = k[(qs[i] & 15) as usize];
        v[i + 16] = k[(qs[i] >> 4) as usize];
    }
    v
}

/// IQ4_XS's eight 6-bit scales minus 32.
#[inline(always)]
pub(crate) fn xs_scales(b: &[u8]) -> [i32; 8] {
    let h = u16::from_le_bytes([b[2], b[3]]);
    let mut ls = [0i32; 8];
    for (j, l) in ls.iter_mut().enumerate() {
        let lo = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
        let hi = ((h >> (2 * j)) & 3) as u8;
        *l = (lo | (hi << 4)) as i32 - 32;
    }
    ls
}

pub(crate) fn dequant_iq4_nl(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ4_NL_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = f16_at(b, 0);
        for (y, v) in y.iter_mut().zip(values32(&b[2..], &K_IQ4)) {
            *y = d * v as f32;
        }
    }
}

pub(crate) fn dequant_iq4_xs(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(IQ4_XS_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, 0);
        let ls = xs_scales(b);
        for (j, y) in y.chunks_exact_mut(32).enumerate() {
            let dl = d * ls[j] as f32;
            for (y, v) in y.iter_mut().zip(values32(&b[8 + 16 * j..], &K_IQ4)) {
                *y = dl * v as f32;
            }
        }
    }
}

pub(crate) fn dequant_mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(MXFP4_BYTES).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for (y, v) in y.iter_mut().zip(values32(&b[1..], &K_MXFP4)) {
            *y = v as f32 * d;
        }
    }
}

/// ggml's `best_index_int8`: the index of the table value nearest `x` (ties to the
/// upper one), by bisection.
#[inline]
fn best_index(x: f32) -> u8 {
    let v = &K_IQ4;
    if x <= v[0] as f32 {
        return 0;
    }
    if x >= v[15] as f32 {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v[mav] as f32 {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - (v[mu - 1] as f32) < v[mu] as f32 - x {
        mu as u8 - 1
    } else {
        mu as u8
    }
}

/// The weights of a 32-element block: `qw·√(σ² + x²)` with an importance matrix (σ² twice
/// the mean square over `sup`, the super-block), else `x²`.
fn block_weights(sup: &[f32], ib: usize, qw: Option<&[f32]>) -> [f32; 32] {
    let x = &sup[32 * ib..32 * ib + 32];
    match qw {
        Some(q) => {
            let mut sigma2 = 0f32;
            for &v in sup {
                sigma2 += v * v;
            }
            sigma2 *= 2.0 / sup.len() as f32;
            std::array::from_fn(|j| q[32 * ib + j] * (sigma2 + x[j] * x[j]).sqrt())
        }
        None => std::array::from_fn(|j| x[j] * x[j]),
    }
}

/// One 32-element block's scale, by `quantize_row_iq4_nl_impl`'s search (weights `w`,
/// `ntry` trial scales either side), with its codes in `l`; 0 for an all-zero block.
fn fit_block(x: &[f32], w: &[f32; 32], l: &mut [u8], ntry: i32) -> f32 {
    let k0 = K_IQ4[0] as f32;
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let mut d = if ntry > 0 { -max / k0 } else { max / k0 };
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0f32, 0f32);
    for (j, &xj) in x.iter().enumerate() {
        let li = best_index(id * xj);
        l[j] = li;
        let q = K_IQ4[li as usize] as f32;
        sumqx += w[j] * q * xj;
        sumq2 += w[j] * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        id = (itry + K_IQ4[0] as i32) as f32 / max;
        (sumqx, sumq2) = (0.0, 0.0);
        for (j, &xj) in x.iter().enumerate() {
            let q = K_IQ4[best_index(id * xj) as usize] as f32;
            sumqx += w[j] * q * xj;
            sumq2 += w[j] * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Pack 32 codes into 16 nibble bytes.
fn pack_nibbles(l: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[16 + j] << 4);
    }
}

/// `quantize_iq4_nl`, what `llama-quantize` runs (`quantize_row_iq4_nl_impl(32, 32, …,
/// ntry 7)`), with importance weights `qw` (one per element of a row) or without.
pub(crate) fn quant_iq4_nl(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    for (ibl, (x, b)) in src.chunks_exact(32).zip(dst.chunks_exact_mut(IQ4_NL_BYTES)).enumerate() {
        let mut l = [0u8; 32];
        let w = block_weights(x, 0, qw.map(|q| &q[(ibl * 32) % q.len()..][..32]));
        let d = fit_block(x, &w, &mut l, 7);
        b[0..2].copy_from_slice(&f16_bits(d));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        for (l, &v) in l.iter_mut().zip(x) {
            *l = best_index(id * v);
        }
        pack_nibbles(&l, &mut b[2..]);
    }
}

/// `quantize_iq4_xs` (`quantize_row_iq4_nl_impl(256, 32, …, ntry 7)`), with importance
/// weights `qw` or without: a scale per 32, then those to 6 bits against the largest in
/// magnitude.
pub(crate) fn quant_iq4_xs(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    for (ibl, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(IQ4_XS_BYTES)).enumerate() {
        let qwb = qw.map(|q| &q[(ibl * QK_K) % q.len()..][..QK_K]);
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 8];
        let (mut max_scale, mut amax_scale) = (0f32, 0f32);
        for ib in 0..8 {
            let w = block_weights(x, ib, qwb);
            scales[ib] = fit_block(&x[32 * ib..32 * ib + 32], &w, &mut l[32 * ib..32 * ib + 32], 7);
            if scales[ib].abs() > amax_scale {
                amax_scale = scales[ib].abs();
                max_scale = scales[ib];
            }
        }
        let d = -max_scale / 32.0;
        b.fill(0);
        b[0..2].copy_from_slice(&f16_bits(d));
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut h = 0u16;
        for ib in 0..8 {
            let li = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * li as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index(idl * x[j]);
            }
            let lu = (li + 32) as u8;
            b[4 + ib / 2] |= (lu & 15) << (4 * (ib % 2));
            h |= ((lu >> 4) as u16) << (2 * ib);
        }
        b[2..4].copy_from_slice(&h.to_le_bytes());
        for ib in 0..8 {
            pack_nibbles(&l[32 * ib..32 * ib + 32], &mut b[8 + 16 * ib..8 + 16 * ib + 16]);
        }
    }
}

/// `quantize_row_mxfp4_ref`: the exponent from `floor(log2(amax)) − 2`, each element
/// the nearest table value (the first on ties).
pub(crate) fn quant_mxfp4(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(MXFP4_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| if m < v.abs() { v.abs() } else { m });
        // C converts the float to uint8_t; the exponents of finite f32 stay in 0..=254.
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
        let d = e8m0_half(e);
        b[0] = e;
        let best = |v: f32| {
            let mut bi = 0usize;
            let mut be = (K_MXFP4[0] as f32 * d - v).abs();
            for (i, &k) in K_MXFP4.iter().enumerate().skip(1) {
                let err = (k as f32 * d - v).abs();
                if err < be {
                    bi = i;
                    be = err;
                }
            }
            bi as u8
        };
        for j in 0..16 {
            b[1 + j] = best(x[j]) | (best(x[16 + j]) << 4);
        }
    }
}

/// Σ over one 32-element nibble block of `K[q]·u` (`u`: 32 int8 activation codes).
#[inline(always)]
fn isum_table(qs: &[u8], k: &[i8; 16], u: &[u8]) -> i32 {
    let v = values32(qs, k);
    let vb: [u8; 32] = v.map(|x| x as u8);
    isum_i8(&vb, &u[..32])
}

/// IQ4_NL · Q8_0: per block `(d·dx)` times the exact `Σ K[q]·u`, added in block order
/// (as ggml's generic kernel; the AVX2 kernel keeps this order, so the two agree bit for
/// bit).
pub(crate) fn dot_iq4_nl(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(IQ4_NL_BYTES).zip(x.chunks_exact(Q8_0_BYTES)).take(n / 32) {
        let s = isum_table(&b[2..], &K_IQ4, &y[2..]);
        acc += (f16_at(b, 0) * f16_at(y, 0)) * s as f32;
    }
    acc
}

/// MXFP4 · Q8_0: as IQ4_NL with `2^(e−128)` for the weight scale.
pub(crate) fn dot_mxfp4(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(MXFP4_BYTES).zip(x.chunks_exact(Q8_0_BYTES)).take(n / 32) {
        let s = isum_table(&b[1..], &K_MXFP4, &y[2..]);
        acc += (f16_at(y, 0) * e8m0_half(b[0])) * s as f32;
    }
    acc
}

/// IQ4_XS · Q8_K: `Σ_j (ls_j − 32)·Σ K[q]·u` exact per super-block, times `d·dx`.
pub(crate) fn dot_iq4_xs(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(IQ4_XS_BYTES).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let ls = xs_scales(b);
        let mut isum = 0i32;
        for (j, l) in ls.iter().enumerate() {
            isum += l * isum_table(&b[8 + 16 * j..], &K_IQ4, &y[Q8K_QS + 32 * j..]);
        }
        acc += (f16_at(b, 0) * f32_at(y, 0)) * isum as f32;
    }
    acc
}
