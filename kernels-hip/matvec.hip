// Decode matvec: y[c][r] = sum_k W[r][k] * x[c][k] for up to NC activation columns.
//
// Weights are read in the GGUF stored block layout (§2 of the reference). Quantized
// weights meet int8 activations quantized as the CPU backend quantizes them (quantize.hip):
// the 32-element types the q8_1 form (Q4_1 / Q5_1 apply their min with the block's
// s = d·Σq, as the CPU does; Q4_0 / Q5_0 subtract their offset from the codes, exact in
// integers, as the CPU does), the K-quants the K form (one f32 scale per super-block,
// integer code sums for the min term); float weights meet f32 activations.
//
// One warp per output row, 4 rows per 128-thread block; grid (ceil(rows / 4)).
// NC = 1 is the decode kernel; NC = 8 serves prefill chunks (columns past `ncols` unused).
// Arguments (every matvec_* kernel): W, x (block_q8_1* or float*), y [ncols, rows] f32,
// rows, k, ncols.
#include "common.h"

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

// ---- K-quant helpers: integer dot products that keep per-weight instructions low ----

struct __attribute__((aligned(8))) u32x2 { u32 x, y; };

// dot4 with unsigned bytes in a (0..255) and signed bytes in b: lets a Q4_K high nibble
// be used in place as (byte & 0xf0) = 16 * nibble, without a shift per word.
#ifdef LODE_NV
DEV int dot4_us(u32 a, int b, int c) {
    int r;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// c + a.lo16 * b.byte0 + a.hi16 * b.byte1 (lo) or b.byte2 / b.byte3 (hi); a signed, b unsigned.
DEV int dot2_lo(u32 a, u32 b, int c) {
    int r;
    asm("dp2a.lo.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
DEV int dot2_hi(u32 a, u32 b, int c) {
    int r;
    asm("dp2a.hi.s32.u32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// PTX prmt (not __byte_perm, which drops the sign-replicate bit of each selector nibble).
DEV u32 perm_bytes(u32 lo, u32 hi, u32 sel) {
    u32 r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(lo), "r"(hi), "r"(sel));
    return r;
}
DEV u32 shr_pair(u32 lo, u32 hi, u32 sh) { return __funnelshift_r(lo, hi, sh); }
DEV u32 shfl_idx_u(u32 v, int src) { return __shfl_sync(0xffffffffu, v, src, 32); }
#else
DEV int dot4_us(u32 a, int b, int c) { return __builtin_amdgcn_sudot4(false, (int)a, true, b, c, false); }
DEV int dot2_lo(u32 a, u32 b, int c) { return c + (int)(short)(a & 0xffff) * (int)(b & 0xff) + ((int)a >> 16) * (int)((b >> 8) & 0xff); }
DEV int dot2_hi(u32 a, u32 b, int c) { return c + (int)(short)(a & 0xffff) * (int)((b >> 16) & 0xff) + ((int)a >> 16) * (int)(b >> 24); }
// Bytes of (hi:lo) picked by the low 3 bits of each selector nibble (bit 3: replicate the
// picked byte's sign), as CUDA's __byte_perm / AMD's v_perm_b32 with swapped operands.
DEV u32 perm_bytes(u32 lo, u32 hi, u32 sel) {
    const u64 v = ((u64)hi << 32) | lo;
    u32 r = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u32 n = (sel >> (4 * i)) & 15;
        u32 b = (u32)(v >> (8 * (n & 7))) & 0xff;
        if (n & 8) b = (b & 0x80) ? 0xff : 0;
        r |= b << (8 * i);
    }
    return r;
}
DEV u32 shr_pair(u32 lo, u32 hi, u32 sh) { return (u32)((((u64)hi << 32) | lo) >> (sh & 31)); }
DEV u32 shfl_idx_u(u32 v, int src) { return (u32)__builtin_amdgcn_ds_bpermute(src << 2, (int)v); }
#endif

// The K-form activation of one lane for 4 consecutive 32-element blocks n .. n + 3 (n % 4
// == 0, so block n starts 16-byte aligned): codes 16h .. 16h + 15 of each block as 4 words
// (c[j][i]: block n + j, codes 16h + 4i ..), read with 7 aligned loads instead of 16
// (block_q8_1 is 36 bytes, so its codes are only 4-byte aligned). hdr: the (d, s) words
// the same loads bring along, valid in some lanes only: hdr[0] = block n (h = 0),
// hdr[1] = block n + 1 (h = 0), hdr[2] = block n + 2 (h = 0), hdr[3] = block n + 3 (h = 1).
// The activation buffer must be 16-byte aligned (device allocations and shared arrays
// declared aligned(16) are).
struct kact { int c[4][4]; u32 hdr[4]; };
DEV void k_act_load(const block_q8_1* blk, int h, kact& a) {
    const u8* p = (const u8*)blk + 16 * h;
    const u32x4 e1 = *(const u32x4*)p;          // block n:     bytes 16h .. (hdr | codes 16h - 4 ..)
    const u32 e2 = *(const u32*)(p + 16);       // block n:     codes 16h + 12 ..
    const u32x4 e3 = *(const u32x4*)(p + 32);   // block n + 1: (codes, hdr | codes 16h + 8 ..), codes 16h ..
    const u32x2 e4 = *(const u32x2*)(p + 48);   // block n + 1: codes 16h + 8 ..
    const u32x2 o1 = *(const u32x2*)(p + 72);   // block n + 2: hdr | codes 16h - 4 .., codes 16h ..
    const u32x4 o2 = *(const u32x4*)(p + 80);   // block n + 2: codes 16h + 4 .. 16h + 15, then hdr n + 3 (h = 1)
    const u32x4 o3 = *(const u32x4*)(p + 112);  // block n + 3: codes 16h ..
    a.c[0][0] = (int)e1.y, a.c[0][1] = (int)e1.z, a.c[0][2] = (int)e1.w, a.c[0][3] = (int)e2;
    a.c[1][0] = (int)e3.z, a.c[1][1] = (int)e3.w, a.c[1][2] = (int)e4.x, a.c[1][3] = (int)e4.y;
    a.c[2][0] = (int)o1.y, a.c[2][1] = (int)o2.x, a.c[2][2] = (int)o2.y, a.c[2][3] = (int)o2.z;
    a.c[3][0] = (int)o3.x, a.c[3][1] = (int)o3.y, a.c[3][2] = (int)o3.z, a.c[3][3] = (int)o3.w;
    a.hdr[0] = e1.x, a.hdr[1] = e3.y, a.hdr[2] = o1.x, a.hdr[3] = o2.w;
}

// The super-block's f32 activation scale (the d halves of its first two blocks), which
// lane (lane & ~3) holds in hdr[0] / hdr[1] (h = 0, first block group): broadcast to the
// 4 lanes of the super-block. Every lane of the warp must call it.
DEV float k_act_scale(const kact& a) {
    const int lane = tid_x() & 31;
    return __builtin_bit_cast(float, shfl_idx_u(perm_bytes(a.hdr[0], a.hdr[1], 0x5410), lane & ~3));
}

// ---- Q4_K: 4 lanes per 256-element super-block, 8 super-blocks per slot ----
//
// Lane = (super-block sb0 + 8 * slot + lane / 4, chunk pair p = (lane / 2) % 2, half
// h = lane % 2): bytes 16h .. 16h + 15 of quant chunks 2p and 2p + 1 (each 32 bytes:
// sub-block 2c in the low nibbles, 2c + 1 in the high ones), i.e. 64 weights of
// sub-blocks 4p .. 4p + 3 against activation blocks 8 sb + 4p .. + 3. Sums stay integers
// until the super-block's end: each 16-weight half sub-block sum fits an i16, so two of
// them meet their 6-bit scales in one dot2, and the min term is the block sums (s fields)
// times the 6-bit mins by dot2 as well.
template <int NS> struct q4k_w { u32x4 hd[NS], q0[NS], q1[NS]; };

// One lane's weight loads of super-block b (chunk pair p, half h).
DEV void q4k_load_sb(const u8* b, int p, int h, u32x4& hd, u32x4& q0, u32x4& q1) {
    hd = *(const u32x4*)b;
    q0 = *(const u32x4*)(b + 16 + 64 * p + 16 * h);
    q1 = *(const u32x4*)(b + 48 + 64 * p + 16 * h);
}

// The 6-bit scales (sc) and mins (mn) of sub-blocks 4p .. 4p + 3 as bytes, from the 12
// scale bytes in y, z, w (ggml's get_scale_min_k4 for four sub-blocks at once).
DEV void q4k_scales(u32 y, u32 z, u32 w, int p, u32* sc, u32* mn) {
    const int sh = 2 * p;
    *sc = ((p ? w : y) & 0x0F0F0F0Fu) | ((y >> sh) & 0x30303030u);
    *mn = ((p ? (w >> 4) : z) & 0x0F0F0F0Fu) | ((z >> sh) & 0x30303030u);
}

// One lane's products for one super-block: xa = its activation blocks (8 sb + 4p, first
// column), xcol = bytes between columns; ok = false: an idle lane (xa any readable
// K-form address; it still joins the broadcast).
template <int NC>
DEV void q4k_dot_sb(const u32x4& hd, const u32x4& q0, const u32x4& q1, const block_q8_1* xa, u64 xcol, bool ok, int ncols, float* acc) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1;
    u32 sc, mn;
    q4k_scales(hd.y, hd.z, hd.w, p, &sc, &mn);
    // Min terms: lane h = 0 holds the s of blocks 4p .. 4p + 2, lane h = 1 of 4p + 3.
    mn &= h ? 0xff000000u : 0x00ffffffu;
    const float d = h2f((u16)(hd.x & 0xffff)), dmin = h2f((u16)(hd.x >> 16));
    const u32 w0[4] = {q0.x, q0.y, q0.z, q0.w};
    const u32 w1[4] = {q1.x, q1.y, q1.z, q1.w};
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (NC > 1 && col >= ncols) break;  // n1: no branch, so the activation loads can go first
        kact a;
        k_act_load((const block_q8_1*)((const u8*)xa + col * xcol), h, a);
        int s0 = 0, s1 = 0, t0 = 0, t1 = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s0 = dot4((int)(w0[i] & 0x0F0F0F0Fu), a.c[0][i], s0);
            s1 = dot4_us(w0[i] & 0xF0F0F0F0u, a.c[1][i], s1);
            t0 = dot4((int)(w1[i] & 0x0F0F0F0Fu), a.c[2][i], t0);
            t1 = dot4_us(w1[i] & 0xF0F0F0F0u, a.c[3][i], t1);
        }
        // s1, t1 are 16x the high-nibble sums; every half sub-block sum fits an i16.
        int isum = dot2_lo(perm_bytes((u32)s0, (u32)(s1 >> 4), 0x5410), sc, 0);
        isum = dot2_hi(perm_bytes((u32)t0, (u32)(t1 >> 4), 0x5410), sc, isum);
        int imin = dot2_lo(perm_bytes(a.hdr[0], a.hdr[1], 0x7632), mn, 0);
        imin = dot2_hi(perm_bytes(a.hdr[2], a.hdr[3], 0x7632), mn, imin);
        const float dx = k_act_scale(a);
        if (ok) acc[col] += dx * (d * (float)isum - dmin * (float)imin);
    }
}

