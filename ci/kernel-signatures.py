#!/usr/bin/env python3
"""Print every exported kernel's parameter kinds, from the preprocessed kernels-hip/ sources.

One line per kernel: `family kernel kind,kind,...` with kinds ptr / i32 / u32 / f32, read
from `extern "C" __global__ ... void NAME(PARAMS)` after clang-19's preprocessor has
expanded the macros that stamp out kernels. `runtime/tests/kernel_signatures.rs` compares
this with the argument structs the Rust launchers declare (`kernel_args!`).
Usage: kernel-signatures.py CLANG KERNELS_DIR
"""
import re
import subprocess
import sys
from pathlib import Path

clang, kdir = sys.argv[1], Path(sys.argv[2])
KINDS = [
    (re.compile(r"\*"), "ptr"),
    (re.compile(r"\b(unsigned|u32|uint32_t)\b"), "u32"),
    (re.compile(r"\b(float)\b"), "f32"),
    (re.compile(r"\b(int|i32|int32_t)\b"), "i32"),
]


def kind(param: str) -> str:
    for pat, k in KINDS:
        if pat.search(param):
            return k
    raise SystemExit(f"unknown parameter type: {param!r}")


for src in sorted(kdir.glob("*.hip")):
    pre = subprocess.run(
        [clang, "-E", "-P", "-x", "hip", "--cuda-device-only", "-nogpulib", "-nogpuinc", "--offload-arch=gfx1100", "-std=c++17", f"-I{kdir}", str(src)],
        check=True, capture_output=True, text=True,
    ).stdout
    flat = " ".join(pre.split())
    # `extern "C" __global__ [attributes] void NAME(` , then the balanced parameter list.
    for m in re.finditer(r'extern "C" __attribute__\(\(global\)\).{0,200}?\bvoid\s+(\w+)\s*\(', flat):
        name, depth, i = m.group(1), 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(flat[i], 0)
            i += 1
        params = flat[m.end():i - 1].strip()
        kinds = [] if params in ("", "void") else [kind(p) for p in params.split(",")]
        print(src.stem, name, ",".join(kinds))
