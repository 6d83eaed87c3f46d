//! `lode serve --spec-type draft-mtp` (the model's own multi-token-prediction block,
//! `lode synth`'s qwen35-tiny-mtp and qwen35moe-tiny-mtp), and the engine pieces under it:
//!
//! - several sequences drafting in one batched row of the block
//!   (`BatchEngine::mtp_draft_rows`) get the rows each would get alone, after batched
//!   decode steps that run the block too (with the block skipped during the steps, as
//!   before, the rows are far off); a prefix copied from another sequence's cache
//!   (`copy_prefix`, the prefix cache) drafts as if evaluated;
//! - the server's greedy completions with draft-mtp, one at a time and two at once, equal
//!   a plain server's token for token (log-probabilities included), with drafts verified
//!   and counted in `/metrics`; a `response_format` request decodes plainly (no
//!   drafts), as with the other drafters, and answers as the plain server does;
//! - a prefix copied from another slot's cache (`-sps 0`) answers as the plain server's
//!   and drafts; `lode fit --parallel 2` counts the block's cache per slot;
//! - a sampled request (temperature 1, a fixed seed) completes, alone and beside another,
//!   with the same tokens each time; its accepted drafts show in its `timings` and in
//!   `lode_spec_accepted_tokens_total`;
//! - a model without the block is refused by name.

mod serve_common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::KvType;
use lode_runtime::engine::{argmax_logits, BatchEngine, EngineOptions};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Model, OutputRows};
use serde_json::json;
use serve_common::*;

const PRESETS: [&str; 2] = ["qwen35-tiny-mtp", "qwen35moe-tiny-mtp"];

fn synth(dir: &Path, preset: &str, seed: &str) -> PathBuf {
    let p = dir.join(format!("{preset}-{seed}.gguf"));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode")).args(["synth", "--preset", preset, "--seed", seed, "-o"]).arg(&p).output().unwrap();
    assert!(out.status.success(), "synth {preset}: {}", String::from_utf8_lossy(&out.stderr));
    p
}

fn tmp(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("lode-mtp-serve-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn engine(path: &Path, n_seq: usize) -> BatchEngine {
    let m = Model::load_with_mtp(Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let opts = EngineOptions { ctx_size: Some(96), batch_size: 4, kv_type: KvType::F32.into(), swa_full: false };
    BatchEngine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts, n_seq).unwrap()
}

fn last_logits(e: &mut BatchEngine, seq: usize, tokens: &[u32]) -> Vec<f32> {
    let mut last = Vec::new();
    e.eval_rows(seq, tokens, OutputRows::Last, &mut |_, l| last = l.to_vec()).unwrap();
    last
}

/// Three drafting rows chained on their own argmax, for several sequences at once.
fn draft_rows(e: &mut BatchEngine, firsts: &[(usize, u32)]) -> Vec<Vec<f32>> {
    let mut rows = vec![Vec::new(); firsts.len()];
    let mut toks: Vec<u32> = firsts.iter().map(|f| f.1).collect();
    for j in 0..3 {
        let req: Vec<(usize, u32, usize)> = firsts.iter().zip(&toks).map(|(f, &t)| (f.0, t, j)).collect();
        for (i, l) in e.mtp_draft_rows(&req).unwrap().into_iter().enumerate() {
            toks[i] = argmax_logits(&l);
            rows[i].extend(l);
        }
    }
    rows
}

fn max_delta(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) })
}

/// Drafting rows of a batch within this of one sequence's (measured: equal bit for bit on
/// the CPU; a copied prefix without its source's hidden row lands 4.9e-3 away).
const SAME: f32 = 1e-4;

