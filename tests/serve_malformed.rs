//! `lode serve` under bad input: each malformed request gets an OpenAI-style error with
//! a 4xx status, a client that hangs up mid-stream frees its slot, and afterwards the
//! server still answers a good request.

mod serve_common;

use std::io::{BufRead, BufReader};
use std::time::{Duration, Instant};

use serde_json::json;
use serve_common::*;

const KEY: &str = "test-key-123";
const AUTH: (&str, &str) = ("Authorization", "Bearer test-key-123");

fn chat_body() -> serde_json::Value {
    json!({"model": SMOL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0})
}

#[test]
fn malformed_requests_get_errors_and_the_server_keeps_serving() {
    let Some(model) = smol() else { return };
    let mut srv = Server::start(&model, &["--api-key", KEY, "--parallel", "2", "--ctx-size", "512"]);
    let chat = "/v1/chat/completions";
    let a = &[AUTH];

    // API key: missing, wrong → 401; /health needs none.
    let e = srv.post_json(chat, &[], &chat_body()).error(401);
    assert_eq!(e["code"], "invalid_api_key");
    srv.post_json(chat, &[("Authorization", "Bearer wrong")], &chat_body()).error(401);
    assert_eq!(srv.get("/health", &[]).status, 200);
    srv.get("/v1/models", &[]).error(401);

    // Bad JSON, not an object, invalid UTF-8.
    let e = srv.post(chat, a, b"{\"messages\": [").error(400);
    assert!(e["message"].as_str().unwrap().contains("JSON"), "{e}");
    srv.post(chat, a, b"[1, 2]").error(400);
    srv.post(chat, a, b"").error(400);
    let e = srv.post(chat, a, b"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\xfe\"}]}").error(400);
    assert!(e["message"].as_str().unwrap().contains("UTF-8"), "{e}");

    // Wrong types and bad values name their field.
    let with = |k: &str, v: serde_json::Value| {
        let mut b = chat_body();
        b[k] = v;
        b
    };
    for (k, v) in [
        ("temperature", json!("hot")),
        ("temperature", json!(-1.0)),
        ("max_tokens", json!("ten")),
        ("max_tokens", json!(-5)),
        ("messages", json!("hello")),
        ("stop", json!({"a": 1})),
        ("top_p", json!(7)),
        ("n", json!(99)),
        ("response_format", json!({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}})),
        ("grammar", json!("root ::= undefined-rule")),
        ("logit_bias", json!({"1": 10})),
        ("stream", json!(1)),
    ] {
        let e = srv.post_json(chat, a, &with(k, v.clone())).error(400);
        assert_eq!(e["param"], k, "{k} = {v}: {e}");
    }

    // Huge max_tokens: more than the whole context.
    let e = srv.post_json(chat, a, &with("max_tokens", json!(1_000_000_000u64))).error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(e["message"].as_str().unwrap().contains("256"), "{e}");
    // A prompt longer than the context: 400 with the numbers.
    let long = "hello ".repeat(400);
    let e = srv.post_json("/v1/completions", a, &json!({"prompt": long, "max_tokens": 1})).error(400);
    assert_eq!(e["code"], "context_length_exceeded");
    let msg = e["message"].as_str().unwrap();
    assert!(msg.contains("256") && msg.contains("tokens"), "{msg}");

    // Unknown role, unknown route, wrong method.
    let e = srv.post_json(chat, a, &json!({"messages": [{"role": "wizard", "content": "x"}]})).error(400);
    assert_eq!(e["param"], "messages[0].role", "{e}");
    assert!(e["message"].as_str().unwrap().contains("wizard"), "{e}");
    srv.get("/v1/nothing", a).error(404);
    srv.get(chat, a).error(405);

    // A 10 MB body → 413 without reading it all.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(10 << 20));
    srv.post("/v1/completions", a, big.as_bytes()).error(413);

    // A client that hangs up mid-stream: its slot is freed and the request counted as cancelled.
    let mut s = connect(&srv.addr);
    let body = json!({"prompt": "1, 2, 3, 4, 5, 6,", "max_tokens": 200, "temperature": 0, "stream": true});
    write_request(&mut s, "POST", "/v1/completions", a, body.to_string().as_bytes());
    let mut r = BufReader::new(s);
    let mut line = String::new();
    let mut chunks = 0;
    while chunks < 2 {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "stream ended early");
        if line.starts_with("data: {") {
            chunks += 1;
        }
    }
    drop(r);
    let t0 = Instant::now();
    while srv.metric("lode_requests_cancelled_total", a) < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the dropped stream was not cancelled");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(srv.metric("lode_slots_active", a), 0.0);

    // Still serving: a good request succeeds, with usage and timings.
    assert!(srv.alive());
    let r = srv.post_json(chat, a, &chat_body());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert!(v["choices"][0]["message"]["content"].is_string());
    assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(v["usage"]["completion_tokens"], v["timings"]["predicted_n"]);
    assert!(v["timings"]["prompt_per_second"].as_f64().unwrap() > 0.0);
    let m = srv.get("/metrics", a).body;
    assert!(m.contains("lode_requests_total{endpoint=\"/v1/chat/completions\",status=\"400\"}"), "{m}");
    assert!(m.contains("lode_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 1"), "{m}");
}
