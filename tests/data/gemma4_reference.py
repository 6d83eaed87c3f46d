#!/usr/bin/env python3
"""An independent gemma4 forward pass in NumPy, for `tests/gemma4_reference.rs`.

    python3 tests/data/gemma4_reference.py MODEL.gguf ID,ID,... OUT.f32 [ABLATION ...]

Reads the tensors with gguf-py (0.19.0) and dequantizes them with `gguf.quants`; it
does not call lode. Writes the logits of every position ([n_tokens, n_vocab]
little-endian f32) to OUT, and for each ABLATION (one of `ABLATIONS`) the logits of
the same pass with that part left out to OUT.ABLATION (the test checks that lode's
logits do not match those). Prints one line of statistics.

The arithmetic is llama.cpp's gemma4 graph (`src/models/gemma4.cpp`), text only: the
embeddings times sqrt(n_embd); per layer an RMS norm, q/k/v projections (a layer without
`attn_v` takes V from K's projection), q and k RMS-normed per head with their weights, V
without one, NeoX RoPE (sliding layers: `rope.freq_base_swa` over
`rope.dimension_count_swa` dimensions; full layers: `rope.freq_base` over
`rope.dimension_count` with `rope_freqs.weight` dividing each pair's frequency), causal
GQA attention with an unscaled q.k (the sliding layers over the last
`attention.sliding_window` keys), each kind of layer with its own head size and KV head
count (`attention.key_length_swa` / `key_length`, the per-layer `head_count_kv`), the
output projection, `post_attention_norm`, the residual; the FFN: `ffn_norm`, GELU(tanh)
gate times up, down, and in a MoE layer beside it the experts (input
`pre_ffw_norm_2`; gate and up from `ffn_gate_up_exps` (each expert's gate rows, then
its up rows) or the two separate tensors; the router's input an unweighted RMS norm times 1/sqrt(n_embd) times
`ffn_gate_inp.scale`; softmax over all experts, the `expert_used_count` most probable
renormalised, each expert's GELU FFN times its `ffn_down_exps.scale`), the dense part
normed by `post_ffw_norm_1`, the experts' sum by `post_ffw_norm_2`, added; then
`post_ffw_norm`, the residual, and the layer's output times `layer_output_scale`. After
the last layer the output norm, the LM head and `cap*tanh(logit/cap)`
(`final_logit_softcapping`).

As llama.cpp's CPU backend (and lode's) computes it: each matrix product first rounds its
activations to the weight's dot type (Q8_K for the K-quants, Q8_0 for Q8_0 and the
legacy types, none for F32), and GELU is read from ggml's f16 table (its input rounded
to f16, its result stored as f16). Everything else is float64.
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

# The activation rounding (Q8_K / Q8_0 and back) is the same as the qwen3moe reference's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from qwen3moe_reference import q8_0, q8_k  # noqa: E402

K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}
Q8_0_DOT = {T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1}
ABLATIONS = ("no-softcap", "no-vnorm", "no-rope-factors", "no-out-scale", "no-expert-scale", "router-on-expert-input")


def gelu_f16(x):
    """ggml's CPU GELU (tanh form) through its f16 table: 0 below -10, x above 10."""
    h = x.astype(np.float32).astype(np.float16).astype(np.float64)
    g = 0.5 * h * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * h * (1.0 + 0.044715 * h * h)))
    g = g.astype(np.float16).astype(np.float64)
    return np.where(x <= -10.0, 0.0, np.where(x >= 10.0, x, g))


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
        self.t = {}
        for t in r.tensors:
            w = t.data if t.tensor_type == T.F32 else dequantize(t.data, t.tensor_type)
            self.t[t.name] = (np.asarray(w, dtype=np.float64), t.tensor_type)

    def kv(self, k, default=None):
        return self.meta.get(f"gemma4.{k}", default)


def matmul(w, x):
    """x [n, k] times the weight (rows [rows, k]) with llama.cpp's activation rounding."""
    wv, ty = w
    if ty in K_QUANTS:
        x = q8_k(x)
    elif ty in Q8_0_DOT:
        x = q8_0(x)
    elif ty != T.F32:
        raise SystemExit(f"no activation rounding for {ty.name} in this reference")
    return np.asarray(x, dtype=np.float64) @ wv.reshape(-1, wv.shape[-1]).T


def rms_norm(x, w, eps):
    y = x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
    return y if w is None else y * w


def rope(x, pos, base, n_rot, factors=None):
    """NeoX RoPE of the first n_rot values of each head (x [n, heads, d]); `factors`
    divide each pair's frequency."""
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    freq = base ** (-2.0 * i / n_rot)
    if factors is not None:
        freq = freq / factors
    ang = pos[:, None].astype(np.float64) * freq[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c, x[..., n_rot:]], axis=-1)


