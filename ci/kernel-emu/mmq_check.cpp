// kernels-hip/mmq.hip on the host (common.h here stands in for the device header) against
// an f64 reference: the weights dequantized by a transcription of ggml's block formats,
// times the activation blocks the kernel reads (made here in the K form for the K-quants,
// the q8_1 form for the 32-element types), over random shapes; the split-K partial sums
// added in order as mmq_ksum does.
// usage: mmq_check TYPE ROWS K NCOLS SPLITS SEED (TYPE: q4_K q5_K q6_K q4_0 q8_0 q4_K_mma q6_K_mma);
// prints "MAX <err>", the largest |got - want| / (1e-4 sum|w x| + 1e-5).
#include "mmq.hip"
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

static u16 f2h_host(float f) {  // round to nearest, normal range only (the values made here)
    if (f == 0.0f) return 0;
    u32 b = __builtin_bit_cast(u32, f), s = (b >> 16) & 0x8000;
    int e = (int)((b >> 23) & 255) - 127 + 15;
    u32 m = b & 0x7fffff;
    u32 r = (m >> 13) + ((m >> 12) & 1);
    if (r == 1024) r = 0, ++e;
    return (u16)(s | (e << 10) | r);
}
static void scale_min(int j, const u8* q, int* d, int* m) {
    if (j < 4) *d = q[j] & 63, *m = q[j + 4] & 63;
    else *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}
// One row of k weights of `ty` dequantized (ggml's dequantize_row_*).
static void dequant(const std::string& ty, const u8* b, int k, double* y) {
    if (ty == "q4_K") {
        for (int sb = 0; sb < k / 256; ++sb, b += 144, y += 256) {
            double d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2));
            const u8 *sc = b + 4, *q = b + 16;
            for (int c = 0; c < 4; ++c) {
                int s1, m1, s2, m2;
                scale_min(2 * c, sc, &s1, &m1);
                scale_min(2 * c + 1, sc, &s2, &m2);
                for (int l = 0; l < 32; ++l) {
                    y[64 * c + l] = d * s1 * (q[32 * c + l] & 0xF) - dmin * m1;
                    y[64 * c + 32 + l] = d * s2 * (q[32 * c + l] >> 4) - dmin * m2;
                }
            }
        }
    } else if (ty == "q5_K") {
        for (int sb = 0; sb < k / 256; ++sb, b += 176, y += 256) {
            double d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2));
            const u8 *sc = b + 4, *qh = b + 16, *q = b + 48;
            for (int c = 0; c < 4; ++c) {
                int s1, m1, s2, m2;
                scale_min(2 * c, sc, &s1, &m1);
                scale_min(2 * c + 1, sc, &s2, &m2);
                for (int l = 0; l < 32; ++l) {
                    int lo = (q[32 * c + l] & 0xF) + ((qh[l] >> (2 * c)) & 1) * 16;
                    int hi = (q[32 * c + l] >> 4) + ((qh[l] >> (2 * c + 1)) & 1) * 16;
                    y[64 * c + l] = d * s1 * lo - dmin * m1;
                    y[64 * c + 32 + l] = d * s2 * hi - dmin * m2;
                }
            }
        }
    } else if (ty == "q6_K") {
        for (int sb = 0; sb < k / 256; ++sb, b += 210, y += 256) {
            double d = h2f(ld_u16(b + 208));
            for (int h = 0; h < 2; ++h) {
                const u8 *ql = b + 64 * h, *qh = b + 128 + 32 * h;
                const i8* sc = (const i8*)(b + 192 + 8 * h);
                double* yy = y + 128 * h;
                for (int l = 0; l < 32; ++l) {
                    int is = l / 16;
                    int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                    int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                    int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                    int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                    yy[l] = d * sc[is] * q1;
                    yy[l + 32] = d * sc[is + 2] * q2;
                    yy[l + 64] = d * sc[is + 4] * q3;
                    yy[l + 96] = d * sc[is + 6] * q4;
                }
            }
        }
    } else if (ty == "q4_0") {
        for (int i = 0; i < k / 32; ++i, b += 18, y += 32) {
            double d = h2f(ld_u16(b));
            for (int j = 0; j < 16; ++j) y[j] = d * ((b[2 + j] & 0xF) - 8), y[j + 16] = d * ((b[2 + j] >> 4) - 8);
        }
    } else {  // q8_0
        for (int i = 0; i < k / 32; ++i, b += 34, y += 32) {
            double d = h2f(ld_u16(b));
            for (int j = 0; j < 32; ++j) y[j] = d * (i8)b[2 + j];
        }
    }
}
static int block_bytes(const std::string& ty) { return ty == "q4_K" ? 144 : ty == "q5_K" ? 176 : ty == "q6_K" ? 210 : ty == "q4_0" ? 18 : 34; }
static int block_elems(const std::string& ty) { return ty[3] == 'K' ? 256 : 32; }

