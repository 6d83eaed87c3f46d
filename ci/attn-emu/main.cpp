// Host harness of ci/attn-emu (run.sh): kernels-hip/attn_decode.hip's three kernels against
// an f64 reference of the op (q/k RMSNorm, RoPE, q scale, the K/V store, attention over the
// visible slots), on the selftest's shapes (selftest/rope_attn.rs) plus the short contexts
// where only some warps hold keys. Cache slots past the new one are NaN.
#include "attn_decode.hip"
#include <cstdio>
#include <random>
#include <thread>
#include <vector>
thread_local Dim3 threadIdx, blockIdx;
std::barrier<>* g_block_bar;
std::barrier<>* g_warp_bar[AD_MAX_WARPS];
float g_xf[AD_MAX_WARPS][32];

typedef void (*Kern)(const float*, const float*, const float*, u16*, u16*, float*, block_q8_1*, const float*, const float*, const float*, const int*,
                     float*, u32*, int, int, int, int, int, float, float, float, float, float, int, int, int, int);

struct Case { int hd, nh, nkv; bool neox; int n_rot; bool norms; int window, pos, n_ctx; bool ff; float fs, q_scale, scale; int part_keys; int spread = 0; };

int main() {
    auto c = [](int hd, int nh, int nkv, bool neox, bool norms, int window, int pos, int n_ctx) {
        return Case{hd, nh, nkv, neox, hd, norms, window, pos, n_ctx, false, 1.0f, 1.0f, 1.0f / sqrtf((float)hd), 0};
    };
    std::vector<Case> cases = {
        c(128, 16, 8, true, true, 0, 0, 64), c(128, 16, 8, true, true, 0, 1, 64), c(128, 4, 2, true, true, 0, 15, 64), c(128, 4, 2, true, true, 0, 16, 64),
        c(128, 4, 2, true, true, 0, 40, 256), c(128, 16, 8, true, true, 0, 127, 256), c(128, 4, 2, true, true, 0, 140, 4096),
        c(128, 4, 2, true, true, 0, 255, 512), c(128, 4, 2, true, true, 0, 256, 512), c(128, 8, 2, true, true, 0, 1000, 2048),
        [&] { Case x = c(128, 4, 4, false, true, 100, 300, 512); x.fs = 0.25f; return x; }(),
        [&] { Case x = c(64, 6, 2, false, false, 0, 128, 300); x.n_rot = 32; x.ff = true; return x; }(),
        c(64, 8, 1, true, false, 700, 1500, 1600), c(64, 4, 2, true, true, 0, 5, 4096),
        [&] { Case x = c(256, 4, 1, true, true, 512, 1000, 1100); x.q_scale = 1.0f / 16; x.scale = 1.0f; return x; }(),
        c(256, 4, 2, false, false, 0, 127, 200), c(256, 4, 1, true, true, 0, 9, 64), c(128, 8, 1, true, true, 1, 0, 8),
        [&] { Case x = c(128, 4, 2, true, true, 0, 126, 1024); x.part_keys = 32; return x; }(),
        [&] { Case x = c(64, 4, 2, true, true, 0, 5, 4096); x.part_keys = 2; return x; }(),
        [&] { Case x = c(256, 4, 1, true, true, 512, 900, 1000); x.part_keys = 7; x.q_scale = 0.125f; x.scale = 1.0f; return x; }(),
        // The spread layout (LODE_ATTN_SPREAD=1).
        [&] { Case x = c(128, 4, 2, true, true, 0, 40, 256); x.spread = 1; return x; }(),
        [&] { Case x = c(128, 4, 2, true, true, 0, 256, 512); x.spread = 1; return x; }(),
        [&] { Case x = c(64, 6, 2, false, false, 0, 128, 300); x.n_rot = 32; x.ff = true; x.spread = 1; return x; }(),
        [&] { Case x = c(256, 4, 1, true, true, 512, 1000, 1100); x.q_scale = 1.0f / 16; x.scale = 1.0f; x.spread = 1; return x; }(),
    };
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> U(-1, 1);
    int fails = 0;
    for (const Case& cs : cases) {
        const int hd = cs.hd, row = cs.nkv * hd, P = cs.pos, group = cs.nh / cs.nkv;
        std::vector<u16> kc((size_t)cs.n_ctx * row), vc((size_t)cs.n_ctx * row);
        for (size_t i = 0; i < kc.size(); ++i) {
            const bool hist = i < (size_t)P * row;
            kc[i] = hist ? f2h(2 * U(rng)) : 0x7e00;
            vc[i] = hist ? f2h(1.5f * U(rng)) : 0x7e00;
        }
        std::vector<float> q(cs.nh * hd), k(row), v(row), qw(hd), kw(hd), ff(cs.n_rot / 2);
        for (auto& x : q) x = 2 * U(rng);
        for (auto& x : k) x = 2 * U(rng);
        for (auto& x : v) x = 1.5f * U(rng);
        for (auto& x : qw) x = 1 + 0.5f * U(rng);
        for (auto& x : kw) x = 1 + 0.5f * U(rng);
        for (auto& x : ff) x = 2.5f + 0.5f * U(rng);
        const float theta_scale = powf(1e6f, -2.0f / cs.n_rot), eps = 1e-6f;
        const int min_keys = cs.part_keys ? cs.part_keys : AD_NSU(hd);
        const int max_keys = cs.window > 0 ? std::min(cs.window, cs.n_ctx) : cs.n_ctx;
        const int parts = std::min(64, std::max(1, (max_keys + min_keys - 1) / min_keys));
        std::vector<float> out(cs.nh * hd, NAN), part((size_t)cs.nh * parts * (hd + 2), NAN);
        std::vector<block_q8_1> q8(cs.nh * hd / 32);
        std::vector<u32> cnt(cs.nh, 0);
        int posv = P;
        Kern kern = hd == 64 ? attn_decode_d64 : hd == 128 ? attn_decode_d128 : attn_decode_d256;
        for (int bz = 0; bz < parts; ++bz)
            for (int by = 0; by < cs.nkv; ++by)
                for (int bx = 0; bx < group; ++bx) {
                    std::barrier<> bb(AD_THREADS);
                    for (int w = 0; w < AD_WARPS; ++w) g_warp_bar[w] = new std::barrier<>(32);
                    g_block_bar = &bb;
                    std::vector<std::thread> th;
                    for (int t = 0; t < AD_THREADS; ++t)
                        th.emplace_back([&, t, bx, by, bz] {
                            threadIdx = {(unsigned)t, 0, 0};
                            blockIdx = {(unsigned)bx, (unsigned)by, (unsigned)bz};
                            kern(q.data(), k.data(), v.data(), kc.data(), vc.data(), out.data(), q8.data(), cs.norms ? qw.data() : nullptr,
                                 cs.norms ? kw.data() : nullptr, cs.ff ? ff.data() : nullptr, &posv, part.data(), cnt.data(), group, cs.nkv, cs.n_ctx,
                                 cs.n_rot, cs.neox, theta_scale, cs.fs, eps, cs.q_scale, cs.scale, cs.window, parts, min_keys, cs.spread);
                        });
                    for (auto& x : th) x.join();
                    for (int w = 0; w < AD_WARPS; ++w) delete g_warp_bar[w];
                }
        // Reference: prepared q (f64) and k, the new rows, attention in f64.
        auto prep = [&](const float* x, const std::vector<float>* w, std::vector<double>& y) {
            y.assign(x, x + hd);
            if (w) {
                double s = 0;
                for (int e = 0; e < hd; ++e) s += (double)x[e] * x[e];
                const double r = 1.0 / sqrt(s / hd + eps);
                for (int e = 0; e < hd; ++e) y[e] = x[e] * r * (*w)[e];
            }
            float theta = (float)P;
            std::vector<double> z = y;
            for (int i = 0; i < cs.n_rot / 2; ++i) {
                const float ang = cs.fs * (cs.ff ? theta / ff[i] : theta);
                theta *= theta_scale;
                const int i0 = cs.neox ? i : 2 * i, i1 = cs.neox ? i + cs.n_rot / 2 : 2 * i + 1;
                z[i0] = y[i0] * cos((double)ang) - y[i1] * sin((double)ang);
                z[i1] = y[i0] * sin((double)ang) + y[i1] * cos((double)ang);
            }
            y = z;
        };
        int bad = 0;
        double worst = 0;
        auto fail = [&](const char* what, int i, double got, double want) {
            if (bad < 4) printf("  %s %d: got %g want %g\n", what, i, got, want);
            ++bad;
        };
        // The cache: history untouched, new V = f16(v), new K ≈ f16(prepared k), later slots NaN.
        for (int h = 0; h < cs.nkv; ++h) {
            std::vector<double> kk;
            prep(&k[h * hd], cs.norms ? &kw : nullptr, kk);
            for (int e = 0; e < hd; ++e) {
                const size_t at = (size_t)P * row + h * hd + e;
                if (vc[at] != f2h(v[h * hd + e])) fail("new V", e, h2f(vc[at]), v[h * hd + e]);
                const double want = h2f(f2h((float)kk[e]));
                if (!(fabs(h2f(kc[at]) - want) <= fabs(want) / 512 + 1e-3)) fail("new K", e, h2f(kc[at]), want);
            }
        }
        for (size_t i = (size_t)(P + 1) * row; i < kc.size(); ++i)
            if (kc[i] != 0x7e00 || vc[i] != 0x7e00) { fail("slot past P written", (int)i, 0, 0); break; }
        const int k0 = cs.window > 0 ? std::max(0, P - cs.window + 1) : 0;
        for (int h = 0; h < cs.nh; ++h) {
            const int kvh = h / group;
            std::vector<double> qq;
            prep(&q[h * hd], cs.norms ? &qw : nullptr, qq);
            std::vector<double> s;
            for (int j = k0; j <= P; ++j) {
                double d = 0;
                for (int e = 0; e < hd; ++e) d += qq[e] * cs.q_scale * h2f(kc[(size_t)j * row + kvh * hd + e]);
                s.push_back(d * cs.scale);
            }
            double mx = -1e300, l = 0;
            for (double x : s) mx = std::max(mx, x);
            for (auto& x : s) { x = exp(x - mx); l += x; }
            for (int e = 0; e < hd; ++e) {
                double o = 0;
                for (int j = k0; j <= P; ++j) o += s[j - k0] * h2f(vc[(size_t)j * row + kvh * hd + e]);
                o /= l;
                const double got = out[h * hd + e], tol = 2e-4 * fabs(o) + 5e-5;
                const double r = fabs(got - o) / tol;
                if (!(r <= 1.0)) fail("out", h * hd + e, got, o);
                if (r > worst || r != r) worst = r;
                const block_q8_1& b = q8[(h * hd + e) / 32];
                const double dq = h2f(b.d) * b.qs[e % 32];
                if (!(fabs(dq - got) <= h2f(b.d) * (0.51 + fabs((double)b.qs[e % 32]) / 1024) + 1e-6)) fail("q8", h * hd + e, dq, got);
            }
        }
        for (u32 x : cnt) if (x) { fail("counter left", 0, x, 0); break; }
        printf("hd %d heads %d/%d %s rot %d norms %d window %d pos %d ctx %d parts %d (min %d) spread %d: worst err/tol %.3f, %d bad\n", hd, cs.nh, cs.nkv,
               cs.neox ? "neox" : "norm", cs.n_rot, cs.norms, cs.window, P, cs.n_ctx, parts, min_keys, cs.spread, worst, bad);
        fflush(stdout);
        fails += bad > 0;
    }
    printf("%s: %d of %zu cases failed\n", fails ? "FAIL" : "PASS", fails, cases.size());
    return fails ? 1 : 0;
}
