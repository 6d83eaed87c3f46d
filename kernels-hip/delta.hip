// qwen35's recurrent layers on the device (the gated delta net, `backend/recurrent.rs` has
// the arithmetic and the CPU reference) and the two small ops of its gated attention.
//
// A layer's recurrent core is three launches, with no host round trip (a decode step stays
// replayable as a graph), for one sequence's chunk of tokens or for a batched decode step
// (one token per sequence):
//   delta_conv_k4: the causal depthwise convolution of each channel over its conv state
//     and the chunk's inputs, then SiLU, written in place over the projection (`qkv`), and
//     the state shifted to the chunk's last three inputs;
//   delta_rule_h<hk>: per value head and group of 16 state rows (each row evolves on its
//     own: S_j <- g S_j + beta (v_j - g S_j.k) k), the rows held in registers over the
//     chunk's tokens: the q/k L2 norms, the gates, the update and the output read
//     o_j = S_j.q / sqrt(hk), written to `out`;
//   delta_norm: per (token, value head), the gated RMS norm of the head's outputs in
//     place (`ssm_norm`, times silu(z)).
//
// States: one sequence's (`conv0`, `ssm0`) or, with a non-null `table`, row s of a batched
// step reads table[2 s] (its conv state) and table[2 s + 1] (its delta-rule state), device
// addresses staged by the host. `per` tokens belong to each state (the whole chunk for one
// sequence, 1 for a batched step); the states are the grid's last dimension.
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
    // Eight inputs loaded before any is overwritten, so their loads are in flight together.
    for (int t0 = 0; t0 < per; t0 += 8) {
        float in[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) in[u] = t0 + u < per ? x[(u64)(t0 + u) * ch] : 0.0f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (t0 + u >= per) break;
            const float h3 = in[u];
            float acc = h0 * w0;
            acc += h1 * w1;
            acc += h2 * w2;
            acc += h3 * w3;
            x[(u64)(t0 + u) * ch] = silu_f(acc);
            h0 = h1, h1 = h2, h2 = h3;
        }
    }
    st[0] = h0, st[1] = h1, st[2] = h2;
}

// ---- the delta rule ----

// State rows per warp and warps per block: a block holds 16 rows of one value head.
#define DELTA_ROWS 4
#define DELTA_WARPS 4

// Value head h (grid.x), rows 16 grid.y + 4 warp + r (r < DELTA_ROWS, below hv) of one
// state (grid.z); the head reads key head h mod n_kh (qwen35: tiled) or, with grouped,
// h / (nv / n_kh) (qwen3next: value heads grouped by key head). Lane l holds elements
// l + 32 e (e < K, head_k_dim = 32 K) of its rows.
// xc: [n, 2 kd + vd] after the convolution (q, k of each key head, then v of each value
// head); out: [n, vd] (o before the norm); beta, alpha: [n, nv]; ssm: [nv][hv][hk].
template <int K>
DEV void delta_rule_run(const float* xc, const float* beta, const float* alpha, const float* dt_bias, const float* a, float* out, float* ssm0,
                        const u64* table, int per, int n_kh, int nv, int hv, float eps, int grouped) {
    const int h = bid_x(), s = bid_z(), lane = tid_x() & 31, warp = tid_x() >> 5;
    const int j0 = bid_y() * (DELTA_ROWS * DELTA_WARPS) + warp * DELTA_ROWS;
    if (j0 >= hv) return;
    const int hk = 32 * K, kd = n_kh * hk, vd = nv * hv, ch = 2 * kd + vd, kh = grouped ? h / (nv / n_kh) : h % n_kh;
    float* S = (table ? (float*)table[2 * s + 1] : ssm0) + (u64)h * hv * hk;
    float st[DELTA_ROWS][K];
#pragma unroll
    for (int r = 0; r < DELTA_ROWS; ++r) {
#pragma unroll
        for (int e = 0; e < K; ++e) st[r][e] = j0 + r < hv ? S[(u64)(j0 + r) * hk + lane + 32 * e] : 0.0f;
    }
    const float scale = rcp(sqrt_f((float)hk));
    const float bias = dt_bias[h], decay_a = a[h];
    // Token i + 1's operands are loaded while token i is computed (they do not depend on
    // the state), so each step waits on no global load of its own.
    float nq[K], nk[K], nv_[DELTA_ROWS], nb = 0.0f, na = 0.0f;
    auto fetch = [&](int i) {
        const u64 t = (u64)s * per + i;
        const float* row = xc + t * ch;
#pragma unroll
        for (int e = 0; e < K; ++e) nq[e] = row[kh * hk + lane + 32 * e], nk[e] = row[kd + kh * hk + lane + 32 * e];
#pragma unroll
        for (int r = 0; r < DELTA_ROWS; ++r) nv_[r] = j0 + r < hv ? row[2 * kd + h * hv + j0 + r] : 0.0f;
        nb = beta[t * nv + h], na = alpha[t * nv + h];
    };
    fetch(0);
    for (int i = 0; i < per; ++i) {
        const u64 t = (u64)s * per + i;
        float q[K], k[K], v[DELTA_ROWS], sq = 0.0f, sk = 0.0f;
        const float b_in = nb, a_in = na;
#pragma unroll
        for (int e = 0; e < K; ++e) {
            q[e] = nq[e], k[e] = nk[e];
            sq += q[e] * q[e];
            sk += k[e] * k[e];
        }
#pragma unroll
        for (int r = 0; r < DELTA_ROWS; ++r) v[r] = nv_[r];
        if (i + 1 < per) fetch(i + 1);
        const float iq = scale * rcp(fmax_f(sqrt_f(warp_sum(sq)), eps)), ik = rcp(fmax_f(sqrt_f(warp_sum(sk)), eps));
#pragma unroll
        for (int e = 0; e < K; ++e) q[e] *= iq, k[e] *= ik;
        const float b = sigmoid_f(b_in);
        const float g = exp_fast(softplus_f(a_in + bias) * decay_a);
        float o_lane = 0.0f;
#pragma unroll
        for (int r = 0; r < DELTA_ROWS; ++r) {
            if (j0 + r >= hv) break;
            float d = 0.0f;
#pragma unroll
            for (int e = 0; e < K; ++e) st[r][e] *= g, d += st[r][e] * k[e];
            d = (v[r] - warp_sum(d)) * b;
            float o = 0.0f;
#pragma unroll
            for (int e = 0; e < K; ++e) st[r][e] += d * k[e], o += st[r][e] * q[e];
            o = warp_sum(o);
            if (lane == r) o_lane = o;
        }
        if (lane < DELTA_ROWS && j0 + lane < hv) out[t * vd + (u64)h * hv + j0 + lane] = o_lane;
    }
#pragma unroll
    for (int r = 0; r < DELTA_ROWS; ++r) {
        if (j0 + r < hv) {
#pragma unroll
            for (int e = 0; e < K; ++e) S[(u64)(j0 + r) * hk + lane + 32 * e] = st[r][e];
        }
    }
}

