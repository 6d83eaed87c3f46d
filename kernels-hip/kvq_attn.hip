// Attention over a quantized KV cache (-ctk / -ctv q8_0 or q4_0, f16 allowed on one side),
// fast paths:
//
//  - kvq_decode_d<HD>: one query (a decode step) split over the keys as attn_decode.hip
//    splits an f16 cache: grid (group, n_kv, n_split), block 512, the part count fixed by
//    the host from the cache size (a replayed graph keeps its shape), the parts used chosen
//    on the device from the position, merged through the same scratch (per-head arrival
//    counters, then [n_head, n_split, HD + 2] partial states) by the last part to finish.
//    A lane holds 16 consecutive elements of a key, which lie inside one 32-value block:
//    it loads the block's scale once and its 16 code bytes (Q8_0) or 16 nibble bytes
//    (Q4_0: the low nibbles are values 0..15, the high ones 16..31) as four words.
//  - kvq_to_f16: rows of a quantized K and / or V plane as f16, into scratch that the
//    prefill flash kernel (flash_attn.hip) then reads as it reads an f16 cache.
//
// Plane layout (attention.hip's KVQ_*): element e of a plane (row p, head h, index i at
// e = p * n_kv * HD + h * HD + i) is f16 e, or value e % 32 of block e / 32 (Q8_0: f16 d,
// 32 i8, 34 bytes; Q4_0: f16 d, 16 bytes, 18 bytes). Rows are whole blocks.
#include "common.h"

#define KQ_F16 0
#define KQ_Q8_0 1
#define KQ_Q4_0 2

#define KQ_THREADS 512
#define KQ_WARPS (KQ_THREADS / 32)
#define KQ_U 4   // keys in flight per stream
#define KQ_E 16  // head elements per lane
#define KQ_LOG2E 1.4426950408889634f

struct __attribute__((aligned(16))) kq_u32x4 { u32 x, y, z, w; };
struct __attribute__((aligned(16))) kq_f32x4 { float x, y, z, w; };

// One lane's 16 elements of one key as loaded: f16 (w[0..7]), or the 16 code bytes
// (w[0..3]) and the block's f16 scale (low half of w[4]).
struct kq_raw {
    u32 w[8];
};

#ifdef LODE_AMD
DEV u32 kq_arrive(u32* c) { return __hip_atomic_fetch_add(c, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT); }
DEV void kq_release() { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent"); }
DEV void kq_acquire() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent"); }
#else
DEV u32 kq_arrive(u32* c) { return atomicAdd(c, 1u); }
DEV void kq_release() { __threadfence(); }
DEV void kq_acquire() { __threadfence(); }
#endif

// 16 bytes at a 2-byte aligned address as four little-endian words: aligned word loads
// from the word at or before p (and, when p is not 4-byte aligned, its last two bytes as
// a half word, so nothing past the 16 bytes is read) and a shift, no branch.
DEV void kq_ld16(const u8* p, u32* w) {
    const u64 a = (u64)p;
    const u32* base = (const u32*)(a & ~(u64)3);
    const bool odd = (a & 2) != 0;
    u32 x[5];
#pragma unroll
    for (int i = 0; i < 4; ++i) x[i] = base[i];
    x[4] = odd ? (u32)ld_u16(p + 14) : 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = odd ? ((x[i] >> 16) | (x[i + 1] << 16)) : x[i];
}

// Elements e .. e + 15 (e % 16 == 0) of a plane of type ty.
DEV void kq_load(kq_raw& r, const u8* plane, int ty, u64 e) {
    if (ty == KQ_F16) {
        const kq_u32x4* s = (const kq_u32x4*)(plane + 2 * e);
        const kq_u32x4 a = s[0], b = s[1];
        r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
        r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
        return;
    }
    const bool q8 = ty == KQ_Q8_0;
    const u8* blk = plane + (e >> 5) * (q8 ? 34u : 18u);
    kq_ld16(blk + (q8 ? 2 + (int)(e & 16) : 2), r.w);
    r.w[4] = ld_u16(blk);
    r.w[5] = r.w[6] = r.w[7] = 0u;
}

DEV void kq_zero(kq_raw& r) {
#pragma unroll
    for (int i = 0; i < 8; ++i) r.w[i] = 0u;
}

// The 16 values of r (hi: this lane's elements are a Q4_0 block's values 16..31, the
// high nibbles). Q8_0 and Q4_0 leave the block scale out (the caller multiplies).
DEV void kq_values(const kq_raw& r, int ty, bool hi, float* x) {
    if (ty == KQ_F16) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            x[2 * i] = h2f((u16)(r.w[i] & 0xffff));
            x[2 * i + 1] = h2f((u16)(r.w[i] >> 16));
        }
    } else if (ty == KQ_Q8_0) {
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) x[4 * i + j] = (float)((int)(r.w[i] << (24 - 8 * j)) >> 24);
    } else {
        const int sh = hi ? 4 : 0;
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) x[4 * i + j] = (float)((int)((r.w[i] >> (8 * j + sh)) & 15u) - 8);
    }
}

