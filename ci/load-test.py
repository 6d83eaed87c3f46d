#!/usr/bin/env python3
"""Load test of `lode serve` (or any OpenAI-compatible server) with concurrent streaming chats.

Starts the server (or attaches to one with --url, and --pid for its memory), then for each
client count in --clients runs that many concurrent streaming chat clients for --duration
seconds, each sending requests back to back, and reports per level: requests ok / failed,
aggregate generated tokens/s, time to first token p50 / p99, inter-token latency p50 / p99,
end-to-end latency, and the server's resident memory (/proc/PID/status, else /metrics) and
device memory (/metrics `lode_device_memory_bytes`) sampled over the run.

Three workloads (--mode):
  mixed   every request a distinct prompt of log-uniform length in [--prompt-min, --prompt-max]
          tokens (default 100 to 8,000, capped to the server's context): nothing to share but
          the chat template's own start (its default system line, where it has one).
  shared  every request the same --shared-tokens system prompt (default 2,000) and a distinct
          user message of [--user-min, --user-max] tokens, run twice: with the prompt cache
          (after one untimed request that puts the system prompt in a slot), then with
          `cache_prompt: false` (every prompt evaluated whole). Reports the hit rate
          (requests whose timings show cached tokens, and /metrics' lode_prompt_cache_*), the
          share of prompt tokens reused, and the TTFT the cache saves (p50 / p99, off − on).

  stall   --clients streams decode short prompts back to back while one more client sends
          --long-tokens prompts (default 8,000) one after another: the streams' inter-token latency
          while a long prompt is prefilling (p50 / p99 / max) against the rest of the time, the long
          prompts' TTFT, and /metrics' decode steps that waited for a prompt chunk (issue 26).

--greedy-check N first sends N greedy requests sharing the system prompt one at a time with
`cache_prompt: false`, then all at once with the cache, and compares the tokens (a difference
is a near-tie when the cold answer's top two log-probabilities there are within --tie).

HTTP client: the `openai` package when it imports (--client auto, the default), else the
Python standard library (http.client, SSE parsed by hand): machines without network or
without the package (the GPU machine's python3) need nothing installed. --client http forces
the standard library; --client openai requires the package (`python3 -m pip install openai`).

Prompt lengths are calibrated through the server's /tokenize (llama-server's endpoint):
random words at the measured tokens per word, so lengths are close, not exact; the actual
prompt tokens come back in each answer's usage.

Examples:
    # CPU, small scale (SmolLM2):
    python3 ci/load-test.py --model ~/.cache/lode/models/SmolLM2-135M-Instruct.Q4_1.gguf \\
        --device cpu --threads 2 --parallel 4 --ctx-size 2048 --clients 1,4 --duration 30 \\
        --prompt-max 1500 --shared-tokens 500 --user-max 100 --max-tokens 32
    # CPU, 4 streams while 8k-token prompts arrive (chunked prefill):
    python3 ci/load-test.py --device cpu --threads 2 --parallel 5 --ctx-size 8704 --mode stall \\
        --clients 4 --duration 120 --max-tokens 64 --user-max 60
    # GPU, a synthetic model (its tokens mostly print nothing: --logprobs makes every token
    # a chunk, so TTFT and inter-token latency see each one):
    python3 ci/load-test.py --lode carry/lode --model /tmp/qwen3-4b.gguf --device cuda \\
        --parallel 64 --ctx-size 8704 --clients 1,8,32,64 --duration 120 --logprobs
"""
import argparse
import http.client
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import threading
import time

WORDS = ("the and that with for this you are was have not but from they his her she which their will there "
         "would what about when your can said more like time one all were been has out some into them than "
         "then only could over also after just first new people world hello model token Paris France capital "
         "is of in to it on as at by be or an we he do if so up no my river city bread market light water "
         "garden window morning evening number letter story answer question music paper table winter summer").split()


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(math.ceil(p / 100 * len(xs))) - 1))
    return xs[k]


# ---------------------------------------------------------------- the server's side

