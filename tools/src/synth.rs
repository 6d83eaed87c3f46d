//! `lode synth`: write a GGUF with a real architecture's tensor shapes, hyper-parameters
//! and one of llama.cpp's quantization type mixes, filled with random (valid) blocks and a
//! minimal tokenizer. Speed work needs 4B/8B-sized files on machines where no real model
//! of that size can be fetched; such a file loads in lode and in llama.cpp alike.

mod blocks;
pub mod gemma4;
pub mod gpt_oss;
pub mod hybrid;
pub mod qwen3next;
mod presets;
pub mod moe;
mod vocab;

pub use presets::Tok;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use lode_runtime::gguf::{GgufWriter, MetaValue, ValueType};
use lode_runtime::quant::GgmlType;

/// Architectures `lode synth` can lay out.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// Qwen3-0.6B: 28 layers, n_embd 1024, tied embeddings.
    #[value(name = "qwen3-0.6b")]
    Qwen3_0_6b,
    /// Qwen3-4B: 36 layers, n_embd 2560, tied embeddings.
    #[value(name = "qwen3-4b")]
    Qwen3_4b,
    /// Llama-3.1-8B: 32 layers, n_embd 4096, separate output matrix.
    #[value(name = "llama-8b")]
    Llama8b,
    /// Gemma-3-27B: 62 layers, n_embd 5376, 32 q / 16 KV heads, 5 of 6 layers with a
    /// 1024-token sliding window, tied embeddings.
    #[value(name = "gemma3-27b")]
    Gemma3_27b,
    /// Mistral-Small-3.1/3.2-24B (arch `llama`): 40 layers, n_embd 5120, FFN 32768,
    /// vocabulary 131,072.
    #[value(name = "mistral-small-24b")]
    MistralSmall24b,
    /// Qwen3-32B: 64 layers, n_embd 5120, 64 q / 8 KV heads, separate output matrix.
    #[value(name = "qwen3-32b")]
    Qwen3_32b,
    /// Llama-3.1-70B / 3.3-70B: 80 layers, n_embd 8192, 64 q / 8 KV heads.
    #[value(name = "llama-70b")]
    Llama70b,
    /// Qwen3-30B-A3B (qwen3moe): 48 layers, n_embd 2048, 128 experts of FFN 768, 8 used.
    #[value(name = "qwen3-30b-a3b")]
    Qwen3_30bA3b,
    /// A tiny qwen3moe for tests: 2 layers, n_embd 256, 8 experts of FFN 256, 2 used.
    #[value(name = "qwen3moe-tiny")]
    Qwen3MoeTiny,
    /// Qwen3.5-27B / Qwen3.6-27B (qwen35): 64 layers (48 gated delta net, 16 gated
    /// attention), n_embd 5120, FFN 17408.
    #[value(name = "qwen35-27b")]
    Qwen35_27b,
    /// A tiny qwen35 for tests: 4 layers (3 gated delta net, 1 gated attention), n_embd 256.
    #[value(name = "qwen35-tiny")]
    Qwen35Tiny,
    /// Qwen3.6-35B-A3B (qwen35moe): 40 layers (30 gated delta net, 10 gated attention),
    /// n_embd 2048, 256 experts of FFN 512 (8 used) and a shared expert.
    #[value(name = "qwen35-35b-a3b")]
    Qwen35_35bA3b,
    /// A tiny qwen35moe for tests: qwen35-tiny's layers, 16 experts of 256 (4 used), shared 256.
    #[value(name = "qwen35moe-tiny")]
    Qwen35MoeTiny,
    /// qwen35-tiny with a multi-token-prediction block (`blk.4.nextn.*`, `--spec-type draft-mtp`).
    #[value(name = "qwen35-tiny-mtp")]
    Qwen35TinyMtp,
    /// qwen35moe-tiny with a multi-token-prediction block (experts in it too).
    #[value(name = "qwen35moe-tiny-mtp")]
    Qwen35MoeTinyMtp,
    /// qwen35-27b with its multi-token-prediction block (`blk.64.nextn.*`), as the
    /// Qwen3.5 / 3.6 MTP GGUFs carry it.
    #[value(name = "qwen35-27b-mtp")]
    Qwen35_27bMtp,
    /// qwen35-35b-a3b with its multi-token-prediction block (`blk.40.nextn.*`).
    #[value(name = "qwen35-35b-a3b-mtp")]
    Qwen35_35bA3bMtp,
    /// Qwen3-Next-80B-A3B / Qwen3-Coder-Next (qwen3next): 48 layers (36 gated delta net, 12
    /// gated attention), n_embd 2048, 512 experts of FFN 512 (10 used) and a shared expert.
    #[value(name = "qwen3-next-80b-a3b")]
    Qwen3Next80bA3b,
    /// A tiny qwen3next for tests: qwen35moe-tiny's shapes, value heads grouped by key head,
    /// the packed `ssm_in` and `ssm_ba` of the older files.
    #[value(name = "qwen3next-tiny")]
    Qwen3NextTiny,
    /// qwen3next-tiny as llama.cpp's converter writes it today (`attn_qkv` + `attn_gate`).
    #[value(name = "qwen3next-tiny-qkv")]
    Qwen3NextTinyQkv,
    /// qwen3next-tiny with a multi-token-prediction block (`blk.4.nextn.*`, as Qwen3-Next's).
    #[value(name = "qwen3next-tiny-mtp")]
    Qwen3NextTinyMtp,
    /// gpt-oss-20b: 24 layers, n_embd 2880, 64 q / 8 KV heads of 64, 32 experts of FFN
    /// 2880 (4 used), every other layer a 128-token sliding window, YaRN RoPE.
    #[value(name = "gpt-oss-20b")]
    GptOss20b,
    /// A tiny gpt-oss for tests: 2 layers, n_embd 256, 8 experts of FFN 256 (4 used),
    /// a 16-token window.
    #[value(name = "gpt-oss-tiny")]
    GptOssTiny,
    /// Gemma-4-31B (gemma4): 60 layers, n_embd 5376, 32 q heads; sliding layers 16 KV
    /// heads of 256, full layers (1 in 6) 4 KV heads of 512 with V from K; tied.
    #[value(name = "gemma4-31b")]
    Gemma4_31b,
    /// Gemma-4-26B-A4B (gemma4): 30 layers, n_embd 2816, 128 experts of FFN 704 (8 used)
    /// beside a dense FFN of 2112 in every layer.
    #[value(name = "gemma4-26b-a4b")]
    Gemma4_26bA4b,
    /// A tiny gemma4 for tests: 4 layers (sliding, sliding, full, sliding), n_embd 256.
    #[value(name = "gemma4-tiny")]
    Gemma4Tiny,
    /// gemma4-tiny's layers with 16 experts of 256 (4 used) beside the dense FFN.
    #[value(name = "gemma4moe-tiny")]
    Gemma4MoeTiny,
}

