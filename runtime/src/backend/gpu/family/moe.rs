//! `kernels-hip/moe.hip`: mixture-of-experts on the device — the router's top-k
//! (`moe_route`, with gpt-oss's router bias and softmax-weight gating), the (token, slot)
//! pairs grouped by expert (`moe_sort`, `moe_gather`), expert-indexed matvecs over the one
//! copy of each 3-D expert tensor (`moe_mv_n1` per pair, `moe_mv8_<type>` per tile of up
//! to 8 pairs of one expert), gpt-oss's biased `swiglu_oai` (`moe_swiglu_oai`) and the
//! weighted sum (`moe_wsum`, with the down bias).
//!
//! The index buffers are `i32` arrays the caller carves from its scratch ([`RouteBufs`]).

use super::matvec::mv_type_code;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, KernelSig, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

/// The most experts the kernels take (moe.hip's `MOE_MAX_EXPERTS`).
pub const MAX_EXPERTS: usize = 1024;
/// Pairs per tile of the grouped matvecs (moe.hip's `MOE_TILE`).
pub const TILE: usize = 8;

kernel_args! {
    /// `moe_route(logits, bias, ids, wts, n_tok, n_exp, k, norm, weight)`.
    pub struct Route { logits: DevPtr, bias: Option<DevPtr>, ids: DevPtr, wts: DevPtr, n_tok: usize, n_exp: usize, k: usize, norm: bool, weight: bool }
}
kernel_args! {
    /// `moe_sort(ids, perm, pos, offs, ntiles, tile_e, tile_s, n_pairs, n_exp, tile)`.
    pub struct Sort { ids: DevPtr, perm: DevPtr, pos: DevPtr, offs: DevPtr, ntiles: DevPtr, tile_e: DevPtr, tile_s: DevPtr, n_pairs: usize, n_exp: usize, tile: usize }
}
kernel_args! {
    /// `moe_gather(src, perm, dst, words, div)`.
    pub struct Gather { src: DevPtr, perm: DevPtr, dst: DevPtr, words: usize, div: usize }
}
kernel_args! {
    /// `moe_wsum(y, pos, wts, ids, bias, out, n_exp, k, n)`.
    pub struct Wsum { y: DevPtr, pos: Option<DevPtr>, wts: DevPtr, ids: DevPtr, bias: Option<DevPtr>, out: DevPtr, n_exp: usize, k: usize, n: usize }
}
kernel_args! {
    /// `moe_swiglu_oai(gate, up, ids, perm, bg, bu, n_exp, f)`.
    pub struct SwigluOai { gate: DevPtr, up: DevPtr, ids: DevPtr, perm: Option<DevPtr>, bg: Option<DevPtr>, bu: Option<DevPtr>, n_exp: usize, f: usize }
}
kernel_args! {
    /// `moe_mv_n1(ids, n_exp, k, xdiv, W0, eb0, ty0, x0, y0, rows0, W1, …, rows1)`.
    pub struct MvN1 {
        ids: DevPtr, n_exp: usize, k: usize, xdiv: usize,
        w0: DevPtr, eb0: usize, ty0: i32, x0: DevPtr, y0: DevPtr, rows0: usize,
        w1: DevPtr, eb1: usize, ty1: i32, x1: DevPtr, y1: DevPtr, rows1: usize,
    }
}
kernel_args! {
    /// `moe_mv8_<type>(offs, ntiles, tile_e, tile_s, n_exp, k, x, W0, eb0, y0, rows0, W1, eb1, y1, rows1)`.
    pub struct Mv8 {
        offs: DevPtr, ntiles: DevPtr, tile_e: DevPtr, tile_s: DevPtr, n_exp: usize, k: usize, x: DevPtr,
        w0: DevPtr, eb0: usize, y0: DevPtr, rows0: usize,
        w1: DevPtr, eb1: usize, y1: DevPtr, rows1: usize,
    }
}

const ROUTE: Kernel<Route> = Kernel::new("moe_route");
const SORT: Kernel<Sort> = Kernel::new("moe_sort");
const GATHER: Kernel<Gather> = Kernel::new("moe_gather");
const WSUM: Kernel<Wsum> = Kernel::new("moe_wsum");
const SWIGLU_OAI: Kernel<SwigluOai> = Kernel::new("moe_swiglu_oai");
const MV_N1: Kernel<MvN1> = Kernel::new("moe_mv_n1");

