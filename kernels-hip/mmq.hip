// Small-batch integer GEMM (issue 26): quantized weights x 2..64 activation columns in
// their int8 form, every weight read once for all columns of the batch.
//   Y[c][r] = sum_k W[r][k] * X[c][k]    W: [M, K] in the stored GGUF blocks, X: [ncols, K/32]
//   activation blocks (quantize.hip: the K form for the K-quants, the q8_1 form for the
//   32-element types, as the matvecs read them), Y: [ncols, M] f32.
//
// Block = 8 warps; a warp holds R rows (lanes per row L = 32 / R), a block 8 R rows. Each K
// step of 256 elements (one K-quant super-block, eight 32-element blocks): the block stages
// every column's eight activation blocks (288 bytes a column) in shared memory, each lane
// loads its share of its row's weights for the step into registers (once), and multiplies
// them by every column from shared memory with int8 dot products (dot4: dp4a / sdot4); the
// lanes at one position of the warp's R rows read the same activation words (a broadcast),
// so one shared load serves R rows. Scales are applied per block as the decode matvecs
// apply them (mv_dot.h / mv_dot_b32.h, whose per-type products this reuses): integer sums
// within a block, then f32. At the end the L lanes of a row are summed by shuffles.
// mmq_mma_q4_K / mmq_mma_q6_K (below) are the same launches on int8 matrix cores.
//   Q4_K: 4 lanes per row (R = 8), Q5_K / Q6_K: 8 lanes (R = 4), the 32-element types one
//   lane per block (8 lanes, R = 4).
// NC: the column capacity (8, 16, 32 or 64), ncols <= NC used. grid (ceil(M / (8 R)), 1,
// splits): split z takes K steps [z per, (z + 1) per) and writes Y + z ncols M (the
// launcher's partial buffer when splits > 1, summed by mmq_ksum in a fixed order).
#include "common.h"
#include "mv_dot.h"
#include "mv_dot_b32.h"

#define MMQ_THREADS 256
#define MMQ_XW 72  // 32-bit words of one column's activation per K step (8 blocks of 36 bytes)

// Stage columns 0 .. ncols - 1 of K step s (blocks 8 s .. 8 s + nblk - 1) into xs, as
// [column][72 words]; the words of blocks past nblk are left as they are (never read).
template <int NC>
DEV void mmq_stage(u32* xs, const block_q8_1* X, int kb, int s, int nblk, int ncols) {
    const int nw = nblk * 9;
    for (int i = tid_x(); i < ncols * MMQ_XW; i += MMQ_THREADS) {
        const int c = i / MMQ_XW, w = i - c * MMQ_XW;
        if (w < nw) xs[i] = ((const u32*)(X + (u64)c * kb + 8 * s))[w];
    }
}

// Sum a row's L lanes (xor within the aligned group of L lanes) and store column c's
// result from the group's first lane.
template <int NC, int L>
DEV void mmq_store(float* Y, const float* acc, int M, int row, int ncols) {
    const int lane = tid_x() & 31;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        float v = acc[c];
#pragma unroll
        for (int m = 1; m < L; m <<= 1) v += shfl_xor(v, m);
        if (c < ncols && (lane & (L - 1)) == 0 && row < M) Y[(u64)c * M + row] = v;
    }
}

// The split's K steps [s0, s1) of n steps in all.
DEV void mmq_range(int n, int per, int* s0, int* s1) {
    *s0 = (int)bid_z() * per;
    *s1 = *s0 + per < n ? *s0 + per : n;
}

// ---- Q4_K: 4 lanes per row (mv_dot.h's lane = (p, h) within a super-block) ----
// The column loop of q4k_dot_sb without its early exit (a loop with a break of 16+
// columns is not unrolled by clang for gfx11, which would put acc in scratch memory).
template <int NC>
DEV void mmq_q4k_cols(const u32x4& hd, const u32x4& q0, const u32x4& q1, const block_q8_1* xa, bool ok, int ncols, float* acc) {
    Q4K_TERMS(hd, q0, q1)
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col < ncols) {
            kact a;
            k_act_load((const block_q8_1*)((const u8*)xa + col * MMQ_XW * 4), h, a);
            q4k_act_dot<NC>(sc, mn, d, dmin, w0, w1, a, ok, acc[col]);
        }
    }
}

