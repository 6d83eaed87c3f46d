//! The large presets (24B to 70B: the models a 24 or 32 GiB card is bought for) and the
//! tokenizer each preset's file carries. Shapes and hyper-parameters are those of the
//! models' published `config.json` files on Hugging Face (named at each preset); what
//! llama.cpp's converter writes differently (Gemma's vocabulary rows) is noted there.

use super::Hparams;

/// Which tokenizer specials and chat template a file gets.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Tok {
    /// The architecture's: ChatML for `qwen3`, Llama 3's header format for `llama`.
    #[default]
    Arch,
    /// Gemma's `<start_of_turn>` / `<end_of_turn>` turns, `<bos>` = 2, `<eos>` = 1.
    Gemma,
    /// Mistral's `[INST]` / `[/INST]`, `<s>` = 1, `</s>` = 2.
    Mistral,
    /// Gemma 4's `<|turn>` / `<turn|>` turns, `<bos>` = 2, `<eos>` = 1.
    Gemma4,
}

/// google/gemma-3-27b-it, `text_config`: hidden 5376, intermediate 21504, 62 layers,
/// 32 heads, 16 KV heads of 128, `query_pre_attn_scalar` 168 (= 5376 / 32, which lode and
/// llama.cpp derive from the layer count: no key), `sliding_window` 1024 with every sixth
/// layer global (llama.cpp's fixed pattern), `rope_theta` 1e6 on the global layers with
/// `rope_scaling` linear × 8, `rope_local_base_freq` 10000 on the local ones (llama.cpp's
/// and lode's default for Gemma 3: no key), `rms_norm_eps` 1e-6,
/// `max_position_embeddings` 131072, tied embeddings. The vocabulary is the tokenizer's
/// 262,144 pieces: llama.cpp's converter writes that many embedding rows, not the
/// config's padded 262,208.
pub fn gemma3_27b() -> Hparams {
    Hparams {
        name: "gemma3-27b",
        arch: "gemma3",
        n_embd: 5376,
        n_layer: 62,
        n_head: 32,
        n_head_kv: 16,
        head_dim: 128,
        n_ff: 21504,
        n_vocab: 262144,
        context_length: 131072,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        qk_norm: true,
        rope_freqs: false,
        sliding_window: 1024,
        rope_linear: 8.0,
        post_norms: true,
        tok: Tok::Gemma,
        moe: None,
        hybrid: None,
        gemma4: None,
    }
}

/// mistralai/Mistral-Small-3.1-24B-Instruct-2503 (`text_config`; 3.2-24B-2506 has the same
/// shapes): hidden 5120, intermediate 32768, 40 layers, 32 heads, 8 KV heads of 128
/// (so q is 4096 wide, less than n_embd), `rope_theta` 1e9, `rms_norm_eps` 1e-5,
/// `max_position_embeddings` 131072, vocabulary 131072, untied. llama.cpp writes these
/// files with arch `llama` (no rope_freqs). The tokenizer (Tekken, `tokenizer.ggml.pre`
/// `tekken`) is stood in for by the synthetic byte-level vocabulary with Llama 3's
/// pre-tokenizer, which lode and llama.cpp split identically.
pub fn mistral_small_24b() -> Hparams {
    Hparams {
        name: "mistral-small-24b",
        arch: "llama",
        n_embd: 5120,
        n_layer: 40,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 32768,
        n_vocab: 131072,
        context_length: 131072,
        rope_base: 1e9,
        rms_eps: 1e-5,
        tok: Tok::Mistral,
        ..Default::default()
    }
}

/// meta-llama/Llama-3.1-70B(-Instruct) (3.3-70B has the same shapes): hidden 8192,
/// intermediate 28672, 80 layers, 64 heads, 8 KV heads of 128, vocabulary 128256,
/// `rope_theta` 500000 with "llama3" scaling (`rope_freqs.weight`, as the 8B),
/// `rms_norm_eps` 1e-5, `max_position_embeddings` 131072, untied.
pub fn llama_70b() -> Hparams {
    Hparams {
        name: "llama-70b",
        arch: "llama",
        n_embd: 8192,
        n_layer: 80,
        n_head: 64,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 28672,
        n_vocab: 128256,
        context_length: 131072,
        rope_base: 500000.0,
        rms_eps: 1e-5,
        rope_freqs: true,
        ..Default::default()
    }
}

