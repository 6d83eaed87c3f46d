//! The forward pass against llama.cpp's own outputs on the two real models
//! (`shared/fixtures/{gemma3-270m,smollm2-135m}`): greedy continuations and
//! per-position log-probabilities. Skips (with a note) when a model or the fixtures are
//! absent; CI fetches both first.
//!
//! The CPU backend rounds as llama.cpp's CPU backend does on an AVX2 machine (see
//! `backend/cpu/attn_ggml.rs`, `quant/simd_avx2/kquant.rs`), so there the logits equal
//! the fixtures (KL 0) and every continuation matches in full; the looser bars
//! (95 % same top-1, no miss at a margin ≥ 0.5, KL ≤ 0.01, greedy up to a near-tie) are
//! what any CPU must meet.

use std::path::PathBuf;
use std::sync::Arc;

use lode_runtime::backend::{cpu::CpuBackend, KvType};
use lode_runtime::engine::{Engine, EngineOptions, GenParams, Sampler, SamplerParams};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use serde_json::Value;

const MODELS: [(&str, &str); 2] =
    [("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"), ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf")];

fn models_dir() -> PathBuf {
    std::env::var_os("LODE_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lode/models")
    })
}

fn fixtures_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LODE_FIXTURES_DIR") {
        return PathBuf::from(d);
    }
    // Beside the checkout, or beside a git worktree one level deeper.
    let near = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures"));
    let deeper = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures"));
    if !near.is_dir() && deeper.is_dir() {
        deeper
    } else {
        near
    }
}

/// The model file and fixture folder of `name`, or `None` (with a note) when absent.
fn find(name: &str, file: &str) -> Option<(PathBuf, PathBuf)> {
    let (m, f) = (models_dir().join(file), fixtures_dir().join(name));
    if !m.exists() || !f.exists() {
        eprintln!("SKIP {name}: need {} and {}", m.display(), f.display());
        return None;
    }
    Some((m, f))
}

fn engine(model: &PathBuf, kv_type: KvType, ctx: usize) -> Engine {
    let file = Arc::new(GgufFile::open(model).expect("open model"));
    let model = Model::load(file).expect("load model");
    let be = Box::new(CpuBackend::new(2).expect("cpu backend"));
    Engine::new(model, be, EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: kv_type.into(), swa_full: false }).expect("engine")
}

/// Whether this CPU runs the kernels that reproduce llama.cpp's rounding (AVX2+FMA+F16C).
fn exact_numerics() -> bool {
    lode_runtime::quant::Isa::Avx2.available()
}

fn read_json(p: PathBuf) -> Value {
    serde_json::from_str(&std::fs::read_to_string(&p).expect("read fixture")).expect("parse fixture")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array().expect("id array").iter().map(|x| x.as_u64().expect("id") as u32).collect()
}

