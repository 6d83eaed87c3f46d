//! `lode bench` end to end on SmolLM2 (the smallest real model): llama-bench's JSON
//! fields and markdown rows, repetitions and statistics consistent with the samples,
//! the roofline figure, the A/B pairing, and bad arguments.
//! Skips (with a note) when the model is absent. Timings are only checked for shape
//! (positive, consistent), never for speed.

use std::path::PathBuf;
use std::process::Output;

use serde_json::Value;

mod common;
use common::lode;

fn model() -> Option<PathBuf> {
    common::model(common::SMOL)
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "lode failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn bench_json_rows_follow_llama_bench() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let out = ok(&lode(&[
        "bench", "-m", m, "-p", "16,32", "-n", "4", "-d", "0,8", "-r", "3", "-o", "json", "--threads", "2", "--device",
        "cpu", "--mem-bw", "20",
    ]));
    let rows: Vec<Value> = serde_json::from_str(&out).expect("JSON array");
    let tests: Vec<&str> = rows.iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["pp16", "pp32", "tg4", "pp16 @ d8", "pp32 @ d8", "tg4 @ d8"]);
    let size: u64 = std::fs::metadata(m).unwrap().len();
    for r in &rows {
        for f in ["model_filename", "model_type", "model_size", "model_n_params", "n_batch", "n_threads", "n_prompt",
            "n_gen", "n_depth", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts", "backends"]
        {
            assert!(!r[f].is_null(), "field {f} missing in {r}");
        }
        assert_eq!(r["model_filename"], "SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(r["model_type"].as_str().unwrap().starts_with("llama "), "{}", r["model_type"]);
        assert!(r["model_type"].as_str().unwrap().ends_with("Q4_1"), "{}", r["model_type"]);
        let msize = r["model_size"].as_u64().unwrap();
        assert!(msize < size && msize > size * 9 / 10, "tensor bytes {msize} vs file {size}");
        let params = r["model_n_params"].as_u64().unwrap();
        assert!((130_000_000..140_000_000).contains(&params), "{params}");
        assert_eq!(r["n_threads"], 2);
        assert_eq!(r["backends"], "CPU");
        let (np, ng) = (r["n_prompt"].as_u64().unwrap(), r["n_gen"].as_u64().unwrap());
        assert!((np == 0) != (ng == 0));
        let ns: Vec<f64> = r["samples_ns"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        let ts: Vec<f64> = r["samples_ts"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
        assert_eq!((ns.len(), ts.len()), (3, 3));
        for (n, t) in ns.iter().zip(&ts) {
            assert!(*n > 0.0);
            assert!((t - (np + ng) as f64 * 1e9 / n).abs() / t < 1e-9);
        }
        let mean_ts = ts.iter().sum::<f64>() / 3.0;
        assert!((r["avg_ts"].as_f64().unwrap() - mean_ts).abs() / mean_ts < 1e-9);
        let mean_ns = ns.iter().sum::<f64>() / 3.0;
        assert!((r["avg_ns"].as_f64().unwrap() - mean_ns).abs() <= 1.0);
        // Roofline only on decode rows: weight bytes per token × t/s ÷ 20 GB/s.
        if ng > 0 {
            let wb = r["weight_bytes_per_token"].as_f64().unwrap();
            assert!(wb > 0.8 * msize as f64 && wb <= msize as f64, "weight bytes per token {wb} vs {msize}");
            let want = wb * r["avg_ts"].as_f64().unwrap() / 20e9;
            assert!((r["roofline_frac"].as_f64().unwrap() - want).abs() < 1e-9);
        } else {
            assert!(r["roofline_frac"].is_null());
        }
    }
}

#[test]
fn bench_markdown_table() {
    let Some(m) = model() else { return };
    let out = ok(&lode(&["bench", "-m", m.to_str().unwrap(), "-p", "8", "-n", "2", "-r", "1", "--threads", "2", "--device", "cpu"]));
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for h in ["model", "size", "params", "backend", "threads", "test", "t/s"] {
        assert!(lines[0].contains(h), "{}", lines[0]);
    }
    assert!(lines[2].contains("| pp8 |") || lines[2].contains(" pp8 |"), "{out}");
    assert!(lines[3].contains(" tg2 |") && lines[3].contains(" ± ") && lines[3].contains("MiB"), "{out}");
}

#[test]
fn bench_pairs_two_configurations() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    let out = ok(&lode(&[
        "bench", "-m", m, "-p", "8", "-n", "2", "-r", "2", "-o", "json", "--threads", "1", "--device", "cpu",
        "--pair-arg", "--kv-type f32", "--pair-arg", "--kv-type f16 --threads 2",
    ]));
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["a"]["config"], "--kv-type f32");
    let (a, b) = (&v["a"]["rows"], &v["b"]["rows"]);
    assert_eq!(a[0]["type_k"], "f32");
    assert_eq!(b[0]["type_k"], "f16");
    assert_eq!(a[0]["n_threads"], 1);
    assert_eq!(b[0]["n_threads"], 2, "B's extra --threads overrides the base one");
    for side in [a, b] {
        for r in side.as_array().unwrap() {
            assert_eq!(r["samples_ns"].as_array().unwrap().len(), 2, "one sample per child run");
        }
    }
    let ratios = v["ratios"].as_array().unwrap();
    assert_eq!(ratios.len(), 2);
    for (i, r) in ratios.iter().enumerate() {
        let (ta, tb) = (a[i]["samples_ts"].as_array().unwrap(), b[i]["samples_ts"].as_array().unwrap());
        let d: f64 = (0..2).map(|k| (tb[k].as_f64().unwrap() / ta[k].as_f64().unwrap()).ln()).sum::<f64>() / 2.0;
        assert!((r["ratio_ts"].as_f64().unwrap() - d.exp()).abs() < 1e-9);
        assert!(r["ci95_low"].as_f64().unwrap() <= r["ratio_ts"].as_f64().unwrap());
        assert!(r["ci95_high"].as_f64().unwrap() >= r["ratio_ts"].as_f64().unwrap());
    }

    // Environment pairing: the markdown summary names both sides.
    let out = ok(&lode(&[
        "bench", "-m", m, "-p", "0", "-n", "2", "-r", "2", "--threads", "1", "--device", "cpu", "--pair-env",
        "LODE_BENCH_TEST_VAR=a,b",
    ]));
    assert!(out.contains("A: LODE_BENCH_TEST_VAR=a") && out.contains("B: LODE_BENCH_TEST_VAR=b"), "{out}");
    assert!(out.contains("| tg2 |"), "{out}");
}

#[test]
fn bench_bad_arguments_are_clear_errors() {
    let Some(m) = model() else { return };
    let m = m.to_str().unwrap();
    // (-p/-n lists accumulate like llama-bench's, so each case gives its own.)
    let cases: [(&[&str], &str); 5] = [
        (&["-p", "4", "-n", "1", "-r", "0"], "at least one repetition"),
        (&["-p", "4", "-n", "1", "-o", "xml"], "unknown output format"),
        (&["-p", "0", "-n", "0"], "nothing to measure"),
        (&["-p", "4", "-n", "1", "--pair-arg", "--threads 1"], "exactly twice"),
        (&["-p", "4", "-n", "1", "--pair-env", "NOVALUES"], "NAME=A,B"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["bench", "-m", m, "--device", "cpu", "-r", "1"];
        args.extend_from_slice(extra);
        let out = lode(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(needle), "{extra:?}: {err}");
    }
}
