//! Hyper-parameters of a model, read from GGUF metadata (reference §1.6, §5).

use crate::backend::{DeltaDims, Glu, RopeMode};
use crate::gguf::{GgufFile, MetaValue};

use super::ModelError;

/// The architectures lode runs (`general.architecture` values).
pub const SUPPORTED_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "qwen3moe", "qwen35", "qwen35moe"];

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
    /// RoPE base of sliding-window layers.
    pub rope_base_swa: f32,
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
        let experts = experts(&opt, a)?;
        // A MoE model's dense `feed_forward_length` is informational (no dense FFN reads it).
        let n_ff = if experts.is_some() { opt("feed_forward_length")?.unwrap_or(0) } else { req("feed_forward_length")? };
        let n_head = req("attention.head_count")?;
        let n_head_kv = opt("attention.head_count_kv")?.unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 || n_layer == 0 || n_embd == 0 {
            return Err(ModelError::BadConfig(format!(
                "{a}: n_head {n_head}, n_head_kv {n_head_kv}, n_layer {n_layer}, n_embd {n_embd}: \
                 need positive sizes and n_head a multiple of n_head_kv"
            )));
        }
        let head_dim_k = opt("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = opt("attention.value_length")?.unwrap_or(n_embd / n_head);
        let n_rot = opt("rope.dimension_count")?.unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            return Err(ModelError::BadConfig(format!("{a}: rope dimension {n_rot} with head_dim {head_dim_k}")));
        }
        let eps = optf("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| ModelError::MissingKey(format!("{a}.attention.layer_norm_rms_epsilon")))?;
        let rope_base = optf("rope.freq_base")?.unwrap_or(10000.0);
        let rope_base_swa = optf("rope.freq_base_swa")?.unwrap_or(10000.0);
        let rope_freq_scale = rope_scale(file, a)?;

        let gemma = arch == Arch::Gemma3;
        let hybrid = matches!(arch, Arch::Qwen35 | Arch::Qwen35Moe);
        if let Some(sc) = optf("expert_weights_scale")? {
            if sc != 0.0 && sc != 1.0 {
                return Err(ModelError::BadConfig(format!("{a}.expert_weights_scale {sc} is not supported (0 or 1)")));
            }
        }
        let (recurrent, recurrent_layers) = if hybrid { delta_net(&req, &opt, a, n_layer)? } else { (None, vec![false; n_layer]) };
        if hybrid {
            rope_sections_plain(file, a, n_rot)?;
        }
        let n_swa = if gemma { opt("attention.sliding_window")?.unwrap_or(0) } else { 0 };
        let swa_layers = if gemma && n_swa > 0 { swa_pattern(file, a, n_layer)? } else { vec![false; n_layer] };
        let explicit_scale = if gemma { None } else { optf("attention.scale")? };
        let (attn_scale, q_scale, embd_scale) = if gemma {
            // llama.cpp derives Gemma 3's query scale from the model size (27B: 62 layers).
            let s = if n_layer == 62 { 1.0 / ((n_embd / n_head) as f32).sqrt() } else { 1.0 / (head_dim_k as f32).sqrt() };
            (1.0, Some(s), Some((n_embd as f32).sqrt()))
        } else {
            (explicit_scale.unwrap_or(1.0 / (head_dim_k as f32).sqrt()), None, None)
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
            swa_layers,
            n_swa,
            attn_scale,
            q_scale,
            embd_scale,
            act: if gemma { Glu::GeluTanh } else { Glu::Silu },
            experts,
            recurrent,
            recurrent_layers,
            attn_out_gate: hybrid,
            ffn_norm_name: if hybrid { "post_attention_norm" } else { "ffn_norm" },
            n_ff_shared: opt("expert_shared_feed_forward_length")?.unwrap_or(n_ff),
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

    /// RoPE base and frequency scale of layer `l`.
    pub fn rope_for_layer(&self, l: usize) -> (f32, f32) {
        if self.swa_layers[l] {
            (self.rope_base_swa, 1.0)
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
    Ok(Some(Experts { n_expert, n_used, n_ff, norm_top_k: true }))
}

/// qwen35's gated delta net: its dimensions from the `ssm.*` keys, and which layers are
/// recurrent: all but every `full_attention_interval`-th (default 4, as llama.cpp).
#[allow(clippy::type_complexity)]
fn delta_net(
    req: &dyn Fn(&str) -> Result<usize, ModelError>,
    opt: &dyn Fn(&str) -> Result<Option<usize>, ModelError>,
    a: &str,
    n_layer: usize,
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
    let interval = opt("full_attention_interval")?.unwrap_or(4);
    if interval == 0 {
        return Err(ModelError::BadConfig(format!("{a}.full_attention_interval is 0")));
    }
    let layers = (0..n_layer).map(|i| (i + 1) % interval != 0).collect();
    Ok((Some(DeltaDims { d_conv, n_k_heads, n_v_heads, head_k_dim: state, head_v_dim: inner / n_v_heads }), layers))
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

/// `1/factor` for linear scaling; 1 for none. Other scaling types are refused.
fn rope_scale(file: &GgufFile, a: &str) -> Result<f32, ModelError> {
    let ty = file.get_str(&format!("{a}.rope.scaling.type"))?.unwrap_or("none");
    let factor = file.get_f32(&format!("{a}.rope.scaling.factor"))?.unwrap_or(1.0);
    match ty {
        "none" => Ok(1.0),
        "linear" if factor > 0.0 => Ok(1.0 / factor),
        // llama-3 style scaling ships as `rope_freqs.weight` and says `linear`/`none`
        // or omits the type; YaRN and LongRoPE need extra math lode does not have.
        other => Err(ModelError::BadConfig(format!(
            "{a}.rope.scaling.type `{other}` (factor {factor}) is not supported (supported: none, linear)"
        ))),
    }
}

/// Gemma 3's sliding-window layers: a period P (default 6; layer l is local iff
/// `l mod P < P-1`) or an explicit per-layer bool array.
fn swa_pattern(file: &GgufFile, a: &str, n_layer: usize) -> Result<Vec<bool>, ModelError> {
    let key = format!("{a}.attention.sliding_window_pattern");
    if let Some(MetaValue::Array(_, items)) = file.get(&key) {
        let v: Vec<bool> = items.iter().map(|x| matches!(x, MetaValue::Bool(true))).collect();
        if v.len() != n_layer {
            return Err(ModelError::BadConfig(format!("{key} has {} entries for {n_layer} layers", v.len())));
        }
        return Ok(v);
    }
    let p = file.get_u64(&key)?.unwrap_or(6) as usize;
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
