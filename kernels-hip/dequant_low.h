// One element e of a row of the low-bit and non-linear weight types (Q2_K, Q3_K, IQ4_NL,
// IQ4_XS, MXFP4), with the CPU's float operations in the CPU's order (`quant::dequantize`,
// no fused multiply-add), so the value is bit-exact with it. For dequant.hip's f16 slabs
// and elementwise.hip's embedding rows. Include after common.h.
//
// Also the grid types (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M): their
// 32-element sub-block decoder `grid_sub` (quant/grid.rs's `sub`), which mv_dot_low.h's
// matvecs share, and their element dequantization.
#include "iq_grids.h"

// The signed byte `q` (0..15) of a 16-entry table held as 4 little-endian words.
DEV int tab16(u32 q, u32 t0, u32 t1, u32 t2, u32 t3) {
    const u32 w = q < 8 ? (q < 4 ? t0 : t1) : (q < 12 ? t2 : t3);
    return (int)(i8)(u8)(w >> (8 * (q & 3)));
}
// kvalues_iq4nl and kvalues_mxfp4 (the E2M1 values doubled), as mv_dot_low.h holds them.
DEV int iq4_value(u32 q) { return tab16(q, 0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u); }
DEV int mxfp4_value(u32 q) { return tab16(q, 0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu); }

// The 4-bit index of element i (< 32) of a 16-byte nibble block: low nibbles first.
DEV u32 nib32(const u8* qs, int i) { return i < 16 ? qs[i] & 15 : qs[i - 16] >> 4; }

// Element i (< 256) of a 64-byte 2-bit code array (element 128h + 32g + l: bits 2g of
// byte 32h + l).
DEV u32 code2(const u8* qs, int i) { return (qs[32 * (i >> 7) + (i & 31)] >> (2 * ((i >> 5) & 3))) & 3; }

DEV float dqe_q2_K(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 8) * 84;
    const int i = e & 255;
    const u32 sc = b[i >> 4];
    const float d = h2f(ld_u16(b + 80)), dmin = h2f(ld_u16(b + 82));
    return sub_rn(mul_rn(mul_rn(d, (float)(sc & 15)), (float)code2(b + 16, i)), mul_rn(dmin, (float)(sc >> 4)));
}

DEV float dqe_q3_K(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 8) * 110;
    const int i = e & 255, j = i >> 4;
    const u8* s = b + 96;
    const u32 low = j < 8 ? s[j] & 15 : s[j - 8] >> 4;
    const u32 high = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    const int sc = (int)(low | (high << 4)) - 32;
    const int q = (int)code2(b + 32, i) - (((b[i & 31] >> (i >> 5)) & 1) ? 0 : 4);
    return mul_rn(mul_rn(h2f(ld_u16(b + 108)), (float)sc), (float)q);
}

DEV float dqe_iq4_nl(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 5) * 18;
    return mul_rn(h2f(ld_u16(b)), (float)iq4_value(nib32(b + 2, e & 31)));
}

DEV float dqe_iq4_xs(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 8) * 136;
    const int i = e & 255, j = i >> 5;
    const u32 sh = ld_u16(b + 2);
    const int ls = (int)(((b[4 + (j >> 1)] >> (4 * (j & 1))) & 15) | (((sh >> (2 * j)) & 3) << 4)) - 32;
    return mul_rn(mul_rn(h2f(ld_u16(b)), (float)ls), (float)iq4_value(nib32(b + 8 + 16 * j, i & 31)));
}

DEV float dqe_mxfp4(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 5) * 17;
    const u32 x = b[0];
    const float d = __builtin_bit_cast(float, x < 2 ? 0x00200000u << x : (x - 1) << 23);
    return mul_rn((float)mxfp4_value(nib32(b + 1, e & 31)), d);
}

// ---- the grid types ----
//
// Type codes (template T): 0 IQ3_S (110 B), 1 IQ3_XXS (98), 2 IQ2_XXS (66), 3 IQ2_XS (74),
// 4 IQ2_S (82), 5 IQ1_S (50), 6 IQ1_M (56). A 32-element sub-block's element 8l + j is
// byte j of the group word g[l] (the grid entry), negative where bit 8l + j of `signs` is
// set (IQ1: a signed grid, shifted by -1/8 where bit l of `nd` is set, else +1/8); elements
// 16h .. 16h + 15 have the integer scale ls[h] (2s + 1 of the stored s).
struct gsub { u64 g[4]; u32 signs, nd; int ls[2]; };

template <int T> struct grid_bb { static constexpr int v = T == 0 ? 110 : T == 1 ? 98 : T == 2 ? 66 : T == 3 ? 74 : T == 4 ? 82 : T == 5 ? 50 : 56; };

// The 4 sign bytes of IQ3_XXS / IQ2_XXS: 7-bit indices into iq_ksigns at bits 7l.
DEV u32 ksigns4(u32 aux) {
    return (u32)iq_ksigns[aux & 127] | ((u32)iq_ksigns[(aux >> 7) & 127] << 8) | ((u32)iq_ksigns[(aux >> 14) & 127] << 16) |
           ((u32)iq_ksigns[(aux >> 21) & 127] << 24);
}

// The super-block scale d (IQ1_M's f16 is spread over the top nibbles of its 4 scale words).
template <int T>
DEV float grid_d(const u8* b) {
    if (T != 6) return h2f(ld_u16(b));
    const u32 s0 = ld_u16(b + 48), s1 = ld_u16(b + 50), s2 = ld_u16(b + 52), s3 = ld_u16(b + 54);
    return h2f((u16)((s0 >> 12) | ((s1 >> 8) & 0x00f0u) | ((s2 >> 4) & 0x0f00u) | (s3 & 0xf000u)));
}

