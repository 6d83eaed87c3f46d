//! Property tests and the kernel bench of the prefill kernels (`prefill.rs`): the
//! matrix-core GEMM of every type and layout it reads, the paired gate/up GEMM, and flash
//! attention, each against an f64 CPU reference at token counts 1, 2, 7, 15, 16, 17, 63,
//! 64, 65, 127, 128, 129, 255, 256, 511, 1024 and odd row / K shapes, outputs poisoned
//! (NaN) before every launch. `lode selftest` runs them after the decode checks.
//!
//! Stated error bounds (f16 operands, f32 accumulation):
//! - GEMM: |y − ref| ≤ 1.5e-3 · Σ_k |w_k x_k| + 1e-5 (each operand rounds once to f16,
//!   2^-11 relative, so a product is off by ≤ ~2^-10 of its magnitude);
//! - GEMM + GLU: the same bound through act and the product (|act'| ≤ 1.13);
//! - attention: |o − ref| ≤ (2e-3 + 2e-3·A) · Σ_j p_j |v_j| + 1e-5 with A the largest
//!   |score| magnitude bound scale·Σ|q k| of the row (q rounds to f16 before QK^T, P to
//!   f16 before PV).

use crate::backend::gpu::family::{attention, elementwise, flash_attn, gemm, matvec, quantize};
use crate::backend::gpu::launch;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::selftest::{dequant, random_weights, Acc, CheckReport, Rng};
use crate::backend::gpu::{GpuError};
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

pub(super) type Out<T> = Result<Option<T>, GpuError>;

/// The token counts every prefill check runs (then `cases` more random ones).
pub const TOKEN_COUNTS: [usize; 16] = [1, 2, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129, 255, 256, 511, 1024];

/// What the prefill checks run against.
pub trait PrefillTarget {
    /// y: [n, rows]; `w` in the stored layout (the target converts to `layout`).
    #[allow(clippy::too_many_arguments)]
    fn gemm(&self, w: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize) -> Out<Vec<f32>>;
    #[allow(clippy::too_many_arguments)]
    fn gemm_glu(&self, g: &[u8], u: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize, gelu: bool) -> Out<Vec<f32>>;
    /// Cache of `slots` rows; queries at pos.
    #[allow(clippy::too_many_arguments)]
    fn flash(&self, q: &[f32], kc: &[u16], vc: &[u16], pos: &[i32], n_head: usize, n_kv: usize, hd: usize, window: usize, scale: f32) -> Out<Vec<f32>>;
}

/// The (type, layout) pairs the GEMM reads (`gemm::type_layouts`' order: new types are
/// appended there, so the older checks keep their seeds), with their check names.
pub fn gemm_cases() -> Vec<(String, GgmlType, Layout)> {
    gemm::type_layouts()
        .map(|(ty, layout)| {
            let suffix = if layout == Layout::Row64 { "_row64" } else { "" };
            (format!("gemm_{}{suffix}", ty.name().to_lowercase()), ty, layout)
        })
        .collect()
}

const GLU_TYPES: [GgmlType; 9] = [
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// Every prefill check whose name contains `filter`.
pub fn run_checks(t: &dyn PrefillTarget, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let mut out = Vec::new();
    let keep = |n: &str| filter.map(|f| n.contains(f)).unwrap_or(true);
    let skipped = |name: &str| CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: true, failure: None };
    let failed = |name: &str, e: GpuError| CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) };
    for (idx, (name, ty, layout)) in gemm_cases().into_iter().enumerate() {
        if keep(&name) {
            let mut rng = Rng::new(seed ^ (0x9e37 + idx as u64 * 0x1f1f_2e2e));
            out.push(match check_gemm(t, &name, ty, layout, cases, &mut rng) {
                Ok(Some(r)) => r,
                Ok(None) => skipped(&name),
                Err(e) => failed(&name, e),
            });
        }
    }
    for (idx, ty) in GLU_TYPES.into_iter().enumerate() {
        let name = format!("gemm_glu_{}", ty.name().to_lowercase());
        if keep(&name) {
            let mut rng = Rng::new(seed ^ (0x51a7 + idx as u64 * 0x3c3c_4d4d));
            out.push(match check_glu(t, &name, ty, cases, &mut rng) {
                Ok(Some(r)) => r,
                Ok(None) => skipped(&name),
                Err(e) => failed(&name, e),
            });
        }
    }
    out
}

