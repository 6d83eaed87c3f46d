// One decode step's attention in one launch: per-head RMSNorm of q and k, RoPE of both,
// q scaled, the new K/V row stored in the f16 cache, and attention over slots k0..=P
// with an online softmax. The step before this one (rope_kv_f32 + attn_f16) was two
// latency chains with few blocks busy; here the cache loads of the first keys are issued
// before the q/k preparation, so their memory latency overlaps the norm and the rotation,
// and the new key is used from shared memory, so no block ever waits on another block's
// cache store.
//
// Launch: grid (group, n_kv, n_split), block AD_THREADS, group = n_head / n_kv. Block
// (g, kvh, s) serves query head kvh * group + g over part s of the keys (no integer
// division on the way to the first loads). The split count n_split is fixed by the host
// from the cache size (a replayed graph keeps its shape token after token); the position P
// is read on the device, and the parts actually used are chosen from it: each part takes
// at least min_chunk keys (the host's default: one iteration's worth, AD_NSU(HD)), so short
// contexts run one block per head and write `out` directly, and longer ones spread over up
// to n_split blocks per head whose partial softmax states are merged by the last block to
// finish (a per-head arrival counter, reset by that block). Blocks past the parts in use
// exit at once.
//
// Inside a block the keys go to the warps in order (warp w takes the w-th run of AD_KW
// keys of each iteration), so a short context keeps only the first few warps busy: the
// others skip the key loop and the stream merge, and the scheduler issues for fewer warps
// (at a few hundred keys the kernel is a latency chain, not a bandwidth one; dealing the
// keys round all the block's streams instead, this kernel's first layout, measured slower
// and was deleted). The q/k preparation is one warp each (warp 0: q,
// warp 1: k, each lane HD / 32 elements, the norm a warp sum, the rotation angles computed
// while the loads are in flight, the pairs exchanged through shared memory under a warp
// barrier; warp 2: v), so the block meets at two barriers: after the preparation and
// before the cross-warp merge.
//
// Which block does what with the new token (n_tok == 1):
//  - the last part of every head attends to the new key (its own copy of k, normalized
//    and rotated in shared memory, rounded to f16 as the cache holds it);
//  - part 0 of the first query head of each KV group stores the new K and V row;
//  - q and k are not written back (nothing reads them after this op; see rope_attn.rs).
#include "common.h"

#define AD_THREADS 512
#define AD_WARPS (AD_THREADS / 32)
#define AD_U 4   // keys in flight per stream
#define AD_E 16  // head elements per lane (two 16-byte f16 chunks)
// Keys of one warp per iteration: (32 / (HD / AD_E)) streams * AD_U.
#define AD_KW(HD) ((32 * AD_E / (HD)) * AD_U)
// Keys per iteration of one block.
#define AD_NSU(HD) (AD_WARPS * AD_KW(HD))
#define AD_LOG2E 1.4426950408889634f

struct __attribute__((aligned(16))) ad_u32x4 { u32 x, y, z, w; };
struct __attribute__((aligned(16))) ad_f32x4 { float x, y, z, w; };

#ifdef LODE_AMD
DEV u32 ad_arrive(u32* c) { return __hip_atomic_fetch_add(c, 1u, __ATOMIC_ACQ_REL, __HIP_MEMORY_SCOPE_AGENT); }
DEV void ad_release() { __builtin_amdgcn_fence(__ATOMIC_RELEASE, "agent"); }
DEV void ad_acquire() { __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "agent"); }
// The lanes of one wave see each other's shared-memory writes.
DEV void ad_syncwarp() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#else
DEV u32 ad_arrive(u32* c) { return atomicAdd(c, 1u); }
DEV void ad_release() { __threadfence(); }
DEV void ad_acquire() { __threadfence(); }
DEV void ad_syncwarp() { __syncwarp(); }
#endif