// grid (nv, ceil(hv / 16), n_states), block 128.
KERNEL LAUNCH_BOUNDS(128) void delta_rule_h64(const float* xc, const float* beta, const float* alpha, const float* dt_bias, const float* a, float* out,
                                              float* ssm0, const u64* table, int per, int n_kh, int nv, int hv, float eps, int grouped) {
    delta_rule_run<2>(xc, beta, alpha, dt_bias, a, out, ssm0, table, per, n_kh, nv, hv, eps, grouped);
}
KERNEL LAUNCH_BOUNDS(128) void delta_rule_h128(const float* xc, const float* beta, const float* alpha, const float* dt_bias, const float* a, float* out,
                                               float* ssm0, const u64* table, int per, int n_kh, int nv, int hv, float eps, int grouped) {
    delta_rule_run<4>(xc, beta, alpha, dt_bias, a, out, ssm0, table, per, n_kh, nv, hv, eps, grouped);
}

// The gated RMS norm in place: for each of the n_rows = n * nv rows of hv outputs,
// o * rsqrt(mean(o^2) + eps) * norm_w * silu(z) (z: [n, vd], the same layout).
// One warp per row; grid (ceil(n_rows / 4)), block 128.
KERNEL LAUNCH_BOUNDS(128) void delta_norm(float* o, const float* z, const float* norm_w, int n_rows, int hv, float eps) {
    const int r = bid_x() * 4 + (tid_x() >> 5), lane = tid_x() & 31;
    if (r >= n_rows) return;
    float* x = o + (u64)r * hv;
    const float* zr = z + (u64)r * hv;
    float ss = 0.0f;
    for (int j = lane; j < hv; j += 32) ss += x[j] * x[j];
    const float rn = rcp(sqrt_f(warp_sum(ss) / (float)hv + eps));
    for (int j = lane; j < hv; j += 32) x[j] = x[j] * rn * norm_w[j] * silu_f(zr[j]);
}

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

// ---- qwen3next's packed projections ----

// Element (i, j, e) of a 3-D block (e < n2 contiguous) from src[i ss0 + j ss1 + e] to
// dst[i ds0 + j ds1 + e] (both pointers at the block's first element).
// grid (ceil(n0 n1 n2 / 256)), block 256.
KERNEL void copy_strided_f32(const float* src, float* dst, int n0, int n1, int n2, int ss0, int ss1, int ds0, int ds1) {
    const int t = bid_x() * 256 + tid_x();
    if (t >= n0 * n1 * n2) return;
    const int e = t % n2, r = t / n2, j = r % n1, i = r / n1;
    dst[(u64)i * ds0 + (u64)j * ds1 + e] = src[(u64)i * ss0 + (u64)j * ss1 + e];
}
