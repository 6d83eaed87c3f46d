//! `kernels-hip/gemm.hip`: the prefill GEMM on matrix cores (two or more tokens), plain
//! and with the gate/up GLU in the epilogue. Which matmuls take it, and with which token
//! tile, is `plan.rs`'s choice.
//!
//! The GEMM reads a weight in the layout `weights::layout::canonical` gives its type, the
//! same copy decode's matvec reads: the stored GGUF blocks, or row64 for Q4_K / Q6_K if the
//! layout policy says so. Whichever it is, there is one resident copy per weight; there is
//! no prefill-only layout and no dequantized copy (each 128-row x 64-element tile is
//! decoded into shared memory inside the kernel).
//!
//! Where a vendor BLAS opens, matmuls of `Tuning::blas_min_tokens` (16) tokens or more go
//! through `dequant.rs` instead (dequantize to a transient f16 slab + cuBLAS / hipBLAS: 3x
//! this GEMM on the H200); this GEMM then serves `--no-blas` or a machine without the
//! library.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, KernelSig, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

type R = Result<(), GpuError>;

kernel_args! {
    /// `gemm_<type>_n{64,16}(W, X, Y, M, N, K)`.
    pub struct Gemm { w: DevPtr, x: DevPtr, y: DevPtr, m: usize, n: usize, k: usize }
}
kernel_args! {
    /// `gemm_<type>_k64(W, X, P, M, N, K, per)`: split-K partial sums into P [splits, N, M].
    pub struct GemmSplit { w: DevPtr, x: DevPtr, p: DevPtr, m: usize, n: usize, k: usize, per: usize }
}
kernel_args! {
    /// `gemm_ksum(P, Y, nsplit, nm)`.
    pub struct KSum { p: DevPtr, y: DevPtr, nsplit: usize, nm: usize }
}
kernel_args! {
    /// `gemm_glu_<type>_n64(G, U, X, Y, M, N, K, act)`.
    pub struct GemmGlu { g: DevPtr, u: DevPtr, x: DevPtr, y: DevPtr, m: usize, n: usize, k: usize, gelu: bool }
}

/// The kernels of one (type, layout): 128 x 64 tiles, 128 x 16 tiles, paired 128 x 64.
#[derive(Clone, Copy)]
struct Set {
    ty: GgmlType,
    layout: Layout,
    n64: Kernel<Gemm>,
    n16: Kernel<Gemm>,
    glu: Kernel<GemmGlu>,
    k64: Kernel<GemmSplit>,
}

macro_rules! set {
    ($ty:ident, $layout:ident, $n:literal) => {
        Set {
            ty: GgmlType::$ty,
            layout: Layout::$layout,
            n64: Kernel::new(concat!("gemm_", $n, "_n64")),
            n16: Kernel::new(concat!("gemm_", $n, "_n16")),
            glu: Kernel::new(concat!("gemm_glu_", $n, "_n64")),
            k64: Kernel::new(concat!("gemm_", $n, "_k64")),
        }
    };
}

const SETS: [Set; 15] = [
    set!(Q4_0, Stored, "q4_0"),
    set!(Q4_1, Stored, "q4_1"),
    set!(Q5_0, Stored, "q5_0"),
    set!(Q5_1, Stored, "q5_1"),
    set!(Q8_0, Stored, "q8_0"),
    set!(Q4_K, Stored, "q4_K"),
    set!(Q5_K, Stored, "q5_K"),
    set!(Q6_K, Stored, "q6_K"),
    set!(Q4_K, Row64, "q4_K_r64"),
    set!(Q6_K, Row64, "q6_K_r64"),
    set!(Q2_K, Stored, "q2_K"),
    set!(Q3_K, Stored, "q3_K"),
    set!(IQ4_NL, Stored, "iq4_nl"),
    set!(IQ4_XS, Stored, "iq4_xs"),
    set!(MXFP4, Stored, "mxfp4"),
];

const fn sigs() -> [KernelSig; 61] {
    let mut out = [KSUM.sig(); 61];
    let mut i = 0;
    while i < SETS.len() {
        out[4 * i] = SETS[i].n64.sig();
        out[4 * i + 1] = SETS[i].n16.sig();
        out[4 * i + 2] = SETS[i].glu.sig();
        out[4 * i + 3] = SETS[i].k64.sig();
        i += 1;
    }
    out
}
const SIGS: [KernelSig; 61] = sigs();
const KSUM: Kernel<KSum> = Kernel::new("gemm_ksum");

