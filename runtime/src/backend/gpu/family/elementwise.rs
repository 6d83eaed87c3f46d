//! `kernels-hip/elementwise.hip`: element-wise ops (add, bias, mul, scale, GLU, softcap),
//! f32 → f16 rows, K/V stores into the f16 caches, and embedding rows (`get_rows_*`).

use super::quantize::check_group;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{ActFmt, Family, Kernel, KernelArgs, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

kernel_args! {
    /// `add_f32`, `mul_f32`, `swiglu_f32`, `geglu_f32` (a, b, y, n).
    pub struct Binary { a: DevPtr, b: DevPtr, y: DevPtr, n: usize }
}
kernel_args! {
    /// `scale_f32(x, y, n, s)`, `softcap_f32(x, y, n, cap)`.
    pub struct Unary { x: DevPtr, y: DevPtr, n: usize, s: f32 }
}
kernel_args! {
    /// `add_bias_f32(x, b, n, total)`.
    pub struct AddBias { x: DevPtr, b: DevPtr, n: usize, total: usize }
}
kernel_args! {
    /// `glu_q8_f32(g, u, y, q, n, act, kfmt)`.
    pub struct GluQ8 { g: DevPtr, u: DevPtr, y: DevPtr, q: DevPtr, n: usize, gelu: bool, kfmt: bool }
}
kernel_args! {
    /// `kv_store_f16(k, v, kc, vc, nk, nv, rows)`.
    pub struct KvStore { k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, nk: usize, nv: usize, rows: DevPtr }
}
kernel_args! {
    /// `kv_store_f16_rows(k, v, kv, nk, nv, pos)`.
    pub struct KvStoreRows { k: DevPtr, v: DevPtr, kv: DevPtr, nk: usize, nv: usize, pos: DevPtr }
}
kernel_args! {
    /// `f32_to_f16_rows(src, dst, n, dst_stride, rows)`.
    pub struct F16Rows { src: DevPtr, dst: DevPtr, n: usize, dst_stride: usize, rows: DevPtr }
}
kernel_args! {
    /// `hadamard_f32(x, lg, scale)`.
    pub struct Hadamard { x: DevPtr, lg: usize, scale: f32 }
}
kernel_args! {
    /// `get_rows_<type>(W, ids, y, k, row_bytes, scale)`.
    pub struct GetRows { w: DevPtr, ids: DevPtr, y: DevPtr, k: usize, row_bytes: usize, scale: f32 }
}

const ADD: Kernel<Binary> = Kernel::new("add_f32");
const MUL: Kernel<Binary> = Kernel::new("mul_f32");
const SWIGLU: Kernel<Binary> = Kernel::new("swiglu_f32");
const GEGLU: Kernel<Binary> = Kernel::new("geglu_f32");
const SCALE: Kernel<Unary> = Kernel::new("scale_f32");
const SOFTCAP: Kernel<Unary> = Kernel::new("softcap_f32");
const ADD_BIAS: Kernel<AddBias> = Kernel::new("add_bias_f32");
const GLU_Q8: Kernel<GluQ8> = Kernel::new("glu_q8_f32");
const KV_STORE: Kernel<KvStore> = Kernel::new("kv_store_f16");
const KV_STORE_ROWS: Kernel<KvStoreRows> = Kernel::new("kv_store_f16_rows");
const F16_ROWS: Kernel<F16Rows> = Kernel::new("f32_to_f16_rows");
const HADAMARD: Kernel<Hadamard> = Kernel::new("hadamard_f32");
const GET_ROWS: [(GgmlType, Kernel<GetRows>); N_GET_ROWS] = [
    (GgmlType::F32, Kernel::new("get_rows_f32")),
    (GgmlType::F16, Kernel::new("get_rows_f16")),
    (GgmlType::BF16, Kernel::new("get_rows_bf16")),
    (GgmlType::Q4_0, Kernel::new("get_rows_q4_0")),
    (GgmlType::Q4_1, Kernel::new("get_rows_q4_1")),
    (GgmlType::Q5_0, Kernel::new("get_rows_q5_0")),
    (GgmlType::Q5_1, Kernel::new("get_rows_q5_1")),
    (GgmlType::Q8_0, Kernel::new("get_rows_q8_0")),
    (GgmlType::Q4_K, Kernel::new("get_rows_q4_K")),
    (GgmlType::Q5_K, Kernel::new("get_rows_q5_K")),
    (GgmlType::Q6_K, Kernel::new("get_rows_q6_K")),
    (GgmlType::Q2_K, Kernel::new("get_rows_q2_K")),
    (GgmlType::Q3_K, Kernel::new("get_rows_q3_K")),
    (GgmlType::IQ4_NL, Kernel::new("get_rows_iq4_nl")),
    (GgmlType::IQ4_XS, Kernel::new("get_rows_iq4_xs")),
    (GgmlType::MXFP4, Kernel::new("get_rows_mxfp4")),
    (GgmlType::IQ3_S, Kernel::new("get_rows_iq3_s")),
    (GgmlType::IQ3_XXS, Kernel::new("get_rows_iq3_xxs")),
    (GgmlType::IQ2_XXS, Kernel::new("get_rows_iq2_xxs")),
    (GgmlType::IQ2_XS, Kernel::new("get_rows_iq2_xs")),
    (GgmlType::IQ2_S, Kernel::new("get_rows_iq2_s")),
    (GgmlType::IQ1_S, Kernel::new("get_rows_iq1_s")),
    (GgmlType::IQ1_M, Kernel::new("get_rows_iq1_m")),
];
const N_GET_ROWS: usize = GgmlType::WEIGHTS.len();

const fn get_rows_sigs() -> [crate::backend::gpu::launch::KernelSig; N_GET_ROWS] {
    let mut out = [ADD.sig(); N_GET_ROWS];
    let mut i = 0;
    while i < N_GET_ROWS {
        out[i] = GET_ROWS[i].1.sig();
        i += 1;
    }
    out
}
const GET_ROWS_SIGS: [crate::backend::gpu::launch::KernelSig; N_GET_ROWS] = get_rows_sigs();

pub const FAMILY: Family = Family {
    name: "elementwise",
    source: include_str!("../../../../../kernels-hip/elementwise.hip"),
    kernels: &[
        &[
            ADD.sig(), ADD_BIAS.sig(), MUL.sig(), SCALE.sig(), SWIGLU.sig(), GEGLU.sig(), SOFTCAP.sig(), F16_ROWS.sig(), GLU_Q8.sig(),
            KV_STORE.sig(), KV_STORE_ROWS.sig(), HADAMARD.sig(),
        ],
        &GET_ROWS_SIGS,
    ],
};

/// One thread per element, 256 per block.
fn flat<A: KernelArgs>(d: &dyn Launch, kernel: Kernel<A>, n: usize, args: &A) -> R {
    if n == 0 {
        return Ok(());
    }
    kernel.launch(d, [n.div_ceil(256) as u32, 1, 1], [256, 1, 1], args)
}

/// `x = H x` per block of `block` values (a power of two, 2..=1024) over `n` values:
/// the quantized KV cache's rotation (`backend::kv_rot`).
pub fn hadamard(d: &dyn Launch, x: DevPtr, n: usize, block: usize) -> R {
    if n == 0 {
        return Ok(());
    }
    let scale = crate::backend::kv_rot::hadamard_scale(block);
    let lg = block.trailing_zeros() as usize;
    HADAMARD.launch(d, [(n / block) as u32, 1, 1], [(block / 2) as u32, 1, 1], &Hadamard { x, lg, scale })
}

/// y = a + b, n f32.
pub fn add(d: &dyn Launch, a: DevPtr, b: DevPtr, y: DevPtr, n: usize) -> R {
    flat(d, ADD, n, &Binary { a, b, y, n })
}
/// x[t][i] += b[i] over `total` elements of rows of n. x: [total/n, n] f32; b: [n] f32.
pub fn add_bias(d: &dyn Launch, x: DevPtr, b: DevPtr, n: usize, total: usize) -> R {
    flat(d, ADD_BIAS, total, &AddBias { x, b, n, total })
}
/// y = a ⊙ b, n f32.
pub fn mul(d: &dyn Launch, a: DevPtr, b: DevPtr, y: DevPtr, n: usize) -> R {
    flat(d, MUL, n, &Binary { a, b, y, n })
}
/// y = s·x, n f32.
pub fn scale(d: &dyn Launch, x: DevPtr, y: DevPtr, n: usize, s: f32) -> R {
    flat(d, SCALE, n, &Unary { x, y, n, s })
}
/// y = act(g) ⊙ u with act = SiLU (gelu = false) or GELU-tanh (gelu = true).
pub fn glu(d: &dyn Launch, g: DevPtr, u: DevPtr, y: DevPtr, n: usize, gelu: bool) -> R {
    flat(d, if gelu { GEGLU } else { SWIGLU }, n, &Binary { a: g, b: u, y, n })
}
/// y = tanh(x / cap)·cap.
pub fn softcap(d: &dyn Launch, x: DevPtr, y: DevPtr, n: usize, cap: f32) -> R {
    flat(d, SOFTCAP, n, &Unary { x, y, n, s: cap })
}

/// `glu` that also writes y's `fmt` blocks. n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn glu_q8(d: &dyn Launch, g: DevPtr, u: DevPtr, y: DevPtr, q: DevPtr, n: usize, gelu: bool, fmt: ActFmt) -> R {
    check_group("glu_q8", fmt, n)?;
    flat(d, GLU_Q8, n, &GluQ8 { g, u, y, q, n, gelu, kfmt: fmt.flag() })
}

