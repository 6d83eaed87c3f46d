//! The mixture-of-experts presets of `lode synth` (qwen3moe) and their metadata keys, as
//! llama.cpp's loader reads them (`LLM_KV_EXPERT_COUNT`, `_USED_COUNT`,
//! `_FEED_FORWARD_LENGTH`); the tensor list and type mix are `plan` / `pick`'s.

use lode_runtime::gguf::MetaValue;

use super::{Hparams, Preset};

/// The experts of a MoE preset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeParams {
    /// `{arch}.expert_count`.
    pub n_expert: u64,
    /// `{arch}.expert_used_count`.
    pub n_used: u64,
    /// `{arch}.expert_feed_forward_length`: rows of each expert's gate and up.
    pub n_ff: u64,
}

/// Qwen3-30B-A3B's published config (`num_experts` 128, `num_experts_per_tok` 8,
/// `moe_intermediate_size` 768, `intermediate_size` 6144, untied embeddings), and a
/// tiny model of the same layout for tests.
pub fn hparams(p: Preset) -> Hparams {
    let base = Hparams {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        n_embd: 2048,
        n_layer: 48,
        n_head: 32,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 6144,
        n_vocab: 151936,
        context_length: 40960,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: false,
        qk_norm: true,
        rope_freqs: false,
        moe: Some(MoeParams { n_expert: 128, n_used: 8, n_ff: 768 }),
        ..Default::default()
    };
    match p {
        Preset::Qwen3MoeTiny => Hparams {
            name: "qwen3moe-tiny",
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_ff: 768,
            moe: Some(MoeParams { n_expert: 8, n_used: 2, n_ff: 256 }),
            ..base
        },
        _ => base,
    }
}

/// The expert keys of architecture `a`.
pub fn metadata(a: &str, m: &MoeParams) -> Vec<(String, MetaValue)> {
    let u = |v: u64| MetaValue::U32(v as u32);
    vec![
        (format!("{a}.expert_count"), u(m.n_expert)),
        (format!("{a}.expert_used_count"), u(m.n_used)),
        (format!("{a}.expert_feed_forward_length"), u(m.n_ff)),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::{plan, Quant};
    use super::*;
    use lode_runtime::quant::GgmlType::{self, *};

    fn census(p: Preset, mix: Quant) -> Vec<(GgmlType, usize)> {
        let mut c = std::collections::BTreeMap::new();
        for t in plan(&super::super::hparams(p), mix) {
            c.entry(t.ty.id()).or_insert((t.ty, 0)).1 += 1;
        }
        c.into_values().collect()
    }

    fn ty_of(p: Preset, mix: Quant, name: &str) -> (GgmlType, Vec<u64>) {
        let t = plan(&super::super::hparams(p), mix).into_iter().find(|t| t.name == name).unwrap();
        (t.ty, t.dims)
    }

    /// Qwen3-30B-A3B Q4_K_M as llama.cpp's quantizer mixes it: 579 tensors; F32: the four
    /// norms and the router per layer and output_norm (5·48 + 1); Q6_K: attn_v and
    /// ffn_down_exps on the 24 use_more_bits layers of 48, and output; Q4_K: the rest
    /// (attn_q, attn_k, attn_output, gate/up exps, the other 24 attn_v and down exps,
    /// the untied token_embd).
    #[test]
    fn qwen3_30b_a3b_q4_k_m_census() {
        let p = Preset::Qwen3_30bA3b;
        assert_eq!(census(p, Quant::Q4KM), [(F32, 241), (Q4_K, 5 * 48 + 2 * 24 + 1), (Q6_K, 2 * 24 + 1)]);
        assert_eq!(plan(&super::super::hparams(p), Quant::Q4KM).len(), 579);
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.0.ffn_gate_inp.weight"), (F32, vec![2048, 128]));
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.5.ffn_down_exps.weight"), (Q6_K, vec![768, 2048, 128]));
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.6.ffn_down_exps.weight"), (Q4_K, vec![768, 2048, 128]));
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.8.ffn_down_exps.weight").0, Q6_K);
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.7.ffn_gate_exps.weight"), (Q4_K, vec![2048, 768, 128]));
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.7.ffn_up_exps.weight"), (Q4_K, vec![2048, 768, 128]));
        assert_eq!(ty_of(p, Quant::Q4KM, "blk.7.attn_k.weight"), (Q4_K, vec![2048, 512]));
        assert_eq!(ty_of(p, Quant::Q4KM, "output.weight"), (Q6_K, vec![2048, 151936]));
        assert_eq!(ty_of(p, Quant::Q4KM, "token_embd.weight").0, Q4_K);
    }

    /// Exactly 8 experts: attn_k and attn_v Q8_0 and attn_output Q5_K in every mix.
    #[test]
    fn eight_experts_move_attention_types() {
        let p = Preset::Qwen3MoeTiny;
        assert_eq!(census(p, Quant::Q4KM), [(F32, 11), (Q8_0, 4), (Q4_K, 8), (Q5_K, 2), (Q6_K, 2)]);
        for mix in Quant::ALL {
            assert_eq!(ty_of(p, mix, "blk.1.attn_k.weight").0, Q8_0, "{mix:?}");
            assert_eq!(ty_of(p, mix, "blk.0.attn_v.weight").0, Q8_0, "{mix:?}");
            assert_eq!(ty_of(p, mix, "blk.0.attn_output.weight").0, Q5_K, "{mix:?}");
            assert_eq!(ty_of(p, mix, "blk.0.ffn_gate_inp.weight").0, F32, "{mix:?}");
        }
        // 128 experts (30B-A3B): attention follows the dense rules.
        assert_eq!(ty_of(Preset::Qwen3_30bA3b, Quant::Q3KM, "blk.5.attn_output.weight").0, Q4_K);
    }

    #[test]
    fn expert_keys_are_written() {
        let h = super::super::hparams(Preset::Qwen3_30bA3b);
        let m = super::super::metadata(&h, Quant::Q4KM);
        let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("general.architecture"), Some(MetaValue::String("qwen3moe".into())));
        assert_eq!(get("qwen3moe.expert_count"), Some(MetaValue::U32(128)));
        assert_eq!(get("qwen3moe.expert_used_count"), Some(MetaValue::U32(8)));
        assert_eq!(get("qwen3moe.expert_feed_forward_length"), Some(MetaValue::U32(768)));
        assert_eq!(get("qwen3moe.attention.head_count_kv"), Some(MetaValue::U32(4)));
        assert_eq!(get("tokenizer.ggml.eos_token_id"), Some(MetaValue::U32(151645)));
    }
}