// Issue the K and V loads of one iteration's AD_U keys of this lane's stream: key slot
// idx (counted down from hi - 1) = first + j * js, first = this iteration's slot of the
// stream's first key, js the slot stride between its keys. Keys past the part, and the new key (slot 0 of the last part: it
// comes from shared memory), are not loaded.
template <int HD>
DEV void ad_load(ad_u32x4 (*kr)[2], ad_u32x4 (*vr)[2], bool* live, const u16* kbase, const u16* vbase, u64 row, int hi, int nk,
                 int first, int js, bool newkey) {
#pragma unroll
    for (int j = 0; j < AD_U; ++j) {
        const int idx = first + j * js;
        live[j] = idx < nk;
        const bool from_cache = live[j] && !(newkey && idx == 0);
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            kr[j][c] = ad_u32x4{0, 0, 0, 0};
            vr[j][c] = ad_u32x4{0, 0, 0, 0};
        }
        if (from_cache) {
            const u64 at = (u64)(hi - 1 - idx) * row;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                kr[j][c] = *(const ad_u32x4*)(kbase + at + c * 8);
                vr[j][c] = *(const ad_u32x4*)(vbase + at + c * 8);
            }
        }
    }
}

// Dot of this lane's AD_E query elements with a key's AD_E f16 elements.
DEV float ad_dot(const float* qr, const ad_u32x4* kw) {
    float d0 = 0.0f, d1 = 0.0f;
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const u32 ws[4] = {kw[c].x, kw[c].y, kw[c].z, kw[c].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            d0 = fma_f(qr[c * 8 + 2 * w], h2f((u16)(ws[w] & 0xffff)), d0);
            d1 = fma_f(qr[c * 8 + 2 * w + 1], h2f((u16)(ws[w] >> 16)), d1);
        }
    }
    return d0 + d1;
}

// acc += pw * (a value row's AD_E f16 elements).
DEV void ad_axpy(float* acc, float pw, const ad_u32x4* vw) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
        const u32 ws[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            acc[c * 8 + 2 * w] = fma_f(pw, h2f((u16)(ws[w] & 0xffff)), acc[c * 8 + 2 * w]);
            acc[c * 8 + 2 * w + 1] = fma_f(pw, h2f((u16)(ws[w] >> 16)), acc[c * 8 + 2 * w + 1]);
        }
    }
}

// The output element t of head `head` (o / l) and, when q8 is given, its q8_1 block (the
// output projection's input; every thread t < HD calls it, HD % 32 == 0: whole warps).
DEV void ad_write(float* out, block_q8_1* q8, int head, int hd, int t, float y) {
    const u64 at = (u64)head * hd + t;
    out[at] = y;
    if (q8) q8_block_store(q8 + at / 32, y);
}

