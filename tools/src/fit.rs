//! `lode fit`: will this model run here, at this context, before loading anything?
//!
//! Maps the file (which copies nothing), reads the architecture, and adds up the device
//! bytes a run needs: the weights in the layouts the device's kernels read (through the
//! same layout policy the weight cache uses, so the answer cannot drift from what a run
//! allocates), the f16 KV cache for the context, and an estimate of activation scratch.
//! The total is compared with the device's free memory (the GPU driver's, or the CPU's
//! `MemAvailable`), and the largest context that would fit is reported.
//! On a GPU the scratch includes prefill's operands: through the vendor BLAS (chunks of
//! `blas_min` tokens or more) the f16 activations, the transient f16 weight slab(s),
//! the BLAS workspace and the library's own memory; else the GEMM's f32 activation values.
//!
//! On a GPU the device is opened as a run opens it (context, kernel modules, trimmed
//! context limits), so "free" is what a run's own allocations can have, and the bytes are
//! counted as the driver hands them out: weights in one arena (rounded once to its 2 MiB
//! granularity), the KV cache as one allocation, each activation buffer rounded to the
//! driver's page, plus what launching costs (functions loaded at first launch, the
//! thread stack grown for the largest frame, graph instances). Beside it: the device
//! memory a run will show in `nvidia-smi` (what this process holds after opening, plus
//! the run's allocations).

use lode_runtime::backend::gpu::family::dequant;
use std::path::PathBuf;

use anyhow::{Context, Result};
use lode_runtime::backend::gpu::driver::{Api, DevAttr};
use lode_runtime::backend::gpu::tuning::Tuning;
use lode_runtime::backend::gpu::{plan, GpuDevice};
use lode_runtime::quant::GgmlType;
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
    /// GPU: device memory in use once the device is open as a run opens it.
    used_at_open: u64,
    /// GPU: weights share one arena (virtual memory management) instead of an
    /// allocation each.
    arena: bool,
}

/// What a run's launches add beyond its allocations (functions loaded on first launch,
/// graph instances, staging): on the H200, Qwen3-4B pp2048 + tg128 with
/// `LODE_DEBUG=mem`, the driver's used figure was within ~10 MiB of the context after
/// open plus lode's page-rounded allocations (the one graph instance: 2 MiB; kernel
/// modules load lazily and added nothing measurable). BENCHMARKS.md, residency.
const GPU_LAUNCH_OVERHEAD: u64 = 8 << 20;

/// What opening the vendor BLAS adds beyond lode's own allocations (handle, the library's
/// buffers and kernels loaded at first use): on the H200 (cuBLAS 13.1), qwen3-4b pp2048 +
/// tg128, the driver's peak rose 152 MiB with the BLAS on while lode's peak allocations
/// rose 86 MiB (BENCHMARKS.md).
const BLAS_LIB_OVERHEAD: u64 = 66 << 20;

/// Device scratch of a prefill chunk of `n` tokens whose widest matmul input has `k`
/// values: through the BLAS (`n` ≥ the tuning's `blas_min`): the f16 activation operand, the
/// weight slab (`max_slab`), the workspace and the library; else through lode's GEMM (from
/// `gemm_min`): the quantized activations' f32 values. Each scratch grows to a power
/// of two (`Scratch`), then to the driver's page.
fn prefill_scratch(n: usize, k: usize, max_slab: u64, t: &Tuning) -> u64 {
    let pow2 = |b: u64| round_up(b.next_power_of_two().max(4096), GPU_PAGE);
    if n < 2 {
        return 0;
    }
    if t.blas && n >= t.blas_min_tokens && max_slab > 0 {
        pow2((n * k * 2) as u64) + pow2(max_slab) + round_up(dequant::WORKSPACE_BYTES as u64, GPU_PAGE) + BLAS_LIB_OVERHEAD
    } else if plan::gemm_tile(&plan::Weight { ty: GgmlType::Q4_K, layout: Layout::Stored, rows: 1, k }, n, t).is_some() {
        pow2((n * k * 4) as u64)
    } else {
        0
    }
}

/// The driver's allocation page: `cuMemAlloc` rounds each allocation up to it.
const GPU_PAGE: u64 = 2 << 20;

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

