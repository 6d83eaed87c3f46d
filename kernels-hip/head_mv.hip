// The LM head of one decode token: x += add, out = RMSNorm(x)·w, y = W · out for a Q6_K
// W of many rows (a vocabulary: 151,936 rows), in one launch.
//
// The head is a pure stream of weight bytes (127.6 MB at Qwen3-0.6B's 1024 columns), far
// more rows than one wave of blocks: the one-warp-per-row matvec (matvec_multi4_n1) ran
// 38k blocks, each warp with one row's 840 bytes in flight, and reached about half of
// the DRAM bandwidth (58 us on the H200 against ~30). Here a grid of a few blocks per
// multiprocessor stays resident; each block takes 8-row stages (rows 8 st .. 8 st + 7 of
// stage st = block, block + grid, ...) and keeps `ns` of them in flight in shared memory:
// on sm_90 each stage is one bulk copy (TMA, `cp.async.bulk`) that completes on an
// mbarrier, so the loads cost no registers and no per-lane instructions, and the next
// stages stream while the warps compute the current one from shared memory (one warp
// per row, mv_dot.h's Q6_K lane layout). A ninth warp issues the copies: it refills a
// slot once the 8 computing warps have each arrived on the slot's `empty` mbarrier, so
// no block-wide barrier runs per stage. Elsewhere (AMD) a stage is copied by the whole
// block before use.
// H200 (ncu, one decode token of the 0.6B shape): 40.5 us at 67 % of DRAM peak, against
// 58 + 4.6 us for matvec_multi4_n1 and the separate norm. A per-stage block barrier in
// place of the copy warp measured the same (40.3 us): the remaining gap to a plain
// stream (~32 us) is not the per-stage synchronization.
//
// The norm runs once per block (a few hundred blocks, not one per 4 rows), after the
// first stages' copies are issued, with decode_mv.hip's arithmetic: norm_q8_row's 1024
// virtual-thread reduction order and quantize.hip's K-form codes, so the outputs equal
// the unfused kernels' (add_rmsnorm_q8_f32, then matvec_multi4_n1) bit for bit. Block 0
// writes `out`; the block that takes the last ticket from `counter` (every block takes
// one after reading x) writes x + add back to x and resets the counter. The normalized
// row is staged in the ring's last stage, whose copy is issued after the prologue.
// Rows past the last whole stage (rows % 8) are computed by block 0 from global memory.
#include "common.h"

#include "mv_dot.h"

// Bytes of weight stages per block (6 stages of 8 rows of 1024 Q6_K values: 6 x 6,720).
#define HEAD_RING 40320
#define HEAD_STAGES 8
#define HEAD_NMAX 4096
// Warps 0-7 compute (warp w: row w of each stage), warp 8 issues the copies (sm_90).
#define HEAD_THREADS 288

struct __attribute__((aligned(16))) f32x4h { float x, y, z, w; };

struct __attribute__((aligned(16))) HeadSh {
    u8 ring[HEAD_RING];               // ns stages of 8 rows; the last stages the normalized row first
    block_q8_1 kf[HEAD_NMAX / 32];    // the normalized row's K form
    float red[32];
    unsigned long long full[HEAD_STAGES];   // mbarriers (sm_90): stage copied
    unsigned long long empty[HEAD_STAGES];  // its 8 rows computed
    float res[HEAD_STAGES][8];        // a stage's 8 results, stored to y together
    u32 last;                         // this block holds the last ticket
};

#if defined(LODE_NV) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define HEAD_TMA 1
DEV u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}
DEV void mbar_init(unsigned long long* bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Orders this thread's earlier shared-memory accesses (generic proxy) before later bulk
// copies into the same bytes (async proxy), and makes mbarrier inits visible to them.
DEV void fence_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// One thread: `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src
// to shared dst, completing on bar (which expects them: one arrival plus the bytes).
DEV void bulk_load(void* dst, const void* src, u32 bytes, unsigned long long* bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes),
                 "r"(smem_addr(bar))
                 : "memory");
}
DEV bool mbar_try(unsigned long long* bar, u32 parity) {
    u32 ok;
    asm volatile(
        "{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\tselp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(ok)
        : "r"(smem_addr(bar)), "r"(parity)
        : "memory");
    return ok != 0;
}
// One arrival (of the count given at init).
DEV void mbar_arrive(unsigned long long* bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(bar)) : "memory"); }
// Waits for the phase of parity `parity` to complete; a copy that never lands (a bad
// address) traps instead of hanging the stream.
DEV void mbar_wait(unsigned long long* bar, u32 parity) {
    for (u32 i = 0; !mbar_try(bar, parity); ++i)
        if (i > (1u << 24)) __trap();
}
#endif

