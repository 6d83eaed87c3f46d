//! The gpt-oss presets of `lode synth` (llama.cpp's `gpt-oss` architecture, its
//! `openai_moe` graph): the tensor list of a layer, the keys llama.cpp's loader reads, the
//! values of the float vectors (biases, sinks) and the o200k_harmony tokenizer's
//! specials with the model's own chat template.

use lode_runtime::gguf::MetaValue;

use super::moe::MoeParams;
use super::{Hparams, Preset};

/// openai/gpt-oss-20b's published config: hidden 2880, 24 layers, 64 heads and 8 KV
/// heads of 64, 32 local experts (4 per token) of intermediate 2880, vocabulary 201,088,
/// `sliding_window` 128 on every other layer (layer 0 first), `rope_theta` 150000 with
/// YaRN × 32 over an original context of 4096, `rms_norm_eps` 1e-5,
/// `max_position_embeddings` 131072, untied embeddings; and a tiny model of the same
/// layout for tests.
pub fn hparams(p: Preset) -> Hparams {
    let base = Hparams {
        name: "gpt-oss-20b",
        arch: "gpt-oss",
        n_embd: 2880,
        n_layer: 24,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 64,
        n_ff: 2880,
        n_vocab: 201088,
        context_length: 131072,
        rope_base: 150000.0,
        rms_eps: 1e-5,
        tied: false,
        qk_norm: false,
        rope_freqs: false,
        sliding_window: 128,
        moe: Some(MoeParams { n_expert: 32, n_used: 4, n_ff: 2880 }),
        ..Default::default()
    };
    match p {
        // Windows of 16 so a 64-token test sequence crosses them.
        Preset::GptOssTiny => Hparams {
            name: "gpt-oss-tiny",
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_ff: 256,
            sliding_window: 16,
            moe: Some(MoeParams { n_expert: 8, n_used: 4, n_ff: 256 }),
            ..base
        },
        _ => base,
    }
}

/// YaRN's factor and original context (`rope.scaling.*`).
const YARN_FACTOR: f32 = 32.0;
const YARN_ORIG_CTX: u32 = 4096;