def forward(m, ids, drop=None):
    n = len(ids)
    L, E = m.kv("block_count"), m.kv("embedding_length")
    H = m.kv("attention.head_count")
    kv_heads = m.kv("attention.head_count_kv")
    kv_heads = kv_heads if isinstance(kv_heads, list) else [kv_heads] * L
    pattern = m.kv("attention.sliding_window_pattern")
    eps, window = m.kv("attention.layer_norm_rms_epsilon"), m.kv("attention.sliding_window")
    cap = m.kv("final_logit_softcapping")
    n_used = m.kv("expert_used_count")
    w = lambda name: m.t[name]
    has = lambda name: name in m.t
    factors = w("rope_freqs.weight")[0] if has("rope_freqs.weight") and drop != "no-rope-factors" else None

    x = w("token_embd.weight")[0][ids] * np.sqrt(np.float32(E))
    pos = np.arange(n)
    dist = pos[:, None] - pos[None, :]
    gaps = []
    for l in range(L):
        b = lambda s: w(f"blk.{l}.{s}")
        swa = pattern[l]
        D = m.kv("attention.key_length_swa") if swa else m.kv("attention.key_length")
        n_rot = m.kv("rope.dimension_count_swa") if swa else m.kv("rope.dimension_count")
        base = m.kv("rope.freq_base_swa", 10000.0) if swa else m.kv("rope.freq_base")
        HKV = kv_heads[l]
        h = rms_norm(x, b("attn_norm.weight")[0], eps)
        q = matmul(b("attn_q.weight"), h).reshape(n, H, D)
        k_raw = matmul(b("attn_k.weight"), h).reshape(n, HKV, D)
        v = matmul(b("attn_v.weight"), h).reshape(n, HKV, D) if has(f"blk.{l}.attn_v.weight") else k_raw.copy()
        q = rms_norm(q, b("attn_q_norm.weight")[0], eps)
        k = rms_norm(k_raw, b("attn_k_norm.weight")[0], eps)
        if drop != "no-vnorm":
            v = rms_norm(v, None, eps)
        f = None if swa else factors
        q, k = rope(q, pos, base, n_rot, f), rope(k, pos, base, n_rot, f)
        visible = (dist >= 0) & ((dist < window) if swa else True)
        att = np.zeros((n, H, D))
        for hd in range(H):
            kvh = hd // (H // HKV)
            s = np.where(visible, q[:, hd, :] @ k[:, kvh, :].T, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hd, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kvh, :]
        a = matmul(b("attn_output.weight"), att.reshape(n, H * D))
        x = x + rms_norm(a, b("post_attention_norm.weight")[0], eps)

        hn = rms_norm(x, b("ffn_norm.weight")[0], eps)
        g = gelu_f16(matmul(b("ffn_gate.weight"), hn)) * matmul(b("ffn_up.weight"), hn)
        dense = matmul(b("ffn_down.weight"), g)
        if has(f"blk.{l}.ffn_gate_inp.weight"):
            dense = rms_norm(dense, b("post_ffw_norm_1.weight")[0], eps)
            xe = rms_norm(x, b("pre_ffw_norm_2.weight")[0], eps)
            if drop == "router-on-expert-input":
                xr = xe
            else:
                xr = rms_norm(x, None, eps) / np.sqrt(E) * b("ffn_gate_inp.scale")[0]
            logits = matmul(b("ffn_gate_inp.weight"), xr)
            down = b("ffn_down_exps.weight")
            if has(f"blk.{l}.ffn_gate_up_exps.weight"):
                # One tensor: each expert's gate rows, then its up rows.
                gu, ty = b("ffn_gate_up_exps.weight")
                f = gu.shape[1] // 2
                gate, up = (gu[:, :f, :], ty), (gu[:, f:, :], ty)
            else:
                gate, up = b("ffn_gate_exps.weight"), b("ffn_up_exps.weight")
            scale = b("ffn_down_exps.scale")[0] if drop != "no-expert-scale" else np.ones(logits.shape[1])
            out = np.zeros_like(x)
            for t in range(n):
                z = np.exp(logits[t] - logits[t].max())
                prob = z / z.sum()
                order = np.argsort(-prob, kind="stable")
                sel = order[:n_used]
                gaps.append(prob[order[n_used - 1]] - prob[order[n_used]])
                wsel = prob[sel] / max(prob[sel].sum(), 6.103515625e-5)
                xt = xe[t : t + 1]
                for ex, wt in zip(sel, wsel):
                    ge = gelu_f16(matmul((gate[0][ex], gate[1]), xt)) * matmul((up[0][ex], up[1]), xt)
                    out[t] += wt * (matmul((down[0][ex], down[1]), ge)[0] * scale[ex])
            dense = dense + rms_norm(out, b("post_ffw_norm_2.weight")[0], eps)
        x = x + rms_norm(dense, b("post_ffw_norm.weight")[0], eps)
        if has(f"blk.{l}.layer_output_scale.weight") and drop != "no-out-scale":
            x = x * b("layer_output_scale.weight")[0][0]
    h = rms_norm(x, w("output_norm.weight")[0], eps)
    head = w("output.weight") if has("output.weight") else w("token_embd.weight")
    logits = matmul(head, h)
    if cap and drop != "no-softcap":
        logits = cap * np.tanh(logits / cap)
    return logits, (min(gaps) if gaps else float("nan"))


def main():
    path, ids, out = sys.argv[1], np.array([int(s) for s in sys.argv[2].split(",")]), sys.argv[3]
    m = Model(path)
    logits, gap = forward(m, ids)
    logits.astype("<f4").tofile(out)
    for drop in sys.argv[4:]:
        assert drop in ABLATIONS, drop
        forward(m, ids, drop)[0].astype("<f4").tofile(f"{out}.{drop}")
    print(f"positions {len(ids)} vocab {logits.shape[1]} min_top_k_gap {gap:.3e} max_abs_logit {np.abs(logits).max():.3f}")


if __name__ == "__main__":
    main()
