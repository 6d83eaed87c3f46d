//! Checks and bench of prefill through the vendor BLAS (`prefill_blas.rs`).
//!
//! - `dequant_<type>[_row64]`: the f16 slab equals `quant::dequantize` rounded to f16,
//!   bit for bit, for every type and layout the GEMM reads; odd row counts (row64's padded
//!   last group), two launches at a row offset; the slab poisoned (NaN) before.
//! - `act_f16_q8_1`, `act_f16_q8_k`, `act_f16_plain`: the f16 activation operand equals,
//!   bit for bit, f16 of what the matrix-core GEMM reads (`quantize_dq_*`'s f32 values,
//!   or the raw f32), rows of zeros and of large values included.
//! - `blas_gemm_<type>[_row64]`: dequantize + BLAS GEMM against the f64 CPU reference at
//!   N = 1, 2, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 511, 1024 and odd
//!   rows / K (`prefill::check_gemm`, bound 1.5e-3 · Σ|w x| + 1e-5: f16
//!   operands, f32 accumulation), outputs poisoned; every other case with a slab of 64
//!   rows so the weight goes through several chunks.
//!
//! All skip (with the reason in the report) when no BLAS library opens.

use crate::backend::gpu::family::{dequant, elementwise, gemm, quantize};
use crate::backend::gpu::launch::ActFmt;
use crate::backend::gpu::family::dequant::ActF16;
use crate::backend::gpu::device::{DeviceBuffer, GpuDevice};
use crate::backend::gpu::driver::blas::Blas;
use crate::backend::gpu::selftest::{dequant, random_weights, Acc, CheckReport, Rng};
use crate::backend::gpu::selftest::prefill::{check_gemm, gemm_cases, time_ms, PrefillTarget, BENCH_SHAPES};
use crate::backend::gpu::{GpuError};
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

type Out<T> = Result<Option<T>, GpuError>;

/// The BLAS on `dev`'s stream with its workspace, or the reason there is none.
pub fn open(dev: &GpuDevice) -> Result<(Blas, DeviceBuffer), String> {
    let _ = dev.mem_info(); // makes the context current on this thread
    let b = Blas::open(dev.api(), dev.stream()).map_err(|e| e.to_string())?;
    let ws = dev.alloc(dequant::WORKSPACE_BYTES).map_err(|e| e.to_string())?;
    b.set_workspace(ws.ptr(), ws.len()).map_err(|e| e.to_string())?;
    Ok((b, ws))
}

fn h16(v: f32) -> u16 {
    half::f16::from_f32(v).to_bits()
}

/// Every BLAS-path check whose name contains `filter`.
pub fn run_checks(dev: &GpuDevice, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let keep = |n: &str| filter.map(|f| n.contains(f)).unwrap_or(true);
    let report = |name: &str, r: Out<CheckReport>| match r {
        Ok(Some(r)) => r,
        Ok(None) => CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: true, failure: None },
        Err(e) => CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) },
    };
    let mut out = Vec::new();
    for (idx, (gname, ty, layout)) in blas_cases().into_iter().enumerate() {
        let name = gname.replacen("gemm_", "dequant_", 1);
        if keep(&name) {
            let mut rng = Rng::new(seed ^ (0xd0d0 + idx as u64 * 0x77));
            out.push(report(&name, check_dequant(dev, &name, ty, layout, cases, &mut rng)));
        }
    }
    for (name, form) in [("act_f16_q8_1", ActF16::Quant(ActFmt::Q8_1)), ("act_f16_q8_k", ActF16::Quant(ActFmt::K)), ("act_f16_plain", ActF16::Plain)] {
        if keep(name) {
            let mut rng = Rng::new(seed ^ 0xac7);
            out.push(report(name, check_act(dev, name, form, cases, &mut rng)));
        }
    }
    let names: Vec<_> = blas_cases().into_iter().map(|(n, ty, l)| (n.replacen("gemm_", "blas_gemm_", 1), ty, l)).filter(|(n, _, _)| keep(n)).collect();
    if names.is_empty() {
        return out;
    }
    match open(dev) {
        Ok((blas, _ws)) => {
            println!("prefill BLAS: {}", blas.library);
            let t = BlasTarget { dev, blas: &blas };
            for (idx, (name, ty, layout)) in names.into_iter().enumerate() {
                let mut rng = Rng::new(seed ^ (0xb1a5 + idx as u64 * 0x1234_5678));
                out.push(report(&name, check_gemm(&t, &name, ty, layout, cases, &mut rng)));
            }
        }
        Err(e) => {
            for (name, _, _) in names {
                out.push(CheckReport { name, cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: true, failure: None });
            }
            println!("note: prefill BLAS checks skipped: {e}");
        }
    }
    out
}