/// Quantization mixes: llama.cpp's `llama-quantize` presets as it applies them without an
/// importance matrix (see [`pick`]).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// llama.cpp's Q4_K_M (`general.file_type` 15): Q4_K, Q6_K on some attn_v / ffn_down.
    #[value(name = "q4_k_m")]
    Q4KM,
    /// llama.cpp's Q3_K_M (`general.file_type` 12): Q3_K, Q4_K/Q5_K on attn_v, attn_output, ffn_down.
    #[value(name = "q3_k_m")]
    Q3KM,
    /// llama.cpp's Q2_K (`general.file_type` 10): Q2_K, Q3_K/Q4_K on attn_v, attn_output, ffn_down.
    #[value(name = "q2_k")]
    Q2K,
    /// llama.cpp's IQ4_XS (`general.file_type` 30): IQ4_XS, Q5_K on some attn_v / ffn_down.
    #[value(name = "iq4_xs")]
    IQ4XS,
    /// llama.cpp's IQ3_S (`general.file_type` 26): IQ3_S, Q4_K on attn_v where n_gqa ≥ 4.
    #[value(name = "iq3_s")]
    IQ3S,
    /// llama.cpp's MXFP4_MOE (`general.file_type` 38): expert tensors MXFP4, the other
    /// matrices Q8_0 (gpt-oss's own mix).
    #[value(name = "mxfp4_moe")]
    MXFP4MOE,
}

impl Quant {
    /// Every mix.
    pub const ALL: [Quant; 5] = [Quant::Q4KM, Quant::Q3KM, Quant::Q2K, Quant::IQ4XS, Quant::IQ3S];

