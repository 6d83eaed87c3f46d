// Exact numerics (`--numerics exact`), part 2: the element-wise ops and attention, each
// the CPU backend's sequence of f32 / f64 operations (`runtime/src/backend/cpu/ops.rs`,
// `vexp.rs`, `attention.rs`, `attn_ggml.rs`, `attn_kernels.rs`). Every float operation is
// an explicit rounding step (no contraction, IEEE division and square root).
//
// Two exponentials, as on the CPU: ggml's vector `exp` (`vexp`: softmax numerators, SiLU)
// and libm's `expf` where the CPU calls `f32::exp` (online-softmax rescaling), ported here
// as glibc's algorithm (the Arm optimized-routines `expf`: a 32-entry table of 2^(i/32)
// and a cubic in double precision, FMA build). Cosines and sines of RoPE and GELU's table
// come from the host (computed by the CPU backend's own functions).
#include "common.h"

#ifdef LODE_AMD
#pragma clang fp contract(off)
DEV float xmul(float a, float b) { return a * b; }
DEV float xadd(float a, float b) { return a + b; }
DEV float xsub(float a, float b) { return a - b; }
DEV float xdiv(float a, float b) { return a / b; }
DEV float xsqrt(float a) { return __builtin_sqrtf(a); }
DEV float xfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
DEV double xdmul(double a, double b) { return a * b; }
DEV double xdadd(double a, double b) { return a + b; }
DEV double xdsub(double a, double b) { return a - b; }
DEV double xddiv(double a, double b) { return a / b; }
DEV double xdfma(double a, double b, double c) { return __builtin_fma(a, b, c); }
#else
DEV float xmul(float a, float b) { return __fmul_rn(a, b); }
DEV float xadd(float a, float b) { return __fadd_rn(a, b); }
DEV float xsub(float a, float b) { return __fsub_rn(a, b); }
DEV float xdiv(float a, float b) { return __fdiv_rn(a, b); }
DEV float xsqrt(float a) { return __fsqrt_rn(a); }
DEV float xfma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
DEV double xdmul(double a, double b) { return __dmul_rn(a, b); }
DEV double xdadd(double a, double b) { return __dadd_rn(a, b); }
DEV double xdsub(double a, double b) { return __dsub_rn(a, b); }
DEV double xddiv(double a, double b) { return __ddiv_rn(a, b); }
DEV double xdfma(double a, double b, double c) { return __fma_rn(a, b, c); }
#endif

DEV float f32_bits(u32 b) { return __builtin_bit_cast(float, b); }
DEV bool is_nan(float x) { return x != x; }
DEV float round16(float x) { return h2f(f2h(x)); }
// Rust's f32::max: the other operand when one is NaN.
DEV float maxf(float a, float b) { return is_nan(a) ? b : is_nan(b) ? a : (a > b ? a : b); }

// ---- ggml's vector exp (`vexp.rs`) ---------------------------------------------------
DEV float p2(int e) { return f32_bits((u32)(e + 127) << 23); }
DEV float vexp(float x) {
    const float shifter = 12582912.0f;
    const float z = xfma(x, f32_bits(0x3FB8AA3Bu), shifter);
    const float n = xsub(z, shifter);
    const float b = xfma(-n, f32_bits(0x35BFBE8Eu), xfma(-n, f32_bits(0x3F317200u), x));
    if (fabs_f(n) > 192.0f || is_nan(n)) return is_nan(n) ? x : (n <= 0.0f ? 0.0f : f32_bits(0x7f800000u));
    const float u = xmul(b, b);
    const float hi = xfma(xfma(f32_bits(0x3C072010u), b, f32_bits(0x3D2B9F17u)), u, xfma(f32_bits(0x3E2AAF33u), b, f32_bits(0x3EFFFEDBu)));
    const float j = xfma(hi, u, xfma(f32_bits(0x3F7FFFF6u), b, 1.0f));
    const int e = (int)n;
    if (e >= -126 && e <= 127) return xmul(j, p2(e));
    if (e > 127) return xmul(xmul(j, p2(e - 64)), p2(64));
    return xmul(xmul(j, p2(e + 100)), p2(-100));
}

