// Prefill attention on matrix cores, FlashAttention-2 style (issue 6): a tile of 64 queries
// of one head walks the keys it can see, S = Q K^T and O += P V on 16x16x16 f16 products
// (mma.h), softmax online in f32 (running max and sum per query row). Causal, GQA,
// sliding window, f16 KV cache; the same arguments and semantics as attention.hip's
// attn_f16, for many queries at once.
//
// q:   [n_tok, n_head, head_dim] f32 (query t at position pos[t], read on the device)
// kc:  [n_ctx, n_kv_head * head_dim] f16 (row p = key at position p), vc likewise
// out: [n_tok, n_head, head_dim] f32
// Query at position P attends keys p in [max(0, P - window + 1) if window > 0 else 0, P];
// slots 0..max(pos) must hold keys (they do: the chunk's keys are stored first).
// Template HD (64, 128, 256) is the padded head size: any head_dim % 8 == 0 up to HD runs,
// the padding is zero-filled. grid (ceil(n_tok / 64), n_head), block 128 threads.
// (A first kernel of 32 keys per step with S and P through shared memory lost to this one
// at every head size on the H200: deleted, its numbers in benchmarks/.)
#include "common.h"
#include "mma.h"

// -inf from its bits: NVRTC has no __builtin_huge_valf and no <cmath> INFINITY.
#define FA_NEG_INF (__builtin_bit_cast(float, 0xff800000u))

struct __attribute__((aligned(16))) fa_u4 { u32 x, y, z, w; };
struct __attribute__((aligned(16))) fa_f4 { float x, y, z, w; };

// ---------------------------------------------------------------------------------------
// flash_attn2: 64 queries per block.
// 64 queries (4 warps x 16 rows) of one head per block, KT keys per step. Each warp keeps
// its Q fragments, the S tile and the online softmax state in registers (row max / sum by
// shuffles over the lanes that share a row, mma.h's row slots, so the one source fits both
// fragment layouts); P becomes the A operand of PV in registers on NVIDIA (frag_a_from_c)
// and through a per-warp shared tile on gfx11 (its accumulator and A layouts differ). K and V have a shared tile each and are software-pipelined through
// registers: V of this step is fetched from global memory while S and the softmax run,
// K of the next step while PV runs, so there are two block barriers per KT keys.
// HD 64 and 128 step 64 keys; HD 256 steps 32 (K and V tiles of 32 x 264 f16, 16.5 KiB
// each, so both fit 48 KiB of static shared memory; the 64 x 264 Q tile is staged through
// the two of them, which are one array for that reason).
#define FA2_BQ 64 // queries per block
#define FA2_NT 128 // threads per block (4 warps)

// One thread's share of a [KT][HD] f16 tile: NC 16-byte chunks, the first NR of which go
// through registers ahead of their use. At HD 256 only half do (NR = NC / 2, 16 registers):
// with Q (64 registers), O (128) and S (16) live, a whole tile (32) spilled on sm_90; the
// other half is copied global -> shared when the tile is stored.
template <int HD, int KT>
struct Fa2Regs {
    static constexpr int CH = HD / 8, NC = KT * CH / FA2_NT, NR = HD > 128 ? NC / 2 : NC;
    fa_u4 v[NR];
};

// Chunk c of this thread's share of rows [key0, key0 + KT) (zeros past `last` or past
// head_dim: slots past the last position may hold anything, NaN included, and are never
// read). Thread t reads chunk t % CH of rows t / CH + c * RS.
template <int HD, int KT>
DEV fa_u4 fa2_chunk(const u16* cache, int key0, int last, u64 stride, int off, int hd, int c) {
    constexpr int CH = Fa2Regs<HD, KT>::CH, RS = FA2_NT / CH;
    const int row = tid_x() / CH + c * RS, d = (tid_x() % CH) * 8;
    fa_u4 v;
    v.x = v.y = v.z = v.w = 0;
    if (key0 + row <= last && d < hd) v = *(const fa_u4*)(cache + (u64)(key0 + row) * stride + off + d);
    return v;
}

