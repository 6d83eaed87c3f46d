//! `lode fit`: will this model run here, at this context, before loading anything?
//!
//! Maps the file (which copies nothing), reads the architecture, opens the device as a
//! run opens it (context, kernel modules, trimmed context limits, `--device-memory`), and
//! counts the device bytes a run needs with the engine's own estimate
//! (`lode_runtime::engine::fit`: the same numbers the engine refuses a model by). The total
//! is compared with the device's free memory (the GPU driver's, a `--device-memory` cap's
//! share, or the CPU's `MemAvailable`), and the largest context that would fit is
//! reported, capped at the model's training context. Beside it on a GPU: the device
//! memory the driver will show during the run (what this process holds after opening,
//! plus the run's allocations), which `--memory-report`'s `driver_peak_used_bytes`
//! measures. A model that does not fit makes the command fail (exit status 1).

use std::path::PathBuf;

use anyhow::{Context, Result};
use lode_runtime::backend::gpu::driver::{Api, DevAttr};
use lode_runtime::backend::gpu::GpuDevice;
use lode_runtime::backend::memory::MemoryTarget;
use lode_runtime::backend::DeviceKind;
use lode_runtime::engine::fit::{self, RunShape};
use lode_runtime::model::Model;
use lode_runtime::weights::budget::human;
use lode_runtime::weights::layout::DeviceClass;
use lode_runtime::weights::Residency;

use crate::common;

/// Arguments of `lode fit`.
#[derive(clap::Args, Debug)]
#[command(after_help = "The KV cache is counted as the engine allocates it: full-context layers hold the \
whole context, sliding-window layers a window-sized cache (window + chunk + 64 slots; --swa-full gives \
them the full context), K and V in their -ctk / -ctv types. The largest context is capped at the model's \
training context, and a model that does not fit makes the command exit with status 1. With `mapped` \
residency the stored weights are read in place; should the file's registration fail or stall at run \
time, the run falls back to device copies and is counted again before anything is allocated. The \
device's capacity can be set with the global --device-memory SIZE (the driver's own use included), \
e.g. `lode fit -m model.gguf --device-memory 24GiB`.")]
pub struct Args {
    /// GGUF model file (default: Gemma 3 270M Q4_K_M).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Context size in tokens (default: min(model's context, 4096), as a run would use).
    #[arg(short = 'c', long = "ctx", visible_alias = "ctx-size")]
    pub ctx: Option<usize>,
    /// Device: cpu, cuda, hip or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceKind,
    /// Prompt tokens per forward chunk (sizes the activation scratch).
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    /// Sequences sharing the model (as `lode serve --parallel N`, also -np): the context
    /// is then the total, each sequence's KV cache holding context / N tokens (without -c:
    /// the training context split N ways, at most 4096 each), as `lode serve` sizes them.
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: usize,
    /// Weight residency to plan for (default: the device's, as a run would pick).
    #[arg(long, value_name = "MODE")]
    pub residency: Option<Residency>,
    /// Keep the expert tensors of the first N layers in host memory, computed by the CPU
    /// (llama.cpp's `--n-cpu-moe`): they are not counted on the device. Unset: when the
    /// experts do not fit, the fewest such layers that fit, as a run chooses them.
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<usize>,
    #[command(flatten)]
    pub kv: common::KvArgs,
    /// Draft model for speculative decoding (as `lode generate --model-draft`): its
    /// weights, KV cache and scratch at the same context are counted as taken first.
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// Speculation without a draft model (as `lode generate --spec-type`): draft-mtp
    /// counts the model's multi-token-prediction block (weights, its KV cache, buffers).
    #[arg(long = "spec-type", value_name = "TYPE", default_value = "none")]
    pub spec_type: crate::spec::SpecType,
    /// Tokens drafted per verify pass at most: with speculation on a model with recurrent
    /// layers, each sequence's rewind log holds this many rows and one more.
    #[arg(long = "draft-max", visible_aliases = ["draft", "draft-n", "spec-draft-n-max"], value_name = "N", default_value_t = 16)]
    pub draft_max: usize,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let path = common::resolve_model(args.model.as_deref())?;
    let file = std::sync::Arc::new(common::open_gguf_plain(&path, "cannot open model")?);
    let mtp = args.spec_type == crate::spec::SpecType::DraftMtp;
    let load = if mtp { Model::load_with_mtp } else { Model::load };
    let model = load(file.clone()).with_context(|| format!("cannot read model {}", path.display()))?;
    if mtp && model.mtp.is_none() {
        anyhow::bail!("{} carries no multi-token-prediction block (`blk.N.nextn.*`): --spec-type draft-mtp needs one", path.display());
    }
    let mut target = target(args.device, args.residency, args.n_cpu_moe.unwrap_or(0))?;
    let c = &model.cfg;
    let n_seq = args.parallel.max(1);
    let ctx = crate::serve::slot_ctx(args.ctx, n_seq, c.n_ctx_train)?;
    let shape = RunShape { ctx, batch: args.batch_size.max(1), n_seq, kv_type: args.kv.types(), swa_full: args.kv.swa_full };
    // The draft model's engine (one sequence per slot at the same context, as `lode
    // serve --model-draft` runs it; one for generate) takes its share first.
    let draft = match &args.model_draft {
        Some(p) => {
            let f = std::sync::Arc::new(common::open_gguf_plain(p, "cannot open draft model")?);
            let dm = Model::load(f).with_context(|| format!("cannot read draft model {}", p.display()))?;
            let de = fit::estimate(&dm, &target, shape).context("cannot size the draft model")?;
            // A recurrent draft logs what it drafts, to rewind to the accepted tokens.
            let need = de.need + fit::rewind_log_bytes(&dm, target.class == DeviceClass::Gpu, shape.n_seq, args.draft_max);
            target.free = target.free.saturating_sub(need);
            target.used_at_open += need;
            Some((p.clone(), need))
        }
        None => None,
    };
    // Speculation on a model with recurrent layers: each sequence's rewind log, allocated
    // at its first verify chunk (taken first, as the draft's share).
    let rewind = if args.model_draft.is_some() || args.spec_type != crate::spec::SpecType::None {
        fit::rewind_log_bytes(&model, target.class == DeviceClass::Gpu, shape.n_seq, args.draft_max + 1)
    } else {
        0
    };
    target.free = target.free.saturating_sub(rewind);
    target.used_at_open += rewind;
    let mut e = fit::estimate(&model, &target, shape).context("cannot size the weights")?;
    // As a run does (`BatchEngine::new`): experts that do not fit stay on the host.
    let placed = if args.n_cpu_moe.is_none() { fit::fewest_host_expert_layers(&model, &target, shape) } else { None };
    if let Some(n) = placed {
        target.host_expert_layers = n;
        e = fit::estimate(&model, &target, shape).context("cannot size the weights")?;
    }
    let (fits, max_ctx) = (e.fits(), e.max_ctx());
    let gpu = target.class == DeviceClass::Gpu;