// Sub-block ib (< 8) of block b (quant/grid.rs's `sub`).
template <int T>
DEV void grid_sub(const u8* b, int ib, gsub& s) {
    s.signs = 0;
    s.nd = 0;
    if (T == 0) {
        const u8* qs = b + 2 + 8 * ib;
        const u32 qh = b[66 + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 i0 = qs[2 * l] | (((qh >> (2 * l)) & 1) << 8), i1 = qs[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8);
            s.g[l] = (u64)iq3s_grid[i0] | ((u64)iq3s_grid[i1] << 32);
        }
        s.signs = ld_u32_a2(b + 74 + 4 * ib);
        s.ls[0] = s.ls[1] = 2 * (int)((b[106 + ib / 2] >> (4 * (ib & 1))) & 15) + 1;
    } else if (T == 1) {
        const u8* qs = b + 2 + 8 * ib;
#pragma unroll
        for (int l = 0; l < 4; ++l) s.g[l] = (u64)iq3xxs_grid[qs[2 * l]] | ((u64)iq3xxs_grid[qs[2 * l + 1]] << 32);
        const u32 aux = ld_u32_a2(b + 66 + 4 * ib);
        s.signs = ksigns4(aux);
        s.ls[0] = s.ls[1] = 2 * (int)(aux >> 28) + 1;
    } else if (T == 2) {
        const u32 a0 = ld_u32_a2(b + 2 + 8 * ib), a1 = ld_u32_a2(b + 6 + 8 * ib);
#pragma unroll
        for (int l = 0; l < 4; ++l) s.g[l] = iq2xxs_grid[(a0 >> (8 * l)) & 255];
        s.signs = ksigns4(a1);
        s.ls[0] = s.ls[1] = 2 * (int)(a1 >> 28) + 1;
    } else if (T == 3) {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 q = ld_u16(b + 2 + 2 * (4 * ib + l));
            s.g[l] = iq2xs_grid[q & 511];
            s.signs |= (u32)iq_ksigns[q >> 9] << (8 * l);
        }
        const int sc = b[66 + ib];
        s.ls[0] = 2 * (sc & 15) + 1;
        s.ls[1] = 2 * (sc >> 4) + 1;
    } else if (T == 4) {
        const u32 qh = b[66 + ib];
#pragma unroll
        for (int l = 0; l < 4; ++l) s.g[l] = iq2s_grid[b[2 + 4 * ib + l] | (((qh >> (2 * l)) & 3) << 8)];
        s.signs = ld_u32_a2(b + 34 + 4 * ib);
        const int sc = b[74 + ib];
        s.ls[0] = 2 * (sc & 15) + 1;
        s.ls[1] = 2 * (sc >> 4) + 1;
    } else if (T == 5) {
        const u32 qh = ld_u16(b + 34 + 2 * ib);
#pragma unroll
        for (int l = 0; l < 4; ++l) s.g[l] = iq1s_grid[b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)];
        s.ls[0] = s.ls[1] = 2 * (int)((qh >> 12) & 7) + 1;
        s.nd = (qh & 0x8000u) ? 15u : 0u;
    } else {
#pragma unroll
        for (int l = 0; l < 4; ++l) {
            const u32 h = (u32)b[32 + 2 * ib + l / 2] >> (4 * (l & 1));
            s.g[l] = iq1s_grid[b[4 * ib + l] | ((h & 7) << 8)];
            s.nd |= ((h >> 3) & 1) << l;
        }
        const u32 sc = (u32)ld_u16(b + 48 + 2 * (ib / 2)) >> (6 * (ib & 1));
        s.ls[0] = 2 * (int)(sc & 7) + 1;
        s.ls[1] = 2 * (int)((sc >> 3) & 7) + 1;
    }
}

// Element i (< 32) of a decoded sub-block, in gguf-py's float steps: IQ3_S d·ls·g; IQ3_XXS
// d·(1/2 + s)·1/2·g; IQ2_* d·(1/2 + s)·1/4·g (then the sign); IQ1 d·ls·(g ± 1/8).
template <int T>
DEV float grid_value(const gsub& s, float d, int i) {
    const int l = i >> 3, h = i >> 4;
    const u32 gb = (u32)(s.g[l] >> (8 * (i & 7))) & 0xffu;
    if (T >= 5) return mul_rn(mul_rn(d, (float)s.ls[h]), add_rn((float)(int)(i8)(u8)gb, ((s.nd >> l) & 1) ? -0.125f : 0.125f));
    float dl;
    if (T == 0) dl = mul_rn(d, (float)s.ls[h]);
    else dl = mul_rn(mul_rn(d, add_rn(0.5f, (float)((s.ls[h] - 1) >> 1))), T == 1 ? 0.5f : 0.25f);
    const float v = mul_rn(dl, (float)gb);
    return ((s.signs >> i) & 1) ? -v : v;
}

template <int T>
DEV float dqe_grid(const u8* row, int e) {
    const u8* b = row + (u64)(e >> 8) * grid_bb<T>::v;
    const int i = e & 255;
    gsub s;
    grid_sub<T>(b, i >> 5, s);
    return grid_value<T>(s, grid_d<T>(b), i & 31);
}