/// Llama-3.1's RoPE frequency factors ("llama3" scaling: factor 8, low/high frequency
/// factors 1 and 4, original context 8192): 1 for short wavelengths, 8 for long ones,
/// a smooth blend between. ggml divides each rotation frequency by its factor.
pub fn llama3_rope_factors(h: &Hparams) -> Vec<f32> {
    let (factor, low, high, orig_ctx) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let (low_wavelen, high_wavelen) = (orig_ctx / low, orig_ctx / high);
    (0..h.head_dim / 2)
        .map(|i| {
            let freq = 1.0 / f64::from(h.rope_base).powf(2.0 * i as f64 / h.head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let f = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (orig_ctx / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            f as f32
        })
        .collect()
}

/// A file's tokenizer: pre-tokenizer name, special tokens at their real ids, and the
/// ids and template llama.cpp reads.
pub struct TokSpec {
    pub pre: &'static str,
    pub specials: &'static [(usize, &'static str)],
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub add_bos: bool,
    pub template: &'static str,
}

pub fn tokenizer(h: &Hparams) -> TokSpec {
    match (h.tok, h.arch) {
        (Tok::Gemma, _) => TokSpec {
            pre: "default",
            specials: &[(0, "<pad>"), (1, "<eos>"), (2, "<bos>"), (3, "<unk>"), (106, "<start_of_turn>"), (107, "<end_of_turn>")],
            bos: 2,
            eos: 1,
            pad: 0,
            add_bos: true,
            template: GEMMA,
        },
        // A byte-level stand-in for Gemma 4's own tokenizer (`gemma4`: BPE over
        // ▁-escaped text), with its specials and turn markers at their ids.
        (Tok::Gemma4, _) => TokSpec {
            pre: "default",
            specials: super::gemma4::SPECIALS,
            bos: 2,
            eos: 106,
            pad: 0,
            add_bos: true,
            template: super::gemma4::TEMPLATE,
        },
        (Tok::Mistral, _) => TokSpec {
            pre: "llama-bpe",
            specials: &[(0, "<unk>"), (1, "<s>"), (2, "</s>"), (3, "[INST]"), (4, "[/INST]")],
            bos: 1,
            eos: 2,
            pad: 0,
            add_bos: true,
            template: MISTRAL,
        },
        // qwen35 files stand in with Qwen3's ChatML specials (ids inside their larger
        // vocabulary); Qwen3.5's own tokenizer places them elsewhere.
        (Tok::Arch, "qwen3" | "qwen3moe" | "qwen35" | "qwen35moe" | "qwen3next") => TokSpec {
            pre: "qwen2",
            specials: &[(151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>")],
            bos: 151643,
            eos: 151645,
            pad: 151643,
            add_bos: false,
            template: CHATML,
        },
        // o200k_harmony: eos `<|return|>`, pad `<|endoftext|>`, no BOS added.
        (Tok::Arch, "gpt-oss") => TokSpec {
            pre: "gpt-4o",
            specials: super::gpt_oss::SPECIALS,
            bos: 199998,
            eos: 200002,
            pad: 199999,
            add_bos: false,
            template: super::gpt_oss::TEMPLATE,
        },
        (Tok::Arch, _) => TokSpec {
            pre: "llama-bpe",
            specials: &[
                (128000, "<|begin_of_text|>"),
                (128001, "<|end_of_text|>"),
                (128006, "<|start_header_id|>"),
                (128007, "<|end_header_id|>"),
                (128009, "<|eot_id|>"),
            ],
            bos: 128000,
            eos: 128009,
            pad: 128009,
            add_bos: true,
            template: LLAMA3,
        },
    }
}

/// ChatML, as Qwen uses it (without tools or thinking blocks).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Llama-3's header/eot format (without tools or the date preamble).
const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// Gemma's turns (the assistant's role is `model`; no system turn).
const GEMMA: &str = "{{ bos_token }}{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// Mistral's instruction turns (without tools or a system prompt).
const MISTRAL: &str = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}{{ '[INST]' + message['content'] + '[/INST]' }}{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}";