    /// `general.file_type`: the mix's `llama_ftype` value in llama.h
    /// (`LLAMA_FTYPE_MOSTLY_Q2_K` 10, `_Q3_K_M` 12, `_Q4_K_M` 15, `_IQ3_S` 26, `_IQ4_XS` 30).
    pub fn file_type(self) -> u32 {
        self.ftype() as u32
    }

    /// The type of every matrix no rule of the mix moves
    /// (llama.cpp's `llama_ftype_get_default_type`).
    pub fn base(self) -> GgmlType {
        self.ftype().default_type()
    }

    /// The name `--quant` takes.
    pub fn name(self) -> &'static str {
        match self {
            Quant::Q2K => "q2_k",
            Quant::Q3KM => "q3_k_m",
            Quant::Q4KM => "q4_k_m",
            Quant::IQ4XS => "iq4_xs",
            Quant::IQ3S => "iq3_s",
            Quant::MXFP4MOE => "mxfp4_moe",
        }
    }
}

/// Arguments of `lode synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Architecture and size.
    #[arg(long)]
    pub preset: Preset,
    /// Quantization type mix, one of llama.cpp's presets: q4_k_m, q3_k_m, q2_k, iq4_xs, iq3_s,
    /// mxfp4_moe.
    #[arg(long, default_value = "q4_k_m")]
    pub quant: Quant,
    /// Output file.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Seed for the random weights (same seed, same file).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// The hyper-parameters a preset fixes (values from the models' published configs).
/// `Default` is only a base for struct updates: every preset sets the sizes.
#[derive(Clone, Debug, Default)]
pub struct Hparams {
    pub name: &'static str,
    pub arch: &'static str,
    pub n_embd: u64,
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_ff: u64,
    pub n_vocab: u64,
    pub context_length: u64,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// No `output.weight`: the LM head reuses `token_embd`.
    pub tied: bool,
    /// Per-head RMSNorm on q and k (`attn_q_norm`, `attn_k_norm`).
    pub qk_norm: bool,
    /// Llama-3.1's `rope_freqs.weight` (frequency factors of its "llama3" RoPE scaling).
    pub rope_freqs: bool,
    /// Sliding window of the local layers (`{arch}.attention.sliding_window`; 0: none).
    /// Gemma 3: every layer but each sixth (llama.cpp's pattern, no key written).
    pub sliding_window: u64,
    /// Linear RoPE scaling factor of the global layers (`{arch}.rope.scaling.*`; 0: none).
    pub rope_linear: f32,
    /// Gemma's norms after attention and after the FFN (`post_attention_norm`,
    /// `post_ffw_norm`).
    pub post_norms: bool,
    /// The tokenizer's specials and chat template (default: the architecture's).
    pub tok: Tok,
    /// A mixture-of-experts FFN in every layer instead of the dense one.
    pub moe: Option<moe::MoeParams>,
    /// qwen35's gated delta net layers (and gated attention in the others).
    pub hybrid: Option<hybrid::HybridParams>,
    /// gemma4's two kinds of attention layer and the rest of its layout.
    pub gemma4: Option<gemma4::G4Params>,
}

impl Hparams {
    /// Query heads per KV head (llama.cpp's `n_gqa()`, 0 without KV heads).
    pub fn n_gqa(&self) -> u64 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }
}

