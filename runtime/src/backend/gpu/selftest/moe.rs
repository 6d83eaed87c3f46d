//! `moe_ffn_*` checks: [`Backend::moe_ffn`] on the GPU (the device path: top-k on the
//! device, expert-indexed matvecs per pair or grouped by expert, `backend/moe.rs`)
//! against the CPU backend's direct op on the same weights and input.
//!
//! Each case: an F32 router, gate/up experts of one type and a down of another, random
//! input rows (or one row repeated, so that the selected experts receive every token and
//! the others none), the output and every working buffer NaN before the op. Checked:
//! - every output within 3e-2·max|CPU row| + 1e-5 of the CPU's, for each token whose
//!   top-k is not a near tie on the CPU (k-th and (k+1)-th probabilities ≥ 2e-3 apart;
//!   the GPU's router logits round differently). A wrong expert, a dropped
//!   renormalisation or a missing slot is off by the size of the row;
//! - on a device with a weight cache: the op made one resident entry per tensor (4 per
//!   case, never one per expert) and no duplicate;
//! - `moe_ffn_*_exact`: the exact backend (router on the host, experts by the exact ops)
//!   gives the CPU's outputs bit for bit (3 resident entries: the router stays on the host).
//!
//! Shapes: 8 experts (2 used) to 128 (8 used), 1 to 2048 tokens, n_embd 256 to 1024;
//! gate/up Q4_K, Q8_0, MXFP4, IQ4_XS or IQ3_S, down Q4_K, Q6_K, Q8_0 or MXFP4. Every plan
//! is reached: pairs (decode), grouped matvecs, the grouped GEMM.
//!
//! `moe_ffn_oss_*`: gpt-oss's layer (router bias, softmax over the top-k logits, gate/up/
//! down expert biases, `swiglu_oai`; biases large enough that the clamp at 7 is reached)
//! with MXFP4 experts of rows of 576 (18 blocks, not a multiple of 256), 32 experts of 4,
//! 1 to 2048 tokens over every plan; near ties judged on the biased logits (k-th and
//! (k+1)-th 2e-3 apart). 8 resident entries (the 4 tensors and 4 F32 biases, read in
//! place); the exact backend runs the CPU's arithmetic on the host rows (none).

