// Decode dot products of the low-bit and non-linear weight types, one warp per output
// row, in mv_dot.h's `mv_*<NC>(W row, x, kb, nsb, ncols, acc)` shape: Q2_K, Q3_K and
// IQ4_XS against the K form (the CPU pairs them with q8_K), IQ4_NL and MXFP4 against the
// q8_1 form (the CPU's q8_0: same codes and d); the grid types (IQ3_S, IQ3_XXS, IQ2_XXS,
// IQ2_XS, IQ2_S, IQ1_S, IQ1_M) against the K form. Include after mv_dot.h, mv_dot_b32.h
// (sub_bytes) and dequant_low.h (grid_sub).
//
// The integer sums are exact, as the CPU's; only the order of the float terms differs
// (per lane, then the warp sum), so the fast kernels match the CPU to rounding.

// ---- 16-entry signed byte tables (IQ4_NL / IQ4_XS's kvalues, MXFP4's doubled E2M1) ----

// Little-endian words of the 16 table bytes.
#define IQ4_T0 0xBFAD9881u
#define IQ4_T1 0xF6EADDCFu
#define IQ4_T2 0x26190D01u
#define IQ4_T3 0x71594535u
#define MXFP4_T0 0x03020100u
#define MXFP4_T1 0x0C080604u
#define MXFP4_T2 0xFDFEFF00u
#define MXFP4_T3 0xF4F8FAFCu

// Bytes of (hi:lo) picked by the low 3 bits of each of the 4 low selector nibbles (bit 3
// ignored: CUDA's __byte_perm; perm_bytes would read it as sign-replicate).
DEV u32 byte_perm3(u32 lo, u32 hi, u32 sel) {
#ifdef LODE_NV
    return __byte_perm(lo, hi, sel);
#else
    return perm_bytes(lo, hi, sel & 0x7777u);
#endif
}

// The table bytes of the 8 nibble indices of q: lo those of its low nibbles (byte k: byte
// k's), hi those of its high nibbles. Nibble k of each 16-bit half selects from both table
// halves at once; a third permutation keeps, per nibble, the half its bit 3 names (as
// selector bit 2); two more gather the low and high nibbles' entries. 7 permutations per
// 8 entries.
DEV void lut16x8(u32 q, u32 t0, u32 t1, u32 t2, u32 t3, u32& lo, u32& hi) {
    const u32 pick = 0x32103210u | ((q & 0x88888888u) >> 1);
    const u32 a = byte_perm3(byte_perm3(t0, t1, q), byte_perm3(t2, t3, q), pick);
    const u32 b = byte_perm3(byte_perm3(t0, t1, q >> 16), byte_perm3(t2, t3, q >> 16), pick >> 16);
    lo = byte_perm3(a, b, 0x6420u);
    hi = byte_perm3(a, b, 0x7531u);
}

// Σ over 16 elements of table[nibble] · activation code: q0, q1 the 8 bytes of nibbles
// (low nibbles: 8 elements against a[0], a[1]; high: the 8 sixteen places on, against
// a[4], a[5] of the caller's offset).
template <bool MX>
DEV int nib_dot16(u32 q0, u32 q1, const int* a, int s) {
    const u32 t0 = MX ? MXFP4_T0 : IQ4_T0, t1 = MX ? MXFP4_T1 : IQ4_T1, t2 = MX ? MXFP4_T2 : IQ4_T2, t3 = MX ? MXFP4_T3 : IQ4_T3;
    u32 l0, h0, l1, h1;
    lut16x8(q0, t0, t1, t2, t3, l0, h0);
    lut16x8(q1, t0, t1, t2, t3, l1, h1);
    s = dot4((int)l0, a[0], s);
    s = dot4((int)l1, a[1], s);
    s = dot4((int)h0, a[4], s);
    s = dot4((int)h1, a[5], s);
    return s;
}

// ---- IQ4_NL (18 B) and MXFP4 (17 B): 2 lanes per 32-element block, 16 blocks a step ----
//
// Lane half hh = lane % 2 takes qs bytes 8hh .. 8hh + 7: elements 8hh .. (low nibbles) and
// 16 + 8hh .. (high nibbles). IQ4_NL: y = d·K[q], blocks 2-byte aligned; MXFP4: y =
// 2^(e − 128)·M[q] (e8m0_half), blocks byte aligned (byte loads).
DEV float e8m0_half(u32 e) {
    const u32 bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    return __builtin_bit_cast(float, bits);
}

