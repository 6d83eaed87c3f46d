//! Hyper-parameters of a model, read from GGUF metadata (reference §1.6, §5).

use crate::backend::{DeltaDims, Gating, Glu, RopeMode, Yarn};
use crate::gguf::{GgufFile, MetaValue};

pub use super::gemma4::{AltAttn, HeadGeo};
use super::ModelError;

/// The architectures lode runs (`general.architecture` values).
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "gpt-oss", "gemma4"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral-style, SmolLM2.
    Llama,
    Qwen2,
    Qwen3,
    /// Qwen3's mixture-of-experts models (Qwen3-30B-A3B, Qwen3-235B-A22B).
    Qwen3Moe,
    Gemma3,
    /// Qwen3.5 / 3.6 dense: gated delta net layers interleaved with gated attention.
    Qwen35,
    /// Qwen3.5 / 3.6 mixture of experts (35B-A3B): qwen35's layers with routed experts and
    /// a gated shared expert.
    Qwen35Moe,
    /// Qwen3-Next (80B-A3B, Qwen3-Coder-Next): qwen35moe's layers with its value heads
    /// grouped by key head and its projections packed (`ssm_in`: q, k, v, z per key head
    /// group, or `attn_qkv` + `attn_gate`; `ssm_ba`: beta and alpha per group).
    Qwen3Next,
    /// OpenAI's gpt-oss (llama.cpp's `openai_moe`): biased attention with sinks and an
    /// alternating sliding window, YaRN RoPE, biased experts with a clamped SwiGLU.
    GptOss,
    /// Gemma 4 (text): sliding and full-attention layers of different head shapes, V
    /// normed (or taken from K), final logit soft-capping; the MoE members add routed
    /// experts beside each layer's dense FFN (`model/gemma4.rs`).
    Gemma4,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Gemma3 => "gemma3",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Next => "qwen3next",
            Arch::GptOss => "gpt-oss",
            Arch::Gemma4 => "gemma4",
        }
    }
}

/// Everything the forward pass needs besides the weights.
#[derive(Clone, Debug)]
pub struct Config {
    pub arch: Arch,
    /// Training context (`{arch}.context_length`).
    pub n_ctx_train: usize,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Vocabulary size = rows of the output head (set by the loader from the tensor).
    pub n_vocab: usize,
    pub eps: f32,
    pub rope_mode: RopeMode,
    pub n_rot: usize,
    pub rope_base: f32,
    /// 1 / linear scaling factor (global layers only for gemma3).
    pub rope_freq_scale: f32,
    /// RoPE base and frequency scale of sliding-window layers.
    pub rope_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    /// YaRN RoPE (`rope.scaling.type = yarn`), every layer.
    pub yarn: Option<Yarn>,
    /// Per layer: does it use the sliding window?
    pub swa_layers: Vec<bool>,
    pub n_swa: usize,
    /// Softmax scale passed to attention.
    pub attn_scale: f32,
    /// Multiplier applied to Q before attention (gemma3's `f_attention_scale`).
    pub q_scale: Option<f32>,
    /// Multiplier of the token embeddings (gemma3: √n_embd).
    pub embd_scale: Option<f32>,
    pub act: Glu,
    /// A mixture-of-experts FFN in every layer (`{arch}.expert_count`); `None`: dense.
    pub experts: Option<Experts>,
    /// The gated delta net of the recurrent layers (qwen35: the `ssm.*` keys); `None`: no
    /// recurrent layer.
    pub recurrent: Option<DeltaDims>,
    /// Per layer: a gated delta net instead of softmax attention.
    pub recurrent_layers: Vec<bool>,
    /// The q projection carries a per-head output gate after each head's query
    /// (`attn_q` is `2·n_head·head_dim` wide; qwen35): attention × sigmoid(gate).
    pub attn_out_gate: bool,
    /// The name of the FFN's input norm (`ffn_norm`; qwen35 calls it
    /// `post_attention_norm`).
    pub ffn_norm_name: &'static str,
    /// Rows of a shared expert's gate and up (`{arch}.expert_shared_feed_forward_length`;
    /// llama.cpp's default: `feed_forward_length`), used where a layer has one.
    pub n_ff_shared: usize,
    /// gemma4: the full-attention layers' head shapes where they differ from the sliding
    /// layers' (which the fields above hold); `None`: every layer alike.
    pub alt_attn: Option<AltAttn>,
    /// gemma4: V is RMS-normed per head (no weight) before the cache.
    pub v_norm: bool,
    /// gemma4: `rope_freqs.weight` applies to the full-attention layers only.
    pub rope_freqs_global_only: bool,
    /// `{arch}.final_logit_softcapping`: logits become `cap·tanh(logit/cap)`.
    pub logit_softcap: Option<f32>,
    /// gemma4's MoE layers keep their dense FFN (`n_ff`) beside the routed experts.
    pub dense_with_experts: bool,
}

