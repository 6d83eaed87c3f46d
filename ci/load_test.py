#!/usr/bin/env python3
"""Bounded load test of `lode serve` on loopback (not part of CI).

Starts the server (or attaches to a running one with --url and --pid), runs CLIENTS
concurrent streaming chat clients for DURATION seconds, each sending requests back to
back, and reports: requests ok / failed, end-to-end latency and time-to-first-token
p50/p99, aggregate generated tokens/s, and the server's resident memory (VmRSS from
/proc/PID/status) at the start, the end and its peak.

    python3 ci/load_test.py --lode target/release/lode --model ~/.cache/lode/models/SmolLM2-135M-Instruct.Q4_1.gguf \
        --clients 32 --duration 120 --parallel 8 --threads 2

Only the Python standard library is used (http.client over threads).
"""
import argparse
import http.client
import json
import os
import random
import re
import statistics
import subprocess
import sys
import threading
import time

PROMPTS = [
    "Write a short poem about the sea.",
    "Explain what a CPU cache is in two sentences.",
    "List five animals that live in the desert.",
    "What is the capital of Italy, and what is it famous for?",
    "Give me three tips for learning to cook.",
    "Describe a sunrise to someone who has never seen one.",
    "Why is the sky blue?",
    "Summarize the plot of a heist movie in three sentences.",
]


def rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(p / 100 * (len(xs) - 1)))))
    return xs[k]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.errors = {}
        self.latency = []
        self.ttft = []
        self.tokens = 0

    def fail(self, why):
        with self.lock:
            self.failed += 1
            self.errors[why] = self.errors.get(why, 0) + 1


def one_request(host, port, key, max_tokens, rng, stats, deadline):
    body = json.dumps({
        "messages": [{"role": "user", "content": rng.choice(PROMPTS)}],
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": rng.randrange(1 << 30),
        "stream": True,
    })
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    t0 = time.monotonic()
    conn = http.client.HTTPConnection(host, port, timeout=600)
    try:
        conn.request("POST", "/v1/chat/completions", body, headers)
        resp = conn.getresponse()
        if resp.status != 200:
            stats.fail(f"HTTP {resp.status}: {resp.read()[:200]!r}")
            return
        first = None
        usage = None
        done = False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                stats.fail(f"stream error: {chunk['error'].get('message')}")
                return
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.monotonic() - t0
            if chunk.get("usage"):
                usage = chunk["usage"]
        if not done or usage is None:
            stats.fail("stream ended without [DONE] and usage")
            return
        latency = time.monotonic() - t0
        with stats.lock:
            stats.ok += 1
            stats.latency.append(latency)
            if first is not None:
                stats.ttft.append(first)
            stats.tokens += usage["completion_tokens"]
    except Exception as e:  # noqa: BLE001 - every failure counts
        stats.fail(f"{type(e).__name__}: {e}")
    finally:
        conn.close()


def client(i, host, port, key, max_tokens, stats, deadline):
    rng = random.Random(i)
    while time.monotonic() < deadline:
        one_request(host, port, key, max_tokens, rng, stats, deadline)


def start_server(args):
    cmd = [args.lode, "serve", "-m", args.model, "--port", "0", "--device", args.device,
           "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        sys.stderr.write("[server] " + line)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit("server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lode", default="target/release/lode")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/lode/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--url", help="attach to a running server (host:port) instead of starting one")
    ap.add_argument("--pid", type=int, help="the attached server's pid (for RSS)")
    ap.add_argument("--api-key")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx-size", type=int, default=1024)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    proc = None
    if args.url:
        host, port = args.url.split(":")
        port = int(port)
        pid = args.pid
    else:
        proc, host, port = start_server(args)
        pid = proc.pid
    try:
        # Warm up: one request, so page faults of the first touch are not in the numbers.
        warm = Stats()
        one_request(host, port, args.api_key, 8, random.Random(-1), warm, 0)
        if warm.failed:
            raise SystemExit(f"warm-up request failed: {warm.errors}")
        rss = [(0.0, rss_kb(pid))] if pid else []
        stats = Stats()
        t0 = time.monotonic()
        deadline = t0 + args.duration
        threads = [threading.Thread(target=client, args=(i, host, port, args.api_key, args.max_tokens, stats, deadline))
                   for i in range(args.clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            time.sleep(5)
            if pid:
                rss.append((time.monotonic() - t0, rss_kb(pid)))
        wall = time.monotonic() - t0
        if pid:
            rss.append((wall, rss_kb(pid)))
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)

    res = {
        "clients": args.clients,
        "duration_s": round(wall, 1),
        "parallel": args.parallel,
        "max_tokens": args.max_tokens,
        "requests_ok": stats.ok,
        "requests_failed": stats.failed,
        "errors": stats.errors,
        "latency_p50_s": round(pct(stats.latency, 50), 3),
        "latency_p99_s": round(pct(stats.latency, 99), 3),
        "ttft_p50_s": round(pct(stats.ttft, 50), 3),
        "ttft_p99_s": round(pct(stats.ttft, 99), 3),
        "generated_tokens": stats.tokens,
        "aggregate_tokens_per_s": round(stats.tokens / wall, 2),
        "rss_start_mib": round(rss[0][1] / 1024, 1) if rss and rss[0][1] else None,
        "rss_end_mib": round(rss[-1][1] / 1024, 1) if rss and rss[-1][1] else None,
        "rss_peak_mib": round(max(r for _, r in rss if r) / 1024, 1) if rss else None,
        "rss_samples_mib": [(round(t), round(r / 1024, 1)) for t, r in rss if r],
    }
    if stats.latency:
        res["latency_mean_s"] = round(statistics.mean(stats.latency), 3)
    print(json.dumps(res, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return 1 if stats.failed else 0


if __name__ == "__main__":
    sys.exit(main())
