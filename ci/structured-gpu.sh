#!/usr/bin/env bash
# One GPU call (issue 27): decode speed of `lode serve` with a json_schema active vs off,
# one stream and eight, through the server's HTTP API (ci/structured_bench.py, Python's
# standard library only: the GPU image need not have the `openai` package). Starts the
# server on the GPU with --parallel 8, waits for /health, runs the bench, stops the server;
# everything printed is also written to $OUT/structured.txt (the server's log to
# $OUT/structured-serve.log).
#   LODE=path/to/lode (default: carry/lode, else target/release/lode)
#   MODEL=FILE.gguf, else PRESET=llama-8b:q4_k_m (a `lode synth` file, made once under /tmp/lode-synth)
#   LODE_DEVICE=cuda|hip (default cuda)   ROUNDS=5   TOKENS=128   PORT=8093   CTX=2048
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
DEV="${LODE_DEVICE:-cuda}"
PORT="${PORT:-8093}"
exec > >(tee -a "$OUT/structured.txt") 2>&1
echo "== structured output on vs off $(date -u +%FT%TZ) device=$DEV binary=$LODE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
M="${MODEL:-}"
if [ -z "$M" ]; then
  P="${PRESET:-llama-8b:q4_k_m}"
  mkdir -p /tmp/lode-synth
  M="/tmp/lode-synth/${P/:/-}.gguf"
  [ -f "$M" ] || timeout 600 "$LODE" synth --preset "${P%%:*}" --quant "${P#*:}" -o "$M" >/dev/null || { echo "synth $P failed"; exit 1; }
fi
echo "model: $M"
"$LODE" serve -m "$M" --device "$DEV" --parallel 8 --ctx-size "$((8 * ${CTX:-2048}))" --port "$PORT" > "$OUT/structured-serve.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null' EXIT
up=0
for _ in $(seq 1 300); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then up=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 1
done
[ "$up" = 1 ] || { echo "the server did not come up:"; tail -20 "$OUT/structured-serve.log"; exit 1; }
python3 ci/structured_bench.py --url "http://127.0.0.1:$PORT" --rounds "${ROUNDS:-5}" --tokens "${TOKENS:-128}"
rc=$?
grep -i "device\|backend" "$OUT/structured-serve.log" | head -3
exit $rc
