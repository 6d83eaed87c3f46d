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

// One lane's products for one block (xb: its activation block of the first column).
template <bool MX, int NC>
DEV void nl_dot(const nl_w<MX>& r, const block_q8_1* xb0, u64 xcol, int ncols, float* acc) {
    const int hh = tid_x() & 1;
    const float d = MX ? e8m0_half(r.d) : h2f((u16)r.d);
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col >= ncols) break;
        const block_q8_1* xb = (const block_q8_1*)((const u8*)xb0 + col * xcol);
        const int s = nib_dot16<MX>(r.q0, r.q1, q8qs(xb) + 2 * hh, 0);
        acc_add<NC>(acc[col], (MX ? h2f(xb->d) * d : d * h2f(xb->d)) * (float)s);
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
            if (blk < kb) nl_dot<MX, NC>(r[it], x + blk, (u64)kb * 36, ncols, acc);
        }
    }
}

// ---- Q2_K (84 B): 8 lanes per 256-element super-block, 4 a step; Q3_K (110 B): 4 lanes ----
//
// Lane = (super-block sb0 + lane / 8, half h = (lane / 4) % 2, quarter lq = lane % 4):
// qs bytes 32h + 8lq .. + 7 hold at bit pair 2g (g < 4) the codes of elements
// 128h + 32g + 8lq .. + 7, of sub-block 8h + 2g + lq / 2, against the K-form codes
// 8lq .. of block 4h + g. Q2_K: y = d·(sc & 15)·q − dmin·(sc >> 4), so the lane also sums
// its activation codes for the min term; Q3_K: y = d·(sc − 32)·(q − 4·!hbit), the high bit
// of element 128h + 32g + l at bit 4h + g of hmask[l].

struct q23_w { u32 q0, q1, s0, s1, d; };

DEV void q2k_load(const u8* b, int h, int lq, q23_w& r) {
    r.q0 = ld_u32(b + 16 + 32 * h + 8 * lq);
    r.q1 = ld_u32(b + 20 + 32 * h + 8 * lq);
    r.s0 = ld_u32(b + 8 * h);  // scale bytes 8h .. 8h + 7
    r.s1 = ld_u32(b + 8 * h + 4);
    r.d = ld_u32(b + 80);      // d | dmin << 16
}

// One lane's Q2_K products for one super-block; xs: the super-block's first K-form block
// of the first column.
template <int NC>
DEV void q2k_dot(const q23_w& r, const block_q8_1* xs, u64 xcol, int ncols, float* acc) {
    const int lane = tid_x() & 31, h = (lane >> 2) & 1, lq = lane & 3;
    u32 c0[4], c1[4];
    int sc[4], mn[4];
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        c0[g] = (r.q0 >> (2 * g)) & 0x03030303u;
        c1[g] = (r.q1 >> (2 * g)) & 0x03030303u;
        const u32 sb = ((g < 2 ? r.s0 : r.s1) >> (8 * (2 * (g & 1) + (lq >> 1)))) & 0xff;
        sc[g] = (int)(sb & 15);
        mn[g] = (int)(sb >> 4);
    }
    const float d = h2f((u16)(r.d & 0xffff)), dmin = h2f((u16)(r.d >> 16));
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
            msum += mn[g] * dot4(0x01010101, a0, dot4(0x01010101, a1, 0));
        }
        const float dx = q8k_scale(xb);
        float v = (d * dx) * (float)isum;
        v -= (dmin * dx) * (float)msum;
        acc_add<NC>(acc[col], v);
    }
}

template <int NC>
DEV void mv_q2_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, h = (lane >> 2) & 1, lq = lane & 3;
    for (int sb0 = 0; sb0 < nsb; sb0 += 8) {
        q23_w r[2];
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) q2k_load(wr + (u64)sb * 84, h, lq, r[it]);
        }