/// The routed experts of a mixture-of-experts model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// `{arch}.expert_count`.
    pub n_expert: usize,
    /// Experts per token (`{arch}.expert_used_count`).
    pub n_used: usize,
    /// Rows of each expert's gate and up (`{arch}.expert_feed_forward_length`).
    pub n_ff: usize,
    /// Divide the selected experts' probabilities by their sum (qwen3moe: always, as
    /// llama.cpp's graph for it does).
    pub norm_top_k: bool,
    /// Softmax then top-k (qwen3moe), or top-k then softmax (gpt-oss).
    pub gating: Gating,
    /// gpt-oss's clamped SwiGLU (`swiglu_oai`) and expert biases.
    pub swiglu_oai: bool,
}

impl Config {
    /// Reads the hyper-parameters of a supported architecture.
    pub fn from_gguf(file: &GgufFile) -> Result<Config, ModelError> {
        let arch_name = file
            .get_str("general.architecture")?
            .ok_or_else(|| ModelError::MissingKey("general.architecture".into()))?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            "qwen3moe" => Arch::Qwen3Moe,
            "gemma3" => Arch::Gemma3,
            "qwen35" => Arch::Qwen35,
            "qwen35moe" => Arch::Qwen35Moe,
            "qwen3next" => Arch::Qwen3Next,
            "gpt-oss" => Arch::GptOss,
            "gemma4" => Arch::Gemma4,
            other => {
                return Err(ModelError::UnsupportedArch {
                    arch: other.to_string(),
                    supported: SUPPORTED_ARCHS.join(", "),
                })
            }
        };
        let a = arch_name;
        let req = |k: &str| -> Result<usize, ModelError> {
            uniform_u64(file, &format!("{a}.{k}"))?
                .map(|v| v as usize)
                .ok_or_else(|| ModelError::MissingKey(format!("{a}.{k}")))
        };
        let opt = |k: &str| -> Result<Option<usize>, ModelError> {
            Ok(uniform_u64(file, &format!("{a}.{k}"))?.map(|v| v as usize))
        };
        let optf = |k: &str| -> Result<Option<f32>, ModelError> { Ok(file.get_f32(&format!("{a}.{k}"))?) };

