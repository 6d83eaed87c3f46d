// Experiment: Q4_K decode matvec bandwidth at real shapes: today's structure vs persistent warps with a prefetch ring.
#include "common.cuh"

__device__ __forceinline__ float q8k_bsum(const block_q8_1* b) { return (float)(short)b->s; }
__device__ __forceinline__ u32 byte_of(u32 w0, u32 w1, u32 w2, int i) { const u32 w = i < 4 ? w0 : (i < 8 ? w1 : w2); return (w >> (8 * (i & 3))) & 0xff; }
__device__ __forceinline__ void scale_min_k4_r(int j, u32 w0, u32 w1, u32 w2, float* sc, float* m) {
  if (j < 4) { *sc = (float)(byte_of(w0, w1, w2, j) & 63); *m = (float)(byte_of(w0, w1, w2, j + 4) & 63); }
  else { const u32 a = byte_of(w0, w1, w2, j + 4), bm = byte_of(w0, w1, w2, j - 4), bs = byte_of(w0, w1, w2, j);
    *sc = (float)((a & 15) | ((bm >> 6) << 4)); *m = (float)((a >> 4) | ((bs >> 6) << 4)); } }
struct q4r { u32x4 hd, qv; };
__device__ __forceinline__ void q4_load(const u8* wr, int sb, int lane, q4r& r) {
  const int j = lane & 7, c = j >> 1, h = j & 1; const u8* b = wr + (size_t)sb * 144;
  r.hd = *(const u32x4*)b; r.qv = *(const u32x4*)(b + 16 + 32 * c + 16 * h);
}
__device__ __forceinline__ float q4_dot(const q4r& r, const block_q8_1* x, int sb, int lane) {
  const int j = lane & 7, c = j >> 1, h = j & 1;
  const float d = h2f((u16)(r.hd.x & 0xffff)), dmin = h2f((u16)(r.hd.x >> 16));
  float sc0, m0, sc1, m1;
  scale_min_k4_r(2 * c, r.hd.y, r.hd.z, r.hd.w, &sc0, &m0); scale_min_k4_r(2 * c + 1, r.hd.y, r.hd.z, r.hd.w, &sc1, &m1);
  const u32 qw[4] = {r.qv.x, r.qv.y, r.qv.z, r.qv.w};
  const block_q8_1* xb = x + sb * 8 + 2 * c;
  const int* a0 = (const int*)xb->qs + 4 * h; const int* a1 = (const int*)(xb + 1)->qs + 4 * h;
  int s0 = 0, s1 = 0;
  for (int i = 0; i < 4; ++i) { s0 = dot4((int)(qw[i] & 0x0F0F0F0F), a0[i], s0); s1 = dot4((int)((qw[i] >> 4) & 0x0F0F0F0F), a1[i], s1); }
  const float dx = q8k_scale(xb);
  float v = d * dx * (sc0 * (float)s0 + sc1 * (float)s1);
  if (h == 0) v -= dmin * dx * (m0 * q8k_bsum(xb) + m1 * q8k_bsum(xb + 1));
  return v;
}
// V0: today's structure: one warp per row, all of a row's loads (<= 16 sb) issued at once.
__global__ void __launch_bounds__(128, 8) v0_q4(const u8* W, const block_q8_1* x, float* y, int rows, int nsb) {
  const int row = blockIdx.x * 4 + (threadIdx.x >> 5), lane = threadIdx.x & 31; if (row >= rows) return;
  const u8* wr = W + (size_t)row * nsb * 144; float acc = 0.f;
  for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
    q4r r[4];
    for (int it = 0; it < 4; ++it) { const int sb = sb0 + (lane >> 3) + 4 * it; if (sb < nsb) q4_load(wr, sb, lane, r[it]); }
    for (int it = 0; it < 4; ++it) { const int sb = sb0 + (lane >> 3) + 4 * it; if (sb < nsb) acc += q4_dot(r[it], x, sb, lane); }
  }
  acc = warp_sum(acc); if (lane == 0) y[row] = acc;
}
// V1: persistent warps over contiguous (row, 4-sb step) units; ring of D steps in flight.
template <int D, int WPB>
__global__ void __launch_bounds__(32 * WPB) v1_q4(const u8* W, const block_q8_1* x, float* y, int rows, int nsb) {
  const int lane = threadIdx.x & 31, gw = blockIdx.x * WPB + (threadIdx.x >> 5), tw = gridDim.x * WPB;
  const int spr = (nsb + 3) / 4;
  const long r0 = (long)rows * gw / tw, r1 = (long)rows * (gw + 1) / tw;
  const long u0 = r0 * spr, u1 = r1 * spr;
  q4r ring[D];
#pragma unroll
  for (int i = 0; i < D; ++i) { const long u = u0 + i; const int sb = (int)(u % spr) * 4 + (lane >> 3); if (u < u1 && sb < nsb) q4_load(W + (size_t)(u / spr) * nsb * 144, sb, lane, ring[i]); }
  float acc = 0.f;
  for (long u = u0; u < u1; u += D) {
#pragma unroll
    for (int i = 0; i < D; ++i) {
      const long uu = u + i; if (uu >= u1) break;
      const long row = uu / spr; const int st = (int)(uu % spr); const int sb = st * 4 + (lane >> 3);
      const q4r cur = ring[i];
      { const long un = uu + D; const int sbn = (int)(un % spr) * 4 + (lane >> 3); if (un < u1 && sbn < nsb) q4_load(W + (size_t)(un / spr) * nsb * 144, sbn, lane, ring[i]); }
      if (sb < nsb) acc += q4_dot(cur, x, sb, lane);
      if (st == spr - 1) { float v = warp_sum(acc); if (lane == 0) y[row] = v; acc = 0.f; }
    }
  }
}
int main() {
  struct Shape { int rows, k; const char* name; } shapes[] = {{28672, 4096, "8b gate+up 28672x4096"}, {4096, 14336, "8b down 4096x14336"}, {4096, 4096, "8b q/o 4096x4096"}, {6144, 1024, "0.6b qkv 6144x1024 (q4k)"}, {1024, 2048, "0.6b o 1024x2048"}, {19456, 2560, "4b gate+up 19456x2560"}};
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int S = 132;
  for (auto sh : shapes) {
    const int rows = sh.rows, k = sh.k, nsb = k / 256;
    const size_t wbytes = (size_t)rows * nsb * 144; const int copies = std::max(2, (int)(512e6 / wbytes));
    u8* W; cudaMalloc(&W, wbytes * copies);
    { std::vector<u8> h(wbytes); uint32_t s = 7; for (auto& b : h) { s = s * 1664525u + 1013904223u; b = s >> 24; }
      for (size_t i = 0; i < wbytes; i += 144) { h[i] = 0; h[i + 1] = 0x3c; h[i + 2] = 0; h[i + 3] = 0x38; }
      for (int c = 0; c < copies; ++c) cudaMemcpy(W + c * wbytes, h.data(), wbytes, cudaMemcpyHostToDevice); }
    block_q8_1* x; cudaMalloc(&x, k / 32 * sizeof(block_q8_1)); { std::vector<block_q8_1> hx(k / 32); for (size_t i = 0; i < hx.size(); ++i) { auto& b = hx[i]; b.d = (i % 2) ? 0x0000 : 0x3c00; b.d = i % 2 ? 0x3f80 : 0x0000; b.s = 3; for (int q = 0; q < 32; ++q) b.qs[q] = (q * 7 + i) % 50 - 25; } cudaMemcpy(x, hx.data(), hx.size() * sizeof(block_q8_1), cudaMemcpyHostToDevice); }
    float *y0, *y1; cudaMalloc(&y0, rows * 4); cudaMalloc(&y1, rows * 4);
    printf("== %s (%.1f MB, %d copies)\n", sh.name, wbytes / 1e6, copies);
    auto timeit = [&](const char* name, auto fn) {
      std::vector<float> ts; for (int r = 0; r < 40; ++r) { cudaEventRecord(e0); fn(r % copies); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (r >= 4) ts.push_back(ms * 1000); }
      std::sort(ts.begin(), ts.end()); float med = ts[ts.size() / 2];
      printf("  %-26s %8.2f us  %6.0f GB/s  %s\n", name, med, wbytes / med / 1e3, cudaGetErrorString(cudaGetLastError()));
    };
    timeit("stream16", [&](int c) { stream_k<<<S * 8, 256>>>((const uint4*)(W + c * wbytes), wbytes / 16, y1); });
    timeit("v0", [&](int c) { v0_q4<<<(rows + 3) / 4, 128>>>(W + c * wbytes, x, y0, rows, nsb); });
    timeit("v1 D=2 4w x8/SM", [&](int c) { v1_q4<2, 4><<<S * 8, 128>>>(W + c * wbytes, x, y1, rows, nsb); });
    timeit("v1 D=4 4w x8/SM", [&](int c) { v1_q4<4, 4><<<S * 8, 128>>>(W + c * wbytes, x, y1, rows, nsb); });
    timeit("v1 D=4 4w x4/SM", [&](int c) { v1_q4<4, 4><<<S * 4, 128>>>(W + c * wbytes, x, y1, rows, nsb); });
    timeit("v1 D=8 4w x4/SM", [&](int c) { v1_q4<8, 4><<<S * 4, 128>>>(W + c * wbytes, x, y1, rows, nsb); });
    timeit("v1 D=4 8w x4/SM", [&](int c) { v1_q4<4, 8><<<S * 4, 256>>>(W + c * wbytes, x, y1, rows, nsb); });
    std::vector<float> a(rows), b(rows);
    cudaMemcpy(a.data(), y0, rows * 4, cudaMemcpyDeviceToHost); cudaMemcpy(b.data(), y1, rows * 4, cudaMemcpyDeviceToHost);
    double md = 0, mx = 0; for (int i = 0; i < rows; ++i) { md = std::max(md, (double)fabsf(a[i] - b[i])); mx = std::max(mx, (double)fabsf(a[i])); } printf("  v1 vs v0 max diff %g (max |y| %g)\n", md, mx);
    cudaFree(W); cudaFree(x); cudaFree(y0); cudaFree(y1);
  }
  return 0;
}