#ifndef HEAD_TMA
// All threads: `bytes` from global src to shared dst (16-byte units), no completion wait.
DEV void copy_stage(u8* dst, const u8* src, u32 bytes) {
    for (u32 i = 16 * tid_x(); i < bytes; i += 16 * HEAD_THREADS) *(u32x4*)(dst + i) = *(const u32x4*)(src + i);
}
#endif

// A ticket from the block counter (one thread per block, after the block's reads of x).
DEV u32 head_ticket(u32* c) {
#ifdef LODE_AMD
    __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "agent");
    return __hip_atomic_fetch_add(c, 1u, __ATOMIC_RELAXED, __HIP_MEMORY_SCOPE_AGENT);
#else
    __threadfence();
    return atomicAdd(c, 1u);
#endif
}

struct HeadArgs {
    const float* x;
    const float* add;
    const float* nw;
    float* out;
    u32* counter;
    int nblk, n;
    float eps;
    const u8* W;
    float* y;
    int rows, ns;
};

// The norm prologue (decode_mv.hip's norm_prologue, K form only): thread t holds
// elements t + 256 q, plays virtual threads t + 256 m of norm_q8_row's 1024. o: n floats
// of shared staging. Leaves the K form in kf; ends with a barrier.
template <int Q>
DEV void head_norm(const HeadArgs& a, const float* wv, float* o, HeadSh& sh) {
    const int t = tid_x(), lane = t & 31, wp = t >> 5;
    const int n = t < 256 ? a.n : 0;  // warp 8 (the copy warp) joins the barriers only
    float v[Q];
    float ss[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const int i = t + 256 * q;
        v[q] = 0.0f;
        if (i < n) {
            float x = a.x[i];
            if (a.add) x += a.add[i];
            v[q] = x;
            ss[q & 3] += x * x;
        }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
        const float s = warp_sum(ss[m]);
        if (lane == 0 && wp < 8) sh.red[wp + 8 * m] = s;
    }
    sync();
    if (t == 0) sh.last = a.add ? (head_ticket(a.counter) == (u32)(a.nblk - 1)) : 0u;
    const float tot = warp_sum(sh.red[lane]);
    const float scale = 1.0f / sqrt_f(tot / (float)a.n + a.eps);
    const bool write_out = bid_x() == 0;
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const int i = t + 256 * q;
        if (i < n) {  // warp-uniform: n % 256 == 0
            float r = v[q] * scale;
            r *= wv[q];
            if (write_out) a.out[i] = r;
            o[i] = r;
        }
    }
    sync();  // the normalized row is staged; sh.last is set
    if (sh.last) {
        // Every block has read x (each took its ticket after its reads): write x + add.
        float* x = (float*)a.x;
#pragma unroll
        for (int q = 0; q < Q; ++q)
            if (t + 256 * q < n) x[t + 256 * q] = v[q];
        if (t == 0) *a.counter = 0u;
    }
    for (int sb = wp; sb < n / 256; sb += 8) {
        const f32x4h* p = (const f32x4h*)(o + sb * 256 + 8 * lane);
        const f32x4h p0 = p[0], p1 = p[1];
        const float vv[8] = {p0.x, p0.y, p0.z, p0.w, p1.x, p1.y, p1.z, p1.w};
        int c[8];
        const float d = q8k_warp_codes(vv, c);
        q8k_warp_store(sh.kf + sb * 8, c, d);
    }
    sync();  // the K form is staged; the staging row is free
}