/// Token counts: the fixed list, then `extra` random ones.
pub(super) fn token_counts(rng: &mut Rng, extra: usize) -> Vec<usize> {
    let mut v = TOKEN_COUNTS.to_vec();
    v.extend((0..extra).map(|_| rng.range(2, 600)));
    v
}

/// Weight shape for case c with n tokens: odd row counts often, bigger only for small n
/// (keeps the f64 reference quick).
fn shape(rng: &mut Rng, ty: GgmlType, n: usize, c: usize) -> (usize, usize) {
    let qk = ty.block_elems();
    let (max_rows, max_k) = match n {
        0..=128 => (300, 2048),
        129..=256 => (200, 1024),
        _ => (150, 512),
    };
    let rows = match c % 4 {
        0 => rng.range(1, 70) * 2 + 1,
        1 => 128 * rng.range(1, 2) + c % 2,
        _ => rng.range(1, max_rows),
    };
    let k = qk * rng.range(1, (max_k / qk).max(1));
    (rows, k)
}

/// f64 W·x for every (token, row): (value, Σ|w x|).
fn ref_gemm(wf: &[f32], x: &[f32], rows: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    use rayon::prelude::*;
    let mut want = vec![0f64; n * rows];
    let mut mag = vec![0f64; n * rows];
    want.par_chunks_mut(rows).zip(mag.par_chunks_mut(rows)).enumerate().for_each(|(t, (wt, mt))| {
        let xr = &x[t * k..(t + 1) * k];
        for r in 0..rows {
            let wr = &wf[r * k..(r + 1) * k];
            let (mut d, mut m) = (0f64, 0f64);
            for (a, b) in wr.iter().zip(xr) {
                let p = *a as f64 * *b as f64;
                d += p;
                m += p.abs();
            }
            wt[r] = d;
            mt[r] = m;
        }
    });
    let _ = n;
    (want, mag)
}

pub(super) fn check_gemm(t: &dyn PrefillTarget, name: &str, ty: GgmlType, layout: Layout, cases: usize, rng: &mut Rng) -> Out<CheckReport> {
    let mut acc = Acc::new(name);
    for (c, n) in token_counts(rng, cases.saturating_sub(TOKEN_COUNTS.len())).into_iter().enumerate() {
        let (rows, k) = shape(rng, ty, n, c);
        let w = random_weights(rng, ty, rows, k);
        let x = rng.vec(n * k, 1.0);
        let Some(y) = t.gemm(&w, ty, layout, rows, k, &x, n)? else { return Ok(None) };
        let wf = dequant(ty, &w, rows * k)?;
        let (want, mag) = ref_gemm(&wf, &x, rows, k, n);
        acc.cmp(&format!("rows={rows} k={k} n={n}"), &y, &want, |i| 1.5e-3 * mag[i] + 1e-5);
    }
    Ok(Some(acc.finish()))
}

fn act(x: f64, gelu: bool) -> f64 {
    if gelu {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    } else {
        x / (1.0 + (-x).exp())
    }
}

