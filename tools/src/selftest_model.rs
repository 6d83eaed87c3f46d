//! `lode selftest --model FILE`: the whole forward pass on the GPU against the CPU backend
//! on the same file — greedy tokens (a divergence is reported with the CPU's top-1/top-2
//! logit gap, to tell a near-tie from a bug), mean KL divergence and same-top-1 % of the
//! next-token distributions over a teacher-forced text, and the GPU's decode speed.

use anyhow::{Context, Result};
use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::gpu::{ExactBackend, GpuBackend, GpuDevice, Numerics};
use lode_runtime::backend::KvType;
use lode_runtime::engine::{argmax_logits, Engine, EngineOptions};
use lode_runtime::model::Model;
use std::path::Path;
use std::time::Instant;

/// Token ids to run: the tokenizer's encoding of a fixed text, or (for synthetic files
/// without a usable vocabulary) a deterministic id sequence.
fn prompt_ids(file: &lode_runtime::gguf::GgufFile, n_vocab: usize, n: usize) -> Vec<u32> {
    const TEXT: &str = "Alice was beginning to get very tired of sitting by her sister on the bank, and of having \
nothing to do: once or twice she had peeped into the book her sister was reading, but it had no pictures or \
conversations in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?' So she \
was considering in her own mind (as well as she could, for the hot day made her feel very sleepy and stupid), \
whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking the daisies, \
when suddenly a White Rabbit with pink eyes ran close by her.";
    if let Ok(t) = lode_runtime::tokenizer::Tokenizer::from_gguf(file) {
        let ids = t.encode(TEXT, true, false);
        if ids.len() >= 8 {
            return ids.into_iter().take(n).collect();
        }
    }
    let mut s = 12345u64;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % n_vocab as u64) as u32
        })
        .collect()
}

fn log_softmax(l: &[f32]) -> Vec<f64> {
    let m = l.iter().cloned().fold(f32::MIN, f32::max) as f64;
    let lse = m + l.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    l.iter().map(|&v| v as f64 - lse).collect()
}

