//! `kernels-hip/mv_dot_low.h`'s decode bodies (Q3_K, Q2_K, IQ4_XS, IQ4_NL) run on the host:
//! g++ compiles them and the headers they include with `ci/kernel-emu/common.h` in place
//! of the device header (one OS thread per GPU thread, warp shuffles and dot4 emulated;
//! the gfx11 branches of the byte permutations and dp2a), and `ci/kernel-emu/mv_low_check.cpp`
//! compares each row's output with the f64 sum over lode's CPU dequantization of the same
//! rows. Row lengths of odd super-block counts put every other row's super-blocks at
//! 2-byte-aligned addresses (the Q3_K body's funnel-shifted loads). `lode selftest
//! --filter norm_mv_low` checks the same bodies on the device, fused and unfused.

use lode_runtime::quant::{self, GgmlType};
use std::path::Path;
use std::process::Command;

/// Random values (a fixed xorshift stream) quantized to `ty`; writes rows, k, the bytes and
/// lode's dequantization to `path`.
fn write_rows(path: &Path, ty: GgmlType, rows: usize, k: usize, seed: u64) {
    let mut s = seed | 1;
    let vals: Vec<f32> = (0..rows * k)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    let mut bytes = vec![0u8; ty.bytes_for((rows * k) as u64).unwrap() as usize];
    quant::quantize(ty, &vals, &mut bytes).unwrap();
    let mut deq = vec![0f32; rows * k];
    quant::dequantize(ty, &bytes, &mut deq).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&(rows as u32).to_le_bytes());
    out.extend_from_slice(&(k as u32).to_le_bytes());
    out.extend_from_slice(&bytes);
    for v in deq {
        out.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(path, out).unwrap();
}

/// The check program's name of `ty`.
fn emu_name(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::Q3_K => "q3_K",
        GgmlType::Q2_K => "q2_K",
        GgmlType::IQ4_XS => "iq4_xs",
        _ => "iq4_nl",
    }
}

#[test]
fn low_bit_decode_bodies_match_the_cpu_dequantization_on_the_host() {
    if Command::new("g++").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        eprintln!("SKIP: g++ not found");
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = std::env::temp_dir().join(format!("lode-mvlow-emu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (from, to) in [
        ("ci/kernel-emu/common.h", "common.h"),
        ("ci/kernel-emu/mv_low_check.cpp", "mv_low_check.cpp"),
        ("kernels-hip/mv_dot.h", "mv_dot.h"),
        ("kernels-hip/mv_dot_b32.h", "mv_dot_b32.h"),
        ("kernels-hip/mv_dot_low.h", "mv_dot_low.h"),
        ("kernels-hip/dequant_low.h", "dequant_low.h"),
        ("kernels-hip/iq_grids.h", "iq_grids.h"),
    ] {
        std::fs::copy(root.join(from), dir.join(to)).unwrap();
    }
    let st = Command::new("g++").current_dir(&dir).args(["-O2", "-std=c++20", "-pthread", "-w", "-x", "c++", "mv_low_check.cpp", "-o", "mv_low_check"]).status().unwrap();
    assert!(st.success(), "g++ failed on the emulated decode bodies");
    // (type, rows, k, columns, seed): an odd super-block count (rows at 2 mod 4 addresses),
    // a row of one super-block, 8B's 4096, a partial 8-super-block step; 1 and 3 columns.
    let cases = [
        (GgmlType::Q3_K, 9, 768, 1, 1),
        (GgmlType::Q3_K, 6, 256, 3, 2),
        (GgmlType::Q3_K, 5, 4096, 1, 3),
        (GgmlType::Q3_K, 7, 2816, 2, 4),
        (GgmlType::Q2_K, 5, 1280, 1, 5),
        (GgmlType::Q2_K, 3, 512, 3, 6),
        (GgmlType::IQ4_XS, 6, 1792, 1, 7),
        (GgmlType::IQ4_XS, 3, 256, 2, 8),
        (GgmlType::IQ4_NL, 5, 2080, 1, 9),
        (GgmlType::IQ4_NL, 3, 96, 3, 10),
    ];
    for (ty, rows, k, ncols, seed) in cases {
        let f = dir.join(format!("w-{seed}.bin"));
        write_rows(&f, ty, rows, k, seed);
        let out = Command::new(dir.join("mv_low_check")).arg(emu_name(ty)).arg(&f).arg(ncols.to_string()).arg(seed.to_string()).output().unwrap();
        assert!(out.status.success(), "mv_low_check {ty} failed: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let e: f64 = text.lines().find_map(|l| l.strip_prefix("MAX ")).unwrap_or_else(|| panic!("no MAX line in:\n{text}")).trim().parse().unwrap_or(f64::INFINITY);
        assert!(e <= 1.0, "{ty} rows {rows} k {k} columns {ncols}: error {e:.3e} of the bound 1e-5·Σ|w x| + 1e-6");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
