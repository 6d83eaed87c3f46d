// Fused decode kernels (one token): the matvecs of a layer with their input side inside.
//
// A decode step of a small model is a chain of short kernels, each a dependent latency
// (load -> reduce -> store) with nothing overlapping it. These kernels take the steps
// before a matvec into the matvec itself:
//   decode_mv_norm{4,16,4_1k,4_h1k}: x += add, out = RMSNorm(x)·w, then 1-3 matvecs of out
//                              (q/k/v; _h1k: Q4_K rows of <= 1024 values, a row per half-warp);
//   decode_mv_glu{4,16,4_1k,4_h1k}: the same norm, then gate and up rows and out_i = act(g_i)·u_i;
//   decode_mv_quant:           a matvec of an f32 input that has no quantized form yet (the
//                              o-projection after attention, the down projection after the
//                              GLU); rows of 2-4 steps one warp per step (quant_run);
//   decode_mv_quant2:          the same for Q4_K rows of 2+ steps one warp per row (4B / 8B's
//                              o), both first steps loaded before the wait.
// (Tried on the H200 and dropped: copying a block's weight rows into shared memory before
// the wait, cp.async, instead of the first step into registers — the norm kernels lost,
// 4.4 vs 3.5 µs per call in place, and decode_mv_quant did not move.)
// Every block redundantly runs the prologue (read the input, reduce, normalize, quantize)
// into SHARED memory, in exactly the activation form(s) the weights read: the codes and
// scales of quantize.hip and of norm_rope.hip's fused norm (norm_q8_row: the same 1024
// virtual-thread reduction order, so the normalized values are bit-identical), so the
// results equal the unfused kernels'. The first weight loads of each warp's row are issued
// before the prologue (weights do not depend on the previous kernel) and pdl_entry()
// follows them, so DRAM latency overlaps the norm. The dot products are mv_dot.h's.
//
// The norm kernels keep the op's semantics: block 0 writes `out`; the sum x + add is
// written back to x by the LAST block to take a ticket from `counter` (every block takes
// one after reading x, so no block can read a half-updated x), which resets the counter.
// One warp per output row, 8 rows per 256-thread block; the _1k kernels (rows of at most
// 1024 values) 32 rows per 1024-thread block, one block per multiprocessor, so the prologue
// runs once per SM (the H200 measured 0.6B's decode +9 % from them). Type codes (per
// weight): 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL, 10 Q4_K, 11 Q5_K, 12 Q6_K,
// 13 Q2_K, 14 Q3_K, 15 IQ4_XS (the last four: mv_dot_low.h's bodies).
#include "common.h"

#include "mv_dot.h"
#include "mv_dot_b32.h"
#include "dequant_low.h"
#include "mv_dot_low.h"

struct __attribute__((aligned(16))) f32x4 { float x, y, z, w; };

// ---- per-type steps (mv_dot.h): UNIT values per unit, STEP units per warp step ----

// K-quants: one slot per step (Q4_K 8 super-blocks, Q5_K / Q6_K 4 = 1024 values);
// 32-element types: two slots (32 blocks = 1024 values). Few registers per step, two
// steps in flight.
template <int TY> struct Mv;
// A: one lane's activation of a step, for the walks that keep it in registers (act loads
// it, dot_act is dot with it).
template <> struct Mv<10> {
    typedef q4k_w<1> W;
    typedef kact A;
    enum { BB = 144, STEP = 8, UNIT = 256 };  // mv_dot.h: a Q4_K slot is 8 super-blocks
    DEV void load(const u8* wr, int nu, int u0, W& r) { q4k_wload<1>(wr, nu, u0, r); }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) { q4k_wdot<1, 1>(r, x, nu * 8, nu, u0, 1, acc); }
    DEV void act(const block_q8_1* x, int nu, int u0, A& a) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 2);
        k_act_load(sb < nu ? x + sb * 8 + 4 * ((lane >> 1) & 1) : x, lane & 1, a);
    }
    DEV void dot_act(const W& r, const A& a, int nu, int u0, float* acc) { q4k_dot_sb_act(r.hd[0], r.q0[0], r.q1[0], a, u0 + ((tid_x() & 31) >> 2) < nu, acc); }
};
template <> struct Mv<11> {
    typedef q5k_w<1> W;
    enum { BB = 176, STEP = 4, UNIT = 256 };
    DEV void load(const u8* wr, int nu, int u0, W& r) { q5k_wload<1>(wr, nu, u0, r); }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) { q5k_wdot<1, 1>(r, x, nu * 8, nu, u0, 1, acc); }
};
template <> struct Mv<12> {
    typedef q6k_w<1> W;
    typedef q6act A;
    enum { BB = 210, STEP = 4, UNIT = 256 };
    DEV void load(const u8* wr, int nu, int u0, W& r) { q6k_wload<1>(wr, nu, u0, r); }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) { q6k_wdot<1, 1>(r, x, nu * 8, nu, u0, 1, acc); }
    DEV void act(const block_q8_1* x, int nu, int u0, A& a) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 3);
        q6k_act_load((const u8*)(x + (sb < nu ? sb * 8 + 4 * ((lane >> 2) & 1) : 0)) + 8 * (lane & 3), a);
    }
    DEV void dot_act(const W& r, const A& a, int nu, int u0, float* acc) {
        q6k_dot_sb_act(r.A[0], r.B[0], r.H[0], r.S[0], r.d[0], r.odd[0], a, u0 + ((tid_x() & 31) >> 3) < nu, acc);
    }
};
template <int T> struct MvB {
    typedef b32_w<2> W;
    enum { BB = b32_bytes<T>::BB, STEP = 32, UNIT = 32 };
    DEV void load(const u8* wr, int nu, int u0, W& r) { b32_wload<T, 2>(wr, nu, u0, r); }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) { b32_wdot<T, 1, 2>(r, x, nu, u0, 1, acc); }
};
// mv_dot_low.h's types, each step the work of one slot of its plain matvec (the same
// lanes, blocks and order: the sums are mv_any's bit for bit). Q2_K (K form): 4
// super-blocks a step, 8 lanes each; Q3_K, IQ4_XS (K form): 8 super-blocks, 4 lanes each;
// IQ4_NL (q8_1 form): 64 blocks, 2 lanes each.
template <> struct Mv<13> {
    typedef q23_w W;
    enum { BB = 84, STEP = 4, UNIT = 256 };
    DEV void load(const u8* wr, int nu, int u0, W& r) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 3);
        if (sb < nu) q2k_load(wr + (u64)sb * BB, (lane >> 2) & 1, lane & 3, r);
    }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) {
        const int sb = u0 + ((tid_x() & 31) >> 3);
        if (sb < nu) q2k_dot<1>(r, x + sb * 8, 0, 1, acc);
    }
};
template <> struct Mv<14> {
    typedef q3k_w W;
    enum { BB = 110, STEP = 8, UNIT = 256 };
    DEV void load(const u8* wr, int nu, int u0, W& r) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 2);
        if (sb < nu) q3k_load(wr + (u64)sb * BB, lane & 3, r);
    }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) {
        const int sb = u0 + ((tid_x() & 31) >> 2);
        if (sb < nu) q3k_dot<1>(r, x + sb * 8, 0, 1, acc);
    }
};
template <> struct Mv<15> {
    typedef xs_w W;
    enum { BB = 136, STEP = 8, UNIT = 256 };
    DEV void load(const u8* wr, int nu, int u0, W& r) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 2);
        if (sb < nu) xs_load(wr + (u64)sb * BB, lane & 3, r);
    }
    DEV void dot(const W& r, const block_q8_1* x, int nu, int u0, float* acc) {
        const int lane = tid_x() & 31, sb = u0 + (lane >> 2);
        if (sb < nu) xs_dot<1>(r, x + sb * 8 + 2 * (lane & 3), 0, 1, acc);
    }
};
struct nl4_w { nl_w<false> r[4]; };
template <> struct Mv<5> {
    typedef nl4_w W;
    enum { BB = 18, STEP = 64, UNIT = 32 };
    DEV void load(const u8* wr, int nu, int u0, W& w) {
        const int lane = tid_x() & 31;
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int blk = u0 + (lane >> 1) + 16 * it;
            if (blk < nu) nl_load<false>(wr + (u64)blk * BB, lane & 1, w.r[it]);
        }
    }
    DEV void dot(const W& w, const block_q8_1* x, int nu, int u0, float* acc) {
        const int lane = tid_x() & 31;
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int blk = u0 + (lane >> 1) + 16 * it;
            if (blk < nu) nl_dot<false, 1>(w.r[it], x + blk, 0, 1, acc);
        }
    }
};
template <> struct Mv<0> : MvB<0> {};
template <> struct Mv<1> : MvB<1> {};
template <> struct Mv<2> : MvB<2> {};
template <> struct Mv<3> : MvB<3> {};
template <> struct Mv<4> : MvB<4> {};

