#!/usr/bin/env bash
# Issue 24 item 6 on a GPU machine: `mapped` residency's registration, its bounds and its
# fallback. On a discrete card `mapped` copies the file into pinned memory by default;
# LODE_TUNE=mapped_host=register makes it register the file's own pageable pages, the
# unified-memory path (on the H200 machine that call has stalled inside the driver).
#   1. the residency check as shipped (mapped = the device's default), which includes
#      injected registration faults (fail / stall at chunk 1 on a second context: each must
#      fall back to device with the same logits) and a --device-memory refusal with nothing
#      allocated;
#   2. lode generate, greedy: device vs mapped with mapped_host=register and a failure /
#      stall injected at chunk 1: the same text, and the fallback said once;
#   3. the residency check with mapped_host=register on the synthesized file (10 s per chunk);
#   4. the same on a copy of the file written by cat (a different writer, same bytes).
# 1 and 2 make no real registration. 3 and 4 do: if the driver call spins in the kernel as
# it did in session 4, lode gives up after 10 s and falls back (or says the driver no longer
# answers), but the stuck thread may keep the process from exiting; they run last.
# MODEL=path (default: a synthesized qwen3-0.6b Q4_K_M), LODE=binary, OUT=dir.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
MD="${MODEL_TMP:-/tmp/lode-synth}"; mkdir -p "$MD"
exec > >(tee -a "$OUT/mapped.txt") 2>&1
echo "== lode mapped-run $(date -u +%FT%TZ) binary=$LODE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
uname -r
M="${MODEL:-$MD/qwen3-0.6b-q4_k_m.gguf}"
if [ ! -f "$M" ]; then
  timeout -k 10 300 "$LODE" synth --preset qwen3-0.6b --quant q4_k_m -o "$M" || { echo "synth failed"; exit 1; }
fi
ls -l "$M"
rc=0
check() { # name, env, time limit (s), model file
  echo "== $1"
  local t0; t0=$(date +%s)
  env $2 timeout -k 10 "${3:-240}" "$LODE" selftest --device cuda --cases 0 --residency-check "$4" --mapped-steps 8 2>&1 \
    | grep -E "PASS|FAIL|mapped|residency check|WARN|error" ; local r=${PIPESTATUS[0]}
  echo "-- exit $r after $(( $(date +%s) - t0 )) s"; [ "$r" = 0 ] || rc=1
}
check "1. residency check, mapped as shipped" "" 300 "$M"
echo "== 2. generate: device vs mapped with a fault injected at chunk 1"
gen() { env $1 timeout -k 10 120 "$LODE" generate -m "$M" --device cuda -p "The capital of France is" -n 24 --temp 0 -s 1 --residency "$2" 2> "$OUT/mapped-gen.err"; }
want=$(gen "" device)
for inj in "fail:1" "stall:1"; do
  got=$(gen "LODE_TUNE=mapped_host=register,mapped_stall_s=3,mapped_inject=$inj" mapped); r=$?
  said=$(grep -c "Falling back to \`device\` residency" "$OUT/mapped-gen.err")
  if [ "$r" = 0 ] && [ "$got" = "$want" ] && [ "$said" = 1 ]; then echo "PASS generate mapped_inject=$inj: same text, fallback said once"; else echo "FAIL generate mapped_inject=$inj: exit $r, fallback lines $said"; rc=1; fi
  grep -m1 "mapped residency" "$OUT/mapped-gen.err"
done
check "3. mapped_host=register (the file's own pages)" "LODE_TUNE=mapped_host=register,mapped_stall_s=10 LODE_DEBUG=weights" 240 "$M"
cat "$M" > "$M.cat"; sync
check "4. mapped_host=register on a copy written by cat" "LODE_TUNE=mapped_host=register,mapped_stall_s=10" 240 "$M.cat"
rm -f "$M.cat"
echo "== mapped-run exit $rc"
exit $rc
