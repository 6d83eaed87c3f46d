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
// Steps: NS slots each; a Q4_K slot is 8 super-blocks (4 lanes per 256-element
// super-block), a Q5_K / Q6_K slot 4 super-blocks (8 lanes per super-block), a 32-element
// slot 16 blocks (2 lanes per block). mv_q4_K / mv_q6_K keep two slots in flight (Q6_K:
// on rows of 12+ super-blocks), mv_q5_K and the 32-element types NS = 4; the fused kernels
// one slot per step (registers). The K-quant bodies read the activation with 16-byte loads:
// it must be 16-byte aligned (device allocations are; shared arrays need aligned(16)).

// One step's product into a column's accumulator. One column (every one-token matvec):
// an add_rn, never fused with the product into an FMA, so a row's steps may also run in
// separate warps and be added afterwards with the same result, bit for bit
// (decode_mv_quant's warps per row). Several columns (batched decode): the plain +=,
// which the compiler may contract (fewer instructions where compute matters).
template <int NC>
DEV void acc_add(float& acc, float v) {
    if (NC == 1) acc = add_rn(acc, v);
    else acc += v;
}

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

// The products of one lane's super-block (6-bit scales sc and mins mn as q4k_scales
// gives them, mins masked to the lane's blocks; d, dmin; the 8 quant words w0, w1) with
// one column's activation a, added to acc (ok = false: an idle lane, nothing added).
template <int NC>
DEV void q4k_act_dot(u32 sc, u32 mn, float d, float dmin, const u32* w0, const u32* w1, const kact& a, bool ok, float& acc) {
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
    if (ok) acc_add<NC>(acc, dx * (d * (float)isum - dmin * (float)imin));
}

// The lane's weight terms of super-block (hd, q0, q1) for q4k_act_dot. A macro, not a
// struct of terms: the struct form changed the register allocation of the kernels that
// already used q4k_dot_sb (spills in matvec_q4k_loop_n1, decode_mv_glu4, the norm walks);
// with the macro their code objects stay byte-identical.
#define Q4K_TERMS(hd, q0, q1)                                                        \
    const int h = tid_x() & 1, p = (tid_x() >> 1) & 1;                               \
    u32 sc, mn;                                                                      \
    q4k_scales(hd.y, hd.z, hd.w, p, &sc, &mn);                                       \
    /* Min terms: lane h = 0 holds the s of blocks 4p .. 4p + 2, lane h = 1 of 4p + 3. */ \
    mn &= h ? 0xff000000u : 0x00ffffffu;                                             \
    const float d = h2f((u16)(hd.x & 0xffff)), dmin = h2f((u16)(hd.x >> 16));        \
    const u32 w0[4] = {q0.x, q0.y, q0.z, q0.w};                                      \
    const u32 w1[4] = {q1.x, q1.y, q1.z, q1.w};

// One lane's products for one super-block: xa = its activation blocks (8 sb + 4p, first
// column), xcol = bytes between columns; ok = false: an idle lane (xa any readable
// K-form address; it still joins the broadcast).
template <int NC>
DEV void q4k_dot_sb(const u32x4& hd, const u32x4& q0, const u32x4& q1, const block_q8_1* xa, u64 xcol, bool ok, int ncols, float* acc) {
    Q4K_TERMS(hd, q0, q1)
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (NC > 1 && col >= ncols) break;  // n1: no branch, so the activation loads can go first
        kact a;
        k_act_load((const block_q8_1*)((const u8*)xa + col * xcol), h, a);
        q4k_act_dot<NC>(sc, mn, d, dmin, w0, w1, a, ok, acc[col]);
    }
}

