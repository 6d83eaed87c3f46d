//! `norm_mv_*` checks: the fused decode matvecs (`backend/norm_mv.rs`, `decode_mv.hip`)
//! through the `Backend` trait, the calls the model makes, on one token:
//! - `norm_mv_multi`: `norm_matmul_multi` with 1–3 weights of random, mixed types
//!   (Q4_0 … Q8_0, Q4_K, Q5_K, Q6_K), rows of 1024 / 2560 / 4096 / 576 / 640 / random,
//!   residual add on or off, norm weight on or off;
//! - `norm_mv_glu`: `norm_matmul_glu` (SiLU and GELU-tanh), same shapes;
//! - `norm_mv_quant`: `matmul` of a fresh f32 input (no quantized form yet: the prologue
//!   quantizes it), rows of up to 16384; every other case as `matmul_residual` (the
//!   product added to a residual vector in the epilogue; unfused: matmul, then `add`);
//! - `norm_mv_head`: `norm_matmul_multi` with one Q6_K weight of 3,601–6,003 rows (more
//!   than one wave of decode_mv blocks on the H200: the fused LM head, `head_mv.rs`), rows
//!   of 256 / 768 / 1024 / 2560 / 3072, row counts that leave a partial 8-row stage; the
//!   head launch must have run;
//! - `norm_mv_half`: `norm_matmul_multi` (1–3 Q4_K weights, odd row counts, so a block's
//!   64 rows span segments) and `norm_matmul_glu` (Q4_K) with rows of 256–1024: the
//!   half-warp kernels (`decode_mv::half_supports`), whose launch must have run;
//! - `norm_mv_walk`: `norm_matmul_multi` (1–3 weights, Q4_K, the last one Q6_K in every
//!   other case) and `norm_matmul_glu` (Q4_K) with weights of more rows than one wave of norm blocks holds (1,000–7,000 per weight),
//!   rows of 2560 / 4096 / 1024 / 2048 / 256·r: the resident row walk
//!   (`decode_mv::norm_walk`), whose launch must have run exactly where the one-wave
//!   kernel does not fit;
//! - `norm_mv_low`: the mv_dot_low.h types in the same kernels, cycling through four ops:
//!   `norm_matmul_multi` of 1–3 weights of Q3_K, IQ4_XS or Q2_K with a last one of that
//!   type or another K-quant (Q3_K_M's q/k/v: Q3_K, Q3_K, Q4_K / Q5_K), rows of 1–300
//!   (one wave of norm blocks; Q3_K takes the walk there too) or 1,000–3,000 per weight
//!   (the walks `decode_mv_norm_walk_{q2k,q3k,iq4xs}`); `norm_matmul_glu` of those types, few or
//!   4,300–6,000 rows; `matmul` / `matmul_residual` of a fresh input over Q3_K, IQ4_XS,
//!   Q2_K or IQ4_NL (`decode_mv_quant`); `norm_matmul_multi` of 1–3 IQ4_NL weights (the
//!   q8_1 form) with rows of 32·r.
//!
//! Each case runs on the GPU with the fusion on, the GPU with it off (the unfused
//! kernels) and the CPU backend, outputs poisoned (NaN) first. Against the CPU: the
//! residual sum x + add bit for bit, the normalized row within 2e-6 relative, each matmul
//! output within 5e-4 · Σ_k |W_ik·x_k| (the CPU rounds activations to the same codes; the
//! bound leaves room for one code flipped by a one-ulp difference in the norm, ~4e-5 of
//! that sum, and catches a wrong block, scale or row, which is O(1) of it), a GLU output
//! within that bound carried through the activation plus 1e-3 relative (GELU rounds
//! through f16). Against the unfused GPU kernels (`*_bits`): every output bit for bit
//! (same reduction order, same activation codes, same per-lane dot order). Each case also
//! checks that the fused path really ran (the launch count grew by one; by none where the
//! launch would not fit in one wave of blocks on the device — never on the H200 at these rows).

