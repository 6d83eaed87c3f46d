//! `kernels-hip/mmq.hip` (the small-batch integer GEMM) run on the host: g++ compiles the
//! source and the headers it includes (`mv_dot.h`, `mv_dot_b32.h`, their gfx11 branches)
//! with `ci/kernel-emu/common.h` in place of the device header (one OS thread per GPU
//! thread, real block barriers and warp shuffles, dot4 / sdot4 / ds_bpermute and the int8
//! mma.sync m16n8k32 emulated), and
//! `ci/kernel-emu/mmq_check.cpp` compares the output with an f64 reference over ggml's
//! block formats. This checks the kernels' indexing and arithmetic where no GPU is (CI);
//! `lode selftest --filter mmq_` checks them on the device.

use std::path::Path;
use std::process::Command;

fn run(dir: &Path, args: &[&str]) -> f64 {
    let out = Command::new(dir.join("mmq_check")).args(args).output().expect("run mmq_check");
    assert!(out.status.success(), "mmq_check {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let max = text.lines().find_map(|l| l.strip_prefix("MAX ")).unwrap_or_else(|| panic!("no MAX line in:\n{text}"));
    max.trim().parse().unwrap_or(f64::INFINITY)
}

#[test]
fn mmq_kernels_match_the_reference_on_the_host() {
    if Command::new("g++").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP: g++ not found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("lode-mmq-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in [
        ("ci/kernel-emu/common.h", "common.h"),
        ("ci/kernel-emu/mmq_check.cpp", "mmq_check.cpp"),
        ("kernels-hip/mmq.hip", "mmq.hip"),
        ("kernels-hip/mv_dot.h", "mv_dot.h"),
        ("kernels-hip/mv_dot_b32.h", "mv_dot_b32.h"),
    ] {
        std::fs::copy(root.join(from), dir.join(to)).unwrap();
    }
    let st = Command::new("g++").current_dir(&dir).args(["-O2", "-std=c++20", "-pthread", "-w", "-x", "c++", "mmq_check.cpp", "-o", "mmq_check"]).status().unwrap();
    assert!(st.success(), "g++ failed on the emulated mmq kernels");
    // (type, rows, K, columns, splits, seed): every type; rows past a block's 32 / 64 and
    // below it; 1, 2, 9, 33 and 64 columns (every column capacity); one to three K splits;
    // a 32-element type ending in a partial 256-element step.
    let cases: [[&str; 6]; 15] = [
        ["q4_K", "70", "512", "9", "1", "1"],
        ["q4_K", "65", "768", "64", "3", "7"],
        ["q6_K", "37", "768", "3", "2", "2"],
        ["q6_K", "33", "512", "33", "2", "8"],
        ["q5_K", "33", "512", "5", "1", "3"],
        ["q5_K", "7", "256", "2", "1", "10"],
        ["q4_0", "40", "288", "2", "1", "4"],
        ["q8_0", "31", "800", "31", "3", "9"],
        ["q8_0", "3", "256", "1", "1", "11"],
        // The matrix-core kernels (mma.sync emulated by its PTX fragment layout).
        ["q4_K_mma", "70", "512", "9", "1", "1"],
        ["q4_K_mma", "65", "768", "64", "3", "7"],
        ["q4_K_mma", "130", "512", "33", "2", "5"],
        ["q6_K_mma", "37", "768", "3", "2", "2"],
        ["q6_K_mma", "33", "512", "33", "2", "8"],
        ["q6_K_mma", "65", "768", "64", "3", "7"],
    ];
    for c in cases {
        let e = run(&dir, &c);
        assert!(e <= 1.0, "mmq kernels {c:?}: error {e:.3e} of the bound 1e-4·Σ|w x| + 1e-5");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