// The factor of r's values: its block scale, or 1 for f16.
DEV float kq_scale(const kq_raw& r, int ty) { return ty == KQ_F16 ? 1.0f : h2f((u16)(r.w[4] & 0xffff)); }

// One query over part `part_i` of its keys; see the top of the file.
// q: [n_head, HD] f32 (the query at pos[0], roped); kc, vc: the planes (row p = key p);
// out: [n_head, HD] f32; q8: null or out's q8_1 blocks; part / cnt: the scratch.
template <int HD>
DEV void kvq_decode_run(const float* q, const u8* kc, const u8* vc, float* out, block_q8_1* q8, const int* pos, float* part, u32* cnt,
                        int group, int n_kv, int ty_k, int ty_v, float scale, int window, int n_split, int min_chunk) {
    constexpr int L = HD / KQ_E;          // lanes per key
    constexpr int NSW = 32 / L;           // key streams per warp
    constexpr int KW = NSW * KQ_U;        // keys per warp per iteration
    constexpr int NSU = KQ_WARPS * KW;    // keys per block per iteration
    __shared__ float s_m[KQ_WARPS], s_l[KQ_WARPS];
    __shared__ __attribute__((aligned(16))) float s_acc[KQ_WARPS][HD];
    __shared__ int s_last;

    const int g = bid_x(), kvh = bid_y(), part_i = bid_z();
    const int head = kvh * group + g;
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int sub = lane % L, ws = lane / L;
    const int P = pos[0];
    if (P < 0) return;
    const int k0 = (window > 0 && P - window + 1 > 0) ? P - window + 1 : 0;
    const int nkeys = P - k0 + 1;
    int chunk = min_chunk, n_parts = 1;
    if (nkeys > min_chunk) {
        chunk = (nkeys + n_split - 1) / n_split;
        if (chunk < min_chunk) chunk = min_chunk;
        n_parts = (nkeys + chunk - 1) / chunk;
    }
    if (part_i >= n_parts) return;
    const int lo = k0 + part_i * chunk;
    const int hi_key = lo + chunk < P + 1 ? lo + chunk : P + 1;
    const int nk = hi_key - lo;
    const u64 row = (u64)n_kv * HD;
    const u64 e0 = (u64)kvh * HD + (u64)sub * KQ_E;
    // Elements sub*16.. of a head: the second half of a 32-value block when sub is odd.
    const bool hi = (sub & 1) != 0;
    const int wfirst = warp * KW;
    const int iters = nk > wfirst ? (nk - wfirst + NSU - 1) / NSU : 0;

    float qr[KQ_E], acc[KQ_E];
    const float qs = scale * KQ_LOG2E;
    const float* qv = q + (u64)head * HD + sub * KQ_E;
#pragma unroll
    for (int e = 0; e < KQ_E; e += 4) {
        const kq_f32x4 q4 = *(const kq_f32x4*)(qv + e);
        qr[e] = q4.x * qs;
        qr[e + 1] = q4.y * qs;
        qr[e + 2] = q4.z * qs;
        qr[e + 3] = q4.w * qs;
    }
#pragma unroll
    for (int e = 0; e < KQ_E; ++e) acc[e] = 0.0f;

    // Online softmax (log2 units) over this warp's keys: slots lo + it * NSU + wfirst +
    // ws + j * NSW. The iteration count is the warp's, so the shuffles stay converged.
    float m = -3.0e38f, l = 0.0f;
    for (int it = 0; it < iters; ++it) {
        kq_raw kr[KQ_U], vr[KQ_U];
        bool live[KQ_U];
#pragma unroll
        for (int j = 0; j < KQ_U; ++j) {
            const int idx = it * NSU + wfirst + ws + j * NSW;
            live[j] = idx < nk;
            kq_zero(kr[j]);
            kq_zero(vr[j]);
            if (live[j]) {
                const u64 e = (u64)(lo + idx) * row + e0;
                kq_load(kr[j], kc, ty_k, e);
                kq_load(vr[j], vc, ty_v, e);
            }
        }
        float sc[KQ_U];
        float mx = m;
#pragma unroll
        for (int j = 0; j < KQ_U; ++j) {
            float x[KQ_E];
            kq_values(kr[j], ty_k, hi, x);
            float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
            for (int e = 0; e < KQ_E; e += 2) {
                d0 = fma_f(qr[e], x[e], d0);
                d1 = fma_f(qr[e + 1], x[e + 1], d1);
            }
            float d = (d0 + d1) * kq_scale(kr[j], ty_k);
#pragma unroll
            for (int o = 1; o < L; o <<= 1) d += shfl_xor(d, o);
            sc[j] = live[j] ? d : -3.0e38f;
            mx = fmax_f(mx, sc[j]);
        }
        const float corr = exp2_fast(m - mx);
        l *= corr;
#pragma unroll
        for (int e = 0; e < KQ_E; ++e) acc[e] *= corr;
#pragma unroll
        for (int j = 0; j < KQ_U; ++j) {
            const float pw = live[j] ? exp2_fast(sc[j] - mx) : 0.0f;
            l += pw;
            float x[KQ_E];
            kq_values(vr[j], ty_v, hi, x);
            const float pd = pw * kq_scale(vr[j], ty_v);
#pragma unroll
            for (int e = 0; e < KQ_E; ++e) acc[e] = fma_f(pd, x[e], acc[e]);
        }
        m = mx;
    }

    // Merge the warp's streams (lanes sub, sub + L, ... hold one element range), then the
    // warps through shared memory: thread t < HD ends with element t.
    if (iters > 0) {
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            const float mo = shfl_xor(m, o), lo2 = shfl_xor(l, o);
            const float mm = fmax_f(m, mo);
            const float a = exp2_fast(m - mm), b = exp2_fast(mo - mm);
#pragma unroll
            for (int e = 0; e < KQ_E; ++e) acc[e] = acc[e] * a + shfl_xor(acc[e], o) * b;
            l = l * a + lo2 * b;
            m = mm;
        }
    }
    if (lane < L) {
#pragma unroll
        for (int e = 0; e < KQ_E; e += 4) *(kq_f32x4*)&s_acc[warp][sub * KQ_E + e] = kq_f32x4{acc[e], acc[e + 1], acc[e + 2], acc[e + 3]};
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    sync();
    float M = -3.0e38f, lsum = 0.0f, o = 0.0f;
    if (t < HD) {
#pragma unroll
        for (int w = 0; w < KQ_WARPS; ++w) M = fmax_f(M, s_m[w]);
#pragma unroll
        for (int w = 0; w < KQ_WARPS; ++w) {
            const float f = exp2_fast(s_m[w] - M);
            lsum += s_l[w] * f;
            o += s_acc[w][t] * f;
        }
    }
    const u64 at = (u64)head * HD + t;
    if (n_parts == 1) {
        if (t < HD) {
            const float y = o / lsum;
            out[at] = y;
            if (q8) q8_block_store(q8 + at / 32, y);
        }
        return;
    }

    // Several parts: publish this part's (m, l, acc); the last part to arrive merges.
    float* mine = part + ((u64)head * n_split + part_i) * (HD + 2);
    if (t < HD) mine[2 + t] = o;
    if (t == 0) {
        mine[0] = M;
        mine[1] = lsum;
    }
    kq_release();
    sync();
    if (t == 0) s_last = kq_arrive(cnt + head) == (u32)(n_parts - 1);
    sync();
    if (!s_last) return;
    kq_acquire();
    if (t == 0) cnt[head] = 0;  // every part of this head has arrived: ready for the next launch
    if (t < HD) {
        const volatile float* ph = part + (u64)head * n_split * (HD + 2);
        float M2 = -3.0e38f;
        for (int b = 0; b < n_parts; ++b) M2 = fmax_f(M2, ph[(u64)b * (HD + 2)]);
        float l2 = 0.0f, o2 = 0.0f;
        for (int b = 0; b < n_parts; ++b) {
            const float f = exp2_fast(ph[(u64)b * (HD + 2)] - M2);
            l2 += ph[(u64)b * (HD + 2) + 1] * f;
            o2 += ph[(u64)b * (HD + 2) + 2 + t] * f;
        }
        const float y = o2 / l2;
        out[at] = y;
        if (q8) q8_block_store(q8 + at / 32, y);
    }
}

