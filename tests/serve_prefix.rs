//! The prefix cache of `lode serve` on SmolLM2: a shared system prompt is evaluated once
//! and its K/V reused by the next requests — from the slot's own cache, copied from an
//! idle slot's, or copied from a live one while several requests arrive together — and
//! every greedy answer equals the same request served cold (`--no-cache-prompt`, or the
//! request's `cache_prompt: false`). The timings' `cache_n` and `/metrics` show the reuse.
//! (The recurrent case, qwen35, is in `serve_hybrid.rs`.)
//!
//! With an f32 KV cache (`--kv-type f32`): the CPU's f16 cache runs llama.cpp's flash
//! attention, whose rounding depends on the chunk's row count (Q rounded to f16, an f16
//! V accumulator, a tiled kernel from 64 rows), so a prompt evaluated as 260 rows or as
//! 18 after 242 cached ones differs by up to ~0.1 in a log-probability on SmolLM2 — enough
//! to flip a greedy choice, without any reuse being wrong. The f32 path rounds alike at
//! every chunk shape, so there a wrong copy (rows, positions, the sequence) shows.

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;

/// About 300 tokens: long enough that a reuse is unmistakable in `cache_n`.
const SYSTEM: &str = "You are a careful assistant for a small bakery in a mountain town. \
The bakery opens at seven in the morning and closes at six in the evening, every day but Monday. \
It sells sourdough bread, rye bread, croissants, cinnamon rolls, apple pie, carrot cake and \
a chocolate tart that is famous in the valley. Prices: sourdough four euros, rye three euros \
fifty, croissants one euro eighty, cinnamon rolls two euros forty, a slice of apple pie three \
euros, a slice of carrot cake three euros twenty, the chocolate tart twenty-two euros whole. \
Orders for whole cakes must be placed two days ahead by phone. The owner, Marta, bakes \
everything herself with flour from the mill down the river. Answer questions about the \
bakery briefly and politely, in one or two sentences, and never invent products or prices \
that are not listed here. If a customer asks about something the bakery does not sell, say \
so and suggest the closest thing it does sell. If asked about allergies, say that every \
product may contain nuts, eggs, milk and gluten.";

const QUESTIONS: [&str; 5] = [
    "When does the bakery open?",
    "How much is a croissant?",
    "Can I order a whole chocolate tart for tomorrow?",
    "Do you sell baguettes?",
    "Who bakes the bread?",
];

const N: usize = 12;

struct Answer {
    text: String,
    cache_n: u64,
    prompt_tokens: u64,
}

fn chat(addr: &str, question: &str, cache_prompt: Option<bool>) -> Answer {
    let mut body = json!({
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": N, "temperature": 0,
    });
    if let Some(c) = cache_prompt {
        body["cache_prompt"] = json!(c);
    }
    let r = request(addr, "POST", "/v1/chat/completions", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = r.json();
    Answer {
        text: v["choices"][0]["message"]["content"].as_str().unwrap().to_string(),
        cache_n: v["timings"]["cache_n"].as_u64().unwrap(),
        prompt_tokens: v["usage"]["prompt_tokens"].as_u64().unwrap(),
    }
}

/// Tokens of the system prompt alone (the template adds a few around it).
fn system_tokens(srv: &Server) -> u64 {
    let r = srv.post_json("/tokenize", &[], &json!({"content": SYSTEM}));
    r.json()["tokens"].as_array().unwrap().len() as u64
}

#[test]
fn shared_system_prompt_is_reused_and_answers_equal_cold_ones() {
    let Some(model) = smol() else { return };
    let none: &[(&str, &str)] = &[];

    // Cold answers: no prompt cache at all, the system prompt evaluated every time.
    let cold = Server::start(&model, &["--parallel", "2", "--ctx-size", "2048", "--kv-type", "f32", "--no-cache-prompt"]);
    let sys = system_tokens(&cold);
    assert!(sys > 200, "{sys}");
    let want: Vec<String> = QUESTIONS
        .iter()
        .map(|q| {
            let a = chat(&cold.addr, q, None);
            assert_eq!(a.cache_n, 0, "--no-cache-prompt reused {} tokens", a.cache_n);
            assert!(!a.text.is_empty());
            a.text
        })
        .collect();
    assert_eq!(chat(&cold.addr, QUESTIONS[0], None).cache_n, 0, "the same request again, still cold");
    assert_eq!(cold.metric("lode_prompt_tokens_shared_total", none), 0.0);
    assert_eq!(cold.metric("lode_prompt_cache_requests_total", none), 0.0);
    drop(cold);

    // Four requests at once on a fresh server: the engine evaluates one prompt first; the
    // other three copy the system prompt's K/V from that live sequence.
    let srv = Server::start(&model, &["--parallel", "4", "--ctx-size", "4096", "--kv-type", "f32"]);
    let handles: Vec<_> = (0..4)
        .map(|i| {
            let addr = srv.addr.clone();
            std::thread::spawn(move || chat(&addr, QUESTIONS[i], None))
        })
        .collect();
    let got: Vec<Answer> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, a) in got.iter().enumerate() {
        assert_eq!(a.text, want[i], "question {i} concurrently, after a prefix copy ({} cached)", a.cache_n);
        assert!(a.cache_n < a.prompt_tokens);
    }
    let hits = got.iter().filter(|a| a.cache_n >= sys).count();
    assert!(hits >= 3, "cache_n of the four: {:?}", got.iter().map(|a| a.cache_n).collect::<Vec<_>>());
    assert!(srv.metric("lode_prompt_tokens_shared_total", none) >= 3.0 * sys as f64);
    assert_eq!(srv.metric("lode_prompt_cache_requests_total", none), 4.0);
    assert!(srv.metric("lode_prompt_cache_hits_total", none) >= 3.0);

    // One after another: the fifth question lands on a slot holding the system prompt
    // and reuses it in place (nothing more copied); asking without the cache reuses
    // nothing; both give the cold answer.
    let shared = srv.metric("lode_prompt_tokens_shared_total", none);
    let a = chat(&srv.addr, QUESTIONS[4], None);
    assert_eq!(a.text, want[4]);
    assert!(a.cache_n >= sys, "{}", a.cache_n);
    assert_eq!(srv.metric("lode_prompt_tokens_shared_total", none), shared, "the slot's own cache, not a copy");
    let a = chat(&srv.addr, QUESTIONS[4], Some(false));
    assert_eq!((a.text.as_str(), a.cache_n), (want[4].as_str(), 0));
    assert_eq!(srv.metric("lode_prompt_cache_requests_total", none), 5.0, "cache_prompt: false is not a lookup");
    let rate = srv.metric("lode_prompt_cache_hit_rate", none);
    assert!((0.8..=1.0).contains(&rate), "{rate}");
    drop(srv);

    // Least recently used slots only (-sps 0): the second request goes to the empty
    // slot and copies the system prompt from the idle one.
    let lru = Server::start(&model, &["--parallel", "2", "--ctx-size", "2048", "--kv-type", "f32", "-sps", "0"]);
    assert_eq!(chat(&lru.addr, QUESTIONS[1], None).text, want[1]);
    let a = chat(&lru.addr, QUESTIONS[2], None);
    assert_eq!(a.text, want[2], "after a copy from an idle slot");
    assert!(a.cache_n >= sys, "{}", a.cache_n);
    assert_eq!(lru.metric("lode_prompt_tokens_shared_total", none), a.cache_n as f64);
}
