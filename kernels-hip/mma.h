// Matrix-core fragments for one 32-lane warp: the portability layer the prefill kernels
// (gemm.hip, flash_attn.hip) are written against, so one kernel source serves NVIDIA
// (mma.sync m16n8k16 + ldmatrix) and AMD gfx11 (v_wmma_f32_16x16x16_f16, wave32).
//
// Every product is 16 (M) x 16 (N) x 16 (K), f16 operands, f32 accumulation:
//   FragA: 16 rows (M) x 16 k of a row-major tile in shared memory (k contiguous);
//   FragB: 16 rows (N) x 16 k of a tile stored [N][K] (k contiguous): C += A * B^T;
//          frag_b_t loads it from a tile stored [K][N] instead (n contiguous);
//   FragC: the 16 x 16 f32 result; element i (0..7) of lane l is (m, n) = frag_coord(i, l).
// Shared tiles hold f16 as u16 bits; row strides (in u16) must keep every row start 16-byte
// aligned (stride % 8 == 0), and a stride of 8 (mod 64) avoids bank conflicts.
#pragma once
// (include after common.h: the run-time compile path inlines both in that order)

#ifdef LODE_AMD
typedef _Float16 mma_v16h __attribute__((ext_vector_type(16)));
typedef float mma_v8f __attribute__((ext_vector_type(8)));
typedef u32 mma_v4u __attribute__((ext_vector_type(4)));
struct FragA { mma_v16h v; };
struct FragB { mma_v16h v; };
struct FragC { mma_v8f v; };

DEV int mma_lane() { return __builtin_amdgcn_mbcnt_lo(~0u, 0); }
// gfx11 wave32 WMMA: lane l and lane l + 16 both hold row (A) / column (B) l % 16, all 16 k.
DEV void frag_a(FragA& a, const u16* s, int ld) {
    const u16* p = s + (mma_lane() & 15) * ld;
    const mma_v4u lo = *(const mma_v4u*)p, hi = *(const mma_v4u*)(p + 8);
    mma_v4u* d = (mma_v4u*)&a.v;
    d[0] = lo;
    d[1] = hi;
}
DEV void frag_b(FragB& b, const u16* s, int ld) {
    const u16* p = s + (mma_lane() & 15) * ld;
    const mma_v4u lo = *(const mma_v4u*)p, hi = *(const mma_v4u*)(p + 8);
    mma_v4u* d = (mma_v4u*)&b.v;
    d[0] = lo;
    d[1] = hi;
}
DEV void frag_b_t(FragB& b, const u16* s, int ld) {
    const int n = mma_lane() & 15;
#pragma unroll
    for (int k = 0; k < 16; ++k) b.v[k] = __builtin_bit_cast(_Float16, s[k * ld + n]);
}
DEV void frag_zero(FragC& c) {
#pragma unroll
    for (int i = 0; i < 8; ++i) c.v[i] = 0.0f;
}
DEV void mma(FragC& c, const FragA& a, const FragB& b) { c.v = __builtin_amdgcn_wmma_f32_16x16x16_f16_w32(a.v, b.v, c.v); }
DEV void frag_coord(int i, int lane, int* m, int* n) {
    *m = 2 * i + (lane >> 4);
    *n = lane & 15;
}
#else
struct FragA { u32 r[4]; };
struct FragB { u32 r[4]; };
struct FragC { float v[8]; };

DEV int mma_lane() { return threadIdx.x & 31; }
DEV u32 smem_addr(const void* p) {
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}
// ldmatrix.x4: lanes 8q..8q+7 give the row addresses of 8x8 matrix q.
DEV void frag_a(FragA& a, const u16* s, int ld) {
    const int l = mma_lane();
    const u32 p = smem_addr(s + (l & 15) * ld + (l >> 4) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(a.r[0]), "=r"(a.r[1]), "=r"(a.r[2]), "=r"(a.r[3]) : "r"(p));
}
// r[0], r[1]: k 0-7 and 8-15 of columns n 0-7; r[2], r[3]: the same for n 8-15.
DEV void frag_b(FragB& b, const u16* s, int ld) {
    const int l = mma_lane();
    const u32 p = smem_addr(s + ((l & 7) + ((l >> 4) << 3)) * ld + ((l >> 3) & 1) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(b.r[0]), "=r"(b.r[1]), "=r"(b.r[2]), "=r"(b.r[3]) : "r"(p));
}
DEV void frag_b_t(FragB& b, const u16* s, int ld) {
    const int l = mma_lane();
    const u32 p = smem_addr(s + (l & 15) * ld + (l >> 4) * 8);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];" : "=r"(b.r[0]), "=r"(b.r[1]), "=r"(b.r[2]), "=r"(b.r[3]) : "r"(p));
}
DEV void frag_zero(FragC& c) {
#pragma unroll
    for (int i = 0; i < 8; ++i) c.v[i] = 0.0f;
}
DEV void mma(FragC& c, const FragA& a, const FragB& b) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float* d = c.v + 4 * h;
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a.r[0]), "r"(a.r[1]), "r"(a.r[2]), "r"(a.r[3]), "r"(b.r[2 * h]), "r"(b.r[2 * h + 1]));
    }
}
DEV void frag_coord(int i, int lane, int* m, int* n) {
    const int g = lane >> 2, t = lane & 3, h = i >> 2, j = i & 3;
    *m = g + ((j & 2) ? 8 : 0);
    *n = 8 * h + 2 * t + (j & 1);
}
#endif