pub fn run(args: Args) -> Result<()> {
    let path = common::resolve_model(args.model.as_deref())?;
    let file = std::sync::Arc::new(common::open_gguf_plain(&path, "cannot open model")?);
    let model = Model::load(file.clone()).with_context(|| format!("cannot read model {}", path.display()))?;
    let target = target(args.device)?;
    let residency = match target.class {
        DeviceClass::Cpu => args.residency.unwrap_or(Residency::Mapped),
        DeviceClass::Gpu => Residency::resolve(args.residency, target.unified).map_err(anyhow::Error::msg)?,
    };
    let c = &model.cfg;
    let gpu = target.class == DeviceClass::Gpu;
    let tuning = Tuning::from_env();

    // Weights, per layout, through the cache's own policy.
    let mut per_layout: std::collections::BTreeMap<String, u64> = Default::default();
    let (mut weights, mut in_place, mut n_tensors) = (0u64, 0u64, 0usize);
    // The largest transient f16 slab a prefill matmul through the BLAS needs (bounded by
    // the tuning's `blas_slab`): over every matrix weight the slab path reads.
    let mut max_slab = 0u64;
    // Bytes as the device hands them out: per weight (256-byte placement in the arena,
    // else one driver page-rounded allocation each); the arena once to its granularity.
    for id in model.weight_ids() {
        let w = model.w(id);
        let l = layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), target.class);
        let bytes = l.bytes(w.ty(), w.n_rows(), w.row_len(), w.data().len()).with_context(|| format!("weight `{}`", w.name()))? as u64;
        n_tensors += 1;
        if w.n_rows() > 1 && dequant::supports(w.ty(), l) {
            max_slab = max_slab.max(dequant::slab_bytes_for(w.n_rows(), w.row_len(), tuning.blas_slab_bytes) as u64);
        }
        // Mapped: the stored layout is read from the file in place (no device bytes) —
        // except on the CPU, where the mapping itself is what occupies RAM.
        if residency == Residency::Mapped && l == Layout::Stored && target.class == DeviceClass::Gpu {
            in_place += bytes;
            continue;
        }
        weights += if target.class == DeviceClass::Gpu && !target.arena { round_up(bytes, GPU_PAGE) } else { round_up(bytes, 256) };
        *per_layout.entry(format!("{} ({})", l.name(w.ty()), w.ty())).or_default() += bytes;
    }

    if gpu && target.arena {
        weights = round_up(weights, GPU_PAGE);
    }
    let ctx = args.ctx.unwrap_or_else(|| c.n_ctx_train.min(lode_runtime::engine::DEFAULT_CTX_CAP)).max(1);
    // f16 K and V for every layer and slot.
    let kv_per_token = (c.n_layer * c.n_head_kv * (c.head_dim_k + c.head_dim_v) * 2) as u64;
    let kv = |ctx: usize| -> u64 {
        let b = kv_per_token * ctx as u64;
        if gpu { round_up(b, GPU_PAGE) } else { b }
    };
    let scratch = |ctx: usize| -> u64 {
        let n = args.batch_size.min(ctx).max(1);
        // The model's activation buffers (model::Scratch), f32, one allocation each; a MoE
        // model has no dense FFN buffers but the experts' (backend::MoeScratch).
        let ff = if c.experts.is_some() { 1 } else { c.n_ff };
        let mut bufs = vec![
            n * c.n_embd,
            n * c.n_embd,
            n * c.n_embd,
            n * c.n_head * c.head_dim_k,
            n * c.n_head_kv * c.head_dim_k,
            n * c.n_head_kv * c.head_dim_v,
            n * c.n_head * c.head_dim_v,
            n * ff,
            n * ff,
            16 * c.n_embd,
            16 * c.n_vocab,
        ];
        if let Some(x) = c.experts {
            bufs.extend([n * x.n_expert, n * c.n_embd, n * x.n_ff, n * x.n_ff, n * c.n_embd, c.n_embd, x.n_used * n * c.n_embd]);
        }
        if !gpu {
            return bufs.iter().map(|&v| v as u64 * 4).sum();
        }
        let act: u64 = bufs.iter().map(|&v| round_up(v as u64 * 4, GPU_PAGE)).sum();
        // The q8_1 copy of the widest activation (36 bytes per 32 values), grown to a
        // power of two, and what launching costs.
        let n_ff = c.experts.map_or(c.n_ff, |x| x.n_ff);
        let q8 = ((n * c.n_embd.max(n_ff)).div_ceil(32) as u64 * 36).next_power_of_two();
        act + round_up(q8, GPU_PAGE) + prefill_scratch(n, c.n_embd.max(n_ff).max(c.n_head * c.head_dim_v), max_slab, &tuning) + GPU_LAUNCH_OVERHEAD
    };
    let need = weights + kv(ctx) + scratch(ctx);
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
            "kv_bytes": kv(ctx),
            "kv_bytes_per_token": kv_per_token,
            "scratch_bytes": scratch(ctx),
            "need_bytes": need,
            "free_bytes": target.free,
            "total_bytes": target.total,
            "device_used_at_open_bytes": target.used_at_open,
            "predicted_device_used_bytes": if gpu { Some(target.used_at_open + need) } else { None },
            "fits": fits,
            "max_ctx": max_ctx,
            "n_ctx_train": c.n_ctx_train,
        });
        println!("{}", serde_json::to_string_pretty(&j)?);
        return verdict(fits, ctx, &target.name);
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
    println!("  KV cache  {:>11}  (f16: {} layers × {ctx} × {} kv heads × {})", human(kv(ctx)), c.n_layer, c.n_head_kv, c.head_dim_k + c.head_dim_v);
    println!("  scratch   {:>11}  (estimate: activations of {}-token chunks{})", human(scratch(ctx)), args.batch_size.min(ctx), if gpu { ", one allocation each, q8_1 copy, prefill operands and BLAS slab, launch overhead" } else { "" });
    println!("  needed    {:>11}", human(need));
    println!("  free      {:>11}  of {}", human(target.free), human(target.total));
    if gpu {
        println!(
            "  device    {:>11}  predicted in use during the run (nvidia-smi): {} held once opened (context, kernels, other processes) + needed",
            human(target.used_at_open + need),
            human(target.used_at_open)
        );
    }
    let trained = if max_ctx > c.n_ctx_train as u64 { format!(" (the model was trained for {})", c.n_ctx_train) } else { String::new() };
    if fits {
        println!("fits: yes; the largest context that fits is {max_ctx}{trained}");
    } else if max_ctx == 0 {
        println!("fits: no; the weights alone need {} more than is free", human(fixed.saturating_sub(target.free)));
    } else {
        println!("fits: no ({} short); the largest context that fits is {max_ctx}{trained}", human(need - target.free));
    }
    verdict(fits, ctx, &target.name)
}

