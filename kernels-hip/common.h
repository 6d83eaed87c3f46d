// lode's portability header: one kernel source for NVIDIA (nvcc / NVRTC) and AMD gfx11
// (clang -x hip with no ROCm install, or hipRTC).
//
// Both targets run 32-wide: a CUDA warp, and an RDNA3 wave32 (gfx11's default). Kernels
// are written for a 32-lane "warp" and use only what this header defines:
//   thread/block ids (tid_x(), bid_x() …), sync(), warp shuffles (shfl_xor),
//   f16 <-> f32 on raw u16 bits (h2f, f2h), bf16 -> f32, int8 dot of 4 (dot4),
//   fast exp/exp2, a portable sincos (same code on both vendors).
// Halves are always carried as uint16 bits so no vendor half type leaks into kernels.
// The matrix-core path (issue 6) uses LODE_WMMA_* below: `__builtin_amdgcn_wmma_*` on
// gfx11, `mma.sync` on NVIDIA.
#pragma once

#if defined(__HIPCC_RTC__) || defined(__HIP__) || defined(__AMDGCN__)
#define LODE_AMD 1
#else
#define LODE_NV 1
#endif

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;

#if defined(LODE_AMD) && !defined(__HIPCC_RTC__)
// clang -x hip -nogpuinc: no HIP headers, so define the language keywords ourselves.
#define __global__ __attribute__((global))
#define __device__ __attribute__((device))
#define __shared__ __attribute__((shared))
#define __forceinline__ __attribute__((always_inline)) inline
#endif

#define DEV static __device__ __forceinline__
#define KERNEL extern "C" __global__
// Programmatic dependent launch (NVIDIA sm_90+). The host may launch a kernel of a
// family that calls `pdl_entry()` first thing before the previous kernel in the stream
// has finished (`Driver::launch_overlapped`), so its launch and block set-up overlap the
// previous kernel's tail. `griddepcontrol.wait` then holds every thread until the
// previous grid has completed and its writes are visible, so nothing in the body can
// see a half-written input (nor overwrite one still being read); the trigger after it
// lets the next kernel start its own launch while this one runs. A kernel launched the
// ordinary way passes both instructions at once. Elsewhere (AMD, older NVIDIA) a no-op.
#if defined(LODE_NV) && defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
DEV void pdl_entry() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
#else
DEV void pdl_entry() {}
#endif
// f32 sums and products the compiler must not fuse into an FMA: the result is then the
// same whichever way a sum is split (the decode matvec accumulators, whose steps may run
// in one warp or in several and be added afterwards), and equal to the CPU's rounding
// where that matters (dequant.hip).
#ifdef LODE_AMD
DEV float mul_rn(float a, float b) {
#pragma clang fp contract(off)
    return a * b;
}
DEV float add_rn(float a, float b) {
#pragma clang fp contract(off)
    return a + b;
}
DEV float sub_rn(float a, float b) {
#pragma clang fp contract(off)
    return a - b;
}
#else
DEV float mul_rn(float a, float b) { return __fmul_rn(a, b); }
DEV float add_rn(float a, float b) { return __fadd_rn(a, b); }
DEV float sub_rn(float a, float b) { return __fsub_rn(a, b); }
#endif
// The block size a kernel is always launched with (caps registers so it fits).
// LAUNCH_BOUNDS_MIN(n, m) also asks for m resident blocks per multiprocessor (NVIDIA:
// caps registers so that many fit; AMD: the work-group size bound only).
#ifdef LODE_AMD
#define LAUNCH_BOUNDS(n) __attribute__((amdgpu_flat_work_group_size(1, n)))
#define LAUNCH_BOUNDS_MIN(n, m) __attribute__((amdgpu_flat_work_group_size(1, n)))
#else
#define LAUNCH_BOUNDS(n) __launch_bounds__(n)
#define LAUNCH_BOUNDS_MIN(n, m) __launch_bounds__(n, m)
#endif