// One lane's K-form activation for its super-block (blocks xa .. xa + 3 = 8 sb + 4 hh ..):
// q6k_dot_sb's loads, codes 8 lq .. 8 lq + 7 of each block, and the super-block's scale
// (from lane (lane & ~7); every lane must call it).
struct q6k_act { int c[4][2]; float dx; };
DEV void q6k_act_load(const block_q8_1* xa, q6k_act& a) {
    const int lane = tid_x() & 31, lq = lane & 3;
    const u8* p = (const u8*)xa + 8 * lq;
    const u32x2 g0a = *(const u32x2*)p;
    const u32 g0b = *(const u32*)(p + 8);
    const u32x2 g1a = *(const u32x2*)(p + 32);
    const u32x2 g1b = *(const u32x2*)(p + 40);
    const u32x2 g2a = *(const u32x2*)(p + 72);
    const u32 g2b = *(const u32*)(p + 80);
    const u32x2 g3 = *(const u32x2*)(p + 112);
    a.c[0][0] = (int)g0a.y, a.c[0][1] = (int)g0b;
    a.c[1][0] = (int)g1b.x, a.c[1][1] = (int)g1b.y;
    a.c[2][0] = (int)g2a.y, a.c[2][1] = (int)g2b;
    a.c[3][0] = (int)g3.x, a.c[3][1] = (int)g3.y;
    a.dx = __builtin_bit_cast(float, shfl_idx_u(perm_bytes(g0a.x, g1a.y, 0x5410), lane & ~7));
}

// One lane's products for one super-block from its raw words (q6k_load_sb's; sh: 16 when
// the super-block starts 2 mod 4): q6k_dot_sb's arithmetic, added to acc in its order.
DEV void q6k_dot_raw(const u32* A, const u32* B, const u32* H, const u32* S, u32 dbits, u32 sh, const q6k_act& x, float& acc) {
    const int lq = tid_x() & 3;
    u32 v[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 a = shr_pair(A[i], A[i + 1], sh), bq = shr_pair(B[i], B[i + 1], sh), h = shr_pair(H[i], H[i + 1], sh);
        v[0][i] = q6k_code4(a << 2, h << 6);
        v[1][i] = q6k_code4(bq << 2, h << 4);
        v[2][i] = q6k_code4(a >> 2, h << 2);
        v[3][i] = q6k_code4(bq >> 2, h);
    }
    const u32 t01 = shr_pair(S[0], S[1], sh + 8 * (lq >> 1)), t23 = shr_pair(S[1], S[2], sh + 8 * (lq >> 1));
    const int sc[4] = {(int)perm_bytes(t01, 0, 0x8880), (int)perm_bytes(t01, 0, 0xAAA2), (int)perm_bytes(t23, 0, 0x8880),
                       (int)perm_bytes(t23, 0, 0xAAA2)};
    const float d4 = 0.25f * h2f((u16)dbits);
    int isum = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) isum += sc[g] * dot4((int)v[g][1], x.c[g][1], dot4((int)v[g][0], x.c[g][0], 0));
    acc = add_rn(acc, x.dx * d4 * (float)isum);  // as mv_dot.h (no FMA), bit for bit
}

// The super-block at b (global or shared, any 2-byte-aligned address).
DEV void q6k_dot_at(const u8* b, const q6k_act& x, float& acc) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3;
    u32 A[3], B[3], H[3], S[3], dbits;
    q6k_load_sb(b, hh, lq, A, B, H, S, &dbits);
    q6k_dot_raw(A, B, H, S, dbits, 16 * (u32)(((u64)b >> 1) & 1), x, acc);
}

// A lane's fixed word offsets into a stage (16-byte aligned) for its row's super-block
// `sb0 + lane / 8` (q6k_load_sb's pointers, as offsets: the stage base varies, these do
// not, so each load is base + offset + constant).
struct q6k_off { int a, h, s, s2, d, odd; };
DEV q6k_off q6k_stage_off(int row_byte, int sb) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3;
    const int at = row_byte + sb * 210, odd = (at >> 1) & 1, w = (at - 2 * odd) >> 2;
    return q6k_off{w + 16 * hh + 2 * lq, w + 32 + 8 * hh + 2 * lq, w + 48 + 2 * hh, w + 49 + 2 * hh + odd, at + 208, odd};
}
DEV void q6k_dot_stage(const u8* stage, const q6k_off& o, const q6k_act& x, float& acc) {
    const u32* w = (const u32*)stage;
    u32 A[3], B[3], H[3], S[3];
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        A[i] = w[o.a + i];
        B[i] = w[o.a + 8 + i];
        H[i] = w[o.h + i];
    }
    S[0] = w[o.s];
    S[1] = w[o.s + 1];
    S[2] = w[o.s2];  // an even start's third word would pass the super-block's end
    const u32 dbits = *(const u16*)(stage + o.d);
    q6k_dot_raw(A, B, H, S, dbits, 16 * (u32)o.odd, x, acc);
}

