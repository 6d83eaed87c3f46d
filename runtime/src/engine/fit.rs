//! Will a model fit, and with what context? The device bytes a run needs, counted as
//! the backend allocates them, before anything is allocated: `lode fit` prints this, and
//! the engine refuses a model that would not fit ([`Estimate::refusal`]) so that nothing
//! fails midway.
//!
//! - Weights: every weight the forward pass reads, in the layout the device's kernels
//!   read ([`layout::canonical`], the cache's own policy), 256-byte placed in one arena
//!   rounded once to 2 MiB (else a driver page each); none for `mapped` weights a GPU
//!   reads in place. On the CPU the mapping itself occupies memory, so it counts.
//! - KV cache: exactly what `alloc_kv` takes: every layer a full-context cache, but a
//!   sliding-window layer a window-sized one ([`window_kv`]: window + chunk + 64 slots;
//!   full-context with `--swa-full`), K and V each in its `-ctk` / `-ctv` type (f16, f32, or Q8_0 / Q4_0 blocks: 34 / 18 bytes per 32
//!   values); on the GPU one allocation per sequence, each K/V plane 256-byte rounded.
//!   Beside the chosen types, the largest context for f16, q8_0 and q4_0 K and V
//!   ([`Estimate::max_ctx_by_kv`]), which the refusal names when a smaller type fits.
//! - Recurrent state (qwen35): every sequence's conv and delta-rule state of each recurrent
//!   layer (f32, one allocation per layer and state), which no context size changes; the
//!   KV cache then counts the attention layers only. Speculation adds each sequence's
//!   rewind log ([`rewind_log_bytes`]: a checkpoint of every state and the logged rows),
//!   allocated at the first verify chunk; `lode fit` counts it with `--draft-max`.
//! - A kept multi-token-prediction block (`Model::mtp`, `--spec-type draft-mtp`): its
//!   weights among the weights, its one-layer full-context cache per sequence in the KV
//!   cache, its hidden rows in the scratch.
//! - Scratch: the model's activation buffers (`model::Scratch`), and on a GPU the q8_1
//!   activation copy, prefill's operands (through the vendor BLAS for chunks of
//!   `blas_min` tokens or more: the f16 activations, the transient f16 weight slab, the
//!   workspace and the library's own memory; else the GEMM's f32 activation values) and
//!   what launching costs.
//!
//! A GPU's driver figure during the run (what `nvidia-smi` shows, and the peak
//! `--memory-report` samples) is predicted as [`MemoryTarget::used_at_open`] + the need.

use std::collections::BTreeMap;

use crate::backend::gpu::family::{dequant, kvq_attn};
use crate::backend::gpu::plan;
use crate::backend::gpu::tuning::Tuning;
use crate::backend::memory::MemoryTarget;
use crate::backend::kv::kv_bytes_per_token;
use crate::backend::{KvSpec, KvType, KvTypes, SwaKv};
use crate::model::{Config, Model};
use crate::quant::GgmlType;
use crate::weights::budget::human;
use crate::weights::layout::{self, DeviceClass, Layout};
use crate::weights::Residency;

/// What a run launches beyond its allocations (functions loaded on first launch, graph
/// instances, staging): on the H200, Qwen3-4B pp2048 + tg128 with `LODE_DEBUG=mem`, the
/// driver's used figure was within ~10 MiB of the context after open plus lode's
/// page-rounded allocations (BENCHMARKS.md, residency).
const GPU_LAUNCH_OVERHEAD: u64 = 8 << 20;

/// What opening the vendor BLAS adds beyond lode's own allocations: on the H200 (cuBLAS
/// 13.1), qwen3-4b pp2048 + tg128, the driver's peak rose 152 MiB with the BLAS on while
/// lode's peak allocations rose 86 MiB (BENCHMARKS.md).
const BLAS_LIB_OVERHEAD: u64 = 66 << 20;

/// The driver's allocation page: `cuMemAlloc` rounds each allocation up to it.
const GPU_PAGE: u64 = 2 << 20;

fn round_up(x: u64, to: u64) -> u64 {
    x.div_ceil(to) * to
}

