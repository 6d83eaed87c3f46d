// RMSNorm (whole rows or per head) and RoPE (NORM and NEOX pairing, frequency factors).
#include "common.h"

// y[r][i] = x[r][i] / sqrt(mean_i x[r][i]^2 + eps) * w[i]   (w may be null: no weight)
// x, y: [rows, n] f32 (y may alias x); w: [n]. grid (rows), block 256.
// Per-head norm (q/k norm) is the same call with rows = n_tok * n_head, n = head_dim.
KERNEL void rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps) { pdl_entry();
    __shared__ float red[8];
    const u64 base = (u64)bid_x() * n;
    const int t = tid_x();
    float ss = 0.0f;
    for (int i = t; i < n; i += 256) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = warp_sum(ss);
    if ((t & 31) == 0) red[t >> 5] = ss;
    sync();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += red[i];
    const float scale = 1.0f / sqrt_f(tot / (float)n + eps);
    for (int i = t; i < n; i += 256) {
        const float v = x[base + i] * scale;
        y[base + i] = w ? v * w[i] : v;
    }
}

// The RMSNorm + q8_1 body shared by rmsnorm_q8_f32 and add_rmsnorm_q8_f32, one row per
// 1024-thread block. A decode step runs these on a single row, so a strided loop over
// the row was one memory round trip per 256 elements (latency-bound: ~14 us for 2560
// values); here every thread loads its (up to NORM_E) values at once and keeps them in
// registers. Element i = t + 1024 j: a warp's 32 lanes hold 32 consecutive values, i.e.
// one q8_1 block. Rows longer than 1024 * NORM_E use the strided loop.
// x_out: where x + r goes (null: nowhere); r: null for a plain norm.
#define NORM_E 8
// kfmt = 1: q gets the K form (quantize.hip) of y instead of q8_1 (n % 256 == 0).
DEV void norm_q8_row(const float* x, const float* r, float* x_out, const float* w, float* y, block_q8_1* q, int n, float eps, int kfmt) {
    __shared__ float red[32];
    __shared__ float tot_s;
    const u64 base = (u64)bid_x() * n;
    const int t = tid_x(), lane = t & 31;
    block_q8_1* qr = q + (u64)bid_x() * (n / 32);
    float ss = 0.0f;
    const bool held = n <= 1024 * NORM_E;
    float v[NORM_E];
    if (held) {
#pragma unroll
        for (int j = 0; j < NORM_E; ++j) {
            const int i = t + 1024 * j;
            v[j] = 0.0f;
            if (i < n) {
                float a = x[base + i];
                if (r) a += r[base + i];
                v[j] = a;
                ss += a * a;
            }
        }
    } else {
        for (int i = t; i < n; i += 1024) {
            float a = x[base + i];
            if (r) a += r[base + i];
            ss += a * a;
        }
    }
    ss = warp_sum(ss);
    if (lane == 0) red[t >> 5] = ss;
    sync();
    if (t < 32) {
        const float s = warp_sum(red[t]);
        if (t == 0) tot_s = s;
    }
    sync();
    const float scale = 1.0f / sqrt_f(tot_s / (float)n + eps);
    if (held) {
#pragma unroll
        for (int j = 0; j < NORM_E; ++j) {
            const int i = t + 1024 * j;
            if (i < n) {  // warp-uniform: n % 32 == 0
                if (x_out) x_out[base + i] = v[j];
                float o = v[j] * scale;
                if (w) o *= w[i];
                y[base + i] = o;
                if (!kfmt) q8_block_store(qr + i / 32, o);
            }
        }
    } else {
        for (int i = t; i < n; i += 1024) {
            float a = x[base + i];
            if (r) a += r[base + i];
            float o = a * scale;
            if (w) o *= w[i];
            y[base + i] = o;
            if (!kfmt) q8_block_store(qr + i / 32, o);
        }
        if (x_out) {
            sync();  // every thread has read its x before any is overwritten
            for (int i = t; i < n; i += 1024) x_out[base + i] = x[base + i] + r[base + i];
        }
    }
    if (kfmt) {
        sync(); // the row of y is written
        q8k_row_store(y + base, qr, n, 1024);
    }
}

// rmsnorm_f32 plus the q8_1 form of y for the matvec that follows (saves a launch).
// x, y: [rows, n] f32 (may alias); q: [rows, n / 32] block_q8_1; n % 32 == 0.
// grid (rows), block 1024.
KERNEL LAUNCH_BOUNDS(1024) void rmsnorm_q8_f32(const float* x, const float* w, float* y, block_q8_1* q, int n, float eps, int kfmt) { pdl_entry();
    norm_q8_row(x, 0, 0, w, y, q, n, eps, kfmt);
}

// The rotation angle of pair i at position p exactly as the CPU backend (and ggml) computes
// it: theta starts at p and is multiplied by theta_scale = base^(-2/n_rot) once per pair,
// in f32; then freq_scale * (theta / ff_i). Matching this rounding (rather than an exact
// inverse frequency) keeps GPU and CPU logits within the fidelity gate.
DEV float rope_angle(int p, int i, float theta_scale, float freq_scale, const float* ff) {
    float theta = (float)p;
    for (int j = 0; j < i; ++j) theta *= theta_scale;
    const float f = ff ? ff[i] : 1.0f;
    return freq_scale * (theta / f);
}

