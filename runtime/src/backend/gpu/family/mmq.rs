//! `kernels-hip/mmq.hip`: the small-batch integer GEMM (issue 26): a decode batch of
//! 2–64 rows times a quantized weight, the activations in the int8 blocks the matvecs read
//! (`quantize.rs`: the K form for the K-quants, q8_1 for the 32-element types), every
//! weight read once for all rows, int8 dot products, scales per block, f32 out. Whether a
//! matmul takes it, and its K split, is `plan.rs`'s choice (`Matmul::Mmq`).
//!
//! Types: Q4_K, Q5_K, Q6_K, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 in the stored layout (dp4a / sdot4;
//! Q4_K and Q6_K also on int8 matrix cores, `mmq_mma_*`, NVIDIA sm_80+); every other type
//! (and Row64) falls back to what the plan picks without it.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, KernelSig, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

type R = Result<(), GpuError>;

kernel_args! {
    /// `mmq_<type>_c{8,16,32,64}(W, X, Y, M, K, ncols, per)`: Y (or split z's partial at
    /// Y + z·ncols·M) = W · X over K steps [z·per, (z+1)·per).
    pub struct Mmq { w: DevPtr, x: DevPtr, y: DevPtr, m: usize, k: usize, ncols: usize, per: usize }
}
kernel_args! {
    /// `mmq_ksum(P, Y, nsplit, nm)`.
    pub struct MmqSum { p: DevPtr, y: DevPtr, nsplit: usize, nm: usize }
}

/// Column capacities: the kernel with the smallest that holds the batch runs.
pub const CAPS: [usize; 4] = [8, 16, 32, 64];
/// The most columns one launch takes.
pub const MAX_COLS: usize = 64;
/// K elements per step.
pub const STEP: usize = 256;
/// Threads per block.
const BLOCK: u32 = 256;

/// (type, rows per block, kernels by capacity, the int8 matrix-core kernels by capacity
/// where the type has them: same block and rows; on AMD and before sm_80 they run the
/// dp4a body).
struct Set {
    ty: GgmlType,
    rows: usize,
    k: [Kernel<Mmq>; 4],
    mma: Option<[Kernel<Mmq>; 4]>,
}

macro_rules! four {
    ($p:literal, $n:literal) => {
        [
            Kernel::new(concat!($p, $n, "_c8")),
            Kernel::new(concat!($p, $n, "_c16")),
            Kernel::new(concat!($p, $n, "_c32")),
            Kernel::new(concat!($p, $n, "_c64")),
        ]
    };
}
macro_rules! set {
    ($ty:ident, $rows:literal, $n:literal) => {
        Set { ty: GgmlType::$ty, rows: $rows, k: four!("mmq_", $n), mma: None }
    };
    ($ty:ident, $rows:literal, $n:literal, mma) => {
        Set { ty: GgmlType::$ty, rows: $rows, k: four!("mmq_", $n), mma: Some(four!("mmq_mma_", $n)) }
    };
}

const SETS: [Set; 8] = [
    set!(Q4_K, 64, "q4_K", mma),
    set!(Q5_K, 32, "q5_K"),
    set!(Q6_K, 32, "q6_K", mma),
    set!(Q4_0, 32, "q4_0"),
    set!(Q4_1, 32, "q4_1"),
    set!(Q5_0, 32, "q5_0"),
    set!(Q5_1, 32, "q5_1"),
    set!(Q8_0, 32, "q8_0"),
];
const KSUM: Kernel<MmqSum> = Kernel::new("mmq_ksum");

const N_SIGS: usize = 4 * SETS.len() + 1 + 4 * N_MMA;
const N_MMA: usize = 2;
const fn sigs() -> [KernelSig; N_SIGS] {
    let mut out = [KSUM.sig(); N_SIGS];
    let (mut i, mut n) = (0, 4 * SETS.len() + 1);
    while i < SETS.len() {
        let mut j = 0;
        while j < 4 {
            out[4 * i + j] = SETS[i].k[j].sig();
            if let Some(m) = &SETS[i].mma {
                out[n + j] = m[j].sig();
            }
            j += 1;
        }
        if SETS[i].mma.is_some() {
            n += 4;
        }
        i += 1;
    }
    assert!(n == N_SIGS, "N_MMA counts the sets with matrix-core kernels");
    out
}
const SIGS: [KernelSig; N_SIGS] = sigs();

pub const FAMILY: Family = Family { name: "mmq", source: include_str!("../../../../../kernels-hip/mmq.hip"), kernels: &[&SIGS] };

fn set(ty: GgmlType) -> Option<&'static Set> {
    SETS.iter().find(|s| s.ty == ty)
}

/// Whether the kernels take `ty` weights in `layout` with rows of `k`: the K-quants whole
/// super-blocks, the 32-element types whole blocks.
pub fn supports(ty: GgmlType, layout: Layout, k: usize) -> bool {
    layout == Layout::Stored && set(ty).is_some() && k > 0 && k % ty.block_elems() == 0
}

/// Rows per block of `ty`'s kernels (0: not a type they take).
pub fn rows_per_block(ty: GgmlType) -> usize {
    set(ty).map(|s| s.rows).unwrap_or(0)
}

