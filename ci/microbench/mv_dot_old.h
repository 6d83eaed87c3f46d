// The decode dot bodies of Q4_K and Q6_K as they were before ci/microbench/mv_dot.cu's
// comparison (main at f2e0d0a, kernels-hip/matvec.hip), renamed into namespace old.
// Include after kernels-hip/matvec.hip (uses mv_dot.h's u32x4, q8qs and common.h).
namespace old {
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

template <int NC>
DEV void mv_q4_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
    // Up to 16 super-blocks per outer step in 4 slots: every weight load of the step is
    // issued before any is used (decode matvecs are latency-bound).
    for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
        u32x4 hd[4], qv[4];
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) {
                const u8* b = wr + (u64)sb * 144;
                hd[it] = *(const u32x4*)b;
                qv[it] = *(const u32x4*)(b + 16 + 32 * c + 16 * h);
            }
        }
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb >= nsb) continue;
            const float d = h2f((u16)(hd[it].x & 0xffff)), dmin = h2f((u16)(hd[it].x >> 16));
            float sc0, m0, sc1, m1;
            scale_min_k4_r(2 * c, hd[it].y, hd[it].z, hd[it].w, &sc0, &m0);
            scale_min_k4_r(2 * c + 1, hd[it].y, hd[it].z, hd[it].w, &sc1, &m1);
            const u32 qw[4] = {qv[it].x, qv[it].y, qv[it].z, qv[it].w};
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
}

template <int NC>
DEV void mv_q6_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, h = j >> 2, l0 = 8 * (j & 3);
    for (int sb0 = 0; sb0 < nsb; sb0 += 16)
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb >= nsb) continue;
        const u8* b = wr + (u64)sb * 210;
        const u8* L = b + 64 * h;
        const u8* H = b + 128 + 32 * h;
        const i8* S = (const i8*)(b + 192);
        const float d = h2f(ld_u16(b + 208));
        u32 q[4][2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const u32 lw = ld_u32_a2(L + l0 + 4 * i), lw32 = ld_u32_a2(L + 32 + l0 + 4 * i), hw = ld_u32_a2(H + l0 + 4 * i);
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
                v += (float)S[8 * h + 2 * g + l0 / 16] * (float)s;
            }
            acc[col] += d * dx * v;
        }
    }
}

}  // namespace old
