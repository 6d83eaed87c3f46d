//! The gemma4 presets of `lode synth` (llama.cpp's `gemma4` architecture, text only):
//! the tensor list of a layer in the converter's order, the keys llama.cpp's loader reads
//! (`load_arch_hparams` of `src/models/gemma4.cpp`), the float vectors' values and the
//! proportional RoPE factors the converter writes (`rope_freqs.weight`).
//!
//! Shapes, from the published configs (google/gemma-4-31B-it and
//! google/gemma-4-26B-A4B-it `text_config`, as llama.cpp's converter turns them into
//! keys), each number with where it was read:
//!
//! - gemma-4-31B: 60 layers, hidden 5376, 32 heads, 16 KV heads of 256 on the sliding
//!   layers and 4 (`num_global_key_value_heads`) of 512 (`global_head_dim`) on the full
//!   ones, whose V is K's projection (`attention_k_eq_v`: no `v_proj`), intermediate
//!   21504, vocabulary 262144, `final_logit_softcapping` 30, tied embeddings, sliding
//!   window 1024 on 5 layers of 6: the mlboydaisuke/Gemma-4-31B-CoreAI model card (which
//!   lists the config's fields), llama.cpp's load log of bartowski's
//!   google_gemma-4-31B-it Q8_0 in ggml-org/llama.cpp#21760 and of the 31B in
//!   kyuz0/amd-strix-halo-toolboxes#89 (`key_length` 512, `key_length_swa` 256,
//!   `rope.dimension_count` 512 / `_swa` 256, `sliding_window` 1024, `shared_kv_layers`
//!   0, `embedding_length_per_layer_input` 0, `final_logit_softcapping` 30, eps 1e-6);
//!   context 262144 (apxml.com/models/gemma-4-31b).
//! - gemma-4-26B-A4B: 30 layers, hidden 2816 (llama.cpp's `n_embd` in the load log of
//!   LostRuins/koboldcpp#2262; google/gemma.cpp#889), 16 heads and 8 KV heads of 256
//!   (gemma.cpp#889; apxml.com/models/gemma-4-26b-a4b), 128 experts, 8 used, expert FFN
//!   704 (`expert_feed_forward_length` in the load log of
//!   lemonade-sdk/llamacpp-rocm#81), the dense FFN beside them 2112 (apxml's listing of
//!   the config), 2 KV heads of 512 on the full layers (the config's
//!   `num_global_key_value_heads`; the 210 KiB per token of KV cache colaberry.ai lists
//!   for the model is 25·8·256·2·2 B + 5·2·512·2 B), the rest as the 31B.
//! - Both: `rope_theta` 1e6 on the full layers with proportional RoPE over a quarter of
//!   each head (`partial_rotary_factor` 0.25: 64 of 256 pairs rotated), 10000 on the
//!   sliding ones over all of it (llama.cpp's converter, `Gemma4Model`).
//!
//! The tiny presets keep that layout at test size: 4 layers (sliding, sliding, full,
//! sliding), 8 query heads, a 16-token window, 64-value sliding heads (4 KV heads) and
//! 128-value full heads (1 KV head, so a full layer's K/V rows are half as wide, as in
//! the 31B; V from K, a quarter rotated), soft-capping at 2.

use lode_runtime::gguf::{MetaValue, ValueType};

use super::moe::MoeParams;
use super::{Hparams, Preset, Tok};

/// What gemma4 adds to [`Hparams`] (whose `head_dim`, `n_head_kv` are the sliding
/// layers').
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct G4Params {
    /// The full-attention layers' head size and KV heads.
    pub head_dim_full: u64,
    pub n_head_kv_full: u64,
    /// Rotated pairs of a full layer's head (the rest get factor 1e30).
    pub rot_pairs_full: u64,
    /// The full layers have no `attn_v` (V is K's projection).
    pub v_from_k: bool,
    /// Layer `l` is a full-attention layer iff `l % period == period - 1`.
    pub period: u64,
    pub rope_base_swa: f32,
    pub softcap: f32,
}

impl G4Params {
    pub fn is_full(&self, l: u64) -> bool {
        l % self.period == self.period - 1
    }
}

