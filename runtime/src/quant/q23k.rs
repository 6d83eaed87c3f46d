//! Q2_K (84 B) and Q3_K (110 B): 256-element super-blocks of sixteen 16-element
//! sub-blocks, 2- and 3-bit codes (ggml-common.h's `block_q2_K`, `block_q3_K`).
//!
//! ```text
//! Q2_K: u8 scales[16] | u8 qs[64] | f16 d | f16 dmin
//! Q3_K: u8 hmask[32] | u8 qs[64] | u8 scales[12] | f16 d
//! ```
//! Element `e = 128h + 32j + l` (h < 2, j < 4, l < 32) has the 2-bit code
//! `(qs[32h + l] >> 2j) & 3` and sub-block `e / 16`. Q2_K: scale byte `s` gives
//! `y = d·(s & 15)·q − dmin·(s >> 4)`. Q3_K: bit `4h + j` of `hmask[l]` clear subtracts 4
//! from the code; the 6-bit scales (low nibbles in bytes 0..8, high pairs in 8..12) are
//! offset by 32: `y = d·(sc − 32)·q`. Quantizers follow `quantize_row_q{2,3}_K_ref`.

use super::fit::{make_q3_quants, make_qkx2_quants, make_qkx3_quants, make_qp_quants, make_qx_quants, nearest_int};
use super::float::{f16_at, f16_bits, f32_at};
use super::q8k::{bsum, Q8K_QS, Q8_K_BYTES, QK_K};

pub(crate) const Q2_K_BYTES: usize = 84;
pub(crate) const Q3_K_BYTES: usize = 110;
pub(crate) const Q2K_QS: usize = 16;
pub(crate) const Q2K_D: usize = 80;
pub(crate) const Q3K_QS: usize = 32;
pub(crate) const Q3K_SCALES: usize = 96;
pub(crate) const Q3K_D: usize = 108;

/// The 256 2-bit codes of `qs` (64 bytes) in element order.
#[inline(always)]
fn codes2(qs: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for (e, q) in q.iter_mut().enumerate() {
        let (h, j, l) = (e / 128, (e % 128) / 32, e % 32);
        *q = (qs[32 * h + l] >> (2 * j)) & 3;
    }
    q
}

/// Pack 256 2-bit codes (element order) into 64 bytes.
fn pack2(l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        for i in 0..32 {
            let c = |k: usize| l[128 * h + i + 32 * k];
            qs[32 * h + i] = c(0) | (c(1) << 2) | (c(2) << 4) | (c(3) << 6);
        }
    }
}

/// Q3_K's sixteen scales, still offset by 32 (0..63).
#[inline(always)]
pub(crate) fn q3_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 15 } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q3_K's 256 signed codes (−4..3) in element order.
#[inline(always)]
fn codes3(b: &[u8]) -> [i8; QK_K] {
    let q2 = codes2(&b[Q3K_QS..Q3K_QS + 64]);
    let mut q = [0i8; QK_K];
    for (e, q) in q.iter_mut().enumerate() {
        let hbit = (b[e % 32] >> (e / 32)) & 1;
        *q = q2[e] as i8 - if hbit == 0 { 4 } else { 0 };
    }
    q
}

pub(crate) fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q2_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let (d, dmin) = (f16_at(b, Q2K_D), f16_at(b, Q2K_D + 2));
        let q = codes2(&b[Q2K_QS..Q2K_QS + 64]);
        for (e, y) in y.iter_mut().enumerate() {
            let sc = b[e / 16];
            let (dl, ml) = (d * (sc & 15) as f32, dmin * (sc >> 4) as f32);
            *y = dl * q[e] as f32 - ml;
        }
    }
}

pub(crate) fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q3_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, Q3K_D);
        let sc = q3_scales(&b[Q3K_SCALES..Q3K_SCALES + 12]);
        let q = codes3(b);
        for (e, y) in y.iter_mut().enumerate() {
            let dl = d * sc[e / 16] as f32;
            *y = dl * q[e] as f32;
        }
    }
}

