// Exact numerics (`--numerics exact`), part 1: activation quantization, the quantized
// matmul and the embedding rows, each computing per output element the CPU backend's own
// sequence of f32 operations (`runtime/src/quant/simd_avx2/{q32,kquant,quantize}.rs`,
// `q8k.rs`), so a GPU run's logits equal the CPU backend's bit for bit.
//
// Rules of this file: every float operation is an explicit rounding step (xmul, xadd,
// xfma …: no contraction of a*b+c into an FMA, no fast division or square root); integer
// block sums are exact in any order, so only where the CPU keeps float partial sums (its
// 8 SIMD lanes, its fold order, FMA or not) is the order reproduced. One thread per
// output (`exact_matmul`) or one per CPU lane (`exact_matmul_lanes`): speed is secondary.
//
// Activation blocks are written in the CPU's byte layouts (q8_0: 34 B, q8_1: 36 B,
// q8_K: 292 B), so a check can compare them byte for byte.
#include "common.h"
#include "dequant_low.h"

#ifdef LODE_AMD
#pragma clang fp contract(off)
DEV float xmul(float a, float b) { return a * b; }
DEV float xadd(float a, float b) { return a + b; }
DEV float xsub(float a, float b) { return a - b; }
DEV float xdiv(float a, float b) { return a / b; }
DEV float xfma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
DEV float xmul(float a, float b) { return __fmul_rn(a, b); }
DEV float xadd(float a, float b) { return __fadd_rn(a, b); }
DEV float xsub(float a, float b) { return __fsub_rn(a, b); }
DEV float xdiv(float a, float b) { return __fdiv_rn(a, b); }
DEV float xfma(float a, float b, float c) { return __fmaf_rn(a, b, c); }
#endif

DEV u32 rd16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
DEV u32 rd32(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24); }
DEV float rdh(const u8* p) { return h2f((u16)rd16(p)); }
DEV float rdf(const u8* p) { return __builtin_bit_cast(float, rd32(p)); }
DEV void wr16(u8* p, u32 v) { p[0] = (u8)v; p[1] = (u8)(v >> 8); }