#ifdef LODE_AMD
DEV u32 tid_x() { return __builtin_amdgcn_workitem_id_x(); }
DEV u32 bid_x() { return __builtin_amdgcn_workgroup_id_x(); }
DEV u32 bid_y() { return __builtin_amdgcn_workgroup_id_y(); }
DEV u32 bid_z() { return __builtin_amdgcn_workgroup_id_z(); }
DEV void sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
}
DEV float shfl_xor(float v, int m) {
    int lane = __builtin_amdgcn_mbcnt_lo(~0u, 0);
    int src = (lane ^ m) << 2;
    return __builtin_bit_cast(float, __builtin_amdgcn_ds_bpermute(src, __builtin_bit_cast(int, v)));
}
DEV int shfl_xor_i(int v, int m) {
    int lane = __builtin_amdgcn_mbcnt_lo(~0u, 0);
    return __builtin_amdgcn_ds_bpermute((lane ^ m) << 2, v);
}
// Bit l: lane l's p (wave32).
DEV u32 warp_ballot(bool p) { return __builtin_amdgcn_ballot_w32(p); }
DEV float h2f(u16 h) { return (float)__builtin_bit_cast(_Float16, h); }
DEV u16 f2h(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
// signed int8 x4 dot: v_dot4_i32_iu8 (gfx11 "dot8-insts").
DEV int dot4(int a, int b, int c) { return __builtin_amdgcn_sudot4(true, a, true, b, c, false); }
DEV float exp2_fast(float x) { return __builtin_amdgcn_exp2f(x); }
DEV float rcp(float x) { return 1.0f / x; }
DEV float sqrt_f(float x) { return __builtin_sqrtf(x); }
DEV float fabs_f(float x) { return __builtin_fabsf(x); }
DEV float fmax_f(float a, float b) { return __builtin_fmaxf(a, b); }
DEV float rint_f(float x) { return __builtin_rintf(x); }
DEV float fma_f(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
#else
DEV u32 tid_x() { return threadIdx.x; }
DEV u32 bid_x() { return blockIdx.x; }
DEV u32 bid_y() { return blockIdx.y; }
DEV u32 bid_z() { return blockIdx.z; }
DEV void sync() { __syncthreads(); }
DEV float shfl_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m, 32); }
DEV int shfl_xor_i(int v, int m) { return __shfl_xor_sync(0xffffffffu, v, m, 32); }
DEV u32 warp_ballot(bool p) { return __ballot_sync(0xffffffffu, p); }
DEV float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
DEV u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
DEV int dot4(int a, int b, int c) {
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
DEV float exp2_fast(float x) {
    float r;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
    return r;
}
DEV float rcp(float x) { return 1.0f / x; }
DEV float sqrt_f(float x) { return sqrtf(x); }
DEV float fabs_f(float x) { return fabsf(x); }
DEV float fmax_f(float a, float b) { return fmaxf(a, b); }
DEV float rint_f(float x) { return rintf(x); }
DEV float fma_f(float a, float b, float c) { return fmaf(a, b, c); }
#endif

DEV float bf2f(u16 b) { return __builtin_bit_cast(float, ((u32)b) << 16); }
DEV float exp_fast(float x) { return exp2_fast(x * 1.4426950408889634f); }

DEV float warp_sum(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m);
    return v;
}
DEV float warp_max(float v) {
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) v = fmax_f(v, shfl_xor(v, m));
    return v;
}

// Unaligned little-endian loads from byte pointers (blocks of 18, 22, 210 bytes are only
// 2-byte aligned).
DEV u32 ld_u32_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}
DEV u16 ld_u16(const u8* p) { return *(const u16*)p; }
DEV u32 ld_u32(const u8* p) { return *(const u32*)p; }

// sin and cos of x by Cody-Waite reduction to [-pi/4, pi/4] and minimax polynomials, the
// same arithmetic on both vendors (no device math library is linked on AMD).
DEV void sincos_p(float x, float* s, float* c) {
    float k = rint_f(x * 0.63661977236758134f);  // 2/pi
    float r = fma_f(k, -1.5707963705062866f, x);
    r = fma_f(k, 4.3711388286737929e-08f, r);
    r = fma_f(k, 1.7151245100059206e-15f, r);
    int q = (int)k;
    float r2 = r * r;
    float sp = r + r * r2 * (-1.6666654611e-1f + r2 * (8.3321608736e-3f + r2 * -1.9515295891e-4f));
    float cp = 1.0f - 0.5f * r2 + r2 * r2 * (4.166664568298827e-2f + r2 * (-1.388731625493765e-3f + r2 * 2.443315711809948e-5f));
    float ss = (q & 1) ? cp : sp;
    float cc = (q & 1) ? sp : cp;
    if (q & 2) ss = -ss;
    if ((q + 1) & 2) cc = -cc;
    *s = ss;
    *c = cc;
}

// tanh: odd Taylor polynomial near 0 (where 1 - 2/(e^2x + 1) cancels), exp form elsewhere.
DEV float tanh_f(float x) {
    if (fabs_f(x) < 0.125f) {
        const float x2 = x * x;
        return x * (1.0f + x2 * (-0.33333333f + x2 * (0.13333333f + x2 * -0.053968254f)));
    }
    return 1.0f - 2.0f * rcp(exp_fast(2.0f * x) + 1.0f);
}
DEV float silu_f(float x) { return x * rcp(1.0f + exp_fast(-x)); }
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
DEV float gelu_tanh_f(float x) { return 0.5f * x * (1.0f + tanh_f(0.7978845608028654f * (x + 0.044715f * x * x * x))); }
// GELU as the CPU backend (and ggml's CPU, through its f16 table) computes it: input
// rounded to f16, GELU of that, result rounded to f16; 0 below -10, x above 10.
DEV float gelu_f16r(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return h2f(f2h(gelu_tanh_f(h2f(f2h(x)))));
}

