//! `kernels-hip/dequant.hip` and the prefill path it serves, matmuls through the vendor
//! BLAS: for chunks of at least `Tuning::blas_min_tokens`
//! tokens (`plan::blas_candidate`), each weight matmul is (1) a dequantize kernel
//! (`kernels-hip/dequant.hip`) that writes a bounded, transient f16 slab of the weight's
//! rows from its one resident copy (the canonical layout: stored blocks, or row64 for
//! Q4_K / Q6_K), then (2) the vendor's f16 × f16 → f32 GEMM (f32 accumulation,
//! `driver::blas`) against the f16 activations — looping over row chunks so the slab never
//! exceeds `Tuning::blas_slab_bytes` (default 128 MiB: it holds every weight of the 8B
//! preset whole; H200 pp2048 llama-8b 19,067 t/s at 128 MiB vs 18,182 at 64; 8–32 MiB cost
//! 5–35 %). The library file is found as `driver::blas` says (`LODE_BLAS_LIB` overrides).
//!
//! Why: the matrix-core GEMM of `gemm.hip` tops out near 120 TFLOP/s on the H200, cuBLAS
//! reaches ~700 on the same shapes (BENCHMARKS.md); decoding a weight to f16 costs one
//! pass over its f16 bytes, much less than the GEMM time it saves from ~128 tokens on.
//! At 16 tokens dequantize + cuBLAS beat decode's 8-column matvec on all 12 qwen3-4b /
//! llama-8b shapes by 1.4-2.6x and lode's matrix-core GEMM on 11 of 12.
//!
//! The slab is scratch reused by every weight (like the activation scratch), not a
//! second resident layout: the weight cache still holds one copy per weight.
//! The activations are rounded as the matrix-core GEMM rounds them (the quantized form's
//! values, then f16), so switching path changes only the summation order.

