//! The 4- and 5-bit 32-element weight formats (reference §2.3):
//! Q4_0 (18 B: `f16 d; u8 qs[16]`), Q4_1 (20 B: `f16 d; f16 m; u8 qs[16]`),
//! Q5_0 (22 B: `f16 d; u8 qh[4]; u8 qs[16]`), Q5_1 (24 B: `f16 d; f16 m; u8 qh[4]; u8 qs[16]`).
//!
//! Byte j of `qs` holds element j (low nibble) and j+16 (high nibble); bit j of the LE
//! u32 `qh` is the fifth bit of element j. Quantizers follow ggml's `_ref` ones,
//! including their truncating `(int8_t)(x + 8.5f)`-style rounding. The `_0` types pair
//! with Q8_0 activations, the `_1` types with Q8_1 (whose `s` carries the min term).

use super::float::{f16_at, f16_bits};
use super::q8::{Q8_0_BYTES, Q8_1_BYTES, QK};
use super::types::GgmlType;

pub(crate) const Q4_0_BYTES: usize = 18;
pub(crate) const Q4_1_BYTES: usize = 20;
pub(crate) const Q5_0_BYTES: usize = 22;
pub(crate) const Q5_1_BYTES: usize = 24;

/// The signed value of largest magnitude (first one on ties), as ggml picks it.
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn pack_nibbles(q: &[u8; QK], qs: &mut [u8]) {
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 15) | ((q[j + 16] & 15) << 4);
    }
}

fn pack_high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut qh = 0u32;
    for (j, &v) in q.iter().enumerate() {
        qh |= (((v & 0x10) >> 4) as u32) << j;
    }
    qh.to_le_bytes()
}

/// The 32 codes of a block from its nibbles (and optional fifth bits).
#[inline(always)]
fn codes(qs: &[u8], qh: Option<&[u8]>) -> [u8; QK] {
    let h = qh.map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 15) | ((((h >> j) & 1) as u8) << 4);
        q[j + 16] = (qs[j] >> 4) | ((((h >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

// ---- quantize ----------------------------------------------------------------------

pub(crate) fn quant_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_0_BYTES)) {
        let d = signed_absmax(x) / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 8.5) as i8).min(15) as u8;
        }
        b[0..2].copy_from_slice(&f16_bits(d));
        pack_nibbles(&q, &mut b[2..]);
    }
}

pub(crate) fn quant_q4_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q4_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = (((v - min) * id + 0.5) as i8).min(15) as u8;
        }
        b[0..2].copy_from_slice(&f16_bits(d));
        b[2..4].copy_from_slice(&f16_bits(min));
        pack_nibbles(&q, &mut b[4..]);
    }
}

pub(crate) fn quant_q5_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_0_BYTES)) {
        let d = signed_absmax(x) / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = ((v * id + 16.5) as i8).min(31) as u8;
        }
        b[0..2].copy_from_slice(&f16_bits(d));
        b[2..6].copy_from_slice(&pack_high_bits(&q));
        pack_nibbles(&q, &mut b[6..]);
    }
}

/// `quantize_q4_0` / `quantize_q5_0` with importance weights (`quantize_row_q4_0_impl`):
/// per block, `make_qx_quants` (nmax 8 or 16) weighted by `qw·√(σ² + x²)`, σ² the row's
/// mean square. `qw` holds one weight per element of a row; `src` is whole rows.
pub(crate) fn quant_q4_5_0_weighted(ty: GgmlType, src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let (nmax, bytes) = if ty == GgmlType::Q5_0 { (16, Q5_0_BYTES) } else { (8, Q4_0_BYTES) };
    let row = qw.len();
    for (xr, br) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row / QK * bytes)) {
        let mut sum_x2 = 0f32;
        for &v in xr {
            sum_x2 += v * v;
        }
        let sigma2 = sum_x2 / row as f32;
        for (ib, (x, b)) in xr.chunks_exact(QK).zip(br.chunks_exact_mut(bytes)).enumerate() {
            let mut w = [0f32; QK];
            for j in 0..QK {
                w[j] = qw[QK * ib + j] * (sigma2 + x[j] * x[j]).sqrt();
            }
            let mut l = [0i8; QK];
            let d = super::fit::make_qx_quants(nmax, x, &mut l, Some(&w));
            let q: [u8; QK] = l.map(|v| v as u8);
            b[0..2].copy_from_slice(&f16_bits(d));
            if ty == GgmlType::Q5_0 {
                b[2..6].copy_from_slice(&pack_high_bits(&q));
                pack_nibbles(&q, &mut b[6..]);
            } else {
                pack_nibbles(&q, &mut b[2..]);
            }
        }
    }
}