class Target:
    def __init__(self, host, port, key, pid):
        self.host, self.port, self.key, self.pid = host, port, key, pid

    def headers(self):
        h = {"Content-Type": "application/json"}
        if self.key:
            h["Authorization"] = f"Bearer {self.key}"
        return h

    def call(self, method, path, body=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path, json.dumps(body) if body is not None else None, self.headers())
            r = conn.getresponse()
            data = r.read()
            if r.status != 200:
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {data[:200]!r}")
            return data.decode("utf-8", "replace")
        finally:
            conn.close()

    def metrics(self):
        out = {}
        try:
            for line in self.call("GET", "/metrics").splitlines():
                if line and not line.startswith("#"):
                    name, _, value = line.rpartition(" ")
                    try:
                        out[name] = float(value)
                    except ValueError:
                        pass
        except Exception:  # noqa: BLE001 - a server without /metrics
            pass
        return out

    def rss_mib(self, metrics=None):
        if self.pid:
            try:
                with open(f"/proc/{self.pid}/status") as f:
                    for line in f:
                        if line.startswith("VmRSS:"):
                            return int(line.split()[1]) / 1024
            except OSError:
                pass
        m = metrics if metrics is not None else self.metrics()
        v = m.get("lode_process_resident_memory_bytes")
        return v / 2**20 if v is not None else None

    def n_ctx(self):
        try:
            return json.loads(self.call("GET", "/props"))["default_generation_settings"]["n_ctx"]
        except Exception:  # noqa: BLE001
            return None

    def count_tokens(self, text):
        return len(json.loads(self.call("POST", "/tokenize", {"content": text}))["tokens"])


class Prompts:
    """Random-word texts of about N tokens, at the tokens per word /tokenize measured."""

    def __init__(self, target):
        rng = random.Random(12345)
        sample = " ".join(rng.choice(WORDS) for _ in range(4000))
        self.per_word = target.count_tokens(sample) / 4000

    def text(self, rng, tokens, tag=""):
        n = max(1, int(round(tokens / self.per_word)))
        return (tag + " " if tag else "") + " ".join(rng.choice(WORDS) for _ in range(n))


# ---------------------------------------------------------------- one streaming request

class Result:
    __slots__ = ("ok", "error", "ttft", "itl", "itl_at", "latency", "completion_tokens", "prompt_tokens", "cache_n", "t0")

    def __init__(self):
        self.ok, self.error, self.ttft, self.itl, self.latency = False, None, None, [], None
        self.itl_at = []  # when each inter-token gap ended (time.monotonic())
        self.t0 = None
        self.completion_tokens = self.prompt_tokens = 0
        self.cache_n = None


def body_for(messages, args, cache_prompt, seed):
    b = {"model": "lode", "messages": messages, "max_tokens": args.max_tokens, "temperature": args.temperature,
         "seed": seed, "stream": True, "stream_options": {"include_usage": True}}
    if not cache_prompt:
        b["cache_prompt"] = False
    if args.logprobs:
        b["logprobs"] = True
    return b


def stream_http(target, body, res):
    """The standard library's client: SSE lines by hand."""
    conn = http.client.HTTPConnection(target.host, target.port, timeout=900)
    t0 = res.t0 = time.monotonic()
    last = None
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), target.headers())
        resp = conn.getresponse()
        if resp.status != 200:
            res.error = f"HTTP {resp.status}: {resp.read()[:160]!r}"
            return
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
                res.error = f"stream error: {chunk['error'].get('message')}"
                return
            now = time.monotonic()
            for c in chunk.get("choices", []):
                d = c.get("delta") or {}
                if d.get("content") or d.get("reasoning_content") or d.get("tool_calls") or c.get("logprobs"):
                    if last is None:
                        res.ttft = now - t0
                    else:
                        res.itl.append(now - last)
                        res.itl_at.append(now)
                    last = now
            if chunk.get("usage"):
                res.completion_tokens = chunk["usage"].get("completion_tokens", 0)
                res.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
            if chunk.get("timings"):
                res.cache_n = chunk["timings"].get("cache_n")
        if not done:
            res.error = "stream ended without [DONE]"
            return
        res.latency = time.monotonic() - t0
        res.ok = True
    finally:
        conn.close()