#[test]
fn batched_drafting_and_steps_keep_each_sequences_block() {
    let dir = tmp("engine");
    let prompts: [Vec<u32>; 2] = [[420, 258, 362, 32, 256].repeat(2), vec![7, 1000, 93, 93, 5000, 12]];
    for preset in PRESETS {
        let p = synth(&dir, preset, "11");
        // Alone: each sequence on an engine of its own, every token evaluated by itself.
        let mut want = Vec::new();
        let mut steps_of = Vec::new();
        for prompt in &prompts {
            let mut e = engine(&p, 1);
            let mut l = last_logits(&mut e, 0, prompt);
            let mut toks = Vec::new();
            for _ in 0..3 {
                let t = argmax_logits(&l);
                toks.push(t);
                l = last_logits(&mut e, 0, &[t]);
            }
            let next = argmax_logits(&l);
            want.push(draft_rows(&mut e, &[(0, next)]).remove(0));
            steps_of.push((toks, next));
        }
        // Together: the same tokens as batched steps of both, then one batched draft.
        let together = |block_in_steps: bool| {
            let mut e = engine(&p, 3);
            for (s, prompt) in prompts.iter().enumerate() {
                last_logits(&mut e, s, prompt);
            }
            for k in 0..3 {
                e.set_mtp(block_in_steps);
                e.step(&[(0, steps_of[0].0[k]), (1, steps_of[1].0[k])]).unwrap();
                e.set_mtp(true);
            }
            let rows = draft_rows(&mut e, &[(0, steps_of[0].1), (1, steps_of[1].1)]);
            (e, rows)
        };
        let (mut e, got) = together(true);
        for s in 0..2 {
            let d = max_delta(&got[s], &want[s]);
            eprintln!("{preset}: sequence {s}: batched vs alone {d:.1e}");
            assert!(d <= SAME, "{preset}: sequence {s}'s batched drafting rows are {d} from its rows alone");
        }
        // The block skipped during the steps (its cache rows missing, no hidden rows):
        // the same comparison fails, so it tells.
        let (_, skipped) = together(false);
        let d = max_delta(&skipped[0], &want[0]);
        assert!(d > 100.0 * SAME, "{preset}: without the block in the steps the rows are only {d} off: the test cannot tell");
        // The prefix cache: sequence 2 takes sequence 0's whole history (KV, state, the
        // block's cache and hidden row) and goes on with a chunk; it drafts as sequence
        // 0 would after that chunk.
        let rest = [11u32, 12, 13];
        let n = e.history(0).len();
        e.copy_prefix(0, 2, n).unwrap();
        let a = last_logits(&mut e, 2, &rest);
        let b = last_logits(&mut e, 0, &rest);
        assert!(a == b, "{preset}: the copied sequence's target logits differ");
        let (t2, t0) = (argmax_logits(&a), argmax_logits(&b));
        let rows = draft_rows(&mut e, &[(2, t2), (0, t0)]);
        let d = max_delta(&rows[0], &rows[1]);
        eprintln!("{preset}: copied prefix vs its source {d:.1e}");
        assert!(d <= SAME, "{preset}: after a copied prefix the drafting rows are {d} from the source's");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

const PROMPTS: [&str; 2] = ["one two three one two three one two", "a b c d a b c d a b"];

/// The answer's text and its whole `logprobs` object.
fn answer(r: &Resp) -> (String, serde_json::Value) {
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    (v["choices"][0]["text"].as_str().unwrap().to_string(), v["choices"][0]["logprobs"].clone())
}

fn body(prompt: &str, temp: f64) -> serde_json::Value {
    json!({"prompt": prompt, "max_tokens": 20, "temperature": temp, "top_k": 3, "seed": 5, "logprobs": 2})
}

/// Every prompt alone, then all at once (their drafts and verify chunks interleave);
/// both must agree. Returns the answers and each one's `timings`.
fn answers(srv: &Server, temp: f64) -> Vec<((String, serde_json::Value), serde_json::Value)> {
    let one: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let r = srv.post_json("/v1/completions", &[], &body(p, temp));
            (answer(&r), r.json()["timings"].clone())
        })
        .collect();
    let handles: Vec<_> = PROMPTS
        .iter()
        .map(|p| {
            let (addr, b) = (srv.addr.clone(), body(p, temp).to_string());
            std::thread::spawn(move || {
                let r = request(&addr, "POST", "/v1/completions", &[], b.as_bytes());
                (answer(&r), r.json()["timings"].clone())
            })
        })
        .collect();
    let both: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (i, (a, b)) in one.iter().zip(&both).enumerate() {
        assert_eq!(a.0, b.0, "prompt {i}, temperature {temp}: the concurrent answer differs from the one alone");
        assert_eq!(a.1["draft_n"], b.1["draft_n"], "prompt {i}: the drafts depend on batching");
    }
    [one, both].concat()
}