// f32 → f16 bits, rounded to nearest even, in integer arithmetic (checked against a
// hardware conversion on every f32). Not common.h's `f2h`: on sm_90 its 16-bit asm result
// came out of `wr16`'s byte stores with the low byte zeroed (exact_quantize_* caught it).
DEV u32 f16_rne(float f) {
    const u32 x = __builtin_bit_cast(u32, f);
    const u32 sign = (x >> 16) & 0x8000u, ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return sign | (ax > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (ax >= 0x477ff000u) return sign | 0x7c00u; // ≥ 65520 rounds to infinity
    if (ax >= 0x38800000u) {                      // a normal f16
        u32 r = ax - 0x38000000u;
        r += 0x0fffu + ((r >> 13) & 1u);
        return sign | (r >> 13);
    }
    if (ax <= 0x33000000u) return sign; // ≤ 2^-25: zero (2^-25 ties to even)
    const u32 e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, sh = 126 - e;
    const u32 q = m >> sh, rem = m & ((1u << sh) - 1), half = 1u << (sh - 1);
    return sign | (q + (rem > half || (rem == half && (q & 1))));
}

// The AVX2 horizontal sum of 8 lanes: (l0+l4, l1+l5, l2+l6, l3+l7), then pairs 0+2, 1+3,
// then the two.
DEV float hsum8(const float* a) {
    const float s0 = xadd(a[0], a[4]), s1 = xadd(a[1], a[5]), s2 = xadd(a[2], a[6]), s3 = xadd(a[3], a[7]);
    return xadd(xadd(s0, s2), xadd(s1, s3));
}

// ---- activation quantization ---------------------------------------------------------
// kind 0: q8_0 (d, 32 codes), 1: q8_1 (d, s = f16(d·Σq), 32 codes), 2: q8_K (f32 d, 256
// codes, 16 i16 bsums). x: [n_rows, k] f32; y: [n_rows, k / block] blocks.
// grid (ceil(k / block / 64), n_rows), block 64: one thread per block.
KERNEL void exact_quantize(const float* x, u8* y, int k, int kind) {
    const int qk = kind == 2 ? 256 : 32;
    const int nb = k / qk, b = bid_x() * 64 + tid_x(), row = bid_y();
    if (b >= nb) return;
    const float* v = x + (u64)row * k + (u64)b * qk;
    if (kind == 2) {
        u8* o = y + ((u64)row * nb + b) * 292;
        float mx = 0.0f, amax = 0.0f;
        for (int i = 0; i < 256; ++i) {
            const float a = fabs_f(v[i]);
            if (a > amax) { amax = a; mx = v[i]; }
        }
        if (amax == 0.0f) {
            for (int i = 0; i < 292; ++i) o[i] = 0;
            return;
        }
        const float iscale = xdiv(-127.0f, mx);
        int sum = 0;
        for (int i = 0; i < 256; ++i) {
            int q = (int)rint_f(xmul(iscale, v[i]));
            q = q < 127 ? q : 127;
            o[4 + i] = (u8)(i8)q;
            sum += q;
            if ((i & 15) == 15) {
                wr16(o + 260 + 2 * (i >> 4), (u32)(u16)(short)sum);
                sum = 0;
            }
        }
        const u32 d = __builtin_bit_cast(u32, xdiv(1.0f, iscale));
        wr16(o, d & 0xffff);
        wr16(o + 2, d >> 16);
        return;
    }
    const int bytes = kind == 0 ? 34 : 36, off = kind == 0 ? 2 : 4;
    u8* o = y + ((u64)row * nb + b) * bytes;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = fmax_f(amax, fabs_f(v[i]));
    const float d = xdiv(amax, 127.0f);
    const float id = amax != 0.0f ? xdiv(127.0f, amax) : 0.0f;
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
        const int q = (int)rint_f(xmul(v[i], id));
        o[off + i] = (u8)(i8)q;
        sum += q;
    }
    wr16(o, f16_rne(d));
    if (kind == 1) wr16(o + 2, f16_rne(xmul((float)sum, d)));
}

// ---- weights × activations -----------------------------------------------------------
// Weight type codes (the host's `ExactType`): 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0,
// 5 Q4_K, 6 Q6_K, 7 Q2_K, 8 Q3_K, 9 IQ4_NL, 10 IQ4_XS, 11 MXFP4, 12 IQ3_S, 13 IQ3_XXS,
// 14 IQ2_XXS, 15 IQ2_XS, 16 IQ2_S, 17 IQ1_S, 18 IQ1_M.

// Code of element e (0..31) of a 32-element weight block, with its type's offset
// removed (Q4_0: −8, Q5_0: −16); the `_1` types keep unsigned codes (min term apart).
DEV int code32(const u8* b, int ty, int e) {
    switch (ty) {
    case 0: return (int)((e < 16 ? b[2 + e] : b[2 + e - 16] >> 4) & 15) - 8;
    case 1: return (int)((e < 16 ? b[4 + e] : b[4 + e - 16] >> 4) & 15);
    case 2: {
        const int lo = (e < 16 ? b[6 + e] : b[6 + e - 16] >> 4) & 15;
        return (lo | (int)(((rd32(b + 2) >> e) & 1) << 4)) - 16;
    }
    case 3: {
        const int lo = (e < 16 ? b[8 + e] : b[8 + e - 16] >> 4) & 15;
        return lo | (int)(((rd32(b + 4) >> e) & 1) << 4);
    }
    default: return (int)(i8)b[2 + e];
    }
}

