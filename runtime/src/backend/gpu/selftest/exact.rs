//! `exact_*` checks: every op of an [`ExactBackend`] (`--numerics exact`) against the
//! [`CpuBackend`] through the `Backend` trait (the same calls the model makes), with
//! tolerance 0: a check fails on any differing bit and reports how many elements differ
//! and the first one. Shapes are random within the ranges below (odd row counts, K not
//! a multiple of 256 where the type allows, token counts 1 … 512 where the CPU switches
//! kernels: 4-token groups, 8-token tiled orders, 64-row tiled attention).

use super::report::{CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::backend::ExactBackend;
use crate::backend::gpu::exact::{self, order::ExactType};
use crate::backend::{Attention, Backend, Buf, Glu, KvSpec, KvType, Rope, RopeMode};
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::{self, GgmlType};
use crate::weights::{WeightId, WeightRef};

/// Token counts every matmul check runs.
const TOKENS: [usize; 11] = [1, 2, 3, 4, 5, 7, 8, 17, 64, 129, 512];

/// The GPU backend under test and the CPU reference, plus the weight files of the run
/// (kept alive: the weight cache knows a weight by its bytes' address).
struct Pair {
    gpu: ExactBackend,
    cpu: CpuBackend,
    files: Files,
}

#[derive(Default)]
struct Files(Vec<Box<GgufFile>>);

impl Files {
    fn get(&self, i: usize) -> WeightRef<'_> {
        WeightRef::new(WeightId(i as u32), self.0[i].tensor("w").expect("the file has `w`"))
    }
}

type Outcome = Result<usize, String>;
type Run<'a> = &'a dyn Fn(&mut dyn Backend, &Files) -> crate::backend::Result<Vec<f32>>;