    if args.json {
        let j = serde_json::json!({
            "model": path.display().to_string(),
            "device": target.name,
            "residency": target.residency,
            "ctx": ctx * n_seq,
            "ctx_per_sequence": ctx,
            "parallel": shape.n_seq,
            "weights_bytes": e.weights,
            "weights_per_layout": e.per_layout,
            "weights_in_place_bytes": e.in_place,
            "weight_tensors": e.n_tensors,
            "kv_bytes": e.kv,
            "kv_bytes_per_token": e.kv_per_token,
            "kv_sliding_window_full_context": c.n_swa > 0 && e.swa.is_none(),
            "kv_sliding_window_slots": e.swa.map(|w| w.slots),
            "kv_sliding_window_layers": e.swa.map(|w| w.n_windowed()),
            "recurrent_state_bytes": e.recurrent,
            "host_expert_layers": target.host_expert_layers,
            "host_expert_layers_chosen_by_fit": placed.is_some(),
            "host_expert_bytes": e.host_experts,
            "scratch_bytes": e.scratch,
            "need_bytes": e.need,
            "free_bytes": e.free,
            "total_bytes": e.total,
            "device_memory_cap_bytes": e.cap,
            "device_used_at_open_bytes": e.used_at_open,
            "predicted_device_used_bytes": e.predicted_device_used(),
            "fits": fits,
            "max_ctx": max_ctx * n_seq as u64,
            "max_ctx_per_sequence": max_ctx,
            "max_ctx_memory": e.max_ctx_memory,
            "cache_type_k": shape.kv_type.k.name(),
            "cache_type_v": shape.kv_type.v.name(),
            "max_ctx_by_kv_type": e.max_ctx_by_kv.iter().map(|(t, m)| (t.name(), (*m).min(c.n_ctx_train as u64))).collect::<std::collections::BTreeMap<_, _>>(),
            "n_ctx_train": c.n_ctx_train,
            "draft_model": draft.as_ref().map(|d| d.0.display().to_string()),
            "draft_need_bytes": draft.as_ref().map(|d| d.1),
            "rewind_log_bytes": rewind,
            "mtp": model.mtp.is_some(),
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return verdict(&e);
    }
    let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    let per = if n_seq > 1 { format!(" ({n_seq} sequences of {ctx}, as lode serve --parallel {n_seq} -c {} splits it)", ctx * n_seq) } else { String::new() };
    println!("{name} on {}, residency {}, context {}{per}", target.name, target.residency, ctx * n_seq);
    println!("  weights   {:>11}  ({} tensors)", human(e.weights), e.n_tensors);
    for (l, b) in &e.per_layout {
        println!("            {:>11}  {l}", human(*b));
    }
    if target.host_expert_layers > 0 {
        let by = if placed.is_some() { "chosen by fit: the fewest that fit, as a run chooses them; --n-cpu-moe N sets the count" } else { "--n-cpu-moe" };
        println!("  experts   {:>11}  of the first {} layers stay in host memory, computed by the CPU ({by})", human(e.host_experts), target.host_expert_layers);
    }
    if e.in_place > 0 {
        println!(
            "  mapped    {:>11}  read in place from the file (registered or pinned host memory, no device copy; if the file cannot be registered, the run falls back to device copies of these and is counted again)",
            human(e.in_place)
        );
    }
    let swa = match e.swa {
        Some(w) => format!("; {} of them sliding-window layers of {} tokens, {} slots each (window + chunk + 64; --swa-full for the full context)", w.n_windowed(), w.window, w.slots),
        None if c.n_swa > 0 && shape.swa_full => format!("; the {}-token sliding-window layers get the full context too (--swa-full)", c.n_swa),
        None if c.n_swa > 0 => format!("; the {}-token sliding-window layers get the full context too (a window-sized cache would be no smaller)", c.n_swa),
        None => String::new(),
    };
    let seqs = if shape.n_seq > 1 { format!("{} sequences × ", shape.n_seq) } else { String::new() };
    println!(
        "  KV cache  {:>11}  ({}: {seqs}{} layers × {ctx} × {} kv heads × {} + {}{swa})",
        human(e.kv),
        shape.kv_type,
        c.kv_layers() + model.mtp.is_some() as usize,
        c.n_head_kv,
        c.head_dim_k,
        c.head_dim_v
    );
    if e.recurrent > 0 {
        let n_rec = c.n_layer - c.kv_layers();
        println!("  recurrent {:>11}  (f32: {seqs}{n_rec} gated delta net layers' conv and delta-rule state, whatever the context)", human(e.recurrent));
    }
    println!("  scratch   {:>11}  (estimate: activations of {}-token chunks{})", human(e.scratch), args.batch_size.min(ctx), if gpu { ", one allocation each, q8_1 copy, prefill operands and BLAS slab, launch overhead" } else { "" });
    println!("  needed    {:>11}", human(e.need));
    if rewind > 0 {
        println!("  rewind    {:>11}  (speculation's rollback of the recurrent state: {seqs}a checkpoint and {} logged rows per gated delta net layer, counted as taken before the above)", human(rewind), args.draft_max + 1);
    }
    if let Some(m) = &model.mtp {
        println!("            (the KV cache and weights include the multi-token-prediction block blk.{}: one more full-context layer)", m.index);
    }
    if let Some((p, need)) = &draft {
        let n = p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        println!("  draft     {:>11}  ({n}: weights, KV cache and scratch, counted as taken before the above)", human(*need));
    }
    let cap = e.cap.map(|b| format!(" (--device-memory {})", human(b))).unwrap_or_default();
    println!("  free      {:>11}  of {}{cap}", human(e.free), human(e.total));
    if let Some(p) = e.predicted_device_used() {
        println!(
            "  device    {:>11}  predicted peak in use during the run (the driver's figure, nvidia-smi): {} held once opened (context, kernels, other processes) + needed",
            human(p),
            human(e.used_at_open)
        );
    }
    let trained = if e.max_ctx_memory > c.n_ctx_train as u64 {
        format!(" (capped at the model's training context; memory alone would allow {})", e.max_ctx_memory)
    } else {
        String::new()
    };
    let by_kv: Vec<String> = e.max_ctx_by_kv.iter().map(|(t, m)| format!("{t} {}", (*m).min(c.n_ctx_train as u64))).collect();
    if !by_kv.is_empty() {
        println!("  largest context by KV type (-ctk/-ctv, K and V alike): {}", by_kv.join(", "));
    }
    // With several sequences, the largest total (-c) and each sequence's share.
    let largest = if n_seq > 1 { format!("{} ({n_seq} sequences of {max_ctx})", max_ctx * n_seq as u64) } else { max_ctx.to_string() };
    if fits {
        println!("fits: yes; the largest context that fits is {largest}{trained}");
    } else if max_ctx == 0 {
        println!("fits: no; the weights and scratch alone need {} more than is free", human(e.fixed().saturating_sub(e.free)));
    } else {
        println!("fits: no ({} short); the largest context that fits is {largest}{trained}", human(e.need - e.free));
    }
    if let Some(n) = fit::fewest_host_expert_layers(&model, &target, shape) {
        println!("      with --n-cpu-moe {n} it fits: the first {n} layers' experts stay in host memory, computed by the CPU");
    }
    verdict(&e)
}

/// "Does not fit" is a failure of the command (exit status 1), after the report.
fn verdict(e: &fit::Estimate) -> Result<()> {
    match e.refusal() {
        None => Ok(()),
        Some(why) => anyhow::bail!("{why}"),
    }
}

/// The device `--device` names and its memory, opened as a run opens it (tuning, context
/// limits, kernel modules, `--device-memory`).
fn target(kind: DeviceKind, residency: Option<Residency>, n_cpu_moe: usize) -> Result<MemoryTarget> {
    let ordinal = lode_runtime::backend::gpu::device_ordinal();
    let cap = common::device_memory()?;
    let apis: &[Api] = match kind {
        DeviceKind::Cpu => &[],
        DeviceKind::Cuda => &[Api::Cuda],
        DeviceKind::Hip => &[Api::Hip],
        DeviceKind::Auto => &[Api::Cuda, Api::Hip],
    };
    for &api in apis {
        match GpuDevice::open_tuned(api, ordinal, common::gpu_options().tuning()) {
            Ok(d) => {
                d.set_memory_cap(cap);
                let (free, total) = d.mem_info().with_context(|| format!("{api}: cannot read device memory"))?;
                let unified = d.attribute(DevAttr::Integrated).map(|v| v != 0).unwrap_or(false);
                return Ok(MemoryTarget {
                    name: format!("{api}:{ordinal} ({})", d.info().name),
                    class: DeviceClass::Gpu,
                    residency: Residency::resolve(residency, unified).map_err(anyhow::Error::msg)?,
                    free,
                    total,
                    used_at_open: total - free,
                    arena: d.driver().vmm_granularity().is_some() && d.tuning().weight_arena,
                    tuning: Some(d.tuning().clone()),
                    cap,
                    host_expert_layers: n_cpu_moe,
                });
            }
            Err(e) if kind != DeviceKind::Auto => return Err(e).with_context(|| format!("cannot open {api} device {ordinal}")),
            Err(_) => {}
        }
    }
    let (free, total) = match cap {
        Some(c) => (c, c),
        None => meminfo().context("cannot read /proc/meminfo")?,
    };
    Ok(MemoryTarget {
        name: "cpu".into(),
        class: DeviceClass::Cpu,
        residency: residency.unwrap_or(Residency::Mapped),
        free,
        total,
        used_at_open: 0,
        arena: false,
        tuning: None,
        cap,
        host_expert_layers: 0,
    })
}

/// (MemAvailable, MemTotal) in bytes.
fn meminfo() -> Result<(u64, u64)> {
    let s = std::fs::read_to_string("/proc/meminfo")?;
    let field = |k: &str| -> Option<u64> {
        let l = s.lines().find(|l| l.starts_with(k))?;
        l.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
    };
    Ok((field("MemAvailable:").context("no MemAvailable")?, field("MemTotal:").context("no MemTotal")?))
}
