//! Speculative decoding against plain decoding: greedy output identical token for token
//! with each drafter (n-gram lookup, a draft model), on tiny models written here and on
//! the two real models (SmolLM2 drafting for itself, Gemma 3 270M with n-gram lookup);
//! seeded sampling with point-mass drafts identical to plain sampling; the stop
//! conditions and the cache length as plain decoding leaves them; clear errors for a
//! vocabulary mismatch and a constraint.

use std::path::PathBuf;
use std::sync::Arc;

use lode_runtime::backend::{cpu::CpuBackend, KvType};
use lode_runtime::engine::{
    generate_speculative, Drafter, Engine, EngineOptions, Flow, GenOutput, GenParams, ModelDrafter, NgramDrafter, Sampler,
    SamplerParams, SpecOutput, SpecParams, StopReason,
};
use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue};
use lode_runtime::model::Model;
use lode_runtime::quant::GgmlType;

/// A tiny llama model: `vocab` tokens, weights from `seed`.
fn tiny(vocab: u64, seed: u64) -> Model {
    let (e, h, hkv, d, ff) = (16u64, 4u64, 2u64, 8u64, 24u64);
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("llama".into()));
    for (k, v) in [
        ("context_length", 64u32),
        ("embedding_length", e as u32),
        ("block_count", 2),
        ("feed_forward_length", ff as u32),
        ("attention.head_count", h as u32),
        ("attention.head_count_kv", hkv as u32),
        ("attention.key_length", d as u32),
        ("attention.value_length", d as u32),
    ] {
        w.add_kv(format!("llama.{k}"), MetaValue::U32(v));
    }
    w.add_kv("llama.attention.layer_norm_rms_epsilon", MetaValue::F32(1e-5));
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut t = |w: &mut GgufWriter, name: String, dims: &[u64], norm: bool| {
        let n: u64 = dims.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let r = (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                if norm { 1.0 + 0.2 * r } else { 1.5 * r }
            })
            .collect();
        w.add_tensor(name, GgmlType::F32, dims, v.iter().flat_map(|f| f.to_le_bytes()).collect());
    };
    t(&mut w, "token_embd.weight".into(), &[e, vocab], false);
    t(&mut w, "output_norm.weight".into(), &[e], true);
    for l in 0..2 {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(&mut w, n("attn_norm.weight"), &[e], true);
        t(&mut w, n("attn_q.weight"), &[e, h * d], false);
        t(&mut w, n("attn_k.weight"), &[e, hkv * d], false);
        t(&mut w, n("attn_v.weight"), &[e, hkv * d], false);
        t(&mut w, n("attn_output.weight"), &[h * d, e], false);
        t(&mut w, n("ffn_norm.weight"), &[e], true);
        t(&mut w, n("ffn_gate.weight"), &[e, ff], false);
        t(&mut w, n("ffn_up.weight"), &[e, ff], false);
        t(&mut w, n("ffn_down.weight"), &[ff, e], false);
    }
    Model::load(Arc::new(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())).unwrap()
}

fn engine_of(model: Model, ctx: usize) -> Engine {
    let be = Box::new(CpuBackend::new(2).unwrap());
    Engine::new(model, be, EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: KvType::F16.into(), swa_full: false }).unwrap()
}

fn plain(e: &mut Engine, prompt: &[u32], params: &GenParams, sp: &SamplerParams) -> GenOutput {
    e.clear();
    let mut s = Sampler::new(sp.clone());
    e.generate(prompt, params, &mut s, &mut |_| Flow::Continue).unwrap()
}