pub fn hparams(p: Preset) -> Hparams {
    let qwen3 = |name, n_embd, n_layer, n_head, n_ff| Hparams {
        name,
        arch: "qwen3",
        n_embd,
        n_layer,
        n_head,
        n_head_kv: 8,
        head_dim: 128,
        n_ff,
        n_vocab: 151936,
        context_length: 40960,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        qk_norm: true,
        rope_freqs: false,
        ..Default::default()
    };
    match p {
        Preset::Qwen3_0_6b => qwen3("qwen3-0.6b", 1024, 28, 16, 3072),
        Preset::Qwen3_4b => qwen3("qwen3-4b", 2560, 36, 32, 9728),
        // Qwen3-32B's config.json: unlike the 4B, its embeddings are not tied.
        Preset::Qwen3_32b => Hparams { tied: false, ..qwen3("qwen3-32b", 5120, 64, 64, 25600) },
        Preset::Gemma3_27b => presets::gemma3_27b(),
        Preset::MistralSmall24b => presets::mistral_small_24b(),
        Preset::Llama70b => presets::llama_70b(),
        Preset::Llama8b => Hparams {
            name: "llama-8b",
            arch: "llama",
            n_embd: 4096,
            n_layer: 32,
            n_head: 32,
            n_head_kv: 8,
            head_dim: 128,
            n_ff: 14336,
            n_vocab: 128256,
            context_length: 131072,
            rope_base: 500000.0,
            rms_eps: 1e-5,
            tied: false,
            qk_norm: false,
            rope_freqs: true,
            ..Default::default()
        },
        Preset::Qwen3_30bA3b | Preset::Qwen3MoeTiny => moe::hparams(p),
        Preset::Qwen35_27b | Preset::Qwen35Tiny | Preset::Qwen35_35bA3b | Preset::Qwen35MoeTiny => hybrid::hparams(p),
        Preset::Qwen35TinyMtp | Preset::Qwen35MoeTinyMtp | Preset::Qwen35_27bMtp | Preset::Qwen35_35bA3bMtp => hybrid::hparams(p),
        Preset::Qwen3NextTiny | Preset::Qwen3NextTinyQkv | Preset::Qwen3NextTinyMtp | Preset::Qwen3Next80bA3b => qwen3next::hparams(p),
        Preset::GptOss20b | Preset::GptOssTiny => gpt_oss::hparams(p),
        Preset::Gemma4_31b | Preset::Gemma4_26bA4b | Preset::Gemma4Tiny | Preset::Gemma4MoeTiny => gemma4::hparams(p),
    }
}

pub use crate::quantize::mix::{fallback, use_more_bits};
use crate::quantize::mix::{self, Ftype};

impl Quant {
    /// The llama.cpp mix this preset names.
    pub fn ftype(self) -> Ftype {
        match self {
            Quant::Q2K => Ftype::Q2_K,
            Quant::Q3KM => Ftype::Q3_K_M,
            Quant::Q4KM => Ftype::Q4_K_M,
            Quant::IQ4XS => Ftype::IQ4_XS,
            Quant::IQ3S => Ftype::IQ3_S,
            Quant::MXFP4MOE => Ftype::MXFP4_MOE,
        }
    }
}

/// The facts of `h` llama.cpp's type choice reads.
pub fn facts(h: &Hparams) -> mix::ModelFacts {
    mix::ModelFacts {
        arch: h.arch.to_string(),
        // llama.cpp's quantizer counts the MTP blocks among the layers.
        n_layer: h.n_layer + h.hybrid.map_or(0, |x| x.nextn),
        n_head: h.n_head,
        n_head_kv: h.n_head_kv,
        n_expert: h.moe.map_or(0, |m| m.n_expert),
    }
}

/// One tensor to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