// ---- libm's expf (glibc ≥ 2.27, FMA build) -------------------------------------------
// 2^(i/32) as binary64 bits minus i << 47.
__device__ const u64 EXPF_T[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};
DEV float libm_expf(float x) {
    const u32 ux = __builtin_bit_cast(u32, x);
    const u32 abstop = (ux >> 20) & 0x7ff;
    if (abstop >= 0x42b) {
        if (ux == 0xff800000u) return 0.0f;
        if (abstop >= 0x7f8) return xadd(x, x);
        if (x > f32_bits(0x42b17217u)) return f32_bits(0x7f800000u);
        if (x < f32_bits(0xc2cff1b4u)) return 0.0f;
    }
    const double inv_ln2_n = 0x1.71547652b82fep+0 * 32.0, shift = 0x1.8p+52;
    const double xd = (double)x;
    // gcc fuses both uses of InvLn2N·x with their additions.
    double kd = xdfma(inv_ln2_n, xd, shift);
    const u64 ki = __builtin_bit_cast(u64, kd);
    kd = xdsub(kd, shift);
    const double r = xdfma(inv_ln2_n, xd, -kd);
    u64 t = EXPF_T[ki % 32];
    t += ki << 47;
    const double s = __builtin_bit_cast(double, t);
    const double c0 = 0x1.c6af84b912394p-5 / 32768.0, c1 = 0x1.ebfce50fac4f3p-3 / 1024.0, c2 = 0x1.62e42ff0c52d6p-1 / 32.0;
    const double z = xdfma(c0, r, c1);
    const double r2 = xdmul(r, r);
    double y = xdfma(c2, r, 1.0);
    y = xdfma(z, r2, y);
    y = xdmul(y, s);
    return (float)y;
}

// ---- element-wise ---------------------------------------------------------------------
// Per row of n: scale = 1 / sqrt((Σ x² in f64, in order) / n + eps); out = x·scale·w.
// x, out: [n_rows, n] (may alias); w: [n] or null. grid n_rows, block 128.
KERNEL void exact_rmsnorm(const float* x, const float* w, float* out, int n, float eps) {
    __shared__ float scale;
    const u64 row = bid_x();
    const float* xr = x + row * n;
    if (tid_x() == 0) {
        double sum = 0.0;
        for (int i = 0; i < n; ++i) sum = xdadd(sum, (double)xmul(xr[i], xr[i]));
        const float mean = (float)xddiv(sum, (double)n);
        scale = xdiv(1.0f, xsqrt(xadd(mean, eps)));
    }
    sync();
    for (int i = tid_x(); i < n; i += 128) {
        const float v = xmul(xr[i], scale);
        out[row * n + i] = w ? xmul(v, w[i]) : v;
    }
}

// op 0: out = a + b; op 1: out = a · s (b unused). grid ceil(n / 256), block 256.
KERNEL void exact_binary(const float* a, const float* b, float* out, int n, float s, int op) {
    const int i = bid_x() * 256 + tid_x();
    if (i >= n) return;
    out[i] = op == 0 ? xadd(a[i], b[i]) : xmul(a[i], s);
}

// out = act(g) · u. act 0: SiLU x / (1 + vexp(0 − x)); act 1: GELU-tanh through the CPU's
// f16 table (saturated outside ±10). grid ceil(n / 256), block 256.
KERNEL void exact_glu(const float* g, const float* u, float* out, const u16* gelu, int n, int act) {
    const int i = bid_x() * 256 + tid_x();
    if (i >= n) return;
    const float x = g[i];
    float a;
    if (act == 0) {
        a = xdiv(x, xadd(1.0f, vexp(xsub(0.0f, x))));
    } else {
        a = x <= -10.0f ? 0.0f : x >= 10.0f ? x : h2f(gelu[f2h(x)]);
    }
    out[i] = xmul(a, u[i]);
}