// NS slots from super-block sb0 (slot it: super-blocks sb0 + 8 it .. + 7).
template <int NS>
DEV void q4k_wload(const u8* wr, int nsb, int sb0, q4k_w<NS>& r) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 2) + 8 * it;
        if (sb < nsb) q4k_load_sb(wr + (u64)sb * 144, p, h, r.hd[it], r.q0[it], r.q1[it]);
    }
}

template <int NC, int NS>
DEV void q4k_wdot(const q4k_w<NS>& r, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 2) + 8 * it;
        const bool ok = sb < nsb;
        q4k_dot_sb<NC>(r.hd[it], r.q0[it], r.q1[it], x + (ok ? sb * 8 + 4 * p : 0), (u64)kb * 36, ok, ncols, acc);
    }
}

// Slots of 8 super-blocks; the next slot's weight loads are issued before the current
// slot's products (two slots in flight: decode matvecs are latency-bound), in two
// register sets used in turn. Lane pointers advance by whole slots.
template <int NC>
DEV void mv_q4_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1, s = lane >> 2;
    const u8* w = wr + s * 144;
    const block_q8_1* xa = x + s * 8 + 4 * p;
    const u64 xcol = (u64)kb * 36;
    u32x4 ha, qa0, qa1, hb, qb0, qb1;
    if (s < nsb) q4k_load_sb(w, p, h, ha, qa0, qa1);
    for (int sb0 = 0; sb0 < nsb; sb0 += 16) {
        const bool okb = sb0 + 8 + s < nsb;
        if (okb) q4k_load_sb(w + 8 * 144, p, h, hb, qb0, qb1);
        const bool oka = sb0 + s < nsb;
        q4k_dot_sb<NC>(ha, qa0, qa1, oka ? xa : x, xcol, oka, ncols, acc);
        if (sb0 + 8 >= nsb) break;
        if (sb0 + 16 + s < nsb) q4k_load_sb(w + 16 * 144, p, h, ha, qa0, qa1);
        q4k_dot_sb<NC>(hb, qb0, qb1, okb ? xa + 64 : x, xcol, okb, ncols, acc);
        w += 16 * 144;
        xa += 128;
    }
}