fn spec(e: &mut Engine, d: &mut dyn Drafter, k: usize, prompt: &[u32], params: &GenParams, sp: &SamplerParams) -> SpecOutput {
    e.clear();
    let mut s = Sampler::new(sp.clone());
    let sparams = SpecParams { draft_max: k, draft_min: 0 };
    let mut seen = Vec::new();
    let out = generate_speculative(e, d, &sparams, prompt, params, &mut s, &mut |t| {
        seen.push(t);
        Flow::Continue
    })
    .unwrap();
    // `on_token` sees every emitted token but an end-of-generation one, in order.
    let shown = if out.out.stop == StopReason::Eog { &out.out.tokens[..out.out.tokens.len() - 1] } else { &out.out.tokens[..] };
    assert_eq!(seen, shown);
    out
}

/// The same tokens, stop reason, and cache contents (plain decoding leaves every token
/// but the last sampled one in the cache).
fn assert_same(a: &GenOutput, b: &SpecOutput, what: &str, cache: &[u32], prompt: &[u32]) {
    assert_eq!(a.tokens, b.out.tokens, "{what}: tokens differ");
    assert_eq!(a.stop, b.out.stop, "{what}: stop reason differs");
    let want: Vec<u32> = prompt.iter().chain(&a.tokens[..a.tokens.len() - 1]).copied().collect();
    assert_eq!(cache, &want[..], "{what}: cache holds other tokens than plain decoding's");
}

#[test]
fn tiny_greedy_with_ngram_and_draft_models_equals_plain() {
    let prompt: Vec<u32> = vec![1, 5, 9, 2, 7, 1, 5, 9, 2, 7, 1, 5];
    let greedy = SamplerParams::greedy();
    let mut target = engine_of(tiny(40, 1), 64);
    for (max_tokens, ctx_left) in [(40, false), (7, false), (200, true)] {
        let params = GenParams { max_tokens, eog: vec![] };
        let want = plain(&mut target, &prompt, &params, &greedy);
        assert_eq!(want.stop == StopReason::ContextFull, ctx_left);
        for k in [1, 3, 16] {
            let mut ng = NgramDrafter::new(4, 1).unwrap();
            let got = spec(&mut target, &mut ng, k, &prompt, &params, &greedy);
            assert_same(&want, &got, &format!("ngram k={k} n={max_tokens}"), target.history(), &prompt);
            assert!(max_tokens < 40 || got.stats.drafted > 0, "the n-gram drafter proposed nothing: k={k} n={max_tokens} {:?} {:?}", want.tokens, got.stats);
            // Itself as the draft model: everything accepted. Another model: mostly not.
            for (seed, all) in [(1, true), (77, false)] {
                let de = engine_of(tiny(40, seed), 64);
                let mut dm = ModelDrafter::new(de, target.model(), &greedy, 0.0).unwrap();
                let got = spec(&mut target, &mut dm, k, &prompt, &params, &greedy);
                assert_same(&want, &got, &format!("draft seed {seed} k={k} n={max_tokens}"), target.history(), &prompt);
                assert!(got.stats.drafted > 0);
                if all {
                    assert_eq!(got.stats.accepted, got.stats.drafted, "self-drafting k={k}: {:?}", got.stats);
                    // k drafts + 1 of its own per pass.
                    let passes = (want.tokens.len() - 1).div_ceil(k + 1);
                    assert!(got.stats.passes <= passes + 1, "{} passes for {:?}", got.stats.passes, want.tokens.len());
                } else {
                    assert!(got.stats.accepted < got.stats.drafted, "{:?}", got.stats);
                }
            }
        }
    }
    // An end-of-generation token stops it where plain decoding stops.
    let params = GenParams { max_tokens: 40, eog: vec![] };
    let free = plain(&mut target, &prompt, &params, &greedy);
    let eog = free.tokens[9];
    let params = GenParams { max_tokens: 40, eog: vec![eog] };
    let want = plain(&mut target, &prompt, &params, &greedy);
    assert_eq!(want.stop, StopReason::Eog);
    let mut dm = ModelDrafter::new(engine_of(tiny(40, 1), 64), target.model(), &greedy, 0.0).unwrap();
    let got = spec(&mut target, &mut dm, 8, &prompt, &params, &greedy);
    assert_same(&want, &got, "eog", target.history(), &prompt);
}