fn check_glu(t: &dyn PrefillTarget, name: &str, ty: GgmlType, cases: usize, rng: &mut Rng) -> Out<CheckReport> {
    let mut acc = Acc::new(name);
    for (c, n) in token_counts(rng, cases.saturating_sub(TOKEN_COUNTS.len()) / 2).into_iter().enumerate() {
        let (rows, k) = shape(rng, ty, n, c);
        let gelu = c % 2 == 1;
        let layout = if ty == GgmlType::Q4_K && c % 3 == 2 { Layout::Row64 } else { Layout::Stored };
        let g = random_weights(rng, ty, rows, k);
        let u = random_weights(rng, ty, rows, k);
        let x = rng.vec(n * k, 1.0);
        let Some(y) = t.gemm_glu(&g, &u, ty, layout, rows, k, &x, n, gelu)? else { return Ok(None) };
        let (gw, gm) = ref_gemm(&dequant(ty, &g, rows * k)?, &x, rows, k, n);
        let (uw, um) = ref_gemm(&dequant(ty, &u, rows * k)?, &x, rows, k, n);
        let want: Vec<f64> = gw.iter().zip(&uw).map(|(&a, &b)| act(a, gelu) * b).collect();
        let tol = |i: usize| 1.5e-3 * (1.2 * gm[i] * uw[i].abs() + act(gw[i], gelu).abs() * um[i]) + 1e-5;
        acc.cmp(&format!("rows={rows} k={k} n={n} {} {}", if gelu { "gelu" } else { "silu" }, layout.name(ty)), &y, &want, tol);
    }
    Ok(Some(acc.finish()))
}

/// The GPU under test.
pub struct GpuPrefill<'a>(pub &'a GpuDevice);

impl GpuPrefill<'_> {
    fn out_buf(&self, bytes: usize) -> Result<crate::backend::gpu::DeviceBuffer, GpuError> {
        let b = self.0.alloc(bytes)?;
        self.0.poison(&b)?;
        Ok(b)
    }
    fn weights(&self, w: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize) -> Result<crate::backend::gpu::DeviceBuffer, GpuError> {
        let bytes = layout.materialize(ty, w, rows, k).map_err(|e| GpuError::Unsupported(format!("pack for the test: {e}")))?;
        Ok(self.0.upload(&bytes)?)
    }
}

impl PrefillTarget for GpuPrefill<'_> {
    fn gemm(&self, w: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize) -> Out<Vec<f32>> {
        let d = self.0;
        let wb = self.weights(w, ty, layout, rows, k)?;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(n * rows * 4)?;
        // Both token tiles meet every token count (the plan alone would give each tile only
        // its own range of n).
        // A third of the counts up to 64 take the split-K form (decode batches), with 1–5
        // splits of ceil(steps / splits) steps: some splits then have no steps left.
        if n <= 64 && (rows + 2 * n) % 3 == 0 {
            let splits = 1 + rows % 5;
            let per = gemm::k_steps(k).div_ceil(splits);
            let part = self.out_buf(gemm::split_bytes(rows, n, splits))?;
            gemm::gemm_split(d, wb.ptr(), ty, layout, rows, k, xb.ptr(), part.ptr(), yb.ptr(), n, splits, per)?;
            return Ok(Some(d.read_f32(yb.ptr(), n * rows)?));
        }
        let tile = [16, 64][(rows + n) % 2];
        gemm::gemm(d, wb.ptr(), ty, layout, rows, k, xb.ptr(), yb.ptr(), n, tile)?;
        Ok(Some(d.read_f32(yb.ptr(), n * rows)?))
    }
    fn gemm_glu(&self, g: &[u8], u: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize, gelu: bool) -> Out<Vec<f32>> {
        let d = self.0;
        let gb = self.weights(g, ty, layout, rows, k)?;
        let ub = self.weights(u, ty, layout, rows, k)?;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(n * rows * 4)?;
        gemm::gemm_glu(d, gb.ptr(), ub.ptr(), ty, layout, rows, k, xb.ptr(), yb.ptr(), n, gelu)?;
        Ok(Some(d.read_f32(yb.ptr(), n * rows)?))
    }
    fn flash(&self, q: &[f32], kc: &[u16], vc: &[u16], pos: &[i32], n_head: usize, n_kv: usize, hd: usize, window: usize, scale: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let qb = d.upload_f32(q)?;
        let kb = d.upload(bytemuck::cast_slice(kc))?;
        let vb = d.upload(bytemuck::cast_slice(vc))?;
        let pb = d.upload_i32(pos)?;
        let ob = self.out_buf(q.len() * 4)?;
        flash_attn::flash_attention(d, qb.ptr(), kb.ptr(), vb.ptr(), ob.ptr(), pos.len(), n_head, n_kv, hd, pb.ptr(), window, scale)?;
        Ok(Some(d.read_f32(ob.ptr(), q.len())?))
    }
}

