//! `lode serve --spec-type ngram-simple`: greedy completions (one request, then two at
//! once, with logprobs) equal those of a server without speculation; a schema-constrained
//! request still runs (plain decoding); `--model-draft` is refused by name.

mod serve_common;

use serde_json::json;
use serve_common::*;

const PROMPTS: [&str; 2] = [
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
];

fn completion(addr: &str, prompt: &str) -> serde_json::Value {
    let body = json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 2});
    let r = request(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// The text and the log-probabilities of the chosen tokens.
fn answer(v: &serde_json::Value) -> (String, Vec<f64>) {
    let c = &v["choices"][0];
    let lp = c["logprobs"]["token_logprobs"].as_array().map(|a| a.iter().map(|x| x.as_f64().unwrap()).collect()).unwrap_or_default();
    (c["text"].as_str().unwrap().to_string(), lp)
}

fn all(addr: &str) -> Vec<(String, Vec<f64>)> {
    let one: Vec<_> = PROMPTS.iter().map(|p| answer(&completion(addr, p))).collect();
    // Both at once: one slot's verify chunks interleave with the other's steps.
    let handles: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let (addr, p) = (addr.to_string(), p.to_string());
            std::thread::spawn(move || answer(&completion(&addr, &p)))
        })
        .collect();
    let both: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(one, both, "concurrent answers differ from one-at-a-time ones");
    one
}

#[test]
fn ngram_speculation_leaves_greedy_completions_unchanged() {
    let Some(m) = smol() else { return };
    let plain = {
        let srv = Server::start(&m, &["--parallel", "2", "-c", "512"]);
        all(&srv.addr)
    };
    let srv = Server::start(&m, &["--parallel", "2", "-c", "512", "--spec-type", "ngram-simple", "--draft-max", "5"]);
    let spec = all(&srv.addr);
    assert!(srv.metric("lode_spec_drafted_tokens_total", &[]) > 0.0, "no draft was verified");
    for (i, (a, b)) in plain.iter().zip(&spec).enumerate() {
        assert_eq!(a.0, b.0, "prompt {i}: text differs under speculation");
        assert_eq!(a.1, b.1, "prompt {i}: log-probabilities differ under speculation");
        assert!(!a.1.is_empty());
    }
    // A constrained request decodes plainly and still answers.
    let body = json!({"prompt": "A JSON object:", "max_tokens": 16, "temperature": 0,
        "response_format": {"type": "json_object"}});
    let r = srv.post_json("/v1/completions", &[], &body);
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn serve_refuses_a_draft_model_by_name() {
    let Some(m) = smol() else { return };
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["serve", "--device", "cpu", "--port", "0", "-m"])
        .arg(&m)
        .arg("--model-draft")
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--model-draft") && !err.contains("panicked"), "{err}");
}