const N_MV8: usize = 20;
const MV8: [(GgmlType, Kernel<Mv8>); N_MV8] = [
    (GgmlType::Q4_K, Kernel::new("moe_mv8_q4_K")),
    (GgmlType::Q5_K, Kernel::new("moe_mv8_q5_K")),
    (GgmlType::Q6_K, Kernel::new("moe_mv8_q6_K")),
    (GgmlType::Q2_K, Kernel::new("moe_mv8_q2_K")),
    (GgmlType::Q3_K, Kernel::new("moe_mv8_q3_K")),
    (GgmlType::IQ4_XS, Kernel::new("moe_mv8_iq4_xs")),
    (GgmlType::IQ3_S, Kernel::new("moe_mv8_iq3_s")),
    (GgmlType::IQ3_XXS, Kernel::new("moe_mv8_iq3_xxs")),
    (GgmlType::IQ2_XXS, Kernel::new("moe_mv8_iq2_xxs")),
    (GgmlType::IQ2_XS, Kernel::new("moe_mv8_iq2_xs")),
    (GgmlType::IQ2_S, Kernel::new("moe_mv8_iq2_s")),
    (GgmlType::IQ1_S, Kernel::new("moe_mv8_iq1_s")),
    (GgmlType::IQ1_M, Kernel::new("moe_mv8_iq1_m")),
    (GgmlType::Q4_0, Kernel::new("moe_mv8_q4_0")),
    (GgmlType::Q4_1, Kernel::new("moe_mv8_q4_1")),
    (GgmlType::Q5_0, Kernel::new("moe_mv8_q5_0")),
    (GgmlType::Q5_1, Kernel::new("moe_mv8_q5_1")),
    (GgmlType::Q8_0, Kernel::new("moe_mv8_q8_0")),
    (GgmlType::IQ4_NL, Kernel::new("moe_mv8_iq4_nl")),
    (GgmlType::MXFP4, Kernel::new("moe_mv8_mxfp4")),
];

const fn mv8_sigs() -> [KernelSig; N_MV8] {
    let mut out = [ROUTE.sig(); N_MV8];
    let mut i = 0;
    while i < N_MV8 {
        out[i] = MV8[i].1.sig();
        i += 1;
    }
    out
}
const MV8_SIGS: [KernelSig; N_MV8] = mv8_sigs();

pub const FAMILY: Family = Family {
    name: "moe",
    source: include_str!("../../../../../kernels-hip/moe.hip"),
    kernels: &[&[ROUTE.sig(), SORT.sig(), GATHER.sig(), WSUM.sig(), SWIGLU_OAI.sig(), MV_N1.sig()], &MV8_SIGS],
};

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

/// True when the expert matvecs take expert matrices of `ty` with rows of `k`.
pub fn supports(ty: GgmlType, k: usize) -> bool {
    mv_type_code(ty).is_some() && MV8.iter().any(|m| m.0 == ty) && k % ty.block_elems() == 0 && k % 32 == 0
}

/// The routing state of one chunk: `i32` arrays in device memory.
/// ids, perm, pos: [n_pairs]; offs: [n_exp + 1]; ntiles: [1]; tile_e, tile_s: [max tiles].
#[derive(Clone, Copy, Debug)]
pub struct RouteBufs {
    pub ids: DevPtr,
    pub wts: DevPtr,
    pub perm: DevPtr,
    pub pos: DevPtr,
    pub offs: DevPtr,
    pub ntiles: DevPtr,
    pub tile_e: DevPtr,
    pub tile_s: DevPtr,
}

/// The most tiles `n_pairs` pairs over `n_exp` experts can make.
pub fn max_tiles(n_pairs: usize, n_exp: usize) -> usize {
    n_pairs.div_ceil(TILE) + n_exp.min(n_pairs)
}

impl RouteBufs {
    /// The arrays laid out from `base` (at least `backend::moe::route_len` words) for
    /// `n_pairs` pairs.
    pub fn carve(base: DevPtr, n_pairs: usize, n_exp: usize) -> RouteBufs {
        let w = |i: usize| base + 4 * i as u64;
        let t = max_tiles(n_pairs, n_exp);
        let p = n_pairs;
        RouteBufs {
            ids: w(0),
            wts: w(p),
            perm: w(2 * p),
            pos: w(3 * p),
            offs: w(4 * p),
            ntiles: w(4 * p + n_exp + 1),
            tile_e: w(4 * p + n_exp + 2),
            tile_s: w(4 * p + n_exp + 2 + t),
        }
    }
}