// One row (nsb super-blocks at wr, global) by one warp: the sum in every lane.
// ONE: nsb <= 4, the activation `a1` preloaded; else loaded from kf per 4 super-blocks.
template <bool ONE>
DEV float head_row_global(const u8* wr, int nsb, const block_q8_1* kf, const q6k_act& a1) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, s = lane >> 3;
    float acc = 0.0f;
    if (ONE) {
        if (s < nsb) q6k_dot_at(wr + s * 210, a1, acc);
    } else {
        for (int sb0 = 0; sb0 < nsb; sb0 += 4) {
            const int sb = sb0 + s;
            const bool ok = sb < nsb;
            q6k_act a;
            q6k_act_load(kf + (ok ? sb * 8 + 4 * hh : 0), a);
            if (ok) q6k_dot_at(wr + sb * 210, a, acc);
        }
    }
    return warp_sum(acc);
}


// Row `wp` of a stage in shared memory by warp wp: the sum in every lane. ONE: the
// lane's offsets o1 and activation a1 are the loop's invariants.
template <bool ONE>
DEV float head_stage_row(const u8* stage, int row_byte, int nsb, const block_q8_1* kf, const q6k_act& a1, const q6k_off& o1) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, s = lane >> 3;
    float acc = 0.0f;
    if (ONE) {
        if (s < nsb) q6k_dot_stage(stage, o1, a1, acc);
    } else {
        for (int sb0 = 0; sb0 < nsb; sb0 += 4) {
            const int sb = sb0 + s;
            const bool ok = sb < nsb;
            q6k_act x;
            q6k_act_load(kf + (ok ? sb * 8 + 4 * hh : 0), x);
            if (ok) q6k_dot_stage(stage, q6k_stage_off(row_byte, sb), x, acc);
        }
    }
    return warp_sum(acc);
}

