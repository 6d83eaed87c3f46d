#!/usr/bin/env python3
"""An independent qwen35 / qwen35moe (Qwen3.5 / 3.6) and qwen3next (Qwen3-Next) forward
pass in NumPy, for `tests/hybrid_reference.rs` and `tests/qwen3next_reference.rs`.

    python3 tests/data/qwen35_reference.py MODEL.gguf ID,ID,... OUT.f32 [--drop-conv|--drop-beta|--drop-shared-gate|--drop-grouping]

Reads the tensors with gguf-py (0.19.0) and dequantizes them with `gguf.quants`; it does
not call lode. Writes the logits of every position ([n_tokens, n_vocab] little-endian
f32) to OUT. `--drop-conv` / `--drop-beta` compute a deliberately wrong model (no
convolution: each channel is its current input; beta fixed at 1; the shared expert
ungated; `--drop-grouping`: qwen3next's value heads read as qwen35's, key head h mod
n_k), which the tests use to show their bounds can fail.

The arithmetic is llama.cpp's qwen35 graph, written from its math:
- every layer: x += mixer(rms_norm(x) * attn_norm); x += ffn(rms_norm(x) *
  post_attention_norm), a SwiGLU FFN;
- a recurrent layer (all but every `full_attention_interval`-th): projections qkv
  (attn_qkv), z (attn_gate), beta (ssm_beta), alpha (ssm_alpha); a causal depthwise
  convolution of qkv over the last `ssm.conv_kernel` inputs (zeros before the first),
  SiLU; q, k, v split, q and k L2-normalised (floor eps); beta = sigmoid, decay =
  exp(softplus(alpha + ssm_dt.bias) * ssm_a); per value head h (key head h mod
  n_k_heads) the state S (rows: value index) goes S = decay S; d = beta (v - S k);
  S += d k^T; o = S q / sqrt(head_k_dim); o RMS-normed per head with ssm_norm times
  silu(z); then ssm_out;
- an attention layer: attn_q gives each head's query then its gate; q/k per-head RMS
  norms, NeoX RoPE over the first rope.dimension_count dimensions, causal GQA
  attention (f32 K/V), times sigmoid(gate), then attn_output;
- qwen35moe's FFN: router logits (ffn_gate_inp), softmax over all experts, the
  expert_used_count most probable, their probabilities divided by their sum (clamped
  below at 2^-14), each selected expert's SwiGLU FFN weighted and summed, plus the shared
  expert's SwiGLU FFN times sigmoid(ffn_gate_inp_shexp . x).
- qwen3next (llama.cpp's qwen3next graph): qwen35moe's layers, except that the value
  heads are grouped by key head (value head h reads key head h // (n_v / n_k), the
  checkpoint's order), the gates come from one `ssm_ba` matrix whose output holds, per key
  head group, its value heads' beta logits then their alpha logits, and an older file's
  `ssm_in` replaces attn_qkv and attn_gate: per key head group its q (head_k_dim), k
  (head_k_dim), v and z (each n_v / n_k value heads wide); no rope sections (plain NeoX).
Like llama.cpp's CPU backend (and lode's), each matrix product first rounds its
activations to the weight's dot type (Q8_K for the K-quants); everything else is float64.
"""
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf.quants import dequantize

K_QUANTS = {T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}


def q8_k(x):
    """Rows of x through Q8_K and back: per 256 values, the signed value of largest
    magnitude sets iscale = -127/max; codes min(127, round-half-even)."""
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


class Model:
    def __init__(self, path):
        r = GGUFReader(path)
        self.meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("tokenizer.")}
        self.t = {}
        for t in r.tensors:
            w = t.data if t.tensor_type == T.F32 else dequantize(t.data, t.tensor_type)
            self.t[t.name] = (np.asarray(w, dtype=np.float64), t.tensor_type)

        self.arch = self.meta["general.architecture"]

    def kv(self, k, default=None):
        return self.meta.get(f"{self.arch}.{k}", default)


