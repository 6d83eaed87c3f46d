// What a kernel's output costs at the end of a dependent step: a graph of 140 PDL launches
// (1024-thread blocks, each reading the previous step's output after griddepcontrol.wait),
// ending with plain stores (32 or 1024 per block) or with one atomic add per thread into a
// 1024-entry accumulator shared by all blocks (u64 red, f32 atomicAdd, f32 v4 red). It priced
// a split-K fold of the o / down projections into the kernel before them (session 11,
// BENCHMARKS.md): with 96 blocks the atomics add ~0.85 µs per step.
//   nvcc -O3 -arch=sm_90 atomics_step.cu -o atomics_step && ./atomics_step
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1;} } while (0)
typedef unsigned long long u64;
__global__ void __launch_bounds__(1024) step(const float* in, float* out, u64* acc, float* facc, int mode, int nin) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  int t = threadIdx.x;
  float v = in[(t + blockIdx.x * 7) % nin] * 0.5f + 1.0f;
  if (mode == 0) { if (t < 32) out[blockIdx.x * 32 + t] = v; }
  else if (mode == 1) { out[blockIdx.x * 1024 + t] = v; }
  else if (mode == 2) { long long q = __float2ll_rn(v * 4294967296.0f); asm volatile("red.global.add.u64 [%0], %1;" :: "l"(acc + t), "l"(q) : "memory"); if (t < 32) out[blockIdx.x * 32 + t] = v; }
  else if (mode == 3) { atomicAdd(facc + t, v); if (t < 32) out[blockIdx.x * 32 + t] = v; }
  else if (mode == 4) { if (t < 256) asm volatile("red.global.add.v4.f32 [%0], {%1,%1,%1,%1};" :: "l"(facc + 4 * t), "f"(v) : "memory"); if (t < 32) out[blockIdx.x * 32 + t] = v; }
  else if (mode == 5) { // 2 u64 per thread for 512 threads: same count, fewer threads
    if (t < 512) { long long q = __float2ll_rn(v * 4294967296.0f); asm volatile("red.global.add.u64 [%0], %1;" :: "l"(acc + 2 * t), "l"(q) : "memory"); asm volatile("red.global.add.u64 [%0], %1;" :: "l"(acc + 2 * t + 1), "l"(q) : "memory"); }
    if (t < 32) out[blockIdx.x * 32 + t] = v; }
}
int main() {
  cudaStream_t st; CK(cudaStreamCreate(&st));
  float *a, *b, *facc; u64* acc;
  CK(cudaMalloc(&a, 1 << 22)); CK(cudaMalloc(&b, 1 << 22)); CK(cudaMalloc(&facc, 1 << 16)); CK(cudaMalloc(&acc, 1 << 16));
  CK(cudaMemset(a, 0, 1 << 22)); CK(cudaMemset(b, 0, 1 << 22)); CK(cudaMemset(acc, 0, 1 << 16)); CK(cudaMemset(facc, 0, 1 << 16));
  const char* nm[] = {"plain 32/blk", "plain 1024/blk", "red.u64 1024/blk", "atomicAdd f32 1024/blk", "red.v4.f32 256/blk", "red.u64 2x512"};
  for (int blocks : {16, 64, 96}) for (int mode = 0; mode < 6; ++mode) {
    const int N = 140;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < N; ++i) {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(blocks); c.blockDim = dim3(1024); c.stream = st;
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
      c.attrs = at; c.numAttrs = 1;
      const float* in = (i & 1) ? b : a; float* out = (i & 1) ? a : b;
      int nin = mode == 1 ? blocks * 1024 : blocks * 32;
      CK(cudaLaunchKernelEx(&c, step, in, out, acc, facc, mode, nin));
    }
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    std::vector<float> t;
    for (int r = 0; r < 25; ++r) { cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) t.push_back(ms * 1000.f / N); }
    std::sort(t.begin(), t.end());
    printf("blocks %3d %-24s %.3f us/step (p10 %.3f p90 %.3f)\n", blocks, nm[mode], t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10]);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  return 0;
}
