//! The new weight types against the `gguf` Python package 0.19.0, bit for bit: random
//! valid blocks (`tests/data/quant-ref/`, made by `ci/gguf_quant_ref.py`) dequantize to
//! exactly the f32 values `gguf.quants.dequantize` gives, and where gguf-py has a
//! quantizer (MXFP4) lode's quantizer writes exactly its bytes. Bad input (partial
//! blocks, NaN/Inf values to quantize) is an error, never a panic.

use std::path::PathBuf;

use lode_runtime::quant::{dequantize, quantize, GgmlType, QuantError};
use serde_json::Value;
use sha2::{Digest, Sha256};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/quant-ref")
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn reference() -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("quant-ref.json")).unwrap()).unwrap()
}

#[test]
fn new_types_dequantize_bit_exact_with_gguf_py() {
    let r = reference();
    let types = r["types"].as_object().unwrap();
    assert_eq!(types.len(), GgmlType::LOWBIT_WEIGHTS.len() + GgmlType::GRID_WEIGHTS.len());
    for ty in GgmlType::LOWBIT_WEIGHTS.into_iter().chain(GgmlType::GRID_WEIGHTS) {
        let w = &types[ty.name()];
        assert_eq!(w["block_bytes"].as_u64().unwrap() as usize, ty.block_bytes(), "{ty}");
        assert_eq!(w["block_elems"].as_u64().unwrap() as usize, ty.block_elems(), "{ty}");
        let blocks = std::fs::read(dir().join(format!("{}.blocks", ty.name()))).unwrap();
        let n = blocks.len() / ty.block_bytes() * ty.block_elems();
        let mut y = vec![f32::NAN; n];
        dequantize(ty, &blocks, &mut y).unwrap();
        let first: Vec<u64> = y.iter().take(64).map(|v| v.to_bits() as u64).collect();
        let want_first: Vec<u64> = w["dequant_first_bits"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
        assert_eq!(first, want_first, "{ty}: first values");
        let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(sha(&bytes), w["dequant_sha256"].as_str().unwrap(), "{ty}: all values");
    }
}

#[test]
fn quantizers_match_gguf_py_where_it_has_one() {
    let r = reference();
    let mut checked = 0;
    for (name, w) in r["types"].as_object().unwrap() {
        let Some(want) = w["quant_sha256"].as_str() else { continue };
        let ty = GgmlType::from_name(name).unwrap();
        let raw = std::fs::read(dir().join(format!("{name}.f32"))).unwrap();
        let x: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
        quantize(ty, &x, &mut q).unwrap();
        assert_eq!(sha(&q), want, "{ty}");
        checked += 1;
    }
    assert!(checked >= 1);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for ty in GgmlType::LOWBIT_WEIGHTS {
        let be = ty.block_elems();
        // A row that is not a whole number of blocks.
        let mut y = vec![0f32; be + 16];
        let e = dequantize(ty, &vec![0u8; 2 * ty.block_bytes()], &mut y).unwrap_err();
        assert!(matches!(e, QuantError::PartialBlock { .. }), "{ty}: {e}");
        let mut q = vec![0u8; ty.block_bytes()];
        assert!(matches!(quantize(ty, &y, &mut q), Err(QuantError::PartialBlock { .. })), "{ty}");
        // Byte counts that do not match.
        let mut y = vec![0f32; be];
        assert!(matches!(dequantize(ty, &[0u8; 3], &mut y), Err(QuantError::ByteLen { .. })), "{ty}");
        // NaN and ±Inf to quantize.
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut x = vec![0.5f32; 2 * be];
            x[be + 3] = bad;
            let mut q = vec![0u8; 2 * ty.block_bytes()];
            let e = quantize(ty, &x, &mut q).unwrap_err();
            assert!(matches!(e, QuantError::NonFiniteInput { index, .. } if index == be + 3), "{ty}: {e}");
        }
    }
}