#[test]
fn seeded_sampling_with_point_mass_drafts_equals_plain_sampling() {
    let prompt: Vec<u32> = vec![3, 4, 5, 3, 4, 5, 3, 4];
    let mut target = engine_of(tiny(40, 2), 64);
    let params = GenParams { max_tokens: 48, eog: vec![] };
    for sp in [
        SamplerParams { temp: 0.7, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 11, ..Default::default() },
        SamplerParams { temp: 1.0, repeat_penalty: 1.3, presence_penalty: 0.2, seed: 5, ..Default::default() },
    ] {
        let want = plain(&mut target, &prompt, &params, &sp);
        let mut ng = NgramDrafter::new(3, 1).unwrap();
        let got = spec(&mut target, &mut ng, 6, &prompt, &params, &sp);
        assert_same(&want, &got, &format!("sampled {sp:?}"), target.history(), &prompt);
        assert!(got.stats.drafted > 0);
    }
}

#[test]
fn a_sampled_draft_model_runs_the_rule_and_keeps_the_cache_right() {
    // With q from the draft model the tokens differ from plain sampling (other random
    // draws) but every emitted token and the cache must be consistent.
    let prompt: Vec<u32> = vec![3, 4, 5, 3, 4, 5];
    let sp = SamplerParams { temp: 0.9, top_k: 0, top_p: 1.0, min_p: 0.0, seed: 4, ..Default::default() };
    let mut target = engine_of(tiny(40, 3), 64);
    let params = GenParams { max_tokens: 40, eog: vec![] };
    let mut dm = ModelDrafter::new(engine_of(tiny(40, 3), 64), target.model(), &sp, 0.0).unwrap();
    let got = spec(&mut target, &mut dm, 4, &prompt, &params, &sp);
    assert_eq!(got.out.tokens.len(), 40);
    let want: Vec<u32> = prompt.iter().chain(&got.out.tokens[..39]).copied().collect();
    assert_eq!(target.history(), &want[..]);
    // Same model, same settings: p == q, so nearly everything is accepted.
    assert!(got.stats.acceptance() > 0.9, "{:?}", got.stats);
}

#[test]
fn vocabulary_mismatch_and_constraints_are_clear_errors() {
    let target = tiny(40, 1);
    let err = ModelDrafter::new(engine_of(tiny(41, 1), 64), &target, &SamplerParams::greedy(), 0.0).err().unwrap();
    assert!(err.to_string().contains("41") && err.to_string().contains("40") && err.to_string().contains("tokenizer"), "{err}");
    struct All;
    impl lode_runtime::engine::Constraint for All {
        fn allowed(&mut self) -> lode_runtime::engine::TokenMask {
            let mut m = lode_runtime::engine::TokenMask::none(40);
            (0..40).for_each(|t| m.set(t, true));
            m
        }
        fn commit(&mut self, _: u32) {}
    }
    let mut e = engine_of(target, 64);
    let mut s = Sampler::new(SamplerParams::greedy()).with_constraint(Box::new(All));
    let mut ng = NgramDrafter::new(3, 1).unwrap();
    let params = GenParams { max_tokens: 4, eog: vec![] };
    let err = generate_speculative(&mut e, &mut ng, &SpecParams::default(), &[1, 2], &params, &mut s, &mut |_| Flow::Continue)
        .err()
        .unwrap();
    assert!(err.to_string().contains("constraint"), "{err}");
}

fn models_dir() -> PathBuf {
    std::env::var_os("LODE_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lode/models")
    })
}

fn real(file: &str) -> Option<Model> {
    let p = models_dir().join(file);
    if !p.exists() {
        eprintln!("SKIP: need {}", p.display());
        return None;
    }
    Some(Model::load(Arc::new(GgufFile::open(&p).unwrap())).unwrap())
}

