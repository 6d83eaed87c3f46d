// Prefill attention on matrix cores, flash style (issue 6): a tile of BQ queries of one head
// walks the keys it can see 32 at a time, S = Q K^T and O += P V on 16x16x16 f16 products
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
// the padding is zero-filled. grid (ceil(n_tok / BQ), n_head), block 2 * BQ threads
// (BQ / 16 warps; warp w owns query rows 16w..16w+15).
#include "common.h"
#include "mma.h"

#define FA_KT 32 // keys per step
// -inf from its bits: NVRTC has no __builtin_huge_valf and no <cmath> INFINITY.
#define FA_NEG_INF (__builtin_bit_cast(float, 0xff800000u))
#define FA_LDS (FA_KT + 1)
#define FA_LDP (FA_KT + 8)

struct __attribute__((aligned(16))) fa_u4 { u32 x, y, z, w; };
struct __attribute__((aligned(16))) fa_f4 { float x, y, z, w; };

// Rows [key0, key0 + 32) of a cache (zeros past `last` or past head_dim) into s[32][HD + 8].
template <int HD>
DEV void fa_load_kv(u16* s, const u16* cache, int key0, int last, u64 stride, int off, int hd, int nthr) {
    constexpr int LD = HD + 8, CH = HD / 8; // 8 f16 per chunk
    for (int e = tid_x(); e < FA_KT * CH; e += nthr) {
        const int r = e / CH, d = (e % CH) * 8, key = key0 + r;
        fa_u4 v;
        v.x = v.y = v.z = v.w = 0;
        if (key <= last && d < hd) v = *(const fa_u4*)(cache + (u64)key * stride + off + d);
        *(fa_u4*)(s + r * LD + d) = v;
    }
}