template <int NC>
DEV void mv_q5_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, j = lane & 7, c = j >> 1, h = j & 1;
    for (int sb0 = 0; sb0 < nsb; sb0 += 16)
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb >= nsb) continue;
        const u8* b = wr + (u64)sb * 176;
        const float d = h2f(ld_u16(b)), dmin = h2f(ld_u16(b + 2));
        float sc0, m0, sc1, m1;
        scale_min_k4(2 * c, b + 4, &sc0, &m0);
        scale_min_k4(2 * c + 1, b + 4, &sc1, &m1);
        const u32x4 q = *(const u32x4*)(b + 48 + 32 * c + 16 * h);
        const u32x4 qh = *(const u32x4*)(b + 16 + 16 * h);
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        const u32 hw[4] = {qh.x, qh.y, qh.z, qh.w};
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

// ---- Q6_K: 8 lanes per 256-element super-block, 4 super-blocks per slot ----
//
// Lane = (super-block sb0 + 4 * slot + lane / 8, half hh = (lane / 4) % 2, eighth
// lq = lane % 4): positions l = 8lq .. 8lq + 7 of half hh in all four 32-element groups g
// (ql[64hh + l] low / high nibbles for g = 0 / 2, ql[64hh + 32 + l] for g = 1 / 3,
// qh[32hh + l] bits 2g, 2g + 1), i.e. 32 weights against codes 8lq .. of blocks
// 8 sb + 4hh + g, scale sc[8hh + 2g + lq / 2] per group. A super-block starts 2-byte
// aligned only: each 8-byte piece is read as 3 aligned words (always inside the
// super-block) and funnel-shifted by 0 or 16 bits.
template <int NS> struct q6k_w { u32 A[NS][3], B[NS][3], H[NS][3], S[NS][3], d[NS]; };

DEV void q6k_load_sb(const u8* b, int hh, int lq, u32* A, u32* B, u32* H, u32* S, u32* d) {
    const int odd = ((u64)b >> 1) & 1;
    const u32* w = (const u32*)(b - 2 * odd);
    const u32* pa = w + 16 * hh + 2 * lq;       // ql[64hh + 8lq ..]
    const u32* ph = w + 32 + 8 * hh + 2 * lq;   // qh[32hh + 8lq ..]
    const u32* ps = w + 48 + 2 * hh;            // sc[8hh ..]
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        A[i] = pa[i];
        B[i] = pa[8 + i];
        H[i] = ph[i];
    }
    S[0] = ps[0];
    S[1] = ps[1];
    S[2] = ps[1 + odd];  // an even start's third word would pass the super-block's end
    *d = *(const u16*)(b + 208);
}

// 4 (q - 32) as signed bytes from the low nibbles at bits 2-5 of lo and the 2-bit high
// parts at bits 6-7 of hi: ((lo & 0x3c) ^ 0x80) ^ (hi & 0xc0) per byte, two LOP3s on
// NVIDIA (the compiler's own form takes three).
DEV u32 q6k_code4(u32 lo, u32 hi) {
#ifdef LODE_NV
    u32 t, r;
    asm("lop3.b32 %0, %1, 0x3C3C3C3C, 0x80808080, 0x6A;" : "=r"(t) : "r"(lo));  // (a & b) ^ c
    asm("lop3.b32 %0, %1, %2, 0xC0C0C0C0, 0x6C;" : "=r"(r) : "r"(hi), "r"(t));   // (a & c) ^ b
    return r;
#else
    return ((lo & 0x3C3C3C3Cu) ^ 0x80808080u) ^ (hi & 0xC0C0C0C0u);
#endif
}

