//! Every tensor of both real models dequantizes, with lode, to exactly the f32 values the
//! `gguf` Python package (0.19.0) produces: the sha256 of all values and the first 32 bit
//! patterns must match the digests committed in `tests/data/gguf-dequant/` (made by
//! `ci/gguf_dequant_ref.py`). Skips when a model file is absent.

use std::path::PathBuf;

use lode_runtime::gguf::GgufFile;
use lode_runtime::quant::dequantize;
use serde_json::Value;
use sha2::{Digest, Sha256};

mod real_files;
use real_files::model;

fn digests(stem: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/gguf-dequant")
        .join(format!("{stem}.json"));
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap()
}

/// Dequantize one tensor a few rows at a time, hashing the LE f32 bytes as they come.
fn lode_digest(f: &GgufFile, name: &str) -> (String, Vec<u32>, String) {
    let t = f
        .tensor(name)
        .unwrap_or_else(|| panic!("{name}: not in file"));
    let ty = t.info.ty;
    let row = t.info.row_len() as usize;
    let row_bytes = ty.bytes_for(row as u64).unwrap() as usize;
    let rows_per_step = (1 << 20) / row.max(1) + 1;
    let mut h = Sha256::new();
    let mut first = Vec::new();
    let mut buf = Vec::new();
    for chunk in t.data.chunks(row_bytes * rows_per_step) {
        let n = chunk.len() / row_bytes * row;
        buf.resize(n, 0f32);
        dequantize(ty, chunk, &mut buf).unwrap();
        if first.len() < 32 {
            first.extend(buf.iter().take(32 - first.len()).map(|v| v.to_bits()));
        }
        let bytes: Vec<u8> = buf.iter().flat_map(|v| v.to_le_bytes()).collect();
        h.update(&bytes);
    }
    let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    (hex, first, ty.name().to_string())
}

fn check_model(file: &str) {
    let Some(p) = model(file) else { return };
    let f = GgufFile::open(&p).unwrap();
    let want = digests(file.trim_end_matches(".gguf"));
    let tensors = want["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensors().len(), "{file}: tensor count");
    let mut bad = Vec::new();
    for w in tensors {
        let name = w["name"].as_str().unwrap();
        let (sha, first, ty) = lode_digest(&f, name);
        assert_eq!(ty, w["type"].as_str().unwrap(), "{name}: type");
        let want_first: Vec<u32> = w["first_bits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        if first != want_first || sha != w["sha256_f32le"].as_str().unwrap() {
            bad.push(format!("{name} ({ty})"));
        }
    }
    assert!(
        bad.is_empty(),
        "{file}: {} tensors differ from gguf-py: {bad:?}",
        bad.len()
    );
    eprintln!("{file}: {} tensors bit-exact with gguf-py", tensors.len());
}

#[test]
fn gemma3_270m_dequantizes_bit_exact_with_gguf_py() {
    check_model("gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn smollm2_135m_dequantizes_bit_exact_with_gguf_py() {
    check_model("SmolLM2-135M-Instruct.Q4_1.gguf");
}
