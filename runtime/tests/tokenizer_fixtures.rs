//! The tokenizer on the two real models against llama.cpp's fixtures: every case of
//! `tokenizer.json` (without specials, with the default BOS, with special parsing, and the
//! detokenized text), the vocabulary facts (BOS/EOS/EOT, end-of-generation set), and the
//! 39,704 ids llama-perplexity evaluates over `alice29.txt`.
//! Skips (with a note) when the models or fixtures are absent.

use std::path::PathBuf;

use lode_runtime::gguf::GgufFile;
use lode_runtime::tokenizer::Tokenizer;
use serde_json::Value;

mod real_files;
use real_files::{fixtures_dir, model};

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

fn load(model_file: &str, fixture: &str) -> Option<(Tokenizer, PathBuf)> {
    let dir = fixtures_dir()?.join(fixture);
    let path = model(model_file)?;
    let file = GgufFile::open(&path).expect("model opens");
    Some((Tokenizer::from_gguf(&file).expect("tokenizer loads"), dir))
}

/// Compare every case; returns (passed checks, failures).
fn check_cases(tok: &Tokenizer, dir: &PathBuf) -> (usize, Vec<String>) {
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
    let voc = &json["vocab"];
    assert_eq!(tok.vocab_size() as u64, voc["n_vocab"].as_u64().unwrap());
    assert_eq!(tok.bos().map(u64::from), voc["bos_id"].as_u64());
    assert_eq!(tok.eos().map(u64::from), voc["eos_id"].as_u64());
    assert_eq!(tok.eot().map(u64::from), voc["eot_id"].as_u64());
    assert_eq!(tok.add_bos(), voc["add_bos_default"].as_bool().unwrap());
    assert_eq!(tok.eog_ids(), ids(&voc["eog_ids"]));

    let mut passed = 0;
    let mut failures = Vec::new();
    let mut check = |what: &str, id: &str, text: &str, got: String, want: String| {
        if got == want {
            passed += 1;
        } else {
            failures.push(format!("{id} {what} {text:?}\n   got  {got}\n   want {want}"));
        }
    };
    for case in json["cases"].as_array().unwrap() {
        let id = case["id"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let no_special = ids(&case["ids_no_special"]);
        check("ids_no_special", id, text, format!("{:?}", tok.encode(text, false, false)), format!("{no_special:?}"));
        check("ids_default", id, text, format!("{:?}", tok.encode(text, true, false)), format!("{:?}", ids(&case["ids_default"])));
        let parse_special = ids(&case["ids_parse_special"]);
        check("ids_parse_special", id, text, format!("{:?}", tok.encode(text, false, true)), format!("{parse_special:?}"));
        let want = case["detokenized"].as_str().unwrap().to_string();
        check("detokenized", id, text, format!("{:?}", tok.decode(&no_special)), format!("{want:?}"));
        let got = String::from_utf8_lossy(&tok.detokenize(&parse_special, false, true)).into_owned();
        let want = case["detokenized_parse_special"].as_str().unwrap().to_string();
        check("detokenized_parse_special", id, text, format!("{got:?}"), format!("{want:?}"));
    }
    (passed, failures)
}

fn run_cases(model_file: &str, fixture: &str) {
    let Some((tok, dir)) = load(model_file, fixture) else { return };
    let (passed, failures) = check_cases(&tok, &dir);
    eprintln!("{fixture}: {passed} checks passed, {} failed", failures.len());
    assert!(failures.is_empty(), "{} mismatches:\n{}", failures.len(), failures.join("\n"));
}

fn run_perplexity_tokens(model_file: &str, fixture: &str) {
    let Some((tok, dir)) = load(model_file, fixture) else { return };
    // llama.cpp's `-f` drops one trailing newline.
    let file = std::fs::read_to_string(dir.join("alice29.txt")).unwrap();
    let text = file.strip_suffix('\n').unwrap_or(&file);
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("perplexity_tokens.json")).unwrap()).unwrap();
    let want = ids(&json["ids"]);
    let got = tok.encode(text, true, false);
    let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
    assert!(
        got == want,
        "{fixture}: {} ids vs llama.cpp's {}; first difference at {first_diff:?}",
        got.len(),
        want.len()
    );
    eprintln!("{fixture}: all {} perplexity ids match", want.len());
    // Round trip: the text comes back (minus the BOS the tokenizer added).
    assert_eq!(tok.decode(&got), text);
}

#[test]
fn gemma3_270m_matches_llama_cpp_on_every_case() {
    run_cases("gemma-3-270m-q4_k_m.gguf", "gemma3-270m");
}

#[test]
fn smollm2_135m_matches_llama_cpp_on_every_case() {
    run_cases("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m");
}

#[test]
fn gemma3_270m_matches_llama_perplexity_ids() {
    run_perplexity_tokens("gemma-3-270m-q4_k_m.gguf", "gemma3-270m");
}

#[test]
fn smollm2_135m_matches_llama_perplexity_ids() {
    run_perplexity_tokens("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m");
}