        let n_embd = req("embedding_length")?;
        // Blocks past `block_count - nextn_predict_layers` are multi-token-prediction heads
        // (qwen35), which the forward pass does not run.
        let n_layer = req("block_count")?.saturating_sub(opt("nextn_predict_layers")?.unwrap_or(0));
        let oss = arch == Arch::GptOss;
        let experts = experts(&opt, a)?.map(|x| if oss { Experts { norm_top_k: false, gating: Gating::SoftmaxWeight, swiglu_oai: true, ..x } } else { x });
        // A MoE model's dense `feed_forward_length` is informational (no dense FFN reads it).
        let g4 = if arch == Arch::Gemma4 { Some(super::gemma4::hparams(file, a, n_layer)?) } else { None };
        let n_ff = if experts.is_some() && g4.is_none() { opt("feed_forward_length")?.unwrap_or(0) } else { req("feed_forward_length")? };
        let n_head = req("attention.head_count")?;
        let n_head_kv = match &g4 {
            Some(g) => g.swa.n_head_kv,
            None => opt("attention.head_count_kv")?.unwrap_or(n_head),
        };
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_layer == 0 || n_embd == 0 {
            return Err(ModelError::BadConfig(format!(
                "{a}: n_head {n_head}, n_head_kv {n_head_kv}, n_layer {n_layer}, n_embd {n_embd}: \
                 need positive sizes and n_head a multiple of n_head_kv"
            )));
        }
        let head_dim_k = g4.as_ref().map_or(opt("attention.key_length")?.unwrap_or(n_embd / n_head), |g| g.swa.head_dim_k);
        let head_dim_v = g4.as_ref().map_or(opt("attention.value_length")?.unwrap_or(n_embd / n_head), |g| g.swa.head_dim_v);
        let n_rot = g4.as_ref().map_or(opt("rope.dimension_count")?.unwrap_or(head_dim_k), |g| g.swa.n_rot);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(ModelError::BadConfig(format!("{a}: rope dimension {n_rot} with head_dim {head_dim_k}")));
        }
        let eps = optf("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| ModelError::MissingKey(format!("{a}.attention.layer_norm_rms_epsilon")))?;
        let rope_base = optf("rope.freq_base")?.unwrap_or(10000.0);
        // gpt-oss's sliding-window layers share the global base and scale (llama.cpp).
        let rope_base_swa = optf("rope.freq_base_swa")?.unwrap_or(if oss { rope_base } else { 10000.0 });
        let (rope_freq_scale, yarn, yarn_mag) = rope_scale(file, a, opt("context_length")?.unwrap_or(4096))?;
        if yarn.is_some() && n_rot != head_dim_k {
            return Err(ModelError::BadConfig(format!("{a}: YaRN RoPE over {n_rot} of {head_dim_k} dimensions is not supported (lode folds its magnitude into the attention scale)")));
        }

        let gemma = arch == Arch::Gemma3;
        let gemma4 = arch == Arch::Gemma4;
        let hybrid = matches!(arch, Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next);
        if arch == Arch::Qwen3Next && experts.is_none() {
            return Err(ModelError::BadConfig(format!("{a}: a qwen3next model needs experts ({a}.expert_count > 0), as llama.cpp's loader does")));
        }
        if let Some(sc) = optf("expert_weights_scale")? {
            if sc != 0.0 && sc != 1.0 {
                return Err(ModelError::BadConfig(format!("{a}.expert_weights_scale {sc} is not supported (0 or 1)")));
            }
        }
        let (recurrent, recurrent_layers) = if hybrid { delta_net(file, &req, &opt, a, n_layer, arch == Arch::Qwen3Next)? } else { (None, vec![false; n_layer]) };
        if hybrid {
            rope_sections_plain(file, a, n_rot)?;
        }
        let n_swa = match arch {
            Arch::Gemma3 | Arch::Gemma4 => opt("attention.sliding_window")?.unwrap_or(0),
            Arch::GptOss => req("attention.sliding_window")?,
            _ => 0,
        };
        // Gemma 3: five local layers in six; gpt-oss: every other layer from layer 0.
        let swa_layers = if (gemma || gemma4 || oss) && n_swa > 0 { swa_pattern(file, a, n_layer, if oss { 2 } else { 6 })? } else { vec![false; n_layer] };
        let explicit_scale = if gemma { None } else { optf("attention.scale")? };
        let (attn_scale, q_scale, embd_scale) = if gemma4 {
            // Gemma 4's q/k norms carry the scale: q·k is not scaled (llama.cpp's 1.0).
            (1.0, None, Some((n_embd as f32).sqrt()))
        } else if gemma {
            // llama.cpp derives Gemma 3's query scale from the model size (27B: 62 layers).
            let s = if n_layer == 62 { 1.0 / ((n_embd / n_head) as f32).sqrt() } else { 1.0 / (head_dim_k as f32).sqrt() };
            (1.0, Some(s), Some((n_embd as f32).sqrt()))
        } else {
            // YaRN's cos/sin magnitude on q and k, as one factor on q·k.
            (explicit_scale.unwrap_or(1.0 / (head_dim_k as f32).sqrt()) * yarn_mag * yarn_mag, None, None)
        };
        Ok(Config {
            arch,
            n_ctx_train: opt("context_length")?.unwrap_or(4096),
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_vocab: 0,
            eps,
            rope_mode: if arch == Arch::Llama { RopeMode::Norm } else { RopeMode::Neox },
            n_rot,
            rope_base,
            rope_freq_scale,
            rope_base_swa,
            rope_freq_scale_swa: if oss { rope_freq_scale } else { 1.0 },
            yarn,
            swa_layers,
            n_swa,
            attn_scale,
            q_scale,
            embd_scale,
            act: if gemma || gemma4 { Glu::GeluTanh } else { Glu::Silu },
            experts,
            recurrent,
            recurrent_layers,
            attn_out_gate: hybrid,
            ffn_norm_name: if hybrid || oss { "post_attention_norm" } else { "ffn_norm" },
            n_ff_shared: opt("expert_shared_feed_forward_length")?.unwrap_or(n_ff),
            alt_attn: g4.as_ref().and_then(|g| g.alt.clone()),
            v_norm: gemma4,
            rope_freqs_global_only: gemma4,
            logit_softcap: if gemma4 { optf("final_logit_softcapping")?.filter(|&c| c > 0.0) } else { None },
            dense_with_experts: gemma4,
        })
    }

    /// Layers with a KV cache (all but the recurrent ones).
    pub fn kv_layers(&self) -> usize {
        self.recurrent_layers.iter().filter(|&&r| !r).count()
    }
    /// Layer `l`'s place in the KV cache (the attention layers before it).
    pub fn kv_slot(&self, l: usize) -> usize {
        self.recurrent_layers[..l].iter().filter(|&&r| !r).count()
    }
    /// f32 values of one sequence's recurrent state (every recurrent layer's conv and
    /// delta-rule state).
    pub fn recurrent_state_len(&self) -> usize {
        let n = self.recurrent_layers.iter().filter(|&&r| r).count();
        self.recurrent.map_or(0, |d| n * (d.conv_state_len() + d.ssm_state_len()))
    }

    /// Layer `l`'s head shapes.
    pub fn heads(&self, l: usize) -> HeadGeo {
        match &self.alt_attn {
            Some(a) if a.layers.get(l) == Some(&true) => a.geo,
            _ => HeadGeo { n_head_kv: self.n_head_kv, head_dim_k: self.head_dim_k, head_dim_v: self.head_dim_v, n_rot: self.n_rot },
        }
    }

    /// The widest q, k and v rows (per token) of any layer: the activation buffers' widths.
    pub fn max_widths(&self) -> (usize, usize, usize, usize) {
        let g = [Some(self.heads_base()), self.alt_attn.as_ref().map(|a| a.geo)];
        let m = |f: &dyn Fn(&HeadGeo) -> usize| g.iter().flatten().map(f).max().unwrap_or(0);
        (m(&|h| self.n_head * h.head_dim_k), m(&|h| h.n_head_kv * h.head_dim_k), m(&|h| h.n_head_kv * h.head_dim_v), m(&|h| self.n_head * h.head_dim_v))
    }

    fn heads_base(&self) -> HeadGeo {
        HeadGeo { n_head_kv: self.n_head_kv, head_dim_k: self.head_dim_k, head_dim_v: self.head_dim_v, n_rot: self.n_rot }
    }

    /// The KV cache's head shapes: the sliding (base) layers', and the full-attention
    /// layers' (if they differ) as [`crate::backend::AltHeads`] over the cache layers.
    pub fn kv_heads(&self) -> (HeadGeo, Option<crate::backend::AltHeads>) {
        let base = self.heads_base();
        let Some(a) = &self.alt_attn else { return (base, None) };
        let attn_layers = (0..self.n_layer).filter(|&l| !self.recurrent_layers[l]);
        let mask = attn_layers.enumerate().filter(|&(i, l)| a.layers[l] && i < 128).fold(0u128, |m, (i, _)| m | 1 << i);
        let alt = crate::backend::AltHeads { n_kv_head: a.geo.n_head_kv, head_dim_k: a.geo.head_dim_k, head_dim_v: a.geo.head_dim_v, layers: mask };
        (base, Some(alt))
    }

    /// RoPE base and frequency scale of layer `l`.
    pub fn rope_for_layer(&self, l: usize) -> (f32, f32) {
        if self.swa_layers[l] {
            (self.rope_base_swa, self.rope_freq_scale_swa)
        } else {
            (self.rope_base, self.rope_freq_scale)
        }
    }
}

