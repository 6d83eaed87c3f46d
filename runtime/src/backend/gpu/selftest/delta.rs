//! `gated_delta_net_*`, `split_halves_*` and `mul_sigmoid_*` checks: qwen35's ops on the
//! GPU (`family/delta.rs`'s kernels, the states in device memory) against the CPU
//! backend's direct ops.
//!
//! Each delta net case runs two consecutive chunks from a random (non-zero) state, the
//! output poisoned with NaN before each; checked within a tolerance (the device's fast
//! exponentials and its sums' order): each chunk's output and, after each, the conv and
//! delta-rule states read back. A state not written back, read at the wrong size, carried
//! wrongly from one chunk to the next or a row mapped to the wrong sequence fails. `_rows`
//! cases give every row its own sequence (a batched decode step). Shapes: the tiny synth
//! preset's heads, Qwen3.5-27B's (48 value heads over 16 key heads of 128) and
//! Qwen3.5-35B-A3B's (32 over 16), 1 to 2048 tokens per chunk (odd lengths among them).
//! qwen3next's grouped value heads: its tiny preset's and Qwen3-Next-80B-A3B's (32 over 16).
//! `split_halves` and `mul_sigmoid` are exact moves and one sigmoid, and `copy_strided`
//! (qwen3next's unpacking of `ssm_in`) an exact move: within 1e-6.