impl Pair {
    /// A weight `[rows, k]` of `ty` from random values (`scale`), in its own GGUF.
    fn weight(&mut self, rng: &mut Rng, ty: GgmlType, rows: usize, k: usize, scale: f32) -> Result<usize, String> {
        let vals = rng.vec(rows * k, scale);
        let mut bytes = vec![0u8; ty.bytes_for((rows * k) as u64).ok_or("partial block")? as usize];
        if GgmlType::GRID_WEIGHTS.contains(&ty) {
            // No quantizer for most of them: random valid blocks.
            bytes = quant::grid_random_blocks(ty, rows * k / 256, rng.range(1, 1 << 30) as u64, scale);
        } else {
            quant::quantize(ty, &vals, &mut bytes).map_err(|e| e.to_string())?;
        }
        let mut g = GgufWriter::new();
        g.add_tensor("w", ty, &[k as u64, rows as u64], bytes);
        let f = GgufFile::from_bytes(g.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        self.files.0.push(Box::new(f));
        Ok(self.files.0.len() - 1)
    }

    /// Runs `f` on both backends with the same inputs; returns (gpu, cpu) outputs.
    fn both(&mut self, f: Run) -> Result<(Vec<f32>, Vec<f32>), String> {
        let Pair { gpu, cpu, files } = self;
        let g = f(gpu, files).map_err(|e| format!("gpu: {e}"))?;
        let c = f(cpu, files).map_err(|e| format!("cpu: {e}"))?;
        Ok((g, c))
    }
}

/// 0 when `gpu` and `cpu` are equal bit for bit, else a message naming the case, the
/// count of differing elements and the first difference.
fn same(case: &str, gpu: &[f32], cpu: &[f32]) -> Outcome {
    if gpu.len() != cpu.len() {
        return Err(format!("{case}: {} vs {} elements", gpu.len(), cpu.len()));
    }
    let diff: Vec<usize> = (0..gpu.len()).filter(|&i| gpu[i].to_bits() != cpu[i].to_bits()).collect();
    match diff.first() {
        None => Ok(gpu.len()),
        Some(&i) => Err(format!("{case}: {} of {} elements differ; first [{i}] gpu {:e} ({:#010x}) vs cpu {:e} ({:#010x})", diff.len(), gpu.len(), gpu[i], gpu[i].to_bits(), cpu[i], cpu[i].to_bits())),
    }
}

/// Uploads `vals` into a fresh buffer of `be`.
fn input(be: &mut dyn Backend, vals: &[f32]) -> crate::backend::Result<Buf> {
    let b = be.alloc(vals.len().max(1))?;
    be.write(b, vals)?;
    Ok(b)
}

fn output(be: &mut dyn Backend, b: Buf, n: usize) -> crate::backend::Result<Vec<f32>> {
    let mut v = vec![0f32; n];
    be.read(b, &mut v)?;
    Ok(v)
}

fn matmul(p: &mut Pair, rng: &mut Rng, ty: GgmlType) -> Outcome {
    let block = ty.block_elems();
    let (rows, k) = (2 * rng.range(8, 60) + 1, block * rng.range(1, if block == 32 { 24 } else { 4 }));
    let w = p.weight(rng, ty, rows, k, 1.0)?;
    let mut n = 0;
    for n_tok in TOKENS {
        let x = rng.vec(n_tok * k, 2.0);
        let (g, c) = p.both(&|be, p| {
            let (xb, yb) = (input(be, &x)?, be.alloc(n_tok * rows)?);
            be.matmul(&p.get(w), xb, n_tok, yb)?;
            output(be, yb, n_tok * rows)
        })?;
        n += same(&format!("{ty} rows {rows} k {k} tokens {n_tok}"), &g, &c)?;
    }
    Ok(n)
}

fn get_rows(p: &mut Pair, rng: &mut Rng, ty: GgmlType) -> Outcome {
    let unit = ty.block_elems().max(32);
    let (rows, k) = (rng.range(5, 200), unit * rng.range(1, if unit == 256 { 8 } else { 30 }));
    let w = p.weight(rng, ty, rows, k, 3.0)?;
    let ids: Vec<u32> = (0..rng.range(1, 40)).map(|_| rng.range(0, rows - 1) as u32).collect();
    let (g, c) = p.both(&|be, p| {
        let out = be.alloc(ids.len() * k)?;
        be.get_rows(&p.get(w), &ids, out)?;
        output(be, out, ids.len() * k)
    })?;
    same(&format!("{ty} rows {rows} k {k}"), &g, &c)
}

fn rms_norm(p: &mut Pair, rng: &mut Rng) -> Outcome {
    let mut n = 0;
    for (row_len, weighted) in [(576, true), (rng.range(1, 700), true), (256, false), (64, true)] {
        let rows = *[1usize, 3, 17, 512].get(rng.range(0, 3)).unwrap_or(&1);
        let x = rng.vec(rows * row_len, 4.0);
        let w = if weighted { Some(p.weight(rng, GgmlType::F32, 1, row_len, 2.0)?) } else { None };
        let (g, c) = p.both(&|be, p| {
            let (xb, ob) = (input(be, &x)?, be.alloc(rows * row_len)?);
            let wr = w.map(|i| p.get(i));
            be.rms_norm(xb, ob, rows, row_len, wr.as_ref(), 1e-6)?;
            be.rms_norm(xb, xb, rows, row_len, wr.as_ref(), 1e-5)?;
            let mut v = output(be, ob, rows * row_len)?;
            v.extend(output(be, xb, rows * row_len)?);
            Ok(v)
        })?;
        n += same(&format!("rows {rows} × {row_len}"), &g, &c)?;
    }
    Ok(n)
}

fn rope(p: &mut Pair, rng: &mut Rng) -> Outcome {
    let mut n = 0;
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        for n_tok in [1, 7, 129] {
            let (n_head, head_dim) = (rng.range(1, 9), 2 * rng.range(16, 128));
            let n_rot = 2 * rng.range(1, head_dim / 2);
            let pos: Vec<u32> = (0..n_tok).map(|_| rng.range(0, 40_000) as u32).collect();
            let x = rng.vec(n_tok * n_head * head_dim, 3.0);
            let (base, fs) = (if rng.range(0, 1) == 0 { 10_000.0 } else { 1_000_000.0 }, if rng.range(0, 1) == 0 { 1.0 } else { 0.25 });
            let (g, c) = p.both(&|be, _| {
                let xb = input(be, &x)?;
                be.rope(xb, n_head, head_dim, &pos, &Rope { mode, n_rot, freq_base: base, freq_scale: fs, freq_factors: None, yarn: None })?;
                output(be, xb, x.len())
            })?;
            n += same(&format!("{mode:?} tokens {n_tok} heads {n_head} dim {head_dim} rot {n_rot}"), &g, &c)?;
        }
    }
    Ok(n)
}

