//! The `qwen35` presets of `lode synth` (Qwen3.5 / 3.6 dense: gated delta net layers
//! interleaved with gated attention), their tensors and their metadata keys, as llama.cpp's
//! loader reads them (`src/models/qwen35.cpp`, `LLM_KV_SSM_*`,
//! `LLM_KV_FULL_ATTENTION_INTERVAL`, `LLM_KV_ROPE_DIMENSION_SECTIONS`; the names in
//! gguf-py's `MODEL_TENSORS[QWEN35]`).
//!
//! Types: norms, `ssm_a`, `ssm_dt.bias` and `ssm_conv1d` are F32 (llama.cpp quantizes
//! only 2-D tensors and never `ssm_conv1d`); the delta net's matrices take the mix's rule
//! of the attention matrix they stand in for (`attn_qkv`, `attn_gate`, `ssm_beta`,
//! `ssm_alpha` as `attn_q`, `ssm_out` as `attn_output`), which is this tool's choice, not
//! a reading of llama.cpp's per-tensor rules for them.

use lode_runtime::gguf::{MetaValue, ValueType};

use super::{Hparams, Preset};

/// The gated delta net of a hybrid preset (llama.cpp's `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HybridParams {
    /// `ssm.conv_kernel`.
    pub d_conv: u64,
    /// `ssm.group_count`: q/k heads.
    pub n_k_heads: u64,
    /// `ssm.time_step_rank`: value heads.
    pub n_v_heads: u64,
    /// `ssm.state_size`: the head width of q, k and v.
    pub head_dim: u64,
    /// `full_attention_interval`: every n-th layer is attention.
    pub interval: u64,
    /// Rotated dimensions of the attention heads (`rope.dimension_count`).
    pub n_rot: u64,
    /// `rope.dimension_sections` (text positions: plain NeoX over `n_rot`).
    pub sections: [i32; 4],
    /// With experts (`Hparams::moe`): the shared expert's FFN rows
    /// (`expert_shared_feed_forward_length`; 0: no shared expert).
    pub n_ff_shared: u64,
    /// Multi-token-prediction blocks after the layers (`nextn_predict_layers`; 0: none):
    /// `blk.{n_layer}` is a gated-attention block with the trunk's FFN plus the
    /// `nextn.eh_proj` / `enorm` / `hnorm` / `shared_head_norm` tensors of the Qwen3.5 /
    /// 3.6 MTP GGUFs (their LM head and embeddings are the trunk's).
    pub nextn: u64,
    /// qwen3next's older files' one `ssm_in` (q, k, v, z per key head group) instead of
    /// `attn_qkv` + `attn_gate` (`super::qwen3next`).
    pub packed_qkvz: bool,
}

impl HybridParams {
    pub fn key_dim(&self) -> u64 {
        self.n_k_heads * self.head_dim
    }
    pub fn value_dim(&self) -> u64 {
        self.n_v_heads * self.head_dim
    }
    pub fn channels(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }
    pub fn is_recurrent(&self, layer: u64) -> bool {
        (layer + 1) % self.interval != 0
    }
}

/// Qwen3.5-27B / Qwen3.6-27B (same text decoder, `model_type` qwen3_5), from the model
/// card (Qwen/Qwen3.6-27B: hidden 5120, 64 layers as 16 × (3 × Gated DeltaNet + 1 ×
/// gated attention), DeltaNet 48 V heads and 16 QK heads of 128, attention 24 Q and 4 KV
/// heads of 256, rotary dimension 64, FFN 17408, vocabulary and LM output 248320 padded,
/// context 262144) and its `config.json` (`rope_theta` 1e7, `mrope_section` [11, 11, 10],
/// `linear_conv_kernel_dim` 4, `rms_norm_eps` 1e-6, untied head). llama.cpp's converter
/// writes `rope.dimension_sections` as four values, the fourth 0.
pub fn qwen35_27b() -> Hparams {
    Hparams {
        name: "qwen35-27b",
        arch: "qwen35",
        n_embd: 5120,
        n_layer: 64,
        n_head: 24,
        n_head_kv: 4,
        head_dim: 256,
        n_ff: 17408,
        n_vocab: 248320,
        context_length: 262144,
        rope_base: 1e7,
        rms_eps: 1e-6,
        tied: false,
        qk_norm: true,
        hybrid: Some(HybridParams { d_conv: 4, n_k_heads: 16, n_v_heads: 48, head_dim: 128, interval: 4, n_rot: 64, sections: [11, 11, 10, 0], n_ff_shared: 0, nextn: 0, packed_qkvz: false }),
        ..Default::default()
    }
}

