//! Greedy text from `lode serve` equals the engine's own greedy generation (and `lode
//! generate`'s, once that command exists), streamed or not, one request at a time or
//! several at once; a repeated prompt reuses the slot's cached prefix.

mod serve_common;

use std::process::Command;
use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::engine::{Engine, EngineOptions, Flow, GenParams, Sampler, SamplerParams};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::json;
use serve_common::*;

const N: usize = 12;

/// The engine's greedy continuation of `text`, tokenized as the server does.
fn reference(model: &std::path::Path, text: &str, chat: bool) -> String {
    let file = Arc::new(GgufFile::open(model).unwrap());
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let prompt = if chat {
        ChatTemplate::for_tokenizer(&tok).unwrap().apply(&[ChatMessage::new("user", text)], true).unwrap()
    } else {
        text.to_string()
    };
    let ids = tok.encode(&prompt, true, true);
    let be = Box::new(CpuBackend::new(2).unwrap());
    let opts = EngineOptions { ctx_size: Some(512), ..Default::default() };
    let mut engine = Engine::new(Model::load(file.clone()).unwrap(), be, opts).unwrap();
    let mut dec = tok.stream_decoder();
    let mut out = String::new();
    let params = GenParams { max_tokens: N, eog: tok.eog_ids() };
    let mut sampler = Sampler::new(SamplerParams::greedy());
    engine
        .generate(&ids, &params, &mut sampler, &mut |id| {
            out.push_str(&dec.push(&tok, id));
            Flow::Continue
        })
        .unwrap();
    out.push_str(&dec.flush());
    out
}

fn completion(srv: &Server, prompt: &str, stream: bool) -> (String, serde_json::Value) {
    completion_at(&srv.addr, prompt, stream)
}

fn completion_at(addr: &str, prompt: &str, stream: bool) -> (String, serde_json::Value) {
    let body = json!({"prompt": prompt, "max_tokens": N, "temperature": 0, "stream": stream});
    let r = request(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    if !stream {
        let v = r.json();
        return (v["choices"][0]["text"].as_str().unwrap().to_string(), v);
    }
    let data = r.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{}", r.body);
    let chunks: Vec<serde_json::Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let text: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap_or("")).collect();
    let last = chunks.last().unwrap().clone();
    assert!(last["choices"][0]["finish_reason"].is_string(), "{last}");
    (text, last)
}

#[test]
fn greedy_text_matches_the_engine_streamed_or_not_and_concurrently() {
    let Some(model) = smol() else { return };
    let srv = Server::start(&model, &["--parallel", "2", "--ctx-size", "1024"]);
    let p1 = "The capital of France is";
    let p2 = "Here is a list of fruits: apple, banana,";

    let want1 = reference(&model, p1, false);
    let want2 = reference(&model, p2, false);
    assert!(!want1.is_empty());
    let (got1, v) = completion(&srv, p1, false);
    assert_eq!(got1, want1);
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap() as usize, v["timings"]["predicted_n"].as_u64().unwrap() as usize);
    let (streamed, last) = completion(&srv, p1, true);
    assert_eq!(streamed, want1);
    assert_eq!(last["usage"], v["usage"]);

    // Two at once on two slots: each equals its one-at-a-time answer.
    let handles: Vec<_> = [p1, p2, p1, p2]
        .into_iter()
        .map(|p| {
            let addr = srv.addr.clone();
            std::thread::spawn(move || completion_at(&addr, p, true).0)
        })
        .collect();
    let got: Vec<String> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got, [want1.clone(), want2.clone(), want1.clone(), want2.clone()]);
    // Continuous batching: concurrent requests shared decode steps (one forward pass for
    // both slots' next tokens), so steps carried more rows than there were steps.
    let (steps, rows) = (srv.metric("lode_batch_steps_total", &[]), srv.metric("lode_batch_rows_total", &[]));
    assert!(steps > 0.0 && rows > steps, "decode steps were not batched: {steps} steps, {rows} rows");

    // The same prompt three times on two slots: at least one lands on a slot that
    // holds it, reuses the cached prefix, and still gives the same text.
    let mut cached = 0;
    for _ in 0..3 {
        let (t, v) = completion(&srv, p2, false);
        assert_eq!(t, want2);
        cached = cached.max(v["timings"]["cache_n"].as_u64().unwrap());
    }
    assert!(cached > 0, "no request reused a cached prefix");

    // Chat goes through the model's template.
    let want = reference(&model, "What is 2 + 2?", true);
    let body = json!({"messages": [{"role": "user", "content": "What is 2 + 2?"}], "max_tokens": N, "temperature": 0});
    let r = srv.post_json("/v1/chat/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["choices"][0]["message"]["content"], want.as_str());
}

#[test]
fn greedy_text_matches_lode_generate() {
    let Some(model) = smol() else { return };
    let prompt = "The capital of France is";
    let out = Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["generate", "--device", "cpu", "--threads", "2", "-c", "512", "--temp", "0", "-n"])
        .arg(N.to_string())
        .arg("-m")
        .arg(&model)
        .args(["-p", prompt])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && (stderr.contains("not built yet") || stderr.contains("unexpected argument")) {
        eprintln!("SKIP: `lode generate` is not usable here yet: {stderr}");
        return;
    }
    assert!(out.status.success(), "lode generate failed: {stderr}");
    let generated = String::from_utf8_lossy(&out.stdout).into_owned();
    let srv = Server::start(&model, &["--parallel", "1", "--ctx-size", "512"]);
    let (text, _) = completion(&srv, prompt, false);
    assert!(!text.is_empty());
    assert!(generated.contains(&text), "server: {text:?}\nlode generate: {generated:?}");
}
