#!/usr/bin/env bash
# Issue 29's Must-show line in one GPU call: decode tokens/s of plain greedy decoding
# beside speculative decoding with acceptance forced to 100 % (the oracle drafter, whose
# drafts are the plain continuation: the ceiling of verifying K tokens per pass; and the
# model drafting for itself) and at the measured acceptance (n-gram lookup; a smaller
# draft model of the same vocabulary), for `lode synth` presets and optional real models.
# Everything printed is also written to $OUT/spec-report.txt.
#   LODE=path/to/lode (default: carry/lode, else target/release/lode)
#   PRESETS="llama-8b qwen3-32b" (also gemma3-27b, qwen35-27b; PRESET:MIX picks a synth mix; "": none)
#   DRAFT_FOR_qwen3_32b=qwen3-0.6b (a preset drafting for a preset: same vocabulary)
#   REAL_MODELS="/tmp/smol.gguf" (real GGUFs: n-gram acceptance on real text, self-drafting;
#     a file with a multi-token-prediction block also drafts with it, --spec-type draft-mtp)
#   MTP_PRESETS="qwen35-27b-mtp" (presets with an MTP block: the block's drafting cost
#     beside plain decoding and the oracle; random weights make its acceptance near 0)
#   K="4 8" (draft lengths)  N=128 (generated tokens per row)  REPS=2
#   SERVE_CLIENTS="1,4" (lode serve with draft-mtp on each MTP preset, and n-gram lookup,
#     beside a plain server: aggregate tokens/s, acceptance, the mean drafting batch and
#     whether greedy answers equal the plain server's; ci/spec-serve.py; empty: skipped)
# Synthetic weights make greedy output one repeated token, so n-gram acceptance on them
# is near 100 % and a random draft's near 0: the ceiling and the floor; the real models'
# rows are the measured acceptance on text.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
LODE="${LODE:-$( [ -x carry/lode ] && echo carry/lode || echo target/release/lode)}"
PRESETS="${PRESETS-llama-8b qwen3-32b}"
K="${K:-4 8}"; N="${N:-128}"; REPS="${REPS:-2}"
MD="${MODEL_TMP:-/tmp/lode-synth}"; mkdir -p "$MD"
exec > >(tee -a "$OUT/spec-report.txt") 2>&1
echo "== lode spec-bench $(date -u +%FT%TZ) binary=$LODE"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
file_of() { echo "$MD/${1/:/-}.gguf"; }
synth() {  # synth PRESET[:MIX]
  local f; f=$(file_of "$1")
  [ -f "$f" ] || timeout -k 10 400 "$LODE" synth --preset "${1%%:*}" --quant "$( [ "${1#*:}" = "$1" ] && echo q4_k_m || echo "${1#*:}")" -o "$f" >/dev/null || echo "-- synth $1 failed"
  echo "$f"
}
rows() { grep -E "^\|" | grep -v -- "---"; }
bench() {  # bench FILE EXTRA...
  local f=$1; shift
  timeout -k 10 240 "$LODE" bench -m "$f" -p 0 -n "$N" -r "$REPS" "$@" 2>&1 | rows
}
for P in $PRESETS; do
  F=$(synth "$P"); [ -f "$F" ] || continue
  echo "== $P ($(du -h "$F" | cut -f1))"
  for k in $K; do
    # tgN (plain), tgN greedy, tgN spec ngram kK (measured), tgN spec oracle kK (100 %)
    bench "$F" --spec-type ngram-simple --spec-oracle --draft-max "$k"
  done
  echo "-- $P drafting for itself (acceptance 100 %, the draft costs a full pass per token)"
  bench "$F" --model-draft "$F" --draft-max 4 --draft-p-min 0 | grep spec
  var="DRAFT_FOR_$(echo "${P%%:*}" | tr -c 'a-zA-Z0-9\n' _)"
  D="${!var:-}"; [ -z "$D" ] && [ "${P%%:*}" = qwen3-32b ] && D=qwen3-0.6b
  if [ -n "$D" ]; then
    DF=$(synth "$D")
    echo "-- $P with $D drafting (random weights: acceptance near 0, the overhead floor)"
    bench "$F" --model-draft "$DF" --draft-max 4 --draft-p-min 0 | grep spec
  fi
done
for P in ${MTP_PRESETS-qwen35-27b-mtp}; do
  F=$(synth "$P"); [ -f "$F" ] || continue
  echo "== $P ($(du -h "$F" | cut -f1)): the model's MTP block drafting (--spec-type draft-mtp)"
  for k in $K; do
    # tgN (plain), tgN greedy, tgN spec mtp kK (the block's cost, acceptance ~0 here), oracle kK
    bench "$F" --spec-type draft-mtp --draft-p-min 0 --spec-oracle --draft-max "$k"
  done
done
if [ -n "${SERVE_CLIENTS-1,4}" ]; then
  for P in ${MTP_PRESETS-qwen35-27b-mtp}; do
    F=$(file_of "$P"); [ -f "$F" ] || continue
    echo "== $P in lode serve (--parallel 4): plain, the MTP block drafting, n-gram lookup"
    timeout -k 10 560 python3 ci/spec-serve.py --lode "$LODE" --model "$F" --device "${DEVICE:-auto}" --parallel 4 \
      --clients "${SERVE_CLIENTS-1,4}" --max-tokens "$N" --rounds 1 \
      --spec "--spec-type draft-mtp --draft-max 3 --draft-p-min 0" --spec "--spec-type ngram-simple --draft-max 8" ||
      echo "-- spec-serve $P failed"
  done
fi
PROMPT="Repeat after me, word for word: the quick brown fox jumps over the lazy dog, and the lazy dog sleeps in the warm sun. Again: the quick brown fox jumps over the lazy dog, and the lazy dog"
for G in ${REAL_MODELS:-}; do
  [ -f "$G" ] || { echo "-- $G absent"; continue; }
  echo "== real model $G"
  for k in $K; do bench "$G" --spec-type ngram-simple --spec-oracle --draft-max "$k"; done
  bench "$G" --model-draft "$G" --draft-max 8 --draft-p-min 0 | grep spec
  if "$LODE" inspect --json "$G" 2>/dev/null | python3 -c 'import json,sys; sys.exit(0 if json.load(sys.stdin).get("mtp") else 1)'; then
    echo "-- its MTP block drafting (measured acceptance)"
    for k in 1 2 3; do bench "$G" --spec-type draft-mtp --draft-p-min 0 --draft-max "$k" | grep spec; done
  fi
  echo "-- generate on repeated text: plain, then n-gram lookup (acceptance measured)"
  MTPRUN=$("$LODE" inspect --json "$G" 2>/dev/null | python3 -c 'import json,sys; print("--spec-type draft-mtp --draft-max 3 --draft-p-min 0" if json.load(sys.stdin).get("mtp") else "")' || true)
  for s in "" "--spec-type ngram-simple --draft-max 8" ${MTPRUN:+"$MTPRUN"}; do
    # shellcheck disable=SC2086
    timeout -k 10 120 "$LODE" generate -m "$G" -p "$PROMPT" -n "$N" --temp 0 --json $s 2>/dev/null |
      python3 -c 'import json,sys; d=json.load(sys.stdin); s=d.get("speculative") or {}; print("   gen_tps %.1f  acceptance %s  passes %s" % (d["timings"]["gen_tps"], s.get("acceptance", "-"), s.get("passes", "-")))' || echo "   (generate failed)"
  done
done
echo "== done $(date -u +%FT%TZ)"
