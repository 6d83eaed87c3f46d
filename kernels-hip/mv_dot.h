// Per-type decode dot products, one warp per output row: shared by the decode matvecs
// (matvec.hip) and the fused decode kernels (decode_mv.hip). Include after common.h.
//
// Each quantized type comes as a pair: `*_wload` issues one lane's weight loads of one
// warp step into a register set (`*_w`), `*_wdot<NC>` multiplies those registers with the
// activation blocks of NC columns. The split lets a caller issue a row's first loads
// before anything the activations depend on (decode_mv.hip: before the RMSNorm that
// makes them); `mv_*<NC>` is the plain loop of both. The activation pointer may point to
// global or shared memory (generic addressing), in block_q8_1's 36-byte shape: the q8_1
// form for the 32-element types, the K form for the K-quants (quantize.hip).
// Steps: NS slots each; a K-quant slot is 4 super-blocks (8 lanes per 256-element
// super-block), a 32-element slot 16 blocks (2 lanes per block). The matvecs use NS = 4
// (16 super-blocks / 64 blocks per step); the fused kernels fewer (registers).

struct __attribute__((aligned(16))) u32x4 { u32 x, y, z, w; };

DEV void scale_min_k4(int j, const u8* s, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// scale_min_k4 on the 12 scale bytes held in three registers (no local-memory copy).
DEV u32 byte_of(u32 w0, u32 w1, u32 w2, int i) {
    const u32 w = i < 4 ? w0 : (i < 8 ? w1 : w2);
    return (w >> (8 * (i & 3))) & 0xff;
}
DEV void scale_min_k4_r(int j, u32 w0, u32 w1, u32 w2, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(byte_of(w0, w1, w2, j) & 63);
        *m = (float)(byte_of(w0, w1, w2, j + 4) & 63);
    } else {
        const u32 a = byte_of(w0, w1, w2, j + 4), bm = byte_of(w0, w1, w2, j - 4), bs = byte_of(w0, w1, w2, j);
        *sc = (float)((a & 15) | ((bm >> 6) << 4));
        *m = (float)((a >> 4) | ((bs >> 6) << 4));
    }
}

DEV const int* q8qs(const block_q8_1* b) { return (const int*)b->qs; }

template <int NC>
DEV void store(float* y, const float* acc, int rows, int row, int ncols) {
    const int lane = tid_x() & 31;
#pragma unroll
    for (int c = 0; c < NC; ++c) {
        float v = warp_sum(acc[c]);
        if (lane == 0 && c < ncols) y[(u64)c * rows + row] = v;
    }
}

// ---- Q4_K (144-byte super-blocks) ----

template <int NS> struct q4k_w { u32x4 hd[NS], qv[NS]; };

template <int NS>
DEV void q4k_wload(const u8* wr, int nsb, int sb0, q4k_w<NS>& r) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb < nsb) {
            const u8* b = wr + (u64)sb * 144;
            r.hd[it] = *(const u32x4*)b;
            r.qv[it] = *(const u32x4*)(b + 16 + 32 * c + 16 * h);
        }
    }
}

template <int NC, int NS>
DEV void q4k_wdot(const q4k_w<NS>& r, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb >= nsb) continue;
        const float d = h2f((u16)(r.hd[it].x & 0xffff)), dmin = h2f((u16)(r.hd[it].x >> 16));
        float sc0, m0, sc1, m1;
        scale_min_k4_r(2 * c, r.hd[it].y, r.hd[it].z, r.hd[it].w, &sc0, &m0);
        scale_min_k4_r(2 * c + 1, r.hd[it].y, r.hd[it].z, r.hd[it].w, &sc1, &m1);
        const u32 qw[4] = {r.qv[it].x, r.qv[it].y, r.qv[it].z, r.qv[it].w};
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = x + (u64)col * kb + sb * 8 + 2 * c;
            const int* a0 = q8qs(xb) + 4 * h;
            const int* a1 = q8qs(xb + 1) + 4 * h;
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s0 = dot4((int)(qw[i] & 0x0F0F0F0F), a0[i], s0);
                s1 = dot4((int)((qw[i] >> 4) & 0x0F0F0F0F), a1[i], s1);
            }
            const float dx = q8k_scale(xb);
            float v = d * dx * (sc0 * (float)s0 + sc1 * (float)s1);
            if (h == 0) v -= dmin * dx * (m0 * q8k_bsum(xb) + m1 * q8k_bsum(xb + 1));
            acc[col] += v;
        }
    }
}

// Up to 16 super-blocks per outer step: every weight load of the step is issued before
// any is used (decode matvecs are latency-bound).
template <int NC>
DEV void mv_q4_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
        q4k_w<4> r;
        q4k_wload<4>(wr, nsb, sb0, r);
        q4k_wdot<NC, 4>(r, x, kb, nsb, sb0, ncols, acc);
    }
}

// ---- Q5_K (176-byte super-blocks) ----

template <int NS> struct q5k_w { u32x4 hd[NS], q[NS], qh[NS]; };

template <int NS>
DEV void q5k_wload(const u8* wr, int nsb, int sb0, q5k_w<NS>& r) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb < nsb) {
            const u8* b = wr + (u64)sb * 176;
            r.hd[it] = *(const u32x4*)b;
            r.q[it] = *(const u32x4*)(b + 48 + 32 * c + 16 * h);
            r.qh[it] = *(const u32x4*)(b + 16 + 16 * h);
        }
    }
}

