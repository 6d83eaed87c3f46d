//! Q4_K (144 B) and Q5_K (176 B): 256-element super-blocks of eight 32-element
//! sub-blocks, each with a 6-bit scale and a 6-bit min (reference §2.4).
//!
//! ```text
//! Q4_K: f16 d | f16 dmin | u8 scales[12] | u8 qs[128]
//! Q5_K: f16 d | f16 dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//! ```
//! Element `64c + l` is the low nibble of `qs[32c + l]`, element `64c + 32 + l` the high
//! nibble; Q5_K's fifth bit of those is bit `2c` / `2c + 1` of `qh[l]`.
//! `y = d·sc_j·q − dmin·m_j`. Quantizers follow `quantize_row_q{4,5}_K_ref`.

use super::fit::{make_qkx2_quants, make_qkx3_quants, make_qp_quants, nearest_int};
use super::float::{f16_at, f16_bits, f32_at};
use super::q8k::{bsum, Q8K_QS, Q8_K_BYTES, QK_K};

pub(crate) const Q4_K_BYTES: usize = 144;
pub(crate) const Q5_K_BYTES: usize = 176;

/// Sub-block j's (scale, min) from the packed 12 bytes (ggml's `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn scale_min(s: &[u8], j: usize) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// All eight (scale, min) pairs.
#[inline(always)]
pub(crate) fn scales_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        (sc[j], m[j]) = scale_min(s, j);
    }
    (sc, m)
}

/// Pack eight 6-bit (scale, min) pairs into 12 bytes.
fn pack_scales(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 15) | ((lm[j] & 15) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// The 256 codes of a Q4_K (`qh = None`) or Q5_K super-block, in element order.
#[inline(always)]
fn codes(qs: &[u8], qh: Option<&[u8]>) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let b = qs[32 * c + l];
            let (hi0, hi1) = match qh {
                Some(h) => (
                    ((h[l] >> (2 * c)) & 1) << 4,
                    ((h[l] >> (2 * c + 1)) & 1) << 4,
                ),
                None => (0, 0),
            };
            q[64 * c + l] = (b & 15) | hi0;
            q[64 * c + 32 + l] = (b >> 4) | hi1;
        }
    }
    q
}

