// Host harness of ci/flash-emu (run.sh): both flash kernels against an f64 reference.
#include "flash_attn.hip"
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
thread_local Dim3 threadIdx, blockIdx;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[8];
float g_xf[8][32];
#ifdef LODE_AMD
float g_wa[8][32][16], g_wb[8][32][16], g_wc[8][32][8];
#else
u32 g_a[8][32][4], g_b[8][32][2];
float g_c[8][32][4];
const u16* g_xp[8][32];
#endif
typedef void (*Kern)(const float*, const u16*, const u16*, float*, int, int, int, int, const int*, int, float);

static void launch(Kern k, int gx, int gy, int nt, const float* q, const u16* kc, const u16* vc, float* out, int n, int nh, int nkv, int hd, const int* pos, int win, float sc) {
    for (int by = 0; by < gy; ++by)
        for (int bx = 0; bx < gx; ++bx) {
            std::barrier<> bb(nt);
            for (int w = 0; w < nt / 32; ++w) g_warp_bar[w] = new std::barrier<>(32);
            g_block_bar = &bb;
            std::vector<std::thread> th;
            for (int t = 0; t < nt; ++t)
                th.emplace_back([=] { threadIdx = {(unsigned)t, 0, 0}; blockIdx = {(unsigned)bx, (unsigned)by, 0}; k(q, kc, vc, out, n, nh, nkv, hd, pos, win, sc); });
            for (auto& x : th) x.join();
            for (int w = 0; w < nt / 32; ++w) delete g_warp_bar[w];
        }
}

int main() {
    struct Case { int n, nh, nkv, hd, pos0, win; float sharp; };
    std::vector<Case> cases = {{1, 2, 1, 128, 0, 0, 1}, {2, 4, 1, 64, 0, 0, 1}, {17, 4, 2, 80, 3, 0, 1}, {65, 8, 1, 128, 0, 0, 6},
                               {130, 2, 2, 80, 70, 50, 1}, {100, 4, 1, 128, 150, 64, 1}, {33, 4, 4, 8, 3, 0, 1}, {129, 2, 1, 128, 0, 1, 1},
                               {64, 2, 2, 64, 64, 0, 6}, {200, 2, 1, 128, 60, 0, 1}, {97, 2, 1, 96, 0, 30, 6},
                               // head_dim 256 (Gemma 3) and sizes padded to it, GQA 1/4/8, windows past a key tile
                               {70, 2, 2, 256, 0, 0, 1}, {40, 4, 1, 256, 30, 17, 6}, {33, 8, 1, 160, 5, 0, 1}, {66, 4, 1, 200, 600, 512, 1},
                               {130, 2, 1, 256, 1000, 1024, 1}};
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> U(-1, 1);
    int fails = 0;
    for (auto c : cases) {
        const int slots = c.pos0 + c.n + 7, filled = c.pos0 + c.n, row = c.nkv * c.hd;
        std::vector<u16> kc(slots * row), vc(slots * row);
        for (int i = 0; i < slots * row; ++i) { kc[i] = i < filled * row ? f2h(U(rng)) : 0x7e00; vc[i] = i < filled * row ? f2h(U(rng)) : 0x7e00; }
        std::vector<float> q(c.n * c.nh * c.hd);
        for (auto& v : q) v = U(rng) * c.sharp;
        std::vector<int> pos(c.n);
        for (int i = 0; i < c.n; ++i) pos[i] = c.pos0 + i;
        const float sc = 1.0f / sqrtf(c.hd);
        for (int ver = 1; ver <= 2; ++ver) {
            std::vector<float> out(q.size(), NAN);
            Kern k; int bq, nt;
            if (ver == 1) { k = c.hd <= 64 ? flash_attn_f16_d64 : c.hd <= 128 ? flash_attn_f16_d128 : flash_attn_f16_d256; bq = c.hd <= 128 ? 64 : 32; nt = 2 * bq; }
            else { k = c.hd <= 64 ? flash_attn2_f16_d64 : c.hd <= 128 ? flash_attn2_f16_d128 : flash_attn2_f16_d256; bq = 64; nt = 128; }
            launch(k, (c.n + bq - 1) / bq, c.nh, nt, q.data(), kc.data(), vc.data(), out.data(), c.n, c.nh, c.nkv, c.hd, pos.data(), c.win, sc);
            double worst = 0; int bad = 0;
            for (int t = 0; t < c.n; ++t) for (int h = 0; h < c.nh; ++h) {
                const int p = pos[t], k0 = c.win > 0 ? std::max(0, p - c.win + 1) : 0, kvh = h / (c.nh / c.nkv);
                const float* qv = &q[(t * c.nh + h) * c.hd];
                std::vector<double> s; double amax = 0;
                for (int j = k0; j <= p; ++j) { double d = 0, m = 0; for (int e = 0; e < c.hd; ++e) { double v = qv[e] * (double)h2f(kc[j * row + kvh * c.hd + e]); d += v; m += fabs(v); } amax = std::max(amax, m * sc); s.push_back(d * sc); }
                double mx = -1e300; for (double v : s) mx = std::max(mx, v);
                double l = 0; for (auto& v : s) { v = exp(v - mx); l += v; }
                for (int e = 0; e < c.hd; ++e) {
                    double o = 0, m = 0;
                    for (int j = k0; j <= p; ++j) { double v = h2f(vc[j * row + kvh * c.hd + e]); o += s[j - k0] * v; m += s[j - k0] * fabs(v); }
                    o /= l; const double tol = (2e-3 + 2e-3 * amax) * m / l + 1e-5;
                    const float y = out[(t * c.nh + h) * c.hd + e];
                    const double r = fabs(y - o) / tol;
                    if (!(r <= 1.0)) { if (bad < 3) printf("  bad t=%d h=%d e=%d got %g want %g\n", t, h, e, y, o); ++bad; }
                    if (r > worst || r != r) worst = r;
                }
            }
            printf("v%d n=%d heads=%d/%d hd=%d pos0=%d win=%d: worst err/tol %.3f, %d bad\n", ver, c.n, c.nh, c.nkv, c.hd, c.pos0, c.win, worst, bad);
            fails += bad > 0;
            fflush(stdout);
        }
    }
    printf("%s\n", fails ? "FAIL" : "PASS");
    return fails != 0;
}
