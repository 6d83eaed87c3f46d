//! A small quantized qwen3-shaped model for the weight-residency tests: Q4_K attention
//! and FFN matrices and embedding, Q6_K `ffn_down` and output, f32 and f16 norms — the
//! Q4_K_M mix at a width the CPU runs 2,000-token prefills of in seconds.
#![allow(dead_code)]

use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::{Backend, KvType};
use lode_runtime::engine::{argmax_logits, Engine, EngineOptions};
use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue};
use lode_runtime::model::Model;
use lode_runtime::quant::{self, GgmlType};
use lode_runtime::backend::cached::CachedBackend;
use lode_runtime::weights::{Residency, WeightOptions};

pub const E: u64 = 256;
pub const H: u64 = 4;
pub const HKV: u64 = 2;
pub const D: u64 = 64;
pub const FF: u64 = 512;
pub const V: u64 = 320;
pub const L: usize = 2;

fn values(n: u64, seed: u64, s: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * s
        })
        .collect()
}

/// The model file's bytes.
pub fn model_bytes() -> Vec<u8> {
    use GgmlType::{Q4_K, Q6_K};
    model_bytes_with(&|name| if name == "output.weight" || name.ends_with("ffn_down.weight") { Q6_K } else { Q4_K })
}

/// The same model with each matrix of the type `mat(name)` gives, its bytes
/// `quant::quantize`d (zeros for a type lode cannot quantize to).
pub fn model_bytes_with(mat: &dyn Fn(&str) -> GgmlType) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let arch = "qwen3";
    w.add_kv("general.architecture", MetaValue::String(arch.into()));
    for (k, v) in [
        ("context_length", 4096u32),
        ("embedding_length", E as u32),
        ("block_count", L as u32),
        ("feed_forward_length", FF as u32),
        ("attention.head_count", H as u32),
        ("attention.head_count_kv", HKV as u32),
        ("attention.key_length", D as u32),
        ("attention.value_length", D as u32),
    ] {
        w.add_kv(format!("{arch}.{k}"), MetaValue::U32(v));
    }
    w.add_kv(format!("{arch}.attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6));
    w.add_kv(format!("{arch}.rope.freq_base"), MetaValue::F32(1e6));
    let mut seed = 7;
    let mut t = |w: &mut GgufWriter, name: String, dims: &[u64], ty: GgmlType| {
        seed += 1;
        let n: u64 = dims.iter().product();
        let v: Vec<f32> = if dims.len() == 1 { values(n, seed, 0.2).iter().map(|x| 1.0 + x).collect() } else { values(n, seed, 0.6) };
        let ty = if dims.len() == 1 { ty } else { mat(&name) };
        let mut b = vec![0u8; ty.bytes_for(n).unwrap() as usize];
        if ty.is_supported() {
            quant::quantize(ty, &v, &mut b).unwrap();
        } else if GgmlType::GRID_WEIGHTS.contains(&ty) {
            // No quantizer: random valid blocks of the same magnitude.
            b = quant::grid_random_blocks(ty, n as usize / 256, seed, 0.6);
        }
        w.add_tensor(name, ty, dims, b);
    };
    use GgmlType::{F16, F32, Q4_K, Q6_K};
    t(&mut w, "token_embd.weight".into(), &[E, V], Q4_K);
    t(&mut w, "output_norm.weight".into(), &[E], F32);
    t(&mut w, "output.weight".into(), &[E, V], Q6_K);
    for l in 0..L {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(&mut w, n("attn_norm.weight"), &[E], F32);
        t(&mut w, n("attn_q.weight"), &[E, H * D], Q4_K);
        t(&mut w, n("attn_k.weight"), &[E, HKV * D], Q4_K);
        t(&mut w, n("attn_v.weight"), &[E, HKV * D], Q4_K);
        t(&mut w, n("attn_output.weight"), &[H * D, E], Q4_K);
        t(&mut w, n("attn_q_norm.weight"), &[D], F32);
        t(&mut w, n("attn_k_norm.weight"), &[D], F16);
        t(&mut w, n("ffn_norm.weight"), &[E], F16);
        t(&mut w, n("ffn_gate.weight"), &[E, FF], Q4_K);
        t(&mut w, n("ffn_up.weight"), &[E, FF], Q4_K);
        t(&mut w, n("ffn_down.weight"), &[FF, E], Q6_K);
    }
    w.to_bytes().expect("write gguf")
}

pub fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(model_bytes()).expect("parse gguf"))
}

/// (tensors the forward pass reads, their GGUF bytes).
pub fn used(file: &Arc<GgufFile>) -> (u64, u64) {
    let m = Model::load(file.clone()).unwrap();
    let ids = m.weight_ids();
    let bytes = ids.iter().map(|&id| m.w(id).data().len() as u64).sum();
    (ids.len() as u64, bytes)
}

pub fn opts(residency: Residency) -> WeightOptions {
    WeightOptions { residency: Some(residency), ..Default::default() }
}

pub fn cached(residency: Residency) -> CachedBackend {
    CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &opts(residency)).unwrap()
}

pub fn engine_on(file: &Arc<GgufFile>, be: Box<dyn Backend>, ctx: usize) -> Result<Engine, lode_runtime::engine::EngineError> {
    let m = Model::load(file.clone()).unwrap();
    Engine::new(m, be, EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: KvType::F16.into(), swa_full: false })
}

/// A prompt of `n` ids.
pub fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) % V as u32).collect()
}

/// Prefill `p`, then `steps` greedy decode steps; every logits vector, in order.
pub fn run(e: &mut Engine, p: &[u32], steps: usize) -> Result<Vec<Vec<f32>>, lode_runtime::engine::EngineError> {
    let mut out = vec![e.eval(p)?];
    for _ in 0..steps {
        let t = argmax_logits(out.last().unwrap());
        out.push(e.eval(&[t])?);
    }
    Ok(out)
}
