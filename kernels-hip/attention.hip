// Attention over the KV cache: decode (one query per head) and simple prefill (a chunk
// of causal queries), GQA and sliding window, over an f16 cache (attn_f16*) or a cache of
// Q8_0 / Q4_0 blocks (attn_kvq, with its store kv_store_q). Online softmax, f32 accumulation.
#include "common.h"

#define ATT_WARPS 16
#define ATT_GROUPS 4     // keys in flight per warp: 4 groups of 8 lanes
#define ATT_STREAMS (ATT_WARPS * ATT_GROUPS)
#define ATT_MAXE 32      // head_dim <= 256: up to 32 elements per lane

struct __attribute__((aligned(16))) att_u32x4 { u32 x, y, z, w; };

// Dot of qr[0..epl) with an f16 row (16-byte loads when epl % 8 == 0: rows are then
// 16-byte aligned), and acc = acc * corr + pw * row.
DEV float att_dot(const float* qr, const u16* r, int epl) {
    float dot = 0.0f;
    if ((epl & 7) == 0) {
#pragma unroll
        for (int c = 0; c < ATT_MAXE / 8; ++c) {
            if (c * 8 < epl) {
                const att_u32x4 w = *(const att_u32x4*)(r + c * 8);
                const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    dot += qr[c * 8 + 2 * j] * h2f((u16)(ws[j] & 0xffff));
                    dot += qr[c * 8 + 2 * j + 1] * h2f((u16)(ws[j] >> 16));
                }
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) dot += qr[e] * h2f(r[e]);
    }
    return dot;
}
DEV void att_acc(float* acc, const u16* r, int epl, float corr, float pw) {
    if ((epl & 7) == 0) {
#pragma unroll
        for (int c = 0; c < ATT_MAXE / 8; ++c) {
            if (c * 8 < epl) {
                const att_u32x4 w = *(const att_u32x4*)(r + c * 8);
                const u32 ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    acc[c * 8 + 2 * j] = acc[c * 8 + 2 * j] * corr + pw * h2f((u16)(ws[j] & 0xffff));
                    acc[c * 8 + 2 * j + 1] = acc[c * 8 + 2 * j + 1] * corr + pw * h2f((u16)(ws[j] >> 16));
                }
            }
        }
    } else {
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) acc[e] = acc[e] * corr + pw * h2f(r[e]);
    }
}

// q:   [n_tok, n_head, head_dim] f32 (query t sits at position pos[t], read on the device
//      so a captured decode graph replays unchanged as the cache grows)
// kc:  [n_ctx, n_kv_head * head_dim] f16 (row p = key at position p), vc likewise
// out: [n_tok, n_head, head_dim] f32
// q8:  null, or out's q8_1 blocks ([n_tok, n_head * head_dim / 32]; head_dim % 32 == 0),
//      the output projection's input, written here to save a quantize launch
// Query at position P attends keys p in [max(0, P - window + 1) if window > 0 else 0, P].
// grid (n_head, n_tok), block 512. Each warp runs 4 independent key streams (8 lanes per
// key, head_dim / 8 elements per lane), 64 streams per block, each with its own online
// softmax state; a warp merges its 4 streams with shuffles, the 16 warps merge through
// shared memory.
// The body of one (head, query) block; `attn_f16` and `attn_f16_rows` differ only in where
// the query's caches are.
DEV void attn_f16_block(const float* q, const u16* kc, const u16* vc, float* out, int n_head, int n_kv_head, int head_dim,
                        const int* pos, int window, float scale, block_q8_1* q8, const float* sinks, int head, int tok) {
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][256];
    const int lane = tid_x() & 31, warp = tid_x() >> 5;
    const int grp = lane >> 3, sub = lane & 7;
    const int epl = head_dim / 8;
    const int kvh = head / (n_head / n_kv_head);
    const u64 kv_stride = (u64)n_kv_head * head_dim;
    const float* qv = q + ((u64)tok * n_head + head) * head_dim + sub * epl;
    float qr[ATT_MAXE], acc[ATT_MAXE];
