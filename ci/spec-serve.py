#!/usr/bin/env python3
"""`lode serve` with speculative decoding beside a plain server, on one model (issue 29).

For each server (plain, then each --spec setting) and each client count in --clients: that
many concurrent greedy completions of --max-tokens tokens (distinct prompts, with
log-probabilities), all at once, --rounds times; prints the aggregate generated tokens/s,
the drafted / accepted tokens (timings.draft_n, draft_n_accepted; /metrics), the mean
drafting batch (lode_spec_draft_requests_total / lode_spec_draft_batches_total: slots
drafting together in one batched row of the MTP block or the draft model), and whether
every completion's tokens and log-probabilities equal the plain server's (greedy output
must be unchanged by speculation). Python standard library only (runs on the GPU machine).

    python3 ci/spec-serve.py --model /tmp/lode-synth/qwen35-27b-mtp.gguf --device cuda \\
        --spec "--spec-type draft-mtp --draft-max 3 --draft-p-min 0" --clients 1,4
"""
import argparse
import http.client
import json
import re
import subprocess
import sys
import threading
import time


def start(lode, model, device, parallel, ctx, extra):
    cmd = [lode, "serve", "-m", model, "--device", device, "--port", "0", "--parallel", str(parallel), "-c", str(ctx)] + extra.split()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    for line in p.stderr:
        m = re.search(r"listening on http://(\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m.group(1)
        if time.time() - t0 > 600:
            break
    p.kill()
    sys.exit(f"server did not start: {' '.join(cmd)}")


def post(addr, path, body):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {data[:300]!r}")
    return json.loads(data)


def metrics(addr):
    host, port = addr.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=60)
    c.request("GET", "/metrics")
    out = {}
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith("lode_spec_"):
            k, v = line.split()
            out[k] = float(v)
    return out


def level(addr, prompts, max_tokens, rounds):
    answers, drafted, accepted, tokens = [], 0, 0, 0
    t0 = time.time()
    for _ in range(rounds):
        res = [None] * len(prompts)

        def one(i):
            res[i] = post(addr, "/v1/completions", {"prompt": prompts[i], "max_tokens": max_tokens, "temperature": 0, "logprobs": 1})

        ts = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        [t.start() for t in ts]
        [t.join() for t in ts]
        for r in res:
            tm = r.get("timings", {})
            drafted += tm.get("draft_n", 0)
            accepted += tm.get("draft_n_accepted", 0)
            tokens += r["usage"]["completion_tokens"]
            lp = r["choices"][0]["logprobs"]
            answers.append((lp.get("tokens"), lp.get("token_logprobs")))
    return tokens / (time.time() - t0), drafted, accepted, answers


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lode", default="target/release/lode")
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx-size", type=int, default=2048)
    ap.add_argument("--spec", action="append", default=[], help="a speculative server's extra flags (repeatable)")
    ap.add_argument("--clients", default="1,4")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()
    base = "Repeat after me, word for word: the quick brown fox jumps over the lazy dog. Again: the quick brown fox"
    levels = [int(c) for c in a.clients.split(",")]
    want = {}
    for extra in [""] + a.spec:
        p, addr = start(a.lode, a.model, a.device, a.parallel, a.ctx_size, extra)
        try:
            post(addr, "/v1/completions", {"prompt": "warm up", "max_tokens": 4, "temperature": 0})
            for n in levels:
                prompts = [f"{base} ({i})" for i in range(n)]
                before = metrics(addr)
                tps, drafted, accepted, answers = level(addr, prompts, a.max_tokens, a.rounds)
                after = metrics(addr)
                d = lambda k: after.get(k, 0) - before.get(k, 0)
                batch = d("lode_spec_draft_requests_total") / d("lode_spec_draft_batches_total") if d("lode_spec_draft_batches_total") else 0
                same = "-" if not extra else ("yes" if answers == want[n] else "NO")
                if not extra:
                    want[n] = answers
                acc = f"{100 * accepted / drafted:.1f} %" if drafted else "-"
                print(f"{extra or 'plain':<55} clients {n:>2}: {tps:8.1f} tok/s  drafted {drafted:>6}  accepted {accepted:>6} ({acc})  mean draft batch {batch:.2f}  greedy same as plain: {same}", flush=True)
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