template <int HD, int BQ>
DEV void flash_body(const float* q, const u16* kc, const u16* vc, float* out, int n_tok, int n_head, int n_kv_head, int hd,
                    const int* pos, int window, float scale) {
    constexpr int LD = HD + 8, NW = BQ / 16, NT = 32 * NW, ND = HD / 16;
    __shared__ __attribute__((aligned(16))) u16 sQ[BQ * LD];
    __shared__ __attribute__((aligned(16))) u16 sKV[FA_KT * LD];
    __shared__ float sS[BQ * FA_LDS];
    __shared__ __attribute__((aligned(16))) u16 sP[BQ * FA_LDP];
    __shared__ float sCorr[BQ], sL[BQ];
    __shared__ int sPos[BQ], sLo[BQ], sRange[2];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int q0 = bid_x() * BQ, head = bid_y();
    const int kvh = head / (n_head / n_kv_head);
    const u64 stride = (u64)n_kv_head * hd;
    const int off = kvh * hd;

    // Queries (scaled, f16) and their key ranges.
    for (int e = t; e < BQ * (HD / 4); e += NT) {
        const int r = e / (HD / 4), d = (e % (HD / 4)) * 4, tok = q0 + r;
        fa_f4 v;
        v.x = v.y = v.z = v.w = 0.0f;
        if (tok < n_tok && d < hd) v = *(const fa_f4*)(q + ((u64)tok * n_head + head) * hd + d);
        u16* p = sQ + r * LD + d;
        p[0] = f2h(v.x * scale), p[1] = f2h(v.y * scale), p[2] = f2h(v.z * scale), p[3] = f2h(v.w * scale);
    }
    for (int r = t; r < BQ; r += NT) {
        const int tok = q0 + r;
        const int P = tok < n_tok ? pos[tok] : -1;
        sPos[r] = P;
        sLo[r] = (window > 0 && P >= 0) ? (P - window + 1 > 0 ? P - window + 1 : 0) : 0;
    }
    sync();
    if (t == 0) {
        int lo = 0x7fffffff, hi = -1;
        for (int r = 0; r < BQ; ++r)
            if (sPos[r] >= 0) {
                lo = sLo[r] < lo ? sLo[r] : lo;
                hi = sPos[r] > hi ? sPos[r] : hi;
            }
        sRange[0] = lo;
        sRange[1] = hi;
    }
    sync();
    const int kmin = sRange[0], kmax = sRange[1];

    FragC o[ND];
#pragma unroll
    for (int j = 0; j < ND; ++j) frag_zero(o[j]);
    // Softmax state: threads 2r and 2r + 1 own row r (16 of its 32 scores each).
    const int sr = t >> 1, sh = t & 1;
    float m_run = FA_NEG_INF, l_run = 0.0f;

    for (int k0 = (kmin / FA_KT) * FA_KT; k0 <= kmax; k0 += FA_KT) {
        fa_load_kv<HD>(sKV, kc, k0, kmax, stride, off, hd, NT);
        sync();
        // S = Q K^T for this warp's 16 rows x 32 keys.
        FragC s[2];
        frag_zero(s[0]);
        frag_zero(s[1]);
#pragma unroll
        for (int kk = 0; kk < ND; ++kk) {
            FragA a;
            frag_a(a, sQ + (warp * 16) * LD + kk * 16, LD);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                FragB b;
                frag_b(b, sKV + (j * 16) * LD + kk * 16, LD);
                mma(s[j], a, b);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                int m, n;
                frag_coord(e, lane, &m, &n);
                m += warp * 16;
                n += j * 16;
                const int key = k0 + n, P = sPos[m];
                const bool ok = P >= 0 && key <= P && key >= sLo[m];
                sS[m * FA_LDS + n] = ok ? s[j].v[e] : FA_NEG_INF;
            }
        sync();
        // V tile into the K buffer while the softmax runs.
        fa_load_kv<HD>(sKV, vc, k0, kmax, stride, off, hd, NT);
        {
            const float* row = sS + sr * FA_LDS + 16 * sh;
            float mx = FA_NEG_INF;
#pragma unroll
            for (int i = 0; i < 16; ++i) mx = fmax_f(mx, row[i]);
            mx = fmax_f(mx, shfl_xor(mx, 1));
            const float m_new = fmax_f(m_run, mx);
            float corr = 1.0f, sum = 0.0f;
            u16* pr = sP + sr * FA_LDP + 16 * sh;
            if (m_new == FA_NEG_INF) {
#pragma unroll
                for (int i = 0; i < 16; ++i) pr[i] = 0;
            } else {
                corr = m_run == FA_NEG_INF ? 0.0f : exp_fast(m_run - m_new);
#pragma unroll
                for (int i = 0; i < 16; ++i) {
                    const float p = row[i] == FA_NEG_INF ? 0.0f : exp_fast(row[i] - m_new);
                    sum += p;
                    pr[i] = f2h(p);
                }
            }
            sum += shfl_xor(sum, 1);
            l_run = l_run * corr + sum;
            m_run = m_new;
            if (sh == 0) sCorr[sr] = corr;
        }
        sync();
        // O = O * corr + P V.
#pragma unroll
        for (int j = 0; j < ND; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                int m, n;
                frag_coord(e, lane, &m, &n);
                o[j].v[e] *= sCorr[warp * 16 + m];
            }
#pragma unroll
        for (int kk = 0; kk < FA_KT / 16; ++kk) {
            FragA a;
            frag_a(a, sP + (warp * 16) * FA_LDP + kk * 16, FA_LDP);
#pragma unroll
            for (int j = 0; j < ND; ++j) {
                FragB b;
                frag_b_t(b, sKV + (kk * 16) * LD + j * 16, LD);
                mma(o[j], a, b);
            }
        }
        sync();
    }
    if (sh == 0) sL[sr] = l_run;
    sync();
#pragma unroll
    for (int j = 0; j < ND; ++j)
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            int m, n;
            frag_coord(e, lane, &m, &n);
            m += warp * 16;
            n += j * 16;
            const int tok = q0 + m;
            if (tok < n_tok && n < hd) {
                const float l = sL[m];
                out[((u64)tok * n_head + head) * hd + n] = l > 0.0f ? o[j].v[e] / l : 0.0f;
            }
        }
}

#define FLASH_KERNEL(HD, BQ)                                                                                        \
    KERNEL LAUNCH_BOUNDS(2 * BQ) void flash_attn_f16_d##HD(const float* q, const u16* kc, const u16* vc, float* out, \
                                                          int n_tok, int n_head, int n_kv_head, int hd,             \
                                                          const int* pos, int window, float scale) {                \
        flash_body<HD, BQ>(q, kc, vc, out, n_tok, n_head, n_kv_head, hd, pos, window, scale);                       \
    }

FLASH_KERNEL(64, 64)
FLASH_KERNEL(128, 64)
FLASH_KERNEL(256, 32)