#pragma unroll
    for (int e = 0; e < ATT_MAXE; ++e) {
        qr[e] = e < epl ? qv[e] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    const int P = pos[tok];
    const int k0 = window > 0 ? (P - window + 1 > 0 ? P - window + 1 : 0) : 0;
    float m = -3.0e38f, l = 0.0f;
    // Every lane of a warp runs the same number of iterations (shuffles stay converged).
    for (int base = k0 + warp * ATT_GROUPS; base <= P; base += ATT_STREAMS) {
        const int p = base + grp;
        const bool live = p <= P;
        const u64 row = (u64)(live ? p : P) * kv_stride + (u64)kvh * head_dim + sub * epl;
        if ((epl & 7) == 0) {
            // Issue the K and V loads of this key together (V does not depend on the score).
            att_u32x4 kw[ATT_MAXE / 8], vw[ATT_MAXE / 8];
#pragma unroll
            for (int c = 0; c < ATT_MAXE / 8; ++c) {
                if (c * 8 < epl) {
                    kw[c] = *(const att_u32x4*)(kc + row + c * 8);
                    vw[c] = *(const att_u32x4*)(vc + row + c * 8);
                }
            }
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < ATT_MAXE / 8; ++c) {
                if (c * 8 < epl) {
                    const u32 ws[4] = {kw[c].x, kw[c].y, kw[c].z, kw[c].w};
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        dot += qr[c * 8 + 2 * j] * h2f((u16)(ws[j] & 0xffff));
                        dot += qr[c * 8 + 2 * j + 1] * h2f((u16)(ws[j] >> 16));
                    }
                }
            }
            dot += shfl_xor(dot, 1);
            dot += shfl_xor(dot, 2);
            dot += shfl_xor(dot, 4);
            if (live) {
                const float mn = fmax_f(m, dot);
                const float corr = exp_fast(m - mn), pw = exp_fast(dot - mn);
                l = l * corr + pw;
#pragma unroll
                for (int c = 0; c < ATT_MAXE / 8; ++c) {
                    if (c * 8 < epl) {
                        const u32 ws[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
                        for (int j = 0; j < 4; ++j) {
                            acc[c * 8 + 2 * j] = acc[c * 8 + 2 * j] * corr + pw * h2f((u16)(ws[j] & 0xffff));
                            acc[c * 8 + 2 * j + 1] = acc[c * 8 + 2 * j + 1] * corr + pw * h2f((u16)(ws[j] >> 16));
                        }
                    }
                }
                m = mn;
            }
            continue;
        }
        float dot = att_dot(qr, kc + row, epl);
        dot += shfl_xor(dot, 1);
        dot += shfl_xor(dot, 2);
        dot += shfl_xor(dot, 4);
        if (live) {
            const float mn = fmax_f(m, dot);
            const float corr = exp_fast(m - mn), pw = exp_fast(dot - mn);
            l = l * corr + pw;
            att_acc(acc, vc + row, epl, corr, pw);
            m = mn;
        }
    }
    // Merge the warp's 4 streams (lanes sub, sub+8, sub+16, sub+24 hold one element range).
#pragma unroll
    for (int off = 8; off <= 16; off <<= 1) {
        const float mo = shfl_xor(m, off), lo = shfl_xor(l, off);
        const float mm = fmax_f(m, mo);
        const float a = l > 0.0f ? exp_fast(m - mm) : 0.0f;
        const float b = lo > 0.0f ? exp_fast(mo - mm) : 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) acc[e] = acc[e] * a + shfl_xor(acc[e], off) * b;
        l = l * a + lo * b;
        m = mm;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    if (grp == 0) {
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) s_acc[warp][sub * epl + e] = acc[e];
    }
    sync();
    float M = -3.0e38f;
    for (int w = 0; w < ATT_WARPS; ++w)
        if (s_l[w] > 0.0f) M = fmax_f(M, s_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) L += s_l[w] > 0.0f ? s_l[w] * exp_fast(s_m[w] - M) : 0.0f;
    // An attention sink (gpt-oss): one more logit per head in the denominator, no value.
    if (sinks) L += exp_fast(sinks[head] - M);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = out + ((u64)tok * n_head + head) * head_dim;
    for (int i = tid_x(); i < head_dim; i += 32 * ATT_WARPS) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (s_l[w] > 0.0f) v += s_acc[w][i] * exp_fast(s_m[w] - M);
        o[i] = v * inv;
        // head_dim % 32 == 0: each warp here holds one whole block of 32 outputs.
        if (q8) q8_block_store(q8 + (((u64)tok * n_head + head) * head_dim + i) / 32, v * inv);
    }
}