/// dst row rows_idx[r] ← f16(src row r). src: [rows, n] f32; dst: rows of dst_stride f16;
/// rows_idx: [rows] i32 on the device.
pub fn f32_to_f16_rows(d: &dyn Launch, src: DevPtr, dst: DevPtr, rows: usize, n: usize, dst_stride: usize, rows_idx: DevPtr) -> R {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    F16_ROWS.launch(d, [n.div_ceil(256) as u32, rows as u32, 1], [256, 1, 1], &F16Rows { src, dst, n, dst_stride, rows: rows_idx })
}

/// y[r] = scale · dequant(W[ids[r]]). w: [n_rows_w, k] of `ty`; ids: [n_ids] i32; y: [n_ids, k] f32.
pub fn get_rows(d: &dyn Launch, w: DevPtr, ty: GgmlType, k: usize, ids: DevPtr, n_ids: usize, y: DevPtr, scale: f32) -> R {
    let &(_, kernel) = GET_ROWS.iter().find(|e| e.0 == ty).ok_or_else(|| GpuError::Unsupported(format!("get_rows of {ty}")))?;
    let row_bytes = ty.bytes_for(k as u64).ok_or_else(|| GpuError::Unsupported(format!("get_rows: k = {k} not whole {ty} blocks")))? as usize;
    if n_ids == 0 {
        return Ok(());
    }
    kernel.launch(d, [n_ids as u32, k.div_ceil(256) as u32, 1], [256, 1, 1], &GetRows { w, ids, y, k, row_bytes, scale })
}

