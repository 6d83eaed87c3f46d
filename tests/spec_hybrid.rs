//! Speculative decoding on the hybrid (recurrent) models, qwen35, qwen35moe and qwen3next: a verify
//! chunk's rejected tail is rolled back through the rewind log (`model/rewind.rs`), so
//!
//! - a sequence rewound into a verify chunk continues exactly (bit for bit) as one that
//!   never evaluated the rejected tokens, for every rewind point, with verify chunks and
//!   replays longer than the batch size (several forward chunks); so do two sequences
//!   rewound after batched steps (within rounding: a batch rounds differently);
//! - every token speculation emits, and the logits it was chosen from, are plain
//!   decoding's, bit for bit: sampled with n-gram drafts (some accepted, most rejected:
//!   rewinds of 1 to several rows) and greedy with another model's drafts (rejected:
//!   the target rewinds, and so does the draft's own cache);
//! - greedy `lode generate` output with n-gram lookup, with the model drafting for itself
//!   and with another qwen35 as the draft is plain greedy decoding, token for token, on
//!   `lode synth`'s tiny presets (whose random weights make greedy output one repeated
//!   token: the logits comparison above is the sharper check).

mod common;

use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::KvType;
use lode_runtime::engine::{
    generate_speculative_with_logits, generate_with_logits, BatchEngine, Drafter, Engine, EngineOptions, Flow, GenParams, ModelDrafter, NgramDrafter,
    Sampler, SamplerParams, SpecParams,
};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Model, OutputRows};

fn synth(dir: &std::path::Path, preset: &str, seed: &str) -> String {
    let p = dir.join(format!("{preset}-{seed}.gguf"));
    let out = common::lode(&["synth", "--preset", preset, "-o", p.to_str().unwrap(), "--seed", seed]);
    assert!(out.status.success(), "synth {preset}: {}", String::from_utf8_lossy(&out.stderr));
    p.to_str().unwrap().to_string()
}

fn engine(file: &Arc<GgufFile>, batch: usize) -> BatchEngine {
    engine_n(file, batch, 1)
}

fn engine_n(file: &Arc<GgufFile>, batch: usize, n_seq: usize) -> BatchEngine {
    let m = Model::load(file.clone()).unwrap();
    let opts = EngineOptions { ctx_size: Some(64), batch_size: batch, kv_type: KvType::F32.into(), swa_full: false };
    BatchEngine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts, n_seq).unwrap()
}

fn prefill(e: &mut BatchEngine, ids: &[u32]) {
    e.eval_rows(0, ids, OutputRows::None, &mut |_, _| {}).unwrap();
}

