// kernels-hip/kvq_attn.hip on the host (common.h here stands in for the device header):
// random K and V planes of GGUF blocks (random codes and f16 scales, or f16 values), the
// split-keys decode kernel against a direct softmax attention over the planes decoded by
// the format's definition, and kvq_to_f16's rows against the same decode rounded to f16.
// usage: kvq_check HD N_HEAD N_KV TY_K TY_V POS WINDOW N_SPLIT MIN_CHUNK
//   (TY: 0 f16, 1 q8_0, 2 q4_0; POS: the query's position, POS + 1 rows cached)
// prints "MAX <relative error of the attention>" and "CONV <mismatched f16 values>".
#include "kvq_attn.hip"
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <algorithm>

static size_t row_bytes(int ty, int n) { return ty == 0 ? (size_t)n * 2 : ty == 1 ? (size_t)n / 32 * 34 : (size_t)n / 32 * 18; }

// Value e of a plane, by the GGUF definitions (Q8_0: d, 32 i8; Q4_0: d, byte j holds
// value j in its low nibble and value j + 16 in its high one, each minus 8).
static float at(const std::vector<u8>& p, int ty, size_t e) {
    u16 h;
    if (ty == 0) { memcpy(&h, &p[2 * e], 2); return h2f(h); }
    size_t b = e / 32; int i = (int)(e % 32);
    if (ty == 1) { memcpy(&h, &p[b * 34], 2); return (float)(signed char)p[b * 34 + 2 + i] * h2f(h); }
    memcpy(&h, &p[b * 18], 2);
    int byte = p[b * 18 + 2 + (i % 16)];
    int nib = i < 16 ? (byte & 15) : (byte >> 4);
    return (float)(nib - 8) * h2f(h);
}

int main(int argc, char** argv) {
    if (argc != 10) { fprintf(stderr, "usage: kvq_check HD N_HEAD N_KV TY_K TY_V POS WINDOW N_SPLIT MIN_CHUNK\n"); return 2; }
    const int hd = atoi(argv[1]), n_head = atoi(argv[2]), n_kv = atoi(argv[3]), ty_k = atoi(argv[4]), ty_v = atoi(argv[5]);
    const int P = atoi(argv[6]), window = atoi(argv[7]), n_split = atoi(argv[8]), min_chunk = atoi(argv[9]);
    const int rows = P + 1, n = n_kv * hd, group = n_head / n_kv;
    std::mt19937 rng(11 + P);
    std::uniform_real_distribution<float> U(-1, 1);
    auto plane = [&](int ty, float mag) {
        std::vector<u8> p(row_bytes(ty, n) * rows);
        if (ty == 0) {
            for (size_t e = 0; e < (size_t)rows * n; ++e) { u16 h = f2h(U(rng) * mag); memcpy(&p[2 * e], &h, 2); }
            return p;
        }
        const size_t bb = ty == 1 ? 34 : 18;
        for (size_t b = 0; b < p.size() / bb; ++b) {
            u16 d = f2h((0.2f + 0.8f * fabsf(U(rng))) * mag / (ty == 1 ? 127.0f : 8.0f));
            memcpy(&p[b * bb], &d, 2);
            for (size_t j = 2; j < bb; ++j) p[b * bb + j] = (u8)(rng() & 255);
        }
        return p;
    };
    std::vector<u8> kc = plane(ty_k, 1.5f), vc = plane(ty_v, 1.0f);
    std::vector<float> q((size_t)n_head * hd);
    for (auto& x : q) x = U(rng) * 2.0f;
    const float scale = 1.0f / sqrtf((float)hd);

    // The reference: softmax over keys k0..=P in double.
    const int k0 = window > 0 ? std::max(0, P - window + 1) : 0;
    std::vector<double> want((size_t)n_head * hd, 0.0);
    for (int h = 0; h < n_head; ++h) {
        const int kvh = h / group;
        std::vector<double> s(rows);
        double mx = -1e300;
        for (int p = k0; p <= P; ++p) {
            double d = 0;
            for (int i = 0; i < hd; ++i) d += (double)q[h * hd + i] * at(kc, ty_k, (size_t)p * n + kvh * hd + i);
            s[p] = d * scale;
            mx = std::max(mx, s[p]);
        }
        double sum = 0;
        for (int p = k0; p <= P; ++p) sum += exp(s[p] - mx);
        for (int p = k0; p <= P; ++p) {
            const double w = exp(s[p] - mx) / sum;
            for (int i = 0; i < hd; ++i) want[h * hd + i] += w * at(vc, ty_v, (size_t)p * n + kvh * hd + i);
        }
    }

    // The kernel: grid (group, n_kv, n_split), 512 threads; scratch as the host lays it out.
    std::vector<float> out((size_t)n_head * hd, NAN);
    const size_t cnt_bytes = ((size_t)n_head * 4 + 255) / 256 * 256;
    std::vector<u32> scratch((cnt_bytes + (size_t)n_head * n_split * (hd + 2) * 4) / 4, 0);
    int pos = P;
    u32* cnt = scratch.data();
    float* part = (float*)(scratch.data() + cnt_bytes / 4);
    for (int rep = 0; rep < 2; ++rep) {  // twice: the counters must be back at zero
        std::fill(out.begin(), out.end(), NAN);
        launch(group, n_kv, n_split, 512, [&] {
            if (hd == 64) kvq_decode_d64(q.data(), kc.data(), vc.data(), out.data(), nullptr, &pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
            else if (hd == 128) kvq_decode_d128(q.data(), kc.data(), vc.data(), out.data(), nullptr, &pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
            else kvq_decode_d256(q.data(), kc.data(), vc.data(), out.data(), nullptr, &pos, part, cnt, group, n_kv, ty_k, ty_v, scale, window, n_split, min_chunk);
        });
        for (int h = 0; h < n_head; ++h)
            if (cnt[h] != 0) { printf("counter of head %d left at %u\n", h, cnt[h]); return 1; }
    }
    double maxe = 0;
    for (int h = 0; h < n_head; ++h) {
        double rmax = 0;
        for (int i = 0; i < hd; ++i) rmax = std::max(rmax, fabs(want[h * hd + i]));
        for (int i = 0; i < hd; ++i) {
            const double e = fabs((double)out[h * hd + i] - want[h * hd + i]) / (rmax + 1e-6);
            if (!(e <= maxe)) maxe = std::isnan(e) ? INFINITY : e;
        }
    }
    printf("MAX %.3e\n", maxe);

    // kvq_to_f16 over rows lo..=P (lo: the decode's first visible key rounded down to 64).
    const int lo = k0 / 64 * 64, nr = P + 1 - lo;
    const int nk = ty_k ? n : 0, nv = ty_v ? n : 0;
    std::vector<u16> dk((size_t)nr * n, 0xffff), dv((size_t)nr * n, 0xffff);
    const int gx = (nr * (std::max(nk, nv) / 16) + 255) / 256;
    if (gx > 0) launch(gx, 1, 1, 256, [&] { kvq_to_f16(kc.data(), vc.data(), dk.data(), dv.data(), nk, nv, lo, nr, ty_k, ty_v); });
    size_t bad = 0;
    for (int r = 0; r < nr; ++r)
        for (int i = 0; i < n; ++i) {
            const size_t e = (size_t)(lo + r) * n + i;
            if (ty_k && dk[(size_t)r * n + i] != f2h(at(kc, ty_k, e))) ++bad;
            if (ty_v && dv[(size_t)r * n + i] != f2h(at(vc, ty_v, e))) ++bad;
        }
    printf("CONV %zu\n", bad);
}