/// `quantize_row_q2_K_ref`: per sub-block a scale and min fitted on `|x|` weights (mean
/// absolute error), both quantized to 4 bits against the super-block's largest.
pub(crate) fn quant_q2_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2_K_BYTES)) {
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins) = ([0f32; 16], [0f32; 16]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        let mut weights = [0f32; 16];
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (sc, mn) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = sc;
            mins[j] = mn;
            if sc > max_scale {
                max_scale = sc;
            }
            if mn > max_min {
                max_min = mn;
            }
        }
        let mut sc = [0u8; 16];
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                sc[j] = nearest_int(iscale * scales[j]) as u8;
            }
            b[Q2K_D..Q2K_D + 2].copy_from_slice(&f16_bits(max_scale / 15.0));
        } else {
            b[Q2K_D..Q2K_D + 2].copy_from_slice(&f16_bits(0.0));
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                sc[j] = (sc[j] as i32 | (nearest_int(iscale * mins[j]) << 4)) as u8;
            }
            b[Q2K_D + 2..Q2K_D + 4].copy_from_slice(&f16_bits(max_min / 15.0));
        } else {
            b[Q2K_D + 2..Q2K_D + 4].copy_from_slice(&f16_bits(0.0));
        }
        b[..16].copy_from_slice(&sc);
        finish_q2(x, b, &mut l);
    }
}

/// Q2_K's last step, shared by both quantizers: the codes again from the stored (rounded)
/// scales and mins, then packed.
fn finish_q2(x: &[f32], b: &mut [u8], l: &mut [u8; QK_K]) {
    let (d_all, dmin_all) = (f16_at(b, Q2K_D), f16_at(b, Q2K_D + 2));
    for j in 0..16 {
        let d = d_all * (b[j] & 15) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (b[j] >> 4) as f32;
        for i in 16 * j..16 * j + 16 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack2(l, &mut b[Q2K_QS..Q2K_QS + 64]);
}

/// `quantize_row_q2_K_impl` (llama-quantize with an importance matrix): per sub-block a
/// scale and min fitted under `qw·sqrt(σ² + x²)` (`make_qkx3_quants`), then the sixteen
/// scales and mins to 4 bits by `make_qp_quants` weighted by each sub-block's weight sum.
pub(crate) fn quant_q2_k_weighted(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let row = qw.len();
    for (k, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q2_K_BYTES)).enumerate() {
        let q = &qw[(k * QK_K) % row..][..QK_K];
        let sigma2 = x.iter().fold(0f32, |s, v| s + v * v) / QK_K as f32;
        let mut l = [0u8; QK_K];
        let (mut scales, mut mins, mut sw) = ([0f32; 16], [0f32; 16], [0f32; 16]);
        let mut weight = [0f32; 16];
        for j in 0..16 {
            for i in 0..16 {
                let v = x[16 * j + i];
                weight[i] = q[16 * j + i] * (sigma2 + v * v).sqrt();
            }
            sw[j] = weight.iter().fold(0f32, |s, &w| s + w);
            (scales[j], mins[j]) = make_qkx3_quants(3, &x[16 * j..16 * j + 16], &weight, &mut l[16 * j..16 * j + 16], -0.9, 0.05, 36);
        }
        let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        b[Q2K_D..Q2K_D + 2].copy_from_slice(&f16_bits(dm));
        b[Q2K_D + 2..Q2K_D + 4].copy_from_slice(&f16_bits(mm));
        for j in 0..16 {
            b[j] = ls[j] | (lm[j] << 4);
        }
        finish_q2(x, b, &mut l);
    }
}

/// `quantize_row_q3_K_ref`: per sub-block `make_q3_quants`, the sixteen scales to 6 bits
/// against the one of largest magnitude, then the codes again from the rounded scales.
pub(crate) fn quant_q3_k(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3_K_BYTES)) {
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut amax) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        let s = &mut b[Q3K_SCALES..Q3K_SCALES + 12];
        s.fill(0);
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                // ggml stores nearest_int(..) in an int8_t first.
                let lj = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
                let lj = lj as u8;
                if j < 8 {
                    s[j] = lj & 15;
                } else {
                    s[j - 8] |= (lj & 15) << 4;
                }
                s[8 + j % 4] |= (lj >> 4) << (2 * (j / 4));
            }
            b[Q3K_D..Q3K_D + 2].copy_from_slice(&f16_bits(1.0 / iscale));
        } else {
            b[Q3K_D..Q3K_D + 2].copy_from_slice(&f16_bits(0.0));
        }
        finish_q3(x, b, &mut l);
    }
}

