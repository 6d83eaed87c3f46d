// Prefill GEMM on matrix cores (issue 6): quantized weights x N f32 activation rows.
//   Y[n][m] = sum_k W[m][k] * X[n][k]     W: [M, K] (the canonical device layout of its type:
//   the GGUF stored blocks, or row64 for Q4_K / Q6_K), X: [N, K] f32, Y: [N, M] f32.
// Paired form (gemm_glu_*): Y[n][m] = act(G·x)[m] * (U·x)[m] with G and U of one type,
// act = SiLU (act 0) or GELU-tanh (act 1): the gate/up projections of one FFN from one
// activation tile, the GLU in the epilogue.
//
// Block = BM / 16 warps = a BM (M) x BN (N) tile: BM = 128 with BN = 64 or 16 (paired
// form: 64). (128 x 128 tiles, 64 x 64 tiles and split-K lost on the H200: deleted, their
// numbers in benchmarks/.) Each K step of 64 elements:
// every thread decodes 32 weights of one row (two 16-element halves of one sub-block pair
// of a K-quant, whose scales it decodes once for both; or one whole 32-element block) into
// shared memory as f16, and 4·BN/16 activations converted to f16; then each warp issues
// (32 x 32 or 16 x 16 per warp) 16x16x16 matrix products (mma.h). The next step's weight
// bytes and activations are loaded into registers before the current step's products,
// so global latency overlaps the matrix work. No dequantized copy of a weight exists
// outside this tile.
// Any M and N work (rows past M / tokens past N are zero-filled and never stored); K is
// whole blocks of the type (a multiple of 256 for K-quants, 32 otherwise).
// grid (ceil(M / BM), ceil(N / BN)), block 2 BM.
#include "common.h"
#include "mma.h"
#include "dequant_low.h"

#define GB_K 64
#define GB_LD 72 // padded row stride (u16): 144 bytes, 16-byte aligned, conflict-free ldmatrix
// Two blocks per SM on NVIDIA for the register-heavy paired tile: caps it at
// 128 registers (measured faster than one block with no spills).
#ifdef LODE_AMD
#define LAUNCH_BOUNDS_2(n) LAUNCH_BOUNDS(n)
#else
#define LAUNCH_BOUNDS_2(n) __launch_bounds__(n, 2)
#endif

enum {
    T_Q4_0 = 0,
    T_Q4_1,
    T_Q5_0,
    T_Q5_1,
    T_Q8_0,
    T_Q4_K,
    T_Q5_K,
    T_Q6_K,
    T_Q4_K_R64,
    T_Q6_K_R64,
    // The low-bit types (K a multiple of their block; no fused decode kernels).
    T_Q2_K,
    T_Q3_K,
    T_IQ4_NL,
    T_IQ4_XS,
    T_MXFP4,
};

// The raw bytes one thread needs for one K step (loaded a step ahead, decoded later):
// 16 words, 18 for Q3_K.
template <int N>
struct RawN {
    u32 w[N];
};
struct __attribute__((aligned(16))) g_u4 { u32 x, y, z, w; };
struct __attribute__((aligned(8))) g_u2 { u32 x, y; };
struct __attribute__((aligned(16))) g_f4 { float x, y, z, w; };

DEV void ld16(u32* d, const u8* p) {
    const g_u4 v = *(const g_u4*)p;
    d[0] = v.x, d[1] = v.y, d[2] = v.z, d[3] = v.w;
}
DEV void ld16_a2(u32* d, const u8* p) {
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = ld_u32_a2(p + 4 * i);
}
// 16 bytes from a 2-byte aligned address: four 4-byte loads where it is 4-byte aligned
// (half the blocks of the odd-sized types; uniform across a warp for even block counts).
DEV void ld16_a24(u32* d, const u8* p) {
    if (((u64)p & 3) == 0) {
#pragma unroll
        for (int i = 0; i < 4; ++i) d[i] = ld_u32(p + 4 * i);
    } else {
        ld16_a2(d, p);
    }
}
DEV u32 byte_at(const u32* w, int i) { return (w[i >> 2] >> (8 * (i & 3))) & 0xff; }

