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

// ---- decode matvec with the activation vector staged in shared memory ----
//
// The q8_1 blocks of x are copied once per block into an aligned layout (codes
// contiguous, (d, s) pairs apart): the inner loops then read 16 activation codes with
// one 128-bit shared load instead of four 32-bit global ones, and each lane works on 64
// weights per step, which roughly halves the instructions per weight byte of the Q4_K /
// Q6_K decode matvecs (they were issue-bound at 1-2 TB/s). Each lane's next weights are
// loaded before the current ones are used (two steps in flight per warp), and the first
// step's loads are issued before the staging so the two latencies overlap.
// One warp per row, 8 rows per 256-thread block; rows of at least 8 super-blocks.
#define MVS_K 16384
struct __attribute__((aligned(8))) mvs_ds { float d, s; };
struct __attribute__((aligned(16))) i32x4 { int x, y, z, w; };

// All threads of the block: x [kb] K-form blocks -> qs [kb * 32] i8, ds [kb] (d, d·Σq).
DEV void mvs_stage(const block_q8_1* x, int kb, i8* qs, mvs_ds* ds) {
    const int t = tid_x();
    for (int i = t; i < kb * 8; i += 256) ((int*)qs)[i] = q8qs(x + (i >> 3))[i & 7];
    for (int b = t; b < kb; b += 256) {
        ds[b].d = q8k_scale(x + (b & ~1));
        ds[b].s = ds[b].d * q8k_bsum(x + b);
    }
}

// Q4_K: lane = (super-block sb0 + lane / 4, quant chunk c = lane % 4: 32 bytes holding
// sub-block 2c in the low nibbles and 2c + 1 in the high ones).
struct q4k_regs { u32x4 hd, q0, q1; };
DEV void q4k_load(const u8* wr, int sb, int c, q4k_regs* r) {
    const u8* b = wr + (u64)sb * 144;
    r->hd = *(const u32x4*)b;
    r->q0 = *(const u32x4*)(b + 16 + 32 * c);
    r->q1 = *(const u32x4*)(b + 32 + 32 * c);
}
DEV float q4k_dot(const q4k_regs& r, int sb, int c, const i8* qs, const mvs_ds* ds) {
    const int sh = 16 * (c & 1);
    const u32 Y = r.hd.y >> sh, Z = r.hd.z >> sh, W = r.hd.w >> sh;
    int sc0, sc1, m0, m1;
    if (c < 2) {
        sc0 = Y & 63, sc1 = (Y >> 8) & 63, m0 = Z & 63, m1 = (Z >> 8) & 63;
    } else {
        sc0 = (W & 15) | ((Y >> 2) & 0x30), sc1 = ((W >> 8) & 15) | ((Y >> 10) & 0x30);
        m0 = ((W >> 4) & 15) | ((Z >> 2) & 0x30), m1 = ((W >> 12) & 15) | ((Z >> 10) & 0x30);
    }
    const i32x4* xa = (const i32x4*)(qs + sb * 256 + 64 * c);
    const i32x4 a0 = xa[0], a1 = xa[1], a2 = xa[2], a3 = xa[3];
    const u32 w[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    const int lo[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const int hi[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s0 = dot4((int)(w[i] & 0x0F0F0F0F), lo[i], s0);
        s1 = dot4((int)((w[i] >> 4) & 0x0F0F0F0F), hi[i], s1);
    }
    const mvs_ds e0 = ds[sb * 8 + 2 * c], e1 = ds[sb * 8 + 2 * c + 1];
    const float d = h2f((u16)(r.hd.x & 0xffff)), dmin = h2f((u16)(r.hd.x >> 16));
    return d * ((float)sc0 * e0.d * (float)s0 + (float)sc1 * e1.d * (float)s1) - dmin * ((float)m0 * e0.s + (float)m1 * e1.s);
}

// 16 bytes at a 2-byte-aligned address as 4 words: 5 aligned 32-bit loads and shifts
// (Q6_K super-blocks are 210 bytes, so their fields are only 2-byte aligned).
DEV void ld16_a2(const u8* p, u32* out) {
    const u32* q = (const u32*)((u64)p & ~(u64)3);
    const bool odd = ((u64)p & 3) != 0;
    u32 w[5];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = q[i];
    w[4] = odd ? q[4] : 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = odd ? ((w[i] >> 16) | (w[i + 1] << 16)) : w[i];
}

// Q6_K: lane = (super-block sb0 + lane / 4, half h = (lane / 2) % 2, 16-element quarter
// q = lane % 2 of each of the half's four 32-element groups): 64 weights per step.
struct q6k_regs { u32 L0[4], L1[4], H[4]; u32 sc01, sc23; u16 d; };
DEV void q6k_load(const u8* wr, int sb, int h, int q, q6k_regs* r) {
    const u8* b = wr + (u64)sb * 210;
    ld16_a2(b + 64 * h + 16 * q, r->L0);
    ld16_a2(b + 64 * h + 32 + 16 * q, r->L1);
    ld16_a2(b + 128 + 32 * h + 16 * q, r->H);
    const u16* sp = (const u16*)(b + 192 + 8 * h);
    r->sc01 = (u32)sp[0] | ((u32)sp[1] << 16);
    r->sc23 = (u32)sp[2] | ((u32)sp[3] << 16);
    r->d = *(const u16*)(b + 208);
}
DEV float q6k_dot(const q6k_regs& r, int sb, int h, int q, const i8* qs, const mvs_ds* ds) {
    // scales 8h + 2g + q for g = 0..3: byte q of each 16-bit word.
    const int scl[4] = {(int)(i8)((r.sc01 >> (8 * q)) & 0xff), (int)(i8)((r.sc01 >> (16 + 8 * q)) & 0xff),
                        (int)(i8)((r.sc23 >> (8 * q)) & 0xff), (int)(i8)((r.sc23 >> (16 + 8 * q)) & 0xff)};
    float v = 0.0f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const int blk = sb * 8 + 4 * h + g;
        const i32x4 a = *(const i32x4*)(qs + blk * 32 + 16 * q);
        const int av[4] = {a.x, a.y, a.z, a.w};
        int s = 0, sa = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 l = (g & 1) ? r.L1[i] : r.L0[i];
            const u32 code = (((g & 2) ? (l >> 4) : l) & 0x0F0F0F0F) | (((r.H[i] >> (2 * g)) & 0x03030303) << 4);
            s = dot4((int)code, av[i], s);
            sa = dot4(0x20202020, av[i], sa);
        }
        v += (float)scl[g] * ds[blk].d * (float)(s - sa);
    }
    return h2f(r.d) * v;
}