use crate::backend::gpu::driver::blas::Blas;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{ActFmt, Family, Kernel, KernelSig, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

type R = Result<(), GpuError>;

kernel_args! {
    /// `dequant_f16_<type>(W, Y, row0, rows, K)`.
    pub struct Dequant { w: DevPtr, y: DevPtr, row0: usize, rows: usize, k: usize }
}
kernel_args! {
    /// `act_f16_*(x, y, n)`.
    pub struct ActToF16 { x: DevPtr, y: DevPtr, n: usize }
}

const DEQUANT: [(GgmlType, Layout, Kernel<Dequant>); N_DEQUANT] = [
    (GgmlType::Q4_0, Layout::Stored, Kernel::new("dequant_f16_q4_0")),
    (GgmlType::Q4_1, Layout::Stored, Kernel::new("dequant_f16_q4_1")),
    (GgmlType::Q5_0, Layout::Stored, Kernel::new("dequant_f16_q5_0")),
    (GgmlType::Q5_1, Layout::Stored, Kernel::new("dequant_f16_q5_1")),
    (GgmlType::Q8_0, Layout::Stored, Kernel::new("dequant_f16_q8_0")),
    (GgmlType::Q4_K, Layout::Stored, Kernel::new("dequant_f16_q4_K")),
    (GgmlType::Q5_K, Layout::Stored, Kernel::new("dequant_f16_q5_K")),
    (GgmlType::Q6_K, Layout::Stored, Kernel::new("dequant_f16_q6_K")),
    (GgmlType::Q4_K, Layout::Row64, Kernel::new("dequant_f16_q4_K_r64")),
    (GgmlType::Q6_K, Layout::Row64, Kernel::new("dequant_f16_q6_K_r64")),
    (GgmlType::Q2_K, Layout::Stored, Kernel::new("dequant_f16_q2_K")),
    (GgmlType::Q3_K, Layout::Stored, Kernel::new("dequant_f16_q3_K")),
    (GgmlType::IQ4_NL, Layout::Stored, Kernel::new("dequant_f16_iq4_nl")),
    (GgmlType::IQ4_XS, Layout::Stored, Kernel::new("dequant_f16_iq4_xs")),
    (GgmlType::MXFP4, Layout::Stored, Kernel::new("dequant_f16_mxfp4")),
    (GgmlType::IQ3_S, Layout::Stored, Kernel::new("dequant_f16_iq3_s")),
    (GgmlType::IQ3_XXS, Layout::Stored, Kernel::new("dequant_f16_iq3_xxs")),
    (GgmlType::IQ2_XXS, Layout::Stored, Kernel::new("dequant_f16_iq2_xxs")),
    (GgmlType::IQ2_XS, Layout::Stored, Kernel::new("dequant_f16_iq2_xs")),
    (GgmlType::IQ2_S, Layout::Stored, Kernel::new("dequant_f16_iq2_s")),
    (GgmlType::IQ1_S, Layout::Stored, Kernel::new("dequant_f16_iq1_s")),
    (GgmlType::IQ1_M, Layout::Stored, Kernel::new("dequant_f16_iq1_m")),
];
const N_DEQUANT: usize = 22;
const ACT_Q8_1: Kernel<ActToF16> = Kernel::new("act_f16_q8_1");
const ACT_Q8_K: Kernel<ActToF16> = Kernel::new("act_f16_q8_k");
const ACT_F32: Kernel<ActToF16> = Kernel::new("act_f16_f32");

const fn sigs() -> [KernelSig; N_DEQUANT] {
    let mut out = [ACT_F32.sig(); N_DEQUANT];
    let mut i = 0;
    while i < N_DEQUANT {
        out[i] = DEQUANT[i].2.sig();
        i += 1;
    }
    out
}
const SIGS: [KernelSig; N_DEQUANT] = sigs();

pub const FAMILY: Family = Family {
    name: "dequant",
    source: include_str!("../../../../../kernels-hip/dequant.hip"),
    kernels: &[&SIGS, &[ACT_Q8_1.sig(), ACT_Q8_K.sig(), ACT_F32.sig()]],
};

/// The dequantize kernel of (type, layout), or None if there is none.
fn dequant_kernel(ty: GgmlType, layout: Layout) -> Option<Kernel<Dequant>> {
    DEQUANT.iter().find(|e| e.0 == ty && e.1 == layout).map(|e| e.2)
}

/// Whether `ty` weights held in `layout` can be dequantized to an f16 slab.
pub fn supports(ty: GgmlType, layout: Layout) -> bool {
    dequant_kernel(ty, layout).is_some()
}

/// The slab bound of the default tuning (the selftest's cases).
pub const DEFAULT_SLAB: usize = 128 << 20;
/// The BLAS workspace lode hands the library (cuBLAS's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// Rows per slab chunk for rows of `k` elements: as many as `slab_bytes` of f16 hold, a
/// multiple of 64 when that is at least 64 (whole row64 groups, aligned BLAS tiles).
pub fn chunk_rows(k: usize, slab_bytes: usize) -> usize {
    let r = (slab_bytes / (2 * k.max(1))).max(1);
    if r >= 64 {
        r / 64 * 64
    } else {
        r
    }
}

/// The slab bytes a weight of `m` rows × `k` needs (≤ the bound `slab_bytes`).
pub fn slab_bytes_for(m: usize, k: usize, slab_bytes: usize) -> usize {
    2 * k * m.min(chunk_rows(k, slab_bytes))
}

/// Y[r][k] = f16(dequantize(W)[row0 + r][k]) for r < rows. w: [m, k] of `ty` in `layout`
/// (rows row0..row0 + rows exist); y: [rows, k] f16.
#[allow(clippy::too_many_arguments)]
pub fn dequant_f16(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, row0: usize, rows: usize, k: usize, y: DevPtr) -> R {
    let kernel = dequant_kernel(ty, layout).ok_or_else(|| GpuError::Unsupported(format!("dequantize {ty} weights in the {} layout to f16", layout.name(ty))))?;
    let qk = ty.block_elems();
    if k == 0 || k % qk != 0 || k % 32 != 0 {
        return Err(GpuError::Unsupported(format!("dequant_f16: k = {k} is not whole {ty} blocks of {qk}")));
    }
    let threads = rows * (k / 16);
    if threads >= 1 << 31 || row0 + rows >= 1 << 31 {
        return Err(GpuError::Unsupported(format!("dequant_f16: {rows} rows of {k} exceed one launch")));
    }
    if rows == 0 {
        return Ok(());
    }
    kernel.launch(d, [threads.div_ceil(256) as u32, 1, 1], [256, 1, 1], &Dequant { w, y, row0, rows, k })
}

/// How the f16 activations are made from the f32 ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActF16 {
    /// The quantized form's values (as the matrix-core GEMM reads them), then f16.
    Quant(ActFmt),
    /// The f32 values rounded to f16 (unquantized weights).
    Plain,
}