#pragma unroll
        for (int it = 0; it < 2; ++it) {
            const int sb = sb0 + (lane >> 3) + 4 * it;
            if (sb < nsb) q2k_dot<NC>(r[it], x + sb * 8, (u64)kb * 36, ncols, acc);
        }
    }
}

// Q3_K: 4 lanes per super-block, 8 super-blocks a slot. Lane lq = lane % 4 of super-block
// sb0 + lane / 4 takes elements l = 8lq .. 8lq + 7 of all eight 32-element groups
// j = 4h + g (qs bytes 32h + 8lq .., bit pair 2g; hmask bytes 8lq .., bit j; sub-block
// 8h + 2g + lq / 2) against K-form codes 8lq .. of block j. A super-block starts 2-byte
// aligned only: the lane reads aligned words from the word at or below it (odd: it starts
// 2 mod 4) and funnel-shifts them by 0 or 16 bits in the products (not at the load, so a
// step's loads stay in flight): 3 words for each half's qs bytes, 3 of its hmask bytes,
// 3 (even) or 4 (odd) of the 12 scale bytes, d by itself (an even super-block's fourth
// scale word would pass its end). Every word lies inside the super-block or the one
// before it.
struct q3k_w { u32 q[2][3], h[3], s[4], d; int odd; };

DEV void q3k_load(const u8* b, int lq, q3k_w& r) {
    r.odd = (int)(((u64)b >> 1) & 1);
    const u32* w = (const u32*)(b - 2 * r.odd);
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        r.q[0][i] = w[8 + 2 * lq + i];   // qs[8lq ..]
        r.q[1][i] = w[16 + 2 * lq + i];  // qs[32 + 8lq ..]
        r.h[i] = w[2 * lq + i];          // hmask[8lq ..]
    }
    r.s[0] = w[24];
    r.s[1] = w[25];
    r.s[2] = w[26];
    r.s[3] = w[26 + r.odd];
    r.d = ld_u16(b + 108);
}

// 0xff in each byte whose bit 7 is set, else 0.
DEV u32 smear7(u32 x) {
#ifdef LODE_NV
    return perm_bytes(x, 0, 0xBA98u);  // prmt sign-replicate of bytes 0-3
#else
    return ((x >> 7) & 0x01010101u) * 0xffu;
#endif
}

// The signed Q3_K byte of each byte's 2-bit field f (bits 0-1) and smeared high bit m:
// f where m is set, f | 0xFC (f - 4) where it is clear. One LOP3 on NVIDIA (the
// compiler's own form of the expression took three).
DEV u32 q3k_code(u32 f, u32 m) {
#ifdef LODE_NV
    u32 r;
    asm("lop3.b32 %0, %1, %2, 0x03030303, 0xB1;" : "=r"(r) : "r"(f), "r"(m));  // (a & c) | (~b & ~c)
    return r;
#else
    return (f & 0x03030303u) | (~m & 0xFCFCFCFCu);
#endif
}