fn check_experts(n_exp: usize, k_used: usize) -> R {
    if n_exp == 0 || n_exp > MAX_EXPERTS || k_used == 0 || k_used > n_exp || k_used > 32 {
        return Err(unsupported(format!("moe: {k_used} of {n_exp} experts (at most {MAX_EXPERTS}, 32 used)")));
    }
    Ok(())
}

/// How [`route`] weighs the selected experts.
#[derive(Clone, Copy, Debug)]
pub struct Gate {
    /// The router's bias (`[n_exp]` f32), added to every logit row.
    pub bias: Option<DevPtr>,
    /// A softmax over the k selected logits (gpt-oss), not over all of them (qwen3moe).
    pub weight: bool,
    /// The selected weights divided by their sum.
    pub norm: bool,
}

/// Top-k routing of `n_tok` rows of router logits into `r.ids` / `r.wts`.
pub fn route(d: &dyn Launch, logits: DevPtr, r: &RouteBufs, n_tok: usize, n_exp: usize, k: usize, g: Gate) -> R {
    check_experts(n_exp, k)?;
    let args = Route { logits, bias: g.bias, ids: r.ids, wts: r.wts, n_tok, n_exp, k, norm: g.norm, weight: g.weight };
    ROUTE.launch(d, [n_tok.div_ceil(4) as u32, 1, 1], [128, 1, 1], &args)
}

/// Groups the `n_pairs` routed pairs by expert (perm, pos, offs) in tiles of up to `tile`
/// pairs of one expert ([`TILE`] for the grouped matvecs, 16 for the grouped GEMM; at
/// least [`TILE`], which the buffers are sized for).
pub fn sort(d: &dyn Launch, r: &RouteBufs, n_pairs: usize, n_exp: usize, tile: usize) -> R {
    check_experts(n_exp, 1)?;
    if tile < TILE {
        return Err(unsupported(format!("moe_sort: tiles of {tile} pairs (at least {TILE})")));
    }
    let args = Sort { ids: r.ids, perm: r.perm, pos: r.pos, offs: r.offs, ntiles: r.ntiles, tile_e: r.tile_e, tile_s: r.tile_s, n_pairs, n_exp, tile };
    SORT.launch(d, [1, 1, 1], [1024, 1, 1], &args)
}

/// dst row j = src row perm[j] / div, rows of `row_bytes` (a multiple of 4), `n_pairs` rows.
pub fn gather(d: &dyn Launch, src: DevPtr, r: &RouteBufs, dst: DevPtr, row_bytes: usize, div: usize, n_pairs: usize) -> R {
    if row_bytes % 4 != 0 || div == 0 {
        return Err(unsupported(format!("moe_gather: rows of {row_bytes} bytes")));
    }
    if n_pairs == 0 {
        return Ok(());
    }
    GATHER.launch(d, [n_pairs as u32, 1, 1], [128, 1, 1], &Gather { src, perm: r.perm, dst, words: row_bytes / 4, div })
}

/// out[t] = Σ_s wts[t k + s] · (y[pos(t k + s)] + bias[ids[t k + s]]) for `n_tok` rows of
/// `n`; `grouped`: y is in grouped order (read through `pos`), else in pair order; `bias`:
/// `[n_exp, n]` f32 rows, one per expert (gpt-oss's down bias).
#[allow(clippy::too_many_arguments)]
pub fn wsum(d: &dyn Launch, y: DevPtr, r: &RouteBufs, grouped: bool, bias: Option<DevPtr>, out: DevPtr, n_tok: usize, n_exp: usize, k: usize, n: usize) -> R {
    if n_tok == 0 || n == 0 {
        return Ok(());
    }
    let args = Wsum { y, pos: grouped.then_some(r.pos), wts: r.wts, ids: r.ids, bias, out, n_exp, k, n };
    WSUM.launch(d, [n.div_ceil(256) as u32, n_tok as u32, 1], [256, 1, 1], &args)
}

/// gpt-oss's expert activation in place over `n_rows` gate rows of `f` (and the up rows
/// beside them): each row's expert's gate/up bias rows added (`bias`: `[n_exp, f]` f32
/// each), then `swiglu_oai`. `grouped`: the rows are in grouped order (their pair through
/// `r.perm`), else in pair order.
#[allow(clippy::too_many_arguments)]
pub fn swiglu_oai(d: &dyn Launch, gate: DevPtr, up: DevPtr, r: &RouteBufs, grouped: bool, bias: Option<(DevPtr, DevPtr)>, n_exp: usize, f: usize, n_rows: usize) -> R {
    if n_rows == 0 || f == 0 {
        return Ok(());
    }
    let args = SwigluOai { gate, up, ids: r.ids, perm: grouped.then_some(r.perm), bg: bias.map(|b| b.0), bu: bias.map(|b| b.1), n_exp, f };
    SWIGLU_OAI.launch(d, [f.div_ceil(256) as u32, n_rows as u32, 1], [256, 1, 1], &args)
}