// The register part (chunks 0..NR-1) of rows [key0, key0 + KT) of a cache, as fa2_chunk
// reads them: one pointer, one step.
template <int HD, int KT>
DEV void fa2_fetch(Fa2Regs<HD, KT>& r, const u16* cache, int key0, int last, u64 stride, int off, int hd) {
    constexpr int CH = Fa2Regs<HD, KT>::CH, RS = FA2_NT / CH;
    const int row0 = tid_x() / CH, d = (tid_x() % CH) * 8;
    const u16* p = cache + (u64)(key0 + row0) * stride + off + d;
    const u64 step = (u64)RS * stride;
#pragma unroll
    for (int c = 0; c < Fa2Regs<HD, KT>::NR; ++c) {
        fa_u4 v;
        v.x = v.y = v.z = v.w = 0;
        if (key0 + row0 + c * RS <= last && d < hd) v = *(const fa_u4*)p;
        r.v[c] = v;
        p += step;
    }
}

// The tile into s [KT][HD + 8]: the fetched registers, then the rest straight from the
// cache (the same arguments as the fetch).
template <int HD, int KT>
DEV void fa2_store(const Fa2Regs<HD, KT>& r, u16* s, const u16* cache, int key0, int last, u64 stride, int off, int hd) {
    constexpr int CH = Fa2Regs<HD, KT>::CH, RS = FA2_NT / CH, LD = HD + 8;
    u16* p = s + (tid_x() / CH) * LD + (tid_x() % CH) * 8;
#pragma unroll
    for (int c = 0; c < Fa2Regs<HD, KT>::NR; ++c) *(fa_u4*)(p + c * RS * LD) = r.v[c];
#pragma unroll
    for (int c = Fa2Regs<HD, KT>::NR; c < Fa2Regs<HD, KT>::NC; ++c)
        *(fa_u4*)(p + c * RS * LD) = fa2_chunk<HD, KT>(cache, key0, last, stride, off, hd, c);
}

