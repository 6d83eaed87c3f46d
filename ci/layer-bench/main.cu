// One decode layer of the Qwen3-0.6B shape — decode_mv_norm4 (q/k/v), attn_decode,
// decode_mv_quant (o, into the residual), decode_mv_glu4 (gate/up), decode_mv_quant (down)
// — 28 times as one graph of PDL launches, lode's kernels compiled from kernels-hip/ as
// they are, with synthetic Q4_K weights (distinct per layer: 248 MB, read from DRAM).
// Prints the time per layer, then with one kernel of each layer replaced by an empty one
// (its marginal cost), with only one kept, and (variants 11-13) with the o and / or down
// launch left out altogether (what a dependent step costs in the chain; the results are
// then wrong). Weights and the residual are scaled so values stay O(1) (the residual is
// restored before every run). A standalone program, not part of lode:
// kernel changes are timed here in seconds of device time, without the runtime.
//   N=$(python3 -c 'import nvidia,os;print(os.path.dirname(nvidia.__path__[0]))')/nvidia/cu13
//   $N/bin/nvcc -arch=sm_90 -O3 -std=c++17 -DLODE_NV -I kernels-hip -I $N/include -I $N/include/cccl \
//     -L $N/lib -x cu ci/layer-bench/main.cu -x cu ci/layer-bench/mv.cu -x cu ci/layer-bench/at.cu -o carry/lb/layer
//   ./layer [position=64] [shared: every layer reads layer 0's weights, from L2] [q/k/v kernel: 1k | h1k]
//           [gate/up kernel: 1k | h1k] [variants to run, 1-14]
// First it checks the chosen q/k/v and gate/up kernels against the 1k ones, bit for bit.
// H200, session 10: 14.9 µs per layer with the 1k kernels, 13.5 with the half-warp ones
// (marginal: q/k/v norm 2.0, attention 1.9, o 0.3, gate/up 2.5, down 0.9 µs). Session 11:
// without the o launch 11.5, without down 11.3-11.5, without both 9.05 (BENCHMARKS.md).
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)
typedef unsigned char u8; typedef unsigned int u32; typedef unsigned short u16;
extern "C" __global__ void decode_mv_norm4_1k(const float*, const float*, const float*, float*, u32*, int, int, float, const u8*, float*, int, int, const u8*, float*, int, int, const u8*, float*, int, int);
extern "C" __global__ void decode_mv_norm4_h1k(const float*, const float*, const float*, float*, u32*, int, int, float, const u8*, float*, int, int, const u8*, float*, int, int, const u8*, float*, int, int);
extern "C" __global__ void decode_mv_glu4_h1k(const float*, const float*, const float*, float*, u32*, int, int, float, const u8*, const u8*, float*, int, int, int);
extern "C" __global__ void decode_mv_glu4_1k(const float*, const float*, const float*, float*, u32*, int, int, float, const u8*, const u8*, float*, int, int, int);
extern "C" __global__ void decode_mv_quant(const float*, int, const u8*, float*, int, int, int, int, int);
extern "C" __global__ void attn_decode_d128(const float*, const float*, const float*, u16*, u16*, float*, void*, const float*, const float*, const float*, const int*, float*, u32*, int, int, int, int, int, float, float, float, float, float, int, int, int, int);
__global__ void empty_k() { asm volatile("griddepcontrol.wait;" ::: "memory"); asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

static cudaStream_t st;
template <typename... A>
void L(void (*k)(A...), dim3 g, dim3 b, A... args) {
    cudaLaunchConfig_t c = {}; c.gridDim = g; c.blockDim = b; c.stream = st;
    cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
    c.attrs = at; c.numAttrs = 1;
    CK(cudaLaunchKernelEx(&c, k, args...));
}
void E() { L(empty_k, dim3(1), dim3(32)); }
u8* q4k(size_t rows, size_t k) {
    size_t nb = rows * (k / 256), bytes = nb * 144;
    std::vector<u8> h(bytes);
    for (size_t i = 0; i < bytes; ++i) h[i] = rand() & 255;
    for (size_t i = 0; i < nb; ++i) { u16 d = 0x0400, m = 0x0200; /* 2^-14, 2^-15: products stay O(1) */ memcpy(&h[i * 144], &d, 2); memcpy(&h[i * 144 + 2], &m, 2); }
    u8* p; CK(cudaMalloc(&p, bytes)); CK(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice)); return p;
}
float* fbuf(size_t n, float v, bool rnd) {
    std::vector<float> h(n); for (size_t i = 0; i < n; ++i) h[i] = rnd ? (rand() / (float)RAND_MAX - 0.5f) : v;
    float* p; CK(cudaMalloc(&p, n * 4)); CK(cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice)); return p;
}
int main(int argc, char** argv) {
    const int NL = 28, n = 1024, nq = 2048, nkv = 1024, nff = 3072, n_ctx = 256;
    const int P = argc > 1 ? atoi(argv[1]) : 64;
    CK(cudaStreamCreate(&st));
    struct Lw { u8 *q, *k, *v, *o, *g, *u, *d; };
    std::vector<Lw> W(NL);
    const bool shared = argc > 2 && !strcmp(argv[2], "shared");
    for (size_t l = 0; l < W.size(); ++l) W[l] = (shared && l > 0) ? W[0] : Lw{q4k(nq, n), q4k(nkv, n), q4k(nkv, n), q4k(n, nq), q4k(nff, n), q4k(nff, n), q4k(n, nff)};
    if (shared) printf("every layer reads layer 0's weights (L2-resident)\n");
    float *x = fbuf(n, 0, true), *xb = fbuf(n, 0, false), *nw = fbuf(n, 1, false), *q = fbuf(nq, 0, true), *k = fbuf(nkv, 0, true), *v = fbuf(nkv, 0, true);
    float *att = fbuf(nq, 0, false), *hb = fbuf(nff, 0, false), *hw = fbuf(128, 1, false), *part = fbuf(16 * 4 * 130, 0, false);
    float* xinit = fbuf(n, 0, true);
    u32* cnt; CK(cudaMalloc(&cnt, 4096)); CK(cudaMemset(cnt, 0, 4096));
    int* pos; CK(cudaMalloc(&pos, 4)); CK(cudaMemcpy(pos, &P, 4, cudaMemcpyHostToDevice));
    std::vector<u16*> kc(NL), vc(NL);
    for (int l = 0; l < NL; ++l) {
        std::vector<u16> h((size_t)n_ctx * nkv); for (auto& e : h) e = __half_as_ushort(__float2half(rand() / (float)RAND_MAX - 0.5f));
        CK(cudaMalloc(&kc[l], h.size() * 2)); CK(cudaMalloc(&vc[l], h.size() * 2));
        CK(cudaMemcpy(kc[l], h.data(), h.size() * 2, cudaMemcpyHostToDevice)); CK(cudaMemcpy(vc[l], h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    const float eps = 1e-6f, theta = powf(1e6f, -2.0f / 128);
    const char* nv = argc > 3 ? argv[3] : "1k";
    const char* gv = argc > 4 ? argv[4] : "1k";
    auto normk = [&](const char* v) { return !strcmp(v, "h1k") ? decode_mv_norm4_h1k : decode_mv_norm4_1k; };
    auto normg = [&](const char* v) { return !strcmp(v, "h1k") ? dim3(64) : dim3(128); };
    auto normb = [&](const char*) { return dim3(1024); };
    auto gluk = [&](const char* v) { return !strcmp(v, "h1k") ? decode_mv_glu4_h1k : decode_mv_glu4_1k; };
    auto glug = [&](const char*) { return dim3(96); };
    auto glub = [&](const char*) { return dim3(1024); };
    {   // bits: the variant against the 1k kernels, one launch each
        auto run = [&](const char* a_, const char* b_, std::vector<float>& out) {
            L(normk(a_), normg(a_), normb(a_), (const float*)x, (const float*)nullptr, (const float*)nw, xb, cnt + 512, (int)normg(a_).x, n, eps,
              (const u8*)W[0].q, q, nq, 10, (const u8*)W[0].k, k, nkv, 10, (const u8*)W[0].v, v, nkv, 10);
            L(gluk(b_), glug(b_), glub(b_), (const float*)x, (const float*)nullptr, (const float*)nw, xb, cnt + 520, (int)glug(b_).x, n, eps,
              (const u8*)W[0].g, (const u8*)W[0].u, hb, nff, 10, 0);
            CK(cudaStreamSynchronize(st));
            out.assign(nq + 2 * nkv + nff, 0);
            CK(cudaMemcpy(out.data(), q, nq * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(out.data() + nq, k, nkv * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(out.data() + nq + nkv, v, nkv * 4, cudaMemcpyDeviceToHost)); CK(cudaMemcpy(out.data() + nq + 2 * nkv, hb, nff * 4, cudaMemcpyDeviceToHost));
        };
        std::vector<float> r0, r1; run("1k", "1k", r0); run(nv, gv, r1);
        int diff = 0; for (size_t i = 0; i < r0.size(); ++i) diff += memcmp(&r0[i], &r1[i], 4) != 0;
        printf("norm %s / glu %s against 1k / 1k: %d of %zu outputs differ in bits (q[0] %g vs %g, hb[0] %g vs %g)\n", nv, gv, diff, r0.size(), r0[0], r1[0], r0[nq + 2 * nkv], r1[nq + 2 * nkv]);
    }
    const char* names[] = {"full", "-norm4_1k", "-attn", "-o", "-glu4_1k", "-down", "only norm4_1k", "only attn", "only o", "only glu4_1k", "only down", "no o step", "no down step", "no o, no down step"};
    const int nvars = argc > 5 ? atoi(argv[5]) : 11;
    for (int var = 0; var < nvars; ++var) {
        auto on = [&](int i) { return var == 0 || var >= 11 ? true : var <= 5 ? var - 1 != i : var - 6 == i; };
        // Variants 11-13 drop the o / down launch altogether (not even an empty kernel).
        auto dropped = [&](int i) { return (i == 2 && (var == 11 || var == 13)) || (i == 4 && (var == 12 || var == 13)); };
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int l = 0; l < NL; ++l) {
            const Lw& w = W[l];
            if (on(0)) L(normk(nv), normg(nv), normb(nv), (const float*)x, (const float*)nullptr, (const float*)nw, xb, cnt + 512, (int)normg(nv).x, n, eps,
                         (const u8*)w.q, q, nq, 10, (const u8*)w.k, k, nkv, 10, (const u8*)w.v, v, nkv, 10); else E();
            if (on(1)) L(attn_decode_d128, dim3(2, 8, 1), dim3(512), (const float*)q, (const float*)k, (const float*)v, kc[l], vc[l], att, (void*)nullptr,
                         (const float*)hw, (const float*)hw, (const float*)nullptr, (const int*)pos, part, cnt, 2, 8, n_ctx, 128, 1, theta, 1.0f, eps, 1.0f,
                         0.0884f, 0, 1, 256, 0); else E();
            if (dropped(2)) {} else if (on(2)) L(decode_mv_quant, dim3(64), dim3(512), (const float*)att, nq, (const u8*)w.o, x, n, 10, 1, 1, 16); else E();
            if (on(3)) L(gluk(gv), glug(gv), glub(gv), (const float*)x, (const float*)nullptr, (const float*)nw, xb, cnt + 520, (int)glug(gv).x, n, eps,
                         (const u8*)w.g, (const u8*)w.u, hb, nff, 10, 0); else E();
            if (dropped(4)) {} else if (on(4)) L(decode_mv_quant, dim3(64), dim3(1024), (const float*)hb, nff, (const u8*)w.d, x, n, 10, 1, 2, 16); else E();
        }
        CK(cudaStreamEndCapture(st, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        std::vector<float> t;
        for (int r = 0; r < 30; ++r) {
            // the same residual every run, so values stay finite
            CK(cudaMemcpyAsync(x, xinit, n * 4, cudaMemcpyDeviceToDevice, st));
            cudaEventRecord(e0, st); CK(cudaGraphLaunch(ge, st)); cudaEventRecord(e1, st); CK(cudaEventSynchronize(e1));
            float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 5) t.push_back(ms * 1000.f / NL);
        }
        std::sort(t.begin(), t.end());
        printf("%-16s %.3f us per layer (p10 %.3f, p90 %.3f)\n", names[var], t[t.size() / 2], t[t.size() / 10], t[t.size() * 9 / 10]);
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    }
    float hx[4]; CK(cudaMemcpy(hx, x, 16, cudaMemcpyDeviceToHost)); printf("x[0..4] %g %g %g %g\n", hx[0], hx[1], hx[2], hx[3]);
    return 0;
}
