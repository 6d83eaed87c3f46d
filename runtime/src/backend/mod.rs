//! The op-level interface between model code and a device.
//!
//! Model code (`crate::model`) expresses a forward pass as a sequence of calls on a
//! `&mut dyn Backend`; it never names a backend. A backend owns every activation
//! buffer ([`Buf`]) and every KV cache ([`KvCache`]); model code only holds their
//! handles. Weights arrive as [`WeightRef`]s (identity + view of the mapped file); the
//! backend chooses layout and residency (the CPU reads the mapping in place, a GPU asks
//! its weight cache for `(weight, layout)`).
//!
//! Contract for every implementation:
//! - All activations are f32, row-major: a buffer of `[n_tok, n]` holds token `t`'s
//!   `n` values at `t*n..(t+1)*n`. Ops take explicit sizes; a buffer may be larger.
//! - Ops may run asynchronously; [`Backend::read`] is the synchronisation point.
//! - `x` and `out` of an element-wise op may be the same buffer (in place).
//! - Host slices passed to an op (token ids, positions) are only borrowed for the call.
//! - Every failure is a [`BackendError`], never a panic.
//!
//! [`open`] turns a `--device` choice into a backend; the GPU backends plug in there.

pub mod cached;
pub mod memory;
pub mod cpu;
pub mod gpu;
pub mod moe;
pub mod kv;
pub mod kv_rot;
mod unfused;
pub use unfused::{attention_rows_unfused, prepare_qk, rope_kv_write_unfused};
pub mod recurrent;

use crate::quant::{GgmlType, QuantError};
use crate::weights::WeightRef;
pub use moe::{Gating, MoeBiases, MoeFfn, MoeScratch};
pub use kv::{AltHeads, KvSpec, KvType, KvTypes, SwaKv};
pub use recurrent::{DeltaDims, DeltaIn, DeltaNet, DeltaState, Strided};

/// Handle to an f32 activation buffer owned by a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Buf(pub u32);

/// Handle to a KV cache owned by a backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvCache(pub u32);

/// Which pairs of a head vector RoPE rotates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Adjacent pairs `(x[2i], x[2i+1])` (llama).
    Norm,
    /// Halves `(x[i], x[i + n_rot/2])` (qwen2/3, gemma3).
    Neox,
}

/// RoPE parameters of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Rope<'a> {
    pub mode: RopeMode,
    /// Rotated dimensions (the first `n_rot` of each head; the rest pass through).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Position multiplier (1 / linear scaling factor).
    pub freq_scale: f32,
    /// Per-pair frequency divisors (`rope_freqs.weight`, length `n_rot/2`, f32).
    pub freq_factors: Option<WeightRef<'a>>,
    /// YaRN (`rope.scaling.type = yarn`, gpt-oss); `None`: plain or linear scaling.
    pub yarn: Option<Yarn>,
}

/// YaRN's RoPE angles, as ggml computes them: pair `i`'s angle mixes the interpolated
/// (`freq_scale`) and extrapolated angles by a ramp between the correction dimensions.
/// ggml also scales cos/sin by `1 + 0.1·ln(1/freq_scale)`; with every dimension rotated
/// that is the same as scaling `q·k` by its square, which the model folds into
/// [`Attention::scale`] (`model::Config::attn_scale`), so no backend scales here.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub ext_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// `rope.scaling.original_context_length`.
    pub n_ctx_orig: usize,
}

impl Yarn {
    /// Per rotated pair, the multiplier of the extrapolated angle `pos·base^(−2i/n_rot)`:
    /// `freq_scale·(1 − mix_i) + mix_i`, `mix_i` the ramp times `ext_factor`.
    pub fn angle_factors(&self, n_rot: usize, base: f32, freq_scale: f32) -> Vec<f32> {
        let [lo, hi] = cpu::ops::yarn_corr_dims(n_rot, self.n_ctx_orig, base, self.beta_fast, self.beta_slow);
        (0..n_rot / 2)
            .map(|i| {
                let y = (i as f32 - lo) / (hi - lo).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * self.ext_factor;
                freq_scale * (1.0 - mix) + mix
            })
            .collect()
    }
}