int main(int argc, char** argv) {
    if (argc < 7) return 2;
    std::string ty = argv[1];
    // q4_K_mma, q6_K_mma: the matrix-core kernels (mma.sync emulated by its fragment layout).
    const bool mma = ty.size() > 4 && ty.substr(4) == "_mma";
    ty = ty.substr(0, 4);
    int M = atoi(argv[2]), K = atoi(argv[3]), N = atoi(argv[4]), splits = atoi(argv[5]);
    std::mt19937 rng(atoi(argv[6]));
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> U(-1, 1);
    const int bb = block_bytes(ty), be = block_elems(ty), nb = K / be;
    std::vector<u8> W((size_t)M * nb * bb);
    for (auto& v : W) v = (u8)byte(rng);
    for (int i = 0; i < M * nb; ++i) {  // sane f16 scales
        u8* b = &W[(size_t)i * bb];
        auto put = [&](int off, float v) { u16 h = f2h_host(v); memcpy(b + off, &h, 2); };
        if (ty == "q4_K" || ty == "q5_K") put(0, 0.01f * (1 + U(rng))), put(2, 0.01f * (1 + U(rng)));
        else if (ty == "q6_K") put(208, 0.01f * (1 + U(rng)));
        else put(0, 0.05f * (1 + U(rng)));
    }
    // Activations and their blocks: [N][K/32] block_q8_1.
    const int kb = K / 32;
    std::vector<float> x((size_t)N * K);
    for (auto& v : x) v = U(rng);
    std::vector<block_q8_1> X((size_t)N * kb);
    std::vector<double> xh((size_t)N * K);
    for (int c = 0; c < N; ++c) {
        const float* xr = &x[(size_t)c * K];
        if (be == 256) {  // K form
            for (int sb = 0; sb < K / 256; ++sb) {
                float mx = 0;
                for (int i = 0; i < 256; ++i) if (fabsf(xr[256 * sb + i]) > fabsf(mx)) mx = xr[256 * sb + i];
                float is = -127.0f / mx, d = 1.0f / is;
                u32 bits = __builtin_bit_cast(u32, d);
                for (int j = 0; j < 8; ++j) {
                    block_q8_1& b = X[(size_t)c * kb + 8 * sb + j];
                    int s = 0;
                    for (int i = 0; i < 32; ++i) {
                        int q = (int)rintf(is * xr[256 * sb + 32 * j + i]);
                        q = q < 127 ? q : 127;
                        b.qs[i] = (i8)q, s += q;
                        xh[(size_t)c * K + 256 * sb + 32 * j + i] = (double)d * q;
                    }
                    b.d = (u16)((j & 1) ? bits >> 16 : bits & 0xffff);
                    b.s = (u16)(short)s;
                }
            }
        } else {  // q8_1 form
            for (int j = 0; j < kb; ++j) {
                float am = 0;
                for (int i = 0; i < 32; ++i) am = fmaxf(am, fabsf(xr[32 * j + i]));
                block_q8_1& b = X[(size_t)c * kb + j];
                u16 dh = f2h_host(am / 127.0f);
                int s = 0;
                for (int i = 0; i < 32; ++i) {
                    int q = (int)rintf(xr[32 * j + i] * 127.0f / am);
                    b.qs[i] = (i8)q, s += q;
                    xh[(size_t)c * K + 32 * j + i] = (double)h2f(dh) * q;
                }
                b.d = dh;
                b.s = f2h_host(h2f(dh) * s);
            }
        }
    }
    const int steps = (K + 255) / 256, per = (steps + splits - 1) / splits;
    splits = (steps + per - 1) / per;
    const int rpb = ty == "q4_K" ? 64 : 32;
    std::vector<float> P((size_t)splits * N * M, NAN), Y((size_t)N * M, NAN);
    float* out = splits > 1 ? P.data() : Y.data();
    auto kern = mma && ty == "q6_K" ? (N <= 8 ? mmq_mma_q6_K_c8 : N <= 16 ? mmq_mma_q6_K_c16 : N <= 32 ? mmq_mma_q6_K_c32 : mmq_mma_q6_K_c64)
              : mma ? (N <= 8 ? mmq_mma_q4_K_c8 : N <= 16 ? mmq_mma_q4_K_c16 : N <= 32 ? mmq_mma_q4_K_c32 : mmq_mma_q4_K_c64)
              : ty == "q4_K" ? (N <= 8 ? mmq_q4_K_c8 : N <= 16 ? mmq_q4_K_c16 : N <= 32 ? mmq_q4_K_c32 : mmq_q4_K_c64)
              : ty == "q5_K" ? (N <= 8 ? mmq_q5_K_c8 : N <= 16 ? mmq_q5_K_c16 : N <= 32 ? mmq_q5_K_c32 : mmq_q5_K_c64)
              : ty == "q6_K" ? (N <= 8 ? mmq_q6_K_c8 : N <= 16 ? mmq_q6_K_c16 : N <= 32 ? mmq_q6_K_c32 : mmq_q6_K_c64)
              : ty == "q4_0" ? (N <= 8 ? mmq_q4_0_c8 : N <= 16 ? mmq_q4_0_c16 : N <= 32 ? mmq_q4_0_c32 : mmq_q4_0_c64)
                             : (N <= 8 ? mmq_q8_0_c8 : N <= 16 ? mmq_q8_0_c16 : N <= 32 ? mmq_q8_0_c32 : mmq_q8_0_c64);
    launch((M + rpb - 1) / rpb, 1, splits, 256, [&] { kern(W.data(), X.data(), out, M, K, N, per); });
    if (splits > 1) {
        const int nm = N * M;
        launch((nm + 255) / 256, 1, 1, 256, [&] { mmq_ksum(P.data(), Y.data(), splits, nm); });
    }
    std::vector<double> wr(K);
    double worst = 0;
    for (int r = 0; r < M; ++r) {
        dequant(ty, &W[(size_t)r * nb * bb], K, wr.data());
        for (int c = 0; c < N; ++c) {
            double dot = 0, mag = 0;
            for (int i = 0; i < K; ++i) dot += wr[i] * xh[(size_t)c * K + i], mag += fabs(wr[i] * xh[(size_t)c * K + i]);
            double g = Y[(size_t)c * M + r];
            double e = std::isfinite(g) ? fabs(g - dot) / (1e-4 * mag + 1e-5) : INFINITY;
            if (e > worst) worst = e;
            if (e > 1 && worst == e) fprintf(stderr, "row %d col %d: got %g want %g\n", r, c, g, dot);
        }
    }
    printf("MAX %g\n", worst);
    return 0;
}
