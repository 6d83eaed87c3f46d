// One element e of a row of the low-bit and non-linear weight types (Q2_K, Q3_K, IQ4_NL,
// IQ4_XS, MXFP4), with the CPU's float operations in the CPU's order (`quant::dequantize`,
// no fused multiply-add), so the value is bit-exact with it. For dequant.hip's f16 slabs
// and elementwise.hip's embedding rows. Include after common.h.

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