// RoPE with a host table by position: cs [cap, half] cos then [cap, half] sin (row p =
// the CPU's `rope_table` of position p). x: [n_tok, n_head, head_dim]; pos: [n_tok] i32;
// pairs (2i, 2i+1) or (i, i + half) (neox). grid (ceil(half / 64), n_head, n_tok), block 64.
KERNEL void exact_rope(float* x, const float* cs, const int* pos, int n_head, int head_dim, int half, int cap, int neox) {
    const int i = bid_x() * 64 + tid_x(), h = bid_y(), t = bid_z();
    if (i >= half) return;
    float* hx = x + ((u64)t * n_head + h) * head_dim;
    const u64 p = (u64)pos[t];
    const float c = cs[p * half + i], s = cs[((u64)cap + p) * half + i];
    const int a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
    const float x0 = hx[a], x1 = hx[b];
    hx[a] = xfma(x0, c, -xmul(x1, s));
    hx[b] = xfma(x0, s, xmul(x1, c));
}

// ---- attention -------------------------------------------------------------------------
// The CPU's `fold16`: halves, quarters, then (t0 + t2) + (t1 + t3).
DEV float fold16(const float* a) {
    float t3[8], t6[4];
    for (int i = 0; i < 8; ++i) t3[i] = xadd(a[i + 8], a[i]);
    for (int j = 0; j < 4; ++j) t6[j] = xadd(t3[j + 4], t3[j]);
    return xadd(xadd(t6[0], t6[2]), xadd(t6[1], t6[3]));
}

// q·k as `tree_dot` with 64 lanes, q rounded to f16 first: lane l's FMA chain over
// d ≡ l (mod 64), 64 → 16 as (p[t] + p[t+32]) + (p[t+16] + p[t+48]), fold16, and the
// elements past the last whole 64 added in f64.
DEV float dot_tree64(const float* q, const u16* k, int dk) {
    const int np = dk / 64 * 64;
    float a[16];
    for (int t = 0; t < 16; ++t) {
        float p[4];
        const int ls[4] = {t, t + 32, t + 16, t + 48};
        for (int j = 0; j < 4; ++j) {
            float c = 0.0f;
            for (int d = ls[j]; d < np; d += 64) c = xfma(round16(q[d]), h2f(k[d]), c);
            p[j] = c;
        }
        a[t] = xadd(xadd(p[0], p[1]), xadd(p[2], p[3]));
    }
    const float r = np > 0 ? fold16(a) : 0.0f;
    if (np == dk) return r;
    double s = (double)r;
    for (int d = np; d < dk; ++d) s = xdadd(s, (double)xmul(round16(q[d]), h2f(k[d])));
    return (float)s;
}