template <int NC>
DEV void mmq_q4k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XW];
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1;
    const int row = bid_x() * 64 + (tid_x() >> 5) * 8 + (lane >> 2);
    const bool ok = row < M;
    const int nsb = K / 256, kb = K / 32;
    const u8* wr = W + (u64)(ok ? row : 0) * nsb * 144;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    int s0, s1;
    mmq_range(nsb, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        u32x4 hd = {0, 0, 0, 0}, q0 = {0, 0, 0, 0}, q1 = {0, 0, 0, 0};
        if (ok) q4k_load_sb(wr + (u64)s * 144, p, h, hd, q0, q1);
        sync();
        mmq_stage<NC>(xs, X, kb, s, 8, ncols);
        sync();
        mmq_q4k_cols<NC>(hd, q0, q1, (const block_q8_1*)xs + 4 * p, ok, ncols, acc);
    }
    mmq_store<NC, 4>(Y + (u64)bid_z() * ncols * M, acc, M, row, ncols);
}

// ---- Q6_K: 8 lanes per row (lane = (hh, lq) within a super-block) ----
// The column loop of q6k_dot_sb without its early exit (see mmq_q4k_cols).
template <int NC>
DEV void mmq_q6k_cols(const u32* A, const u32* B, const u32* H, const u32* S, u32 dbits, int odd, const block_q8_1* xa, bool ok, int ncols, float* acc) {
    Q6K_TERMS(A, B, H, S, dbits, odd)
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col < ncols) {
            q6act a;
            q6k_act_load((const u8*)xa + col * MMQ_XW * 4 + 8 * lq, a);
            q6k_act_dot<NC>(v, sc, d4, a, ok, acc[col]);
        }
    }
}

template <int NC>
DEV void mmq_q6k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XW];
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3;
    const int row = bid_x() * 32 + (tid_x() >> 5) * 4 + (lane >> 3);
    const bool ok = row < M;
    const int nsb = K / 256, kb = K / 32;
    const u8* wr = W + (u64)(ok ? row : 0) * nsb * 210;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    int s0, s1;
    mmq_range(nsb, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        const u8* b = wr + (u64)s * 210;
        const int odd = (int)(((u64)b >> 1) & 1);
        u32 A[3] = {0, 0, 0}, B[3] = {0, 0, 0}, H[3] = {0, 0, 0}, S[3] = {0, 0, 0}, d = 0;
        if (ok) q6k_load_sb(b, hh, lq, A, B, H, S, &d);
        sync();
        mmq_stage<NC>(xs, X, kb, s, 8, ncols);
        sync();
        mmq_q6k_cols<NC>(A, B, H, S, d, odd, (const block_q8_1*)xs + 4 * hh, ok, ncols, acc);
    }
    mmq_store<NC, 8>(Y + (u64)bid_z() * ncols * M, acc, M, row, ncols);
}

// ---- Q5_K: 8 lanes per row (lane j = (c, h): 16 weights of sub-blocks 2c and 2c + 1) ----
template <int NC>
DEV void mmq_q5k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XW];
    const int lane = tid_x() & 31, j = lane & 7, c2 = j >> 1, h = j & 1;
    const int row = bid_x() * 32 + (tid_x() >> 5) * 4 + (lane >> 3);
    const bool ok = row < M;
    const int nsb = K / 256, kb = K / 32;
    const u8* wr = W + (u64)(ok ? row : 0) * nsb * 176;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    int s0, s1;
    mmq_range(nsb, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        u32x4 hd = {0, 0, 0, 0}, q = {0, 0, 0, 0}, qh = {0, 0, 0, 0};
        if (ok) {
            const u8* b = wr + (u64)s * 176;
            hd = *(const u32x4*)b;
            q = *(const u32x4*)(b + 48 + 32 * c2 + 16 * h);
            qh = *(const u32x4*)(b + 16 + 16 * h);
        }
        sync();
        mmq_stage<NC>(xs, X, kb, s, 8, ncols);
        sync();
        const float d = h2f((u16)(hd.x & 0xffff)), dmin = h2f((u16)(hd.x >> 16));
        float sc0, m0, sc1, m1;
        scale_min_k4_r(2 * c2, hd.y, hd.z, hd.w, &sc0, &m0);
        scale_min_k4_r(2 * c2 + 1, hd.y, hd.z, hd.w, &sc1, &m1);
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        const u32 hw[4] = {qh.x, qh.y, qh.z, qh.w};
        int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            lo[i] = (int)((qw[i] & 0x0F0F0F0F) | (((hw[i] >> (2 * c2)) & 0x01010101) << 4));
            hi[i] = (int)(((qw[i] >> 4) & 0x0F0F0F0F) | (((hw[i] >> (2 * c2 + 1)) & 0x01010101) << 4));
        }
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = (const block_q8_1*)xs + col * 8 + 2 * c2;
            const int* a0 = q8qs(xb) + 4 * h;
            const int* a1 = q8qs(xb + 1) + 4 * h;
            int t0 = 0, t1 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                t0 = dot4(lo[i], a0[i], t0);
                t1 = dot4(hi[i], a1[i], t1);
            }
            const float dx = q8k_scale(xb);
            float v = d * dx * (sc0 * (float)t0 + sc1 * (float)t1);
            if (h == 0) v -= dmin * dx * (m0 * q8k_bsum(xb) + m1 * q8k_bsum(xb + 1));
            if (ok) acc[col] += v;
        }
    }
    mmq_store<NC, 8>(Y + (u64)bid_z() * ncols * M, acc, M, row, ncols);
}

