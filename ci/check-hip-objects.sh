#!/usr/bin/env bash
# Checks the AMD code objects build.rs made with clang-19 (no GPU needed):
#  - each family's gfx1100 and gfx1151 object is an AMDGPU ELF exporting every kernel the
#    runtime looks up (the list in runtime/src/backend/gpu/kernels.rs, via the test
#    tests/hip_objects.rs, run here too);
#  - the GEMM family contains v_wmma instructions for both architectures.
# Usage: bash ci/check-hip-objects.sh [target-dir-profile, default release]
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-release}"
objdump="$(command -v llvm-objdump-19 || command -v llvm-objdump || true)"
if [ -z "$objdump" ]; then echo "check-hip-objects: llvm-objdump-19 not found" >&2; exit 1; fi
out=$(ls -td target/"$profile"/build/lode-*/out 2>/dev/null | while read d; do [ -f "$d/kernels_embedded.rs" ] && echo "$d"; done | head -1)
if [ -z "$out" ]; then echo "check-hip-objects: no build output; run cargo build --$profile first" >&2; exit 1; fi
fail=0
for arch in gfx1100 gfx1151; do
  for fam in quantize matvec decode_mv norm_rope attention attn_decode elementwise gemm flash_attn exact_matmul exact_ops moe delta mmq kvq_attn; do
    co="$out/$fam.$arch.co"
    if [ ! -f "$co" ]; then echo "MISSING $co"; fail=1; continue; fi
    nk=$("$objdump" -t "$co" | grep -c '\.kd$' || true)
    echo "$fam.$arch: $nk kernels"
    if [ "$fam" = gemm ] || [ "$fam" = flash_attn ]; then
      nw=$("$objdump" -d --mcpu="$arch" "$co" | grep -c 'v_wmma' || true)
      echo "$fam.$arch: $nw v_wmma instructions"
      if [ "$nw" -eq 0 ]; then echo "FAIL: no v_wmma in $co"; fail=1; fi
    fi
  done
done
if [ "$profile" = release ]; then pf=--release; else pf=; fi
cargo test $pf --locked --test hip_objects -- --nocapture
exit $fail
