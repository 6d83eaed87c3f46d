//! The importance-weighted quantizers of IQ2_XXS and IQ2_XS, as llama.cpp's
//! `quantize_iq2_xxs` / `quantize_iq2_xs` (`ggml-quants.c`) write them, and the 8-value
//! lattice search they share with IQ2_S and IQ1_S/M (`iq2xs_init_impl`).
//!
//! A group of 8 magnitudes is a point of the lattice `2l + 1` (l < 3 here); the grid holds
//! 256 (IQ2_XXS), 512 (IQ2_XS), 1024 (IQ2_S) or 2048 (IQ1) of its points. A point off the
//! grid is replaced by the best (weighted distance at the trial scale) of its nearest grid
//! points: those at the `nwant` smallest squared distances (2 for IQ2_XXS/XS, 1 for IQ2_S,
//! 3 for IQ1), in (distance, index) order. Signs are stored as 7 bits per group; when a
//! group has an odd number of negatives, the element of least `w·x²` takes the other sign.
//!
//! Weights: `qw[i]·√(σ² + x[i]²)` with `σ²` the super-block's mean square and `qw` the
//! importance matrix's column weights. llama.cpp refuses these types without one, and so
//! does lode ([`super::QuantError::NeedsImatrix`]).

use std::sync::OnceLock;

use super::fit::{make_qp_quants, nearest_int, GROUP_MAX_EPS};
use super::float::f16_bits;
use super::iq_grids_data::{IQ1S_PACKED, IQ2S_PACKED, IQ2XS_PACKED, IQ2XXS_PACKED};
use super::q8k::QK_K;

/// Every lattice point of 8 levels < 3 (2 bits each) has an index below this.
const KMAP_SIZE: usize = 43692;

/// A grid's points (`2l + 1` per value), the lattice point → grid index map, and the
/// candidate lists of the points off the grid.
pub(crate) struct Lattice {
    pub(crate) grid: Vec<[i8; 8]>,
    pub(crate) index: Vec<i32>,
    pub(crate) neighbours: Vec<Vec<u16>>,
}

fn build(packed: &[u16], nwant: usize) -> Lattice {
    let grid: Vec<[i8; 8]> = packed.iter().map(|&p| std::array::from_fn(|i| (2 * ((p >> (2 * i)) & 3) + 1) as i8)).collect();
    let mut index = vec![-1i32; KMAP_SIZE];
    for (k, &p) in packed.iter().enumerate() {
        index[p as usize] = k as i32;
    }
    let mut neighbours = vec![Vec::new(); KMAP_SIZE];
    let mut d2: Vec<(i32, u16)> = Vec::with_capacity(grid.len());
    for (u, nb) in neighbours.iter_mut().enumerate() {
        if index[u] >= 0 {
            continue;
        }
        let pos: [i32; 8] = std::array::from_fn(|k| 2 * ((u >> (2 * k)) & 3) as i32 + 1);
        d2.clear();
        d2.extend(grid.iter().enumerate().map(|(j, g)| ((0..8).map(|k| (g[k] as i32 - pos[k]).pow(2)).sum(), j as u16)));
        d2.sort_unstable();
        let (mut last, mut have) = (d2[0].0, 1);
        for &(d, j) in d2.iter() {
            if d > last {
                if have == nwant {
                    break;
                }
                last = d;
                have += 1;
            }
            nb.push(j);
        }
    }
    Lattice { grid, index, neighbours }
}

/// The lattice of a grid type (built once, on first use).
pub(crate) fn lattice(ty: super::GgmlType) -> &'static Lattice {
    use super::GgmlType::*;
    static L: [OnceLock<Lattice>; 4] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    match ty {
        IQ2_XXS => L[0].get_or_init(|| build(&IQ2XXS_PACKED, 2)),
        IQ2_XS => L[1].get_or_init(|| build(&IQ2XS_PACKED, 2)),
        IQ2_S => L[2].get_or_init(|| build(&IQ2S_PACKED, 1)),
        _ => L[3].get_or_init(|| build(&IQ1S_PACKED, 3)),
    }
}