// One warp's preparation of the new token's q (warp 0) or k (warp 1): lane l holds elements
// l + 32 c in x (w: the norm weights, ffv: the frequency divisors of its pairs l + 32 c).
// q leaves s_f = the rotated q scaled by qs0 then qs1 (f32); k leaves s_h = the rotated k
// rounded to f16 and, when `kst` is given, stores that row in the cache. s_x: scratch
// (may be s_f).
template <int HD>
DEV void ad_prep(float* x, const float* w, const float* ffv, bool norm, int P, int n_rot, int neox, float theta_scale, float freq_scale, float eps,
                 float qs0, float qs1, bool to_f16, float* s_x, float* s_f, u16* s_h, u16* kst) {
    constexpr int C = HD / 32;
    constexpr int NP = (HD / 2 + 31) / 32;
    const int lane = tid_x() & 31;
    const int half = n_rot / 2;
    // 1. The angles of pairs i = lane + 32 c (they need the position only, so this chain
    //    runs while the norm waits on its loads). norm_rope.hip's rope_angle operation for
    //    operation: theta = P multiplied by theta_scale once per pair in f32, as the CPU
    //    does; lane l's first pair takes l predicated products, each later pair 32 more.
    float sn[NP], cs[NP];
    float theta = (float)P;
#pragma unroll
    for (int j = 0; j < 31; ++j)
        if (j < lane) theta *= theta_scale;
#pragma unroll
    for (int c = 0; c < NP; ++c) {
        if (c > 0) {
#pragma unroll
            for (int j = 0; j < 32; ++j) theta *= theta_scale;
        }
        sn[c] = 0.0f;
        cs[c] = 1.0f;
        if (lane + 32 * c < half) sincos_p(freq_scale * (ffv ? theta / ffv[c] : theta), &sn[c], &cs[c]);
    }
    // 2. Per-head RMSNorm (a warp sum of each lane's squares).
    if (norm) {
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < C; ++c) ss = fma_f(x[c], x[c], ss);
        ss = warp_sum(ss);
        const float r = 1.0f / sqrt_f(ss / (float)HD + eps);
#pragma unroll
        for (int c = 0; c < C; ++c) x[c] = x[c] * r * w[c];
    }
    // 3. Elements past the rotated ones are final now; the rotated ones go through shared
    //    memory to the lane that owns their pair.
    auto fin = [&](int e, float y) {
        if (to_f16) {
            const u16 h = f2h(y);
            s_h[e] = h;
            if (kst) kst[e] = h;
        } else {
            s_f[e] = y * qs0 * qs1;
        }
    };
#pragma unroll
    for (int c = 0; c < C; ++c) {
        const int e = lane + 32 * c;
        if (e < n_rot) s_x[e] = x[c];
        else fin(e, x[c]);
    }
    ad_syncwarp();
#pragma unroll
    for (int c = 0; c < NP; ++c) {
        const int pi = lane + 32 * c;
        if (pi < half) {
            const int i0 = neox ? pi : 2 * pi, i1 = neox ? pi + half : 2 * pi + 1;
            const float a0 = s_x[i0], b0 = s_x[i1];
            fin(i0, a0 * cs[c] - b0 * sn[c]);
            fin(i1, a0 * sn[c] + b0 * cs[c]);
        }
    }
}

// One lane's C elements (lane + 32 c) of a new token's q, k or v row (live: this warp
// prepares one; otherwise zeros).
template <int C>
DEV void ad_inputs(float* x, const float* src, bool live) {
#pragma unroll
    for (int c = 0; c < C; ++c) x[c] = live ? src[(tid_x() & 31) + 32 * c] : 0.0f;
}

