// Mixture-of-experts on the device: the router's top-k, the (token, slot) pairs grouped by
// expert, and matvecs that read each pair's expert inside the one copy of a 3-D expert
// tensor. No host round trip: a step stays replayable as a graph.
//
// A "pair" is one token's slot s (p = t * k + s): the expert it was routed to and its
// weight. Expert e of a 3-D tensor W is the `ebytes` bytes at W + e * ebytes (its rows in
// the stored GGUF block layout, as matvec.hip reads them).
//
// Decode (few pairs): moe_route → moe_mv_n1 (gate and up of every pair) → the GLU (or
// moe_swiglu_oai with gpt-oss's expert biases) → moe_mv_n1 (down) → moe_wsum (with the
// down bias). Larger chunks: moe_route → moe_sort (pairs grouped by
// expert, tiles of up to 8 pairs of one expert) → moe_gather (the activations' quantized
// rows in grouped order) → moe_mv8_<type> (each tile's expert rows read once for its
// columns) → the GLU → moe_mv8_<type> (down) → moe_wsum (through the inverse order).
#include "common.h"

#include "mv_dot.h"
#include "mv_dot_b32.h"
#include "dequant_low.h"
#include "mv_dot_low.h"

// The largest expert count moe_route and moe_sort take (one bit per expert and lane).
#define MOE_MAX_EXPERTS 1024
// Columns (pairs of one expert) per tile of the grouped matvecs.
#define MOE_TILE 8

// Shared-memory counter increment (returns the old value).
#ifdef LODE_AMD
DEV int moe_inc(int* c) { return __hip_atomic_fetch_add(c, 1, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_WORKGROUP); }
#else
DEV int moe_inc(int* c) { return atomicAdd(c, 1); }
#endif

// ---- routing ----

// Per token: the k largest router logits (plus `bias[i]` when bias is not null; ties: the
// lower index) and their weights. weight = 0 (qwen3moe): the softmax over all n_exp
// logits at the selected experts; weight = 1 (gpt-oss's softmax-weight gating): a softmax
// over the k selected logits only. Then, when `norm`, divided by their sum (clamped below
// at 2^-14). logits: [n_tok, n_exp]; ids: [n_tok, k] expert indices; wts: [n_tok, k].
// One warp per token, 4 per 128-thread block; grid (ceil(n_tok / 4)).
KERNEL LAUNCH_BOUNDS(128) void moe_route(const float* logits, const float* bias, int* ids, float* wts, int n_tok, int n_exp, int k, int norm, int weight) { pdl_entry();
    const int t = bid_x() * 4 + (tid_x() >> 5), lane = tid_x() & 31;
    if (t >= n_tok) return;
    const float* l = logits + (u64)t * n_exp;
#define MOE_LOGIT(i) (bias ? l[i] + bias[i] : l[i])
    float mx = -3.0e38f;
    for (int i = lane; i < n_exp; i += 32) mx = fmax_f(mx, MOE_LOGIT(i));
    mx = warp_max(mx);
    float sum = 0.0f;
    if (!weight) {
        for (int i = lane; i < n_exp; i += 32) sum += exp_fast(MOE_LOGIT(i) - mx);
        sum = warp_sum(sum);
    }
    const float inv = weight ? 1.0f : sum > 0.0f ? 1.0f / sum : 0.0f;
    u32 taken = 0;  // bit j: expert lane + 32 j already selected
    float picked = 0.0f, mine = 0.0f;  // mine: lane s holds slot s's weight
    for (int s = 0; s < k; ++s) {
        float bv = -3.0e38f;
        int bi = 0x7fffffff;
        for (int j = 0, i = lane; i < n_exp; ++j, i += 32) {
            const float v = MOE_LOGIT(i);
            if (!((taken >> j) & 1u) && (v > bv || (v == bv && i < bi))) bv = v, bi = i;
        }
#pragma unroll
        for (int m = 16; m >= 1; m >>= 1) {
            const float ov = shfl_xor(bv, m);
            const int oi = shfl_xor_i(bi, m);
            if (ov > bv || (ov == bv && oi < bi)) bv = ov, bi = oi;
        }
        // NaN logits select nothing: fall back to a valid expert of weight 0.
        const bool ok = bi >= 0 && bi < n_exp;
        if (!ok) bi = s < n_exp ? s : 0;
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        const float p = ok ? exp_fast(bv - mx) * inv : 0.0f;
        picked += p;
        if (lane == s) mine = p;
        if (lane == 0) ids[(u64)t * k + s] = bi;
    }
#undef MOE_LOGIT
    // Softmax-weight: the selected exponentials over their sum (the first is 1).
    if (weight) mine = picked > 0.0f ? mine * (1.0f / picked) : 0.0f, picked = picked > 0.0f ? 1.0f : 0.0f;
    if (norm) mine = mine / fmax_f(picked, 6.103515625e-5f);
    if (lane < k) wts[(u64)t * k + lane] = mine;
}

