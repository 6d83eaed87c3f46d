// Prefill GEMM on matrix cores (issue 6 builds on this skeleton): Q4_K weights (stored
// layout) x N f32 activation rows, f16 operands, f32 accumulation.
//   Y[n][m] = sum_k W[m][k] * X[n][k]      W: [M, K] Q4_K, X: [N, K] f32, Y: [N, M] f32
// Block = 4 warps = a 64 (M) x 16 (N) tile; each K step of 32 (one Q4_K sub-block) is
// dequantized into shared memory as f16 (scales decoded once per row and sub-block), the
// activations converted to f16, then each warp issues two 16x16x16 matrix products.
// Any M, N works (tails are zero-filled / not stored); K must be a multiple of 256.
// grid (ceil(M / 64), ceil(N / 16)), block 128.
#include "common.h"

#define GT_M 64
#define GT_N 16
#define GT_K 32
#define GT_LD (GT_K + 8) // padded row stride (u16) against bank conflicts

KERNEL void gemm_q4_K_f16(const u8* W, const float* X, float* Y, int M, int N, int K) {
    __shared__ __attribute__((aligned(16))) u16 sW[GT_M * GT_LD];
    __shared__ __attribute__((aligned(16))) u16 sX[GT_N * GT_LD];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int m0 = bid_x() * GT_M, n0 = bid_y() * GT_N;
    const int nsb = K / 256;
    float acc[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;
    // Thread t dequantizes 16 codes of row t/2 (half t%2 of the sub-block).
    const int wr = t >> 1, wh = t & 1;
    for (int ks = 0; ks < K / GT_K; ++ks) {
        const int sb = ks >> 3, j = ks & 7;
        {
            u16* dst = sW + wr * GT_LD + 16 * wh;
            if (m0 + wr < M) {
                const u8* b = W + ((u64)(m0 + wr) * nsb + sb) * 144;
                const u8* s = b + 4;
                int sc, mn;
                if (j < 4) {
                    sc = s[j] & 63;
                    mn = s[j + 4] & 63;
                } else {
                    sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
                    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
                }
                const float dl = h2f(ld_u16(b)) * sc, ml = h2f(ld_u16(b + 2)) * mn;
                const u8* q = b + 16 + 32 * (j >> 1) + 16 * wh;
                const int sh = (j & 1) * 4;
#pragma unroll
                for (int i = 0; i < 16; ++i) dst[i] = f2h(dl * (float)((q[i] >> sh) & 15) - ml);
            } else {
#pragma unroll
                for (int i = 0; i < 16; ++i) dst[i] = 0;
            }
        }
        // 16 x 32 activations: 512 values, 4 per thread.
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int e = t + 128 * r, n = e >> 5, kk = e & 31;
            const float v = (n0 + n < N) ? X[(u64)(n0 + n) * K + ks * GT_K + kk] : 0.0f;
            sX[n * GT_LD + kk] = f2h(v);
        }
        sync();
        mma16x16x16(sW + warp * 16 * GT_LD, GT_LD, sX, GT_LD, acc);
        mma16x16x16(sW + warp * 16 * GT_LD + 16, GT_LD, sX + 16, GT_LD, acc);
        sync();
    }
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int m, n;
        mma_coord(i, lane, &m, &n);
        m += m0 + warp * 16;
        n += n0;
        if (m < M && n < N) Y[(u64)n * M + m] = acc[i];
    }
}