/// `quantize_q4_1` / `quantize_q5_1` with importance weights (`quantize_row_q4_1_impl`):
/// per block a scale and min by `make_qkx3_quants` (nmax 15 or 31) weighted by
/// `qw·√(σ² + x²)`, σ² the row's mean square; `src` is whole rows of `qw.len()`.
pub(crate) fn quant_q4_5_1_weighted(ty: GgmlType, src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let (nmax, bytes) = if ty == GgmlType::Q5_1 { (31, Q5_1_BYTES) } else { (15, Q4_1_BYTES) };
    let row = qw.len();
    for (xr, br) in src.chunks_exact(row).zip(dst.chunks_exact_mut(row / QK * bytes)) {
        let sigma2 = xr.iter().fold(0f32, |s, v| s + v * v) / row as f32;
        for (ib, (x, b)) in xr.chunks_exact(QK).zip(br.chunks_exact_mut(bytes)).enumerate() {
            let mut w = [0f32; QK];
            for j in 0..QK {
                w[j] = qw[QK * ib + j] * (sigma2 + x[j] * x[j]).sqrt();
            }
            let mut q = [0u8; QK];
            let (d, neg_min) = super::fit::make_qkx3_quants(nmax, x, &w, &mut q, -0.9, 0.05, 36);
            b[0..2].copy_from_slice(&f16_bits(d));
            b[2..4].copy_from_slice(&f16_bits(-neg_min));
            if ty == GgmlType::Q5_1 {
                b[4..8].copy_from_slice(&pack_high_bits(&q));
                pack_nibbles(&q, &mut b[8..]);
            } else {
                pack_nibbles(&q, &mut b[4..]);
            }
        }
    }
}

pub(crate) fn quant_q5_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q5_1_BYTES)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0u8; QK];
        for (q, &v) in q.iter_mut().zip(x) {
            // ggml casts straight to uint8_t here (no clamp); the value is ≤ 31.5.
            *q = (((v - min) * id + 0.5) as u8).min(31);
        }
        b[0..2].copy_from_slice(&f16_bits(d));
        b[2..4].copy_from_slice(&f16_bits(min));
        b[4..8].copy_from_slice(&pack_high_bits(&q));
        pack_nibbles(&q, &mut b[8..]);
    }
}

// ---- dequantize ----------------------------------------------------------------------

pub(crate) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, q) in y.iter_mut().zip(codes(&b[2..], None)) {
            *y = d * (q as i32 - 8) as f32;
        }
    }
}

pub(crate) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q4_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (y, q) in y.iter_mut().zip(codes(&b[4..], None)) {
            *y = d * q as f32 + m;
        }
    }
}

pub(crate) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, q) in y.iter_mut().zip(codes(&b[6..], Some(&b[2..6]))) {
            *y = d * (q as i32 - 16) as f32;
        }
    }
}

pub(crate) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q5_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (y, q) in y.iter_mut().zip(codes(&b[8..], Some(&b[4..8]))) {
            *y = d * q as f32 + m;
        }
    }
}

// ---- dots (scalar reference) --------------------------------------------------------

/// Σ (q_w − offset)·q_x over one block, exact.
#[inline(always)]
fn isum(q: &[u8; QK], offset: i32, x: &[u8]) -> i32 {
    q.iter()
        .zip(&x[..QK])
        .map(|(&a, &b)| (a as i32 - offset) * b as i8 as i32)
        .sum()
}