// Pairs grouped by expert. ids: [n_pairs]; perm: [n_pairs] grouped position → pair;
// pos: [n_pairs] pair → grouped position; offs: [n_exp + 1] each expert's first grouped
// position; ntiles: [1] the tile count; tile_e, tile_s: [ceil(n_pairs / tile) + n_exp]
// each tile's expert and first grouped position (a tile holds up to `tile` pairs of its
// expert: 8 for the grouped matvecs, 16 for gemm.hip's grouped GEMM).
// The order of pairs inside an expert is the atomics' (each pair's output depends on its
// own column only). One block of 1024 threads.
KERNEL LAUNCH_BOUNDS(1024) void moe_sort(const int* ids, int* perm, int* pos, int* offs, int* ntiles, int* tile_e, int* tile_s, int n_pairs, int n_exp, int tile) { pdl_entry();
    __shared__ int cnt[MOE_MAX_EXPERTS];
    __shared__ int fill[MOE_MAX_EXPERTS];
    __shared__ int tfirst[MOE_MAX_EXPERTS];
    const int tid = tid_x();
    for (int e = tid; e < n_exp; e += 1024) cnt[e] = 0, fill[e] = 0;
    sync();
    for (int p = tid; p < n_pairs; p += 1024) {
        const int e = ids[p];
        if (e >= 0 && e < n_exp) moe_inc(&cnt[e]);
    }
    sync();
    if (tid == 0) {
        int o = 0, tl = 0;
        for (int e = 0; e < n_exp; ++e) {
            offs[e] = o;
            tfirst[e] = tl;
            o += cnt[e];
            tl += (cnt[e] + tile - 1) / tile;
        }
        offs[n_exp] = o;
        ntiles[0] = tl;
    }
    sync();
    for (int e = tid; e < n_exp; e += 1024) {
        const int n = (cnt[e] + tile - 1) / tile, o = offs[e];
        for (int j = 0; j < n; ++j) tile_e[tfirst[e] + j] = e, tile_s[tfirst[e] + j] = o + j * tile;
    }
    for (int p = tid; p < n_pairs; p += 1024) {
        const int e = ids[p];
        if (e >= 0 && e < n_exp) {
            const int q = offs[e] + moe_inc(&fill[e]);
            perm[q] = p;
            pos[p] = q;
        }
    }
}

// dst row j = src row perm[j] / div, rows of `words` u32 (quantized activation rows).
// grid (n_rows), block 128.
KERNEL LAUNCH_BOUNDS(128) void moe_gather(const u32* src, const int* perm, u32* dst, int words, int div) { pdl_entry();
    const int j = bid_x();
    const u32* s = src + (u64)(perm[j] / div) * words;
    u32* d = dst + (u64)j * words;
    for (int i = tid_x(); i < words; i += 128) d[i] = s[i];
}

// out[t][i] = Σ_s wts[t k + s] · (y[pos(t k + s)][i] + bias[ids[t k + s]][i]), slots in
// order; pos null: the identity; bias null: none (gpt-oss's down bias, [n_exp, n]).
// y: [n_tok k, n] f32; out: [n_tok, n]. grid (ceil(n / 256), n_tok), block 256.
KERNEL LAUNCH_BOUNDS(256) void moe_wsum(const float* y, const int* pos, const float* wts, const int* ids, const float* bias, float* out, int n_exp, int k, int n) { pdl_entry();
    const int t = bid_y(), i = bid_x() * 256 + tid_x();
    if (i >= n) return;
    float acc = 0.0f;
    for (int s = 0; s < k; ++s) {
        const int p = t * k + s;
        const int r = pos ? pos[p] : p;
        float v = y[(u64)r * n + i];
        if (bias) {
            const int e = ids[p];
            v += bias[(u64)(e < 0 ? 0 : e >= n_exp ? n_exp - 1 : e) * n + i];
        }
        acc += wts[p] * v;
    }
    out[(u64)t * n + i] = acc;
}

// gpt-oss's expert activation over [n_rows, f] gate and up rows (pair order, or grouped
// order through perm when it is not null): the expert's gate and up bias rows added
// (bg, bu: [n_exp, f], null: none), then llama.cpp's swiglu_oai,
// min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, −7, 7) + 1), into gate.
// grid (ceil(f / 256), n_rows), block 256.
KERNEL LAUNCH_BOUNDS(256) void moe_swiglu_oai(float* gate, const float* up, const int* ids, const int* perm, const float* bg, const float* bu, int n_exp, int f) { pdl_entry();
    const int j = bid_y(), i = bid_x() * 256 + tid_x();
    if (i >= f) return;
    const int p = perm ? perm[j] : j;
    int e = ids[p];
    e = e < 0 ? 0 : e >= n_exp ? n_exp - 1 : e;
    const u64 o = (u64)j * f + i, b = (u64)e * f + i;
    float g = gate[o], u = up[o];
    if (bg) g += bg[b];
    if (bu) u += bu[b];
    const float x = g < 7.0f ? g : 7.0f;
    const float c = u < -7.0f ? -7.0f : u > 7.0f ? 7.0f : u;
    gate[o] = x / (1.0f + exp_fast(1.702f * -x)) * (c + 1.0f);
}