template <int HD, int KT>
DEV void flash2_body(const float* q, const u16* kc, const u16* vc, float* out, int n_tok, int n_head, int n_kv_head, int hd,
                     const int* pos, int window, float scale) {
    // LDP: P's row stride where it is staged in shared memory (!MMA_C_IS_A: 16 x 64 per warp).
    constexpr int LD = HD + 8, ND = HD / 16, NS = KT / 16, LDP = KT + 8;
    // sK = [KT keys][HD], sV = [KT keys][HD]; first, sKV holds the [64 queries][HD] Q tile.
    // With fewer than 64 keys per step (HD 256) the two tiles are one array for that
    // (JOINT; sV0 then is a 1-element stand-in); at 64 they stay apart, as first measured.
    constexpr bool JOINT = KT < FA2_BQ;
    static_assert(2 * KT >= FA2_BQ && KT % 16 == 0, "the Q tile is staged in sK and sV");
    __shared__ __attribute__((aligned(16))) u16 sKV[(JOINT ? 2 : 1) * KT * LD];
    __shared__ __attribute__((aligned(16))) u16 sV0[JOINT ? 8 : KT * LD];
    u16* const sK = sKV;
    u16* const sV = JOINT ? sKV + KT * LD : sV0;
#if !MMA_C_IS_A
    __shared__ __attribute__((aligned(16))) u16 sP[4 * 16 * LDP]; // per warp: P, [16][KT]
#endif
    __shared__ int sPos[FA2_BQ], sLo[FA2_BQ], sRange[2];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    // The last query tiles (the most keys, causally) are launched first, so the short ones
    // fill the tail of the grid.
    const int q0 = ((n_tok + FA2_BQ - 1) / FA2_BQ - 1 - (int)bid_x()) * FA2_BQ, head = bid_y();
    const int kvh = head / (n_head / n_kv_head);
    const u64 stride = (u64)n_kv_head * hd;
    const int off = kvh * hd;
#if !MMA_C_IS_A
    u16* scratch = sP + warp * 16 * LDP;
#else
    u16* scratch = nullptr;
#endif

    // Queries scaled by scale * log2(e) (the softmax then runs on exp2), f16, staged in sKV.
    const float qs = scale * 1.4426950408889634f;
    for (int e = t; e < FA2_BQ * (HD / 4); e += FA2_NT) {
        const int r = e / (HD / 4), d = (e % (HD / 4)) * 4, tok = q0 + r;
        fa_f4 v;
        v.x = v.y = v.z = v.w = 0.0f;
        if (tok < n_tok && d < hd) v = *(const fa_f4*)(q + ((u64)tok * n_head + head) * hd + d);
        u16* p = sKV + r * LD + d;
        p[0] = f2h(v.x * qs), p[1] = f2h(v.y * qs), p[2] = f2h(v.z * qs), p[3] = f2h(v.w * qs);
    }
    for (int r = t; r < FA2_BQ; r += FA2_NT) {
        const int tok = q0 + r;
        const int P = tok < n_tok ? pos[tok] : -1;
        sPos[r] = P;
        sLo[r] = (window > 0 && P >= 0) ? (P - window + 1 > 0 ? P - window + 1 : 0) : 0;
    }
    sync();
    if (t == 0) {
        int lo = 0x7fffffff, hi = -1;
        for (int r = 0; r < FA2_BQ; ++r)
            if (sPos[r] >= 0) {
                lo = sLo[r] < lo ? sLo[r] : lo;
                hi = sPos[r] > hi ? sPos[r] : hi;
            }
        sRange[0] = lo;
        sRange[1] = hi;
    }
    FragA qf[ND];
#pragma unroll
    for (int kk = 0; kk < ND; ++kk) frag_a(qf[kk], sKV + (warp * 16) * LD + kk * 16, LD);
    // This lane's rows (one per row slot): position and first visible key; the warp's
    // key range, to skip steps none of its rows sees.
    int rP[FRAG_ROWS], rLo[FRAG_ROWS];
#pragma unroll
    for (int s = 0; s < FRAG_ROWS; ++s) {
        const int m = warp * 16 + frag_slot_row(s, lane);
        rP[s] = sPos[m];
        rLo[s] = sLo[m];
    }
    // wPmin / wLoMax: below the first and from the last, no key of a step is masked for
    // any row (a row past n_tok has P = -1 and so masks every step).
    int wHi = -1, wLo = 0x7fffffff, wPmin = 0x7fffffff, wLoMax = 0;
    for (int r = 0; r < 16; ++r) {
        const int P = sPos[warp * 16 + r], lo = sLo[warp * 16 + r];
        wPmin = P < wPmin ? P : wPmin;
        wLoMax = lo > wLoMax ? lo : wLoMax;
        if (P >= 0) {
            wHi = P > wHi ? P : wHi;
            wLo = lo < wLo ? lo : wLo;
        }
    }
    sync(); // sRange written; every warp has its Q fragments out of sKV
    const int kmin = sRange[0], kmax = sRange[1];

    FragC o[ND];
#pragma unroll
    for (int j = 0; j < ND; ++j) frag_zero(o[j]);
    float m_run[FRAG_ROWS], l_part[FRAG_ROWS]; // running max (log2 units); this lane's share of the sum
#pragma unroll
    for (int s = 0; s < FRAG_ROWS; ++s) m_run[s] = FA_NEG_INF, l_part[s] = 0.0f;

    Fa2Regs<HD, KT> kr, vr;
    const int kfirst = kmax >= 0 ? (kmin / KT) * KT : 0;
    if (kmax >= 0) {
        fa2_fetch<HD, KT>(kr, kc, kfirst, kmax, stride, off, hd);
        fa2_store<HD, KT>(kr, sK, kc, kfirst, kmax, stride, off, hd);
    }
    for (int k0 = kfirst; k0 <= kmax; k0 += KT) {
        fa2_fetch<HD, KT>(vr, vc, k0, kmax, stride, off, hd);
        sync(); // sK holds K[k0..]; the last step's PV is done with sV
        const bool active = k0 <= wHi && k0 + KT - 1 >= wLo;
        FragA pa[NS];
        if (active) {
            // S = Q K^T (log2 units): 16 rows x KT keys in NS fragments.
            FragC s[NS];
#pragma unroll
            for (int j = 0; j < NS; ++j) frag_zero(s[j]);
#pragma unroll
            for (int kk = 0; kk < ND; ++kk)
#pragma unroll
                for (int j = 0; j < NS; ++j) {
                    FragB b;
                    frag_b(b, sK + (j * 16) * LD + kk * 16, LD);
                    mma(s[j], qf[kk], b);
                }
            // Mask (causal, window, rows past n_tok) and the row max of this step.
            if (k0 + KT - 1 > wPmin || k0 < wLoMax) {
#pragma unroll
                for (int j = 0; j < NS; ++j)
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        int m, n;
                        frag_coord(i, lane, &m, &n);
                        const int r = frag_slot(i), key = k0 + j * 16 + n;
                        const bool ok = key <= rP[r] && key >= rLo[r];
                        s[j].v[i] = ok ? s[j].v[i] : FA_NEG_INF;
                    }
            }
            float mx[FRAG_ROWS];
#pragma unroll
            for (int r = 0; r < FRAG_ROWS; ++r) mx[r] = FA_NEG_INF;
#pragma unroll
            for (int j = 0; j < NS; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i) mx[frag_slot(i)] = fmax_f(mx[frag_slot(i)], s[j].v[i]);
            float corr[FRAG_ROWS], mref[FRAG_ROWS];
#pragma unroll
            for (int r = 0; r < FRAG_ROWS; ++r) {
                const float m_new = fmax_f(m_run[r], frag_row_max(mx[r]));
                // A row that has seen no key yet keeps max -inf: exponents then use 0 so
                // that every p (and the correction of an empty state) is exp2(-inf) = 0.
                mref[r] = m_new == FA_NEG_INF ? 0.0f : m_new;
                corr[r] = exp2_fast(m_run[r] - mref[r]);
                m_run[r] = m_new;
                l_part[r] *= corr[r];
            }
#pragma unroll
            for (int j = 0; j < NS; ++j) {
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const int r = frag_slot(i);
                    const float p = exp2_fast(s[j].v[i] - mref[r]);
                    s[j].v[i] = p;
                    l_part[r] += p;
                }
                // P as the A operand of PV: in registers where the layouts agree, else staged
                // in the warp's shared tile (read after the block barrier below).
                if (MMA_C_IS_A) frag_a_from_c(pa[j], s[j], scratch, LDP);
                else frag_c_store(s[j], scratch + j * 16, LDP);
            }
#pragma unroll
            for (int j = 0; j < ND; ++j)
#pragma unroll
                for (int i = 0; i < 8; ++i) o[j].v[i] *= corr[frag_slot(i)];
        }
        fa2_store<HD, KT>(vr, sV, vc, k0, kmax, stride, off, hd);
        const bool more = k0 + KT <= kmax;
        if (more) fa2_fetch<HD, KT>(kr, kc, k0 + KT, kmax, stride, off, hd);
        sync(); // sV holds V[k0..]; every warp is done with sK
        if (active) {
            // O += P V.
#pragma unroll
            for (int kk = 0; kk < NS; ++kk) {
                if (!MMA_C_IS_A) frag_a(pa[kk], scratch + kk * 16, LDP);
#pragma unroll
                for (int j = 0; j < ND; ++j) {
                    FragB b;
                    frag_b_t(b, sV + (kk * 16) * LD + j * 16, LD);
                    mma(o[j], pa[kk], b);
                }
            }
        }
        if (more) fa2_store<HD, KT>(kr, sK, kc, k0 + KT, kmax, stride, off, hd);
    }
    float linv[FRAG_ROWS];
#pragma unroll
    for (int r = 0; r < FRAG_ROWS; ++r) {
        const float l = frag_row_sum(l_part[r]);
        linv[r] = l > 0.0f ? 1.0f / l : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < ND; ++j)
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            int m, n;
            frag_coord(i, lane, &m, &n);
            m += warp * 16;
            n += j * 16;
            const int tok = q0 + m;
            if (tok < n_tok && n < hd) out[((u64)tok * n_head + head) * hd + n] = o[j].v[i] * linv[frag_slot(i)];
        }
}

#define FLASH2_KERNEL(HD, KT)                                                                                          \
    KERNEL LAUNCH_BOUNDS(FA2_NT) void flash_attn2_f16_d##HD(const float* q, const u16* kc, const u16* vc, float* out, \
                                                           int n_tok, int n_head, int n_kv_head, int hd,              \
                                                           const int* pos, int window, float scale) {                 \
        flash2_body<HD, KT>(q, kc, vc, out, n_tok, n_head, n_kv_head, hd, pos, window, scale);                       \
    }

FLASH2_KERNEL(64, 64)
FLASH2_KERNEL(128, 64)
FLASH2_KERNEL(256, 32)