/// Qwen3.6-35B-A3B (arch `qwen35moe`; Qwen3.5-35B-A3B has the same shapes), from the model
/// card (Qwen/Qwen3.6-35B-A3B: hidden 2048, 40 layers as 10 × (3 × Gated DeltaNet + 1 ×
/// gated attention), each with a MoE; DeltaNet 32 V heads and 16 QK heads of 128;
/// attention 16 Q and 2 KV heads of 256, rotary dimension 64; 256 experts, 8 routed and
/// 1 shared, expert intermediate 512; vocabulary 248320 padded; context 262144). The shared
/// expert's intermediate size (512, `shared_expert_intermediate_size`) and the family's
/// `rope_theta` 1e7, `rms_norm_eps` 1e-6 and conv kernel 4 are as in the 27B's config.
pub fn qwen35_35b_a3b() -> Hparams {
    Hparams {
        name: "qwen35-35b-a3b",
        arch: "qwen35moe",
        n_embd: 2048,
        n_layer: 40,
        n_head: 16,
        n_head_kv: 2,
        n_ff: 0,
        moe: Some(super::moe::MoeParams { n_expert: 256, n_used: 8, n_ff: 512 }),
        hybrid: Some(HybridParams { d_conv: 4, n_k_heads: 16, n_v_heads: 32, head_dim: 128, interval: 4, n_rot: 64, sections: [11, 11, 10, 0], n_ff_shared: 512, nextn: 0, packed_qkvz: false }),
        ..qwen35_27b()
    }
}

/// A tiny qwen35moe for tests: [`qwen35_tiny`]'s layers with 16 experts of 256 (4 used) and
/// a shared expert of 256 instead of the dense FFN.
pub fn qwen35moe_tiny() -> Hparams {
    let t = qwen35_tiny();
    Hparams {
        name: "qwen35moe-tiny",
        arch: "qwen35moe",
        n_ff: 0,
        moe: Some(super::moe::MoeParams { n_expert: 16, n_used: 4, n_ff: 256 }),
        hybrid: t.hybrid.map(|x| HybridParams { n_ff_shared: 256, ..x }),
        ..t
    }
}

/// A tiny qwen35 for tests: 4 layers (3 recurrent, then attention), n_embd 256; 2 q/k
/// heads shared by 4 value heads of 64 (so value head h reads key head h mod 2), kernel 4;
/// attention 4 q / 2 KV heads of 64 with 16 rotated dimensions; Qwen3's vocabulary size.
pub fn qwen35_tiny() -> Hparams {
    Hparams {
        name: "qwen35-tiny",
        n_embd: 256,
        n_layer: 4,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 512,
        n_vocab: 151936,
        context_length: 4096,
        hybrid: Some(HybridParams { d_conv: 4, n_k_heads: 2, n_v_heads: 4, head_dim: 64, interval: 4, n_rot: 16, sections: [3, 3, 2, 0], n_ff_shared: 0, nextn: 0, packed_qkvz: false }),
        ..qwen35_27b()
    }
}

pub fn hparams(p: Preset) -> Hparams {
    match p {
        Preset::Qwen35Tiny => qwen35_tiny(),
        Preset::Qwen35MoeTiny => qwen35moe_tiny(),
        Preset::Qwen35_35bA3b => qwen35_35b_a3b(),
        Preset::Qwen35TinyMtp => with_mtp(qwen35_tiny(), "qwen35-tiny-mtp"),
        Preset::Qwen35MoeTinyMtp => with_mtp(qwen35moe_tiny(), "qwen35moe-tiny-mtp"),
        Preset::Qwen35_27bMtp => with_mtp(qwen35_27b(), "qwen35-27b-mtp"),
        Preset::Qwen35_35bA3bMtp => with_mtp(qwen35_35b_a3b(), "qwen35-35b-a3b-mtp"),
        Preset::Qwen3NextTiny | Preset::Qwen3NextTinyQkv | Preset::Qwen3NextTinyMtp | Preset::Qwen3Next80bA3b => super::qwen3next::hparams(p),
        _ => qwen35_27b(),
    }
}