// ---- several decode matvecs over one q8_1 activation vector in one launch ----
//
// The q/k/v projections (and gate/up) read the same normalized input: one launch serves
// up to 3 weights of any q8_1-consuming type (a type code per segment), saving launches,
// which dominate a decode step of a small model; a single decode matvec of Q4_K / Q6_K
// is this kernel with one segment. Segment s owns blocks [sum_{j<s} ceil(rows_j / 8), …);
// Q4_K / Q6_K rows of at least 8 super-blocks (K <= MVS_K) use the staged kernels above,
// everything else the per-type warp bodies on global q8_1.
// Type codes: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 10 Q4_K, 11 Q5_K, 12 Q6_K.
// x: [k / 32] q8_1 form (for the 32-element types), xk: [k / 32] K form (for the
// K-quants; either may be unused); y_s: [rows_s] f32; staged: the fewest super-blocks per row for
// which the staged kernels are used (0: never). On the H200 they beat the uncapped warp
// bodies on long rows (Q4_K 4096 x 14336: 2.0 vs 1.4 TB/s) but only matched them once
// those were compiled for 64 registers, and lost on K <= 9728: opt-in (ops.rs).
// grid (Σ ceil(rows_s / 8)), block 256.
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
    default: break;
    }
}

#ifdef LODE_NV
#define MVS_BOUNDS __launch_bounds__(256, 4)
#else
#define MVS_BOUNDS LAUNCH_BOUNDS(256)
#endif
KERNEL MVS_BOUNDS void matvec_multi_n1(const block_q8_1* x, const block_q8_1* xk, int k, const u8* W0, float* y0, int rows0, int ty0, const u8* W1,
                                       float* y1, int rows1, int ty1, const u8* W2, float* y2, int rows2, int ty2, int staged) { pdl_entry();
    __shared__ __attribute__((aligned(16))) i8 s_qs[MVS_K];
    __shared__ mvs_ds s_ds[MVS_K / 32];
    int b = bid_x();
    const int nb0 = (rows0 + 7) / 8, nb1 = (rows1 + 7) / 8;
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
    const int lane = tid_x() & 31;
    const int row = b * 8 + (tid_x() >> 5);
    const bool live = row < rows;
    const int kb = k / 32, nsb = k / 256;
    float acc[1] = {0.0f};
    if (staged > 0 && (ty == 10 || ty == 12) && nsb >= staged && nsb >= 8 && k <= MVS_K) {
        // Block-uniform branch: every thread reaches the barrier.
        int sb = lane >> 2;
        if (ty == 10) {
            const int c = lane & 3;
            const u8* wr = W + (u64)(live ? row : 0) * nsb * 144;
            q4k_regs cur, nxt;
            if (live && sb < nsb) q4k_load(wr, sb, c, &cur);
            mvs_stage(xk, kb, s_qs, s_ds);
            sync();
            if (!live) return;
            for (; sb < nsb; sb += 8) {
                if (sb + 8 < nsb) q4k_load(wr, sb + 8, c, &nxt);
                acc[0] += q4k_dot(cur, sb, c, s_qs, s_ds);
                cur = nxt;
            }
        } else {
            const int h = (lane >> 1) & 1, q = lane & 1;
            const u8* wr = W + (u64)(live ? row : 0) * nsb * 210;
            q6k_regs cur, nxt;
            if (live && sb < nsb) q6k_load(wr, sb, h, q, &cur);
            mvs_stage(xk, kb, s_qs, s_ds);
            sync();
            if (!live) return;
            for (; sb < nsb; sb += 8) {
                if (sb + 8 < nsb) q6k_load(wr, sb + 8, h, q, &nxt);
                acc[0] += q6k_dot(cur, sb, h, q, s_qs, s_ds);
                cur = nxt;
            }
        }
        store<1>(y, acc, rows, row, 1);
        return;
    }
    if (!live) return;
    mv_any(ty, W, x, xk, row, kb, nsb, acc);
    store<1>(y, acc, rows, row, 1);
}

// The same launch without the staged kernels: 4 rows per 128-thread block and the warp
// bodies only, compiled for 8 resident blocks (64 registers, no spills); used when no
// segment qualifies for staging. grid (Σ ceil(rows_s / 4)), block 128.
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