template <int Q, bool ONE>
DEV void head_run(const HeadArgs& a) {
    __shared__ HeadSh sh;
    const int t = tid_x(), wp = t >> 5, lane = t & 31, b = bid_x(), G = a.nblk, ns = a.ns;
    const int nsb = a.n / 256;
    const u32 rbytes = (u32)nsb * 210, sbytes = 8 * rbytes;
    const int nfull = a.rows / 8;
    // This block's stages: i = 0 .. nst - 1 is stage b + i G (rows 8 (b + i G) ..), in slot i % ns.
    const int nst = b < nfull ? (nfull - 1 - b) / G + 1 : 0;
#ifdef HEAD_TMA
    // The first ns - 1 stages stream in during the norm (weights only: before pdl_entry).
    if (t == 256) {
        for (int s = 0; s < ns; ++s) {
            mbar_init(&sh.full[s], 1);
            mbar_init(&sh.empty[s], 8);
        }
        fence_async();
        for (int i = 0; i < ns - 1 && i < nst; ++i) bulk_load(sh.ring + i * sbytes, a.W + (u64)(b + i * G) * sbytes, sbytes, &sh.full[i]);
    }
#endif
    float wv[Q];
#pragma unroll
    for (int q = 0; q < Q; ++q) {
        const int i = t + 256 * q;
        wv[q] = (a.nw && t < 256 && i < a.n) ? a.nw[i] : 1.0f;
    }
    pdl_entry();
    head_norm<Q>(a, wv, (float*)(sh.ring + (ns - 1) * sbytes), sh);
    const int hh = (lane >> 2) & 1, s = lane >> 3;
    q6k_act a1;
    if (ONE) q6k_act_load(sh.kf + (s < nsb ? s * 8 + 4 * hh : 0), a1);
    q6k_off o1 = q6k_stage_off(wp * rbytes, s);
#ifdef LODE_NV
    // Opaque to the optimizer, so the loop uses them instead of recomputing them per stage.
    asm("" : "+r"(o1.a), "+r"(o1.h), "+r"(o1.s), "+r"(o1.s2), "+r"(o1.d), "+r"(o1.odd));
#endif
#ifdef HEAD_TMA
    if (wp == 8) {
        // The copy warp: stage i into slot i % ns once the 8 rows of stage i - ns are done,
        // and those 8 results stored to y as one 32-byte write (lanes 0-7): y may be
        // page-locked host memory (the logits, readback.rs), where a write of each row
        // alone crossed the link as its own 4-byte transaction (0.6B decode 1,680 vs
        // 1,980 t/s). Stage j is the (j / ns)-th use of its slot: parity (j / ns) & 1.
        auto store = [&](int j) {
            mbar_wait(&sh.empty[j % ns], (u32)(j / ns) & 1u);
            if (lane < 8) a.y[(b + j * G) * 8 + lane] = sh.res[j % ns][lane];
            __syncwarp();  // every lane has read the slot's results before its refill is issued
        };
        for (int i = ns - 1; i < nst; ++i) {
            if (i >= ns) store(i - ns);
            if (lane == 0) {
                fence_async();  // the slot's earlier reads (and the norm's staging) before the copy
                bulk_load(sh.ring + (i % ns) * sbytes, a.W + (u64)(b + i * G) * sbytes, sbytes, &sh.full[i % ns]);
            }
        }
        // The last ns stages (or fewer) were never waited on for a refill.
        for (int j = nst - ns > 0 ? nst - ns : 0; j < nst; ++j) store(j);
        return;
    }
    int slot = 0;
    u32 parity = 0;
    for (int i = 0; i < nst; ++i) {
        mbar_wait(&sh.full[slot], parity);
        const float r = head_stage_row<ONE>(sh.ring + slot * sbytes, wp * rbytes, nsb, sh.kf, a1, o1);
        if (lane == 0) {
            sh.res[slot][wp] = r;          // stored by the copy warp (released by the arrive)
            mbar_arrive(&sh.empty[slot]);  // the warp's reads of the slot are done (warp_sum used them all)
        }
        if (++slot == ns) {
            slot = 0;
            parity ^= 1u;
        }
    }
#else
    // Every warp copies each stage; warps 0-7 compute it. The stage's 8 results go out as
    // one 32-byte write (threads 0-7), as the copy warp's above: y may be mapped host memory.
    for (int i = 0; i < nst; ++i) {
        copy_stage(sh.ring, a.W + (u64)(b + i * G) * sbytes, sbytes);
        sync();
        if (wp < 8) {
            const float r = head_stage_row<ONE>(sh.ring, wp * rbytes, nsb, sh.kf, a1, o1);
            if (lane == 0) sh.res[0][wp] = r;
        }
        sync();
        if (t < 8) a.y[(b + i * G) * 8 + t] = sh.res[0][t];
    }
#endif
    // The rows after the last whole stage, from global memory.
    const int row = nfull * 8 + wp;
    if (b == 0 && wp < 8 && row < a.rows) {
        const float r = head_row_global<ONE>(a.W + (u64)row * rbytes, nsb, sh.kf, a1);
        if (lane == 0) a.y[row] = r;
    }
}

// x, add, out: [n] f32 (add may be null: no residual add and no write-back); nw: [n] f32
// or null; counter: a zeroed u32 (left zeroed); W: [rows, n] Q6_K, 16-byte aligned;
// y: [rows] f32. n % 256 == 0, n <= 256 Q (n4: n <= 1024, one warp step per row);
// ns: stages in the ring, 2 <= ns <= HEAD_STAGES, ns * 8 * (n / 256) * 210 <= HEAD_RING;
// rows >= 8. grid (nblk), block HEAD_THREADS (288).
#define HEAD_KERNEL(NAME, Q, ONE, MINB)                                                                                    \
    KERNEL LAUNCH_BOUNDS_MIN(HEAD_THREADS, MINB) void NAME(const float* x, const float* add, const float* nw, float* out, u32* counter, \
                                               int nblk, int n, float eps, const u8* W, float* y, int rows, int ns) {      \
        const HeadArgs a = {x, add, nw, out, counter, nblk, n, eps, W, y, rows, ns};                                      \
        head_run<Q, ONE>(a);                                                                                               \
    }
// MINB: resident blocks per multiprocessor (a register cap without spills; shared memory
// holds 5 blocks).
HEAD_KERNEL(head_q6k_n4, 4, true, 5)
HEAD_KERNEL(head_q6k_n16, 16, false, 3)