// ---- expert matvecs ----

// One row of any q8_1 / K-form consuming type, type codes as matvec.hip's mv_any.
DEV void moe_any1(int ty, const u8* W, const block_q8_1* x, int row, int kb, int nsb, float* acc) {
    switch (ty) {
    case 0: mv_b32<0, 1>(W + (u64)row * kb * 18, x, kb, 1, acc); break;
    case 1: mv_b32<1, 1>(W + (u64)row * kb * 20, x, kb, 1, acc); break;
    case 2: mv_b32<2, 1>(W + (u64)row * kb * 22, x, kb, 1, acc); break;
    case 3: mv_b32<3, 1>(W + (u64)row * kb * 24, x, kb, 1, acc); break;
    case 4: mv_b32<4, 1>(W + (u64)row * kb * 34, x, kb, 1, acc); break;
    case 5: mv_nl<false, 1>(W + (u64)row * kb * 18, x, kb, 1, acc); break;
    case 6: mv_nl<true, 1>(W + (u64)row * kb * 17, x, kb, 1, acc); break;
    case 10: mv_q4_K<1>(W + (u64)row * nsb * 144, x, kb, nsb, 1, acc); break;
    case 11: mv_q5_K<1>(W + (u64)row * nsb * 176, x, kb, nsb, 1, acc); break;
    case 12: mv_q6_K<1>(W + (u64)row * nsb * 210, x, kb, nsb, 1, acc); break;
    case 13: mv_q2_K<1>(W + (u64)row * nsb * 84, x, kb, nsb, 1, acc); break;
    case 14: mv_q3_K<1>(W + (u64)row * nsb * 110, x, kb, nsb, 1, acc); break;
    case 15: mv_iq4_xs<1>(W + (u64)row * nsb * 136, x, kb, nsb, 1, acc); break;
    case 16: mv_iq3_s<1>(W + (u64)row * nsb * 110, x, kb, nsb, 1, acc); break;
    case 17: mv_iq3_xxs<1>(W + (u64)row * nsb * 98, x, kb, nsb, 1, acc); break;
    case 18: mv_iq2_xxs<1>(W + (u64)row * nsb * 66, x, kb, nsb, 1, acc); break;
    case 19: mv_iq2_xs<1>(W + (u64)row * nsb * 74, x, kb, nsb, 1, acc); break;
    case 20: mv_iq2_s<1>(W + (u64)row * nsb * 82, x, kb, nsb, 1, acc); break;
    case 21: mv_iq1_s<1>(W + (u64)row * nsb * 50, x, kb, nsb, 1, acc); break;
    case 22: mv_iq1_m<1>(W + (u64)row * nsb * 56, x, kb, nsb, 1, acc); break;
    default: break;
    }
}

DEV int moe_clamp(int e, int n_exp) { return e < 0 ? 0 : e >= n_exp ? n_exp - 1 : e; }

// Per pair p (grid.y), rows of up to two weights of the same k over one activation set:
// segment 0's blocks first (grid.x = ceil(rows0 / 4) + ceil(rows1 / 4)). Segment s: W_s
// [n_exp][rows_s, k] of type ty_s (each expert ebytes_s), x_s: [.., k/32] blocks in its
// type's form, read at row p / xdiv (xdiv = k_used for the tokens' rows, 1 for the pairs'
// own rows), y_s: [n_pairs, rows_s]. rows1 = 0: one segment.
KERNEL LAUNCH_BOUNDS_MIN(128, 8) void moe_mv_n1(const int* ids, int n_exp, int k, int xdiv,
                                               const u8* W0, int eb0, int ty0, const block_q8_1* x0, float* y0, int rows0,
                                               const u8* W1, int eb1, int ty1, const block_q8_1* x1, float* y1, int rows1) { pdl_entry();
    const int p = bid_y(), nb0 = (rows0 + 3) / 4;
    int b = bid_x();
    const u8* W = W0;
    u64 eb = eb0;
    int ty = ty0, rows = rows0;
    const block_q8_1* x = x0;
    float* y = y0;
    if (b >= nb0) b -= nb0, W = W1, eb = eb1, ty = ty1, rows = rows1, x = x1, y = y1;
    const int row = b * 4 + (tid_x() >> 5);
    if (row >= rows) return;
    const int e = moe_clamp(ids[p], n_exp), kb = k / 32;
    float acc[1] = {0.0f};
    moe_any1(ty, W + (u64)e * eb, x + (u64)(p / xdiv) * kb, row, kb, k / 256, acc);
    store<1>(y + (u64)p * rows, acc, rows, row, 1);
}