template <bool MX> struct nl_w { u32 q0, q1, d; };

template <bool MX>
DEV void nl_load(const u8* b, int hh, nl_w<MX>& r) {
    if (MX) {
        const u8* p = b + 1 + 8 * hh;
        r.q0 = (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
        r.q1 = (u32)p[4] | ((u32)p[5] << 8) | ((u32)p[6] << 16) | ((u32)p[7] << 24);
        r.d = b[0];
    } else {
        r.q0 = ld_u32_a2(b + 2 + 8 * hh);
        r.q1 = ld_u32_a2(b + 6 + 8 * hh);
        r.d = ld_u16(b);
    }
}

template <bool MX, int NC>
DEV void mv_nl(const u8* wr, const block_q8_1* x, int kb, int ncols, float* acc) {
    constexpr int BB = MX ? 17 : 18;
    const int lane = tid_x() & 31, hh = lane & 1;
    for (int blk0 = 0; blk0 < kb; blk0 += 64) {
        nl_w<MX> r[4];
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int blk = blk0 + (lane >> 1) + 16 * it;
            if (blk < kb) nl_load<MX>(wr + (u64)blk * BB, hh, r[it]);
        }
#pragma unroll
        for (int it = 0; it < 4; ++it) {
            const int blk = blk0 + (lane >> 1) + 16 * it;
            if (blk >= kb) continue;
            const float d = MX ? e8m0_half(r[it].d) : h2f((u16)r[it].d);
#pragma unroll
            for (int col = 0; col < NC; ++col) {
                if (col >= ncols) break;
                const block_q8_1* xb = x + (u64)col * kb + blk;
                const int s = nib_dot16<MX>(r[it].q0, r[it].q1, q8qs(xb) + 2 * hh, 0);
                acc_add<NC>(acc[col], (MX ? h2f(xb->d) * d : d * h2f(xb->d)) * (float)s);
            }
        }
    }
}

// ---- Q2_K (84 B) and Q3_K (110 B): 8 lanes per 256-element super-block, 4 a step ----
//
// Lane = (super-block sb0 + lane / 8, half h = (lane / 4) % 2, quarter lq = lane % 4):
// qs bytes 32h + 8lq .. + 7 hold at bit pair 2g (g < 4) the codes of elements
// 128h + 32g + 8lq .. + 7, of sub-block 8h + 2g + lq / 2, against the K-form codes
// 8lq .. of block 4h + g. Q2_K: y = d·(sc & 15)·q − dmin·(sc >> 4), so the lane also sums
// its activation codes for the min term; Q3_K: y = d·(sc − 32)·(q − 4·!hbit), the high bit
// of element 128h + 32g + l at bit 4h + g of hmask[l].

struct q23_w { u32 q0, q1, h0, h1, s0, s1, s2, d; };

DEV void q2k_load(const u8* b, int h, int lq, q23_w& r) {
    r.q0 = ld_u32(b + 16 + 32 * h + 8 * lq);
    r.q1 = ld_u32(b + 20 + 32 * h + 8 * lq);
    r.s0 = ld_u32(b + 8 * h);  // scale bytes 8h .. 8h + 7
    r.s1 = ld_u32(b + 8 * h + 4);
    r.d = ld_u32(b + 80);      // d | dmin << 16
}

DEV void q3k_load(const u8* b, int h, int lq, q23_w& r) {
    r.q0 = ld_u32_a2(b + 32 + 32 * h + 8 * lq);
    r.q1 = ld_u32_a2(b + 36 + 32 * h + 8 * lq);
    r.h0 = ld_u32_a2(b + 8 * lq);
    r.h1 = ld_u32_a2(b + 4 + 8 * lq);
    r.s0 = ld_u32_a2(b + 96);
    r.s1 = ld_u32_a2(b + 100);
    r.s2 = ld_u32_a2(b + 104);
    r.d = ld_u16(b + 108);
}