// One lane's products for one super-block: odd = its address is 2 mod 4; xa = its
// activation blocks (8 sb + 4hh, first column); ok = false: an idle lane (xa any
// readable K-form address; it still joins the broadcast of the activation scale).
// Each weight becomes the signed byte 4 (q - 32): the low nibble at bits 2-5 and the
// 2-bit high part, its top bit flipped, at bits 6-7 (so the sign comes for free).
template <int NC>
DEV void q6k_dot_sb(const u32* A, const u32* B, const u32* H, const u32* S, u32 dbits, int odd, const block_q8_1* xa, u64 xcol, bool ok, int ncols,
                    float* acc) {
    const int lane = tid_x() & 31, lq = lane & 3;
    const u32 sh = 16 * odd;
    u32 v[4][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const u32 a = shr_pair(A[i], A[i + 1], sh), bq = shr_pair(B[i], B[i + 1], sh), h = shr_pair(H[i], H[i + 1], sh);
        v[0][i] = q6k_code4(a << 2, h << 6);
        v[1][i] = q6k_code4(bq << 2, h << 4);
        v[2][i] = q6k_code4(a >> 2, h << 2);
        v[3][i] = q6k_code4(bq >> 2, h);
    }
    // sc[8hh + lq / 2 + 2g] at bytes 0 and 2 of t01 (g = 0, 1) and t23 (g = 2, 3)
    const u32 t01 = shr_pair(S[0], S[1], sh + 8 * (lq >> 1)), t23 = shr_pair(S[1], S[2], sh + 8 * (lq >> 1));
    const int sc[4] = {(int)perm_bytes(t01, 0, 0x8880), (int)perm_bytes(t01, 0, 0xAAA2), (int)perm_bytes(t23, 0, 0x8880),
                       (int)perm_bytes(t23, 0, 0xAAA2)};
    const float d4 = 0.25f * h2f((u16)dbits);
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (NC > 1 && col >= ncols) break;  // n1: no branch, so the activation loads can go first
        // Codes 8lq .. 8lq + 7 of blocks n .. n + 3 (n % 4 == 0, 16-byte aligned): aligned
        // loads, the first block's and second block's (d, s) words come along in lane lq = 0.
        const u8* p = (const u8*)xa + col * xcol + 8 * lq;
        const u32x2 g0a = *(const u32x2*)p;          // hdr n (lq = 0) | codes 8lq - 4 .., codes 8lq ..
        const u32 g0b = *(const u32*)(p + 8);          // codes 8lq + 4 ..
        const u32x2 g1a = *(const u32x2*)(p + 32);     // .., hdr n + 1 (lq = 0) | codes 8lq - 4 ..
        const u32x2 g1b = *(const u32x2*)(p + 40);     // codes 8lq ..
        const u32x2 g2a = *(const u32x2*)(p + 72);     // hdr n + 2 | .., codes 8lq ..
        const u32 g2b = *(const u32*)(p + 80);         // codes 8lq + 4 ..
        const u32x2 g3 = *(const u32x2*)(p + 112);     // codes 8lq ..
        const int c[4][2] = {{(int)g0a.y, (int)g0b}, {(int)g1b.x, (int)g1b.y}, {(int)g2a.y, (int)g2b}, {(int)g3.x, (int)g3.y}};
        int isum = 0;
#pragma unroll
        for (int g = 0; g < 4; ++g) isum += sc[g] * dot4((int)v[g][1], c[g][1], dot4((int)v[g][0], c[g][0], 0));
        // The super-block's activation scale, from lane (lane & ~7) (hh = 0, lq = 0).
        const float dx = __builtin_bit_cast(float, shfl_idx_u(perm_bytes(g0a.x, g1a.y, 0x5410), lane & ~7));
        if (ok) acc[col] += dx * d4 * (float)isum;
    }
}

// NS slots from super-block sb0 (slot it: super-blocks sb0 + 4 it .. + 3).
template <int NS>
DEV void q6k_wload(const u8* wr, int nsb, int sb0, q6k_w<NS>& r) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        if (sb < nsb) q6k_load_sb(wr + (u64)sb * 210, hh, lq, r.A[it], r.B[it], r.H[it], r.S[it], &r.d[it]);
    }
}

// wr: the row (the pointer q6k_wload got: each super-block's shift is its address's).
template <int NC, int NS>
DEV void q6k_wdot(const q6k_w<NS>& r, const u8* wr, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        const bool ok = sb < nsb;
        const int odd = (int)((((u64)wr >> 1) + (u64)sb) & 1);
        q6k_dot_sb<NC>(r.A[it], r.B[it], r.H[it], r.S[it], r.d[it], odd, x + (ok ? sb * 8 + 4 * hh : 0), (u64)kb * 36, ok, ncols, acc);
    }
}

// A lane's raw words of one super-block (q6k_load_sb's, from word pointers that advance
// by whole slots).
struct q6k_raw { u32 A[3], B[3], H[3], S[3], d; };
DEV void q6k_load_raw(const u32* pa, const u32* ph, const u32* ps, const u16* pd, int odd, q6k_raw& r) {
#pragma unroll
    for (int i = 0; i < 3; ++i) {
        r.A[i] = pa[i];
        r.B[i] = pa[8 + i];
        r.H[i] = ph[i];
    }
    r.S[0] = ps[0];
    r.S[1] = ps[1];
    r.S[2] = ps[1 + odd];
    r.d = *pd;
}