def stream_openai(client, body, res):
    """The `openai` package's client."""
    extra = {}
    if "cache_prompt" in body:
        extra["cache_prompt"] = body["cache_prompt"]
    t0 = res.t0 = time.monotonic()
    last = None
    stream = client.chat.completions.create(
        model=body["model"], messages=body["messages"], max_tokens=body["max_tokens"], temperature=body["temperature"],
        seed=body["seed"], stream=True, stream_options={"include_usage": True}, logprobs=body.get("logprobs"),
        extra_body=extra or None)
    for chunk in stream:
        now = time.monotonic()
        for c in chunk.choices or []:
            d = c.delta
            extra_d = getattr(d, "model_extra", None) or {}
            if (d and (d.content or d.tool_calls or extra_d.get("reasoning_content"))) or c.logprobs:
                if last is None:
                    res.ttft = now - t0
                else:
                    res.itl.append(now - last)
                    res.itl_at.append(now)
                last = now
        if chunk.usage:
            res.completion_tokens = chunk.usage.completion_tokens or 0
            res.prompt_tokens = chunk.usage.prompt_tokens or 0
        timings = getattr(chunk, "timings", None) or (getattr(chunk, "model_extra", None) or {}).get("timings")
        if timings:
            res.cache_n = timings.get("cache_n")
    res.latency = time.monotonic() - t0
    res.ok = True


# ---------------------------------------------------------------- one level