/// "Does not fit" is a failure of the command (exit status 1), after the report.
fn verdict(fits: bool, ctx: usize, device: &str) -> Result<()> {
    if fits {
        Ok(())
    } else {
        anyhow::bail!("the model does not fit on {device} with a context of {ctx} tokens")
    }
}

/// The device `--device` names and its free memory, opened as a run opens it.
fn target(kind: DeviceKind) -> Result<Target> {
    let ordinal = std::env::var("LODE_DEVICE_ORDINAL").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    let apis: &[Api] = match kind {
        DeviceKind::Cpu => &[],
        DeviceKind::Cuda => &[Api::Cuda],
        DeviceKind::Hip => &[Api::Hip],
        DeviceKind::Auto => &[Api::Cuda, Api::Hip],
    };
    for &api in apis {
        // Opened as a run opens it: context limits trimmed, kernel modules loaded.
        match GpuDevice::open(api, ordinal) {
            Ok(d) => {
                let (free, total) = d.mem_info().with_context(|| format!("{api}: cannot read device memory"))?;
                let unified = d.attribute(DevAttr::Integrated).map(|v| v != 0).unwrap_or(false);
                let arena = d.driver().vmm_granularity().is_some() && d.tuning().weight_arena;
                let info = d.info();
                let name = format!("{api}:{ordinal} ({})", info.name);
                return Ok(Target { name, class: DeviceClass::Gpu, unified, free, total, used_at_open: total - free, arena });
            }
            Err(e) if kind != DeviceKind::Auto => return Err(e).with_context(|| format!("cannot open {api} device {ordinal}")),
            Err(_) => {}
        }
    }
    let (free, total) = meminfo().context("cannot read /proc/meminfo")?;
    Ok(Target { name: "cpu".into(), class: DeviceClass::Cpu, unified: true, free, total, used_at_open: 0, arena: false })
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
