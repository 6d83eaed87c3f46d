//! Vocabulary-only GGUFs of models too large to bring here (Llama 3 `llama-bpe`, Qwen2
//! `qwen2`, Llama-2-style SPM, GPT-2) against llama.cpp's own tokenizer test files
//! (`.inp` strings / `.out` ids, no BOS) and our case list (`NAME.tokenizer.json`).
//! This is what proves the `llama-bpe` and `qwen2` pre-tokenizers.

use std::path::PathBuf;

use lode_runtime::gguf::GgufFile;
use lode_runtime::tokenizer::Tokenizer;
use serde_json::Value;

fn vocab_dir() -> Option<PathBuf> {
    let candidates = match std::env::var_os("LODE_FIXTURES_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => vec![
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")),
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures")),
        ],
    };
    let found = candidates.into_iter().map(|d| d.join("vocab")).find(|d| d.is_dir());
    if found.is_none() {
        eprintln!("SKIP: fixtures/vocab not found (set LODE_FIXTURES_DIR)");
    }
    found
}

fn load(dir: &PathBuf, name: &str) -> Tokenizer {
    let file = GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).expect("vocab GGUF opens");
    Tokenizer::from_gguf(&file).expect("tokenizer loads from a vocabulary-only GGUF")
}

/// llama.cpp's test strings: separated by a `__ggml_vocab_test__` line (the newline
/// before the separator belongs to the separator).
fn inp_cases(dir: &PathBuf, name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.inp"))).unwrap();
    let out = std::fs::read_to_string(dir.join(format!("ggml-vocab-{name}.gguf.out"))).unwrap();
    let mut texts: Vec<String> = inp.split("\n__ggml_vocab_test__\n").map(str::to_string).collect();
    if texts.last().is_some_and(|t| t.is_empty()) {
        texts.pop(); // after the last separator
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    assert_eq!(texts.len(), ids.len(), "{name}: .inp and .out disagree on the case count");
    texts.into_iter().zip(ids).collect()
}

fn check_inp(name: &str) {
    let Some(dir) = vocab_dir() else { return };
    let tok = load(&dir, name);
    let cases = inp_cases(&dir, name);
    let mut failures = Vec::new();
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = tok.encode(text, false, false);
        if &got != want {
            failures.push(format!("case {i} {text:?}\n   got  {got:?}\n   want {want:?}"));
        }
    }
    eprintln!("{name}: {}/{} llama.cpp test strings match", cases.len() - failures.len(), cases.len());
    assert!(failures.is_empty(), "{name}: {} mismatches:\n{}", failures.len(), failures.join("\n"));
}

fn check_json(name: &str) {
    let Some(dir) = vocab_dir() else { return };
    let tok = load(&dir, name);
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.tokenizer.json"))).unwrap()).unwrap();
    let ids = |v: &Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect() };
    let mut failures = Vec::new();
    let cases = json["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        for (field, add_special) in [("ids_no_special", false), ("ids_default", true)] {
            let got = tok.encode(text, add_special, false);
            let want = ids(&case[field]);
            if got != want {
                failures.push(format!("{} {field} {text:?}\n   got  {got:?}\n   want {want:?}", case["id"]));
            }
        }
    }
    eprintln!("{name}: {}/{} case checks match", 2 * cases.len() - failures.len(), 2 * cases.len());
    assert!(failures.is_empty(), "{name}: {} mismatches:\n{}", failures.len(), failures.join("\n"));
}

#[test]
fn llama_bpe_matches_llama_cpp_test_strings() {
    check_inp("llama-bpe");
}

#[test]
fn qwen2_matches_llama_cpp_test_strings() {
    check_inp("qwen2");
}

#[test]
fn llama_spm_matches_llama_cpp_test_strings() {
    check_inp("llama-spm");
}

#[test]
fn gpt2_matches_llama_cpp_test_strings() {
    check_inp("gpt-2");
}

#[test]
fn llama_bpe_matches_the_case_list() {
    check_json("llama-bpe");
}

#[test]
fn qwen2_matches_the_case_list() {
    check_json("qwen2");
}
