#!/usr/bin/env python3
"""Decode speed of `lode serve` with a json_schema constraint active vs off (not part of CI).

Against a running server (start it with `--parallel 8` or more), each round runs, in
this order, 1 stream off, 1 stream on, 8 streams off, 8 streams on: STREAMS concurrent
completion requests of --tokens tokens each, on one counting prompt (the model goes on
counting, so "off" runs to the token limit too). "on" adds a json_schema (an array of
forty long strings: it runs to the limit). Reported per setting, mean ± sd over the
rounds: the mean per-request decode speed (the server's `timings.predicted_per_second`)
and the aggregate speed (completion tokens of all streams / wall time of the batch);
then, from /metrics, the masks computed, the time the grammar threads spent on them and
the time sampling waited for one, against the decode time of the "on" requests.

    target/release/lode serve -m ~/.cache/lode/models/SmolLM2-135M-Instruct.Q4_1.gguf --parallel 8 --port 8091 &
    python3 ci/structured_bench.py --url http://127.0.0.1:8091 --rounds 5 --tokens 96

Only the Python standard library is used.
"""
import argparse
import json
import statistics
import threading
import time
import urllib.request

SCHEMA = {
    "type": "array",
    "items": {"type": "string", "minLength": 30, "maxLength": 60},
    "minItems": 40,
    "maxItems": 40,
}
PROMPT = "Counting: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        text = r.read().decode()
    return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l.startswith("lode_") and len(l.split()) == 2}


def request(url, constrained, tokens, seed):
    body = {
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0.8,
        "seed": seed,
    }
    if constrained:
        body["json_schema"] = SCHEMA
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def batch(url, constrained, streams, tokens, seed):
    out = [None] * streams

    def one(i):
        out[i] = request(url, constrained, tokens, seed + i)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    per = [r["timings"]["predicted_per_second"] for r in out]
    n = sum(r["usage"]["completion_tokens"] for r in out)
    return statistics.mean(per), n / wall, min(r["usage"]["completion_tokens"] for r in out), sum(r["timings"]["predicted_ms"] for r in out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=96)
    args = ap.parse_args()
    settings = [(1, False), (1, True), (8, False), (8, True)]
    res = {s: ([], []) for s in settings}
    batch(args.url, True, 1, 8, 0)  # warm-up (and the first schema compile)
    m0, on_decode_ms = metrics(args.url), 0.0
    for rnd in range(args.rounds):
        for streams, on in settings:
            per, agg, shortest, decode_ms = batch(args.url, on, streams, args.tokens, 1000 * rnd)
            on_decode_ms += decode_ms if on else 0.0
            res[(streams, on)][0].append(per)
            res[(streams, on)][1].append(agg)
            print(f"round {rnd}: {streams} stream(s), schema {'on ' if on else 'off'}: "
                  f"{per:6.2f} t/s per stream, {agg:6.2f} t/s aggregate (shortest answer {shortest} tokens)", flush=True)
    fmt = lambda xs: f"{statistics.mean(xs):.2f} ± {statistics.stdev(xs) if len(xs) > 1 else 0:.2f}"
    print("\n| streams | json_schema | per-stream decode t/s | aggregate t/s |")
    print("|---|---|---|---|")
    for streams, on in settings:
        per, agg = res[(streams, on)]
        print(f"| {streams} | {'on' if on else 'off'} | {fmt(per)} | {fmt(agg)} |")
    for streams in (1, 8):
        off, on = statistics.mean(res[(streams, False)][0]), statistics.mean(res[(streams, True)][0])
        print(f"{streams} stream(s): on / off = {on / off:.3f} per stream")
    m1 = metrics(args.url)
    d = lambda k: m1.get(k, 0.0) - m0.get(k, 0.0)
    masks = d("lode_grammar_masks_total")
    print(f"masks: {masks:.0f}; computing them: {d('lode_grammar_mask_seconds_total') * 1e3:.1f} ms "
          f"({d('lode_grammar_mask_seconds_total') * 1e6 / max(masks, 1):.0f} us each); sampling waited "
          f"{d('lode_grammar_wait_seconds_total') * 1e3:.1f} ms of the 'on' requests' {on_decode_ms:.0f} ms of decoding "
          f"({100 * d('lode_grammar_wait_seconds_total') * 1e3 / max(on_decode_ms, 1e-9):.2f} %)")


if __name__ == "__main__":
    main()
