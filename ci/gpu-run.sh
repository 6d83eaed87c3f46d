#!/usr/bin/env bash
# The ONE script run on a GPU machine: kernel selftest (embedded code objects and the
# run-time compile path), then end-to-end checks and benchmarks; everything it prints is
# also written under $OUT (report.txt). Needs no Rust toolchain: only the lode binary.
#   LODE=path/to/lode  (default: carry/lode, else target/release/lode)
#   LODE_DEVICE=cuda|hip (default cuda)   STAGES="selftest rtc e2e bench residency" (default all)
#   MODELS=dir with the real GGUFs (optional)   CASES=N (default 30)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
DEV="${LODE_DEVICE:-cuda}"
STAGES="${STAGES:-selftest rtc e2e bench residency}"
CASES="${CASES:-30}"
exec > >(tee -a "$OUT/report.txt") 2>&1
echo "== lode gpu-run $(date -u +%FT%TZ) device=$DEV binary=$LODE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
# NVRTC / hipRTC for the run-time compile path: find the library where the image keeps it.
if [ "$DEV" = cuda ] && ! ldconfig -p | grep -q libnvrtc.so; then
  d=$(dirname "$(find / -name 'libnvrtc.so.1[0-9]*' -not -path '*/proc/*' 2>/dev/null | head -1)" 2>/dev/null)
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}" && echo "nvrtc from $d"
fi
export LODE_CACHE_DIR="$OUT/cache"
rc=0
stage() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }
if stage selftest; then
  echo "== selftest (embedded code objects)"
  "$LODE" selftest --device "$DEV" --cases "$CASES" || rc=1
fi
if stage rtc; then
  echo "== selftest (run-time compile: LODE_KERNELS=rtc)"
  LODE_KERNELS=rtc "$LODE" selftest --device "$DEV" --cases 5 || rc=1
fi
if stage e2e && [ -f carry/e2e.sh ]; then
  echo "== end to end"; bash carry/e2e.sh "$LODE" "$DEV" || rc=1
fi
if stage bench && [ -f carry/bench.sh ]; then
  echo "== bench"; bash carry/bench.sh "$LODE" "$DEV" || rc=1
fi
# ---------------------------------------------------------------------------------------
# Weight residency (issue 5; section owned by the residency work). For each synthetic
# shape: `lode fit`, then pp2048 + tg128 in each residency mode with the memory report
# (copies, duplicates, peak device memory; nvidia-smi sampled alongside), greedy tokens
# of mapped vs device, and bit-identical logits between upload / device / mapped
# (perplexity --kl-divergence-base: mean KLD 0, same top-1 100 %).
# llama.cpp's peak device memory for the same run: qwen3-4b 3,575 MiB, llama-8b 5,527 MiB.
if stage residency; then
  echo "== residency"
  R="$OUT/residency"; mkdir -p "$R"
  TXT="$(ls carry/alice29.txt ../shared/fixtures/gemma3-270m/alice29.txt 2>/dev/null | head -1)"
  for P in ${RESIDENCY_PRESETS:-qwen3-4b llama-8b}; do
    M="$R/$P.gguf"
    [ -f "$M" ] || "$LODE" synth --preset "$P" -o "$M" >/dev/null || { rc=1; continue; }
    echo "-- $P: lode fit"
    "$LODE" fit -m "$M" --ctx 2176 --device "$DEV" || rc=1
    for mode in device mapped upload; do
      [ "$mode" = mapped ] && PN=64 || PN=2048   # mapped reads weights over PCIe: short prompt
      base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
      (nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$R/$P-$mode.smi" 2>/dev/null &
       echo $! > "$R/smi.pid")
      "$LODE" bench -m "$M" --device "$DEV" -p "$PN" -n 128 -r 1 --residency "$mode" --memory-report -o json \
        > "$R/$P-$mode.json" 2> "$R/$P-$mode.err" || rc=1
      kill "$(cat "$R/smi.pid")" 2>/dev/null
      peak=$(sort -n "$R/$P-$mode.smi" 2>/dev/null | tail -1)
      echo "-- $P $mode: pp$PN+tg128; nvidia-smi peak ${peak:-?} MiB (idle before: ${base:-?} MiB)"
      grep -E '^bench:|memory_report|error' "$R/$P-$mode.err" | cut -c1-2000
    done
    echo "-- $P: greedy tokens, mapped vs device"
    for mode in device mapped; do
      "$LODE" generate -m "$M" --device "$DEV" --residency "$mode" --temp 0 -n 32 --json \
        -p "The weight cache keeps every tensor resident once." > "$R/$P-gen-$mode.json" 2>>"$R/$P-gen.err" || rc=1
    done
    if python3 - "$R/$P-gen-device.json" "$R/$P-gen-mapped.json" <<'PY'
import json, sys
a, b = (json.load(open(f))["generated_ids"] for f in sys.argv[1:3])
print("device:", a); print("mapped:", b)
sys.exit(0 if a == b and len(a) > 0 else 1)
PY
    then echo "-- $P: mapped == device greedy tokens: OK"; else echo "-- $P: mapped != device greedy tokens: FAIL"; rc=1; fi
    if [ -n "$TXT" ]; then
      echo "-- $P: logits upload vs device vs mapped (KLD must be 0, same top-1 100 %)"
      "$LODE" perplexity -m "$M" -f "$TXT" --ctx 128 --chunks 2 --device "$DEV" --residency upload \
        --save-logits "$R/$P-upload.logits" > /dev/null 2>"$R/$P-ppl-upload.err" || rc=1
      for mode in device mapped; do
        "$LODE" perplexity -m "$M" -f "$TXT" --ctx 128 --chunks 2 --device "$DEV" --residency "$mode" \
          --kl-divergence-base "$R/$P-upload.logits" 2>&1 | grep -E "Mean +KLD|Maximum +KLD|Same top-1" | sed "s/^/   $mode: /"
      done
    fi
  done
  echo "-- over budget, then a good run (same binary, clear error expected)"
  "$LODE" generate -m "$R/qwen3-4b.gguf" --device "$DEV" --weight-budget 1GiB --temp 0 -n 4 -p hi 2>&1 | tail -2
  LODE_TEST_ALLOC_LIMIT=512MiB "$LODE" generate -m "$R/qwen3-4b.gguf" --device "$DEV" --temp 0 -n 4 -p hi 2>&1 | tail -2
  rm -f "$R"/*.gguf
fi
echo "== done rc=$rc"
exit $rc