/// `h` with one multi-token-prediction block (as the MTP GGUFs of Qwen3.5 / 3.6 carry).
fn with_mtp(h: Hparams, name: &'static str) -> Hparams {
    Hparams { name, hybrid: h.hybrid.map(|x| HybridParams { nextn: 1, ..x }), ..h }
}

/// The multi-token-prediction block `blk.{n_layer}` (llama.cpp's qwen35 loader's
/// `load_block_mtp`): an attention block with the trunk's FFN, then the `nextn` tensors.
pub fn mtp_tensors(h: &Hparams, x: &HybridParams) -> Vec<(String, Vec<u64>)> {
    let (i, e) = (h.n_layer, h.n_embd);
    let mut v = block_tensors(h, x, i, false);
    let b = |s: &str| format!("blk.{i}.nextn.{s}.weight");
    v.extend([(b("eh_proj"), vec![2 * e, e]), (b("enorm"), vec![e]), (b("hnorm"), vec![e]), (b("shared_head_norm"), vec![e])]);
    v
}

/// One block's tensors in the order llama.cpp's loader asks for them: `(name, dims)`
/// (their types are the mix's, `quantize::mix::assign`, by name).
pub fn layer_tensors(h: &Hparams, x: &HybridParams, i: u64) -> Vec<(String, Vec<u64>)> {
    block_tensors(h, x, i, x.is_recurrent(i))
}

