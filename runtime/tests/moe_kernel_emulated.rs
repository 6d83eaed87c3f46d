//! `kernels-hip/moe.hip`'s routing (`moe_route`: softmax then top-k, or gpt-oss's router
//! bias and top-k then softmax), gpt-oss's expert activation (`moe_swiglu_oai`: the
//! expert's gate/up bias rows and the clamped SwiGLU) and the weighted sum with the down
//! bias (`moe_wsum`) run on the host: g++ compiles the source with `ci/kernel-emu/common.h`
//! in place of the device header and `moe_mv_stub.h` in place of the matvec dots, and
//! `ci/kernel-emu/moe_check.cpp` compares them with a transcription of the CPU's
//! arithmetic (`backend/moe.rs`, `cpu/moe.rs`). This checks their indexing and arithmetic
//! where no GPU is (CI); `lode selftest`'s `moe_ffn_*` checks them on the device.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, args: &[&str]) -> (usize, f64) {
    let out = Command::new(dir.join("moe_check")).args(args).output().expect("run moe_check");
    assert!(out.status.success(), "moe_check {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} line in:\n{text}")).trim().to_string();
    (field("IDS ").parse().unwrap_or(usize::MAX), field("MAX ").parse().unwrap_or(f64::INFINITY))
}

#[test]
fn moe_routing_and_gpt_oss_activation_match_the_cpu_on_the_host() {
    if Command::new("g++").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP: g++ not found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("lode-moe-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let files = [("ci/kernel-emu/common.h", "common.h"), ("ci/kernel-emu/moe_check.cpp", "moe_check.cpp"), ("ci/kernel-emu/moe_mv_stub.h", "mv_dot.h"), ("kernels-hip/moe.hip", "moe.hip")];
    for (from, to) in files {
        std::fs::copy(root.join(from), dir.join(to)).unwrap();
    }
    for empty in ["mv_dot_b32.h", "dequant_low.h", "mv_dot_low.h"] {
        std::fs::write(dir.join(empty), "").unwrap();
    }
    let st = Command::new("g++").current_dir(&dir).args(["-O2", "-std=c++20", "-pthread", "-w", "-x", "c++", "moe_check.cpp", "-o", "moe_check"]).status().unwrap();
    assert!(st.success(), "g++ failed on the emulated moe kernels");
    // (tokens, experts, used, f, n_embd, softmax-weight gating, biases, renormalised,
    // grouped rows): gpt-oss's 32 of 4 decoding and in a chunk (pair order and grouped),
    // without biases; qwen3moe's softmax then top-k with renormalisation, 8 to 128 experts.
    let cases: [[&str; 9]; 6] = [
        ["1", "32", "4", "320", "576", "1", "1", "0", "0"],
        ["7", "32", "4", "64", "96", "1", "1", "0", "1"],
        ["3", "32", "4", "32", "40", "1", "0", "0", "1"],
        ["5", "8", "2", "32", "40", "0", "0", "1", "0"],
        ["9", "128", "8", "32", "40", "0", "0", "1", "1"],
        ["4", "40", "4", "32", "300", "1", "1", "1", "1"],
    ];
    for c in cases {
        let (ids, e) = run(&dir, &c);
        assert!(ids == 0 && e <= 1e-5, "moe kernels {c:?}: {ids} selections differ, max relative error {e:.3e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