use crate::backend::gpu::family::decode_mv;
use super::report::{Acc, CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::{Backend, Buf, Glu, NormIn};
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::{self, GgmlType};
use crate::weights::{WeightId, WeightRef};

const EPS: f32 = 1e-6;

/// Weights of the run, each in its own GGUF (kept alive: the weight cache knows a weight
/// by its bytes' address), with their dequantized values for the error bounds.
#[derive(Default)]
struct Files(Vec<(Box<GgufFile>, Vec<f32>)>);

impl Files {
    fn add(&mut self, rng: &mut Rng, ty: GgmlType, rows: usize, k: usize, scale: f32) -> Result<usize, String> {
        let vals = rng.vec(rows * k, scale);
        let mut bytes = vec![0u8; ty.bytes_for((rows * k) as u64).ok_or("partial block")? as usize];
        quant::quantize(ty, &vals, &mut bytes).map_err(|e| e.to_string())?;
        let mut deq = vec![0f32; rows * k];
        quant::dequantize(ty, &bytes, &mut deq).map_err(|e| e.to_string())?;
        let mut g = GgufWriter::new();
        g.add_tensor("w", ty, &[k as u64, rows as u64], bytes);
        let f = GgufFile::from_bytes(g.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        self.0.push((Box::new(f), deq));
        Ok(self.0.len() - 1)
    }
    fn get(&self, i: usize) -> WeightRef<'_> {
        WeightRef::new(WeightId(i as u32), self.0[i].0.tensor("w").expect("the file has `w`"))
    }
    fn values(&self, i: usize) -> &[f32] {
        &self.0[i].1
    }
}

/// One case's op: which fused op, its weights (file indices) and rows.
#[derive(Clone, Debug)]
enum Op {
    Multi(Vec<(usize, usize)>),
    Glu { gate: usize, up: usize, rows: usize, act: Glu },
    Quant { w: usize, rows: usize },
}

/// What a backend left behind: x after the op, out (the normalized row), the outputs.
type Outs = (Vec<f32>, Vec<f32>, Vec<Vec<f32>>);

struct Case {
    n: usize,
    x: Vec<f32>,
    add: Option<Vec<f32>>,
    norm_w: Option<usize>,
    op: Op,
    /// `Op::Quant` through `matmul_residual`: the residual's values ([rows]).
    residual: Option<Vec<f32>>,
}

fn input(be: &mut dyn Backend, v: &[f32]) -> crate::backend::Result<Buf> {
    let b = be.alloc(v.len())?;
    be.write(b, v)?;
    Ok(b)
}

fn poisoned(be: &mut dyn Backend, n: usize) -> crate::backend::Result<Buf> {
    input(be, &vec![f32::NAN; n])
}

fn read(be: &mut dyn Backend, b: Buf, n: usize) -> crate::backend::Result<Vec<f32>> {
    let mut v = vec![0f32; n];
    be.read(b, &mut v)?;
    Ok(v)
}

/// Runs the case's op on `be`; returns what it wrote.
fn run_case(be: &mut dyn Backend, f: &Files, c: &Case) -> crate::backend::Result<Outs> {
    let n = c.n;
    let xb = input(be, &c.x)?;
    let mut bufs = vec![xb];
    let r = (|| {
        let ab = match &c.add {
            Some(a) => Some(input(be, a)?),
            None => None,
        };
        bufs.extend(ab);
        let ob = poisoned(be, n)?;
        bufs.push(ob);
        let nw = c.norm_w.map(|i| f.get(i));
        let norm = NormIn { x: xb, add: ab, out: ob, row_len: n, w: nw.as_ref(), eps: EPS };
        let mut ys = Vec::new();
        match &c.op {
            Op::Multi(ws) => {
                for &(_, rows) in ws {
                    ys.push((poisoned(be, rows)?, rows));
                }
                bufs.extend(ys.iter().map(|y| y.0));
                let refs: Vec<WeightRef> = ws.iter().map(|&(i, _)| f.get(i)).collect();
                let outs: Vec<(&WeightRef, Buf)> = refs.iter().zip(&ys).map(|(w, y)| (w, y.0)).collect();
                be.norm_matmul_multi(&norm, 1, &outs)?;
            }
            Op::Glu { gate, up, rows, act } => {
                let (y, tmp) = (poisoned(be, *rows)?, poisoned(be, *rows)?);
                bufs.extend([y, tmp]);
                ys.push((y, *rows));
                be.norm_matmul_glu(&norm, 1, &f.get(*gate), &f.get(*up), y, tmp, *act)?;
            }
            Op::Quant { w, rows } => {
                let y = poisoned(be, *rows)?;
                bufs.push(y);
                match &c.residual {
                    Some(rv) => {
                        let rb = input(be, rv)?;
                        bufs.push(rb);
                        // As the model does: the caller adds what the backend left.
                        if !be.matmul_residual(&f.get(*w), xb, 1, rb, y)? {
                            be.add(rb, y, rb, *rows)?;
                        }
                        ys.push((rb, *rows));
                    }
                    None => {
                        be.matmul(&f.get(*w), xb, 1, y)?;
                        ys.push((y, *rows));
                    }
                }
            }
        }
        let x_after = read(be, xb, n)?;
        let out = if matches!(c.op, Op::Quant { .. }) { Vec::new() } else { read(be, ob, n)? };
        let mut yv = Vec::new();
        for (y, rows) in ys {
            yv.push(read(be, y, rows)?);
        }
        Ok((x_after, out, yv))
    })();
    for b in bufs {
        let _ = be.free(b);
    }
    r
}

/// Σ_k |W_rk · x_k| per row r of the `rows`×`k` values `w`.
fn abs_dot(w: &[f32], x: &[f32], rows: usize) -> Vec<f64> {
    let k = x.len();
    (0..rows).map(|r| w[r * k..(r + 1) * k].iter().zip(x).map(|(a, b)| (*a as f64 * *b as f64).abs()).sum()).collect()
}

fn act_of(act: Glu, g: f64) -> f64 {
    match act {
        Glu::Silu => g / (1.0 + (-g).exp()),
        Glu::GeluTanh => 0.5 * g * (1.0 + (0.797_884_560_802_865_4 * (g + 0.044715 * g * g * g)).tanh()),
    }
}

/// Compares a case's fused GPU outputs with the CPU's (`acc`) and the unfused GPU's (`bits`).
fn compare(acc: &mut Acc, bits: &mut Acc, f: &Files, c: &Case, fused: &Outs, plain: &Outs, cpu: &Outs) {
    let label = format!("n={} {:?} add={} w={}", c.n, c.op, c.add.is_some(), c.norm_w.is_some());
    acc.cmp_bits(&format!("{label} x"), &fused.0, &cpu.0);
    if !matches!(c.op, Op::Quant { .. }) {
        let want: Vec<f64> = cpu.1.iter().map(|&v| v as f64).collect();
        acc.cmp(&format!("{label} out"), &fused.1, &want, |i| 2e-6 * want[i].abs() + 1e-7);
    }
    // The matmul input as the CPU saw it.
    let xin: Vec<f32> = if matches!(c.op, Op::Quant { .. }) { c.x.clone() } else { cpu.1.clone() };
    match &c.op {
        Op::Multi(ws) => {
            for (s, &(i, rows)) in ws.iter().enumerate() {
                let sum = abs_dot(f.values(i), &xin, rows);
                let want: Vec<f64> = cpu.2[s].iter().map(|&v| v as f64).collect();
                acc.cmp(&format!("{label} y{s} ({})", f.get(i).ty()), &fused.2[s], &want, |r| 5e-4 * sum[r] + 1e-6);
            }
        }
        Op::Glu { gate, up, rows, act } => {
            let (sg, su) = (abs_dot(f.values(*gate), &xin, *rows), abs_dot(f.values(*up), &xin, *rows));
            // g and u themselves, from the dequantized weights (for the bound only).
            let k = c.n;
            let dot = |w: &[f32], r: usize| -> f64 { w[r * k..(r + 1) * k].iter().zip(&xin).map(|(a, b)| *a as f64 * *b as f64).sum() };
            let want: Vec<f64> = cpu.2[0].iter().map(|&v| v as f64).collect();
            acc.cmp(&format!("{label} glu ({})", f.get(*gate).ty()), &fused.2[0], &want, |r| {
                let (g, u) = (dot(f.values(*gate), r), dot(f.values(*up), r));
                5e-4 * (1.2 * sg[r] * u.abs() + su[r] * act_of(*act, g).abs().max(g.abs())) + 1e-3 * want[r].abs() + 1e-6
            });
        }
        Op::Quant { w, rows } => {
            let sum = abs_dot(f.values(*w), &xin, *rows);
            let want: Vec<f64> = cpu.2[0].iter().map(|&v| v as f64).collect();
            let base = |r: usize| c.residual.as_ref().map(|v| v[r].abs() as f64 * 2e-7).unwrap_or(0.0);
            acc.cmp(&format!("{label} y ({}, residual {})", f.get(*w).ty(), c.residual.is_some()), &fused.2[0], &want, |r| 5e-4 * sum[r] + 1e-6 + base(r));
        }
    }
    bits.cmp_bits(&format!("{label} x"), &fused.0, &plain.0);
    bits.cmp_bits(&format!("{label} out"), &fused.1, &plain.1);
    for (s, (a, b)) in fused.2.iter().zip(&plain.2).enumerate() {
        bits.cmp_bits(&format!("{label} y{s}"), a, b);
    }
}

const K_TYPES: [GgmlType; 3] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
const B32_TYPES: [GgmlType; 5] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

/// A weight type for rows of `n` (the K-quants need whole 256-value super-blocks).
fn pick_type(rng: &mut Rng, n: usize) -> GgmlType {
    let k_ok = n % 256 == 0;
    if k_ok && rng.range(0, 1) == 0 {
        K_TYPES[rng.range(0, 2)]
    } else {
        B32_TYPES[rng.range(0, 4)]
    }
}

/// Case `i` of check `name`.
fn make_case(name: &str, i: usize, rng: &mut Rng, f: &mut Files) -> Result<Case, String> {
    let low = name == "norm_mv_low";
    let quant = name == "norm_mv_quant" || (low && i % 4 == 2);
    let n = if low {
        if i % 4 == 3 {
            32 * rng.range(1, 128)
        } else {
            [4096, 2560, 1024, 2048, 256 * rng.range(1, 16), 4096, 3072, 512][i % 8]
        }
    } else if quant {
        [2048, 3072, 9728, 1024, 576, 14336, 640, if i % 16 == 7 { 4096 } else { 32 * rng.range(1, 512) }][i % 8]
    } else if name == "norm_mv_walk" {
        [2560, 4096, 1024, 2560, 2048, 4096, 256 * rng.range(1, 16), 2560][i % 8]
    } else if name == "norm_mv_half" {
        [1024, 768, 1024, 256, 512, 1024, 256 * rng.range(1, 4), 1024][i % 8]
    } else if name == "norm_mv_head" {
        [1024, 2560, 1024, 3072, 768, 1024, 2560, 256][i % 8]
    } else {
        [1024, 2560, 4096, 576, 640, 2048, 256 * rng.range(1, 16), 32 * rng.range(1, 128)][i % 8]
    };
    let x = rng.vec(n, 2.0);
    let add = (!quant && i % 2 == 0).then(|| rng.vec(n, 2.0));
    let norm_w = if !quant && i % 3 != 2 { Some(f.add(rng, GgmlType::F32, 1, n, 1.5)?) } else { None };
    // Rows: odd counts and counts that do not fill the last 8-row block.
    let rows = |rng: &mut Rng| if rng.range(0, 3) == 0 { 8 * rng.range(1, 64) } else { rng.range(1, 300) };
    let op = match name {
        "norm_mv_multi" => {
            let mut ws = Vec::new();
            for _ in 0..rng.range(1, 3) {
                let (ty, r) = (pick_type(rng, n), rows(rng));
                ws.push((f.add(rng, ty, r, n, 1.0)?, r));
            }
            Op::Multi(ws)
        }
        "norm_mv_walk" if i % 2 == 0 => {
            // Every other case a Q6_K last weight (Q4_K_M's v: the `_v` kernel).
            let m = rng.range(1, 3);
            let mut ws = Vec::new();
            for j in 0..m {
                let r = rng.range(1_000, 5_000);
                let ty = if j + 1 == m && i % 4 == 2 { GgmlType::Q6_K } else { GgmlType::Q4_K };
                ws.push((f.add(rng, ty, r, n, 1.0)?, r));
            }
            Op::Multi(ws)
        }
        "norm_mv_walk" => {
            let r = rng.range(4_300, 7_000);
            let act = if i % 4 == 1 { Glu::Silu } else { Glu::GeluTanh };
            Op::Glu { gate: f.add(rng, GgmlType::Q4_K, r, n, 1.0)?, up: f.add(rng, GgmlType::Q4_K, r, n, 1.0)?, rows: r, act }
        }
        "norm_mv_half" if i % 2 == 0 => {
            let mut ws = Vec::new();
            for _ in 0..rng.range(1, 3) {
                let r = rng.range(1, 700);
                ws.push((f.add(rng, GgmlType::Q4_K, r, n, 1.0)?, r));
            }
            Op::Multi(ws)
        }
        "norm_mv_half" => {
            let r = rng.range(1, 3_100);
            let act = if i % 4 == 1 { Glu::Silu } else { Glu::GeluTanh };
            Op::Glu { gate: f.add(rng, GgmlType::Q4_K, r, n, 1.0)?, up: f.add(rng, GgmlType::Q4_K, r, n, 1.0)?, rows: r, act }
        }
        "norm_mv_head" => {
            let r = [6_003, 4_001, 5_120, 3_609, 4_803, 4_805, 3_601, 4_811][i % 8];
            Op::Multi(vec![(f.add(rng, GgmlType::Q6_K, r, n, 1.0)?, r)])
        }
        "norm_mv_glu" => {
            let (ty, r) = (pick_type(rng, n), rows(rng));
            let act = if i % 2 == 0 { Glu::Silu } else { Glu::GeluTanh };
            Op::Glu { gate: f.add(rng, ty, r, n, 1.0)?, up: f.add(rng, ty, r, n, 1.0)?, rows: r, act }
        }
        "norm_mv_low" => low_op(i, n, rng, f)?,
        // Qwen3-4B's o (Q4_K rows of 4096, 2560 of them: one warp per row, decode_mv_quant2).
        _ if i % 16 == 7 => Op::Quant { w: f.add(rng, GgmlType::Q4_K, 2560, n, 1.0)?, rows: 2560 },
        _ => {
            let (ty, r) = (pick_type(rng, n), rows(rng));
            Op::Quant { w: f.add(rng, ty, r, n, 1.0)?, rows: r }
        }
    };
    let residual = match &op {
        Op::Quant { rows, .. } if i % 2 == 1 || (low && i % 8 == 6) => Some(rng.vec(*rows, 4.0)),
        _ => None,
    };
    Ok(Case { n, x, add, norm_w, op, residual })
}

/// Case `i` of `norm_mv_low`: its op over the mv_dot_low.h types (see the module header).
fn low_op(i: usize, n: usize, rng: &mut Rng, f: &mut Files) -> Result<Op, String> {
    const MAIN: [GgmlType; 3] = [GgmlType::Q3_K, GgmlType::IQ4_XS, GgmlType::Q2_K];
    const LAST: [GgmlType; 4] = [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q3_K];
    let main = MAIN[(i / 4) % 3];
    // Every other case of the first two ops more rows than one wave of norm blocks: a walk.
    let big = (i / 4) % 2 == 0;
    Ok(match i % 4 {
        0 => {
            let m = rng.range(1, 3);
            let mut ws = Vec::new();
            for j in 0..m {
                let r = if big { rng.range(1_000, 3_000) } else { rng.range(1, 300) };
                let ty = if j + 1 == m && m > 1 && rng.range(0, 1) == 0 { LAST[rng.range(0, 3)] } else { main };
                ws.push((f.add(rng, ty, r, n, 1.0)?, r));
            }
            Op::Multi(ws)
        }
        1 => {
            let r = if big { rng.range(4_300, 6_000) } else { rng.range(1, 300) };
            let act = if i % 8 == 1 { Glu::Silu } else { Glu::GeluTanh };
            Op::Glu { gate: f.add(rng, main, r, n, 1.0)?, up: f.add(rng, main, r, n, 1.0)?, rows: r, act }
        }
        2 => {
            let ty = [GgmlType::Q3_K, GgmlType::IQ4_XS, GgmlType::Q2_K, GgmlType::IQ4_NL][(i / 4) % 4];
            let r = if rng.range(0, 1) == 0 { rng.range(1, 300) } else { rng.range(2_000, 4_096) };
            Op::Quant { w: f.add(rng, ty, r, n, 1.0)?, rows: r }
        }
        _ => {
            let mut ws = Vec::new();
            for _ in 0..rng.range(1, 3) {
                let r = rng.range(1, 300);
                ws.push((f.add(rng, GgmlType::IQ4_NL, r, n, 1.0)?, r));
            }
            Op::Multi(ws)
        }
    })
}

/// `files` lives as long as the backends: a weight file dropped while the GPU backend
/// lives could have its bytes' address reused by a later file, whose weight the cache
/// would then take for the old one.
fn check(gpu: &mut GpuBackend, cpu: &mut CpuBackend, files: &mut Files, name: &str, cases: usize, rng: &mut Rng) -> (CheckReport, CheckReport) {
    let mut acc = Acc::new(name);
    let mut bits = Acc::new(&format!("{name}_bits"));
    // The walk's weights are large (up to 7,000 rows of 4096 per weight): 8 cases cover
    // its row lengths and both ops.
    let n_cases = match name {
        "norm_mv_walk" => 8,
        "norm_mv_low" => cases.clamp(8, 24),
        _ => cases.max(8),
    };
    for i in 0..n_cases {
        let c = match make_case(name, i, rng, files) {
            Ok(c) => c,
            Err(e) => {
                acc.fail(format!("case {i}: {e}"));
                break;
            }
        };
        gpu.set_fuse_mv(true);
        let (before, head_before, walk_before, half_before) = (gpu.fused_mv_launches(), gpu.head_launches(), gpu.walk_launches(), gpu.half_launches());
        let fused = run_case(gpu, files, &c);
        let (taken, head, walk) = (gpu.fused_mv_launches() - before, gpu.head_launches() - head_before, gpu.walk_launches() - walk_before);
        let half = gpu.half_launches() - half_before;
        gpu.set_fuse_mv(false);
        let plain = run_case(gpu, files, &c);
        gpu.set_fuse_mv(true);
        let plain_half = gpu.half_launches() - half_before - half;
        // The half-warp check's cases are all the half-warp kernels' (while they are on).
        if plain_half != 0 || (name == "norm_mv_half" && half != taken) {
            acc.fail(format!("case {i} (n={} {:?}): {half} half-warp launches of {taken} fused with the fusion on, {plain_half} with it off", c.n, c.op));
        }
        let plain_launches = gpu.fused_mv_launches() - before - taken;
        let plain_head = gpu.head_launches() - head_before - head;
        let plain_walk = gpu.walk_launches() - walk_before - walk;
        // The head check's weights never fit one wave: each case is one head launch.
        let want_head = (name == "norm_mv_head") as u64;
        if head != want_head || plain_head != 0 {
            acc.fail(format!("case {i} (n={} {:?}): {head} head launches with the fusion on, {plain_head} with it off (expected {want_head} and 0)", c.n, c.op));
        }
        let want = run_case(cpu, files, &c);
        match (fused, plain, want) {
            (Ok(a), Ok(b), Ok(w)) => {
                // One fused launch, unless the launch would not fit in one wave of blocks
                // on this device (then the backend takes the unfused ops by design).
                let (kernel, rows) = match &c.op {
                    Op::Multi(ws) => (decode_mv::norm_kernel(c.n, false), ws.iter().map(|w| w.1).sum()),
                    Op::Glu { rows, .. } => (decode_mv::norm_kernel(c.n, true), *rows),
                    Op::Quant { rows, .. } => ("decode_mv_quant", *rows),
                };
                let tys: Vec<GgmlType> = match &c.op {
                    Op::Multi(ws) => ws.iter().map(|w| files.get(w.0).ty()).collect(),
                    Op::Glu { gate, up, .. } => vec![files.get(*gate).ty(), files.get(*up).ty()],
                    Op::Quant { .. } => Vec::new(),
                };
                // The backend's own rule (with the driver's occupancy figure); the one-wave
                // norm kernels take no Q3_K (`decode_mv::norm_supports`).
                let expect = (gpu.mv_fits(kernel, rows) && tys.iter().all(|&t| decode_mv::norm_supports(t, c.n))) as u64;
                if taken != expect || plain_launches != 0 {
                    acc.fail(format!("case {i} (n={} {:?}): {taken} fused launches with the fusion on, {plain_launches} with it off (expected {expect} and 0)", c.n, c.op));
                }
                // Where the one-wave kernel does not take them, the row walk does (Q4_K, the
                // last Q6_K; Q2_K / Q3_K / IQ4_XS, the last another K-quant).
                let want_walk = (expect == 0 && decode_mv::walk_supports(c.n, &tys)) as u64;
                if walk != want_walk || plain_walk != 0 {
                    acc.fail(format!("case {i} (n={} {:?}): {walk} row-walk launches with the fusion on, {plain_walk} with it off (expected {want_walk} and 0)", c.n, c.op));
                }
                compare(&mut acc, &mut bits, files, &c, &a, &b, &w);
            }
            (a, b, w) => {
                let e = [a.err(), b.err(), w.err()].into_iter().flatten().map(|e| e.to_string()).collect::<Vec<_>>().join("; ");
                acc.fail(format!("case {i} (n={} {:?}): {e}", c.n, c.op));
            }
        }
    }
    (acc.finish(), bits.finish())
}

/// Every `norm_mv_*` check whose name contains `filter` (`cases` random cases each, at
/// least 8 so every row length of the list runs).
pub fn run(dev: &GpuDevice, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let names = ["norm_mv_multi", "norm_mv_glu", "norm_mv_quant", "norm_mv_head", "norm_mv_half", "norm_mv_walk", "norm_mv_low"];
    let chosen: Vec<&str> = names.iter().copied().filter(|n| filter.map(|f| n.contains(f) || format!("{n}_bits").contains(f)).unwrap_or(true)).collect();
    if chosen.is_empty() || cases == 0 {
        return Vec::new();
    }
    let mut gpu = GpuBackend::new(dev.clone());
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => {
            return chosen
                .iter()
                .map(|n| CheckReport { name: n.to_string(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) })
                .collect()
        }
    };
    let mut out = Vec::new();
    let mut files = Files::default();
    for (idx, name) in chosen.into_iter().enumerate() {
        let mut rng = Rng::new(seed ^ ((idx as u64 + 1) * 0x006e_6f72_6d5f_6d76));
        let (a, b) = check(&mut gpu, &mut cpu, &mut files, name, cases, &mut rng);
        out.push(a);
        out.push(b);
    }
    out
}