template <int NC, int NS>
DEV void q5k_wdot(const q5k_w<NS>& r, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb >= nsb) continue;
        const float d = h2f((u16)(r.hd[it].x & 0xffff)), dmin = h2f((u16)(r.hd[it].x >> 16));
        float sc0, m0, sc1, m1;
        scale_min_k4_r(2 * c, r.hd[it].y, r.hd[it].z, r.hd[it].w, &sc0, &m0);
        scale_min_k4_r(2 * c + 1, r.hd[it].y, r.hd[it].z, r.hd[it].w, &sc1, &m1);
        const u32 qw[4] = {r.q[it].x, r.q[it].y, r.q[it].z, r.q[it].w};
        const u32 hw[4] = {r.qh[it].x, r.qh[it].y, r.qh[it].z, r.qh[it].w};
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = x + (u64)col * kb + sb * 8 + 2 * c;
            const int* a0 = q8qs(xb) + 4 * h;
            const int* a1 = q8qs(xb + 1) + 4 * h;
            int s0 = 0, s1 = 0;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const u32 lo = (qw[i] & 0x0F0F0F0F) | (((hw[i] >> (2 * c)) & 0x01010101) << 4);
                const u32 hi = ((qw[i] >> 4) & 0x0F0F0F0F) | (((hw[i] >> (2 * c + 1)) & 0x01010101) << 4);
                s0 = dot4((int)lo, a0[i], s0);
                s1 = dot4((int)hi, a1[i], s1);
            }
            const float dx = q8k_scale(xb);
            float v = d * dx * (sc0 * (float)s0 + sc1 * (float)s1);
            if (h == 0) v -= dmin * dx * (m0 * q8k_bsum(xb) + m1 * q8k_bsum(xb + 1));
            acc[col] += v;
        }
    }
}

template <int NC>
DEV void mv_q5_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
        q5k_w<4> r;
        q5k_wload<4>(wr, nsb, sb0, r);
        q5k_wdot<NC, 4>(r, x, kb, nsb, sb0, ncols, acc);
    }
}

// ---- Q6_K (210-byte super-blocks: fields only 2-byte aligned) ----

// Per slot: low bits of this lane's two 32-element groups (lw, lw32), high bits (hw),
// the four scale bytes it needs (two u16 pairs) and d.
template <int NS> struct q6k_w { u32 lw[NS][2], lw32[NS][2], hw[NS][2], s01[NS], s23[NS], d[NS]; };

template <int NS>
DEV void q6k_wload(const u8* wr, int nsb, int sb0, q6k_w<NS>& r) {
    const int lane = tid_x() & 31, j = lane & 7, h = j >> 2, l0 = 8 * (j & 3);
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb < nsb) {
            const u8* b = wr + (u64)sb * 210;
            const u8* L = b + 64 * h;
            const u8* H = b + 128 + 32 * h;
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                r.lw[it][i] = ld_u32_a2(L + l0 + 4 * i);
                r.lw32[it][i] = ld_u32_a2(L + 32 + l0 + 4 * i);
                r.hw[it][i] = ld_u32_a2(H + l0 + 4 * i);
            }
            const u16* sp = (const u16*)(b + 192 + 8 * h);
            r.s01[it] = (u32)sp[0] | ((u32)sp[1] << 16);
            r.s23[it] = (u32)sp[2] | ((u32)sp[3] << 16);
            r.d[it] = ld_u16(b + 208);
        }
    }
}

template <int NC, int NS>
DEV void q6k_wdot(const q6k_w<NS>& r, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, h = j >> 2, l0 = 8 * (j & 3);
    const int sh = 8 * (l0 / 16); // scale byte 8h + 2g + l0/16: byte l0/16 of u16 g
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb >= nsb) continue;
        const float d = h2f((u16)r.d[it]);
        const int S[4] = {(int)(i8)((r.s01[it] >> sh) & 0xff), (int)(i8)((r.s01[it] >> (16 + sh)) & 0xff),
                          (int)(i8)((r.s23[it] >> sh) & 0xff), (int)(i8)((r.s23[it] >> (16 + sh)) & 0xff)};
        u32 q[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 lw = r.lw[it][i], lw32 = r.lw32[it][i], hw = r.hw[it][i];
            q[0][i] = (lw & 0x0F0F0F0F) | ((hw & 0x03030303) << 4);
            q[1][i] = (lw32 & 0x0F0F0F0F) | (((hw >> 2) & 0x03030303) << 4);
            q[2][i] = ((lw >> 4) & 0x0F0F0F0F) | (((hw >> 4) & 0x03030303) << 4);
            q[3][i] = ((lw32 >> 4) & 0x0F0F0F0F) | (((hw >> 6) & 0x03030303) << 4);
        }
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            float v = 0.0f;
            const float dx = q8k_scale(x + (u64)col * kb + sb * 8);
#pragma unroll
            for (int g = 0; g < 4; ++g) {
                const block_q8_1* xb = x + (u64)col * kb + sb * 8 + 4 * h + g;
                const int* a = q8qs(xb) + l0 / 4;
                int s = dot4((int)q[g][0], a[0], 0);
                s = dot4((int)q[g][1], a[1], s);
                s -= dot4(0x20202020, a[0], dot4(0x20202020, a[1], 0));
                v += (float)S[g] * (float)s;
            }
            acc[col] += d * dx * v;
        }
    }
}

template <int NC>
DEV void mv_q6_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
        q6k_w<4> r;
        q6k_wload<4>(wr, nsb, sb0, r);
        q6k_wdot<NC, 4>(r, x, kb, nsb, sb0, ncols, acc);
    }
}

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
            acc[col] += v;
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