// Row slots of a FragC, for softmax in registers without knowing the layout: a lane holds
// FRAG_ROWS distinct rows; element i lies in row slot frag_slot(i), which is row
// frag_slot_row(s, lane) (the same m frag_coord gives), and the FRAG_ROW_LANES lanes that
// share a row differ only in their low log2(FRAG_ROW_LANES) lane bits, so frag_row_max /
// frag_row_sum reduce a row over them with xor shuffles.
#ifdef LODE_AMD
#define FRAG_ROWS 8
#define FRAG_ROW_LANES 16
DEV int frag_slot(int i) { return i; }
DEV int frag_slot_row(int s, int lane) { return 2 * s + (lane >> 4); }
#else
#define FRAG_ROWS 2
#define FRAG_ROW_LANES 4
DEV int frag_slot(int i) { return (i >> 1) & 1; }
DEV int frag_slot_row(int s, int lane) { return (lane >> 2) + 8 * s; }
#endif
DEV float frag_row_max(float v) {
#pragma unroll
    for (int m = 1; m < FRAG_ROW_LANES; m <<= 1) v = fmax_f(v, shfl_xor(v, m));
    return v;
}
DEV float frag_row_sum(float v) {
#pragma unroll
    for (int m = 1; m < FRAG_ROW_LANES; m <<= 1) v += shfl_xor(v, m);
    return v;
}

// Two f32 -> two f16 bits packed low | high << 16 (one cvt.rn.f16x2.f32 on NVIDIA).
#ifdef LODE_AMD
DEV u32 pack_h2(float a, float b) { return (u32)f2h(a) | ((u32)f2h(b) << 16); }
#else
DEV u32 pack_h2(float a, float b) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(b), "f"(a));
    return r;
}
#endif

// (float)q - bias for a small unsigned integer q (< 2^23) without an int->float
// conversion (those issue at a quarter of the FMA rate): 2^23 + q has q as its mantissa.
DEV float qf(u32 q, float bias) { return __builtin_bit_cast(float, 0x4B000000u | q) - (8388608.0f + bias); }

struct __attribute__((aligned(16))) mma_u4 { u32 x, y, z, w; };
DEV void st_u4(u16* p, u32 a, u32 b, u32 c, u32 d) {
    mma_u4 v;
    v.x = a;
    v.y = b;
    v.z = c;
    v.w = d;
    *(mma_u4*)p = v;
}

// A 16 x 16 FragC (rows m, columns n) as the A operand (rows m, k = n) of the next product,
// rounded to f16: flash attention's P for PV. NVIDIA: the m16n8k16 accumulator layout is
// the A layout, so it is register packing only and `scratch` is unused. AMD: the
// accumulator holds columns per lane and the A operand rows, so it goes through `scratch`
// (16 rows x ld u16, private to the calling wave, 16-byte aligned rows).
// MMA_C_IS_A: whether frag_a_from_c is register-only (a kernel may instead stage a FragC
// in shared memory with frag_c_store and read it back with frag_a where it is not).
#ifdef LODE_AMD
#define MMA_C_IS_A 0
DEV void frag_a_from_c(FragA& a, const FragC& c, u16* scratch, int ld) {
    const int lane = mma_lane();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int m, n;
        frag_coord(i, lane, &m, &n);
        scratch[m * ld + n] = f2h(c.v[i]);
    }
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
    frag_a(a, scratch, ld);
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#else
#define MMA_C_IS_A 1
DEV void frag_a_from_c(FragA& a, const FragC& c, u16*, int) {
    a.r[0] = pack_h2(c.v[0], c.v[1]); // row g,     k 2t, 2t+1
    a.r[1] = pack_h2(c.v[2], c.v[3]); // row g + 8, k 2t, 2t+1
    a.r[2] = pack_h2(c.v[4], c.v[5]); // row g,     k 2t+8, 2t+9
    a.r[3] = pack_h2(c.v[6], c.v[7]); // row g + 8, k 2t+8, 2t+9
}
#endif

// A FragC rounded to f16 into a row-major shared tile (row m at s + m * ld), any layout.
DEV void frag_c_store(const FragC& c, u16* s, int ld) {
    const int lane = mma_lane();
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        int m, n;
        frag_coord(i, lane, &m, &n);
        s[m * ld + n] = f2h(c.v[i]);
    }
}