pub(super) fn time_ms(dev: &GpuDevice, reps: usize, mut f: impl FnMut() -> Result<(), GpuError>) -> Result<f64, GpuError> {
    for _ in 0..2 {
        f()?;
    }
    let t = dev.timer()?;
    t.start()?;
    for _ in 0..reps {
        f()?;
    }
    Ok(t.stop_ms()? as f64 / reps as f64)
}

/// The GEMM shapes of the qwen3-4b and llama-8b presets the kernel benches time.
pub const BENCH_SHAPES: [(&str, usize, usize, GgmlType); 12] = [
    ("4b.q", 4096, 2560, GgmlType::Q4_K),
    ("4b.kv", 1024, 2560, GgmlType::Q4_K),
    ("4b.o", 2560, 4096, GgmlType::Q4_K),
    ("4b.gate_up", 9728, 2560, GgmlType::Q4_K),
    ("4b.down", 2560, 9728, GgmlType::Q4_K),
    ("4b.down", 2560, 9728, GgmlType::Q6_K),
    ("8b.q_o", 4096, 4096, GgmlType::Q4_K),
    ("8b.kv", 1024, 4096, GgmlType::Q4_K),
    ("8b.gate_up", 14336, 4096, GgmlType::Q4_K),
    ("8b.down", 4096, 14336, GgmlType::Q4_K),
    ("8b.down", 4096, 14336, GgmlType::Q6_K),
    ("8b.v", 1024, 4096, GgmlType::Q6_K),
];