fn elementwise(p: &mut Pair, rng: &mut Rng, which: &str) -> Outcome {
    let len = rng.range(1, 40_000);
    let (a, b) = (rng.vec(len, 14.0), rng.vec(len, 3.0));
    let s = rng.f() * 30.0;
    let (g, c) = p.both(&|be, _| {
        let (ab, bb, ob) = (input(be, &a)?, input(be, &b)?, be.alloc(len)?);
        match which {
            "add" => be.add(ab, bb, ob, len)?,
            "scale" => {
                be.scale(ab, len, s)?;
                be.copy(ab, 0, ob, 0, len)?
            }
            "silu" => be.glu(ab, bb, ob, len, Glu::Silu)?,
            _ => be.glu(ab, bb, ob, len, Glu::GeluTanh)?,
        }
        output(be, ob, len)
    })?;
    same(&format!("{which} n {len}"), &g, &c)
}

/// K/V of positions `0..=last` stored, then `n_tok` query rows ending at `last`.
#[allow(clippy::too_many_arguments)]
fn attention_case(p: &mut Pair, rng: &mut Rng, n_tok: usize, last: usize, n_head: usize, n_kv: usize, hd: usize, window: Option<usize>) -> Outcome {
    let spec = KvSpec { n_layer: 1, n_ctx: last + 1, n_kv_head: n_kv, head_dim_k: hd, head_dim_v: hd, ty: KvType::F16.into(), swa: None, alt: None };
    let kv_pos: Vec<u32> = (0..=last as u32).collect();
    let (k, v) = (rng.vec(kv_pos.len() * n_kv * hd, 2.0), rng.vec(kv_pos.len() * n_kv * hd, 1.5));
    let q = rng.vec(n_tok * n_head * hd, 2.0);
    let pos: Vec<u32> = kv_pos[kv_pos.len() - n_tok..].to_vec();
    let attn = Attention { n_head, n_kv_head: n_kv, head_dim_k: hd, head_dim_v: hd, scale: 1.0 / (hd as f32).sqrt(), window, sinks: None };
    let (g, c) = p.both(&|be, _| {
        let kv = be.alloc_kv(&spec)?;
        let (kb, vb, qb, ob) = (input(be, &k)?, input(be, &v)?, input(be, &q)?, be.alloc(n_tok * n_head * hd)?);
        be.kv_write(kv, 0, kb, vb, &kv_pos)?;
        be.attention(qb, kv, 0, &pos, &attn, ob)?;
        let r = output(be, ob, n_tok * n_head * hd);
        be.free_kv(kv)?;
        r
    })?;
    same(&format!("tokens {n_tok} last {last} heads {n_head}/{n_kv} dim {hd} window {window:?}"), &g, &c)
}

fn attention(p: &mut Pair, rng: &mut Rng) -> Outcome {
    let mut n = 0;
    for n_tok in [1, 2, 3, 5, 17, 63, 64, 129] {
        let last = n_tok - 1 + rng.range(0, 150);
        n += attention_case(p, rng, n_tok, last, 9, 3, 64, None)?;
    }
    n += attention_case(p, rng, 70, 300, 4, 1, 256, Some(128))?;
    n += attention_case(p, rng, 5, 300, 4, 1, 256, Some(128))?;
    n += attention_case(p, rng, 3, 40, 2, 2, 80, None)?;
    n += attention_case(p, rng, 66, 90, 2, 2, 80, None)?;
    // One decode row past 256 positions: the keys split by the CPU's thread count.
    n += attention_case(p, rng, 1, 300, 9, 3, 64, None)?;
    n += attention_case(p, rng, 1, 700, 4, 1, 256, Some(512))?;
    Ok(n)
}

