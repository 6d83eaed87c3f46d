// Activation quantization: f32 rows -> q8_1 blocks (the decode matvec's input format).
#include "common.h"

// x: [n_rows, k] f32; y: [n_rows, kb] block_q8_1, kb = ceil(k / 32); elements past k are 0.
// d = amax / 127, q = round(x / d), s = d * sum(q) (the CPU reference's convention: the
// offset term of Q4_1/Q5_1/K-quant dots then equals the dot with the quantized values,
// so the GPU computes what the CPU computes).
// grid (ceil(kb / 8), n_rows), block 256: one warp per 32-element block.
KERNEL void quantize_q8_1(const float* x, block_q8_1* y, int k, int kb) {
    const int lane = tid_x() & 31;
    const int blk = bid_x() * 8 + (tid_x() >> 5);
    const int row = bid_y();
    if (blk >= kb) return;
    const int i = blk * 32 + lane;
    const float v = i < k ? x[(u64)row * k + i] : 0.0f;
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int q = (int)rint_f(v * id);
    const float qsum = warp_sum((float)q);
    block_q8_1* b = y + (u64)row * kb + blk;
    b->qs[lane] = (i8)q;
    if (lane == 0) {
        b->d = f2h(d);
        b->s = f2h(d * qsum);
    }
}
