//! Q6_K (210 B): `u8 ql[128] | u8 qh[64] | i8 scales[16] | f16 d`, 6-bit symmetric codes
//! with one signed 8-bit scale per 16 elements (reference §2.4).
//!
//! Half h (128 elements) uses `L = ql[64h..]`, `H = qh[32h..]`; for l < 32:
//! element 128h+l = `L[l]&15 | (H[l]&3)<<4`, +32: `L[l+32]&15 | ((H[l]>>2)&3)<<4`,
//! +64: `L[l]>>4 | ((H[l]>>4)&3)<<4`, +96: `L[l+32]>>4 | ((H[l]>>6)&3)<<4`; `q − 32`.
//! The quantizer is `quantize_row_q6_K_ref` (`make_qx_quants` per 16, scales to i8).

use super::fit::{make_qx_quants, nearest_int, GROUP_MAX_EPS};
use super::float::{f16_at, f16_bits, f32_at};
use super::q8k::{Q8K_QS, Q8_K_BYTES, QK_K};

pub(crate) const Q6_K_BYTES: usize = 210;
pub(crate) const Q6K_QH: usize = 128;
pub(crate) const Q6K_SCALES: usize = 192;
pub(crate) const Q6K_D: usize = 208;

/// The 256 codes (0..63, not yet offset by −32) in element order.
#[inline(always)]
fn codes(b: &[u8]) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        let (ql, qh) = (
            &b[64 * h..64 * h + 64],
            &b[Q6K_QH + 32 * h..Q6K_QH + 32 * h + 32],
        );
        let o = 128 * h;
        for l in 0..32 {
            q[o + l] = (ql[l] & 15) | ((qh[l] & 3) << 4);
            q[o + 32 + l] = (ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4);
            q[o + 64 + l] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            q[o + 96 + l] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// `quantize_row_q6_K_ref`, or with importance weights `qw` (whole rows of `qw.len()`
/// elements) `quantize_row_q6_K_impl`, which weights each 16-element fit by them alone.
pub(crate) fn quant_q6_k(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    for (k, (x, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(Q6_K_BYTES)).enumerate() {
        let q = qw.map(|w| &w[(k * QK_K) % w.len()..][..QK_K]);
        let mut l = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for ib in 0..16 {
            let s = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                q.map(|w| &w[16 * ib..16 * ib + 16]),
            );
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        b.fill(0);
        if max_abs_scale < GROUP_MAX_EPS {
            continue;
        }
        let iscale = -128.0 / max_scale;
        b[Q6K_D..Q6K_D + 2].copy_from_slice(&f16_bits(1.0 / iscale));
        let d_all = f16_at(b, Q6K_D);
        for ib in 0..16 {
            let sc = nearest_int(iscale * scales[ib]).min(127) as i8;
            b[Q6K_SCALES + ib] = sc as u8;
            let d = d_all * sc as f32;
            if d == 0.0 {
                continue;
            }
            for i in 16 * ib..16 * ib + 16 {
                l[i] = (nearest_int(x[i] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        for h in 0..2 {
            let lh = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                let q = |k: usize| lh[i + 32 * k] as u8;
                b[64 * h + i] = (q(0) & 15) | ((q(2) & 15) << 4);
                b[64 * h + 32 + i] = (q(1) & 15) | ((q(3) & 15) << 4);
                b[Q6K_QH + 32 * h + i] =
                    (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
            }
        }
    }
}

pub(crate) fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src.chunks_exact(Q6_K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_at(b, Q6K_D);
        let q = codes(b);
        for (i, y) in y.iter_mut().enumerate() {
            let sc = b[Q6K_SCALES + i / 16] as i8 as f32;
            *y = d * sc * (q[i] as i32 - 32) as f32;
        }
    }
}

/// Q6_K · Q8_K: `d·dx · Σ_s scale_s · Σ (q−32)·u` per super-block, the sum exact.
pub(crate) fn dot_q6_k(w: &[u8], x: &[u8], n: usize) -> f32 {
    let mut sum = 0f32;
    for (bw, bx) in w
        .chunks_exact(Q6_K_BYTES)
        .zip(x.chunks_exact(Q8_K_BYTES))
        .take(n / QK_K)
    {
        let q = codes(bw);
        let u = &bx[Q8K_QS..Q8K_QS + QK_K];
        let mut isum = 0i32;
        for s in 0..16 {
            let p: i32 = (16 * s..16 * s + 16)
                .map(|i| (q[i] as i32 - 32) * u[i] as i8 as i32)
                .sum();
            isum += bw[Q6K_SCALES + s] as i8 as i32 * p;
        }
        sum += (f16_at(bw, Q6K_D) * f32_at(bx, 0)) * isum as f32;
    }
    sum
}
