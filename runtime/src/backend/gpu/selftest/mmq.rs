//! `mmq_<type>` checks: the small-batch integer GEMM (`family/mmq.rs`, `kernels-hip/mmq.hip`)
//! of every type it reads (`mmq_mma_<type>`: its int8 matrix-core kernels) against the f64 reference over the activation blocks it read
//! (`q8_reference`, the matvec checks' bound: 2e-5·Σ|w x| plus the q8_1 types' offset
//! term), outputs, activation blocks and partial sums NaN before every launch.
//!
//! Columns 1, 2, 7, 8, 9, 16, 31, 33 and 64 (every column capacity, both sides of each
//! boundary), then `cases` random counts in 1..=64; rows that are rarely a multiple of a
//! block's 32 or 64 (odd counts, 64·m ± 1, random up to 300); K of 1–12 steps of 256 (the
//! 32-element types also ending in a partial step); the K steps in 1 to 5 splits (a split
//! with no steps included), as `plan::mmq` splits them.

use super::report::{Acc, CheckReport, Rng};
use super::{dequant, q8_reference, random_weights};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::family::{mmq, quantize};
use crate::backend::gpu::GpuError;
use crate::quant::GgmlType;

/// The types checked, in check order (new types are appended: the older keep their seeds).
pub const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
];

/// The column counts every check runs (then `cases` random ones).
pub const COLUMNS: [usize; 9] = [1, 2, 7, 8, 9, 16, 31, 33, 64];

/// Every `mmq_*` check whose name contains `filter`.
pub fn run_checks(d: &GpuDevice, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let mut out = Vec::new();
    // The dp4a kernels of every type, then the matrix-core kernels of the types that have them.
    let all = TYPES.iter().map(|&ty| (ty, false)).chain(TYPES.iter().filter(|&&ty| mmq::has_mma(ty)).map(|&ty| (ty, true)));
    for (idx, (ty, mma)) in all.enumerate() {
        let name = format!("mmq_{}{}", if mma { "mma_" } else { "" }, ty.name().to_lowercase());
        if !filter.map(|f| name.contains(f)).unwrap_or(true) {
            continue;
        }
        let mut rng = Rng::new(seed ^ (0x6d_6d71 + idx as u64 * 0x2b2b_5e5e));
        out.push(check(d, &name, ty, mma, cases, &mut rng).unwrap_or_else(|e| {
            CheckReport { name: name.clone(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }
        }));
    }
    out
}

/// Rows for case c: odd, around a multiple of 64, or random.
fn rows_for(rng: &mut Rng, c: usize) -> usize {
    match c % 3 {
        0 => rng.range(0, 40) * 2 + 1,
        1 => 64 * rng.range(1, 4) + [1, 63][c % 2],
        _ => rng.range(1, 300),
    }
}

fn check(d: &GpuDevice, name: &str, ty: GgmlType, mma: bool, cases: usize, rng: &mut Rng) -> Result<CheckReport, GpuError> {
    let fmt = quantize::act_fmt(ty).ok_or_else(|| GpuError::Unsupported(format!("{ty}: no activation form")))?;
    let mut acc = Acc::new(name);
    let mut cols = COLUMNS.to_vec();
    cols.extend((0..cases).map(|_| rng.range(1, 64)));
    for (c, &ncols) in cols.iter().enumerate() {
        let rows = rows_for(rng, c);
        let be = ty.block_elems();
        // The 32-element types: every third case ends in a partial 256-element step.
        let k = if be == 32 && c % 3 == 2 { 32 * rng.range(1, 95) } else { 256 * rng.range(1, 12) };
        let steps = mmq::k_steps(k);
        let want_splits = 1 + rng.range(0, 4).min(steps - 1);
        let per = steps.div_ceil(want_splits);
        let splits = steps.div_ceil(per);
        let w = random_weights(rng, ty, rows, k);
        let x = rng.vec(ncols * k, 1.0);
        let wb = d.upload(&w)?;
        let xb = d.upload_f32(&x)?;
        let qb = d.alloc(quantize::q8_1_bytes(k, ncols))?;
        d.poison(&qb)?;
        let yb = d.alloc(ncols * rows * 4)?;
        d.poison(&yb)?;
        let part = d.alloc(mmq::split_bytes(rows, ncols, splits).max(4))?;
        d.poison(&part)?;
        quantize::quantize_act(d, fmt, xb.ptr(), qb.ptr(), k, ncols)?;
        mmq::mmq(d, wb.ptr(), ty, rows, k, qb.ptr(), yb.ptr(), ncols, splits, per, part.ptr(), mma)?;
        let y = d.read_f32(yb.ptr(), ncols * rows)?;
        let mut q8 = vec![0u8; qb.len()];
        d.read(qb.ptr(), &mut q8)?;
        let wf = dequant(ty, &w, rows * k)?;
        let (want, tol) = q8_reference(&wf, rows, k, &q8, ncols, fmt);
        acc.cmp(&format!("rows={rows} k={k} ncols={ncols} splits={splits}x{per}"), &y, &want, |i| tol[i]);
    }
    Ok(acc.finish())
}