#[test]
fn draft_mtp_in_serve_leaves_greedy_completions_unchanged() {
    let dir = tmp("greedy");
    for preset in PRESETS {
        let m = synth(&dir, preset, "11");
        let base = ["--parallel", "2", "-c", "256", "-b", "4"];
        let plain = Server::start(&m, &base);
        let want = answers(&plain, 0.0);
        assert!(want.iter().all(|a| a.0 .1["token_logprobs"].as_array().is_some_and(|l| l.len() == 20)), "{want:?}");
        let srv = Server::start(&m, &[&base[..], &["--spec-type", "draft-mtp", "--draft-max", "3", "--draft-p-min", "0"]].concat());
        let got = answers(&srv, 0.0);
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.0, b.0, "{preset}: answer {i} differs under draft-mtp");
            assert!(a.1["draft_n"].is_null() && b.1["draft_n"].as_u64().is_some_and(|n| n > 0), "{preset}: {} / {}", a.1, b.1);
        }
        let drafted: u64 = got.iter().map(|a| a.1["draft_n"].as_u64().unwrap()).sum();
        let accepted: u64 = got.iter().map(|a| a.1["draft_n_accepted"].as_u64().unwrap()).sum();
        assert_eq!(srv.metric("lode_spec_drafted_tokens_total", &[]), drafted as f64, "{preset}: /metrics counts other drafts");
        assert_eq!(srv.metric("lode_spec_accepted_tokens_total", &[]), accepted as f64, "{preset}");
        let (rounds, reqs) = (srv.metric("lode_spec_draft_batches_total", &[]), srv.metric("lode_spec_draft_requests_total", &[]));
        eprintln!("{preset}: {drafted} drafted, {accepted} accepted, {reqs} draft requests in {rounds} rounds");
        assert!(rounds > 0.0 && reqs >= rounds, "{preset}: {rounds} {reqs}");
        // Structured output decodes plainly (a grammar's state cannot be rolled back past
        // a rejected draft), as with the other drafters: the plain server's answer.
        let grammar = json!({"prompt": "A JSON object:", "max_tokens": 12, "temperature": 0, "logprobs": 1,
            "response_format": {"type": "json_object"}});
        let (a, b) = (plain.post_json("/v1/completions", &[], &grammar), srv.post_json("/v1/completions", &[], &grammar));
        assert_eq!(answer(&a), answer(&b), "{preset}: a constrained request answers otherwise under draft-mtp");
        assert!(b.json()["timings"]["draft_n"].is_null(), "{preset}: a constrained request was drafted for: {}", b.body);
        assert_eq!(srv.metric("lode_spec_drafted_tokens_total", &[]), drafted as f64, "{preset}: the constrained request drafted");
    }
    // The prefix cache: a one-token request leaves exactly its prompt in slot 0, and a
    // prompt extending it goes to slot 1 (`-sps 0`) with that history copied (the block's
    // cache and hidden row too); it answers as the plain server and still drafts.
    let m = dir.join("qwen35-tiny-mtp-11.gguf");
    let tok = lode_runtime::tokenizer::Tokenizer::from_gguf(&GgufFile::open(&m).unwrap()).unwrap();
    let (a, longer) = ("The capital of France is Paris and", "The capital of France is Paris and the capital of Italy is");
    let n_a = tok.encode(a, true, true).len() as u64;
    assert!(tok.encode(longer, true, true).starts_with(&tok.encode(a, true, true)));
    let copied = |extra: &[&str]| {
        let srv = Server::start(&m, &[&["--parallel", "2", "-c", "256", "-b", "4", "-sps", "0"][..], extra].concat());
        assert_eq!(srv.post_json("/v1/completions", &[], &json!({"prompt": a, "max_tokens": 1, "temperature": 0})).status, 200);
        let r = srv.post_json("/v1/completions", &[], &body(longer, 0.0));
        assert_eq!(r.json()["timings"]["cache_n"], n_a, "{}", r.body);
        (answer(&r), r.json()["timings"]["draft_n"].clone())
    };
    let (want, _) = copied(&[]);
    let (got, drafted) = copied(&["--spec-type", "draft-mtp", "--draft-max", "3", "--draft-p-min", "0"]);
    assert_eq!(want, got, "after a copied prefix the answer differs under draft-mtp");
    assert!(drafted.as_u64().is_some_and(|n| n > 0), "{drafted}");
    // `lode fit` sizes the server: the block's cache once per slot (f16 K and V of 2 KV
    // heads × 64 over 256 positions: 128 KiB a slot).
    let fit = |extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
            .args(["fit", "--device", "cpu", "-c", "256", "--parallel", "2", "--json", "-m"])
            .arg(&m)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["kv_bytes"].as_u64().unwrap()
    };
    assert_eq!(fit(&["--spec-type", "draft-mtp"]) - fit(&[]), 2 * 256 * 2 * 64 * 2 * 2);
    // A model without the block: refused by name at start.
    let plain = synth(&dir, "qwen35-tiny", "11");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["serve", "--device", "cpu", "--port", "0", "--spec-type", "draft-mtp", "-m"])
        .arg(&plain)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("multi-token-prediction"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn draft_mtp_in_serve_with_a_sampler() {
    let dir = tmp("sampled");
    // Seed 2's block agrees with the target now and then under top-k 3 (seed 11's never
    // does), so acceptance has something to count.
    let m = synth(&dir, "qwen35-tiny-mtp", "2");
    let srv = Server::start(&m, &["--parallel", "2", "-c", "256", "-b", "4", "--spec-type", "draft-mtp", "--draft-max", "3", "--draft-p-min", "0"]);
    let got = answers(&srv, 1.0);
    let n = |a: &serde_json::Value, k: &str| a[k].as_u64().unwrap_or_else(|| panic!("{k} in {a}"));
    for (i, a) in got.iter().enumerate() {
        assert_eq!(a.0 .1["token_logprobs"].as_array().map(Vec::len), Some(20), "answer {i}: {}", a.0 .1);
        assert!(n(&a.1, "draft_n") > 0 && n(&a.1, "draft_n_accepted") <= n(&a.1, "draft_n"), "answer {i}: {}", a.1);
    }
    let accepted: u64 = got.iter().map(|a| n(&a.1, "draft_n_accepted")).sum();
    eprintln!("sampled: {accepted} accepted of {}", got.iter().map(|a| n(&a.1, "draft_n")).sum::<u64>());
    assert!(accepted > 0, "no draft accepted: {got:?}");
    assert_eq!(srv.metric("lode_spec_accepted_tokens_total", &[]), accepted as f64);
    std::fs::remove_dir_all(&dir).unwrap();
}
