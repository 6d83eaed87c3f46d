// Micro-benchmark: cost of a kernel boundary in a CUDA graph vs a software grid barrier.
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>
__global__ void empty_k(float* p) { if (threadIdx.x == 0 && blockIdx.x == 0 && p) p[0] += 1.0f; }
// load a little memory like a small matvec: each block reads 'bytes' per block
__global__ void small_k(const float4* w, float* out, int per_block) {
  float4 a = make_float4(0,0,0,0);
  const float4* p = w + (size_t)blockIdx.x * per_block;
  for (int i = threadIdx.x; i < per_block; i += blockDim.x) { float4 v = p[i]; a.x += v.x; a.y += v.y; }
  if (a.x == 12345.f) out[0] = a.y;
}
__device__ unsigned g_count, g_gen;
__device__ __forceinline__ void grid_barrier(unsigned G) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* gen = &g_gen;
    unsigned my = *gen;
    __threadfence();
    if (atomicAdd(&g_count, 1) == G - 1) { g_count = 0; __threadfence(); atomicAdd(&g_gen, 1); }
    else { while (*gen == my) { } }
    __threadfence();
  }
  __syncthreads();
}
__global__ void barrier_k(int n, const float4* w, float* out, int per_block, int work) {
  for (int i = 0; i < n; ++i) {
    if (work) {
      float4 a = make_float4(0,0,0,0);
      const float4* p = w + ((size_t)blockIdx.x + (size_t)(i % 16) * gridDim.x) * per_block;
      for (int j = threadIdx.x; j < per_block; j += blockDim.x) { float4 v = p[j]; a.x += v.x; a.y += v.y; }
      if (a.x == 12345.f) out[0] = a.y;
    }
    grid_barrier(gridDim.x);
  }
}
int main() {
  cudaDeviceProp pr; cudaGetDeviceProperties(&pr, 0);
  int S = pr.multiProcessorCount; printf("SMs %d L2 %d MB\n", S, pr.l2CacheSize >> 20);
  cudaStream_t st; cudaStreamCreate(&st);
  float* out; cudaMalloc(&out, 4);
  size_t wb = 1ull << 30; float4* w; cudaMalloc(&w, wb); cudaMemset(w, 0, wb);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int N = 200;
  int per_block_small = 4096 / 16; // 4 KB per block
  for (int variant = 0; variant < 4; ++variant) {
    int blocks = variant < 2 ? S : S * 4; int threads = 256;
    cudaGraph_t g; cudaGraphExec_t ge;
    cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal);
    for (int i = 0; i < N; ++i) {
      if (variant % 2 == 0) empty_k<<<blocks, threads, 0, st>>>(nullptr);
      else small_k<<<blocks, threads, 0, st>>>(w + (size_t)(i % 16) * blocks * per_block_small, out, per_block_small);
    }
    cudaStreamEndCapture(st, &g); cudaGraphInstantiate(&ge, g, 0);
    std::vector<float> ts;
    for (int r = 0; r < 8; ++r) { cudaEventRecord(e0, st); cudaGraphLaunch(ge, st); cudaEventRecord(e1, st); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms); }
    std::sort(ts.begin(), ts.end());
    printf("graph %s blocks=%d: %.3f us per kernel (median)\n", variant % 2 ? "small4KB" : "empty", blocks, ts[4] * 1000 / N);
  }
  for (int variant = 0; variant < 4; ++variant) {
    int threads = variant < 2 ? 256 : 512; int work = variant % 2;
    std::vector<float> ts;
    for (int r = 0; r < 8; ++r) {
      cudaEventRecord(e0, st);
      void* args[] = {(void*)&N, (void*)&w, (void*)&out, (void*)&per_block_small, (void*)&work};
      cudaLaunchCooperativeKernel((void*)barrier_k, S, threads, args, 0, st);
      cudaEventRecord(e1, st); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    printf("barrier threads=%d work=%d: %.3f us per barrier (median) err=%s\n", threads, work, ts[4] * 1000 / N, cudaGetErrorString(cudaGetLastError()));
  }
  return 0;
}