/// The candidate of least `Σ w·(scale·g − x)²`; its levels `(g − 1)/2` into `l`.
pub(crate) fn best_neighbour(lat: &Lattice, u: usize, x: &[f32], w: &[f32], scale: f32, l: &mut [i8]) -> usize {
    let mut best = (f32::MAX, 0usize);
    for &j in &lat.neighbours[u] {
        let g = &lat.grid[j as usize];
        let mut d2 = 0f32;
        for i in 0..8 {
            let diff = scale * g[i] as f32 - x[i];
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

/// Levels of group `x` at inverse scale `id` (clamped to `0..=2`), then its grid index (a
/// neighbour's when off the grid, `l` rewritten): (index, was on the grid).
fn group(lat: &Lattice, id: f32, scale: f32, x: &[f32], w: &[f32], l: &mut [i8]) -> (usize, bool) {
    let mut u = 0usize;
    for i in 0..8 {
        l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, 2) as i8;
        u |= (l[i] as usize) << (2 * i);
    }
    match lat.index[u] {
        g if g >= 0 => (g as usize, true),
        _ => (best_neighbour(lat, u, x, w, scale, l), false),
    }
}

/// The grid index of levels `l` (every caller took them from a grid point).
fn index_of(lat: &Lattice, l: &[i8]) -> usize {
    let u = (0..8).fold(0usize, |u, i| u | (l[i] as usize) << (2 * i));
    lat.index[u].max(0) as usize
}

/// Magnitudes of the groups of 8 of `xb` into `xval`, their 7-bit sign indices (an odd
/// count of negatives flips the element of least `w·x²`).
pub(crate) fn signs8(xb: &[f32], w: &[f32], xval: &mut [f32], signs: &mut [u8]) {
    for (k, s_out) in signs.iter_mut().enumerate() {
        let (mut nflip, mut s) = (0, 0u8);
        for i in 0..8 {
            let v = xb[8 * k + i];
            if v >= 0.0 {
                xval[8 * k + i] = v;
            } else {
                xval[8 * k + i] = -v;
                nflip += 1;
                s |= 1 << i;
            }
        }
        if nflip % 2 == 1 {
            let mut imin = 0;
            let mut min = w[8 * k] * xb[8 * k] * xb[8 * k];
            for i in 1..8 {
                let ax = w[8 * k + i] * xb[8 * k + i] * xb[8 * k + i];
                if ax < min {
                    min = ax;
                    imin = i;
                }
            }
            xval[8 * k + imin] = -xval[8 * k + imin];
            s ^= 1 << imin;
        }
        *s_out = s & 127;
    }
}

/// `Σ w·x·q`, `Σ w·q²` with `q = 2l + 1`.
pub(crate) fn sums(w: &[f32], x: &[f32], l: &[i8]) -> (f32, f32) {
    let (mut sqx, mut sq2) = (0f32, 0f32);
    for i in 0..x.len() {
        let q = (2 * l[i] as i32 + 1) as f32;
        sqx += w[i] * x[i] * q;
        sq2 += w[i] * q * q;
    }
    (sqx, sq2)
}

/// A grid quantizer's trial scales: `(kmax + is·step) / max` for `is` in `-r..=r`.
pub(crate) struct Trials {
    pub kmax: f32,
    pub r: i32,
    pub step: f32,
    /// Take every group again at the chosen scale (IQ3_S), not only those off the grid.
    pub refit_all: bool,
    /// Whether the groups count as on the grid before any trial is kept (IQ3_S: no).
    pub start_on_grid: bool,
}

/// The scale search the grid quantizers share (llama.cpp repeats it in each
/// `quantize_row_iq*_impl`): at each trial scale every group of `GS` magnitudes of `xval`
/// is rounded to the lattice by `group(id, scale, k, l)` (group `k`'s levels into `l`, the
/// best grid neighbour's when the rounded point is off the grid; `true` when it was on
/// it), and the levels of the best weighted least-squares fit are kept. When a group of
/// that trial was off the grid, the groups are taken again at the chosen scale and the
/// scale refitted. Returns the levels and the scale.
pub(crate) fn search_scale<const N: usize, const GS: usize>(
    t: &Trials,
    xval: &[f32; N],
    w: &[f32; N],
    max: f32,
    group: &mut dyn FnMut(f32, f32, usize, &mut [i8]) -> bool,
) -> ([i8; N], f32) {
    let ng = N / GS;
    let (mut best, mut scale) = (0f32, max / t.kmax);
    let mut l = [0i8; N];
    let mut on_grid = [t.start_on_grid; 8];
    for is in -t.r..=t.r {
        let id = (t.kmax + is as f32 * t.step) / max;
        let this_scale = 1.0 / id;
        let mut laux = [0i8; N];
        let mut on = [true; 8];
        for k in 0..ng {
            on[k] = group(id, this_scale, k, &mut laux[GS * k..GS * k + GS]);
        }
        let (sqx, sq2) = sums(w, xval, &laux);
        if sq2 > 0.0 && sqx * sqx > best * sq2 {
            scale = sqx / sq2;
            best = scale * sqx;
            l = laux;
            on_grid = on;
        }
    }
    if on_grid[..ng].iter().any(|&o| !o) && scale > 0.0 {
        let id = 1.0 / scale;
        for k in 0..ng {
            if t.refit_all || !on_grid[k] {
                group(id, scale, k, &mut l[GS * k..GS * k + GS]);
            }
        }
        let (sqx, sq2) = sums(w, xval, &l);
        if sq2 > 0.0 {
            scale = sqx / sq2;
        }
    }
    (l, scale)
}

/// The super-block's mean square and the weights `qw·√(σ² + x²)` with their square roots.
pub(crate) fn weights(xbl: &[f32], qw: &[f32], w: &mut [f32], waux: &mut [f32], off: usize) {
    let sumx2 = xbl.iter().fold(0f32, |s, &v| s + v * v);
    let sigma2 = sumx2 / QK_K as f32;
    for i in 0..w.len() {
        let x = xbl[off + i];
        w[i] = qw[off + i] * (sigma2 + x * x).sqrt();
        waux[i] = w[i].sqrt();
    }
}

/// The 4-bit sub-block scale codes against `d = max/31`: `(d, codes)`.
fn scale_codes<const N: usize>(scales: &[f32; N], max_scale: f32) -> (f32, [i32; N]) {
    let d = max_scale / 31.0;
    let id = 1.0 / d;
    (d, scales.map(|s| nearest_int(0.5 * (id * s - 1.0)).clamp(0, 15)))
}

/// IQ2_XXS (66 bytes per 256): f16 d, then per 32-element sub-block two u32 words — four
/// 8-bit grid indices, then four 7-bit sign indices and the 4-bit scale at bit 28.
pub(crate) fn quant_iq2_xxs(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let lat = lattice(super::GgmlType::IQ2_XXS);
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(66)).enumerate() {
        let qwb = &qw[(ibl * QK_K) % qw.len()..][..QK_K];
        b.fill(0);
        let mut q2 = [0u32; 16];
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        for ib in 0..8 {
            let (mut w, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
            weights(xbl, qwb, &mut w, &mut waux, 32 * ib);
            let mut signs = [0u8; 4];
            signs8(&xbl[32 * ib..32 * ib + 32], &w, &mut xval, &mut signs);
            let max = xval[1..].iter().fold(xval[0], |m, &v| if m > v { m } else { v });
            if max < GROUP_MAX_EPS {
                continue;
            }
            let mut lq = [0u8; 32];
            let mut scale = make_qp_quants(4, &xval, &mut lq, &w);
            let eff_max = scale * 3.0;
            if eff_max <= 0.0 {
                continue;
            }
            let mut l = [0i8; 32];
            let mut best = 0f32;
            for is in -6..=6 {
                let id = (5.0 + is as f32 * 0.1) / eff_max;
                let this_scale = 1.0 / id;
                let mut laux = [0i8; 32];
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    group(lat, id, this_scale, &xval[r.clone()], &waux[r.clone()], &mut laux[r]);
                }
                let (sqx, sq2) = sums(&w, &xval, &laux);
                if sq2 > 0.0 && sqx * sqx > best * sq2 {
                    scale = sqx / sq2;
                    best = scale * sqx;
                    l = laux;
                }
            }
            if scale > 0.0 {
                let id = 1.0 / scale;
                for k in 0..4 {
                    let r = 8 * k..8 * k + 8;
                    let g = group(lat, id, scale, &xval[r.clone()], &waux[r.clone()], &mut l[r.clone()]).0;
                    for i in 0..8 {
                        l[8 * k + i] = (lat.grid[g][i] - 1) / 2;
                    }
                }
                let (sqx, sq2) = sums(&w, &xval, &l);
                if sq2 > 0.0 {
                    scale = sqx / sq2;
                }
            }
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s & 127);
            }
            for k in 0..4 {
                q2[2 * ib] |= (index_of(lat, &l[8 * k..8 * k + 8]) as u32) << (8 * k);
                q2[2 * ib + 1] |= (signs[k] as u32) << (7 * k);
            }
            scales[ib] = scale;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let (d, codes) = scale_codes(&scales, max_scale);
        b[0..2].copy_from_slice(&f16_bits(d));
        for ib in 0..8 {
            q2[2 * ib + 1] |= (codes[ib] as u32) << 28;
        }
        for (i, q) in q2.iter().enumerate() {
            b[2 + 4 * i..6 + 4 * i].copy_from_slice(&q.to_le_bytes());
        }
    }
}