/// A batched decode step's K and V rows, row r into its own sequence's caches (kv[2r],
/// kv[2r + 1], a device u64 table) at slot pos[r]. k: [n_rows, nk] f32, v: [n_rows, nv] f32.
#[allow(clippy::too_many_arguments)]
pub fn kv_store_rows(d: &dyn Launch, k: DevPtr, v: DevPtr, kv: DevPtr, nk: usize, nv: usize, pos: DevPtr, n_rows: usize) -> R {
    if n_rows == 0 {
        return Ok(());
    }
    KV_STORE_ROWS.launch(d, [nk.max(nv).div_ceil(256) as u32, n_rows as u32, 1], [256, 1, 1], &KvStoreRows { k, v, kv, nk, nv, pos })
}

/// K and V rows into the f16 caches. k: [n_rows, nk] f32, v: [n_rows, nv] f32;
/// kc: rows of nk f16, vc: rows of nv f16; rows: [n_rows] i32 on the device.
#[allow(clippy::too_many_arguments)]
pub fn kv_store(d: &dyn Launch, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, nk: usize, nv: usize, rows: DevPtr, n_rows: usize) -> R {
    if n_rows == 0 {
        return Ok(());
    }
    KV_STORE.launch(d, [nk.max(nv).div_ceil(256) as u32, n_rows as u32, 1], [256, 1, 1], &KvStore { k, v, kc, vc, nk, nv, rows })
}
