//! `lode selftest --residency-check MODEL`: the weight-residency and graph-replay
//! must-shows on this machine's GPU, in one process, over a real model file:
//! - `device`: after prefills of 1, 7, 64, 127, 513 and 2048 tokens, each followed by
//!   128 greedy decode steps, device copies == weight tensors used, 0 duplicates,
//!   resident bytes ≤ their GGUF bytes;
//! - `upload` and `mapped` compute bit-identical logits to `device` (every f32's bits);
//!   `mapped` makes no copy of a stored-layout weight (and reports how it made the file
//!   readable, how fast it reads over the bus, or that it fell back and why);
//! - a registration that fails or stalls at its first chunk (`LODE_TUNE=mapped_inject`, on
//!   a second context of the same GPU) falls back to `device` residency, says so in the
//!   weight report, and computes the same logits;
//! - graph replay off (`Tuning::graphs` off) gives bit-identical logits to replay on;
//! - over budget and injected allocation / upload / pack failures: a clear error, then a
//!   successful run — the same engine, or a new one — in the same process.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use lode_runtime::backend::gpu::materialize::{choose_mapped_host, MappedHost};
use lode_runtime::backend::gpu::register::Inject;
use lode_runtime::backend::gpu::{GpuBackend, GpuDevice};
use lode_runtime::backend::KvType;
use lode_runtime::backend::Backend;
use lode_runtime::engine::fit::{self, RunShape};
use lode_runtime::engine::{argmax_logits, Engine, EngineError, EngineOptions};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::weights::layout::{canonical, consumer_for_dims, DeviceClass};
use lode_runtime::weights::{Layout, Residency, Stage, WeightOptions};

const CTX: usize = 2048 + 128 + 8;

struct Setup {
    file: Arc<GgufFile>,
    dev: GpuDevice,
    n_vocab: usize,
    /// Weight tensors the forward pass reads, their GGUF bytes, and how many of them
    /// are read in the stored layout (served in place by `mapped`).
    used: u64,
    bytes: u64,
    stored: u64,
}

impl Setup {
    fn backend(&self, residency: Residency, budget: Option<u64>) -> Result<GpuBackend> {
        self.backend_on(&self.dev, residency, budget)
    }
    fn backend_on(&self, dev: &GpuDevice, residency: Residency, budget: Option<u64>) -> Result<GpuBackend> {
        let opts = WeightOptions { residency: Some(residency), budget, ..Default::default() };
        Ok(GpuBackend::with_options(dev.clone(), &opts)?)
    }
    fn engine(&self, be: GpuBackend) -> Result<Engine> {
        Ok(self.engine_ctx(be, CTX)?)
    }
    fn engine_ctx(&self, be: GpuBackend, ctx: usize) -> Result<Engine, EngineError> {
        let m = Model::load(self.file.clone())?;
        Engine::new(m, Box::new(be), EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: KvType::F16.into(), swa_full: false })
    }
    fn prompt(&self, n: usize, seed: u32) -> Vec<u32> {
        let v = self.n_vocab.min(30000) as u32;
        (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed.wrapping_mul(7919)) >> 5) % v).collect()
    }
}

/// Prefill `p`, then `steps` greedy steps; every logits vector.
fn run(e: &mut Engine, p: &[u32], steps: usize) -> Result<Vec<Vec<f32>>, EngineError> {
    let mut out = vec![e.eval(p)?];
    for _ in 0..steps {
        let t = argmax_logits(out.last().unwrap_or(&Vec::new()));
        out.push(e.eval(&[t])?);
    }
    Ok(out)
}

/// Every logit's bits equal (`==` on f32 would let -0.0 match 0.0 and fail on NaN).
fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

fn tokens(l: &[Vec<f32>]) -> Vec<u32> {
    l.iter().map(|x| argmax_logits(x)).collect()
}

struct Tally(u32, u32);
impl Tally {
    fn check(&mut self, name: &str, ok: bool, detail: String) {
        if ok {
            self.0 += 1;
            println!("PASS residency {name}: {detail}");
        } else {
            self.1 += 1;
            println!("FAIL residency {name}: {detail}");
        }
    }
}