// ---- the 32-element types: one lane per block, 8 lanes per row ----
// TYPE as mv_dot_b32.h: 0 = Q4_0, 1 = Q4_1, 2 = Q5_0, 3 = Q5_1, 4 = Q8_0. A lane's block
// as 8 words of signed (or, Q4_1 / Q5_1, unsigned) codes: word i holds elements 4i .. 4i + 3.
template <int TYPE>
DEV void b32_block_codes(const u8* b, int* w, float* d, float* m) {
    *d = h2f(ld_u16(b));
    *m = (TYPE == 1 || TYPE == 3) ? h2f(ld_u16(b + 2)) : 0.0f;
    if (TYPE == 4) {
#pragma unroll
        for (int i = 0; i < 8; ++i) w[i] = (int)ld_u32_a2(b + 2 + 4 * i);
        return;
    }
    const int qoff = TYPE == 0 ? 2 : TYPE == 1 ? 4 : TYPE == 2 ? 6 : 8;
    const u32 H = TYPE == 2 ? ld_u32_a2(b + 2) : TYPE == 3 ? ld_u32_a2(b + 4) : 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 qw = ld_u32_a2(b + qoff + 4 * i);
        u32 lo = qw & 0x0F0F0F0F, hi = (qw >> 4) & 0x0F0F0F0F;
        if (TYPE == 2 || TYPE == 3) {
            lo |= spread4((H >> (4 * i)) & 15);
            hi |= spread4((H >> (16 + 4 * i)) & 15);
        }
        if (TYPE == 0) lo = sub_bytes(lo, 0x08080808u), hi = sub_bytes(hi, 0x08080808u);
        if (TYPE == 2) lo = sub_bytes(lo, 0x10101010u), hi = sub_bytes(hi, 0x10101010u);
        w[i] = (int)lo;
        w[4 + i] = (int)hi;
    }
}

template <int TYPE, int NC>
DEV void mmq_b32(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    constexpr int BB = b32_bytes<TYPE>::BB;
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XW];
    const int lane = tid_x() & 31, j = lane & 7;
    const int row = bid_x() * 32 + (tid_x() >> 5) * 4 + (lane >> 3);
    const int kb = K / 32, nst = (kb + 7) / 8;
    const u8* wr = W + (u64)(row < M ? row : 0) * kb * BB;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; ++c) acc[c] = 0.0f;
    int s0, s1;
    mmq_range(nst, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        const int nblk = kb - 8 * s < 8 ? kb - 8 * s : 8;
        const bool ok = row < M && j < nblk;
        int w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        float d = 0.0f, m = 0.0f;
        if (ok) b32_block_codes<TYPE>(wr + (u64)(8 * s + j) * BB, w, &d, &m);
        sync();
        mmq_stage<NC>(xs, X, kb, s, nblk, ncols);
        sync();
        if (!ok) continue;  // no shuffles below: idle lanes may skip the products
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = (const block_q8_1*)xs + col * 8 + j;
            const int* a = q8qs(xb);
            int t = 0;
#pragma unroll
            for (int i = 0; i < 8; ++i) t = dot4(w[i], a[i], t);
            float v = d * h2f(xb->d) * (float)t;
            if (TYPE == 1 || TYPE == 3) v += m * h2f(xb->s);
            acc[col] += v;
        }
    }
    mmq_store<NC, 8>(Y + (u64)bid_z() * ncols * M, acc, M, row, ncols);
}

