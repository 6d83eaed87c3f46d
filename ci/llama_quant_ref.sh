#!/usr/bin/env bash
# Writes tests/data/quant-ref/IQ3_S.llama.f32 (random rows, one all-zero 32-element
# sub-block among them) and tests/data/quant-ref/llama-ref.json (the sha256 of the bytes
# llama.cpp's quantize_iq3_s writes for them), for runtime/tests/quant_gguf_py.rs.
#   bash ci/llama_quant_ref.sh LLAMA_CPP_PYTHON_SDIST.tar.gz
# ggml-quants.c is compiled as llama.cpp's CMake build compiles ggml-base on x86-64 (no
# -march flags, so no FMA contraction); built with -march=native and GCC's default
# -ffp-contract=fast, a few codes differ (the products fuse), as they would in such a build.
set -euo pipefail
cd "$(dirname "$0")/.."
t=$(mktemp -d)
tar -xzf "$1" -C "$t" --wildcards '*/vendor/llama.cpp/ggml/*'
g=$(find "$t" -maxdepth 4 -type d -path '*vendor/llama.cpp/ggml' | head -1)
gcc -O2 -ffp-contract=off -c -I "$g/include" -I "$g/src" "$g/src/ggml-quants.c" -o "$t/q.o"
gcc -O2 ci/llama_quant_ref.c "$t/q.o" -lm -o "$t/ref"
python3 - "$t" "$(basename "$1")" <<'PY'
import hashlib, json, subprocess, sys
import numpy as np
t = sys.argv[1]
rng = np.random.default_rng(7)
n = 256 * 64
x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 4, size=n))).astype("<f4")
x[rng.random(n) < 0.03] = 0
x[256 * 3 + 64:256 * 3 + 96] = 0
x.tofile("tests/data/quant-ref/IQ3_S.llama.f32")
subprocess.run([f"{t}/ref", "tests/data/quant-ref/IQ3_S.llama.f32", f"{t}/y.bin", "1024"], check=True)
y = open(f"{t}/y.bin", "rb").read()
out = {"generator": "llama.cpp ggml-quants.c quantize_iq3_s (ci/llama_quant_ref.sh)", "source": sys.argv[2],
       "types": {"IQ3_S": {"input": "IQ3_S.llama.f32", "row_len": 1024, "quant_sha256": hashlib.sha256(y).hexdigest()}}}
json.dump(out, open("tests/data/quant-ref/llama-ref.json", "w"), indent=1)
print("IQ3_S", len(y), "bytes", out["types"]["IQ3_S"]["quant_sha256"])
PY
rm -rf "$t"
