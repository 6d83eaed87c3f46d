//! The `qwen3next` presets of `lode synth` (Qwen3-Next-80B-A3B, Qwen3-Coder-Next): qwen35moe's
//! layers (`super::hybrid` writes them) with llama.cpp's qwen3next names
//! (`src/models/qwen3next.cpp`, gguf-py's `MODEL_TENSORS[QWEN3NEXT]`): the gates packed in
//! `ssm_ba` (per key head group its value heads' beta, then their alpha), the projections
//! as `attn_qkv` + `attn_gate` (what `convert_hf_to_gguf.py` writes today) or, in the
//! older files, one `ssm_in` (per key head group its q, k, v and z); value heads grouped by
//! key head (the converter keeps the checkpoint's order); plain NeoX RoPE (no sections).

use super::hybrid::HybridParams;
use super::moe::MoeParams;
use super::{Hparams, Preset};

/// Qwen/Qwen3-Next-80B-A3B-Instruct's `config.json` as llama.cpp's converter
/// (`Qwen3NextModel`) reads it: `hidden_size` 2048, `num_hidden_layers` 48 with
/// `full_attention_interval` 4 (no `layer_types`: 36 gated delta net, 12 gated attention),
/// `num_attention_heads` 16 and `num_key_value_heads` 2 of `head_dim` 256,
/// `partial_rotary_factor` 0.25 (`rope.dimension_count` 64), `rope_theta` 1e7,
/// `rms_norm_eps` 1e-6, `linear_conv_kernel_dim` 4, `linear_num_key_heads` 16 and
/// `linear_num_value_heads` 32 of `linear_key_head_dim` = `linear_value_head_dim` 128,
/// `num_experts` 512, `num_experts_per_tok` 10, `moe_intermediate_size` 512,
/// `shared_expert_intermediate_size` 512, `intermediate_size` 5120 (written as
/// `feed_forward_length`, read by no layer), `vocab_size` 151936 (Qwen3's tokenizer),
/// `max_position_embeddings` 262144, untied embeddings. The model card: 80B parameters,
/// 3B active, 512 experts with 10 routed and 1 shared. (Qwen3-Coder-Next has the same
/// shapes; its `rope_theta` differs, which changes no tensor.) The MTP block the
/// checkpoint carries is left out (`--no-mtp`'s file).
pub fn qwen3_next_80b_a3b() -> Hparams {
    Hparams {
        name: "qwen3-next-80b-a3b",
        arch: "qwen3next",
        n_embd: 2048,
        n_layer: 48,
        n_head: 16,
        n_head_kv: 2,
        head_dim: 256,
        n_ff: 5120,
        n_vocab: 151936,
        context_length: 262144,
        rope_base: 1e7,
        rms_eps: 1e-6,
        tied: false,
        qk_norm: true,
        moe: Some(MoeParams { n_expert: 512, n_used: 10, n_ff: 512 }),
        hybrid: Some(HybridParams {
            d_conv: 4,
            n_k_heads: 16,
            n_v_heads: 32,
            head_dim: 128,
            interval: 4,
            n_rot: 64,
            sections: [0; 4],
            n_ff_shared: 512,
            nextn: 0,
            packed_qkvz: false,
        }),
        ..Default::default()
    }
}

/// A tiny qwen3next for tests: qwen35moe-tiny's shapes (4 layers, 3 recurrent; n_embd 256;
/// 2 key heads and 4 value heads of 64, so value head h reads key head h / 2; attention 4 q
/// / 2 KV heads of 64 with 16 rotated dimensions; 16 experts of 256, 4 used, a shared
/// expert of 256) with the older files' packed `ssm_in`.
pub fn qwen3next_tiny() -> Hparams {
    let t = super::hybrid::hparams(Preset::Qwen35MoeTiny);
    Hparams {
        name: "qwen3next-tiny",
        arch: "qwen3next",
        hybrid: t.hybrid.map(|x| HybridParams { sections: [0; 4], packed_qkvz: true, ..x }),
        ..t
    }
}

/// [`super::hybrid::f32_map`] with slower decays: `ssm_a` (`−exp(A_log)`) in
/// −0.05·[0.9, 1.1), so `exp(softplus(·)·ssm_a)` is near 0.94 rather than 0.3 and a state
/// keeps its history (as real checkpoints' long-memory heads do). With the fast default an
/// output is mostly its newest token's, whose q·k is positive for either key head (both
/// after SiLU), so which key head a value head reads would hardly show in the logits.
pub fn f32_map(name: &str) -> Option<fn(f32) -> f32> {
    if name.ends_with(".ssm_a") {
        Some(|v| -0.05 * v)
    } else {
        super::hybrid::f32_map(name)
    }
}