// Slots of 4 super-blocks. A slot is 840 bytes, so a lane's shift is the same in every
// slot and its word pointers advance by 210 words. Rows of 12 or more super-blocks issue
// the next slot's loads before the current slot's products (two register sets in turn);
// shorter ones one slot at a time. H200 (ci/microbench/mv_dot.cu): pipelining took the
// 8B / 4B / 0.6B Q6_K down projections from 27.8 / 19.0 / 10.4 to 24.6 / 16.1 / 8.9 us but
// the 4B head (10 super-blocks, 152k rows) from 120 to 126 us, the 8B head (16) from 141 to
// 151 (a cost the downs repay several times over). 64 registers: at 48 the pipelined loop
// spills.
template <int NC>
DEV void mv_q6_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3, s = lane >> 3;
    const u8* b = wr + s * 210;
    const int odd = (int)(((u64)b >> 1) & 1);
    const u32* pa = (const u32*)(b - 2 * odd) + 16 * hh + 2 * lq;  // see q6k_load_sb
    const u32* ph = (const u32*)(b - 2 * odd) + 32 + 8 * hh + 2 * lq;
    const u32* ps = (const u32*)(b - 2 * odd) + 48 + 2 * hh;
    const u16* pd = (const u16*)(b + 208);
    const block_q8_1* xa = x + s * 8 + 4 * hh;
    const u64 xcol = (u64)kb * 36;
    if (nsb < 12) {
        for (int sb0 = 0; sb0 < nsb; sb0 += 4) {
            const bool ok = sb0 + s < nsb;
            q6k_raw r;
            if (ok) q6k_load_raw(pa, ph, ps, pd, odd, r);
            q6k_dot_sb<NC>(r.A, r.B, r.H, r.S, r.d, odd, ok ? xa : x, xcol, ok, ncols, acc);
            pa += 210, ph += 210, ps += 210, pd += 420;
            xa += 32;
        }
        return;
    }
    q6k_raw ra, rb;
    if (s < nsb) q6k_load_raw(pa, ph, ps, pd, odd, ra);
    for (int sb0 = 0; sb0 < nsb; sb0 += 8) {
        const bool okb = sb0 + 4 + s < nsb;
        if (okb) q6k_load_raw(pa + 210, ph + 210, ps + 210, pd + 420, odd, rb);
        const bool oka = sb0 + s < nsb;
        q6k_dot_sb<NC>(ra.A, ra.B, ra.H, ra.S, ra.d, odd, oka ? xa : x, xcol, oka, ncols, acc);
        if (sb0 + 4 >= nsb) break;
        if (sb0 + 8 + s < nsb) q6k_load_raw(pa + 420, ph + 420, ps + 420, pd + 840, odd, ra);
        q6k_dot_sb<NC>(rb.A, rb.B, rb.H, rb.S, rb.d, odd, okb ? xa + 32 : x, xcol, okb, ncols, acc);
        pa += 420, ph += 420, ps += 420, pd += 840;
        xa += 64;
    }
}

// ---- 32-element blocks: 2 lanes per block (16 elements each), 16 blocks per warp step ----

// Expand 4 bits (bit i -> byte i, bit 4).
DEV u32 spread4(u32 x) { return ((x & 1) << 4) | ((x & 2) << 11) | ((x & 4) << 18) | ((x & 8) << 25); }
// Bytes b - o (b in [0, 32), o = 8 or 16 in every byte) as signed bytes, without borrows.
DEV u32 sub_bytes(u32 b, u32 o) { return ((b | 0x80808080u) - o) ^ 0x80808080u; }

// TYPE: 0 = Q4_0, 1 = Q4_1, 2 = Q5_0, 3 = Q5_1, 4 = Q8_0
template <int TYPE, int NC>
DEV void mv_b32(const u8* wr, const block_q8_1* x, int kb, int ncols, float* acc) {
    constexpr int BB = TYPE == 0 ? 18 : TYPE == 1 ? 20 : TYPE == 2 ? 22 : TYPE == 3 ? 24 : 34;
    const int lane = tid_x() & 31, hh = lane & 1;
    for (int blk0 = 0; blk0 < kb; blk0 += 64)
#pragma unroll
    for (int it = 0; it < 4; ++it) {
        const int blk = blk0 + (lane >> 1) + 16 * it;
        if (blk >= kb) continue;
        const u8* b = wr + (u64)blk * BB;
        const float d = h2f(ld_u16(b));
        float m = 0.0f;
        int w[4];
        if (TYPE == 4) {
#pragma unroll
            for (int i = 0; i < 4; ++i) w[i] = (int)ld_u32_a2(b + 2 + 16 * hh + 4 * i);
        } else {
            const int qoff = TYPE == 0 ? 2 : TYPE == 1 ? 4 : TYPE == 2 ? 6 : 8;
            if (TYPE == 1 || TYPE == 3) m = h2f(ld_u16(b + 2));
            u32 H = 0;
            if (TYPE == 2) H = ld_u32_a2(b + 2);
            if (TYPE == 3) H = ld_u32_a2(b + 4);
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const u32 qw = ld_u32_a2(b + qoff + 8 * hh + 4 * i);
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

// ---- float weights x f32 activations ----

// TYPE: 0 = F32, 1 = F16, 2 = BF16
template <int TYPE, int NC>
DEV void mv_float(const u8* wr, const float* x, int k, int ncols, float* acc) {
    const int lane = tid_x() & 31;
    for (int i = lane; i < k; i += 32) {
        float wv;
        if (TYPE == 0) wv = ((const float*)wr)[i];
        else if (TYPE == 1) wv = h2f(((const u16*)wr)[i]);
        else wv = bf2f(((const u16*)wr)[i]);
#pragma unroll
        for (int col = 0; col < NC; ++col) {
            if (col >= ncols) break;
            acc[col] += wv * x[(u64)col * k + i];
        }
    }
}

#define ROW_SETUP                                   \
    const int row = bid_x() * 4 + (tid_x() >> 5);   \
    if (row >= rows) return;                        \
    float acc[NC];                                  \
    _Pragma("unroll") for (int c = 0; c < NC; ++c) acc[c] = 0.0f;

// MINB: resident 128-thread blocks per multiprocessor the n1 kernel is compiled for (a
// register cap without spills; Q4_K at 79 registers ran 24 warps per SM; Q6_K's
// pipelined loop needs 64, at 40 or 48 it spills).
#define MV_K(NAME, FN, BB, MINB)                                                                   \
    template <int NC>                                                                              \
    DEV void NAME##_body(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                                  \
        const int nsb = k / 256;                                                                   \
        FN<NC>(W + (u64)row * nsb * BB, x, k / 32, nsb, ncols, acc);                               \
        store<NC>(y, acc, rows, row, ncols);                                                       \
    }                                                                                              \
    KERNEL LAUNCH_BOUNDS_MIN(128, MINB) void NAME##_n1(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                                   \
    }                                                                                              \
    KERNEL void NAME##_n8(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                                   \
    }