pub fn hparams(p: Preset) -> Hparams {
    let g = G4Params { head_dim_full: 512, n_head_kv_full: 4, rot_pairs_full: 64, v_from_k: true, period: 6, rope_base_swa: 10000.0, softcap: 30.0 };
    let base = Hparams {
        name: "gemma4-31b",
        arch: "gemma4",
        n_embd: 5376,
        n_layer: 60,
        n_head: 32,
        n_head_kv: 16,
        head_dim: 256,
        n_ff: 21504,
        n_vocab: 262144,
        context_length: 262144,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        qk_norm: true,
        rope_freqs: false,
        sliding_window: 1024,
        post_norms: true,
        tok: Tok::Gemma4,
        gemma4: Some(g),
        ..Default::default()
    };
    let tiny = Hparams {
        name: "gemma4-tiny",
        n_embd: 256,
        n_layer: 4,
        n_head: 8,
        n_head_kv: 4,
        head_dim: 64,
        n_ff: 512,
        n_vocab: 16384,
        context_length: 4096,
        sliding_window: 16,
        // A cap of 2: the tiny model's logits (of order 1) are visibly capped.
        gemma4: Some(G4Params { head_dim_full: 128, n_head_kv_full: 1, rot_pairs_full: 16, period: 3, softcap: 2.0, ..g }),
        ..base.clone()
    };
    match p {
        Preset::Gemma4_26bA4b => Hparams {
            name: "gemma4-26b-a4b",
            n_embd: 2816,
            n_layer: 30,
            n_head: 16,
            n_head_kv: 8,
            n_ff: 2112,
            gemma4: Some(G4Params { n_head_kv_full: 2, ..g }),
            moe: Some(MoeParams { n_expert: 128, n_used: 8, n_ff: 704 }),
            ..base
        },
        Preset::Gemma4Tiny => tiny,
        Preset::Gemma4MoeTiny => Hparams { name: "gemma4moe-tiny", n_ff: 256, moe: Some(MoeParams { n_expert: 16, n_used: 4, n_ff: 256 }), ..tiny },
        _ => base,
    }
}

/// Layer `i`'s tensors in the order llama.cpp's converter writes them.
pub fn layer_tensors(h: &Hparams, g: &G4Params, i: u64) -> Vec<(String, Vec<u64>)> {
    let full = g.is_full(i);
    let (hd, nkv) = if full { (g.head_dim_full, g.n_head_kv_full) } else { (h.head_dim, h.n_head_kv) };
    let (e, qd, kv) = (h.n_embd, h.n_head * hd, nkv * hd);
    let t = |s: &str, d: &[u64]| (format!("blk.{i}.{s}"), d.to_vec());
    let mut v = vec![t("attn_norm.weight", &[e]), t("attn_q.weight", &[e, qd]), t("attn_k.weight", &[e, kv])];
    if !(full && g.v_from_k) {
        v.push(t("attn_v.weight", &[e, kv]));
    }
    v.extend([
        t("attn_output.weight", &[qd, e]),
        t("attn_q_norm.weight", &[hd]),
        t("attn_k_norm.weight", &[hd]),
        t("post_attention_norm.weight", &[e]),
        t("layer_output_scale.weight", &[1]),
        t("ffn_norm.weight", &[e]),
        t("ffn_gate.weight", &[e, h.n_ff]),
        t("ffn_up.weight", &[e, h.n_ff]),
        t("ffn_down.weight", &[h.n_ff, e]),
        t("post_ffw_norm.weight", &[e]),
    ]);
    if let Some(m) = h.moe {
        let (f, ne) = (m.n_ff, m.n_expert);
        v.extend([
            t("ffn_gate_inp.weight", &[e, ne]),
            t("ffn_gate_inp.scale", &[e]),
            t("pre_ffw_norm_2.weight", &[e]),
            t("post_ffw_norm_1.weight", &[e]),
            t("post_ffw_norm_2.weight", &[e]),
            // Gate and up as one tensor, as gemma4's GGUF files carry them (llama.cpp's
            // converter wrote `ffn_gate_up_exps` for gemma4 from the start; the 26B-A4B
            // files' 658 tensors count it once per layer).
            t("ffn_gate_up_exps.weight", &[e, 2 * f, ne]),
            t("ffn_down_exps.weight", &[f, e, ne]),
            t("ffn_down_exps.scale", &[ne]),
        ]);
    }
    v
}

