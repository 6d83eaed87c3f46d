//! Chunked prefill in `lode serve` on SmolLM2: a long prompt arriving while two other
//! requests decode is fed in chunks of `--ubatch-size` rows inside their decode steps,
//! and every greedy answer equals the same request served alone (f32 KV cache, whose
//! rounding does not depend on the chunk's shape: see `serve_prefix.rs`). `/metrics`
//! shows the mixed chunks and the decode steps that waited for them; `--ctx-size` is the
//! total split among the `--parallel` slots, as llama-server splits it.

mod serve_common;

use serde_json::{json, Value};
use serve_common::*;

const N_LONG: usize = 8;
const N_DECODE: usize = 48;

fn completion(addr: &str, prompt: &str, max_tokens: usize) -> String {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0});
    let r = request(addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.body);
    let v: Value = r.json();
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// About 700 tokens: more than one 512-row chunk alone, a dozen chunks of 64 rows.
fn long_prompt() -> String {
    let lines: Vec<String> = (0..40).map(|i| format!("Note {i}: the mill by the river grinds rye on day {} of the month.", i % 28 + 1)).collect();
    lines.join(" ") + " In short, the notes say that"
}

const DECODERS: [&str; 2] = ["Counting slowly: 1, 2, 3, 4, 5,", "The alphabet, one letter per line: A\nB\nC\n"];

#[test]
fn a_long_prompt_fed_in_chunks_inside_decode_steps_changes_no_answer() {
    let Some(model) = smol() else { return };
    let none: &[(&str, &str)] = &[];
    let long = long_prompt();

    // Alone: one slot, one request at a time, the prompt in chunks of 512.
    let alone = Server::start(&model, &["--parallel", "1", "--ctx-size", "2048", "--kv-type", "f32"]);
    let want_long = completion(&alone.addr, &long, N_LONG);
    let want: Vec<String> = DECODERS.iter().map(|p| completion(&alone.addr, p, N_DECODE)).collect();
    assert_eq!(alone.metric("lode_prefill_chunks_mixed_total", none), 0.0, "nothing to mix with");
    assert_eq!(alone.metric("lode_decode_prefill_wait_seconds_count", none), 0.0);
    drop(alone);

    // Together: three slots of 1024 tokens (--ctx-size is the total), passes of 64 rows.
    let srv = Server::start(&model, &["--parallel", "3", "--ctx-size", "3072", "--kv-type", "f32", "-ub", "64"]);
    let props = srv.get("/props", none).json();
    assert_eq!(props["default_generation_settings"]["n_ctx"].as_u64().or(props["n_ctx"].as_u64()), Some(1024), "{props}");
    let decoders: Vec<_> = DECODERS
        .iter()
        .map(|p| {
            let (addr, p) = (srv.addr.clone(), p.to_string());
            std::thread::spawn(move || completion(&addr, &p, N_DECODE))
        })
        .collect();
    // The long prompt arrives once both are decoding.
    let t0 = std::time::Instant::now();
    while srv.metric("lode_batch_rows_total", none) < 6.0 {
        assert!(t0.elapsed().as_secs() < 60, "the two requests never decoded together");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let got_long = completion(&srv.addr, &long, N_LONG);
    let got: Vec<String> = decoders.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(got_long, want_long, "the long prompt, fed in chunks beside two decoding requests");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "decoding request {i}, beside the long prompt's chunks");
    }
    let mixed = srv.metric("lode_prefill_chunks_mixed_total", none);
    let chunks = srv.metric("lode_prefill_chunks_total", none);
    assert!(mixed >= 6.0 && chunks >= mixed, "chunks {chunks}, mixed into decode steps {mixed}");
    let waits = srv.metric("lode_decode_prefill_wait_seconds_count", none);
    assert!(waits >= mixed, "each mixed chunk carried decode steps: {waits} waits");
    let (sum, max) = (srv.metric("lode_decode_prefill_wait_seconds_sum", none), srv.metric("lode_decode_prefill_wait_seconds_max", none));
    assert!(max > 0.0 && sum >= max && sum <= waits * max, "sum {sum}, max {max}");

    // A slot holds a third of the total: a prompt longer than that is refused.
    let too_long = format!("{long} {long}");
    let body = json!({"prompt": too_long, "max_tokens": 1});
    let r = request(&srv.addr, "POST", "/v1/completions", &[], body.to_string().as_bytes());
    assert_eq!(r.status, 400, "{}", r.body);
}
