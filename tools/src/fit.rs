//! `lode fit`: will this model run here, at this context, before loading anything?
//!
//! Maps the file (which copies nothing), reads the architecture, and adds up the device
//! bytes a run needs: the weights in the layouts the device's kernels read (through the
//! same layout policy the weight cache uses, so the answer cannot drift from what a run
//! allocates), the f16 KV cache for the context, and an estimate of activation scratch.
//! The total is compared with the device's free memory (the GPU driver's, or the CPU's
//! `MemAvailable`), and the largest context that would fit is reported.

use std::path::PathBuf;

use anyhow::{Context, Result};
use lode_runtime::backend::gpu::driver::{self, Api, DevAttr};
use lode_runtime::backend::DeviceKind;
use lode_runtime::model::Model;
use lode_runtime::weights::budget::human;
use lode_runtime::weights::layout::{self, DeviceClass, Layout};
use lode_runtime::weights::Residency;

use crate::common;

/// Arguments of `lode fit`.
#[derive(clap::Args, Debug)]
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
    /// Weight residency to plan for (default: the device's, as a run would pick).
    #[arg(long, value_name = "MODE")]
    pub residency: Option<Residency>,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Memory of the device a run would use.
struct Target {
    name: String,
    class: DeviceClass,
    unified: bool,
    free: u64,
    total: u64,
}

/// Headroom for kernels' own buffers, graphs and staging on a GPU.
const GPU_MARGIN: u64 = 64 << 20;

