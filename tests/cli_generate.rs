//! `lode generate` on bad input: a clear `error:` line, a non-zero exit, never a panic.
//! The model files used are written by the test (no real model needed), except the
//! prompt-too-long case, which uses SmolLM2 when present.

use std::path::PathBuf;
use std::process::Command;

use lode_runtime::gguf::{GgufWriter, MetaValue};
use lode_runtime::quant::GgmlType;

fn lode(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).args(args).output().expect("run lode");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code().unwrap_or(-1), stderr)
}

fn assert_clean_error(args: &[&str], needle: &str) {
    let (code, err) = lode(args);
    assert_ne!(code, 0, "{args:?} succeeded: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(err.contains("error:") && err.contains(needle), "{args:?}: expected `{needle}` in: {err}");
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("lode-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

/// A GGUF with an architecture lode does not know, one tiny tensor.
fn write_unknown_arch() -> PathBuf {
    let p = tmp("mamba.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("mamba".into()));
    w.add_tensor("token_embd.weight", GgmlType::F32, &[4, 2], vec![0u8; 32]);
    w.write_to(&p).unwrap();
    p
}

/// A llama header without any layer tensors.
fn write_missing_tensor() -> PathBuf {
    let p = tmp("llama-missing.gguf");
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in [("embedding_length", 4u32), ("block_count", 1), ("feed_forward_length", 8), ("attention.head_count", 1)] {
        w.add_kv(format!("llama.{k}"), MetaValue::U32(v));
    }
    w.add_kv("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5));
    w.add_tensor("token_embd.weight", GgmlType::F32, &[4, 2], vec![0u8; 32]);
    w.add_tensor("output_norm.weight", GgmlType::F32, &[4], vec![0u8; 16]);
    w.write_to(&p).unwrap();
    p
}

#[test]
fn bad_input_is_a_clear_error() {
    let unknown = write_unknown_arch();
    let missing = write_missing_tensor();
    let cpu = ["--device", "cpu"];
    let u = unknown.to_str().unwrap();
    let m = missing.to_str().unwrap();
    assert_clean_error(&["generate", "-m", u, "-p", "hi", cpu[0], cpu[1]], "unsupported architecture `mamba`");
    assert_clean_error(&["generate", "-m", u, "-p", "hi", cpu[0], cpu[1]], "llama, qwen2, qwen3, gemma3");
    assert_clean_error(&["generate", "-m", m, "-p", "hi", cpu[0], cpu[1]], "missing tensor `blk.0.attn_norm.weight`");
    assert_clean_error(&["generate", "-m", "/nonexistent/model.gguf", "-p", "hi"], "/nonexistent/model.gguf");
    assert_clean_error(&["generate", "-m", u, "-p", ""], "prompt is empty");
    assert_clean_error(&["generate", "-m", u, "-p", "hi", "-n", "0"], "at least 1");
    let smol = std::env::var_os("LODE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lode/models"))
        .join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if smol.exists() {
        let long = "hello ".repeat(100);
        let s = smol.to_str().unwrap();
        assert_clean_error(&["generate", "-m", s, "-p", &long, "-c", "32", cpu[0], cpu[1]], "only 32 of the context's 32");
    } else {
        eprintln!("SKIP prompt-too-long case: {} absent", smol.display());
    }
    let _ = std::fs::remove_dir_all(unknown.parent().unwrap());
}
