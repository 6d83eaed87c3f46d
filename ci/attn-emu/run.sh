#!/usr/bin/env bash
# Runs kernels-hip/attn_decode.hip on the host, no GPU: each block's 512 threads are
# std::threads, shuffles and barriers emulated (common.h here), blocks run one after another
# (so the multi-part merge's last-to-arrive block is the highest part). Compared with an f64
# reference of the op under the selftest's bounds. What it proves: indexing, the key
# assignment to warps, the masking, the warp-level q/k preparation, the merges; not timing,
# nor the hardware's rounding. Usage: bash ci/attn-emu/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
b="$(mktemp -d)"
cp "$here/common.h" "$here/main.cpp" "$here/../../kernels-hip/attn_decode.hip" "$b/"
g++ -std=c++20 -O1 -pthread -I "$b" "$b/main.cpp" -o "$b/emu"
"$b/emu"
rm -rf "$b"