/// Greedy continuations equal llama.cpp's up to the first step whose reference
/// top-1/top-2 margin is below 0.5 (past such a step llama.cpp disagrees with itself).
#[test]
fn greedy_matches_llama_cpp_until_a_near_tie() {
    for (name, file) in MODELS {
        let Some((model, fx)) = find(name, file) else { continue };
        let g = read_json(fx.join("greedy.json"));
        let eog = ids(&g["eog_ids"]);
        let mut e = engine(&model, KvType::F16, 1024);
        let cases: Vec<&Value> =
            g["raw"].as_array().unwrap().iter().chain(g["chat"].as_array().unwrap()).collect();
        let (mut full, mut failures) = (0, Vec::new());
        for c in &cases {
            let id = c["id"].as_str().unwrap();
            let prompt = ids(&c["prompt_ids"]);
            let want = ids(&c["generated_ids"]);
            let steps = c["steps_top2"].as_array().unwrap();
            let must = steps
                .iter()
                .position(|s| s[1].as_f64().unwrap() - s[3].as_f64().unwrap() < 0.5)
                .unwrap_or(want.len());
            e.clear();
            let mut sampler = Sampler::new(SamplerParams::greedy());
            let params = GenParams { max_tokens: want.len(), eog: eog.clone() };
            let out = e.generate(&prompt, &params, &mut sampler, &mut |_| lode_runtime::engine::Flow::Continue).unwrap();
            let got = out.tokens;
            let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
            eprintln!("{name} {id}: {agree}/{} tokens agree (must: {must})", want.len());
            if got == want {
                full += 1;
            }
            if agree < must {
                failures.push(format!("{name} {id}: diverged at step {agree} (< {must}): got {got:?}, want {want:?}"));
            }
        }
        eprintln!("{name}: {full}/{} continuations match all tokens", cases.len());
        if exact_numerics() && full != cases.len() {
            failures.push(format!("{name}: only {full}/{} continuations match in full", cases.len()));
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

/// Per-position statistics of our logits against one fixture prompt.
struct Agreement {
    n: usize,
    same_top1: usize,
    kl_sum: f64,
    kl_max: f64,
    /// Largest |our logit − llama.cpp's| over each position's top 32.
    logit_diff_max: f64,
    /// Positions whose top-1 differs although llama.cpp's top-1/top-2 margin is ≥ 0.5.
    confident_misses: Vec<usize>,
}

fn compare_logits(e: &mut Engine, prompt: &Value) -> Agreement {
    let tokens = ids(&prompt["prompt_ids"]);
    let positions = prompt["positions"].as_array().unwrap();
    let mut a = Agreement {
        n: 0,
        same_top1: 0,
        kl_sum: 0.0,
        kl_max: 0.0,
        logit_diff_max: 0.0,
        confident_misses: Vec::new(),
    };
    e.clear();
    e.eval_all(&tokens, &mut |i, logits| {
        let p = &positions[i];
        let top_ids = ids(&p["top_ids"]);
        let top_logits: Vec<f64> = p["top_logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let lse_a = p["logsumexp"].as_f64().unwrap();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse_b = max + logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln();
        // KL(A‖B) over A's top-32 plus the remaining mass (fixture README).
        let (mut kl, mut sum_a, mut sum_b) = (0.0, 0.0, 0.0);
        for (&t, &la) in top_ids.iter().zip(&top_logits) {
            // The fixture's decimals round-trip to f32: compare as f32.
            a.logit_diff_max = a.logit_diff_max.max((logits[t as usize] - la as f32).abs() as f64);
            let lpa = la - lse_a;
            let lpb = logits[t as usize] as f64 - lse_b;
            kl += lpa.exp() * (lpa - lpb);
            sum_a += lpa.exp();
            sum_b += lpb.exp();
        }
        let (ra, rb) = ((1.0 - sum_a).max(1e-12), (1.0 - sum_b).max(1e-12));
        kl += ra * (ra / rb).ln();
        let ours = lode_runtime::engine::argmax_logits(logits);
        a.n += 1;
        a.kl_sum += kl;
        a.kl_max = a.kl_max.max(kl);
        if ours == top_ids[0] {
            a.same_top1 += 1;
        } else if top_logits[0] - top_logits[1] >= 0.5 {
            a.confident_misses.push(i);
        }
    })
    .unwrap();
    a
}

fn check_logits(fixture: &str, kv_type: KvType) {
    let mut failures = Vec::new();
    for (name, file) in MODELS {
        let Some((model, fx)) = find(name, file) else { continue };
        let l = read_json(fx.join(fixture));
        let mut e = engine(&model, kv_type, 1024);
        for p in l["prompts"].as_array().unwrap() {
            let id = p["id"].as_str().unwrap();
            let a = compare_logits(&mut e, p);
            let top1 = a.same_top1 as f64 / a.n as f64;
            let kl = a.kl_sum / a.n as f64;
            eprintln!(
                "{name} {fixture} {id} ({kv_type:?} KV): {} positions, same top-1 {:.1} %, mean KL {kl:.6}, \
                 max KL {:.2e}, max |Δlogit| (top 32) {:.2e}",
                a.n,
                100.0 * top1,
                a.kl_max,
                a.logit_diff_max
            );
            // The bars.
            if top1 < 0.95 {
                failures.push(format!("{name} {id}: same top-1 only {:.1} %", 100.0 * top1));
            }
            if !a.confident_misses.is_empty() {
                failures.push(format!("{name} {id}: top-1 differs where margin ≥ 0.5 at {:?}", a.confident_misses));
            }
            if kl > 0.01 {
                failures.push(format!("{name} {id}: mean KL {kl}"));
            }
            // Where the kernels reproduce llama.cpp's rounding, the logits are its logits
            // (the fixture stores the shortest decimal that round-trips each f32).
            if exact_numerics() && a.logit_diff_max > 0.0 {
                failures.push(format!(
                    "{name} {id}: logits differ from llama.cpp's by up to {:.2e} (expected bit-equal on AVX2)",
                    a.logit_diff_max
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Default llama.cpp settings (f16 KV, flash attention) against an f16-KV run.
#[test]
fn logits_match_llama_cpp_f16_kv() {
    check_logits("logits.json", KvType::F16);
}

/// llama.cpp's precise variant (f32 KV, no flash attention) against an f32-KV run.
#[test]
fn logits_match_llama_cpp_f32_kv() {
    check_logits("logits_f32kv_nofa.json", KvType::F32);
}

/// Gemma 3's sliding-window layers in a window-sized cache (chunks of 64 tokens: 640
/// slots for the 512-token window) give the same logits, bit for bit, as full-context
/// ones (`--swa-full`) over the 703-token prompt and 90 greedy steps past it (the base
/// moves during the prompt and during decoding), and they meet the fixture's bars.
#[test]
fn window_sized_cache_matches_the_full_context_on_gemma3() {
    let Some((model, fx)) = find(MODELS[0].0, MODELS[0].1) else { return };
    let l = read_json(fx.join("logits.json"));
    let p = l["prompts"].as_array().unwrap().iter().max_by_key(|p| p["prompt_ids"].as_array().unwrap().len()).unwrap();
    let tokens = ids(&p["prompt_ids"]);
    let open = |swa_full: bool| {
        let file = Arc::new(GgufFile::open(&model).expect("open model"));
        let m = Model::load(file).expect("load model");
        let be = Box::new(CpuBackend::new(2).expect("cpu backend"));
        Engine::new(m, be, EngineOptions { ctx_size: Some(1024), batch_size: 64, kv_type: KvType::F16.into(), swa_full }).expect("engine")
    };
    let run = |e: &mut Engine| {
        let mut rows: Vec<Vec<f32>> = Vec::new();
        e.eval_all(&tokens, &mut |_, l| rows.push(l.to_vec())).unwrap();
        for _ in 0..90 {
            let next = lode_runtime::engine::argmax_logits(rows.last().unwrap());
            rows.push(e.eval(&[next]).unwrap());
        }
        rows
    };
    let (mut ring, mut full) = (open(false), open(true));
    let w = ring.window_kv().expect("the window-sized cache is smaller here");
    assert!(w.slots < tokens.len() && full.window_kv().is_none(), "{w:?}");
    let (a, b) = (run(&mut ring), run(&mut full));
    let first = a.iter().zip(&b).position(|(x, y)| x != y);
    assert!(first.is_none(), "logits differ from position {first:?} ({} prompt tokens)", tokens.len());
    let agree = compare_logits(&mut ring, p);
    assert!(agree.confident_misses.is_empty() && agree.same_top1 * 100 >= 95 * agree.n, "{:?} of {}", agree.confident_misses, agree.n);
}