/// A batched decode step's per-row K/V store and attention (`attention_rows`): rows of
/// three sequences with their own caches and lengths (one past 256 positions: split keys).
fn attention_rows(p: &mut Pair, rng: &mut Rng) -> Outcome {
    let (n_head, n_kv, hd) = (4, 2, 64);
    let lens = [5usize, 120, 300];
    let spec = KvSpec { n_layer: 1, n_ctx: 320, n_kv_head: n_kv, head_dim_k: hd, head_dim_v: hd, ty: KvType::F16.into(), swa: None, alt: None };
    let hist: Vec<(Vec<f32>, Vec<f32>)> = lens.iter().map(|&l| (rng.vec(l * n_kv * hd, 2.0), rng.vec(l * n_kv * hd, 1.5))).collect();
    let (q, k, v) = (rng.vec(3 * n_head * hd, 2.0), rng.vec(3 * n_kv * hd, 2.0), rng.vec(3 * n_kv * hd, 1.5));
    let pos: Vec<u32> = lens.iter().map(|&l| l as u32).collect();
    let attn = Attention { n_head, n_kv_head: n_kv, head_dim_k: hd, head_dim_v: hd, scale: 0.125, window: None, sinks: None };
    let (g, c) = p.both(&|be, _| {
        let mut kvs = Vec::new();
        for (i, &l) in lens.iter().enumerate() {
            let kv = be.alloc_kv(&spec)?;
            let (kb, vb) = (input(be, &hist[i].0)?, input(be, &hist[i].1)?);
            be.kv_write(kv, 0, kb, vb, &(0..l as u32).collect::<Vec<_>>())?;
            kvs.push(kv);
        }
        let (qb, kb, vb, ob) = (input(be, &q)?, input(be, &k)?, input(be, &v)?, be.alloc(3 * n_head * hd)?);
        be.attention_rows(qb, kb, vb, &kvs, 0, &pos, &attn, ob)?;
        let r = output(be, ob, 3 * n_head * hd);
        for kv in kvs {
            be.free_kv(kv)?;
        }
        r
    })?;
    same(&format!("rows at {pos:?}"), &g, &c)
}

/// The activation blocks alone: `exact_quantize` against `quant::quantize_rows` (the
/// CPU backend's bytes), byte for byte.
fn quantize_bytes(dev: &GpuDevice, rng: &mut Rng, ty: GgmlType) -> Outcome {
    let et = ExactType::of(ty).ok_or("no exact type")?;
    let (_, qk, bytes) = et.act();
    let mut n = 0;
    for rows in [1, 3, 17] {
        let k = qk * rng.range(1, if qk == 32 { 30 } else { 4 });
        let x = rng.vec(rows * k, 3.0);
        let want = quant::quantize_rows(ty, &x, rows, k).map_err(|e| e.to_string())?.data;
        let e = |e: crate::backend::gpu::DriverError| e.to_string();
        let xb = dev.upload_f32(&x).map_err(e)?;
        let qb = dev.alloc(want.len().max(4)).map_err(e)?;
        dev.poison(&qb).map_err(e)?;
        crate::backend::gpu::family::exact_matmul::quantize(dev, et, xb.ptr(), qb.ptr(), k, rows).map_err(|e| e.to_string())?;
        let mut got = vec![0u8; want.len()];
        dev.read(qb.ptr(), &mut got).map_err(e)?;
        let diff: Vec<usize> = (0..got.len()).filter(|&i| got[i] != want[i]).collect();
        if let Some(&i) = diff.first() {
            return Err(format!("{ty} rows {rows} k {k}: {} of {} bytes differ; first byte {} of block {} (row {}): gpu {:#04x} cpu {:#04x}", diff.len(), got.len(), i % bytes, i / bytes, i / (k / qk * bytes), got[i], want[i]));
        }
        n += got.len();
    }
    Ok(n)
}

/// The dot kernel alone: `exact_matmul` over the CPU's own activation blocks against
/// `quant::matmul_quantized`.
fn dot_only(dev: &GpuDevice, rng: &mut Rng, ty: GgmlType) -> Outcome {
    let et = ExactType::of(ty).ok_or("no exact type")?;
    let (_, qk, _) = et.act();
    let mut n = 0;
    for n_tok in [1, 5, 9] {
        let (rows, k) = (2 * rng.range(8, 60) + 1, qk * rng.range(1, if qk == 32 { 24 } else { 4 }));
        let w = rng.vec(rows * k, 1.0);
        let mut wq = vec![0u8; ty.bytes_for((rows * k) as u64).ok_or("partial block")? as usize];
        quant::quantize(ty, &w, &mut wq).map_err(|e| e.to_string())?;
        let x = rng.vec(n_tok * k, 2.0);
        let xq = quant::quantize_rows(ty, &x, n_tok, k).map_err(|e| e.to_string())?;
        let mut want = vec![0f32; n_tok * rows];
        quant::matmul_quantized(&wq, ty, rows, &xq, &mut want, quant::Isa::best()).map_err(|e| e.to_string())?;
        let e = |e: crate::backend::gpu::DriverError| e.to_string();
        let (wb, qb) = (dev.upload(&wq).map_err(e)?, dev.upload(&xq.data).map_err(e)?);
        let yb = dev.alloc(want.len() * 4).map_err(e)?;
        crate::backend::gpu::family::exact_matmul::matmul(dev, et, wb.ptr(), qb.ptr(), yb.ptr(), rows, k, n_tok).map_err(|e| e.to_string())?;
        let got = dev.read_f32(yb.ptr(), want.len()).map_err(e)?;
        n += same(&format!("{ty} rows {rows} k {k} tokens {n_tok}"), &got, &want)?;
    }
    Ok(n)
}