/// The gemma4 keys, replacing the common ones that differ (`head_count_kv` per layer,
/// the full layers' `key_length` / `rope.dimension_count`) and adding the rest.
pub fn metadata(h: &Hparams, g: &G4Params, m: &mut Vec<(String, MetaValue)>) {
    let a = h.arch;
    let u = |v: u64| MetaValue::U32(v as u32);
    let set = |m: &mut Vec<(String, MetaValue)>, k: String, v: MetaValue| match m.iter_mut().find(|(n, _)| *n == k) {
        Some(slot) => slot.1 = v,
        None => m.push((k, v)),
    };
    let kv: Vec<MetaValue> = (0..h.n_layer).map(|l| u(if g.is_full(l) { g.n_head_kv_full } else { h.n_head_kv })).collect();
    set(m, format!("{a}.attention.head_count_kv"), MetaValue::Array(ValueType::U32, kv));
    set(m, format!("{a}.attention.key_length"), u(g.head_dim_full));
    set(m, format!("{a}.attention.value_length"), u(g.head_dim_full));
    set(m, format!("{a}.rope.dimension_count"), u(g.head_dim_full));
    let pattern: Vec<MetaValue> = (0..h.n_layer).map(|l| MetaValue::Bool(!g.is_full(l))).collect();
    for (k, v) in [
        ("attention.key_length_swa", u(h.head_dim)),
        ("attention.value_length_swa", u(h.head_dim)),
        ("rope.dimension_count_swa", u(h.head_dim)),
        ("rope.freq_base_swa", MetaValue::F32(g.rope_base_swa)),
        ("final_logit_softcapping", MetaValue::F32(g.softcap)),
        ("attention.shared_kv_layers", u(0)),
        ("embedding_length_per_layer_input", u(0)),
        ("attention.sliding_window_pattern", MetaValue::Array(ValueType::Bool, pattern)),
    ] {
        set(m, format!("{a}.{k}"), v);
    }
}

/// `rope_freqs.weight` as the converter writes it: 1 for the rotated pairs of a full
/// layer's head, 1e30 (never rotated) for the rest.
pub fn rope_factors(g: &G4Params) -> Vec<f32> {
    (0..g.head_dim_full / 2).map(|i| if i < g.rot_pairs_full { 1.0 } else { 1e30 }).collect()
}

/// The values of gemma4's F32 tensors, from the generator's [0.9, 1.1): the layer output
/// scales near 0.5; the router centred on 0 (±2, so that its logits spread over a few
/// units and the top-k has no near-ties); the q and k norms near 0.3 (gemma4 does not
/// scale q·k: with norms near 1 the scores of 64- to 512-value heads would reach the
/// hundreds and every softmax would be one key; 0.3² is about 1/√head_dim, as a trained
/// model's norms make it); the router's input scale and the experts' output scales near
/// 1 (±0.1, as they come); the other norms as they come.
pub fn f32_map(name: &str) -> Option<fn(f32) -> f32> {
    if name.ends_with(".attn_q_norm.weight") || name.ends_with(".attn_k_norm.weight") {
        Some(|v| v * 0.3)
    } else if name.ends_with(".layer_output_scale.weight") {
        Some(|v| v * 0.5)
    } else if name.ends_with(".ffn_gate_inp.weight") {
        Some(|v| (v - 1.0) * 20.0)
    } else {
        None
    }
}

/// Gemma 4's specials (`<|turn>` / `<turn|>` turns) at the ids its tokenizer gives them.
pub const SPECIALS: &[(usize, &str)] = &[(0, "<pad>"), (1, "<eos>"), (2, "<bos>"), (3, "<unk>"), (105, "<|turn>"), (106, "<turn|>")];

/// Gemma 4's turns (the assistant's role is `model`; system turns allowed), without the
/// thinking and tool parts of the real template.
pub const TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{ '<|turn>' + role + '\\n' + message['content'] | trim + '<turn|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\\n' }}{% endif %}";

#[cfg(test)]
mod tests {
    use super::super::{data_bytes, metadata as all_metadata, plan, Quant};
    use super::*;
    use lode_runtime::quant::GgmlType::*;

