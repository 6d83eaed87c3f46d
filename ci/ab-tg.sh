#!/usr/bin/env bash
# Interleaved tg128 A/B on the GPU machine: each variant once per round, ROUNDS rounds, so
# clock and thermal drift spread over all variants alike.
#   bash ci/ab-tg.sh PRESET ROUNDS "label|/abs/path/lode|VAR=1 VAR2=x" ...
# (an empty third field: no extra environment). Prints one line per variant and round.
set -uo pipefail
P=$1 ROUNDS=$2; shift 2
MD="${MODEL_TMP:-/tmp/lode-synth}"; mkdir -p "$MD"; M="$MD/$P.gguf"
first=${1#*|}; first=${first%%|*}
[ -f "$M" ] || "$first" synth --preset "$P" -o "$M" >/dev/null
for r in $(seq "$ROUNDS"); do
  for v in "$@"; do
    IFS='|' read -r label bin envs <<<"$v"
    line=$(env $envs "$bin" bench -m "$M" -p 0 -n 128 -r "${REPS:-3}" 2>&1 | grep '^bench:' | cut -d'(' -f1)
    echo "$P round $r $label: $line"
  done
done