/// Token ids of a few prompts (a tokenizer-free test: ids from the models' vocabularies,
/// one with a repeated passage so the n-gram drafter has something to find).
fn real_prompts(model: &Model) -> Vec<Vec<u32>> {
    let tok = lode_runtime::tokenizer::Tokenizer::from_gguf(model.file()).unwrap();
    let texts = [
        "The capital of France is",
        "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n\nRewrite fib with a loop:\n\ndef fib(n):\n",
        "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    ];
    texts.iter().map(|t| tok.encode(t, true, false)).collect()
}

#[test]
fn smollm2_drafting_for_itself_equals_plain_greedy() {
    let Some(m) = real("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let d = real("SmolLM2-135M-Instruct.Q4_1.gguf").unwrap();
    let prompts = real_prompts(&m);
    let mut target = engine_of(m, 512);
    let greedy = SamplerParams::greedy();
    let params = GenParams { max_tokens: 48, eog: vec![] };
    let mut dm = ModelDrafter::new(engine_of(d, 512), target.model(), &greedy, 0.0).unwrap();
    for (i, p) in prompts.iter().enumerate() {
        let want = plain(&mut target, p, &params, &greedy);
        let got = spec(&mut target, &mut dm, 8, p, &params, &greedy);
        eprintln!("smollm2 prompt {i}: {:?}, acceptance {:.3}", got.stats, got.stats.acceptance());
        assert_same(&want, &got, &format!("smollm2 prompt {i}"), target.history(), p);
        assert!(got.stats.acceptance() > 0.95, "self-drafting accepted only {:?}", got.stats);
    }
}

#[test]
fn gemma3_with_ngram_lookup_equals_plain_greedy() {
    let Some(m) = real("gemma-3-270m-q4_k_m.gguf") else { return };
    let prompts = real_prompts(&m);
    let mut target = engine_of(m, 512);
    let greedy = SamplerParams::greedy();
    let params = GenParams { max_tokens: 48, eog: vec![] };
    let mut accepted = 0;
    for (i, p) in prompts.iter().enumerate() {
        let want = plain(&mut target, p, &params, &greedy);
        let mut ng = NgramDrafter::new(8, 1).unwrap();
        let got = spec(&mut target, &mut ng, 10, p, &params, &greedy);
        eprintln!("gemma3 prompt {i}: {:?}, acceptance {:.3}", got.stats, got.stats.acceptance());
        assert_same(&want, &got, &format!("gemma3 prompt {i}"), target.history(), p);
        accepted += got.stats.accepted;
    }
    assert!(accepted > 0, "n-gram lookup never hit, even on the repeated passage");
}

/// Each drafter on each real model: Gemma 3 drafting for itself (a draft model whose
/// cache has window-sized layers, caught up and cut back with the target's) and SmolLM2
/// with n-gram lookup, greedy output plain greedy's token for token. (SmolLM2 drafting
/// for itself and Gemma with n-gram lookup are above; neither file has an MTP block:
/// draft-mtp is checked on the synthetic presets, `tests/mtp_reference.rs`.)
#[test]
fn gemma3_drafting_for_itself_and_smollm2_with_ngram_equal_plain_greedy() {
    let greedy = SamplerParams::greedy();
    let params = GenParams { max_tokens: 32, eog: vec![] };
    if let (Some(m), Some(d)) = (real("gemma-3-270m-q4_k_m.gguf"), real("gemma-3-270m-q4_k_m.gguf")) {
        let prompts = real_prompts(&m);
        let mut target = engine_of(m, 512);
        let mut dm = ModelDrafter::new(engine_of(d, 512), target.model(), &greedy, 0.0).unwrap();
        for (i, p) in prompts.iter().enumerate() {
            let want = plain(&mut target, p, &params, &greedy);
            let got = spec(&mut target, &mut dm, 6, p, &params, &greedy);
            eprintln!("gemma3 self-draft prompt {i}: {:?}", got.stats);
            assert_same(&want, &got, &format!("gemma3 self-draft prompt {i}"), target.history(), p);
            assert!(got.stats.acceptance() > 0.95, "self-drafting accepted only {:?}", got.stats);
        }
    }
    if let Some(m) = real("SmolLM2-135M-Instruct.Q4_1.gguf") {
        let prompts = real_prompts(&m);
        let mut target = engine_of(m, 512);
        let mut accepted = 0;
        for (i, p) in prompts.iter().enumerate() {
            let want = plain(&mut target, p, &params, &greedy);
            let got = spec(&mut target, &mut NgramDrafter::new(8, 1).unwrap(), 8, p, &params, &greedy);
            eprintln!("smollm2 n-gram prompt {i}: {:?}", got.stats);
            assert_same(&want, &got, &format!("smollm2 n-gram prompt {i}"), target.history(), p);
            accepted += got.stats.accepted;
        }
        assert!(accepted > 0, "n-gram lookup never hit, even on the repeated passage");
    }
}

/// The same on a window-sized cache (chunks of 64: 640 slots for Gemma's 512-token
/// window) past its base moves: a long repeated passage, so drafts are accepted while the
/// cache drops old keys, and a rolled-back verify chunk keeps its prefix.
#[test]
fn gemma3_speculation_on_a_window_sized_cache_equals_plain_greedy() {
    let Some(m) = real("gemma-3-270m-q4_k_m.gguf") else { return };
    let one = real_prompts(&m).remove(2);
    let p: Vec<u32> = one.iter().chain(one[1..].iter().cycle().take(720)).copied().collect();
    let be = Box::new(CpuBackend::new(2).unwrap());
    let opts = EngineOptions { ctx_size: Some(2048), batch_size: 64, kv_type: KvType::F16.into(), swa_full: false };
    let mut target = Engine::new(m, be, opts).unwrap();
    let w = target.window_kv().expect("a window-sized cache");
    assert!(p.len() > w.slots, "{} tokens, {} slots", p.len(), w.slots);
    let greedy = SamplerParams::greedy();
    let params = GenParams { max_tokens: 40, eog: vec![] };
    let want = plain(&mut target, &p, &params, &greedy);
    let mut ng = NgramDrafter::new(8, 1).unwrap();
    let got = spec(&mut target, &mut ng, 10, &p, &params, &greedy);
    eprintln!("gemma3 window-sized: {:?}, acceptance {:.3}", got.stats, got.stats.acceptance());
    assert_same(&want, &got, "gemma3 window-sized cache", target.history(), &p);
    assert!(got.stats.accepted > 0, "{:?}: n-gram lookup never hit", got.stats);
}

/// The verify chunk's rows are the decode steps' logits bit for bit on the CPU, with
/// either KV precision and with chunks long enough for the four-token and batch-order
/// kernels a prompt uses (without `round_rows_as_decode` they differ on Gemma's Q4_K).
#[test]
fn verify_rows_equal_decode_steps_bit_for_bit() {
    for f in ["gemma-3-270m-q4_k_m.gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"] {
        let Some(m) = real(f) else { return };
        let p = real_prompts(&m)[2].clone();
        let file = m.file().clone();
        for kv in [KvType::F16, KvType::F32] {
            let m = Model::load(file.clone()).unwrap();
            let be = Box::new(CpuBackend::new(2).unwrap());
            let mut e = Engine::new(m, be, EngineOptions { ctx_size: Some(512), batch_size: 512, kv_type: kv.into(), swa_full: false }).unwrap();
            let n = p.len();
            let chunk = 12;
            e.eval(&p[..n - chunk]).unwrap();
            let rows = lode_runtime::engine::Sequence::eval_each(&mut e, &p[n - chunk..]).unwrap();
            assert_eq!(rows.len(), chunk);
            e.truncate(n - chunk);
            for (i, row) in rows.iter().enumerate() {
                let one = e.eval(&p[n - chunk + i..n - chunk + i + 1]).unwrap();
                assert!(one == *row, "{f} {kv:?}: verify row {i} differs from the decode step");
            }
        }
    }
}