// Q4_K / Q5_K scale and min of sub-block j from the 12 scale bytes (header words 1..3).
DEV void kq_scale_min(const u32* hd, int j, float* sc, float* mn) {
    const u32* s = hd + 1;
    if (j < 4) {
        *sc = (float)(byte_at(s, j) & 63);
        *mn = (float)(byte_at(s, j + 4) & 63);
    } else {
        *sc = (float)((byte_at(s, j + 4) & 15) | ((byte_at(s, j - 4) >> 6) << 4));
        *mn = (float)((byte_at(s, j + 4) >> 4) | ((byte_at(s, j) >> 6) << 4));
    }
}

template <int TYPE>
struct TypeInfo;
template <> struct TypeInfo<T_Q4_0> { enum { BB = 18, QK = 32 }; };
template <> struct TypeInfo<T_Q4_1> { enum { BB = 20, QK = 32 }; };
template <> struct TypeInfo<T_Q5_0> { enum { BB = 22, QK = 32 }; };
template <> struct TypeInfo<T_Q5_1> { enum { BB = 24, QK = 32 }; };
template <> struct TypeInfo<T_Q8_0> { enum { BB = 34, QK = 32 }; };
template <> struct TypeInfo<T_Q4_K> { enum { BB = 144, QK = 256 }; };
template <> struct TypeInfo<T_Q5_K> { enum { BB = 176, QK = 256 }; };
template <> struct TypeInfo<T_Q6_K> { enum { BB = 210, QK = 256 }; };
template <> struct TypeInfo<T_Q4_K_R64> { enum { BB = 144, QK = 256 }; };
template <> struct TypeInfo<T_Q6_K_R64> { enum { BB = 210, QK = 256 }; };
template <> struct TypeInfo<T_Q2_K> { enum { BB = 84, QK = 256 }; };
template <> struct TypeInfo<T_Q3_K> { enum { BB = 110, QK = 256 }; };
template <> struct TypeInfo<T_IQ4_NL> { enum { BB = 18, QK = 32 }; };
template <> struct TypeInfo<T_IQ4_XS> { enum { BB = 136, QK = 256 }; };
template <> struct TypeInfo<T_MXFP4> { enum { BB = 17, QK = 32 }; };
// The 256-element low-bit types: one thread decodes one whole 32-element run of a K step.
template <int TYPE>
struct Runs { enum { ON = TYPE == T_Q2_K || TYPE == T_Q3_K || TYPE == T_IQ4_XS }; };
template <int TYPE>
struct RawOf { typedef RawN<TYPE == T_Q3_K ? 18 : 16> T; };

DEV void ld16_a1(u32* d, const u8* p) {
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = (u32)p[4 * i] | ((u32)p[4 * i + 1] << 8) | ((u32)p[4 * i + 2] << 16) | ((u32)p[4 * i + 3] << 24);
}

// Raw bytes of run r (elements [32 r, 32 r + 32) of super-block block b) of a low-bit type.
template <int TYPE, int N>
DEV void load_run(RawN<N>& w, const u8* b, int r) {
    if (TYPE == T_Q2_K) {
        // qs[32 h .. + 32) (h = r / 4), scales 2r and 2r + 1, d | dmin.
#pragma unroll
        for (int i = 0; i < 8; ++i) w.w[i] = ld_u32(b + 16 + 32 * (r >> 2) + 4 * i);
        w.w[8] = ld_u16(b + 2 * r);
        w.w[9] = ld_u32(b + 80);
    } else if (TYPE == T_Q3_K) {
        // qs[32 h .. + 32), hmask[0 .. 32), the scale bytes of sub-blocks 2r, 2r + 1, d.
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            w.w[i] = ld_u32_a2(b + 32 + 32 * (r >> 2) + 4 * i);
            w.w[8 + i] = ld_u32_a2(b + 4 * i);
        }
        w.w[16] = (u32)ld_u16(b + 96 + ((2 * r) & 7)) | ((u32)ld_u16(b + 104 + ((2 * r) & 3)) << 16);
        w.w[17] = ld_u16(b + 108);
    } else {
        // IQ4_XS: qs of sub-block r, d | scales_h, the scales_l byte of r.
#pragma unroll
        for (int i = 0; i < 4; ++i) w.w[i] = ld_u32(b + 8 + 16 * r + 4 * i);
        w.w[4] = ld_u32(b);
        w.w[5] = b[4 + (r >> 1)];
    }
}

