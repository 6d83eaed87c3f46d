// Prefill through the vendor BLAS (`runtime/src/backend/gpu/prefill_blas.rs`): quantized
// weight rows -> a transient f16 slab, and f32 activations -> the f16 operand the BLAS
// GEMM reads.
//
// dequant_f16_<type>(W, Y, row0, rows, K): Y[r][k] = f16(dequantize(W row row0 + r)[k])
//   for r < rows, k < K. W: the weight's canonical device layout (stored GGUF blocks, or
//   row64 tiles for Q4_K / Q6_K); Y: [rows, K] f16 row-major. The f32 value is computed
//   with the CPU's operations in the CPU's order (`quant::dequantize`; no fused
//   multiply-add), then rounded to nearest even: the slab is bit-exact with the CPU's
//   dequantization rounded to f16 (selftest `dequant_*`). K is whole blocks of the type.
//   One thread per 16 consecutive elements of a row; grid ceil(rows K / 16 / 256), block
//   256; rows K / 16 < 2^31 (the slab is bounded).
//
// act_f16_<form>(x, y, k): the prefill GEMM's f16 activation operand, rounded exactly as
//   the matrix-core GEMM (`gemm.hip`) rounds what it stages: the quantized form's values
//   (code x scale, as `quantize.hip`'s dq kernels compute them) then f2h; or plain f2h of
//   the f32 activations (`LODE_PREFILL_ACT=f16`).
#include "common.h"
#include "dequant_low.h"

// mul_rn / add_rn / sub_rn (common.h): f32 products and sums the compiler must not fuse
// into an FMA (the CPU rounds each).

DEV float f16_at(const u8* p) { return h2f((u16)((u32)p[0] | ((u32)p[1] << 8))); }
DEV u32 u32_at(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24); }

// Q4_K / Q5_K sub-block j's 6-bit scale and min from the 12 packed bytes.
DEV void scale_min(const u8* s, int j, u32* sc, u32* mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// 32-element types: elements [k0, k0 + 16) of a row; h = which half of the block.
// q4/q5 nibbles: element e < 16 is the low nibble of byte e, e >= 16 the high nibble of
// byte e - 16; Q5's fifth bit of element e is bit e of qh.
template <int BB, int QS, int QH, bool MIN, int OFF>
DEV void dq_q32(const u8* W, int row, int K, int k0, float* y) {
    const u8* b = W + ((u64)row * (K / 32) + k0 / 32) * BB;
    const int h = (k0 >> 4) & 1;
    const float d = f16_at(b);
    const float m = MIN ? f16_at(b + 2) : 0.0f;
    const u32 qh = QH ? u32_at(b + QH) : 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const u32 byte = b[QS + i];
        u32 q = h ? byte >> 4 : byte & 15;
        if (QH) q |= ((qh >> (16 * h + i)) & 1) << 4;
        y[i] = MIN ? add_rn(mul_rn(d, (float)q), m) : mul_rn(d, (float)((int)q - OFF));
    }
}

DEV void dq_q8_0(const u8* W, int row, int K, int k0, float* y) {
    const u8* b = W + ((u64)row * (K / 32) + k0 / 32) * 34;
    const float d = f16_at(b);
    const u8* q = b + 2 + (k0 & 31);
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = mul_rn((float)(int)(i8)q[i], d);
}

// Q4_K / Q5_K: hd = the 16 header bytes (d, dmin, scales); nib(l) = the 4-bit code of
// element l of sub-block j; qh (Q5_K) bit j of byte l is its fifth bit.
DEV void dq_kq_out(const u8* hd, int j, const u32* q, float* y) {
    const float d = f16_at(hd), dmin = f16_at(hd + 2);
    u32 sc, mn;
    scale_min(hd + 4, j, &sc, &mn);
    const float d1 = mul_rn(d, (float)sc), m1 = mul_rn(dmin, (float)mn);
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = sub_rn(mul_rn(d1, (float)q[i]), m1);
}

template <bool Q5>
DEV void dq_qk(const u8* W, int row, int K, int k0, float* y) {
    const u8* b = W + ((u64)row * (K / 256) + k0 / 256) * (Q5 ? 176 : 144);
    const int e0 = k0 & 255, j = e0 >> 5, c = e0 >> 6, l0 = e0 & 31;
    const u8* qs = b + (Q5 ? 48 : 16) + 32 * c + l0;
    u32 q[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        q[i] = (j & 1) ? qs[i] >> 4 : qs[i] & 15;
        if (Q5) q[i] |= ((b[16 + l0 + i] >> j) & 1) << 4;
    }
    dq_kq_out(b, j, q, y);
}