// q4k_dot_sb for one column whose activation a is already in registers.
DEV void q4k_dot_sb_act(const u32x4& hd, const u32x4& q0, const u32x4& q1, const kact& a, bool ok, float* acc) {
    Q4K_TERMS(hd, q0, q1)
    (void)h;
    q4k_act_dot<1>(sc, mn, d, dmin, w0, w1, a, ok, acc[0]);
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

// A whole Q4_K row of at most 16 super-blocks in one lane's registers (both slots of
// mv_q4_K): the unit of the resident row walks (matvec_q4k_loop_n1, decode_mv_norm_walk),
// which load the next row into a second one while the current row's products run.
struct q4k_row2 { u32x4 ha, qa0, qa1, hb, qb0, qb1; };

DEV void q4k_row2_load(const u8* wr, int nsb, q4k_row2& r) {
    const int lane = tid_x() & 31, p = (lane >> 1) & 1, h = lane & 1, s = lane >> 2;
    const u8* w = wr + s * 144;
    if (s < nsb) q4k_load_sb(w, p, h, r.ha, r.qa0, r.qa1);
    if (8 + s < nsb) q4k_load_sb(w + 8 * 144, p, h, r.hb, r.qb0, r.qb1);
}

// A loaded row's sum against activations already in registers (ka, kb: slots a and b;
// kb unread for rows of at most 8 super-blocks): q4k_row2_dot's
// arithmetic without its activation loads, for a walk that keeps them across rows.
DEV float q4k_row2_dot_act(const q4k_row2& r, const kact& ka, const kact& kb, int nsb) {
    const int s = (tid_x() & 31) >> 2;
    float acc[1] = {0.0f};
    q4k_dot_sb_act(r.ha, r.qa0, r.qa1, ka, s < nsb, acc);
    if (nsb > 8) q4k_dot_sb_act(r.hb, r.qb0, r.qb1, kb, 8 + s < nsb, acc);
    return warp_sum(acc[0]);
}

// A loaded row's sum (every lane): mv_q4_K's arithmetic (slot a, then slot b, then the
// warp sum). xk: the K form (any address space); xa = xk + 8 (lane / 4) + 4 p, this lane's
// activation blocks of slot a.
DEV float q4k_row2_dot(const q4k_row2& r, const block_q8_1* xk, const block_q8_1* xa, int nsb) {
    const int s = (tid_x() & 31) >> 2;
    float acc[1] = {0.0f};
    const bool oka = s < nsb, okb = 8 + s < nsb;
    q4k_dot_sb<1>(r.ha, r.qa0, r.qa1, oka ? xa : xk, 0, oka, 1, acc);
    if (nsb > 8) q4k_dot_sb<1>(r.hb, r.qb0, r.qb1, okb ? xa + 64 : xk, 0, okb, 1, acc);
    return warp_sum(acc[0]);
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
            acc_add<NC>(acc[col], v);
        }
    }
}

