#!/usr/bin/env bash
# Issue 24 (at capacity) on a GPU machine, one preset after another: synthesize it, ask
# `lode fit` at the capacity, run a PROMPT-token prompt + GEN generated tokens under
# `--device-memory CAP` with nvidia-smi sampled every 50 ms, and print fit's predicted
# driver peak beside `--memory-report`'s `driver_peak_used_bytes` and nvidia-smi's peak;
# then a context past fit's largest must be refused before anything is loaded.
# Needs only the lode binary (and python3, nvidia-smi). Everything printed goes to
# $OUT/capacity.txt; each run's files to $OUT/capacity-PRESET-MIX/.
#   PRESETS="gemma3-27b mistral-small-24b qwen3-32b" (PRESET[:MIX], default mix q4_k_m)
#   CAP=24GiB  CTX=4096  PROMPT=3000  GEN=1000  LODE=path  MODEL_TMP=/tmp/lode-synth  KEEP=1 (keep files)
#   KV=q8_0 (the KV cache type of the run, -ctk/-ctv; default f16); fit's largest context is
#   printed for f16, q8_0 and q4_0 KV either way
# A 10-minute call holds about one 27B preset (synth ~2 min, the run ~2 min on an H200).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
CAP="${CAP:-24GiB}"; CTX="${CTX:-4096}"; KV="${KV:-f16}"; PROMPT="${PROMPT:-3000}"; GEN="${GEN:-1000}"
MD="${MODEL_TMP:-/tmp/lode-synth}"; mkdir -p "$MD"
TXT="$(ls carry/alice29.txt ../shared/fixtures/gemma3-270m/alice29.txt 2>/dev/null | head -1)"
exec > >(tee -a "$OUT/capacity.txt") 2>&1
echo "== lode capacity-run $(date -u +%FT%TZ) binary=$LODE cap=$CAP ctx=$CTX prompt=$PROMPT gen=$GEN"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
rc=0
for P in ${PRESETS:-gemma3-27b mistral-small-24b qwen3-32b}; do
  name=${P%%:*}; mix=$( [ "${P#*:}" = "$P" ] && echo q4_k_m || echo "${P#*:}")
  M="$MD/$name-$mix.gguf"; R="$OUT/capacity-$name-$mix"; mkdir -p "$R"
  echo "== $name $mix"
  if [ ! -f "$M" ]; then
    t0=$(date +%s)
    timeout -k 10 420 "$LODE" synth --preset "$name" --quant "$mix" -o "$M" || { echo "-- synth failed"; rc=1; rm -f "$M"; continue; }
    echo "-- synth $(( $(date +%s) - t0 )) s, $(du -h "$M" | cut -f1)"
  fi
  timeout -k 10 120 "$LODE" fit -m "$M" --device cuda -c "$CTX" --device-memory "$CAP" -ctk "$KV" -ctv "$KV" --json > "$R/fit.json" 2> "$R/fit.err"
  echo "-- lode fit -c $CTX --device-memory $CAP (KV $KV): exit $?"; tail -2 "$R/fit.err"
  for k in f16 q8_0 q4_0; do
    echo "-- largest context at $CAP with $k KV: $(timeout -k 10 60 "$LODE" fit -m "$M" --device cuda -c "$CTX" --device-memory "$CAP" -ctk $k -ctv $k --json 2>/dev/null | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("max_ctx"), "(memory alone", d.get("max_ctx_memory"), "; trained", d.get("n_ctx_train"), ")")')"
  done
  # A prompt of about PROMPT tokens of text (the synthetic vocabulary's own ratio).
  python3 - "$LODE" "$M" "$TXT" "$PROMPT" > "$R/prompt.txt" <<'PY'
import json, subprocess, sys
lode, model, txt, want = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
text = open(txt, encoding="utf-8", errors="replace").read() if txt else "the model of the world is a token " * 2000
while len(text) < 40 * want:
    text += text
def count(t):
    r = subprocess.run([lode, "tokenize", "-m", model, "--ids"], input=t.encode(), capture_output=True, check=True)
    return len(r.stdout.split())