MV_K(matvec_q4_K, mv_q4_K, 144, 8)
MV_K(matvec_q5_K, mv_q5_K, 176, 12)
MV_K(matvec_q6_K, mv_q6_K, 210, 8)

#define MV_B32(NAME, T, BB)                                                                        \
    template <int NC>                                                                              \
    DEV void NAME##_body(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                                  \
        mv_b32<T, NC>(W + (u64)row * (k / 32) * BB, x, k / 32, ncols, acc);                        \
        store<NC>(y, acc, rows, row, ncols);                                                       \
    }                                                                                              \
    KERNEL void NAME##_n1(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                                   \
    }                                                                                              \
    KERNEL void NAME##_n8(const u8* W, const block_q8_1* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                                   \
    }

MV_B32(matvec_q4_0, 0, 18)
MV_B32(matvec_q4_1, 1, 20)
MV_B32(matvec_q5_0, 2, 22)
MV_B32(matvec_q5_1, 3, 24)
MV_B32(matvec_q8_0, 4, 34)

#define MV_F(NAME, T, EB)                                                                      \
    template <int NC>                                                                          \
    DEV void NAME##_body(const u8* W, const float* x, float* y, int rows, int k, int ncols) { \
        ROW_SETUP                                                                              \
        mv_float<T, NC>(W + (u64)row * k * EB, x, k, ncols, acc);                              \
        store<NC>(y, acc, rows, row, ncols);                                                   \
    }                                                                                          \
    KERNEL void NAME##_n1(const u8* W, const float* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<1>(W, x, y, rows, k, ncols);                                               \
    }                                                                                          \
    KERNEL void NAME##_n8(const u8* W, const float* x, float* y, int rows, int k, int ncols) { pdl_entry(); \
        NAME##_body<8>(W, x, y, rows, k, ncols);                                               \
    }

MV_F(matvec_f32, 0, 4)
MV_F(matvec_f16, 1, 2)
MV_F(matvec_bf16, 2, 2)

// ---- decode matvec with the activation vector staged in shared memory ----
//
// The q8_1 blocks of x are copied once per block into an aligned layout (codes
// contiguous, (d, s) pairs apart): the inner loops then read 16 activation codes with
// one 128-bit shared load instead of four 32-bit global ones, and each lane works on 64
// weights per step, which roughly halves the instructions per weight byte of the Q4_K /
// Q6_K decode matvecs (they were issue-bound at 1-2 TB/s). Each lane's next weights are
// loaded before the current ones are used (two steps in flight per warp), and the first
// step's loads are issued before the staging so the two latencies overlap.
// One warp per row, 8 rows per 256-thread block; rows of at least 8 super-blocks.
#define MVS_K 16384
struct __attribute__((aligned(8))) mvs_ds { float d, s; };
struct __attribute__((aligned(16))) i32x4 { int x, y, z, w; };

// All threads of the block: x [kb] K-form blocks -> qs [kb * 32] i8, ds [kb] (d, d·Σq).
DEV void mvs_stage(const block_q8_1* x, int kb, i8* qs, mvs_ds* ds) {
    const int t = tid_x();
    for (int i = t; i < kb * 8; i += 256) ((int*)qs)[i] = q8qs(x + (i >> 3))[i & 7];
    for (int b = t; b < kb; b += 256) {
        ds[b].d = q8k_scale(x + (b & ~1));
        ds[b].s = ds[b].d * q8k_bsum(x + b);
    }
}