/// Shared body of the Q4_K / Q5_K reference quantizers: returns the header
/// (`d`, `dmin`, scales) and the codes in element order.
fn quant_super_block(x: &[f32], nmax: i32, rmin: f32, nstep: i32) -> ([u8; 16], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let mut weights = [0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().fold(0f32, |s, v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (sc, mn) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = sc;
        mins[j] = mn;
        if sc > max_scale {
            max_scale = sc;
        }
        if mn > max_min {
            max_min = mn;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let mut head = [0u8; 16];
    head[0..2].copy_from_slice(&f16_bits(max_scale / 63.0));
    head[2..4].copy_from_slice(&f16_bits(max_min / 63.0));
    head[4..16].copy_from_slice(&pack_scales(&ls, &lm));
    requant(x, &head, nmax, &mut l);
    (head, l)
}

/// The codes again from the stored (rounded) scales and mins of `head`.
fn requant(x: &[f32], head: &[u8; 16], nmax: i32, l: &mut [u8; QK_K]) {
    let (d_all, dmin_all) = (f16_at(head, 0), f16_at(head, 2));
    for j in 0..8 {
        let (sc, m) = scale_min(&head[4..], j);
        let d = d_all * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for i in 32 * j..32 * j + 32 {
            l[i] = nearest_int((x[i] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

/// `quantize_row_q{4,5}_K_impl` (llama-quantize with an importance matrix) for one
/// super-block: per sub-block a scale and min under `qw·sqrt(σ² + x²)` (σ² twice the mean
/// square; `make_qkx3_quants`), then the eight scales and mins to 6 bits by
/// `make_qp_quants` weighted by each sub-block's weight sum. Q5_K caps the 6-bit codes at
/// 63, Q4_K stores them as they come (`cap`).
fn quant_super_block_weighted(x: &[f32], qw: &[f32], nmax: i32, cap: bool) -> ([u8; 16], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let sigma2 = 2.0 * x.iter().fold(0f32, |s, v| s + v * v) / QK_K as f32;
    let (mut scales, mut mins, mut sw) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    let mut weights = [0f32; 32];
    for j in 0..8 {
        for i in 0..32 {
            let v = x[32 * j + i];
            weights[i] = qw[32 * j + i] * (sigma2 + v * v).sqrt();
        }
        sw[j] = weights.iter().fold(0f32, |s, &w| s + w);
        (scales[j], mins[j]) = make_qkx3_quants(nmax, &x[32 * j..32 * j + 32], &weights, &mut l[32 * j..32 * j + 32], -0.9, 0.05, 36);
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    if cap {
        ls = ls.map(|v| v.min(63));
        lm = lm.map(|v| v.min(63));
    }
    let mut head = [0u8; 16];
    head[0..2].copy_from_slice(&f16_bits(d_block));
    head[2..4].copy_from_slice(&f16_bits(m_block));
    head[4..16].copy_from_slice(&pack_scales(&ls, &lm));
    requant(x, &head, nmax, &mut l);
    (head, l)
}

/// The importance weights of super-block `k` of whole rows of `qw.len()` elements.
fn block_weights(qw: &[f32], k: usize) -> &[f32] {
    &qw[(k * QK_K) % qw.len()..][..QK_K]
}

pub(crate) fn quant_q4_k(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    for (k, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q4_K_BYTES)).enumerate() {
        let (head, l) = match qw {
            Some(w) => quant_super_block_weighted(x, block_weights(w, k), 15, false),
            None => quant_super_block(x, 15, -1.0, 20),
        };
        b[..16].copy_from_slice(&head);
        for c in 0..4 {
            for i in 0..32 {
                b[16 + 32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

pub(crate) fn quant_q5_k(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    for (k, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q5_K_BYTES)).enumerate() {
        let (head, l) = match qw {
            Some(w) => quant_super_block_weighted(x, block_weights(w, k), 31, true),
            None => quant_super_block(x, 31, -0.5, 15),
        };
        b[..16].copy_from_slice(&head);
        let (qh, qs) = b[16..].split_at_mut(32);
        qh.fill(0);
        for c in 0..4 {
            for i in 0..32 {
                let (lo, hi) = (l[64 * c + i], l[64 * c + 32 + i]);
                qh[i] |= ((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1));
                qs[32 * c + i] = (lo & 15) | ((hi & 15) << 4);
            }
        }
    }
}

fn dequant_k(b: &[u8], q: &[u8; QK_K], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    for j in 0..8 {
        let (sc, m) = scale_min(&b[4..16], j);
        let (d1, m1) = (d * sc as f32, dmin * m as f32);
        for i in 32 * j..32 * j + 32 {
            y[i] = d1 * q[i] as f32 - m1;
        }
    }
}

pub(crate) fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        dequant_k(b, &codes(&b[16..], None), y);
    }
}

pub(crate) fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        dequant_k(b, &codes(&b[48..], Some(&b[16..48])), y);
    }
}

/// One super-block against Q8_K: `d·dx·Σ_j sc_j·Σ q·u − dmin·dx·Σ_k m_{k/2}·bsum_k`,
/// both sums exact integers.
#[inline(always)]
fn dot_block(b: &[u8], q: &[u8; QK_K], x: &[u8]) -> f32 {
    let (sc, m) = scales_mins(&b[4..16]);
    let u = &x[Q8K_QS..Q8K_QS + QK_K];
    let mut isum = 0i32;
    for j in 0..8 {
        let s: i32 = (32 * j..32 * j + 32)
            .map(|i| q[i] as i32 * u[i] as i8 as i32)
            .sum();
        isum += sc[j] as i32 * s;
    }
    let msum: i32 = (0..16).map(|k| bsum(x, k) * m[k / 2] as i32).sum();
    let dx = f32_at(x, 0);
    (f16_at(b, 0) * dx) * isum as f32 - (f16_at(b, 2) * dx) * msum as f32
}

/// In the order of llama.cpp's one-row repacked Q4_K kernel: two FMA chains over the
/// super-blocks (`d·dx × Σ sc·Σ q·u` and `dmin·dx × Σ m·bsum`), subtracted at the end —
/// the same values as the AVX2 kernel's.
pub(crate) fn dot_q4_k(w: &[u8], x: &[u8], n: usize) -> f32 {
    let (mut acc, mut acc_m) = (0f32, 0f32);
    for (b, x) in w
        .chunks_exact(Q4_K_BYTES)
        .zip(x.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let q = codes(&b[16..], None);
        let (sc, m) = scales_mins(&b[4..16]);
        let u = &x[Q8K_QS..Q8K_QS + QK_K];
        let isum: i32 = (0..8)
            .map(|j| sc[j] as i32 * (32 * j..32 * j + 32).map(|i| q[i] as i32 * u[i] as i8 as i32).sum::<i32>())
            .sum();
        let msum: i32 = (0..16).map(|k| bsum(x, k) * m[k / 2] as i32).sum();
        let dx = f32_at(x, 0);
        acc = (isum as f32).mul_add(f16_at(b, 0) * dx, acc);
        acc_m = (msum as f32).mul_add(f16_at(b, 2) * dx, acc_m);
    }
    acc - acc_m
}

pub(crate) fn dot_q5_k(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q5_K_BYTES)
        .zip(x.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        sum += dot_block(bw, &codes(&bw[48..], Some(&bw[16..48])), bx);
    }
    sum
}