/// The experts' keys: all three or none (`expert_count` 0 or absent: a dense model).
fn experts(opt: &dyn Fn(&str) -> Result<Option<usize>, ModelError>, a: &str) -> Result<Option<Experts>, ModelError> {
    let n_expert = opt("expert_count")?.unwrap_or(0);
    if n_expert == 0 {
        return Ok(None);
    }
    let need = |k: &str| opt(k)?.ok_or_else(|| ModelError::MissingKey(format!("{a}.{k}")));
    let (n_used, n_ff) = (need("expert_used_count")?, need("expert_feed_forward_length")?);
    if n_used == 0 || n_used > n_expert || n_ff == 0 {
        return Err(ModelError::BadConfig(format!(
            "{a}: {n_used} experts used of {n_expert}, expert FFN length {n_ff}: need 1 ≤ used ≤ count and a positive length"
        )));
    }
    Ok(Some(Experts { n_expert, n_used, n_ff, norm_top_k: true, gating: Gating::Softmax, swiglu_oai: false }))
}

/// qwen35's gated delta net: its dimensions from the `ssm.*` keys, and which layers are
/// recurrent: `attention.recurrent_layers` (one bool per block) where the file has it, else
/// all but every `full_attention_interval`-th (default 4, as llama.cpp). `grouped`:
/// qwen3next's value heads grouped by key head ([`DeltaDims::grouped`]).
#[allow(clippy::type_complexity)]
fn delta_net(
    file: &GgufFile,
    req: &dyn Fn(&str) -> Result<usize, ModelError>,
    opt: &dyn Fn(&str) -> Result<Option<usize>, ModelError>,
    a: &str,
    n_layer: usize,
    grouped: bool,
) -> Result<(Option<DeltaDims>, Vec<bool>), ModelError> {
    let (d_conv, inner, state) = (req("ssm.conv_kernel")?, req("ssm.inner_size")?, req("ssm.state_size")?);
    let (n_v_heads, n_k_heads) = (req("ssm.time_step_rank")?, req("ssm.group_count")?);
    let ok = d_conv >= 1 && n_k_heads > 0 && n_v_heads > 0 && n_v_heads % n_k_heads == 0 && state > 0 && inner == n_v_heads * state;
    if !ok {
        return Err(ModelError::BadConfig(format!(
            "{a}: ssm.conv_kernel {d_conv}, ssm.inner_size {inner}, ssm.state_size {state}, ssm.time_step_rank {n_v_heads}, \
             ssm.group_count {n_k_heads}: need a kernel of at least 1, value heads a multiple of the key heads and \
             inner_size = time_step_rank × state_size (square states)"
        )));
    }
    let key = format!("{a}.attention.recurrent_layers");
    let layers = match file.get(&key) {
        // The blocks past the layers (multi-token prediction) are listed too, as attention.
        Some(MetaValue::Array(_, items)) => {
            let v: Vec<bool> = items.iter().filter_map(|x| if let MetaValue::Bool(b) = x { Some(*b) } else { None }).collect();
            if v.len() != items.len() || v.len() < n_layer {
                return Err(ModelError::BadConfig(format!("{key}: expected at least {n_layer} bools, got {} entries", items.len())));
            }
            v[..n_layer].to_vec()
        }
        Some(_) => return Err(ModelError::BadConfig(format!("{key}: expected an array of bools"))),
        None => {
            let interval = opt("full_attention_interval")?.unwrap_or(4);
            if interval == 0 {
                return Err(ModelError::BadConfig(format!("{a}.full_attention_interval is 0")));
            }
            (0..n_layer).map(|i| (i + 1) % interval != 0).collect()
        }
    };
    Ok((Some(DeltaDims { d_conv, n_k_heads, n_v_heads, head_k_dim: state, head_v_dim: inner / n_v_heads, grouped }), layers))
}

