//! `kernels-hip/head_mv.hip`: the fused LM head, one decode token's last
//! residual add, output norm and Q6_K head matvec in one launch, for heads too large for
//! one wave of `decode_mv` blocks (a vocabulary of rows). A grid of a few resident blocks
//! per multiprocessor streams the weight in 8-row stages (bulk copies into shared memory
//! on sm_90) and normalizes once per block; outputs equal the unfused kernels' bit for
//! bit (`selftest/norm_mv.rs`, check `norm_mv_head`).

use super::decode_mv::Norm;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

kernel_args! {
    /// `head_q6k_n{4,16}(x, add, w, out, counter, nblk, n, eps, W, y, rows, stages)`.
    pub struct Head {
        x: DevPtr, add: Option<DevPtr>, w: Option<DevPtr>, out: DevPtr, counter: DevPtr, nblk: usize, n: usize, eps: f32,
        head: DevPtr, y: DevPtr, rows: usize, stages: usize,
    }
}

const N4: Kernel<Head> = Kernel::new("head_q6k_n4");
const N16: Kernel<Head> = Kernel::new("head_q6k_n16");

pub const FAMILY: Family = Family { name: "head_mv", source: include_str!("../../../../../kernels-hip/head_mv.hip"), kernels: &[&[N4.sig(), N16.sig()]] };

/// Weight-stage bytes per block (`HEAD_RING`), the most stages (`HEAD_STAGES`) and the
/// longest row (`HEAD_NMAX`) in head_mv.hip.
const RING: usize = 40_320;
const STAGES_MAX: usize = 8;
pub const N_MAX: usize = 4096;
/// Rows per stage (one warp each) and threads per block (8 computing warps, one copying).
const STAGE_ROWS: usize = 8;
pub const BLOCK: u32 = 288;

/// The kernel for rows of `n` values.
pub fn kernel(n: usize) -> &'static str {
    if n <= 1024 {
        N4.name
    } else {
        N16.name
    }
}

/// Stages of rows of `n` Q6_K values that fit the ring.
fn stages(n: usize) -> usize {
    (RING / (STAGE_ROWS * (n / 256) * 210)).min(STAGES_MAX)
}

/// Whether the kernel takes a `ty` weight of `rows` rows of `n` at address `w`: Q6_K,
/// whole super-blocks, n <= [`N_MAX`], at least two stages in the ring (n <= 3072), at
/// least one whole stage of rows, and a 16-byte aligned weight (the bulk copies' rule).
pub fn supports(ty: GgmlType, n: usize, rows: usize, w: DevPtr) -> bool {
    ty == GgmlType::Q6_K && n > 0 && n % 256 == 0 && n <= N_MAX && stages(n) >= 2 && rows >= STAGE_ROWS && w % 16 == 0
}

/// The blocks a launch over `rows` uses with `per_sm` resident blocks on `sms`
/// multiprocessors: one wave, never more blocks than whole stages.
pub fn grid(rows: usize, sms: usize, per_sm: usize) -> usize {
    (sms * per_sm.max(1)).min(rows / STAGE_ROWS).max(1)
}

/// One launch: the norm `a`, then y = W · out. w: [rows, a.n] Q6_K (16-byte aligned);
/// y: [rows] f32; nblk: [`grid`]'s block count.
pub fn norm_head(d: &dyn Launch, a: &Norm, w: DevPtr, rows: usize, y: DevPtr, nblk: usize) -> Result<(), GpuError> {
    if !supports(GgmlType::Q6_K, a.n, rows, w) || nblk == 0 || nblk > rows / STAGE_ROWS {
        return Err(GpuError::Unsupported(format!("norm_head: {rows} Q6_K rows of {} in {nblk} blocks", a.n)));
    }
    let args = Head { x: a.x, add: a.add, w: a.w, out: a.out, counter: a.counter, nblk, n: a.n, eps: a.eps, head: w, y, rows, stages: stages(a.n) };
    (if a.n <= 1024 { N4 } else { N16 }).launch(d, [nblk as u32, 1, 1], [BLOCK, 1, 1], &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_the_heads_that_fit_the_ring() {
        // Qwen3-0.6B (1024) and 4B (2560) heads; not 8B's 4096 (one 26.9 KB stage).
        assert_eq!(stages(1024), 6);
        assert_eq!(stages(2560), 2);
        assert!(supports(GgmlType::Q6_K, 1024, 151_936, 0x1000));
        assert!(supports(GgmlType::Q6_K, 3072, 8, 0x1000));
        assert!(!supports(GgmlType::Q6_K, 4096, 128_256, 0x1000));
        assert!(!supports(GgmlType::Q4_K, 1024, 151_936, 0x1000));
        assert!(!supports(GgmlType::Q6_K, 1024, 7, 0x1000));
        assert!(!supports(GgmlType::Q6_K, 1024, 151_936, 0x1008));
        assert_eq!(grid(151_936, 132, 4), 528);
        assert_eq!(grid(20, 132, 4), 2);
    }
}
