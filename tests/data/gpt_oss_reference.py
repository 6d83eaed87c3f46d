#!/usr/bin/env python3
"""An independent gpt-oss forward pass in NumPy, for `tests/gpt_oss_reference.rs`.

    python3 tests/data/gpt_oss_reference.py MODEL.gguf ID,ID,... OUT.f32 [ABLATION ...]

Reads the tensors with gguf-py (0.19.0) and dequantizes them with `gguf.quants`; it
does not call lode. Writes the logits of every position ([n_tokens, n_vocab]
little-endian f32) to OUT, and for each ABLATION (one of `ABLATIONS`: no attention
sinks, no clamp, no attention / router / expert biases, no YaRN (plain RoPE), no
window) the logits of the same pass with that part left out to OUT.ABLATION (the test
checks that lode's logits do not match those). Prints one line of statistics.

The arithmetic is llama.cpp's gpt-oss graph (`openai_moe`): RMS norms; q, k, v with
biases; NeoX RoPE with YaRN (factor and original context from the file, beta_fast 32,
beta_slow 1, cos/sin scaled by 1 + 0.1 ln factor); causal GQA attention over f32 K/V
with a 128-token (the file's) window on the even layers and one learned sink logit per
head in each softmax's denominator; the output projection with its bias; the FFN norm
(`post_attention_norm`); the MoE: router logits plus bias, the `expert_used_count`
largest, a softmax over those, each selected expert's gate and up plus their biases,
`swiglu_oai` (gate clamped above at 7, up to [-7, 7], gate * sigmoid(1.702 gate) *
(up + 1)), down plus its bias, weighted and summed. Each matrix product first rounds
its activations to the weight's dot type as llama.cpp's CPU backend does: Q8_0 for
Q8_0 and MXFP4 weights, none for F32. Everything else is float64.
"""
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

ALPHA, LIMIT = 1.702, 7.0
ABLATIONS = ("no-sinks", "no-clamp", "no-attn-bias", "no-router-bias", "no-expert-bias", "no-yarn", "no-window")


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
            w = t.data if t.tensor_type == T.F32 else dequantize(t.data, t.tensor_type)
            self.t[t.name] = (np.asarray(w, dtype=np.float64), t.tensor_type)

    def kv(self, k, default=None):
        return self.meta.get(f"gpt-oss.{k}", default)