/// A run's shape: context per sequence, prompt chunk, sequences, KV types.
#[derive(Clone, Copy, Debug)]
pub struct RunShape {
    pub ctx: usize,
    pub batch: usize,
    pub n_seq: usize,
    pub kv_type: KvTypes,
    /// Full-context K/V for the sliding-window layers too (`--swa-full`).
    pub swa_full: bool,
}

/// The sliding-window layers' window-sized cache for a context of `n_ctx` written in
/// chunks of at most `chunk` positions (`None`: no such layer, or it would be no smaller).
pub fn window_kv(c: &Config, n_ctx: usize, chunk: usize) -> Option<SwaKv> {
    let windowed: Vec<bool> = (0..c.n_layer).filter(|&l| !c.recurrent_layers[l]).map(|l| c.swa_layers[l]).collect();
    SwaKv::new(c.n_swa, chunk, n_ctx, &windowed)
}

/// The bytes a run needs on a device.
#[derive(Clone, Debug)]
pub struct Estimate {
    pub shape: RunShape,
    /// Weight bytes on the device (as allocated).
    pub weights: u64,
    /// Bytes per layout name (with the type), as stored.
    pub per_layout: BTreeMap<String, u64>,
    /// Weights a GPU reads in place from the mapped file (no device bytes).
    pub in_place: u64,
    /// Of those, the expert tensors of the host expert layers
    /// (`MemoryTarget::host_expert_layers`), computed by the CPU.
    pub host_experts: u64,
    pub n_tensors: usize,
    /// KV cache of every sequence.
    pub kv: u64,
    /// KV bytes per token of context (all sequences; the full-context layers only where
    /// the sliding-window layers keep a window-sized cache).
    pub kv_per_token: u64,
    /// The sliding-window layers' window-sized cache at this context, if any.
    pub swa: Option<SwaKv>,
    /// Recurrent state of every sequence (qwen35; 0 for other models).
    pub recurrent: u64,
    /// Activations, launch overhead and, for a quantized KV cache on a GPU, the prefill's
    /// f16 rows (`kvq_attn::prefill_scratch_bytes`).
    pub scratch: u64,
    /// weights + kv + recurrent + scratch.
    pub need: u64,
    /// The device: free and total (a cap's where set), used at open, name.
    pub free: u64,
    pub total: u64,
    pub used_at_open: u64,
    pub device: String,
    pub cap: Option<u64>,
    pub gpu: bool,
    /// Largest context whose need fits the free memory (before the training-context cap).
    pub max_ctx_memory: u64,
    /// The same for K and V both f16, q8_0 and q4_0 (before the training-context cap).
    pub max_ctx_by_kv: Vec<(KvType, u64)>,
    pub n_ctx_train: usize,
}

impl Estimate {
    pub fn fits(&self) -> bool {
        self.need <= self.free
    }
    /// The largest context that fits, capped at the model's training context.
    pub fn max_ctx(&self) -> u64 {
        self.max_ctx_memory.min(self.n_ctx_train as u64)
    }
    /// The driver's used memory during the run (GPU): what it held at open + the need.
    pub fn predicted_device_used(&self) -> Option<u64> {
        self.gpu.then_some(self.used_at_open + self.need)
    }
    /// Fixed bytes (weights and scratch at the full chunk): what no context size changes.
    pub fn fixed(&self) -> u64 {
        self.need - self.kv
    }

