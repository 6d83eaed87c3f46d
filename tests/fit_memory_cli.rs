//! `lode fit` and the residency flags end to end on SmolLM2 (CPU): fit's numbers add up
//! from the file's tensors and the architecture, its largest context is consistent with
//! its verdict; `--residency upload --memory-report` reports one copy per tensor and no
//! duplicates; a too-small `--weight-budget` is a clear error naming a weight.
//! Skips (with a note) when the model is absent.

use std::path::PathBuf;

use serde_json::Value;

mod common;
use common::lode;

fn model() -> Option<PathBuf> {
    common::model(common::SMOL)
}

#[test]
fn fit_adds_up() {
    let Some(m) = model() else { return };
    let out = lode(&["fit", "-m", m.to_str().unwrap(), "--ctx", "1000", "--device", "cpu", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let u = |k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {j}"));
    // SmolLM2-135M: 30 layers, 3 KV heads of 64 (K and V), f16.
    assert_eq!(u("kv_bytes_per_token"), 30 * 3 * (64 + 64) * 2);
    assert_eq!(u("kv_bytes"), 1000 * u("kv_bytes_per_token"));
    let per: u64 = j["weights_per_layout"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(per, u("weights_bytes"));
    // Every tensor is read (the embedding is tied), so the weights are the file's tensor bytes.
    let size = std::fs::metadata(&m).unwrap().len();
    assert!(u("weights_bytes") < size && u("weights_bytes") > size * 9 / 10, "{j}");
    assert_eq!(u("need_bytes"), u("weights_bytes") + u("kv_bytes") + u("scratch_bytes"));
    assert_eq!(j["fits"].as_bool().unwrap(), u("need_bytes") <= u("free_bytes"));
    assert_eq!(j["fits"].as_bool().unwrap(), u("max_ctx") >= 1000);
    // `--parallel 3` (a server's slots): --ctx the total, three KV caches of a third of it.
    let out = lode(&["fit", "-m", m.to_str().unwrap(), "--ctx", "3000", "--device", "cpu", "--json", "--parallel", "3"]);
    let j3: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j3["kv_bytes"].as_u64(), Some(3 * u("kv_bytes")), "{j3}");
    assert_eq!(j3["weights_bytes"].as_u64(), Some(u("weights_bytes")));
    assert_eq!((j3["ctx"].as_u64(), j3["ctx_per_sequence"].as_u64()), (Some(3000), Some(1000)), "{j3}");
    // Without -c, the training context (8192) split four ways, as lode serve sizes its
    // slots; fewer tokens than slots is an error naming the flags.
    let out = lode(&["fit", "-m", m.to_str().unwrap(), "--device", "cpu", "--json", "--parallel", "4"]);
    let j4: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((j4["ctx"].as_u64(), j4["ctx_per_sequence"].as_u64()), (Some(8192), Some(2048)), "{j4}");
    assert_eq!(j4["max_ctx"].as_u64().unwrap(), 4 * j4["max_ctx_per_sequence"].as_u64().unwrap());
    let out = lode(&["fit", "-m", m.to_str().unwrap(), "--device", "cpu", "-c", "3", "--parallel", "4"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--ctx-size 3") && err.contains("--parallel 4"), "{err}");
}

#[test]
fn memory_report_and_budget_through_the_cli() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let out = lode(&["bench", "-m", m, "-p", "8", "-n", "2", "-r", "1", "--device", "cpu", "-t", "2", "-o", "json", "--residency", "upload", "--memory-report"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("{\"memory_report\"")).unwrap_or_else(|| panic!("no report in:\n{err}"));
    let r: Value = serde_json::from_str(line).unwrap();
    let r = &r["memory_report"];
    assert_eq!(r["residency"], "upload");
    assert_eq!(r["copies"].as_u64(), Some(272), "{r}"); // SmolLM2's 272 tensors, tied embedding read twice, copied once
    assert_eq!(r["duplicates"].as_u64(), Some(0));
    assert_eq!(r["misses"].as_u64(), Some(272));
    assert!(err.contains("weights: 272 copies"), "bench prints copies beside the speed:\n{err}");

    let out = lode(&["bench", "-m", m, "-p", "8", "-n", "0", "-r", "1", "--device", "cpu", "-t", "2", "--residency", "device", "--weight-budget", "10MiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("weight budget") && err.contains("10.00 MiB (10485760 bytes)") && err.contains("weight `"), "{err}");
}

/// `lode fit` caps its largest context at the trained one (and says so); under
/// `--device-memory` a context that does not fit makes it exit non-zero naming the
/// largest that does, and `generate` refuses the same run before loading anything while
/// the named context runs.
#[test]
fn device_memory_caps_fit_and_generate() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let fit = |extra: &[&str]| {
        let mut a = vec!["fit", "-m", m, "--device", "cpu", "--json"];
        a.extend_from_slice(extra);
        let out = lode(&a);
        let j: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.success(), j, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (ok, j, _) = fit(&[]);
    let u = |j: &Value, k: &str| j[k].as_u64().unwrap_or_else(|| panic!("{k} missing: {j}"));
    assert!(ok);
    assert!(u(&j, "max_ctx_memory") > u(&j, "n_ctx_train"), "this machine holds more than the trained context: {j}");
    assert_eq!(u(&j, "max_ctx"), u(&j, "n_ctx_train"));
    // The table says so too.
    let out = lode(&["fit", "-m", m, "--device", "cpu"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // (The free memory, and so the context memory alone allows, moves between two runs.)
    let want = format!("fits: yes; the largest context that fits is {} (capped at the model's training context; memory alone would allow ", u(&j, "n_ctx_train"));
    let i = text.find(&want).unwrap_or_else(|| panic!("no `{want}` in:\n{text}"));
    let allowed: u64 = text[i + want.len()..].split(')').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(allowed > u(&j, "n_ctx_train"), "{text}");

    // A device of the weights + scratch + 2,000 tokens of KV.
    let cap = u(&j, "need_bytes") - u(&j, "kv_bytes") + 2000 * u(&j, "kv_bytes_per_token");
    let cap_arg = cap.to_string();
    let (ok, j, err) = fit(&["--device-memory", &cap_arg, "--ctx", "4096"]);
    assert!(!ok, "4096 tokens do not fit: {j}");
    assert_eq!(u(&j, "total_bytes"), cap);
    assert_eq!(u(&j, "device_memory_cap_bytes"), cap);
    assert!((1990..=2000).contains(&u(&j, "max_ctx")), "{j}");
    assert!(err.contains(&format!("-c {}", u(&j, "max_ctx"))), "{err}");
    // The table's verdict, and the same exit status.
    let out = lode(&["fit", "-m", m, "--device", "cpu", "--device-memory", &cap_arg, "--ctx", "4096"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "exit status 0 for a model that does not fit:\n{text}");
    assert_eq!(out.status.code(), Some(1));
    assert!(text.contains("fits: no (") && text.contains(&format!("the largest context that fits is {}", u(&j, "max_ctx"))), "{text}");

    let gen = |ctx: &str| lode(&["generate", "-m", m, "--device", "cpu", "-t", "2", "--device-memory", &cap_arg, "-c", ctx, "-p", "Hello", "-n", "4", "--temp", "0"]);
    let out = gen("4096");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("does not fit") && err.contains(&format!("-c {}", u(&j, "max_ctx"))), "{err}");
    let out = gen(&u(&j, "max_ctx").to_string());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