/// Q4_0 · Q8_0: Σ_blocks (d_w·d_x) · Σ (q−8)·u.
pub(crate) fn dot_q4_0(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q4_0_BYTES)
        .zip(x.chunks_exact(Q8_0_BYTES))
        .take(n / QK)
    {
        let s = isum(&codes(&bw[2..], None), 8, &bx[2..]);
        sum += (f16_at(bw, 0) * f16_at(bx, 0)) * s as f32;
    }
    sum
}

/// Q5_0 · Q8_0: Σ_blocks (d_w·d_x) · Σ (q−16)·u.
pub(crate) fn dot_q5_0(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q5_0_BYTES)
        .zip(x.chunks_exact(Q8_0_BYTES))
        .take(n / QK)
    {
        let s = isum(&codes(&bw[6..], Some(&bw[2..6])), 16, &bx[2..]);
        sum += (f16_at(bw, 0) * f16_at(bx, 0)) * s as f32;
    }
    sum
}

/// Q4_1 · Q8_1: Σ_blocks (d_w·d_x)·Σ q·u + m_w·s_x.
pub(crate) fn dot_q4_1(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q4_1_BYTES)
        .zip(x.chunks_exact(Q8_1_BYTES))
        .take(n / QK)
    {
        let s = isum(&codes(&bw[4..], None), 0, &bx[4..]);
        sum += (f16_at(bw, 0) * f16_at(bx, 0)) * s as f32 + f16_at(bw, 2) * f16_at(bx, 2);
    }
    sum
}

/// Q5_1 · Q8_1: Σ_blocks (d_w·d_x)·Σ q·u + m_w·s_x.
pub(crate) fn dot_q5_1(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q5_1_BYTES)
        .zip(x.chunks_exact(Q8_1_BYTES))
        .take(n / QK)
    {
        let s = isum(&codes(&bw[8..], Some(&bw[4..8])), 0, &bx[4..]);
        sum += (f16_at(bw, 0) * f16_at(bx, 0)) * s as f32 + f16_at(bw, 2) * f16_at(bx, 2);
    }
    sum
}

// ---- expansion for many-token matmuls ------------------------------------------------

/// Bytes per expanded block: the `_0` types become Q8_0 blocks (`f16 d`, 32 × `i8`
/// `q − offset`), the `_1` types 36-byte blocks (`f16 d`, `f16 m`, 32 × `u8` q). Same
/// integers, same scales: a kernel on the expanded form computes exactly what one on
/// the packed form does, without unpacking nibbles per token.
pub(crate) fn expanded_block_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 => Some(Q8_0_BYTES),
        GgmlType::Q4_1 | GgmlType::Q5_1 => Some(Q8_1_BYTES),
        _ => None,
    }
}

/// Expand whole blocks of `ty` from `src` into `dst` ([`expanded_block_bytes`] each).
pub(crate) fn expand(ty: GgmlType, src: &[u8], dst: &mut [u8]) {
    let (wb, head, qh, qs, offset) = match ty {
        GgmlType::Q4_0 => (Q4_0_BYTES, 2, None, 2, 8),
        GgmlType::Q5_0 => (Q5_0_BYTES, 2, Some(2), 6, 16),
        GgmlType::Q4_1 => (Q4_1_BYTES, 4, None, 4, 0),
        GgmlType::Q5_1 => (Q5_1_BYTES, 4, Some(4), 8, 0),
        _ => return,
    };
    let eb = head + QK;
    for (b, e) in src.chunks_exact(wb).zip(dst.chunks_exact_mut(eb)) {
        e[..head].copy_from_slice(&b[..head]);
        let q = codes(&b[qs..], qh.map(|o| &b[o..o + 4]));
        for (o, v) in e[head..].iter_mut().zip(q) {
            *o = (v as i32 - offset) as u8;
        }
    }
}
