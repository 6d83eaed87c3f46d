// Elementwise ops, gated activations, embedding rows (every weight type), f32 -> f16 rows.
#include "common.h"
#include "dequant_low.h"

// All flat ops: grid (ceil(n / 256)), block 256.
KERNEL void add_f32(const float* a, const float* b, float* y, int n) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = a[i] + b[i];
}

KERNEL void mul_f32(const float* a, const float* b, float* y, int n) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = a[i] * b[i];
}

KERNEL void scale_f32(const float* x, float* y, int n, float s) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = x[i] * s;
}

// x[t][i] += b[i] for x [total / n, n]  (projection biases)
KERNEL void add_bias_f32(float* x, const float* b, int n, int total) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < total) x[i] += b[i % n];
}

// y = silu(g) * u  (SwiGLU)
KERNEL void swiglu_f32(const float* g, const float* u, float* y, int n) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = silu_f(g[i]) * u[i];
}

// y = gelu(g) * u  (GeGLU, Gemma; GELU rounded through f16 as the CPU backend)
KERNEL void geglu_f32(const float* g, const float* u, float* y, int n) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) y[i] = gelu_f16r(g[i]) * u[i];
}

// y = act(g) * u and its q8_1 blocks (32 consecutive elements each) for the down
// projection. act: 0 = SiLU, 1 = GELU-tanh. grid (ceil(n / 256)), block 256; n % 32 == 0.
// kfmt = 1: q gets the K form (quantize.hip) instead (n % 256 == 0: one super-block per block).
KERNEL void glu_q8_f32(const float* g, const float* u, float* y, block_q8_1* q, int n, int act, int kfmt) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), lane = tid_x() & 31;
    if (i - lane >= n) return; // whole warp past the end (n % 32 == 0; block-uniform if kfmt)
    const float a = g[i];
    const float v = (act ? gelu_f16r(a) : silu_f(a)) * u[i];
    y[i] = v;
    if (kfmt) {
        sync(); // the block's 256 values are written
        q8k_row_store(y + bid_x() * 256, q + bid_x() * 8, 256, 256);
        return;
    }
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    const float qsum = warp_sum((float)c);
    block_q8_1* b = q + i / 32;
    b->qs[lane] = (i8)c;
    if (lane == 0) {
        b->d = f2h(d);
        b->s = f2h(d * qsum);
    }
}

// K and V rows of the new tokens into the f16 caches in one launch:
// kc[rows[r]][i] = f16(k[r][i]) for i < nk; vc likewise for i < nv.
// grid (ceil(max(nk, nv) / 256), n_rows), block 256.
KERNEL void kv_store_f16(const float* k, const float* v, u16* kc, u16* vc, int nk, int nv, const int* rows) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), r = bid_y();
    const u64 p = (u64)rows[r];
    if (i < nk) kc[p * nk + i] = f2h(k[(u64)r * nk + i]);
    if (i < nv) vc[p * nv + i] = f2h(v[(u64)r * nv + i]);
}

// A batched decode step's K and V rows, each into its own sequence's caches (kv[2r],
// kv[2r + 1]) at slot pos[r]. grid (ceil(max(nk, nv) / 256), n_rows), block 256.
KERNEL void kv_store_f16_rows(const float* k, const float* v, const u64* kv, int nk, int nv, const int* pos) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), r = bid_y();
    const u64 p = (u64)pos[r];
    u16* kc = (u16*)kv[2 * r];
    u16* vc = (u16*)kv[2 * r + 1];
    if (i < nk) kc[p * nk + i] = f2h(k[(u64)r * nk + i]);
    if (i < nv) vc[p * nv + i] = f2h(v[(u64)r * nv + i]);
}

// y = tanh(x / cap) * cap  (final logit soft-capping)
KERNEL void softcap_f32(const float* x, float* y, int n, float cap) { pdl_entry();
    const int i = bid_x() * 256 + tid_x();
    if (i < n) {
        y[i] = tanh_f(x[i] / cap) * cap;
    }
}

// dst[rows[r] * dst_stride + i] = f16(src[r * n + i]) for r < n_rows, i < n.
// The KV-cache write (rows = the tokens' positions, read on the device).
// grid (ceil(n / 256), n_rows), block 256.
KERNEL void f32_to_f16_rows(const float* src, u16* dst, int n, int dst_stride, const int* rows) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), r = bid_y();
    if (i < n) dst[(u64)rows[r] * dst_stride + i] = f2h(src[(u64)r * n + i]);
}

// ---- dequantize one element e of a row, for every stored type ----

DEV float dq_q4_K(const u8* row, int e) {
    const u8* b = row + (u64)(e / 256) * 144;
    const int i = e % 256, c = i / 64, j = i / 32, l = i % 32;
    const u8* s = b + 4;
    int sc, m;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const u8 q = b[16 + 32 * c + l];
    const int code = (j & 1) ? (q >> 4) : (q & 15);
    return h2f(ld_u16(b)) * sc * code - h2f(ld_u16(b + 2)) * m;
}

DEV float dq_q5_K(const u8* row, int e) {
    const u8* b = row + (u64)(e / 256) * 176;
    const int i = e % 256, c = i / 64, j = i / 32, l = i % 32;
    const u8* s = b + 4;
    int sc, m;
    if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
    } else {
        sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
    const u8 q = b[48 + 32 * c + l];
    int code = (j & 1) ? (q >> 4) : (q & 15);
    code += ((b[16 + l] >> j) & 1) << 4;
    return h2f(ld_u16(b)) * sc * code - h2f(ld_u16(b + 2)) * m;
}

