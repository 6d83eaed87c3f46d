//! `kernels-hip/exact_matmul.hip`: the matmuls and embedding rows of `--numerics exact`
//! (`ExactBackend`), each output in the CPU backend's order of f32 operations.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::exact::order::ExactType;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `exact_quantize(x, xq, k, kind)`.
    pub struct Quantize { x: DevPtr, xq: DevPtr, k: usize, kind: i32 }
}
kernel_args! {
    /// `exact_matmul{,_lanes}(W, xq, y, rows, k, ty, order)`.
    pub struct Matmul { w: DevPtr, xq: DevPtr, y: DevPtr, rows: usize, k: usize, ty: i32, order: i32 }
}
kernel_args! {
    /// `exact_get_rows(W, ids, y, k, ty)`.
    pub struct GetRows { w: DevPtr, ids: DevPtr, y: DevPtr, k: usize, ty: i32 }
}

const QUANTIZE: Kernel<Quantize> = Kernel::new("exact_quantize");
const MATMUL: Kernel<Matmul> = Kernel::new("exact_matmul");
const MATMUL_LANES: Kernel<Matmul> = Kernel::new("exact_matmul_lanes");
const GET_ROWS: Kernel<GetRows> = Kernel::new("exact_get_rows");

pub const FAMILY: Family = Family {
    name: "exact_matmul",
    source: include_str!("../../../../../kernels-hip/exact_matmul.hip"),
    kernels: &[&[QUANTIZE.sig(), MATMUL.sig(), MATMUL_LANES.sig(), GET_ROWS.sig()]],
};

fn ceil(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

pub(super) fn unsupported(msg: String) -> GpuError {
    GpuError::Unsupported(format!("exact numerics: {msg}"))
}

/// Bytes of the activation blocks `ty` reads for `rows` rows of `k` values.
pub fn act_bytes(ty: ExactType, k: usize, rows: usize) -> usize {
    let (_, qk, bytes) = ty.act();
    rows * (k / qk) * bytes
}

/// x: [rows, k] f32 → xq: [rows, k / block] activation blocks of `ty`'s vec_dot type,
/// byte for byte the CPU's (`quant::quantize_rows`).
pub fn quantize(d: &dyn Launch, ty: ExactType, x: DevPtr, xq: DevPtr, k: usize, rows: usize) -> R {
    let (kind, qk, _) = ty.act();
    if k % qk != 0 {
        return Err(unsupported(format!("rows of {k} values are not whole {qk}-value blocks")));
    }
    if rows == 0 || k == 0 {
        return Ok(());
    }
    QUANTIZE.launch(d, [ceil(k / qk, 64), rows as u32, 1], [64, 1, 1], &Quantize { x, xq, k, kind })
}

/// y: [n_tok, rows] = W · xq (already quantized by [`quantize`]), in the order the CPU
/// backend uses for `n_tok` tokens.
#[allow(clippy::too_many_arguments)]
pub fn matmul(d: &dyn Launch, ty: ExactType, w: DevPtr, xq: DevPtr, y: DevPtr, rows: usize, k: usize, n_tok: usize) -> R {
    matmul_in_order(d, ty, w, xq, y, rows, k, n_tok, ty.order(n_tok))
}

/// [`matmul`] with the kernel's `order` argument given ([`ExactType::order`] of another
/// token count: `order(1)` sums every row as one decode token).
#[allow(clippy::too_many_arguments)]
pub fn matmul_in_order(d: &dyn Launch, ty: ExactType, w: DevPtr, xq: DevPtr, y: DevPtr, rows: usize, k: usize, n_tok: usize, order: i32) -> R {
    let (_, qk, _) = ty.act();
    if k % qk != 0 {
        return Err(unsupported(format!("{ty:?} rows of {k} values are not whole {qk}-value blocks")));
    }
    if rows == 0 || n_tok == 0 {
        return Ok(());
    }
    let args = Matmul { w, xq, y, rows, k, ty: ty as i32, order };
    if !matches!(ty, ExactType::Q4_0 | ExactType::Q4_1 | ExactType::Q5_0 | ExactType::Q5_1 | ExactType::Q8_0 | ExactType::Q6K) {
        // One thread per output (Q4_K's and the low-bit types' chains have no lane
        // structure to spread).
        MATMUL.launch(d, [ceil(rows, 128), n_tok as u32, 1], [128, 1, 1], &args)
    } else {
        // The CPU's 8 SIMD lanes on 8 threads per output.
        MATMUL_LANES.launch(d, [ceil(rows, 16), n_tok as u32, 1], [128, 1, 1], &args)
    }
}

/// Embedding rows: `ty` 0 f32, 1 f16, 2 Q8_0. w: [n_rows, k]; ids: [n] i32; y: [n, k].
pub fn get_rows(d: &dyn Launch, ty: i32, w: DevPtr, ids: DevPtr, y: DevPtr, k: usize, n: usize) -> R {
    if n == 0 || k == 0 {
        return Ok(());
    }
    GET_ROWS.launch(d, [ceil(k, 256), n as u32, 1], [256, 1, 1], &GetRows { w, ids, y, k, ty })
}