// The row (nu units at wr) whose first step is already in `cur`: each later step's loads
// are issued before the current step's products. Returns the warp's sum (every lane).
template <int TY>
DEV float row_finish(typename Mv<TY>::W& cur, const u8* wr, const block_q8_1* xs, int nu) {
    typedef Mv<TY> M;
    float acc[1] = {0.0f};
    for (int u0 = 0; u0 < nu; u0 += M::STEP) {
        typename M::W nxt;
        const bool more = u0 + M::STEP < nu;
        if (more) M::load(wr, nu, u0 + M::STEP, nxt);
        M::dot(cur, xs, nu, u0, acc);
        if (more) cur = nxt;
    }
    return warp_sum(acc[0]);
}

// row_finish for a row whose first two steps are already in c0 and c1 (c1 only when the
// row has a second step): each later step is loaded two steps ahead. The same products and
// additions in the same order, so the sum is row_finish's bit for bit.
template <int TY>
DEV float row_finish2(typename Mv<TY>::W& c0, typename Mv<TY>::W& c1, const u8* wr, const block_q8_1* xs, int nu) {
    typedef Mv<TY> M;
    float acc[1] = {0.0f};
    for (int u0 = 0; u0 < nu; u0 += M::STEP) {
        typename M::W n2;
        const bool more2 = u0 + 2 * M::STEP < nu;
        if (more2) M::load(wr, nu, u0 + 2 * M::STEP, n2);
        M::dot(c0, xs, nu, u0, acc);
        c0 = c1;
        if (more2) c1 = n2;
    }
    return warp_sum(acc[0]);
}

// Two rows of the same shape at once (gate and up): their steps interleaved, so the two
// dependent chains (products, then the warp sums) overlap instead of running one after
// the other. Each row's arithmetic is row_finish's, in the same order.
template <int TY>
DEV void rows2_finish(typename Mv<TY>::W& ca, typename Mv<TY>::W& cb, const u8* wa, const u8* wb, const block_q8_1* xs, int nu, float* ra, float* rb) {
    typedef Mv<TY> M;
    float acca[1] = {0.0f}, accb[1] = {0.0f};
    for (int u0 = 0; u0 < nu; u0 += M::STEP) {
        typename M::W na, nb;
        const bool more = u0 + M::STEP < nu;
        if (more) {
            M::load(wa, nu, u0 + M::STEP, na);
            M::load(wb, nu, u0 + M::STEP, nb);
        }
        M::dot(ca, xs, nu, u0, acca);
        M::dot(cb, xs, nu, u0, accb);
        if (more) {
            ca = na;
            cb = nb;
        }
    }
    float a = acca[0], b = accb[0];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        a += shfl_xor(a, m);
        b += shfl_xor(b, m);
    }
    *ra = a;
    *rb = b;
}

// rows2_finish for rows of one step (nu <= STEP: every row a wide block takes), without
// the next-step registers the loop keeps: the same products and sums, bit for bit.
template <int TY>
DEV void rows2_one(const typename Mv<TY>::W& ca, const typename Mv<TY>::W& cb, const block_q8_1* xs, int nu, float* ra, float* rb) {
    typedef Mv<TY> M;
    float acca[1] = {0.0f}, accb[1] = {0.0f};
    M::dot(ca, xs, nu, 0, acca);
    M::dot(cb, xs, nu, 0, accb);
    float a = acca[0], b = accb[0];
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        a += shfl_xor(a, m);
        b += shfl_xor(b, m);
    }
    *ra = a;
    *rb = b;
}