/// Run every check; Ok(true) when all pass.
pub fn check(dev: &GpuDevice, path: &Path, mapped_steps: usize) -> Result<bool> {
    let file = crate::common::open_gguf(path)?;
    let m = Model::load(file.clone()).context("loading the model")?;
    let ids = m.weight_ids();
    let mut s = Setup { file: file.clone(), dev: dev.clone(), n_vocab: m.cfg.n_vocab, used: ids.len() as u64, bytes: 0, stored: 0 };
    for &id in &ids {
        let w = m.w(id);
        s.bytes += w.data().len() as u64;
        let l = canonical(w.ty(), consumer_for_dims(&w.view.info.dims), DeviceClass::Gpu);
        if l == Layout::Stored {
            s.stored += 1;
        }
    }
    drop(m);
    println!("residency check on {}: {} weight tensors used, {} bytes, {} read in the stored layout", path.display(), s.used, s.bytes, s.stored);
    println!("context limits set at open: {}", if dev.context_limits().is_empty() { "driver defaults".to_string() } else { dev.context_limits() });
    let mut t = Tally(0, 0);

    // device: one copy per weight at every prefill length.
    let mut e = s.engine(s.backend(Residency::Device, None)?)?;
    let load = e.weight_stats().map(|x| x.copies).unwrap_or(u64::MAX);
    t.check("device nothing copied at load", load == 0, format!("{load} copies"));
    for (i, len) in [1usize, 7, 64, 127, 513, 2048].into_iter().enumerate() {
        e.clear();
        let t0 = Instant::now();
        let l = run(&mut e, &s.prompt(len, i as u32), 128)?;
        let st = e.weight_stats().unwrap_or_default();
        let finite = l.iter().flatten().all(|x| x.is_finite());
        let ok = finite && st.copies == s.used && st.duplicates == 0 && st.resident_bytes <= s.bytes && st.failures == 0;
        t.check(
            &format!("device pp{len}+tg128"),
            ok,
            format!("copies {} (used {}), duplicates {}, resident {} ≤ {} bytes, {:.1} s", st.copies, s.used, st.duplicates, st.resident_bytes, s.bytes, t0.elapsed().as_secs_f64()),
        );
    }
    let st = e.weight_stats().unwrap_or_default();
    if let Some(g) = st.graphs {
        println!("  graph replay over that run: {g:?}");
    }
    drop(e);

    // The reference run every mode must reproduce bit for bit.
    let p = s.prompt(16, 99);
    let want = run(&mut s.engine(s.backend(Residency::Device, None)?)?, &p, mapped_steps)?;
    println!("  reference greedy tokens (device): {:?}", tokens(&want));

    let mut e = s.engine(s.backend(Residency::Upload, None)?)?;
    let at_load = e.weight_stats().unwrap_or_default().copies;
    let got = run(&mut e, &p, mapped_steps)?;
    t.check("upload bit-identical logits", same_bits(&got, &want) && at_load == s.used, format!("{at_load} copies at load"));
    drop(e);

    let mut be = s.backend(Residency::Device, None)?;
    be.set_graphs(false);
    let mut e = s.engine(be)?;
    let got = run(&mut e, &p, mapped_steps)?;
    let g = e.weight_stats().and_then(|x| x.graphs).unwrap_or_default();
    t.check("graphs off bit-identical logits", same_bits(&got, &want) && g.captures == 0 && g.hits == 0, format!("{g:?}"));
    drop(e);

    // Over budget: a clear error, then a run that fits, in this process.
    let half = s.bytes / 2;
    let mut e = s.engine(s.backend(Residency::Device, Some(half))?)?;
    let err = run(&mut e, &p, 2).err().map(|e| e.to_string()).unwrap_or_default();
    t.check("device over budget is a clear error", err.contains("weight budget"), err.clone());
    drop(e);
    let err = s.engine(s.backend(Residency::Upload, Some(half))?).err().map(|e| format!("{e:#}")).unwrap_or_default();
    t.check("upload over budget is a clear error", err.contains("weight budget"), err.clone());
    let got = run(&mut s.engine(s.backend(Residency::Device, Some(s.bytes))?)?, &p, mapped_steps)?;
    t.check("then a run within budget", same_bits(&got, &want), "same logits as the reference".into());

    // A model that does not fit (a --device-memory cap with room for half the KV cache)
    // is refused before any device memory is taken, naming a context that fits; that
    // context runs within the cap.
    {
        let d3 = GpuDevice::open_tuned(dev.api(), lode_runtime::backend::gpu::device_ordinal(), dev.tuning().clone()).context("opening a second context for the capacity check")?;
        let probe = s.backend_on(&d3, Residency::Device, None)?;
        let target = probe.memory_target().context("no memory figures from the device")?;
        drop(probe);
        let m = Model::load(s.file.clone())?;
        let shape = RunShape { ctx: CTX, batch: 512, n_seq: 1, kv_type: KvType::F16.into(), swa_full: false };
        let est = fit::estimate(&m, &target, shape)?;
        let cap = target.used_at_open + est.fixed() + est.kv / 2;
        let opts = WeightOptions { residency: Some(Residency::Device), device_memory: Some(cap), ..Default::default() };
        let refused = s.engine_ctx(GpuBackend::with_options(d3.clone(), &opts)?, CTX);
        let taken = d3.peak_allocated_bytes();
        let msg = match &refused {
            Err(EngineError::DoesNotFit(m)) => m.clone(),
            Err(e) => format!("not a refusal: {e}"),
            Ok(_) => "accepted".into(),
        };
        let named = msg.find("-c ").and_then(|i| msg[i + 3..].split(|c: char| !c.is_ascii_digit()).next()?.parse::<usize>().ok());
        t.check("a run that does not fit is refused before any device memory is taken", matches!(refused, Err(EngineError::DoesNotFit(_))) && taken == 0 && named.is_some(), format!("{taken} bytes allocated; {msg}"));
        if let Some(n) = named {
            let mut e = s.engine_ctx(GpuBackend::with_options(d3.clone(), &opts)?, n)?;
            let l = run(&mut e, &s.prompt(n.min(2048).saturating_sub(8).max(1), 7), 4)?;
            let peak = e.weight_stats().and_then(|x| x.device).and_then(|d| d.driver_peak_used_bytes);
            let ok = l.iter().flatten().all(|x| x.is_finite()) && peak.is_some_and(|p| p <= cap);
            t.check("the context the refusal names runs within the cap", ok, format!("-c {n}: driver peak {peak:?} ≤ cap {cap}"));
        }
    }

    // Injected failures at a materialization midway: error, then the same engine works.
    for stage in [Stage::Pack, Stage::Alloc, Stage::Upload] {
        let mut be = s.backend(Residency::Device, None)?;
        let at = s.used / 2;
        be.weight_cache_mut().inject_failure(stage, at);
        let mut e = s.engine(be)?;
        let err = run(&mut e, &p, 2).err().map(|e| e.to_string()).unwrap_or_default();
        let leak = e.weight_stats().and_then(|x| x.device.map(|d| (x.resident_bytes, d.allocated_bytes)));
        e.clear();
        let again = run(&mut e, &p, mapped_steps);
        let ok = err.contains("weight `") && matches!(&again, Ok(g) if same_bits(g, &want));
        t.check(&format!("injected {stage:?} failure at {at}"), ok, format!("error: {err}; then {}; (resident, device allocated) after the failure {leak:?}", if ok { "same logits" } else { "WRONG" }));
    }
    // A registration that fails or stalls falls back to `device` and computes the same
    // logits. On a second context with the hook set at the first chunk, so that no real
    // registration (which can itself stall on some machines) comes before it.
    for (inject, name) in [(Inject::Fail(1), "fails"), (Inject::Stall(1), "stalls")] {
        let mut tune = dev.tuning().clone();
        tune.mapped_host = Some(MappedHost::Register);
        tune.mapped_inject = Some(inject);
        tune.mapped_stall_s = 1;
        let d2 = GpuDevice::open_tuned(dev.api(), lode_runtime::backend::gpu::device_ordinal(), tune).context("opening a second context for the injected registration faults")?;
        let t0 = Instant::now();
        let mut e = s.engine(s.backend_on(&d2, Residency::Mapped, None)?)?;
        let opened = t0.elapsed().as_secs_f64();
        let got = run(&mut e, &p, mapped_steps)?;
        let st = e.weight_stats().unwrap_or_default();
        let fell = st.residency_fallback.clone().unwrap_or_default();
        let named = fell.contains("chunk 1 of") && fell.contains(if name == "fails" { "injected failure" } else { "mapped_stall_s" });
        t.check(
            &format!("mapped registration that {name} falls back to device"),
            named && st.residency == Some(Residency::Device) && st.mapped == 0 && same_bits(&got, &want),
            format!("engine up after {opened:.1} s; reported: {fell:?}; {} logits", if same_bits(&got, &want) { "same" } else { "WRONG" }),
        );
    }

    // Last (a real registration can stall): `mapped` reads every weight over the bus on
    // every step. `LODE_TUNE=mapped_host=register` makes a discrete GPU register the
    // file's own pageable pages instead of copying it into pinned memory.
    let how = choose_mapped_host(dev);
    println!("  mapped: {how:?} ({}), coherence {:?}", if dev.tuning().mapped_host.is_some() { "LODE_TUNE=mapped_host" } else { "the device's default" }, dev.tuning().mapped_coherence);
    let t0 = Instant::now();
    let mut e = s.engine(s.backend(Residency::Mapped, None)?)?;
    let opened = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let got = run(&mut e, &p, mapped_steps)?;
    let secs = t0.elapsed().as_secs_f64();
    let st = e.weight_stats().unwrap_or_default();
    let fell = match &st.residency_fallback {
        Some(f) => format!("FELL BACK ({f}); "),
        None => String::new(),
    };
    t.check(
        "mapped bit-identical logits, no copy of stored-layout weights",
        st.residency_fallback.is_none() && same_bits(&got, &want) && st.copies == s.used - s.stored && st.mapped == s.stored,
        format!(
            "{fell}{how:?} in {opened:.2} s (engine up); {} logits; copies {} (weights not in the stored layout: {}), mapped {}; tokens {:?}; {} evals in {secs:.2} s ≈ {:.2} GB/s of weights over the bus",
            if same_bits(&got, &want) { "same" } else { "DIFFERENT" },
            st.copies,
            s.used - s.stored,
            st.mapped,
            tokens(&got),
            mapped_steps + 1,
            (mapped_steps + 1) as f64 * st.mapped_bytes as f64 / secs / 1e9
        ),
    );
    drop(e);

    println!("residency check: {} passed, {} failed", t.0, t.1);
    Ok(t.1 == 0)
}