// sinks: null, or [n_head] f32 attention sinks (gpt-oss), unscaled logits.
KERNEL LAUNCH_BOUNDS(512) void attn_f16(const float* q, const u16* kc, const u16* vc, float* out, int n_head, int n_kv_head, int head_dim,
                     const int* pos, int window, float scale, block_q8_1* q8, const float* sinks) { pdl_entry();
    attn_f16_block(q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, q8, sinks, bid_x(), bid_y());
}

// A batched decode step: query row t belongs to a different sequence, whose K and V caches
// sit at kv[2t] and kv[2t + 1] (device addresses), so all rows run in one launch.
// q, out: [n_rows, n_head, head_dim] f32; pos: [n_rows] i32; grid (n_head, n_rows), block 512.
KERNEL LAUNCH_BOUNDS(512) void attn_f16_rows(const float* q, const u64* kv, float* out, int n_head, int n_kv_head, int head_dim,
                          const int* pos, int window, float scale, const float* sinks) { pdl_entry();
    const int tok = bid_y();
    attn_f16_block(q, (const u16*)kv[2 * tok], (const u16*)kv[2 * tok + 1], out, n_head, n_kv_head, head_dim, pos, window, scale,
                   (block_q8_1*)0, sinks, bid_x(), tok);
}

// ---- Quantized caches ------------------------------------------------------------------
// A K or V plane of type ty (KVQ_F16, KVQ_Q8_0, KVQ_Q4_0): element e of the plane (row p,
// head h, index i at e = p * n_kv_head * head_dim + h * head_dim + i) is f16 e, or value
// e % 32 of GGUF block e / 32 (Q8_0: f16 d then 32 i8, 34 bytes; Q4_0: f16 d then 16 bytes
// whose low nibbles are values 0..15 and high nibbles 16..31, value (nibble - 8) * d, 18
// bytes). Rows are whole blocks (n_kv_head * head_dim % 32 == 0).
DEV float kvq_at(const u8* plane, int ty, u64 e) {
    if (ty == KVQ_F16) return h2f(ld_u16(plane + 2 * e));
    const int i = (int)(e & 31);
    if (ty == KVQ_Q8_0) {
        const u8* b = plane + (e >> 5) * 34;
        return (float)(signed char)b[2 + i] * h2f(ld_u16(b));
    }
    const u8* b = plane + (e >> 5) * 18;
    const int nib = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
    return (float)(nib - 8) * h2f(ld_u16(b));
}

// K and V rows of the new tokens into quantized (or f16) caches: kc / vc rows of nk / nv
// values of types ty_k / ty_v at slots rows[r]. One warp per 32 values.
// grid (ceil(max(nk, nv) / 256), n_rows), block 256.
KERNEL LAUNCH_BOUNDS(256) void kv_store_q(const float* k, const float* v, u8* kc, u8* vc, int nk, int nv, const int* rows, int ty_k,
                                          int ty_v) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), r = bid_y();
    const u64 p = (u64)rows[r];
    // Warps are whole blocks (nk, nv multiples of 32): a warp is either inside or outside.
    if (i < nk) {
        const float x = k[(u64)r * nk + i];
        if (ty_k == KVQ_F16) ((u16*)kc)[p * nk + i] = f2h(x);
        else kvq_block_store(kc + (p * nk + i) / 32 * (ty_k == KVQ_Q8_0 ? 34 : 18), ty_k, x);
    }
    if (i < nv) {
        const float x = v[(u64)r * nv + i];
        if (ty_v == KVQ_F16) ((u16*)vc)[p * nv + i] = f2h(x);
        else kvq_block_store(vc + (p * nv + i) / 32 * (ty_v == KVQ_Q8_0 ? 34 : 18), ty_v, x);
    }
}

