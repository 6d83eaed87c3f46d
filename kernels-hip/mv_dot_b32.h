// Decode dot products of the 32-element block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) against
// the q8_1 form, one warp per output row, in mv_dot.h's shape (its header comment says
// how the `*_wload` / `*_wdot` pairs are used). Include after mv_dot.h.

// ---- 32-element blocks: 2 lanes per block (16 elements each), 16 blocks per warp step ----

// Expand 4 bits (bit i -> byte i, bit 4).
DEV u32 spread4(u32 x) { return ((x & 1) << 4) | ((x & 2) << 11) | ((x & 4) << 18) | ((x & 8) << 25); }
// Bytes b - o (b in [0, 32), o = 8 or 16 in every byte) as signed bytes, without borrows.
DEV u32 sub_bytes(u32 b, u32 o) { return ((b | 0x80808080u) - o) ^ 0x80808080u; }

// TYPE: 0 = Q4_0, 1 = Q4_1, 2 = Q5_0, 3 = Q5_1, 4 = Q8_0
template <int TYPE> struct b32_bytes { enum { BB = TYPE == 0 ? 18 : TYPE == 1 ? 20 : TYPE == 2 ? 22 : TYPE == 3 ? 24 : 34 }; };

// Per slot: d and m (u16 bits), the high-bit word H (Q5_0 / Q5_1), and the raw quant
// words (Q8_0: 4 words of codes; the 4/5-bit types: 2 words of nibbles).
template <int NS> struct b32_w { u32 d[NS], m[NS], H[NS], q[NS][4]; };

template <int TYPE, int NS>
DEV void b32_wload(const u8* wr, int kb, int blk0, b32_w<NS>& r) {
    constexpr int BB = b32_bytes<TYPE>::BB;
    const int lane = tid_x() & 31, hh = lane & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int blk = blk0 + (lane >> 1) + 16 * it;
        if (blk >= kb) continue;
        const u8* b = wr + (u64)blk * BB;
        r.d[it] = ld_u16(b);
        if (TYPE == 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) r.q[it][i] = ld_u32_a2(b + 2 + 16 * hh + 4 * i);
        } else {
            const int qoff = TYPE == 0 ? 2 : TYPE == 1 ? 4 : TYPE == 2 ? 6 : 8;
            if (TYPE == 1 || TYPE == 3) r.m[it] = ld_u16(b + 2);
            if (TYPE == 2) r.H[it] = ld_u32_a2(b + 2);
            if (TYPE == 3) r.H[it] = ld_u32_a2(b + 4);
#pragma unroll
            for (int i = 0; i < 2; ++i) r.q[it][i] = ld_u32_a2(b + qoff + 8 * hh + 4 * i);
        }
    }
}

template <int TYPE, int NC, int NS>
DEV void b32_wdot(const b32_w<NS>& r, const block_q8_1* x, int kb, int blk0, int ncols, float* acc) {
    const int lane = tid_x() & 31, hh = lane & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int blk = blk0 + (lane >> 1) + 16 * it;
        if (blk >= kb) continue;
        const float d = h2f((u16)r.d[it]);
        float m = 0.0f;
        int w[4];
        if (TYPE == 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) w[i] = (int)r.q[it][i];
        } else {
            if (TYPE == 1 || TYPE == 3) m = h2f((u16)r.m[it]);
            const u32 H = (TYPE == 2 || TYPE == 3) ? r.H[it] : 0u;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const u32 qw = r.q[it][i];
                u32 lo = qw & 0x0F0F0F0F, hi = (qw >> 4) & 0x0F0F0F0F;
                if (TYPE == 2 || TYPE == 3) {
                    lo |= spread4((H >> (8 * hh + 4 * i)) & 15);
                    hi |= spread4((H >> (16 + 8 * hh + 4 * i)) & 15);
                }
                if (TYPE == 0) lo = sub_bytes(lo, 0x08080808u), hi = sub_bytes(hi, 0x08080808u);
                if (TYPE == 2) lo = sub_bytes(lo, 0x10101010u), hi = sub_bytes(hi, 0x10101010u);
                w[i] = (int)lo;
                w[2 + i] = (int)hi;
            }
        }
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = x + (u64)col * kb + blk;
            const int* a = q8qs(xb);
            int s = 0;
            if (TYPE == 4) {
#pragma unroll
                for (int i = 0; i < 4; ++i) s = dot4(w[i], a[4 * hh + i], s);
            } else {
                s = dot4(w[0], a[2 * hh], s);
                s = dot4(w[1], a[2 * hh + 1], s);
                s = dot4(w[2], a[4 + 2 * hh], s);
                s = dot4(w[3], a[4 + 2 * hh + 1], s);
            }
            float v = d * h2f(xb->d) * (float)s;
            if (hh == 0 && (TYPE == 1 || TYPE == 3)) v += m * h2f(xb->s);
            acc_add<NC>(acc[col], v);
        }
    }
}

template <int TYPE, int NC>
DEV void mv_b32(const u8* wr, const block_q8_1* x, int kb, int ncols, float* acc) {
    for (int blk0 = 0; blk0 < kb; blk0 += 64) {
        b32_w<4> r;
        b32_wload<TYPE, 4>(wr, kb, blk0, r);
        b32_wdot<TYPE, NC, 4>(r, x, kb, blk0, ncols, acc);
    }
}
