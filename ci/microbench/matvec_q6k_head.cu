// Experiment: decode matvec bandwidth, current structure vs persistent/prefetch vs smem-staged.
#include "common.cuh"

// Q6_K per-lane work for one super-block slot (current mapping).
struct q6r { u32 lw[2], lw32[2], hw[2]; u32 sc; u16 d; };
__device__ __forceinline__ void q6_load(const u8* b, int lane, q6r& r) {
  const int j = lane & 7, h = j >> 2, l0 = 8 * (j & 3);
  const u8* L = b + 64 * h; const u8* H = b + 128 + 32 * h;
  for (int i = 0; i < 2; ++i) { r.lw[i] = ld_u32_a2(L + l0 + 4 * i); r.lw32[i] = ld_u32_a2(L + 32 + l0 + 4 * i); r.hw[i] = ld_u32_a2(H + l0 + 4 * i); }
  const i8* S = (const i8*)(b + 192 + 8 * h + l0 / 16);
  r.sc = (u32)(u8)S[0] | ((u32)(u8)S[2] << 8) | ((u32)(u8)S[4] << 16) | ((u32)(u8)S[6] << 24);
  r.d = *(const u16*)(b + 208);
}
__device__ __forceinline__ float q6_dot(const q6r& r, const block_q8_1* x, int sb, int lane) {
  const int j = lane & 7, h = j >> 2, l0 = 8 * (j & 3);
  u32 q[4][2];
  for (int i = 0; i < 2; ++i) {
    q[0][i] = (r.lw[i] & 0x0F0F0F0F) | ((r.hw[i] & 0x03030303) << 4);
    q[1][i] = (r.lw32[i] & 0x0F0F0F0F) | (((r.hw[i] >> 2) & 0x03030303) << 4);
    q[2][i] = ((r.lw[i] >> 4) & 0x0F0F0F0F) | (((r.hw[i] >> 4) & 0x03030303) << 4);
    q[3][i] = ((r.lw32[i] >> 4) & 0x0F0F0F0F) | (((r.hw[i] >> 6) & 0x03030303) << 4);
  }
  float v = 0.f; const float dx = q8k_scale(x + sb * 8);
  for (int g = 0; g < 4; ++g) {
    const block_q8_1* xb = x + sb * 8 + 4 * h + g; const int* a = (const int*)xb->qs + l0 / 4;
    int s = dot4((int)q[g][0], a[0], 0); s = dot4((int)q[g][1], a[1], s);
    s -= dot4(0x20202020, a[0], dot4(0x20202020, a[1], 0));
    v += (float)(i8)(r.sc >> (8 * g)) * (float)s;
  }
  return h2f(r.d) * dx * v;
}
// V0: one warp per row, 4 rows per 128-thread block (today's structure).
__global__ void __launch_bounds__(128, 12) v0_q6(const u8* W, const block_q8_1* x, float* y, int rows, int nsb) {
  const int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31; if (row >= rows) return;
  float acc = 0.f; const u8* wr = W + (size_t)row * nsb * 210;
  for (int sb0 = 0; sb0 < nsb; sb0 += 4) { const int sb = sb0 + (lane >> 3); if (sb < nsb) { q6r r; q6_load(wr + (size_t)sb * 210, lane, r); acc += q6_dot(r, x, sb, lane); } }
  acc = warp_sum(acc); if (lane == 0) y[row] = acc;
}
// V1: persistent warps over a contiguous range of (row, step) units, register prefetch depth D.
template <int D>
__global__ void __launch_bounds__(256) v1_q6(const u8* W, const block_q8_1* x, float* y, int rows, int nsb) {
  const int lane = threadIdx.x & 31, gw = blockIdx.x * 8 + (threadIdx.x >> 5), tw = gridDim.x * 8;
  const int spr = (nsb + 3) / 4; // steps per row
  const long r0 = (long)rows * gw / tw, r1 = (long)rows * (gw + 1) / tw;
  const long u0 = r0 * spr, u1 = r1 * spr;
  q6r ring[D];
  auto load = [&](long u, q6r& r) { const long row = u / spr; const int sb = (int)(u % spr) * 4 + (lane >> 3); if (u < u1 && sb < nsb) q6_load(W + ((size_t)row * nsb + sb) * 210, lane, r); };
  for (int i = 0; i < D; ++i) load(u0 + i, ring[i]);
  float acc = 0.f;
  for (long u = u0; u < u1; u += D) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const long uu = u + i; if (uu >= u1) break;
      const long row = uu / spr; const int st = (int)(uu % spr); const int sb = st * 4 + (lane >> 3);
      q6r cur = ring[i]; load(uu + D, ring[i]);
      if (sb < nsb) acc += q6_dot(cur, x, sb, lane);
      if (st == spr - 1) { float v = warp_sum(acc); if (lane == 0) y[row] = v; acc = 0.f; }
    }
  }
}
// V2: persistent warps; each warp copies a tile of rows (16-B aligned span) into its own
// shared buffer with cp.async (double buffered), then computes from shared.
#define V2_TILE 1680  // bytes per warp stage (2 rows of 840 B at k = 1024)
__device__ __forceinline__ void cp16(void* s, const void* g) { unsigned sa = (unsigned)__cvta_generic_to_shared(s); asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(sa), "l"(g)); }
template <int NS>
__global__ void __launch_bounds__(256) v2_q6(const u8* W, const block_q8_1* x, float* y, int rows, int nsb) {
  __shared__ __align__(16) u8 buf[8][NS][V2_TILE];
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, gw = blockIdx.x * 8 + wi, tw = gridDim.x * 8;
  const int rb = nsb * 210, rpt = V2_TILE / rb; // rows per tile (2 at k=1024)
  const int ntiles = rows / rpt;
  const long t0 = (long)ntiles * gw / tw, t1 = (long)ntiles * (gw + 1) / tw;
  auto issue = [&](long t, int s) { if (t < t1) { const u8* g = W + (size_t)t * V2_TILE; for (int c = lane; c < V2_TILE / 16; c += 32) cp16(&buf[wi][s][16 * c], g + 16 * c); } asm volatile("cp.async.commit_group;"); };
  for (int s = 0; s < NS - 1; ++s) issue(t0 + s, s);
  for (long t = t0; t < t1; ++t) {
    const int s = (int)((t - t0) % NS);
    issue(t + NS - 1, (int)((t - t0 + NS - 1) % NS));
    asm volatile("cp.async.wait_group %0;" :: "n"(NS - 1));
    __syncwarp();
    for (int rr = 0; rr < rpt; ++rr) {
      float acc = 0.f; const u8* wr = &buf[wi][s][rr * rb];
      for (int sb0 = 0; sb0 < nsb; sb0 += 4) { const int sb = sb0 + (lane >> 3); if (sb < nsb) { q6r r; q6_load(wr + sb * 210, lane, r); acc += q6_dot(r, x, sb, lane); } }
      acc = warp_sum(acc); if (lane == 0) y[t * rpt + rr] = acc;
    }
    __syncwarp();
  }
}
int main() {
  const int rows = 151936, k = 1024, nsb = k / 256;
  const size_t wbytes = (size_t)rows * nsb * 210; const int copies = 3;
  u8* W; cudaMalloc(&W, wbytes * copies);
  { std::vector<u8> h(wbytes); uint32_t s = 1; for (auto& b : h) { s = s * 1664525u + 1013904223u; b = s >> 24; }
    for (size_t i = 0; i + 210 <= wbytes; i += 210) { h[i + 208] = 0x00; h[i + 209] = 0x3c; }
    for (int c = 0; c < copies; ++c) cudaMemcpy(W + c * wbytes, h.data(), wbytes, cudaMemcpyHostToDevice); }
  block_q8_1* x; cudaMalloc(&x, k / 32 * sizeof(block_q8_1)); { std::vector<block_q8_1> hx(k / 32); for (auto& b : hx) { b.d = 0x3c00; b.s = 0; for (int i = 0; i < 32; ++i) b.qs[i] = (i * 7) % 50 - 25; } cudaMemcpy(x, hx.data(), hx.size() * sizeof(block_q8_1), cudaMemcpyHostToDevice); }
  float *y0, *y1; cudaMalloc(&y0, rows * 4); cudaMalloc(&y1, rows * 4);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto timeit = [&](const char* name, auto fn) {
    std::vector<float> ts; for (int r = 0; r < 30; ++r) { cudaEventRecord(e0); fn(r % copies); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 3) ts.push_back(ms * 1000); }
    std::sort(ts.begin(), ts.end()); float med = ts[ts.size() / 2];
    printf("%-28s %8.2f us  %6.0f GB/s  %s\n", name, med, wbytes / med / 1e3, cudaGetErrorString(cudaGetLastError()));
  };
  int S = 132;
  timeit("stream16 (ceiling)", [&](int c) { stream_k<<<S * 8, 256>>>((const uint4*)(W + c * wbytes), wbytes / 16, y1); });
  timeit("v0 one row/warp", [&](int c) { v0_q6<<<(rows + 3) / 4, 128>>>(W + c * wbytes, x, y0, rows, nsb); });
  for (int occ : {4, 8}) {
    char n[64];
    sprintf(n, "v1 D=2 grid=%dxSM", occ); timeit(n, [&](int c) { v1_q6<2><<<S * occ, 256>>>(W + c * wbytes, x, y1, rows, nsb); });
    sprintf(n, "v1 D=4 grid=%dxSM", occ); timeit(n, [&](int c) { v1_q6<4><<<S * occ, 256>>>(W + c * wbytes, x, y1, rows, nsb); });
  }
  std::vector<float> a(rows), b(rows);
  cudaMemcpy(a.data(), y0, rows * 4, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), y1, rows * 4, cudaMemcpyDeviceToHost);
  double md = 0; for (int i = 0; i < rows; ++i) md = std::max(md, (double)fabsf(a[i] - b[i])); printf("v1 vs v0 max diff %g (y0[5]=%g)\n", md, a[5]);
  for (int occ : {2, 4}) {
    char n[64];
    cudaMemset(y1, 0, rows * 4);
    sprintf(n, "v2 NS=2 grid=%dxSM", occ); timeit(n, [&](int c) { v2_q6<2><<<S * occ, 256>>>(W + c * wbytes, x, y1, rows, nsb); });
    sprintf(n, "v2 NS=3 grid=%dxSM", occ); timeit(n, [&](int c) { v2_q6<3><<<S * occ, 256>>>(W + c * wbytes, x, y1, rows, nsb); });
  }
  cudaMemcpy(b.data(), y1, rows * 4, cudaMemcpyDeviceToHost);
  md = 0; for (int i = 0; i < rows; ++i) md = std::max(md, (double)fabsf(a[i] - b[i])); printf("v2 vs v0 max diff %g\n", md);
  return 0;
}