// attn_f16's arithmetic over caches of types ty_k / ty_v, each element dequantized as it
// is loaded (kvq_at): the same 16 warps × 4 key streams, online softmax and merges.
// q, out, pos, window, scale, q8 as attn_f16; grid (n_head, n_tok), block 512.
KERNEL LAUNCH_BOUNDS(512) void attn_kvq(const float* q, const u8* kc, const u8* vc, float* out, int n_head, int n_kv_head, int head_dim,
                                        const int* pos, int window, float scale, int ty_k, int ty_v, block_q8_1* q8) { pdl_entry();
    __shared__ float s_m[ATT_WARPS], s_l[ATT_WARPS];
    __shared__ float s_acc[ATT_WARPS][256];
    const int head = bid_x(), tok = bid_y();
    const int lane = tid_x() & 31, warp = tid_x() >> 5;
    const int grp = lane >> 3, sub = lane & 7;
    const int epl = head_dim / 8;
    const int kvh = head / (n_head / n_kv_head);
    const u64 kv_stride = (u64)n_kv_head * head_dim;
    const float* qv = q + ((u64)tok * n_head + head) * head_dim + sub * epl;
    float qr[ATT_MAXE], acc[ATT_MAXE];
#pragma unroll
    for (int e = 0; e < ATT_MAXE; ++e) {
        qr[e] = e < epl ? qv[e] * scale : 0.0f;
        acc[e] = 0.0f;
    }
    const int P = pos[tok];
    const int k0 = window > 0 ? (P - window + 1 > 0 ? P - window + 1 : 0) : 0;
    float m = -3.0e38f, l = 0.0f;
    for (int base = k0 + warp * ATT_GROUPS; base <= P; base += ATT_STREAMS) {
        const int p = base + grp;
        const bool live = p <= P;
        const u64 row = (u64)(live ? p : P) * kv_stride + (u64)kvh * head_dim + sub * epl;
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) dot += qr[e] * kvq_at(kc, ty_k, row + e);
        dot += shfl_xor(dot, 1);
        dot += shfl_xor(dot, 2);
        dot += shfl_xor(dot, 4);
        if (live) {
            const float mn = fmax_f(m, dot);
            const float corr = exp_fast(m - mn), pw = exp_fast(dot - mn);
            l = l * corr + pw;
#pragma unroll
            for (int e = 0; e < ATT_MAXE; ++e)
                if (e < epl) acc[e] = acc[e] * corr + pw * kvq_at(vc, ty_v, row + e);
            m = mn;
        }
    }
#pragma unroll
    for (int off = 8; off <= 16; off <<= 1) {
        const float mo = shfl_xor(m, off), lo = shfl_xor(l, off);
        const float mm = fmax_f(m, mo);
        const float a = l > 0.0f ? exp_fast(m - mm) : 0.0f;
        const float b = lo > 0.0f ? exp_fast(mo - mm) : 0.0f;
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) acc[e] = acc[e] * a + shfl_xor(acc[e], off) * b;
        l = l * a + lo * b;
        m = mm;
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    if (grp == 0) {
#pragma unroll
        for (int e = 0; e < ATT_MAXE; ++e)
            if (e < epl) s_acc[warp][sub * epl + e] = acc[e];
    }
    sync();
    float M = -3.0e38f;
    for (int w = 0; w < ATT_WARPS; ++w)
        if (s_l[w] > 0.0f) M = fmax_f(M, s_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATT_WARPS; ++w) L += s_l[w] > 0.0f ? s_l[w] * exp_fast(s_m[w] - M) : 0.0f;
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    float* o = out + ((u64)tok * n_head + head) * head_dim;
    for (int i = tid_x(); i < head_dim; i += 32 * ATT_WARPS) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; ++w)
            if (s_l[w] > 0.0f) v += s_acc[w][i] * exp_fast(s_m[w] - M);
        o[i] = v * inv;
        if (q8) q8_block_store(q8 + (((u64)tok * n_head + head) * head_dim + i) / 32, v * inv);
    }
}
