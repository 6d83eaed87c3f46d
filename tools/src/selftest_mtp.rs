//! `lode selftest --model FILE` on a file with a multi-token-prediction block: the block's
//! drafting logits on the GPU against the CPU backend. A prompt in chunks (the target's
//! hidden state carried across chunk boundaries into the block's catch-up), then a chain
//! of drafting rows (the CPU's argmax each time, so both backends see the same tokens), and
//! again after a verify chunk rewound to the prompt (the kept row's hidden state). The
//! A third case is `lode serve`'s: two sequences decoding in batched steps (the block runs
//! over the step's rows, each into its own cache), then drafting together in batched rows
//! of the block (`BatchEngine::mtp_draft_rows`). The bound is the target's own: a drafting row passes when its largest |Δ| is at most 4 ×
//! that of the target's logits after the same prompt (or 1e-3 of the row's logit range)
//! and the top-1 tokens agree or differ at a near-tie. The block is one more decoder
//! layer fed the target's hidden state, so it should drift no more than the target.

use anyhow::{Context, Result};
use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::gpu::{ExactBackend, GpuBackend, GpuDevice, Numerics};
use lode_runtime::backend::KvType;
use lode_runtime::engine::{argmax_logits, BatchEngine, EngineOptions};
use lode_runtime::model::{Model, OutputRows};
use std::path::Path;

/// `None`: the file has no block (nothing to compare). Else whether the GPU's drafting
/// rows match the CPU's.
pub fn compare(dev: &GpuDevice, path: &Path, threads: usize) -> Result<Option<bool>> {
    let file = crate::common::open_gguf(path)?;
    let mk = |gpu: bool, n_seq: usize| -> Result<BatchEngine> {
        let model = Model::load_with_mtp(file.clone()).with_context(|| format!("cannot load {}", path.display()))?;
        let be: Box<dyn lode_runtime::backend::Backend> = if !gpu {
            Box::new(CpuBackend::new(threads)?)
        } else if crate::common::gpu_options().numerics == Numerics::Exact {
            Box::new(ExactBackend::new(dev.clone()))
        } else {
            Box::new(GpuBackend::new(dev.clone()))
        };
        let opts = EngineOptions { ctx_size: Some(256), batch_size: 16, kv_type: KvType::F16.into(), swa_full: false };
        Ok(BatchEngine::new(model, be, opts, n_seq)?)
    };
    if Model::load_with_mtp(file.clone())?.mtp.is_none() {
        return Ok(None);
    }
    let (mut cpu, mut gpu) = (mk(false, 1)?, mk(true, 1)?);
    let n_vocab = cpu.model().cfg.n_vocab;
    let mut s = 977u64;
    let ids: Vec<u32> = (0..48)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % n_vocab as u64) as u32
        })
        .collect();
    let (prompt, junk) = (&ids[..40], &ids[40..]);
    let mut ok = true;
    let mut target_delta = 0f32;
    for rewound in [false, true] {
        let mut last = [Vec::new(), Vec::new()];
        for (e, l) in [&mut cpu, &mut gpu].into_iter().zip(&mut last) {
            e.truncate(0, 0);
            if rewound {
                e.eval_rows(0, &prompt[..33], OutputRows::None, &mut |_, _| {})?;
                let tail: Vec<u32> = prompt[33..].iter().chain(junk).copied().collect();
                e.eval_verify(0, &tail)?;
                e.rewind(0, prompt.len())?;
            } else {
                e.eval_rows(0, prompt, OutputRows::Last, &mut |_, row| *l = row.to_vec())?;
            }
        }
        if !rewound {
            target_delta = max_delta(&last[0], &last[1]);
            println!("     mtp: the target's logits after the prompt: max |gpu - cpu| {target_delta:.3e}");
        }
        // The token after the prompt, then the CPU's drafts.
        let mut tok = ids[47];
        for j in 0..4 {
            let c = cpu.mtp_logits(0, tok, j)?.context("the CPU engine has no MTP block")?;
            let g = gpu.mtp_logits(0, tok, j)?.context("the GPU engine has no MTP block")?;
            let what = format!("{}row {j}", if rewound { "after a rewound verify, " } else { "" });
            ok &= row_ok(&c, &g, target_delta, &what);
            tok = argmax_logits(&c);
        }
    }
    // `lode serve`'s case: two sequences, batched steps, batched drafting rows.
    let (mut cpu, mut gpu) = (mk(false, 2)?, mk(true, 2)?);
    for e in [&mut cpu, &mut gpu] {
        e.eval_rows(0, &ids[..24], OutputRows::None, &mut |_, _| {})?;
        e.eval_rows(1, &ids[24..40], OutputRows::None, &mut |_, _| {})?;
        for k in 0..3 {
            e.step(&[(0, ids[40 + k]), (1, ids[44 + k])])?;
        }
    }
    let mut toks = [ids[43], ids[47]];
    for j in 0..3 {
        let rows = [(0, toks[0], j), (1, toks[1], j)];
        let (c, g) = (cpu.mtp_draft_rows(&rows)?, gpu.mtp_draft_rows(&rows)?);
        for s in 0..2 {
            ok &= row_ok(&c[s], &g[s], target_delta, &format!("batched, sequence {s}, row {j}"));
            toks[s] = argmax_logits(&c[s]);
        }
    }
    Ok(Some(ok))
}

fn max_delta(c: &[f32], g: &[f32]) -> f32 {
    c.iter().zip(g).map(|(a, b)| (a - b).abs()).fold(0f32, |m, x| if x.is_nan() { f32::INFINITY } else { m.max(x) })
}

/// Prints and judges one drafting row (the bound in the module's doc).
fn row_ok(c: &[f32], g: &[f32], target_delta: f32, what: &str) -> bool {
    let range = c.iter().fold(f32::MIN, |m, &v| m.max(v)) - c.iter().fold(f32::MAX, |m, &v| m.min(v));
    let d = max_delta(c, g);
    let (tc, tg) = (argmax_logits(c), argmax_logits(g));
    let gap = c[tc as usize] - c[tg as usize];
    let bound = (4.0 * target_delta).max(1e-3 * range);
    let ok = d <= bound && (tc == tg || gap <= 2.0 * bound);
    println!("{} mtp {what}: max |gpu - cpu| {d:.3e} (logit range {range:.3}), top-1 cpu {tc} gpu {tg}", if ok { "ok  " } else { "FAIL" });
    ok
}
