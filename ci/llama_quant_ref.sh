#!/usr/bin/env bash
# Writes tests/data/quant-ref/IQ3_S.llama.f32 (random rows, one all-zero 32-element
# sub-block among them), tests/data/quant-ref/imatrix.llama.f32 (importance weights for
# one row) and tests/data/quant-ref/llama-ref.json (the sha256 of the bytes llama.cpp's
# quantize_iq3_s, quantize_iq3_xxs, quantize_iq2_xxs, quantize_iq2_xs, quantize_iq2_s,
# quantize_iq1_s, quantize_iq1_m, quantize_iq4_nl, quantize_iq4_xs, quantize_q8_0, quantize_q4_0, quantize_q5_0,
# and with the importance weights quantize_iq3_s, quantize_q4_1, quantize_q5_1 and quantize_q2_K ... quantize_q6_K
# write for them),
# for runtime/tests/quant_gguf_py.rs.
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
d = "tests/data/quant-ref"
rng = np.random.default_rng(7)
n = 256 * 64
x = (rng.standard_normal(n) * np.exp2(rng.integers(-8, 4, size=n))).astype("<f4")
x[rng.random(n) < 0.03] = 0
x[256 * 3 + 64:256 * 3 + 96] = 0
x.tofile(f"{d}/IQ3_S.llama.f32")
# Importance weights of one 1024-column row: mean squares of activations spread over
# four decades, as llama-imatrix's are, a few columns never reached (weight 0).
rng = np.random.default_rng(11)
w = np.exp(rng.standard_normal(1024) * 2.0).astype("<f4")
w[rng.random(1024) < 0.01] = 0
w.tofile(f"{d}/imatrix.llama.f32")
out = {"generator": "llama.cpp ggml-quants.c quantize_iq3_s / iq3_xxs / iq2_xxs / iq2_xs / iq2_s / iq1_s / iq1_m / iq4_nl / iq4_xs / q8_0 / q4_0 / q5_0 / q4_1 / q5_1 / q2_K ... q6_K (ci/llama_quant_ref.sh)",
       "source": sys.argv[2], "types": {}}
for key, ty, weights in [("IQ3_S", "IQ3_S", None), ("IQ3_XXS", "IQ3_XXS", None), ("IQ3_XXS+imatrix", "IQ3_XXS", "imatrix.llama.f32"),
                         ("IQ2_XXS+imatrix", "IQ2_XXS", "imatrix.llama.f32"), ("IQ2_XS+imatrix", "IQ2_XS", "imatrix.llama.f32"),
                         ("IQ2_S", "IQ2_S", None), ("IQ2_S+imatrix", "IQ2_S", "imatrix.llama.f32"), ("IQ1_S+imatrix", "IQ1_S", "imatrix.llama.f32"),
                         ("IQ1_M", "IQ1_M", None), ("IQ1_M+imatrix", "IQ1_M", "imatrix.llama.f32"),
                         ("IQ4_NL", "IQ4_NL", None), ("IQ4_NL+imatrix", "IQ4_NL", "imatrix.llama.f32"),
                         ("IQ4_XS", "IQ4_XS", None), ("IQ4_XS+imatrix", "IQ4_XS", "imatrix.llama.f32"), ("Q8_0", "Q8_0", None),
                         ("Q4_0+imatrix", "Q4_0", "imatrix.llama.f32"), ("Q5_0+imatrix", "Q5_0", "imatrix.llama.f32"),
                         ("IQ3_S+imatrix", "IQ3_S", "imatrix.llama.f32"), ("Q4_1+imatrix", "Q4_1", "imatrix.llama.f32"),
                         ("Q5_1+imatrix", "Q5_1", "imatrix.llama.f32"), ("Q2_K+imatrix", "Q2_K", "imatrix.llama.f32"),
                         ("Q3_K+imatrix", "Q3_K", "imatrix.llama.f32"), ("Q4_K+imatrix", "Q4_K", "imatrix.llama.f32"),
                         ("Q5_K+imatrix", "Q5_K", "imatrix.llama.f32"), ("Q6_K+imatrix", "Q6_K", "imatrix.llama.f32")]:
    args = [f"{t}/ref", ty, f"{d}/IQ3_S.llama.f32", f"{t}/y.bin", "1024"] + ([f"{d}/{weights}"] if weights else [])
    subprocess.run(args, check=True)
    y = open(f"{t}/y.bin", "rb").read()
    out["types"][key] = {"type": ty, "input": "IQ3_S.llama.f32", "weights": weights, "row_len": 1024,
                         "quant_sha256": hashlib.sha256(y).hexdigest()}
    print(key, len(y), "bytes", out["types"][key]["quant_sha256"])
json.dump(out, open(f"{d}/llama-ref.json", "w"), indent=1)
PY
rm -rf "$t"