// In-place RoPE on x: [n_tok, n_head, head_dim] f32 (row stride = n_head * head_dim).
// pos: [n_tok] i32. ff: [n_rot / 2] f32 frequency divisors or null. Dims >= n_rot pass
// through. neox = 0: pairs (2i, 2i+1); neox = 1: pairs (i, i + n_rot/2).
// grid (n_tok, n_head), block 128: thread i handles pairs i, i+128, …
KERNEL void rope_f32(float* x, const int* pos, const float* ff, int n_head, int head_dim, int n_rot, int neox,
                     float theta_scale, float freq_scale, float attn_factor) { pdl_entry();
    const int tok = bid_x(), head = bid_y();
    float* v = x + ((u64)tok * n_head + head) * head_dim;
    const int p = pos[tok];
    const int half = n_rot / 2;
    for (int i = tid_x(); i < half; i += 128) {
        float s, c;
        sincos_p(rope_angle(p, i, theta_scale, freq_scale, ff), &s, &c);
        s *= attn_factor;
        c *= attn_factor;
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
    }
}

// The residual add fused with the next RMSNorm: x += r, then y = rmsnorm(x) * w and
// y's q8_1 blocks. x, r, y: [rows, n] f32 (x updated in place; y may not alias x or r);
// q: [rows, n / 32] block_q8_1; n % 32 == 0. grid (rows), block 1024.
KERNEL LAUNCH_BOUNDS(1024) void add_rmsnorm_q8_f32(float* x, const float* r, const float* w, float* y, block_q8_1* q, int n, float eps, int kfmt) { pdl_entry();
    norm_q8_row(x, r, x, w, y, q, n, eps, kfmt);
}

// After the q/k/v projections of a chunk, in one launch: per-head RMSNorm of q and k
// (weights qw / kw, either may be null: no norm), RoPE of q and k, q scaled by q_scale,
// q and k written back in place, and k and v stored in the caches at row pos[t].
// q: [n_tok, n_head, hd] f32; k, v: [n_tok, n_kv, hd] f32; kc, vc: [n_ctx, n_kv * hd] of
// types ty_k / ty_v (KVQ_*: f16, or Q8_0 / Q4_0 blocks, quantized a warp per block as
// kv_store_q does; those need hd % 32 == 0).
// grid (n_tok, n_head + 2 * n_kv), block 128 (one block per head: q heads, k heads, then
// v heads); hd <= 256.
KERNEL LAUNCH_BOUNDS(128) void rope_kv_f32(float* q, float* k, const float* v, u8* kc, u8* vc, const float* qw, const float* kw,
                                           const int* pos, const float* ff, int n_head, int n_kv, int hd, int n_rot, int neox,
                                           float theta_scale, float freq_scale, float eps, float q_scale, int ty_k, int ty_v) { pdl_entry();
    __shared__ float s[256];
    __shared__ float red[4];
    const int tok = bid_x(), h = bid_y(), t = tid_x();
    const int p = pos[tok];
    const u64 kv_at = (u64)p * n_kv * hd;
    if (h >= n_head + n_kv) {
        const int vh = h - n_head - n_kv;
        const float* src = v + ((u64)tok * n_kv + vh) * hd;
        for (int i = t; i < hd; i += 128) kvq_put(vc, ty_v, kv_at + (u64)vh * hd + i, src[i]);
        return;
    }
    const bool is_q = h < n_head;
    const int kh = h - n_head;
    float* row = is_q ? q + ((u64)tok * n_head + h) * hd : k + ((u64)tok * n_kv + kh) * hd;
    const float* w = is_q ? qw : kw;
    float ss = 0.0f;
    for (int i = t; i < hd; i += 128) {
        const float x = row[i];
        s[i] = x;
        ss += x * x;
    }
    if (w) {
        ss = warp_sum(ss);
        if ((t & 31) == 0) red[t >> 5] = ss;
        sync();
        const float scale = 1.0f / sqrt_f((red[0] + red[1] + red[2] + red[3]) / (float)hd + eps);
        for (int i = t; i < hd; i += 128) s[i] = s[i] * scale * w[i];
    }
    sync();
    const int half = n_rot / 2;
    for (int i = t; i < hd; i += 128) {
        float o = s[i];
        const int pi = neox ? (i < n_rot ? i % half : -1) : (i < n_rot ? i / 2 : -1);
        if (pi >= 0) {
            float sn, cs;
            sincos_p(rope_angle(p, pi, theta_scale, freq_scale, ff), &sn, &cs);
            const int i0 = neox ? pi : 2 * pi, i1 = neox ? pi + half : 2 * pi + 1;
            const float a = s[i0], b = s[i1];
            o = (i == i0) ? a * cs - b * sn : a * sn + b * cs;
        }
        if (is_q) {
            row[i] = o * q_scale;
        } else {
            row[i] = o;
            kvq_put(kc, ty_k, kv_at + (u64)kh * hd + i, o);
        }
    }
}