/// The GEMM's (type, layout) pairs, then any low-bit type only the BLAS path reads, named
/// `gemm_<type>` as [`gemm_cases`] names them.
fn blas_cases() -> Vec<(String, GgmlType, Layout)> {
    let mut v = gemm_cases();
    let only_blas = GgmlType::LOWBIT_WEIGHTS.iter().chain(&GgmlType::GRID_WEIGHTS).filter(|&&ty| !gemm::gemm_supports(ty, Layout::Stored));
    v.extend(only_blas.map(|&ty| (format!("gemm_{}", ty.name().to_lowercase()), ty, Layout::Stored)));
    v
}

fn check_dequant(dev: &GpuDevice, name: &str, ty: GgmlType, layout: Layout, cases: usize, rng: &mut Rng) -> Out<CheckReport> {
    let mut acc = Acc::new(name);
    let qk = ty.block_elems();
    for c in 0..cases.max(8) {
        let rows = [1, 63, 64, 65, 130, 257][c % 6] + 2 * (c / 6);
        let k = qk * rng.range(1, (2048 / qk).max(1));
        let w = random_weights(rng, ty, rows, k);
        let packed = layout.materialize(ty, &w, rows, k).map_err(|e| GpuError::Unsupported(format!("pack for the test: {e}")))?;
        let wb = dev.upload(&packed)?;
        let yb = dev.alloc(rows * k * 2)?;
        dev.poison(&yb)?;
        // Two launches: rows [0, r1) and [r1, rows) at their offset in the slab.
        let r1 = rng.range(0, rows);
        dequant::dequant_f16(dev, wb.ptr(), ty, layout, 0, r1, k, yb.ptr())?;
        dequant::dequant_f16(dev, wb.ptr(), ty, layout, r1, rows - r1, k, yb.at(r1 * k * 2))?;
        let mut got = vec![0u8; rows * k * 2];
        dev.read(yb.ptr(), &mut got)?;
        let want: Vec<u8> = dequant(ty, &w, rows * k)?.iter().flat_map(|&v| h16(v).to_le_bytes()).collect();
        acc.cmp_bytes(&format!("rows={rows} k={k} split at {r1} ({})", layout.name(ty)), &got, &want);
    }
    Ok(Some(acc.finish()))
}

fn check_act(dev: &GpuDevice, name: &str, form: ActF16, cases: usize, rng: &mut Rng) -> Out<CheckReport> {
    let mut acc = Acc::new(name);
    for c in 0..cases.max(6) {
        let n = [1, 2, 7, 64, 129, 512][c % 6];
        let k = 256 * rng.range(1, 8);
        let mut x = rng.vec(n * k, if c % 3 == 0 { 40.0 } else { 1.0 });
        if n > 1 {
            x[k..2 * k].iter_mut().for_each(|v| *v = 0.0); // a row of zeros (scale 0)
        }
        let xb = dev.upload_f32(&x)?;
        let yb = dev.alloc(n * k * 2)?;
        dev.poison(&yb)?;
        dequant::act_f16(dev, form, xb.ptr(), yb.ptr(), k, n)?;
        let vals = match form {
            ActF16::Quant(f) => {
                let vb = dev.alloc(n * k * 4)?;
                quantize::quantize_dq(dev, f, xb.ptr(), vb.ptr(), k, n)?;
                dev.read_f32(vb.ptr(), n * k)?
            }
            ActF16::Plain => x,
        };
        let mut got = vec![0u8; n * k * 2];
        dev.read(yb.ptr(), &mut got)?;
        let want: Vec<u8> = vals.iter().flat_map(|&v| h16(v).to_le_bytes()).collect();
        acc.cmp_bytes(&format!("n={n} k={k}"), &got, &want);
    }
    Ok(Some(acc.finish()))
}

/// The GPU through dequantize + BLAS.
struct BlasTarget<'a> {
    dev: &'a GpuDevice,
    blas: &'a Blas,
}

impl PrefillTarget for BlasTarget<'_> {
    fn gemm(&self, w: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize) -> Out<Vec<f32>> {
        let d = self.dev;
        let packed = layout.materialize(ty, w, rows, k).map_err(|e| GpuError::Unsupported(format!("pack for the test: {e}")))?;
        let wb = d.upload(&packed)?;
        let xb = d.upload_f32(x)?;
        let xh = d.alloc(n * k * 2)?;
        let yb = d.alloc(n * rows * 4)?;
        d.poison(&yb)?;
        dequant::act_f16(d, ActF16::Plain, xb.ptr(), xh.ptr(), k, n)?;
        // Every other case through 64-row chunks (several GEMMs into column blocks of y).
        let bound = if (rows + n) % 2 == 0 { 2 * k * 64 } else { dequant::DEFAULT_SLAB };
        let slab = d.alloc(dequant::slab_bytes_for(rows, k, bound))?;
        dequant::matmul(d, self.blas, wb.ptr(), ty, layout, rows, k, xh.ptr(), yb.ptr(), n, slab.ptr(), bound)?;
        Ok(Some(d.read_f32(yb.ptr(), n * rows)?))
    }
    fn gemm_glu(&self, _: &[u8], _: &[u8], _: GgmlType, _: Layout, _: usize, _: usize, _: &[f32], _: usize, _: bool) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn flash(&self, _: &[f32], _: &[u16], _: &[u16], _: &[i32], _: usize, _: usize, _: usize, _: usize, _: f32) -> Out<Vec<f32>> {
        Ok(None)
    }
}