/// qwen35's multi-section RoPE (`rope.dimension_sections`, interleaved as ggml's IMROPE):
/// for text every section's position is the token's, so it is plain NeoX RoPE over
/// `n_rot` dimensions exactly when every rotated pair falls in one of the first three
/// sections (none in the fourth, whose position is 0). Refused otherwise.
fn rope_sections_plain(file: &GgufFile, a: &str, n_rot: usize) -> Result<(), ModelError> {
    let key = format!("{a}.rope.dimension_sections");
    let Some(MetaValue::Array(_, items)) = file.get(&key) else {
        return Ok(());
    };
    let s: Vec<usize> = items.iter().filter_map(meta_int).map(|v| v as usize).collect();
    if s.len() != items.len() || s.len() < 3 {
        return Err(ModelError::BadConfig(format!("{key}: expected 3 or 4 integers")));
    }
    let total: usize = s.iter().sum();
    let covered = |sector: usize| {
        (sector % 3 == 0 && sector < 3 * s[0]) || (sector % 3 == 1 && sector < 3 * s[1]) || (sector % 3 == 2 && sector < 3 * s[2])
    };
    if total == 0 || !(0..n_rot / 2).all(|i| covered(i % total)) {
        return Err(ModelError::BadConfig(format!(
            "{key} {s:?} with {n_rot} rotated dimensions: some pairs take the fourth section's position; not supported"
        )));
    }
    Ok(())
}