/// Attention parameters of one layer.
#[derive(Clone, Copy, Debug)]
pub struct Attention<'a> {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplier of `q·k` before the softmax.
    pub scale: f32,
    /// Sliding window: key at `pk` is visible to query at `pq` iff `pq - pk < window`.
    pub window: Option<usize>,
    /// Attention sinks (gpt-oss's `attn_sinks`, `[n_head]` f32): one logit per head added
    /// to the softmax's denominator (unscaled, no value).
    pub sinks: Option<WeightRef<'a>>,
}

/// What [`Backend::rope_kv_write`] does to a layer's fresh q/k/v projections.
#[derive(Clone, Copy, Debug)]
pub struct QkvPrep<'a> {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Per-head RMSNorm weights of q and k (`[head_dim]`; qwen3, gemma3).
    pub q_norm: Option<WeightRef<'a>>,
    pub k_norm: Option<WeightRef<'a>>,
    pub eps: f32,
    pub rope: Rope<'a>,
    /// Multiplier of q after RoPE.
    pub q_scale: Option<f32>,
}

/// Gate activation of a gated FFN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// `silu(gate) * up` (llama, qwen).
    Silu,
    /// `gelu_tanh(gate) * up` (gemma).
    GeluTanh,
}

/// What a `--device` flag asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Cuda,
    Hip,
    /// The first GPU backend that opens, else the CPU.
    Auto,
}

impl std::str::FromStr for DeviceKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "cpu" => Ok(DeviceKind::Cpu),
            "cuda" | "nvidia" => Ok(DeviceKind::Cuda),
            "hip" | "rocm" | "amd" => Ok(DeviceKind::Hip),
            "auto" => Ok(DeviceKind::Auto),
            _ => Err(format!("unknown device `{s}` (expected cpu, cuda, hip or auto)")),
        }
    }
}