// ---- int8 matrix cores (NVIDIA sm_80+): mmq_mma_q4_K, mmq_mma_q6_K ----
// The same block (256 threads, 64 rows) and launch as mmq_q4_K, the products on
// mma.sync m16n8k32 (s8 x s8 -> s32): warp w takes rows 16 (w % 4) .. + 15 of the block and
// the 8-column tiles n = w / 4, w / 4 + 2, ... . Per K step (one super-block) and sub-block
// j: A = the 16 rows' 4-bit codes of sub-block j (0..15 as s8), B = 8 columns' int8 codes of
// activation block j; the integer product times the row's 6-bit sub-block scale is summed
// over the super-block in integers, and at its end y += dx (d isum - dmin sum_j m_j bsum_j),
// the min term from the staged block sums by dot2. Fragments (PTX ISA, m16n8k32 .s8): lane
// (g = lane / 4, t = lane % 4) holds A rows g and g + 8 at k 4t .. 4t + 3 and 16 + 4t ..,
// B column g at the same k, C rows g / g + 8 at columns 2t, 2t + 1. Elsewhere (AMD, older
// NVIDIA) the name runs mmq_q4_K's dp4a body.
#if defined(LODE_NV) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
#define MMQ_MMA 1
// c += A (16 x 32, a[0..3]) * B (32 x 8, b[0..1]).
DEV void mma_s8_k32(int* c, const u32* a, const u32* b) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// c += A (16 x 16, a[0..1]: rows g, g + 8 at k 4t ..) * B (16 x 8, b: column g at k 4t ..).
DEV void mma_s8_k16(int* c, const u32* a, u32 b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b));
}
#elif defined(LODE_EMU_MMA)
#define MMQ_MMA 1  // mma_s8_k32 comes from the host emulation's header
#endif

#ifdef MMQ_MMA
#define MMQ_XS 76  // staged column stride in words: the B fragment loads hit 32 banks

// Byte j % 4 of w.
DEV int byte_at(u32 w, int j) { return (int)((w >> (8 * (j & 3))) & 0xff); }

template <int NC>
DEV void mmq_mma_q4k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    constexpr int NT = NC / 8, NTW = (NT + 1) / 2;  // column tiles, per warp
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XS];
    __shared__ float xd[NC];                                  // each column's K-form scale
    __shared__ __attribute__((aligned(16))) u32 xsum[NC * 4]; // block sums (i16) of blocks 2i | 2i + 1
    const int lane = tid_x() & 31, warp = tid_x() >> 5, g = lane >> 2, t = lane & 3, cg = warp >> 2;
    const int r0 = bid_x() * 64 + (warp & 3) * 16 + g, r1 = r0 + 8;
    const int nsb = K / 256, kb = K / 32;
    const u8* w0 = W + (u64)(r0 < M ? r0 : 0) * nsb * 144;
    const u8* w1 = W + (u64)(r1 < M ? r1 : 0) * nsb * 144;
    float acc[NTW][4];
