//! IQ3_XXS's quantizer, as llama.cpp's `quantize_iq3_xxs` (`quantize_row_iq3_xxs_impl`
//! with its 256-point grid) writes it: with importance weights `qw·√(σ² + x²)` (σ² twice
//! the super-block's mean square) when an importance matrix is given, else `x²`.
//!
//! Groups of 4 magnitudes on the lattice `2l + 1` (l < 8); off-grid points go to the best
//! of their neighbours at the two smallest squared distances. 31 trial scales around
//! `max/15` per 32-element sub-block; groups that left their lattice point are coded
//! again at the chosen scale. The super-block scale is `max/31` stored times 1.0125.

use std::sync::OnceLock;

use super::fit::nearest_int;
use super::float::f16_bits;
use super::iq2_quant::{search_scale, signs8, Trials};
use super::iq_grids_data::IQ3XXS_PACKED;
use super::q8k::QK_K;

const EPS: f32 = 1e-8;

struct Lattice4 {
    grid: Vec<[i8; 4]>,
    index: Vec<i32>,
    neighbours: Vec<Vec<u16>>,
}

fn lattice() -> &'static Lattice4 {
    static L: OnceLock<Lattice4> = OnceLock::new();
    L.get_or_init(|| {
        let grid: Vec<[i8; 4]> = IQ3XXS_PACKED.iter().map(|&p| std::array::from_fn(|i| (2 * ((p >> (4 * i)) & 7) + 1) as i8)).collect();
        let mut index = vec![-1i32; 4096];
        for (k, g) in grid.iter().enumerate() {
            let u = (0..4).fold(0usize, |u, i| u | (((g[i] - 1) / 2) as usize) << (3 * i));
            index[u] = k as i32;
        }
        let mut neighbours = vec![Vec::new(); 4096];
        for (u, nb) in neighbours.iter_mut().enumerate() {
            if index[u] >= 0 {
                continue;
            }
            let pos: [i32; 4] = std::array::from_fn(|k| 2 * ((u >> (3 * k)) & 7) as i32 + 1);
            let mut d2: Vec<(i32, u16)> =
                grid.iter().enumerate().map(|(j, g)| ((0..4).map(|k| (g[k] as i32 - pos[k]).pow(2)).sum(), j as u16)).collect();
            d2.sort_unstable();
            let (mut last, mut have) = (d2[0].0, 1);
            for &(d, j) in &d2 {
                if d > last {
                    if have == 2 {
                        break;
                    }
                    last = d;
                    have += 1;
                }
                nb.push(j);
            }
        }
        Lattice4 { grid, index, neighbours }
    })
}

/// Levels of a group at inverse scale `id`, then its grid index (the best neighbour's when
/// off the grid, `l` rewritten): (index, was on the grid).
fn group(lat: &Lattice4, id: f32, scale: f32, x: &[f32], w: &[f32], l: &mut [i8]) -> (usize, bool) {
    let mut u = 0usize;
    for i in 0..4 {
        l[i] = nearest_int(0.5 * (id * x[i] - 1.0)).clamp(0, 7) as i8;
        u |= (l[i] as usize) << (3 * i);
    }
    if lat.index[u] >= 0 {
        return (lat.index[u] as usize, true);
    }
    let mut best = (f32::MAX, 0usize);
    for &j in &lat.neighbours[u] {
        let mut d2 = 0f32;
        for i in 0..4 {
            let diff = scale * lat.grid[j as usize][i] as f32 - x[i];
            d2 += w[i] * diff * diff;
        }
        if d2 < best.0 {
            best = (d2, j as usize);
        }
    }
    for i in 0..4 {
        l[i] = (lat.grid[best.1][i] - 1) / 2;
    }
    (best.1, false)
}

/// IQ3_XXS (98 bytes per 256): f16 d, 64 grid-index bytes, then per 32-element sub-block a
/// u32 of four 7-bit sign indices and the 4-bit scale at bit 28. `qw`: one importance
/// weight per element of a row, or none.
pub(crate) fn quant_iq3_xxs(src: &[f32], dst: &mut [u8], qw: Option<&[f32]>) {
    let lat = lattice();
    for (ibl, (xbl, b)) in src.chunks_exact(QK_K).zip(dst.chunks_exact_mut(98)).enumerate() {
        b.fill(0);
        let qwb = qw.map(|q| &q[(ibl * QK_K) % q.len()..][..QK_K]);
        let sumx2 = xbl.iter().fold(0f32, |s, &v| s + v * v);
        let sigma2 = 2.0 * sumx2 / QK_K as f32;
        let mut scales = [0f32; 8];
        let mut words = [0u32; 8];
        let mut max_scale = 0f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let (mut w, mut waux, mut xval) = ([0f32; 32], [0f32; 32], [0f32; 32]);
            for i in 0..32 {
                w[i] = match qwb {
                    Some(q) => q[32 * ib + i] * (sigma2 + xb[i] * xb[i]).sqrt(),
                    None => xb[i] * xb[i],
                };
                waux[i] = w[i].sqrt();
            }
            let mut signs = [0u8; 4];
            signs8(xb, &w, &mut xval, &mut signs);
            let max = xval[1..].iter().fold(xval[0], |m, &v| if m > v { m } else { v });
            if max < EPS {
                continue;
            }
            let trials = Trials { kmax: 15.0, r: 15, step: 0.2, refit_all: false, start_on_grid: true };
            let (l, mut scale) = search_scale::<32, 4>(&trials, &xval, &w, max, &mut |id, scale, k, l| {
                let r = 4 * k..4 * k + 4;
                group(lat, id, scale, &xval[r.clone()], &waux[r], l).1
            });
            if scale < 0.0 {
                scale = -scale;
                signs = signs.map(|s| !s & 127);
            }
            for k in 0..8 {
                let u = (0..4).fold(0usize, |u, i| u | (l[4 * k + i] as usize) << (3 * i));
                b[2 + 8 * ib + k] = lat.index[u].max(0) as u8;
            }
            words[ib] = signs[0] as u32 | (signs[1] as u32) << 7 | (signs[2] as u32) << 14 | (signs[3] as u32) << 21;
            scales[ib] = scale;
            max_scale = max_scale.max(scale);
        }
        if max_scale == 0.0 {
            b.fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        b[0..2].copy_from_slice(&f16_bits(d * 1.0125));
        let id = 1.0 / d;
        for ib in 0..8 {
            let code = nearest_int(0.5 * (id * scales[ib] - 1.0)).clamp(0, 15) as u32;
            b[66 + 4 * ib..70 + 4 * ib].copy_from_slice(&(words[ib] | code << 28).to_le_bytes());
        }
    }
}
