// Decode matvec: y[c][r] = sum_k W[r][k] * x[c][k] for up to NC activation columns.
//
// Weights are read in the GGUF stored block layout (§2 of the reference). Quantized
// weights meet int8 activations quantized as the CPU backend quantizes them (quantize.hip):
// the 32-element types the q8_1 form (Q4_1 / Q5_1 apply their min with the block's
// s = d·Σq, as the CPU does; Q4_0 / Q5_0 subtract their offset from the codes, exact in
// integers, as the CPU does), the K-quants the K form (one f32 scale per super-block,
// integer code sums for the min term); float weights meet f32 activations.
//
// One warp per output row, 4 rows per 128-thread block; grid (ceil(rows / 4)).
// NC = 1 is the decode kernel; NC = 8 serves prefill chunks (columns past `ncols` unused).
// Arguments (every matvec_* kernel): W, x (block_q8_1* or float*), y [ncols, rows] f32,
// rows, k, ncols.
#include "common.h"

#include "mv_dot.h"
#include "mv_dot_b32.h"
#include "dequant_low.h"
#include "mv_dot_low.h"

// ---- float weights x f32 activations ----

// TYPE: 0 = F32, 1 = F16, 2 = BF16
template <int TYPE, int NC>
DEV void mv_float(const u8* wr, const float* x, int k, int ncols, float* acc) {
    const int lane = tid_x() & 31;
    for (int i = lane; i < k; i += 32) {
        float wv;
        if (TYPE == 0) wv = ((const float*)wr)[i];
        else if (TYPE == 1) wv = h2f(((const u16*)wr)[i]);
        else wv = bf2f(((const u16*)wr)[i]);
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            acc[col] += wv * x[(u64)col * k + i];
        }
    }
}

#define ROW_SETUP                                   \
    const int row = bid_x() * 4 + (tid_x() >> 5);   \
    if (row >= rows) return;                        \
    float acc[NC];                                  \
    _Pragma("unroll") for (int c = 0; c < NC; ++c) acc[c] = 0.0f;

// MINB: resident 128-thread blocks per multiprocessor the n1 kernel is compiled for (a
// register cap without spills; Q4_K at 79 registers ran 24 warps per SM; Q6_K's
// pipelined loop needs 64, at 40 or 48 it spills).
#define MV_K(NAME, FN, BB, MINB)                                                                   \
    template <int NC>                                                                              \
    DEV void NAME##_body(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                                  \
        const int nsb = k / 256;                                                                   \
        FN<NC>(W + (u64)row * nsb * BB, x, k / 32, nsb, ncols, acc);                               \
        store<NC>(y, acc, rows, row, ncols);                                                       \
    }                                                                                              \
    KERNEL LAUNCH_BOUNDS_MIN(128, MINB) void NAME##_n1(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                                   \
    }                                                                                              \
    KERNEL void NAME##_n8(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                                   \
    }

MV_K(matvec_q4_K, mv_q4_K, 144, 8)
MV_K(matvec_q5_K, mv_q5_K, 176, 12)
MV_K(matvec_q6_K, mv_q6_K, 210, 8)
MV_K(matvec_q2_K, mv_q2_K, 84, 8)
MV_K(matvec_q3_K, mv_q3_K, 110, 8)
MV_K(matvec_iq4_xs, mv_iq4_xs, 136, 8)
MV_K(matvec_iq3_s, mv_iq3_s, 110, 8)
MV_K(matvec_iq3_xxs, mv_iq3_xxs, 98, 8)
MV_K(matvec_iq2_xxs, mv_iq2_xxs, 66, 8)
MV_K(matvec_iq2_xs, mv_iq2_xs, 74, 8)
MV_K(matvec_iq2_s, mv_iq2_s, 82, 8)
MV_K(matvec_iq1_s, mv_iq1_s, 50, 8)
MV_K(matvec_iq1_m, mv_iq1_m, 56, 8)

#define MV_B32(NAME, T, BB)                                                                        \
    template <int NC>                                                                              \
    DEV void NAME##_body(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                                  \
        mv_b32<T, NC>(W + (u64)row * (k / 32) * BB, x, k / 32, ncols, acc);                        \
        store<NC>(y, acc, rows, row, ncols);                                                       \
    }                                                                                              \
    KERNEL void NAME##_n1(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                                   \
    }                                                                                              \
    KERNEL void NAME##_n8(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                                   \
    }

MV_B32(matvec_q4_0, 0, 18)
MV_B32(matvec_q4_1, 1, 20)
MV_B32(matvec_q5_0, 2, 22)
MV_B32(matvec_q5_1, 3, 24)
MV_B32(matvec_q8_0, 4, 34)

#define MV_NL(NAME, MX, BB)                                                                        \
    template <int NC>                                                                              \
    DEV void NAME##_body(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                                  \
        mv_nl<MX, NC>(W + (u64)row * (k / 32) * BB, x, k / 32, ncols, acc);                        \
        store<NC>(y, acc, rows, row, ncols);                                                       \
    }                                                                                              \
    KERNEL void NAME##_n1(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                                   \
    }                                                                                              \
    KERNEL void NAME##_n8(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                                   \
    }