/// Q3_K's last step, shared by both quantizers: the codes again from the stored scales,
/// then the high bits into `hmask` and the low two packed.
fn finish_q3(x: &[f32], b: &mut [u8], l: &mut [i8; QK_K]) {
    let d_all = f16_at(b, Q3K_D);
    let sc = q3_scales(&b[Q3K_SCALES..Q3K_SCALES + 12]);
    for j in 0..16 {
        let d = d_all * sc[j] as f32;
        if d == 0.0 {
            continue;
        }
        for i in 16 * j..16 * j + 16 {
            l[i] = (nearest_int(x[i] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    b[..32].fill(0);
    let mut l2 = [0u8; QK_K];
    for (e, &v) in l.iter().enumerate() {
        let mut v = v as u8;
        if v > 3 {
            b[e % 32] |= 1 << (e / 32);
            v -= 4;
        }
        l2[e] = v;
    }
    pack2(&l2, &mut b[Q3K_QS..Q3K_QS + 64]);
}

/// `quantize_row_q3_K_impl` (with an importance matrix): per sub-block `make_qx_quants`
/// under `qw·sqrt(σ² + x²)` (σ² twice the mean square), then the sixteen scales to 6 bits
/// by `make_qx_quants` weighted by each sub-block's weight sum.
pub(crate) fn quant_q3_k_weighted(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let row = qw.len();
    for (k, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q3_K_BYTES)).enumerate() {
        let q = &qw[(k * QK_K) % row..][..QK_K];
        let sigma2 = 2.0 * x.iter().fold(0f32, |s, v| s + v * v) / QK_K as f32;
        let mut l = [0i8; QK_K];
        let (mut scales, mut sw) = ([0f32; 16], [0f32; 16]);
        let mut weight = [0f32; 16];
        for j in 0..16 {
            for i in 0..16 {
                let v = x[16 * j + i];
                weight[i] = q[16 * j + i] * (sigma2 + v * v).sqrt();
            }
            sw[j] = weight.iter().fold(0f32, |s, &w| s + w);
            scales[j] = make_qx_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16], Some(&weight));
        }
        let mut ls = [0i8; 16];
        let d_block = make_qx_quants(32, &scales, &mut ls, Some(&sw));
        let s = &mut b[Q3K_SCALES..Q3K_SCALES + 12];
        s.fill(0);
        for j in 0..16 {
            let lj = ls[j] as u8;
            if j < 8 {
                s[j] = lj & 15;
            } else {
                s[j - 8] |= (lj & 15) << 4;
            }
            s[8 + j % 4] |= (lj >> 4) << (2 * (j / 4));
        }
        b[Q3K_D..Q3K_D + 2].copy_from_slice(&f16_bits(d_block));
        finish_q3(x, b, &mut l);
    }
}

/// Q2_K · Q8_K: per super-block the exact integers `Σ_s (sc_s & 15)·Σ q·u` and
/// `Σ_s (sc_s >> 4)·bsum_s`, then `dx·d·isum − dx·dmin·msum` added in block order, as
/// ggml's generic kernel (the AVX2 kernel keeps this order: the two agree bit for bit).
pub(crate) fn dot_q2_k(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(Q2_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let q = codes2(&b[Q2K_QS..Q2K_QS + 64]);
        let u = &y[Q8K_QS..Q8K_QS + QK_K];
        let mut isum = 0i32;
        let mut msum = 0i32;
        for s in 0..16 {
            let p: i32 = (16 * s..16 * s + 16).map(|i| q[i] as i32 * u[i] as i8 as i32).sum();
            isum += (b[s] & 15) as i32 * p;
            msum += (b[s] >> 4) as i32 * bsum(y, s);
        }
        acc += block_sum(b, y, isum, msum);
    }
    acc
}

/// Q2_K's float step for one super-block (shared with the AVX2 kernel).
#[inline(always)]
pub(crate) fn block_sum(b: &[u8], y: &[u8], isum: i32, msum: i32) -> f32 {
    let dx = f32_at(y, 0);
    let (dall, dmin) = (dx * f16_at(b, Q2K_D), dx * f16_at(b, Q2K_D + 2));
    dall * isum as f32 - dmin * msum as f32
}

/// Q3_K · Q8_K: `Σ_s (sc_s − 32)·Σ q·u` exact per super-block, times `d·dx`, in block
/// order.
pub(crate) fn dot_q3_k(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(Q3_K_BYTES).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let q = codes3(b);
        let sc = q3_scales(&b[Q3K_SCALES..Q3K_SCALES + 12]);
        let u = &y[Q8K_QS..Q8K_QS + QK_K];
        let mut isum = 0i32;
        for s in 0..16 {
            let p: i32 = (16 * s..16 * s + 16).map(|i| q[i] as i32 * u[i] as i8 as i32).sum();
            isum += sc[s] as i32 * p;
        }
        acc += (f16_at(b, Q3K_D) * f32_at(y, 0)) * isum as f32;
    }
    acc
}
