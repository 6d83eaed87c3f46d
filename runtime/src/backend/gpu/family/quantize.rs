//! `kernels-hip/quantize.hip`: f32 activations into the blocks the quantized matvecs and
//! GEMMs read (q8_1 for the 32-element types, the K form for the K-quants), and the
//! quantize-dequantize round trip the prefill GEMM takes.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{ActFmt, Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

kernel_args! {
    /// `quantize_q8_1(x, y, k, kb)`: x [rows, k] f32 → y [rows, kb] q8_1 blocks.
    pub struct QuantizeQ8_1 { x: DevPtr, y: DevPtr, k: usize, kb: usize }
}
kernel_args! {
    /// `quantize_q8_k` / `quantize_dq_*(x, y, k)`.
    pub struct QuantizeRow { x: DevPtr, y: DevPtr, k: usize }
}

const Q8_1: Kernel<QuantizeQ8_1> = Kernel::new("quantize_q8_1");
const Q8_K: Kernel<QuantizeRow> = Kernel::new("quantize_q8_k");
const DQ_Q8_1: Kernel<QuantizeRow> = Kernel::new("quantize_dq_q8_1");
const DQ_Q8_K: Kernel<QuantizeRow> = Kernel::new("quantize_dq_q8_k");

pub const FAMILY: Family = Family {
    name: "quantize",
    source: include_str!("../../../../../kernels-hip/quantize.hip"),
    kernels: &[&[Q8_1.sig(), Q8_K.sig(), DQ_Q8_1.sig(), DQ_Q8_K.sig()]],
};

fn ceil(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

/// Bytes of q8_1 activations for `rows` rows of `k` values.
pub fn q8_1_bytes(k: usize, rows: usize) -> usize {
    rows * k.div_ceil(32) * 36
}

/// x: [rows, k] f32 → y: [rows, ceil(k/32)] q8_1 blocks.
pub fn quantize_q8_1(d: &dyn Launch, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    let kb = k.div_ceil(32);
    Q8_1.launch(d, [ceil(kb, 8), rows as u32, 1], [256, 1, 1], &QuantizeQ8_1 { x, y, k, kb })
}

/// The activation format matvecs of `ty` read (None: float weights, f32 activations).
pub fn act_fmt(ty: GgmlType) -> Option<ActFmt> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => Some(ActFmt::Q8_1),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_XS => Some(ActFmt::K),
        ty if GgmlType::GRID_WEIGHTS.contains(&ty) => Some(ActFmt::K),
        _ => None,
    }
}

/// An error unless `n` values are whole scale groups of `fmt`.
pub fn check_group(op: &str, fmt: ActFmt, n: usize) -> R {
    if n % fmt.group() != 0 {
        return Err(GpuError::Unsupported(format!("{op}: {n} values are not whole {}-value groups of the {fmt:?} activation form", fmt.group())));
    }
    Ok(())
}

/// x: [rows, k] f32 → y: [rows, k/32] blocks of `fmt` (the K form needs k % 256 == 0).
pub fn quantize_act(d: &dyn Launch, fmt: ActFmt, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    match fmt {
        ActFmt::Q8_1 => quantize_q8_1(d, x, y, k, rows),
        ActFmt::K => {
            check_group("quantize_act", fmt, k)?;
            if rows == 0 || k == 0 {
                return Ok(());
            }
            Q8_K.launch(d, [ceil(k, 2048), rows as u32, 1], [256, 1, 1], &QuantizeRow { x, y, k })
        }
    }
}

/// y = x quantized to `fmt` and back to f32 (code × scale as the matvec reads it), for the
/// prefill GEMM. x, y: [rows, k] f32 (may alias); k whole groups of `fmt`.
pub fn quantize_dq(d: &dyn Launch, fmt: ActFmt, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    check_group("quantize_dq", fmt, k)?;
    if rows == 0 || k == 0 {
        return Ok(());
    }
    let (kernel, grid) = match fmt {
        ActFmt::Q8_1 => (DQ_Q8_1, ceil(k, 256)),
        ActFmt::K => (DQ_Q8_K, ceil(k, 2048)),
    };
    kernel.launch(d, [grid, rows as u32, 1], [256, 1, 1], &QuantizeRow { x, y, k })
}