// Q4_K: lane = (super-block sb0 + lane / 4, quant chunk c = lane % 4: 32 bytes holding
// sub-block 2c in the low nibbles and 2c + 1 in the high ones).
struct q4k_regs { u32x4 hd, q0, q1; };
DEV void q4k_load(const u8* wr, int sb, int c, q4k_regs* r) {
    const u8* b = wr + (u64)sb * 144;
    r->hd = *(const u32x4*)b;
    r->q0 = *(const u32x4*)(b + 16 + 32 * c);
    r->q1 = *(const u32x4*)(b + 32 + 32 * c);
}
DEV float q4k_dot(const q4k_regs& r, int sb, int c, const i8* qs, const mvs_ds* ds) {
    const int sh = 16 * (c & 1);
    const u32 Y = r.hd.y >> sh, Z = r.hd.z >> sh, W = r.hd.w >> sh;
    int sc0, sc1, m0, m1;
    if (c < 2) {
        sc0 = Y & 63, sc1 = (Y >> 8) & 63, m0 = Z & 63, m1 = (Z >> 8) & 63;
    } else {
        sc0 = (W & 15) | ((Y >> 2) & 0x30), sc1 = ((W >> 8) & 15) | ((Y >> 10) & 0x30);
        m0 = ((W >> 4) & 15) | ((Z >> 2) & 0x30), m1 = ((W >> 12) & 15) | ((Z >> 10) & 0x30);
    }
    const i32x4* xa = (const i32x4*)(qs + sb * 256 + 64 * c);
    const i32x4 a0 = xa[0], a1 = xa[1], a2 = xa[2], a3 = xa[3];
    const u32 w[8] = {r.q0.x, r.q0.y, r.q0.z, r.q0.w, r.q1.x, r.q1.y, r.q1.z, r.q1.w};
    const int lo[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
    const int hi[8] = {a2.x, a2.y, a2.z, a2.w, a3.x, a3.y, a3.z, a3.w};
    int s0 = 0, s1 = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        s0 = dot4((int)(w[i] & 0x0F0F0F0F), lo[i], s0);
        s1 = dot4((int)((w[i] >> 4) & 0x0F0F0F0F), hi[i], s1);
    }
    const mvs_ds e0 = ds[sb * 8 + 2 * c], e1 = ds[sb * 8 + 2 * c + 1];
    const float d = h2f((u16)(r.hd.x & 0xffff)), dmin = h2f((u16)(r.hd.x >> 16));
    return d * ((float)sc0 * e0.d * (float)s0 + (float)sc1 * e1.d * (float)s1) - dmin * ((float)m0 * e0.s + (float)m1 * e1.s);
}

// 16 bytes at a 2-byte-aligned address as 4 words: 5 aligned 32-bit loads and shifts
// (Q6_K super-blocks are 210 bytes, so their fields are only 2-byte aligned).
DEV void ld16_a2(const u8* p, u32* out) {
    const u32* q = (const u32*)((u64)p & ~(u64)3);
    const bool odd = ((u64)p & 3) != 0;
    u32 w[5];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = q[i];
    w[4] = odd ? q[4] : 0u;
#pragma unroll
    for (int i = 0; i < 4; ++i) out[i] = odd ? ((w[i] >> 16) | (w[i + 1] << 16)) : w[i];
}

// Q6_K: lane = (super-block sb0 + lane / 4, half h = (lane / 2) % 2, 16-element quarter
// q = lane % 2 of each of the half's four 32-element groups): 64 weights per step.
struct q6k_regs { u32 L0[4], L1[4], H[4]; u32 sc01, sc23; u16 d; };
DEV void q6k_load(const u8* wr, int sb, int h, int q, q6k_regs* r) {
    const u8* b = wr + (u64)sb * 210;
    ld16_a2(b + 64 * h + 16 * q, r->L0);
    ld16_a2(b + 64 * h + 32 + 16 * q, r->L1);
    ld16_a2(b + 128 + 32 * h + 16 * q, r->H);
    const u16* sp = (const u16*)(b + 192 + 8 * h);
    r->sc01 = (u32)sp[0] | ((u32)sp[1] << 16);
    r->sc23 = (u32)sp[2] | ((u32)sp[3] << 16);
    r->d = *(const u16*)(b + 208);
}
DEV float q6k_dot(const q6k_regs& r, int sb, int h, int q, const i8* qs, const mvs_ds* ds) {
    // scales 8h + 2g + q for g = 0..3: byte q of each 16-bit word.
    const int scl[4] = {(int)(i8)((r.sc01 >> (8 * q)) & 0xff), (int)(i8)((r.sc01 >> (16 + 8 * q)) & 0xff),
                        (int)(i8)((r.sc23 >> (8 * q)) & 0xff), (int)(i8)((r.sc23 >> (16 + 8 * q)) & 0xff)};
    float v = 0.0f;
#pragma unroll
    for (int g = 0; g < 4; ++g) {
        const int blk = sb * 8 + 4 * h + g;
        const i32x4 a = *(const i32x4*)(qs + blk * 32 + 16 * q);
        const int av[4] = {a.x, a.y, a.z, a.w};
        int s = 0, sa = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 l = (g & 1) ? r.L1[i] : r.L0[i];
            const u32 code = (((g & 2) ? (l >> 4) : l) & 0x0F0F0F0F) | (((r.H[i] >> (2 * g)) & 0x03030303) << 4);
            s = dot4((int)code, av[i], s);
            sa = dot4(0x20202020, av[i], sa);
        }
        v += (float)scl[g] * ds[blk].d * (float)(s - sa);
    }
    return h2f(r.d) * v;
}

