// Attention over an f16 KV cache: decode (one query per head) and simple prefill (a chunk
// of causal queries), GQA and sliding window. Online softmax, f32 accumulation.
#include "common.h"

#define ATT_WARPS 4
#define ATT_MAXE 8 // head_dim <= 256: 8 elements per lane

// q:   [n_tok, n_head, head_dim] f32 (query t sits at position pos[t], read on the device
//      so a captured decode graph replays unchanged as the cache grows)
// kc:  [n_ctx, n_kv_head * head_dim] f16 (row p = key at position p), vc likewise
// out: [n_tok, n_head, head_dim] f32
// Query at position P attends keys p in [max(0, P - window + 1) if window > 0 else 0, P].
// grid (n_head, n_tok), block 128 (4 warps split the keys; merged through shared memory).
KERNEL void attn_f16(const float* q, const u16* kc, const u16* vc, float* out, int n_head, int n_kv_head, int head_dim,
                     const int* pos, int window, float scale) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][ATT_MAXE * 32];
    const int head = bid_x(), tok = bid_y();
    const int lane = tid_x() & 31, warp = tid_x() >> 5;
    const int epl = head_dim / 32;
    const int kvh = head / (n_head / n_kv_head);
    const u64 kv_stride = (u64)n_kv_head * head_dim;
    const float* qv = q + ((u64)tok * n_head + head) * head_dim + lane * epl;
    float qr[ATT_MAXE], acc[ATT_MAXE];
#pragma unroll
    for (int e = 0; e < ATT_MAXE; ++e) {
        qr[e] = e < epl ? qv[e] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    const int P = pos[tok];
    const int k0 = window > 0 ? (P - window + 1 > 0 ? P - window + 1 : 0) : 0;
    float m = -3.0e38f, l = 0.0f;
    for (int p = k0 + warp; p <= P; p += ATT_WARPS) {
        const u16* kr = kc + (u64)p * kv_stride + (u64)kvh * head_dim + lane * epl;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) dot += qr[e] * h2f(kr[e]);
        dot = warp_sum(dot);
        const float mn = fmax_f(m, dot);
        const float corr = exp_fast(m - mn), pw = exp_fast(dot - mn);
        l = l * corr + pw;
        const u16* vr = vc + (u64)p * kv_stride + (u64)kvh * head_dim + lane * epl;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) acc[e] = acc[e] * corr + pw * h2f(vr[e]);
        m = mn;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
#pragma unroll
    for (int e = 0; e < ATT_MAXE; ++e)
        if (e < epl) s_acc[warp][lane * epl + e] = acc[e];
    sync();
    float M = -3.0e38f;
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) M = fmax_f(M, s_m[w]);
    float L = 0.0f, f[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; ++w) {
        f[w] = s_l[w] > 0.0f ? exp_fast(s_m[w] - M) : 0.0f;
        L += s_l[w] * f[w];
    }
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = out + ((u64)tok * n_head + head) * head_dim;
    for (int i = tid_x(); i < head_dim; i += 32 * ATT_WARPS) {
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) v += s_acc[w][i] * f[w];
        o[i] = v * inv;
    }
}
