// kernels-hip/moe.hip's routing, activation and weighted sum on the host (common.h here
// stands in for the device header, moe_mv_stub.h for the matvec dots) against a direct
// transcription of backend/moe.rs (route, route_weight, swiglu_oai) and cpu/moe.rs (the
// biases, the slot sums): moe_route, then moe_swiglu_oai and moe_wsum over its ids and
// weights, pair order or grouped through a random permutation.
// usage: moe_check N_TOK N_EXP K F N WEIGHT(0|1) BIAS(0|1) NORM(0|1) GROUPED(0|1);
// prints "IDS <wrong selections>" and "MAX <err>".
#include "moe.hip"
#include <cstdio>
#include <random>
#include <algorithm>
#include <numeric>
int main(int argc, char** argv) {
    if (argc < 10) return 2;
    const int nt = atoi(argv[1]), ne = atoi(argv[2]), k = atoi(argv[3]), f = atoi(argv[4]), n = atoi(argv[5]);
    const int weight = atoi(argv[6]), use_bias = atoi(argv[7]), norm = atoi(argv[8]), grouped = atoi(argv[9]);
    const int np = nt * k;
    std::mt19937 rng(11); std::uniform_real_distribution<float> U(-1, 1);
    auto vec = [&](size_t m, float s) { std::vector<float> v(m); for (auto& x : v) x = U(rng) * s; return v; };
    auto logits = vec((size_t)nt * ne, 3), rb = vec(ne, 2), bg = vec((size_t)ne * f, 2), bu = vec((size_t)ne * f, 2), bd = vec((size_t)ne * n, 1);
    // The kernels.
    std::vector<int> ids(np, -1); std::vector<float> wts(np, NAN);
    launch((nt + 3) / 4, 1, 1, 128, [&] { moe_route(logits.data(), use_bias ? rb.data() : nullptr, ids.data(), wts.data(), nt, ne, k, norm, weight); });
    std::vector<int> perm(np), pos(np);
    std::iota(perm.begin(), perm.end(), 0);
    if (grouped) std::shuffle(perm.begin(), perm.end(), rng);
    for (int j = 0; j < np; ++j) pos[perm[j]] = j;
    auto gate = vec((size_t)np * f, 9), up = vec((size_t)np * f, 9), y = vec((size_t)np * n, 1);
    auto gk = gate;
    launch((f + 255) / 256, np, 1, 256, [&] { moe_swiglu_oai(gk.data(), up.data(), ids.data(), grouped ? perm.data() : nullptr, use_bias ? bg.data() : nullptr, use_bias ? bu.data() : nullptr, ne, f); });
    std::vector<float> out((size_t)nt * n, NAN);
    launch((n + 255) / 256, nt, 1, 256, [&] { moe_wsum(y.data(), grouped ? pos.data() : nullptr, wts.data(), ids.data(), use_bias ? bd.data() : nullptr, out.data(), ne, k, n); });
    // The CPU's arithmetic.
    int bad_ids = 0; double maxe = 0;
    auto err = [&](float g, float r) { double e = fabs((double)g - r) / (1 + fabs(r)); if (!(e <= 1e30)) e = 1e30; maxe = std::max(maxe, e); };
    for (int t = 0; t < nt; ++t) {
        std::vector<float> l(ne);
        for (int i = 0; i < ne; ++i) l[i] = logits[(size_t)t * ne + i] + (use_bias ? rb[i] : 0.0f);
        std::vector<float> p(ne);
        std::vector<int> idx(ne); std::iota(idx.begin(), idx.end(), 0);
        std::vector<float> w(k);
        if (weight) {
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return l[a] > l[b]; });
            float mx = l[idx[0]]; double s = 0;
            for (int j = 0; j < k; ++j) { w[j] = expf(l[idx[j]] - mx); s += w[j]; }
            float inv = (float)(1.0 / s);
            for (int j = 0; j < k; ++j) w[j] *= inv;
        } else {
            float mx = *std::max_element(l.begin(), l.end()); double s = 0;
            for (int i = 0; i < ne; ++i) { p[i] = expf(l[i] - mx); s += p[i]; }
            float inv = (float)(1.0 / s);
            for (auto& v : p) v *= inv;
            std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
            for (int j = 0; j < k; ++j) w[j] = p[idx[j]];
        }
        if (norm) { float s = 0; for (float v : w) s += v; s = std::max(s, 6.103515625e-5f); for (auto& v : w) v /= s; }
        for (int j = 0; j < k; ++j) { bad_ids += ids[t * k + j] != idx[j]; err(wts[t * k + j], w[j]); }
    }
    for (int j = 0; j < np; ++j) {
        int e = ids[perm[j]];
        for (int i = 0; i < f; ++i) {
            float g = gate[(size_t)j * f + i] + (use_bias ? bg[(size_t)e * f + i] : 0.0f), u = up[(size_t)j * f + i] + (use_bias ? bu[(size_t)e * f + i] : 0.0f);
            float x = std::min(g, 7.0f), c = std::clamp(u, -7.0f, 7.0f);
            err(gk[(size_t)j * f + i], x / (1.0f + expf(1.702f * -x)) * (c + 1.0f));
        }
    }
    for (int t = 0; t < nt; ++t)
        for (int i = 0; i < n; ++i) {
            float acc = 0;
            for (int s = 0; s < k; ++s) { int pp = t * k + s; acc += wts[pp] * (y[(size_t)pos[pp] * n + i] + (use_bias ? bd[(size_t)ids[pp] * n + i] : 0.0f)); }
            err(out[(size_t)t * n + i], acc);
        }
    printf("IDS %d\nMAX %.3e\n", bad_ids, maxe);
}