// One slot (4 super-blocks) per step (four slots loaded at once spilled 330 bytes even at
// 64 registers; two pipelined slots spill at the 40 of MINB 12).
template <int NC>
DEV void mv_q5_K(const u8* wr, const block_q8_1* x, int kb, int nsb, int ncols, float* acc) {
    for (int sb0 = 0; sb0 < nsb; sb0 += 4) {
        q5k_w<1> r;
        q5k_wload<1>(wr, nsb, sb0, r);
        q5k_wdot<NC, 1>(r, x, kb, nsb, sb0, ncols, acc);
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
template <int NS> struct q6k_w { u32 A[NS][3], B[NS][3], H[NS][3], S[NS][3], d[NS]; int odd[NS]; };

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

// A lane's K-form activation for one Q6_K super-block: codes 8lq .. 8lq + 7 of blocks
// n .. n + 3 (n % 4 == 0, 16-byte aligned) by aligned loads; the first and second blocks'
// (d, s) words come along in lane lq = 0 (h0, h1).
struct q6act { int c[4][2]; u32 h0, h1; };
DEV void q6k_act_load(const u8* p, q6act& a) {
    const u32x2 g0a = *(const u32x2*)p;          // hdr n (lq = 0) | codes 8lq - 4 .., codes 8lq ..
    const u32 g0b = *(const u32*)(p + 8);          // codes 8lq + 4 ..
    const u32x2 g1a = *(const u32x2*)(p + 32);     // .., hdr n + 1 (lq = 0) | codes 8lq - 4 ..
    const u32x2 g1b = *(const u32x2*)(p + 40);     // codes 8lq ..
    const u32x2 g2a = *(const u32x2*)(p + 72);     // hdr n + 2 | .., codes 8lq ..
    const u32 g2b = *(const u32*)(p + 80);         // codes 8lq + 4 ..
    const u32x2 g3 = *(const u32x2*)(p + 112);     // codes 8lq ..
    a.c[0][0] = (int)g0a.y, a.c[0][1] = (int)g0b, a.c[1][0] = (int)g1b.x, a.c[1][1] = (int)g1b.y;
    a.c[2][0] = (int)g2a.y, a.c[2][1] = (int)g2b, a.c[3][0] = (int)g3.x, a.c[3][1] = (int)g3.y;
    a.h0 = g0a.x, a.h1 = g1a.y;
}

// The products of a lane's super-block (its signed codes v, scales sc, d / 4) with one
// column's activation a, added to acc (ok = false: an idle lane; it still joins the
// broadcast of the activation scale).
template <int NC>
DEV void q6k_act_dot(const u32 (*v)[2], const int* sc, float d4, const q6act& a, bool ok, float& acc) {
    const int lane = tid_x() & 31;
    int isum = 0;
#pragma unroll
    for (int g = 0; g < 4; ++g) isum += sc[g] * dot4((int)v[g][1], a.c[g][1], dot4((int)v[g][0], a.c[g][0], 0));
    // The super-block's activation scale, from lane (lane & ~7) (hh = 0, lq = 0).
    const float dx = __builtin_bit_cast(float, shfl_idx_u(perm_bytes(a.h0, a.h1, 0x5410), lane & ~7));
    if (ok) acc_add<NC>(acc, dx * d4 * (float)isum);
}

// A lane's weight terms of one Q6_K super-block (A, B, H, S, dbits, odd as loaded) for
// q6k_act_dot (a macro for the reason Q4K_TERMS is one). Each weight becomes the signed byte 4 (q - 32): the low nibble at bits 2-5
// and the 2-bit high part, its top bit flipped, at bits 6-7 (so the sign comes for free).
#define Q6K_TERMS(A, B, H, S, dbits, odd)                                                                              \
    const int lq = tid_x() & 3;                                                                                        \
    const u32 sh = 16 * odd;                                                                                           \
    u32 v[4][2];                                                                                                       \
    _Pragma("unroll") for (int i = 0; i < 2; ++i) {                                                                    \
        const u32 a = shr_pair(A[i], A[i + 1], sh), bq = shr_pair(B[i], B[i + 1], sh), h = shr_pair(H[i], H[i + 1], sh); \
        v[0][i] = q6k_code4(a << 2, h << 6);                                                                           \
        v[1][i] = q6k_code4(bq << 2, h << 4);                                                                          \
        v[2][i] = q6k_code4(a >> 2, h << 2);                                                                           \
        v[3][i] = q6k_code4(bq >> 2, h);                                                                               \
    }                                                                                                                  \
    /* sc[8hh + lq / 2 + 2g] at bytes 0 and 2 of t01 (g = 0, 1) and t23 (g = 2, 3) */                                  \
    const u32 t01 = shr_pair(S[0], S[1], sh + 8 * (lq >> 1)), t23 = shr_pair(S[1], S[2], sh + 8 * (lq >> 1));          \
    const int sc[4] = {(int)perm_bytes(t01, 0, 0x8880), (int)perm_bytes(t01, 0, 0xAAA2), (int)perm_bytes(t23, 0, 0x8880), \
                       (int)perm_bytes(t23, 0, 0xAAA2)};                                                               \
    const float d4 = 0.25f * h2f((u16)dbits);

// One lane's products for one super-block: odd = its address is 2 mod 4; xa = its
// activation blocks (8 sb + 4hh, first column); ok = false: an idle lane (xa any
// readable K-form address; it still joins the broadcast of the activation scale).
template <int NC>
DEV void q6k_dot_sb(const u32* A, const u32* B, const u32* H, const u32* S, u32 dbits, int odd, const block_q8_1* xa, u64 xcol, bool ok, int ncols,
                    float* acc) {
    Q6K_TERMS(A, B, H, S, dbits, odd)
#pragma unroll
    for (int col = 0; col < NC; ++col) {
        if (NC > 1 && col >= ncols) break;  // n1: no branch, so the activation loads can go first
        q6act a;
        q6k_act_load((const u8*)xa + col * xcol + 8 * lq, a);
        q6k_act_dot<NC>(v, sc, d4, a, ok, acc[col]);
    }
}

// q6k_dot_sb for one column whose activation a is already in registers.
DEV void q6k_dot_sb_act(const u32* A, const u32* B, const u32* H, const u32* S, u32 dbits, int odd, const q6act& a, bool ok, float* acc) {
    Q6K_TERMS(A, B, H, S, dbits, odd)
    q6k_act_dot<1>(v, sc, d4, a, ok, acc[0]);
}

// NS slots from super-block sb0 (slot it: super-blocks sb0 + 4 it .. + 3).
template <int NS>
DEV void q6k_wload(const u8* wr, int nsb, int sb0, q6k_w<NS>& r) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1, lq = lane & 3;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        const u8* b = wr + (u64)sb * 210;
        r.odd[it] = (int)(((u64)b >> 1) & 1);
        if (sb < nsb) q6k_load_sb(b, hh, lq, r.A[it], r.B[it], r.H[it], r.S[it], &r.d[it]);
    }
}

template <int NC, int NS>
DEV void q6k_wdot(const q6k_w<NS>& r, const block_q8_1* x, int kb, int nsb, int sb0, int ncols, float* acc) {
    const int lane = tid_x() & 31, hh = (lane >> 2) & 1;
#pragma unroll
    for (int it = 0; it < NS; ++it) {
        const int sb = sb0 + (lane >> 3) + 4 * it;
        const bool ok = sb < nsb;
        q6k_dot_sb<NC>(r.A[it], r.B[it], r.H[it], r.S[it], r.d[it], r.odd[it], x + (ok ? sb * 8 + 4 * hh : 0), (u64)kb * 36, ok, ncols, acc);
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