    /// Why the run cannot start here, naming what would fit (`None`: it fits).
    pub fn refusal(&self) -> Option<String> {
        if self.fits() {
            return None;
        }
        let s = &self.shape;
        let cap = if self.cap.is_some() { " (--device-memory)" } else { "" };
        let mut msg = format!(
            "the model does not fit on {}: it needs {} (weights {}, KV cache {} for {} × {} tokens, scratch {}) but {} of {}{cap} are free",
            self.device,
            human(self.need),
            human(self.weights),
            human(self.kv),
            s.n_seq,
            s.ctx,
            human(self.scratch),
            human(self.free),
            human(self.total)
        );
        let max = self.max_ctx();
        // A smaller KV type that holds the asked context.
        let smaller = self.max_ctx_by_kv.iter().find(|&&(t, m)| {
            t.bytes(32) < s.kv_type.k.bytes(32).max(s.kv_type.v.bytes(32)) && m >= s.ctx as u64
        });
        if let Some(&(t, _)) = smaller {
            msg += &format!("; -ctk {t} -ctv {t} holds this context");
        }
        if max >= 1 && s.n_seq > 1 {
            msg += &format!("; the largest context that fits is {max} tokens per sequence (lode serve: -c {} for its {} slots)", max * s.n_seq as u64, s.n_seq);
        } else if max >= 1 {
            msg += &format!("; the largest context that fits is -c {max}");
        } else {
            // Not even one token: the weights must shrink (or stay in host memory).
            let room = self.free.saturating_sub(self.need - self.weights);
            msg += &format!(
                "; the weights alone need {} where at most {} can go next to a {}-token context",
                human(self.weights),
                human(room),
                s.ctx
            );
            if self.gpu {
                msg += " (--residency mapped reads the stored weights from host memory instead; or a smaller quantization)";
            }
        }
        Some(msg)
    }
}

/// The decode rows a mixed step (`BatchEngine::step_mixed`) of an engine of `n_seq`
/// sequences may carry (every sequence but the prefilling one), or `None` where the engine
/// does not mix (one sequence, recurrent layers, an MTP block kept, gemma4's layers of
/// their own head shapes: the decode rows' buffers have the model's one width).
pub(crate) fn mix_rows(model: &Model, n_seq: usize) -> Option<usize> {
    let c = &model.cfg;
    (n_seq > 1 && c.recurrent.is_none() && model.mtp.is_none() && c.alt_attn.is_none()).then_some(n_seq - 1)
}

/// For a mixture-of-experts model that does not fit a GPU: the fewest layers whose
/// experts must stay in host memory (`--n-cpu-moe`) for the run to fit, if any number does.
pub fn fewest_host_expert_layers(model: &Model, target: &MemoryTarget, shape: RunShape) -> Option<usize> {
    host_expert_layers_within(model, target, shape, None)
}

