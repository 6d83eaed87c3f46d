//! IQ1_S's and IQ1_M's quantizers, as llama.cpp's `quantize_iq1_s` / `quantize_iq1_m`
//! write them. Each value becomes −1, 0 or 1 plus a shared shift of ±⅛ (`IQ1S_DELTA`):
//! per sub-block (32 elements for IQ1_S, 16 for IQ1_M) the values are sorted and every
//! pair of split points is tried (the weighted least-squares scale of each split is
//! exact), with both shifts (IQ1_M: a shift per half). Groups of 8 codes must be points of
//! the 2048-point grid; an off-grid group goes to the neighbour of least weighted error.
//! Weights `qw·√(σ² + x²)` (σ² twice the super-block's mean square); IQ1_M without an
//! importance matrix uses `x²`; IQ1_S needs one.

use super::fit::nearest_int;
use super::float::f16_bits;
use super::iq2_quant::{lattice, Lattice};
use super::q8k::QK_K;
use super::GgmlType;

const X_P: [f32; 3] = [-1.0 + 0.125, 0.125, 1.0 + 0.125];
const X_M: [f32; 3] = [-1.0 - 0.125, -0.125, 1.0 - 0.125];

/// The neighbour of least `Σ w·(scale·xx[l] − x)²` (`iq1_find_best_neighbour2`); its
/// levels into `l`.
fn best_neighbour(lat: &Lattice, u: usize, x: &[f32], w: &[f32], scale: f32, xx: &[f32; 3], l: &mut [i8]) -> usize {
    let mut best = (f32::MAX, 0usize);
    for &j in &lat.neighbours[u] {
        let g = &lat.grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..8 {
            let diff = scale * xx[((g[i] - 1) / 2) as usize] - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best.0 {
            best = (d2, j as usize);
        }
    }
    for i in 0..8 {
        l[i] = (lat.grid[best.1][i] - 1) / 2;
    }
    best.1
}

/// The sub-block's values sorted ascending (stable), as their indices.
fn sorted(xb: &[f32]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..xb.len()).collect();
    idx.sort_by(|&a, &b| xb[a].partial_cmp(&xb[b]).unwrap_or(std::cmp::Ordering::Equal));
    idx
}

/// Grid indices of the groups of 8 of `l` (off-grid groups moved to a neighbour, `l`
/// rewritten), the shift table of each group, and whether all were on the grid.
fn grid_groups(lat: &Lattice, xb: &[f32], w: &[f32], scale: f32, xx: &dyn Fn(usize) -> &'static [f32; 3], l: &mut [i8], index: &mut [usize]) -> bool {
    let mut all = true;
    for k in 0..xb.len() / 8 {
        let r = 8 * k..8 * k + 8;
        let u = (0..8).fold(0usize, |u, j| u | (l[8 * k + j] as usize) << (2 * j));
        index[k] = match lat.index[u] {
            g if g >= 0 => g as usize,
            _ => {
                all = false;
                best_neighbour(lat, u, &xb[r.clone()], &w[r.clone()], scale, xx(k), &mut l[r])
            }
        };
    }
    all
}

/// The refitted scale over the chosen grid points (kept when both sums are positive).
fn refit(lat: &Lattice, xb: &[f32], w: &[f32], xx: &dyn Fn(usize) -> &'static [f32; 3], index: &[usize], scale: f32) -> f32 {
    let (mut sqx, mut sq2) = (0f32, 0f32);
    for (k, &g) in index.iter().enumerate() {
        for j in 0..8 {
            let q = xx(k)[((lat.grid[g][j] - 1) / 2) as usize];
            sqx += w[8 * k + j] * q * xb[8 * k + j];
            sq2 += w[8 * k + j] * q * q;
        }
    }
    if sqx > 0.0 && sq2 > 0.0 {
        sqx / sq2
    } else {
        scale
    }
}

fn weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, w: &mut [f32]) {
    for i in 0..xb.len() {
        w[i] = match qw {
            Some(q) => q[i] * (sigma2 + xb[i] * xb[i]).sqrt(),
            None => xb[i] * xb[i],
        };
    }
}

fn abs_max(xb: &[f32]) -> f32 {
    xb[1..].iter().fold(xb[0].abs(), |m, &v| if m > v.abs() { m } else { v.abs() })
}

