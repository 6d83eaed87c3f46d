// kernels-hip/mv_dot_low.h's decode dot bodies on the host (common.h here stands in for
// the device header; their gfx11 branches), one warp per row as matvec.hip runs them,
// against the CPU's dequantization: runtime/tests/mv_low_kernel_emulated.rs writes the
// weight rows lode quantized and lode's dequantized values, this program makes random
// activations in the form the body reads (the K form: int8 codes, one f32 scale per 256
// values in the d halves of a super-block's first two blocks; IQ4_NL's q8_1 form: an f16
// scale per block) and compares every output with the f64 sum Σ deq · code · scale.
// usage: mv_low_check TYPE FILE NCOLS SEED (TYPE: q3_K q2_K iq4_xs iq4_nl; FILE: u32 rows,
// u32 k, the weight bytes, rows·k f32); prints "MAX <err>", the largest
// |got - want| / (1e-5 Σ|w x| + 1e-6).
#define __device__
#include "common.h"
// dequant_low.h's element dequantization uses the device header's rounded arithmetic.
DEV float mul_rn(float a, float b) { return a * b; }
DEV float sub_rn(float a, float b) { return a - b; }
#include "mv_dot.h"
#include "mv_dot_b32.h"
#include "dequant_low.h"
#include "mv_dot_low.h"
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

static u16 f2h_host(float f) { return __builtin_bit_cast(u16, (_Float16)f); }

int main(int argc, char** argv) {
    if (argc != 5) return 2;
    const std::string ty = argv[1];
    FILE* fp = fopen(argv[2], "rb");
    if (!fp) return 2;
    u32 hdr[2];
    if (fread(hdr, 4, 2, fp) != 2) return 2;
    const int rows = (int)hdr[0], k = (int)hdr[1], ncols = atoi(argv[3]);
    const int bb = ty == "q3_K" ? 110 : ty == "q2_K" ? 84 : ty == "iq4_xs" ? 136 : 18;
    const int qk = ty == "iq4_nl" ? 32 : 256;
    const size_t wbytes = (size_t)rows * (k / qk) * bb;
    // 16 spare bytes: the bodies' word loads stay inside a super-block or the one before.
    std::vector<u8> w(wbytes + 16);
    std::vector<float> deq((size_t)rows * k);
    if (fread(w.data(), 1, wbytes, fp) != wbytes || fread(deq.data(), 4, deq.size(), fp) != deq.size()) return 2;
    fclose(fp);
    std::mt19937 rng(atoi(argv[4]));
    std::uniform_int_distribution<int> code(-127, 127);
    std::uniform_real_distribution<float> sc(0.001f, 0.05f);
    const int kb = k / 32;
    std::vector<block_q8_1> x((size_t)kb * ncols);
    std::vector<double> xv((size_t)k * ncols);
    for (int c = 0; c < ncols; ++c) {
        for (int b = 0; b < kb; ++b) {
            block_q8_1& blk = x[(size_t)c * kb + b];
            for (int i = 0; i < 32; ++i) blk.qs[i] = (i8)code(rng);
            blk.d = blk.s = 0;
        }
        for (int b = 0; b < kb; b += (qk == 256 ? 8 : 1)) {
            float d = sc(rng);
            if (qk == 256) {
                const u32 bits = __builtin_bit_cast(u32, d);
                x[(size_t)c * kb + b].d = (u16)bits, x[(size_t)c * kb + b + 1].d = (u16)(bits >> 16);
            } else {
                x[(size_t)c * kb + b].d = f2h_host(d);
                d = h2f(x[(size_t)c * kb + b].d);
            }
            for (int bi = b; bi < b + (qk == 256 ? 8 : 1); ++bi)
                for (int i = 0; i < 32; ++i) xv[(size_t)c * k + bi * 32 + i] = (double)d * x[(size_t)c * kb + bi].qs[i];
        }
    }
    std::vector<float> y((size_t)rows * ncols, NAN);
    const int nsb = k / 256;
    // One 128-thread block per 4 rows, as matvec.hip's MV_K / MV_NL kernels (NC = 1 or 8).
    launch((rows + 3) / 4, 1, 1, 128, [&] {
        const int row = bid_x() * 4 + (tid_x() >> 5);
        if (row >= rows) return;  // whole warps
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        const u8* wr = w.data() + (size_t)row * (k / qk) * bb;
        auto body = [&](auto nc) {
            constexpr int NC = decltype(nc)::value;
            if (ty == "q3_K") mv_q3_K<NC>(wr, x.data(), kb, nsb, ncols, acc);
            else if (ty == "q2_K") mv_q2_K<NC>(wr, x.data(), kb, nsb, ncols, acc);
            else if (ty == "iq4_xs") mv_iq4_xs<NC>(wr, x.data(), kb, nsb, ncols, acc);
            else mv_nl<false, NC>(wr, x.data(), kb, ncols, acc);
        };
        if (ncols == 1) body(std::integral_constant<int, 1>());
        else body(std::integral_constant<int, 8>());
        for (int c = 0; c < 8; ++c) {
            const float v = warp_sum(acc[c]);
            if ((tid_x() & 31) == 0 && c < ncols) y[(size_t)c * rows + row] = v;
        }
    });
    double worst = 0;
    for (int c = 0; c < ncols; ++c)
        for (int r = 0; r < rows; ++r) {
            double want = 0, mag = 0;
            for (int i = 0; i < k; ++i) {
                const double p = (double)deq[(size_t)r * k + i] * xv[(size_t)c * k + i];
                want += p, mag += fabs(p);
            }
            const double got = y[(size_t)c * rows + r];
            const double e = std::isnan(got) ? INFINITY : fabs(got - want) / (1e-5 * mag + 1e-6);
            if (e > worst) worst = e;
        }
    printf("MAX %.6e\n", worst);
    return 0;
}