def run_level(target, prompts, args, kind, clients, n_ctx, cache_prompt, system):
    results, lock = [], threading.Lock()
    deadline = time.monotonic() + args.duration
    room = (n_ctx or 10**9) - args.max_tokens - 64

    def client_loop(i):
        rng = random.Random(f"{kind}-{clients}-{cache_prompt}-{i}")
        oa = None
        if args.client_kind == "openai":
            import openai  # noqa: PLC0415 - optional
            oa = openai.OpenAI(base_url=f"http://{target.host}:{target.port}/v1", api_key=target.key or "none",
                               max_retries=0, timeout=900)
        k = 0
        while time.monotonic() < deadline:
            k += 1
            tag = f"Request {i}-{k}-{rng.randrange(10**9)}:"
            if system is None:
                lo, hi = args.prompt_min, min(args.prompt_max, room)
                n = int(math.exp(rng.uniform(math.log(lo), math.log(max(lo, hi)))))
                messages = [{"role": "user", "content": prompts.text(rng, n, tag)}]
            else:
                lo, hi = args.user_min, min(args.user_max, max(args.user_min, room - args.shared_tokens))
                n = int(math.exp(rng.uniform(math.log(lo), math.log(max(lo, hi)))))
                messages = [{"role": "system", "content": system}, {"role": "user", "content": prompts.text(rng, n, tag)}]
            body = body_for(messages, args, cache_prompt, rng.randrange(1 << 30))
            res = Result()
            try:
                if oa is not None:
                    stream_openai(oa, body, res)
                else:
                    stream_http(target, body, res)
            except Exception as e:  # noqa: BLE001 - every failure counts
                res.ok, res.error = False, f"{type(e).__name__}: {str(e)[:160]}"
            with lock:
                results.append(res)

    m0 = target.metrics()
    mem = []
    stop = threading.Event()

    def sampler():
        t0 = time.monotonic()
        while True:
            m = target.metrics()
            dev = m.get("lode_device_memory_bytes")
            mem.append((round(time.monotonic() - t0, 1), target.rss_mib(m), dev / 2**20 if dev is not None else None))
            if stop.wait(args.sample_every):
                break

    st = threading.Thread(target=sampler, daemon=True)
    st.start()
    t0 = time.monotonic()
    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    stop.set()
    st.join()
    m1 = target.metrics()

    ok = [r for r in results if r.ok]
    bad = [r for r in results if not r.ok]
    errors = {}
    for r in bad:
        errors[r.error] = errors.get(r.error, 0) + 1
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [x for r in ok for x in r.itl]
    gen = sum(r.completion_tokens for r in ok)
    rss = [x[1] for x in mem if x[1] is not None]
    dev = [x[2] for x in mem if x[2] is not None]
    # Memory after the first quarter (caches touched, graphs built) against the end: flat?
    warm = [x for x in mem if x[0] >= wall / 4]

    def drift(i):
        xs = [x[i] for x in warm if x[i] is not None]
        return round(xs[-1] - xs[0], 1) if len(xs) >= 2 else None

    out = {
        "mode": kind, "clients": clients, "cache_prompt": cache_prompt, "duration_s": round(wall, 1),
        "requests_ok": len(ok), "requests_failed": len(bad), "errors": errors,
        "generated_tokens": gen, "aggregate_tokens_per_s": round(gen / wall, 1),
        "prompt_tokens_mean": round(statistics.mean([r.prompt_tokens for r in ok]), 1) if ok else None,
        "prompt_tokens_max": max((r.prompt_tokens for r in ok), default=None),
        "ttft_p50_s": round(pct(ttft, 50), 4), "ttft_p99_s": round(pct(ttft, 99), 4),
        "itl_p50_ms": round(pct(itl, 50) * 1e3, 2), "itl_p99_ms": round(pct(itl, 99) * 1e3, 2),
        "latency_p50_s": round(pct([r.latency for r in ok], 50), 3),
        "latency_p99_s": round(pct([r.latency for r in ok], 99), 3),
        "no_token_chunks": sum(1 for r in ok if r.ttft is None and r.completion_tokens > 0),
        "rss_mib_start_end_peak": [round(rss[0], 1), round(rss[-1], 1), round(max(rss), 1)] if rss else None,
        "rss_mib_drift_after_warmup": drift(1),
        "device_mib_start_end_peak": [round(dev[0], 1), round(dev[-1], 1), round(max(dev), 1)] if dev else None,
        "device_mib_drift_after_warmup": drift(2),
        "memory_samples": mem,
    }
    timed = [r for r in ok if r.cache_n is not None]
    if timed:
        out["hit_rate_requests"] = round(sum(1 for r in timed if r.cache_n > 0) / len(timed), 4)
        pt = sum(r.prompt_tokens for r in timed)
        out["prompt_tokens_reused_share"] = round(sum(r.cache_n for r in timed) / pt, 4) if pt else None
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
    if "lode_prompt_cache_requests_total" in m1:
        out["metrics_cache_requests"] = d("lode_prompt_cache_requests_total")
        out["metrics_cache_hits"] = d("lode_prompt_cache_hits_total")
        out["metrics_tokens_cached"] = d("lode_prompt_tokens_cached_total")
        out["metrics_tokens_shared"] = d("lode_prompt_tokens_shared_total")
        out["metrics_tokens_evaluated"] = d("lode_prompt_tokens_total")
    return out


def show(r):
    pieces = [f"{r['mode']:6} x{r['clients']:<3} cache={'on ' if r['cache_prompt'] else 'off'}",
              f"ok {r['requests_ok']} failed {r['requests_failed']}",
              f"{r['aggregate_tokens_per_s']} t/s",
              f"TTFT p50/p99 {r['ttft_p50_s']:.3f}/{r['ttft_p99_s']:.3f} s",
              f"ITL p50/p99 {r['itl_p50_ms']:.1f}/{r['itl_p99_ms']:.1f} ms",
              f"prompt mean {r['prompt_tokens_mean']} max {r['prompt_tokens_max']}"]
    if r.get("hit_rate_requests") is not None:
        pieces.append(f"hits {r['hit_rate_requests']:.0%} reused {r.get('prompt_tokens_reused_share') or 0:.0%}")
    if r["rss_mib_start_end_peak"]:
        s, e, p = r["rss_mib_start_end_peak"]
        pieces.append(f"RSS {s}->{e} MiB (peak {p}, {r['rss_mib_drift_after_warmup']:+} after warm-up)"
                      if r["rss_mib_drift_after_warmup"] is not None else f"RSS {s}->{e} MiB")
    if r["device_mib_start_end_peak"] and r["device_mib_start_end_peak"][2] > 0:
        s, e, p = r["device_mib_start_end_peak"]
        pieces.append(f"device {s}->{e} MiB (peak {p})")
    print(" | ".join(pieces), flush=True)
    if r["errors"]:
        print(f"   errors: {r['errors']}", flush=True)
    if r["no_token_chunks"]:
        print(f"   {r['no_token_chunks']} answers had tokens but no chunk with text: rerun with --logprobs", flush=True)