/// One expert-tensor segment of an expert matvec: the whole 3-D tensor (`w`, type `ty`,
/// `rows` rows of each expert, `ebytes` bytes per expert), the activations in its type's
/// form (`x`) and the output (`y`).
#[derive(Clone, Copy, Debug)]
pub struct ExpSeg {
    pub w: DevPtr,
    pub ty: GgmlType,
    pub rows: usize,
    pub ebytes: usize,
    pub x: DevPtr,
    pub y: DevPtr,
}

/// Per pair (`n_pairs`), the rows of one or two expert tensors with rows of `k`: y_s[p] =
/// W_s[ids[p]] · x_s[p / xdiv].
pub fn mv_pairs(d: &dyn Launch, r: &RouteBufs, n_exp: usize, k: usize, xdiv: usize, n_pairs: usize, segs: &[ExpSeg]) -> R {
    if segs.is_empty() || segs.len() > 2 || xdiv == 0 {
        return Err(unsupported(format!("moe_mv_n1: {} segments", segs.len())));
    }
    let mut s = [(0u64, 0usize, -1i32, 0u64, 0u64, 0usize); 2];
    let mut blocks = 0;
    for (slot, g) in s.iter_mut().zip(segs) {
        if !supports(g.ty, k) {
            return Err(unsupported(format!("moe_mv_n1: {} experts with rows of {k}", g.ty)));
        }
        blocks += g.rows.div_ceil(4);
        *slot = (g.w, g.ebytes, mv_type_code(g.ty).unwrap_or(-1), g.x, g.y, g.rows);
    }
    if n_pairs == 0 || blocks == 0 {
        return Ok(());
    }
    let args = MvN1 {
        ids: r.ids, n_exp, k, xdiv,
        w0: s[0].0, eb0: s[0].1, ty0: s[0].2, x0: s[0].3, y0: s[0].4, rows0: s[0].5,
        w1: s[1].0, eb1: s[1].1, ty1: s[1].2, x1: s[1].3, y1: s[1].4, rows1: s[1].5,
    };
    MV_N1.launch(d, [blocks as u32, n_pairs as u32, 1], [128, 1, 1], &args)
}

/// Per tile of grouped pairs, the rows of one or two expert tensors of the same type over
/// the grouped activations `x` (the segments' own `x` is ignored): y_s in grouped order.
pub fn mv_grouped(d: &dyn Launch, r: &RouteBufs, n_exp: usize, k: usize, x: DevPtr, n_pairs: usize, segs: &[ExpSeg]) -> R {
    let ty = segs.first().map(|g| g.ty);
    if segs.is_empty() || segs.len() > 2 || segs.iter().any(|g| Some(g.ty) != ty) {
        return Err(unsupported(format!("moe_mv8: {} segments of one type", segs.len())));
    }
    let ty = segs[0].ty;
    let kernel = MV8.iter().find(|m| m.0 == ty).map(|m| m.1).filter(|_| supports(ty, k));
    let kernel = kernel.ok_or_else(|| unsupported(format!("moe_mv8: {ty} experts with rows of {k}")))?;
    let b = |g: Option<&ExpSeg>| g.map(|g| (g.w, g.ebytes, g.y, g.rows)).unwrap_or((0, 0, 0, 0));
    let (s0, s1) = (b(segs.first()), b(segs.get(1)));
    let blocks = s0.3.div_ceil(4) + s1.3.div_ceil(4);
    if n_pairs == 0 || blocks == 0 {
        return Ok(());
    }
    let args = Mv8 {
        offs: r.offs, ntiles: r.ntiles, tile_e: r.tile_e, tile_s: r.tile_s, n_exp, k, x,
        w0: s0.0, eb0: s0.1, y0: s0.2, rows0: s0.3,
        w1: s1.0, eb1: s1.1, y1: s1.2, rows1: s1.3,
    };
    kernel.launch(d, [blocks as u32, max_tiles(n_pairs, n_exp) as u32, 1], [128, 1, 1], &args)
}