// Decode run r into v[0..32).
template <int TYPE, int N>
DEV void emit_run(const RawN<N>& w, float* v, int r) {
    if (TYPE == T_Q2_K) {
        const float d = h2f((u16)(w.w[9] & 0xffff)), dmin = h2f((u16)(w.w[9] >> 16));
        const int g = 2 * (r & 3);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 sc = (w.w[8] >> (8 * h)) & 0xff;
            const float dl = d * (float)(sc & 15), ml = dmin * (float)(sc >> 4);
#pragma unroll
            for (int l = 0; l < 16; ++l) v[16 * h + l] = fma_f(dl, qf((byte_at(w.w, 16 * h + l) >> g) & 3, 0.0f), -ml);
        }
    } else if (TYPE == T_Q3_K) {
        const float d = h2f((u16)w.w[17]);
        const int g = 2 * (r & 3), lsh = r < 4 ? 0 : 4, hsh = 2 * (r >> 1);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 lo = (w.w[16] >> (8 * h + lsh)) & 15, hi = (w.w[16] >> (16 + 8 * h + hsh)) & 3;
            const float dl = d * (float)((int)(lo | (hi << 4)) - 32);
#pragma unroll
            for (int l = 0; l < 16; ++l) {
                const int i = 16 * h + l;
                const u32 q = ((byte_at(w.w, i) >> g) & 3) + (((byte_at(w.w + 8, i) >> r) & 1) << 2);
                v[i] = dl * qf(q, 4.0f);
            }
        }
    } else {
        const u32 lo = (w.w[5] >> (4 * (r & 1))) & 15, hi = ((w.w[4] >> 16) >> (2 * r)) & 3;
        const float dl = h2f((u16)(w.w[4] & 0xffff)) * (float)((int)(lo | (hi << 4)) - 32);
#pragma unroll
        for (int l = 0; l < 16; ++l) {
            v[l] = dl * (float)iq4_value(byte_at(w.w, l) & 15);
            v[16 + l] = dl * (float)iq4_value(byte_at(w.w, l) >> 4);
        }
    }
}