// One kernel per head size (the lane layout depends on it); ty_k, ty_v: KQ_*.
KERNEL LAUNCH_BOUNDS(KQ_THREADS) void kvq_decode_d64(const float* q, const u8* kc, const u8* vc, float* out, block_q8_1* q8, const int* pos,
                                                    float* part, u32* cnt, int group, int n_kv, int ty_k, int ty_v, float scale, int window,
                                                    int n_split, int min_chunk) {
    pdl_entry();
    kvq_decode_run<64>(q, kc, vc, out, q8, pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
}
KERNEL LAUNCH_BOUNDS(KQ_THREADS) void kvq_decode_d128(const float* q, const u8* kc, const u8* vc, float* out, block_q8_1* q8, const int* pos,
                                                     float* part, u32* cnt, int group, int n_kv, int ty_k, int ty_v, float scale, int window,
                                                     int n_split, int min_chunk) {
    pdl_entry();
    kvq_decode_run<128>(q, kc, vc, out, q8, pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
}
KERNEL LAUNCH_BOUNDS(KQ_THREADS) void kvq_decode_d256(const float* q, const u8* kc, const u8* vc, float* out, block_q8_1* q8, const int* pos,
                                                     float* part, u32* cnt, int group, int n_kv, int ty_k, int ty_v, float scale, int window,
                                                     int n_split, int min_chunk) {
    pdl_entry();
    kvq_decode_run<256>(q, kc, vc, out, q8, pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
}

// Rows [lo, lo + n_rows) of K and V planes (types ty_k, ty_v; rows of nk / nv values,
// multiples of 32) as f16: dk / dv row r = plane row lo + r. nk = 0 (nv = 0): that plane
// is not converted (an f16 side is read in place). Thread g = r * C + i (C = max(nk, nv)
// / 16 per row) converts elements 16 i .. 16 i + 15 of row r of K and of V (rows in the
// grid's x: more than 65,535 of them fit). grid ceil(n_rows * C / 256), block 256.
KERNEL LAUNCH_BOUNDS(256) void kvq_to_f16(const u8* kc, const u8* vc, u16* dk, u16* dv, int nk, int nv, int lo, int n_rows, int ty_k, int ty_v) {
    pdl_entry();
    const u64 per_row = (u64)(nk > nv ? nk : nv) / KQ_E;
    const u64 g = (u64)bid_x() * 256 + tid_x();
    if (per_row == 0 || g >= per_row * (u64)n_rows) return;
    const int r = (int)(g / per_row), i = (int)(g % per_row);
    const u64 p = (u64)lo + r;
    for (int side = 0; side < 2; ++side) {
        const int n = side == 0 ? nk : nv;
        if (i * KQ_E >= n) continue;
        const int ty = side == 0 ? ty_k : ty_v;
        kq_raw raw;
        kq_load(raw, side == 0 ? kc : vc, ty, p * n + (u64)i * KQ_E);
        float x[KQ_E];
        kq_values(raw, ty, (i & 1) != 0, x);
        const float d = kq_scale(raw, ty);
        u32 h[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) h[j] = (u32)f2h(x[2 * j] * d) | ((u32)f2h(x[2 * j + 1] * d) << 16);
        kq_u32x4* dst = (kq_u32x4*)((side == 0 ? dk : dv) + (u64)r * n + (u64)i * KQ_E);
        dst[0] = kq_u32x4{h[0], h[1], h[2], h[3]};
        dst[1] = kq_u32x4{h[4], h[5], h[6], h[7]};
    }
}