#pragma unroll
    for (int i = 0; i < NTW; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    int s0, s1;
    mmq_range(nsb, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        const u8* b0 = w0 + (u64)s * 144;
        const u8* b1 = w1 + (u64)s * 144;
        const u32x4 h0 = *(const u32x4*)b0, h1 = *(const u32x4*)b1;
        u32 q0[8], q1[8];  // chunk c: [2c] = bytes 32c + 4t .., [2c + 1] = bytes 32c + 16 + 4t ..
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            q0[2 * c] = ld_u32(b0 + 16 + 32 * c + 4 * t);
            q0[2 * c + 1] = ld_u32(b0 + 32 + 32 * c + 4 * t);
            q1[2 * c] = ld_u32(b1 + 16 + 32 * c + 4 * t);
            q1[2 * c + 1] = ld_u32(b1 + 32 + 32 * c + 4 * t);
        }
        sync();
        for (int i = tid_x(); i < ncols * MMQ_XW; i += MMQ_THREADS) {
            const int c = i / MMQ_XW, w = i - c * MMQ_XW;
            xs[c * MMQ_XS + w] = ((const u32*)(X + (u64)c * kb + 8 * s))[w];
        }
        for (int c = tid_x(); c < ncols; c += MMQ_THREADS) {
            const u32* xw = (const u32*)(X + (u64)c * kb + 8 * s);
            xd[c] = __builtin_bit_cast(float, (xw[0] & 0xffffu) | (xw[9] << 16));
#pragma unroll
            for (int p = 0; p < 4; ++p) xsum[c * 4 + p] = (xw[18 * p] >> 16) | (xw[18 * p + 9] & 0xffff0000u);
        }
        sync();
        u32 sa0, ma0, sb0, mb0, sa1, ma1, sb1, mb1;  // scale / min bytes of sub-blocks 0-3 (a), 4-7 (b)
        q4k_scales(h0.y, h0.z, h0.w, 0, &sa0, &ma0);
        q4k_scales(h0.y, h0.z, h0.w, 1, &sb0, &mb0);
        q4k_scales(h1.y, h1.z, h1.w, 0, &sa1, &ma1);
        q4k_scales(h1.y, h1.z, h1.w, 1, &sb1, &mb1);
        int isum[NTW][4];
#pragma unroll
        for (int i = 0; i < NTW; ++i) isum[i][0] = isum[i][1] = isum[i][2] = isum[i][3] = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int c = j >> 1, sh = 4 * (j & 1);
            const u32 a[4] = {(q0[2 * c] >> sh) & 0x0F0F0F0Fu, (q1[2 * c] >> sh) & 0x0F0F0F0Fu, (q0[2 * c + 1] >> sh) & 0x0F0F0F0Fu,
                              (q1[2 * c + 1] >> sh) & 0x0F0F0F0Fu};
            const int sc0 = byte_at(j < 4 ? sa0 : sb0, j), sc1 = byte_at(j < 4 ? sa1 : sb1, j);
#pragma unroll
            for (int i = 0; i < NTW; ++i) {
                const int n = 2 * i + cg;
                if (n < NT && 8 * n < ncols) {
                    const u32* xc = xs + (8 * n + g) * MMQ_XS + 9 * j + 1 + t;
                    const u32 b[2] = {xc[0], xc[4]};
                    int c4[4] = {0, 0, 0, 0};
                    mma_s8_k32(c4, a, b);
                    isum[i][0] += sc0 * c4[0];
                    isum[i][1] += sc0 * c4[1];
                    isum[i][2] += sc1 * c4[2];
                    isum[i][3] += sc1 * c4[3];
                }
            }
        }
        const float d0 = h2f((u16)(h0.x & 0xffff)), dm0 = h2f((u16)(h0.x >> 16));
        const float d1 = h2f((u16)(h1.x & 0xffff)), dm1 = h2f((u16)(h1.x >> 16));
#pragma unroll
        for (int i = 0; i < NTW; ++i) {
            const int n = 2 * i + cg;
            if (n < NT && 8 * n < ncols) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = 8 * n + 2 * t + e;
                    const u32x4 ps = *(const u32x4*)(xsum + col * 4);
                    const int m0 = dot2_hi(ps.w, mb0, dot2_lo(ps.z, mb0, dot2_hi(ps.y, ma0, dot2_lo(ps.x, ma0, 0))));
                    const int m1 = dot2_hi(ps.w, mb1, dot2_lo(ps.z, mb1, dot2_hi(ps.y, ma1, dot2_lo(ps.x, ma1, 0))));
                    const float dx = xd[col];
                    acc[i][e] += dx * (d0 * (float)isum[i][e] - dm0 * (float)m0);
                    acc[i][2 + e] += dx * (d1 * (float)isum[i][2 + e] - dm1 * (float)m1);
                }
            }
        }
    }
    float* Yz = Y + (u64)bid_z() * ncols * M;
#pragma unroll
    for (int i = 0; i < NTW; ++i) {
        const int n = 2 * i + cg;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * n + 2 * t + e;
            if (n < NT && col < ncols) {
                if (r0 < M) Yz[(u64)col * M + r0] = acc[i][e];
                if (r1 < M) Yz[(u64)col * M + r1] = acc[i][2 + e];
            }
        }
    }
}