def matmul(w, x):
    wv, ty = w
    if ty in K_QUANTS:
        x = q8_k(x)
    elif ty != T.F32:
        raise SystemExit(f"no activation rounding for {ty.name} in this reference")
    return np.asarray(x, dtype=np.float64) @ wv.T


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * w


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def rope_neox(x, pos, base, n_rot):
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    ang = pos[:, None].astype(np.float64) * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c, rest], axis=-1)


def delta_net(m, b, l, h, eps, drop):
    n = h.shape[0]
    K, nk, nv = m.kv("ssm.conv_kernel"), m.kv("ssm.group_count"), m.kv("ssm.time_step_rank")
    hk = m.kv("ssm.state_size")
    hv = m.kv("ssm.inner_size") // nv
    kd = nk * hk
    r = nv // nk
    if f"blk.{l}.ssm_in.weight" in m.t:
        # Per key head group: q, k, then the group's v heads and z heads.
        g = matmul(b("ssm_in.weight"), h).reshape(n, nk, 2 * hk + 2 * r * hv)
        q_, k_ = g[:, :, :hk], g[:, :, hk : 2 * hk]
        v_, z_ = g[:, :, 2 * hk : 2 * hk + r * hv], g[:, :, 2 * hk + r * hv :]
        qkv = np.concatenate([q_.reshape(n, kd), k_.reshape(n, kd), v_.reshape(n, nv * hv)], axis=1)
        z = z_.reshape(n, nv, hv)
    else:
        qkv = matmul(b("attn_qkv.weight"), h)
        z = matmul(b("attn_gate.weight"), h).reshape(n, nv, hv)
    if f"blk.{l}.ssm_ba.weight" in m.t:
        ba = matmul(b("ssm_ba.weight"), h).reshape(n, nk, 2 * r)
        beta, alpha = sigmoid(ba[:, :, :r].reshape(n, nv)), ba[:, :, r:].reshape(n, nv)
    else:
        beta = sigmoid(matmul(b("ssm_beta.weight"), h))
        alpha = matmul(b("ssm_alpha.weight"), h)
    if drop == "--drop-beta":
        beta = np.ones_like(beta)
    conv_w = b("ssm_conv1d.weight")[0]  # [channels, K]
    if drop == "--drop-conv":
        xc = qkv
    else:
        padded = np.concatenate([np.zeros((K - 1, qkv.shape[1])), qkv], axis=0)
        xc = sum(padded[j : j + n] * conv_w[:, j][None, :] for j in range(K))
    xc = silu(xc)
    l2 = lambda a: a / np.maximum(np.sqrt((a * a).sum(axis=-1, keepdims=True)), eps)
    q = l2(xc[:, :kd].reshape(n, nk, hk))
    k = l2(xc[:, kd : 2 * kd].reshape(n, nk, hk))
    v = xc[:, 2 * kd :].reshape(n, nv, hv)
    decay = np.exp(softplus(alpha + b("ssm_dt.bias")[0]) * b("ssm_a")[0])
    if m.arch == "qwen3next" and drop != "--drop-grouping":
        kh = np.arange(nv) // r  # grouped by key head (llama.cpp's interleaved repeat)
    else:
        kh = np.arange(nv) % nk  # value head h reads key head h mod n_k (ggml's repeat)
    S = np.zeros((nv, hv, hk))
    o = np.zeros((n, nv, hv))
    for t in range(n):
        Q, Kt = q[t][kh], k[t][kh]
        S *= decay[t][:, None, None]
        sk = np.einsum("hji,hi->hj", S, Kt)
        d = (v[t] - sk) * beta[t][:, None]
        S += d[:, :, None] * Kt[:, None, :]
        o[t] = np.einsum("hji,hi->hj", S, Q) / np.sqrt(hk)
    o = rms_norm(o, b("ssm_norm.weight")[0], eps) * silu(z)
    return matmul(b("ssm_out.weight"), o.reshape(n, nv * hv))


