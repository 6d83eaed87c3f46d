//! `lode serve` on a recurrent model (qwen35, `lode synth --preset qwen35-tiny`): a
//! slot's sequence keeps its recurrent state at its last position only, so a new prompt
//! that shares only part of a slot's history (or of another slot's) must be evaluated
//! whole. Every greedy answer equals a fresh engine's (its tokens' log-probabilities: the
//! random model's text is mostly placeholder tokens that print nothing), whatever slot it
//! lands on and whatever came before (within 2e-6: the same arithmetic, the log-softmax
//! summed differently); a prompt that shares a start with an earlier one reuses nothing,
//! and one that extends a slot's whole history gets it (and its state) copied.
//! Checked to fail when a recurrent sequence is cut back like a plain one (20 tokens
//! reused; the stale state moves the random model's near-uniform log-probabilities by
//! ~5e-6).

mod serve_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::engine::{generate_with_logits, Engine, EngineOptions, Flow, GenParams, Sampler, SamplerParams};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::tokenizer::Tokenizer;
use serde_json::json;
use serve_common::*;

const N: usize = 10;

/// A fresh engine's greedy continuation of `text` (tokenized as the server does): each
/// token's log-probability.
fn reference(model: &Path, text: &str) -> Vec<f32> {
    let file = Arc::new(GgufFile::open(model).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let ids = tok.encode(text, true, true);
    let opts = EngineOptions { ctx_size: Some(512), ..Default::default() };
    let mut engine = Engine::new(Model::load(file.clone()).unwrap(), Box::new(CpuBackend::new(2).unwrap()), opts).unwrap();
    let params = GenParams { max_tokens: N, eog: Vec::new() };
    let mut lp = Vec::new();
    generate_with_logits(&mut engine, &ids, &params, &mut Sampler::new(SamplerParams::greedy()), &mut |id, logits| {
        let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
        let z: f64 = logits.iter().map(|&x| ((x - max) as f64).exp()).sum();
        lp.push(logits[id as usize] - max - z.ln() as f32);
        Flow::Continue
    })
    .unwrap();
    lp
}

/// The server's greedy continuation: each token's log-probability, and the cached tokens.
fn completion(srv: &Server, prompt: &str) -> (Vec<f32>, u64) {
    let body = json!({"prompt": prompt, "max_tokens": N, "temperature": 0, "logprobs": 1});
    let r = srv.post_json("/v1/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let lp = v["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap_or_else(|| panic!("no logprobs in {v}"));
    (lp.iter().map(|x| x.as_f64().unwrap() as f32).collect(), v["timings"]["cache_n"].as_u64().unwrap_or(0))
}

fn close(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 2e-6)
}

#[test]
fn recurrent_slots_reuse_only_whole_histories() {
    let dir = std::env::temp_dir().join(format!("lode-serve-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model: PathBuf = dir.join("qwen35-tiny.gguf");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["synth", "--preset", "qwen35-tiny", "--seed", "7", "-o"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let a = "The capital of France is Paris and the capital of Italy is";
    let b = "The capital of France is Paris and the river through it is";
    let (want_a, want_b) = (reference(&model, a), reference(&model, b));
    assert!(want_a.len() == N && !close(&want_a, &want_b), "{want_a:?} {want_b:?}");
    // `-sps 0` (least recently used slots only) sends b to the other slot, where only a
    // copy of a's history could give it a start.
    for extra in [&["--parallel", "1"][..], &["--parallel", "2"], &["--parallel", "2", "-sps", "0"]] {
        let parallel = extra.join(" ");
        // 512 tokens a slot (--ctx-size is the total).
        let ctx = if extra[1] == "2" { "1024" } else { "512" };
        let srv = Server::start(&model, &[extra, &["--ctx-size", ctx]].concat());
        // a, then b (sharing a's first words but not a's history), then a again, twice.
        for (p, want) in [(a, &want_a), (b, &want_b), (a, &want_a), (a, &want_a)] {
            let (got, cached) = completion(&srv, p);
            assert!(close(&got, want), "{parallel}: {p:?}: server {got:?}, engine {want:?}");
            assert_eq!(cached, 0, "{parallel}: {p:?} reused {cached} tokens of a recurrent history it does not extend whole");
        }
    }

    // What a recurrent sequence did keep is reused: a one-token request leaves exactly
    // its prompt in slot 0 (the sampled token is not evaluated), so a prompt extending it
    // gets that history and its state copied into the empty slot 1 (`-sps 0`: least
    // recently used slots only) and evaluates only the rest, answering as a fresh engine.
    let tok = Tokenizer::from_gguf(&GgufFile::open(&model).unwrap()).unwrap();
    let longer = format!("{a} Rome, and the capital of Spain is");
    let (ids_a, ids_long) = (tok.encode(a, true, true), tok.encode(&longer, true, true));
    assert!(ids_long.starts_with(&ids_a), "{ids_a:?} {ids_long:?}");
    let want_long = reference(&model, &longer);
    let srv = Server::start(&model, &["--parallel", "2", "--ctx-size", "1024", "-sps", "0"]);
    let r = srv.post_json("/v1/completions", &[], &json!({"prompt": a, "max_tokens": 1, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let (got, cached) = completion(&srv, &longer);
    assert!(close(&got, &want_long), "after a whole-history copy: server {got:?}, engine {want_long:?}");
    assert_eq!(cached, ids_a.len() as u64, "the kept history is copied whole");
    assert_eq!(srv.metric("lode_prompt_tokens_shared_total", &[]), ids_a.len() as f64);
    std::fs::remove_dir_all(&dir).unwrap();
}