// A ticket from the block counter (one thread per block, after the block's reads of x).
DEV u32 take_ticket(u32* c) {
#ifdef LODE_AMD
    __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent");
    return __hip_atomic_fetch_add(c, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
    __threadfence();
    return atomicAdd(c, 1u);
#endif
}

// ---- the RMSNorm prologue ----

// Rows of up to 256 Q values (Q = 4: 1024, Q = 16: 4096): the smaller kernel keeps its
// shared memory small (10 KB instead of 41 KB).
// 16-byte aligned: the K-quant dot bodies read the K form with 16-byte loads.
template <int Q>
struct __attribute__((aligned(16))) NormSh {
    float sum[256 * Q];           // x + add, for the write-back
    float o[256 * Q];             // the normalized row (staging of the K form)
    block_q8_1 q8[256 * Q / 32];  // q8_1 form
    block_q8_1 kf[256 * Q / 32];  // K form
    float red[32];
};

// What every norm kernel gets. x, add, out: [n] f32 (add may be null); nw: [n] f32 or null.
struct NormArgs {
    const float* x;
    const float* add;
    const float* nw;
    float* out;
    u32* counter;
    int nblk, n;
    float eps;
};

// Blocks of NT threads (256, or 1024: one block per multiprocessor, whose prologue then
// runs once per multiprocessor instead of four times); each thread holds QT = 256 Q / NT
// elements of the row, t + NT q.

// Thread t's norm weights (element t + NT q), loaded before pdl_entry (weights only).
template <int Q, int NT>
DEV void norm_wload(const NormArgs& a, float* wv) {
    const int t = tid_x();
#pragma unroll
    for (int q = 0; q < 256 * Q / NT; ++q) {
        const int i = t + NT * q;
        wv[q] = (a.nw && i < a.n) ? a.nw[i] : 1.0f;
    }
}

// norm_q8_row's arithmetic with NT threads: thread t plays virtual threads t + NT m
// (m < 1024 / NT) of its 1024, whose elements are t + NT m + 1024 j; each virtual thread's
// sum of squares, each virtual warp's butterfly and the 32-warp total are the same
// operations in the same order. Leaves the q8_1 and / or K form in shared memory; thread
// 0 returns its ticket in *ticket when add is given.
template <int Q, int NT>
DEV void norm_prologue(const NormArgs& a, const float* wv, bool need_q8, bool need_k, NormSh<Q>& sh, u32* ticket) {
    enum { QT = 256 * Q / NT, M = 1024 / NT, NW = NT / 32 };
    const int t = tid_x(), lane = t & 31, wp = t >> 5, n = a.n;
    float v[QT];
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ss[m] = 0.0f;
#pragma unroll
    for (int q = 0; q < QT; ++q) {
        const int i = t + NT * q;
        v[q] = 0.0f;
        if (i < n) {
            float x = a.x[i];
            if (a.add) x += a.add[i];
            v[q] = x;
            ss[q % M] += x * x;
        }
    }
    if (a.add) {
#pragma unroll
        for (int q = 0; q < QT; ++q)
            if (t + NT * q < n) sh.sum[t + NT * q] = v[q];
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float s = warp_sum(ss[m]);
        if (lane == 0) sh.red[wp + NW * m] = s;
    }
    sync();
    if (a.add && t == 0) *ticket = take_ticket(a.counter);
    const float tot = warp_sum(sh.red[lane]);
    const float scale = 1.0f / sqrt_f(tot / (float)n + a.eps);
    const bool write_out = bid_x() == 0;
#pragma unroll
    for (int q = 0; q < QT; ++q) {
        const int i = t + NT * q;
        if (i < n) { // warp-uniform: n % 32 == 0
            float o = v[q] * scale;
            o *= wv[q];
            if (write_out) a.out[i] = o;
            if (need_q8) q8_block_store(sh.q8 + i / 32, o);
            if (need_k) sh.o[i] = o;
        }
    }
    if (need_k) {
        sync(); // the normalized row is staged
        for (int sb = wp; sb < n / 256; sb += NW) {
            const f32x4* p = (const f32x4*)(sh.o + sb * 256 + 8 * lane);
            const f32x4 p0 = p[0], p1 = p[1];
            const float vv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
            int c[8];
            const float d = q8k_warp_codes(vv, c);
            q8k_warp_store(sh.kf + sb * 8, c, d);
        }
    }
    sync(); // the forms are staged
}

// Warp 0 of the block holding the last ticket writes x + add back and resets the counter.
template <int Q>
DEV void norm_tail(const NormArgs& a, const NormSh<Q>& sh, u32 ticket) {
    if (!a.add || tid_x() >= 32) return;
    const int lane = tid_x() & 31;
    int last = (lane == 0 && ticket == (u32)(a.nblk - 1)) ? 1 : 0;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) last |= shfl_xor_i(last, m);
    if (!last) return;
    float* x = (float*)a.x;
    for (int i = 4 * lane; i < a.n; i += 128) *(f32x4*)(x + i) = *(const f32x4*)(sh.sum + i);
    if (lane == 0) *a.counter = 0u;
}

// ---- norm + up to 3 matvecs ----

struct Seg {
    const u8* W;
    float* y;
    int rows, ty;
};

template <int Q, int TY, int NT>
DEV void norm_multi_run(const NormArgs& a, const Seg& s, int b, bool need_q8, bool need_k, NormSh<Q>& sh) {
    typedef Mv<TY> M;
    const int row = b * (NT / 32) + (tid_x() >> 5);
    const bool live = row < s.rows;
    const int nu = a.n / M::UNIT;
    const u8* wr = s.W + (u64)(live ? row : 0) * nu * M::BB;
    typename M::W cur;
    if (live) M::load(wr, nu, 0, cur);
    float wv[256 * Q / NT];
    norm_wload<Q, NT>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<Q, NT>(a, wv, need_q8, need_k, sh, &ticket);
    if (live) {
        const float r = row_finish<TY>(cur, wr, TY >= 10 ? sh.kf : sh.q8, nu);
        if ((tid_x() & 31) == 0) s.y[row] = r;
    }
    norm_tail(a, sh, ticket);
}