// The 32-element types (`q32::rows_r`): per 4-element lane an exact integer sum per block,
// `acc[l] = fma(d_w·d_y, Σ, acc[l])` over blocks, the lanes folded by hsum8, then (the
// `_1` types) `+ Σ_blocks m_w·s_y` summed in block order.
DEV float dot32(const u8* w, const u8* x, int nb, int ty) {
    const int wb = ty == 0 ? 18 : ty == 1 ? 20 : ty == 2 ? 22 : ty == 3 ? 24 : 34;
    const bool min_term = ty == 1 || ty == 3;
    const int yb = min_term ? 36 : 34, yq = min_term ? 4 : 2;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float acc_m = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * wb;
        const u8* y = x + (u64)i * yb;
        const float dm = xmul(rdh(b), rdh(y));
        if (min_term) acc_m = xadd(acc_m, xmul(rdh(b + 2), rdh(y + 2)));
        for (int l = 0; l < 8; ++l) {
            int s = 0;
            for (int e = 4 * l; e < 4 * l + 4; ++e) s += code32(b, ty, e) * (int)(i8)y[yq + e];
            acc[l] = xfma(dm, (float)s, acc[l]);
        }
    }
    float r = hsum8(acc);
    if (min_term) r = xadd(r, acc_m);
    return r;
}

// Q4_K's 6-bit scale (m = 0) or min (m = 1) of sub-block j.
DEV int q4k_scale(const u8* s, int j, int m) {
    if (j < 4) return m ? s[j + 4] & 63 : s[j] & 63;
    return m ? (s[j + 4] >> 4) | ((s[j] >> 6) << 4) : (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
}

DEV int bsum(const u8* y, int k) { return (int)(short)rd16(y + 260 + 2 * k); }

// Q4_K · q8_K (`kquant::q4k_loop`): per super-block four exact sums of 64 elements (and
// four min sums); `per64`: one FMA per 64 elements (the CPU's four-token kernel), else
// one per super-block (its one-token kernel). Result `acc − acc_m`.
DEV float dot_q4k(const u8* w, const u8* x, int nb, bool per64) {
    float acc = 0.0f, acc_m = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * 144;
        const u8* y = x + (u64)i * 292;
        int is[4], mn[4];
        for (int c = 0; c < 4; ++c) {
            int lo = 0, hi = 0;
            for (int l = 0; l < 32; ++l) {
                const int q = b[16 + 32 * c + l];
                lo += (q & 15) * (int)(i8)y[4 + 64 * c + l];
                hi += (q >> 4) * (int)(i8)y[4 + 64 * c + 32 + l];
            }
            is[c] = q4k_scale(b + 4, 2 * c, 0) * lo + q4k_scale(b + 4, 2 * c + 1, 0) * hi;
            mn[c] = q4k_scale(b + 4, 2 * c, 1) * (bsum(y, 4 * c) + bsum(y, 4 * c + 1)) +
                    q4k_scale(b + 4, 2 * c + 1, 1) * (bsum(y, 4 * c + 2) + bsum(y, 4 * c + 3));
        }
        const float dy = rdf(y);
        const float d = xmul(rdh(b), dy), dmin = xmul(rdh(b + 2), dy);
        if (per64) {
            for (int c = 0; c < 4; ++c) {
                acc = xfma((float)is[c], d, acc);
                acc_m = xfma((float)mn[c], dmin, acc_m);
            }
        } else {
            acc = xfma((float)(is[0] + is[1] + is[2] + is[3]), d, acc);
            acc_m = xfma((float)(mn[0] + mn[1] + mn[2] + mn[3]), dmin, acc_m);
        }
    }
    return xsub(acc, acc_m);
}