/// The grid types: partial blocks and wrong byte counts are errors; quantizing without an
/// importance matrix to IQ2_XXS, IQ2_XS or IQ1_S is an error naming the type (llama.cpp
/// refuses them too); the others quantize without one (`quant_imatrix.rs` checks them).
#[test]
fn grid_types_bad_input_and_no_quantizer() {
    for ty in GgmlType::GRID_WEIGHTS {
        let mut y = vec![0f32; 256 + 32];
        let e = dequantize(ty, &vec![0u8; 2 * ty.block_bytes()], &mut y).unwrap_err();
        assert!(matches!(e, QuantError::PartialBlock { .. }), "{ty}: {e}");
        let mut y = vec![0f32; 256];
        assert!(matches!(dequantize(ty, &[0u8; 3], &mut y), Err(QuantError::ByteLen { .. })), "{ty}");
        let mut q = vec![0u8; ty.block_bytes()];
        if matches!(ty, GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S) {
            let e = quantize(ty, &[0.5; 256], &mut q).unwrap_err();
            assert!(matches!(e, QuantError::NeedsImatrix(t) if t == ty) && e.to_string().contains(ty.name()), "{ty}: {e}");
        } else {
            quantize(ty, &[0.5; 256], &mut q).unwrap();
        }
        // All-zero blocks (d = 0) are zeros.
        dequantize(ty, &vec![0u8; ty.block_bytes()], &mut y).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

/// Round trips: an all-zero row stays zero; random rows come back within a few code
/// steps of each type, and the finer types closer than the coarser ones.
#[test]
fn round_trip_error_orders_the_types() {
    let n = 256 * 64;
    let mut s = 0x2545_f491_u32;
    let x: Vec<f32> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 20001) as f32 / 10000.0 - 1.0
        })
        .collect();
    let rmse = |ty: GgmlType, x: &[f32]| {
        let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
        quantize(ty, x, &mut q).unwrap();
        let mut y = vec![0f32; x.len()];
        dequantize(ty, &q, &mut y).unwrap();
        (x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
    };
    for ty in GgmlType::LOWBIT_WEIGHTS {
        assert_eq!(rmse(ty, &vec![0.0; 256]), 0.0, "{ty}");
    }
    assert_eq!(rmse(GgmlType::IQ3_S, &vec![0.0; 256]), 0.0);
    let e: Vec<(GgmlType, f64)> = GgmlType::LOWBIT_WEIGHTS.iter().chain(&[GgmlType::IQ3_S]).map(|&t| (t, rmse(t, &x))).collect();
    eprintln!("rmse on uniform [-1, 1]: {e:?}");
    let get = |t: GgmlType| e.iter().find(|p| p.0 == t).unwrap().1;
    // Uniform data: rmse of a uniform quantizer with step h is h/sqrt(12).
    assert!(get(GgmlType::Q2_K) < 0.2 && get(GgmlType::Q2_K) > get(GgmlType::Q3_K));
    assert!(get(GgmlType::Q3_K) > get(GgmlType::IQ4_XS) && get(GgmlType::Q3_K) < 0.1);
    assert!(get(GgmlType::IQ4_NL) < 0.06 && get(GgmlType::IQ4_XS) < 0.06 && get(GgmlType::MXFP4) < 0.12);
    assert!(rmse(GgmlType::Q4_K, &x) < get(GgmlType::Q3_K));
    // IQ3_S (3.44 bits) between Q2_K and IQ4_XS.
    assert!(get(GgmlType::IQ3_S) < get(GgmlType::Q2_K) && get(GgmlType::IQ3_S) > get(GgmlType::IQ4_XS));
}

/// IQ3_S's quantizer writes the bytes llama.cpp's `quantize_iq3_s` writes (no importance
/// matrix; `tests/data/quant-ref/llama-ref.json` from `ci/llama_quant_ref.sh`), on rows
/// with zeros, a wide range of magnitudes and one all-zero sub-block.
#[test]
fn iq3_s_quantizer_matches_llama_cpp() {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir().join("llama-ref.json")).unwrap()).unwrap();
    let w = &r["types"]["IQ3_S"];
    let raw = std::fs::read(dir().join(w["input"].as_str().unwrap())).unwrap();
    let x: Vec<f32> = raw.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    let mut q = vec![0u8; x.len() / 256 * 110];
    quantize(GgmlType::IQ3_S, &x, &mut q).unwrap();
    assert_eq!(sha(&q), w["quant_sha256"].as_str().unwrap());
}