// Load the raw bytes of (row, K step ks, half c) into r. Caller guarantees row < M.
// K-quants: sub-blocks 2p, 2p+1 (p = ks % 4) of super-block ks / 4, elements
// [16c, 16c + 16) of each. 32-blocks: block 2 ks + c (absent past K: r.w[15] = 0 flags it).
template <int TYPE>
DEV void load_raw(typename RawOf<TYPE>::T& r, const u8* W, int row, int K, int ks, int c) {
    constexpr int BB = TypeInfo<TYPE>::BB;
    if (TypeInfo<TYPE>::QK == 32) {
        const int kb = K / 32, bi = 2 * ks + c;
        r.w[15] = bi < kb;
        if (bi >= kb) return;
        const u8* b = W + ((u64)row * kb + bi) * BB;
        if (TYPE == T_MXFP4) {
            r.w[8] = b[0];
            ld16_a1(r.w, b + 1);
        } else if (TYPE == T_IQ4_NL) {
            r.w[8] = ld_u16(b);
            ld16_a24(r.w, b + 2);
        } else if (TYPE == T_Q8_0) {
            r.w[8] = ld_u16(b);
            ld16_a24(r.w, b + 2);
            ld16_a24(r.w + 4, b + 18);
        } else {
            const int qoff = TYPE == T_Q4_0 ? 2 : TYPE == T_Q4_1 ? 4 : TYPE == T_Q5_0 ? 6 : 8;
            r.w[8] = (TYPE == T_Q4_1 || TYPE == T_Q5_1) ? ld_u32(b) : (u32)ld_u16(b);
            if (TYPE == T_Q5_0) r.w[9] = ld_u32_a2(b + 2);
            if (TYPE == T_Q5_1) r.w[9] = ld_u32(b + 4);
            if (TYPE == T_Q4_1 || TYPE == T_Q5_1) {
#pragma unroll
                for (int i = 0; i < 4; ++i) r.w[i] = ld_u32(b + qoff + 4 * i);
            } else {
                ld16_a24(r.w, b + qoff);
            }
        }
        return;
    }
    const int nsb = K / 256, sb = ks >> 2, p = ks & 3;
    if (Runs<TYPE>::ON) {
        load_run<TYPE>(r, W + ((u64)row * nsb + sb) * BB, 2 * p + c);
    } else if (TYPE == T_Q4_K) {
        const u8* b = W + ((u64)row * nsb + sb) * BB;
        ld16(r.w, b);
        ld16(r.w + 4, b + 16 + 32 * p + 16 * c);
    } else if (TYPE == T_Q5_K) {
        const u8* b = W + ((u64)row * nsb + sb) * BB;
        ld16(r.w, b);
        ld16(r.w + 4, b + 16 + 16 * c);
        ld16(r.w + 8, b + 48 + 32 * p + 16 * c);
    } else if (TYPE == T_Q4_K_R64) {
        const u8* t = W + ((u64)(row >> 6) * nsb + sb) * (64 * BB);
        const int lane = row & 63;
        ld16(r.w, t + lane * 16);
        const g_u2 a = *(const g_u2*)(t + (1 + 2 * p) * 1024 + lane * 16 + 8 * c);
        const g_u2 bb = *(const g_u2*)(t + (2 + 2 * p) * 1024 + lane * 16 + 8 * c);
        r.w[4] = a.x, r.w[5] = a.y, r.w[6] = bb.x, r.w[7] = bb.y;
    } else {
        // Q6_K: sub-block j = 2p (+1): half h = p / 2, group g = 2 (p % 2) (+1).
        const int h = p >> 1, gA = 2 * (p & 1);
        if (TYPE == T_Q6_K) {
            const u8* b = W + ((u64)row * nsb + sb) * BB;
            ld16_a24(r.w, b + 64 * h + 16 * c);
            ld16_a24(r.w + 4, b + 64 * h + 32 + 16 * c);
            ld16_a24(r.w + 8, b + 128 + 32 * h + 16 * c);
            const u8* S = b + 192 + 8 * h + c;
            r.w[12] = (u32)S[2 * gA] | ((u32)S[2 * gA + 2] << 8);
            r.w[13] = ld_u16(b + 208);
        } else {
            const u8* t = W + ((u64)(row >> 6) * nsb + sb) * (64 * BB);
            const int lane = row & 63;
            const u8* raw = t + 128 + 1024;
            ld16(r.w, raw + ((3 * h + 0) * 64 + lane) * 32 + 16 * c);
            ld16(r.w + 4, raw + ((3 * h + 1) * 64 + lane) * 32 + 16 * c);
            ld16(r.w + 8, raw + ((3 * h + 2) * 64 + lane) * 32 + 16 * c);
            // scale s at 128 + ((s / 2) * 64 + lane) * 2 + s % 2; here s = 8h + 2g + c.
            const int sA = 8 * h + 2 * gA + c, sB = sA + 2;
            const u8* S = t + 128;
            r.w[12] = (u32)S[((sA >> 1) * 64 + lane) * 2 + (sA & 1)] | ((u32)S[((sB >> 1) * 64 + lane) * 2 + (sB & 1)] << 8);
            r.w[13] = ld_u16(t + lane * 2);
        }
    }
}

