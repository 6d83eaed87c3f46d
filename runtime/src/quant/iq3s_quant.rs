//! IQ3_S's quantizer as llama.cpp's `quantize_iq3_s` (`quantize_row_iq3_s_impl`,
//! 32-element sub-blocks) writes it: weights `x²`, or with an importance matrix
//! `qw·sqrt(σ² + x²)` (σ² twice the super-block's mean square).
//!
//! Each group of 4 magnitudes is a point of the 8-level lattice `2l + 1` (l < 8); the grid
//! holds 512 of the 4096 points. A point off the grid is replaced by the best (weighted
//! distance at the trial scale) of its nearest grid points: those at the three smallest
//! squared distances, in (distance, index) order (`iq3xs_init_impl(512)`'s neighbour lists).
//! Per sub-block, 19 trial scales around `max/15` pick the codes of least weighted error;
//! when a group had to leave the lattice point it rounded to, the codes are taken again at
//! the chosen scale and the scale refitted. The super-block scale is `max/31`, stored times
//! 1.033; the sub-block scales are 4-bit odd multiples of it.
//!
//! Like llama.cpp, a sub-block whose values are all zero does not advance the code and
//! sign pointers, so the codes of the sub-blocks after it land one place early (and the
//! last ones stay zero): reproduced, since the goal is llama.cpp's bytes.

use std::sync::OnceLock;

use super::fit::nearest_int;
use super::float::f16_bits;
use super::iq2_quant::{search_scale, Trials};
use super::iq_grids::IQ3S_GRID;
use super::q8k::QK_K;

/// The lattice point of 4 level indices (3 bits each) → its grid index, or the list of
/// candidate grid indices for a point off the grid.
struct Map {
    index: Vec<i32>,
    neighbours: Vec<Vec<u16>>,
}

fn levels(p: u32) -> [i32; 4] {
    [0, 1, 2, 3].map(|i| (2 * ((p >> (3 * i)) & 7) + 1) as i32)
}

fn map() -> &'static Map {
    static MAP: OnceLock<Map> = OnceLock::new();
    MAP.get_or_init(|| {
        let mut index = vec![-1i32; 4096];
        for (g, &w) in IQ3S_GRID.iter().enumerate() {
            let u = (0..4).fold(0usize, |u, i| u | ((((w >> (8 * i)) & 255) as usize - 1) / 2) << (3 * i));
            index[u] = g as i32;
        }
        let mut neighbours = vec![Vec::new(); 4096];
        for (u, nb) in neighbours.iter_mut().enumerate() {
            if index[u] >= 0 {
                continue;
            }
            let pos = levels(u as u32);
            let mut d: Vec<(i32, u16)> = IQ3S_GRID
                .iter()
                .enumerate()
                .map(|(g, &w)| ((0..4).map(|i| ((w >> (8 * i)) & 255) as i32 - pos[i]).map(|e| e * e).sum(), g as u16))
                .collect();
            d.sort_unstable();
            // Every grid point at the three smallest distances.
            let mut distinct = 1;
            let mut last = d[0].0;
            for &(d2, g) in &d {
                if d2 > last {
                    if distinct == 3 {
                        break;
                    }
                    last = d2;
                    distinct += 1;
                }
                nb.push(g);
            }
        }
        Map { index, neighbours }
    })
}

/// The candidate of least `Σ w·(scale·g − x)²`; its level indices into `l`.
fn best_neighbour(cands: &[u16], x: &[f32], w: &[f32], scale: f32, l: &mut [i8]) -> usize {
    let mut best = (f32::MAX, usize::MAX);
    for &g in cands {
        let gw = IQ3S_GRID[g as usize];
        let mut d2 = 0f32;
        for i in 0..4 {
            let diff = scale * ((gw >> (8 * i)) & 255) as f32 - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best.0 {
            best = (d2, g as usize);
        }
    }
    set_levels(best.1, l);
    best.1
}

fn set_levels(g: usize, l: &mut [i8]) {
    for (i, l) in l.iter_mut().enumerate().take(4) {
        *l = ((((IQ3S_GRID[g] >> (8 * i)) & 255) as i32 - 1) / 2) as i8;
    }
}

/// Group `k`'s levels at inverse scale `id`, then its grid index (a neighbour's when off
/// the grid, `l` rewritten to it): (index, was on the grid).
fn group(m: &Map, id: f32, scale: f32, x: &[f32], w: &[f32], l: &mut [i8]) -> (usize, bool) {
    let mut u = 0usize;
    for i in 0..4 {
        l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, 7) as i8;
        u |= (l[i] as usize) << (3 * i);
    }
    match m.index[u] {
        g if g >= 0 => (g as usize, true),
        _ => (best_neighbour(&m.neighbours[u], x, w, scale, l), false),
    }
}

pub(crate) fn quant_iq3_s(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    let m = map();
    for (k, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(110)).enumerate() {
        b.fill(0);
        let qbl = qw.map(|w| &w[(k * QK_K) % w.len()..][..QK_K]);
        let sigma2 = 2.0 * xbl.iter().fold(0f32, |s, v| s + v * v) / QK_K as f32;
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        // Where the next sub-block's codes and signs go (see the module note).
        let mut slot = 0usize;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut w = [0f32; 32];
            let mut waux = [0f32; 32];
            let mut xval = [0f32; 32];
            let mut signs = [0u8; 4];
            for i in 0..32 {
                w[i] = match qbl {
                    Some(q) => q[32 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                    None => xb[i] * xb[i],
                };
                waux[i] = w[i].sqrt();
                if xb[i] >= 0.0 {
                    xval[i] = xb[i];
                } else {
                    xval[i] = -xb[i];
                    signs[i / 8] |= 1 << (i % 8);
                }
            }
            let max = xval[1..].iter().fold(xval[0], |m, &v| if m > v { m } else { v });
            if max == 0.0 {
                scales[ib] = 0.0;
                continue;
            }
            let trials = Trials { kmax: 15.0, r: 9, step: 0.2, refit_all: true, start_on_grid: false };
            let (l, mut scale) = search_scale::<32, 4>(&trials, &xval, &w, max, &mut |id, scale, k, l| {
                let r = 4 * k..4 * k + 4;
                group(m, id, scale, &xval[r.clone()], &waux[r], l).1
            });
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s);
            }
            for k in 0..8 {
                let u = (0..4).fold(0usize, |u, i| u | (l[4 * k + i] as usize) << (3 * i));
                // Every code was taken from a grid point above.
                let g = m.index[u].max(0) as usize;
                b[2 + 8 * slot + k] = (g & 255) as u8;
                b[66 + ib] |= ((g >> 8) as u8) << k;
            }
            b[74 + 4 * slot..74 + 4 * slot + 4].copy_from_slice(&signs);
            slot += 1;
            scales[ib] = scale;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b[0..2].copy_from_slice(&f16_bits(d * 1.033));
        let id = 1.0 / d;
        for ib in (0..8).step_by(2) {
            let l1 = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15);
            let l2 = nearest_int(0.5 * (id * scales[ib + 1] - 1.0)).clamp(0, 15);
            b[106 + ib / 2] = (l1 | (l2 << 4)) as u8;
        }
    }
}