fn top2_gap(l: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::MIN, f32::MIN);
    for &v in l {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

/// Compare GPU and CPU on one model file. Returns Ok(true) when tokens match (or diverge
/// only at a near-tie) and KLD ≤ 1e-3 with same-top-1 ≥ 98 %.
pub fn compare(dev: &GpuDevice, path: &Path, gen: usize, n_text: usize, threads: usize, tg: usize, speed_only: bool) -> Result<bool> {
    let file = crate::common::open_gguf(path)?;
    let opts = EngineOptions { ctx_size: Some((n_text + gen + tg + 8).max(128)), batch_size: 512, kv_type: KvType::F16.into(), swa_full: false };
    let mk = |gpu: bool| -> Result<Engine> {
        let model = Model::load(file.clone()).with_context(|| format!("cannot load {}", path.display()))?;
        let be: Box<dyn lode_runtime::backend::Backend> =
            if !gpu {
                Box::new(CpuBackend::new(threads)?)
            } else if crate::common::gpu_options().numerics == Numerics::Exact {
                Box::new(ExactBackend::new(dev.clone()))
            } else {
                Box::new(GpuBackend::new(dev.clone()))
            };
        Ok(Engine::new(model, be, opts)?)
    };
    let mut gpu = mk(true)?;
    let n_vocab = gpu.model().cfg.n_vocab;
    let ids = prompt_ids(&file, n_vocab, n_text);
    if tg > 0 {
        speed(&mut gpu, &ids, tg)?;
        gpu.clear();
    }
    if speed_only {
        return Ok(true);
    }
    let mut cpu = mk(false)?;
    println!("model {} ({} prompt tokens, {} greedy steps)", path.display(), ids.len().min(24), gen);

    // Teacher-forced next-token distributions over the text.
    let mut lc: Vec<Vec<f32>> = Vec::new();
    cpu.eval_all(&ids, &mut |_, l| lc.push(l.to_vec()))?;
    let mut kl_sum = 0f64;
    let mut same = 0usize;
    let mut n = 0usize;
    let mut bit_equal = 0usize;
    gpu.eval_all(&ids, &mut |i, l| {
        bit_equal += lc[i].iter().zip(l).all(|(a, b)| a.to_bits() == b.to_bits()) as usize;
        let (p, q) = (log_softmax(&lc[i]), log_softmax(l));
        kl_sum += p.iter().zip(&q).map(|(a, b)| a.exp() * (a - b)).sum::<f64>();
        same += (argmax_logits(&lc[i]) == argmax_logits(l)) as usize;
        n += 1;
    })?;
    let kld = kl_sum / n.max(1) as f64;
    let top1 = 100.0 * same as f64 / n.max(1) as f64;
    println!("  teacher-forced {n} positions: mean KLD(cpu||gpu) = {kld:.3e}, same top-1 = {top1:.2} %, logits bit-identical at {bit_equal} of {n}");

    // Greedy continuation from the first 24 tokens.
    cpu.clear();
    gpu.clear();
    let p = &ids[..ids.len().min(24)];
    let mut l_c = cpu.eval(p)?;
    let mut l_g = gpu.eval(p)?;
    let (mut toks_c, mut toks_g) = (Vec::new(), Vec::new());
    let mut diverged = None;
    let mut decode_s = 0f64;
    for step in 0..gen {
        let (tc, tg) = (argmax_logits(&l_c), argmax_logits(&l_g));
        toks_c.push(tc);
        toks_g.push(tg);
        if tc != tg && diverged.is_none() {
            diverged = Some((step, top2_gap(&l_c), top2_gap(&l_g)));
            break;
        }
        if step + 1 == gen {
            break;
        }
        l_c = cpu.eval(&[tc])?;
        let t0 = Instant::now();
        l_g = gpu.eval(&[tg])?;
        decode_s += t0.elapsed().as_secs_f64();
    }
    println!("  cpu greedy: {toks_c:?}");
    println!("  gpu greedy: {toks_g:?}");
    let tokens_ok = match diverged {
        None => {
            println!("  greedy tokens identical over {gen} steps");
            true
        }
        Some((s, gc, gg)) => {
            let tie = gc < 0.05 || gg < 0.05;
            println!(
                "  greedy tokens diverge at step {s}: cpu top1-top2 gap {gc:.4}, gpu gap {gg:.4} ({})",
                if tie { "a near-tie" } else { "NOT a near-tie" }
            );
            tie
        }
    };
    if toks_g.len() > 1 {
        println!("  gpu decode (engine, unbatched host loop): {:.1} tok/s", (toks_g.len() - 1) as f64 / decode_s.max(1e-9));
    }
    let verify_ok = verify_rows(&mut gpu, &ids)?;
    drop(gpu);
    let kv_ok = kv_copy(dev, &file, &ids, opts)?;
    let mixed_ok = mixed_step(dev, &file, &ids, opts)?;
    let replay_ok = graphs_off(dev, &file, p, &toks_g, opts)?;
    let crit = [
        ("KLD ≤ 1e-3", kld <= 1e-3),
        ("top-1 ≥ 98 %", top1 >= 98.0),
        ("tokens equal or near-tie", tokens_ok),
        ("KV copy", kv_ok),
        ("prompt chunks mixed into decode steps", mixed_ok),
        ("exact: verify rows", verify_ok),
        ("greedy equal without graph replay", replay_ok),
    ];
    let ok = crit.iter().all(|c| c.1);
    let failed: Vec<&str> = crit.iter().filter(|c| !c.1).map(|c| c.0).collect();
    println!("  {} ({}){}", if ok { "PASS" } else { "FAIL" }, crit.iter().map(|c| c.0).collect::<Vec<_>>().join(", "), if ok { String::new() } else { format!("; failed: {}", failed.join(", ")) });
    Ok(ok)
}

/// A speculative verify chunk (`Engine`'s `eval_each`, 9 rows) against the same tokens
/// decoded one at a time on the same engine: greedy speculation is plain greedy decoding
/// exactly when the rows are bit-identical. Required of `--numerics exact` (which honours
/// `round_rows_as_decode`); reported for the fast kernels, whose small-batch and decode
/// kernels round differently.
fn verify_rows(gpu: &mut Engine, ids: &[u32]) -> Result<bool> {
    use lode_runtime::engine::Sequence;
    let n = 9.min(ids.len().saturating_sub(1));
    if n < 2 {
        return Ok(true);
    }
    let k = ids.len() - n;
    gpu.clear();
    gpu.eval(&ids[..k])?;
    let rows = gpu.eval_each(&ids[k..])?;
    // Recurrent layers: the state goes back through the chunk's rewind log.
    gpu.rewind(k)?;
    let (mut bits, mut same, mut max) = (0, 0, 0f32);
    for (i, row) in rows.iter().enumerate() {
        let one = gpu.eval(&ids[k + i..k + i + 1])?;
        bits += one.iter().zip(row).all(|(a, b)| a.to_bits() == b.to_bits()) as usize;
        same += (argmax_logits(&one) == argmax_logits(row)) as usize;
        max = one.iter().zip(row).map(|(a, b)| (a - b).abs()).fold(max, f32::max);
    }
    println!("  speculative verify chunk of {n} rows vs {n} decode steps: {bits} rows bit-identical, {same} same top-1, max |diff| {max:.3e}");
    // Rewound into the chunk (2 of its rows kept), the next row is the decode step's.
    let j = 2;
    gpu.truncate(k);
    if gpu.history().len() != k {
        gpu.clear();
        gpu.eval(&ids[..k])?;
    }
    let again = gpu.eval_each(&ids[k..])?;
    gpu.rewind(k + j)?;
    let next = gpu.eval(&ids[k + j..k + j + 1])?;
    let rewound = next.iter().zip(&again[j]).all(|(a, b)| a.to_bits() == b.to_bits());
    let rmax = next.iter().zip(&again[j]).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    println!("  rewound to {j} of {n} verify rows: the next row {} (max |diff| {rmax:.3e})", if rewound { "bit-identical" } else { "differs" });
    let exact = crate::common::gpu_options().numerics == Numerics::Exact;
    Ok(!exact || (bits == n && rewound))
}

/// `Backend::copy_kv` on the GPU (the server's shared prompts): a sequence given another's
/// first tokens by copy continues as that one does. Both evaluate the same last chunk after
/// the same cached prefix, so the logits should be bit-identical; a broken copy (wrong
/// rows, wrong layer) moves them by whole units.
fn kv_copy(dev: &GpuDevice, file: &std::sync::Arc<lode_runtime::gguf::GgufFile>, ids: &[u32], opts: EngineOptions) -> Result<bool> {
    use lode_runtime::engine::BatchEngine;
    use lode_runtime::model::OutputRows;
    let k = ids.len().saturating_sub(4).max(1);
    if k + 1 > ids.len() {
        return Ok(true);
    }
    let model = Model::load(file.clone())?;
    let be: Box<dyn lode_runtime::backend::Backend> = if crate::common::gpu_options().numerics == Numerics::Exact {
        Box::new(ExactBackend::new(dev.clone()))
    } else {
        Box::new(GpuBackend::new(dev.clone()))
    };
    let mut e = BatchEngine::new(model, be, opts, 2)?;
    let (mut own, mut copied) = (Vec::new(), Vec::new());
    // The copy takes all of sequence 0 (a model with recurrent layers copies only whole
    // sequences), then both go on with the same tokens.
    e.eval_rows(0, &ids[..k], OutputRows::Last, &mut |_, _| {})?;
    e.copy_prefix(0, 1, k)?;
    e.eval_rows(0, &ids[k..], OutputRows::Last, &mut |_, l| own = l.to_vec())?;
    e.eval_rows(1, &ids[k..], OutputRows::Last, &mut |_, l| copied = l.to_vec())?;
    let max = own.iter().zip(&copied).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let bits = own.iter().zip(&copied).all(|(a, b)| a.to_bits() == b.to_bits());
    println!("  KV copy of {k} tokens: logits after it {} (max |diff| {max:.3e})", if bits { "bit-identical" } else { "differ" });
    Ok(max <= 1e-2)
}

/// Chunked prefill on the GPU (`BatchEngine::step_mixed`, the server's long prompts): the
/// text fed in chunks of 7 inside the decode steps of another sequence ends with the logits
/// it gets evaluated alone, and each decode row of those passes agrees with the same token
/// stepped alone on a twin holding the same prefix. Rows of different pass shapes take
/// different kernels, so the check is the top-1 (a near-tie excepted) and a bound that a
/// wrong cache, position or row would break by whole units.
fn mixed_step(dev: &GpuDevice, file: &std::sync::Arc<lode_runtime::gguf::GgufFile>, ids: &[u32], opts: EngineOptions) -> Result<bool> {
    use lode_runtime::engine::BatchEngine;
    use lode_runtime::model::OutputRows;
    let model = Model::load(file.clone())?;
    let be: Box<dyn lode_runtime::backend::Backend> = if crate::common::gpu_options().numerics == Numerics::Exact {
        Box::new(ExactBackend::new(dev.clone()))
    } else {
        Box::new(GpuBackend::new(dev.clone()))
    };
    let mut e = BatchEngine::new(model, be, EngineOptions { batch_size: opts.batch_size.max(8), ..opts }, 4)?;
    let k = ids.len() / 4;
    if !e.can_mix() || k == 0 || ids.len() < 16 {
        println!("  prompt chunks mixed into decode steps: not run (the model does not mix, or the text is short)");
        return Ok(true);
    }
    // Sequence 0 decodes; 1 is its twin stepped alone; 2 takes the text in mixed chunks;
    // 3 evaluates it alone.
    let mut last = Vec::new();
    e.eval_rows(0, &ids[..k], OutputRows::Last, &mut |_, l| last = l.to_vec())?;
    e.copy_prefix(0, 1, k)?;
    let mut alone = Vec::new();
    e.eval_rows(3, ids, OutputRows::Last, &mut |_, l| alone = l.to_vec())?;
    let (mut t, mut fed, mut max, mut agree, mut rows) = (argmax_logits(&last), 0, 0f32, true, 0);
    let mut got = None;
    while fed < ids.len() {
        let part = &ids[fed..(fed + 7).min(ids.len())];
        fed += part.len();
        let (first, step) = e.step_mixed(2, part, fed == ids.len(), &[(0, t)])?;
        let twin = e.step(&[(1, t)])?.remove(0);
        max = step[0].iter().zip(&twin).map(|(a, b)| (a - b).abs()).fold(max, f32::max);
        agree &= argmax_logits(&step[0]) == argmax_logits(&twin) || top2_gap(&twin) < 0.1;
        rows += 1;
        got = first.or(got);
        t = argmax_logits(&twin);
    }
    let got = got.unwrap_or_default();
    let pmax = got.iter().zip(&alone).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let same = argmax_logits(&got) == argmax_logits(&alone) || top2_gap(&alone) < 0.1;
    println!("  prompt of {} tokens in chunks of 7 beside a decoding sequence: last logits vs alone max |diff| {pmax:.3e} ({}); {rows} decode rows vs stepped alone max |diff| {max:.3e} ({})",
        ids.len(), if same { "same top-1" } else { "DIFFERENT top-1" }, if agree { "same top-1" } else { "DIFFERENT top-1" });
    Ok(same && agree && pmax < 0.5 && max < 0.5 && got.len() == alone.len())
}

/// The greedy continuation again on a fast GPU backend with graph replay off
/// (`Tuning::graphs`): a replayed step launches the kernels it recorded with the same
/// arguments, so the tokens must equal `want` (the run with replay on) exactly. A step
/// whose work is not all recorded (a host read-back inside it, a state the graph does not
/// see move) shows here. Skipped under `--numerics exact`, which never replays.
fn graphs_off(dev: &GpuDevice, file: &std::sync::Arc<lode_runtime::gguf::GgufFile>, prompt: &[u32], want: &[u32], opts: EngineOptions) -> Result<bool> {
    if crate::common::gpu_options().numerics == Numerics::Exact || want.is_empty() {
        return Ok(true);
    }
    let mut be = GpuBackend::new(dev.clone());
    be.tuning_mut().graphs = false;
    let mut e = Engine::new(Model::load(file.clone())?, Box::new(be), opts)?;
    let mut l = e.eval(prompt)?;
    let mut got = Vec::new();
    for _ in 0..want.len() {
        let t = argmax_logits(&l);
        got.push(t);
        if got.len() == want.len() || t != want[got.len() - 1] {
            break;
        }
        l = e.eval(&[t])?;
    }
    let ok = got == want;
    println!("  greedy without graph replay: {} over {} steps", if ok { "identical" } else { "DIFFERENT" }, want.len());
    if !ok {
        println!("  no-replay greedy: {got:?}");
    }
    Ok(ok)
}

/// Prefill of the prompt and `tg` greedy decode steps on the GPU engine, timed on the host
/// (each step includes the engine's logits read-back and argmax, as generation does).
fn speed(gpu: &mut Engine, ids: &[u32], tg: usize) -> Result<()> {
    gpu.clear();
    let warm = gpu.eval(&ids[..ids.len().min(8)])?;
    let _ = gpu.eval(&[argmax_logits(&warm)])?;
    gpu.clear();
    let t0 = Instant::now();
    let l = gpu.eval(ids)?;
    let pp = t0.elapsed().as_secs_f64();
    let mut tok = argmax_logits(&l);
    let t1 = Instant::now();
    for _ in 0..tg {
        let l = gpu.eval(&[tok])?;
        tok = argmax_logits(&l);
    }
    let tgs = t1.elapsed().as_secs_f64();
    println!("  speed: pp{} {:.1} tok/s, tg{} {:.1} tok/s ({:.3} ms/token) on {}", ids.len(), ids.len() as f64 / pp, tg, tg as f64 / tgs, tgs * 1e3 / tg as f64, gpu.backend_name());
    Ok(())
}

/// A backend that forwards every op to `inner` and then multiplies each RMSNorm output by
/// (1 + 2⁻²³): a perturbation of one f32 rounding step, the size of the differences that
/// summation order or an exp implementation make between two correct backends.
struct Nudged(Box<dyn lode_runtime::backend::Backend>);

mod nudged_impl {
    use super::Nudged;
    use lode_runtime::backend::{Attention, Backend, Buf, Glu, KvCache, KvSpec, MoeFfn, MoeScratch, Result, Rope};
    use lode_runtime::weights::WeightRef;
    impl Backend for Nudged {
        fn name(&self) -> String {
            format!("{} (norm outputs × (1 + 2^-23))", self.0.name())
        }
        fn alloc(&mut self, len: usize) -> Result<Buf> {
            self.0.alloc(len)
        }
        fn alloc_readback(&mut self, len: usize) -> Result<Buf> {
            self.0.alloc_readback(len)
        }
        fn free(&mut self, buf: Buf) -> Result<()> {
            self.0.free(buf)
        }
        fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()> {
            self.0.write(buf, src)
        }
        fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()> {
            self.0.read(buf, dst)
        }
        fn read_with(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> Result<()> {
            self.0.read_with(buf, n, host, f)
        }
        fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
            self.0.alloc_kv(spec)
        }
        fn free_kv(&mut self, kv: KvCache) -> Result<()> {
            self.0.free_kv(kv)
        }
        fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
            self.0.get_rows(w, ids, out)
        }
        fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
            self.0.matmul(w, x, n_tok, y)
        }
        fn rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
            self.0.rms_norm(x, out, n_rows, row_len, w, eps)?;
            self.0.scale(out, n_rows * row_len, 1.0 + f32::EPSILON)
        }
        fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
            self.0.rope(x, n_head, head_dim, pos, rope)
        }
        fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
            self.0.add(a, b, out, n)
        }
        fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
            self.0.add_bias(x, n_tok, bias)
        }
        fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
            self.0.scale(x, n, s)
        }
        fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
            self.0.glu(gate, up, out, n, act)
        }
        fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
            self.0.copy(src, src_off, dst, dst_off, n)
        }
        fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
            self.0.kv_write(kv, layer, k, v, pos)
        }
        fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
            self.0.attention(q, kv, layer, pos, p, out)
        }
        // gpt-oss's MoE runs only in the backend's own op (the trait's default refuses it).
        fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
            self.0.moe_ffn(x, n_tok, p, out, tmp)
        }
    }
}