/// The tensor list in the converter's order, each with the type llama.cpp's quantizer
/// gives it under the mix (`quantize::mix::assign`, the code `lode quantize` runs) from
/// the converter's F32: 1-D tensors and MoE routers stay F32.
pub fn plan(h: &Hparams, q: Quant) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut add = |name: String, dims: &[u64]| out.push(Planned { name, ty: GgmlType::F32, dims: dims.to_vec() });
    let (e, qd, kv) = (h.n_embd, h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
    add("token_embd.weight".into(), &[e, h.n_vocab]);
    if h.rope_freqs {
        add("rope_freqs.weight".into(), &[h.head_dim / 2]);
    }
    if let Some(g) = &h.gemma4 {
        add("rope_freqs.weight".into(), &[g.head_dim_full / 2]);
    }
    for i in 0..h.n_layer {
        if let Some(g) = &h.gemma4 {
            for (name, dims) in gemma4::layer_tensors(h, g, i) {
                add(name, &dims);
            }
            continue;
        }
        if let Some(x) = &h.hybrid {
            for (name, dims) in hybrid::layer_tensors(h, x, i) {
                add(name, &dims);
            }
            continue;
        }
        if let (Some(m), "gpt-oss") = (&h.moe, h.arch) {
            for (name, dims) in gpt_oss::layer_tensors(h, m, i) {
                add(name, &dims);
            }
            continue;
        }
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        add(b("attn_norm"), &[e]);
        add(b("attn_q"), &[e, qd]);
        add(b("attn_k"), &[e, kv]);
        add(b("attn_v"), &[e, kv]);
        add(b("attn_output"), &[qd, e]);
        if h.qk_norm {
            add(b("attn_q_norm"), &[h.head_dim]);
            add(b("attn_k_norm"), &[h.head_dim]);
        }
        if h.post_norms {
            add(b("post_attention_norm"), &[e]);
        }
        add(b("ffn_norm"), &[e]);
        match h.moe {
            None => {
                add(b("ffn_gate"), &[e, h.n_ff]);
                add(b("ffn_up"), &[e, h.n_ff]);
                add(b("ffn_down"), &[h.n_ff, e]);
            }
            Some(m) => {
                add(b("ffn_gate_inp"), &[e, m.n_expert]);
                add(b("ffn_gate_exps"), &[e, m.n_ff, m.n_expert]);
                add(b("ffn_up_exps"), &[e, m.n_ff, m.n_expert]);
                add(b("ffn_down_exps"), &[m.n_ff, e, m.n_expert]);
            }
        }
        if h.post_norms {
            add(b("post_ffw_norm"), &[e]);
        }
    }
    if let Some(x) = h.hybrid.filter(|x| x.nextn > 0) {
        for (name, dims) in hybrid::mtp_tensors(h, &x) {
            add(name, &dims);
        }
    }
    add("output_norm.weight".into(), &[e]);
    if !h.tied {
        add("output.weight".into(), &[e, h.n_vocab]);
    }
    let descs: Vec<mix::TensorDesc> = out.iter().map(|t| mix::TensorDesc { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty }).collect();
    // A preset's names always carry their layer, so the choice cannot fail.
    let choice = mix::assign(q.ftype(), &facts(h), &mix::Options::default(), &descs).unwrap_or_default();
    for (t, c) in out.iter_mut().zip(choice) {
        t.ty = c.ty;
    }
    out
}

/// The metadata llama.cpp reads for this architecture, plus the tokenizer.
pub fn metadata(h: &Hparams, mix: Quant) -> Vec<(String, MetaValue)> {
    let a = h.arch;
    let u32v = |v: u64| MetaValue::U32(v as u32);
    let s = |v: &str| MetaValue::String(v.to_string());
    let mut m: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), s(a)),
        ("general.name".into(), s(&format!("lode synth {} (random weights)", h.name))),
        ("general.file_type".into(), MetaValue::U32(mix.file_type())),
        ("general.quantization_version".into(), MetaValue::U32(2)),
        (format!("{a}.vocab_size"), u32v(h.n_vocab)),
        (format!("{a}.context_length"), u32v(h.context_length)),
        (format!("{a}.embedding_length"), u32v(h.n_embd)),
        (format!("{a}.block_count"), u32v(h.n_layer + h.hybrid.map_or(0, |x| x.nextn))),
        (format!("{a}.feed_forward_length"), u32v(h.n_ff)),
        (format!("{a}.attention.head_count"), u32v(h.n_head)),
        (format!("{a}.attention.head_count_kv"), u32v(h.n_head_kv)),
        (format!("{a}.attention.key_length"), u32v(h.head_dim)),
        (format!("{a}.attention.value_length"), u32v(h.head_dim)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), MetaValue::F32(h.rms_eps)),
        (format!("{a}.rope.freq_base"), MetaValue::F32(h.rope_base)),
        (format!("{a}.rope.dimension_count"), u32v(h.hybrid.map_or(h.head_dim, |x| x.n_rot))),
    ];
    if let Some(x) = &h.hybrid {
        m.extend(hybrid::metadata(a, x));
    }
    if let Some(x) = h.moe {
        m.extend(moe::metadata(a, &x));
    }
    if h.sliding_window > 0 {
        m.push((format!("{a}.attention.sliding_window"), u32v(h.sliding_window)));
    }
    if a == "gpt-oss" {
        m.extend(gpt_oss::metadata(a));
    }
    if let Some(g) = &h.gemma4 {
        gemma4::metadata(h, g, &mut m);
    }
    if h.rope_linear > 0.0 {
        m.push((format!("{a}.rope.scaling.type"), s("linear")));
        m.push((format!("{a}.rope.scaling.factor"), MetaValue::F32(h.rope_linear)));
    }
    let t = presets::tokenizer(h);
    let v = vocab::build(h.n_vocab as usize, t.specials);
    let strs = |xs: Vec<String>| MetaValue::Array(ValueType::String, xs.into_iter().map(MetaValue::String).collect());
    m.extend([
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s(t.pre)),
        ("tokenizer.ggml.tokens".into(), strs(v.tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(ValueType::I32, v.types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strs(v.merges)),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(t.bos)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(t.eos)),
        ("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(t.pad)),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(t.add_bos)),
        ("tokenizer.chat_template".into(), s(t.template)),
    ]);
    m
}