template <int Q, int NT>
DEV void norm_multi(const NormArgs& a, Seg s0, Seg s1, Seg s2) {
    __shared__ NormSh<Q> sh;
    int b = bid_x();
    const int R = NT / 32, nb0 = (s0.rows + R - 1) / R, nb1 = (s1.rows + R - 1) / R;
    Seg s = s0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        s = s2;
    } else if (b >= nb0) {
        b -= nb0;
        s = s1;
    }
    bool need_q8 = false, need_k = false;
    const Seg all[3] = {s0, s1, s2};
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        if (all[i].rows <= 0) continue;
        if (all[i].ty >= 10) need_k = true;
        else need_q8 = true;
    }
    switch (s.ty) {
    case 0: norm_multi_run<Q, 0, NT>(a, s, b, need_q8, need_k, sh); break;
    case 1: norm_multi_run<Q, 1, NT>(a, s, b, need_q8, need_k, sh); break;
    case 2: norm_multi_run<Q, 2, NT>(a, s, b, need_q8, need_k, sh); break;
    case 3: norm_multi_run<Q, 3, NT>(a, s, b, need_q8, need_k, sh); break;
    case 4: norm_multi_run<Q, 4, NT>(a, s, b, need_q8, need_k, sh); break;
    case 10: norm_multi_run<Q, 10, NT>(a, s, b, need_q8, need_k, sh); break;
    case 11: norm_multi_run<Q, 11, NT>(a, s, b, need_q8, need_k, sh); break;
    case 12: norm_multi_run<Q, 12, NT>(a, s, b, need_q8, need_k, sh); break;
    case 5: norm_multi_run<Q, 5, NT>(a, s, b, need_q8, need_k, sh); break;
    // (Q3_K has no case here nor in norm_glu: its body took these kernels from 64 / 80
    // registers to 77 / 80 with more spills, one block per SM fewer for every type. Its
    // norm launches take the walk, decode_mv_norm_walk_q3k, at any row count.)
    case 13: norm_multi_run<Q, 13, NT>(a, s, b, need_q8, need_k, sh); break;
    case 15: norm_multi_run<Q, 15, NT>(a, s, b, need_q8, need_k, sh); break;
    default: break;
    }
}

// grid (Σ ceil(rows_s / (NT / 32))) = nblk, block NT; n % 32 == 0 (% 256 with a K-quant
// weight), n <= 256 Q; segments with rows 0 are absent.
#define NORM_MULTI(NAME, Q, NT)                                                                                              \
    KERNEL LAUNCH_BOUNDS(NT) void NAME(const float* x, const float* add, const float* nw, float* out, u32* counter, int nblk, \
                                        int n, float eps, const u8* W0, float* y0, int rows0, int ty0, const u8* W1, float* y1,   \
                                        int rows1, int ty1, const u8* W2, float* y2, int rows2, int ty2) {                         \
        const NormArgs a = {x, add, nw, out, counter, nblk, n, eps};                                                             \
        norm_multi<Q, NT>(a, Seg{W0, y0, rows0, ty0}, Seg{W1, y1, rows1, ty1}, Seg{W2, y2, rows2, ty2});                         \
    }
NORM_MULTI(decode_mv_norm4, 4, 256)
NORM_MULTI(decode_mv_norm16, 16, 256)
NORM_MULTI(decode_mv_norm4_1k, 4, 1024)

// ---- norm + a Q4_K row walk (launches too large for one wave of norm blocks) ----

// 4B / 8B q/k/v and gate/up: more rows than one wave of 8-row norm blocks holds, where
// repeating the prologue in every block of a second wave lost (see decode_mv.rs), so these
// ran as rmsnorm_q8_f32 — one block, a launch of its own on the chain — then the row walk
// of matvec_q4k_loop_n1. Here the grid is resident (every block runs the prologue once)
// and its warps then walk rows g, g + nw, ... of up to three segments laid end to end, the
// next row loaded while the current row's products run (q4k_row2, mv_dot.h), each lane's
// activation loaded from shared memory once and kept in registers. Each warp's first row
// is loaded before pdl_entry, so its DRAM latency overlaps the wait and the norm.
// Segments 0 and 1 are Q4_K; segment 2 is Q4_K or, as in Q4_K_M files (a Q6_K attn_v in
// half the layers), Q6_K (TY2): its rows go through row_finish, their first step loaded
// during the warp's last Q4_K row (decode_mv_norm_walk_v: one kernel per TY2, so the Q4_K
// walk keeps its registers).
// The K form is the norm kernels' and each row's arithmetic mv_q4_K's (row_finish for
// segment 2's other types, as matvec_multi4_n1's mv_any), so the results equal
// rmsnorm_q8_f32 + the unfused matvecs' bit for bit.
template <int Q, int NT, int TY2>
DEV void norm_walk_run(const NormArgs& a, const Seg& s0, const Seg& s1, const Seg& s2, int nw, NormSh<Q>& sh) {
    typedef Mv<TY2> M2;
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, s = lane >> 2;
    const int nsb = a.n / 256, nu2 = a.n / M2::UNIT, r01 = s0.rows + s1.rows, total = r01 + s2.rows;
    const int qrows = TY2 == 10 ? total : r01;  // the rows walked as Q4_K
    const u64 rb = (u64)nsb * 144;
    auto wrow = [&](int r) -> const u8* { return r < s0.rows ? s0.W + r * rb : r < r01 ? s1.W + (r - s0.rows) * rb : s2.W + (r - r01) * rb; };
    auto vrow = [&](int g) -> const u8* { return s2.W + (u64)(g - r01) * nu2 * M2::BB; };
    int g = bid_x() * (NT / 32) + (tid_x() >> 5);
    q4k_row2 cur, nxt;
    typename M2::W vcur;
    if (g < qrows) q4k_row2_load(wrow(g), nsb, cur);
    float wv[256 * Q / NT];
    norm_wload<Q, NT>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<Q, NT>(a, wv, false, true, sh, &ticket);
    const block_q8_1* xa = sh.kf + s * 8 + 4 * p;
    // The lane's activation of both slots is the same for every row: loaded once, kept in
    // registers (40 of them: 2 blocks per SM instead of 3, and no shared-memory loads per
    // row; the H200 measured +6 % on 4B and +5 % on 8B tg128 from it).
    kact ka, kb;
    k_act_load(s < nsb ? xa : sh.kf, lane & 1, ka);
    k_act_load(8 + s < nsb ? xa + 64 : sh.kf, lane & 1, kb);
    for (; g < qrows; g += nw) {
        const int gn = g + nw;
        if (gn < qrows) q4k_row2_load(wrow(gn), nsb, nxt);
        else if (TY2 != 10 && gn < total) M2::load(vrow(gn), nu2, 0, vcur);
        const float v = q4k_row2_dot_act(cur, ka, kb, nsb);
        float* y = g < s0.rows ? s0.y + g : g < r01 ? s1.y + (g - s0.rows) : s2.y + (g - r01);
        if (lane == 0) *y = v;
        cur = nxt;
    }
    if (TY2 != 10) {
        // This warp's segment-2 rows: the first loaded during its last Q4_K row (when it
        // had one: q and k hold more rows than the grid has warps on 4B / 8B), any later
        // one from cold. (Loading a first segment-2 row before pdl_entry too spilled.)
        for (bool pre = g - nw >= 0 && g - nw < qrows; g < total; g += nw, pre = false) {
            if (!pre) M2::load(vrow(g), nu2, 0, vcur);
            const float v = row_finish<TY2>(vcur, vrow(g), sh.kf, nu2);
            if (lane == 0) s2.y[g - r01] = v;
        }
    }
    norm_tail(a, sh, ticket);
}