// Q3_K's sub-block `is` scale minus 32 from its 12 scale bytes (in three words).
DEV int q3k_scale(int is, u32 s0, u32 s1, u32 s2) {
    const u32 low = is < 8 ? byte_of(s0, s1, s2, is) & 15 : byte_of(s0, s1, s2, is - 8) >> 4;
    const u32 high = (byte_of(s0, s1, s2, 8 + (is & 3)) >> (2 * (is >> 2))) & 3;
    return (int)(low | (high << 4)) - 32;
}

// One lane's products for one super-block; xs: the super-block's first K-form block of the
// first column.
template <bool Q3, int NC>
DEV void q23_dot(const q23_w& r, const block_q8_1* xs, u64 xcol, int ncols, float* acc) {
    const int lane = tid_x() & 31, h = (lane >> 2) & 1, lq = lane & 3;
    u32 c0[4], c1[4];
    int sc[4], mn[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        c0[g] = (r.q0 >> (2 * g)) & 0x03030303u;
        c1[g] = (r.q1 >> (2 * g)) & 0x03030303u;
        const int is = 8 * h + 2 * g + (lq >> 1);
        if (Q3) {
            const int hb = 4 * h + g;
            c0[g] = sub_bytes(c0[g] | (((r.h0 >> hb) & 0x01010101u) << 2), 0x04040404u);
            c1[g] = sub_bytes(c1[g] | (((r.h1 >> hb) & 0x01010101u) << 2), 0x04040404u);
            sc[g] = q3k_scale(is, r.s0, r.s1, r.s2);
            mn[g] = 0;
        } else {
            const u32 sb = ((g < 2 ? r.s0 : r.s1) >> (8 * (2 * (g & 1) + (lq >> 1)))) & 0xff;
            sc[g] = (int)(sb & 15);
            mn[g] = (int)(sb >> 4);
        }
    }
    const float d = h2f((u16)(r.d & 0xffff)), dmin = Q3 ? 0.0f : h2f((u16)(r.d >> 16));
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col >= ncols) break;
        const block_q8_1* xb = (const block_q8_1*)((const u8*)xs + col * xcol);
        int isum = 0, msum = 0;
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int* a = q8qs(xb + 4 * h + g) + 2 * lq;
            const int a0 = a[0], a1 = a[1];
            isum += sc[g] * dot4((int)c0[g], a0, dot4((int)c1[g], a1, 0));
            if (!Q3) msum += mn[g] * dot4(0x01010101, a0, dot4(0x01010101, a1, 0));
        }
        const float dx = q8k_scale(xb);
        float v = (d * dx) * (float)isum;
        if (!Q3) v -= (dmin * dx) * (float)msum;
        acc_add<NC>(acc[col], v);
    }
}

template <bool Q3, int NC>
DEV void mv_q23(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    constexpr int BB = Q3 ? 110 : 84;
    const int lane = tid_x() & 31, h = (lane >> 2) & 1, lq = lane & 3;
    for (int sb0 = 0; sb0 < nsb; sb0 += 8) {
        q23_w r[2];
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb >= nsb) continue;
            if (Q3) q3k_load(wr + (u64)sb * BB, h, lq, r[it]);
            else q2k_load(wr + (u64)sb * BB, h, lq, r[it]);
        }
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) q23_dot<Q3, NC>(r[it], x + sb * 8, (u64)kb * 36, ncols, acc);
        }
    }
}

template <int NC>
DEV void mv_q2_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_q23<false, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_q3_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_q23<true, NC>(wr, x, kb, nsb, ncols, acc); }

// ---- IQ4_XS (136 B): 8 lanes per super-block (one 32-element sub-block each), 4 a step ----
//
// Lane j = lane % 8 of super-block sb0 + lane / 8: qs bytes 16j .. 16j + 15 (element i < 16
// the low nibble of byte i, i + 16 its high nibble) against K-form block 8 sb + j, scale
// ls_j − 32 = (scales_l[j / 2] >> 4(j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4, minus 32.
struct xs_w { u32 q[4], hd0, hd1; };

DEV void xs_load(const u8* b, int j, xs_w& r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) r.q[i] = ld_u32(b + 8 + 16 * j + 4 * i);
    r.hd0 = ld_u32(b);      // d | scales_h << 16
    r.hd1 = ld_u32(b + 4);  // scales_l[4]
}