/// The file's writer with every tensor declared (data streamed at write time).
fn writer(h: &Hparams, mix: Quant) -> anyhow::Result<GgufWriter> {
    let mut w = GgufWriter::new();
    for (k, v) in metadata(h, mix) {
        w.add_kv(k, v);
    }
    for t in plan(h, mix) {
        if !blocks::supported(t.ty) {
            bail!("cannot generate {} data for {}", t.ty, t.name);
        }
        w.add_tensor_info(t.name, t.ty, &t.dims);
    }
    Ok(w)
}

/// Bytes of the file's tensor data section (each tensor padded to the alignment), as
/// [`synth`] will write it, computed without generating anything.
pub fn data_bytes(h: &Hparams, mix: Quant) -> anyhow::Result<u64> {
    let layout = writer(h, mix)?.layout()?;
    Ok(layout.last().map_or(0, |t| t.offset + t.n_bytes))
}

/// Write the preset's file with the mix to `path`; returns the number of bytes written.
/// Streams: each tensor is generated in pieces of at most 32 MiB (`blocks`) behind an
/// 8 MiB write buffer, so memory stays flat whatever the file size (a 40 GB llama-70b
/// included). With `progress`, a bar on stderr counts the bytes (hidden off a terminal).
pub fn synth(h: &Hparams, mix: Quant, path: &std::path::Path, seed: u64) -> anyhow::Result<u64> {
    synth_with(h, mix, path, seed, false)
}

fn synth_with(h: &Hparams, mix: Quant, path: &std::path::Path, seed: u64, progress: bool) -> anyhow::Result<u64> {
    let w = writer(h, mix)?;
    let total = data_bytes(h, mix)?;
    let bar = if progress { indicatif::ProgressBar::new(total) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template("writing {bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta} left)")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let rope = match &h.gemma4 {
        Some(g) => gemma4::rope_factors(g),
        None if h.rope_freqs => presets::llama3_rope_factors(h),
        None => Vec::new(),
    };
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    w.write_stream(&mut out, &path.display().to_string(), |i, info, dst| {
        let mut dst = bar.wrap_write(dst);
        if info.name == "rope_freqs.weight" {
            let bytes: Vec<u8> = rope.iter().flat_map(|f| f.to_le_bytes()).collect();
            return dst.write_all(&bytes);
        }
        let map = match h.arch {
            "gpt-oss" => gpt_oss::f32_map(&info.name),
            "gemma4" => gemma4::f32_map(&info.name),
            "qwen3next" => qwen3next::f32_map(&info.name),
            _ => hybrid::f32_map(&info.name),
        };
        if let Some(f) = map.filter(|_| info.ty == GgmlType::F32) {
            let mut v = Vec::with_capacity(info.n_bytes as usize);
            blocks::fill_tensor(info.ty, info.n_bytes, seed, i as u64, &mut v)?;
            let bytes: Vec<u8> = v.chunks_exact(4).flat_map(|b| f(f32::from_le_bytes([b[0], b[1], b[2], b[3]])).to_le_bytes()).collect();
            return dst.write_all(&bytes);
        }
        blocks::fill_tensor(info.ty, info.n_bytes, seed, i as u64, &mut dst)
    })?;
    out.flush().with_context(|| format!("writing {}", path.display()))?;
    bar.finish_and_clear();
    Ok(std::fs::metadata(path)?.len())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let h = hparams(args.preset);
    let t0 = std::time::Instant::now();
    let n = synth_with(&h, args.quant, &args.output, args.seed, true)?;
    eprintln!(
        "wrote {} ({} {} tensors, {:.2} GB) in {:.1} s",
        args.output.display(),
        plan(&h, args.quant).len(),
        args.quant.name(),
        n as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests;
