#!/usr/bin/env bash
# Runs kernels-hip/flash_attn.hip (both kernels) on the host, no GPU: each block's threads are
# std::threads, the warp-level matrix products and shuffles are emulated following the NVIDIA
# PTX fragment layouts (nv, g++) and gfx11 WMMA wave32 (amd, clang++-19), and the outputs are
# compared with an f64 reference under the selftest's error bound, NaN in the cache slots past
# the last position. What it proves: the kernels' indexing, masking, online softmax, barriers
# and fragment bookkeeping (frag_coord, row slots, frag_a_from_c) on both layouts, given that
# the emulated instructions match the hardware (the first flash kernel, verified on the H200,
# passes it too). Not what it proves: timing, or the hardware's own rounding.
# Usage: bash ci/flash-emu/run.sh [nv|amd|both]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
which="${1:-both}"
for kind in nv amd; do
  [ "$which" = both ] || [ "$which" = "$kind" ] || continue
  b="$(mktemp -d)"
  cp "$here/common.h" "$here/main.cpp" "$b/"
  cp "$root/kernels-hip/flash_attn.hip" "$b/"
  python3 "$here/gen_mma.py" "$kind" "$root/kernels-hip/mma.h" "$b/mma.h"
  if [ "$kind" = nv ]; then
    g++ -std=c++20 -O1 -pthread -I "$b" "$b/main.cpp" -o "$b/emu"
  else
    clang++-19 -std=c++20 -O1 -pthread -DLODE_AMD=1 -w -I "$b" "$b/main.cpp" -o "$b/emu"
  fi
  echo "== flash-emu $kind"
  "$b/emu"
  rm -rf "$b"
done
