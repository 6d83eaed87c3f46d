//! The multi-token-prediction block (`blk.{n_layer}.nextn.*`, `--spec-type draft-mtp`)
//! against an independent reference, and speculation with it:
//!
//! - its drafting logits (the first row after a prompt, with the target's hidden state,
//!   then rows chained on its own output) against a NumPy computation over gguf-py
//!   0.19.0's dequantized tensors (`tests/data/qwen35_mtp_reference.py`, which does not
//!   call lode), on `lode synth`'s qwen35-tiny-mtp, qwen35moe-tiny-mtp and qwen3next-tiny-mtp: after the
//!   prompt as one chunk, in chunks of 4 (the hidden state carried across chunk
//!   boundaries), token by token (the decode path), and rewound into a verify chunk (the
//!   kept row's hidden state). The same comparison against the reference with the
//!   concatenation's halves swapped, or the hidden half not normed, must fail;
//! - every token speculation with it emits, and the logits it was chosen from, are plain
//!   decoding's (without the block), bit for bit, greedy and sampled; and `lode generate
//!   --spec-type draft-mtp` prints plain greedy's tokens;
//! - a file without the block is refused by name (`lode serve --spec-type draft-mtp`:
//!   `tests/mtp_serve.rs`); `lode fit` counts the block's KV cache
//!   (one more full-context layer) and, with speculation on a hybrid model, the rewind
//!   logs; `lode inspect` names the block.
//!
//! Needs python3 with `gguf==0.19.0` and numpy (CI installs them: `.ci/run`).

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::KvType;
use lode_runtime::engine::{
    generate_speculative_with_logits, generate_with_logits, BatchEngine, Engine, EngineOptions, Flow, GenParams, MtpDrafter, Sampler, SamplerParams,
    SpecParams,
};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Model, OutputRows};

/// Bound on every drafting row's max |lode − reference|.
const EVERY: f32 = 2e-2;
/// Bound on most rows (the reference rounds activations to Q8_K as the CPU does; one
/// that lands on the other side of a rounding boundary moves a row further).
const MOST: f32 = 1e-4;

fn synth(dir: &Path, preset: &str, seed: &str) -> String {
    let p = dir.join(format!("{preset}-{seed}.gguf"));
    let out = common::lode(&["synth", "--preset", preset, "-o", p.to_str().unwrap(), "--seed", seed]);
    assert!(out.status.success(), "synth {preset}: {}", String::from_utf8_lossy(&out.stderr));
    p.to_str().unwrap().to_string()
}

fn list(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// The reference's drafting rows for every case, for the right block and then each of
/// `variants` (wrong blocks).
fn reference(model: &str, cases: &[(&[u32], &[u32])], out: &Path, variants: &[&str]) -> Vec<f32> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen35_mtp_reference.py");
    let spec: Vec<String> = cases.iter().map(|(p, c)| format!("{}:{}", list(p), list(c))).collect();
    let r = Command::new("python3")
        .arg(&script)
        .arg(model)
        .arg(spec.join("/"))
        .arg(out)
        .args(variants)
        .output()
        .expect("python3 must be installed for this test (python3 -m pip install gguf==0.19.0 numpy)");
    assert!(r.status.success(), "the NumPy reference failed (needs python3 -m pip install gguf==0.19.0 numpy): {}", String::from_utf8_lossy(&r.stderr));
    eprintln!("reference: {}", String::from_utf8_lossy(&r.stdout).trim());
    std::fs::read(out).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn engine(file: &Arc<GgufFile>, batch: usize) -> BatchEngine {
    let m = Model::load_with_mtp(file.clone()).unwrap();
    assert!(m.mtp.is_some(), "the preset carries an MTP block");
    let opts = EngineOptions { ctx_size: Some(64), batch_size: batch, kv_type: KvType::F32.into(), swa_full: false };
    BatchEngine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts, 1).unwrap()
}