/// A backend failure. Messages name the op and the sizes involved.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("{op}: {msg}")]
    Invalid { op: &'static str, msg: String },
    #[error("{op} on weight `{weight}`: {source}")]
    Quant {
        op: &'static str,
        weight: String,
        #[source]
        source: QuantError,
    },
    #[error("out of memory allocating {bytes} bytes for {what}")]
    OutOfMemory { what: &'static str, bytes: u64 },
    #[error("{0}")]
    Unavailable(String),
    #[error("unknown buffer handle {0:?}")]
    BadHandle(Buf),
    #[error("unknown KV cache handle {0:?}")]
    BadKvHandle(KvCache),
    #[error(transparent)]
    Weight(#[from] crate::weights::WeightError),
    #[error("weight `{weight}` is {ty}: unsupported type on {backend} (its weight types: {supported}){hint}")]
    UnsupportedWeight { weight: String, ty: GgmlType, backend: String, supported: String, hint: &'static str },
}

/// Every matrix among `weights` must be of a type in `be.weight_types()`.
pub fn check_weight_types(be: &dyn Backend, weights: &[WeightRef]) -> Result<()> {
    let types = be.weight_types();
    for w in weights {
        if w.view.info.dims.len() >= 2 && !types.contains(&w.ty()) {
            let fast = GgmlType::WEIGHTS.contains(&w.ty());
            return Err(BackendError::UnsupportedWeight {
                weight: w.name().to_string(),
                ty: w.ty(),
                backend: be.name(),
                supported: GgmlType::names(types),
                hint: if fast { "; the default numerics (--numerics fast) and the CPU backend run it" } else { "" },
            });
        }
    }
    Ok(())
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// The ops a forward pass is made of. Object safe: model and engine hold
/// `Box<dyn Backend>`.
pub trait Backend: Send {
    /// Short name for logs (`cpu`, `cuda:0 (NVIDIA H200)`).
    fn name(&self) -> String;

    /// Called once with the model's file and every weight its forward pass reads, before
    /// the first op: `mapped` residency registers the mapping here, `upload` copies all.
    fn attach_weights(&mut self, _file: &std::sync::Arc<crate::gguf::GgufFile>, _weights: &[WeightRef]) -> Result<()> {
        Ok(())
    }
    /// The matrix weight types this backend's kernels cover ([`GgmlType::WEIGHTS`] on
    /// every backend lode has). The engine
    /// refuses a model with other matrices ([`check_weight_types`]) before the first op.
    fn weight_types(&self) -> &'static [GgmlType] {
        &GgmlType::WEIGHTS
    }
    /// The weight cache's counters (`--memory-report`); `None` where weights are read in
    /// place without a cache.
    fn weight_stats(&self) -> Option<crate::weights::WeightStats> {
        None
    }
    /// Opens (`true`) or closes a window over which the device's driver-reported use is
    /// sampled for a peak, read from [`Backend::weight_stats`] before closing (`lode
    /// bench`'s per-row peak); `Ok(false)` where the backend has no device memory to sample.
    fn memory_window(&mut self, _open: bool) -> Result<bool> {
        Ok(false)
    }
    /// The device's memory before the engine allocates anything (the engine refuses a
    /// model that would not fit, `engine::fit`); `None` where there is nothing to check
    /// against (the plain CPU backend, with no `--device-memory`).
    fn memory_target(&self) -> Option<memory::MemoryTarget> {
        None
    }
    /// Fit's placement (`engine::fit::host_expert_layers_within`): the experts of the first
    /// `layers` layers (`bytes` of them) stay in host memory, computed by the CPU. `false`
    /// where the backend places no experts or `--n-cpu-moe` fixed the count.
    fn place_host_experts(&mut self, _layers: usize, _bytes: u64) -> Result<bool> {
        Ok(false)
    }

    /// While on, a chunk of several tokens rounds each row as a one-token step would
    /// (a speculative verify chunk, whose rows must give the logits decoding gives).
    /// The CPU backend honours it (dense matmuls and attention); the default ignores
    /// it, and there a chunk's rows may differ from decode steps in the last bits.
    fn round_rows_as_decode(&mut self, _on: bool) {}

    /// A zeroed f32 buffer of `len` elements.
    fn alloc(&mut self, len: usize) -> Result<Buf>;
    /// A zeroed f32 buffer of `len` elements that the host reads back after steps (the
    /// logits). A GPU backend may keep it in page-locked host memory that its kernels
    /// write directly, so a read costs no copy; elsewhere it is an ordinary buffer.
    fn alloc_readback(&mut self, len: usize) -> Result<Buf> {
        self.alloc(len)
    }
    /// Releases a buffer; the handle is invalid afterwards.
    fn free(&mut self, buf: Buf) -> Result<()>;
    /// Copies `src` into the start of `buf`.
    fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()>;
    /// Copies the first `dst.len()` elements of `buf` to the host (waits for pending work).
    fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()>;
    /// Reads the first `n` elements of `buf` and hands them to `f`. `host` is the caller's
    /// scratch for backends that read through it (the default); the GPU backend reads into
    /// its own page-locked buffer instead, which the link fills at full speed and nothing
    /// copies again (a decode step's logits: 0.6 MB per token for Qwen3).
    fn read_with(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        host.resize(n, 0.0);
        self.read(buf, &mut host[..n])?;
        f(&host[..n]);
        Ok(())
    }

    /// A KV cache; its contents are undefined until written.
    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache>;
    fn free_kv(&mut self, kv: KvCache) -> Result<()>;
    /// Copies positions `0..n` of `src`'s K and V into `dst` (a cache of the same spec),
    /// so `dst` continues a prompt `src` evaluated without evaluating it again. A
    /// window-sized layer (`KvSpec::swa`) copies what it holds of them and `dst` takes its
    /// base; refused when it no longer holds what position `n` sees.
    fn copy_kv(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        let _ = (src, dst, n);
        Err(BackendError::Invalid { op: "copy_kv", msg: format!("the {} backend cannot copy a KV cache", self.name()) })
    }

    /// `out[t] = w[ids[t]]` (dequantized): `out` `[ids.len(), w.row_len()]`.
    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()>;

    /// `y[t][r] = Σ_k W[r][k] x[t][k]`: `x` `[n_tok, w.row_len()]`, `y` `[n_tok, w.n_rows()]`.
    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()>;

    /// Per row of `row_len`: `out = x / sqrt(mean(x²) + eps) ⊙ w` (`w` absent: 1).
    /// With `row_len = head_dim` and `n_rows = n_tok * n_head` this is the per-head
    /// q/k norm.
    fn rms_norm(
        &mut self,
        x: Buf,
        out: Buf,
        n_rows: usize,
        row_len: usize,
        w: Option<&WeightRef>,
        eps: f32,
    ) -> Result<()>;

    /// Rotates `x` `[n_tok, n_head, head_dim]` in place; token `t` sits at `pos[t]`.
    fn rope(
        &mut self,
        x: Buf,
        n_head: usize,
        head_dim: usize,
        pos: &[u32],
        rope: &Rope,
    ) -> Result<()>;

    /// `out = a + b` over `n` elements.
    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()>;
    /// `x[t] += bias` for each of `n_tok` rows of `bias.row_len()` (f32 bias vector).
    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()>;
    /// `x *= s` over `n` elements.
    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()>;
    /// `out = act(gate) ⊙ up` over `n` elements.
    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()>;
    /// One feed-forward's gate and up projections and the GLU:
    /// `out = act(gate·x) ⊙ (up·x)`, `x` `[n_tok, k]`, `out` `[n_tok, gate.n_rows()]`;
    /// `tmp` (same size as `out`) may be used as scratch. A backend may fuse it (the GPU
    /// does for two or more tokens: one kernel, one activation tile, GLU in the epilogue).
    fn matmul_glu(&mut self, gate: &WeightRef, up: &WeightRef, x: Buf, n_tok: usize, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        self.matmul_multi(x, n_tok, &[(gate, out), (up, tmp)])?;
        self.glu(out, tmp, out, n_tok * gate.n_rows(), act)
    }
    /// Copies `n` elements from `src[src_off..]` to `dst[dst_off..]`.
    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize)
        -> Result<()>;

    /// Stores `k` `[n_tok, n_kv_head*head_dim_k]` and `v` `[n_tok, n_kv_head*head_dim_v]`
    /// of `layer` at positions `pos[t]` (a window-sized layer first moves its base as
    /// `SwaKv::advance` says; an error names a position older than it holds).
    fn kv_write(
        &mut self,
        kv: KvCache,
        layer: usize,
        k: Buf,
        v: Buf,
        pos: &[u32],
    ) -> Result<()>;

    /// Fused ops. Each has a default composed of the ops above, so a backend only
    /// overrides those it can do in fewer launches (the GPU: decode is launch-bound).
    ///
    /// `y_i = W_i x` for every `(W_i, y_i)` of `outs` (all with rows of `x`'s length):
    /// the q/k/v or gate/up projections of one input.
    fn matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        for (w, y) in outs {
            self.matmul(w, x, n_tok, *y)?;
        }
        Ok(())
    }

    /// `x += b` over `n_rows * row_len` values, then `out = rms_norm(x)` (the residual
    /// add and the next norm).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm(&mut self, x: Buf, b: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        self.add(x, b, x, n_rows * row_len)?;
        self.rms_norm(x, out, n_rows, row_len, w, eps)
    }

    /// After the q/k/v projections of `pos.len()` tokens: per-head norms of q and k,
    /// RoPE of both, q scaled, then k and v stored in `kv` at `layer` (`q` and `k` are
    /// updated in place).
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_write(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep) -> Result<()> {
        rope_kv_write_unfused(self, q, k, v, kv, layer, pos, p)
    }

    /// A projection whose output joins the residual stream: `y = W · x`, and then either
    /// `residual += y` done here (returns `true`; `y` is then not written) or left to the
    /// caller, who passes `y` as the next [`NormIn`]'s `add` (returns `false`, and `y`
    /// holds the product). The default leaves it (the next norm adds in the same pass);
    /// the GPU's decode adds in the matvec's epilogue, so that the next norm reads one
    /// finished vector instead of two.
    fn matmul_residual(&mut self, w: &WeightRef, x: Buf, n_tok: usize, residual: Buf, y: Buf) -> Result<bool> {
        let _ = residual;
        self.matmul(w, x, n_tok, y)?;
        Ok(false)
    }

    /// The norm in front of a layer's first matmuls and the matmuls themselves:
    /// [`NormIn`] (`x += add`, `out = rms_norm(x) · w`) then `matmul_multi(out, …)`. One op
    /// so that a backend can normalize inside the matmul's input staging (the GPU's decode:
    /// one launch instead of two, the weight loads overlapping the norm).
    fn norm_matmul_multi(&mut self, norm: &NormIn, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        norm_in(self, norm, n_tok)?;
        self.matmul_multi(norm.out, n_tok, outs)
    }

    /// [`NormIn`] then `matmul_glu(norm.out, …)`: the feed-forward block's input side.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul_glu(&mut self, norm: &NormIn, n_tok: usize, gate: &WeightRef, up: &WeightRef, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        norm_in(self, norm, n_tok)?;
        self.matmul_glu(gate, up, norm.out, n_tok, out, tmp, act)
    }

    /// `rope_kv_write` then `attention` of one sequence's chunk: one op so that a backend
    /// can prepare q/k and store K/V inside the attention kernel (the GPU's decode). The
    /// cache and `out` are what those two leave; `q` and `k` may be left unprepared (the
    /// GPU's fused kernel reads them without writing them back), so nothing may read them
    /// afterwards expecting the prepared values.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv_attention(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], prep: &QkvPrep, attn: &Attention, out: Buf) -> Result<()> {
        self.rope_kv_write(q, k, v, kv, layer, pos, prep)?;
        self.attention(q, kv, layer, pos, attn, out)
    }

    /// A mixture-of-experts feed-forward: `out` `[n_tok, n_embd]` = for each token of `x`
    /// `[n_tok, n_embd]`, the weighted sum of its routed experts' gated FFNs ([`moe`] has
    /// the arithmetic). `tmp` is the default's working space. The default
    /// ([`moe::moe_ffn_unfused`]) reads the router's logits back to the host for the
    /// top-k; a device-side top-k and expert-indexed matvecs are the GPU's next step.
    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
        moe::moe_ffn_unfused(self, x, n_tok, p, out, tmp)
    }

    /// A gated delta net layer's recurrent core ([`recurrent`] has the arithmetic): from
    /// its projections `x` of `n_tok` rows to `out` `[n_tok, value_dim]` (normed and gated,
    /// ready for `ssm_out`), updating the conv and delta-rule states in `states` (one for
    /// a sequence's chunk, or one per row of a batched step). `x.qkv` is the op's to
    /// clobber (the GPU writes the convolution's output over it). The default reads the
    /// operands back to the host; the CPU runs it directly; the GPU in its own kernels.
    fn gated_delta_net(&mut self, p: &DeltaNet, x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        recurrent::gated_delta_net_host(self, p, x, n_tok, states, out)
    }
    /// Row `r` of `src` (`2·half` values) into row `r` of `a` (first half) and `b`
    /// (second): qwen35's query and output gate, interleaved per head. Default: host.
    fn split_halves(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        recurrent::split_halves_host(self, src, n_rows, half, a, b)
    }
    /// The 3-D block `s` of `src` into `dst` (qwen3next's packed projections taken apart
    /// per token and key head group). Default: host.
    fn copy_strided(&mut self, src: Buf, dst: Buf, s: &Strided) -> Result<()> {
        recurrent::copy_strided_host(self, src, dst, s)
    }
    /// Rows of `a` and `b` (`half` values each) side by side into `dst` (`2·half` a row):
    /// the MTP block's `[enorm(embedding), hnorm(hidden)]`. Default: two copies per row.
    fn join_halves(&mut self, a: Buf, b: Buf, n_rows: usize, half: usize, dst: Buf) -> Result<()> {
        recurrent::join_halves_copies(self, a, b, n_rows, half, dst)
    }
    /// `x *= sigmoid(gate)` over `x` `[n_rows, row_len]`, `gate` of the same shape or, with
    /// `per_row`, one value per row (qwen35's attention output gate; qwen35moe's shared
    /// expert gate). Default: host.
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        recurrent::mul_sigmoid_host(self, x, gate, n_rows, row_len, per_row)
    }

    /// `x = H x` per block of `block` values over the first `n` values of `x`: a quantized
    /// KV cache's rotation ([`kv_rot`]). Default: on the host, [`kv_rot::hadamard_slice`].
    fn hadamard(&mut self, x: Buf, n: usize, block: usize) -> Result<()> {
        let mut v = vec![0f32; n];
        self.read(x, &mut v)?;
        kv_rot::hadamard_slice(&mut v, block);
        self.write(x, &v)
    }

    /// Causal attention of `q` `[n_tok, n_head*head_dim_k]` (token `t` at `pos[t]`) over
    /// cache slots `0..=pos[t]` of `layer` (narrowed by the window);
    /// `out` `[n_tok, n_head*head_dim_v]`.
    fn attention(
        &mut self,
        q: Buf,
        kv: KvCache,
        layer: usize,
        pos: &[u32],
        p: &Attention,
        out: Buf,
    ) -> Result<()>;

    /// A batched decode step's K/V store and attention, where row `t` is the next token
    /// of a different sequence: it stores row `t` of `k`/`v` in cache `kvs[t]` at slot
    /// `pos[t]` and attends with row `t` of `q` over that cache. This default goes row by
    /// row through one-row buffers; backends override it to skip the copies.
    #[allow(clippy::too_many_arguments)]
    fn attention_rows(
        &mut self,
        q: Buf,
        k: Buf,
        v: Buf,
        kvs: &[KvCache],
        layer: usize,
        pos: &[u32],
        p: &Attention,
        out: Buf,
    ) -> Result<()> {
        attention_rows_unfused(self, q, k, v, kvs, layer, pos, p, out)
    }
}

