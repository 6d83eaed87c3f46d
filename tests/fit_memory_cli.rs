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