def matmul(w, x):
    """x [n, k] times the weight (rows [rows, k]) with llama.cpp's activation rounding."""
    wv, ty = w
    if ty in (T.Q8_0, T.MXFP4):
        x = q8_0(x)
    elif ty != T.F32:
        raise SystemExit(f"no activation rounding for {ty.name} in this reference")
    return np.asarray(x, dtype=np.float64) @ wv.T


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def yarn_rope(x, pos, base, factor, orig_ctx, yarn=True):
    """NeoX RoPE with YaRN over all of each head (x [n, heads, d]); without `yarn`, plain
    NeoX RoPE."""
    d = x.shape[-1]
    half = d // 2
    i = np.arange(half, dtype=np.float64)
    extrap = pos[:, None].astype(np.float64) * base ** (-2.0 * i / d)[None, :]
    interp = extrap / factor

    def corr(beta):
        return d * np.log(orig_ctx / (beta * 2 * np.pi)) / (2 * np.log(base))

    lo, hi = max(0.0, np.floor(corr(32.0))), min(d - 1.0, np.ceil(corr(1.0)))
    ramp = 1.0 - np.clip((i - lo) / max(0.001, hi - lo), 0.0, 1.0)
    ang = interp * (1 - ramp) + extrap * ramp
    mscale = 1.0 + 0.1 * np.log(factor)
    if not yarn:
        ang, mscale = extrap, 1.0
    c, s = (np.cos(ang) * mscale)[:, None, :], (np.sin(ang) * mscale)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def forward(m, ids, drop=None):
    n = len(ids)
    L = m.kv("block_count")
    H, HKV, D = m.kv("attention.head_count"), m.kv("attention.head_count_kv"), m.kv("attention.key_length")
    eps, base = m.kv("attention.layer_norm_rms_epsilon"), m.kv("rope.freq_base")
    factor, orig = m.kv("rope.scaling.factor"), m.kv("rope.scaling.original_context_length")
    assert m.kv("rope.scaling.type") == "yarn"
    window, n_used = m.kv("attention.sliding_window"), m.kv("expert_used_count")
    w = lambda name: m.t[name]
    def bias(name):
        kind = "attn" if ".attn_" in name else "router" if "gate_inp" in name else "expert"
        return np.zeros_like(m.t[name][0]) if drop == f"no-{kind}-bias" else m.t[name][0]

    x = w("token_embd.weight")[0][ids]
    pos = np.arange(n)
    dist = pos[:, None] - pos[None, :]
    gaps, clamped = [], 0
    for l in range(L):
        b = lambda s: w(f"blk.{l}.{s}.weight")
        bb = lambda s: bias(f"blk.{l}.{s}.bias")
        h = rms_norm(x, b("attn_norm")[0], eps)
        q = (matmul(b("attn_q"), h) + bb("attn_q")).reshape(n, H, D)
        k = (matmul(b("attn_k"), h) + bb("attn_k")).reshape(n, HKV, D)
        v = (matmul(b("attn_v"), h) + bb("attn_v")).reshape(n, HKV, D)
        yarn = drop != "no-yarn"
        q, k = yarn_rope(q, pos, base, factor, orig, yarn), yarn_rope(k, pos, base, factor, orig, yarn)
        # llama.cpp's pattern: the even layers are sliding-window layers.
        visible = (dist >= 0) & ((dist < window) if l % 2 == 0 and drop != "no-window" else True)
        sinks = b("attn_sinks")[0]
        att = np.zeros((n, H, D))
        for hd in range(H):
            kv = hd // (H // HKV)
            s = np.where(visible, q[:, hd, :] @ k[:, kv, :].T / np.sqrt(D), -np.inf)
            mx = s.max(axis=1, keepdims=True)
            p = np.exp(s - mx)
            den = p.sum(axis=1, keepdims=True)
            if drop != "no-sinks":
                den = den + np.exp(sinks[hd] - mx)
            att[:, hd, :] = (p / den) @ v[:, kv, :]
        x = x + matmul(b("attn_output"), att.reshape(n, H * D)) + bb("attn_output")

        h = rms_norm(x, b("post_attention_norm")[0], eps)
        logits = matmul(b("ffn_gate_inp"), h) + bb("ffn_gate_inp")
        gate, up, down = b("ffn_gate_exps"), b("ffn_up_exps"), b("ffn_down_exps")
        gb, ub, db = bb("ffn_gate_exps"), bb("ffn_up_exps"), bb("ffn_down_exps")
        out = np.zeros_like(x)
        for t in range(n):
            order = np.argsort(-logits[t], kind="stable")
            sel = order[:n_used]
            gaps.append(logits[t, order[n_used - 1]] - logits[t, order[n_used]])
            z = np.exp(logits[t, sel] - logits[t, sel].max())
            wsel = z / z.sum()
            ht = h[t : t + 1]
            for ex, wt in zip(sel, wsel):
                g = matmul((gate[0][ex], gate[1]), ht) + gb[ex]
                u = matmul((up[0][ex], up[1]), ht) + ub[ex]
                clamped += int((g > LIMIT).sum() + (np.abs(u) > LIMIT).sum())
                if drop != "no-clamp":
                    g, u = np.minimum(g, LIMIT), np.clip(u, -LIMIT, LIMIT)
                a = g / (1.0 + np.exp(-ALPHA * g)) * (u + 1.0)
                out[t] += wt * (matmul((down[0][ex], down[1]), a)[0] + db[ex])
        x = x + out
    h = rms_norm(x, w("output_norm.weight")[0], eps)
    return matmul(w("output.weight"), h), min(gaps), clamped


def main():
    path, ids, out = sys.argv[1], np.array([int(s) for s in sys.argv[2].split(",")]), sys.argv[3]
    m = Model(path)
    logits, gap, clamped = forward(m, ids)
    logits.astype("<f4").tofile(out)
    for drop in sys.argv[4:]:
        assert drop in ABLATIONS, drop
        forward(m, ids, drop)[0].astype("<f4").tofile(f"{out}.{drop}")
    print(
        f"positions {len(ids)} vocab {logits.shape[1]} min_top_k_gap {gap:.3e} "
        f"clamped_values {clamped} max_abs_logit {np.abs(logits).max():.3f}"
    )


if __name__ == "__main__":
    main()
