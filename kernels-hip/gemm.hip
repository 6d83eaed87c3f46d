// Prefill GEMM on matrix cores (issue 6): quantized weights x N f32 activation rows.
//   Y[n][m] = sum_k W[m][k] * X[n][k]     W: [M, K] (the canonical device layout of its type:
//   the GGUF stored blocks, or row64 for Q4_K / Q6_K), X: [N, K] f32, Y: [N, M] f32.
// Paired form (gemm_glu_*): Y[n][m] = act(G·x)[m] * (U·x)[m] with G and U of one type,
// act = SiLU (act 0) or GELU-tanh (act 1): the gate/up projections of one FFN from one
// activation tile, the GLU in the epilogue.
//
// Block = BM / 16 warps = a BM (M) x BN (N) tile: BM = 128 with BN = 64 or 16 (paired
// form: 64). (128 x 128 tiles, 64 x 64 tiles and split-K lost on the H200: deleted, their
// numbers in benchmarks/.) Each K step of 64 elements:
// every thread decodes 32 weights of one row (two 16-element halves of one sub-block pair
// of a K-quant, whose scales it decodes once for both; or one whole 32-element block) into
// shared memory as f16, and 4·BN/16 activations converted to f16; then each warp issues
// (32 x 32 or 16 x 16 per warp) 16x16x16 matrix products (mma.h). The next step's weight
// bytes and activations are loaded into registers before the current step's products,
// so global latency overlaps the matrix work. No dequantized copy of a weight exists
// outside this tile.
// Any M and N work (rows past M / tokens past N are zero-filled and never stored); K is
// whole blocks of the type (a multiple of 256 for K-quants, 32 otherwise).
// grid (ceil(M / BM), ceil(N / BN)), block 2 BM.
#include "common.h"
#include "mma.h"
#include "dequant_low.h"

#define GB_K 64
#define GB_LD 72 // padded row stride (u16): 144 bytes, 16-byte aligned, conflict-free ldmatrix
// Two blocks per SM on NVIDIA for the register-heavy paired tile: caps it at
// 128 registers (measured faster than one block with no spills).
#ifdef LODE_AMD
#define LAUNCH_BOUNDS_2(n) LAUNCH_BOUNDS(n)
#else
#define LAUNCH_BOUNDS_2(n) __launch_bounds__(n, 2)
#endif

#include "gemm_load.h"