/// Layer `i`'s tensors in the order llama.cpp's converter writes them.
pub fn layer_tensors(h: &Hparams, m: &MoeParams, i: u64) -> Vec<(String, Vec<u64>)> {
    let (e, qd, kv) = (h.n_embd, h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
    let (f, ne) = (m.n_ff, m.n_expert);
    let t = |s: &str, d: &[u64]| (format!("blk.{i}.{s}"), d.to_vec());
    vec![
        t("attn_norm.weight", &[e]),
        t("attn_q.weight", &[e, qd]),
        t("attn_q.bias", &[qd]),
        t("attn_k.weight", &[e, kv]),
        t("attn_k.bias", &[kv]),
        t("attn_v.weight", &[e, kv]),
        t("attn_v.bias", &[kv]),
        t("attn_output.weight", &[qd, e]),
        t("attn_output.bias", &[e]),
        t("attn_sinks.weight", &[h.n_head]),
        t("post_attention_norm.weight", &[e]),
        t("ffn_gate_inp.weight", &[e, ne]),
        t("ffn_gate_inp.bias", &[ne]),
        t("ffn_gate_exps.weight", &[e, f, ne]),
        t("ffn_gate_exps.bias", &[f, ne]),
        t("ffn_up_exps.weight", &[e, f, ne]),
        t("ffn_up_exps.bias", &[f, ne]),
        t("ffn_down_exps.weight", &[f, e, ne]),
        t("ffn_down_exps.bias", &[e, ne]),
    ]
}

/// The keys gpt-oss adds to the common ones (sliding window and experts are written by
/// the common code): YaRN's type, factor and original context.
pub fn metadata(a: &str) -> Vec<(String, MetaValue)> {
    vec![
        (format!("{a}.rope.scaling.type"), MetaValue::String("yarn".into())),
        (format!("{a}.rope.scaling.factor"), MetaValue::F32(YARN_FACTOR)),
        (format!("{a}.rope.scaling.original_context_length"), MetaValue::U32(YARN_ORIG_CTX)),
    ]
}

/// The values of gpt-oss's F32 tensors, from the generator's [0.9, 1.1): biases centred
/// on 0 (±0.1); attention sinks in [−1, 3) (comparable with the scores, so they take a
/// visible share of each softmax); the router centred on 0 (±0.005, logits of order 1);
/// the FFN norm ×20, so that a few percent of the experts' gate and up values pass
/// `swiglu_oai`'s clamp at ±7 (as real gpt-oss activations do); `None` for the other
/// norms (kept near 1).
pub fn f32_map(name: &str) -> Option<fn(f32) -> f32> {
    if name.ends_with(".attn_sinks.weight") {
        Some(|v| (v - 0.9) * 20.0 - 1.0)
    } else if name.ends_with(".bias") {
        Some(|v| v - 1.0)
    } else if name.ends_with(".ffn_gate_inp.weight") {
        Some(|v| (v - 1.0) * 0.05)
    } else if name.ends_with(".post_attention_norm.weight") {
        Some(|v| v * 20.0)
    } else {
        None
    }
}

/// o200k_harmony's special tokens at their ids (the reserved ones between them too).
pub const SPECIALS: &[(usize, &str)] = &[
    (199998, "<|startoftext|>"),
    (199999, "<|endoftext|>"),
    (200000, "<|reserved_200000|>"),
    (200001, "<|reserved_200001|>"),
    (200002, "<|return|>"),
    (200003, "<|constrain|>"),
    (200004, "<|reserved_200004|>"),
    (200005, "<|channel|>"),
    (200006, "<|start|>"),
    (200007, "<|end|>"),
    (200008, "<|message|>"),
    (200009, "<|reserved_200009|>"),
    (200010, "<|reserved_200010|>"),
    (200011, "<|reserved_200011|>"),
    (200012, "<|call|>"),
    (200018, "<|endofprompt|>"),
];

/// gpt-oss's chat template as its GGUF files carry it (the harmony format: system and
/// developer preambles, channels, tool calls), from llama.cpp's `models/templates`.
pub const TEMPLATE: &str = include_str!("gpt_oss.jinja");

#[cfg(test)]
mod tests {
    use super::super::{metadata as all_metadata, plan, Quant};
    use super::*;
    use lode_runtime::quant::GgmlType::{self, *};

    fn census(p: Preset) -> Vec<(GgmlType, usize)> {
        let mut c = std::collections::BTreeMap::new();
        for t in plan(&super::super::hparams(p), Quant::MXFP4MOE) {
            c.entry(t.ty.id()).or_insert((t.ty, 0)).1 += 1;
        }
        c.into_values().collect()
    }

    /// gpt-oss-20b under llama.cpp's MXFP4_MOE mix: 19 tensors per layer and 3 more; the
    /// three expert matrices MXFP4, every other matrix (attention, router excepted: it
    /// stays F32 as in every mix) and the embeddings and LM head Q8_0, vectors F32.
    #[test]
    fn gpt_oss_20b_mxfp4_moe_census() {
        let h = super::super::hparams(Preset::GptOss20b);
        let p = plan(&h, Quant::MXFP4MOE);
        assert_eq!(p.len(), 19 * 24 + 3);
        assert_eq!(census(Preset::GptOss20b), [(F32, 24 * 12 + 1), (Q8_0, 4 * 24 + 2), (MXFP4, 3 * 24)]);
        let ty = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap();
        assert_eq!(ty("blk.0.ffn_gate_exps.weight"), (MXFP4, vec![2880, 2880, 32]));
        assert_eq!(ty("blk.23.ffn_down_exps.weight"), (MXFP4, vec![2880, 2880, 32]));
        assert_eq!(ty("blk.0.ffn_down_exps.bias"), (F32, vec![2880, 32]));
        assert_eq!(ty("blk.3.attn_q.weight"), (Q8_0, vec![2880, 4096]));
        assert_eq!(ty("blk.3.attn_sinks.weight"), (F32, vec![64]));
        assert_eq!(ty("blk.3.ffn_gate_inp.weight"), (F32, vec![2880, 32]));
        assert_eq!(ty("output.weight"), (Q8_0, vec![2880, 201088]));
        assert_eq!(ty("token_embd.weight"), (Q8_0, vec![2880, 201088]));
    }

    #[test]
    fn gpt_oss_keys_and_tokenizer() {
        let h = super::super::hparams(Preset::GptOss20b);
        let m = all_metadata(&h, Quant::MXFP4MOE);
        let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("general.architecture"), Some(MetaValue::String("gpt-oss".into())));
        assert_eq!(get("general.file_type"), Some(MetaValue::U32(38)));
        assert_eq!(get("gpt-oss.expert_count"), Some(MetaValue::U32(32)));
        assert_eq!(get("gpt-oss.expert_used_count"), Some(MetaValue::U32(4)));
        assert_eq!(get("gpt-oss.expert_feed_forward_length"), Some(MetaValue::U32(2880)));
        assert_eq!(get("gpt-oss.attention.sliding_window"), Some(MetaValue::U32(128)));
        assert_eq!(get("gpt-oss.rope.scaling.type"), Some(MetaValue::String("yarn".into())));
        assert_eq!(get("gpt-oss.rope.scaling.original_context_length"), Some(MetaValue::U32(4096)));
        assert_eq!(get("tokenizer.ggml.pre"), Some(MetaValue::String("gpt-4o".into())));
        assert_eq!(get("tokenizer.ggml.eos_token_id"), Some(MetaValue::U32(200002)));
        assert_eq!(get("tokenizer.chat_template"), Some(MetaValue::String(TEMPLATE.into())));
        let Some(MetaValue::Array(_, toks)) = get("tokenizer.ggml.tokens") else { panic!("no tokens") };
        assert_eq!(toks.len(), 201088);
        for (id, text) in [(200006, "<|start|>"), (200007, "<|end|>"), (200008, "<|message|>"), (200005, "<|channel|>"), (200002, "<|return|>"), (200012, "<|call|>"), (200003, "<|constrain|>"), (199999, "<|endoftext|>")] {
            assert_eq!(toks[id], MetaValue::String(text.into()), "id {id}");
        }
    }

    /// The embedded template renders through lode's chat-template engine as Jinja2 renders
    /// it (the expected text is Python jinja2's output for these messages; only the date
    /// line, today's, is cut out of both).
    #[test]
    fn harmony_template_renders_as_jinja2() {
        use lode_runtime::tokenizer::ChatMessage;
        let t = lode_runtime::tokenizer::ChatTemplate::new(TEMPLATE, "<|startoftext|>", "<|return|>").unwrap();
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hello"),
            ChatMessage::new("assistant", "Hi there"),
            ChatMessage::new("user", "Capital of France?"),
        ];
        let got = t.render(&msgs, true).unwrap();
        let undate = |s: &str| s.lines().filter(|l| !l.starts_with("Current date: ")).collect::<Vec<_>>().join("\n");
        let want = "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\nKnowledge cutoff: 2024-06\nCurrent date: 2026-01-01\n\nReasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|><|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi there<|end|><|start|>user<|message|>Capital of France?<|end|><|start|>assistant";
        assert!(got.contains("\nCurrent date: 20"), "{got}");
        assert_eq!(undate(&got), undate(want));
    }
}
