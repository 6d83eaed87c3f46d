//! `swa_*` checks: window-sized KV caches (`SwaKv`, sliding-window layers) on the GPU
//! through the trait, against the CPU backend (whose window-sized cache attends bit for
//! bit as its full-context one: `cpu/attention.rs`'s tests). Per case, a prompt in
//! chunks then decode steps, each through `rope_kv_attention` (the K/V store, then flash
//! attention or the quantized-cache kernel for a chunk, the fused decode attention for a
//! step), past several moves of the cache's base: every output, NaN before the op, is
//! within 3e-2·max|CPU row| + 1e-4 of the CPU's. A row read from a dropped or misplaced
//! slot is off by the size of the row; a copy that overlapped would garble the kept rows.

use super::report::{Acc, CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::{Attention, Backend, KvCache, KvSpec, KvType, KvTypes, QkvPrep, Rope, RopeMode, SwaKv};

#[derive(Clone, Debug)]
struct Case {
    hd: usize,
    n_head: usize,
    n_kv: usize,
    ty: KvTypes,
    window: usize,
    chunk: usize,
    /// Prompt chunks (each at most `chunk`), then this many decode steps.
    prompt: Vec<usize>,
    steps: usize,
}

fn cases() -> Vec<Case> {
    use KvType::{Q4_0, Q8_0, F16};
    let t = |k, v| KvTypes { k, v };
    vec![
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(F16, F16), window: 100, chunk: 32, prompt: vec![32, 32, 7, 32, 32, 32, 32, 20], steps: 180 },
        Case { hd: 64, n_head: 8, n_kv: 8, ty: t(F16, F16), window: 200, chunk: 64, prompt: vec![64; 8], steps: 150 },
        Case { hd: 256, n_head: 4, n_kv: 1, ty: t(F16, F16), window: 512, chunk: 128, prompt: vec![128; 10], steps: 130 },
        Case { hd: 128, n_head: 16, n_kv: 8, ty: t(Q8_0, Q8_0), window: 100, chunk: 32, prompt: vec![32, 5, 32, 32, 32, 32, 32], steps: 200 },
        Case { hd: 256, n_head: 4, n_kv: 1, ty: t(Q8_0, Q4_0), window: 100, chunk: 16, prompt: vec![16; 14], steps: 140 },
    ]
}

fn name(c: &Case) -> String {
    format!("swa_d{}_g{}_{}_{}_w{}_c{}", c.hd, c.n_head / c.n_kv, c.ty.k, c.ty.v, c.window, c.chunk)
}

/// One chunk at `pos` through `rope_kv_attention` on `be`; returns the output.
fn chunk_on<B: Backend + ?Sized>(be: &mut B, kv: KvCache, c: &Case, qkv: [&[f32]; 3], pos: &[u32]) -> crate::backend::Result<Vec<f32>> {
    let attn = Attention { n_head: c.n_head, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, scale: 1.0 / (c.hd as f32).sqrt(), window: Some(c.window), sinks: None };
    let rope = Rope { mode: RopeMode::Neox, n_rot: c.hd, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None, yarn: None };
    let prep = QkvPrep { n_head: c.n_head, n_kv_head: c.n_kv, head_dim: c.hd, q_norm: None, k_norm: None, eps: 1e-6, rope, q_scale: None };
    let n_out = pos.len() * c.n_head * c.hd;
    let mut bufs = Vec::new();
    for x in qkv.into_iter().chain([&vec![f32::NAN; n_out][..]]) {
        let b = be.alloc(x.len())?;
        be.write(b, x)?;
        bufs.push(b);
    }
    let r = be.rope_kv_attention(bufs[0], bufs[1], bufs[2], kv, 0, pos, &prep, &attn, bufs[3]);
    let mut out = vec![0f32; n_out];
    let r = r.and_then(|_| be.read(bufs[3], &mut out));
    for b in bufs {
        be.free(b)?;
    }
    r.map(|_| out)
}