MV_NL(matvec_iq4_nl, false, 18)
MV_NL(matvec_mxfp4, true, 17)

#define MV_F(NAME, T, EB)                                                                      \
    template <int NC>                                                                          \
    DEV void NAME##_body(const u8* W, const float* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                              \
        mv_float<T, NC>(W + (u64)row * k * EB, x, k, ncols, acc);                              \
        store<NC>(y, acc, rows, row, ncols);                                                   \
    }                                                                                          \
    KERNEL void NAME##_n1(const u8* W, const float* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                               \
    }                                                                                          \
    KERNEL void NAME##_n8(const u8* W, const float* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                               \
    }

MV_F(matvec_f32, 0, 4)
MV_F(matvec_f16, 1, 2)
MV_F(matvec_bf16, 2, 2)

// ---- float weights x 2+ f32 columns: 32 rows x 32 columns per 256-thread block ----
//
// The n8 matvec above gives a 128-row router (MoE) 32 warps in all and reads its input
// once per 8 columns; here W and x go through shared memory in 32-wide k steps, so every
// column of a block shares one read of its rows. grid (ceil(rows / 32), ceil(ncols / 32)).
template <int TYPE>
DEV float float_at(const u8* W, u64 i) {
    if (TYPE == 0) return ((const float*)W)[i];
    if (TYPE == 1) return h2f(((const u16*)W)[i]);
    return bf2f(((const u16*)W)[i]);
}

template <int TYPE>
DEV void mv_float_tile(const u8* W, const float* x, float* y, int rows, int k, int ncols) {
    __shared__ float ws[32][33];
    __shared__ float xs[32][33];
    const int tx = tid_x() & 31, ty = tid_x() >> 5;
    const int r0 = bid_x() * 32, c0 = bid_y() * 32;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < k; k0 += 32) {
        const int kk = k0 + tx;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int r = r0 + ty + 8 * j, c = c0 + ty + 8 * j;
            ws[ty + 8 * j][tx] = (r < rows && kk < k) ? float_at<TYPE>(W, (u64)r * k + kk) : 0.0f;
            xs[ty + 8 * j][tx] = (c < ncols && kk < k) ? x[(u64)c * k + kk] : 0.0f;
        }
        sync();
#pragma unroll 8
        for (int i = 0; i < 32; ++i) {
            const float wv = ws[tx][i];
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[j] += wv * xs[ty + 8 * j][i];
        }
        sync();
    }
    const int r = r0 + tx;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int c = c0 + ty + 8 * j;
        if (r < rows && c < ncols) y[(u64)c * rows + r] = acc[j];
    }
}

#define MV_FT(NAME, T)                                                                            \
    KERNEL LAUNCH_BOUNDS(256) void NAME(const u8* W, const float* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        mv_float_tile<T>(W, x, y, rows, k, ncols);                                                \
    }

MV_FT(matvec_f32_tile, 0)
MV_FT(matvec_f16_tile, 1)
MV_FT(matvec_bf16_tile, 2)

// ---- several decode matvecs over one q8_1 activation vector in one launch ----
//
// The q/k/v projections (and gate/up) read the same normalized input: one launch serves
// up to 3 weights of any q8_1-consuming type (a type code per segment), saving launches,
// which dominate a decode step of a small model; a single decode matvec of Q4_K / Q6_K
// is this kernel with one segment. Segment s owns blocks [sum_{j<s} ceil(rows_j / 4), …).
// Type codes: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 5 IQ4_NL, 6 MXFP4 (q8_1 form),
// 10 Q4_K, 11 Q5_K, 12 Q6_K, 13 Q2_K, 14 Q3_K, 15 IQ4_XS, 16 IQ3_S, 17 IQ3_XXS, 18 IQ2_XXS,
// 19 IQ2_XS, 20 IQ2_S, 21 IQ1_S, 22 IQ1_M (K form).
// x: [k / 32] q8_1 form (for the 32-element types), xk: [k / 32] K form (for the
// K-quants; either may be unused); y_s: [rows_s] f32.
// (A variant staging x in shared memory, 8 rows per block, matched these bodies on rows
// of 14336 and lost on 2560-9728 on the H200: deleted, numbers in benchmarks/.)
// One row of any q8_1-consuming type by its warp body (type codes as above).
DEV void mv_any(int ty, const u8* W, const block_q8_1* x, const block_q8_1* xk, int row, int kb, int nsb, float* acc) {
    switch (ty) {
    case 0: mv_b32<0, 1>(W + (u64)row * kb * 18, x, kb, 1, acc); break;
    case 1: mv_b32<1, 1>(W + (u64)row * kb * 20, x, kb, 1, acc); break;
    case 2: mv_b32<2, 1>(W + (u64)row * kb * 22, x, kb, 1, acc); break;
    case 3: mv_b32<3, 1>(W + (u64)row * kb * 24, x, kb, 1, acc); break;
    case 4: mv_b32<4, 1>(W + (u64)row * kb * 34, x, kb, 1, acc); break;
    case 10: mv_q4_K<1>(W + (u64)row * nsb * 144, xk, kb, nsb, 1, acc); break;
    case 11: mv_q5_K<1>(W + (u64)row * nsb * 176, xk, kb, nsb, 1, acc); break;
    case 12: mv_q6_K<1>(W + (u64)row * nsb * 210, xk, kb, nsb, 1, acc); break;
    case 5: mv_nl<false, 1>(W + (u64)row * kb * 18, x, kb, 1, acc); break;
    case 6: mv_nl<true, 1>(W + (u64)row * kb * 17, x, kb, 1, acc); break;
    case 13: mv_q2_K<1>(W + (u64)row * nsb * 84, xk, kb, nsb, 1, acc); break;
    case 14: mv_q3_K<1>(W + (u64)row * nsb * 110, xk, kb, nsb, 1, acc); break;
    case 15: mv_iq4_xs<1>(W + (u64)row * nsb * 136, xk, kb, nsb, 1, acc); break;
    case 16: mv_iq3_s<1>(W + (u64)row * nsb * 110, xk, kb, nsb, 1, acc); break;
    case 17: mv_iq3_xxs<1>(W + (u64)row * nsb * 98, xk, kb, nsb, 1, acc); break;
    case 18: mv_iq2_xxs<1>(W + (u64)row * nsb * 66, xk, kb, nsb, 1, acc); break;
    case 19: mv_iq2_xs<1>(W + (u64)row * nsb * 74, xk, kb, nsb, 1, acc); break;
    case 20: mv_iq2_s<1>(W + (u64)row * nsb * 82, xk, kb, nsb, 1, acc); break;
    case 21: mv_iq1_s<1>(W + (u64)row * nsb * 50, xk, kb, nsb, 1, acc); break;
    case 22: mv_iq1_m<1>(W + (u64)row * nsb * 56, xk, kb, nsb, 1, acc); break;
    default: break;
    }
}