// Q6_K · q8_K (`kquant::q6_k_loop`): 8 lanes of exact integers per super-block (lane l:
// elements 128h + 32k + 4l … +3 with their scales, minus 32·(bsum·sc) of sub-blocks 2l,
// 2l+1). Vector order: `acc[l] = fma(d_y·d_w, lane, acc[l])`, hsum8 at the end; `tiled`
// (≥ 8 tokens): `acc = fma(Σlanes · d_w, d_y, acc)`.
DEV float dot_q6k(const u8* w, const u8* x, int nb, bool tiled) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float acc1 = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * 210;
        const u8* y = x + (u64)i * 292;
        const i8* sc = (const i8*)(b + 192);
        int lanes[8];
        for (int l = 0; l < 8; ++l) {
            int s = 0;
            for (int h = 0; h < 2; ++h) {
                for (int k = 0; k < 4; ++k) {
                    const int g = 2 * (4 * h + k) + (l >= 4);
                    int p = 0;
                    for (int e = 4 * l; e < 4 * l + 4; ++e) {
                        const int ql = b[64 * h + 32 * (k & 1) + e];
                        const int qh = b[128 + 32 * h + e];
                        const int q = (k < 2 ? ql & 15 : ql >> 4) | (((qh >> (2 * k)) & 3) << 4);
                        p += q * (int)(i8)y[4 + 128 * h + 32 * k + e];
                    }
                    s += (int)sc[g] * p;
                }
            }
            lanes[l] = s - 32 * (bsum(y, 2 * l) * (int)sc[2 * l] + bsum(y, 2 * l + 1) * (int)sc[2 * l + 1]);
        }
        const float dw = rdh(b + 208), dy = rdf(y);
        if (tiled) {
            int t = 0;
            for (int l = 0; l < 8; ++l) t += lanes[l];
            acc1 = xfma(xmul((float)t, dw), dy, acc1);
        } else {
            const float d = xmul(dy, dw);
            for (int l = 0; l < 8; ++l) acc[l] = xfma(d, (float)lanes[l], acc[l]);
        }
    }
    return tiled ? acc1 : hsum8(acc);
}

// ---- the low-bit types (`quant::q23k`, `quant::iq4`): every CPU path of these sums as the
// scalar dot does (the AVX2 kernels are bit-equal to it): per block an exact integer sum,
// then one float step per block added in block order ----

// Element e (< 256) of a 64-byte 2-bit code array: bits 2g of byte 32h + l for
// e = 128h + 32g + l.
DEV int code2x(const u8* qs, int e) { return (qs[32 * (e >> 7) + (e & 31)] >> (2 * ((e >> 5) & 3))) & 3; }

// Q2_K · q8_K: Σ_s (sc_s & 15)·Σ q·u and Σ_s (sc_s >> 4)·bsum_s, then
// acc + ((dx·d)·isum − (dx·dmin)·msum).
DEV float dot_q2k(const u8* w, const u8* x, int nb) {
    float acc = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * 84;
        const u8* y = x + (u64)i * 292;
        int isum = 0, msum = 0;
        for (int sb = 0; sb < 16; ++sb) {
            int p = 0;
            for (int e = 16 * sb; e < 16 * sb + 16; ++e) p += code2x(b + 16, e) * (int)(i8)y[4 + e];
            isum += (b[sb] & 15) * p;
            msum += (b[sb] >> 4) * bsum(y, sb);
        }
        const float dx = rdf(y);
        acc = xadd(acc, xsub(xmul(xmul(dx, rdh(b + 80)), (float)isum), xmul(xmul(dx, rdh(b + 82)), (float)msum)));
    }
    return acc;
}

// Q3_K · q8_K: Σ_s (sc_s − 32)·Σ q·u, then acc + (d·dx)·isum.
DEV float dot_q3k(const u8* w, const u8* x, int nb) {
    float acc = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * 110;
        const u8* y = x + (u64)i * 292;
        const u8* s = b + 96;
        int isum = 0;
        for (int sb = 0; sb < 16; ++sb) {
            const int lo = sb < 8 ? s[sb] & 15 : s[sb - 8] >> 4;
            const int hi = (s[8 + (sb & 3)] >> (2 * (sb >> 2))) & 3;
            int p = 0;
            for (int e = 16 * sb; e < 16 * sb + 16; ++e) {
                const int q = code2x(b + 32, e) - (((b[e & 31] >> (e >> 5)) & 1) ? 0 : 4);
                p += q * (int)(i8)y[4 + e];
            }
            isum += ((lo | (hi << 4)) - 32) * p;
        }
        acc = xadd(acc, xmul(xmul(rdh(b + 108), rdf(y)), (float)isum));
    }
    return acc;
}

// The signed table entry of a 4-bit index: kvalues_iq4nl, or kvalues_mxfp4 (doubled E2M1).
DEV int tab4(int q, bool mx) {
    const u32 t[4] = {mx ? 0x03020100u : 0xBFAD9881u, mx ? 0x0C080604u : 0xF6EADDCFu, mx ? 0xFDFEFF00u : 0x26190D01u, mx ? 0xF4F8FAFCu : 0x71594535u};
    return (int)(i8)(u8)(t[q >> 2] >> (8 * (q & 3)));
}