# ---------------------------------------------------------------- stall: long prompts beside decoding streams

def run_stall(target, prompts, args, clients, n_ctx):
    """`clients` streams decode (short prompts, --max-tokens each, back to back) while one more
    client sends a --long-tokens prompt, waits for its answer (--long-max-tokens), pauses
    --long-gap seconds and sends another. Reports the decoding streams' inter-token latency
    p50 / p99 / max while a long prompt was being prefilled (from its send to its first
    token) and outside those windows, the long prompts' TTFT, and /metrics' prefill waits."""
    room = (n_ctx or 10**9) - args.long_max_tokens - 64
    deadline = time.monotonic() + args.duration
    decoders, longs, lock = [], [], threading.Lock()

    def one(messages, max_tokens, seed):
        body = body_for(messages, args, True, seed)
        body["max_tokens"] = max_tokens
        res = Result()
        try:
            stream_http(target, body, res)
        except Exception as e:  # noqa: BLE001 - every failure counts
            res.ok, res.error = False, f"{type(e).__name__}: {str(e)[:160]}"
        return res

    def decoder(i):
        rng = random.Random(f"stall-{clients}-{i}")
        k = 0
        while time.monotonic() < deadline:
            k += 1
            n = rng.randint(args.user_min, args.user_max)
            msgs = [{"role": "user", "content": prompts.text(rng, n, f"Stream {i}-{k}:")}]
            r = one(msgs, args.max_tokens, rng.randrange(1 << 30))
            with lock:
                decoders.append(r)

    def long_client():
        rng = random.Random(f"stall-long-{clients}")
        time.sleep(args.long_gap)
        k = 0
        while time.monotonic() < deadline:
            k += 1
            msgs = [{"role": "user", "content": prompts.text(rng, min(args.long_tokens, room), f"Long {k}:")}]
            r = one(msgs, args.long_max_tokens, rng.randrange(1 << 30))
            with lock:
                longs.append(r)
            time.sleep(args.long_gap)

    m0 = target.metrics()
    t0 = time.monotonic()
    threads = [threading.Thread(target=decoder, args=(i,), daemon=True) for i in range(clients)]
    threads.append(threading.Thread(target=long_client, daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    m1 = target.metrics()
    ok_long = [r for r in longs if r.ok and r.ttft is not None]
    windows = [(r.t0, r.t0 + r.ttft) for r in ok_long]
    inside, outside = [], []
    for r in decoders:
        if not r.ok:
            continue
        for gap, at in zip(r.itl, r.itl_at):
            # A gap that overlaps a prefill window (it ends after the window opens and
            # starts before it closes).
            (inside if any(at > a and at - gap < b for a, b in windows) else outside).append(gap)
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)  # noqa: E731
    bad = [r for r in decoders + longs if not r.ok]
    out = {
        "mode": "stall", "clients": clients, "cache_prompt": True, "duration_s": round(wall, 1),
        "requests_ok": len(decoders) + len(longs) - len(bad), "requests_failed": len(bad),
        "errors": {e: sum(1 for r in bad if r.error == e) for e in {r.error for r in bad}},
        "long_prompts": len(ok_long), "long_prompt_tokens_mean": round(statistics.mean([r.prompt_tokens for r in ok_long]), 1) if ok_long else None,
        "long_ttft_p50_s": round(pct([r.ttft for r in ok_long], 50), 3), "long_ttft_max_s": round(max((r.ttft for r in ok_long), default=float("nan")), 3),
        "itl_during_prefill_n": len(inside),
        "itl_during_prefill_p50_ms": round(pct(inside, 50) * 1e3, 1), "itl_during_prefill_p99_ms": round(pct(inside, 99) * 1e3, 1),
        "itl_during_prefill_max_ms": round(max(inside, default=float("nan")) * 1e3, 1),
        "itl_outside_p50_ms": round(pct(outside, 50) * 1e3, 1), "itl_outside_p99_ms": round(pct(outside, 99) * 1e3, 1),
        "decode_tokens_per_s": round(sum(r.completion_tokens for r in decoders if r.ok) / wall, 1),
    }
    if "lode_decode_prefill_wait_seconds_count" in m1:
        n = d("lode_decode_prefill_wait_seconds_count")
        out["metrics_prefill_waits"] = n
        out["metrics_prefill_wait_mean_ms"] = round(d("lode_decode_prefill_wait_seconds_sum") / n * 1e3, 1) if n else None
        out["metrics_prefill_wait_max_ms"] = round(m1["lode_decode_prefill_wait_seconds_max"] * 1e3, 1)
        out["metrics_prefill_chunks_mixed"] = d("lode_prefill_chunks_mixed_total")
    return out


def show_stall(r):
    print(f"stall  x{r['clients']:<3} ok {r['requests_ok']} failed {r['requests_failed']} | {r['long_prompts']} long prompts "
          f"(mean {r['long_prompt_tokens_mean']} tokens), TTFT p50/max {r['long_ttft_p50_s']}/{r['long_ttft_max_s']} s | "
          f"decoding streams' ITL while one prefills ({r['itl_during_prefill_n']} gaps) p50/p99/max "
          f"{r['itl_during_prefill_p50_ms']}/{r['itl_during_prefill_p99_ms']}/{r['itl_during_prefill_max_ms']} ms, "
          f"otherwise p50/p99 {r['itl_outside_p50_ms']}/{r['itl_outside_p99_ms']} ms | {r['decode_tokens_per_s']} t/s", flush=True)
    if "metrics_prefill_waits" in r:
        print(f"   /metrics: {r['metrics_prefill_waits']:.0f} decode steps waited for a prompt chunk, mean "
              f"{r['metrics_prefill_wait_mean_ms']} ms, max {r['metrics_prefill_wait_max_ms']} ms; "
              f"{r['metrics_prefill_chunks_mixed']:.0f} chunks mixed into decode steps", flush=True)
    if r["errors"]:
        print(f"   errors: {r['errors']}", flush=True)


# ---------------------------------------------------------------- greedy check

def greedy_check(target, system, prompts, args):
    """Greedy answers of N requests sharing the system prompt: each alone and cold
    (`cache_prompt: false`, one at a time), then all at once with the prompt cache. Returns
    (equal, differing at a near-tie, differing beyond it); a difference is a near-tie when the
    cold answer's top two log-probabilities at the first differing token are within --tie."""
    def ask(q, cache_prompt):
        body = {"model": "lode", "temperature": 0, "max_tokens": args.greedy_tokens, "logprobs": True, "top_logprobs": 2,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}], "cache_prompt": cache_prompt}
        v = json.loads(target.call("POST", "/v1/chat/completions", body))
        return [(t["token"], [x["logprob"] for x in t.get("top_logprobs", [])]) for t in v["choices"][0]["logprobs"]["content"]], \
            v.get("timings", {}).get("cache_n")

    qs = [prompts.text(random.Random(100 + i), 40, f"Question {i}:") for i in range(args.greedy_check)]
    cold = [ask(q, False) for q in qs]
    hot = [None] * len(qs)

    def one(i):
        try:
            hot[i] = ask(qs[i], True)
        except Exception as e:  # noqa: BLE001
            hot[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(qs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    equal, ties, beyond = 0, [], []
    for i, ((c, _), h) in enumerate(zip(cold, hot)):
        if isinstance(h, Exception):
            beyond.append((i, f"failed: {h}"))
            continue
        toks, cache_n = h
        if [t for t, _ in c] == [t for t, _ in toks]:
            equal += 1
            continue
        n = min(len(c), len(toks))
        j = next((k for k in range(n) if c[k][0] != toks[k][0]), n)
        tops = c[j][1] if j < len(c) else []
        margin = tops[0] - tops[1] if len(tops) >= 2 else float("inf")
        (ties if margin <= args.tie else beyond).append((i, f"token {j}: cold {c[j][0] if j < len(c) else None!r} vs "
                                                           f"{toks[j][0] if j < len(toks) else None!r}, cold margin {margin:.4f}, cache_n {cache_n}"))
    print(f"greedy check: {len(qs)} requests sharing the system prompt, alone and cold vs all at once with the cache: "
          f"{equal} equal, {len(ties)} differ at a near-tie (margin <= {args.tie}), {len(beyond)} differ beyond it", flush=True)
    for i, why in ties + beyond:
        print(f"   request {i}: {why}", flush=True)
    return {"mode": "greedy-check", "requests": len(qs), "equal": equal, "near_ties": ties, "beyond": beyond,
            "requests_failed": len(beyond)}


# ---------------------------------------------------------------- main

def start_server(args):
    cmd = [args.lode, "serve", "-m", args.model, "--port", "0", "--device", args.device,
           "--parallel", str(args.parallel), "--ctx-size", str(args.ctx_size if args.ctx_per_slot else args.ctx_size * args.parallel)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    cmd += shlex.split(args.server_args)
    print("server:", " ".join(cmd), flush=True)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in proc.stderr:
        sys.stderr.write("[server] " + line)
        m = re.search(r"listening on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(1), int(m.group(2))
    raise SystemExit(f"the server did not start (exit {proc.wait()})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lode", default="target/release/lode")
    ap.add_argument("--model", default=os.path.expanduser("~/.cache/lode/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx-size", type=int, default=8704, help="per slot: the server gets --parallel times this (lode's --ctx-size is the total, as llama-server's)")
    ap.add_argument("--ctx-per-slot", action="store_true", help="pass --ctx-size as it is (a lode from before --ctx-size became the total)")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--server-args", default="", help="more `lode serve` arguments, e.g. '-ctk q8_0 -ctv q8_0'")
    ap.add_argument("--url", help="attach to a running server (host:port) instead of starting one")
    ap.add_argument("--pid", type=int, help="the attached server's pid (for its RSS; else /metrics)")
    ap.add_argument("--api-key")
    ap.add_argument("--client", choices=["auto", "openai", "http"], default="auto")
    ap.add_argument("--mode", default="mixed,shared", help="mixed, shared, both or stall (comma-separated; empty: none)")
    ap.add_argument("--long-tokens", type=int, default=8000, help="stall mode: the long prompts' length")
    ap.add_argument("--long-max-tokens", type=int, default=8, help="stall mode: tokens generated for each long prompt")
    ap.add_argument("--long-gap", type=float, default=2.0, help="stall mode: seconds between a long answer and the next long prompt")
    ap.add_argument("--clients", default="1,8,32,64", help="concurrent clients per level, comma-separated")
    ap.add_argument("--duration", type=float, default=120, help="seconds per level (and per phase in shared mode)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--prompt-min", type=int, default=100)
    ap.add_argument("--prompt-max", type=int, default=8000)
    ap.add_argument("--shared-tokens", type=int, default=2000)
    ap.add_argument("--user-min", type=int, default=20)
    ap.add_argument("--user-max", type=int, default=400)
    ap.add_argument("--logprobs", action="store_true", help="ask for log-probabilities: every token its own chunk")
    ap.add_argument("--sample-every", type=float, default=2.0, help="memory sampling period, seconds")
    ap.add_argument("--greedy-check", type=int, default=0, metavar="N",
                    help="first compare N greedy answers sharing the system prompt: alone and cold vs concurrent with the cache")
    ap.add_argument("--greedy-tokens", type=int, default=32)
    ap.add_argument("--tie", type=float, default=0.05, help="log-probability margin under which a greedy difference is a near-tie")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()

    args.client_kind = "http"
    if args.client in ("auto", "openai"):
        try:
            import openai  # noqa: F401, PLC0415
            args.client_kind = "openai"
        except ImportError:
            if args.client == "openai":
                raise SystemExit("--client openai: the openai package is missing (python3 -m pip install openai)")
    print(f"client: {'openai ' + __import__('openai').__version__ if args.client_kind == 'openai' else 'http.client (standard library)'}",
          flush=True)

    proc = None
    if args.url:
        host, port = args.url.rsplit(":", 1)
        target = Target(host, int(port), args.api_key, args.pid)
    else:
        proc, host, port = start_server(args)
        target = Target(host, port, args.api_key, proc.pid)
    results = []
    try:
        n_ctx = target.n_ctx()
        prompts = Prompts(target)
        print(f"n_ctx per slot {n_ctx}; {prompts.per_word:.2f} tokens per word", flush=True)
        # Warm up (first-touch page faults, graph capture) outside the numbers.
        warm = Result()
        stream_http(target, body_for([{"role": "user", "content": "Hello"}], args, True, 1), warm)
        if not warm.ok:
            raise SystemExit(f"the warm-up request failed: {warm.error}")
        levels = [int(c) for c in args.clients.split(",") if c]
        modes = [m for m in args.mode.replace("both", "mixed,shared").split(",") if m]
        system = None
        if "shared" in modes or args.greedy_check:
            system = "You are the assistant of a shared service. " + prompts.text(random.Random(7), args.shared_tokens - 10)
            print(f"shared system prompt: {target.count_tokens(system)} tokens", flush=True)
        if args.greedy_check:
            results.append(greedy_check(target, system, prompts, args))
        for mode in modes:
            for c in levels:
                if mode == "mixed":
                    results.append(run_level(target, prompts, args, "mixed", c, n_ctx, True, None))
                    show(results[-1])
                elif mode == "shared":
                    # One untimed request first: the phase measures the steady state, where
                    # some slot already holds the system prompt.
                    warm = Result()
                    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Hello"}]
                    stream_http(target, body_for(msgs, args, True, 2), warm)
                    if not warm.ok:
                        raise SystemExit(f"the shared prompt's warm-up request failed: {warm.error}")
                    on = run_level(target, prompts, args, "shared", c, n_ctx, True, system)
                    show(on)
                    off = run_level(target, prompts, args, "shared", c, n_ctx, False, system)
                    show(off)
                    saved = {"mode": "shared-saved", "clients": c,
                             "ttft_p50_saved_s": round(off["ttft_p50_s"] - on["ttft_p50_s"], 4),
                             "ttft_p99_saved_s": round(off["ttft_p99_s"] - on["ttft_p99_s"], 4),
                             "hit_rate_requests": on.get("hit_rate_requests"),
                             "metrics_hit_rate": round(on["metrics_cache_hits"] / on["metrics_cache_requests"], 4)
                             if on.get("metrics_cache_requests") else None}
                    print(f"shared x{c}: prompt cache hit rate {saved['hit_rate_requests']} (/metrics {saved['metrics_hit_rate']}); "
                          f"TTFT saved p50 {saved['ttft_p50_saved_s']:.3f} s, p99 {saved['ttft_p99_saved_s']:.3f} s", flush=True)
                    results += [on, off, saved]
                elif mode == "stall":
                    results.append(run_stall(target, prompts, args, c, n_ctx))
                    show_stall(results[-1])
                else:
                    raise SystemExit(f"unknown mode {mode!r} (mixed, shared, both, stall)")
    finally:
        if proc:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = sum(r.get("requests_failed", 0) for r in results)
    print(f"failures: {failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