// 4 rows per 128-thread block, compiled for 8 resident blocks (64 registers, no spills).
// grid (Σ ceil(rows_s / 4)), block 128.
KERNEL LAUNCH_BOUNDS_MIN(128, 8) void matvec_multi4_n1(const block_q8_1* x, const block_q8_1* xk, int k, const u8* W0, float* y0, int rows0, int ty0,
                                                      const u8* W1, float* y1, int rows1, int ty1, const u8* W2, float* y2,
                                                      int rows2, int ty2) { pdl_entry();
    int b = bid_x();
    const int nb0 = (rows0 + 3) / 4, nb1 = (rows1 + 3) / 4;
    const u8* W = W0;
    float* y = y0;
    int rows = rows0, ty = ty0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, y = y2, rows = rows2, ty = ty2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, y = y1, rows = rows1, ty = ty1;
    }
    const int row = b * 4 + (tid_x() >> 5);
    if (row >= rows) return;
    float acc[1] = {0.0f};
    mv_any(ty, W, x, xk, row, k / 32, k / 256, acc);
    store<1>(y, acc, rows, row, 1);
}

// Q4_K rows of at most 16 super-blocks (Qwen3-4B's 2560, Llama-8B's 4096) over up to 3
// segments, for launches of many waves (4B's q/k/v and gate/up: 4-5 waves of
// matvec_multi4_n1, each wave a pause of loads then products): a resident grid whose warps
// walk the rows g = warp, warp + all warps, ..., the next row's two slots loaded before
// the current row's products, so two rows are in flight per warp and loads continue
// across what were waves. Each row's arithmetic is mv_q4_K's (slot a, then slot b).
// xk: [k/32] K form; W_s: [rows_s, k] Q4_K; nw: the grid's warps (4 per block). grid
// (resident blocks), block 128.
// (q4k_row2 and its loads: mv_dot.h, shared with decode_mv.hip's norm walk.)
KERNEL LAUNCH_BOUNDS_MIN(128, 6) void matvec_q4k_loop_n1(const block_q8_1* xk, int k, const u8* W0, float* y0, int rows0, const u8* W1,
                                                         float* y1, int rows1, const u8* W2, float* y2, int rows2, int nw) { pdl_entry();
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, s = lane >> 2;
    const int nsb = k / 256, total = rows0 + rows1 + rows2;
    const u64 rb = (u64)nsb * 144;
    const block_q8_1* xa = xk + s * 8 + 4 * p;
    int g = bid_x() * 4 + (tid_x() >> 5);
    // Row g of the concatenated segments: its weights.
    auto wrow = [&](int r) -> const u8* { return r < rows0 ? W0 + r * rb : r < rows0 + rows1 ? W1 + (r - rows0) * rb : W2 + (r - rows0 - rows1) * rb; };
    q4k_row2 cur, nxt;
    if (g < total) q4k_row2_load(wrow(g), nsb, cur);
    for (; g < total; g += nw) {
        const int gn = g + nw;
        if (gn < total) q4k_row2_load(wrow(gn), nsb, nxt);
        const float v = q4k_row2_dot(cur, xk, xa, nsb);
        float* y = g < rows0 ? y0 + g : g < rows0 + rows1 ? y1 + (g - rows0) : y2 + (g - rows0 - rows1);
        if (lane == 0) *y = v;
        cur = nxt;
    }
}