// Σ over a 32-element nibble block (element e < 16: low nibble of byte e, else the high
// nibble of byte e − 16) of table[q]·u.
DEV int nib_sum(const u8* qs, const u8* u, bool mx) {
    int s = 0;
    for (int e = 0; e < 32; ++e) s += tab4(e < 16 ? qs[e] & 15 : qs[e - 16] >> 4, mx) * (int)(i8)u[e];
    return s;
}

// IQ4_NL / MXFP4 · q8_0: acc + (scale product)·Σ per block; IQ4_NL's product d·dx,
// MXFP4's dx·2^(e − 128).
DEV float dot_nl(const u8* w, const u8* x, int nb, bool mx) {
    float acc = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * (mx ? 17 : 18);
        const u8* y = x + (u64)i * 34;
        const int s = nib_sum(b + (mx ? 1 : 2), y + 2, mx);
        float dm;
        if (mx) {
            const u32 e = b[0];
            dm = xmul(rdh(y), __builtin_bit_cast(float, e < 2 ? 0x00200000u << e : (e - 1) << 23));
        } else {
            dm = xmul(rdh(b), rdh(y));
        }
        acc = xadd(acc, xmul(dm, (float)s));
    }
    return acc;
}

// IQ4_XS · q8_K: Σ_j (ls_j − 32)·Σ K[q]·u, then acc + (d·dx)·isum.
DEV float dot_iq4xs(const u8* w, const u8* x, int nb) {
    float acc = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * 136;
        const u8* y = x + (u64)i * 292;
        const u32 h = rd16(b + 2);
        int isum = 0;
        for (int j = 0; j < 8; ++j) {
            const int ls = (int)(((b[4 + j / 2] >> (4 * (j % 2))) & 15) | (((h >> (2 * j)) & 3) << 4)) - 32;
            isum += ls * nib_sum(b + 8 + 16 * j, y + 4 + 32 * j, false);
        }
        acc = xadd(acc, xmul(xmul(rdh(b), rdf(y)), (float)isum));
    }
    return acc;
}

// The grid types · q8_K (`quant::grid::dot`): per super-block the exact Σ ls·Σ ±g·q (IQ1:
// its signed grid, and Σ ls·(±1)·Σ q for the ±1/8 shift), then acc + (d·dx)·isum (IQ1:
// (d·dx)·(isum + 1/8·dsum)) in block order, times the type's factor at the end (IQ2: 1/8,
// IQ3_XXS: 1/4). Sub-blocks decoded by dequant_low.h's grid_sub. T: its type code.
template <int T>
DEV float dot_grid(const u8* w, const u8* x, int nb) {
    float acc = 0.0f;
    for (int i = 0; i < nb; ++i) {
        const u8* b = w + (u64)i * grid_bb<T>::v;
        const u8* y = x + (u64)i * 292;
        int isum = 0, dsum = 0;
        for (int ib = 0; ib < 8; ++ib) {
            gsub s;
            grid_sub<T>(b, ib, s);
            int h[2] = {0, 0}, dh[2] = {0, 0};
            for (int e = 0; e < 32; ++e) {
                const int l = e >> 3, q = (int)(i8)y[4 + 32 * ib + e];
                const int g = (int)((s.g[l] >> (8 * (e & 7))) & 0xff);
                if (T >= 5) {
                    h[e >> 4] += (int)(i8)(u8)g * q;
                    dh[e >> 4] += ((s.nd >> l) & 1) ? -q : q;
                } else {
                    h[e >> 4] += ((s.signs >> e) & 1) ? -g * q : g * q;
                }
            }
            isum += s.ls[0] * h[0] + s.ls[1] * h[1];
            dsum += s.ls[0] * dh[0] + s.ls[1] * dh[1];
        }
        const float dd = xmul(grid_d<T>(b), rdf(y));
        acc = xadd(acc, T >= 5 ? xmul(dd, xadd((float)isum, xmul(0.125f, (float)dsum))) : xmul(dd, (float)isum));
    }
    return xmul((T == 2 || T == 3 || T == 4) ? 0.125f : T == 1 ? 0.25f : 1.0f, acc);
}