kernel_args! {
    /// `gemm_moe_<type>_n16(offs, ntiles, tile_e, tile_s, n_exp, W, eb, X, Y, M, K)`.
    pub struct MoeGemm { offs: DevPtr, ntiles: DevPtr, tile_e: DevPtr, tile_s: DevPtr, n_exp: usize, w: DevPtr, eb: usize, x: DevPtr, y: DevPtr, m: usize, k: usize }
}
kernel_args! {
    /// `gemm_moe_glu_<type>_n16(offs, ntiles, tile_e, tile_s, n_exp, G, U, eb, X, Y, M, K, act)`.
    pub struct MoeGemmGlu { offs: DevPtr, ntiles: DevPtr, tile_e: DevPtr, tile_s: DevPtr, n_exp: usize, g: DevPtr, u: DevPtr, eb: usize, x: DevPtr, y: DevPtr, m: usize, k: usize, gelu: bool }
}

/// The grouped (mixture-of-experts) kernels of one type, stored layout: plain and paired,
/// 128 x 16 tiles of one expert's pairs.
const MOE: [(GgmlType, Kernel<MoeGemm>, Kernel<MoeGemmGlu>); 13] = {
    macro_rules! m {
        ($ty:ident, $n:literal) => {
            (GgmlType::$ty, Kernel::new(concat!("gemm_moe_", $n, "_n16")), Kernel::new(concat!("gemm_moe_glu_", $n, "_n16")))
        };
    }
    [
        m!(Q4_0, "q4_0"), m!(Q4_1, "q4_1"), m!(Q5_0, "q5_0"), m!(Q5_1, "q5_1"), m!(Q8_0, "q8_0"),
        m!(Q4_K, "q4_K"), m!(Q5_K, "q5_K"), m!(Q6_K, "q6_K"), m!(Q2_K, "q2_K"), m!(Q3_K, "q3_K"),
        m!(IQ4_NL, "iq4_nl"), m!(IQ4_XS, "iq4_xs"), m!(MXFP4, "mxfp4"),
    ]
};
const fn moe_sigs() -> [KernelSig; 26] {
    let mut out = [SETS[0].n64.sig(); 26];
    let mut i = 0;
    while i < MOE.len() {
        out[2 * i] = MOE[i].1.sig();
        out[2 * i + 1] = MOE[i].2.sig();
        i += 1;
    }
    out
}
const MOE_SIGS: [KernelSig; 26] = moe_sigs();

pub const FAMILY: Family = Family { name: "gemm", source: include_str!("../../../../../kernels-hip/gemm.hip"), kernels: &[&SIGS, &MOE_SIGS] };

/// Pairs per tile of the grouped GEMM (`moe::sort`'s tile for it).
pub const MOE_TILE: usize = 16;

/// Whether the grouped GEMM reads experts of `ty` with rows of `k` (stored layout).
pub fn moe_supports(ty: GgmlType, k: usize) -> bool {
    MOE.iter().any(|m| m.0 == ty) && k > 0 && k % ty.block_elems() == 0
}

/// Every expert's pairs in one launch: per tile of up to 16 pairs of one expert (`r`'s
/// tiles, sorted with [`MOE_TILE`]), y = W[e] · x over the grouped rows; with `up`, the
/// paired form y = act(G[e]·x) · U[e]·x (GELU-tanh when `gelu`, else SiLU). w (and up):
/// the whole 3-D tensor, `eb` bytes per expert of `m` rows of `k`; x: [n_pairs, k] f32 and
/// y: [n_pairs, m] f32, both in grouped order.
#[allow(clippy::too_many_arguments)]
pub fn gemm_moe(d: &dyn Launch, r: &super::moe::RouteBufs, n_exp: usize, w: DevPtr, up: Option<DevPtr>, ty: GgmlType, eb: usize, m: usize, k: usize, x: DevPtr, y: DevPtr, n_pairs: usize, gelu: bool) -> R {
    let (_, plain, glu) = MOE.iter().find(|s| s.0 == ty).filter(|_| moe_supports(ty, k)).ok_or_else(|| GpuError::Unsupported(format!("grouped gemm of {ty} experts with rows of {k}")))?;
    if m == 0 || n_pairs == 0 {
        return Ok(());
    }
    let grid = [m.div_ceil(TILE_M) as u32, (n_pairs.div_ceil(MOE_TILE) + n_exp.min(n_pairs)) as u32, 1];
    let (offs, ntiles, tile_e, tile_s) = (r.offs, r.ntiles, r.tile_e, r.tile_s);
    match up {
        None => plain.launch(d, grid, [256, 1, 1], &MoeGemm { offs, ntiles, tile_e, tile_s, n_exp, w, eb, x, y, m, k }),
        Some(u) => glu.launch(d, grid, [256, 1, 1], &MoeGemmGlu { offs, ntiles, tile_e, tile_s, n_exp, g: w, u, eb, x, y, m, k, gelu }),
    }
}

/// The (type, layout) pairs the GEMM reads, in the order of `dequant.rs`'s table too.
pub fn type_layouts() -> impl Iterator<Item = (GgmlType, Layout)> {
    SETS.iter().map(|s| (s.ty, s.layout))
}

