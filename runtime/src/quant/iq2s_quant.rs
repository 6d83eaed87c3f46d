//! IQ2_S's quantizer, as llama.cpp's `quantize_iq2_s` writes it: 16-element sub-blocks,
//! groups of 8 on the 1024-point grid (an off-grid point goes to the best of its nearest
//! neighbours, `nwant` 1), plain 8-bit signs, 19 trial scales around `max/5`. Weights
//! `qw·√(σ² + x²)` (σ² twice the super-block's mean square) with an importance matrix,
//! else `σ²/4 + x²`. The super-block scale is `max/31` stored times 0.9875.

use super::fit::nearest_int;
use super::float::f16_bits;
use super::iq2_quant::{best_neighbour, lattice, search_scale, Trials};
use super::q8k::QK_K;
use super::GgmlType;

const EPS: f32 = 1e-8;

/// IQ2_S (82 bytes per 256): f16 d, 32 low bytes of the 10-bit grid indices, 32 sign
/// bytes, 8 bytes of the indices' top 2 bits, 8 bytes of two 4-bit scales.
pub(crate) fn quant_iq2_s(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    let lat = lattice(GgmlType::IQ2_S);
    let group = |id: f32, scale: f32, x: &[f32], w: &[f32], l: &mut [i8]| -> bool {
        let mut u = 0usize;
        for i in 0..8 {
            l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, 2) as i8;
            u |= (l[i] as usize) << (2 * i);
        }
        if lat.index[u] >= 0 {
            return true;
        }
        best_neighbour(lat, u, x, w, scale, l);
        false
    };
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(82)).enumerate() {
        b.fill(0);
        let qwb = qw.map(|q| &q[(ibl * QK_K) % q.len()..][..QK_K]);
        let sumx2 = xbl.iter().fold(0f32, |s, &v| s + v * v);
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        for ib in 0..16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let (mut w, mut waux, mut xval) = ([0f32; 16], [0f32; 16], [0f32; 16]);
            let mut signs = [0u8; 2];
            for i in 0..16 {
                w[i] = match qwb {
                    Some(q) => q[16 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                    None => 0.25 * sigma2 + xb[i] * xb[i],
                };
                waux[i] = w[i].sqrt();
                xval[i] = if xb[i] >= 0.0 { xb[i] } else { -xb[i] };
                if xb[i] < 0.0 {
                    signs[i / 8] |= 1 << (i % 8);
                }
            }
            let max = xval[1..].iter().fold(xval[0], |m, &v| if m > v { m } else { v });
            if max < EPS {
                continue;
            }
            let trials = Trials { kmax: 5.0, r: 9, step: 0.1, refit_all: false, start_on_grid: true };
            let (l, mut scale) = search_scale::<16, 8>(&trials, &xval, &w, max, &mut |id, scale, k, l| {
                let r = 8 * k..8 * k + 8;
                group(id, scale, &xval[r.clone()], &waux[r], l)
            });
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s);
            }
            for k in 0..2 {
                let u = (0..8).fold(0usize, |u, i| u | (l[8 * k + i] as usize) << (2 * i));
                let g = lat.index[u].max(0) as usize;
                let i8 = 2 * ib + k;
                b[2 + i8] = (g & 255) as u8;
                b[66 + i8 / 4] |= ((g >> 8) << (2 * (i8 % 4))) as u8;
                b[34 + i8] = signs[k];
            }
            scales[ib] = scale;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b[0..2].copy_from_slice(&f16_bits(d * 0.9875));
        let id = 1.0 / d;
        for ib in 0..16 {
            let code = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u8;
            b[74 + ib / 2] |= if ib % 2 == 0 { code } else { code << 4 };
        }
    }
}
