// What a dependent step costs on the GPU, three ways (BENCHMARKS.md, session 8): a graph
// of kernel launches (with and without programmatic dependent launch), one persistent
// kernel with a grid barrier, and one with per-step arrival counters. Each step: every
// block reads all the previous step's values (as a norm reads all of x), reduces, writes
// one value. A standalone program, not part of lode; build here and carry it:
//   N=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13
//   $N/bin/nvcc -arch=sm_90 -O3 -I $N/include -L $N/lib ci/boundary-bench.cu -o carry/mb/mb
#include <cstdio>
#include <cuda_runtime.h>
#include <vector>
#include <algorithm>
#include <chrono>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// One step: every block reads all nb values of the previous step (like a norm over x),
// reduces, writes its own value.
__device__ __forceinline__ void step_body(const float* in, float* out, int nb) {
    __shared__ float red[32];
    float v = 0.f;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) v += __ldcg(in + i);
    for (int m = 16; m; m >>= 1) v += __shfl_xor_sync(~0u, v, m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x < 32) {
        float w = threadIdx.x < blockDim.x / 32 ? red[threadIdx.x] : 0.f;
        for (int m = 16; m; m >>= 1) w += __shfl_xor_sync(~0u, w, m);
        if (threadIdx.x == 0) out[blockIdx.x] = w * (1.0f / nb) + 1.0f;
    }
    __syncthreads();
}
__global__ void step_k(const float* in, float* out, int nb) { pdl_wait(); step_body(in, out, nb); }

__device__ unsigned bar_count, bar_gen;
__device__ __forceinline__ void grid_bar(unsigned nblocks, unsigned& gen) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned g = gen;
        __threadfence();
        unsigned t = atomicAdd(&bar_count, 1u);
        if (t == nblocks - 1) { atomicExch(&bar_count, 0u); __threadfence(); atomicExch(&bar_gen, g + 1); }
        else { while (true) { unsigned cur; asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(cur) : "l"(&bar_gen)); if (cur != g) break; } }
        __threadfence();
    }
    gen++;
    __syncthreads();
}
__global__ void persist_k(float* buf, int nb, int steps, unsigned gen0) {
    pdl_wait();
    unsigned gen = gen0;
    for (int s = 0; s < steps; ++s) {
        step_body(buf + (size_t)s * 1024, buf + (size_t)(s + 1) * 1024, nb);
        grid_bar(gridDim.x, gen);
    }
}
// Flag variant: per-step arrival counters (monotonic), no reset: block waits until counter[s] == nb.
__global__ void flags_k(float* buf, unsigned* cnt, int nb, int steps, unsigned epoch) {
    pdl_wait();
    for (int s = 0; s < steps; ++s) {
        step_body(buf + (size_t)s * 1024, buf + (size_t)(s + 1) * 1024, nb);
        if (threadIdx.x == 0) {
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" :: "l"(cnt + s) : "memory");
            unsigned target = (epoch + 1) * nb;
            while (true) { unsigned cur; asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(cur) : "l"(cnt + s)); if (cur >= target) break; }
        }
        __syncthreads();
    }
}

int main() {
    int dev = 0; cudaDeviceProp p; CK(cudaGetDeviceProperties(&p, dev));
    const int nsm = p.multiProcessorCount;
    const int steps = 140;
    float* buf; CK(cudaMalloc(&buf, sizeof(float) * 1024 * (steps + 2))); CK(cudaMemset(buf, 0, sizeof(float) * 1024 * (steps + 2)));
    unsigned* cnt; CK(cudaMalloc(&cnt, 4 * steps)); CK(cudaMemset(cnt, 0, 4 * steps));
    cudaStream_t st; CK(cudaStreamCreate(&st));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    int threads_list[2] = {1024, 256};
    for (int ti = 0; ti < 2; ++ti) {
        int thr = threads_list[ti];
        int per = thr == 1024 ? 1 : 4;
        int nb = nsm * per;
        for (int pdl = 0; pdl < 2; ++pdl) {
            cudaGraph_t g; cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
            for (int s = 0; s < steps; ++s) {
                cudaLaunchConfig_t cfg = {}; cfg.gridDim = nb; cfg.blockDim = thr; cfg.stream = st;
                cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
                cfg.attrs = at; cfg.numAttrs = pdl;
                const float* in = buf + (size_t)s * 1024; float* out = buf + (size_t)(s + 1) * 1024;
                CK(cudaLaunchKernelEx(&cfg, step_k, in, out, nb));
            }
            CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
            for (int w = 0; w < 5; ++w) CK(cudaGraphLaunch(ge, st));
            CK(cudaStreamSynchronize(st));
            const int R = 50; std::vector<float> ts;
            for (int r = 0; r < R; ++r) { cudaEventRecord(e0, st); cudaGraphLaunch(ge, st); cudaEventRecord(e1, st); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms); }
            std::sort(ts.begin(), ts.end());
            printf("graph thr=%4d blocks=%d pdl=%d: median %.2f us/step\n", thr, nb, pdl, ts[R / 2] * 1000 / steps);
        }
        // persistent
        {
            unsigned gen = 0; unsigned h0 = 0; CK(cudaMemcpyToSymbol(bar_count, &h0, 4)); CK(cudaMemcpyToSymbol(bar_gen, &h0, 4));
            std::vector<float> ts; const int R = 50;
            for (int r = 0; r < R + 5; ++r) {
                cudaEventRecord(e0, st); persist_k<<<nb, thr, 0, st>>>(buf, nb, steps, gen); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
                gen += steps; float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) ts.push_back(ms);
            }
            std::sort(ts.begin(), ts.end());
            printf("persist barrier thr=%4d blocks=%d: median %.2f us/step\n", thr, nb, ts[R / 2] * 1000 / steps);
        }
        {
            CK(cudaMemset(cnt, 0, 4 * steps));
            std::vector<float> ts; const int R = 50;
            for (int r = 0; r < R + 5; ++r) {
                cudaEventRecord(e0, st); flags_k<<<nb, thr, 0, st>>>(buf, cnt, nb, steps, r); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
                float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) ts.push_back(ms);
            }
            std::sort(ts.begin(), ts.end());
            printf("persist flags   thr=%4d blocks=%d: median %.2f us/step\n", thr, nb, ts[R / 2] * 1000 / steps);
        }
    }
    CK(cudaGetLastError());
    return 0;
}
