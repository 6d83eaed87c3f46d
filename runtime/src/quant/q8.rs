//! Q8_0 (34 B: `f16 d; i8 qs[32]`) and Q8_1 (36 B: `f16 d; f16 s; i8 qs[32]`), the
//! 8-bit 32-element formats. Q8_0 is also a weight format; both are the activation
//! formats ggml's CPU backend pairs with the 32-element weight types.
//!
//! Quantizers follow `quantize_row_q8_{0,1}_ref`: `d = amax/127`, codes `round(x/d)`
//! (half away from zero), and for Q8_1 `s = d·Σq` (the CPU convention, reference §2.3).

use super::float::{f16_at, f16_bits};

pub(crate) const QK: usize = 32;
pub(crate) const Q8_0_BYTES: usize = 34;
pub(crate) const Q8_1_BYTES: usize = 36;

/// `(d, codes)` of one 32-element block, rounded as llama.cpp's x86 `quantize_row_q8_0`
/// (`id = 127/amax`, ties to even) rather than the `_ref` C code (`1/d`, ties away):
/// with this, whole-model logits match llama.cpp's to the printed digit at position 0.
fn quant_block(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut q = [0i8; QK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    (d, q)
}

pub(crate) fn quant_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let (d, q) = quant_block(x);
        b[0..2].copy_from_slice(&f16_bits(d));
        for (o, q) in b[2..].iter_mut().zip(q) {
            *o = q as u8;
        }
    }
}

/// ggml's `quantize_row_q8_0_ref`, the weight quantizer `llama-quantize` runs: `d = amax/127`,
/// codes `roundf(x / d)` (half away from zero). The activation quantizer above follows
/// llama.cpp's CPU path instead (`127/amax`, half to even), so the two differ on ties.
pub(crate) fn quant_q8_0_ref(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_0_BYTES)) {
        let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        b[0..2].copy_from_slice(&f16_bits(d));
        for (o, &v) in b[2..].iter_mut().zip(x) {
            *o = (v * id).round() as i8 as u8;
        }
    }
}

pub(crate) fn quant_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(Q8_1_BYTES)) {
        let (d, q) = quant_block(x);
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        b[0..2].copy_from_slice(&f16_bits(d));
        b[2..4].copy_from_slice(&f16_bits(sum as f32 * d));
        for (o, q) in b[4..].iter_mut().zip(q) {
            *o = q as u8;
        }
    }
}

pub(crate) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_0_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[2..]) {
            *y = q as i8 as f32 * d;
        }
    }
}

pub(crate) fn dequant_q8_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q8_1_BYTES).zip(dst.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (y, &q) in y.iter_mut().zip(&b[4..]) {
            *y = q as i8 as f32 * d;
        }
    }
}

/// Σ over 32 code pairs, exact.
#[inline(always)]
pub(crate) fn isum_i8(a: &[u8], b: &[u8]) -> i32 {
    a[..QK]
        .iter()
        .zip(&b[..QK])
        .map(|(&p, &q)| p as i8 as i32 * q as i8 as i32)
        .sum()
}

/// Q8_0 weights · Q8_0 activations: Σ_blocks (d_w·d_x) · Σ q_w·q_x.
pub(crate) fn dot_q8_0(w: &[u8], x: &[u8], n: usize) -> f32 {
    let nb = n / QK;
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q8_0_BYTES)
        .zip(x.chunks_exact(Q8_0_BYTES))
        .take(nb)
    {
        let isum = isum_i8(&bw[2..], &bx[2..]);
        sum += (f16_at(bw, 0) * f16_at(bx, 0)) * isum as f32;
    }
    sum
}