fn block_tensors(h: &Hparams, x: &HybridParams, i: u64, recurrent: bool) -> Vec<(String, Vec<u64>)> {
    let b = |s: &str| format!("blk.{i}.{s}.weight");
    let e = h.n_embd;
    let mut v = vec![(b("attn_norm"), vec![e]), (b("post_attention_norm"), vec![e])];
    if recurrent {
        let (ch, vd, nv) = (x.channels(), x.value_dim(), x.n_v_heads);
        // qwen3next: `ssm_in` or `attn_qkv` + `attn_gate`, and `ssm_ba` (llama.cpp's order).
        if x.packed_qkvz {
            v.push((b("ssm_in"), vec![e, ch + vd]));
        } else {
            v.extend([(b("attn_qkv"), vec![e, ch]), (b("attn_gate"), vec![e, vd])]);
        }
        v.extend([(b("ssm_conv1d"), vec![x.d_conv, ch]), (format!("blk.{i}.ssm_dt.bias"), vec![nv]), (format!("blk.{i}.ssm_a"), vec![nv])]);
        if h.arch == "qwen3next" {
            v.push((b("ssm_ba"), vec![e, 2 * nv]));
        } else {
            v.extend([(b("ssm_beta"), vec![e, nv]), (b("ssm_alpha"), vec![e, nv])]);
        }
        v.extend([(b("ssm_norm"), vec![x.head_dim]), (b("ssm_out"), vec![vd, e])]);
    } else {
        let (q, kv) = (h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
        v.extend([
            (b("attn_q"), vec![e, 2 * q]),
            (b("attn_k"), vec![e, kv]),
            (b("attn_v"), vec![e, kv]),
            (b("attn_output"), vec![q, e]),
            (b("attn_q_norm"), vec![h.head_dim]),
            (b("attn_k_norm"), vec![h.head_dim]),
        ]);
    }
    match h.moe {
        None => v.extend([(b("ffn_gate"), vec![e, h.n_ff]), (b("ffn_down"), vec![h.n_ff, e]), (b("ffn_up"), vec![e, h.n_ff])]),
        Some(m) => {
            v.extend([
                (b("ffn_gate_inp"), vec![e, m.n_expert]),
                (b("ffn_down_exps"), vec![m.n_ff, e, m.n_expert]),
                (b("ffn_gate_exps"), vec![e, m.n_ff, m.n_expert]),
                (b("ffn_up_exps"), vec![e, m.n_ff, m.n_expert]),
            ]);
            let fs = x.n_ff_shared;
            if fs > 0 {
                v.extend([
                    (b("ffn_gate_inp_shexp"), vec![e]),
                    (b("ffn_gate_shexp"), vec![e, fs]),
                    (b("ffn_up_shexp"), vec![e, fs]),
                    (b("ffn_down_shexp"), vec![fs, e]),
                ]);
            }
        }
    }
    v
}

/// The keys llama.cpp's qwen35 loader reads beyond the common ones.
pub fn metadata(a: &str, x: &HybridParams) -> Vec<(String, MetaValue)> {
    let u = |v: u64| MetaValue::U32(v as u32);
    vec![
        (format!("{a}.ssm.conv_kernel"), u(x.d_conv)),
        (format!("{a}.ssm.inner_size"), u(x.value_dim())),
        (format!("{a}.ssm.state_size"), u(x.head_dim)),
        (format!("{a}.ssm.time_step_rank"), u(x.n_v_heads)),
        (format!("{a}.ssm.group_count"), u(x.n_k_heads)),
        (format!("{a}.full_attention_interval"), u(x.interval)),
    ]
    .into_iter()
    // qwen3next's RoPE is plain NeoX: no sections.
    .chain((a != "qwen3next").then(|| (format!("{a}.rope.dimension_sections"), MetaValue::Array(ValueType::I32, x.sections.iter().map(|&s| MetaValue::I32(s)).collect()))))
    .chain((x.n_ff_shared > 0).then(|| (format!("{a}.expert_shared_feed_forward_length"), u(x.n_ff_shared))))
    .chain((x.nextn > 0).then(|| (format!("{a}.nextn_predict_layers"), u(x.nextn))))
    .collect()
}

/// A map of the default F32 fill ([0.9, 1.1), a norm's range) for the vectors whose meaning
/// needs another: `ssm_a` is `−exp(A_log)`, so negative (decays below 1); the shared
/// expert's gate row is centred on 0 ([−0.1, 0.1)), so its sigmoid does not saturate.
pub fn f32_map(name: &str) -> Option<fn(f32) -> f32> {
    if name.ends_with(".ssm_a") {
        Some(|v| -v)
    } else if name.ends_with(".ffn_gate_inp_shexp.weight") {
        Some(|v| v - 1.0)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::{metadata as all_metadata, plan, Quant};
    use super::*;
    use lode_runtime::quant::GgmlType::*;

    /// Qwen3.5-27B's tensor list: 48 recurrent layers of 14 tensors (two norms, nine of
    /// the delta net, three of the FFN), 16 attention layers of 11, and token_embd,
    /// output_norm, output; with the shapes llama.cpp's loader asks for.
    #[test]
    fn qwen35_27b_tensors_and_keys() {
        let h = hparams(Preset::Qwen35_27b);
        let p = plan(&h, Quant::Q4KM);
        assert_eq!(p.len(), 48 * 14 + 16 * 11 + 3);
        let get = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        // 2·16·128 + 48·128 channels; z and ssm_out 6144 wide; 48 value heads.
        assert_eq!(get("blk.0.attn_qkv.weight").1, [5120, 10240]);
        assert_eq!(get("blk.0.ssm_conv1d.weight"), (F32, vec![4, 10240]));
        assert_eq!(get("blk.2.ssm_a"), (F32, vec![48]));
        assert_eq!(get("blk.2.ssm_dt.bias"), (F32, vec![48]));
        assert_eq!(get("blk.1.ssm_out.weight").1, [6144, 5120]);
        assert_eq!(get("blk.1.ssm_norm.weight"), (F32, vec![128]));
        // Layer 3 is attention: q with its gate (2 · 24 · 256), 4 KV heads of 256.
        assert_eq!(get("blk.3.attn_q.weight").1, [5120, 12288]);
        assert_eq!(get("blk.3.attn_k.weight").1, [5120, 1024]);
        assert_eq!(get("blk.3.attn_output.weight").1, [6144, 5120]);
        assert_eq!(get("blk.3.post_attention_norm.weight"), (F32, vec![5120]));
        assert!(!p.iter().any(|t| t.name == "blk.3.attn_qkv.weight" || t.name == "blk.4.attn_q.weight" || t.name.contains("ffn_norm")));
        assert_eq!(get("output.weight"), (Q6_K, vec![5120, 248320]));
        let m = all_metadata(&h, Quant::Q4KM);
        let key = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {k}"));
        assert_eq!(key("general.architecture"), MetaValue::String("qwen35".into()));
        assert_eq!(key("qwen35.ssm.inner_size"), MetaValue::U32(6144));
        assert_eq!(key("qwen35.ssm.time_step_rank"), MetaValue::U32(48));
        assert_eq!(key("qwen35.ssm.group_count"), MetaValue::U32(16));
        assert_eq!(key("qwen35.ssm.state_size"), MetaValue::U32(128));
        assert_eq!(key("qwen35.ssm.conv_kernel"), MetaValue::U32(4));
        assert_eq!(key("qwen35.rope.dimension_count"), MetaValue::U32(64));
        assert_eq!(key("qwen35.full_attention_interval"), MetaValue::U32(4));
        assert_eq!(key("qwen35.attention.key_length"), MetaValue::U32(256));
        assert!(matches!(key("qwen35.rope.dimension_sections"), MetaValue::Array(ValueType::I32, ref v) if v.len() == 4));
    }

    /// The MTP presets: the trunk's tensors, then `blk.{n_layer}` as a gated-attention block
    /// with the trunk's FFN and the four `nextn` tensors; `block_count` counts the block
    /// and `nextn_predict_layers` says it is one (the plain presets write no such key).
    #[test]
    fn mtp_presets_carry_one_nextn_block() {
        let h = hparams(Preset::Qwen35_27bMtp);
        let p = plan(&h, Quant::Q4KM);
        assert_eq!(p.len(), 48 * 14 + 16 * 11 + 3 + 11 + 4);
        let get = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        assert_eq!(get("blk.64.nextn.eh_proj.weight").1, [10240, 5120]);
        assert_eq!(get("blk.64.nextn.hnorm.weight"), (F32, vec![5120]));
        assert_eq!(get("blk.64.attn_q.weight").1, [5120, 12288]);
        assert_eq!(get("blk.64.ffn_down.weight").1, [17408, 5120]);
        assert!(!p.iter().any(|t| t.name.starts_with("blk.64.") && (t.name.contains("ssm") || t.name.contains("attn_qkv"))));
        let m = all_metadata(&h, Quant::Q4KM);
        let key = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(key("qwen35.block_count"), Some(MetaValue::U32(65)));
        assert_eq!(key("qwen35.nextn_predict_layers"), Some(MetaValue::U32(1)));
        assert_eq!(all_metadata(&hparams(Preset::Qwen35_27b), Quant::Q4KM).iter().find(|(n, _)| n.ends_with("nextn_predict_layers")), None);
        let moe = plan(&hparams(Preset::Qwen35MoeTinyMtp), Quant::Q4KM);
        assert!(moe.iter().any(|t| t.name == "blk.4.ffn_gate_exps.weight") && moe.iter().any(|t| t.name == "blk.4.nextn.eh_proj.weight"));
    }

    /// Qwen3.6-35B-A3B: 30 recurrent layers of 19 tensors (two norms, the delta net's nine,
    /// the router, three expert tensors, the shared expert's four) and 10 attention layers
    /// of 16, and the expert keys llama.cpp's qwen35moe loader reads.
    #[test]
    fn qwen35_35b_a3b_tensors_and_keys() {
        let h = hparams(Preset::Qwen35_35bA3b);
        let p = plan(&h, Quant::Q4KM);
        assert_eq!(p.len(), 30 * 19 + 10 * 16 + 3);
        let get = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        assert_eq!(get("blk.0.attn_qkv.weight").1, [2048, 8192]);
        assert_eq!(get("blk.0.ffn_gate_inp.weight"), (F32, vec![2048, 256]));
        assert_eq!(get("blk.0.ffn_down_exps.weight").1, [512, 2048, 256]);
        assert_eq!(get("blk.3.ffn_gate_inp_shexp.weight"), (F32, vec![2048]));
        assert_eq!(get("blk.3.ffn_down_shexp.weight").1, [512, 2048]);
        assert_eq!(get("blk.3.attn_q.weight").1, [2048, 8192]);
        let m = all_metadata(&h, Quant::Q4KM);
        let key = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {k}"));
        assert_eq!(key("general.architecture"), MetaValue::String("qwen35moe".into()));
        assert_eq!(key("qwen35moe.expert_count"), MetaValue::U32(256));
        assert_eq!(key("qwen35moe.expert_used_count"), MetaValue::U32(8));
        assert_eq!(key("qwen35moe.expert_feed_forward_length"), MetaValue::U32(512));
        assert_eq!(key("qwen35moe.expert_shared_feed_forward_length"), MetaValue::U32(512));
        assert_eq!(key("qwen35moe.ssm.time_step_rank"), MetaValue::U32(32));
    }
}
