//! Bad tokenizer metadata is a clear error naming what is wrong (GGUFs written here),
//! and a tiny hand-made SPM vocabulary behaves as llama.cpp's rules say.

use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue, ValueType};
use lode_runtime::tokenizer::{Tokenizer, TokenizerError};

fn strings(v: &[&str]) -> MetaValue {
    MetaValue::Array(ValueType::String, v.iter().map(|s| MetaValue::String(s.to_string())).collect())
}

/// A vocabulary-only GGUF with the given tokenizer keys.
fn vocab_file(kvs: Vec<(&str, MetaValue)>) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in kvs {
        w.add_kv(k, v);
    }
    GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
}

fn load_err(kvs: Vec<(&str, MetaValue)>) -> String {
    match Tokenizer::from_gguf(&vocab_file(kvs)) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_tokenizer_model_names_it_and_the_supported_ones() {
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::String("bert".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
    ]);
    assert!(err.contains("'bert'") && err.contains("llama") && err.contains("gpt2"), "{err}");
}

#[test]
fn unsupported_pre_tokenizer_names_it_and_the_supported_ones() {
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.pre", MetaValue::String("mystery-bpe".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b", "ab"])),
        ("tokenizer.ggml.merges", strings(&["a b"])),
    ]);
    assert!(err.contains("'mystery-bpe'") && err.contains("qwen2") && err.contains("smollm"), "{err}");
}

#[test]
fn missing_keys_are_named() {
    let err = load_err(vec![("tokenizer.ggml.tokens", strings(&["a"]))]);
    assert!(err.contains("tokenizer.ggml.model"), "{err}");
    let err = load_err(vec![("tokenizer.ggml.model", MetaValue::String("llama".into()))]);
    assert!(err.contains("tokenizer.ggml.tokens"), "{err}");
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::String("gpt2".into())),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ]);
    assert!(err.contains("tokenizer.ggml.merges"), "{err}");
}

#[test]
fn wrong_types_and_lengths_are_errors_not_panics() {
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "b"])),
        ("tokenizer.ggml.scores", MetaValue::Array(ValueType::F32, vec![MetaValue::F32(0.0)])),
    ]);
    assert!(err.contains("tokenizer.ggml.scores"), "{err}");
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::U32(3)),
        ("tokenizer.ggml.tokens", strings(&["a"])),
    ]);
    assert!(err.contains("tokenizer.ggml.model"), "{err}");
    let err = load_err(vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&["a", "a"])),
    ]);
    assert!(err.contains("duplicate"), "{err}");
    assert!(matches!(
        Tokenizer::from_gguf(&vocab_file(vec![
            ("tokenizer.ggml.model", MetaValue::String("llama".into())),
            ("tokenizer.ggml.tokens", strings(&[])),
        ])),
        Err(TokenizerError::BadMetadata { .. })
    ));
}

/// A Llama-2-style SPM vocabulary: `<unk>` `<s>` `</s>`, byte tokens for 'é', and a few
/// merges by score.
fn tiny_spm() -> Tokenizer {
    let tokens = ["<unk>", "<s>", "</s>", "<0xC3>", "<0xA9>", "▁", "h", "i", "▁h", "▁hi", "hi"];
    let scores: Vec<MetaValue> = [0.0, 0.0, 0.0, 0.0, 0.0, -1.0, -2.0, -2.0, -3.0, -1.5, -5.0]
        .iter()
        .map(|&s| MetaValue::F32(s))
        .collect();
    let types = [2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1].iter().map(|&t| MetaValue::I32(t)).collect();
    Tokenizer::from_gguf(&vocab_file(vec![
        ("tokenizer.ggml.model", MetaValue::String("llama".into())),
        ("tokenizer.ggml.tokens", strings(&tokens)),
        ("tokenizer.ggml.scores", MetaValue::Array(ValueType::F32, scores)),
        ("tokenizer.ggml.token_type", MetaValue::Array(ValueType::I32, types)),
    ]))
    .unwrap()
}

#[test]
fn spm_defaults_add_bos_and_a_space_prefix() {
    let tok = tiny_spm();
    assert_eq!(tok.bos(), Some(1));
    assert_eq!(tok.eos(), Some(2));
    assert!(tok.is_eog(2) && !tok.is_eog(1));
    // " hi" after the space prefix: ▁h (-3) vs hi (-5) vs ▁hi needs ▁h first...
    // pairs: ▁+h → "▁h" (-3), h+i → "hi" (-5): ▁h wins, then ▁h+i → "▁hi".
    assert_eq!(tok.encode("hi", true, false), [1, 9]);
    // Unknown character → byte fallback; decode turns the bytes back into 'é' and drops
    // the prefix space.
    let ids = tok.encode("hié", false, false);
    assert_eq!(ids, [9, 3, 4]);
    assert_eq!(tok.decode(&ids), "hié");
    // "</s>" is only the EOS token with special parsing.
    assert_eq!(tok.encode("</s>", false, true), [2]);
    assert_ne!(tok.encode("</s>", false, false), [2]);
}

#[test]
fn streaming_decode_holds_split_characters() {
    let tok = tiny_spm();
    let mut d = tok.stream_decoder();
    assert_eq!(d.push(&tok, 9), " hi");
    assert_eq!(d.push(&tok, 3), ""); // first byte of 'é'
    assert_eq!(d.push(&tok, 4), "é");
    assert_eq!(d.push(&tok, 2), ""); // EOS renders as nothing
    assert_eq!(d.flush(), "");
}