DEV void dq_q4k_r64(const u8* W, int row, int K, int k0, float* y) {
    const int nsb = K / 256, lane = row & 63;
    const u8* t = W + ((u64)(row >> 6) * nsb + k0 / 256) * (64 * 144);
    const int e0 = k0 & 255, j = e0 >> 5, l0 = e0 & 31;
    // Field 1 + j: sub-block j's 32 codes, byte p = element 2p (low) | 2p + 1 (high).
    const u8* f = t + (1 + j) * 1024 + lane * 16 + l0 / 2;
    u32 q[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) q[i] = (f[i >> 1] >> (4 * (i & 1))) & 15;
    dq_kq_out(t + lane * 16, j, q, y);
}

// Q6_K: element e = 128 h + 32 qd + l: low 4 bits from ql[64 h + l] (qd 0, 2) or
// ql[64 h + 32 + l] (qd 1, 3), low nibble for qd < 2, high otherwise; bits 4-5 from
// qh[32 h + l] >> 2 qd; value d * scale[e / 16] * (q - 32).
DEV void dq_q6_out(const u8* ql0, const u8* ql1, const u8* qh, int qd, float d, int sc, float* y) {
    const float ds = mul_rn(d, (float)sc);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const u32 lb = (qd & 1) ? ql1[i] : ql0[i];
        const u32 q = ((qd >= 2) ? lb >> 4 : lb & 15) | (((qh[i] >> (2 * qd)) & 3) << 4);
        y[i] = mul_rn(ds, (float)((int)q - 32));
    }
}

DEV void dq_q6k(const u8* W, int row, int K, int k0, float* y) {
    const u8* b = W + ((u64)row * (K / 256) + k0 / 256) * 210;
    const int e0 = k0 & 255, h = e0 >> 7, qd = (e0 >> 5) & 3, l0 = e0 & 31;
    const u8* ql = b + 64 * h + l0;
    dq_q6_out(ql, ql + 32, b + 128 + 32 * h + l0, qd, f16_at(b + 208), (int)(i8)b[192 + e0 / 16], y);
}

DEV void dq_q6k_r64(const u8* W, int row, int K, int k0, float* y) {
    const int nsb = K / 256, lane = row & 63;
    const u8* t = W + ((u64)(row >> 6) * nsb + k0 / 256) * (64 * 210);
    const int e0 = k0 & 255, h = e0 >> 7, qd = (e0 >> 5) & 3, l0 = e0 & 31, s = e0 / 16;
    // d plane (64 x f16), scale plane [8][64][2 x i8], then per half three 32-byte fields
    // (ql[64h..], ql[64h + 32..], qh[32h..]), field-major over the 64 lanes.
    const u8* raw = t + 128 + 1024;
    const u8* ql0 = raw + ((3 * h + 0) * 64 + lane) * 32 + l0;
    const u8* ql1 = raw + ((3 * h + 1) * 64 + lane) * 32 + l0;
    const u8* qh = raw + ((3 * h + 2) * 64 + lane) * 32 + l0;
    const int sc = (int)(i8)t[128 + ((s >> 1) * 64 + lane) * 2 + (s & 1)];
    dq_q6_out(ql0, ql1, qh, qd, f16_at(t + lane * 2), sc, y);
}

// The low-bit types (dequant_low.h) element by element.
template <float (*F)(const u8*, int), int BB, int QK>
DEV void dq_elems(const u8* W, int row, int K, int k0, float* y) {
    const u8* r = W + (u64)row * (K / QK) * BB;
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = F(r, k0 + i);
}

// The grid types: 16 elements of one sub-block half, the sub-block decoded once.
template <int G>
DEV void dq_grid16(const u8* W, int row, int K, int k0, float* y) {
    const u8* b = W + ((u64)row * (K / 256) + k0 / 256) * grid_bb<G>::v;
    const int i0 = k0 & 255;
    gsub s;
    grid_sub<G>(b, i0 >> 5, s);
    const float d = grid_d<G>(b);
#pragma unroll
    for (int i = 0; i < 16; ++i) y[i] = grid_value<G>(s, d, (i0 & 31) + i);
}

enum { D_Q4_0, D_Q4_1, D_Q5_0, D_Q5_1, D_Q8_0, D_Q4_K, D_Q5_K, D_Q6_K, D_Q4_K_R64, D_Q6_K_R64, D_Q2_K, D_Q3_K, D_IQ4_NL, D_IQ4_XS, D_MXFP4, D_GRID0 };

