//! `kernels-hip/kvq_attn.hip` (attention over quantized KV caches) run on the host: g++
//! compiles the source with `ci/kernel-emu/common.h` in place of the device header, and
//! `ci/kernel-emu/kvq_check.cpp` compares the split-keys decode kernel with a direct
//! softmax attention over planes decoded by the GGUF block definitions (Q8_0, Q4_0, f16 on
//! either side), launched twice so the parts' arrival counters must return to zero, and
//! `kvq_to_f16`'s rows with the same decode rounded to f16 (exactly). This checks the
//! kernels' block indexing, nibble order, unaligned loads, part split and merge where no
//! GPU is; `lode selftest --filter kvq` checks them on the device against the CPU backend.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, args: &[&str]) -> (f64, usize) {
    let out = Command::new(dir.join("kvq_check")).args(args).output().expect("run kvq_check");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "kvq_check {args:?} failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    let line = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).unwrap_or_else(|| panic!("no {k} line in:\n{text}")).trim().to_string();
    (line("MAX ").parse().unwrap_or(f64::INFINITY), line("CONV ").parse().unwrap_or(usize::MAX))
}

#[test]
fn kvq_kernels_match_the_block_definitions_on_the_host() {
    if Command::new("g++").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP: g++ not found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("lode-kvq-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in [("ci/kernel-emu/common.h", "common.h"), ("ci/kernel-emu/kvq_check.cpp", "kvq_check.cpp"), ("kernels-hip/kvq_attn.hip", "kvq_attn.hip")] {
        std::fs::copy(root.join(from), dir.join(to)).unwrap();
    }
    let st = Command::new("g++").current_dir(&dir).args(["-O2", "-std=c++20", "-pthread", "-x", "c++", "kvq_check.cpp", "-o", "kvq_check"]).status().unwrap();
    assert!(st.success(), "g++ failed on the emulated kvq kernels");
    // (HD, heads, KV heads, type K, type V (0 f16, 1 q8_0, 2 q4_0), position, window,
    // parts, fewest keys per part): one key; 32 keys in one part; Q4_0 over 201 keys in
    // 4 parts of 64 (GQA 2); HD 256 with Q8_0 K / Q4_0 V over 5 parts; a window of 100 over
    // an f16 K and Q8_0 V; Q4_0 K / f16 V over 1000 keys.
    let cases: [[&str; 9]; 6] = [
        ["128", "4", "2", "1", "1", "0", "0", "4", "256"],
        ["128", "4", "2", "1", "1", "31", "0", "4", "256"],
        ["64", "2", "1", "2", "2", "200", "0", "4", "64"],
        ["256", "2", "1", "1", "2", "256", "0", "8", "64"],
        ["128", "4", "2", "0", "1", "600", "100", "4", "32"],
        ["128", "2", "2", "2", "0", "999", "0", "4", "256"],
    ];
    for c in cases {
        let (e, bad) = run(&dir, &c);
        assert!(e <= 1e-5, "kvq_decode {c:?}: max relative error {e:.3e}");
        assert_eq!(bad, 0, "kvq_to_f16 {c:?}: {bad} values differ");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
