//! `lode quantize` through the real binary on SmolLM2 (skipped when absent): llama.cpp's
//! Q3_K_M mix (its per-tensor rules and substitutes for rows that are not whole
//! super-blocks), `--pure`, the IQ3_S mix, and the IQ2_XXS mix from an importance matrix;
//! the results run on the CPU, and the GPU plan reads their weights with their own kernels.
//! `ci/llama_mix_ref.sh` compares the files with llama-quantize's byte for byte.

use std::process::Command;

mod common;
use common::{lode, model, SMOL};

/// (type, count) of the file's tensors, by type name.
fn totals(path: &str) -> Vec<(String, u64)> {
    let v: serde_json::Value = serde_json::from_slice(&lode(&["inspect", "--json", path]).stdout).unwrap();
    let mut t: Vec<(String, u64)> =
        v["totals"].as_array().unwrap().iter().map(|t| (t["type"].as_str().unwrap().to_string(), t["count"].as_u64().unwrap())).collect();
    t.sort();
    t
}

#[test]
fn smollm2_to_q3_k_runs_on_the_cpu_and_has_a_gpu_plan() {
    let Some(src) = model(SMOL) else { return };
    let dir = std::env::temp_dir().join(format!("lode-quantize-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("smol-q3_k.gguf");
    let (src, outp) = (src.to_str().unwrap(), out.to_str().unwrap());
    // Q3_K is llama-quantize's alias of Q3_K_M. SmolLM2 (30 layers, width 576, 3 query
    // heads per KV head): attn_v Q5_K in layers 0-1 and Q4_K after, attn_output Q4_K,
    // attn_q/k and ffn_gate/up Q3_K, all of them on 576-wide rows, so Q5_1 / Q5_0 / Q4_0;
    // ffn_down (rows of 1536) Q5_K in layer 0 (< 30/16), Q4_K after; the tied head Q8_0.
    let r = lode(&["quantize", src, outp, "Q3_K"]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(r.status.success(), "{err}");
    assert!(err.contains("already quantized") && err.contains("substitute"), "{err}");
    let want = [("F32", 61), ("Q4_0", 120), ("Q4_K", 29), ("Q5_0", 58), ("Q5_1", 2), ("Q5_K", 1), ("Q8_0", 1)];
    assert_eq!(totals(outp), want.map(|(t, n)| (t.to_string(), n)).to_vec());

    // Greedy: the default temperature samples, and this requantized file is not sure of Paris.
    let g = lode(&["generate", "-m", outp, "--device", "cpu", "-p", "The capital of France is", "-n", "8", "--temp", "0"]);
    let text = String::from_utf8_lossy(&g.stdout);
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    assert!(text.contains("Paris"), "{text}");

    // --pure: every matrix Q3_K where its rows allow, llama.cpp's Q4_0 substitute elsewhere.
    let r = lode(&["quantize", src, outp, "Q3_K", "--pure"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    assert_eq!(totals(outp), [("F32", 61), ("Q3_K", 30), ("Q4_0", 181)].map(|(t, n)| (t.to_string(), n)).to_vec());
    let p = Command::new(env!("CARGO_BIN_EXE_lode")).args(["inspect", "--plan", outp]).output().unwrap();
    let (plan, err) = (String::from_utf8_lossy(&p.stdout), String::from_utf8_lossy(&p.stderr));
    assert!(p.status.success(), "{err}");
    for kernel in ["dequant_f16_q3_k + vendor BLAS", "matvec_multi4_n1"] {
        assert!(plan.contains(kernel), "{kernel} not in\n{plan}");
    }
    // Decode's Q3_K ffn_down: the fused kernel that quantizes its input and adds the residual.
    let down = plan.lines().find(|l| l.contains("ffn_down.weight Q3_K") && l.contains("1 tok")).unwrap_or_else(|| panic!("no decode ffn_down in\n{plan}"));
    assert!(down.contains("decode_mv_quant") && down.contains("residual"), "{down}");

    let bad = lode(&["quantize", src, outp, "IQ2_XXS"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("needs an importance matrix") && err.contains("--imatrix"), "{err}");
    let bad = lode(&["quantize", src, outp, "Q9_K"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("unknown quantization type `Q9_K`") && err.contains("Q4_K_M"), "{err}");
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
    assert_eq!(totals(outp), [("F32", 61), ("IQ3_S", 30), ("IQ4_NL", 180), ("Q8_0", 1)].map(|(t, n)| (t.to_string(), n)).to_vec());

    let r = lode(&["quantize", outp, twinp, "F32"]);
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

/// `--imatrix`: an importance matrix in llama-imatrix's GGUF form (`<tensor>.in_sum2`,
/// `<tensor>.counts`, the `imatrix.*` keys), here the squares of a made-up activation
/// profile, makes the IQ2_XXS mix possible: SmolLM2's ffn_down (rows of 1536) IQ2_XXS from
/// layer 3 on (Q2_K in the first 30/8), the 576-wide matrices IQ4_NL (Q4_0 for attn_v's
/// Q2_K), the head Q8_0; the file records the matrix's keys, runs on the CPU, and an
/// entry of the wrong length is refused.
#[test]
fn smollm2_to_iq2_xxs_with_an_imatrix() {
    use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue, ValueType};
    use lode_runtime::quant::GgmlType;
    let Some(src) = model(SMOL) else { return };
    let dir = std::env::temp_dir().join(format!("lode-quantize-imatrix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = GgufFile::open(&src).unwrap();
    let write = |path: &std::path::Path, short: bool| {
        let mut w = GgufWriter::new();
        w.add_kv("imatrix.datasets", MetaValue::Array(ValueType::String, vec![MetaValue::String("made-up".into())]));
        w.add_kv("imatrix.chunk_count", MetaValue::U32(3));
        w.add_kv("imatrix.chunk_size", MetaValue::U32(512));
        for t in f.tensors().iter().filter(|t| t.name.starts_with("blk.") && t.dims.len() == 2) {
            let n = if short { t.dims[0] as usize - 1 } else { t.dims[0] as usize };
            let sums: Vec<u8> = (0..n).flat_map(|i| (1536.0f32 * (1.0 + (i % 7) as f32)).to_le_bytes()).collect();
            w.add_tensor(format!("{}.in_sum2", t.name), GgmlType::F32, &[n as u64, 1], sums);
            w.add_tensor(format!("{}.counts", t.name), GgmlType::F32, &[1, 1], 1536.0f32.to_le_bytes().to_vec());
        }
        w.write_to(path).unwrap();
    };
    let (im, bad_im, out) = (dir.join("imatrix.gguf"), dir.join("short.gguf"), dir.join("smol-iq2_xxs.gguf"));
    write(&im, false);
    write(&bad_im, true);
    let (srcp, outp) = (src.to_str().unwrap(), out.to_str().unwrap());
    let r = lode(&["quantize", "--imatrix", im.to_str().unwrap(), srcp, outp, "IQ2_XXS"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let want = [("F32", 61), ("IQ2_XXS", 27), ("IQ4_NL", 150), ("Q2_K", 3), ("Q4_0", 30), ("Q8_0", 1)];
    assert_eq!(totals(outp), want.map(|(t, n)| (t.to_string(), n)).to_vec());
    let q = GgufFile::open(&out).unwrap();
    assert_eq!(q.get_str("quantize.imatrix.dataset").unwrap(), Some("made-up"));
    assert_eq!(q.get_u64("quantize.imatrix.entries_count").unwrap(), Some(210));
    assert_eq!(q.get_u64("general.file_type").unwrap(), Some(19));
    let g = lode(&["generate", "-m", outp, "--device", "cpu", "-p", "The capital of France is", "-n", "4"]);
    assert!(g.status.success(), "{}", String::from_utf8_lossy(&g.stderr));
    let bad = lode(&["quantize", "--imatrix", bad_im.to_str().unwrap(), srcp, outp, "IQ2_XXS"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("has 575 values, the tensor needs 576"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}