// c + a.lo16 * b.byte0 + a.hi16 * b.byte1 (lo) or b.byte2 / b.byte3 (hi); a and b signed.
DEV int dot2s_lo(u32 a, u32 b, int c) {
#ifdef LODE_NV
    int r;
    asm("dp2a.lo.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return c + (int)(short)(a & 0xffff) * (int)(signed char)(b & 0xff) + ((int)a >> 16) * (int)(signed char)((b >> 8) & 0xff);
#endif
}
DEV int dot2s_hi(u32 a, u32 b, int c) {
#ifdef LODE_NV
    int r;
    asm("dp2a.hi.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return c + (int)(short)(a & 0xffff) * (int)(signed char)((b >> 16) & 0xff) + ((int)a >> 16) * (int)(signed char)(b >> 24);
#endif
}

// One lane's Q3_K products for one super-block (xs: its first K-form block of the first
// column). Per 4 weights: the 2-bit field shifted down (none for g = 0), the hmask word
// shifted so the group's bit is each byte's bit 7 (none for j = 7), one byte permutation
// smearing it over the byte, one LOP3 making the signed byte q − 4·!hbit (= field | 0xFC
// where the bit is clear), one dp4a. The 8 group sums (each an i16) meet the scales
// 4·(sc − 32) as signed bytes in four dp2a; the scales of both halves come from two byte
// permutations (sub-block 8h + 2g + lq / 2: low nibble h of byte 2g + lq / 2, high pair
// 2h + g / 2 of byte 8 + 2(g & 1) + lq / 2). The integer sum is the CPU's exactly (times
// 4, folded into d as 0.25·d).
template <int NC>
DEV void q3k_dot(const q3k_w& r, const block_q8_1* xs, u64 xcol, int ncols, float* acc) {
    const int lq = tid_x() & 3;
    const u32 sh = 16 * r.odd;
    const u32 h0 = shr_pair(r.h[0], r.h[1], sh), h1 = shr_pair(r.h[1], r.h[2], sh);
    const u32 s0 = shr_pair(r.s[0], r.s[1], sh), s1 = shr_pair(r.s[1], r.s[2], sh), s2 = shr_pair(r.s[2], r.s[3], sh);
    const u32 sel = 0x6420u + 0x1111u * (u32)(lq >> 1);
    const u32 lo = perm_bytes(s0, s1, sel);           // byte g: low nibbles of sub-blocks 2g + lq/2 and 8 + 2g + lq/2
    const u32 hi = perm_bytes(s2, s2 >> 2, sel);      // byte g: their high pairs at bits 0-1 and 4-5
    const u32 sc4[2] = {q6k_code4(lo << 2, hi << 6), q6k_code4(lo >> 2, hi << 2)};  // byte g: 4 (sc - 32), signed
    u32 v[8][2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const u32 q0 = shr_pair(r.q[hh][0], r.q[hh][1], sh), q1 = shr_pair(r.q[hh][1], r.q[hh][2], sh);
#pragma unroll
        for (int g = 0; g < 4; ++g) {
            const int j = 4 * hh + g;
            v[j][0] = q3k_code(q0 >> (2 * g), smear7(h0 << (7 - j)));
            v[j][1] = q3k_code(q1 >> (2 * g), smear7(h1 << (7 - j)));
        }
    }
    const float d4 = 0.25f * h2f((u16)r.d);
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col >= ncols) break;
        const block_q8_1* xb = (const block_q8_1*)((const u8*)xs + col * xcol);
        int s[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int* a = q8qs(xb + j) + 2 * lq;
            s[j] = dot4((int)v[j][0], a[0], dot4((int)v[j][1], a[1], 0));
        }
        int isum = dot2s_lo(perm_bytes((u32)s[0], (u32)s[1], 0x5410u), sc4[0], 0);
        isum = dot2s_hi(perm_bytes((u32)s[2], (u32)s[3], 0x5410u), sc4[0], isum);
        isum = dot2s_lo(perm_bytes((u32)s[4], (u32)s[5], 0x5410u), sc4[1], isum);
        isum = dot2s_hi(perm_bytes((u32)s[6], (u32)s[7], 0x5410u), sc4[1], isum);
        const float dx = q8k_scale(xb);
        acc_add<NC>(acc[col], (d4 * dx) * (float)isum);
    }
}

// Slots of 8 super-blocks, two loaded before their products (one with several columns,
// whose products need more registers); a lane's super-blocks in the same order either way.
template <int NC>
DEV void mv_q3_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    constexpr int NS = NC == 1 ? 2 : 1;
    const int lane = tid_x() & 31;
    for (int sb0 = 0; sb0 < nsb; sb0 += 8 * NS) {
        q3k_w r[NS];
#pragma unroll
        for (int it = 0; it < NS; ++it) {
            const int sb = sb0 + (lane >> 2) + 8 * it;
            if (sb < nsb) q3k_load(wr + (u64)sb * 110, lane & 3, r[it]);
        }
#pragma unroll
        for (int it = 0; it < NS; ++it) {
            const int sb = sb0 + (lane >> 2) + 8 * it;
            if (sb < nsb) q3k_dot<NC>(r[it], x + sb * 8, (u64)kb * 36, ncols, acc);
        }
    }
}