use super::report::{Acc, CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::{ExactBackend, GpuBackend};
use crate::backend::moe::{moe_ffn_unfused, route};
use crate::backend::moe::{Gating, MoeBiases};
use crate::backend::{Backend, Glu, MoeFfn, MoeScratch};
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::{self, GgmlType};
use crate::weights::{WeightId, WeightRef};

#[derive(Clone, Copy, Debug)]
struct Case {
    e: usize,
    f: usize,
    n_exp: usize,
    k: usize,
    n_tok: usize,
    down: GgmlType,
    /// The gate and up experts' type.
    gu: GgmlType,
    /// Every token the same row (the selected experts get all tokens, the rest none).
    same_rows: bool,
    /// gpt-oss's layer: biases, softmax-weight gating, `swiglu_oai`.
    oss: bool,
}

fn cases() -> Vec<Case> {
    let c = |e, f, n_exp, k, n_tok, down, same_rows| Case { e, f, n_exp, k, n_tok, down, gu: GgmlType::Q4_K, same_rows, oss: false };
    let g = |gu, down, n_tok| Case { e: 512, f: 256, n_exp: 16, k: 4, n_tok, down, gu, same_rows: false, oss: false };
    let o = |n_tok, down, same_rows| Case { e: 576, f: 320, n_exp: 32, k: 4, n_tok, down, gu: GgmlType::MXFP4, same_rows, oss: true };
    use GgmlType::{IQ3_S, IQ4_XS, MXFP4, Q4_K, Q6_K, Q8_0};
    vec![
        c(256, 256, 8, 2, 1, Q6_K, false),
        c(256, 512, 8, 2, 64, Q4_K, false),
        c(512, 256, 16, 4, 7, Q6_K, false),
        c(256, 256, 8, 2, 33, Q4_K, true),
        c(1024, 256, 64, 8, 1, Q6_K, false),
        c(1024, 256, 64, 8, 100, Q4_K, false),
        // The device path's shapes: decode pairs (1-3 tokens), grouped tiles up to 2048
        // tokens, qwen3moe's 128 experts of 8, every token to the same experts.
        c(512, 256, 128, 8, 2, Q6_K, false),
        c(512, 256, 128, 8, 512, Q6_K, false),
        c(256, 256, 32, 4, 2048, Q4_K, false),
        c(256, 256, 128, 8, 300, Q4_K, true),
        // Other expert types: 32-element blocks (the q8_1 form) beside K-form downs.
        g(Q8_0, Q6_K, 3),
        g(Q8_0, Q4_K, 40),
        g(MXFP4, MXFP4, 1),
        g(MXFP4, MXFP4, 64),
        g(IQ4_XS, Q8_0, 24),
        // Grid-type experts have no GEMM: grouped matvecs at prefill sizes.
        g(IQ3_S, Q6_K, 200),
        // gpt-oss: decode pairs (1, 3), grouped matvecs (7, 24), the grouped GEMM (64,
        // 2048), every token to the same 4 experts (the other 28 get none), a Q8_0 down.
        o(1, MXFP4, false),
        o(3, MXFP4, false),
        o(7, MXFP4, false),
        o(24, MXFP4, false),
        o(64, MXFP4, false),
        o(2048, MXFP4, false),
        o(5, MXFP4, true),
        o(300, MXFP4, true),
        o(40, Q8_0, false),
    ]
}

fn name(c: &Case) -> String {
    let ty = |t: GgmlType| t.to_string().to_lowercase();
    let oss = if c.oss { "oss_" } else { "" };
    format!("moe_ffn_{oss}e{}_x{}k{}_t{}_{}_{}{}", c.e, c.n_exp, c.k, c.n_tok, ty(c.gu), ty(c.down), if c.same_rows { "_same" } else { "" })
}

/// The case's weights as one file: `router` F32 [e, n_exp], `gate`/`up` Q4_K
/// [e, f, n_exp], `down` [f, e, n_exp]; gpt-oss's F32 biases `router_b` [n_exp],
/// `gate_b`/`up_b` [f, n_exp], `down_b` [e, n_exp].
fn weights(rng: &mut Rng, c: &Case) -> Result<GgufFile, String> {
    let mut w = GgufWriter::new();
    let mut add = |w: &mut GgufWriter, name: &str, ty: GgmlType, dims: &[u64], scale: f32| -> Result<(), String> {
        let n: u64 = dims.iter().product();
        let v = rng.vec(n as usize, scale);
        let mut b = vec![0u8; ty.bytes_for(n).ok_or("partial block")? as usize];
        quant::quantize(ty, &v, &mut b).map_err(|e| e.to_string())?;
        w.add_tensor(name, ty, dims, b);
        Ok(())
    };
    let (e, f, n) = (c.e as u64, c.f as u64, c.n_exp as u64);
    add(&mut w, "router", GgmlType::F32, &[e, n], 0.2)?;
    add(&mut w, "gate", c.gu, &[e, f, n], 0.5)?;
    add(&mut w, "up", c.gu, &[e, f, n], 0.5)?;
    add(&mut w, "down", c.down, &[f, e, n], 0.5)?;
    if c.oss {
        add(&mut w, "router_b", GgmlType::F32, &[n], 1.0)?;
        add(&mut w, "gate_b", GgmlType::F32, &[f, n], 2.0)?;
        add(&mut w, "up_b", GgmlType::F32, &[f, n], 2.0)?;
        add(&mut w, "down_b", GgmlType::F32, &[e, n], 1.0)?;
    }
    GgufFile::from_bytes(w.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

/// The case file's router, gate, up and down, then (gpt-oss) the router, gate, up and
/// down biases (ids unique to case `idx`; a case without biases repeats the first four).
fn case_weights(f: &GgufFile, idx: usize) -> Result<[WeightRef<'_>; 8], String> {
    let mut v = Vec::new();
    let oss = f.tensor("router_b").is_some();
    for (i, n) in ["router", "gate", "up", "down", "router_b", "gate_b", "up_b", "down_b"].into_iter().enumerate() {
        let n = if oss { n } else { n.trim_end_matches("_b") };
        v.push(WeightRef::new(WeightId(8 * idx as u32 + i as u32), f.tensor(n).ok_or("no tensor")?));
    }
    v.try_into().map_err(|_| "eight weights".to_string())
}

/// The op on `be` (through the trait, or the default itself with `unfused`); the output.
fn run<B: Backend + ?Sized>(be: &mut B, unfused: bool, c: &Case, x: &[f32], ws: [WeightRef; 8], right: bool) -> crate::backend::Result<Vec<f32>> {
    let (n, e) = (c.n_tok, c.e);
    let xb = be.alloc(n * e)?;
    be.write(xb, x)?;
    let out = be.alloc(n * e)?;
    be.write(out, &vec![f32::NAN; n * e])?;
    let tmp = MoeScratch::new(be, n, e, c.n_exp, c.f, c.k)?;
    let lens = MoeScratch::lens(n, e, c.n_exp, c.f, c.k);
    for (b, len) in tmp.bufs().into_iter().zip(lens) {
        be.write(b, &vec![f32::NAN; len])?;
    }
    let biases = MoeBiases { router: &ws[4], gate: &ws[5], up: &ws[6], down: &ws[7] };
    let plain = MoeFfn { router: &ws[0], gate: &ws[1], up: &ws[2], down: &ws[3], n_used: c.k, norm_top_k: right, act: Glu::Silu, gating: Gating::Softmax, biases: None, swiglu_oai: false, router_x: None, expert_scale: None, gate_up_fused: false };
    // gpt-oss's layer, or (`!right`) its plain softmax over every logit instead.
    let oss = MoeFfn { norm_top_k: false, gating: if right { Gating::SoftmaxWeight } else { Gating::Softmax }, biases: Some(biases), swiglu_oai: true, ..plain };
    let p = if c.oss { oss } else { plain };
    let r = if unfused && p.plain() { moe_ffn_unfused(be, xb, n, &p, out, &tmp) } else { be.moe_ffn(xb, n, &p, out, &tmp) };
    let mut y = vec![0f32; n * e];
    let r = r.and_then(|_| be.read(out, &mut y));
    for b in tmp.bufs().into_iter().chain([xb, out]) {
        be.free(b)?;
    }
    r.map(|_| y)
}

/// How the backend under test runs and is judged.
#[derive(Clone, Copy)]
struct Mode {
    /// Call the trait's default itself instead of the backend's `moe_ffn`.
    unfused: bool,
    /// The layer as it is (false only in the test that shows the check failing: no
    /// renormalisation, or gpt-oss's softmax over every logit instead of the top k).
    norm: bool,
    /// Bit-identical to the CPU (exact numerics) instead of within the tolerance.
    bits: bool,
    /// Resident entries the op adds on a device with a weight cache (the exact backend
    /// runs the router on the host: 3), for a layer without biases; gpt-oss's: twice
    /// that on the fast backend (its 4 biases), none on the exact (the CPU's arithmetic).
    entries: u64,
}

/// Case `c` on `under` against the CPU's direct op.
#[allow(clippy::too_many_arguments)]
fn check_case<G: Backend + ?Sized>(under: &mut G, m: Mode, cpu: &mut CpuBackend, rng: &mut Rng, c: &Case, idx: usize, files: &mut Vec<GgufFile>, acc: &mut Acc) -> Result<(), String> {
    files.push(weights(rng, c)?);
    let f: &GgufFile = files.last().ok_or("no file")?;
    let ws = |f| case_weights(f, idx);
    let x: Vec<f32> = if c.same_rows { rng.vec(c.e, 1.0).repeat(c.n_tok) } else { rng.vec(c.n_tok * c.e, 1.0) };
    // Resident entries (copies, or in place in `mapped` residency) and duplicates.
    let copies = |b: &G| b.weight_stats().map(|s| (s.copies + s.mapped, s.duplicates));
    let before = copies(under);
    let got = run(under, m.unfused, c, &x, ws(f)?, m.norm).map_err(|e| format!("under test: {e}"))?;
    let want = run(cpu, false, c, &x, ws(f)?, true).map_err(|e| format!("cpu: {e}"))?;
    let entries = match (c.oss, m.entries) {
        (false, n) => n,
        (true, 4) => 8,
        (true, _) => 0,
    };
    if let (Some(b), Some(a)) = (before, copies(under)) {
        if a.0 - b.0 != entries || a.1 != b.1 {
            acc.fail(format!("{}: {} new resident entries (want {entries}) and {} duplicates", name(c), a.0 - b.0, a.1 - b.1));
            return Ok(());
        }
    }
    if m.bits {
        acc.cmp_bits(&name(c), &got, &want);
        return Ok(());
    }
    // The CPU's routing, to leave out near ties.
    let w8 = ws(f)?;
    let (router, router_b) = (w8[0], w8[4]);
    let mut logits = vec![0f32; c.n_tok * c.n_exp];
    quant::matmul(router.data(), GgmlType::F32, c.n_exp, c.e, &x, c.n_tok, &mut logits).map_err(|e| e.to_string())?;
    let mut probs = Vec::new();
    let mut checked = 0;
    for t in 0..c.n_tok {
        let row = &mut logits[t * c.n_exp..][..c.n_exp];
        if c.oss {
            // The biased logits, largest first.
            let b = router_b.data().chunks_exact(4).map(|v| f32::from_le_bytes([v[0], v[1], v[2], v[3]]));
            row.iter_mut().zip(b).for_each(|(l, b)| *l += b);
            probs = row.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
            probs.sort_by(|a, b| b.1.total_cmp(&a.1));
        } else {
            route(row, c.n_exp, false, &mut probs);
        }
        if c.k < c.n_exp && probs[c.k - 1].1 - probs[c.k].1 < 2e-3 {
            continue;
        }
        checked += 1;
        let (g, w) = (&got[t * c.e..][..c.e], &want[t * c.e..][..c.e]);
        let wmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let wv: Vec<f64> = w.iter().map(|&v| v as f64).collect();
        acc.cmp(&format!("{} token {t}", name(c)), g, &wv, |_| 3e-2 * wmax + 1e-5);
    }
    if checked == 0 {
        acc.fail(format!("{}: every token was a near tie", name(c)));
    }
    Ok(())
}

/// Every `moe_ffn_*` check whose name contains `filter` (one per case), on the GPU backend.
pub fn run_checks(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let named: Vec<(usize, Case)> = cases().into_iter().enumerate().filter(|(_, c)| filter.map(|f| name(c).contains(f)).unwrap_or(true)).collect();
    if named.is_empty() {
        return Vec::new();
    }
    let mut gpu = GpuBackend::new(dev.clone());
    let mut exact = ExactBackend::new(dev.clone());
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => return named.iter().map(|(_, c)| CheckReport { name: name(c), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }).collect(),
    };
    let mut rng = Rng::new(seed ^ 0x3e0e_ff17);
    // The files outlive the backends: their caches know a weight by its bytes' address.
    let mut files = Vec::new();
    let fast = Mode { unfused: false, norm: true, bits: false, entries: 4 };
    let mut reports = Vec::new();
    for (idx, c) in named {
        let mut acc = Acc::new(&name(&c));
        if let Err(e) = check_case(&mut gpu, fast, &mut cpu, &mut rng, &c, idx, &mut files, &mut acc) {
            acc.fail(e);
        }
        reports.push(acc.finish());
        // --numerics exact: the CPU's logits bit for bit.
        let mut acc = Acc::new(&format!("{}_exact", name(&c)));
        if let Err(e) = check_case(&mut exact, Mode { bits: true, entries: 3, ..fast }, &mut cpu, &mut rng, &c, idx + 1000, &mut files, &mut acc) {
            acc.fail(e);
        }
        reports.push(acc.finish());
    }
    drop(exact);
    drop(gpu);
    drop(cpu);
    drop(files);
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check's body on the host: the trait's default on the CPU equals the CPU's
    /// direct op bit for bit on every case, and fails when it drops the renormalisation.
    #[test]
    fn default_op_passes_and_a_dropped_renormalisation_fails() {
        let (mut a, mut cpu) = (CpuBackend::new(2).unwrap(), CpuBackend::new(2).unwrap());
        let mut rng = Rng::new(7);
        let mut files = Vec::new();
        for (idx, c) in cases().into_iter().enumerate() {
            let mut acc = Acc::new(&name(&c));
            let m = Mode { unfused: true, norm: true, bits: true, entries: 0 };
            check_case(&mut a, m, &mut cpu, &mut rng, &c, idx, &mut files, &mut acc).unwrap();
            let r = acc.finish();
            assert!(r.passed(), "{}", r.line());
        }
        // A dropped renormalisation, and gpt-oss's softmax taken over every logit (at the
        // grouped GEMM's size, and decoding).
        let oss: Vec<Case> = cases().into_iter().filter(|c| c.oss && !c.same_rows && (c.n_tok == 64 || c.n_tok == 1)).collect();
        assert_eq!(oss.len(), 2);
        for (i, c) in [cases()[1], oss[0], oss[1]].into_iter().enumerate() {
            let mut acc = Acc::new(&name(&c));
            check_case(&mut a, Mode { unfused: true, norm: false, bits: false, entries: 0 }, &mut cpu, &mut rng, &c, 99 + i, &mut files, &mut acc).unwrap();
            let r = acc.finish();
            assert!(!r.passed(), "{}", r.line());
        }
    }
}
