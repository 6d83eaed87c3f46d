#!/usr/bin/env python3
"""An independent NumPy computation of a qwen35 / qwen35moe file's multi-token-prediction
block (`blk.{n_layer}.nextn.*`), for `tests/mtp_reference.rs`.

    python3 tests/data/qwen35_mtp_reference.py MODEL.gguf CASES OUT.f32 [VARIANT...]

CASES: `PROMPT_IDS:CHAIN_IDS` items separated by `/`, each list comma-separated.

The trunk is `qwen35_reference.py`'s (gguf-py 0.19.0's dequantized tensors; it does not
call lode). With h_p the trunk's hidden state at position p after `output_norm` (h_{-1} =
0), the block's row at position p takes a token t and a hidden vector g:
    c = [rms_norm(embd[t]) * enorm, rms_norm(g) * hnorm]     (embedding first)
    x = eh_proj . c, then one gated-attention decoder block (`blk.{n_layer}`'s tensors,
    qwen35_reference.py's attention and FFN), its causal attention over the block's own
    rows at positions 0..p
    g' = rms_norm(x) * shared_head_norm (output_norm where absent); logits = output . g'
Rows 0..n-1 (n = len(PROMPT_IDS)) are the prompt's: token PROMPT_IDS[p], g = h_{p-1}.
Then the drafting rows at n, n+1, ...: CHAIN_IDS[0] with g = h_{n-1}, then CHAIN_IDS[j]
with g = the previous row's g'. Writes the drafting rows' logits (little-endian f32,
n_vocab per row) to OUT: for the right block, then for each VARIANT, every case's rows in
order. The variants `--swap-concat` (hidden first) and `--no-hnorm` (g unnormed) compute
deliberately wrong blocks, which the test uses to show its bounds can fail.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen35_reference as q  # noqa: E402


def chain_logits(m, prompt, chain, drop):
    eps = m.kv("attention.layer_norm_rms_epsilon")
    L = m.kv("block_count") - m.kv("nextn_predict_layers", 0)
    w = lambda name: m.t[name]
    b = lambda s: w(f"blk.{L}.{s}")
    opt = lambda s, default: m.t.get(f"blk.{L}.nextn.{s}", m.t[default])
    embd = opt("embed_tokens.weight", "token_embd.weight")[0]
    head_norm = opt("shared_head_norm.weight", "output_norm.weight")[0]
    head = m.t.get(f"blk.{L}.nextn.shared_head_head.weight", m.t.get("output.weight", m.t["token_embd.weight"]))
    e = m.kv("embedding_length")
    h = q.rms_norm(q.trunk(m, prompt, None), w("output_norm.weight")[0], eps)

    def rows(tokens, gs):
        """The block over rows 0..len(tokens)-1 (causal), returning g' of every row."""
        en = q.rms_norm(embd[tokens], b("nextn.enorm.weight")[0], eps)
        hn = gs if drop == "--no-hnorm" else q.rms_norm(gs, b("nextn.hnorm.weight")[0], eps)
        c = np.concatenate([hn, en] if drop == "--swap-concat" else [en, hn], axis=1)
        x = q.matmul(b("nextn.eh_proj.weight"), c)
        x = x + q.attention(m, b, q.rms_norm(x, b("attn_norm.weight")[0], eps), eps, np.arange(len(tokens)))
        hf = q.rms_norm(x, b("post_attention_norm.weight")[0], eps)
        x = x + (q.moe(m, b, hf, None) if m.arch in ("qwen35moe", "qwen3next") else q.swiglu(b, hf, ""))
        return q.rms_norm(x, head_norm, eps)

    # Causal attention: a row's output depends only on the rows before it, so the chain
    # is computed by running the block over the growing sequence of rows.
    tokens = list(prompt) + [chain[0]]
    gs = np.concatenate([np.zeros((1, e)), h], axis=0)  # h_{p-1} for p = 0..n
    logits = []
    for j in range(len(chain)):
        g = rows(np.array(tokens), gs)
        logits.append(q.matmul(head, g[-1:])[0])
        if j + 1 < len(chain):
            tokens.append(chain[j + 1])
            gs = np.concatenate([gs, g[-1:]], axis=0)
    return np.array(logits)


def main():
    path, out = sys.argv[1], sys.argv[3]
    ids = lambda s: [int(v) for v in s.split(",")]
    cases = [(np.array(ids(c.split(":")[0])), ids(c.split(":")[1])) for c in sys.argv[2].split("/")]
    m = q.Model(path)
    rows = []
    for drop in [None] + sys.argv[4:]:
        for prompt, chain in cases:
            rows.append(chain_logits(m, prompt, chain, drop))
    logits = np.concatenate(rows, axis=0)
    logits.astype("<f4").tofile(out)
    print(f"cases {len(cases)} variants {len(sys.argv) - 3} rows {logits.shape[0]} max_abs_logit {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