def attention(m, b, h, eps, pos):
    n = h.shape[0]
    H, HKV, D = m.kv("attention.head_count"), m.kv("attention.head_count_kv"), m.kv("attention.key_length")
    base, n_rot = m.kv("rope.freq_base"), m.kv("rope.dimension_count")
    qg = matmul(b("attn_q.weight"), h).reshape(n, H, 2, D)
    q, gate = qg[:, :, 0, :], qg[:, :, 1, :].reshape(n, H * D)
    k = matmul(b("attn_k.weight"), h).reshape(n, HKV, D)
    v = matmul(b("attn_v.weight"), h).reshape(n, HKV, D)
    q = rope_neox(rms_norm(q, b("attn_q_norm.weight")[0], eps), pos, base, n_rot)
    k = rope_neox(rms_norm(k, b("attn_k_norm.weight")[0], eps), pos, base, n_rot)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    att = np.zeros((n, H, D))
    for hd in range(H):
        kv = hd // (H // HKV)
        s = q[:, hd, :] @ k[:, kv, :].T / np.sqrt(D) + mask
        p = np.exp(s - s.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        att[:, hd, :] = p @ v[:, kv, :]
    return matmul(b("attn_output.weight"), att.reshape(n, H * D) * sigmoid(gate))


def swiglu(b, h, suffix):
    g, u = matmul(b(f"ffn_gate{suffix}.weight"), h), matmul(b(f"ffn_up{suffix}.weight"), h)
    return matmul(b(f"ffn_down{suffix}.weight"), silu(g) * u)


def moe(m, b, h, drop):
    n_used = m.kv("expert_used_count")
    logits = matmul(b("ffn_gate_inp.weight"), h)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    gate, up, down = b("ffn_gate_exps.weight"), b("ffn_up_exps.weight"), b("ffn_down_exps.weight")
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        sel = np.argsort(-probs[t], kind="stable")[:n_used]
        wsel = probs[t, sel] / max(probs[t, sel].sum(), 6.103515625e-5)
        ht = h[t : t + 1]
        for ex, wt in zip(sel, wsel):
            g = matmul((gate[0][ex], gate[1]), ht)
            u = matmul((up[0][ex], up[1]), ht)
            out[t] += wt * matmul((down[0][ex], down[1]), silu(g) * u)[0]
    try:
        gi = b("ffn_gate_inp_shexp.weight")
    except KeyError:
        return out
    gate = 1.0 if drop == "--drop-shared-gate" else sigmoid(matmul((gi[0][None, :], gi[1]), h))
    return out + swiglu(b, h, "_shexp") * gate


def forward(m, ids, drop):
    eps = m.kv("attention.layer_norm_rms_epsilon")
    h = rms_norm(trunk(m, ids, drop), m.t["output_norm.weight"][0], eps)
    head = m.t.get("output.weight", m.t["token_embd.weight"])
    return matmul(head, h)


def trunk(m, ids, drop):
    """The residual stream after the last layer (before the output norm). The blocks past
    `block_count - nextn_predict_layers` are multi-token-prediction heads, not layers."""
    n = len(ids)
    L, eps = m.kv("block_count") - m.kv("nextn_predict_layers", 0), m.kv("attention.layer_norm_rms_epsilon")
    interval = m.kv("full_attention_interval", 4)
    w = lambda name: m.t[name]
    x = w("token_embd.weight")[0][ids]
    pos = np.arange(n)
    for l in range(L):
        b = lambda s: w(f"blk.{l}.{s}")
        h = rms_norm(x, b("attn_norm.weight")[0], eps)
        if (l + 1) % interval != 0:
            x = x + delta_net(m, b, l, h, eps, drop)
        else:
            x = x + attention(m, b, h, eps, pos)
        h = rms_norm(x, b("post_attention_norm.weight")[0], eps)
        x = x + (moe(m, b, h, drop) if m.arch in ("qwen35moe", "qwen3next") else swiglu(b, h, ""))
    return x


def main():
    path, ids, out = sys.argv[1], [int(s) for s in sys.argv[2].split(",")], sys.argv[3]
    drop = sys.argv[4] if len(sys.argv) > 4 else None
    logits = forward(Model(path), np.array(ids), drop)
    logits.astype("<f4").tofile(out)
    print(f"positions {len(ids)} vocab {logits.shape[1]} max_abs_logit {np.abs(logits).max():.3f} drop {drop}")


if __name__ == "__main__":
    main()