// W0, W1: [rows, n] Q4_K; W2: [rows2, n] of type code ty2 (here 10, Q4_K; _v: 12, Q6_K);
// n % 256 == 0, n <= 4096 (two slots of 8 super-blocks); nw: the grid's warps; grid
// (resident blocks) = nblk, block 256.
#define NORM_WALK(NAME, TY2)                                                                                                 \
    KERNEL LAUNCH_BOUNDS_MIN(256, 2) void NAME(const float* x, const float* add, const float* nw_, float* out, u32* counter, \
                                               int nblk, int n, float eps, const u8* W0, float* y0, int rows0, const u8* W1, \
                                               float* y1, int rows1, const u8* W2, float* y2, int rows2, int ty2, int nw) {    \
        __shared__ NormSh<16> sh;                                                                                            \
        const NormArgs a = {x, add, nw_, out, counter, nblk, n, eps};                                                        \
        const Seg s0{W0, y0, rows0, 10}, s1{W1, y1, rows1, 10}, s2{W2, y2, rows2, ty2};                                      \
        norm_walk_run<16, 256, TY2>(a, s0, s1, s2, nw, sh);                                                                  \
    }
NORM_WALK(decode_mv_norm_walk, 10)
// A Q6_K segment 2 (ty2 12). (A Q5_K one too, in the same kernel, spilled at 3 blocks per
// SM; Q5_K_M files' v rows take the unfused path.)
NORM_WALK(decode_mv_norm_walk_v, 12)

// ---- norm + a row walk of the mv_dot_low.h types (launches too large for one wave) ----

// 8B-shaped q/k/v and gate/up of Q3_K_M, Q2_K and IQ4_XS files: the norm_walk_run scheme
// for weights whose segments 0 and 1 are of type TA (Q2_K, Q3_K or IQ4_XS; ty2 == TA puts
// segment 2 in the same walk). A warp's rows g, g + nw, ... of the TA segments are one
// stream of steps (Mv<TA>: 8 super-blocks each, Q2_K 4), every step's loads issued two steps
// ahead, across row ends too (three register sets in turn), the first two before pdl_entry, so DRAM latency overlaps the
// wait and the norm, and a row's first step is never loaded cold. A row's arithmetic is
// row_finish's (its steps in order into an accumulator from 0, then the warp sum): the
// sums equal rmsnorm_q8_f32 + the unfused matvecs' bit for bit. Segment 2 of another
// K-form type (Q3_K_M's v: Q4_K or Q5_K; IQ4_XS's v: Q5_K; Q2_K's: Q3_K) goes through
// row_finish after the stream, its first step loaded cold.
template <int TY>
DEV void walk_rows_after(const Seg& s2, int g, int r01, int total, int nw, int n, const block_q8_1* kf) {
    typedef Mv<TY> M;
    const int nu = n / M::UNIT;
    for (; g < total; g += nw) {
        const u8* wr = s2.W + (u64)(g - r01) * nu * M::BB;
        typename M::W cur;
        M::load(wr, nu, 0, cur);
        const float v = row_finish<TY>(cur, wr, kf, nu);
        if ((tid_x() & 31) == 0) s2.y[g - r01] = v;
    }
}

template <int TA>
DEV void walk_low_run(const NormArgs& a, const Seg& s0, const Seg& s1, const Seg& s2, int nw, NormSh<16>& sh) {
    typedef Mv<TA> M;
    typedef typename M::W W;
    const int lane = tid_x() & 31, nu = a.n / M::UNIT, spr = (nu + M::STEP - 1) / M::STEP;
    const int r01 = s0.rows + s1.rows, total = r01 + s2.rows, arows = s2.ty == TA ? total : r01;
    const u64 rb = (u64)nu * M::BB;
    auto wrow = [&](int r) -> const u8* { return r < s0.rows ? s0.W + r * rb : r < r01 ? s1.W + (r - s0.rows) * rb : s2.W + (r - r01) * rb; };
    const int g0 = bid_x() * 8 + (tid_x() >> 5);
    const int n = g0 < arows ? (arows - g0 + nw - 1) / nw * spr : 0;  // the warp's steps
    // The next step to load: step lu of row lg, whose weights start at lw.
    int lg = g0, lu = 0;
    const u8* lw = wrow(g0 < arows ? g0 : 0);
    auto load_next = [&](W& w) {
        M::load(lw, nu, lu * M::STEP, w);
        if (++lu == spr) {
            lu = 0, lg += nw;
            if (lg < arows) lw = wrow(lg);
        }
    };
    // Three register sets in turn (X, Y, Z: the loop unrolled by three, so no set is
    // copied into another), two steps loaded ahead of the one whose products run.
    W X, Y, Z;
    if (n > 0) load_next(X);
    if (n > 1) load_next(Y);
    float wv[16];
    norm_wload<16, 256>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<16, 256>(a, wv, false, true, sh, &ticket);
    float acc[1] = {0.0f};
    int g = g0, u = 0;
    auto step = [&](const W& cur, W& ahead, int i) {
        if (i + 2 < n) load_next(ahead);
        M::dot(cur, sh.kf, nu, u * M::STEP, acc);
        if (++u == spr) {
            const float v = warp_sum(acc[0]);
            acc[0] = 0.0f;
            float* y = g < s0.rows ? s0.y + g : g < r01 ? s1.y + (g - s0.rows) : s2.y + (g - r01);
            if (lane == 0) *y = v;
            u = 0;
            g += nw;
        }
    };
    for (int i = 0; i < n; i += 3) {
        step(X, Z, i);
        if (i + 1 >= n) break;
        step(Y, X, i + 1);
        if (i + 2 >= n) break;
        step(Z, Y, i + 2);
    }
    if (s2.ty != TA && s2.rows > 0) {
        // The warp's segment-2 rows: the first row index >= r01 of its stride.
        const int g2 = g0 >= r01 ? g0 : g0 + (r01 - g0 + nw - 1) / nw * nw;
        switch (s2.ty) {
        case 10: walk_rows_after<10>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        case 11: walk_rows_after<11>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        case 12: walk_rows_after<12>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        case 13: walk_rows_after<13>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        case 14: walk_rows_after<14>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        case 15: walk_rows_after<15>(s2, g2, r01, total, nw, a.n, sh.kf); break;
        default: break;
        }
    }
    norm_tail(a, sh, ticket);
}

