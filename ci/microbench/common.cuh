// Shared by the standalone matvec microbenchmarks: the block type and the few device
// helpers they use (copies of kernels-hip/common.h's, in plain CUDA).
#pragma once
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
typedef uint8_t u8; typedef uint16_t u16; typedef uint32_t u32; typedef int8_t i8;
struct block_q8_1 { u16 d, s; i8 qs[32]; };
__device__ __forceinline__ int dot4(int a, int b, int c) { int r; asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c)); return r; }
__device__ __forceinline__ float h2f(u16 h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) { const u16* q = (const u16*)p; return (u32)q[0] | ((u32)q[1] << 16); }
__device__ __forceinline__ float warp_sum(float v) { for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffff, v, m); return v; }
__device__ __forceinline__ float q8k_scale(const block_q8_1* e) { return __uint_as_float((u32)e[0].d | ((u32)e[1].d << 16)); }
struct __align__(16) u32x4 { u32 x, y, z, w; };

// Ceiling: stream all bytes with 16-B loads.
__global__ void stream_k(const uint4* W, size_t n16, float* y) {
  uint4 a = make_uint4(0,0,0,0);
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) { uint4 v = W[i]; a.x ^= v.x; a.y ^= v.y; a.z ^= v.z; a.w ^= v.w; }
  if ((a.x ^ a.y ^ a.z ^ a.w) == 0x12345678) y[0] = 1.f;
}