// Write 16 f16 (v[0..16)) to dst (16-byte aligned).
DEV void put16(u16* dst, const float* v) {
    st_u4(dst, pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
    st_u4(dst + 8, pack_h2(v[8], v[9]), pack_h2(v[10], v[11]), pack_h2(v[12], v[13]), pack_h2(v[14], v[15]));
}

// Decode r into the shared row dst (64 f16 of this K step; this thread's 32 of them).
template <int TYPE>
DEV void emit(const typename RawOf<TYPE>::T& r, u16* dst, int ks, int c) {
    float a[16], b[16];
    if (TypeInfo<TYPE>::QK == 32) {
        if (!r.w[15]) {
#pragma unroll
            for (int i = 0; i < 16; ++i) a[i] = 0.0f;
            put16(dst + 32 * c, a);
            put16(dst + 32 * c + 16, a);
            return;
        }
        if (TYPE == T_MXFP4 || TYPE == T_IQ4_NL) {
            // MXFP4: the E8M0 scale halved (the table holds the E2M1 values doubled).
            const u32 e = r.w[8];
            const float d = TYPE == T_MXFP4 ? __builtin_bit_cast(float, e < 2 ? 0x00200000u << e : (e - 1) << 23) : h2f((u16)e);
#pragma unroll
            for (int i = 0; i < 16; ++i) {
                const u32 q = byte_at(r.w, i);
                a[i] = d * (float)(TYPE == T_MXFP4 ? mxfp4_value(q & 15) : iq4_value(q & 15));
                b[i] = d * (float)(TYPE == T_MXFP4 ? mxfp4_value(q >> 4) : iq4_value(q >> 4));
            }
            put16(dst + 32 * c, a);
            put16(dst + 32 * c + 16, b);
            return;
        }
        const float d = h2f((u16)(r.w[8] & 0xffff));
        const float m = (TYPE == T_Q4_1 || TYPE == T_Q5_1) ? h2f((u16)(r.w[8] >> 16)) : 0.0f;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            if (TYPE == T_Q8_0) {
                a[i] = d * qf(byte_at(r.w, i) ^ 0x80, 128.0f);
                b[i] = d * qf(byte_at(r.w, 16 + i) ^ 0x80, 128.0f);
            } else {
                u32 lo = byte_at(r.w, i) & 15, hi = byte_at(r.w, i) >> 4;
                if (TYPE == T_Q5_0 || TYPE == T_Q5_1) {
                    lo |= ((r.w[9] >> i) & 1) << 4;
                    hi |= ((r.w[9] >> (i + 16)) & 1) << 4;
                }
                const float off = TYPE == T_Q4_0 ? 8.0f : TYPE == T_Q5_0 ? 16.0f : 0.0f;
                a[i] = fma_f(d, qf(lo, off), m);
                b[i] = fma_f(d, qf(hi, off), m);
            }
        }
        put16(dst + 32 * c, a);
        put16(dst + 32 * c + 16, b);
        return;
    }
    const int p = ks & 3;
    if (Runs<TYPE>::ON) {
        float v[32];
        emit_run<TYPE>(r, v, 2 * p + c);
        put16(dst + 32 * c, v);
        put16(dst + 32 * c + 16, v + 16);
        return;
    }
    if (TYPE == T_Q4_K || TYPE == T_Q5_K || TYPE == T_Q4_K_R64) {
        const float d = h2f((u16)(r.w[0] & 0xffff)), dmin = h2f((u16)(r.w[0] >> 16));
        float sc0, m0, sc1, m1;
        kq_scale_min(r.w, 2 * p, &sc0, &m0);
        kq_scale_min(r.w, 2 * p + 1, &sc1, &m1);
        const float d0 = d * sc0, n0 = dmin * m0, d1 = d * sc1, n1 = dmin * m1;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            u32 lo, hi;
            if (TYPE == T_Q4_K_R64) {
                // field bytes: element 2q (low nibble) | 2q + 1 (high); A in w[4..5], B in w[6..7].
                lo = (byte_at(r.w + 4, i >> 1) >> (4 * (i & 1))) & 15;
                hi = (byte_at(r.w + 6, i >> 1) >> (4 * (i & 1))) & 15;
            } else {
                lo = byte_at(r.w + 4, i) & 15;
                hi = byte_at(r.w + 4, i) >> 4;
                if (TYPE == T_Q5_K) {
                    const u32 qh = byte_at(r.w + 4, i);
                    lo = byte_at(r.w + 8, i) & 15;
                    hi = byte_at(r.w + 8, i) >> 4;
                    lo |= ((qh >> (2 * p)) & 1) << 4;
                    hi |= ((qh >> (2 * p + 1)) & 1) << 4;
                }
            }
            a[i] = fma_f(d0, qf(lo, 0.0f), -n0);
            b[i] = fma_f(d1, qf(hi, 0.0f), -n1);
        }
    } else {
        // Q6_K: A = ql[64h + l] nibble (p & 1), B = ql[64h + 32 + l] same nibble;
        // high bits qh[32h + l] >> 2g.
        const int gA = 2 * (p & 1), sh = 4 * (p & 1);
        const float d = h2f((u16)r.w[13]);
        const float dA = d * (float)(i8)(r.w[12] & 0xff), dB = d * (float)(i8)((r.w[12] >> 8) & 0xff);
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const u32 qh = byte_at(r.w + 8, i);
            const u32 qa = ((byte_at(r.w, i) >> sh) & 15) | (((qh >> (2 * gA)) & 3) << 4);
            const u32 qb = ((byte_at(r.w + 4, i) >> sh) & 15) | (((qh >> (2 * gA + 2)) & 3) << 4);
            a[i] = dA * qf(qa, 32.0f);
            b[i] = dB * qf(qb, 32.0f);
        }
    }
    put16(dst + 16 * c, a);
    put16(dst + 32 + 16 * c, b);
}