// One query row (token t, head h) per block of 64 threads. q: [n_tok, n_head, hd] f32;
// kc, vc: [n_ctx, n_kv_head, hd] f16; out: [n_tok, n_head, hd]; pos: [n_tok] i32;
// sc: scratch [n_tok · n_head, stride] f32 for the row's scores (stride ≥ max pos + 1).
// mode 0: flash rows (< 64 rows: q rounded to f16, tree scores, online softmax with an
// f16 accumulator; `chunk` > 0 splits the keys as one decode row with `chunk` keys per
// part); mode 1: flash tiled (FMA-chain scores, tiles of 64 keys, vexp numerators).
// grid (n_head, n_tok), block 64.
KERNEL void exact_attention(const float* q, const u16* kc, const u16* vc, float* out, const int* pos, float* sc,
                            int n_head, int n_kv_head, int hd, int stride, int window, float scale, int mode, int chunk) {
    const int h = bid_x(), t = bid_y(), tid = tid_x();
    const int kvh = h / (n_head / n_kv_head), wkv = n_kv_head * hd;
    const int pq = pos[t];
    const int lo = window > 0 ? (pq + 1 > window ? pq + 1 - window : 0) : 0;
    const int n = pq + 1 - lo;
    const float* qr = q + ((u64)t * n_head + h) * hd;
    float* s = sc + ((u64)t * n_head + h) * stride;
    // Scores, one key per thread.
    for (int j = tid; j < n; j += 64) {
        const u16* kr = kc + (u64)(lo + j) * wkv + (u64)kvh * hd;
        float v;
        if (mode == 0) {
            v = dot_tree64(qr, kr, hd);
        } else {
            float c = 0.0f;
            for (int d = 0; d < hd; ++d) c = xfma(qr[d], h2f(kr[d]), c);
            v = c;
        }
        s[j] = xmul(v, scale);
    }
    sync();
    float* o = out + ((u64)t * n_head + h) * hd;
    const u64 voff = (u64)kvh * hd;
    // Every thread runs the row's scalar recurrence (same values) for its own dims.
    for (int d = tid; d < hd; d += 64) {
        if (mode == 1) {
            float acc = 0.0f, m = f32_bits(0xff800000u), ssum = 0.0f;
            const int hi = lo + n;
            for (int t0 = lo / 64 * 64; t0 < hi; t0 += 64) {
                const int a = t0 > lo ? t0 : lo, b = t0 + 64 < hi ? t0 + 64 : hi;
                float tmax = f32_bits(0xff800000u);
                for (int key = a; key < b; ++key) tmax = maxf(tmax, s[key - lo]);
                const float m_new = maxf(m, tmax);
                if (m_new > m) {
                    const float ms = libm_expf(xsub(m, m_new));
                    acc = xmul(acc, ms);
                    ssum = xmul(ssum, ms);
                }
                m = m_new;
                // The tile's numerators (masked keys 0), summed per 16 in f64; recomputed
                // for the V sum rather than kept (a thread's stack stays small).
                double sum = -0.0;
                for (int c = 0; c < 4; ++c) {
                    float p[16];
                    for (int i = 0; i < 16; ++i) {
                        const int key = t0 + 16 * c + i;
                        p[i] = key >= a && key < b ? vexp(xsub(s[key - lo], m)) : 0.0f;
                    }
                    sum = xdadd(sum, (double)fold16(p));
                }
                ssum = (float)xdadd((double)ssum, sum);
                for (int key = a; key < b; ++key) acc = xfma(vexp(xsub(s[key - lo], m)), h2f(vc[(u64)key * wkv + voff + d]), acc);
            }
            const float inv = ssum == 0.0f ? 0.0f : xdiv(1.0f, ssum);
            o[d] = xmul(acc, inv);
            continue;
        }
        // Flash rows: the online softmax over [a, b) with the f16 accumulator.
        float total = 0.0f, m = f32_bits(0xff800000u), ssum = 0.0f;
        const int hi = lo + n;
        const int step = chunk > 0 ? chunk : hi;
        for (int c0 = 0; c0 < hi; c0 += step) {
            const int a = c0 > lo ? c0 : lo, b = c0 + step < hi ? c0 + step : hi;
            if (a >= b) continue;
            float acc = 0.0f, mc = f32_bits(0xff800000u), sc_ = 0.0f;
            for (int key = a; key < b; ++key) {
                const float sv = s[key - lo];
                float ms = 1.0f, vs = 1.0f;
                if (sv > mc) {
                    ms = libm_expf(xsub(mc, sv));
                    mc = sv;
                    acc = round16(xmul(acc, ms));
                } else {
                    vs = libm_expf(xsub(sv, mc));
                }
                acc = round16(xfma(h2f(vc[(u64)key * wkv + voff + d]), vs, acc));
                sc_ = xfma(sc_, ms, vs);
            }
            if (chunk == 0) {
                total = acc;
                ssum = sc_;
                break;
            }
            if (sc_ == 0.0f) continue;
            const float m_new = maxf(m, mc);
            const float so = libm_expf(xsub(m, m_new)), sn = libm_expf(xsub(mc, m_new));
            total = xfma(total, so, xmul(acc, sn));
            ssum = xfma(ssum, so, xmul(sc_, sn));
            m = m_new;
        }
        const float inv = ssum == 0.0f ? 0.0f : xdiv(1.0f, ssum);
        o[d] = xmul(total, inv);
    }
}
