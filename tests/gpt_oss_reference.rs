//! gpt-oss against an independent reference: `lode synth --preset gpt-oss-tiny --quant
//! mxfp4_moe` (2 layers, the first with a 16-token window; 8 experts, 4 used; MXFP4
//! experts, Q8_0 attention and head), then a NumPy forward pass over gguf-py 0.19.0's
//! dequantized tensors (`tests/data/gpt_oss_reference.py`, which does not call lode)
//! and lode's CPU logits at every position of a 64-token sequence, as one prefill chunk
//! and as 64 one-token decode steps.
//!
//! Tolerance (logits of order 1): at every position max |lode − reference| ≤ 2e-2, and
//! at no fewer than 3/4 of the positions ≤ 1e-4, as the qwen3moe test: the reference
//! rounds activations to Q8_0 as the CPU does, so most positions agree to ~1e-6; where
//! a 1e-7 difference lands an activation on the other side of a Q8_0 rounding boundary
//! (the FFN norm's ×20 inputs make this likelier) a position moves by up to ~1e-2.
//! The same reference with the attention sinks, `swiglu_oai`'s clamp, the attention,
//! router or expert biases, YaRN or the window left out must fail these bounds (checked
//! here on each run), so the test sees each of them.
//!
//! Needs python3 with `gguf==0.19.0` and numpy (CI installs them: `.ci/run`).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::KvType;
use lode_runtime::engine::{Engine, EngineOptions};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::{Arch, Model};

const N: usize = 64;
/// Bound at every position.
const EVERY: f32 = 2e-2;
/// Bound at 3/4 of the positions.
const MOST: f32 = 1e-4;
/// The reference's ablations (`ABLATIONS` in the script): lode must match none of them.
const ABLATIONS: [&str; 7] = ["no-sinks", "no-clamp", "no-attn-bias", "no-router-bias", "no-expert-bias", "no-yarn", "no-window"];

fn lode(args: &[&str]) {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).args(args).output().unwrap();
    assert!(out.status.success(), "lode {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path).unwrap().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn reference(model: &Path, ids: &[u32], out: &Path) -> Vec<f32> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt_oss_reference.py");
    let ids: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    let r = Command::new("python3").arg(&script).arg(model).arg(ids.join(",")).arg(out).args(ABLATIONS).output();
    let r = r.expect("python3 must be installed for this test (python3 -m pip install gguf==0.19.0 numpy)");
    assert!(
        r.status.success(),
        "the NumPy reference failed (needs python3 -m pip install gguf==0.19.0 numpy): {}",
        String::from_utf8_lossy(&r.stderr)
    );
    eprintln!("reference: {}", String::from_utf8_lossy(&r.stdout).trim());
    read_f32(out)
}

/// Per position, the largest |Δ| (NaN counts as infinite).
fn diffs(got: &[Vec<f32>], want: &[f32], n_vocab: usize) -> Vec<f32> {
    assert_eq!(got.len(), N, "positions");
    got.iter()
        .enumerate()
        .map(|(p, row)| {
            assert_eq!(row.len(), n_vocab);
            let w = &want[p * n_vocab..(p + 1) * n_vocab];
            row.iter().zip(w).map(|(&a, &b)| if (a - b).is_nan() { f32::INFINITY } else { (a - b).abs() }).fold(0f32, f32::max)
        })
        .collect()
}

/// Whether the per-position differences are within both bounds.
fn within(d: &[f32]) -> bool {
    d.iter().all(|&x| x <= EVERY) && 4 * d.iter().filter(|&&x| x <= MOST).count() >= 3 * N
}

fn report(what: &str, d: &[f32]) -> String {
    let close = d.iter().filter(|&&x| x <= MOST).count();
    format!("{what}: max |lode - reference| = {:.2e}; {close} of {N} positions within {MOST:e}", d.iter().fold(0f32, |m, &x| m.max(x)))
}

