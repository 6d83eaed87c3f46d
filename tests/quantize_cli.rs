//! `lode quantize` through the real binary on SmolLM2 (skipped when absent): Q3_K where
//! rows are whole super-blocks, llama.cpp's IQ4_NL substitute elsewhere, the head Q8_0
//! (Q6_K's substitute); the result runs on the CPU, and the GPU plan reads its Q3_K and
//! IQ4_NL weights with their own kernels.

use std::process::Command;

mod common;
use common::{lode, model, SMOL};

#[test]
fn smollm2_to_q3_k_runs_on_the_cpu_and_has_a_gpu_plan() {
    let Some(src) = model(SMOL) else { return };
    let dir = std::env::temp_dir().join(format!("lode-quantize-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smol-q3_k.gguf");
    let (src, outp) = (src.to_str().unwrap(), out.to_str().unwrap());
    let r = lode(&["quantize", src, outp, "Q3_K"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("already quantized") && err.contains("IQ4_NL"), "{err}");

    let v: serde_json::Value = serde_json::from_slice(&lode(&["inspect", "--json", outp]).stdout).unwrap();
    let mut totals: Vec<(String, u64)> =
        v["totals"].as_array().unwrap().iter().map(|t| (t["type"].as_str().unwrap().to_string(), t["count"].as_u64().unwrap())).collect();
    totals.sort();
    let want = [("F32", 61), ("IQ4_NL", 180), ("Q3_K", 30), ("Q8_0", 1)];
    assert_eq!(totals, want.map(|(t, n)| (t.to_string(), n)).to_vec());

    let g = lode(&["generate", "-m", outp, "--device", "cpu", "-p", "The capital of France is", "-n", "8"]);
    let text = String::from_utf8_lossy(&g.stdout);
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    assert!(text.contains("Paris"), "{text}");

    let p = Command::new(env!("CARGO_BIN_EXE_lode")).args(["inspect", "--plan", outp]).output().unwrap();
    let (plan, err) = (String::from_utf8_lossy(&p.stdout), String::from_utf8_lossy(&p.stderr));
    assert!(p.status.success(), "{err}");
    for kernel in ["dequant_f16_q3_k + vendor BLAS", "dequant_f16_iq4_nl + vendor BLAS", "matvec_q3_k", "matvec_iq4_nl", "matvec_multi4_n1"] {
        assert!(plan.contains(kernel), "{kernel} not in\n{plan}");
    }

    let bad = lode(&["quantize", src, outp, "IQ2_XXS"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("cannot quantize to `IQ2_XXS`"), "{err}");
    let same = lode(&["quantize", outp, outp, "Q4_0"]);
    let err = String::from_utf8_lossy(&same.stderr);
    assert!(!same.status.success() && err.contains("is the input file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// IQ3_S (the grid type lode quantizes to, as llama.cpp does without an importance
/// matrix): SmolLM2's `ffn_down` (rows of 1536) become IQ3_S, the rest IQ4_NL; on the CPU
/// its perplexity equals (within the activations' Q8_K rounding) that of its own F32
/// dequantization, the same weights; the GPU plan reads the IQ3_S weights with their
/// matvec and dequantize kernels.
#[test]
fn smollm2_to_iq3_s_runs_on_the_cpu_and_has_a_gpu_plan() {
    let Some(src) = model(SMOL) else { return };
    let dir = std::env::temp_dir().join(format!("lode-quantize-iq3s-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out, twin) = (dir.join("smol-iq3_s.gguf"), dir.join("smol-iq3_s-f32.gguf"));
    let (src, outp, twinp) = (src.to_str().unwrap(), out.to_str().unwrap(), twin.to_str().unwrap());
    let r = lode(&["quantize", src, outp, "IQ3_S"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&lode(&["inspect", "--json", outp]).stdout).unwrap();
    let mut totals: Vec<(String, u64)> =
        v["totals"].as_array().unwrap().iter().map(|t| (t["type"].as_str().unwrap().to_string(), t["count"].as_u64().unwrap())).collect();
    totals.sort();
    assert_eq!(totals, [("F32", 61), ("IQ3_S", 30), ("IQ4_NL", 180), ("Q8_0", 1)].map(|(t, n)| (t.to_string(), n)).to_vec());

    let r = lode(&["quantize", outp, twinp, "F32", "--output-type", "same"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let fx = std::env::var("LODE_FIXTURES_DIR").map(std::path::PathBuf::from).unwrap_or_else(|_| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/fixtures"));
    let text = fx.join("smollm2-135m/alice29.txt");
    if text.exists() {
        let ppl = |m: &str| -> f64 {
            let o = lode(&["perplexity", "-m", m, "-f", text.to_str().unwrap(), "--ctx", "256", "--chunks", "2", "--threads", "2", "--device", "cpu"]);
            let s = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert!(o.status.success(), "{s}");
            let l = s.lines().find(|l| l.starts_with("Final estimate: PPL = ")).unwrap_or_else(|| panic!("{s}"));
            l["Final estimate: PPL = ".len()..].split_whitespace().next().unwrap().parse().unwrap()
        };
        let (a, b) = (ppl(outp), ppl(twinp));
        assert!(a.is_finite() && (a - b).abs() < 0.01 * b, "IQ3_S file PPL {a}, its F32 twin {b}");
    }

    let p = Command::new(env!("CARGO_BIN_EXE_lode")).args(["inspect", "--plan", outp]).output().unwrap();
    let plan = String::from_utf8_lossy(&p.stdout);
    assert!(p.status.success(), "{}", String::from_utf8_lossy(&p.stderr));
    for kernel in ["dequant_f16_iq3_s + vendor BLAS", "matvec_iq3_s"] {
        assert!(plan.contains(kernel), "{kernel} not in\n{plan}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