/// Blocks over `m` rows of `ty`.
pub fn row_blocks(ty: GgmlType, m: usize) -> usize {
    m.div_ceil(rows_per_block(ty).max(1))
}

/// K steps over rows of `k`.
pub fn k_steps(k: usize) -> usize {
    k.div_ceil(STEP)
}

/// Whether `ty` has the int8 matrix-core kernels.
pub fn has_mma(ty: GgmlType) -> bool {
    set(ty).is_some_and(|s| s.mma.is_some())
}

/// The kernel for `ncols` columns (1..=64) of `ty`: the matrix-core one when `mma` and the
/// type has it.
pub fn kernel_name(ty: GgmlType, ncols: usize, mma: bool) -> Option<&'static str> {
    let s = set(ty)?;
    let i = CAPS.iter().position(|&c| ncols <= c)?;
    Some(s.mma.filter(|_| mma).unwrap_or(s.k)[i].name)
}

/// Bytes of the partial sums of `splits` splits.
pub fn split_bytes(m: usize, ncols: usize, splits: usize) -> usize {
    if splits > 1 {
        splits * ncols * m * 4
    } else {
        0
    }
}

/// y[c][r] = Σ_k W[r][k]·x[c][k] for c < ncols (1..=64): w [m, k] of `ty` (stored), x
/// [ncols, k/32] activation blocks of `quantize::act_fmt(ty)`, y [ncols, m] f32. K steps
/// split over `splits` (≥ 1) ranges of `per` steps; with more than one, the partial sums
/// go to `part` (at least [`split_bytes`]) and `mmq_ksum` adds them into y in order.
/// `mma`: the int8 matrix-core kernels where the type has them ([`has_mma`]).
#[allow(clippy::too_many_arguments)]
pub fn mmq(d: &dyn Launch, w: DevPtr, ty: GgmlType, m: usize, k: usize, x: DevPtr, y: DevPtr, ncols: usize, splits: usize, per: usize, part: DevPtr, mma: bool) -> R {
    let s = set(ty).filter(|_| supports(ty, Layout::Stored, k)).ok_or_else(|| GpuError::Unsupported(format!("mmq of {ty} weights with rows of {k}")))?;
    if m == 0 || ncols == 0 {
        return Ok(());
    }
    let steps = k_steps(k);
    if ncols > MAX_COLS || splits == 0 || per == 0 || (splits - 1) * per >= steps {
        return Err(GpuError::Unsupported(format!("mmq of {ncols} columns in {splits} splits of {per} of {steps} K steps (1–64 columns)")));
    }
    let i = CAPS.iter().position(|&c| ncols <= c).unwrap_or(CAPS.len() - 1);
    let grid = [m.div_ceil(s.rows) as u32, 1, splits as u32];
    let out = if splits > 1 { part } else { y };
    s.mma.filter(|_| mma).unwrap_or(s.k)[i].launch(d, grid, [BLOCK, 1, 1], &Mmq { w, x, y: out, m, k, ncols, per })?;
    if splits > 1 {
        let nm = ncols * m;
        KSUM.launch(d, [nm.div_ceil(256) as u32, 1, 1], [256, 1, 1], &MmqSum { p: part, y, nsplit: splits, nm })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_kernel_per_capacity() {
        for s in &SETS {
            let t = s.ty.name().to_lowercase();
            for (kn, cap) in s.k.iter().zip(CAPS) {
                assert!(kn.name.to_lowercase().contains(&t) && kn.name.ends_with(&format!("_c{cap}")), "{}: {}", s.ty, kn.name);
            }
        }
        assert_eq!(kernel_name(GgmlType::Q4_K, 2, false), Some("mmq_q4_K_c8"));
        assert_eq!(kernel_name(GgmlType::Q4_K, 17, true), Some("mmq_mma_q4_K_c32"));
        assert_eq!(kernel_name(GgmlType::Q6_K, 9, true), Some("mmq_mma_q6_K_c16"));
        assert_eq!(kernel_name(GgmlType::Q5_K, 9, true), Some("mmq_q5_K_c16"));
        assert_eq!(kernel_name(GgmlType::Q8_0, 33, false), Some("mmq_q8_0_c64"));
        assert_eq!(kernel_name(GgmlType::Q4_K, 65, false), None);
        assert!(has_mma(GgmlType::Q4_K) && !has_mma(GgmlType::Q8_0));
        let names: Vec<&str> = FAMILY.kernel_names().collect();
        assert_eq!(names.len(), N_SIGS);
        for n in ["mmq_ksum", "mmq_mma_q4_K_c8", "mmq_mma_q4_K_c64", "mmq_q5_1_c64"] {
            assert_eq!(names.iter().filter(|&&x| x == n).count(), 1, "{n}");
        }
        assert!(supports(GgmlType::Q4_K, Layout::Stored, 2560) && !supports(GgmlType::Q4_K, Layout::Stored, 2560 + 32));
        assert!(supports(GgmlType::Q8_0, Layout::Stored, 2560 + 32));
        assert!(!supports(GgmlType::Q4_K, Layout::Row64, 2560) && !supports(GgmlType::Q3_K, Layout::Stored, 2560));
        assert_eq!(split_bytes(100, 3, 1), 0);
        assert_eq!(split_bytes(100, 3, 2), 2400);
    }
}
