#!/usr/bin/env bash
# Decode batch for the GPU machine (one device call): kernel selftest + kernel bandwidth
# bench, tg128 of the three synthetic presets (fused, unfused, graphs off), an nsys
# kernel profile of qwen3-4b decode where nsys exists, and GPU-vs-CPU perplexity KLD of
# the real models reassembled under /tmp by earlier piece calls.
#   LODE=path/to/lode  STAGES="selftest bench profile kld" (default all)  CASES=N
set -uo pipefail
L="${LODE:-carry/decode/lode}"
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
STAGES="${STAGES:-selftest bench profile kld}"
CASES="${CASES:-20}"
TXT="$(ls carry/alice29.txt carry/decode/alice29.txt 2>/dev/null | head -1)"
exec > >(tee -a "$OUT/report.txt") 2>&1
stage() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }
echo "== decode batch $(date -u +%FT%TZ) binary=$L"
echo "tools: nsys=$(command -v nsys || echo none) ncu=$(command -v ncu || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
rc=0
if stage selftest; then
  echo "== selftest"; "$L" selftest --device cuda --cases "$CASES" --bench || rc=1
fi
if stage bench; then
  for P in qwen3-0.6b qwen3-4b llama-8b; do
    M=/tmp/$P.gguf
    [ -f "$M" ] || { t0=$(date +%s); "$L" synth --preset "$P" -o "$M" >/dev/null || { rc=1; continue; }; echo "synth $P: $(( $(date +%s) - t0 )) s"; }
    echo "== $P: fused (default)"; "$L" bench --device cuda -m "$M" -p 512 -n 128 -r 5 --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
    echo "== $P: LODE_FUSE=0"; LODE_FUSE=0 "$L" bench --device cuda -m "$M" -p 0 -n 128 -r 3 --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
    if [ -n "${GRAPHS_OFF:-}" ]; then
      echo "== $P: LODE_GRAPHS=0"; LODE_GRAPHS=0 "$L" bench --device cuda -m "$M" -p 0 -n 128 -r 3 --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
    fi
  done
fi
if stage profile && command -v nsys >/dev/null; then
  for P in ${PROFILE_PRESETS:-qwen3-4b}; do
    echo "== nsys kernel summary: $P decode (graph nodes traced)"
    nsys profile --cuda-graph-trace=node -o "/tmp/prof-$P" --force-overwrite true \
      "$L" bench --device cuda -m "/tmp/$P.gguf" -p 0 -n 64 -r 1 --no-warmup >/dev/null 2>&1
    nsys stats --report cuda_gpu_kern_sum --format csv "/tmp/prof-$P.nsys-rep" 2>/dev/null | cut -d, -f1-9 | head -40
  done
fi
if stage kld && [ -n "$TXT" ]; then
  for M in /tmp/smol.gguf /tmp/gemma.gguf; do
    [ -f "$M" ] || { echo "-- $M absent"; continue; }
    echo "== KLD $M: sha256 $(sha256sum "$M" | cut -c1-16)"
    b=$(basename "$M" .gguf)
    "$L" perplexity -m "$M" -f "$TXT" --ctx 512 --chunks "${CHUNKS:-8}" --device cpu --save-logits "/tmp/$b-cpu.logits" 2>&1 | grep -E "^(Final|PPL|perplexity: [0-9]+ tokens)" 
    for mode in default ${KLD_MODES:-}; do
      echo "-- GPU ($mode) vs CPU"
      env ${mode/default/X=1} "$L" perplexity -m "$M" -f "$TXT" --ctx 512 --chunks "${CHUNKS:-8}" --device cuda \
        --kl-divergence-base "/tmp/$b-cpu.logits" 2>&1 | grep -E "Final|Mean|Maximum KLD|99.0%|Median|Same top"
    done
    echo "-- greedy GPU vs CPU"
    "$L" selftest --device cuda --cases 0 --model "$M" --tg 0 --gen 32 --text-tokens 128 2>&1 | tail -8
  done
fi
echo "== done rc=$rc $(date -u +%T)"
exit $rc