fn set(ty: GgmlType, layout: Layout) -> Option<&'static Set> {
    SETS.iter().find(|s| s.ty == ty && s.layout == layout)
}

/// Whether the GEMM reads `ty` weights held in `layout`.
pub fn gemm_supports(ty: GgmlType, layout: Layout) -> bool {
    set(ty, layout).is_some()
}

/// Output rows per block.
const TILE_M: usize = 128;

fn check(op: &str, ty: GgmlType, layout: Layout, k: usize) -> Result<&'static Set, GpuError> {
    let s = set(ty, layout).ok_or_else(|| GpuError::Unsupported(format!("{op} of {ty} weights in the {} layout", layout.name(ty))))?;
    let qk = ty.block_elems();
    if k == 0 || k % qk != 0 {
        return Err(GpuError::Unsupported(format!("{op}: k = {k} is not whole {ty} blocks of {qk}")));
    }
    Ok(s)
}

/// y[t][r] = Σ_k W[r][k]·x[t][k] with the token tile `tile` (16 or 64: `plan::gemm_tile`).
/// w: [m, k] of `ty` in `layout`; x: [n, k] f32; y: [n, m] f32.
#[allow(clippy::too_many_arguments)]
pub fn gemm(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize, tile: usize) -> R {
    let s = check("gemm", ty, layout, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (kernel, bn) = if tile == 16 { (s.n16, 16) } else { (s.n64, 64) };
    let grid = [m.div_ceil(TILE_M) as u32, n.div_ceil(bn) as u32, 1];
    kernel.launch(d, grid, [2 * TILE_M as u32, 1, 1], &Gemm { w, x, y, m, n, k })
}

/// `gemm` for a decode batch (n ≤ 64 tokens, one 64-token tile: each weight read once)
/// with its K steps split over `splits` blocks per row tile, `per` steps each
/// (`plan::small_batch`): partial sums into `part` ([splits, n, m] f32, at least
/// [`split_bytes`]), then summed into y in a fixed order.
#[allow(clippy::too_many_arguments)]
pub fn gemm_split(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, part: DevPtr, y: DevPtr, n: usize, splits: usize, per: usize) -> R {
    let s = check("gemm_split", ty, layout, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if n > 64 || splits == 0 || per == 0 {
        return Err(GpuError::Unsupported(format!("gemm_split of {n} tokens in {splits} splits of {per} steps (1–64 tokens)")));
    }
    let grid = [m.div_ceil(TILE_M) as u32, 1, splits as u32];
    s.k64.launch(d, grid, [2 * TILE_M as u32, 1, 1], &GemmSplit { w, x, p: part, m, n, k, per })?;
    let nm = n * m;
    KSUM.launch(d, [nm.div_ceil(256) as u32, 1, 1], [256, 1, 1], &KSum { p: part, y, nsplit: splits, nm })
}

/// Bytes of [`gemm_split`]'s partial sums.
pub fn split_bytes(m: usize, n: usize, splits: usize) -> usize {
    splits * n * m * 4
}

/// K steps of the GEMM over rows of `k` (64 elements each).
pub fn k_steps(k: usize) -> usize {
    k.div_ceil(64)
}

/// Row tiles of the GEMM over `m` rows.
pub fn row_tiles(m: usize) -> usize {
    m.div_ceil(TILE_M)
}

/// Paired gate/up with the GLU in the epilogue: y[t][r] = act(G·x_t)[r] · (U·x_t)[r],
/// act = GELU-tanh when `gelu`, else SiLU. g, u: [m, k] of `ty` in `layout`; x: [n, k] f32;
/// y: [n, m] f32.
#[allow(clippy::too_many_arguments)]
pub fn gemm_glu(d: &dyn Launch, g: DevPtr, u: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize, gelu: bool) -> R {
    let s = check("gemm_glu", ty, layout, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let grid = [m.div_ceil(TILE_M) as u32, n.div_ceil(64) as u32, 1];
    s.glu.launch(d, grid, [256, 1, 1], &GemmGlu { g, u, x, y, m, n, k, gelu })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_its_three_kernels() {
        for s in &SETS {
            let t = s.ty.name().to_lowercase();
            for n in [s.n64.name, s.n16.name, s.glu.name, s.k64.name] {
                assert!(n.to_lowercase().contains(&t), "{}: {n}", s.ty);
                assert_eq!(n.contains("r64"), s.layout == Layout::Row64, "{n}");
            }
        }
        assert!(gemm_supports(GgmlType::Q4_K, Layout::Row64));
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::MXFP4] {
            assert!(gemm_supports(ty, Layout::Stored), "{ty}");
        }
        assert!(!gemm_supports(GgmlType::Q8_0, Layout::Row64));
        assert!(!gemm_supports(GgmlType::F16, Layout::Stored));
    }
}
