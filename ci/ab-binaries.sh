#!/usr/bin/env bash
# Two lode binaries side by side on the GPU machine, in one call: the kernel selftest of
# each (check names and outcomes diffed), then pp512 + tg128 of each preset, the binaries
# interleaved round by round so clock and thermal drift fall on both alike.
#   bash ci/ab-binaries.sh BEFORE AFTER   (paths to the two binaries; output under $OUT)
#   STAGES="selftest bench" PRESETS="qwen3-0.6b qwen3-4b llama-8b llama-8b:q3_k_m" ROUNDS=2 REPS=3 CASES=4
set -uo pipefail
A=$1 B=$2
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
MD="${MODEL_TMP:-/tmp/lode-synth}"; mkdir -p "$MD"
exec > >(tee -a "$OUT/ab.txt") 2>&1
export LODE_CACHE_DIR="${LODE_CACHE_DIR:-$OUT/cache}"
echo "== ab-binaries $(date -u +%FT%TZ) before=$A after=$B"
stage() { case " ${STAGES:-selftest bench} " in *" $1 "*) return 0;; *) return 1;; esac; }
for v in before after; do
  stage selftest || break
  bin=$A; [ $v = after ] && bin=$B
  timeout -k 10 240 "$bin" selftest --device cuda --cases "${CASES:-4}" > "$OUT/selftest-$v.txt" 2>&1
  echo "-- selftest $v: exit $?; $(grep -E 'passed, .* failed' "$OUT/selftest-$v.txt")"
  grep -E '^(PASS|FAIL|SKIP)' "$OUT/selftest-$v.txt" | awk '{print $1, $2}' | sort > "$OUT/checks-$v.txt"
done
if stage selftest; then
  echo "-- checks only before / only after / outcome changed:"
  diff "$OUT/checks-before.txt" "$OUT/checks-after.txt" | grep '^[<>]' | head -40
fi
stage bench || PRESETS=" "
for P in ${PRESETS:-qwen3-0.6b qwen3-4b llama-8b}; do  # PRESET or PRESET:MIX (synth --quant)
  F="$MD/${P/:/-}.gguf"; Q=q4_k_m; [ "${P#*:}" != "$P" ] && Q=${P#*:}
  [ -f "$F" ] || timeout 300 "$B" synth --preset "${P%%:*}" --quant "$Q" -o "$F" > /dev/null || { echo "-- $P: synth failed"; continue; }
  for r in $(seq "${ROUNDS:-2}"); do
    for v in before after; do
      bin=$A; [ $v = after ] && bin=$B
      timeout -k 10 300 "$bin" bench --device cuda -m "$F" -p 512 -n 128 -r "${REPS:-3}" --mem-bw 4270 2>&1 | grep -E '^\|' | grep -vE 'model|---' | sed "s/^/$P r$r $v /"
    done
  done
done
echo "== done"