// W0, W1: [rows, n] of type TA; W2: [rows2, n] of type code ty2 (TA, or a K-form type
// 10-15); n % 256 == 0, n <= 4096; nw: the grid's warps; grid (resident blocks) = nblk,
// block 256.
#define NORM_WALK_LOW(NAME, TA)                                                                                              \
    KERNEL LAUNCH_BOUNDS_MIN(256, 2) void NAME(const float* x, const float* add, const float* nw_, float* out, u32* counter, \
                                               int nblk, int n, float eps, const u8* W0, float* y0, int rows0, const u8* W1, \
                                               float* y1, int rows1, const u8* W2, float* y2, int rows2, int ty2, int nw) {    \
        __shared__ NormSh<16> sh;                                                                                            \
        const NormArgs a = {x, add, nw_, out, counter, nblk, n, eps};                                                        \
        const Seg s0{W0, y0, rows0, TA}, s1{W1, y1, rows1, TA}, s2{W2, y2, rows2, ty2};                                      \
        walk_low_run<TA>(a, s0, s1, s2, nw, sh);                                                                             \
    }
NORM_WALK_LOW(decode_mv_norm_walk_q2k, 13)
NORM_WALK_LOW(decode_mv_norm_walk_q3k, 14)
NORM_WALK_LOW(decode_mv_norm_walk_iq4xs, 15)

// ---- norm + gate/up + GLU ----

template <int Q, int TY, int NT>
DEV void norm_glu_run(const NormArgs& a, const u8* Wg, const u8* Wu, float* y, int rows, int act, NormSh<Q>& sh) {
    typedef Mv<TY> M;
    const int row = bid_x() * (NT / 32) + (tid_x() >> 5);
    const bool live = row < rows;
    const int nu = a.n / M::UNIT;
    const u64 off = (u64)(live ? row : 0) * nu * M::BB;
    typename M::W cg, cu;
    if (live) {
        M::load(Wg + off, nu, 0, cg);
        M::load(Wu + off, nu, 0, cu);
    }
    float wv[256 * Q / NT];
    norm_wload<Q, NT>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<Q, NT>(a, wv, TY < 10, TY >= 10, sh, &ticket);
    if (live) {
        const block_q8_1* xs = TY >= 10 ? sh.kf : sh.q8;
        float g, u;
        if (NT < 1024) rows2_finish<TY>(cg, cu, Wg + off, Wu + off, xs, nu, &g, &u);
        else rows2_one<TY>(cg, cu, xs, nu, &g, &u);  // n <= 1024: one step for every type
        // As glu_q8_f32: SiLU, or GELU-tanh rounded through f16 as the CPU backend.
        if ((tid_x() & 31) == 0) y[row] = (act ? gelu_f16r(g) : silu_f(g)) * u;
    }
    norm_tail(a, sh, ticket);
}

template <int Q, int NT>
DEV void norm_glu(const NormArgs& a, const u8* Wg, const u8* Wu, float* y, int rows, int ty, int act) {
    __shared__ NormSh<Q> sh;
    switch (ty) {
    case 0: norm_glu_run<Q, 0, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 1: norm_glu_run<Q, 1, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 2: norm_glu_run<Q, 2, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 3: norm_glu_run<Q, 3, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 4: norm_glu_run<Q, 4, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 10: norm_glu_run<Q, 10, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 11: norm_glu_run<Q, 11, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 12: norm_glu_run<Q, 12, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 5: norm_glu_run<Q, 5, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 13: norm_glu_run<Q, 13, NT>(a, Wg, Wu, y, rows, act, sh); break;
    case 15: norm_glu_run<Q, 15, NT>(a, Wg, Wu, y, rows, act, sh); break;
    default: break;
    }
}

// Wg, Wu: [rows, n] of one type; y: [rows] f32; act: 0 SiLU, 1 GELU-tanh.
// grid (ceil(rows / (NT / 32))) = nblk, block NT.
#define NORM_GLU(NAME, Q, MINB, NT)                                                                                         \
    KERNEL LAUNCH_BOUNDS_MIN(NT, MINB) void NAME(const float* x, const float* add, const float* nw, float* out, u32* counter, int nblk, \
                                        int n, float eps, const u8* Wg, const u8* Wu, float* y, int rows, int ty, int act) {     \
        const NormArgs a = {x, add, nw, out, counter, nblk, n, eps};                                                             \
        norm_glu<Q, NT>(a, Wg, Wu, y, rows, ty, act);                                                                                \
    }
// MINB: the resident blocks per multiprocessor decode_mv.rs's `blocks_per_sm` counts on
// (a register cap: glu4 took 91 registers after the leaner Q4_K bodies, 2 blocks per SM, and
// 0.6B's 384 blocks then ran in two waves, each repeating the prologue).
NORM_GLU(decode_mv_glu4, 4, 3, 256)
NORM_GLU(decode_mv_glu16, 16, 2, 256)
NORM_GLU(decode_mv_glu4_1k, 4, 1, 1024)

// ---- half-warp rows: Q4_K rows of at most 1024 values ----
//
// A Q4_K row of at most 4 super-blocks (1024 values: the 0.6B's q/k/v and gate/up) keeps
// only lanes 0-15 of the one-warp body busy (4 lanes per super-block); the other half
// computes zeros. Here each half of a warp takes a row of its own — q/k/v: rows 2w and
// 2w + 1; gate/up: the gate row in lanes 0-15 and the up row of the same index in lanes
// 16-31 — so a block issues half the dot instructions for the same rows. A half's lanes
// hold exactly what lanes 0-15 of the one-warp body hold, and its sum is the body's
// butterfly without the xor-16 step, which there only added the idle half's zeros: the
// results are the one-warp kernels' bit for bit.

// The lane's super-block of its half's row (wr: the row; ok: the lane has one).
DEV void half_load(const u8* wr, bool ok, u32x4& hd, u32x4& q0, u32x4& q1) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1, sl = (lane >> 2) & 3;
    if (ok) q4k_load_sb(wr + (u64)sl * 144, p, h, hd, q0, q1);
}

// The half's row sum, in every lane of the half (kf: the K form in shared memory).
DEV float half_dot(const u32x4& hd, const u32x4& q0, const u32x4& q1, const block_q8_1* kf, bool ok) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, sl = (lane >> 2) & 3;
    float acc[1] = {0.0f};
    q4k_dot_sb<1>(hd, q0, q1, kf + (ok ? sl * 8 + 4 * p : 0), 0, ok, 1, acc);
    float v = acc[0];
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}

