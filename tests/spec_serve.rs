//! `lode serve --spec-type ngram-simple` and `--model-draft`: greedy completions (one
//! request, then two at once, with logprobs) equal those of a server without
//! speculation; a schema-constrained request still runs (plain decoding); SmolLM2
//! drafting for itself through the shared draft thread; on qwen35 (recurrent layers),
//! n-gram and another model's drafts (rejected: the slot's sequence rewinds on the
//! engine thread) leave greedy and seeded sampled completions and their
//! log-probabilities unchanged.

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
        let srv = Server::start(&m, &["--parallel", "2", "-c", "1024"]);
        all(&srv.addr)
    };
    let srv = Server::start(&m, &["--parallel", "2", "-c", "1024", "--spec-type", "ngram-simple", "--draft-max", "5"]);
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
fn a_draft_model_leaves_greedy_completions_unchanged() {
    let Some(m) = smol() else { return };
    let plain = {
        let srv = Server::start(&m, &["--parallel", "2", "-c", "1024"]);
        all(&srv.addr)
    };
    let ms = m.to_str().unwrap();
    let srv = Server::start(&m, &["--parallel", "2", "-c", "1024", "--model-draft", ms, "--draft-max", "6", "--draft-p-min", "0"]);
    let spec = all(&srv.addr);
    let (drafted, rounds, reqs) = (
        srv.metric("lode_spec_drafted_tokens_total", &[]),
        srv.metric("lode_spec_draft_batches_total", &[]),
        srv.metric("lode_spec_draft_requests_total", &[]),
    );
    eprintln!("drafted {drafted}, {reqs} draft requests in {rounds} rounds");
    assert!(drafted > 0.0 && rounds > 0.0 && reqs >= rounds, "{drafted} {rounds} {reqs}");
    assert_eq!(plain, spec, "a draft model changed the completions");
}

/// Greedy and seeded sampled completions on qwen35-tiny, with their log-probabilities.
fn hybrid_answers(srv: &Server) -> Vec<(String, Vec<f64>)> {
    let mut out = Vec::new();
    for (temp, seed) in [(0.0, 0), (1.0, 5), (1.0, 9)] {
        let body = json!({"prompt": "one two three one two three one two", "max_tokens": 20, "temperature": temp,
            "top_k": 4, "seed": seed, "logprobs": 1});
        let r = srv.post_json("/v1/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        out.push(answer(&r.json()));
    }
    out
}

#[test]
fn speculation_on_a_recurrent_model_in_serve() {
    let dir = std::env::temp_dir().join(format!("lode-spec-serve-rec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let synth = |seed: &str| {
        let p = dir.join(format!("qwen35-tiny-{seed}.gguf"));
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode")).args(["synth", "--preset", "qwen35-tiny", "--seed", seed, "-o"]).arg(&p).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        p
    };
    let (m, other) = (synth("11"), synth("12"));
    let base = ["--parallel", "2", "-c", "512", "-b", "4"];
    let plain = hybrid_answers(&Server::start(&m, &base));
    assert!(plain.iter().all(|a| a.1.len() == 20), "{plain:?}");
    let ngram = Server::start(&m, &[&base[..], &["--spec-type", "ngram-simple", "--spec-ngram-size-n", "2"]].concat());
    assert_eq!(hybrid_answers(&ngram), plain, "n-gram speculation changed the completions");
    assert!(ngram.metric("lode_spec_drafted_tokens_total", &[]) > 0.0);
    let o = other.to_str().unwrap();
    let draft = Server::start(&m, &[&base[..], &["--model-draft", o, "--draft-max", "4", "--draft-p-min", "0"]].concat());
    assert_eq!(hybrid_answers(&draft), plain, "another model's drafts changed the completions");
    assert!(draft.metric("lode_spec_drafted_tokens_total", &[]) > 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}