pub fn run(args: Args) -> Result<()> {
    let path = common::resolve_model(args.model.as_deref())?;
    let file = lode_runtime::gguf::GgufFile::open(&path).with_context(|| format!("cannot open model {}", path.display()))?;
    let file = std::sync::Arc::new(file);
    let model = Model::load(file.clone()).with_context(|| format!("cannot read model {}", path.display()))?;
    let target = target(args.device)?;
    let residency = match target.class {
        DeviceClass::Cpu => args.residency.unwrap_or(Residency::Mapped),
        DeviceClass::Gpu => Residency::resolve(args.residency, target.unified).map_err(anyhow::Error::msg)?,
    };
    let c = &model.cfg;

    // Weights, per layout, through the cache's own policy.
    let mut per_layout: std::collections::BTreeMap<String, u64> = Default::default();
    let (mut weights, mut in_place, mut n_tensors) = (0u64, 0u64, 0usize);
    for id in model.weight_ids() {
        let w = model.w(id);
        let l = layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), target.class);
        let bytes = l.bytes(w.ty(), w.n_rows(), w.row_len(), w.data().len()).with_context(|| format!("weight `{}`", w.name()))? as u64;
        n_tensors += 1;
        // Mapped: the stored layout is read from the file in place (no device bytes) —
        // except on the CPU, where the mapping itself is what occupies RAM.
        if residency == Residency::Mapped && l == Layout::Stored && target.class == DeviceClass::Gpu {
            in_place += bytes;
            continue;
        }
        weights += bytes;
        *per_layout.entry(format!("{} ({})", l.name(w.ty()), w.ty())).or_default() += bytes;
    }

    let ctx = args.ctx.unwrap_or_else(|| c.n_ctx_train.min(lode_runtime::engine::DEFAULT_CTX_CAP)).max(1);
    // f16 K and V for every layer and slot.
    let kv_per_token = (c.n_layer * c.n_head_kv * (c.head_dim_k + c.head_dim_v) * 2) as u64;
    let scratch = |ctx: usize| -> u64 {
        let n = args.batch_size.min(ctx).max(1);
        // The model's activation buffers (model::Scratch), f32.
        let per_tok = 3 * c.n_embd + c.n_head * (c.head_dim_k + c.head_dim_v) + c.n_head_kv * (c.head_dim_k + c.head_dim_v) + 2 * c.n_ff;
        let act = (n * per_tok + 16 * (c.n_embd + c.n_vocab)) as u64 * 4;
        match target.class {
            // q8_1 copy of the widest activation (36 bytes per 32 values), plus headroom.
            DeviceClass::Gpu => act + (n * c.n_embd.max(c.n_ff)).div_ceil(32) as u64 * 36 + GPU_MARGIN,
            DeviceClass::Cpu => act,
        }
    };
    let need = weights + kv_per_token * ctx as u64 + scratch(ctx);
    let fits = need <= target.free;
    // Largest context: scratch grows with the chunk only up to the batch size.
    let fixed = weights + scratch(args.batch_size);
    let max_ctx = target.free.saturating_sub(fixed) / kv_per_token.max(1);

    if args.json {
        let j = serde_json::json!({
            "model": path.display().to_string(),
            "device": target.name,
            "residency": residency,
            "ctx": ctx,
            "weights_bytes": weights,
            "weights_per_layout": per_layout,
            "weights_in_place_bytes": in_place,
            "weight_tensors": n_tensors,
            "kv_bytes": kv_per_token * ctx as u64,
            "kv_bytes_per_token": kv_per_token,
            "scratch_bytes": scratch(ctx),
            "need_bytes": need,
            "free_bytes": target.free,
            "total_bytes": target.total,
            "fits": fits,
            "max_ctx": max_ctx,
            "n_ctx_train": c.n_ctx_train,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    println!("{name} on {}, residency {residency}, context {ctx}", target.name);
    println!("  weights   {:>11}  ({n_tensors} tensors)", human(weights));
    for (l, b) in &per_layout {
        println!("            {:>11}  {l}", human(*b));
    }
    if in_place > 0 {
        println!("  mapped    {:>11}  read in place from the file (pinned host memory, no device copy)", human(in_place));
    }
    println!("  KV cache  {:>11}  (f16: {} layers × {ctx} × {} kv heads × {})", human(kv_per_token * ctx as u64), c.n_layer, c.n_head_kv, c.head_dim_k + c.head_dim_v);
    println!("  scratch   {:>11}  (estimate: activations of {}-token chunks{})", human(scratch(ctx)), args.batch_size.min(ctx), if target.class == DeviceClass::Gpu { ", q8_1 copy, 64 MiB headroom" } else { "" });
    println!("  needed    {:>11}", human(need));
    println!("  free      {:>11}  of {}", human(target.free), human(target.total));
    let trained = if max_ctx > c.n_ctx_train as u64 { format!(" (the model was trained for {})", c.n_ctx_train) } else { String::new() };
    if fits {
        println!("fits: yes; the largest context that fits is {max_ctx}{trained}");
    } else if max_ctx == 0 {
        println!("fits: no; the weights alone need {} more than is free", human(fixed.saturating_sub(target.free)));
    } else {
        println!("fits: no ({} short); the largest context that fits is {max_ctx}{trained}", human(need - target.free));
    }
    Ok(())
}

/// The device `--device` names and its free memory, without loading kernels.
fn target(kind: DeviceKind) -> Result<Target> {
    let ordinal = std::env::var("LODE_DEVICE_ORDINAL").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let apis: &[Api] = match kind {
        DeviceKind::Cpu => &[],
        DeviceKind::Cuda => &[Api::Cuda],
        DeviceKind::Hip => &[Api::Hip],
        DeviceKind::Auto => &[Api::Cuda, Api::Hip],
    };
    for &api in apis {
        match driver::open(api, ordinal) {
            Ok(d) => {
                let (free, total) = d.mem_info().with_context(|| format!("{api}: cannot read device memory"))?;
                let unified = d.attribute(DevAttr::Integrated).map(|v| v != 0).unwrap_or(false);
                let info = d.info();
                return Ok(Target { name: format!("{api}:{ordinal} ({})", info.name), class: DeviceClass::Gpu, unified, free, total });
            }
            Err(e) if kind != DeviceKind::Auto => return Err(e).with_context(|| format!("cannot open {api} device {ordinal}")),
            Err(_) => {}
        }
    }
    let (free, total) = meminfo().context("cannot read /proc/meminfo")?;
    Ok(Target { name: "cpu".into(), class: DeviceClass::Cpu, unified: true, free, total })
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
