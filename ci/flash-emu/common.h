// Host emulation of kernels-hip/common.h for ci/flash-emu (see run.sh): one block at a time,
// one std::thread per GPU thread, __shared__ = static, the lanes of a 32-lane warp exchange
// values through arrays between per-warp barriers. LODE_AMD selects mma.h's gfx11 branch.
#pragma once
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef uint64_t u64;
#ifndef LODE_AMD
#define LODE_NV 1
#endif
#define DEV static inline
#define KERNEL extern "C"
#define __shared__ static
#define LAUNCH_BOUNDS(n)
struct Dim3 { unsigned x, y, z; };
extern thread_local Dim3 threadIdx, blockIdx;
extern std::barrier<>* g_block_bar;
extern std::barrier<>* g_warp_bar[8];
DEV u32 tid_x() { return threadIdx.x; }
DEV u32 bid_x() { return blockIdx.x; }
DEV u32 bid_y() { return blockIdx.y; }
#include <unistd.h>
#define sync lode_sync
DEV void sync() { g_block_bar->arrive_and_wait(); }
DEV void wsync() { g_warp_bar[threadIdx.x / 32]->arrive_and_wait(); }
extern float g_xf[8][32];
DEV float shfl_xor(float v, int m) { int w = threadIdx.x / 32, l = threadIdx.x % 32; g_xf[w][l] = v; wsync(); float r = g_xf[w][l ^ m]; wsync(); return r; }
DEV float h2f(u16 h) { _Float16 f; memcpy(&f, &h, 2); return (float)f; }
DEV u16 f2h(float f) { _Float16 h = (_Float16)f; u16 r; memcpy(&r, &h, 2); return r; }
DEV float exp2_fast(float x) { return exp2f(x); }
DEV float fmax_f(float a, float b) { return fmaxf(a, b); }
DEV float exp_fast(float x) { return exp2_fast(x * 1.4426950408889634f); }
