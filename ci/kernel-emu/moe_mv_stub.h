// Stand-ins for the expert matvecs' per-type dots (mv_dot.h and its siblings), so that
// kernels-hip/moe.hip compiles on the host: moe_check.cpp runs its routing, activation and
// weighted-sum kernels only, never the matvecs these would serve.
#pragma once
template <int A, int B = 0, typename... T> DEV void mv_b32(T...) {}
template <bool A, int B, typename... T> DEV void mv_nl(T...) {}
#define MOE_EMU_STUB(N) template <int B, typename... T> DEV void N(T...) {}
MOE_EMU_STUB(mv_q4_K) MOE_EMU_STUB(mv_q5_K) MOE_EMU_STUB(mv_q6_K) MOE_EMU_STUB(mv_q2_K) MOE_EMU_STUB(mv_q3_K)
MOE_EMU_STUB(mv_iq4_xs) MOE_EMU_STUB(mv_iq3_s) MOE_EMU_STUB(mv_iq3_xxs) MOE_EMU_STUB(mv_iq2_xxs) MOE_EMU_STUB(mv_iq2_xs)
MOE_EMU_STUB(mv_iq2_s) MOE_EMU_STUB(mv_iq1_s) MOE_EMU_STUB(mv_iq1_m) MOE_EMU_STUB(store)