// q: [n_head, HD] f32 and k, v: [n_kv, HD] f32 (the projections of the one new token);
// kc, vc: [n_ctx, n_kv * HD] f16 caches; out: [n_head, HD] f32; q8: null or out's q8_1
// blocks [n_head * HD / 32]; qw, kw: [HD] norm weights or null (no norm); ff: [n_rot / 2]
// frequency divisors or null; pos: [1] i32 (the new token's slot P, read here so the
// graph of a decode step replays unchanged); part: [n_head, n_split, HD + 2] f32 scratch
// (m, l, acc of each part); cnt: [n_head] u32 arrival counters, zero between launches;
// group: query heads per KV head; min_chunk: the fewest keys a part takes (n_split *
// min_chunk covers the most keys). Keys visible to the query at P:
// [max(0, P - window + 1) if window > 0 else 0, P].
template <int HD>
DEV void attn_decode_run(const float* q, const float* k, const float* v, u16* kc, u16* vc, float* out, block_q8_1* q8,
                          const float* qw, const float* kw, const float* ff, const int* pos, float* part, u32* cnt, int group,
                          int n_kv, int n_ctx, int n_rot, int neox, float theta_scale, float freq_scale, float eps, float q_scale,
                          float scale, int window, int n_split, int min_chunk) {
    constexpr int L = HD / AD_E;         // lanes per key
    constexpr int KW = AD_KW(HD);        // keys per warp per iteration
    constexpr int NSU = AD_NSU(HD);      // keys per iteration of the block
    constexpr int C = HD / 32;           // elements per lane in the preparation
    constexpr int NP = (HD / 2 + 31) / 32;  // rotation pairs per lane, at most
    __shared__ __attribute__((aligned(16))) float s_q[HD];
    __shared__ float s_kx[HD];
    __shared__ __attribute__((aligned(16))) u16 s_kh[HD];
    __shared__ __attribute__((aligned(16))) u16 s_vh[HD];
    __shared__ float s_m[AD_WARPS], s_l[AD_WARPS];
    __shared__ __attribute__((aligned(16))) float s_acc[AD_WARPS][HD];
    __shared__ int s_last;

    const int g = bid_x(), kvh = bid_y(), part_i = bid_z();
    const int head = kvh * group + g;
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int sub = lane % L, ws = lane / L;
    // Before the wait: what no kernel of this step writes — the position (staged by a copy
    // before the step's first kernel), the norm weights, the frequency divisors and the
    // cache rows of earlier tokens (this launch writes only slot P, and its blocks take the
    // new key from shared memory) — so the first cache loads' latency overlaps the kernel
    // before this one instead of following it.
    float wv[C], ffv[NP];
    const float* wsrc = warp == 0 ? qw : warp == 1 ? kw : nullptr;
#pragma unroll
    for (int c = 0; c < C; ++c) wv[c] = 1.0f;
#pragma unroll
    for (int c = 0; c < NP; ++c) ffv[c] = 1.0f;
    if (warp < 3) {
        if (wsrc) {
#pragma unroll
            for (int c = 0; c < C; ++c) wv[c] = wsrc[lane + 32 * c];
        }
        if (ff && warp < 2) {
#pragma unroll
            for (int c = 0; c < NP; ++c)
                if (lane + 32 * c < n_rot / 2) ffv[c] = ff[lane + 32 * c];
        }
    }
    const int P = pos[0];
    if (P < 0 || P >= n_ctx) return;  // the host never stages such a position
    const int k0 = (window > 0 && P - window + 1 > 0) ? P - window + 1 : 0;
    const int nkeys = P - k0 + 1;
    // Up to min_chunk keys: one part (no division on the way to the cache loads).
    int chunk = min_chunk, n_parts = 1;
    if (nkeys > min_chunk) {
        chunk = (nkeys + n_split - 1) / n_split;
        if (chunk < min_chunk) chunk = min_chunk;
        n_parts = (nkeys + chunk - 1) / chunk;
    }
    if (part_i >= n_parts) return;
    const int lo = k0 + part_i * chunk;
    const int hi = lo + chunk < P + 1 ? lo + chunk : P + 1;
    const int nk = hi - lo;
    const bool last = part_i == n_parts - 1;
    const bool store = part_i == 0 && g == 0;
    const u64 row = (u64)n_kv * HD;
    const u16* kbase = kc + (u64)kvh * HD + sub * AD_E;
    const u16* vbase = vc + (u64)kvh * HD + sub * AD_E;
    // This warp's keys in each iteration it: slots it * NSU + warp * KW + [0, KW) (stream
    // ws: + ws + j * NSW).
    constexpr int NSW = 32 / L;
    const int wfirst = warp * KW;
    const int js = NSW;
    const int iters = nk > wfirst ? (nk - wfirst + NSU - 1) / NSU : 0;

    // 1. The first iteration's cache loads.
    ad_u32x4 kr[AD_U][2], vr[AD_U][2];
    bool live[AD_U];
    ad_load<HD>(kr, vr, live, kbase, vbase, row, hi, iters > 0 ? nk : 0, wfirst + ws, js, last);

    // The new token's inputs (warp 0: q, warp 1: k, warp 2: v), written by the kernel
    // before this one: after the wait.
    pdl_entry();
    float x[C];
    ad_inputs<C>(x, warp == 0 ? q + (u64)head * HD : warp == 1 ? k + (u64)kvh * HD : v + (u64)kvh * HD, warp < 3);

    // 2. The new token's q (warp 0), k (warp 1) and v (warp 2).
    const u64 at_new = (u64)P * row + (u64)kvh * HD;
    if (warp < 2) {
        ad_prep<HD>(x, wv, ff ? ffv : nullptr, wsrc != nullptr, P, n_rot, neox, theta_scale, freq_scale, eps, q_scale, scale * AD_LOG2E, warp == 1,
                    warp == 0 ? s_q : s_kx, s_q, s_kh, warp == 1 && store ? kc + at_new : nullptr);
    } else if (warp == 2) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
            const u16 h = f2h(x[c]);
            s_vh[lane + 32 * c] = h;
            if (store) vc[at_new + lane + 32 * c] = h;
        }
    }
    sync();

    // 3. This lane's query slice; the last part's first stream takes the new key from
    //    shared memory (its slot was left out of the cache loads).
    float qr[AD_E], acc[AD_E];