// ---- mmq_mma_q6_K: as mmq_q6_K's block (256 threads, 32 rows); warp w takes rows
// 16 (w % 2) .. + 15 and the column tiles n = w / 2, w / 2 + 4, ...; one m16n8k16 product
// per 16-element scale group gi (A: the rows' codes q - 32 as s8; B: half gi % 2 of
// activation block gi / 2), times the group's signed 8-bit scale, summed in integers over
// the super-block; y += dx d isum at its end.
template <int NC>
DEV void mmq_mma_q6k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    constexpr int NT = NC / 8, NTW = (NT + 3) / 4;
    __shared__ __attribute__((aligned(16))) u32 xs[NC * MMQ_XS];
    __shared__ float xd[NC];
    const int lane = tid_x() & 31, warp = tid_x() >> 5, g = lane >> 2, t = lane & 3, cg = warp >> 1;
    const int r0 = bid_x() * 32 + (warp & 1) * 16 + g, r1 = r0 + 8;
    const int nsb = K / 256, kb = K / 32;
    const u8* w0 = W + (u64)(r0 < M ? r0 : 0) * nsb * 210;
    const u8* w1 = W + (u64)(r1 < M ? r1 : 0) * nsb * 210;
    float acc[NTW][4];
#pragma unroll
    for (int i = 0; i < NTW; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
    int s0, s1;
    mmq_range(nsb, per, &s0, &s1);
    for (int s = s0; s < s1; ++s) {
        const u8* b[2] = {w0 + (u64)s * 210, w1 + (u64)s * 210};
        // Per row: ql words [h][q & 1][gi & 1] at 64h + 32(q & 1) + 16(gi & 1) + 4t, qh words
        // [h][gi & 1] at 128 + 32h + 16(gi & 1) + 4t, the 16 scales, d (2-byte aligned).
        u32 ql[2][8], qh[2][4], sc[2][4];
        float dr[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
#pragma unroll
            for (int i = 0; i < 8; ++i) ql[r][i] = ld_u32_a2(b[r] + 64 * (i >> 2) + 32 * ((i >> 1) & 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; ++i) qh[r][i] = ld_u32_a2(b[r] + 128 + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
#pragma unroll
            for (int i = 0; i < 4; ++i) sc[r][i] = ld_u32_a2(b[r] + 192 + 4 * i);
            dr[r] = h2f(ld_u16(b[r] + 208));
        }
        sync();
        for (int i = tid_x(); i < ncols * MMQ_XW; i += MMQ_THREADS) {
            const int c = i / MMQ_XW, w = i - c * MMQ_XW;
            xs[c * MMQ_XS + w] = ((const u32*)(X + (u64)c * kb + 8 * s))[w];
        }
        for (int c = tid_x(); c < ncols; c += MMQ_THREADS) {
            const u32* xw = (const u32*)(X + (u64)c * kb + 8 * s);
            xd[c] = __builtin_bit_cast(float, (xw[0] & 0xffffu) | (xw[9] << 16));
        }
        sync();
        int isum[NTW][4];
#pragma unroll
        for (int i = 0; i < NTW; ++i) isum[i][0] = isum[i][1] = isum[i][2] = isum[i][3] = 0;
#pragma unroll
        for (int gi = 0; gi < 16; ++gi) {
            const int h = gi >> 3, q = (gi >> 1) & 3, lo = gi & 1;
            u32 a[2];
            int scr[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const u32 nib = (ql[r][4 * h + 2 * (q & 1) + lo] >> (4 * (q >> 1))) & 0x0F0F0F0Fu;
                const u32 hi = ((qh[r][2 * h + lo] >> (2 * q)) & 0x03030303u) << 4;
                a[r] = sub_bytes(nib | hi, 0x20202020u);
                scr[r] = (int)(signed char)byte_at(sc[r][gi >> 2], gi);
            }
#pragma unroll
            for (int i = 0; i < NTW; ++i) {
                const int n = 4 * i + cg;
                if (n < NT && 8 * n < ncols) {
                    const u32 bw = xs[(8 * n + g) * MMQ_XS + 9 * (gi >> 1) + 1 + 4 * lo + t];
                    int c4[4] = {0, 0, 0, 0};
                    mma_s8_k16(c4, a, bw);
                    isum[i][0] += scr[0] * c4[0];
                    isum[i][1] += scr[0] * c4[1];
                    isum[i][2] += scr[1] * c4[2];
                    isum[i][3] += scr[1] * c4[3];
                }
            }
        }
#pragma unroll
        for (int i = 0; i < NTW; ++i) {
            const int n = 4 * i + cg;
            if (n < NT && 8 * n < ncols) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const float dx = xd[8 * n + 2 * t + e];
                    acc[i][e] += dx * dr[0] * (float)isum[i][e];
                    acc[i][2 + e] += dx * dr[1] * (float)isum[i][2 + e];
                }
            }
        }
    }
    float* Yz = Y + (u64)bid_z() * ncols * M;
#pragma unroll
    for (int i = 0; i < NTW; ++i) {
        const int n = 4 * i + cg;
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int col = 8 * n + 2 * t + e;
            if (n < NT && col < ncols) {
                if (r0 < M) Yz[(u64)col * M + r0] = acc[i][e];
                if (r1 < M) Yz[(u64)col * M + r1] = acc[i][2 + e];
            }
        }
    }
}
#else
template <int NC>
DEV void mmq_mma_q4k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    mmq_q4k<NC>(W, X, Y, M, K, ncols, per);
}
template <int NC>
DEV void mmq_mma_q6k(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) {
    mmq_q6k<NC>(W, X, Y, M, K, ncols, per);
}
#endif