/// y = the f16 GEMM operand of x. x: [n, k] f32; y: [n, k] f16.
pub fn act_f16(d: &dyn Launch, form: ActF16, x: DevPtr, y: DevPtr, k: usize, n: usize) -> R {
    if k == 0 || n == 0 {
        return Ok(());
    }
    match form {
        ActF16::Quant(ActFmt::Q8_1) => {
            if k % 32 != 0 {
                return Err(GpuError::Unsupported(format!("act_f16_q8_1: k = {k} is not a multiple of 32")));
            }
            ACT_Q8_1.launch(d, [k.div_ceil(256) as u32, n as u32, 1], [256, 1, 1], &ActToF16 { x, y, n: k })?;
        }
        ActF16::Quant(ActFmt::K) => {
            if k % 256 != 0 {
                return Err(GpuError::Unsupported(format!("act_f16_q8_k: k = {k} is not a multiple of 256")));
            }
            ACT_Q8_K.launch(d, [k.div_ceil(2048) as u32, n as u32, 1], [256, 1, 1], &ActToF16 { x, y, n: k })?;
        }
        ActF16::Plain => {
            let total = n * k;
            if total >= 1 << 31 {
                return Err(GpuError::Unsupported(format!("act_f16_f32: {total} values exceed one launch")));
            }
            ACT_F32.launch(d, [total.div_ceil(256) as u32, 1, 1], [256, 1, 1], &ActToF16 { x, y, n: total })?;
        }
    }
    Ok(())
}

/// y[t][r] = Σ_k W[r][k]·x[t][k] through the slab and the BLAS: for each chunk of rows,
/// dequantize into `slab`, then one GEMM writing that chunk's columns of y.
/// w: [m, k] of `ty` in `layout`; xh: [n, k] f16; y: [n, m] f32; slab: `slab_bytes_for`
/// bytes. The launches go through `d` (the step recorder, which the caller has taken out
/// of replay for this step) and the GEMM straight onto the same stream, in order.
#[allow(clippy::too_many_arguments)]
pub fn matmul(d: &dyn Launch, blas: &Blas, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, xh: DevPtr, y: DevPtr, n: usize, slab: DevPtr, slab_bytes: usize) -> R {
    if m == 0 || n == 0 {
        return Ok(());
    }
    let rows = chunk_rows(k, slab_bytes).min(m);
    let mut r0 = 0;
    while r0 < m {
        let r = rows.min(m - r0);
        dequant_f16(d, w, ty, layout, r0, r, k, slab)?;
        blas.gemm_f16_f32(r, n, k, slab, k, xh, k, y + 4 * r0 as u64, m)?;
        r0 += r;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gemm_type_has_a_dequant_kernel() {
        for (ty, layout) in super::super::gemm::type_layouts() {
            assert!(supports(ty, layout), "{ty}");
        }
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            assert_eq!(supports(ty, Layout::Stored), super::super::gemm::gemm_supports(ty, Layout::Stored), "{ty}");
            let n = dequant_kernel(ty, Layout::Stored).unwrap().name;
            assert!(n.to_lowercase().ends_with(&ty.name().to_lowercase()), "{ty}: {n}");
        }
        assert!(supports(GgmlType::Q4_K, Layout::Row64) && supports(GgmlType::Q6_K, Layout::Row64));
        assert!(!supports(GgmlType::Q8_0, Layout::Row64) && !supports(GgmlType::F16, Layout::Stored));
    }

    #[test]
    fn chunks_stay_within_the_slab() {
        for (k, slab) in [(2560, 64 << 20), (4096, 64 << 20), (14336, 1 << 20), (1 << 22, 1 << 20)] {
            let r = chunk_rows(k, slab);
            assert!(r >= 1);
            assert!(r == 1 || 2 * k * r <= slab, "k {k} slab {slab}: {r} rows");
            if r >= 64 {
                assert_eq!(r % 64, 0);
            }
        }
        // The 8B gate (14336 x 4096) fits one default slab, as does the 4B one (9728 x 2560).
        assert!(slab_bytes_for(9728, 2560, DEFAULT_SLAB) == 2 * 2560 * 9728);
        assert!(slab_bytes_for(14336, 4096, DEFAULT_SLAB) == 2 * 4096 * 14336);
    }
}
