//! `lode synth`: write a GGUF with a real architecture's tensor shapes, hyper-parameters
//! and llama.cpp's quantization type mix, filled with random (valid) blocks and a
//! minimal tokenizer. Speed work needs 4B/8B-sized files on machines where no real model
//! of that size can be fetched; such a file loads in lode and in llama.cpp alike.

mod blocks;
mod vocab;

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
}

/// Quantization mixes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quant {
    /// llama.cpp's Q4_K_M (`general.file_type` 15).
    #[value(name = "q4_k_m")]
    Q4KM,
}

/// Arguments of `lode synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Architecture and size.
    #[arg(long)]
    pub preset: Preset,
    /// Quantization type mix.
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
#[derive(Clone, Debug)]
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
    };
    match p {
        Preset::Qwen3_0_6b => qwen3("qwen3-0.6b", 1024, 28, 16, 3072),
        Preset::Qwen3_4b => qwen3("qwen3-4b", 2560, 36, 32, 9728),
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
        },
    }
}

/// llama.cpp's Q4_K_M rule for which layers' `attn_v` and `ffn_down` get Q6_K: the first
/// and last eighth of the layers, and every third layer in between.
pub fn use_more_bits(i_layer: u64, n_layer: u64) -> bool {
    let (i, n) = (i_layer as i64, n_layer as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// One tensor to write.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
}

/// The tensor list in llama.cpp's order with Q4_K_M types: F32 for 1-D tensors; Q6_K for
/// the LM head (`output`, or `token_embd` when tied) and for `attn_v` / `ffn_down` where
/// [`use_more_bits`]; Q4_K otherwise. A row length that is not a multiple of 256 falls
/// back as llama.cpp does (Q4_K → Q5_0, Q6_K → Q8_0); no preset has one.
pub fn plan(h: &Hparams) -> Vec<Planned> {
    let q4 = GgmlType::Q4_K;
    let q6 = GgmlType::Q6_K;
    let mut out = Vec::new();
    let mut add = |name: String, ty: GgmlType, dims: &[u64]| {
        let ty = match ty {
            GgmlType::F32 => ty,
            _ if dims[0] % 256 == 0 => ty,
            GgmlType::Q6_K => GgmlType::Q8_0,
            _ => GgmlType::Q5_0,
        };
        out.push(Planned { name, ty, dims: dims.to_vec() });
    };
    let (e, q, kv) = (h.n_embd, h.n_head * h.head_dim, h.n_head_kv * h.head_dim);
    add("token_embd.weight".into(), if h.tied { q6 } else { q4 }, &[e, h.n_vocab]);
    if h.rope_freqs {
        add("rope_freqs.weight".into(), GgmlType::F32, &[h.head_dim / 2]);
    }
    for i in 0..h.n_layer {
        let more = if use_more_bits(i, h.n_layer) { q6 } else { q4 };
        let b = |s: &str| format!("blk.{i}.{s}.weight");
        add(b("attn_norm"), GgmlType::F32, &[e]);
        add(b("attn_q"), q4, &[e, q]);
        add(b("attn_k"), q4, &[e, kv]);
        add(b("attn_v"), more, &[e, kv]);
        add(b("attn_output"), q4, &[q, e]);
        if h.qk_norm {
            add(b("attn_q_norm"), GgmlType::F32, &[h.head_dim]);
            add(b("attn_k_norm"), GgmlType::F32, &[h.head_dim]);
        }
        add(b("ffn_norm"), GgmlType::F32, &[e]);
        add(b("ffn_gate"), q4, &[e, h.n_ff]);
        add(b("ffn_up"), q4, &[e, h.n_ff]);
        add(b("ffn_down"), more, &[h.n_ff, e]);
    }
    add("output_norm.weight".into(), GgmlType::F32, &[e]);
    if !h.tied {
        add("output.weight".into(), q6, &[e, h.n_vocab]);
    }
    out
}

/// Llama-3.1's RoPE frequency factors ("llama3" scaling: factor 8, low/high frequency
/// factors 1 and 4, original context 8192): 1 for short wavelengths, 8 for long ones,
/// a smooth blend between. ggml divides each rotation frequency by its factor.
fn llama3_rope_factors(h: &Hparams) -> Vec<f32> {
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

/// The metadata llama.cpp reads for this architecture, plus the tokenizer.
pub fn metadata(h: &Hparams) -> Vec<(String, MetaValue)> {
    let a = h.arch;
    let u32v = |v: u64| MetaValue::U32(v as u32);
    let s = |v: &str| MetaValue::String(v.to_string());
    let mut m: Vec<(String, MetaValue)> = vec![
        ("general.architecture".into(), s(a)),
        ("general.name".into(), s(&format!("lode synth {} (random weights)", h.name))),
        ("general.file_type".into(), MetaValue::U32(15)),
        ("general.quantization_version".into(), MetaValue::U32(2)),
        (format!("{a}.vocab_size"), u32v(h.n_vocab)),
        (format!("{a}.context_length"), u32v(h.context_length)),
        (format!("{a}.embedding_length"), u32v(h.n_embd)),
        (format!("{a}.block_count"), u32v(h.n_layer)),
        (format!("{a}.feed_forward_length"), u32v(h.n_ff)),
        (format!("{a}.attention.head_count"), u32v(h.n_head)),
        (format!("{a}.attention.head_count_kv"), u32v(h.n_head_kv)),
        (format!("{a}.attention.key_length"), u32v(h.head_dim)),
        (format!("{a}.attention.value_length"), u32v(h.head_dim)),
        (format!("{a}.attention.layer_norm_rms_epsilon"), MetaValue::F32(h.rms_eps)),
        (format!("{a}.rope.freq_base"), MetaValue::F32(h.rope_base)),
        (format!("{a}.rope.dimension_count"), u32v(h.head_dim)),
    ];
    // (pre-tokenizer, specials, bos, eos, add_bos, chat template)
    let (pre, specials, bos, eos, add_bos, template): (&str, &[(usize, &str)], u32, u32, bool, &str) =
        if a == "qwen3" {
            (
                "qwen2",
                &[(151643, "<|endoftext|>"), (151644, "<|im_start|>"), (151645, "<|im_end|>")],
                151643,
                151645,
                false,
                CHATML,
            )
        } else {
            (
                "llama-bpe",
                &[
                    (128000, "<|begin_of_text|>"),
                    (128001, "<|end_of_text|>"),
                    (128006, "<|start_header_id|>"),
                    (128007, "<|end_header_id|>"),
                    (128009, "<|eot_id|>"),
                ],
                128000,
                128009,
                true,
                LLAMA3,
            )
        };
    let v = vocab::build(h.n_vocab as usize, specials);
    let strs = |xs: Vec<String>| MetaValue::Array(ValueType::String, xs.into_iter().map(MetaValue::String).collect());
    m.extend([
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s(pre)),
        ("tokenizer.ggml.tokens".into(), strs(v.tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            MetaValue::Array(ValueType::I32, v.types.into_iter().map(MetaValue::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), strs(v.merges)),
        ("tokenizer.ggml.bos_token_id".into(), MetaValue::U32(bos)),
        ("tokenizer.ggml.eos_token_id".into(), MetaValue::U32(eos)),
        ("tokenizer.ggml.padding_token_id".into(), MetaValue::U32(if a == "qwen3" { bos } else { eos })),
        ("tokenizer.ggml.add_bos_token".into(), MetaValue::Bool(add_bos)),
        ("tokenizer.chat_template".into(), s(template)),
    ]);
    m
}

/// ChatML, as Qwen uses it (without tools or thinking blocks).
const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// Llama-3's header/eot format (without tools or the date preamble).
const LLAMA3: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// Write the preset's file to `path`; returns the number of bytes written.
pub fn synth(h: &Hparams, path: &std::path::Path, seed: u64) -> anyhow::Result<u64> {
    let mut w = GgufWriter::new();
    for (k, v) in metadata(h) {
        w.add_kv(k, v);
    }
    let planned = plan(h);
    for t in &planned {
        if !blocks::supported(t.ty) {
            bail!("cannot generate {} data for {}", t.ty, t.name);
        }
        w.add_tensor_info(t.name.clone(), t.ty, &t.dims);
    }
    let rope = if h.rope_freqs { llama3_rope_factors(h) } else { Vec::new() };
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
    w.write_stream(&mut out, &path.display().to_string(), |i, info, dst| {
        if info.name == "rope_freqs.weight" {
            let bytes: Vec<u8> = rope.iter().flat_map(|f| f.to_le_bytes()).collect();
            return dst.write_all(&bytes);
        }
        blocks::fill_tensor(info.ty, info.n_bytes, seed, i as u64, dst)
    })?;
    out.flush().with_context(|| format!("writing {}", path.display()))?;
    Ok(std::fs::metadata(path)?.len())
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let Quant::Q4KM = args.quant;
    let h = hparams(args.preset);
    let t0 = std::time::Instant::now();
    let n = synth(&h, &args.output, args.seed)?;
    eprintln!(
        "wrote {} ({} tensors, {:.2} GB) in {:.1} s",
        args.output.display(),
        plan(&h).len(),
        n as f64 / 1e9,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn census(p: Preset) -> (usize, [usize; 3]) {
        let pl = plan(&hparams(p));
        let count = |ty| pl.iter().filter(|t| t.ty == ty).count();
        (pl.len(), [count(GgmlType::F32), count(GgmlType::Q4_K), count(GgmlType::Q6_K)])
    }

    #[test]
    fn use_more_bits_matches_llama_cpp_layers() {
        let layers = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
        assert_eq!(layers(32), vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
        assert_eq!(layers(28), vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    }

    /// Llama-3.1-8B-Instruct Q4_K_M as llama.cpp's quantizer writes it: 292 tensors,
    /// 66 F32, 193 Q4_K, 33 Q6_K.
    #[test]
    fn llama_8b_census_matches_llama_cpp() {
        assert_eq!(census(Preset::Llama8b), (292, [66, 193, 33]));
    }

    #[test]
    fn qwen3_census() {
        // 28 layers × 11 tensors + token_embd + output_norm; Q6_K = 14 + 14 + tied embd.
        assert_eq!(census(Preset::Qwen3_0_6b), (310, [113, 168, 29]));
        let more = (0..36).filter(|&i| use_more_bits(i, 36)).count();
        assert_eq!(census(Preset::Qwen3_4b), (398, [145, 36 * 7 - 2 * more, 2 * more + 1]));
    }

    #[test]
    fn llama3_rope_factors_span_1_to_8() {
        let f = llama3_rope_factors(&hparams(Preset::Llama8b));
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
    }

    #[test]
    fn vocab_fills_the_embedding_rows() {
        for p in [Preset::Qwen3_0_6b, Preset::Llama8b] {
            let h = hparams(p);
            let m = metadata(&h);
            let toks = m.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap();
            assert_eq!(toks.1.as_array().unwrap().1.len() as u64, h.n_vocab);
        }
    }
}