// y[t][r] = W[r] · xq[t]. w: [rows, row_bytes] stored blocks; xq: [n_tok, k / block]
// activation blocks of the type's vec_dot type; y: [n_tok, rows] f32.
// `order`: Q4_K: tokens below it use the four-token order (4·⌊n_tok/4⌋); Q6_K: 1 = tiled.
// grid (ceil(rows / 128), n_tok), block 128.
KERNEL void exact_matmul(const u8* w, const u8* xq, float* y, int rows, int k, int ty, int order) {
    const int r = bid_x() * 128 + tid_x(), t = bid_y();
    if (r >= rows) return;
    float v;
    if (ty <= 4) {
        const int nb = k / 32;
        const int wb = ty == 0 ? 18 : ty == 1 ? 20 : ty == 2 ? 22 : ty == 3 ? 24 : 34;
        const int yb = (ty == 1 || ty == 3) ? 36 : 34;
        v = dot32(w + (u64)r * nb * wb, xq + (u64)t * nb * yb, nb, ty);
    } else if (ty == 5) {
        const int nb = k / 256;
        v = dot_q4k(w + (u64)r * nb * 144, xq + (u64)t * nb * 292, nb, t < order);
    } else if (ty == 7 || ty == 8 || ty == 10) {
        const int nb = k / 256, wb = ty == 7 ? 84 : ty == 8 ? 110 : 136;
        const u8* wr = w + (u64)r * nb * wb;
        const u8* xr = xq + (u64)t * nb * 292;
        v = ty == 7 ? dot_q2k(wr, xr, nb) : ty == 8 ? dot_q3k(wr, xr, nb) : dot_iq4xs(wr, xr, nb);
    } else if (ty == 9 || ty == 11) {
        const int nb = k / 32;
        v = dot_nl(w + (u64)r * nb * (ty == 11 ? 17 : 18), xq + (u64)t * nb * 34, nb, ty == 11);
    } else if (ty >= 12) {
        const int nb = k / 256;
        const u8* xr = xq + (u64)t * nb * 292;
        switch (ty) {
        case 12: v = dot_grid<0>(w + (u64)r * nb * 110, xr, nb); break;
        case 13: v = dot_grid<1>(w + (u64)r * nb * 98, xr, nb); break;
        case 14: v = dot_grid<2>(w + (u64)r * nb * 66, xr, nb); break;
        case 15: v = dot_grid<3>(w + (u64)r * nb * 74, xr, nb); break;
        case 16: v = dot_grid<4>(w + (u64)r * nb * 82, xr, nb); break;
        case 17: v = dot_grid<5>(w + (u64)r * nb * 50, xr, nb); break;
        default: v = dot_grid<6>(w + (u64)r * nb * 56, xr, nb); break;
        }
    } else {
        const int nb = k / 256;
        v = dot_q6k(w + (u64)r * nb * 210, xq + (u64)t * nb * 292, nb, order != 0);
    }
    y[(u64)t * rows + r] = v;
}

