//! `kernels-hip/delta.hip` (qwen35's and qwen3next's conv and delta rule kernels) run on the host: g++
//! compiles the source with `ci/kernel-emu/common.h` in place of the device header (one OS
//! thread per GPU thread, real block barriers and warp shuffles) and
//! `ci/kernel-emu/delta_check.cpp` compares two chunks of output and both states with a
//! transcription of `backend/recurrent.rs`. This checks the kernels' indexing and
//! arithmetic where no GPU is (CI); `lode selftest` checks them on the device.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, args: &[&str]) -> f64 {
    let out = Command::new(dir.join("delta_check")).args(args).output().expect("run delta_check");
    assert!(out.status.success(), "delta_check {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let max = text.lines().find_map(|l| l.strip_prefix("MAX ")).unwrap_or_else(|| panic!("no MAX line in:\n{text}"));
    max.trim().parse().unwrap_or(f64::INFINITY)
}

#[test]
fn delta_kernels_match_the_reference_on_the_host() {
    if Command::new("g++").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP: g++ not found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("lode-delta-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in [("ci/kernel-emu/common.h", "common.h"), ("ci/kernel-emu/delta_check.cpp", "delta_check.cpp"), ("kernels-hip/delta.hip", "delta.hip")] {
        std::fs::copy(root.join(from), dir.join(to)).unwrap();
    }
    let st = Command::new("g++").current_dir(&dir).args(["-O2", "-std=c++20", "-pthread", "-x", "c++", "delta_check.cpp", "-o", "delta_check"]).status().unwrap();
    assert!(st.success(), "g++ failed on the emulated delta kernels");
    // (key heads, value heads, head_k, head_v, tokens, one state per row): the tiny
    // preset's heads over a chunk, a batched step, heads of 128, value heads of 40 (a
    // partial group of rows) and 21 tokens (the conv's loads in groups of 8).
    // The last two: qwen3next's grouped value heads (head h reads key head h / 2), a
    // chunk and a batched step.
    let cases: [[&str; 7]; 7] = [
        ["2", "4", "64", "64", "5", "0", "0"],
        ["2", "4", "64", "64", "3", "1", "0"],
        ["1", "2", "128", "128", "9", "0", "0"],
        ["1", "3", "64", "40", "4", "0", "0"],
        ["1", "2", "64", "64", "21", "0", "0"],
        ["2", "4", "64", "64", "6", "0", "1"],
        ["2", "4", "128", "128", "3", "1", "1"],
    ];
    for c in cases {
        let e = run(&dir, &c);
        assert!(e <= 1e-4, "delta kernels {c:?}: max relative error {e:.3e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