/// The block's drafting rows for `chain` after what the engine holds.
fn chain(e: &mut BatchEngine, chain: &[u32]) -> Vec<f32> {
    chain.iter().enumerate().flat_map(|(j, &t)| e.mtp_logits(0, t, j).unwrap().expect("the engine keeps the MTP block")).collect()
}

/// Per row, the largest |Δ| (NaN counts as infinite).
fn deltas(got: &[f32], want: &[f32], n_vocab: usize) -> Vec<f32> {
    assert_eq!(got.len(), want.len(), "rows");
    got.chunks(n_vocab)
        .zip(want.chunks(n_vocab))
        .map(|(a, b)| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, |m, d| if d.is_nan() { f32::INFINITY } else { m.max(d) }))
        .collect()
}

fn show(d: &[f32]) -> String {
    d.iter().map(|x| format!("{x:.1e}")).collect::<Vec<_>>().join(" ")
}

/// Whether every row is within `EVERY` and the fraction `most` (num, den) of them within
/// `MOST`.
fn within(d: &[f32], (num, den): (usize, usize)) -> bool {
    d.iter().all(|&x| x <= EVERY) && den * d.iter().filter(|&&x| x <= MOST).count() >= num * d.len()
}

#[test]
fn mtp_block_matches_a_numpy_reference() {
    let dir = std::env::temp_dir().join(format!("lode-mtp-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Ids spread over the vocabulary, below the special tokens.
    let ids: Vec<u32> = (0..40u64).map(|i| ((i * 2654435761) >> 7) as u32 % 151643).collect();
    for preset in ["qwen35-tiny-mtp", "qwen35moe-tiny-mtp", "qwen3next-tiny-mtp"] {
        let path = synth(&dir, preset, "3");
        let file = Arc::new(GgufFile::open(&path).unwrap());
        let n_vocab = Model::load(file.clone()).unwrap().cfg.n_vocab;
        // A one-token prompt (its row has no hidden state before it), and 21 tokens.
        let cases: [(&[u32], &[u32]); 2] = [(&ids[..1], &ids[30..33]), (&ids[..21], &ids[21..25])];
        let variants: &[&str] = if preset == "qwen35-tiny-mtp" { &["--swap-concat", "--no-hnorm"] } else { &[] };
        let want = reference(&path, &cases, &dir.join(format!("{preset}.f32")), variants);
        let rows: usize = cases.iter().map(|c| c.1.len()).sum();
        assert_eq!(want.len(), (1 + variants.len()) * rows * n_vocab);
        let right = &want[..rows * n_vocab];

        let mut got: Vec<(String, Vec<f32>)> = Vec::new();
        for batch in [64, 4] {
            let mut v = Vec::new();
            for (prompt, c) in cases {
                let mut e = engine(&file, batch);
                e.eval_rows(0, prompt, OutputRows::None, &mut |_, _| {}).unwrap();
                v.extend(chain(&mut e, c));
            }
            got.push((format!("prompt in chunks of {batch}"), v));
        }
        let mut v = Vec::new();
        for (prompt, c) in cases {
            let mut e = engine(&file, 64);
            for &t in prompt {
                e.eval_rows(0, &[t], OutputRows::Last, &mut |_, _| {}).unwrap();
            }
            v.extend(chain(&mut e, c));
        }
        got.push(("token by token".into(), v));
        // Rewound into a verify chunk: the kept prompt's last row feeds the first draft.
        let mut v = Vec::new();
        for (prompt, c) in cases {
            let mut e = engine(&file, 64);
            let h0 = prompt.len().div_ceil(2);
            if h0 < prompt.len() {
                e.eval_rows(0, &prompt[..h0], OutputRows::None, &mut |_, _| {}).unwrap();
            }
            let start = if h0 < prompt.len() { h0 } else { 0 };
            let tail: Vec<u32> = prompt[start..].iter().chain(&ids[35..39]).copied().collect();
            e.eval_verify(0, &tail).unwrap();
            e.rewind(0, prompt.len()).unwrap();
            v.extend(chain(&mut e, c));
        }
        got.push(("rewound into a verify chunk".into(), v));

        // 3/4 of the rows within MOST; with experts 1/3: the trunk's routed experts over the
        // 21-token prompt move its hidden states by ~3e-3 from the reference's (as
        // hybrid_reference.rs sees for qwen35moe), while the one-token case's rows (where
        // the block's own experts run) stay within 1e-6.
        let most = if preset == "qwen35-tiny-mtp" { (3, 4) } else { (1, 3) };
        for (what, g) in &got {
            let d = deltas(g, right, n_vocab);
            eprintln!("{preset}, {what}: per-row max |lode - reference| {}", show(&d));
            assert!(within(&d, most), "{preset}, {what}: outside the bounds: {d:?}");
        }
        for (k, name) in variants.iter().enumerate() {
            let wrong = &want[(k + 1) * rows * n_vocab..(k + 2) * rows * n_vocab];
            let d = deltas(&got[0].1, wrong, n_vocab);
            eprintln!("{preset}, against the reference {name}: {}", show(&d));
            assert!(!within(&d, most), "{preset}: the bounds cannot tell the block from the reference {name}: {d:?}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn open(path: &str, keep_mtp: bool) -> Engine {
    let file = Arc::new(GgufFile::open(path).unwrap());
    let m = if keep_mtp { Model::load_with_mtp(file) } else { Model::load(file) }.unwrap();
    let opts = EngineOptions { ctx_size: Some(128), batch_size: 4, kv_type: KvType::F32.into(), swa_full: false };
    Engine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts).unwrap()
}

type Emitted = Vec<(u32, Vec<f32>)>;

#[test]
fn speculation_with_mtp_emits_plain_decodings_tokens_and_logits() {
    let dir = std::env::temp_dir().join(format!("lode-mtp-spec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompt: Vec<u32> = [420, 258, 362, 32, 256].repeat(4);
    let params = GenParams { max_tokens: 30, eog: vec![] };
    let spec = SpecParams { draft_max: 4, draft_min: 0 };
    for preset in ["qwen35-tiny-mtp", "qwen35moe-tiny-mtp"] {
        let p = synth(&dir, preset, "11");
        for sp in [SamplerParams { temp: 0.0, ..Default::default() }, SamplerParams { temp: 1.0, top_k: 3, top_p: 1.0, min_p: 0.0, seed: 5, ..Default::default() }] {
            let mut e = open(&p, true);
            let mut d = MtpDrafter::new(e.model(), &sp, 0.0).unwrap();
            let mut got: Emitted = Vec::new();
            let r = generate_speculative_with_logits(&mut e, &mut d, &spec, &prompt, &params, &mut Sampler::new(sp.clone()), &mut |t, l| {
                got.push((t, l.to_vec()));
                Flow::Continue
            })
            .unwrap();
            assert!(r.stats.drafted > 0 && got.len() == 30, "{preset}: {:?}", r.stats);
            // Every token was chosen from the logits plain decoding (the block not even
            // loaded) gives after the same tokens, one step at a time, bit for bit.
            let mut plain = open(&p, false);
            let mut logits = plain.eval(&prompt).unwrap();
            for (i, (t, l)) in got.iter().enumerate() {
                assert!(*l == logits, "{preset}, temp {}: token {i}'s logits are not plain decoding's ({:?})", sp.temp, r.stats);
                logits = plain.eval(&[*t]).unwrap();
            }
            if sp.temp > 0.0 {
                // Sampled drafts come with their distribution, and the rule draws its own
                // uniforms: the same distribution as plain sampling, not the same draws.
                continue;
            }
            let mut want: Emitted = Vec::new();
            generate_with_logits(&mut open(&p, false), &prompt, &params, &mut Sampler::new(sp.clone()), &mut |t, l| {
                want.push((t, l.to_vec()));
                Flow::Continue
            })
            .unwrap();
            assert!(got == want, "{preset}: greedy MTP speculation emitted other tokens ({:?})", r.stats);
        }
    }
    // A model without the block: the drafter is refused by name.
    let plain = synth(&dir, "qwen35-tiny", "11");
    let err = MtpDrafter::new(open(&plain, true).model(), &SamplerParams::greedy(), 0.0).err().expect("no MTP block").to_string();
    assert!(err.contains("multi-token-prediction"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn json_run(args: &[&str]) -> serde_json::Value {
    let out = common::lode(args);
    assert!(out.status.success(), "lode {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json output")
}

#[test]
fn generate_with_draft_mtp_is_plain_greedy() {
    let dir = std::env::temp_dir().join(format!("lode-mtp-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for preset in ["qwen35-tiny-mtp", "qwen35moe-tiny-mtp"] {
        let p = synth(&dir, preset, "11");
        let base = ["generate", "--device", "cpu", "-t", "2", "-m", &p, "-p", "one two three one two three", "-n", "20", "-c", "256", "-b", "4", "--temp", "0", "--json"];
        let want = json_run(&base)["generated_ids"].clone();
        let mtp = json_run(&[&base[..], &["--spec-type", "draft-mtp", "--draft-max", "3", "--draft-p-min", "0"]].concat());
        assert_eq!(mtp["generated_ids"], want, "{preset}: draft-mtp changed the greedy output");
        let s = &mtp["speculative"];
        assert!(s["drafted"].as_u64().unwrap() > 0 && s["drafter"] == "mtp", "{preset}: {s}");
    }
    let plain = synth(&dir, "qwen35-tiny", "11");
    let out = common::lode(&["generate", "--device", "cpu", "-m", &plain, "-p", "hi", "-n", "4", "--spec-type", "draft-mtp"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("multi-token-prediction"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn fit_and_inspect_know_the_block() {
    let dir = std::env::temp_dir().join(format!("lode-mtp-fit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = synth(&dir, "qwen35-tiny-mtp", "1");
    let fit = |extra: &[&str]| json_run(&[&["fit", "--device", "cpu", "-m", &p, "-c", "4096", "--json"][..], extra].concat());
    let (plain, ngram, mtp) = (fit(&[]), fit(&["--spec-type", "ngram-simple", "--draft-max", "16"]), fit(&["--spec-type", "draft-mtp"]));
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    // f16 K and V of 2 KV heads × 64 over 4096 positions: one layer is 2 MiB.
    assert_eq!(n(&mtp, "kv_bytes") - n(&plain, "kv_bytes"), 4096 * 2 * 2 * 64 * 2);
    assert!(n(&mtp, "weights_bytes") > n(&plain, "weights_bytes") && n(&mtp, "weight_tensors") == n(&plain, "weight_tensors") + 15);
    assert_eq!((n(&plain, "rewind_log_bytes"), mtp["mtp"].as_bool(), plain["mtp"].as_bool()), (0, Some(true), Some(false)));
    // 3 delta net layers: conv (3 × 512) and state (4 × 64 × 64) checkpoints, 17 rows of
    // qkv (512), beta and alpha (4 each); f32.
    assert_eq!(n(&ngram, "rewind_log_bytes"), 3 * (3 * 512 + 4 * 64 * 64 + 17 * (512 + 8)) * 4);
    let ins = json_run(&["inspect", "--json", &p]);
    assert_eq!(ins["mtp"], serde_json::json!({ "blocks": 1, "first_block": 4, "tensors": 15, "bytes": n(&ins["mtp"], "bytes") }));
    let plain_file = synth(&dir, "qwen35-tiny", "1");
    assert!(json_run(&["inspect", "--json", &plain_file])["mtp"].is_null());
    std::fs::remove_dir_all(&dir).unwrap();
}