// ---- several decode matvecs over one q8_1 activation vector in one launch ----
//
// The q/k/v projections (and gate/up) read the same normalized input: one launch serves
// up to 3 weights of any q8_1-consuming type (a type code per segment), saving launches,
// which dominate a decode step of a small model; a single decode matvec of Q4_K / Q6_K
// is this kernel with one segment. Segment s owns blocks [sum_{j<s} ceil(rows_j / 8), …);
// Q4_K / Q6_K rows of at least 8 super-blocks (K <= MVS_K) use the staged kernels above,
// everything else the per-type warp bodies on global q8_1.
// Type codes: 0 Q4_0, 1 Q4_1, 2 Q5_0, 3 Q5_1, 4 Q8_0, 10 Q4_K, 11 Q5_K, 12 Q6_K.
// x: [k / 32] q8_1 form (for the 32-element types), xk: [k / 32] K form (for the
// K-quants; either may be unused); y_s: [rows_s] f32; staged: the fewest super-blocks per row for
// which the staged kernels are used (0: never). On the H200 they beat the uncapped warp
// bodies on long rows (Q4_K 4096 x 14336: 2.0 vs 1.4 TB/s) but only matched them once
// those were compiled for 64 registers, and lost on K <= 9728: opt-in (ops.rs).
// grid (Σ ceil(rows_s / 8)), block 256.
// One row of any q8_1-consuming type by its warp body (type codes as above).
DEV void mv_any(int ty, const u8* W, const block_q8_1* x, const block_q8_1* xk, int row, int kb, int nsb, float* acc) {
    switch (ty) {
    case 0: mv_b32<0, 1>(W + (u64)row * kb * 18, x, kb, 1, acc); break;
    case 1: mv_b32<1, 1>(W + (u64)row * kb * 20, x, kb, 1, acc); break;
    case 2: mv_b32<2, 1>(W + (u64)row * kb * 22, x, kb, 1, acc); break;
    case 3: mv_b32<3, 1>(W + (u64)row * kb * 24, x, kb, 1, acc); break;
    case 4: mv_b32<4, 1>(W + (u64)row * kb * 34, x, kb, 1, acc); break;
    case 10: mv_q4_K<1>(W + (u64)row * nsb * 144, xk, kb, nsb, 1, acc); break;
    case 11: mv_q5_K<1>(W + (u64)row * nsb * 176, xk, kb, nsb, 1, acc); break;
    case 12: mv_q6_K<1>(W + (u64)row * nsb * 210, xk, kb, nsb, 1, acc); break;
    default: break;
    }
}

#ifdef LODE_NV
#define MVS_BOUNDS __launch_bounds__(256, 4)
#else
#define MVS_BOUNDS LAUNCH_BOUNDS(256)
#endif
KERNEL MVS_BOUNDS void matvec_multi_n1(const block_q8_1* x, const block_q8_1* xk, int k, const u8* W0, float* y0, int rows0, int ty0, const u8* W1,
                                       float* y1, int rows1, int ty1, const u8* W2, float* y2, int rows2, int ty2, int staged) { pdl_entry();
    __shared__ __attribute__((aligned(16))) i8 s_qs[MVS_K];
    __shared__ mvs_ds s_ds[MVS_K / 32];
    int b = bid_x();
    const int nb0 = (rows0 + 7) / 8, nb1 = (rows1 + 7) / 8;
    const u8* W = W0;
    float* y = y0;
    int rows = rows0, ty = ty0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, y = y2, rows = rows2, ty = ty2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, y = y1, rows = rows1, ty = ty1;
    }
    const int lane = tid_x() & 31;
    const int row = b * 8 + (tid_x() >> 5);
    const bool live = row < rows;
    const int kb = k / 32, nsb = k / 256;
    float acc[1] = {0.0f};
    if (staged > 0 && (ty == 10 || ty == 12) && nsb >= staged && nsb >= 8 && k <= MVS_K) {
        // Block-uniform branch: every thread reaches the barrier.
        int sb = lane >> 2;
        if (ty == 10) {
            const int c = lane & 3;
            const u8* wr = W + (u64)(live ? row : 0) * nsb * 144;
            q4k_regs cur, nxt;
            if (live && sb < nsb) q4k_load(wr, sb, c, &cur);
            mvs_stage(xk, kb, s_qs, s_ds);
            sync();
            if (!live) return;
            for (; sb < nsb; sb += 8) {
                if (sb + 8 < nsb) q4k_load(wr, sb + 8, c, &nxt);
                acc[0] += q4k_dot(cur, sb, c, s_qs, s_ds);
                cur = nxt;
            }
        } else {
            const int h = (lane >> 1) & 1, q = lane & 1;
            const u8* wr = W + (u64)(live ? row : 0) * nsb * 210;
            q6k_regs cur, nxt;
            if (live && sb < nsb) q6k_load(wr, sb, h, q, &cur);
            mvs_stage(xk, kb, s_qs, s_ds);
            sync();
            if (!live) return;
            for (; sb < nsb; sb += 8) {
                if (sb + 8 < nsb) q6k_load(wr, sb + 8, h, q, &nxt);
                acc[0] += q6k_dot(cur, sb, h, q, s_qs, s_ds);
                cur = nxt;
            }
        }
        store<1>(y, acc, rows, row, 1);
        return;
    }
    if (!live) return;
    mv_any(ty, W, x, xk, row, kb, nsb, acc);
    store<1>(y, acc, rows, row, 1);
}

// The same launch without the staged kernels: 4 rows per 128-thread block and the warp
// bodies only, compiled for 8 resident blocks (64 registers, no spills); used when no
// segment qualifies for staging. grid (Σ ceil(rows_s / 4)), block 128.
KERNEL LAUNCH_BOUNDS_MIN(128, 8) void matvec_multi4_n1(const block_q8_1* x, const block_q8_1* xk, int k, const u8* W0, float* y0, int rows0, int ty0,
                                                      const u8* W1, float* y1, int rows1, int ty1, const u8* W2, float* y2,
                                                      int rows2, int ty2) { pdl_entry();
    int b = bid_x();
    const int nb0 = (rows0 + 3) / 4, nb1 = (rows1 + 3) / 4;
    const u8* W = W0;
    float* y = y0;
    int rows = rows0, ty = ty0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, y = y2, rows = rows2, ty = ty2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, y = y1, rows = rows1, ty = ty1;
    }
    const int row = b * 4 + (tid_x() >> 5);
    if (row >= rows) return;
    float acc[1] = {0.0f};
    mv_any(ty, W, x, xk, row, k / 32, k / 256, acc);
    store<1>(y, acc, rows, row, 1);
}
