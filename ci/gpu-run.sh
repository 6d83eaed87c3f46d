#!/usr/bin/env bash
# The ONE script run on a GPU machine: kernel selftest (embedded code objects and the
# run-time compile path), then end-to-end checks and benchmarks; everything it prints is
# also written under $OUT (report.txt). Needs no Rust toolchain: only the lode binary.
#   LODE=path/to/lode  (default: carry/lode, else target/release/lode)
#   LODE_DEVICE=cuda|hip (default cuda)   STAGES="selftest rtc e2e bench" (default all)
#   MODELS=dir with the real GGUFs (optional)   CASES=N (default 30)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
DEV="${LODE_DEVICE:-cuda}"
STAGES="${STAGES:-selftest rtc e2e bench}"
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
echo "== done rc=$rc"
exit $rc
