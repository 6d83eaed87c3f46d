//! `lode perplexity` on the two real models against llama-perplexity's fixtures
//! (`perplexity.json`: PPL over `alice29.txt` at context 512 with the running PPL after
//! every chunk), the save-logits / KL-divergence round trip, and its errors.
//! Skips (with a note) when the models or fixtures are absent.
//!
//! The full text is 77 chunks; CI has two cores, so each model runs the first
//! `LODE_PPL_CHUNKS` chunks (default 8) and is compared with llama.cpp's running PPL
//! after the same chunk. Set `LODE_PPL_CHUNKS=77` for the whole text.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn fixtures_dir() -> Option<PathBuf> {
    let candidates = match std::env::var_os("LODE_FIXTURES_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => vec![
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/fixtures")),
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")),
        ],
    };
    candidates.into_iter().find(|d| d.is_dir())
}

mod common;
use common::{lode, models_dir};

/// (model file, fixture folder) or `None` with a note.
fn find(name: &str, file: &str) -> Option<(PathBuf, PathBuf)> {
    let Some(fx) = fixtures_dir() else {
        eprintln!("SKIP {name}: fixtures not found (set LODE_FIXTURES_DIR)");
        return None;
    };
    let (m, f) = (models_dir().join(file), fx.join(name));
    if !m.exists() || !f.exists() {
        eprintln!("SKIP {name}: need {} and {}", m.display(), f.display());
        return None;
    }
    Some((m, f))
}

fn chunks() -> usize {
    std::env::var("LODE_PPL_CHUNKS").ok().and_then(|s| s.parse().ok()).unwrap_or(8)
}

/// The running PPL values `[1]x,[2]y,...` and the final estimate of a run's stdout.
fn parse_ppl(stdout: &str) -> (Vec<f64>, f64, f64) {
    let line = stdout.lines().find(|l| l.starts_with("[1]")).expect("running PPL line");
    let running: Vec<f64> = line
        .split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.split(']').nth(1).expect("[i]x").parse().expect("number"))
        .collect();
    let fin = stdout.lines().find(|l| l.starts_with("Final estimate: PPL = ")).expect("final line");
    let rest = fin.trim_start_matches("Final estimate: PPL = ");
    let (p, e) = rest.split_once(" +/- ").expect("x +/- y");
    (running, p.parse().unwrap(), e.parse().unwrap())
}