DEV float dq_q6_K(const u8* row, int e) {
    const u8* b = row + (u64)(e / 256) * 210;
    const int i = e % 256, h = i / 128, g = (i % 128) / 32, l = i % 32;
    const u8* L = b + 64 * h;
    const u8* H = b + 128 + 32 * h;
    const int lo = (g & 1 ? L[l + 32] : L[l]) >> (g & 2 ? 4 : 0) & 15;
    const int hi = (H[l] >> (2 * g)) & 3;
    const int q = (lo | (hi << 4)) - 32;
    return h2f(ld_u16(b + 208)) * (float)((const i8*)(b + 192))[i / 16] * q;
}

DEV float dq_b32(int type, const u8* row, int e) {
    const int BB = type == 0 ? 18 : type == 1 ? 20 : type == 2 ? 22 : type == 3 ? 24 : 34;
    const u8* b = row + (u64)(e / 32) * BB;
    const int i = e % 32;
    const float d = h2f(ld_u16(b));
    if (type == 4) return d * ((const i8*)(b + 2))[i];
    const int qoff = type == 0 ? 2 : type == 1 ? 4 : type == 2 ? 6 : 8;
    const u8 byte = b[qoff + (i % 16)];
    int q = i < 16 ? (byte & 15) : (byte >> 4);
    if (type == 2) q |= ((ld_u32_a2(b + 2) >> i) & 1) << 4;
    if (type == 3) q |= ((ld_u32_a2(b + 4) >> i) & 1) << 4;
    if (type == 0) return d * (q - 8);
    if (type == 2) return d * (q - 16);
    return d * q + h2f(ld_u16(b + 2));
}

// y[r][:] = scale * dequant(W[ids[r]][:]); W rows of k elements, row_bytes each.
// grid (n_ids, ceil(k / 256)), block 256: one element per thread, so a row's loads all
// issue at once (one token's embedding was 4 dependent rounds of DRAM latency in one block).
#define GET_ROWS(NAME, EXPR)                                                                             \
    KERNEL void NAME(const u8* W, const int* ids, float* y, int k, int row_bytes, float scale) { pdl_entry();         \
        const int e = bid_y() * 256 + tid_x();                                                           \
        if (e >= k) return;                                                                              \
        const u8* row = W + (u64)ids[bid_x()] * row_bytes;                                               \
        y[(u64)bid_x() * k + e] = scale * (EXPR);                                                        \
    }

GET_ROWS(get_rows_f32, ((const float*)row)[e])
GET_ROWS(get_rows_f16, h2f(((const u16*)row)[e]))
GET_ROWS(get_rows_bf16, bf2f(((const u16*)row)[e]))
GET_ROWS(get_rows_q4_0, dq_b32(0, row, e))
GET_ROWS(get_rows_q4_1, dq_b32(1, row, e))
GET_ROWS(get_rows_q5_0, dq_b32(2, row, e))
GET_ROWS(get_rows_q5_1, dq_b32(3, row, e))
GET_ROWS(get_rows_q8_0, dq_b32(4, row, e))
GET_ROWS(get_rows_q4_K, dq_q4_K(row, e))
GET_ROWS(get_rows_q5_K, dq_q5_K(row, e))
GET_ROWS(get_rows_q6_K, dq_q6_K(row, e))
GET_ROWS(get_rows_q2_K, dqe_q2_K(row, e))
GET_ROWS(get_rows_q3_K, dqe_q3_K(row, e))
GET_ROWS(get_rows_iq4_nl, dqe_iq4_nl(row, e))
GET_ROWS(get_rows_iq4_xs, dqe_iq4_xs(row, e))
GET_ROWS(get_rows_mxfp4, dqe_mxfp4(row, e))
GET_ROWS(get_rows_iq3_s, dqe_grid<0>(row, e))
GET_ROWS(get_rows_iq3_xxs, dqe_grid<1>(row, e))
GET_ROWS(get_rows_iq2_xxs, dqe_grid<2>(row, e))
GET_ROWS(get_rows_iq2_xs, dqe_grid<3>(row, e))
GET_ROWS(get_rows_iq2_s, dqe_grid<4>(row, e))
GET_ROWS(get_rows_iq1_s, dqe_grid<5>(row, e))
GET_ROWS(get_rows_iq1_m, dqe_grid<6>(row, e))

// x = H x for each block of n = 2^lg consecutive values (a quantized KV cache's rotation,
// runtime/src/backend/kv_rot.rs): Sylvester's Walsh-Hadamard butterflies of width 1, 2,
// 4, ... ((a, b) -> (a + b, a - b)), then every value times `scale` (1/sqrt(n), rounded
// once on the host) - the CPU's order, so both give the same bits.
// grid (n_blocks), block (n / 2), n <= 1024.
KERNEL void hadamard_f32(float* x, int lg, float scale) { pdl_entry();
    __shared__ float s[1024];
    const int n = 1 << lg, half = n >> 1, t = tid_x();
    float* b = x + (u64)bid_x() * (u64)n;
    s[t] = b[t];
    s[t + half] = b[t + half];
    sync();
    for (int h = 1; h < n; h <<= 1) {
        const int i = (t / h) * 2 * h + (t % h);
        const float a = s[i], c = s[i + h];
        s[i] = a + c;
        s[i + h] = a - c;
        sync();
    }
    b[t] = s[t] * scale;
    b[t + half] = s[t + half] * scale;
}

