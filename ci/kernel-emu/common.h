// A host stand-in for kernels-hip/common.h: a kernel source compiled with g++ (C++20) runs
// on the CPU, one OS thread per GPU thread and one block at a time, with block barriers
// (sync) and warp shuffles (shfl_xor through a shared slot array between two warp
// barriers). Only what the emulated sources use is defined; exp/log are libm's. It checks
// a kernel's indexing and algorithm without a GPU, not its speed or vendor behaviour.
// Used by runtime/tests/delta_kernel_emulated.rs and moe_kernel_emulated.rs (copied beside
// the kernel source, so its `#include "common.h"` finds this file).
#pragma once
#include <cmath>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#define LODE_AMD 1
typedef unsigned long long u64;
typedef unsigned int u32;
#define DEV static inline
#define KERNEL extern "C"
#define LAUNCH_BOUNDS(n)
#define __shared__ static
#define __builtin_amdgcn_logf(x) log2f(x)
struct Ctx { u32 tid, bx, by, bz; };
inline thread_local Ctx ctx;
inline std::barrier<>* g_block_bar = nullptr;
inline std::vector<std::barrier<>*> g_warp_bar;
inline float g_xchg[1024];
DEV u32 tid_x() { return ctx.tid; }
DEV u32 bid_x() { return ctx.bx; }
DEV u32 bid_y() { return ctx.by; }
DEV u32 bid_z() { return ctx.bz; }
DEV void blk_sync() { g_block_bar->arrive_and_wait(); }
#define sync blk_sync
DEV float shfl_xor(float v, int m) {
    int w = ctx.tid >> 5, l = ctx.tid & 31;
    g_xchg[ctx.tid] = v;
    g_warp_bar[w]->arrive_and_wait();
    float r = g_xchg[w * 32 + (l ^ m)];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
DEV float warp_sum(float v) { for (int m = 16; m > 0; m >>= 1) v += shfl_xor(v, m); return v; }
DEV float warp_max(float v) { for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, shfl_xor(v, m)); return v; }
inline int g_xchg_i[1024];
DEV int shfl_xor_i(int v, int m) {
    int w = ctx.tid >> 5, l = ctx.tid & 31;
    g_xchg_i[ctx.tid] = v;
    g_warp_bar[w]->arrive_and_wait();
    int r = g_xchg_i[w * 32 + (l ^ m)];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
typedef unsigned char u8;
DEV void pdl_entry() {}
#define LAUNCH_BOUNDS_MIN(n, m)
#define __HIP_MEMORY_SCOPE_WORKGROUP 0
inline int __hip_atomic_fetch_add(int* c, int v, int, int) { return __atomic_fetch_add(c, v, __ATOMIC_RELAXED); }
DEV float rcp(float x) { return 1.0f / x; }
DEV float sqrt_f(float x) { return sqrtf(x); }
DEV float fmax_f(float a, float b) { return fmaxf(a, b); }
DEV float exp_fast(float x) { return expf(x); }
DEV float silu_f(float x) { return x / (1.0f + expf(-x)); }
// What kernels-hip/mmq.hip and the headers it includes (mv_dot.h, mv_dot_b32.h, their
// gfx11 branches) use besides the above.
typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef int i32;
inline int g_ixchg[1024];
// ds_bpermute: lane l reads lane (addr / 4)'s value.
DEV int emu_bpermute(int addr, int v) {
    int w = ctx.tid >> 5;
    g_ixchg[ctx.tid] = v;
    g_warp_bar[w]->arrive_and_wait();
    int r = g_ixchg[w * 32 + ((addr >> 2) & 31)];
    g_warp_bar[w]->arrive_and_wait();
    return r;
}
#define __builtin_amdgcn_ds_bpermute(addr, v) emu_bpermute(addr, v)
// sudot4: c + sum of the 4 byte products, each operand signed or unsigned as flagged.
DEV int emu_sudot4(bool as, int a, bool bs, int b, int c) {
    for (int i = 0; i < 4; ++i) {
        int x = (a >> (8 * i)) & 0xff, y = (b >> (8 * i)) & 0xff;
        if (as && x > 127) x -= 256;
        if (bs && y > 127) y -= 256;
        c += x * y;
    }
    return c;
}
#define __builtin_amdgcn_sudot4(as, a, bs, b, c, clamp) emu_sudot4(as, a, bs, b, c)
DEV int dot4(int a, int b, int c) { return emu_sudot4(true, a, true, b, c); }
DEV float add_rn(float a, float b) { return a + b; }
DEV float fabs_f(float x) { return fabsf(x); }
DEV float h2f(u16 h) {
    u32 s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
DEV u32 ld_u32_a2(const u8* p) { const u16* q = (const u16*)p; return (u32)q[0] | ((u32)q[1] << 16); }
DEV u16 ld_u16(const u8* p) { return *(const u16*)p; }
DEV u32 ld_u32(const u8* p) { return *(const u32*)p; }
struct __attribute__((aligned(4))) block_q8_1 { u16 d; u16 s; i8 qs[32]; };
DEV float q8k_scale(const block_q8_1* even) { return __builtin_bit_cast(float, (u32)even[0].d | ((u32)even[1].d << 16)); }
DEV float q8k_bsum(const block_q8_1* b) { return (float)(short)b->s; }
// mma.sync m16n8k32 .s8 (mmq.hip's mma_s8_k32) by its fragment layout in the PTX ISA:
// lane (g, t) = (lane / 4, lane % 4); A regs 0-3: rows g, g + 8, g, g + 8 at k 4t .. 4t + 3
// (regs 0, 1) and 16 + 4t .. (regs 2, 3); B regs 0-1: column g at k 4t .. and 16 + 4t ..;
// C: rows g (0, 1) and g + 8 (2, 3) at columns 2t, 2t + 1. Byte i of a register is k + i.
#define LODE_EMU_MMA 1
inline u32 g_mma_a[1024][4], g_mma_b[1024][2];
DEV void mma_s8_k32(int* c, const u32* a, const u32* b) {
    const int w = ctx.tid >> 5, l = ctx.tid & 31;
    for (int i = 0; i < 4; ++i) g_mma_a[ctx.tid][i] = a[i];
    g_mma_b[ctx.tid][0] = b[0], g_mma_b[ctx.tid][1] = b[1];
    g_warp_bar[w]->arrive_and_wait();
    auto A = [&](int row, int k) { return (int)(signed char)(g_mma_a[w * 32 + (row % 8) * 4 + (k % 16) / 4][(row >= 8) + 2 * (k >= 16)] >> (8 * (k % 4))); };
    auto B = [&](int k, int col) { return (int)(signed char)(g_mma_b[w * 32 + col * 4 + (k % 16) / 4][k >= 16] >> (8 * (k % 4))); };
    for (int i = 0; i < 4; ++i) {
        const int row = (l >> 2) + (i >= 2 ? 8 : 0), col = 2 * (l & 3) + (i & 1);
        for (int k = 0; k < 32; ++k) c[i] += A(row, k) * B(k, col);
    }
    g_warp_bar[w]->arrive_and_wait();
}
// mma.sync m16n8k16 .s8: A regs 0-1 rows g, g + 8 at k 4t .. 4t + 3; B column g at k 4t ..
DEV void mma_s8_k16(int* c, const u32* a, u32 b) {
    const int w = ctx.tid >> 5, l = ctx.tid & 31;
    g_mma_a[ctx.tid][0] = a[0], g_mma_a[ctx.tid][1] = a[1], g_mma_b[ctx.tid][0] = b;
    g_warp_bar[w]->arrive_and_wait();
    auto A = [&](int row, int k) { return (int)(signed char)(g_mma_a[w * 32 + (row % 8) * 4 + k / 4][row >= 8] >> (8 * (k % 4))); };
    auto B = [&](int k, int col) { return (int)(signed char)(g_mma_b[w * 32 + col * 4 + k / 4][0] >> (8 * (k % 4))); };
    for (int i = 0; i < 4; ++i) {
        const int row = (l >> 2) + (i >= 2 ? 8 : 0), col = 2 * (l & 3) + (i & 1);
        for (int k = 0; k < 16; ++k) c[i] += A(row, k) * B(k, col);
    }
    g_warp_bar[w]->arrive_and_wait();
}

// What kvq_attn.hip uses beyond that (kvq_kernel_emulated.rs): the small integer types,
// f16 conversions (_Float16), the math and the q8_1 block store of the device header, and
// the AMD atomics and fences as host ones (blocks run one at a time here).
DEV u16 f2h(float f) { return __builtin_bit_cast(u16, (_Float16)f); }
DEV float exp2_fast(float x) { return exp2f(x); }
DEV float fma_f(float a, float b, float c) { return fmaf(a, b, c); }
DEV float rint_f(float x) { return rintf(x); }
DEV void q8_block_store(block_q8_1* b, float v) {
    const int lane = tid_x() & 31;
    const float amax = warp_max(fabs_f(v));
    const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
    const int c = (int)rint_f(v * id);
    const float qsum = warp_sum((float)c);
    b->qs[lane] = (i8)c;
    if (lane == 0) { b->d = f2h(d); b->s = f2h(d * qsum); }
}
#define __hip_atomic_fetch_add(p, v, order, scope) __atomic_fetch_add(p, v, order)
#define __HIP_MEMORY_SCOPE_AGENT 0
#define __builtin_amdgcn_fence(order, scope) __atomic_thread_fence(order)
// Runs f over a grid, block of nt threads (a multiple of 32).
inline void launch(int gx, int gy, int gz, int nt, std::function<void()> f) {
    for (int bz = 0; bz < gz; ++bz) for (int by = 0; by < gy; ++by) for (int bx = 0; bx < gx; ++bx) {
        std::barrier<> bb(nt); g_block_bar = &bb;
        std::vector<std::barrier<>*> wb; for (int w = 0; w < nt / 32; ++w) wb.push_back(new std::barrier<>(32));
        g_warp_bar = wb;
        std::vector<std::thread> ts;
        for (int t = 0; t < nt; ++t) ts.emplace_back([&, t] { ctx = Ctx{(u32)t, (u32)bx, (u32)by, (u32)bz}; f(); });
        for (auto& t : ts) t.join();
        for (auto* p : wb) delete p;
    }
}