/// The norm in front of a fused matmul ([`Backend::norm_matmul_multi`],
/// [`Backend::norm_matmul_glu`]): `x += add` when `add` is given, then
/// `out = rms_norm(x) · w` over rows of `row_len` (one row per token).
#[derive(Clone, Copy, Debug)]
pub struct NormIn<'a, 'w> {
    pub x: Buf,
    pub add: Option<Buf>,
    pub out: Buf,
    pub row_len: usize,
    pub w: Option<&'a WeightRef<'w>>,
    pub eps: f32,
}

/// [`NormIn`] as the separate ops (the fused ops' defaults, and a backend's fallback).
pub fn norm_in<B: Backend + ?Sized>(be: &mut B, n: &NormIn, n_tok: usize) -> Result<()> {
    match n.add {
        Some(b) => be.add_rms_norm(n.x, b, n.out, n_tok, n.row_len, n.w, n.eps),
        None => be.rms_norm(n.x, n.out, n_tok, n.row_len, n.w, n.eps),
    }
}

/// What a run chooses about a GPU backend beyond its weights (command-line flags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// `--numerics`: `fast` (the tuned kernels) or `exact` ([`gpu::ExactBackend`]).
    pub numerics: gpu::Numerics,
    /// `--no-blas`: lode's own matrix-core GEMM for every prefill matmul.
    pub no_blas: bool,
    /// `--device-memory`: the device's capacity, the driver's own use included (the
    /// backend gets it through `WeightOptions::device_memory`, which also reads the
    /// environment).
    pub device_memory: Option<u64>,
}