#pragma unroll
    for (int e = 0; e < AD_E; e += 4) {
        const ad_f32x4 q4 = *(const ad_f32x4*)&s_q[sub * AD_E + e];
        qr[e] = q4.x;
        qr[e + 1] = q4.y;
        qr[e + 2] = q4.z;
        qr[e + 3] = q4.w;
    }
#pragma unroll
    for (int e = 0; e < AD_E; ++e) acc[e] = 0.0f;
    if (last && warp == 0 && ws == 0) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
            kr[0][c] = *(const ad_u32x4*)(s_kh + sub * AD_E + c * 8);
            vr[0][c] = *(const ad_u32x4*)(s_vh + sub * AD_E + c * 8);
        }
    }

    // 4. Online softmax over the warp's keys, AD_U keys of each stream at a time. The
    //    iteration count is the warp's, so the shuffles stay converged.
    float m = -3.0e38f, l = 0.0f;
    for (int it = 0; it < iters; ++it) {
        if (it > 0) ad_load<HD>(kr, vr, live, kbase, vbase, row, hi, nk, it * NSU + wfirst + ws, js, false);
        float sc[AD_U];
        float mx = m;
#pragma unroll
        for (int j = 0; j < AD_U; ++j) {
            float d = ad_dot(qr, kr[j]);
#pragma unroll
            for (int o = 1; o < L; o <<= 1) d += shfl_xor(d, o);
            sc[j] = live[j] ? d : -3.0e38f;
            mx = fmax_f(mx, sc[j]);
        }
        const float corr = exp2_fast(m - mx);
        l *= corr;
#pragma unroll
        for (int e = 0; e < AD_E; ++e) acc[e] *= corr;
#pragma unroll
        for (int j = 0; j < AD_U; ++j) {
            const float pw = live[j] ? exp2_fast(sc[j] - mx) : 0.0f;
            l += pw;
            ad_axpy(acc, pw, vr[j]);
        }
        m = mx;
    }

    // 5. Merge the warp's streams (lanes sub, sub + L, … hold one element range), then
    //    the warps through shared memory: thread t < HD ends with element t. A warp without
    //    keys skips the shuffles and leaves (m, l, acc) = (-3e38, 0, 0), which the merge
    //    weighs by 0 (no branch per warp there: its shared loads all go out at once).
    if (iters > 0) {
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            const float mo = shfl_xor(m, o), lo2 = shfl_xor(l, o);
            const float mm = fmax_f(m, mo);
            const float a = exp2_fast(m - mm), b = exp2_fast(mo - mm);
#pragma unroll
            for (int e = 0; e < AD_E; ++e) acc[e] = acc[e] * a + shfl_xor(acc[e], o) * b;
            l = l * a + lo2 * b;
            m = mm;
        }
    }
    if (lane < L) {
#pragma unroll
        for (int e = 0; e < AD_E; e += 4) *(ad_f32x4*)&s_acc[warp][sub * AD_E + e] = ad_f32x4{acc[e], acc[e + 1], acc[e + 2], acc[e + 3]};
    }
    if (lane == 0) {
        s_m[warp] = m;
        s_l[warp] = l;
    }
    sync();
    float M = -3.0e38f, lsum = 0.0f, o = 0.0f;
    if (t < HD) {
#pragma unroll
        for (int w = 0; w < AD_WARPS; ++w) M = fmax_f(M, s_m[w]);
#pragma unroll
        for (int w = 0; w < AD_WARPS; ++w) {
            const float f = exp2_fast(s_m[w] - M);
            lsum += s_l[w] * f;
            o += s_acc[w][t] * f;
        }
    }
    if (n_parts == 1) {
        if (t < HD) ad_write(out, q8, head, HD, t, o / lsum);
        return;
    }

    // 6. Several parts: publish this part's (m, l, acc); the last part to arrive merges.
    float* mine = part + ((u64)head * n_split + part_i) * (HD + 2);
    if (t < HD) mine[2 + t] = o;
    if (t == 0) {
        mine[0] = M;
        mine[1] = lsum;
    }
    ad_release();
    sync();
    if (t == 0) s_last = ad_arrive(cnt + head) == (u32)(n_parts - 1);
    sync();
    if (!s_last) return;
    ad_acquire();
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
        ad_write(out, q8, head, HD, t, o2 / l2);
    }
}

