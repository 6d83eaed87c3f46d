//! `lode synth`: the mixes' censuses against llama.cpp's rules, and each mix written,
//! decoded and loaded.
use super::*;
use GgmlType::*;

/// (type, count) of the preset's tensors under the mix, in type-id order.
fn census(p: Preset, mix: Quant) -> Vec<(GgmlType, usize)> {
    let mut c = std::collections::BTreeMap::new();
    for t in plan(&hparams(p), mix) {
        c.entry(t.ty.id()).or_insert((t.ty, 0)).1 += 1;
    }
    c.into_values().collect()
}

fn ty_of(p: Preset, mix: Quant, name: &str) -> GgmlType {
    plan(&hparams(p), mix).into_iter().find(|t| t.name == name).unwrap().ty
}

#[test]
fn use_more_bits_matches_llama_cpp_layers() {
    let layers = |n| (0..n).filter(|&i| use_more_bits(i, n)).collect::<Vec<_>>();
    assert_eq!(layers(32), vec![0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    assert_eq!(layers(28), vec![0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27]);
    // 36: 0..4, 31..36 and 6, 9, …, 30.
    assert_eq!(layers(36).len(), 18);
}

// The censuses below count, per preset: qwen3 layers hold 11 tensors (4 of them 1-D:
// attn_norm, attn_q_norm, attn_k_norm, ffn_norm) and 7 matrices; llama layers 9
// tensors (2 1-D) and 7 matrices. F32 = 1-D tensors: qwen3-0.6b 4·28 + output_norm
// = 113, qwen3-4b 4·36 + 1 = 145, llama-8b 2·32 + output_norm + rope_freqs = 66.
// qwen3 ties its embeddings (token_embd takes the LM head's Q6_K); llama-8b has an
// untied token_embd (the mix's base type) and output.weight (Q6_K). n_gqa: qwen3-0.6b
// 16/8 = 2, qwen3-4b 32/8 = 4, llama-8b 32/8 = 4.

/// Q4_K_M: attn_v and ffn_down Q6_K on the use_more_bits layers (14 of 28, 18 of 36,
/// 16 of 32), Q4_K otherwise. Llama-3.1-8B-Instruct Q4_K_M as llama.cpp's quantizer
/// writes it: 292 tensors, 66 F32, 193 Q4_K, 33 Q6_K.
#[test]
fn q4_k_m_census() {
    assert_eq!(census(Preset::Qwen3_0_6b, Quant::Q4KM), [(F32, 113), (Q4_K, 7 * 28 - 28), (Q6_K, 2 * 14 + 1)]);
    assert_eq!(census(Preset::Qwen3_4b, Quant::Q4KM), [(F32, 145), (Q4_K, 7 * 36 - 36), (Q6_K, 2 * 18 + 1)]);
    assert_eq!(census(Preset::Llama8b, Quant::Q4KM), [(F32, 66), (Q4_K, 193), (Q6_K, 33)]);
}

/// Q3_K_M: attn_v Q5_K in layers 0, 1 and Q4_K after; ffn_down Q5_K below n_layer/16
/// (1 layer of 28, 2 of 36, 2 of 32) and Q4_K after; attn_output Q4_K; attn_q, attn_k,
/// ffn_gate, ffn_up (and llama's untied token_embd) Q3_K.
/// qwen3-0.6b: Q3_K 4·28 = 112, Q4_K 26 + 27 + 28 = 81, Q5_K 2 + 1 = 3, Q6_K 1.
/// qwen3-4b: Q3_K 4·36 = 144, Q4_K 34 + 34 + 36 = 104, Q5_K 2 + 2 = 4, Q6_K 1.
/// llama-8b: Q3_K 4·32 + 1 = 129, Q4_K 30 + 30 + 32 = 92, Q5_K 4, Q6_K 1.
#[test]
fn q3_k_m_census() {
    assert_eq!(census(Preset::Qwen3_0_6b, Quant::Q3KM), [(F32, 113), (Q3_K, 112), (Q4_K, 81), (Q5_K, 3), (Q6_K, 1)]);
    assert_eq!(census(Preset::Qwen3_4b, Quant::Q3KM), [(F32, 145), (Q3_K, 144), (Q4_K, 104), (Q5_K, 4), (Q6_K, 1)]);
    assert_eq!(census(Preset::Llama8b, Quant::Q3KM), [(F32, 66), (Q3_K, 129), (Q4_K, 92), (Q5_K, 4), (Q6_K, 1)]);
    for (name, ty) in [
        ("blk.1.attn_v.weight", Q5_K),
        ("blk.2.attn_v.weight", Q4_K),
        ("blk.1.ffn_down.weight", Q5_K),
        ("blk.2.ffn_down.weight", Q4_K),
        ("blk.31.attn_output.weight", Q4_K),
        ("blk.31.ffn_up.weight", Q3_K),
        ("token_embd.weight", Q3_K),
        ("output.weight", Q6_K),
    ] {
        assert_eq!(ty_of(Preset::Llama8b, Quant::Q3KM, name), ty, "{name}");
    }
    assert_eq!(ty_of(Preset::Qwen3_0_6b, Quant::Q3KM, "blk.1.ffn_down.weight"), Q4_K);
}

/// Q2_K: attn_v Q4_K where n_gqa ≥ 4 (qwen3-4b, llama-8b), Q3_K otherwise
/// (qwen3-0.6b); attn_output and ffn_down Q3_K; attn_q, attn_k, ffn_gate, ffn_up (and
/// llama's untied token_embd) Q2_K.
/// qwen3-0.6b: Q2_K 4·28 = 112, Q3_K 3·28 = 84, Q6_K 1.
/// qwen3-4b: Q2_K 4·36 = 144, Q3_K 2·36 = 72, Q4_K 36, Q6_K 1.
/// llama-8b: Q2_K 4·32 + 1 = 129, Q3_K 2·32 = 64, Q4_K 32, Q6_K 1.
#[test]
fn q2_k_census() {
    assert_eq!(census(Preset::Qwen3_0_6b, Quant::Q2K), [(F32, 113), (Q2_K, 112), (Q3_K, 84), (Q6_K, 1)]);
    assert_eq!(census(Preset::Qwen3_4b, Quant::Q2K), [(F32, 145), (Q2_K, 144), (Q3_K, 72), (Q4_K, 36), (Q6_K, 1)]);
    assert_eq!(census(Preset::Llama8b, Quant::Q2K), [(F32, 66), (Q2_K, 129), (Q3_K, 64), (Q4_K, 32), (Q6_K, 1)]);
    assert_eq!(ty_of(Preset::Llama8b, Quant::Q2K, "token_embd.weight"), Q2_K);
    assert_eq!(ty_of(Preset::Qwen3_0_6b, Quant::Q2K, "token_embd.weight"), Q6_K);
}

/// IQ4_XS: attn_v Q5_K where n_gqa ≥ 4, IQ4_XS otherwise; ffn_down Q5_K below
/// n_layer/8 (3 layers of 28, 4 of 36, 4 of 32); all else IQ4_XS.
/// qwen3-0.6b: IQ4_XS 28 (attn_v) + 25 (ffn_down) + 5·28 = 193, Q5_K 3, Q6_K 1.
/// qwen3-4b: IQ4_XS 32 + 5·36 = 212, Q5_K 36 + 4 = 40, Q6_K 1.
/// llama-8b: IQ4_XS 28 + 5·32 + 1 = 189, Q5_K 32 + 4 = 36, Q6_K 1.
#[test]
fn iq4_xs_census() {
    assert_eq!(census(Preset::Qwen3_0_6b, Quant::IQ4XS), [(F32, 113), (Q5_K, 3), (Q6_K, 1), (IQ4_XS, 193)]);
    assert_eq!(census(Preset::Qwen3_4b, Quant::IQ4XS), [(F32, 145), (Q5_K, 40), (Q6_K, 1), (IQ4_XS, 212)]);
    assert_eq!(census(Preset::Llama8b, Quant::IQ4XS), [(F32, 66), (Q5_K, 36), (Q6_K, 1), (IQ4_XS, 189)]);
    assert_eq!(ty_of(Preset::Llama8b, Quant::IQ4XS, "blk.3.ffn_down.weight"), Q5_K);
    assert_eq!(ty_of(Preset::Llama8b, Quant::IQ4XS, "blk.4.ffn_down.weight"), IQ4_XS);
    assert_eq!(ty_of(Preset::Qwen3_0_6b, Quant::IQ4XS, "blk.0.attn_v.weight"), IQ4_XS);
}

/// IQ3_S: attn_v Q4_K where n_gqa ≥ 4, IQ3_S otherwise; all else IQ3_S.
/// qwen3-0.6b: IQ3_S 7·28 = 196, Q6_K 1 (tied head). qwen3-4b: IQ3_S 6·36 = 216, Q4_K 36,
/// Q6_K 1. llama-8b: IQ3_S 6·32 + token_embd = 193, Q4_K 32, Q6_K 1.
#[test]
fn iq3_s_census() {
    assert_eq!(census(Preset::Qwen3_0_6b, Quant::IQ3S), [(F32, 113), (Q6_K, 1), (IQ3_S, 196)]);
    assert_eq!(census(Preset::Qwen3_4b, Quant::IQ3S), [(F32, 145), (Q4_K, 36), (Q6_K, 1), (IQ3_S, 216)]);
    assert_eq!(census(Preset::Llama8b, Quant::IQ3S), [(F32, 66), (Q4_K, 32), (Q6_K, 1), (IQ3_S, 193)]);
    assert_eq!(ty_of(Preset::Llama8b, Quant::IQ3S, "token_embd.weight"), IQ3_S);
}

#[test]
fn file_types_are_llama_ftype_values() {
    let ft = |q: Quant| q.file_type();
    assert_eq!(Quant::ALL.map(ft), [15, 12, 10, 30, 26]);
    let h = hparams(Preset::Qwen3_0_6b);
    for q in Quant::ALL {
        let m = metadata(&h, q);
        let v = &m.iter().find(|(k, _)| k == "general.file_type").unwrap().1;
        assert!(matches!(v, MetaValue::U32(x) if *x == q.file_type()), "{q:?}");
    }
}

#[test]
fn quant_names_parse() {
    use clap::ValueEnum;
    for q in Quant::ALL {
        assert_eq!(Quant::from_str(q.name(), false), Ok(q));
    }
}

/// Rows that are not whole 256-element super-blocks: llama.cpp's fallbacks, and the
/// LM head's Q8_0.
#[test]
fn fallback_for_odd_rows() {
    for (ty, alt) in [(IQ4_XS, IQ4_NL), (IQ3_S, IQ4_NL), (Q2_K, Q4_0), (Q3_K, Q4_0), (Q4_K, Q5_0), (Q5_K, Q5_1), (Q6_K, Q8_0)] {
        assert_eq!(fallback(ty, 512), ty);
        assert_eq!(fallback(ty, 1056), alt, "{ty}");
        assert_eq!(fallback(ty, 1000), F16, "{ty}");
    }
    assert_eq!(fallback(F32, 7), F32);
    let h = Hparams { n_embd: 1056, ..hparams(Preset::Qwen3_0_6b) };
    for q in Quant::ALL {
        let pl = plan(&h, q);
        assert_eq!(pl[0].ty, Q8_0, "{q:?} tied embedding");
        assert!(pl.iter().all(|t| blocks::supported(t.ty) && t.ty.bytes_for(t.dims[0]).is_some()), "{q:?}");
    }
    assert_eq!(ty_of_h(&h, Quant::Q3KM, "blk.0.attn_q.weight"), Q4_0);
    assert_eq!(ty_of_h(&h, Quant::IQ4XS, "blk.0.attn_q.weight"), IQ4_NL);
    // attn_output's rows are n_head·head_dim = 2048 long: no fallback.
    assert_eq!(ty_of_h(&h, Quant::Q2K, "blk.0.attn_output.weight"), Q3_K);
}

fn ty_of_h(h: &Hparams, mix: Quant, name: &str) -> GgmlType {
    plan(h, mix).into_iter().find(|t| t.name == name).unwrap().ty
}

/// Every type a mix can assign generates blocks that decode (with lode's reference
/// dequantizers) to finite weights of roughly ±0.05 with some spread.
#[test]
fn blocks_decode_small_and_finite() {
    for ty in [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, IQ3_S, IQ4_NL, Q4_0, Q5_0, Q5_1, Q8_0, F16] {
        assert!(blocks::supported(ty));
        let n = 256 * 512;
        let mut bytes = Vec::new();
        blocks::fill_tensor(ty, ty.bytes_for(n).unwrap(), 3, 9, &mut bytes).unwrap();
        let mut w = vec![0f32; n as usize];
        lode_runtime::quant::dequantize(ty, &bytes, &mut w).unwrap();
        let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let rms = (w.iter().map(|x| x * x).sum::<f32>() / n as f32).sqrt();
        assert!(w.iter().all(|x| x.is_finite()), "{ty}: non-finite");
        assert!(max < 0.065 && max > 0.02 && rms > 0.005, "{ty}: max {max} rms {rms}");
    }
}

/// Each mix's qwen3-0.6b file writes, holds the planned types, carries its
/// `general.file_type`, dequantizes to finite small weights and loads in the model layer.
#[test]
fn every_mix_writes_qwen3_0_6b() {
    use lode_runtime::gguf::GgufFile;
    let h = hparams(Preset::Qwen3_0_6b);
    let dir = std::env::temp_dir().join(format!("lode-synth-mixes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for q in Quant::ALL {
        let path = dir.join(format!("{}.gguf", q.name()));
        synth(&h, q, &path, 5).unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.get_u64("general.file_type").unwrap(), Some(q.file_type() as u64));
        let planned = plan(&h, q);
        assert_eq!(f.tensors().len(), planned.len());
        for (t, p) in f.tensors().iter().zip(&planned) {
            assert_eq!((&t.name, t.ty, &t.dims), (&p.name, p.ty, &p.dims));
            let v = f.tensor(&t.name).unwrap();
            let row = t.ty.bytes_for(t.dims[0]).unwrap() as usize;
            let mut w = vec![0f32; t.dims[0] as usize * 64];
            // Dequantize in 64-row pieces (the embedding is 150k rows).
            let mut max = 0f32;
            for piece in v.data.chunks(row * 64) {
                let w = &mut w[..piece.len() / row * t.dims[0] as usize];
                lode_runtime::quant::dequantize(t.ty, piece, w).unwrap();
                assert!(w.iter().all(|x| x.is_finite()), "{:?} {}", q, t.name);
                max = w.iter().fold(max, |m, x| m.max(x.abs()));
            }
            let limit = if t.ty == F32 { 1.1 } else { 0.065 };
            assert!(max < limit, "{:?} {}: max {max}", q, t.name);
        }
        lode_runtime::model::Model::load(std::sync::Arc::new(f)).unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn llama3_rope_factors_span_1_to_8() {
    let f = super::presets::llama3_rope_factors(&hparams(Preset::Llama8b));
    assert_eq!(f.len(), 64);
    assert_eq!(f[0], 1.0);
    assert_eq!(f[63], 8.0);
    assert!(f.windows(2).all(|w| w[0] <= w[1]));
}

#[test]
fn vocab_fills_the_embedding_rows() {
    for p in [Preset::Qwen3_0_6b, Preset::Llama8b] {
        let h = hparams(p);
        let m = metadata(&h, Quant::Q4KM);
        let toks = m.iter().find(|(k, _)| k == "tokenizer.ggml.tokens").unwrap();
        assert_eq!(toks.1.as_array().unwrap().1.len() as u64, h.n_vocab);
    }
}

// The large presets. Layers: gemma3 13 tensors (6 vectors: attn_norm, attn_q_norm,
// attn_k_norm, post_attention_norm, ffn_norm, post_ffw_norm), qwen3 11 (4), llama 9 (2);
// 7 matrices each. use_more_bits layers: 30 of 62 (0..7, 54..62 and 9, 12, …, 51),
// 20 of 40, 32 of 64, 40 of 80.

/// Q4_K_M of the large presets. gemma3-27b: tied (token_embd Q6_K), F32 6·62 + 1;
/// mistral-small-24b: untied (token_embd Q4_K, output Q6_K), F32 2·40 + 1; qwen3-32b:
/// untied, F32 4·64 + 1; llama-70b: F32 2·80 + 2 (rope_freqs), and llama.cpp's 70B rule
/// moves the 40 attn_v left at Q4_K to Q5_K.
#[test]
fn large_presets_q4_k_m_census() {
    assert_eq!(census(Preset::Gemma3_27b, Quant::Q4KM), [(F32, 373), (Q4_K, 7 * 62 - 60), (Q6_K, 2 * 30 + 1)]);
    assert_eq!(census(Preset::MistralSmall24b, Quant::Q4KM), [(F32, 81), (Q4_K, 5 * 40 + 20 + 20 + 1), (Q6_K, 2 * 20 + 1)]);
    assert_eq!(census(Preset::Qwen3_32b, Quant::Q4KM), [(F32, 257), (Q4_K, 6 * 64 + 1), (Q6_K, 2 * 32 + 1)]);
    assert_eq!(census(Preset::Llama70b, Quant::Q4KM), [(F32, 162), (Q4_K, 5 * 80 + 40 + 1), (Q5_K, 40), (Q6_K, 81)]);
    assert_eq!(ty_of(Preset::Llama70b, Quant::Q4KM, "blk.10.attn_v.weight"), Q5_K);
    assert_eq!(ty_of(Preset::Llama70b, Quant::Q4KM, "blk.9.attn_v.weight"), Q6_K);
    assert_eq!(ty_of(Preset::Llama70b, Quant::Q4KM, "blk.10.ffn_down.weight"), Q4_K);
    // Not a 70B by llama.cpp's rule: the 8B keeps Q4_K attn_v.
    assert_eq!(ty_of(Preset::Llama8b, Quant::Q4KM, "blk.4.attn_v.weight"), Q4_K);
}

/// The other mixes of llama-70b (every attn_v ends at Q5_K): Q2_K (attn_v Q4_K → Q5_K,
/// attn_output and ffn_down Q3_K), Q3_K_M (ffn_down Q5_K below 80/16 = 5), IQ4_XS
/// (ffn_down Q5_K below 80/8 = 10). Every preset plans every mix with types synth writes.
#[test]
fn large_presets_every_mix() {
    assert_eq!(census(Preset::Llama70b, Quant::Q2K), [(F32, 162), (Q2_K, 321), (Q3_K, 160), (Q5_K, 80), (Q6_K, 1)]);
    assert_eq!(census(Preset::Llama70b, Quant::Q3KM), [(F32, 162), (Q3_K, 321), (Q4_K, 155), (Q5_K, 85), (Q6_K, 1)]);
    assert_eq!(census(Preset::Llama70b, Quant::IQ4XS), [(F32, 162), (Q5_K, 90), (Q6_K, 1), (IQ4_XS, 471)]);
    for p in [Preset::Gemma3_27b, Preset::MistralSmall24b, Preset::Qwen3_32b, Preset::Llama70b] {
        for q in Quant::ALL {
            let pl = plan(&hparams(p), q);
            assert!(pl.iter().all(|t| blocks::supported(t.ty) && t.ty.bytes_for(t.dims[0]).is_some()), "{p:?} {q:?}");
        }
    }
}

/// Q4_K_M data bytes against the published llama.cpp Q4_K_M files of the real models
/// (file sizes on Hugging Face: Qwen3-32B 19.8 GB, gemma-3-27b-it 16.5 GB,
/// Mistral-Small-3.1-24B 14.3 GB, Llama-3.1-70B 42.5 GB), within 1 %; the header is a few MB.
#[test]
fn large_presets_bytes_match_the_real_files() {
    for (p, gb) in [(Preset::Qwen3_32b, 19.8), (Preset::Gemma3_27b, 16.5), (Preset::MistralSmall24b, 14.3), (Preset::Llama70b, 42.5)] {
        let b = data_bytes(&hparams(p), Quant::Q4KM).unwrap() as f64 / 1e9;
        eprintln!("{p:?} Q4_K_M: {b:.3} GB of tensor data");
        assert!((b / gb - 1.0).abs() < 0.01, "{p:?}: {b:.3} GB, published {gb}");
    }
}

/// Gemma 3's keys as llama.cpp reads them: the window, linear RoPE scaling, its
/// tokenizer's specials at their ids; and the file loads with 5 of 6 layers local.
#[test]
fn gemma3_27b_metadata_and_config() {
    let h = hparams(Preset::Gemma3_27b);
    let m = metadata(&h, Quant::Q4KM);
    let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()).unwrap_or_else(|| panic!("{k}"));
    assert!(matches!(get("gemma3.attention.sliding_window"), MetaValue::U32(1024)));
    assert!(matches!(get("gemma3.rope.scaling.type"), MetaValue::String(s) if s == "linear"));
    assert!(matches!(get("gemma3.rope.scaling.factor"), MetaValue::F32(f) if f == 8.0));
    assert!(matches!(get("tokenizer.ggml.bos_token_id"), MetaValue::U32(2)));
    let toks = get("tokenizer.ggml.tokens");
    let toks = toks.as_array().unwrap().1;
    assert_eq!(toks.len(), 262144);
    assert!(matches!(&toks[107], MetaValue::String(s) if s == "<end_of_turn>"));
    // A layer's tensors include Gemma's post-norms.
    let pl = plan(&h, Quant::Q4KM);
    assert!(pl.iter().any(|t| t.name == "blk.61.post_ffw_norm.weight"));
    assert!(!plan(&hparams(Preset::Qwen3_32b), Quant::Q4KM).iter().any(|t| t.name.contains("post_")));
}

/// Each tensor's data goes to the writer in pieces of at most 32 MiB: a multi-GB file
/// never sits in memory.
#[test]
fn tensors_stream_in_bounded_pieces() {
    struct MaxWrite(usize, u64);
    impl std::io::Write for MaxWrite {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.max(b.len());
            self.1 += b.len() as u64;
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let n = Q4_K.bytes_for(256 * 300_000).unwrap();
    let mut w = MaxWrite(0, 0);
    blocks::fill_tensor(Q4_K, n, 1, 2, &mut w).unwrap();
    assert_eq!(w.1, n);
    assert!(n > 40 << 20 && w.0 <= 32 << 20, "{n} bytes in writes of up to {}", w.0);
}

/// Gemma 3 27B's and Mistral Small's layouts at toy sizes (same keys, tensors and
/// tokenizers, small matrices) write, load in the model layer with the configuration
/// llama.cpp derives, and tokenize with their specials at their ids.
#[test]
fn large_layouts_load_at_toy_size() {
    use lode_runtime::gguf::GgufFile;
    let dir = std::env::temp_dir().join(format!("lode-synth-large-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let toy = |h: Hparams| Hparams { n_embd: 256, n_layer: 12, n_ff: 512, n_head: 4, n_head_kv: 2, head_dim: 64, n_vocab: 2048, ..h };
    let cases = [(toy(hparams(Preset::Gemma3_27b)), "<end_of_turn>", 107u32), (toy(hparams(Preset::MistralSmall24b)), "[INST]", 3)];
    for (h, special, id) in cases {
        let path = dir.join(format!("{}.gguf", h.name));
        synth(&h, Quant::Q4KM, &path, 1).unwrap();
        let f = std::sync::Arc::new(GgufFile::open(&path).unwrap());
        let tok = lode_runtime::tokenizer::Tokenizer::from_gguf(&f).unwrap();
        assert_eq!(tok.encode(special, false, true), vec![id], "{}", h.name);
        let m = lode_runtime::model::Model::load(f).unwrap();
        let c = &m.cfg;
        if h.arch == "gemma3" {
            assert_eq!(c.n_swa, 1024);
            assert_eq!(c.swa_layers.iter().filter(|&&l| l).count(), 10, "5 of every 6 of 12 layers");
            assert!(!c.swa_layers[5] && !c.swa_layers[11]);
            assert_eq!(c.rope_freq_scale, 1.0 / 8.0);
            assert_eq!((c.rope_base, c.rope_base_swa), (1e6, 10000.0));
            assert!(m.layers.iter().all(|l| l.post_attn_norm.is_some() && l.post_ffw_norm.is_some()));
            // `lode fit` counts the 10 windowed layers at 1024 + 512 + 64 slots, the 2
            // others at the context; `--swa-full` all 12 at the context. GPU planes are
            // 256-byte rounded rows of 2 heads × 64 f16 (256 bytes), the whole to 2 MiB.
            use lode_runtime::engine::fit::{self, RunShape};
            let w = fit::window_kv(c, 4096, 512).unwrap();
            assert_eq!((w.slots, w.n_windowed()), (1600, 10));
            let target = lode_runtime::backend::memory::MemoryTarget {
                name: "gpu".into(),
                class: lode_runtime::weights::layout::DeviceClass::Gpu,
                residency: lode_runtime::weights::Residency::Device,
                free: 64 << 30,
                total: 80 << 30,
                used_at_open: 0,
                arena: true,
                tuning: Some(Default::default()),
                cap: None,
                host_expert_layers: 0,
            };
            let kv = |swa_full| {
                let shape = RunShape { ctx: 4096, batch: 512, n_seq: 1, kv_type: lode_runtime::backend::KvType::F16.into(), swa_full };
                fit::estimate(&m, &target, shape).unwrap().kv
            };
            let mib = |x: u64| x.div_ceil(2 << 20) * (2 << 20);
            assert_eq!((kv(false), kv(true)), (mib(2 * (2 * 4096 + 10 * 1600) * 256), mib(2 * 12 * 4096 * 256)));
        } else {
            assert_eq!((c.rope_base, c.n_swa, c.n_ctx_train), (1e9, 0, 131072));
            assert!(m.output != m.tok_embd, "untied");
        }
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