impl GpuOptions {
    /// The tuning table a device opens with: `LODE_TUNE`'s, then these flags.
    pub fn tuning(&self) -> gpu::tuning::Tuning {
        let mut t = gpu::tuning::Tuning::from_env();
        if self.no_blas {
            t.blas = false;
        }
        t
    }
}

/// Opens the backend `kind` asks for. `Auto` falls back to the CPU with a one-line note
/// (returned as the second value) when no GPU backend opens. `opts`: how weights are held
/// (`--residency`, `--weight-budget`); on the CPU the mapping is read in place unless
/// `device`/`upload` residency, a budget or a memory report asks for the weight cache
/// (`device`/`upload` then copy weights into host memory, like llama.cpp's `--no-mmap`;
/// `mapped` keeps reading in place).
pub fn open_with(kind: DeviceKind, threads: usize, opts: &crate::weights::WeightOptions, gpu_opts: &GpuOptions) -> Result<(Box<dyn Backend>, Option<String>)> {
    use gpu::{ExactBackend, GpuBackend, Numerics};
    let cpu = |note: Option<String>| -> Result<(Box<dyn Backend>, Option<String>)> {
        let be = Box::new(cpu::CpuBackend::new(threads)?);
        let mapped = crate::weights::Residency::resolve(opts.residency, true).map_err(BackendError::Unavailable)? == crate::weights::Residency::Mapped;
        if mapped && opts.budget.is_none() && opts.test_alloc_limit.is_none() && opts.device_memory.is_none() && !opts.report_at_exit {
            return Ok((be, note));
        }
        let cached = cached::CachedBackend::new(be, opts).map_err(BackendError::Unavailable)?;
        Ok((Box::new(cached), note))
    };
    match gpu::open_device(kind, &gpu_opts.tuning()) {
        Ok(Ok(dev)) => Ok(match gpu_opts.numerics {
            Numerics::Fast => {
                let mut be = GpuBackend::with_options(dev, opts)?;
                be.set_host_experts(opts.n_cpu_moe, threads)?;
                (Box::new(be), None)
            }
            Numerics::Exact => (Box::new(ExactBackend::with_options(dev, opts)?), None),
        }),
        Ok(Err(note)) => cpu(Some(note)),
        Err(e) => Err(BackendError::Unavailable(e.to_string())),
    }
}