pub fn hparams(p: Preset) -> Hparams {
    match p {
        Preset::Qwen3NextTiny => qwen3next_tiny(),
        Preset::Qwen3NextTinyQkv => {
            let t = qwen3next_tiny();
            Hparams { name: "qwen3next-tiny-qkv", hybrid: t.hybrid.map(|x| HybridParams { packed_qkvz: false, ..x }), ..t }
        }
        Preset::Qwen3NextTinyMtp => {
            let t = qwen3next_tiny();
            Hparams { name: "qwen3next-tiny-mtp", hybrid: t.hybrid.map(|x| HybridParams { nextn: 1, ..x }), ..t }
        }
        _ => qwen3_next_80b_a3b(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{data_bytes, metadata, plan, Quant};
    use super::*;
    use lode_runtime::gguf::MetaValue;
    use lode_runtime::quant::GgmlType::*;

    /// Qwen3-Next-80B-A3B: 36 recurrent layers of 18 tensors (two norms; attn_qkv,
    /// attn_gate, conv, dt, a, ssm_ba, norm, out; router, three expert tensors, the shared
    /// expert's four) and 12 attention layers of 16, with llama.cpp's shapes and keys; at
    /// Q4_K_M it is about 45 GB (the file the bench runs).
    #[test]
    fn qwen3_next_80b_tensors_keys_and_size() {
        let h = hparams(Preset::Qwen3Next80bA3b);
        let p = plan(&h, Quant::Q4KM);
        assert_eq!(p.len(), 36 * 18 + 12 * 16 + 3);
        let get = |n: &str| p.iter().find(|t| t.name == n).map(|t| (t.ty, t.dims.clone())).unwrap_or_else(|| panic!("no {n}"));
        // 2·16·128 + 32·128 channels, 32 value heads: ssm_ba 64 wide.
        assert_eq!(get("blk.0.attn_qkv.weight").1, [2048, 8192]);
        assert_eq!(get("blk.0.attn_gate.weight").1, [2048, 4096]);
        assert_eq!(get("blk.0.ssm_ba.weight").1, [2048, 64]);
        assert_eq!(get("blk.0.ssm_conv1d.weight"), (F32, vec![4, 8192]));
        assert_eq!(get("blk.0.ffn_down_exps.weight").1, [512, 2048, 512]);
        assert_eq!(get("blk.3.attn_q.weight").1, [2048, 8192]);
        assert_eq!(get("blk.3.attn_k.weight").1, [2048, 512]);
        assert_eq!(get("blk.47.ffn_gate_inp_shexp.weight"), (F32, vec![2048]));
        assert!(!p.iter().any(|t| t.name.contains("ssm_beta") || t.name.contains("ssm_in.")));
        let m = metadata(&h, Quant::Q4KM);
        let key = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(key("general.architecture"), Some(MetaValue::String("qwen3next".into())));
        assert_eq!(key("qwen3next.expert_count"), Some(MetaValue::U32(512)));
        assert_eq!(key("qwen3next.expert_used_count"), Some(MetaValue::U32(10)));
        assert_eq!(key("qwen3next.expert_shared_feed_forward_length"), Some(MetaValue::U32(512)));
        assert_eq!(key("qwen3next.ssm.group_count"), Some(MetaValue::U32(16)));
        assert_eq!(key("qwen3next.ssm.time_step_rank"), Some(MetaValue::U32(32)));
        assert_eq!(key("qwen3next.rope.dimension_count"), Some(MetaValue::U32(64)));
        assert_eq!(key("qwen3next.rope.dimension_sections"), None);
        let gb = data_bytes(&h, Quant::Q4KM).unwrap() as f64 / 1e9;
        eprintln!("qwen3-next-80b-a3b Q4_K_M: {gb:.2} GB of tensor data");
        assert!((40.0..50.0).contains(&gb), "{gb} GB");
    }

    /// The tiny preset packs q, k, v and z into `ssm_in` (channels + value_dim wide); the
    /// `-qkv` one writes them as qwen35 does.
    #[test]
    fn tiny_presets_pack_as_asked() {
        let p = plan(&hparams(Preset::Qwen3NextTiny), Quant::Q4KM);
        let dims = |p: &[super::super::Planned], n: &str| p.iter().find(|t| t.name == n).map(|t| t.dims.clone());
        assert_eq!(dims(&p, "blk.0.ssm_in.weight"), Some(vec![256, 2 * 128 + 256 + 256]));
        assert_eq!(dims(&p, "blk.0.ssm_ba.weight"), Some(vec![256, 8]));
        assert_eq!(dims(&p, "blk.0.attn_qkv.weight"), None);
        let q = plan(&hparams(Preset::Qwen3NextTinyQkv), Quant::Q4KM);
        assert_eq!(dims(&q, "blk.0.attn_qkv.weight"), Some(vec![256, 512]));
        assert_eq!(dims(&q, "blk.0.ssm_in.weight"), None);
    }
}
