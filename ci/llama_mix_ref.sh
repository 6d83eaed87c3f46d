#!/usr/bin/env bash
# `lode quantize` against llama.cpp's `llama-quantize` for llama.cpp's named mixes: builds
# llama-quantize (and llama-imatrix) from the llama.cpp tree of PyPI's llama-cpp-python sdist
# (CPU only, GGML_NATIVE off, as the ggml-base of ci/llama_quant_ref.sh) into
# $LLAMA_BUILD (default target/llama-ref; ~15 min at -j1, reused when present), quantizes each
# F32/F16 model given to each mix with both, and reports per mix: the files identical, or
# which tensors differ (type or bytes) and any metadata difference (ci/llama_mix_diff.py).
#   bash ci/llama_mix_ref.sh SDIST.tar.gz MODEL.gguf... [-- MIX...] [--imatrix FILE]
# Without MIX names it runs the non-imatrix mixes of issue 23.
set -euo pipefail
cd "$(dirname "$0")/.."
sdist=$1; shift
models=(); mixes=(); imatrix=()
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; while [ $# -gt 0 ] && [ "$1" != --imatrix ]; do mixes+=("$1"); shift; done ;;
    --imatrix) imatrix=(--imatrix "$2"); shift 2 ;;
    *) models+=("$1"); shift ;;
  esac
done
[ ${#mixes[@]} -gt 0 ] || mixes=(Q4_K_M Q4_K_S Q5_K_M Q6_K Q8_0 Q3_K_M Q3_K_S Q3_K_L Q2_K IQ4_XS IQ4_NL IQ3_S IQ3_M MXFP4_MOE)
b=${LLAMA_BUILD:-target/llama-ref}
if [ ! -x "$b/bin/llama-quantize" ]; then
  mkdir -p "$b/src"
  tar -xzf "$sdist" -C "$b/src"
  s=$(find "$b/src" -maxdepth 3 -type d -path '*vendor/llama.cpp' | head -1)
  cmake -S "$s" -B "$b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF
  ninja -C "$b" -j "${JOBS:-1}" llama-quantize llama-imatrix
fi
lode=${LODE:-target/release/lode}
out=$(mktemp -d)
for m in "${models[@]}"; do
  for mix in "${mixes[@]}"; do
    "$b/bin/llama-quantize" "${imatrix[@]}" "$m" "$out/llama.gguf" "$mix" 2 > "$out/llama.log" 2>&1 || { echo "$(basename "$m") $mix: llama-quantize failed: $(tail -1 "$out/llama.log")"; continue; }
    "$lode" quantize "${imatrix[@]}" "$m" "$out/lode.gguf" "$mix" -t 2 > "$out/lode.log" 2>&1 || { echo "$(basename "$m") $mix: lode quantize failed: $(tail -1 "$out/lode.log")"; continue; }
    python3 ci/llama_mix_diff.py "$(basename "$m") $mix" "$out/lode.gguf" "$out/llama.gguf"
  done
done
rm -rf "$out"
