// qwen35's recurrent layers on the device (the gated delta net, `backend/recurrent.rs` has
// the arithmetic and the CPU reference) and the two small ops of its gated attention.
//
// A layer's recurrent core is two launches, with no host round trip (a decode step stays
// replayable as a graph), for one sequence's chunk of tokens or for a batched decode step
// (one token per sequence):
//   delta_conv_k4: the causal depthwise convolution of each channel over its conv state
//     and the chunk's inputs, then SiLU, written in place over the projection (`qkv`), and
//     the state shifted to the chunk's last three inputs;
//   delta_rule_h<hk>: per value head, its state matrix held in registers over the chunk's
//     tokens: the q/k L2 norms, the gates, the delta rule update, the output read and the
//     gated RMS norm (`ssm_norm`, times silu(z)); the state written back once at the end.
//
// States: one sequence's (`conv0`, `ssm0`) or, with a non-null `table`, row s of a batched
// step reads table[2 s] (its conv state) and table[2 s + 1] (its delta-rule state), device
// addresses staged by the host. `per` tokens belong to each state (the whole chunk for one
// sequence, 1 for a batched step); grid.y is the number of states.
#include "common.h"

DEV float sigmoid_f(float x) { return rcp(1.0f + exp_fast(-x)); }
#ifdef LODE_AMD
DEV float log2_fast(float x) { return __builtin_amdgcn_logf(x); }
#else
DEV float log2_fast(float x) {
    float r;
    asm("lg2.approx.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
#endif
// ggml's softplus: x above 20, else ln(1 + e^x).
DEV float softplus_f(float x) { return x > 20.0f ? x : 0.69314718055994531f * log2_fast(1.0f + exp_fast(x)); }

// ---- the causal convolution (4 taps, as every qwen35 file has) ----

// qkv: [n, ch], overwritten by silu(conv); w: [ch][4] taps (oldest input first);
// a conv state: [ch][3], oldest first. grid (ceil(ch / 128), n_states), block 128: one
// thread per channel walks its tokens in order.
KERNEL LAUNCH_BOUNDS(128) void delta_conv_k4(float* qkv, const float* w, float* conv0, const u64* table, int ch, int per) {
    const int c = bid_x() * 128 + tid_x(), s = bid_y();
    if (c >= ch) return;
    float* st = (table ? (float*)table[2 * s] : conv0) + (u64)c * 3;
    const float w0 = w[(u64)c * 4], w1 = w[(u64)c * 4 + 1], w2 = w[(u64)c * 4 + 2], w3 = w[(u64)c * 4 + 3];
    float h0 = st[0], h1 = st[1], h2 = st[2];
    float* x = qkv + (u64)s * per * ch + c;
    for (int t = 0; t < per; ++t) {
        const float h3 = x[(u64)t * ch];
        float acc = h0 * w0;
        acc += h1 * w1;
        acc += h2 * w2;
        acc += h3 * w3;
        x[(u64)t * ch] = silu_f(acc);
        h0 = h1, h1 = h2, h2 = h3;
    }
    st[0] = h0, st[1] = h1, st[2] = h2;
}

// ---- the delta rule ----

// Rows of a head's state per warp at most (8 warps: head_v_dim up to 128).
#define DELTA_ROWS 16
#define DELTA_WARPS 8

// One value head h (grid.x) of one state (grid.y), 8 warps. Lane l holds elements
// l + 32 e (e < K, head_k_dim = 32 K) of rows j = warp + 8 r (r < DELTA_ROWS, j < hv).
// xc: [n, 2 kd + vd] after the convolution (q, k of each key head, then v of each value
// head); z, out: [n, vd]; beta, alpha: [n, nv]; ssm: [nv][hv][hk].
template <int K>
DEV void delta_rule_run(const float* xc, const float* z, const float* beta, const float* alpha, const float* dt_bias, const float* a, const float* norm_w,
                        float* out, float* ssm0, const u64* table, int per, int n_kh, int nv, int hv, float eps) {
    __shared__ float o_s[DELTA_ROWS * DELTA_WARPS];
    const int h = bid_x(), s = bid_y(), lane = tid_x() & 31, warp = tid_x() >> 5;
    const int hk = 32 * K, kd = n_kh * hk, vd = nv * hv, ch = 2 * kd + vd, kh = h % n_kh;
    float* S = (table ? (float*)table[2 * s + 1] : ssm0) + (u64)h * hv * hk;
    float st[DELTA_ROWS][K];
#pragma unroll
    for (int r = 0; r < DELTA_ROWS; ++r) {
        const int j = warp + DELTA_WARPS * r;
#pragma unroll
        for (int e = 0; e < K; ++e) st[r][e] = j < hv ? S[(u64)j * hk + lane + 32 * e] : 0.0f;
    }
    const float scale = rcp(sqrt_f((float)hk));
    const float bias = dt_bias[h], decay_a = a[h];
    for (int i = 0; i < per; ++i) {
        const u64 t = (u64)s * per + i;
        const float* row = xc + t * ch;
        float q[K], k[K], sq = 0.0f, sk = 0.0f;
#pragma unroll
        for (int e = 0; e < K; ++e) {
            q[e] = row[kh * hk + lane + 32 * e];
            k[e] = row[kd + kh * hk + lane + 32 * e];
            sq += q[e] * q[e];
            sk += k[e] * k[e];
        }
        const float iq = scale * rcp(fmax_f(sqrt_f(warp_sum(sq)), eps)), ik = rcp(fmax_f(sqrt_f(warp_sum(sk)), eps));
#pragma unroll
        for (int e = 0; e < K; ++e) q[e] *= iq, k[e] *= ik;
        const float b = sigmoid_f(beta[t * nv + h]);
        const float g = exp_fast(softplus_f(alpha[t * nv + h] + bias) * decay_a);
        const float* v = row + 2 * kd + h * hv;
#pragma unroll
        for (int r = 0; r < DELTA_ROWS; ++r) {
            const int j = warp + DELTA_WARPS * r;
            if (j >= hv) break;
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < K; ++e) st[r][e] *= g, d += st[r][e] * k[e];
            d = (v[j] - warp_sum(d)) * b;
            float o = 0.0f;
#pragma unroll
            for (int e = 0; e < K; ++e) st[r][e] += d * k[e], o += st[r][e] * q[e];
            o = warp_sum(o);
            if (lane == 0) o_s[j] = o;
        }
        sync();
        // The gated RMS norm over the head's hv outputs (every warp sums them all).
        float ss = 0.0f;
        for (int j = lane; j < hv; j += 32) ss += o_s[j] * o_s[j];
        const float rn = rcp(sqrt_f(warp_sum(ss) / (float)hv + eps));
        for (int j = tid_x(); j < hv; j += 32 * DELTA_WARPS) {
            const u64 at = t * vd + (u64)h * hv + j;
            out[at] = o_s[j] * rn * norm_w[j] * silu_f(z[at]);
        }
        sync();
    }
#pragma unroll
    for (int r = 0; r < DELTA_ROWS; ++r) {
        const int j = warp + DELTA_WARPS * r;
        if (j < hv) {
#pragma unroll
            for (int e = 0; e < K; ++e) S[(u64)j * hk + lane + 32 * e] = st[r][e];
        }
    }
}

// grid (nv, n_states), block 256.
#define DELTA_RULE_KERNEL(HK)                                                                                                             \
    KERNEL LAUNCH_BOUNDS(256) void delta_rule_h##HK(const float* xc, const float* z, const float* beta, const float* alpha, const float* dt_bias, \
                                                    const float* a, const float* norm_w, float* out, float* ssm0, const u64* table, int per,       \
                                                    int n_kh, int nv, int hv, float eps) {                                                          \
        delta_rule_run<HK / 32>(xc, z, beta, alpha, dt_bias, a, norm_w, out, ssm0, table, per, n_kh, nv, hv, eps);                                  \
    }
DELTA_RULE_KERNEL(64)
DELTA_RULE_KERNEL(128)

// ---- the gated attention's small ops ----

// Row r of src (2 half values) split: its first half to a[r], its second to b[r].
// grid (ceil(n_rows * half / 256)), block 256.
KERNEL void split_halves_f32(const float* src, float* a, float* b, int n_rows, int half) {
    const int i = bid_x() * 256 + tid_x();
    if (i >= n_rows * half) return;
    const int r = i / half, j = i - r * half;
    a[i] = src[(u64)r * 2 * half + j];
    b[i] = src[(u64)r * 2 * half + half + j];
}

// x[i] *= sigmoid(gate[i]), or with per_row x[r][j] *= sigmoid(gate[r]) over rows of
// row_len. grid (ceil(n / 256)), block 256.
KERNEL void mul_sigmoid_f32(float* x, const float* gate, int n, int row_len, int per_row) {
    const int i = bid_x() * 256 + tid_x();
    if (i >= n) return;
    x[i] *= sigmoid_f(gate[per_row ? i / row_len : i]);
}