    /// The 31B under Q4_K_M: 14 tensors per sliding layer, 13 per full one (no attn_v),
    /// 833 in all as in the published GGUFs (llama.cpp's load log in
    /// ggml-org/llama.cpp#21760), the full layers' q/k/output of 512-value heads over 4 KV
    /// heads, every matrix quantized (the mix's rules found every name), and its size.
    #[test]
    fn gemma4_31b_layout() {
        let h = super::super::hparams(Preset::Gemma4_31b);
        let p = plan(&h, Quant::Q4KM);
        assert_eq!(p.len(), 50 * 14 + 10 * 13 + 3);
        assert_eq!(p.len(), 833);
        let t = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        assert_eq!(t("blk.5.attn_q.weight").1, vec![5376, 16384]);
        assert_eq!(t("blk.5.attn_k.weight").1, vec![5376, 2048]);
        assert!(p.iter().all(|x| x.name != "blk.5.attn_v.weight"));
        assert_eq!(t("blk.0.attn_v.weight").1, vec![5376, 4096]);
        assert_eq!(t("blk.5.attn_output.weight").1, vec![16384, 5376]);
        assert_eq!(t("blk.0.attn_q_norm.weight"), (F32, vec![256]));
        assert_eq!(t("blk.5.attn_q_norm.weight"), (F32, vec![512]));
        assert_eq!(t("rope_freqs.weight"), (F32, vec![256]));
        assert!(p.iter().filter(|x| x.dims.len() >= 2).all(|x| x.ty != F32), "a matrix left F32: the mix did not apply");
        let gb = data_bytes(&h, Quant::Q4KM).unwrap() as f64 / 1e9;
        eprintln!("gemma4-31b q4_k_m: {gb:.2} GB of tensor data");
        assert!((17.0..20.0).contains(&gb), "{gb} GB");
    }

    /// The 26B-A4B: the dense FFN and the experts in every layer, the router F32, and the
    /// keys llama.cpp's loader reads.
    #[test]
    fn gemma4_26b_a4b_layout_and_keys() {
        let h = super::super::hparams(Preset::Gemma4_26bA4b);
        let p = plan(&h, Quant::Q4KM);
        let t = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        assert_eq!(t("blk.0.ffn_gate.weight").1, vec![2816, 2112]);
        assert_eq!(t("blk.0.ffn_gate_up_exps.weight").1, vec![2816, 1408, 128]);
        assert!(t("blk.0.ffn_gate_up_exps.weight").0 != F32);
        // The tensor count of the published 26B-A4B GGUFs (llama.cpp's load log in
        // LostRuins/koboldcpp#2262: 658).
        assert_eq!(p.len(), 658);
        assert_eq!(t("blk.0.ffn_gate_inp.weight"), (F32, vec![2816, 128]));
        assert_eq!(t("blk.29.ffn_down_exps.scale"), (F32, vec![128]));
        assert_eq!(t("blk.5.attn_k.weight").1, vec![2816, 1024]);
        let gb = data_bytes(&h, Quant::Q4KM).unwrap() as f64 / 1e9;
        eprintln!("gemma4-26b-a4b q4_k_m: {gb:.2} GB of tensor data");
        assert!((14.0..18.0).contains(&gb), "{gb} GB");
        let m = all_metadata(&h, Quant::Q4KM);
        let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("no {k}"));
        assert_eq!(get("gemma4.attention.key_length"), MetaValue::U32(512));
        assert_eq!(get("gemma4.attention.key_length_swa"), MetaValue::U32(256));
        assert_eq!(get("gemma4.rope.dimension_count_swa"), MetaValue::U32(256));
        assert_eq!(get("gemma4.expert_feed_forward_length"), MetaValue::U32(704));
        assert_eq!(get("gemma4.final_logit_softcapping"), MetaValue::F32(30.0));
        let MetaValue::Array(_, kv) = get("gemma4.attention.head_count_kv") else { panic!("head_count_kv is not per layer") };
        assert_eq!((kv[0].clone(), kv[5].clone(), kv.len()), (MetaValue::U32(8), MetaValue::U32(2), 30));
        let MetaValue::Array(_, pat) = get("gemma4.attention.sliding_window_pattern") else { panic!("no pattern") };
        assert_eq!(pat.iter().filter(|b| **b == MetaValue::Bool(false)).count(), 5);
        assert_eq!(get("tokenizer.ggml.eos_token_id"), MetaValue::U32(106));
    }

    /// The proportional RoPE factors: a quarter of a 512-value head rotated.
    #[test]
    fn rope_factors_leave_three_quarters_unrotated() {
        let Some(g) = super::super::hparams(Preset::Gemma4_31b).gemma4 else { panic!("no gemma4 params") };
        let f = rope_factors(&g);
        assert_eq!((f.len(), f.iter().filter(|&&x| x == 1.0).count()), (256, 64));
        assert!(f[64..].iter().all(|&x| x == 1e30));
    }
}