/// IQ1_S (50 bytes per 256): f16 d, 32 low bytes of the 11-bit grid indices, then per
/// 32-element sub-block a u16: the indices' top 3 bits ×4, a 3-bit scale at bit 12 and the
/// shift's sign at bit 15.
pub(crate) fn quant_iq1_s(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let lat = lattice(GgmlType::IQ1_S);
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(50)).enumerate() {
        b.fill(0);
        let qwb = &qw[(ibl * QK_K) % qw.len()..][..QK_K];
        let sigma2 = 2.0 * xbl.iter().fold(0f32, |s, &v| s + v * v) / QK_K as f32;
        let (mut scales, mut shifts, mut qh) = ([0f32; 8], [1i32; 8], [0u16; 8]);
        let mut max_scale = 0f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut w = [0f32; 32];
            weights(xb, Some(&qwb[32 * ib..32 * ib + 32]), sigma2, &mut w);
            if abs_max(xb) < 1e-12 {
                continue;
            }
            let idx = sorted(xb);
            let (mut sumx, mut sumw) = ([0f32; 33], [0f32; 33]);
            for j in 0..32 {
                sumx[j + 1] = sumx[j] + w[idx[j]] * xb[idx[j]];
                sumw[j + 1] = sumw[j] + w[idx[j]];
            }
            let (mut best_score, mut scale) = (-f32::MAX, abs_max(xb));
            let (mut b1, mut b2, mut shift) = (usize::MAX, usize::MAX, 0i32);
            for i1 in 0..=32 {
                for i2 in i1..=32 {
                    for (xs, sh) in [(&X_P, 1), (&X_M, -1)] {
                        let sqx = (sumx[i1] - sumx[0]) * xs[0] + (sumx[i2] - sumx[i1]) * xs[1] + (sumx[32] - sumx[i2]) * xs[2];
                        let sq2 = (sumw[i1] - sumw[0]) * xs[0] * xs[0] + (sumw[i2] - sumw[i1]) * xs[1] * xs[1] + (sumw[32] - sumw[i2]) * xs[2] * xs[2];
                        if sq2 > 0.0 && sqx * sqx > best_score * sq2 {
                            scale = sqx / sq2;
                            best_score = scale * sqx;
                            (b1, b2, shift) = (i1, i2, sh);
                        }
                    }
                }
            }
            if b1 == usize::MAX || shift == 0 {
                continue;
            }
            let mut l = [0i8; 32];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < b1 { 0 } else if j < b2 { 1 } else { 2 };
            }
            if scale < 0.0 {
                l.iter_mut().for_each(|v| *v = 2 - *v);
                scale = -scale;
                shift = -shift;
            }
            let xx = move |_k: usize| -> &'static [f32; 3] { if shift == 1 { &X_P } else { &X_M } };
            let mut index = [0usize; 4];
            if !grid_groups(lat, xb, &w, scale, &xx, &mut l, &mut index) {
                scale = refit(lat, xb, &w, &xx, &index, scale);
            }
            let mut h = 0u16;
            for k in 0..4 {
                b[2 + 4 * ib + k] = (index[k] & 255) as u8;
                h |= ((index[k] >> 8) << (3 * k)) as u16;
            }
            qh[ib] = h;
            scales[ib] = scale;
            shifts[ib] = shift;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 15.0;
        b[0..2].copy_from_slice(&f16_bits(d * 1.125));
        let id = 1.0 / d;
        for ib in 0..8 {
            let mut code = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            if shifts[ib] == -1 {
                code |= 8;
            }
            qh[ib] |= (code as u16) << 12;
            b[34 + 2 * ib..36 + 2 * ib].copy_from_slice(&qh[ib].to_le_bytes());
        }
    }
}