// Every kernel: (W, X, Y, M, K, ncols, per); MMQ_FOUR(NAME, BODY) defines NAME_c8 .. NAME_c64.
#define MMQ_ONE(NAME, BODY, NC) \
    KERNEL LAUNCH_BOUNDS(256) void NAME(const u8* W, const block_q8_1* X, float* Y, int M, int K, int ncols, int per) { pdl_entry(); \
        BODY<NC>(W, X, Y, M, K, ncols, per); \
    }
#define MMQ_FOUR(NAME, BODY) \
    MMQ_ONE(NAME##_c8, BODY, 8) \
    MMQ_ONE(NAME##_c16, BODY, 16) \
    MMQ_ONE(NAME##_c32, BODY, 32) \
    MMQ_ONE(NAME##_c64, BODY, 64)

template <int NC> DEV void mmq_q4_0_body(const u8* W, const block_q8_1* X, float* Y, int M, int K, int n, int per) { mmq_b32<0, NC>(W, X, Y, M, K, n, per); }
template <int NC> DEV void mmq_q4_1_body(const u8* W, const block_q8_1* X, float* Y, int M, int K, int n, int per) { mmq_b32<1, NC>(W, X, Y, M, K, n, per); }
template <int NC> DEV void mmq_q5_0_body(const u8* W, const block_q8_1* X, float* Y, int M, int K, int n, int per) { mmq_b32<2, NC>(W, X, Y, M, K, n, per); }
template <int NC> DEV void mmq_q5_1_body(const u8* W, const block_q8_1* X, float* Y, int M, int K, int n, int per) { mmq_b32<3, NC>(W, X, Y, M, K, n, per); }
template <int NC> DEV void mmq_q8_0_body(const u8* W, const block_q8_1* X, float* Y, int M, int K, int n, int per) { mmq_b32<4, NC>(W, X, Y, M, K, n, per); }

MMQ_FOUR(mmq_q4_K, mmq_q4k)
MMQ_FOUR(mmq_mma_q4_K, mmq_mma_q4k)
MMQ_FOUR(mmq_q5_K, mmq_q5k)
MMQ_FOUR(mmq_q6_K, mmq_q6k)
MMQ_FOUR(mmq_mma_q6_K, mmq_mma_q6k)
MMQ_FOUR(mmq_q4_0, mmq_q4_0_body)
MMQ_FOUR(mmq_q4_1, mmq_q4_1_body)
MMQ_FOUR(mmq_q5_0, mmq_q5_0_body)
MMQ_FOUR(mmq_q5_1, mmq_q5_1_body)
MMQ_FOUR(mmq_q8_0, mmq_q8_0_body)

// Y[i] = sum over z < nsplit of P[z nm + i], in order z = 0, 1, ... (nm = ncols M).
// grid ceil(nm / 256), block 256.
KERNEL LAUNCH_BOUNDS(256) void mmq_ksum(const float* P, float* Y, int nsplit, int nm) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i >= nm) return;
    float v = 0.0f;
    for (int z = 0; z < nsplit; ++z) v += P[(u64)z * nm + i];
    Y[i] = v;
}
