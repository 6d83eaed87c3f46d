#!/usr/bin/env python3
"""Where a decode token's wall time goes, from an nsys trace (gpu-run.sh `timeline`).

argv[1]: the trace exported as SQLite (`nsys export --type sqlite`) of a
`lode bench -p 0 -n N` run. The GPU timeline is split at each device-to-host copy of
the logits (the largest D2H size); medians over the steady-state tokens: the token
period, the time kernels ran, the GPU's idle gap between the read and the next token's
first kernel, and the host API calls (CUDA driver/runtime) made in that gap.
"""
import sqlite3, statistics as st, sys, collections

db = sqlite3.connect(sys.argv[1])
tables = {r[0] for r in db.execute("select name from sqlite_master where type='table'")}
names = dict(db.execute("select id, value from StringIds"))
kern = []
if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
    kern = [(s, e, names.get(n, "?")) for s, e, n in db.execute("select start, end, shortName from CUPTI_ACTIVITY_KIND_KERNEL")]
if "CUPTI_ACTIVITY_KIND_GRAPH_TRACE" in tables:  # --cuda-graph-trace=graph: one span per graph launch
    kern += [(s, e, "graph") for s, e in db.execute("select start, end from CUPTI_ACTIVITY_KIND_GRAPH_TRACE")]
cp = list(db.execute("select start, end, bytes, copyKind from CUPTI_ACTIVITY_KIND_MEMCPY"))
kern.sort()
d2h = [c for c in cp if c[3] == 2]
big = max(c[2] for c in d2h)
reads = sorted(c for c in d2h if c[2] == big)
api = []
if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
    api = sorted((s, e, names.get(n, "?")) for s, e, n in db.execute("select start, end, nameId from CUPTI_ACTIVITY_KIND_RUNTIME"))
toks = []
ki = 0
for a, b in zip(reads, reads[1:]):
    ks = [k for k in kern if a[1] <= k[0] < b[0]]
    if not ks:
        continue
    busy, cur = 0, None
    for s, e, _ in ks:
        if cur is None or s > cur[1]:
            if cur:
                busy += cur[1] - cur[0]
            cur = [s, e]
        else:
            cur[1] = max(cur[1], e)
    busy += cur[1] - cur[0]
    h2d = [c for c in cp if a[1] <= c[0] < ks[0][0] and c[3] == 1]
    calls = [c for c in api if a[0] - 50_000 <= c[0] < ks[0][0]]
    toks.append(dict(period=b[1] - a[1], read=b[1] - b[0], busy=busy, n=len(ks), idle=ks[0][0] - a[1],
                     tail=b[0] - max(k[1] for k in ks), span=max(k[1] for k in ks) - ks[0][0],
                     h2d=len(h2d), h2d_ns=sum(c[1] - c[0] for c in h2d), calls=calls, a=a, first=ks[0][0],
                     firstname=ks[0][2]))
toks = toks[len(toks) // 4:]
med = lambda k: st.median(t[k] for t in toks)
us = lambda ns: f"{ns / 1e3:8.1f} us"
print(f"tokens {len(toks)} (steady state), logits read {big} bytes")
print(f"  period                   {us(med('period'))}  (= {1e9 / med('period'):.0f} t/s)")
print(f"  kernels busy             {us(med('busy'))}  over {med('n'):.0f} kernels (first→last span {med('span') / 1e3:.1f} us)")
print(f"  read end → first kernel  {us(med('idle'))}  ({med('h2d'):.0f} H2D copies, {med('h2d_ns') / 1e3:.1f} us; first kernel {toks[0]['firstname']})")
print(f"  last kernel → read start {us(med('tail'))}")
print(f"  logits read (D2H)        {us(med('read'))}")
if api:
    # host calls relative to the read's end (negative: started before it ended)
    agg = collections.defaultdict(list)
    for t in toks:
        for s, e, n in t["calls"]:
            agg[n].append((s - t["a"][1], e - s))
    print("  host API calls from the read's start to the first kernel (per token: count, median start after read end, median duration):")
    for n, v in sorted(agg.items(), key=lambda kv: st.median(x[0] for x in kv[1])):
        print(f"    {n[:44]:44} {len(v) / len(toks):5.1f}  {st.median(x[0] for x in v) / 1e3:8.1f} us  {st.median(x[1] for x in v) / 1e3:7.1f} us")