// q8_1 activation block: 32 int8 codes, d = amax/127, s = sum of the unquantized values.
struct __attribute__((aligned(4))) block_q8_1 {
    u16 d;
    u16 s;
    i8 qs[32];
};

// q8_1 form of 32 consecutive values held one per lane of a warp (all 32 lanes call it).
DEV void q8_block_store(block_q8_1* b, float v) {
    const int lane = tid_x() & 31;
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    const float qsum = warp_sum((float)c);
    b->qs[lane] = (i8)c;
    if (lane == 0) {
        b->d = f2h(d);
        b->s = f2h(d * qsum);
    }
}

// Element types of a KV cache plane (-ctk / -ctv): f16, or GGUF Q8_0 / Q4_0 blocks.
#define KVQ_F16 0
#define KVQ_Q8_0 1
#define KVQ_Q4_0 2

// One warp quantizes the 32 values x (one per lane) into block b of type ty, rounding as
// the CPU backend's quantizers (quant/q8.rs: llama.cpp's x86 quantize_row_q8_0, d =
// amax/127, codes rint(x·127/amax); quant/q32.rs: quantize_row_q4_0_ref, d = -max/8 of
// the signed value of largest magnitude, first on ties, codes min(15, (int)(x/d + 8.5))).
DEV void kvq_block_store(u8* b, int ty, float x) {
    const int lane = tid_x() & 31;
    if (ty == KVQ_Q8_0) {
        const float amax = warp_max(fabs_f(x));
        const float d = amax / 127.0f;
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[2 + lane] = (u8)(signed char)(int)rint_f(mul_rn(x, id));
        if (lane == 0) *(u16*)b = f2h(d);
        return;
    }
    // Q4_0: the signed value of largest magnitude, the lowest lane on ties.
    float av = fabs_f(x), mv = x;
    int at = lane;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) {
        const float ao = shfl_xor(av, m), mo = shfl_xor(mv, m);
        const int lo = shfl_xor_i(at, m);
        if (ao > av || (ao == av && lo < at)) {
            av = ao;
            mv = mo;
            at = lo;
        }
    }
    const float d = mv / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int c = (int)add_rn(mul_rn(x, id), 8.5f);
    c = c < 15 ? c : 15;
    const int hi = shfl_xor_i(c, 16);
    if (lane < 16) b[2 + lane] = (u8)((c & 15) | ((hi & 15) << 4));
    if (lane == 0) *(u16*)b = f2h(d);
}

// x as element e of a plane of type ty. A quantized type is stored a block at a time: the
// 32 lanes of the warp call it together, lane l with element e % 32 == l.
DEV void kvq_put(u8* plane, int ty, u64 e, float x) {
    if (ty == KVQ_F16) ((u16*)plane)[e] = f2h(x);
    else kvq_block_store(plane + (e >> 5) * (ty == KVQ_Q8_0 ? 34 : 18), ty, x);
}

// K-format activation blocks: the codes of ggml's q8_K (one f32 scale per 256 values,
// taken from the signed value of largest magnitude: iscale = -127 / max, codes
// min(127, round_even(iscale * x)), d = 1 / iscale; an all-zero super-block is all
// zeros), kept in block_q8_1's 36-byte shape so the matvecs index both formats alike.
// Per 32-element block j of a super-block: d = 16 bits of the super-block's f32 scale
// (the low half in even j, the high half in odd j), s = the i16 sum of the block's codes.
// Every K-quant weight is dotted with these, so GPU and CPU quantize activations alike.
DEV float q8k_scale(const block_q8_1* even) { return __builtin_bit_cast(float, (u32)even[0].d | ((u32)even[1].d << 16)); }
DEV float q8k_bsum(const block_q8_1* b) { return (float)(short)b->s; }

// One super-block held by one warp, lane l holding elements 8l .. 8l + 7 in v: the codes
// (8 per lane, into q) and the scale d (returned; 0 for an all-zero super-block).
DEV float q8k_warp_codes(const float* v, int* q) {
    float am = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) am = fmax_f(am, fabs_f(v[j]));
    am = warp_max(am);
    if (am == 0.0f) {
#pragma unroll
        for (int j = 0; j < 8; ++j) q[j] = 0;
        return 0.0f;
    }
    // The signed value of largest magnitude, the first in element order among equal ones
    // (as the CPU's scan): every candidate is +am or -am, so only the first one's sign is
    // needed: the lowest lane holding one, and that lane's first candidate.
    bool has = false, neg = false;
