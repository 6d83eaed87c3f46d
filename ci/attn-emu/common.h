// Host emulation of kernels-hip/common.h for ci/attn-emu (see run.sh): one block at a time,
// one std::thread per GPU thread, __shared__ = static, the lanes of a 32-lane warp exchange
// values through arrays between per-warp barriers. Only what attn_decode.hip uses.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
typedef uint8_t u8; typedef int8_t i8; typedef uint16_t u16; typedef uint32_t u32; typedef int32_t i32; typedef uint64_t u64;
#define LODE_NV 1
#define DEV static inline
#define KERNEL extern "C"
#define __shared__ static
#define LAUNCH_BOUNDS(n)
#define AD_MAX_WARPS 16
struct Dim3 { unsigned x, y, z; };
extern thread_local Dim3 threadIdx, blockIdx;
extern std::barrier<>* g_block_bar;
extern std::barrier<>* g_warp_bar[AD_MAX_WARPS];
extern float g_xf[AD_MAX_WARPS][32];
DEV u32 tid_x() { return threadIdx.x; }
DEV u32 bid_x() { return blockIdx.x; }
DEV u32 bid_y() { return blockIdx.y; }
DEV u32 bid_z() { return blockIdx.z; }
DEV void pdl_entry() {}
#define sync lode_sync
DEV void sync() { g_block_bar->arrive_and_wait(); }
DEV void wsync() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
DEV void __syncwarp() { wsync(); }
DEV void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
DEV u32 atomicAdd(u32* p, u32 v) { return std::atomic_ref<u32>(*p).fetch_add(v); }
DEV float shfl_xor(float v, int m) { int w = threadIdx.x / 32, l = threadIdx.x % 32; g_xf[w][l] = v; wsync(); float r = g_xf[w][l ^ m]; wsync(); return r; }
DEV float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
DEV u16 f2h(float f) { _Float16 h = (_Float16)f; u16 r; memcpy(&r, &h, 2); return r; }
DEV float exp2_fast(float x) { return exp2f(x); }
DEV float sqrt_f(float x) { return sqrtf(x); }
DEV float fabs_f(float x) { return fabsf(x); }
DEV float fmax_f(float a, float b) { return fmaxf(a, b); }
DEV float rint_f(float x) { return rintf(x); }
DEV float fma_f(float a, float b, float c) { return fmaf(a, b, c); }
DEV float warp_sum(float v) { for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m); return v; }
DEV float warp_max(float v) { for (int m = 16; m > 0; m >>= 1) v = fmax_f(v, shfl_xor(v, m)); return v; }
// kernels-hip/common.h's sincos_p, the same arithmetic.
DEV void sincos_p(float x, float* s, float* c) {
    float k = rint_f(x * 0.63661977236758134f);
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
struct block_q8_1 { u16 d; u16 s; i8 qs[32]; };
DEV void q8_block_store(block_q8_1* b, float v) {
    const int lane = tid_x() & 31;
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    const float qsum = warp_sum((float)c);
    b->qs[lane] = (i8)c;
    if (lane == 0) { b->d = f2h(d); b->s = f2h(d * qsum); }
}