n = int(want * 2000 / count(text[:2000]))
for _ in range(4):
    got = count(text[:n])
    n = int(n * want / max(got, 1))
sys.stdout.write(text[:n])
PY
  base=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 > "$R/smi.txt" 2>/dev/null & smi=$!
  timeout -k 10 500 "$LODE" generate -m "$M" --device cuda -c "$CTX" --device-memory "$CAP" -ctk "$KV" -ctv "$KV" -n "$GEN" -s 1 \
    --memory-report --json < "$R/prompt.txt" > "$R/gen.json" 2> "$R/gen.err"; grc=$?
  kill $smi 2>/dev/null; sleep 0.3
  echo "-- generate exit $grc (nvidia-smi idle before: ${base:-?} MiB)"; [ $grc = 0 ] || { rc=1; tail -3 "$R/gen.err"; }
  python3 - "$R" <<'PY' || true
import json, re, sys, os
R = sys.argv[1]
mib = lambda b: f"{b / 2**20:,.0f} MiB" if b else "?"
fit = json.load(open(f"{R}/fit.json")) if os.path.getsize(f"{R}/fit.json") else {}
err = open(f"{R}/gen.err").read()
m = [json.loads(l)["memory_report"] for l in err.splitlines() if l.startswith('{"memory_report"')]
dev = (m[-1].get("device") or {}) if m else {}
smi = [int(x) for x in open(f"{R}/smi.txt").read().split() if x.isdigit()]
try:
    g = json.load(open(f"{R}/gen.json"))["timings"]
    print(f"   prompt {g['prompt_tokens']} tokens at {g['prompt_tps']:.1f} t/s, generated {g['generated_tokens']} at {g['gen_tps']:.1f} t/s")
except Exception as e:
    print(f"   no timings ({e})")
pred, drv = fit.get("predicted_device_used_bytes"), dev.get("driver_peak_used_bytes")
print(f"   fit: need {mib(fit.get('need_bytes'))} (weights {mib(fit.get('weights_bytes'))}, KV {mib(fit.get('kv_bytes'))}, scratch {mib(fit.get('scratch_bytes'))}), "
      f"held at open {mib(fit.get('device_used_at_open_bytes'))}, predicted driver peak {mib(pred)}; fits {fit.get('fits')}, largest context {fit.get('max_ctx')} "
      f"(memory alone {fit.get('max_ctx_memory')}, trained {fit.get('n_ctx_train')})")
print(f"   run: driver peak {mib(drv)} over {dev.get('driver_samples')} samples, lode peak {mib(dev.get('peak_allocated_bytes'))}, "
      f"nvidia-smi peak {max(smi) if smi else '?'} MiB, cap {mib(dev.get('device_memory_cap_bytes'))}")
if pred and drv:
    print(f"   fit's prediction vs the driver's peak: {100 * (pred / drv - 1):+.2f} %")
if pred and smi:
    print(f"   fit's prediction vs nvidia-smi's peak: {100 * (pred / 2**20 / max(smi) - 1):+.2f} %")
PY
  max=$(python3 -c "import json; print(json.load(open('$R/fit.json')).get('max_ctx', 0))" 2>/dev/null || echo 0)
  if [ "${max:-0}" -gt 0 ]; then
    over=$(( max + 1024 ))
    out=$(timeout -k 10 120 "$LODE" generate -m "$M" --device cuda -c "$over" --device-memory "$CAP" -ctk "$KV" -ctv "$KV" -p hi -n 1 2>&1); orc=$?
    if [ $orc != 0 ] && echo "$out" | grep -q "does not fit"; then echo "-- -c $over refused: $(echo "$out" | grep -o 'the largest context.*' | head -1)";
    elif [ "$over" -gt "$(python3 -c "import json; print(json.load(open('$R/fit.json'))['n_ctx_train'])")" ]; then echo "-- -c $over: past the trained context (exit $orc)";
    else echo "-- -c $over NOT refused (exit $orc): $(echo "$out" | tail -2)"; rc=1; fi
  fi
  [ "${KEEP:-0}" = 1 ] || rm -f "$M"
done
exit $rc