/// Kernel bench of the BLAS path next to the matrix-core GEMM: for each preset GEMM
/// shape and n = 16 … 2048, the dequantize alone, dequantize + BLAS GEMM (the prefill
/// path's cost; µs and TFLOP/s) and lode's own GEMM; gate/up as two BLAS matmuls + GLU.
/// One `bench prefill blas` line per measurement.
pub fn bench(dev: &GpuDevice) -> Result<(), GpuError> {
    let (blas, _ws) = match open(dev) {
        Ok(b) => b,
        Err(e) => {
            println!("bench prefill blas: skipped ({e})");
            return Ok(());
        }
    };
    println!("bench prefill blas: {}", blas.library);
    let mut rng = Rng::new(11);
    let (nmax, kmax) = (2048usize, 14336usize);
    let x = rng.vec(nmax * kmax, 1.0);
    let xb = dev.upload_f32(&x)?;
    let xh = dev.alloc(nmax * kmax * 2)?;
    dequant::act_f16(dev, ActF16::Quant(ActFmt::K), xb.ptr(), xh.ptr(), kmax, nmax)?;
    let yb = dev.alloc(nmax * 14336 * 4)?;
    let y2 = dev.alloc(nmax * 14336 * 4)?;
    let bound = dequant::DEFAULT_SLAB;
    let slab = dev.alloc(bound)?;
    for (label, m, k, ty) in BENCH_SHAPES {
        let w = random_weights(&mut rng, ty, m, k);
        let wb = dev.upload(&w)?;
        let rows = dequant::chunk_rows(k, bound).min(m);
        let deq = time_ms(dev, 10, || {
            let mut r0 = 0;
            while r0 < m {
                let r = rows.min(m - r0);
                dequant::dequant_f16(dev, wb.ptr(), ty, Layout::Stored, r0, r, k, slab.ptr())?;
                r0 += r;
            }
            Ok(())
        })?;
        let gbps = (m * k * 2 + w.len()) as f64 / deq / 1e6;
        for n in [16usize, 64, 128, 512, 2048] {
            let reps = if n >= 512 { 5 } else { 20 };
            let act = time_ms(dev, reps, || dequant::act_f16(dev, ActF16::Quant(ActFmt::K), xb.ptr(), xh.ptr(), k, n))?;
            let both = time_ms(dev, reps, || dequant::matmul(dev, &blas, wb.ptr(), ty, Layout::Stored, m, k, xh.ptr(), yb.ptr(), n, slab.ptr(), bound))?;
            let ours = time_ms(dev, reps, || gemm::gemm(dev, wb.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, crate::backend::gpu::plan::tile(n, m)))?;
            let fl = 2.0 * (m * k * n) as f64;
            println!(
                "bench prefill blas {label:<11} {ty:<5} {m:>5}x{k:<5} n={n:<5} dequant {:7.1} us ({gbps:5.0} GB/s)  dequant+blas {:8.1} us {:6.1} TFLOP/s (blas alone ~{:6.1})  act_f16 {:6.1} us  lode gemm {:8.1} us {:6.1} TFLOP/s",
                deq * 1e3,
                both * 1e3,
                fl / both / 1e9,
                fl / (both - deq).max(1e-6) / 1e9,
                act * 1e3,
                ours * 1e3,
                fl / ours / 1e9
            );
        }
        if label.ends_with("gate_up") {
            let u = random_weights(&mut rng, ty, m, k);
            let ub = dev.upload(&u)?;
            for n in [512usize, 2048] {
                let t = time_ms(dev, 5, || {
                    dequant::matmul(dev, &blas, wb.ptr(), ty, Layout::Stored, m, k, xh.ptr(), yb.ptr(), n, slab.ptr(), bound)?;
                    dequant::matmul(dev, &blas, ub.ptr(), ty, Layout::Stored, m, k, xh.ptr(), y2.ptr(), n, slab.ptr(), bound)?;
                    elementwise::glu(dev, yb.ptr(), y2.ptr(), yb.ptr(), m * n, false)
                })?;
                let fused = time_ms(dev, 5, || gemm::gemm_glu(dev, wb.ptr(), ub.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, false))?;
                println!(
                    "bench prefill blas gate_up {label:<11} n={n:<5} two (dequant+blas) + glu {:8.1} us {:6.1} TFLOP/s; lode paired gemm_glu {:8.1} us",
                    t * 1e3,
                    4.0 * (m * k * n) as f64 / t / 1e9,
                    fused * 1e3
                );
            }
        }
    }
    Ok(())
}