/// IQ2_XS (74 bytes per 256): f16 d, per 16-element sub-block two u16 (9-bit grid index,
/// 7-bit sign index), then eight bytes of two 4-bit scales.
pub(crate) fn quant_iq2_xs(src: &[f32], dst: &mut [u8], qw: &[f32]) {
    let lat = lattice(super::GgmlType::IQ2_XS);
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(74)).enumerate() {
        let qwb = &qw[(ibl * QK_K) % qw.len()..][..QK_K];
        b.fill(0);
        let mut q2 = [0u16; 32];
        let mut scales = [0f32; 16];
        let mut max_scale = 0f32;
        for ib in 0..16 {
            let (mut w, mut waux, mut xval) = ([0f32; 16], [0f32; 16], [0f32; 16]);
            weights(xbl, qwb, &mut w, &mut waux, 16 * ib);
            let mut signs = [0u8; 2];
            signs8(&xbl[16 * ib..16 * ib + 16], &w, &mut xval, &mut signs);
            let max = xval[1..].iter().fold(xval[0], |m, &v| if m > v { m } else { v });
            if max < GROUP_MAX_EPS {
                continue;
            }
            let trials = Trials { kmax: 5.0, r: 9, step: 0.1, refit_all: false, start_on_grid: true };
            let (l, mut scale) = search_scale::<16, 8>(&trials, &xval, &w, max, &mut |id, scale, k, l| {
                let r = 8 * k..8 * k + 8;
                group(lat, id, scale, &xval[r.clone()], &waux[r], l).1
            });
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s & 127);
            }
            for k in 0..2 {
                q2[2 * ib + k] = index_of(lat, &l[8 * k..8 * k + 8]) as u16 | (signs[k] as u16) << 9;
            }
            scales[ib] = scale;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let (d, codes) = scale_codes(&scales, max_scale);
        b[0..2].copy_from_slice(&f16_bits(d));
        for (i, q) in q2.iter().enumerate() {
            b[2 + 2 * i..4 + 2 * i].copy_from_slice(&q.to_le_bytes());
        }
        for ib in 0..8 {
            b[66 + ib] = (codes[2 * ib] | codes[2 * ib + 1] << 4) as u8;
        }
    }
}
