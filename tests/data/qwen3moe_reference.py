#!/usr/bin/env python3
"""An independent qwen3moe forward pass in NumPy, for `tests/moe_reference.rs`.

    python3 tests/data/qwen3moe_reference.py MODEL.gguf ID,ID,... OUT.f32

Reads the tensors with gguf-py (0.19.0) and dequantizes them with `gguf.quants`; it
does not call lode. Writes the logits of every position ([n_tokens, n_vocab]
little-endian f32) to OUT and prints one line of routing statistics.

The arithmetic is llama.cpp's qwen3moe graph: RMS norms, q/k per-head norms, NeoX RoPE,
causal GQA attention (f32 K/V), and the MoE FFN: router logits, softmax over all
experts, the `expert_used_count` most probable, their probabilities divided by their sum
(clamped below at 2^-14), each selected expert's SwiGLU FFN, the weighted outputs summed
most probable first. Like llama.cpp's CPU backend (and lode's), each matrix product
first rounds its activations to the weight's dot type: Q8_K for the K-quants, Q8_0 for
Q8_0, none for F32. Everything else is float64.
"""
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}


def q8_k(x):
    """Rows of x (float32) through Q8_K and back: per 256 values, the signed value of
    largest magnitude sets iscale = -127/max; codes min(127, round-half-even)."""
    b = x.astype(np.float32).reshape(-1, 256)
    idx = np.abs(b).argmax(axis=1)
    mx = b[np.arange(len(b)), idx]
    out = np.zeros_like(b)
    nz = mx != 0
    iscale = (np.float32(-127.0) / mx[nz]).astype(np.float32)
    q = np.minimum(127, np.rint(b[nz] * iscale[:, None]))
    d = (np.float32(1.0) / iscale).astype(np.float32)
    out[nz] = (d[:, None] * q.astype(np.float32)).astype(np.float32)
    return out.reshape(x.shape)


def q8_0(x):
    """Rows of x through Q8_0 and back: per 32 values d = max|x|/127 (stored f16), codes
    round(x·127/max)."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(axis=1)
    idv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(b * idv[:, None])
    d = (amax / np.float32(127.0)).astype(np.float16).astype(np.float32)
    return (q * d[:, None]).astype(np.float32).reshape(x.shape)


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
        self.t = {}
        for t in r.tensors:
            w = t.data if t.tensor_type in (T.F32,) else dequantize(t.data, t.tensor_type)
            self.t[t.name] = (np.asarray(w, dtype=np.float64), t.tensor_type)

    def kv(self, k):
        return self.meta[f"qwen3moe.{k}"]


def matmul(w, x):
    """x [n, k] times the weight (rows [rows, k]) with llama.cpp's activation rounding."""
    wv, ty = w
    if ty in K_QUANTS:
        x = q8_k(x)
    elif ty == T.Q8_0:
        x = q8_0(x)
    elif ty != T.F32:
        raise SystemExit(f"no activation rounding for {ty.name} in this reference")
    return np.asarray(x, dtype=np.float64) @ wv.T


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def rope_neox(x, pos, base):
    # x [n, heads, d]
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / d)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def forward(m, ids):
    n = len(ids)
    e, L = m.kv("embedding_length"), m.kv("block_count")
    H, HKV, D = m.kv("attention.head_count"), m.kv("attention.head_count_kv"), m.kv("attention.key_length")
    eps, base = m.kv("attention.layer_norm_rms_epsilon"), m.kv("rope.freq_base")
    n_used = m.kv("expert_used_count")
    w = lambda name: m.t[name]
    x = w("token_embd.weight")[0][ids]
    pos = np.arange(n)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    gaps = []
    for l in range(L):
        b = lambda s: w(f"blk.{l}.{s}.weight")
        h = rms_norm(x, b("attn_norm")[0], eps)
        q = matmul(b("attn_q"), h).reshape(n, H, D)
        k = matmul(b("attn_k"), h).reshape(n, HKV, D)
        v = matmul(b("attn_v"), h).reshape(n, HKV, D)
        q = rope_neox(rms_norm(q, b("attn_q_norm")[0], eps), pos, base)
        k = rope_neox(rms_norm(k, b("attn_k_norm")[0], eps), pos, base)
        att = np.zeros((n, H, D))
        for hd in range(H):
            kv = hd // (H // HKV)
            s = q[:, hd, :] @ k[:, kv, :].T / np.sqrt(D) + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            p /= p.sum(axis=1, keepdims=True)
            att[:, hd, :] = p @ v[:, kv, :]
        x = x + matmul(b("attn_output"), att.reshape(n, H * D))

        h = rms_norm(x, b("ffn_norm")[0], eps)
        logits = matmul(b("ffn_gate_inp"), h)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        gate, up, down = b("ffn_gate_exps"), b("ffn_up_exps"), b("ffn_down_exps")
        out = np.zeros_like(x)
        for t in range(n):
            order = np.argsort(-probs[t], kind="stable")
            sel = order[:n_used]
            gaps.append(probs[t, order[n_used - 1]] - probs[t, order[n_used]])
            wsel = probs[t, sel] / max(probs[t, sel].sum(), 6.103515625e-5)
            for ex, wt in zip(sel, wsel):
                ht = h[t : t + 1]
                g = matmul((gate[0][ex], gate[1]), ht)
                u = matmul((up[0][ex], up[1]), ht)
                a = g / (1.0 + np.exp(-g)) * u
                out[t] += wt * matmul((down[0][ex], down[1]), a)[0]
        x = x + out
    h = rms_norm(x, w("output_norm.weight")[0], eps)
    head = m.t.get("output.weight", m.t["token_embd.weight"])
    return matmul(head, h), min(gaps)


def main():
    path, ids, out = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
    logits, gap = forward(Model(path), np.array(ids))
    logits.astype("<f4").tofile(out)
    print(f"positions {len(ids)} vocab {logits.shape[1]} min_top_k_gap {gap:.3e} max_abs_logit {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
