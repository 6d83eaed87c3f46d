#!/usr/bin/env bash
# Decode batch for the GPU machine (one device call): kernel selftest + kernel bandwidth
# bench, tg128 of the three synthetic presets (fused, unfused, graphs off), an nsys
# kernel profile of qwen3-4b decode where nsys exists, and GPU-vs-CPU perplexity KLD of
# the real models reassembled under /tmp by earlier piece calls.
#   LODE=path/to/lode  STAGES="selftest bench profile kld" (default all)  CASES=N
set -uo pipefail
L="${LODE:-carry/decode/lode}"
OUT="${OUT:-$PWD/gpu-out}"; mkdir -p "$OUT"
STAGES="${STAGES:-selftest bench profile ncu synthkld kld}"
CASES="${CASES:-20}"
TXT="$(ls carry/alice29.txt carry/decode/alice29.txt 2>/dev/null | head -1)"
exec > >(tee -a "$OUT/report.txt") 2>&1
stage() { case " $STAGES " in *" $1 "*) return 0;; *) return 1;; esac; }
echo "== decode batch $(date -u +%FT%TZ) binary=$L"
echo "tools: nsys=$(command -v nsys || echo none) ncu=$(command -v ncu || echo none)"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null
rc=0
if stage selftest; then
  echo "== selftest"; "$L" selftest --device cuda --cases "$CASES" ${SELFTEST_BENCH---bench} | grep -v "^PASS" || rc=1
  for V in ${SELFTEST_VARIANTS:-}; do
    echo "== selftest, matvec checks and bench with $V"; env "$V" "$L" selftest --device cuda --cases "$CASES" --filter matvec --bench 2>&1 | grep -v "^PASS" || rc=1
  done
fi
if stage bench; then
  for P in qwen3-0.6b qwen3-4b llama-8b; do
    M=/tmp/$P.gguf
    [ -f "$M" ] || { t0=$(date +%s); "$L" synth --preset "$P" -o "$M" >/dev/null || { rc=1; continue; }; echo "synth $P: $(( $(date +%s) - t0 )) s"; }
    echo "== $P: fused (default)"; "$L" bench --device cuda -m "$M" ${DEFAULT_ARGS:--p 512 -n 128 -r 5} --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
    for V in ${VARIANTS:-LODE_MV=0}; do
      echo "== $P: $V"; env "$V" "$L" bench --device cuda -m "$M" -p 0 -n 128 -r 3 --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
    done
    echo "== $P: LODE_MV=0 LODE_FUSE=0 (main's kernels)"; LODE_MV=0 LODE_FUSE=0 "$L" bench --device cuda -m "$M" -p 0 -n 128 -r 3 --mem-bw 4270 2>&1 | grep -v '^bench:' || rc=1
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
if stage ncu && command -v ncu >/dev/null; then
  # Per-kernel GPU time and DRAM bytes of decode steps (eager launches: ncu times each
  # kernel alone, so the sum against the step time shows the launch gaps).
  for P in ${NCU_PRESETS:-qwen3-4b}; do
    echo "== ncu: $P, 4 decode steps after 4 (graphs off)"
    LODE_GRAPHS=0 timeout 240 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base --launch-skip "${NCU_SKIP:-600}" --launch-count "${NCU_COUNT:-900}" \
      "$L" bench --device cuda -m "/tmp/$P.gguf" -p 0 -n 8 -r 1 --no-warmup > "$OUT/ncu-$P.csv" 2>/dev/null
    python3 - "$OUT/ncu-$P.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 14]
if not rows: print("no ncu rows"); sys.exit(0)
h = rows[0]; ki, mi, vi = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value")
t = collections.defaultdict(lambda: [0, 0.0, 0.0])
for r in rows[1:]:
    v = float(r[vi].replace(",", ""))
    k = r[ki].split("(")[0]
    if r[mi] == "gpu__time_duration.sum": t[k][0] += 1; t[k][1] += v
    elif r[mi] == "dram__bytes_read.sum": t[k][2] += v
tot = sum(x[1] for x in t.values())
print(f"{'kernel':<24}{'calls':>6}{'us/call':>9}{'share':>7}{'GB/s':>7}")
for k, (n, ns, b) in sorted(t.items(), key=lambda kv: -kv[1][1]):
    print(f"{k:<24}{n:>6}{ns/n/1e3:>9.2f}{100*ns/tot:>6.1f}%{b/ns if ns else 0:>7.0f}")
print(f"total kernel time {tot/1e6:.3f} ms over {sum(x[0] for x in t.values())} launches")
PY
  done
fi
if stage synthkld; then
  for P in ${SYNTHKLD_PRESETS:-qwen3-0.6b}; do
    echo "== $P: GPU vs CPU (teacher-forced 128, greedy 32), then CPU vs nudged CPU (the floor)"
    "$L" selftest --device cuda --cases 0 --model "/tmp/$P.gguf" --tg 0 --gen 32 --text-tokens 128 2>&1 | tail -7
    "$L" selftest --device cpu --model "/tmp/$P.gguf" --perturb --text-tokens 128 2>&1 | tail -1
  done
fi
if stage kld && [ -n "$TXT" ]; then
  for M in /tmp/smol.gguf /tmp/gemma.gguf; do
    [ -f "$M" ] || { echo "-- $M absent"; continue; }
    echo "== KLD $M: sha256 $(sha256sum "$M" | cut -c1-16)"
    b=$(basename "$M" .gguf)
    "$L" bench --device cuda -m "$M" -p 512 -n 128 -r 3 2>&1 | grep -v '^bench:' || rc=1
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