// One kernel per supported head size (the stream layout depends on it).
KERNEL LAUNCH_BOUNDS(AD_THREADS) void attn_decode_d64(const float* q, const float* k, const float* v, u16* kc, u16* vc, float* out, block_q8_1* q8,
                                                     const float* qw, const float* kw, const float* ff, const int* pos, float* part, u32* cnt,
                                                     int group, int n_kv, int n_ctx, int n_rot, int neox, float theta_scale, float freq_scale,
                                                     float eps, float q_scale, float scale, int window, int n_split, int min_chunk) {
    attn_decode_run<64>(q, k, v, kc, vc, out, q8, qw, kw, ff, pos, part, cnt, group, n_kv, n_ctx, n_rot, neox, theta_scale, freq_scale, eps, q_scale,
                        scale, window, n_split, min_chunk);
}
KERNEL LAUNCH_BOUNDS(AD_THREADS) void attn_decode_d128(const float* q, const float* k, const float* v, u16* kc, u16* vc, float* out, block_q8_1* q8,
                                                     const float* qw, const float* kw, const float* ff, const int* pos, float* part, u32* cnt,
                                                     int group, int n_kv, int n_ctx, int n_rot, int neox, float theta_scale, float freq_scale,
                                                     float eps, float q_scale, float scale, int window, int n_split, int min_chunk) {
    attn_decode_run<128>(q, k, v, kc, vc, out, q8, qw, kw, ff, pos, part, cnt, group, n_kv, n_ctx, n_rot, neox, theta_scale, freq_scale, eps, q_scale,
                        scale, window, n_split, min_chunk);
}
KERNEL LAUNCH_BOUNDS(AD_THREADS) void attn_decode_d256(const float* q, const float* k, const float* v, u16* kc, u16* vc, float* out, block_q8_1* q8,
                                                     const float* qw, const float* kw, const float* ff, const int* pos, float* part, u32* cnt,
                                                     int group, int n_kv, int n_ctx, int n_rot, int neox, float theta_scale, float freq_scale,
                                                     float eps, float q_scale, float scale, int window, int n_split, int min_chunk) {
    attn_decode_run<256>(q, k, v, kc, vc, out, q8, qw, kw, ff, pos, part, cnt, group, n_kv, n_ctx, n_rot, neox, theta_scale, freq_scale, eps, q_scale,
                        scale, window, n_split, min_chunk);
}