/// IQ1_M (56 bytes per 256): 32 low bytes of the grid indices, per 16-element sub-block a
/// byte of the two indices' top 3 bits and their shift signs (0x08, 0x80), then four u16
/// of 3-bit scales whose top nibbles hold the f16 super-block scale.
pub(crate) fn quant_iq1_m(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    let lat = lattice(GgmlType::IQ1_M);
    const MASKS: [u8; 4] = [0x00, 0x80, 0x08, 0x88];
    let pick = |k: usize, best_k: usize| -> &'static [f32; 3] {
        let plus = if k == 0 { best_k < 2 } else { best_k % 2 == 0 };
        if plus {
            &X_P
        } else {
            &X_M
        }
    };
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(56)).enumerate() {
        b.fill(0);
        let qwb = qw.map(|q| &q[(ibl * QK_K) % q.len()..][..QK_K]);
        let sigma2 = 2.0 * xbl.iter().fold(0f32, |s, &v| s + v * v) / QK_K as f32;
        let (mut scales, mut shifts) = ([0f32; 16], [0usize; 16]);
        let mut max_scale = 0f32;
        for ib in 0..16 {
            let xb = &xbl[16 * ib..16 * ib + 16];
            let mut w = [0f32; 16];
            weights(xb, qwb.map(|q| &q[16 * ib..16 * ib + 16]), sigma2, &mut w);
            if abs_max(xb) < 1e-7 {
                continue;
            }
            let idx = sorted(xb);
            let (mut px, mut pw) = ([[0f32; 17]; 2], [[0f32; 17]; 2]);
            for j in 0..16 {
                let i = idx[j];
                let h = usize::from(i >= 8);
                px[h][j + 1] = px[h][j] + w[i] * xb[i];
                px[1 - h][j + 1] = px[1 - h][j];
                pw[h][j + 1] = pw[h][j] + w[i];
                pw[1 - h][j + 1] = pw[1 - h][j];
            }
            let (txs, tws) = ([px[0][16], px[1][16]], [pw[0][16], pw[1][16]]);
            let (p2, m2) = (X_P[2], X_M[2]);
            let cp1 = X_P[0] * X_P[0] - X_P[1] * X_P[1];
            let cp2 = X_P[1] * X_P[1] - X_P[2] * X_P[2];
            let cm1 = X_M[0] * X_M[0] - X_M[1] * X_M[1];
            let cm2 = X_M[1] * X_M[1] - X_M[2] * X_M[2];
            let (mut best_score, mut scale) = (-f32::MAX, abs_max(xb));
            let (mut b1, mut b2, mut best_k) = (usize::MAX, usize::MAX, usize::MAX);
            for i1 in 0..=16 {
                for i2 in i1..=16 {
                    let (mut qxp, mut qxm, mut q2p, mut q2m) = ([0f32; 2], [0f32; 2], [0f32; 2], [0f32; 2]);
                    for h in 0..2 {
                        let sx = px[h][i1] + px[h][i2];
                        qxp[h] = txs[h] * p2 - sx;
                        qxm[h] = txs[h] * m2 - sx;
                        q2p[h] = tws[h] * p2 * p2 + pw[h][i1] * cp1 + pw[h][i2] * cp2;
                        q2m[h] = tws[h] * m2 * m2 + pw[h][i1] * cm1 + pw[h][i2] * cm2;
                    }
                    let sqx = [qxp[0] + qxp[1], qxp[0] + qxm[1], qxm[0] + qxp[1], qxm[0] + qxm[1]];
                    let sq2 = [q2p[0] + q2p[1], q2p[0] + q2m[1], q2m[0] + q2p[1], q2m[0] + q2m[1]];
                    for k in 0..4 {
                        if sq2[k] > 0.0 && sqx[k] * sqx[k] > best_score * sq2[k] {
                            scale = sqx[k] / sq2[k];
                            best_score = scale * sqx[k];
                            (b1, b2, best_k) = (i1, i2, k);
                        }
                    }
                }
            }
            if b1 == usize::MAX || best_k == usize::MAX {
                continue;
            }
            let mut l = [0i8; 16];
            for (j, &i) in idx.iter().enumerate() {
                l[i] = if j < b1 { 0 } else if j < b2 { 1 } else { 2 };
            }
            if scale < 0.0 {
                l.iter_mut().for_each(|v| *v = 2 - *v);
                scale = -scale;
                best_k = 3 - best_k;
            }
            let xx = move |k: usize| pick(k, best_k);
            let mut index = [0usize; 2];
            if !grid_groups(lat, xb, &w, scale, &xx, &mut l, &mut index) {
                scale = refit(lat, xb, &w, &xx, &index, scale);
            }
            b[2 * ib] = (index[0] & 255) as u8;
            b[2 * ib + 1] = (index[1] & 255) as u8;
            b[32 + ib] = ((index[0] >> 8) | ((index[1] >> 8) << 4)) as u8;
            scales[ib] = scale;
            shifts[ib] = best_k;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let mut sc = [0u16; 4];
        let mut d = max_scale / 15.0;
        let id = 1.0 / d;
        let (mut sqx, mut sq2) = (0f32, 0f32);
        for ib in 0..16 {
            let code = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 7);
            sc[ib / 4] |= (code << (3 * (ib % 4))) as u16;
            b[32 + ib] |= MASKS[shifts[ib]];
            let xb = &xbl[16 * ib..16 * ib + 16];
            let mut w = [0f32; 16];
            weights(xb, qwb.map(|q| &q[16 * ib..16 * ib + 16]), sigma2, &mut w);
            for k in 0..2 {
                let xx = pick(k, shifts[ib]);
                let g = b[2 * ib + k] as usize + (((b[32 + ib] as usize) << (8 - 4 * k)) & 0x700);
                for j in 0..8 {
                    let q = xx[((lat.grid[g][j] - 1) / 2) as usize] * (2 * code + 1) as f32;
                    sqx += w[8 * k + j] * q * xb[8 * k + j];
                    sq2 += w[8 * k + j] * q * q;
                }
            }
        }
        if sq2 > 0.0 {
            d = sqx / sq2;
        }
        let s = u16::from_le_bytes(f16_bits(d * 1.1125));
        sc[0] |= (s & 0x000f) << 12;
        sc[1] |= (s & 0x00f0) << 8;
        sc[2] |= (s & 0x0f00) << 4;
        sc[3] |= s & 0xf000;
        for (i, v) in sc.iter().enumerate() {
            b[48 + 2 * i..50 + 2 * i].copy_from_slice(&v.to_le_bytes());
        }
    }
}