#[test]
fn gpt_oss_tiny_matches_a_numpy_forward_pass() {
    let dir = std::env::temp_dir().join(format!("lode-gpt-oss-ref-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt-oss-tiny.gguf");
    lode(&["synth", "--preset", "gpt-oss-tiny", "--quant", "mxfp4_moe", "-o", path.to_str().unwrap(), "--seed", "3"]);
    // Ids spread over the vocabulary, below the special tokens.
    let ids: Vec<u32> = (0..N as u64).map(|i| ((i * 2654435761) >> 7) as u32 % 199998).collect();
    let out = dir.join("ref.f32");
    let want = reference(&path, &ids, &out);

    let file = Arc::new(GgufFile::open(&path).unwrap());
    let engine = || {
        let m = Model::load(file.clone()).unwrap();
        let opts = EngineOptions { ctx_size: Some(2 * N), batch_size: N, kv_type: KvType::F32.into(), swa_full: false };
        Engine::new(m, Box::new(CpuBackend::new(2).unwrap()), opts).unwrap()
    };
    let mut e = engine();
    let c = &e.model().cfg;
    assert_eq!(c.arch, Arch::GptOss);
    let x = c.experts.expect("gpt-oss has experts");
    assert_eq!((x.n_expert, x.n_used, x.n_ff), (8, 4, 256));
    assert_eq!((c.swa_layers.as_slice(), c.n_swa), (&[true, false][..], 16));
    assert!(c.yarn.is_some() && (c.rope_freq_scale - 1.0 / 32.0).abs() < 1e-9, "{c:?}");
    let n_vocab = c.n_vocab;
    assert_eq!(want.len(), N * n_vocab);

    // One prefill chunk of 64 rows.
    let mut chunk = vec![Vec::new(); N];
    e.eval_all(&ids, &mut |i, l| chunk[i] = l.to_vec()).unwrap();
    let d = diffs(&chunk, &want, n_vocab);
    eprintln!("{}", report("prefill", &d));
    assert!(within(&d), "{}: {d:?}", report("prefill", &d));
    assert!(d.iter().any(|&x| x > 0.0), "bit-equal to a float64 reference would be suspicious");
    // One token at a time (the decode path).
    let mut e = engine();
    let steps: Vec<Vec<f32>> = ids.iter().map(|&t| e.eval(&[t]).unwrap()).collect();
    let d = diffs(&steps, &want, n_vocab);
    eprintln!("{}", report("decode", &d));
    assert!(within(&d), "{}: {d:?}", report("decode", &d));

    // The reference without any one part is far from lode: each part counts.
    for a in ABLATIONS {
        let other = read_f32(&dir.join(format!("ref.f32.{a}")));
        let d = diffs(&chunk, &other, n_vocab);
        eprintln!("{}", report(a, &d));
        assert!(!within(&d), "lode's logits also match the reference {a}: {}", report(a, &d));
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn lode_out(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).args(args).output().unwrap();
    assert!(out.status.success(), "lode {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The CLI on a gpt-oss file: `--residency upload --memory-report` makes one copy per
/// tensor (41 = 19 per layer and 3: biases and sinks included), no duplicates; the
/// harmony tokens tokenize at their ids, the message-structure ones always (llama.cpp
/// makes them USER_DEFINED), `<|return|>` only with `--parse-special`.
#[test]
fn gpt_oss_tiny_through_the_cli() {
    let dir = std::env::temp_dir().join(format!("lode-gpt-oss-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("gpt-oss-tiny.gguf");
    let p = path.to_str().unwrap();
    lode(&["synth", "--preset", "gpt-oss-tiny", "--quant", "mxfp4_moe", "-o", p, "--seed", "5"]);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 41);

    let err = lode_out(&["bench", "-m", p, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu", "-t", "2", "-o", "json", "--residency", "upload", "--memory-report"]);
    let line = err.lines().find(|l| l.starts_with("{\"memory_report\"")).unwrap_or_else(|| panic!("no report in:\n{err}"));
    let r: serde_json::Value = serde_json::from_str(line).unwrap();
    let r = &r["memory_report"];
    assert_eq!((r["copies"].as_u64(), r["duplicates"].as_u64()), (Some(41), Some(0)), "{r}");

    let text = "<|start|>user<|message|>Hello<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>";
    let ids = |special: bool| -> Vec<u32> {
        let mut a = vec!["tokenize", "-m", p, "--ids"];
        if special {
            a.push("--parse-special");
        }
        a.push(text);
        lode_out(&a).split_whitespace().filter_map(|s| s.parse().ok()).collect()
    };
    let plain = ids(false);
    assert_eq!(plain[..2], [200006, 117], "{plain:?}");
    for id in [200008, 200007, 200005] {
        assert!(plain.contains(&id), "{id} missing: {plain:?}");
    }
    assert!(!plain.contains(&200002), "{plain:?}");
    let special = ids(true);
    assert_eq!(special.last(), Some(&200002), "{special:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