// The same sums with the CPU's 8 SIMD lanes on 8 threads: the 32-element types and Q6_K.
// Thread l of a group of 8 runs lane l's chain (its 4-element integer sums, its FMA per
// block); the fold is hsum8's pairing through shuffles ((l, l+4), then (0, 2) and (1, 3),
// then the two); the `_1` types' min term and Q6_K's tiled order (which adds the 8 lane
// integers exactly) are computed alike in every thread. 16 outputs per block of 128.
// grid (ceil(rows / 16), n_tok), block 128.
KERNEL void exact_matmul_lanes(const u8* w, const u8* xq, float* y, int rows, int k, int ty, int order) {
    const int l = tid_x() & 7, r = bid_x() * 16 + (tid_x() >> 3), t = bid_y();
    const int rr = r < rows ? r : rows - 1; // every thread takes part in the shuffles
    float acc = 0.0f, acc_m = 0.0f, acc1 = 0.0f;
    const bool min_term = ty == 1 || ty == 3;
    if (ty <= 4) {
        const int nb = k / 32;
        const int wb = ty == 0 ? 18 : ty == 1 ? 20 : ty == 2 ? 22 : ty == 3 ? 24 : 34;
        const int yb = min_term ? 36 : 34, yq = min_term ? 4 : 2;
        const u8* wr = w + (u64)rr * nb * wb;
        const u8* xr = xq + (u64)t * nb * yb;
        for (int i = 0; i < nb; ++i) {
            const u8* b = wr + (u64)i * wb;
            const u8* yv = xr + (u64)i * yb;
            const float dm = xmul(rdh(b), rdh(yv));
            if (min_term) acc_m = xadd(acc_m, xmul(rdh(b + 2), rdh(yv + 2)));
            int s = 0;
            for (int e = 4 * l; e < 4 * l + 4; ++e) s += code32(b, ty, e) * (int)(i8)yv[yq + e];
            acc = xfma(dm, (float)s, acc);
        }
    } else {
        const int nb = k / 256;
        const u8* wr = w + (u64)rr * nb * 210;
        const u8* xr = xq + (u64)t * nb * 292;
        for (int i = 0; i < nb; ++i) {
            const u8* b = wr + (u64)i * 210;
            const u8* yv = xr + (u64)i * 292;
            const i8* sc = (const i8*)(b + 192);
            int s = 0;
            for (int h = 0; h < 2; ++h) {
                for (int kk = 0; kk < 4; ++kk) {
                    const int g = 2 * (4 * h + kk) + (l >= 4);
                    int p = 0;
                    for (int e = 4 * l; e < 4 * l + 4; ++e) {
                        const int ql = b[64 * h + 32 * (kk & 1) + e];
                        const int qh = b[128 + 32 * h + e];
                        const int q = (kk < 2 ? ql & 15 : ql >> 4) | (((qh >> (2 * kk)) & 3) << 4);
                        p += q * (int)(i8)yv[4 + 128 * h + 32 * kk + e];
                    }
                    s += (int)sc[g] * p;
                }
            }
            const int lane = s - 32 * (bsum(yv, 2 * l) * (int)sc[2 * l] + bsum(yv, 2 * l + 1) * (int)sc[2 * l + 1]);
            const float dw = rdh(b + 208), dy = rdf(yv);
            if (order != 0) {
                int tot = lane + shfl_xor_i(lane, 4);
                tot += shfl_xor_i(tot, 2);
                tot += shfl_xor_i(tot, 1);
                acc1 = xfma(xmul((float)tot, dw), dy, acc1);
            } else {
                acc = xfma(xmul(dy, dw), (float)lane, acc);
            }
        }
    }
    float v = xadd(acc, shfl_xor(acc, 4));
    v = xadd(v, shfl_xor(v, 2));
    v = xadd(v, shfl_xor(v, 1));
    if (ty == 6 && order != 0) v = acc1;
    else if (min_term) v = xadd(v, acc_m);
    if (l == 0 && r < rows) y[(u64)t * rows + r] = v;
}

// Embedding rows as the CPU's `dequantize`: ty 0 f32, 1 f16, 2 Q8_0 (`q · d`).
// w: [n_rows, k] stored; ids: [n] i32; y: [n, k] f32. grid (ceil(k / 256), n), block 256.
KERNEL void exact_get_rows(const u8* w, const int* ids, float* y, int k, int ty) {
    const int i = bid_x() * 256 + tid_x(), t = bid_y();
    if (i >= k) return;
    const u64 row = (u64)ids[t];
    float v;
    if (ty == 0) {
        v = rdf(w + (row * k + i) * 4);
    } else if (ty == 1) {
        v = rdh(w + (row * k + i) * 2);
    } else {
        const u8* b = w + row * (k / 32) * 34 + (u64)(i / 32) * 34;
        v = xmul((float)(i8)b[2 + i % 32], rdh(b));
    }
    y[(u64)t * k + i] = v;
}