/// `lode selftest --model F --perturb`: the CPU backend against itself with every norm
/// output nudged by one f32 rounding step. Q8 activation codes then flip now and then, and
/// each flip is a full quantization step that the next layers amplify into more flips: the
/// KL divergence this prints is the floor any backend that is not bit-identical to the CPU
/// (summation order, exp, rsqrt) can reach on this model — the GPU gate is judged against it.
pub fn perturb_compare(path: &Path, n_text: usize, threads: usize) -> Result<()> {
    let file = crate::common::open_gguf(path)?;
    let opts = EngineOptions { ctx_size: Some((n_text + 8).max(128)), batch_size: 512, kv_type: KvType::F16.into(), swa_full: false };
    let mk = |nudge: bool| -> Result<Engine> {
        let model = Model::load(file.clone()).with_context(|| format!("cannot load {}", path.display()))?;
        let cpu: Box<dyn lode_runtime::backend::Backend> = Box::new(CpuBackend::new(threads)?);
        let be: Box<dyn lode_runtime::backend::Backend> = if nudge { Box::new(Nudged(cpu)) } else { cpu };
        Ok(Engine::new(model, be, opts)?)
    };
    let (mut a, mut b) = (mk(false)?, mk(true)?);
    let ids = prompt_ids(&file, a.model().cfg.n_vocab, n_text);
    let mut la: Vec<Vec<f32>> = Vec::new();
    a.eval_all(&ids, &mut |_, l| la.push(l.to_vec()))?;
    let (mut kl_sum, mut same, mut n) = (0f64, 0usize, 0usize);
    b.eval_all(&ids, &mut |i, l| {
        let (p, q) = (log_softmax(&la[i]), log_softmax(l));
        kl_sum += p.iter().zip(&q).map(|(x, y)| x.exp() * (x - y)).sum::<f64>();
        same += (argmax_logits(&la[i]) == argmax_logits(l)) as usize;
        n += 1;
    })?;
    println!(
        "model {}: cpu vs cpu with norm outputs × (1 + 2^-23), teacher-forced {n} positions: mean KLD = {:.3e}, same top-1 = {:.2} %",
        path.display(),
        kl_sum / n.max(1) as f64,
        100.0 * same as f64 / n.max(1) as f64
    );
    Ok(())
}