#pragma unroll
    for (int j = 7; j >= 0; --j)
        if (fabs_f(v[j]) == am) {
            has = true;
            neg = v[j] < 0.0f;
        }
    const u32 hb = warp_ballot(has), nb = warp_ballot(has && neg);
    const u32 first = hb & (0u - hb); // the lowest set bit
    const float mx = (nb & first) ? -am : am;
    const float iscale = -127.0f / mx;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        const int c = (int)rint_f(iscale * v[j]);
        q[j] = c < 127 ? c : 127;
    }
    return 1.0f / iscale;
}

// Store one super-block's K-format blocks (all 32 lanes call it; codes and d from
// q8k_warp_codes). b: the super-block's first block.
DEV void q8k_warp_store(block_q8_1* b, const int* q, float d) {
    const int lane = tid_x() & 31, j = lane >> 2;
    int s = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) s += q[i];
    s += shfl_xor_i(s, 1);
    s += shfl_xor_i(s, 2);
    u32 w0 = 0, w1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w0 |= ((u32)q[i] & 0xff) << (8 * i);
        w1 |= ((u32)q[4 + i] & 0xff) << (8 * i);
    }
    u32* qs = (u32*)b[j].qs + 2 * (lane & 3);
    qs[0] = w0;
    qs[1] = w1;
    if ((lane & 3) == 0) {
        const u32 bits = __builtin_bit_cast(u32, d);
        b[j].d = (u16)((j & 1) ? (bits >> 16) : (bits & 0xffff));
        b[j].s = (u16)(short)s;
    }
}

// K-format blocks of one row of n values (n % 256 == 0) by all threads of a block
// (nthr of them, a multiple of 32), after a barrier that made the row visible: warp w
// takes super-blocks w, w + nthr / 32, ...
DEV void q8k_row_store(const float* y, block_q8_1* q, int n, int nthr) {
    const int lane = tid_x() & 31;
    for (int sb = tid_x() >> 5; sb < n / 256; sb += nthr >> 5) {
        float v[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = y[sb * 256 + 8 * lane + j];
        int c[8];
        const float d = q8k_warp_codes(v, c);
        q8k_warp_store(q + sb * 8, c, d);
    }
}

// ---- matrix cores: one 16x16x16 f16 product, f32 accumulate, per 32-lane warp ----
// A: 16 (M) rows x 16 (K) f16 at sA (row stride lda, in u16 units), B: 16 (N) rows x 16 (K)
// f16 at sB (stride ldb): acc += A * B^T. Lane l's acc[i] is element (m, n) given by
// mma_coord(i, l). gfx11: one v_wmma_f32_16x16x16_f16 (wave32; A/B rows in lanes 0-15,
// replicated in 16-31; D element (2i + l/16, l%16)). NVIDIA: two mma.sync m16n8k16.
#ifdef LODE_AMD
typedef _Float16 lode_v16h __attribute__((ext_vector_type(16)));
typedef float lode_v8f __attribute__((ext_vector_type(8)));
DEV void mma16x16x16(const u16* sA, int lda, const u16* sB, int ldb, float* acc) {
    const int l = __builtin_amdgcn_mbcnt_lo(~0u, 0) & 15;
    lode_v16h a, b;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        a[k] = __builtin_bit_cast(_Float16, sA[l * lda + k]);
        b[k] = __builtin_bit_cast(_Float16, sB[l * ldb + k]);
    }
    lode_v8f c;
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = acc[i];
    c = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a, b, c);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[i] = c[i];
}
DEV void mma_coord(int i, int lane, int* m, int* n) {
    *m = 2 * i + (lane >> 4);
    *n = lane & 15;
}
#else
DEV u32 ld_h2(const u16* p) { return *(const u32*)p; }
DEV void mma16x16x16(const u16* sA, int lda, const u16* sB, int ldb, float* acc) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u32 a0 = ld_h2(sA + g * lda + 2 * t), a1 = ld_h2(sA + (g + 8) * lda + 2 * t);
    const u32 a2 = ld_h2(sA + g * lda + 2 * t + 8), a3 = ld_h2(sA + (g + 8) * lda + 2 * t + 8);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const u16* b = sB + (8 * h + g) * ldb;
        const u32 b0 = ld_h2(b + 2 * t), b1 = ld_h2(b + 2 * t + 8);
        float* c = acc + 4 * h;
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}
DEV void mma_coord(int i, int lane, int* m, int* n) {
    const int g = lane >> 2, t = lane & 3, h = i >> 2, j = i & 3;
    *m = g + ((j & 2) ? 8 : 0);
    *n = 8 * h + 2 * t + (j & 1);
}
#endif
