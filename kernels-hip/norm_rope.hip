// RMSNorm (whole rows or per head) and RoPE (NORM and NEOX pairing, frequency factors).
#include "common.h"

// y[r][i] = x[r][i] / sqrt(mean_i x[r][i]^2 + eps) * w[i]   (w may be null: no weight)
// x, y: [rows, n] f32 (y may alias x); w: [n]. grid (rows), block 256.
// Per-head norm (q/k norm) is the same call with rows = n_tok * n_head, n = head_dim.
KERNEL void rmsnorm_f32(const float* x, const float* w, float* y, int n, float eps) {
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

// rmsnorm_f32 plus the q8_1 form of y for the matvec that follows (saves a launch).
// q: [rows, n / 32] block_q8_1. Requires n % 32 == 0 (a warp's 32 elements form a block).
KERNEL void rmsnorm_q8_f32(const float* x, const float* w, float* y, block_q8_1* q, int n, float eps) {
    __shared__ float red[8];
    const u64 base = (u64)bid_x() * n;
    const int t = tid_x(), lane = t & 31;
    float ss = 0.0f;
    for (int i = t; i < n; i += 256) {
        const float v = x[base + i];
        ss += v * v;
    }
    ss = warp_sum(ss);
    if (lane == 0) red[t >> 5] = ss;
    sync();
    float tot = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) tot += red[i];
    const float scale = 1.0f / sqrt_f(tot / (float)n + eps);
    block_q8_1* qr = q + (u64)bid_x() * (n / 32);
    for (int i = t; i < n; i += 256) {
        float v = x[base + i] * scale;
        if (w) v *= w[i];
        y[base + i] = v;
        const float amax = warp_max(fabs_f(v));
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        const int c = (int)rint_f(v * id);
        const float qsum = warp_sum((float)c);
        block_q8_1* b = qr + i / 32;
        b->qs[lane] = (i8)c;
        if (lane == 0) {
            b->d = f2h(d);
            b->s = f2h(d * qsum);
        }
    }
}

// In-place RoPE on x: [n_tok, n_head, head_dim] f32 (row stride = n_head * head_dim).
// pos: [n_tok] i32. inv_freq: [n_rot / 2] f32 = freq_scale * base^(-2i/n_rot) / ff_i,
// computed on the host in f64 so both vendors and the CPU agree. Dims >= n_rot pass through.
// neox = 0: pairs (2i, 2i+1); neox = 1: pairs (i, i + n_rot/2).
// grid (n_tok, n_head), block 128: thread i handles pairs i, i+128, …
KERNEL void rope_f32(float* x, const int* pos, const float* inv_freq, int n_head, int head_dim, int n_rot, int neox,
                     float attn_factor) {
    const int tok = bid_x(), head = bid_y();
    float* v = x + ((u64)tok * n_head + head) * head_dim;
    const float p = (float)pos[tok];
    const int half = n_rot / 2;
    for (int i = tid_x(); i < half; i += 128) {
        float s, c;
        sincos_p(p * inv_freq[i], &s, &c);
        s *= attn_factor;
        c *= attn_factor;
        const int i0 = neox ? i : 2 * i;
        const int i1 = neox ? i + half : 2 * i + 1;
        const float a = v[i0], b = v[i1];
        v[i0] = a * c - b * s;
        v[i1] = a * s + b * c;
    }
}