// The grouped matvec of one type: tile t (grid.y) of up to 8 pairs of expert tile_e[t],
// at grouped positions tile_s[t] …; x: [n_pairs, k/32] in grouped order; y: [n_pairs,
// rows] in grouped order. Two segments as moe_mv_n1's (same type and activations).
// Tiles past ntiles[0] (the grid is sized for the most there can be) return at once.
#define MOE_MV8(NAME, CALL)                                                                                     \
    KERNEL LAUNCH_BOUNDS(128) void NAME(const int* offs, const int* ntiles, const int* tile_e, const int* tile_s, \
                                        int n_exp, int k, const block_q8_1* x, const u8* W0, int eb0, float* y0, \
                                        int rows0, const u8* W1, int eb1, float* y1, int rows1) { pdl_entry();     \
        const int t = bid_y();                                                                                  \
        if (t >= ntiles[0]) return;                                                                             \
        const int nb0 = (rows0 + 3) / 4;                                                                        \
        int b = bid_x();                                                                                        \
        const u8* W = W0;                                                                                       \
        u64 eb = eb0;                                                                                           \
        int rows = rows0;                                                                                       \
        float* y = y0;                                                                                          \
        if (b >= nb0) b -= nb0, W = W1, eb = eb1, rows = rows1, y = y1;                                         \
        const int row = b * 4 + (tid_x() >> 5);                                                                 \
        if (row >= rows) return;                                                                                \
        const int e = moe_clamp(tile_e[t], n_exp), s = tile_s[t];                                               \
        const int n0 = offs[e + 1] - s, n = n0 < MOE_TILE ? n0 : MOE_TILE, kb = k / 32, nsb = k / 256;                               \
        (void)nsb;                                                                                              \
        const u8* We = W + (u64)e * eb;                                                                         \
        const block_q8_1* xs = x + (u64)s * kb;                                                                 \
        float acc[MOE_TILE];                                                                                    \
        _Pragma("unroll") for (int c = 0; c < MOE_TILE; ++c) acc[c] = 0.0f;                                    \
        CALL;                                                                                                   \
        store<MOE_TILE>(y + (u64)s * rows, acc, rows, row, n);                                                  \
    }

#define K_CALL(FN, BB) FN<MOE_TILE>(We + (u64)row * nsb * BB, xs, kb, nsb, n, acc)
MOE_MV8(moe_mv8_q4_K, K_CALL(mv_q4_K, 144))
MOE_MV8(moe_mv8_q5_K, K_CALL(mv_q5_K, 176))
MOE_MV8(moe_mv8_q6_K, K_CALL(mv_q6_K, 210))
MOE_MV8(moe_mv8_q2_K, K_CALL(mv_q2_K, 84))
MOE_MV8(moe_mv8_q3_K, K_CALL(mv_q3_K, 110))
MOE_MV8(moe_mv8_iq4_xs, K_CALL(mv_iq4_xs, 136))
MOE_MV8(moe_mv8_iq3_s, K_CALL(mv_iq3_s, 110))
MOE_MV8(moe_mv8_iq3_xxs, K_CALL(mv_iq3_xxs, 98))
MOE_MV8(moe_mv8_iq2_xxs, K_CALL(mv_iq2_xxs, 66))
MOE_MV8(moe_mv8_iq2_xs, K_CALL(mv_iq2_xs, 74))
MOE_MV8(moe_mv8_iq2_s, K_CALL(mv_iq2_s, 82))
MOE_MV8(moe_mv8_iq1_s, K_CALL(mv_iq1_s, 50))
MOE_MV8(moe_mv8_iq1_m, K_CALL(mv_iq1_m, 56))
#define B32_CALL(T, BB) mv_b32<T, MOE_TILE>(We + (u64)row * kb * BB, xs, kb, n, acc)
MOE_MV8(moe_mv8_q4_0, B32_CALL(0, 18))
MOE_MV8(moe_mv8_q4_1, B32_CALL(1, 20))
MOE_MV8(moe_mv8_q5_0, B32_CALL(2, 22))
MOE_MV8(moe_mv8_q5_1, B32_CALL(3, 24))
MOE_MV8(moe_mv8_q8_0, B32_CALL(4, 34))
#define NL_CALL(MX, BB) mv_nl<MX, MOE_TILE>(We + (u64)row * kb * BB, xs, kb, n, acc)
MOE_MV8(moe_mv8_iq4_nl, NL_CALL(false, 18))
MOE_MV8(moe_mv8_mxfp4, NL_CALL(true, 17))