// Norm + q/k/v: NT / 16 rows per block (2 per warp), segments laid end to end as in
// norm_multi; every weight Q4_K with rows of n <= 1024.
template <int Q, int NT>
DEV void norm_half(const NormArgs& a, Seg s0, Seg s1, Seg s2) {
    __shared__ NormSh<Q> sh;
    const int lane = tid_x() & 31, nsb = a.n / 256;
    int r = bid_x() * (NT / 16) + 2 * (tid_x() >> 5) + (lane >> 4);
    Seg s = s0;
    if (r >= s0.rows + s1.rows) {
        r -= s0.rows + s1.rows;
        s = s2;
    } else if (r >= s0.rows) {
        r -= s0.rows;
        s = s1;
    }
    const bool live = r < s.rows;
    const bool ok = live && ((lane >> 2) & 3) < nsb;
    u32x4 hd, q0, q1;
    half_load(s.W + (u64)(live ? r : 0) * nsb * 144, ok, hd, q0, q1);
    float wv[256 * Q / NT];
    norm_wload<Q, NT>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<Q, NT>(a, wv, false, true, sh, &ticket);
    const float v = half_dot(hd, q0, q1, sh.kf, ok);
    if ((lane & 15) == 0 && live) s.y[r] = v;
    norm_tail(a, sh, ticket);
}

// Norm + gate/up + GLU: NT / 32 rows per block (the gate row in lanes 0-15, the up row
// in 16-31); Q4_K rows of n <= 1024.
template <int Q, int NT>
DEV void glu_half(const NormArgs& a, const u8* Wg, const u8* Wu, float* y, int rows, int act) {
    __shared__ NormSh<Q> sh;
    const int lane = tid_x() & 31, nsb = a.n / 256;
    const int row = bid_x() * (NT / 32) + (tid_x() >> 5);
    const bool live = row < rows;
    const bool ok = live && ((lane >> 2) & 3) < nsb;
    u32x4 hd, q0, q1;
    half_load((lane < 16 ? Wg : Wu) + (u64)(live ? row : 0) * nsb * 144, ok, hd, q0, q1);
    float wv[256 * Q / NT];
    norm_wload<Q, NT>(a, wv);
    pdl_entry();
    u32 ticket = 0;
    norm_prologue<Q, NT>(a, wv, false, true, sh, &ticket);
    const float v = half_dot(hd, q0, q1, sh.kf, ok);
    const float u = shfl_xor(v, 16);
    // As glu_q8_f32: SiLU, or GELU-tanh rounded through f16 as the CPU backend.
    if (lane == 0 && live) y[row] = (act ? gelu_f16r(v) : silu_f(v)) * u;
    norm_tail(a, sh, ticket);
}

#define NORM_HALF(NAME, NT)                                                                                                  \
    KERNEL LAUNCH_BOUNDS(NT) void NAME(const float* x, const float* add, const float* nw, float* out, u32* counter, int nblk,  \
                                        int n, float eps, const u8* W0, float* y0, int rows0, int ty0, const u8* W1, float* y1,   \
                                        int rows1, int ty1, const u8* W2, float* y2, int rows2, int ty2) {                         \
        const NormArgs a = {x, add, nw, out, counter, nblk, n, eps};                                                             \
        norm_half<4, NT>(a, Seg{W0, y0, rows0, ty0}, Seg{W1, y1, rows1, ty1}, Seg{W2, y2, rows2, ty2});                          \
    }
#define GLU_HALF(NAME, NT)                                                                                                   \
    KERNEL LAUNCH_BOUNDS(NT) void NAME(const float* x, const float* add, const float* nw, float* out, u32* counter, int nblk,  \
                                        int n, float eps, const u8* Wg, const u8* Wu, float* y, int rows, int ty, int act) {      \
        const NormArgs a = {x, add, nw, out, counter, nblk, n, eps};                                                             \
        glu_half<4, NT>(a, Wg, Wu, y, rows, act);                                                                                \
    }
NORM_HALF(decode_mv_norm4_h1k, 1024)
GLU_HALF(decode_mv_glu4_h1k, 1024)

// ---- quantize + matvec ----

#define QUANT_MAX 16384