/// Kernel bench: every GEMM shape of the qwen3-4b and llama-8b presets (Q4_K; the down
/// projection also Q6_K) at 16 … 2048 tokens in TFLOP/s, decode's 8-column matvec at 16
/// tokens (the dispatch crossover), fused gate/up vs two GEMMs, flash vs the per-query
/// attention kernel. Prints one `bench prefill` line per measurement.
pub fn bench(dev: &GpuDevice) -> Result<(), GpuError> {
    let mut rng = Rng::new(7);
    let shapes = BENCH_SHAPES;
    let nmax = 2048;
    let kmax = 14336;
    let x = rng.vec(nmax * kmax, 1.0);
    let xb = dev.upload_f32(&x)?;
    let yb = dev.alloc(nmax * 14336 * 4)?;
    let qb = dev.alloc(quantize::q8_1_bytes(kmax, 16))?;
    for (label, m, k, ty) in shapes {
        let w = random_weights(&mut rng, ty, m, k);
        let wb = dev.upload(&w)?;
        for n in [16usize, 64, 128, 512, 2048] {
            let reps = if n >= 512 { 5 } else { 20 };
            let ms = time_ms(dev, reps, || gemm::gemm(dev, wb.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, crate::backend::gpu::plan::tile(n, m)))?;
            let tf = 2.0 * (m * k * n) as f64 / ms / 1e9;
            let mut line = format!("bench prefill gemm {label:<11} {ty:<5} {m:>5}x{k:<5} n={n:<5} {:9.1} us {tf:7.1} TFLOP/s", ms * 1e3);
            if n <= 64 {
                let other = if n < 48 { 64 } else { 16 };
                let ms2 = time_ms(dev, reps, || gemm::gemm(dev, wb.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, other))?;
                line.push_str(&format!("  (tile n{other}: {:.1} us)", ms2 * 1e3));
            }
            if n == 16 {
                let ms3 = time_ms(dev, reps, || {
                    quantize::quantize_act(dev, quantize::act_fmt(ty).unwrap_or(launch::ActFmt::Q8_1), xb.ptr(), qb.ptr(), k, n)?;
                    matvec::matvec(dev, wb.ptr(), ty, m, k, qb.ptr(), yb.ptr(), n)
                })?;
                line.push_str(&format!("  (q8_1 + matvec n8: {:.1} us)", ms3 * 1e3));
            }
            println!("{line}");
        }
        if label.ends_with("gate_up") {
            let u = random_weights(&mut rng, ty, m, k);
            let ub = dev.upload(&u)?;
            for n in [512usize, 2048] {
                let fused = time_ms(dev, 5, || gemm::gemm_glu(dev, wb.ptr(), ub.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, false))?;
                let apart = time_ms(dev, 5, || {
                    gemm::gemm(dev, wb.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, crate::backend::gpu::plan::tile(n, m))?;
                    gemm::gemm(dev, ub.ptr(), ty, Layout::Stored, m, k, xb.ptr(), yb.ptr(), n, crate::backend::gpu::plan::tile(n, m))?;
                    elementwise::glu(dev, yb.ptr(), yb.ptr(), yb.ptr(), m * n, false)
                })?;
                let tf = 4.0 * (m * k * n) as f64 / fused / 1e9;
                println!("bench prefill gemm_glu {label:<11} {ty:<5} n={n:<5} fused {:9.1} us {tf:7.1} TFLOP/s; two GEMMs + glu {:9.1} us", fused * 1e3, apart * 1e3);
            }
        }
    }
    drop((xb, yb, qb));
    // Attention, causal over n tokens: 32 heads / 8 KV heads, head_dim 128 (both presets),
    // and Gemma 3 4B's 8 / 4 heads of head_dim 256 (flash2 there: `flash_attn2_f16_d256`,
    // prefill's kernel there).
    for (nh, nkv, hd, n) in [(32usize, 8usize, 128usize, 512usize), (32, 8, 128, 2048), (8, 4, 256, 512), (8, 4, 256, 2048)] {
        let q = rng.vec(n * nh * hd, 1.0);
        let kv: Vec<u16> = (0..n * nkv * hd).map(|_| half::f16::from_f32(rng.f()).to_bits()).collect();
        let qb = dev.upload_f32(&q)?;
        let kb = dev.upload(bytemuck::cast_slice(&kv))?;
        let vb = dev.upload(bytemuck::cast_slice(&kv))?;
        let ob = dev.alloc(q.len() * 4)?;
        let pos: Vec<i32> = (0..n as i32).collect();
        let pb = dev.upload_i32(&pos)?;
        let s = 1.0 / (hd as f32).sqrt();
        let flash2 = time_ms(dev, 5, || flash_attn::flash_attention(dev, qb.ptr(), kb.ptr(), vb.ptr(), ob.ptr(), n, nh, nkv, hd, pb.ptr(), 0, s))?;
        let old = time_ms(dev, 2, || attention::attention(dev, qb.ptr(), kb.ptr(), vb.ptr(), ob.ptr(), n, nh, nkv, hd, pb.ptr(), 0, s))?;
        // causal: n(n+1)/2 scores per head, 2 products (QK, PV) of hd MACs each
        let flops = 4.0 * (n * (n + 1) / 2) as f64 * (nh * hd) as f64;
        println!(
            "bench prefill attention n={n} heads={nh}/{nkv} hd={hd}: flash2 {:8.1} us {:6.1} TFLOP/s; per-query kernel {:8.1} us",
            flash2 * 1e3,
            flops / flash2 / 1e9,
            old * 1e3
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::backend::gpu::selftest::flash::{ref_flash, FLASH_SHAPES};
    use super::*;
    use crate::quant::row64;

    /// A host "GPU": the reference math in f32 with f16-rounded operands, as the kernels
    /// compute it. The checks must pass it, and must catch a wrong variant of it.
    struct Host {
        drop_last_row: bool,
        /// A wrong attention: ignores the sliding window.
        no_window: bool,
    }
    fn r16(v: f32) -> f32 {
        half::f16::from_f32(v).to_f32()
    }
    impl PrefillTarget for Host {
        fn gemm(&self, w: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize) -> Out<Vec<f32>> {
            // Round-trip through the layout the GPU would read.
            let packed = layout.materialize(ty, w, rows, k).unwrap();
            let mut stored = vec![0u8; w.len()];
            if layout == Layout::Row64 {
                row64::unpack(ty, &packed, rows, k, &mut stored).unwrap();
            } else {
                stored.copy_from_slice(&packed);
            }
            let wf = dequant(ty, &stored, rows * k)?;
            let mut y = vec![0f32; n * rows];
            for t in 0..n {
                for r in 0..rows {
                    if self.drop_last_row && r + 1 == rows && t + 1 == n {
                        continue;
                    }
                    y[t * rows + r] = (0..k).map(|i| r16(wf[r * k + i]) * r16(x[t * k + i])).sum();
                }
            }
            if self.drop_last_row {
                y[n * rows - 1] = f32::NAN;
            }
            Ok(Some(y))
        }
        fn gemm_glu(&self, g: &[u8], u: &[u8], ty: GgmlType, layout: Layout, rows: usize, k: usize, x: &[f32], n: usize, gelu: bool) -> Out<Vec<f32>> {
            let a = self.gemm(g, ty, layout, rows, k, x, n)?.unwrap();
            let b = self.gemm(u, ty, layout, rows, k, x, n)?.unwrap();
            Ok(Some(a.iter().zip(&b).map(|(&a, &b)| (act(a as f64, gelu) * b as f64) as f32).collect()))
        }
        fn flash(&self, q: &[f32], kc: &[u16], vc: &[u16], pos: &[i32], n_head: usize, n_kv: usize, hd: usize, window: usize, scale: f32) -> Out<Vec<f32>> {
            let window = if self.no_window { 0 } else { window };
            let (o, _) = ref_flash(q, kc, vc, pos, n_head, n_kv, hd, window, scale);
            Ok(Some(o.iter().map(|&v| v as f32).collect()))
        }
    }

    #[test]
    fn checks_pass_a_correct_target_and_catch_a_wrong_one() {
        let ok = run_checks(&Host { drop_last_row: false, no_window: false }, Some("gemm_q4_k"), 0, 3);
        assert_eq!(ok.len(), 2, "stored and row64");
        for r in &ok {
            assert!(r.passed() && r.cases == TOKEN_COUNTS.len(), "{}", r.line());
        }
        let bad = run_checks(&Host { drop_last_row: true, no_window: false }, Some("gemm_q8_0"), 0, 3);
        assert!(!bad[0].passed(), "{}", bad[0].line());
    }

    #[test]
    fn glu_and_flash_checks_pass_the_reference() {
        for r in run_checks(&Host { drop_last_row: false, no_window: false }, Some("gemm_glu_q5_0"), 0, 5) {
            assert!(r.passed(), "{}", r.line());
        }
        let ok = crate::backend::gpu::selftest::flash::run_checks(&Host { drop_last_row: false, no_window: false }, Some("flash_attn"), 0, 5);
        assert_eq!(ok.len(), 1);
        assert!(ok[0].passed() && ok[0].cases == TOKEN_COUNTS.len() + FLASH_SHAPES.len(), "{}", ok[0].line());
        let bad = crate::backend::gpu::selftest::flash::run_checks(&Host { drop_last_row: false, no_window: true }, Some("flash_attn"), 0, 5);
        assert!(!bad[0].passed(), "{}", bad[0].line());
    }
}
