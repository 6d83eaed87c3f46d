// What a dependent step costs inside a thread-block cluster, against a graph of PDL launches:
// S steps in one launch; each step every block publishes 64 floats in its shared memory,
// passes one cluster barrier (arrive.release / wait.acquire), and reads 1024 floats back
// from the cluster's blocks (DSMEM), optionally reducing them over the block. Double
// buffering makes one barrier per step enough. Prices fusing two decode steps through a
// cluster instead of a kernel boundary (session 12, BENCHMARKS.md).
//   nvcc -O3 -arch=sm_90 cluster_step.cu -o cluster_step && ./cluster_step
#include <cstdio>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); return 1;} } while (0)

__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffff, v, m);
  int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  if (l == 0) red[w] = v;
  __syncthreads();
  float r = l < nw ? red[l] : 0.f;
  for (int m = 16; m > 0; m >>= 1) r += __shfl_xor_sync(0xffffffff, r, m);
  __syncthreads();
  return r;
}

// mode 0: read one remote value per thread; mode 1: and reduce over the block.
__global__ void __launch_bounds__(1024) chain(float* out, int steps, int mode) {
  __shared__ float buf[2][64];
  __shared__ float red[32];
  cg::cluster_group cl = cg::this_cluster();
  const int C = cl.num_blocks();
  const int t = threadIdx.x;
  float v = t * 0.001f + blockIdx.x;
  for (int s = 0; s < steps; ++s) {
    float* mine = buf[s & 1];
    if (t < 64) mine[t] = v;
    cl.sync();
    const float* rem = cl.map_shared_rank(mine, t % C);
    float r = rem[(t / C) % 64];
    v = mode ? block_sum(r, red) * 1e-3f + 1.f : r * 0.5f + 1.f;
  }
  cl.sync();  // no block leaves while another may still read its shared memory
  if (t < 32) out[blockIdx.x * 32 + t] = v;
}

// The same chain between kernels: one PDL launch per step, each block reading 1024 of the
// previous step's outputs (blocks x 64 of them).
__global__ void __launch_bounds__(1024) pdl_step(const float* in, float* out, int nin, int mode) {
  __shared__ float red[32];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  int t = threadIdx.x;
  float r = in[(t * 61 + blockIdx.x * 7) % nin];
  float v = mode ? block_sum(r, red) * 1e-3f + 1.f : r * 0.5f + 1.f;
  if (t < 64) out[blockIdx.x * 64 + t] = v;
}

int main() {
  float* o; CK(cudaMalloc(&o, 1 << 22));
  float *a, *b; CK(cudaMalloc(&a, 1 << 22)); CK(cudaMalloc(&b, 1 << 22));
  CK(cudaMemset(a, 0, 1 << 22)); CK(cudaMemset(b, 0, 1 << 22));
  CK(cudaFuncSetAttribute(chain, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  cudaStream_t st; CK(cudaStreamCreate(&st));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int threads : {1024, 256}) for (int mode = 0; mode < 2; ++mode) for (int C : {1, 2, 4, 8, 16}) {
    const int blocks = 128;
    auto run = [&](int steps) -> float {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(blocks); c.blockDim = dim3(threads); c.stream = st;
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeClusterDimension;
      at[0].val.clusterDim.x = C; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
      c.attrs = at; c.numAttrs = 1;
      std::vector<float> t;
      for (int r = 0; r < 15; ++r) {
        cudaEventRecord(e0, st);
        if (cudaLaunchKernelEx(&c, chain, o, steps, mode)) return -1.f;
        cudaEventRecord(e1, st); cudaEventSynchronize(e1);
        float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 3) t.push_back(ms * 1000.f);
      }
      std::sort(t.begin(), t.end()); return t[t.size() / 2];
    };
    float t0 = run(0), t1 = run(2000);
    cudaError_t e = cudaGetLastError();
    if (t0 < 0 || t1 < 0 || e) { printf("threads %4d mode %d cluster %2d: launch failed (%s)\n", threads, mode, C, cudaGetErrorString(e)); continue; }
    printf("threads %4d %-14s cluster %2d: %.3f us/step\n", threads, mode ? "read+reduce" : "read", C, (t1 - t0) / 2000.f);
  }
  for (int threads : {1024, 256}) for (int mode = 0; mode < 2; ++mode) {
    const int N = 140, blocks = 128;
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < N; ++i) {
      cudaLaunchConfig_t c = {}; c.gridDim = dim3(blocks); c.blockDim = dim3(threads); c.stream = st;
      cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
      c.attrs = at; c.numAttrs = 1;
      CK(cudaLaunchKernelEx(&c, pdl_step, (const float*)((i & 1) ? b : a), (i & 1) ? a : b, blocks * 64, mode));
    }
    CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<float> t;
    for (int r = 0; r < 25; ++r) { cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1)); float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) t.push_back(ms * 1000.f / N); }
    std::sort(t.begin(), t.end());
    printf("threads %4d %-14s PDL graph   : %.3f us/step\n", threads, mode ? "read+reduce" : "read", t[t.size() / 2]);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  }
  return 0;
}
