// Reference bytes of llama.cpp's IQ3_S quantizer (ggml-quants.c's quantize_iq3_s, no
// importance matrix) for lode's test: ci/llama_quant_ref.sh builds this against the
// llama.cpp tree of PyPI's llama-cpp-python sdist (ggml-quants.c compiled as llama.cpp's
// ggml-base is on x86-64: no FMA contraction).
//   usage: llama_quant_ref IN.f32 OUT.bin ROW_LEN
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdarg.h>
size_t quantize_iq3_s(const float * src, void * dst, int64_t nrow, int64_t n_per_row, const float * quant_weights);
void iq3xs_init_impl(int grid_size);
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); exit(2); }
void ggml_log_internal(int level, const char * fmt, ...) { (void)level; (void)fmt; }
int main(int argc, char ** argv) {
    FILE * f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f) / 4; fseek(f, 0, SEEK_SET);
    float * x = malloc(n * 4); if (fread(x, 4, n, f) != (size_t)n) return 1; fclose(f);
    int64_t row = atoi(argv[3]);
    iq3xs_init_impl(512);
    void * y = malloc(n / 256 * 110);
    size_t b = quantize_iq3_s(x, y, n / row, row, NULL);
    f = fopen(argv[2], "wb"); fwrite(y, 1, b, f); fclose(f);
    return 0;
}
// Link stubs for ggml.c functions the quantizers reference but never reach here.
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
const char * ggml_type_name(int type) { (void)type; abort(); }
