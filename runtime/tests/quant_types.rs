//! Types lode knows by name but cannot compute with, and the CPU-only weight types: a
//! model is refused with an error naming the tensor, its type and the supported types;
//! a model whose matrices are a CPU-only type runs on the CPU backend.

use std::sync::Arc;

use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Model, ModelError};
use lode_runtime::quant::GgmlType;

mod weights_common;
use weights_common::model_bytes_with;

#[test]
fn a_model_with_a_type_lode_cannot_compute_is_refused_by_name() {
    for ty in [GgmlType::TQ1_0, GgmlType::NVFP4, GgmlType::TQ2_0, GgmlType::I8] {
        let bytes = model_bytes_with(&|name| if name == "blk.1.ffn_up.weight" { ty } else { GgmlType::Q8_0 });
        // The file itself is valid: it opens.
        let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
        assert_eq!(f.tensor("blk.1.ffn_up.weight").unwrap().info.ty, ty);
        let e = Model::load(f).err().expect("refused");
        assert!(matches!(&e, ModelError::UnsupportedType { name, ty: t, .. } if name == "blk.1.ffn_up.weight" && *t == ty), "{e}");
        let msg = e.to_string();
        for part in ["blk.1.ffn_up.weight", ty.name(), "Q4_K", "Q6_K", "Q8_0"] {
            assert!(msg.contains(part), "{msg}");
        }
    }
}

/// The file `f` with every matrix dequantized to F32 (the same weights, exactly).
fn f32_twin(f: &GgufFile) -> Arc<GgufFile> {
    use lode_runtime::gguf::GgufWriter;
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_kv(k.clone(), v.clone());
    }
    for t in f.tensors() {
        let data = f.tensor(&t.name).unwrap().data;
        let mut v = vec![0f32; t.n_elements() as usize];
        lode_runtime::quant::dequantize(t.ty, data, &mut v).unwrap();
        w.add_tensor(t.name.clone(), GgmlType::F32, &t.dims, v.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
}

/// A model whose every matrix is one CPU-only type (embedding and head included) runs on
/// the CPU backend, prefill and decode, and gives the logits of its F32 twin (the same
/// weights dequantized) up to the activations' own quantization (Q8_K / Q8_0): as close
/// as the older types are (Q4_K, Q4_0 and Q6_K are run alongside for scale).
#[test]
fn models_of_each_cpu_only_type_run_on_the_cpu() {
    use lode_runtime::backend::cpu::CpuBackend;
    use weights_common::{engine_on, prompt, run};
    for ty in GgmlType::LOWBIT_WEIGHTS.into_iter().chain(GgmlType::GRID_WEIGHTS).chain([GgmlType::Q4_K, GgmlType::Q4_0, GgmlType::Q6_K]) {
        let f = Arc::new(GgufFile::from_bytes(model_bytes_with(&|_| ty)).unwrap());
        let twin = f32_twin(&f);
        let p = prompt(37, 5);
        let mut e = engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 128).unwrap();
        let got = run(&mut e, &p, 4).unwrap();
        let mut e = engine_on(&twin, Box::new(CpuBackend::new(2).unwrap()), 128).unwrap();
        let want = run(&mut e, &p, 0).unwrap();
        let (g, w) = (&got[0], &want[0]);
        assert!(g.iter().all(|v| v.is_finite()), "{ty}");
        let rms = |v: &[f32]| (v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>() / v.len() as f64).sqrt();
        let diff: Vec<f32> = g.iter().zip(w).map(|(a, b)| a - b).collect();
        let rel = rms(&diff) / rms(w);
        eprintln!("{ty}: logits rms {:.4}, relative difference to the F32 twin {rel:.5}", rms(w));
        // The grid types' weights are random valid blocks (lode has no quantizer for them):
        // their logits are smaller (rms ~2.3 against ~5.7) against the same activation
        // rounding, so their relative difference is larger; a wrong dot gives ~1.
        let bound = if GgmlType::GRID_WEIGHTS.contains(&ty) { 0.08 } else { 0.05 };
        assert!(rel < bound, "{ty}: logits differ from the F32 twin by {rel} (relative rms)");
        assert!(got[1..].iter().all(|l| l.iter().all(|v| v.is_finite())), "{ty}: decode");
    }
}

/// A weight block with a NaN or Inf scale is refused at load, naming tensor and block.
#[test]
fn non_finite_scales_are_refused_at_load() {
    let mut f = GgufFile::from_bytes(model_bytes_with(&|_| GgmlType::Q3_K)).unwrap();
    let t = f.tensor("blk.0.attn_k.weight").unwrap().info.clone();
    let at = (f.data_offset() + t.offset) as usize + 5 * 110 + 108;
    let mut bytes = f.bytes().to_vec();
    bytes[at..at + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
    f = GgufFile::from_bytes(bytes).unwrap();
    let e = Model::load(Arc::new(f)).err().expect("refused");
    let msg = e.to_string();
    assert!(matches!(e, ModelError::BadBlocks { .. }), "{msg}");
    assert!(msg.contains("blk.0.attn_k.weight") && msg.contains("block 5") && msg.contains("inf"), "{msg}");
}

/// The grid types too: a block whose scale is Inf (IQ1_M: spread over the top nibbles of
/// its scale words) is refused at load, naming tensor and block.
#[test]
fn grid_types_non_finite_scales_are_refused_at_load() {
    for ty in GgmlType::GRID_WEIGHTS {
        let f = GgufFile::from_bytes(model_bytes_with(&|_| ty)).unwrap();
        let t = f.tensor("blk.0.attn_k.weight").unwrap().info.clone();
        let at = (f.data_offset() + t.offset) as usize + 5 * ty.block_bytes();
        let mut bytes = f.bytes().to_vec();
        if ty == GgmlType::IQ1_M {
            // f16 0x7c00: nibbles 0, 0, 0xc, 0x7 from the low end.
            for (k, nib) in [0u8, 0, 0xc, 0x7].into_iter().enumerate() {
                bytes[at + 49 + 2 * k] = (bytes[at + 49 + 2 * k] & 0x0f) | (nib << 4);
            }
        } else {
            bytes[at..at + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
        }
        let e = Model::load(Arc::new(GgufFile::from_bytes(bytes).unwrap())).err().expect("refused");
        let msg = e.to_string();
        assert!(matches!(e, ModelError::BadBlocks { .. }), "{ty}: {msg}");
        assert!(msg.contains("blk.0.attn_k.weight") && msg.contains("block 5") && msg.contains(ty.name()), "{msg}");
    }
}