// Activations of one K step: BN rows x 64, SEG = 64 BN / threads floats per thread.
template <int SEG>
struct XRaw {
    float v[SEG];
};
template <int SEG>
DEV void load_x(XRaw<SEG>& x, const float* X, int N, int K, int n0, int ks) {
    constexpr int TPR = 64 / SEG;
    const int t = tid_x(), n = n0 + t / TPR, k = ks * GB_K + (t % TPR) * SEG;
    const float* p = X + (u64)n * K + k;
    if (n < N && k + SEG <= K) {
#pragma unroll
        for (int i = 0; i < SEG; i += 4) {
            const g_f4 f = *(const g_f4*)(p + i);
            x.v[i] = f.x, x.v[i + 1] = f.y, x.v[i + 2] = f.z, x.v[i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < SEG; ++i) x.v[i] = (n < N && k + i < K) ? p[i] : 0.0f;
    }
}
template <int SEG>
DEV void store_x(const XRaw<SEG>& x, u16* sX) {
    constexpr int TPR = 64 / SEG;
    const int t = tid_x();
    u16* d = sX + (t / TPR) * GB_LD + (t % TPR) * SEG;
    if constexpr (SEG >= 8) {
#pragma unroll
        for (int i = 0; i < SEG; i += 8)
            st_u4(d + i, pack_h2(x.v[i], x.v[i + 1]), pack_h2(x.v[i + 2], x.v[i + 3]), pack_h2(x.v[i + 4], x.v[i + 5]), pack_h2(x.v[i + 6], x.v[i + 7]));
    } else {
        g_u2 v;
        v.x = pack_h2(x.v[0], x.v[1]);
        v.y = pack_h2(x.v[2], x.v[3]);
        *(g_u2*)d = v;
    }
}

template <int TYPE, int BM, int BN, bool GLU>
DEV void gemm_body(const u8* W, const u8* W2, const float* X, float* Y, int M, int N, int K, int act, int n0,
                   int ks_begin = 0, int ks_end = 1 << 30) {
    constexpr int NT = 2 * BM, NWARP = NT / 32;       // two threads per weight row
    constexpr int WN = BN >= 32 ? BN / 32 : 1;         // warps along N
    constexpr int WM = NWARP / WN;                     // warps along M
    constexpr int FM = BM / (16 * WM), FN = BN / (16 * WN);
    constexpr int SEG = BN * GB_K / NT;                // activations per thread and step
    __shared__ __attribute__((aligned(16))) u16 sW[BM * GB_LD];
    __shared__ __attribute__((aligned(16))) u16 sW2[GLU ? BM * GB_LD : 8];
    __shared__ __attribute__((aligned(16))) u16 sX[BN * GB_LD];
    const int t = tid_x(), lane = t & 31, warp = t >> 5;
    const int wm = warp % WM, wn = warp / WM;
    const int m0 = bid_x() * BM;
    const int r = t >> 1, c = t & 1, row = m0 + r;
    const bool live = row < M;
    // K steps [kb0, nks) of this block: all of them, or one split's range (none past K:
    // the block then stores zeros, so a split sum stays whole).
    const int all_steps = (K + GB_K - 1) / GB_K;
    const int kb0 = ks_begin, nks = ks_end < all_steps ? ks_end : all_steps;
    const bool any = kb0 < nks;

    FragC acc[FM][FN], acc2[GLU ? FM : 1][GLU ? FN : 1];
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j) {
            frag_zero(acc[i][j]);
            if (GLU) frag_zero(acc2[GLU ? i : 0][GLU ? j : 0]);
        }

    typename RawOf<TYPE>::T raw, raw2;
    XRaw<SEG> xr;
    if (live && any) {
        load_raw<TYPE>(raw, W, row, K, kb0, c);
        if (GLU) load_raw<TYPE>(raw2, W2, row, K, kb0, c);
    }
    if (any) load_x<SEG>(xr, X, N, K, n0, kb0);
    for (int ks = kb0; ks < nks; ++ks) {
        u16* dst = sW + r * GB_LD;
        if (live) {
            emit<TYPE>(raw, dst, ks, c);
            if (GLU) emit<TYPE>(raw2, sW2 + r * GB_LD, ks, c);
        } else {
            float z[16];
#pragma unroll
            for (int i = 0; i < 16; ++i) z[i] = 0.0f;
            put16(dst + 32 * c, z);
            put16(dst + 32 * c + 16, z);
            if (GLU) {
                put16(sW2 + r * GB_LD + 32 * c, z);
                put16(sW2 + r * GB_LD + 32 * c + 16, z);
            }
        }
        store_x<SEG>(xr, sX);
        sync();
        if (ks + 1 < nks) {
            if (live) {
                load_raw<TYPE>(raw, W, row, K, ks + 1, c);
                if (GLU) load_raw<TYPE>(raw2, W2, row, K, ks + 1, c);
            }
            load_x<SEG>(xr, X, N, K, n0, ks + 1);
        }
#pragma unroll
        for (int kk = 0; kk < GB_K / 16; ++kk) {
            FragB b[FN];
#pragma unroll
            for (int j = 0; j < FN; ++j) frag_b(b[j], sX + ((wn * FN + j) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
            for (int i = 0; i < FM; ++i) {
                FragA a;
                frag_a(a, sW + ((wm * FM + i) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
                for (int j = 0; j < FN; ++j) mma(acc[i][j], a, b[j]);
                if (GLU) {
                    FragA a2;
                    frag_a(a2, sW2 + ((wm * FM + i) * 16) * GB_LD + kk * 16, GB_LD);
#pragma unroll
                    for (int j = 0; j < FN; ++j) mma(acc2[GLU ? i : 0][GLU ? j : 0], a2, b[j]);
                }
            }
        }
        sync();
    }
#pragma unroll
    for (int i = 0; i < FM; ++i)
#pragma unroll
        for (int j = 0; j < FN; ++j)
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                int m, n;
                frag_coord(e, lane, &m, &n);
                m += m0 + (wm * FM + i) * 16;
                n += n0 + (wn * FN + j) * 16;
                if (m < M && n < N) {
                    float v = acc[i][j].v[e];
                    if (GLU) {
                        const float u = acc2[GLU ? i : 0][GLU ? j : 0].v[e];
                        v = (act ? gelu_tanh_f(v) : silu_f(v)) * u;
                    }
                    Y[(u64)n * M + m] = v;
                }
            }
}

#define GEMM_KERNELS(NAME, T)                                                                                    \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_n64(const u8* W, const float* X, float* Y, int M, int N, int K) { \
        gemm_body<T, 128, 64, false>(W, W, X, Y, M, N, K, 0, bid_y() * 64);                                      \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_n16(const u8* W, const float* X, float* Y, int M, int N, int K) { \
        gemm_body<T, 128, 16, false>(W, W, X, Y, M, N, K, 0, bid_y() * 16);                                      \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS_2(256) void gemm_glu_##NAME##_n64(const u8* G, const u8* U, const float* X, float* Y,   \
                                                           int M, int N, int K, int act) {                       \
        gemm_body<T, 128, 64, true>(G, U, X, Y, M, N, K, act, bid_y() * 64);                                     \
    }                                                                                                            \
    KERNEL LAUNCH_BOUNDS(256) void gemm_##NAME##_k64(const u8* W, const float* X, float* P, int M, int N, int K,  \
                                                     int per) {                                                  \
        const int z = bid_z();                                                                                   \
        gemm_body<T, 128, 64, false>(W, W, X, P + (u64)z * N * M, M, N, K, 0, bid_y() * 64, z * per, z * per + per); \
    }

GEMM_KERNELS(q4_0, T_Q4_0)
GEMM_KERNELS(q4_1, T_Q4_1)
GEMM_KERNELS(q5_0, T_Q5_0)
GEMM_KERNELS(q5_1, T_Q5_1)
GEMM_KERNELS(q8_0, T_Q8_0)
GEMM_KERNELS(q4_K, T_Q4_K)
GEMM_KERNELS(q5_K, T_Q5_K)
GEMM_KERNELS(q6_K, T_Q6_K)
GEMM_KERNELS(q4_K_r64, T_Q4_K_R64)
GEMM_KERNELS(q6_K_r64, T_Q6_K_R64)
GEMM_KERNELS(q2_K, T_Q2_K)
GEMM_KERNELS(q3_K, T_Q3_K)
GEMM_KERNELS(iq4_nl, T_IQ4_NL)
GEMM_KERNELS(iq4_xs, T_IQ4_XS)
GEMM_KERNELS(mxfp4, T_MXFP4)

// ---- split-K (decode batches): gemm_<type>_k64 above ----
//
// A batch of a few tokens gives a projection few 128-row tiles (a 2560-row one: 20 blocks
// on 132 multiprocessors), each walking all of K alone. gemm_<type>_k64 splits the K steps
// over grid.z: block z sums steps [z·per, z·per + per) into its slice P[z] [N, M]; this
// sums the slices in order z = 0, 1, … (the same result every run, graph or not).
KERNEL LAUNCH_BOUNDS(256) void gemm_ksum(const float* P, float* Y, int nsplit, int nm) {
    const int i = bid_x() * 256 + tid_x();
    if (i >= nm) return;
    float v = 0.0f;
    for (int z = 0; z < nsplit; ++z) v += P[(u64)z * nm + i];
    Y[i] = v;
}

// ---- mixture-of-experts: one launch over every expert (grouped GEMM) ----
//
// The (token, expert) pairs grouped by expert (moe.hip's moe_sort with tiles of 16): tile
// t (grid.y) covers up to 16 pairs of expert tile_e[t] at grouped positions tile_s[t] …,
// whose rows of X [n_pairs, K] f32 (grouped order) it multiplies by that expert's matrix,
// the eb bytes at W + e·eb of the 3-D tensor's one copy, into Y [n_pairs, M] (grouped
// order). Tiles past ntiles[0] return at once (the grid is sized for the most there can
// be). The paired form: gate and up experts with the GLU in the epilogue.
DEV bool moe_tile16(const int* offs, const int* ntiles, const int* tile_e, const int* tile_s, int n_exp, int* e, int* s, int* n) {
    const int t = bid_y();
    if (t >= ntiles[0]) return false;
    const int ee = tile_e[t];
    *e = ee < 0 ? 0 : ee >= n_exp ? n_exp - 1 : ee;
    *s = tile_s[t];
    const int left = offs[*e + 1] - *s;
    *n = left < 16 ? left : 16;
    return *n > 0;
}

#define GEMM_MOE_KERNELS(NAME, T)                                                                                      \
    KERNEL LAUNCH_BOUNDS(256) void gemm_moe_##NAME##_n16(const int* offs, const int* ntiles, const int* tile_e,       \
                                                         const int* tile_s, int n_exp, const u8* W, int eb,            \
                                                         const float* X, float* Y, int M, int K) {                     \
        int e, s, n;                                                                                                   \
        if (!moe_tile16(offs, ntiles, tile_e, tile_s, n_exp, &e, &s, &n)) return;                                      \
        const u8* We = W + (u64)e * eb;                                                                                \
        gemm_body<T, 128, 16, false>(We, We, X + (u64)s * K, Y + (u64)s * M, M, n, K, 0, 0);                           \
    }                                                                                                                  \
    KERNEL LAUNCH_BOUNDS(256) void gemm_moe_glu_##NAME##_n16(const int* offs, const int* ntiles, const int* tile_e,   \
                                                             const int* tile_s, int n_exp, const u8* G, const u8* U,   \
                                                             int eb, const float* X, float* Y, int M, int K, int act) { \
        int e, s, n;                                                                                                   \
        if (!moe_tile16(offs, ntiles, tile_e, tile_s, n_exp, &e, &s, &n)) return;                                      \
        gemm_body<T, 128, 16, true>(G + (u64)e * eb, U + (u64)e * eb, X + (u64)s * K, Y + (u64)s * M, M, n, K, act, 0); \
    }

GEMM_MOE_KERNELS(q4_0, T_Q4_0)
GEMM_MOE_KERNELS(q4_1, T_Q4_1)
GEMM_MOE_KERNELS(q5_0, T_Q5_0)
GEMM_MOE_KERNELS(q5_1, T_Q5_1)
GEMM_MOE_KERNELS(q8_0, T_Q8_0)
GEMM_MOE_KERNELS(q4_K, T_Q4_K)
GEMM_MOE_KERNELS(q5_K, T_Q5_K)
GEMM_MOE_KERNELS(q6_K, T_Q6_K)
GEMM_MOE_KERNELS(q2_K, T_Q2_K)
GEMM_MOE_KERNELS(q3_K, T_Q3_K)
GEMM_MOE_KERNELS(iq4_nl, T_IQ4_NL)
GEMM_MOE_KERNELS(iq4_xs, T_IQ4_XS)
GEMM_MOE_KERNELS(mxfp4, T_MXFP4)