use super::report::{Acc, CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::recurrent::gated_delta_net_host;
use crate::backend::{Backend, Buf, DeltaDims, DeltaIn, DeltaNet, DeltaState, Strided};
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::GgmlType;
use crate::weights::{WeightId, WeightRef};

#[derive(Clone, Copy, Debug)]
struct Case {
    d: DeltaDims,
    n_tok: usize,
    /// One sequence per row instead of one for the chunk.
    rows: bool,
}

fn cases() -> Vec<Case> {
    let d = |n_k_heads, n_v_heads, hd| DeltaDims { d_conv: 4, n_k_heads, n_v_heads, head_k_dim: hd, head_v_dim: hd, grouped: false };
    // qwen3next's value heads grouped by key head (head h reads key head h / (n_v/n_k)).
    let g = |n_k_heads, n_v_heads, hd| DeltaDims { grouped: true, ..d(n_k_heads, n_v_heads, hd) };
    let c = |d, n_tok, rows| Case { d, n_tok, rows };
    let mut v = vec![c(d(2, 4, 64), 1, false), c(d(2, 4, 64), 37, false), c(d(2, 4, 64), 5, true), c(d(16, 48, 128), 3, true), c(d(16, 32, 128), 8, true)];
    v.extend([1, 2, 7, 64, 129, 511, 2048].map(|n| c(d(16, 48, 128), n, false)));
    v.extend([1, 255].map(|n| c(d(16, 32, 128), n, false)));
    // Qwen3-Next-80B-A3B's (32 value heads over 16 key heads of 128, grouped) and the tiny
    // qwen3next preset's.
    v.extend([c(g(2, 4, 64), 37, false), c(g(2, 4, 64), 5, true), c(g(16, 32, 128), 6, true)]);
    v.extend([1, 129, 2048].map(|n| c(g(16, 32, 128), n, false)));
    v
}

fn name(c: &Case) -> String {
    let g = if c.d.grouped { "_grouped" } else { "" };
    format!("gated_delta_net_v{}k{}_d{}{g}_t{}{}", c.d.n_v_heads, c.d.n_k_heads, c.d.head_k_dim, c.n_tok, if c.rows { "_rows" } else { "" })
}

/// The case's four vectors as one file (`ssm_a` negative, as the converter writes it).
fn weights(rng: &mut Rng, d: &DeltaDims) -> Result<GgufFile, String> {
    let mut w = GgufWriter::new();
    let mut add = |name: &str, dims: &[u64], v: Vec<f32>| {
        w.add_tensor(name, GgmlType::F32, dims, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    };
    add("conv", &[d.d_conv as u64, d.channels() as u64], rng.vec(d.d_conv * d.channels(), 0.5));
    add("dt_bias", &[d.n_v_heads as u64], rng.vec(d.n_v_heads, 1.0));
    add("a", &[d.n_v_heads as u64], rng.vec(d.n_v_heads, 1.0).iter().map(|x| -0.2 - x.abs()).collect());
    add("norm", &[d.head_v_dim as u64], rng.vec(d.head_v_dim, 0.2).iter().map(|x| 1.0 + x).collect());
    GgufFile::from_bytes(w.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

fn case_weights(f: &GgufFile, idx: usize) -> Result<[WeightRef<'_>; 4], String> {
    let mut v = Vec::new();
    for (i, n) in ["conv", "dt_bias", "a", "norm"].into_iter().enumerate() {
        v.push(WeightRef::new(WeightId(4 * idx as u32 + i as u32), f.tensor(n).ok_or("no tensor")?));
    }
    v.try_into().map_err(|_| "four weights".to_string())
}

/// The operands of two chunks and the initial states.
struct Data {
    chunks: [[Vec<f32>; 4]; 2],
    conv: Vec<Vec<f32>>,
    ssm: Vec<Vec<f32>>,
}

fn data(rng: &mut Rng, c: &Case) -> Data {
    let (d, n) = (&c.d, c.n_tok);
    let mut chunk = || [rng.vec(n * d.channels(), 1.0), rng.vec(n * d.value_dim(), 1.0), rng.vec(n * d.n_v_heads, 1.0), rng.vec(n * d.n_v_heads, 1.0)];
    let chunks = [chunk(), chunk()];
    let n_st = if c.rows { n } else { 1 };
    let conv = (0..n_st).map(|_| rng.vec(d.conv_state_len(), 1.0)).collect();
    let ssm = (0..n_st).map(|_| rng.vec(d.ssm_state_len(), 0.1)).collect();
    Data { chunks, conv, ssm }
}

/// Both chunks on `be` (the trait's op, or the default itself with `host`): per chunk
/// the output, then every state read back.
fn run<B: Backend + ?Sized>(be: &mut B, host: bool, c: &Case, x: &Data, ws: [WeightRef; 4]) -> crate::backend::Result<Vec<Vec<f32>>> {
    let (d, n) = (c.d, c.n_tok);
    let mut bufs: Vec<Buf> = Vec::new();
    let r = (|| {
        let mut alloc = |be: &mut B, v: &[f32]| -> crate::backend::Result<Buf> {
            let b = be.alloc(v.len())?;
            bufs.push(b);
            be.write(b, v)?;
            Ok(b)
        };
        let mut states = Vec::new();
        for (cv, sv) in x.conv.iter().zip(&x.ssm) {
            states.push(DeltaState { conv: alloc(be, cv)?, ssm: alloc(be, sv)? });
        }
        let ins: Vec<Buf> = x.chunks[0].iter().map(|v| alloc(be, v)).collect::<crate::backend::Result<_>>()?;
        let out = alloc(be, &vec![f32::NAN; n * d.value_dim()])?;
        let p = DeltaNet { conv: &ws[0], dt_bias: &ws[1], a: &ws[2], norm: &ws[3], dims: d, eps: 1e-6 };
        let io = DeltaIn { qkv: ins[0], z: ins[1], beta: ins[2], alpha: ins[3] };
        let mut got = Vec::new();
        for ch in &x.chunks {
            for (b, v) in ins.iter().zip(ch) {
                be.write(*b, v)?;
            }
            be.write(out, &vec![f32::NAN; n * d.value_dim()])?;
            if host {
                gated_delta_net_host(be, &p, &io, n, &states, out)?;
            } else {
                be.gated_delta_net(&p, &io, n, &states, out)?;
            }
            let mut o = vec![0f32; n * d.value_dim()];
            be.read(out, &mut o)?;
            got.push(o);
            for st in &states {
                let (mut cv, mut sv) = (vec![0f32; d.conv_state_len()], vec![0f32; d.ssm_state_len()]);
                be.read(st.conv, &mut cv)?;
                be.read(st.ssm, &mut sv)?;
                got.extend([cv, sv]);
            }
        }
        Ok(got)
    })();
    for b in bufs {
        be.free(b)?;
    }
    r
}

/// Case `c` on `under` (its op, or the default with `host`) against the CPU's direct op.
fn check_case<G: Backend + ?Sized>(under: &mut G, host: bool, cpu: &mut CpuBackend, rng: &mut Rng, c: &Case, idx: usize, files: &mut Vec<GgufFile>, acc: &mut Acc) -> Result<(), String> {
    files.push(weights(rng, &c.d)?);
    let f: &GgufFile = files.last().ok_or("no file")?;
    let x = data(rng, c);
    let got = run(under, host, c, &x, case_weights(f, idx)?).map_err(|e| format!("under test: {e}"))?;
    let want = run(cpu, false, c, &x, case_weights(f, idx)?).map_err(|e| format!("cpu: {e}"))?;
    let per = 1 + 2 * x.conv.len();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let what = match i % per {
            0 => "output".to_string(),
            j => format!("{} state {}", if j % 2 == 1 { "conv" } else { "delta" }, (j - 1) / 2),
        };
        let case = format!("{} chunk {} {what}", name(c), i / per);
        if host {
            acc.cmp_bits(&case, g, w);
        } else {
            let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
            acc.cmp(&case, g, &w64, |j| 2e-3 * (1.0 + w64[j].abs()));
        }
    }
    Ok(())
}

/// `split_halves` and `mul_sigmoid` on `under` against the CPU, bit for bit.
fn check_small<G: Backend>(under: &mut G, host: bool, cpu: &mut CpuBackend, rng: &mut Rng, acc: &mut Acc) -> crate::backend::Result<()> {
    let (rows, half) = (3 * 24, 256);
    let src = rng.vec(rows * 2 * half, 2.0);
    let x = rng.vec(rows * half, 1.0);
    let fill = rng.vec(rows * 256 + 60, 1.0);
    let run = |be: &mut dyn Backend| -> crate::backend::Result<Vec<f32>> {
        let (s, a, b, xb) = (be.alloc(src.len())?, be.alloc(rows * half)?, be.alloc(rows * half)?, be.alloc(rows * half)?);
        be.write(s, &src)?;
        be.write(a, &vec![f32::NAN; rows * half])?;
        be.write(b, &vec![f32::NAN; rows * half])?;
        be.write(xb, &x)?;
        be.split_halves(s, rows, half, a, b)?;
        be.mul_sigmoid(xb, b, rows, half, false)?;
        // One gate per row (the first `rows` values of `a`) over the gated rows.
        be.mul_sigmoid(xb, a, rows, half, true)?;
        // qwen3next's unpacking: per row of `src` (as 4 groups of 128), the 40 values at 16
        // of each group into a destination row of 256 from 60 (groups 40 apart); the rest
        // of the destination stays as written.
        let cs = Strided { n: [rows, 4, 40], src_off: 16, src_stride: [2 * half, 128], dst_off: 60, dst_stride: [256, 40] };
        let cd = be.alloc(rows * 256 + 60)?;
        be.write(cd, &fill)?;
        be.copy_strided(s, cd, &cs)?;
        let mut out = vec![0f32; 4 * rows * half + 60];
        be.read(a, &mut out[..rows * half])?;
        be.read(b, &mut out[rows * half..2 * rows * half])?;
        be.read(xb, &mut out[2 * rows * half..3 * rows * half])?;
        be.read(cd, &mut out[3 * rows * half..])?;
        for h in [s, a, b, xb, cd] {
            be.free(h)?;
        }
        Ok(out)
    };
    let (g, w) = (run(under)?, run(cpu)?);
    if host {
        acc.cmp_bits("split_halves + mul_sigmoid + copy_strided", &g, &w);
    } else {
        let w64: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        acc.cmp("split_halves + mul_sigmoid + copy_strided", &g, &w64, |j| 1e-6 * (1.0 + w64[j].abs()));
    }
    Ok(())
}

/// Every check whose name contains `filter`, on the GPU backend.
pub fn run_checks(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let named: Vec<(usize, Case)> = cases().into_iter().enumerate().filter(|(_, c)| filter.map(|f| name(c).contains(f)).unwrap_or(true)).collect();
    let small = filter.map(|f| "split_halves_mul_sigmoid".contains(f)).unwrap_or(true);
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => return vec![CheckReport { name: "gated_delta_net".into(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }],
    };
    let mut gpu = GpuBackend::new(dev.clone());
    let mut rng = Rng::new(seed ^ 0xde17_a0e7);
    let mut files = Vec::new();
    let mut reports = Vec::new();
    for (idx, c) in named {
        let mut acc = Acc::new(&name(&c));
        if let Err(e) = check_case(&mut gpu, false, &mut cpu, &mut rng, &c, idx, &mut files, &mut acc) {
            acc.fail(e);
        }
        reports.push(acc.finish());
    }
    if small {
        let mut acc = Acc::new("split_halves_mul_sigmoid");
        if let Err(e) = check_small(&mut gpu, false, &mut cpu, &mut rng, &mut acc) {
            acc.fail(e.to_string());
        }
        reports.push(acc.finish());
    }
    drop(gpu);
    drop(files);
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check's body on the host: the trait's defaults (read back, host, write) on one
    /// CPU backend equal the other's direct ops bit for bit, and a state mix-up fails.
    #[test]
    fn defaults_equal_the_direct_ops_and_a_wrong_state_fails() {
        let (mut a, mut cpu) = (CpuBackend::new(2).unwrap(), CpuBackend::new(2).unwrap());
        let mut rng = Rng::new(11);
        let mut files = Vec::new();
        for (idx, c) in cases().into_iter().enumerate().filter(|(_, c)| c.d.n_v_heads == 4) {
            let mut acc = Acc::new(&name(&c));
            check_case(&mut a, true, &mut cpu, &mut rng, &c, idx, &mut files, &mut acc).unwrap();
            let r = acc.finish();
            assert!(r.passed(), "{}", r.line());
        }
        let mut acc = Acc::new("small");
        check_small(&mut a, true, &mut cpu, &mut rng, &mut acc).unwrap();
        assert!(acc.finish().passed());
        // Per-row states handed over as one sequence's: the outputs differ.
        let c = cases()[2];
        files.push(weights(&mut rng, &c.d).unwrap());
        let f = files.last().unwrap();
        let x = data(&mut rng, &c);
        let one = Data { chunks: x.chunks.clone(), conv: x.conv[..1].to_vec(), ssm: x.ssm[..1].to_vec() };
        let got = run(&mut a, true, &Case { rows: false, ..c }, &one, case_weights(f, 50).unwrap()).unwrap();
        let want = run(&mut cpu, false, &c, &x, case_weights(f, 50).unwrap()).unwrap();
        assert_ne!(got[0], want[0]);
    }
}