// ---- IQ4_XS (136 B): 4 lanes per super-block (two 32-element sub-blocks each), 8 a step ----
//
// Lane lq = lane % 4 of super-block sb0 + lane / 4: sub-blocks j = 2lq, 2lq + 1, qs bytes
// 32lq .. 32lq + 31 (sub-block j's element i < 16 the low nibble of its byte i, i + 16 the
// high nibble) against K-form blocks 8 sb + 2lq, + 1, scale ls_j − 32 = (scales_l[j / 2]
// >> 4(j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4, minus 32. A super-block is 8-byte
// aligned: 5 loads of 8 bytes a lane. The two sub-block sums meet their scales in
// integers, one float product per super-block (the per-super-block work, 8 lanes of one
// sub-block each before, is paid once per 64 weights).
struct xs_w { u32 q[8], hd0, hd1; };

DEV void xs_load(const u8* b, int lq, xs_w& r) {
    const u32x2* p = (const u32x2*)(b + 8 + 32 * lq);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32x2 v = p[i];
        r.q[2 * i] = v.x, r.q[2 * i + 1] = v.y;
    }
    const u32x2 h = *(const u32x2*)b;
    r.hd0 = h.x;  // d | scales_h << 16
    r.hd1 = h.y;  // scales_l[4]
}

// xb0: block 8 sb + 2lq of the first column.
template <int NC>
DEV void xs_dot(const xs_w& r, const block_q8_1* xb0, u64 xcol, int ncols, float* acc) {
    const int lq = tid_x() & 3;
    const u32 sh = r.hd0 >> (16 + 4 * lq), sl = r.hd1 >> (8 * lq);
    const int ls0 = (int)((sl & 15) | ((sh & 3) << 4)) - 32;
    const int ls1 = (int)(((sl >> 4) & 15) | ((sh & 12) << 2)) - 32;
    const float d = h2f((u16)(r.hd0 & 0xffff));
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (col >= ncols) break;
        const block_q8_1* xb = (const block_q8_1*)((const u8*)xb0 + col * xcol);
        const int* a0 = q8qs(xb);
        const int* a1 = q8qs(xb + 1);
        int s0 = nib_dot16<false>(r.q[0], r.q[1], a0, 0);
        s0 = nib_dot16<false>(r.q[2], r.q[3], a0 + 2, s0);
        int s1 = nib_dot16<false>(r.q[4], r.q[5], a1, 0);
        s1 = nib_dot16<false>(r.q[6], r.q[7], a1 + 2, s1);
        // The super-block's scale sits in its first two blocks.
        const float dx = q8k_scale(xb - 2 * lq);
        acc_add<NC>(acc[col], (d * dx) * (float)(ls0 * s0 + ls1 * s1));
    }
}

// Slots of 8 super-blocks, two loaded before their products with one column (one with
// several); a lane's super-blocks in the same order either way.
template <int NC>
DEV void mv_iq4_xs(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    constexpr int NS = NC == 1 ? 2 : 1;
    const int lane = tid_x() & 31, lq = lane & 3;
    for (int sb0 = 0; sb0 < nsb; sb0 += 8 * NS) {
        xs_w r[NS];
#pragma unroll
        for (int it = 0; it < NS; ++it) {
            const int sb = sb0 + (lane >> 2) + 8 * it;
            if (sb < nsb) xs_load(wr + (u64)sb * 136, lq, r[it]);
        }
#pragma unroll
        for (int it = 0; it < NS; ++it) {
            const int sb = sb0 + (lane >> 2) + 8 * it;
            if (sb < nsb) xs_dot<NC>(r[it], x + sb * 8 + 2 * lq, (u64)kb * 36, ncols, acc);
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