// x [k] f32 -> the activation form of type TY in shared memory (quantize.hip's codes),
// by the block's nwarp warps.
template <int TY>
DEV void quant_stage(const float* x, int k, block_q8_1* sa, int nwarp) {
    const int lane = tid_x() & 31, wp = tid_x() >> 5;
    if (TY >= 10) {
        for (int sb = wp; sb < k / 256; sb += nwarp) {
            const f32x4* p = (const f32x4*)(x + sb * 256 + 8 * lane);
            const f32x4 p0 = p[0], p1 = p[1];
            const float v[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
            int c[8];
            const float d = q8k_warp_codes(v, c);
            q8k_warp_store(sa + sb * 8, c, d);
        }
    } else {
        for (int blk = wp; blk < k / 32; blk += nwarp) q8_block_store(sa + blk, x[blk * 32 + lane]);
    }
}

// Warps per row: with wpr > 1 (K-quant rows of at most wpr steps) warp j of a row takes its
// step j alone, so each warp's chain is one step instead of the row's; the per-lane
// partial sums meet in shared memory and are added in step order — the additions the
// one-warp loop makes (mv_dot.h adds each step's product with add_rn, no FMA), so the
// result is bit-identical to wpr = 1. The block is rpb rows × wpr warps (warp w: row
// w % rpb, step w / rpb), and its prologue (the quantization) is shared by all of them.
template <int TY, bool TWO = false>
DEV void quant_run(const float* x, int k, const u8* W, float* y, int rows, int acc, int wpr, int rpb, block_q8_1* sa, float* part) {
    typedef Mv<TY> M;
    const int wp = tid_x() >> 5, lane = tid_x() & 31, ri = wp % rpb, j = wp / rpb;
    const int row = bid_x() * rpb + ri;
    const bool live = row < rows;
    const int nu = k / M::UNIT;
    const int u0 = wpr > 1 ? j * M::STEP : 0;
    const bool mine = live && u0 < nu;
    const u8* wr = W + (u64)(live ? row : 0) * nu * M::BB;
    typename M::W cur, nxt;
    if (mine) M::load(wr, nu, u0, cur);
    // TWO (one warp per row over Q4_K rows of two or more steps: 4B / 8B's o): the second
    // step is loaded before the wait too, so its DRAM latency does not follow the prologue.
    if (TWO && mine) M::load(wr, nu, M::STEP, nxt);
    pdl_entry();
    // The residual this row adds to (written by an earlier kernel: read after the wait),
    // in flight during the prologue.
    const float base = (acc && live && j == 0 && lane == 0) ? y[row] : 0.0f;
    quant_stage<TY>(x, k, sa, rpb * wpr);
    sync();
    float r;
    if (wpr == 1) {
        if (!live) return;
        r = TWO ? row_finish2<TY>(cur, nxt, wr, sa, nu) : row_finish<TY>(cur, wr, sa, nu);
    } else {
        float a[1] = {0.0f};
        if (mine) M::dot(cur, sa, nu, u0, a);
        part[wp * 32 + lane] = a[0];
        sync();
        if (j != 0 || !live) return;
        float s = part[ri * 32 + lane];
        for (int jj = 1; jj < wpr && jj * M::STEP < nu; ++jj) s = add_rn(s, part[(jj * rpb + ri) * 32 + lane]);
        r = warp_sum(s);
    }
    if (lane == 0) y[row] = acc ? base + r : r;
}

// y = W x (acc != 0: y = y + W x, the residual add, y read and written by its row's warp
// only) with x [k] f32 quantized in the prologue (k % 32 == 0, % 256 for the K-quants,
// k <= QUANT_MAX); W: [rows, k] of type code ty; y: [rows] f32.
// grid (ceil(rows / rpb)), block 32 rpb wpr (rpb: rows per block, 8, 16 or 32; wpr 1, 2 or 4,
// above 1 only for the K-quants, rows of at most wpr steps: see quant_run; rpb wpr <= 32).
// Wider blocks (16 rows by default, decode_mv.rs) spread a launch over fewer SMs than
// 8-row ones, which leaves the others empty for the next kernel's one-per-SM blocks (the
// _1k norm kernels, attention) to start on during this one.
KERNEL LAUNCH_BOUNDS(1024) void decode_mv_quant(const float* x, int k, const u8* W, float* y, int rows, int ty, int acc, int wpr, int rpb) {
    __shared__ __attribute__((aligned(16))) block_q8_1 sa[QUANT_MAX / 32];
    __shared__ float part[32 * 32];
    switch (ty) {
    case 0: quant_run<0>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 1: quant_run<1>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 2: quant_run<2>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 3: quant_run<3>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 4: quant_run<4>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 10: quant_run<10>(x, k, W, y, rows, acc, wpr, rpb, sa, part); break;
    case 11: quant_run<11>(x, k, W, y, rows, acc, wpr, rpb, sa, part); break;
    case 12: quant_run<12>(x, k, W, y, rows, acc, wpr, rpb, sa, part); break;
    case 5: quant_run<5>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 13: quant_run<13>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 14: quant_run<14>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    case 15: quant_run<15>(x, k, W, y, rows, acc, 1, rpb, sa, part); break;
    default: break;
    }
}

// decode_mv_quant for Q4_K rows of two or more steps taken one warp per row (4B / 8B's o,
// k = 4096, when the two-warp form does not fit one wave): both first steps are loaded
// before the wait (quant_run's TWO). Its own kernel, so decode_mv_quant's registers and
// code stay as they were. Results equal decode_mv_quant's bit for bit.
KERNEL LAUNCH_BOUNDS(1024) void decode_mv_quant2(const float* x, int k, const u8* W, float* y, int rows, int acc, int rpb) {
    __shared__ __attribute__((aligned(16))) block_q8_1 sa[QUANT_MAX / 32];
    __shared__ float part[32 * 32];
    quant_run<10, true>(x, k, W, y, rows, acc, 1, rpb, sa, part);
}

// ---- a one-token matvec of long K-quant rows: one warp per step, rows walked ----

#define SPLIT_MAX 16

// 4B / 8B down projections (rows of 9728 / 14336: 5-7 Q4_K steps, 10-14 Q6_K ones) ran
// one warp per row, which reads every step's activation from L1 again for every row:
// L1 throughput, not DRAM, bounded them (ncu: L1/TEX 87 % busy, 1.9 TB/s). Here a block
// is one warp per step of a row: warp j loads step j's activation once, keeps it in
// registers, and walks the rows r = block, block + grid, ... of a resident grid, the next
// row's step loaded while the current one's products run. The per-lane partial sums meet
// in shared memory (two buffers, one barrier per row) and warp 0 adds them in step order
// with add_rn — the additions the one-warp loop makes, so the sums are bit-identical to
// matvec's — then the warp sum. xk: [k/32] K form (written by an earlier kernel);
// W: [rows, k]; y: [rows]. grid (resident blocks), block 32 * steps (steps <= SPLIT_MAX).
template <int TY>
DEV void split_run(const block_q8_1* xk, int k, const u8* W, float* y, int rows, int grid, float (*part)[SPLIT_MAX][32]) {
    typedef Mv<TY> M;
    const int lane = tid_x() & 31, j = tid_x() >> 5, steps = (k / M::UNIT + M::STEP - 1) / M::STEP;
    const int nu = k / M::UNIT, u0 = j * M::STEP;
    const u64 rb = (u64)nu * M::BB;
    int r = bid_x();
    typename M::W cur, nxt;
    if (r < rows) M::load(W + r * rb, nu, u0, cur);
    pdl_entry();
    typename M::A act;
    M::act(xk, nu, u0, act);
    for (int it = 0; r < rows; r += grid, ++it) {
        const int rn = r + grid;
        if (rn < rows) M::load(W + rn * rb, nu, u0, nxt);
        float a[1] = {0.0f};
        M::dot_act(cur, act, nu, u0, a);
        part[it & 1][j][lane] = a[0];
        sync();
        if (j == 0) {
            float sum = add_rn(0.0f, part[it & 1][0][lane]);
            for (int jj = 1; jj < steps; ++jj) sum = add_rn(sum, part[it & 1][jj][lane]);
            const float v = warp_sum(sum);
            if (lane == 0) y[r] = v;
        }
        cur = nxt;
    }
}

// ty: 10 Q4_K or 12 Q6_K (k % 256 == 0, at most SPLIT_MAX steps); grid: the blocks.
KERNEL LAUNCH_BOUNDS(512) void decode_mv_split(const block_q8_1* xk, int k, const u8* W, float* y, int rows, int ty, int grid) {
    __shared__ float part[2][SPLIT_MAX][32];
    if (ty == 12) split_run<12>(xk, k, W, y, rows, grid, part);
    else split_run<10>(xk, k, W, y, rows, grid, part);
}