template <int NC>
DEV void xs_dot(const xs_w& r, const block_q8_1* xb0, u64 xcol, int ncols, float* acc) {
    const int j = tid_x() & 7;
    const u32 sh = r.hd0 >> 16, sl = (r.hd1 >> (8 * (j >> 1))) & 0xff;
    const int ls = (int)(((sl >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
    const float d = h2f((u16)(r.hd0 & 0xffff));
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col >= ncols) break;
        const block_q8_1* xb = (const block_q8_1*)((const u8*)xb0 + col * xcol);
        const int* a = q8qs(xb);
        int s = nib_dot16<false>(r.q[0], r.q[1], a, 0);
        s = nib_dot16<false>(r.q[2], r.q[3], a + 2, s);
        // xb0 is block 8 sb + j; the super-block's scale sits in its first two blocks.
        const float dx = q8k_scale(xb - j);
        acc_add<NC>(acc[col], (d * dx) * (float)(ls * s));
    }
}

template <int NC>
DEV void mv_iq4_xs(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7;
    for (int sb0 = 0; sb0 < nsb; sb0 += 8) {
        xs_w r[2];
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) xs_load(wr + (u64)sb * 136, j, r[it]);
        }
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) xs_dot<NC>(r[it], x + sb * 8 + j, (u64)kb * 36, ncols, acc);
        }
    }
}

// ---- the grid types: 8 lanes per super-block (one 32-element sub-block each), 4 a step ----
//
// Lane j = lane % 8 of super-block sb0 + lane / 8 decodes sub-block j (dequant_low.h's
// grid_sub) against K-form block 8 sb + j. Products of a group word (4 + 4 unsigned grid
// bytes, < 64) with the activation codes by dot4, the signs as Σ g·q − 2·Σ_neg g·q; IQ1's
// grid is signed bytes, its ±1/8 shift Σ ±q. The CPU's final factor (IQ2: 1/8, IQ3_XXS: 1/4)
// is applied per lane (a power of two: the same value).

// 0xff in byte k where bit k (< 4) of `bits` is set.
DEV u32 mask4(u32 bits) { return (((bits & 15u) * 0x00204081u) & 0x01010101u) * 0xffu; }

template <int T, int NC>
DEV void mv_grid(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    constexpr int BB = grid_bb<T>::v;
    constexpr float FS = (T == 2 || T == 3 || T == 4) ? 0.125f : T == 1 ? 0.25f : 1.0f;
    const int lane = tid_x() & 31, j = lane & 7;
    for (int sb = (lane >> 3); sb < nsb; sb += 4) {
        const u8* b = wr + (u64)sb * BB;
        gsub s;
        grid_sub<T>(b, j, s);
        const float d = grid_d<T>(b);
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            const block_q8_1* xb = x + (u64)col * kb + sb * 8 + j;
            const int* a = q8qs(xb);
            int hs[2] = {0, 0}, hd[2] = {0, 0};
#pragma unroll
            for (int l = 0; l < 4; ++l) {
                const u32 lo = (u32)s.g[l], hi = (u32)(s.g[l] >> 32);
                const int a0 = a[2 * l], a1 = a[2 * l + 1];
                int p = dot4((int)lo, a0, dot4((int)hi, a1, 0));
                if (T >= 5) {
                    const int q = dot4(0x01010101, a0, dot4(0x01010101, a1, 0));
                    hd[l >> 1] += ((s.nd >> l) & 1) ? -q : q;
                } else {
                    const u32 sg = s.signs >> (8 * l);
                    p -= 2 * dot4((int)(lo & mask4(sg)), a0, dot4((int)(hi & mask4(sg >> 4)), a1, 0));
                }
                hs[l >> 1] += p;
            }
            const int v = s.ls[0] * hs[0] + s.ls[1] * hs[1];
            const float dd = d * q8k_scale(xb - j);
            float t;
            if (T >= 5) t = dd * ((float)v + 0.125f * (float)(s.ls[0] * hd[0] + s.ls[1] * hd[1]));
            else t = dd * (float)v * FS;
            acc_add<NC>(acc[col], t);
        }
    }
}

template <int NC>
DEV void mv_iq3_s(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<0, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq3_xxs(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<1, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq2_xxs(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<2, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq2_xs(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<3, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq2_s(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<4, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq1_s(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<5, NC>(wr, x, kb, nsb, ncols, acc); }
template <int NC>
DEV void mv_iq1_m(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) { mv_grid<6, NC>(wr, x, kb, nsb, ncols, acc); }