/// [`fewest_host_expert_layers`] under a weight budget too (`--weight-budget`: the device
/// copies of the weights at most `budget` bytes): `None` when the run fits as it is (or
/// no count makes it fit, or the model has no experts, or the target is no GPU). The
/// engine places the experts by it (`BatchEngine::new`); `lode fit` names it.
pub fn host_expert_layers_within(model: &Model, target: &MemoryTarget, shape: RunShape, budget: Option<u64>) -> Option<usize> {
    if model.cfg.experts.is_none() || target.class != DeviceClass::Gpu {
        return None;
    }
    let fits = |n: usize| {
        let t = MemoryTarget { host_expert_layers: n, ..target.clone() };
        estimate(model, &t, shape).is_ok_and(|e| e.fits() && budget.is_none_or(|b| e.weights <= b))
    };
    if fits(target.host_expert_layers) {
        return None;
    }
    // Fitting only gets easier with more host layers: the first that fits.
    let (mut lo, mut hi) = (target.host_expert_layers, model.cfg.n_layer);
    if !fits(hi) {
        return None;
    }
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// The bytes `model` needs on `target` for a run of `shape`.
pub fn estimate(model: &Model, target: &MemoryTarget, shape: RunShape) -> Result<Estimate, crate::quant::QuantError> {
    let c = &model.cfg;
    let gpu = target.class == DeviceClass::Gpu;
    let default_tuning;
    let tuning = match &target.tuning {
        Some(t) => t,
        None => {
            default_tuning = Tuning::default();
            &default_tuning
        }
    };
    let mut per_layout: BTreeMap<String, u64> = BTreeMap::new();
    let (mut weights, mut in_place, mut host_experts, mut n_tensors, mut max_slab) = (0u64, 0u64, 0u64, 0usize, 0u64);
    for id in model.weight_ids() {
        let w = model.w(id);
        let l = layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), target.class);
        let bytes = l.bytes(w.ty(), w.n_rows(), w.row_len(), w.data().len())? as u64;
        n_tensors += 1;
        if gpu && w.n_rows() > 1 && dequant::supports(w.ty(), l) {
            max_slab = max_slab.max(dequant::slab_bytes_for(w.n_rows(), w.row_len(), tuning.blas_slab_bytes) as u64);
        }
        let host_expert = crate::backend::moe::expert_tensor_layer(w.name()).is_some_and(|l| l < target.host_expert_layers);
        if gpu && (host_expert || (target.residency == Residency::Mapped && l == Layout::Stored)) {
            in_place += bytes;
            host_experts += if host_expert { bytes } else { 0 };
            continue;
        }
        weights += if gpu && !target.arena { round_up(bytes, GPU_PAGE) } else { round_up(bytes, 256) };
        *per_layout.entry(format!("{} ({})", l.name(w.ty()), w.ty())).or_default() += bytes;
    }
    if gpu && target.arena {
        weights = round_up(weights, GPU_PAGE);
    }

    let n_seq = shape.n_seq.max(1) as u64;
    let ctx = shape.ctx.max(1);
    let kv_layers = c.kv_layers();
    // The cache's rows: every layer at the widest layer's heads (gemma4: `Config::kv_heads`).
    let (kh, kv_alt) = c.kv_heads();
    // The MTP block's cache: one more full-context layer, its own allocation.
    let mtp_layers = model.mtp.is_some() as usize;
    let swa_at = |ctx: usize| if shape.swa_full { None } else { window_kv(c, ctx, shape.batch.min(ctx).max(shape.n_seq).max(1)) };
    // Per token of context: the layers whose cache grows with it.
    let per_token = |ty: KvTypes, ctx: usize| {
        let swa = swa_at(ctx);
        let spec = KvSpec { n_layer: kv_layers, n_ctx: ctx, n_kv_head: kh.n_head_kv, head_dim_k: kh.head_dim_k, head_dim_v: kh.head_dim_v, ty, swa, alt: kv_alt };
        let full: u64 = (0..kv_layers).filter(|&l| swa.is_none_or(|w| !w.is_windowed(l))).map(|l| spec.row_bytes(l) as u64).sum();
        (full + kv_bytes_per_token(ty, mtp_layers, kh.n_head_kv, kh.head_dim_k, kh.head_dim_v)) * n_seq
    };
    let kv_per_token = per_token(shape.kv_type, ctx);
    let kv_of = |ty: KvTypes, ctx: usize| -> u64 {
        let spec = KvSpec { n_layer: kv_layers, n_ctx: ctx, n_kv_head: kh.n_head_kv, head_dim_k: kh.head_dim_k, head_dim_v: kh.head_dim_v, ty, swa: swa_at(ctx), alt: kv_alt };
        let row = |t: KvType, d: usize| t.bytes(kh.n_head_kv * d) as u64;
        if gpu {
            let plane = |t: KvType, d: usize, slots: usize| round_up(slots as u64 * row(t, d), 256);
            let layers: u64 = (0..kv_layers).map(|l| plane(ty.k, kh.head_dim_k, spec.slots(l)) + plane(ty.v, kh.head_dim_v, spec.slots(l))).sum();
            // (The GPU refuses per-layer head shapes: `gpu::ALT_HEADS_NOT_YET`.)
            let mtp = mtp_layers as u64 * round_up(plane(ty.k, kh.head_dim_k, ctx) + plane(ty.v, kh.head_dim_v, ctx), GPU_PAGE);
            n_seq * (round_up(layers, GPU_PAGE) + mtp)
        } else {
            let mtp = (mtp_layers * ctx) as u64 * (row(ty.k, kh.head_dim_k) + row(ty.v, kh.head_dim_v));
            n_seq * ((0..kv_layers).map(|l| spec.slots(l) as u64 * spec.row_bytes(l) as u64).sum::<u64>() + mtp)
        }
    };
    let kv = |ctx: usize| kv_of(shape.kv_type, ctx);
    // A quantized side's prefill on a GPU reads its rows through one f16 scratch of the
    // largest layer's slots (`kvq_attn::prefill_scratch_bytes`), shared by every sequence:
    // scratch that grows with the context.
    let kvq_scratch = |ty: KvTypes, ctx: usize| -> u64 {
        let spec = KvSpec { n_layer: kv_layers, n_ctx: ctx, n_kv_head: kh.n_head_kv, head_dim_k: kh.head_dim_k, head_dim_v: kh.head_dim_v, ty, swa: swa_at(ctx), alt: kv_alt };
        let bytes = kvq_attn::prefill_scratch_bytes(&spec) as u64;
        if gpu && bytes > 0 { round_up(bytes, GPU_PAGE) } else { 0 }
    };
    let scratch = |ctx: usize| -> u64 {
        let n = shape.batch.min(ctx).max(shape.n_seq).max(1);
        // A MoE model has no dense FFN buffers but the experts' (`backend::MoeScratch`).
        let ff = if c.experts.is_some() && !c.dense_with_experts { 1 } else { c.n_ff };
        let (wq, wk, wv, wo) = c.max_widths();
        let mut bufs = vec![
            n * c.n_embd,
            n * c.n_embd,
            n * c.n_embd,
            n * wq,
            n * wk,
            n * wv,
            n * wo,
            n * ff,
            n * ff,
            crate::model::OUT_ROWS_MAX * c.n_embd,
            crate::model::OUT_ROWS_MAX * c.n_vocab,
        ];
        if c.attn_out_gate {
            bufs.extend([2 * n * c.n_head * c.head_dim_k, n * c.n_head * c.head_dim_k]);
        }
        if let Some(d) = c.recurrent {
            bufs.extend([n * d.channels(), n * d.value_dim(), n * d.n_v_heads, n * d.n_v_heads, n * d.value_dim()]);
            // qwen3next's packed projections' outputs (`HybridScratch::packed`).
            if model.layers.iter().any(|l| l.delta.as_ref().is_some_and(|w| w.packed())) {
                bufs.extend([n * (d.channels() + d.value_dim()), n * 2 * d.n_v_heads]);
            }
        }
        if model.layers.iter().any(|l| l.shared.is_some()) {
            bufs.extend([n * c.n_ff_shared, n * c.n_ff_shared, n * c.n_embd, n]);
        }
        if let Some(x) = c.experts {
            bufs.extend(crate::backend::MoeScratch::lens(n, c.n_embd, x.n_expert, x.n_ff, x.n_used));
            if c.dense_with_experts {
                // gemma4: the experts' and the router's inputs (`model/gemma4.rs`).
                bufs.extend([n * c.n_embd, n * c.n_embd]);
            }
        }
        if let Some(d) = mix_rows(model, shape.n_seq) {
            // A mixed step's decode rows moved for their attention (`BatchEngine::step_mixed`).
            bufs.extend([d * c.n_head * c.head_dim_k, d * c.n_head_kv * c.head_dim_k, d * c.n_head_kv * c.head_dim_v, d * c.n_head * c.head_dim_v]);
        }
        if model.mtp.is_some() {
            // `MtpBufs` (hidden input, concatenation, a zero row), then per sequence
            // `MtpState`'s rows.
            bufs.extend([n * c.n_embd, 2 * n * c.n_embd, c.n_embd]);
            for _ in 0..n_seq {
                bufs.extend([n * c.n_embd, c.n_embd]);
            }
        }
        if !gpu {
            return bufs.iter().map(|&v| v as u64 * 4).sum();
        }
        let act: u64 = bufs.iter().map(|&v| round_up(v as u64 * 4, GPU_PAGE)).sum();
        // The q8_1 copy of the widest activation (36 bytes per 32 values), grown to a
        // power of two, and what launching costs.
        let n_ff = c.experts.map_or(c.n_ff, |x| x.n_ff);
        let q8 = ((n * c.n_embd.max(n_ff)).div_ceil(32) as u64 * 36).next_power_of_two();
        let widest = c.n_embd.max(n_ff).max(if c.dense_with_experts { c.n_ff } else { 0 }).max(wo);
        act + round_up(q8, GPU_PAGE) + prefill_scratch(n, widest, max_slab, tuning) + GPU_LAUNCH_OVERHEAD
    };
    // Each recurrent layer's two states, per sequence (one allocation each on a GPU).
    let recurrent = match c.recurrent {
        Some(d) if gpu => {
            let n_rec = (c.n_layer - kv_layers) as u64;
            n_seq * n_rec * (round_up(d.conv_state_len() as u64 * 4, GPU_PAGE) + round_up(d.ssm_state_len() as u64 * 4, GPU_PAGE))
        }
        _ => n_seq * c.recurrent_state_len() as u64 * 4,
    };
    let need = weights + kv(ctx) + recurrent + scratch(ctx) + kvq_scratch(shape.kv_type, ctx);
    // Largest context: scratch grows with the chunk only up to the batch size.
    let fixed = weights + recurrent + scratch(shape.batch.max(1));
    // The bound without rounding, then the largest context whose rounded KV fits below it
    // (the GPU rounds each sequence's cache to the driver's page).
    let largest = |ty: KvTypes| -> u64 {
        // Past the window-sized layers' size only the full layers grow (a large context's rate).
        let (mut lo, mut hi) = (0u64, target.free.saturating_sub(fixed) / per_token(ty, 1 << 30).max(1));
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if fixed + kv_of(ty, mid as usize) + kvq_scratch(ty, mid as usize) <= target.free {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        lo
    };
    let max_ctx_memory = largest(shape.kv_type);
    let max_ctx_by_kv = [KvType::F16, KvType::Q8_0, KvType::Q4_0]
        .into_iter()
        .filter(|t| KvTypes::from(*t).unsupported(c.head_dim_k, c.head_dim_v).is_none())
        .map(|t| (t, largest(t.into())))
        .collect();
    Ok(Estimate {
        shape: RunShape { ctx, ..shape },
        weights,
        per_layout,
        in_place,
        host_experts,
        n_tensors,
        kv: kv(ctx),
        kv_per_token,
        swa: swa_at(ctx),
        recurrent,
        scratch: scratch(ctx) + kvq_scratch(shape.kv_type, ctx),
        need,
        free: target.free,
        total: target.total,
        used_at_open: target.used_at_open,
        device: target.name.clone(),
        cap: target.cap,
        gpu,
        max_ctx_memory,
        max_ctx_by_kv,
        n_ctx_train: c.n_ctx_train,
    })
}

