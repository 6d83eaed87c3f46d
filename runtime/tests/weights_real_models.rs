//! The weight cache under the CPU engine with the real models (skipped when absent):
//! SmolLM2 through the whole prefill schedule (1 … 2048 tokens, each followed by 128
//! decode steps) with one copy per weight tensor used, and both models computing
//! bit-identical logits in `mapped`, `device` and `upload` residency.

mod weights_common;

use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::weights::Residency;
use weights_common::{cached, engine_on, run};

mod real_files;

fn model(name: &str) -> Option<Arc<GgufFile>> {
    let p = real_files::model(name)?;
    Some(Arc::new(GgufFile::open(&p).expect("open model")))
}

/// (weight tensors the forward pass reads, their GGUF bytes, vocabulary size).
fn used(f: &Arc<GgufFile>) -> (u64, u64, u32) {
    let m = Model::load(f.clone()).unwrap();
    let ids = m.weight_ids();
    (ids.len() as u64, ids.iter().map(|&id| m.w(id).data().len() as u64).sum(), m.cfg.n_vocab as u32)
}

fn prompt(n: usize, seed: u32, vocab: u32) -> Vec<u32> {
    // Ids above the special tokens, spread over the vocabulary.
    (0..n as u32).map(|i| 300 + (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) % (vocab - 300)).collect()
}

#[test]
fn smollm2_one_copy_per_weight_at_every_prefill_length() {
    let Some(f) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let (n, bytes, vocab) = used(&f);
    let mut e = engine_on(&f, Box::new(cached(Residency::Device)), 2048 + 128 + 8).unwrap();
    assert_eq!(e.weight_stats().unwrap().copies, 0, "nothing copied at load");
    for (i, len) in [1usize, 7, 64, 127, 513, 2048].into_iter().enumerate() {
        e.clear();
        let logits = run(&mut e, &prompt(len, i as u32, vocab), 128).unwrap();
        assert!(logits.iter().flatten().all(|x| x.is_finite()));
        let s = e.weight_stats().unwrap();
        assert_eq!(s.copies, n, "after prefill {len}: {s:?}");
        assert_eq!(s.duplicates, 0, "after prefill {len}");
        assert!(s.resident_bytes <= bytes, "after prefill {len}: {} > {bytes}", s.resident_bytes);
        assert_eq!(s.failures, 0);
        let d = s.device.unwrap();
        assert_eq!(d.peak_allocated_bytes, s.resident_bytes, "no transient weight memory");
    }
}

#[test]
fn real_models_compute_bit_identical_logits_in_every_residency() {
    for name in ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"] {
        let Some(f) = model(name) else { continue };
        let (n, bytes, vocab) = used(&f);
        let p = prompt(48, 5, vocab);
        let plain = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 128).unwrap(), &p, 4).unwrap();
        for r in [Residency::Mapped, Residency::Device, Residency::Upload] {
            let mut e = engine_on(&f, Box::new(cached(r)), 128).unwrap();
            let got = run(&mut e, &p, 4).unwrap();
            assert!(got == plain, "{name} {r}: logits differ from reading the mapping directly");
            let s = e.weight_stats().unwrap();
            match r {
                Residency::Mapped => assert_eq!((s.copies, s.mapped, s.mapped_bytes), (0, n, bytes), "{name}"),
                _ => assert_eq!((s.copies, s.resident_bytes, s.duplicates), (n, bytes, 0), "{name} {r}"),
            }
        }
    }
}
