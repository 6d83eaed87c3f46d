// Activation quantization: f32 rows -> the blocks the quantized matvecs read, rounded as
// the CPU backend rounds them (`quant::quantize` of the weight type's vec_dot_type), so the
// two backends carry the same activation quantization noise, not two independent ones.
//   q8_1 form (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 weights: the CPU's q8_0 / q8_1 have the same codes
//   and d): d = f16(amax / 127), codes round_even(x * (127 / amax)), s = f16(d * Σq).
//   K form (K-quant weights: the CPU's q8_K), see common.h (q8k_warp_codes).
// The `dq` kernels write the quantized values back as f32 (code × scale, the scale as the
// matvec reads it: d as f16 in the q8_1 form, exact f32 in the K form) for the prefill
// GEMM, whose f16 operand staging then rounds them once more (f16(q·d): at most 2^-11
// relative, far below the quantization step itself).
#include "common.h"

// x: [n_rows, k] f32; y: [n_rows, kb] block_q8_1, kb = ceil(k / 32); elements past k are 0.
// grid (ceil(kb / 8), n_rows), block 256: one warp per 32-element block.
KERNEL void quantize_q8_1(const float* x, block_q8_1* y, int k, int kb) { pdl_entry();
    const int lane = tid_x() & 31;
    const int blk = bid_x() * 8 + (tid_x() >> 5);
    const int row = bid_y();
    if (blk >= kb) return;
    const int i = blk * 32 + lane;
    const float v = i < k ? x[(u64)row * k + i] : 0.0f;
    q8_block_store(y + (u64)row * kb + blk, v);
}

// x: [n_rows, k] f32, k % 256 == 0; y: [n_rows, k / 32] K-form blocks.
// grid (ceil(k / 2048), n_rows), block 256: one warp per 256-element super-block.
KERNEL void quantize_q8_k(const float* x, block_q8_1* y, int k) { pdl_entry();
    const int sb = bid_x() * 8 + (tid_x() >> 5), lane = tid_x() & 31;
    if (sb >= k / 256) return;
    const float* p = x + (u64)bid_y() * k + sb * 256 + 8 * lane;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = p[j];
    int c[8];
    const float d = q8k_warp_codes(v, c);
    q8k_warp_store(y + (u64)bid_y() * (k / 32) + sb * 8, c, d);
}

// y = the q8_1 form's values of x (code × f16 d). x, y: [n_rows, k] f32, k % 32 == 0.
// grid (ceil(k / 256), n_rows), block 256.
KERNEL void quantize_dq_q8_1(const float* x, float* y, int k) { pdl_entry();
    const int i = bid_x() * 256 + tid_x(), lane = tid_x() & 31;
    if (i - lane >= k) return; // whole warp past the end (k % 32 == 0)
    const u64 at = (u64)bid_y() * k + i;
    const float v = x[at];
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    y[at] = (float)c * h2f(f2h(d));
}

// y = the K form's values of x (code × f32 d). x, y: [n_rows, k] f32, k % 256 == 0.
// grid (ceil(k / 2048), n_rows), block 256: one warp per super-block.
KERNEL void quantize_dq_q8_k(const float* x, float* y, int k) { pdl_entry();
    const int sb = bid_x() * 8 + (tid_x() >> 5), lane = tid_x() & 31;
    if (sb >= k / 256) return;
    const u64 at = (u64)bid_y() * k + sb * 256 + 8 * lane;
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = x[at + j];
    int c[8];
    const float d = q8k_warp_codes(v, c);
#pragma unroll
    for (int j = 0; j < 8; ++j) y[at + j] = (float)c[j] * d;
}
