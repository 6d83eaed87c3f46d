//! `lode serve` on Gemma 3 with window-sized caches for its sliding-window layers
//! (`-c 2048 -b 64`: 640 slots for the 512-token window): a repeated long prompt reuses
//! the slot's cache; a prompt that shares only an old prefix of it (keys the windowed
//! layers have dropped) is evaluated again from the start. Every reply is the engine's own
//! greedy text; a wrong cut would make the backend refuse the evaluation (a 500) or give
//! other text.

mod serve_common;

use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::engine::{Engine, EngineOptions, Flow, GenParams, Sampler, SamplerParams};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::tokenizer::Tokenizer;
use serde_json::json;
use serve_common::*;

const N: usize = 12;

fn reference(model: &std::path::Path, text: &str) -> String {
    let file = Arc::new(GgufFile::open(model).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let ids = tok.encode(text, true, true);
    let opts = EngineOptions { ctx_size: Some(2048), batch_size: 64, ..Default::default() };
    let mut engine = Engine::new(Model::load(file.clone()).unwrap(), Box::new(CpuBackend::new(2).unwrap()), opts).unwrap();
    let w = engine.window_kv().expect("a window-sized cache");
    assert!(text.len() < 1000 || w.slots < ids.len(), "the long prompt must outgrow the window-sized cache");
    let (mut dec, mut out) = (tok.stream_decoder(), String::new());
    let params = GenParams { max_tokens: N, eog: tok.eog_ids() };
    engine
        .generate(&ids, &params, &mut Sampler::new(SamplerParams::greedy()), &mut |id| {
            out.push_str(&dec.push(&tok, id));
            Flow::Continue
        })
        .unwrap();
    out.push_str(&dec.flush());
    out
}

#[test]
fn cut_backs_past_the_window_sized_cache_evaluate_again() {
    let model = models_dir().join("gemma-3-270m-q4_k_m.gguf");
    let text = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures/gemma3-270m/alice29.txt");
    let text = std::fs::read_to_string(&text).or_else(|_| std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/gemma3-270m/alice29.txt")));
    let (true, Ok(text)) = (model.exists(), text) else {
        eprintln!("SKIP: needs {} and the gemma3-270m fixtures", model.display());
        return;
    };
    let long: String = text.chars().take(3200).collect();
    let old_prefix = format!("{} And then the Queen said", long.chars().take(300).collect::<String>());
    let srv = Server::start(&model, &["--parallel", "1", "--ctx-size", "2048", "--batch-size", "64"]);
    for prompt in [&long, &long, &old_prefix] {
        let body = json!({"prompt": prompt, "max_tokens": N, "temperature": 0});
        let r = request(&srv.addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
        assert_eq!(r.status, 200, "{}", r.body);
        let got = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert_eq!(got, reference(&model, prompt), "prompt of {} bytes", prompt.len());
    }
}