/// The number after `label` (up to whitespace) in the comparison block.
fn stat(stdout: &str, label: &str) -> f64 {
    let l = stdout.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no `{label}` line in:\n{stdout}"));
    l.split(':').nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

fn check_model(name: &str, file: &str) {
    let Some((model, fx)) = find(name, file) else { return };
    let text = fx.join("alice29.txt");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(fx.join("perplexity.json")).unwrap()).unwrap();
    let n_ref = reference["running_ppl"].as_array().unwrap().len();
    let n = chunks().min(n_ref);
    let tmp = std::env::temp_dir().join(format!("lode-ppl-{name}-{}.bin", std::process::id()));
    let (m, t, l) = (model.to_str().unwrap(), text.to_str().unwrap(), tmp.to_str().unwrap());
    let nc = n.to_string();
    let out = lode(&["perplexity", "-m", m, "-f", t, "--ctx", "512", "--chunks", &nc, "--threads", "2", "--device", "cpu", "--save-logits", l]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lode perplexity failed:\n{stderr}");
    // Same tokenization as llama-perplexity: the token count of the whole text.
    let n_tokens = reference["n_tokens"].as_u64().unwrap();
    assert!(stderr.contains(&format!(": {n_tokens} tokens")), "token count differs from llama.cpp's {n_tokens}:\n{stderr}");

    let (running, ppl, err) = parse_ppl(&stdout);
    assert_eq!(running.len(), n);
    let want = reference["running_ppl"][n - 1].as_f64().unwrap();
    let rel = (ppl - want).abs() / want;
    eprintln!("{name}: PPL over {n} chunks {ppl:.4} ± {err:.4}, llama.cpp {want:.4} ({:+.3} %)", (ppl / want - 1.0) * 100.0);
    assert!(rel <= 0.005, "{name}: PPL {ppl} vs llama.cpp {want} after {n} chunks: {:.3} % apart (> 0.5 %)", rel * 100.0);
    assert!((running[n - 1] - ppl).abs() < 1e-3);
    for (i, r) in running.iter().enumerate() {
        let w = reference["running_ppl"][i].as_f64().unwrap();
        assert!((r - w).abs() / w < 0.02, "{name}: running PPL after chunk {} is {r}, llama.cpp {w}", i + 1);
    }
    if n == n_ref {
        let full = reference["ppl"].as_f64().unwrap();
        assert!((ppl - full).abs() / full <= 0.005, "{name}: final PPL {ppl} vs {full}");
        let se = reference["ppl_stderr"].as_f64().unwrap();
        assert!((err - se).abs() / se < 0.05, "{name}: PPL error {err} vs llama.cpp's {se}");
    }

    // Compared with itself (first two chunks of the saved run): KLD 0, same top-1 100 %.
    let out = lode(&["perplexity", "-m", m, "-f", t, "--ctx", "512", "--chunks", "2", "--threads", "2", "--device", "cpu", "--kl-divergence-base", l]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "KLD run failed:\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stat(&stdout, "Mean KLD"), 0.0, "{stdout}");
    assert_eq!(stat(&stdout, "Maximum KLD"), 0.0, "{stdout}");
    assert_eq!(stat(&stdout, "Same top-1"), 100.0, "{stdout}");
    assert_eq!(stat(&stdout, "PPL ratio"), 1.0, "{stdout}");
    assert!((stat(&stdout, "Mean PPL(base)") - running[1]).abs() < 1e-3, "{stdout}");

    // The same comparison with f32 KV: a real, small divergence (the KLD is not a constant).
    let out = lode(&["perplexity", "-m", m, "-f", t, "--ctx", "512", "--chunks", "1", "--threads", "2", "--device", "cpu", "--kv-type", "f32", "--kl-divergence-base", l]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "f32 KLD run failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let kld = stat(&stdout, "Mean KLD");
    eprintln!("{name}: KLD f32 KV vs f16 KV over one chunk: {kld}, same top-1 {} %", stat(&stdout, "Same top-1"));
    assert!(kld > 0.0 && kld < 0.01, "{stdout}");
    let _ = std::fs::remove_file(&tmp);
}

#[test]
fn perplexity_gemma3_matches_llama_cpp() {
    check_model("gemma3-270m", "gemma-3-270m-q4_k_m.gguf");
}

#[test]
fn perplexity_smollm2_matches_llama_cpp() {
    check_model("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf");
}

fn assert_fails(args: &[&str], needle: &str) {
    let out = lode(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure for {args:?}");
    assert!(err.contains(needle), "stderr of {args:?} lacks `{needle}`:\n{err}");
}

#[test]
fn perplexity_bad_input_is_a_clear_error() {
    let Some((model, fx)) = find("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let m = model.to_str().unwrap();
    let dir = std::env::temp_dir().join(format!("lode-ppl-err-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let short = dir.join("short.txt");
    std::fs::write(&short, "Only a few words here.\n").unwrap();
    let junk = dir.join("junk.bin");
    std::fs::write(&junk, vec![7u8; 100]).unwrap();
    let text = fx.join("alice29.txt");
    let p = |x: &Path| x.to_str().unwrap().to_string();
    assert_fails(&["perplexity", "-m", m, "-f", "/nonexistent/text.txt", "--device", "cpu"], "cannot read text file");
    assert_fails(&["perplexity", "-m", m, "-f", &p(&short), "--device", "cpu"], "needs at least 1024");
    assert_fails(&["perplexity", "-m", m, "-f", &p(&text), "--device", "cpu", "--ctx", "2"], "too small");
    assert_fails(&["perplexity", "-m", m, "-f", &p(&text), "--device", "cpu", "--chunks", "0"], "nothing to evaluate");
    assert_fails(
        &["perplexity", "-m", m, "-f", &p(&text), "--device", "cpu", "--kl-divergence-base", &p(&junk)],
        "not a lode logits file",
    );
    assert_fails(&["perplexity", "-m", "/nonexistent/model.gguf", "-f", &p(&text), "--device", "cpu"], "cannot load model");
    let _ = std::fs::remove_dir_all(&dir);
}