/// The rewind logs speculation allocates for a model with recurrent layers (0 for
/// others): per sequence and recurrent layer a checkpoint of its conv and delta-rule
/// state and `rows` logged rows of its `attn_qkv`, `ssm_beta` and `ssm_alpha` inputs
/// (`model/rewind.rs`; `rows` is the longest verify chunk, `--draft-max` + 1), f32, one
/// allocation each on a GPU. Qwen3.5-27B, 17 rows: 48 layers × 3.8 MiB ≈ 183 MiB.
pub fn rewind_log_bytes(model: &Model, gpu: bool, n_seq: usize, rows: usize) -> u64 {
    let c = &model.cfg;
    let Some(d) = c.recurrent else { return 0 };
    let n_rec = (c.n_layer - c.kv_layers()) as u64;
    let lens = [d.conv_state_len(), d.ssm_state_len(), rows * d.channels(), rows * d.n_v_heads, rows * d.n_v_heads];
    let per_layer: u64 = lens.iter().map(|&l| if gpu { round_up(l as u64 * 4, GPU_PAGE) } else { l as u64 * 4 }).sum();
    n_seq.max(1) as u64 * n_rec * per_layer
}

/// Device scratch of a prefill chunk of `n` tokens whose widest matmul input has `k`
/// values: through the BLAS (`n` ≥ the tuning's `blas_min`): the f16 activation operand,
/// the weight slab (`max_slab`), the workspace and the library; else through lode's GEMM
/// (from `gemm_min`): the quantized activations' f32 values. Each scratch grows to a
/// power of two (`Scratch`), then to the driver's page.
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