template <int T>
DEV void dq16(const u8* W, int row, int K, int k0, float* y) {
    if (T == D_Q4_0) dq_q32<18, 2, 0, false, 8>(W, row, K, k0, y);
    if (T == D_Q4_1) dq_q32<20, 4, 0, true, 0>(W, row, K, k0, y);
    if (T == D_Q5_0) dq_q32<22, 6, 2, false, 16>(W, row, K, k0, y);
    if (T == D_Q5_1) dq_q32<24, 8, 4, true, 0>(W, row, K, k0, y);
    if (T == D_Q8_0) dq_q8_0(W, row, K, k0, y);
    if (T == D_Q4_K) dq_qk<false>(W, row, K, k0, y);
    if (T == D_Q5_K) dq_qk<true>(W, row, K, k0, y);
    if (T == D_Q6_K) dq_q6k(W, row, K, k0, y);
    if (T == D_Q4_K_R64) dq_q4k_r64(W, row, K, k0, y);
    if (T == D_Q6_K_R64) dq_q6k_r64(W, row, K, k0, y);
    if (T == D_Q2_K) dq_elems<dqe_q2_K, 84, 256>(W, row, K, k0, y);
    if (T == D_Q3_K) dq_elems<dqe_q3_K, 110, 256>(W, row, K, k0, y);
    if (T == D_IQ4_NL) dq_elems<dqe_iq4_nl, 18, 32>(W, row, K, k0, y);
    if (T == D_IQ4_XS) dq_elems<dqe_iq4_xs, 136, 256>(W, row, K, k0, y);
    if (T == D_MXFP4) dq_elems<dqe_mxfp4, 17, 32>(W, row, K, k0, y);
    if (T >= D_GRID0) dq_grid16<(T >= D_GRID0 ? T - D_GRID0 : 0)>(W, row, K, k0, y);
}

struct __attribute__((aligned(16))) dq_u4 { u32 x, y, z, w; };
DEV u32 h2pack(float a, float b) { return (u32)f2h(a) | ((u32)f2h(b) << 16); }

template <int T>
DEV void dequant_body(const u8* W, u16* Y, int row0, int rows, int K) {
    const u32 per_row = (u32)K / 16;
    const u32 g = bid_x() * 256 + tid_x();
    if (g >= (u32)rows * per_row) return;
    const u32 r = g / per_row, k0 = (g - r * per_row) * 16;
    float y[16];
    dq16<T>(W, row0 + (int)r, K, (int)k0, y);
    dq_u4* o = (dq_u4*)(Y + (u64)r * K + k0);
    dq_u4 a, b;
    a.x = h2pack(y[0], y[1]), a.y = h2pack(y[2], y[3]), a.z = h2pack(y[4], y[5]), a.w = h2pack(y[6], y[7]);
    b.x = h2pack(y[8], y[9]), b.y = h2pack(y[10], y[11]), b.z = h2pack(y[12], y[13]), b.w = h2pack(y[14], y[15]);
    o[0] = a;
    o[1] = b;
}

KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q4_0(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q4_0>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q4_1(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q4_1>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q5_0(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q5_0>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q5_1(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q5_1>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q8_0(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q8_0>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q4_K(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q4_K>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q5_K(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q5_K>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q6_K(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q6_K>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q4_K_r64(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q4_K_R64>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q6_K_r64(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q6_K_R64>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q2_K(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q2_K>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_q3_K(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_Q3_K>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq4_nl(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_IQ4_NL>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq4_xs(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_IQ4_XS>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_mxfp4(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_MXFP4>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq3_s(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 0>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq3_xxs(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 1>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq2_xxs(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 2>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq2_xs(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 3>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq2_s(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 4>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq1_s(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 5>(W, Y, row0, rows, K); }
KERNEL LAUNCH_BOUNDS(256) void dequant_f16_iq1_m(const u8* W, u16* Y, int row0, int rows, int K) { dequant_body<D_GRID0 + 6>(W, Y, row0, rows, K); }

// y = f16(the q8_1 form's value of x) = f2h(code x f16 d), as quantize_dq_q8_1 + the GEMM's
// staging. x: [n_rows, k] f32; y: [n_rows, k] f16; k % 32 == 0. grid (ceil(k / 256), n_rows),
// block 256.
KERNEL void act_f16_q8_1(const float* x, u16* y, int k) {
    const int i = bid_x() * 256 + tid_x(), lane = tid_x() & 31;
    if (i - lane >= k) return; // whole warp past the end
    const u64 at = (u64)bid_y() * k + i;
    const float v = x[at];
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    y[at] = f2h((float)c * h2f(f2h(d)));
}

// y = f16(the K form's value of x) = f2h(code x f32 d), as quantize_dq_q8_k + the GEMM's
// staging. x: [n_rows, k] f32, k % 256 == 0; grid (ceil(k / 2048), n_rows), block 256.
KERNEL void act_f16_q8_k(const float* x, u16* y, int k) {
    const int sb = bid_x() * 8 + (tid_x() >> 5), lane = tid_x() & 31;
    if (sb >= k / 256) return;
    const u64 at = (u64)bid_y() * k + sb * 256 + 8 * lane;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = x[at + j];
    int c[8];
    const float d = q8k_warp_codes(v, c);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[at + j] = f2h((float)c[j] * d);
}

// y[i] = f16(x[i]) for i < n (unquantized activations). grid ceil(n / 256), block 256.
KERNEL void act_f16_f32(const float* x, u16* y, int n) {
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = f2h(x[i]);
}
