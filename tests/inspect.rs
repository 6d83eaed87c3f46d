//! `lode inspect` through the real binary: the Gemma 3 270M Q4_K_M tensor census, and
//! the JSON form agreeing with the text form.

use std::process::Command;

mod common;
use common::models_dir;

fn inspect(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).arg("inspect").args(args).output().unwrap();
    assert!(out.status.success(), "lode inspect failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn gemma3_270m_tensor_census() {
    let path = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("SKIP: {} not found (set LODE_MODELS_DIR)", path.display());
        return;
    }
    let path = path.to_str().unwrap();
    let v: serde_json::Value = serde_json::from_str(&inspect(&[path, "--json"])).unwrap();
    assert_eq!(v["n_tensors"], 236);
    assert_eq!(v["tensors"].as_array().unwrap().len(), 236);
    let mut counts: Vec<(String, u64)> = v["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["type"].as_str().unwrap().to_string(), t["count"].as_u64().unwrap()))
        .collect();
    counts.sort();
    let want = [("F32", 109), ("Q4_K", 27), ("Q5_0", 81), ("Q6_K", 9), ("Q8_0", 10)];
    assert_eq!(counts, want.map(|(t, n)| (t.to_string(), n)).to_vec());
    // Long arrays are summarised, not dumped.
    let tokens = v["metadata"].as_array().unwrap().iter().find(|m| m["key"] == "tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens["value"]["len"], 262144);
    assert_eq!(tokens["value"]["first"].as_array().unwrap().len(), 8);
    // Text form: the table and the totals.
    let text = inspect(&[path]);
    assert!(text.contains("tensors (236):"), "{text}");
    assert!(text.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Q5_0", "81", "tensors", "43591680", "bytes"]));
    assert!(text.contains("262144 items"));
    assert!(text.lines().count() < 400, "text output should be summarised");
}

#[test]
fn inspect_reports_a_bad_file() {
    let dir = std::env::temp_dir().join(format!("lode-inspect-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("bad.gguf");
    std::fs::write(&p, b"GGUF\x03\x00\x00\x00\xff\xff\xff\xff\xff\xff\xff\xff").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).arg("inspect").arg(&p).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("byte 8"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gemma3_270m_plan_names_every_decode_and_prefill_kernel() {
    let path = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("SKIP: {} not found (set LODE_MODELS_DIR)", path.display());
        return;
    }
    let path = path.to_str().unwrap();
    let text = inspect(&[path, "--plan", "--tokens", "256"]);
    let (prefill, decode) = text.split_once("== decode").expect("a decode section");
    assert!(prefill.contains("== prefill: one chunk of 256 tokens"), "{text}");
    // Prefill: the BLAS path for the 256-token matmuls, flash attention (head_dim 256).
    assert!(prefill.contains("vendor BLAS"), "{text}");
    assert!(prefill.contains("flash_attn2_f16_d256"), "{text}");
    // Decode: 18 layers of fused one-token launches, folded into `blk.*` rows with counts.
    assert!(decode.contains("norm_matmul_multi") && decode.contains("blk.*.attn_q.weight"), "{text}");
    assert!(decode.contains("rope_kv_attention"), "{text}");
    assert!(!decode.contains("vendor BLAS") && !decode.contains("flash_attn"), "{text}");
    // Without the BLAS the prefill matmuls are lode's GEMM.
    let no_blas = Command::new(env!("CARGO_BIN_EXE_lode")).args(["inspect", path, "--plan", "--tokens", "256", "--no-blas"]).output().unwrap();
    let no_blas = String::from_utf8(no_blas.stdout).unwrap();
    assert!(no_blas.contains("gemm_q") && !no_blas.contains("vendor BLAS"), "{no_blas}");
}

/// `lode inspect` opens a file with one tensor of every type gguf-py 0.19.0 knows
/// (`ci/gguf_all_types.py`): each tensor has its type's name and the byte size gguf-py's
/// `GGML_QUANT_SIZES` gives it (Q8_1 aside: gguf-py still lists ggml's old 40-byte
/// block; ggml's `block_q8_1` has been 36 bytes since 2024, and lode reads it so).
#[test]
fn inspect_knows_every_ggml_type() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf-types");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("all-types.json")).unwrap()).unwrap();
    let path = dir.join("all-types.gguf");
    let v: serde_json::Value = serde_json::from_str(&inspect(&[path.to_str().unwrap(), "--json"])).unwrap();
    let got = v["tensors"].as_array().unwrap();
    let want = want["tensors"].as_array().unwrap();
    assert_eq!(got.len(), want.len());
    assert!(want.len() >= 34, "every id of 0..=41 that ggml still defines");
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g["name"], w["name"]);
        assert_eq!(g["type"], w["type"], "{}", w["name"]);
        assert_eq!(g["shape"], w["dims"], "{}", w["name"]);
        let n = w["n_bytes"].as_u64().unwrap();
        let n = if w["type"] == "Q8_1" { n / 40 * 36 } else { n };
        assert_eq!(g["bytes"].as_u64().unwrap(), n, "{}", w["name"]);
    }
    let text = inspect(&[path.to_str().unwrap()]);
    for t in ["Q3_K", "IQ2_XXS", "IQ4_XS", "MXFP4", "TQ2_0", "F64", "I8"] {
        assert!(text.lines().any(|l| l.split_whitespace().next() == Some(t) && l.contains("1 tensors")), "{t}: {text}");
    }
}