#[test]
fn rewind_into_a_verify_chunk_continues_exactly() {
    let dir = std::env::temp_dir().join(format!("lode-spec-rewind-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = Arc::new(GgufFile::open(synth(&dir, "qwen35-tiny", "6")).unwrap());
    let ids: Vec<u32> = (0..30u32).map(|i| 900 + 53 * i).collect();
    let (h0, chunk) = (8, 6);
    for batch in [16, 4] {
        for keep in [h0, h0 + 1, h0 + 2, h0 + 5, h0 + chunk] {
            // Rewound: the verify chunk ids[8..14], back to `keep`, then a verify of two.
            let mut a = engine(&file, batch);
            prefill(&mut a, &ids[..h0]);
            let rows = a.eval_verify(0, &ids[h0..h0 + chunk]).unwrap();
            assert_eq!(rows.len(), chunk);
            assert!(a.can_rewind(0, keep) && !a.can_rewind(0, h0 - 1));
            a.rewind(0, keep).unwrap();
            assert_eq!(a.history(0), &ids[..keep]);
            let next = [ids[keep + 7], ids[keep + 9]];
            let got = a.eval_verify(0, &next).unwrap();
            // Never past the kept tokens: the prompt, then one decode step per token.
            let mut b = engine(&file, batch);
            prefill(&mut b, &ids[..h0]);
            for (i, &t) in ids[h0..keep].iter().enumerate() {
                let l = b.step(&[(0, t)]).unwrap().remove(0);
                assert!(l == rows[i], "batch {batch}: verify row {i} differs from the decode step");
            }
            let want = b.eval_verify(0, &next).unwrap();
            assert!(got == want, "batch {batch}, kept {keep} of {}: the rewound state continues differently", h0 + chunk);
        }
    }
    // Batched steps of two sequences log each row into its own sequence's log (how the
    // draft model of `lode serve` drafts for several slots at once).
    let mut a = engine_n(&file, 16, 2);
    prefill(&mut a, &ids[..h0]);
    a.eval_rows(1, &ids[3..3 + h0], OutputRows::None, &mut |_, _| {}).unwrap();
    a.start_rewind_log(0, 4).unwrap();
    a.start_rewind_log(1, 4).unwrap();
    for j in 0..4 {
        a.step(&[(0, ids[12 + j]), (1, ids[20 + j])]).unwrap();
    }
    a.rewind(0, h0 + 1).unwrap();
    a.rewind(1, h0 + 3).unwrap();
    let next = [ids[27], ids[29]];
    let got = [a.eval_verify(0, &next).unwrap(), a.eval_verify(1, &next).unwrap()];
    for (k, (start, kept)) in [(0, &ids[12..13]), (3, &ids[20..23])].into_iter().enumerate() {
        let mut b = engine(&file, 16);
        prefill(&mut b, &ids[start..start + h0]);
        for &t in kept {
            b.step(&[(0, t)]).unwrap();
        }
        let want = b.eval_verify(0, &next).unwrap();
        let d = want.iter().flatten().zip(got[k].iter().flatten()).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
        // A batched step may round its rows as a batch (0 here on the CPU); logging the
        // wrong row of the step moves the logits by 5e-3.
        eprintln!("sequence {k} rewound after batched steps: max |Δ| {d:.2e}");
        assert!(d < 1e-3, "sequence {k} rewound after batched steps: max |Δ| {d}");
    }
    // Outside the log: refused, the sequence unchanged; a step past the log's room or a
    // truncation ends the log.
    let mut a = engine(&file, 16);
    prefill(&mut a, &ids[..h0]);
    a.eval_verify(0, &ids[h0..h0 + 4]).unwrap();
    let err = a.rewind(0, h0 - 2).unwrap_err().to_string();
    assert!(err.contains("cannot be rewound") && a.history(0).len() == h0 + 4, "{err}");
    a.step(&[(0, ids[15])]).unwrap();
    assert!(!a.can_rewind(0, h0 + 1) && a.can_rewind(0, h0 + 5));
    a.eval_verify(0, &ids[..3]).unwrap();
    a.truncate(0, h0 + 6);
    assert_eq!(a.history(0).len(), 0, "truncate keeps all or nothing, as before");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn open(path: &str) -> Engine {
    let m = Model::load(Arc::new(GgufFile::open(path).unwrap())).unwrap();
    let opts = EngineOptions { ctx_size: Some(128), batch_size: 4, kv_type: KvType::F32.into(), swa_full: false };
    Engine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts).unwrap()
}

type Emitted = Vec<(u32, Vec<f32>)>;

fn plain(path: &str, prompt: &[u32], n: usize, sp: &SamplerParams) -> Emitted {
    let mut out = Vec::new();
    let params = GenParams { max_tokens: n, eog: vec![] };
    generate_with_logits(&mut open(path), prompt, &params, &mut Sampler::new(sp.clone()), &mut |t, l| {
        out.push((t, l.to_vec()));
        Flow::Continue
    })
    .unwrap();
    out
}

fn speculative(path: &str, drafter: &mut dyn Drafter, prompt: &[u32], n: usize, sp: &SamplerParams) -> (Emitted, lode_runtime::engine::SpecStats) {
    let mut out = Vec::new();
    let params = GenParams { max_tokens: n, eog: vec![] };
    let spec = SpecParams { draft_max: 5, draft_min: 0 };
    let r = generate_speculative_with_logits(&mut open(path), drafter, &spec, prompt, &params, &mut Sampler::new(sp.clone()), &mut |t, l| {
        out.push((t, l.to_vec()));
        Flow::Continue
    })
    .unwrap();
    (out, r.stats)
}

#[test]
fn speculation_emits_plain_decodings_tokens_and_logits() {
    let dir = std::env::temp_dir().join(format!("lode-spec-logits-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompt: Vec<u32> = [420, 258, 362, 32, 256].repeat(4);
    // qwen3next-tiny: its rewind log holds the rows its packed projections were taken apart into.
    for preset in ["qwen35-tiny", "qwen35moe-tiny", "qwen3next-tiny"] {
        let p = synth(&dir, preset, "11");
        let other = synth(&dir, preset, "12");
        let (mut partial, mut rejected) = (0, 0);
        for seed in 1..=3 {
            let sp = SamplerParams { temp: 1.0, top_k: 4, top_p: 1.0, min_p: 0.0, seed, ..Default::default() };
            let want = plain(&p, &prompt, 40, &sp);
            let (got, st) = speculative(&p, &mut NgramDrafter::new(2, 1).unwrap(), &prompt, 40, &sp);
            assert!(got == want, "{preset}, seed {seed}: n-gram speculation emitted other tokens or logits ({st:?})");
            partial += st.accepted;
            rejected += st.drafted - st.accepted;
        }
        assert!(partial > 0 && rejected > 0, "{preset}: {partial} accepted, {rejected} rejected: not both kinds of rewind");
        let greedy = SamplerParams { temp: 0.0, ..Default::default() };
        let want = plain(&p, &prompt, 24, &greedy);
        let mut d = ModelDrafter::new(open(&other), open(&p).model(), &greedy, 0.0).unwrap();
        let (got, st) = speculative(&p, &mut d, &prompt, 24, &greedy);
        assert!(got == want, "{preset}: another model's drafts changed tokens or logits ({st:?})");
        assert!(st.drafted > st.accepted, "{preset}: {st:?}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn json_run(args: &[&str]) -> serde_json::Value {
    let out = common::lode(args);
    assert!(out.status.success(), "lode {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json output")
}

#[test]
fn hybrid_presets_greedy_is_unchanged_by_speculation() {
    let dir = std::env::temp_dir().join(format!("lode-spec-hybrid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for preset in ["qwen35-tiny", "qwen35moe-tiny"] {
        let p = synth(&dir, preset, "11");
        let other = synth(&dir, preset, "12");
        let base = ["generate", "--device", "cpu", "-t", "2", "-m", &p, "-p", "one two three one two three one two", "-n", "24", "-c", "256", "-b", "4", "--temp", "0", "--json"];
        let want = json_run(&base)["generated_ids"].clone();
        let ngram = json_run(&[&base[..], &["--spec-type", "ngram-simple", "--spec-ngram-size-n", "2", "--draft-max", "6"]].concat());
        assert_eq!(ngram["generated_ids"], want, "{preset}: n-gram lookup changed the greedy output");
        assert!(ngram["speculative"]["drafted"].as_u64().unwrap() > 0, "{preset}: {}", ngram["speculative"]);
        let selfd = json_run(&[&base[..], &["--model-draft", &p, "--draft-max", "5", "--draft-p-min", "0"]].concat());
        assert_eq!(selfd["generated_ids"], want, "{preset}: self-drafting changed the greedy output");
        let s = &selfd["speculative"];
        assert!(s["drafted"].as_u64().unwrap() > 0 && s["accepted"] == s["drafted"], "{preset}: {s}");
        // Another model's drafts are mostly rejected: the target rewinds, and the draft's
        // own cache rewinds to the accepted tokens before drafting again.
        let od = json_run(&[&base[..], &["--model-draft", &other, "--draft-max", "4", "--draft-p-min", "0"]].concat());
        assert_eq!(od["generated_ids"], want, "{preset}: another draft model changed the greedy output");
        let s = &od["speculative"];
        assert!(s["drafted"].as_u64().unwrap() > s["accepted"].as_u64().unwrap(), "{preset}: {s}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