// Activations of one K step: BN rows x 64, SEG = 64 BN / threads floats per thread.
template <int SEG>
struct XRaw {
    float v[SEG];
};
// Thread t of the tile's loaders (the block's thread, or the lane for one warp's tile).
template <int SEG>
DEV void load_x(XRaw<SEG>& x, const float* X, int N, int K, int n0, int ks, int t = tid_x()) {
    constexpr int TPR = 64 / SEG;
    const int n = n0 + t / TPR, k = ks * GB_K + (t % TPR) * SEG;
    const float* p = X + (u64)n * K + k;
    if (n < N && k + SEG <= K) {
#pragma unroll
        for (int i = 0; i < SEG; i += 4) {
            const g_f4 f = *(const g_f4*)(p + i);
            x.v[i] = f.x, x.v[i + 1] = f.y, x.v[i + 2] = f.z, x.v[i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < SEG; ++i) x.v[i] = (n < N && k + i < K) ? p[i] : 0.0f;
    }
}
template <int SEG>
DEV void store_x(const XRaw<SEG>& x, u16* sX, int t = tid_x()) {
    constexpr int TPR = 64 / SEG;
    u16* d = sX + (t / TPR) * GB_LD + (t % TPR) * SEG;
    if constexpr (SEG >= 8) {
#pragma unroll
        for (int i = 0; i < SEG; i += 8)
            st_u4(d + i, pack_h2(x.v[i], x.v[i + 1]), pack_h2(x.v[i + 2], x.v[i + 3]), pack_h2(x.v[i + 4], x.v[i + 5]), pack_h2(x.v[i + 6], x.v[i + 7]));
    } else {
        g_u2 v;
        v.x = pack_h2(x.v[0], x.v[1]);
        v.y = pack_h2(x.v[2], x.v[3]);
        *(g_u2*)d = v;
    }
}

template <int TYPE, int BM, int BN, bool GLU>
DEV void gemm_body(const u8* W, const u8* W2, const float* X, float* Y, int M, int N, int K, int act) {
    constexpr int NT = 2 * BM, NWARP = NT / 32;       // two threads per weight row
    constexpr int WN = BN >= 32 ? BN / 32 : 1;         // warps along N
    constexpr int WM = NWARP / WN;                     // warps along M
    constexpr int FM = BM / (16 * WM), FN = BN / (16 * WN);
    constexpr int SEG = BN * GB_K / NT;                // activations per thread and step
    __shared__ __attribute__((aligned(16))) u16 sW[BM * GB_LD];
    __shared__ __attribute__((aligned(16))) u16 sW2[GLU ? BM * GB_LD : 8];
    __shared__ __attribute__((aligned(16))) u16 sX[BN * GB_LD];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = bid_x() * BM, n0 = bid_y() * BN;
    const int r = t >> 1, c = t & 1, row = m0 + r;
    const bool live = row < M;
    // K steps [kb0, nks) of this block: all of them.
    const int kb0 = 0, nks = (K + GB_K - 1) / GB_K;

    FragC acc[FM][FN], acc2[GLU ? FM : 1][GLU ? FN : 1];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            frag_zero(acc[i][j]);
            if (GLU) frag_zero(acc2[GLU ? i : 0][GLU ? j : 0]);
        }

    typename RawOf<TYPE>::T raw, raw2;
    XRaw<SEG> xr;
    if (live) {
        load_raw<TYPE>(raw, W, row, K, kb0, c);
        if (GLU) load_raw<TYPE>(raw2, W2, row, K, kb0, c);
    }
    load_x<SEG>(xr, X, N, K, n0, kb0);
    for (int ks = kb0; ks < nks; ++ks) {
        u16* dst = sW + r * GB_LD;
        if (live) {
            emit<TYPE>(raw, dst, ks, c);
            if (GLU) emit<TYPE>(raw2, sW2 + r * GB_LD, ks, c);
        } else {
            float z[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) z[i] = 0.0f;
            put16(dst + 32 * c, z);
            put16(dst + 32 * c + 16, z);
            if (GLU) {
                put16(sW2 + r * GB_LD + 32 * c, z);
                put16(sW2 + r * GB_LD + 32 * c + 16, z);
            }
        }
        store_x<SEG>(xr, sX);
        sync();
        if (ks + 1 < nks) {
            if (live) {
                load_raw<TYPE>(raw, W, row, K, ks + 1, c);
                if (GLU) load_raw<TYPE>(raw2, W2, row, K, ks + 1, c);
            }
            load_x<SEG>(xr, X, N, K, n0, ks + 1);
        }
#pragma unroll
        for (int kk = 0; kk < GB_K / 16; ++kk) {
            FragB b[FN];
#pragma unroll
            for (int j = 0; j < FN; ++j) frag_b(b[j], sX + ((wn * FN + j) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                FragA a;
                frag_a(a, sW + ((wm * FM + i) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
                for (int j = 0; j < FN; ++j) mma(acc[i][j], a, b[j]);
                if (GLU) {
                    FragA a2;
                    frag_a(a2, sW2 + ((wm * FM + i) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
                    for (int j = 0; j < FN; ++j) mma(acc2[GLU ? i : 0][GLU ? j : 0], a2, b[j]);
                }
            }
        }
        sync();
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                int m, n;
                frag_coord(e, lane, &m, &n);
                m += m0 + (wm * FM + i) * 16;
                n += n0 + (wn * FN + j) * 16;
                if (m < M && n < N) {
                    float v = acc[i][j].v[e];
                    if (GLU) {
                        const float u = acc2[GLU ? i : 0][GLU ? j : 0].v[e];
                        v = (act ? gelu_tanh_f(v) : silu_f(v)) * u;
                    }
                    Y[(u64)n * M + m] = v;
                }
            }
}


// One warp's lanes in step before it reads what the others wrote to shared memory.
#ifdef LODE_AMD
DEV void warp_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#else
DEV void warp_sync() { __syncwarp(); }
#endif

// Few tokens (batched decode steps, short chunks): 16 weight rows x 16 tokens per block of
// GS_WARPS warps. Each warp decodes and multiplies every GS_WARPS-th K step on its own
// (its own tile in shared memory, no block barrier per step), and the warps' sums are
// added in shared memory at the end in a fixed order, so a run gives the same bits every
// time. Where gemm_body's 128-row tiles give a 1024-row weight 8 blocks walking K serially,
// this gives 64 blocks of 8 warps walking 1/8 of it each. Each weight byte is read once per
// 16 tokens. grid (ceil(N / 16), ceil(M / 16)), block 32 GS_WARPS.
#define GS_WARPS 8
template <int TYPE>
DEV void gemm_small_body(const u8* W, const float* X, float* Y, int M, int N, int K) {
    __shared__ __attribute__((aligned(16))) u16 sW[GS_WARPS][16 * GB_LD];
    __shared__ __attribute__((aligned(16))) u16 sX[GS_WARPS][16 * GB_LD];
    __shared__ float red[GS_WARPS][256];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int n0 = bid_x() * 16, m0 = bid_y() * 16;
    const int r = lane >> 1, c = lane & 1, row = m0 + r;
    const bool live = row < M;
    const int nks = (K + GB_K - 1) / GB_K;
    u16* ws = sW[warp] + r * GB_LD;
    FragC acc;
    frag_zero(acc);
    typename RawOf<TYPE>::T raw;
    XRaw<32> xr;
    int ks = warp;
    if (ks < nks) {
        if (live) load_raw<TYPE>(raw, W, row, K, ks, c);
        load_x<32>(xr, X, N, K, n0, ks, lane);
    }
    for (; ks < nks; ks += GS_WARPS) {
        if (live) {
            emit<TYPE>(raw, ws, ks, c);
        } else {
            float z[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) z[i] = 0.0f;
            put16(ws + 32 * c, z);
            put16(ws + 32 * c + 16, z);
        }
        store_x<32>(xr, sX[warp], lane);
        warp_sync();
        if (ks + GS_WARPS < nks) {
            if (live) load_raw<TYPE>(raw, W, row, K, ks + GS_WARPS, c);
            load_x<32>(xr, X, N, K, n0, ks + GS_WARPS, lane);
        }
#pragma unroll
        for (int kk = 0; kk < GB_K / 16; ++kk) {
            FragA a;
            FragB b;
            frag_a(a, sW[warp] + kk * 16, GB_LD);
            frag_b(b, sX[warp] + kk * 16, GB_LD);
            mma(acc, a, b);
        }
        warp_sync();
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        int m, n;
        frag_coord(e, lane, &m, &n);
        red[warp][n * 16 + m] = acc.v[e];
    }
    sync();
    const int m = t & 15, n = t >> 4;
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < GS_WARPS; ++w) v += red[w][n * 16 + m];
    if (m0 + m < M && n0 + n < N) Y[(u64)(n0 + n) * M + m0 + m] = v;
}

#define GEMM_KERNELS(NAME, T)                                                                                    \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_n64(const u8* W, const float* X, float* Y, int M, int N, int K) { \
        gemm_body<T, 128, 64, false>(W, W, X, Y, M, N, K, 0);                                                    \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_n16(const u8* W, const float* X, float* Y, int M, int N, int K) { \
        gemm_body<T, 128, 16, false>(W, W, X, Y, M, N, K, 0);                                                    \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS_2(256) void gemm_glu_##NAME##_n64(const u8* G, const u8* U, const float* X, float* Y,   \
                                                           int M, int N, int K, int act) {                       \
        gemm_body<T, 128, 64, true>(G, U, X, Y, M, N, K, act);                                                   \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_s16(const u8* W, const float* X, float* Y, int M, int N, int K) { \
        gemm_small_body<T>(W, X, Y, M, N, K);                                                                    \
    }

GEMM_KERNELS(q4_0, T_Q4_0)
GEMM_KERNELS(q4_1, T_Q4_1)
GEMM_KERNELS(q5_0, T_Q5_0)
GEMM_KERNELS(q5_1, T_Q5_1)
GEMM_KERNELS(q8_0, T_Q8_0)
GEMM_KERNELS(q4_K, T_Q4_K)
GEMM_KERNELS(q5_K, T_Q5_K)
GEMM_KERNELS(q6_K, T_Q6_K)
GEMM_KERNELS(q4_K_r64, T_Q4_K_R64)
GEMM_KERNELS(q6_K_r64, T_Q6_K_R64)
GEMM_KERNELS(q2_K, T_Q2_K)
GEMM_KERNELS(q3_K, T_Q3_K)
GEMM_KERNELS(iq4_nl, T_IQ4_NL)
GEMM_KERNELS(iq4_xs, T_IQ4_XS)
GEMM_KERNELS(mxfp4, T_MXFP4)
