//! llama-server's conventions and the OpenAI fields beyond plain text (SmolLM2, CPU):
//! any `model` name, unknown roles refused, CORS (off by default, preflight answered
//! with `--cors`), `/tokenize` + `/detokenize`, `/props`, `/slots`, `/v1/embeddings`,
//! `logprobs` (top-1 equals the greedy token), `n > 1` (whole and streamed).

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;

fn cosine(a: &Value, b: &Value) -> f64 {
    let (a, b): (Vec<f64>, Vec<f64>) = (
        a.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
        b.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect(),
    );
    let dot: f64 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(&a) * n(&b))
}

#[test]
fn llama_server_endpoints_cors_and_embeddings() {
    let Some(model) = smol() else { return };
    let srv = Server::start(&model, &["--parallel", "2", "--ctx-size", "1024", "--embeddings", "--cors", "http://ui.example"]);
    let none: &[(&str, &str)] = &[];

    // Preflight: answered with the origin, before routing (no 405).
    let pre = srv.request_raw(
        "OPTIONS",
        "/v1/chat/completions",
        &[("Origin", "http://ui.example"), ("Access-Control-Request-Method", "POST"), ("Access-Control-Request-Headers", "content-type,authorization")],
    );
    assert!(pre.status == 200 || pre.status == 204, "{pre:?}");
    let h = pre.headers.to_ascii_lowercase();
    assert!(h.contains("access-control-allow-origin: http://ui.example"), "{h}");
    assert!(h.contains("access-control-allow-methods") && h.contains("post"), "{h}");
    let r = srv.get("/v1/models", &[("Origin", "http://ui.example")]);
    assert!(r.headers.to_ascii_lowercase().contains("access-control-allow-origin: http://ui.example"), "{}", r.headers);

    // tokenize / detokenize round trip; pieces.
    let t = srv.post_json("/tokenize", none, &json!({"content": "Hello world"})).json();
    let ids = t["tokens"].as_array().unwrap().clone();
    assert!(!ids.is_empty() && ids.iter().all(Value::is_u64), "{t}");
    let d = srv.post_json("/detokenize", none, &json!({"tokens": ids})).json();
    assert_eq!(d["content"], "Hello world");
    let p = srv.post_json("/tokenize", none, &json!({"content": "Hello world", "with_pieces": true})).json();
    let pieces: String = p["tokens"].as_array().unwrap().iter().map(|x| x["piece"].as_str().unwrap().to_string()).collect();
    assert_eq!(pieces, "Hello world");
    srv.post_json("/detokenize", none, &json!({"tokens": [99999999]})).error(400);
    srv.post_json("/tokenize", none, &json!({"text": "x"})).error(400);

    let props = srv.get("/props", none).json();
    assert_eq!(props["total_slots"], 2);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 512);
    assert!(props["chat_template"].as_str().unwrap().contains("im_start"), "{props}");
    let slots = srv.get("/slots", none).json();
    assert_eq!(slots.as_array().unwrap().len(), 2);
    assert_eq!(slots[0]["is_processing"], false);

    // Embeddings: unit length, identical texts cosine 1, different texts less.
    let e = srv.post_json("/v1/embeddings", none, &json!({"input": ["The cat sat.", "The cat sat.", "Stock markets fell sharply."], "model": "x"}));
    assert_eq!(e.status, 200, "{}", e.body);
    let e = e.json();
    let data = e["data"].as_array().unwrap();
    assert_eq!(data.len(), 3);
    let v0 = &data[0]["embedding"];
    assert_eq!(v0.as_array().unwrap().len(), 576); // SmolLM2-135M's width
    let norm: f64 = v0.as_array().unwrap().iter().map(|x| x.as_f64().unwrap().powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    assert!((cosine(v0, &data[1]["embedding"]) - 1.0).abs() < 1e-5);
    assert!(cosine(v0, &data[2]["embedding"]) < 0.999);
    assert!(e["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    srv.post_json("/v1/embeddings", none, &json!({"input": 5})).error(400);
    srv.post_json("/v1/embeddings", none, &json!({"input": "x", "encoding_format": "hex"})).error(400);
}

#[test]
fn model_names_roles_logprobs_and_n() {
    let Some(model) = smol() else { return };
    let srv = Server::start(&model, &["--parallel", "3", "--ctx-size", "1536"]);
    let none: &[(&str, &str)] = &[];
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "Name a color."}]);

    // No CORS unless asked: a preflight is not answered with CORS headers.
    let pre = srv.request_raw("OPTIONS", chat, &[("Origin", "http://x"), ("Access-Control-Request-Method", "POST")]);
    assert!(!pre.headers.to_ascii_lowercase().contains("access-control-allow-origin"), "{pre:?}");
    // Embeddings are off unless asked.
    srv.post_json("/v1/embeddings", none, &json!({"input": "x"})).error(501);

    // Any model name; the response names the served model.
    let a = srv.post_json(chat, none, &json!({"model": "gpt-4o", "messages": msgs, "max_tokens": 6, "temperature": 0})).json();
    let b = srv.post_json(chat, none, &json!({"messages": msgs, "max_tokens": 6, "temperature": 0})).json();
    assert_eq!(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    assert_eq!(a["model"], SMOL);

    // Unknown role: 400 naming the field.
    let e = srv.post_json(chat, none, &json!({"messages": [{"role": "robot", "content": "x"}]})).error(400);
    assert_eq!(e["param"], "messages[0].role");

    // Chat logprobs: one entry per token; greedy picks the top-1, whose logprob is its own.
    let r = srv.post_json(chat, none, &json!({"messages": msgs, "max_tokens": 6, "temperature": 0, "logprobs": true, "top_logprobs": 3})).json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    assert_eq!(content.len() as u64, r["usage"]["completion_tokens"].as_u64().unwrap() - u64::from(r["choices"][0]["finish_reason"] == "stop"), "{r}");
    let joined: String = content.iter().map(|c| c["token"].as_str().unwrap().to_string()).collect();
    assert_eq!(joined, r["choices"][0]["message"]["content"].as_str().unwrap());
    for c in &content {
        let top = c["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        assert_eq!(top[0]["token"], c["token"]);
        assert!((top[0]["logprob"].as_f64().unwrap() - c["logprob"].as_f64().unwrap()).abs() < 1e-6);
        let lp: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lp.windows(2).all(|w| w[0] >= w[1]) && lp[0] <= 0.0, "{lp:?}");
        assert!(lp.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-5);
    }
    // Completion logprobs (legacy shape).
    let c = srv.post_json("/v1/completions", none, &json!({"prompt": "1, 2, 3,", "max_tokens": 4, "temperature": 0, "logprobs": 2})).json();
    let lp = &c["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 4, "{c}");
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 2);
    assert_eq!(lp["text_offset"][0], 0);

    // n = 3: three choices with their own seeds; usage counts them all.
    let r = srv.post_json(chat, none, &json!({"messages": msgs, "max_tokens": 8, "temperature": 1.0, "seed": 5, "n": 3})).json();
    let ch = r["choices"].as_array().unwrap();
    assert_eq!(ch.len(), 3, "{r}");
    assert_eq!((0..3).map(|i| ch[i]["index"].as_u64().unwrap()).collect::<Vec<_>>(), vec![0, 1, 2]);
    let texts: std::collections::HashSet<String> = ch.iter().map(|c| c["message"]["content"].as_str().unwrap().to_string()).collect();
    assert!(texts.len() >= 2, "three seeds gave one text: {r}");
    assert!(r["usage"]["completion_tokens"].as_u64().unwrap() > 8);
    // Streamed: chunks of every index, one finish per choice, then [DONE].
    let s = srv.post_json(chat, none, &json!({"messages": msgs, "max_tokens": 5, "temperature": 0, "n": 2, "stream": true}));
    let data = s.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let mut text = [String::new(), String::new()];
    let mut finishes = 0;
    for c in &chunks {
        let i = c["choices"][0]["index"].as_u64().unwrap() as usize;
        text[i].push_str(c["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        finishes += usize::from(c["choices"][0]["finish_reason"].is_string());
    }
    assert_eq!(finishes, 2);
    assert_eq!(text[0], text[1], "greedy choices differ");
    assert!(!text[0].is_empty());
}

#[test]
fn tool_calls_whole_and_streamed_and_tool_results_in() {
    let Some(model) = smol() else { return };
    let srv = Server::start(&model, &["--parallel", "1", "--ctx-size", "1024"]);
    let none: &[(&str, &str)] = &[];
    let chat = "/v1/chat/completions";
    let tools = json!([{"type": "function", "function": {"name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let msgs = json!([{"role": "user", "content": "Weather in Paris?"}]);
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let body = json!({"messages": msgs, "tools": tools, "tool_choice": named, "temperature": 0, "max_tokens": 40});
    let r = srv.post_json(chat, none, &body).json();
    let c = &r["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{r}");
    assert!(c["message"]["content"].is_null(), "{r}");
    let call = &c["message"]["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(args.is_object(), "{args}");

    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let data = srv.post_json(chat, none, &sbody).sse_data();
    let chunks: Vec<Value> = data.iter().filter(|d| *d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect();
    let deltas: Vec<&Value> = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array()).flatten().collect();
    assert_eq!(deltas.len(), 1, "{data:?}");
    assert_eq!(deltas[0]["function"]["name"], "get_weather");
    assert_eq!(serde_json::from_str::<Value>(deltas[0]["function"]["arguments"].as_str().unwrap()).unwrap(), args);
    assert!(chunks.iter().any(|c| c["choices"][0]["finish_reason"] == "tool_calls"));

    // The call and its result go back in; tool_choice none gives a text answer.
    let back = json!({"messages": [msgs[0], {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call["id"], "content": "{\"sky\": \"sunny\"}"}],
        "tools": tools, "tool_choice": "none", "temperature": 0, "max_tokens": 8});
    let r = srv.post_json(chat, none, &back).json();
    assert!(r["choices"][0]["message"]["content"].is_string() && r["choices"][0]["message"].get("tool_calls").is_none(), "{r}");
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 20);
    // A tool message without tools renders too; a bad call shape is a 400 naming it.
    let mut no_tools = back.clone();
    no_tools.as_object_mut().unwrap().remove("tools");
    no_tools.as_object_mut().unwrap().remove("tool_choice");
    assert_eq!(srv.post_json(chat, none, &no_tools).status, 200);
    let bad = json!({"messages": [{"role": "user", "content": "x", "tool_calls": [1]}]});
    assert_eq!(srv.post_json(chat, none, &bad).error(400)["param"], "messages[0].tool_calls");
}

/// Structured output without Python: a json_schema for three choices at once (each its
/// own grammar state; the prompt evaluated once, its K/V copied to the other two slots),
/// streamed, a GBNF grammar, the mask counters in /metrics, and refusals naming their
/// field.
#[test]
fn structured_output_schema_grammar_and_refusals() {
    let Some(model) = smol() else { return };
    let srv = Server::start(&model, &["--parallel", "3", "--ctx-size", "1536"]);
    let none: &[(&str, &str)] = &[];
    let chat = "/v1/chat/completions";
    let msgs = json!([{"role": "user", "content": "Invent a city and its population. Answer in JSON."}]);
    let schema = json!({"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
        "population": {"type": "integer", "minimum": 0, "maximum": 100000000}},
        "required": ["city", "population"], "additionalProperties": false});
    let fmt = json!({"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": true}});
    let r = srv.post_json(chat, none, &json!({"messages": msgs, "response_format": fmt, "n": 3, "seed": 4, "temperature": 0.9, "max_tokens": 60}));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = r.json();
    // The first choice evaluated the prompt; the other two copied its K/V (all but the
    // last token, which each evaluates for its own logits).
    let p = r["usage"]["prompt_tokens"].as_f64().unwrap();
    assert_eq!(srv.metric("lode_prompt_tokens_shared_total", none), 2.0 * (p - 1.0), "{r}");
    for c in r["choices"].as_array().unwrap() {
        assert_eq!(c["finish_reason"], "stop", "{r}");
        let v: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["city", "population"], "{v}");
        assert!(v["city"].as_str().unwrap().chars().count() <= 20 && v["population"].as_u64().unwrap() <= 100_000_000, "{v}");
    }
    // Streamed, through llama-server's `json_schema` field.
    let s = srv.post_json(chat, none, &json!({"messages": msgs, "json_schema": schema, "seed": 1, "temperature": 0.9, "max_tokens": 60, "stream": true}));
    let data = s.sse_data();
    let text: String = data
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["content"].as_str().unwrap_or("").to_string())
        .collect();
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    assert!(v["population"].is_u64(), "{v}");
    // GBNF on the completions endpoint.
    let g = "root ::= \"It is \" (\"red\" | \"green\" | \"blue\") \".\"";
    let c = srv.post_json("/v1/completions", none, &json!({"prompt": "The sky's color?", "grammar": g, "temperature": 1.0, "seed": 2, "max_tokens": 10})).json();
    let t = c["choices"][0]["text"].as_str().unwrap();
    assert!(["It is red.", "It is green.", "It is blue."].contains(&t), "{c}");
    assert_eq!(c["choices"][0]["finish_reason"], "stop");
    // Logprobs under a grammar are the constrained distribution's: greedy picks the
    // top-1, and no alternative leaves the grammar (the unconstrained top-5 would).
    let words = ["It is red.", "It is green.", "It is blue."];
    let c = srv.post_json("/v1/chat/completions", none, &json!({"messages": [{"role": "user", "content": "The sky's color?"}],
        "grammar": g, "temperature": 0, "max_tokens": 10, "logprobs": true, "top_logprobs": 5})).json();
    let content = c["choices"][0]["logprobs"]["content"].as_array().unwrap().clone();
    let mut before = String::new();
    for e in &content {
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top[0]["token"], e["token"], "{c}");
        assert!((top[0]["logprob"].as_f64().unwrap() - e["logprob"].as_f64().unwrap()).abs() < 1e-6);
        for t in top {
            let ext = format!("{before}{}", t["token"].as_str().unwrap());
            assert!(words.iter().any(|w| w.starts_with(&ext)), "{ext:?} is outside the grammar: {c}");
            assert!(t["logprob"].as_f64().unwrap().is_finite(), "{c}");
        }
        before.push_str(e["token"].as_str().unwrap());
    }
    assert!(words.contains(&before.as_str()), "{c}");
    // Every token drawn under a grammar had a mask.
    let masks = srv.metric("lode_grammar_masks_total", none);
    assert!(masks >= 3.0 * 5.0, "{masks}");
    // Refusals: the field and the reason.
    let e = srv.post_json(chat, none, &json!({"messages": msgs, "json_schema": {"type": "object", "properties": {"a": {"$ref": "#/missing"}}}})).error(400);
    assert_eq!(e["param"], "json_schema");
    assert!(e["message"].as_str().unwrap().contains("missing"), "{e}");
    let e = srv.post_json(chat, none, &json!({"messages": msgs, "grammar": "root ::= [a-z"})).error(400);
    assert_eq!(e["param"], "grammar");
    assert!(e["message"].as_str().unwrap().contains("GBNF"), "{e}");
}