fn check_case(gpu: &mut GpuBackend, cpu: &mut CpuBackend, rng: &mut Rng, c: &Case, acc: &mut Acc) -> Result<(), String> {
    let n_ctx = 2048;
    let ring = SwaKv::new(c.window, c.chunk, n_ctx, &[true]).ok_or("no window-sized cache for this case")?;
    let spec = KvSpec { n_layer: 1, n_ctx, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, ty: c.ty, swa: Some(ring), alt: None };
    let gkv = gpu.alloc_kv(&spec).map_err(|e| format!("gpu: {e}"))?;
    let ckv = cpu.alloc_kv(&spec).map_err(|e| format!("cpu: {e}"))?;
    let mut p0 = 0usize;
    let mut result = Ok(());
    for n in c.prompt.iter().copied().chain(std::iter::repeat_n(1, c.steps)) {
        let pos: Vec<u32> = (p0..p0 + n).map(|p| p as u32).collect();
        let q = rng.vec(n * c.n_head * c.hd, 2.0);
        let (k, v) = (rng.vec(n * c.n_kv * c.hd, 1.5), rng.vec(n * c.n_kv * c.hd, 1.0));
        let want = chunk_on(cpu, ckv, c, [&q, &k, &v], &pos).map_err(|e| format!("cpu at {p0}: {e}"));
        let got = chunk_on(gpu, gkv, c, [&q, &k, &v], &pos).map_err(|e| format!("gpu at {p0}: {e}"));
        let (want, got) = match (want, got) {
            (Ok(w), Ok(g)) => (w, g),
            (Err(e), _) | (_, Err(e)) => {
                result = Err(e);
                break;
            }
        };
        let hd = c.hd;
        let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
        acc.cmp(&format!("positions {p0}..{}", p0 + n), &got, &want64, |i| {
            let r = &want[i / hd * hd..][..hd];
            3e-2 * r.iter().fold(0f32, |m, x| m.max(x.abs())) as f64 + 1e-4
        });
        p0 += n;
    }
    gpu.free_kv(gkv).map_err(|e| e.to_string())?;
    cpu.free_kv(ckv).map_err(|e| e.to_string())?;
    if p0 < 2 * ring.slots && result.is_ok() {
        return Err(format!("the case ends at {p0}, before the base moved twice ({} slots)", ring.slots));
    }
    result
}

pub fn run(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let named: Vec<(String, Case)> = cases().into_iter().map(|c| (name(&c), c)).filter(|(n, _)| filter.map(|f| n.contains(f)).unwrap_or(true)).collect();
    if named.is_empty() {
        return Vec::new();
    }
    let mut gpu = GpuBackend::new(dev.clone());
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => return named.into_iter().map(|(n, _)| CheckReport { name: n, cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }).collect(),
    };
    let mut rng = Rng::new(seed ^ 0x5377_6100);
    named
        .into_iter()
        .map(|(n, c)| {
            let mut acc = Acc::new(&n);
            if let Err(e) = check_case(&mut gpu, &mut cpu, &mut rng, &c, &mut acc) {
                acc.fail(e);
            }
            acc.finish()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case runs past two moves of the base (else it would not test them), and its
    /// CPU half completes.
    #[test]
    fn cases_move_the_base_and_run_on_the_cpu() {
        let mut cpu = CpuBackend::new(2).unwrap();
        let mut rng = Rng::new(3);
        for c in cases() {
            let ring = SwaKv::new(c.window, c.chunk, 2048, &[true]).unwrap();
            let total: usize = c.prompt.iter().sum::<usize>() + c.steps;
            assert!(total >= 2 * ring.slots && c.prompt.iter().all(|&n| n <= c.chunk), "{}: {total} positions, {} slots", name(&c), ring.slots);
            let spec = KvSpec { n_layer: 1, n_ctx: 2048, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, ty: c.ty, swa: Some(ring), alt: None };
            let kv = cpu.alloc_kv(&spec).unwrap();
            let mut p0 = 0;
            for n in c.prompt.iter().copied().chain(std::iter::repeat_n(1, c.steps)) {
                let pos: Vec<u32> = (p0..p0 + n as u32).collect();
                let (q, k, v) = (rng.vec(n * c.n_head * c.hd, 2.0), rng.vec(n * c.n_kv * c.hd, 1.5), rng.vec(n * c.n_kv * c.hd, 1.0));
                let out = chunk_on(&mut cpu, kv, &c, [&q, &k, &v], &pos).unwrap();
                assert!(out.iter().all(|x| x.is_finite()), "{}", name(&c));
                p0 += n as u32;
            }
            cpu.free_kv(kv).unwrap();
        }
    }
}
