// Reference bytes of llama.cpp's grid quantizers (ggml-quants.c's quantize_iq3_s,
// quantize_iq3_xxs, quantize_iq2_xxs, quantize_iq2_xs, quantize_iq2_s, quantize_iq1_s,
// quantize_iq1_m, quantize_iq4_nl, quantize_iq4_xs, quantize_q8_0, quantize_q4_0, quantize_q5_0, quantize_q4_1,
// quantize_q5_1 and the K-quants' quantize_q2_K ... quantize_q6_K, with or without importance
// weights) for lode's tests: ci/llama_quant_ref.sh builds this against the llama.cpp tree
// of PyPI's llama-cpp-python sdist (ggml-quants.c compiled as llama.cpp's ggml-base is on
// x86-64: no FMA contraction).
//   usage: llama_quant_ref TYPE IN.f32 OUT.bin ROW_LEN [WEIGHTS.f32 (ROW_LEN values)]
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <stdarg.h>
typedef size_t (*quantize_fn)(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq3_s(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq3_xxs(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq2_xxs(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq2_xs(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq2_s(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq1_s(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq1_m(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq4_nl(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q4_0(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q5_0(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_iq4_xs(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q4_1(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q5_1(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q2_K(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q3_K(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q4_K(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q5_K(const float *, void *, int64_t, int64_t, const float *);
size_t quantize_q6_K(const float *, void *, int64_t, int64_t, const float *);
void quantize_row_q8_0_ref(const float *, void *, int64_t);
// quantize_q8_0 sizes its result with ggml.c's ggml_row_size: call the row function it runs.
static size_t q8_0(const float * x, void * y, int64_t nrow, int64_t n, const float * w) { (void)w; quantize_row_q8_0_ref(x, y, nrow * n); return nrow * n / 32 * 34; }
void iq3xs_init_impl(int grid_size);
void iq2xs_init_impl(int type);
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); exit(2); }
void ggml_log_internal(int level, const char * fmt, ...) { (void)level; (void)fmt; }
static float * read_f32(const char * path, long * n) {
    FILE * f = fopen(path, "rb"); if (!f) exit(3);
    fseek(f, 0, SEEK_END); *n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    float * x = malloc(*n * 4); if (fread(x, 4, *n, f) != (size_t)*n) exit(3); fclose(f);
    return x;
}
int main(int argc, char ** argv) {
    if (argc < 5) return 1;
    long n, nw = 0;
    float * x = read_f32(argv[2], &n);
    float * w = argc > 5 ? read_f32(argv[5], &nw) : NULL;
    int64_t row = atoi(argv[4]);
    quantize_fn q; int bytes;
    // ggml type ids: IQ2_XXS 16, IQ2_XS 17, IQ1_S 19, IQ2_S 22, IQ1_M 29.
    if (!strcmp(argv[1], "IQ3_S")) { iq3xs_init_impl(512); q = quantize_iq3_s; bytes = 110; }
    else if (!strcmp(argv[1], "IQ3_XXS")) { iq3xs_init_impl(256); q = quantize_iq3_xxs; bytes = 98; }
    else if (!strcmp(argv[1], "IQ2_XXS")) { iq2xs_init_impl(16); q = quantize_iq2_xxs; bytes = 66; }
    else if (!strcmp(argv[1], "IQ2_XS")) { iq2xs_init_impl(17); q = quantize_iq2_xs; bytes = 74; }
    else if (!strcmp(argv[1], "IQ2_S")) { iq2xs_init_impl(22); q = quantize_iq2_s; bytes = 82; }
    else if (!strcmp(argv[1], "IQ1_S")) { iq2xs_init_impl(19); q = quantize_iq1_s; bytes = 50; }
    else if (!strcmp(argv[1], "IQ1_M")) { iq2xs_init_impl(29); q = quantize_iq1_m; bytes = 56; }
    else if (!strcmp(argv[1], "IQ4_NL")) { q = quantize_iq4_nl; bytes = 8 * 18; }
    else if (!strcmp(argv[1], "IQ4_XS")) { q = quantize_iq4_xs; bytes = 136; }
    else if (!strcmp(argv[1], "Q8_0")) { q = q8_0; bytes = 8 * 34; }
    else if (!strcmp(argv[1], "Q4_0")) { q = quantize_q4_0; bytes = 8 * 18; }
    else if (!strcmp(argv[1], "Q5_0")) { q = quantize_q5_0; bytes = 8 * 22; }
    else if (!strcmp(argv[1], "Q4_1")) { q = quantize_q4_1; bytes = 8 * 20; }
    else if (!strcmp(argv[1], "Q5_1")) { q = quantize_q5_1; bytes = 8 * 24; }
    else if (!strcmp(argv[1], "Q2_K")) { q = quantize_q2_K; bytes = 84; }
    else if (!strcmp(argv[1], "Q3_K")) { q = quantize_q3_K; bytes = 110; }
    else if (!strcmp(argv[1], "Q4_K")) { q = quantize_q4_K; bytes = 144; }
    else if (!strcmp(argv[1], "Q5_K")) { q = quantize_q5_K; bytes = 176; }
    else if (!strcmp(argv[1], "Q6_K")) { q = quantize_q6_K; bytes = 210; }
    else return 4;
    if (w && nw != row) return 5;
    void * y = malloc(n / 256 * bytes);
    size_t b = q(x, y, n / row, row, w);
    FILE * f = fopen(argv[3], "wb"); fwrite(y, 1, b, f); fclose(f);
    return 0;
}
// Link stubs for ggml.c functions the quantizers reference but never reach here.
// The quantizers size their rows with it (ggml type ids: Q4_0 2, Q4_1 3, Q5_0 6, Q5_1 7,
// Q2_K 10 ... Q6_K 14).
size_t ggml_row_size(int type, int64_t ne) {
    switch (type) {
    case 2: return ne / 32 * 18; case 3: return ne / 32 * 20; case 6: return ne / 32 * 22; case 7: return ne / 32 * 24;
    case 10: return ne / 256 * 84; case 11: return ne / 256 * 110; case 12: return ne / 256 * 144;
    case 13: return ne / 256 * 176; case 14: return ne / 256 * 210;
    }
    abort();
}
size_t ggml_type_size(int type) { (void)type; abort(); }
const char * ggml_type_name(int type) { (void)type; abort(); }