/// Every `exact_*` check whose name contains `filter`.
pub fn run(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let mut names: Vec<String> = Vec::new();
    for ty in ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q4_k", "q6_k"] {
        names.push(format!("exact_matmul_{ty}"));
        names.push(format!("exact_dot_{ty}"));
    }
    for ty in ["q8_0", "q4_1", "q4_k"] {
        names.push(format!("exact_quantize_{ty}"));
    }
    for n in ["exact_get_rows_q8_0", "exact_get_rows_f16", "exact_get_rows_f32", "exact_get_rows_q4_0", "exact_get_rows_q4_k", "exact_get_rows_q6_k", "exact_rms_norm", "exact_rope", "exact_add", "exact_scale", "exact_glu_silu", "exact_glu_gelu", "exact_attention", "exact_attention_rows"] {
        names.push(n.into());
    }
    // The low-bit types last (the checks share one generator: the older ones keep their cases).
    for ty in GgmlType::LOWBIT_WEIGHTS.iter().chain(&GgmlType::GRID_WEIGHTS) {
        names.push(format!("exact_matmul_{}", ty.name().to_lowercase()));
        names.push(format!("exact_get_rows_{}", ty.name().to_lowercase()));
    }
    names.retain(|n| filter.map(|f| n.contains(f)).unwrap_or(true));
    if names.is_empty() {
        return Vec::new();
    }
    let threads = exact::threads(dev.tuning());
    let gpu = ExactBackend::new(dev.clone());
    let cpu = match CpuBackend::new(threads) {
        Ok(c) => c,
        Err(e) => return names.into_iter().map(|n| report(n, Err(e.to_string()))).collect(),
    };
    let mut p = Pair { gpu, cpu, files: Files::default() };
    let mut rng = Rng::new(seed ^ 0xe8ac7);
    names
        .into_iter()
        .map(|name| {
            let suffix = ["exact_matmul_", "exact_get_rows_", "exact_dot_", "exact_quantize_"].iter().fold(name.as_str(), |n, p| n.trim_start_matches(p));
            let ty = |s: &str| {
                use GgmlType::*;
                [F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4]
                    .into_iter()
                    .chain(GgmlType::GRID_WEIGHTS)
                    .find(|t| t.name().eq_ignore_ascii_case(s))
            };
            let r = match name.as_str() {
                n if n.starts_with("exact_matmul_") => ty(suffix).map_or(Err("unknown type".into()), |t| matmul(&mut p, &mut rng, t)),
                n if n.starts_with("exact_dot_") => ty(suffix).map_or(Err("unknown type".into()), |t| dot_only(dev, &mut rng, t)),
                n if n.starts_with("exact_quantize_") => ty(suffix).map_or(Err("unknown type".into()), |t| quantize_bytes(dev, &mut rng, t)),
                n if n.starts_with("exact_get_rows_") => ty(suffix).map_or(Err("unknown type".into()), |t| get_rows(&mut p, &mut rng, t)),
                "exact_rms_norm" => rms_norm(&mut p, &mut rng),
                "exact_rope" => rope(&mut p, &mut rng),
                "exact_add" => elementwise(&mut p, &mut rng, "add"),
                "exact_scale" => elementwise(&mut p, &mut rng, "scale"),
                "exact_glu_silu" => elementwise(&mut p, &mut rng, "silu"),
                "exact_glu_gelu" => elementwise(&mut p, &mut rng, "gelu"),
                "exact_attention_rows" => attention_rows(&mut p, &mut rng),
                _ => attention(&mut p, &mut rng),
            };
            report(name, r)
        })
        .collect()
}

fn report(name: String, r: Outcome) -> CheckReport {
    let failure = r.as_ref().err().cloned();
    CheckReport { name, cases: r.unwrap_or(0), max_err: 0.0, worst_ratio: if failure.is_some() { f64::INFINITY } else { 0.0 }, skipped: false, failure }
}