/// The frequency scale (`1/factor` for linear and YaRN scaling; 1 for none), YaRN's
/// parameters as llama.cpp derives them (`ext_factor` 1, `beta_fast` 32, `beta_slow` 1,
/// the original context `rope.scaling.original_context_length`, default the training
/// context) and YaRN's magnitude factor (1 without YaRN): llama.cpp's `attn_factor`
/// `mscale(factor) / (1 + 0.1·ln factor)` times ggml's own `1 + 0.1·ln factor`, in f32
/// as they compute it. Other scaling types are refused.
fn rope_scale(file: &GgufFile, a: &str, n_ctx_train: usize) -> Result<(f32, Option<Yarn>, f32), ModelError> {
    let ty = file.get_str(&format!("{a}.rope.scaling.type"))?.unwrap_or("none");
    let factor = file.get_f32(&format!("{a}.rope.scaling.factor"))?.unwrap_or(1.0);
    match ty {
        "none" => Ok((1.0, None, 1.0)),
        "linear" if factor > 0.0 => Ok((1.0 / factor, None, 1.0)),
        "yarn" if factor > 0.0 => {
            if file.get_f32(&format!("{a}.rope.scaling.yarn_log_multiplier"))?.is_some_and(|m| m != 0.0) {
                return Err(ModelError::BadConfig(format!("{a}.rope.scaling.yarn_log_multiplier is not supported")));
            }
            let n_ctx_orig = uniform_u64(file, &format!("{a}.rope.scaling.original_context_length"))?.map_or(n_ctx_train, |v| v as usize);
            let freq_scale = 1.0 / factor;
            let f = 1.0 / freq_scale;
            let mscale = if f <= 1.0 { 1.0 } else { 0.1 * f.ln() + 1.0 };
            let attn_factor = mscale * (1.0 / (1.0 + 0.1 * f.ln()));
            let magnitude = attn_factor * (1.0 + 0.1 * (1.0 / freq_scale).ln());
            Ok((freq_scale, Some(Yarn { ext_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig }), magnitude))
        }
        // llama-3 style scaling ships as `rope_freqs.weight` and says `linear`/`none`
        // or omits the type; LongRoPE needs extra math lode does not have.
        other => Err(ModelError::BadConfig(format!(
            "{a}.rope.scaling.type `{other}` (factor {factor}) is not supported (supported: none, linear, yarn)"
        ))),
    }
}

/// The sliding-window layers: a period P (default `default`: Gemma 3's 6, gpt-oss's 2;
/// layer l is local iff `l mod P < P-1`) or an explicit per-layer bool array.
fn swa_pattern(file: &GgufFile, a: &str, n_layer: usize, default: usize) -> Result<Vec<bool>, ModelError> {
    let key = format!("{a}.attention.sliding_window_pattern");
    if let Some(MetaValue::Array(_, items)) = file.get(&key) {
        let v: Vec<bool> = items.iter().map(|x| matches!(x, MetaValue::Bool(true))).collect();
        if v.len() != n_layer {
            return Err(ModelError::BadConfig(format!("{key} has {} entries for {n_layer} layers", v.len())));
        }
        return Ok(v);
    }
    let p = file.get_u64(&key)?.unwrap_or(default as u64) as usize;
    Ok((0..n_layer).map(|l| p == 0 || l % p < p - 1).collect())
}

/// An integer key that may also be written as a per-layer array; lode needs every
/// layer to agree.
fn uniform_u64(file: &GgufFile, key: &str) -> Result<Option<u64>, ModelError> {
    if let Some(MetaValue::Array(_, items)) = file.get(key) {
        let vals: Vec<u64> = items.iter().filter_map(meta_int).collect();
        if vals.len() != items.len() || vals.is_empty() {
            return Err(ModelError::BadConfig(format!("{key}: expected integers")));
        }
        if vals.iter().any(|&v| v != vals[0]) {
            return Err(ModelError::BadConfig(format!("{key}: per-layer values differ ({vals:?}); not supported")));
        }
        return Ok(Some(vals[0]));
    }
    Ok(file.get_u64(key)?)
}

fn meta_int(v: &MetaValue) -> Option<u64> {
    match *v {
        MetaValue::U8(x) => Some(x as u64),
        MetaValue::U16(x) => Some(x as u64),
        MetaValue::U32(x) => Some(x as u64),
        MetaValue::U64(x) => Some(x),
        MetaValue::I8(x) => u64::try_from(x).ok(),
        MetaValue::I16(x) => u64::try_from(x).ok(),
        MetaValue::I32(x) => u64::try_from(x).ok(),
        MetaValue::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}
