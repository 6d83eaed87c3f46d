//! `kernels-hip/matvec.hip`: the plain matvecs (one launch per 8 columns, every weight
//! type), up to three one-column matvecs over one activation vector in one launch
//! (`matvec_multi4_n1`), and the resident-grid Q4_K walk (`matvec_q4k_loop_n1`).

use super::quantize::q8_1_bytes;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, KernelSig, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

kernel_args! {
    /// `matvec_<type>_n{1,8}(W, x, y, rows, k, ncols)`.
    pub struct Matvec { w: DevPtr, x: DevPtr, y: DevPtr, rows: usize, k: usize, ncols: usize }
}
kernel_args! {
    /// `matvec_multi4_n1(x, xk, k, W0, y0, rows0, ty0, W1, …, ty2)`: absent segments have
    /// 0 rows and type -1.
    pub struct Multi {
        x: DevPtr, xk: DevPtr, k: usize,
        w0: DevPtr, y0: DevPtr, rows0: usize, ty0: i32,
        w1: DevPtr, y1: DevPtr, rows1: usize, ty1: i32,
        w2: DevPtr, y2: DevPtr, rows2: usize, ty2: i32,
    }
}
kernel_args! {
    /// `matvec_q4k_loop_n1(xk, k, W0, y0, rows0, …, rows2, nw)`.
    pub struct Q4kLoop {
        xk: DevPtr, k: usize,
        w0: DevPtr, y0: DevPtr, rows0: usize,
        w1: DevPtr, y1: DevPtr, rows1: usize,
        w2: DevPtr, y2: DevPtr, rows2: usize,
        nw: usize,
    }
}

/// (type, one-column kernel, up-to-8-column kernel).
const PLAIN: [(GgmlType, Kernel<Matvec>, Kernel<Matvec>); N_PLAIN] = [
    (GgmlType::F32, Kernel::new("matvec_f32_n1"), Kernel::new("matvec_f32_n8")),
    (GgmlType::F16, Kernel::new("matvec_f16_n1"), Kernel::new("matvec_f16_n8")),
    (GgmlType::BF16, Kernel::new("matvec_bf16_n1"), Kernel::new("matvec_bf16_n8")),
    (GgmlType::Q4_0, Kernel::new("matvec_q4_0_n1"), Kernel::new("matvec_q4_0_n8")),
    (GgmlType::Q4_1, Kernel::new("matvec_q4_1_n1"), Kernel::new("matvec_q4_1_n8")),
    (GgmlType::Q5_0, Kernel::new("matvec_q5_0_n1"), Kernel::new("matvec_q5_0_n8")),
    (GgmlType::Q5_1, Kernel::new("matvec_q5_1_n1"), Kernel::new("matvec_q5_1_n8")),
    (GgmlType::Q8_0, Kernel::new("matvec_q8_0_n1"), Kernel::new("matvec_q8_0_n8")),
    (GgmlType::Q4_K, Kernel::new("matvec_q4_K_n1"), Kernel::new("matvec_q4_K_n8")),
    (GgmlType::Q5_K, Kernel::new("matvec_q5_K_n1"), Kernel::new("matvec_q5_K_n8")),
    (GgmlType::Q6_K, Kernel::new("matvec_q6_K_n1"), Kernel::new("matvec_q6_K_n8")),
    (GgmlType::Q2_K, Kernel::new("matvec_q2_K_n1"), Kernel::new("matvec_q2_K_n8")),
    (GgmlType::Q3_K, Kernel::new("matvec_q3_K_n1"), Kernel::new("matvec_q3_K_n8")),
    (GgmlType::IQ4_NL, Kernel::new("matvec_iq4_nl_n1"), Kernel::new("matvec_iq4_nl_n8")),
    (GgmlType::IQ4_XS, Kernel::new("matvec_iq4_xs_n1"), Kernel::new("matvec_iq4_xs_n8")),
    (GgmlType::MXFP4, Kernel::new("matvec_mxfp4_n1"), Kernel::new("matvec_mxfp4_n8")),
    (GgmlType::IQ3_S, Kernel::new("matvec_iq3_s_n1"), Kernel::new("matvec_iq3_s_n8")),
    (GgmlType::IQ3_XXS, Kernel::new("matvec_iq3_xxs_n1"), Kernel::new("matvec_iq3_xxs_n8")),
    (GgmlType::IQ2_XXS, Kernel::new("matvec_iq2_xxs_n1"), Kernel::new("matvec_iq2_xxs_n8")),
    (GgmlType::IQ2_XS, Kernel::new("matvec_iq2_xs_n1"), Kernel::new("matvec_iq2_xs_n8")),
    (GgmlType::IQ2_S, Kernel::new("matvec_iq2_s_n1"), Kernel::new("matvec_iq2_s_n8")),
    (GgmlType::IQ1_S, Kernel::new("matvec_iq1_s_n1"), Kernel::new("matvec_iq1_s_n8")),
    (GgmlType::IQ1_M, Kernel::new("matvec_iq1_m_n1"), Kernel::new("matvec_iq1_m_n8")),
];
const N_PLAIN: usize = GgmlType::WEIGHTS.len();
const MULTI: Kernel<Multi> = Kernel::new("matvec_multi4_n1");
/// Float weights over 2+ columns, 32 × 32 tiles through shared memory.
const FLOAT_TILE: [(GgmlType, Kernel<Matvec>); 3] = [
    (GgmlType::F32, Kernel::new("matvec_f32_tile")),
    (GgmlType::F16, Kernel::new("matvec_f16_tile")),
    (GgmlType::BF16, Kernel::new("matvec_bf16_tile")),
];
const Q4K_LOOP: Kernel<Q4kLoop> = Kernel::new("matvec_q4k_loop_n1");

const fn plain_sigs() -> [KernelSig; 2 * N_PLAIN] {
    let mut out = [MULTI.sig(); 2 * N_PLAIN];
    let mut i = 0;
    while i < N_PLAIN {
        out[2 * i] = PLAIN[i].1.sig();
        out[2 * i + 1] = PLAIN[i].2.sig();
        i += 1;
    }
    out
}
const PLAIN_SIGS: [KernelSig; 2 * N_PLAIN] = plain_sigs();

pub const FAMILY: Family = Family {
    name: "matvec",
    source: include_str!("../../../../../kernels-hip/matvec.hip"),
    kernels: &[&PLAIN_SIGS, &[MULTI.sig(), Q4K_LOOP.sig(), FLOAT_TILE[0].1.sig(), FLOAT_TILE[1].1.sig(), FLOAT_TILE[2].1.sig()]],
};

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

/// True when the matvec for `ty` takes q8_1 activations (else f32).
pub fn matvec_takes_q8_1(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// y[c][r] = Σ_k W[r][k]·x[c][k] for c < ncols.
/// w: [rows, k] of `ty` (stored layout); x: [ncols, k] f32, or [ncols, k/32] blocks of
/// `act_fmt(ty)` when [`matvec_takes_q8_1`]; y: [ncols, rows] f32.
#[allow(clippy::too_many_arguments)]
pub fn matvec(d: &dyn Launch, w: DevPtr, ty: GgmlType, rows: usize, k: usize, x: DevPtr, y: DevPtr, ncols: usize) -> R {
    let &(_, n1, n8) = PLAIN.iter().find(|e| e.0 == ty).ok_or_else(|| unsupported(format!("matvec of {ty} weights")))?;
    if k % ty.block_elems() != 0 {
        return Err(unsupported(format!("matvec: k = {k} is not a multiple of {ty}'s {}-element block", ty.block_elems())));
    }
    let x_col_bytes = if matvec_takes_q8_1(ty) { q8_1_bytes(k, 1) } else { k * 4 };
    let grid = [rows.div_ceil(4) as u32, 1, 1];
    let mut c = 0;
    while c < ncols {
        let n = (ncols - c).min(8);
        let kernel = if n == 1 { n1 } else { n8 };
        let args = Matvec { w, x: x + (c * x_col_bytes) as u64, y: y + (c * rows * 4) as u64, rows, k, ncols: n };
        kernel.launch(d, grid, [128, 1, 1], &args)?;
        c += n;
    }
    Ok(())
}

/// True when [`float_tile`] takes weights of `ty`.
pub fn float_tile_supports(ty: GgmlType) -> bool {
    FLOAT_TILE.iter().any(|e| e.0 == ty)
}

/// y[c][r] = Σ_k W[r][k]·x[c][k] for float weights and any number of columns, one launch:
/// each block holds 32 rows × 32 columns, so the weight is read once per 32 columns (the
/// MoE router over a prefill chunk, where [`matvec`] gave 128 rows 32 warps per 8 columns).
/// x: [ncols, k] f32; y: [ncols, rows] f32.
#[allow(clippy::too_many_arguments)]
pub fn float_tile(d: &dyn Launch, w: DevPtr, ty: GgmlType, rows: usize, k: usize, x: DevPtr, y: DevPtr, ncols: usize) -> R {
    let &(_, kernel) = FLOAT_TILE.iter().find(|e| e.0 == ty).ok_or_else(|| unsupported(format!("float_tile of {ty} weights")))?;
    if rows == 0 || ncols == 0 {
        return Ok(());
    }
    let grid = [rows.div_ceil(32) as u32, ncols.div_ceil(32) as u32, 1];
    kernel.launch(d, grid, [256, 1, 1], &Matvec { w, x, y, rows, k, ncols })
}

/// The weight type code `matvec_multi4_n1` switches on (matvec.hip's numbering; the fused
/// `decode_mv` kernels take the mv_dot.h types among them, `decode_mv::type_code`). None:
/// not a q8_1 / K-form consumer.
pub fn mv_type_code(ty: GgmlType) -> Option<i32> {
    Some(match ty {
        GgmlType::Q4_0 => 0,
        GgmlType::Q4_1 => 1,
        GgmlType::Q5_0 => 2,
        GgmlType::Q5_1 => 3,
        GgmlType::Q8_0 => 4,
        GgmlType::Q4_K => 10,
        GgmlType::Q5_K => 11,
        GgmlType::Q6_K => 12,
        GgmlType::IQ4_NL => 5,
        GgmlType::MXFP4 => 6,
        GgmlType::Q2_K => 13,
        GgmlType::Q3_K => 14,
        GgmlType::IQ4_XS => 15,
        GgmlType::IQ3_S => 16,
        GgmlType::IQ3_XXS => 17,
        GgmlType::IQ2_XXS => 18,
        GgmlType::IQ2_XS => 19,
        GgmlType::IQ2_S => 20,
        GgmlType::IQ1_S => 21,
        GgmlType::IQ1_M => 22,
        _ => return None,
    })
}

/// True when `matvec_multi` takes weights of `ty` with rows of `k`.
pub fn multi_supports(ty: GgmlType, k: usize) -> bool {
    mv_type_code(ty).is_some() && k % ty.block_elems() == 0
}

/// One segment of a multi-matvec launch: (w [rows, k] of ty, ty, rows, y [rows] f32).
pub type Seg = (DevPtr, GgmlType, usize, DevPtr);

/// Up to 3 one-column matvecs over the same activations, one launch:
/// y_s[r] = Σ_k W_s[r][k]·x[k]. x: [k/32] q8_1 form (read by the 32-element types), xk:
/// [k/32] K form (read by the K-quants); a form no segment reads may be 0.
pub fn matvec_multi(d: &dyn Launch, x: DevPtr, xk: DevPtr, k: usize, segs: &[Seg]) -> R {
    if segs.is_empty() || segs.len() > 3 {
        return Err(unsupported(format!("matvec_multi: {} weights (1 to 3)", segs.len())));
    }
    let mut s = [(0u64, 0u64, 0usize, -1i32); 3];
    let mut blocks = 0usize;
    for (slot, &(w, ty, rows, y)) in s.iter_mut().zip(segs) {
        if !multi_supports(ty, k) {
            return Err(unsupported(format!("matvec_multi: {ty} weights with k = {k}")));
        }
        blocks += rows.div_ceil(4);
        *slot = (w, y, rows, mv_type_code(ty).unwrap_or(-1));
    }
    if blocks == 0 {
        return Ok(());
    }
    let args = Multi {
        x, xk, k,
        w0: s[0].0, y0: s[0].1, rows0: s[0].2, ty0: s[0].3,
        w1: s[1].0, y1: s[1].1, rows1: s[1].2, ty1: s[1].3,
        w2: s[2].0, y2: s[2].1, rows2: s[2].2, ty2: s[2].3,
    };
    MULTI.launch(d, [blocks as u32, 1, 1], [128, 1, 1], &args)
}

/// Whether [`matvec_q4k_loop`] takes these weights: all Q4_K, rows of at most 16
/// super-blocks (two slots of the warp body).
pub fn q4k_loop_supports(k: usize, segs: &[Seg]) -> bool {
    k % 256 == 0 && k / 256 <= 16 && !segs.is_empty() && segs.len() <= 3 && segs.iter().all(|s| s.1 == GgmlType::Q4_K)
}

/// `matvec_multi` of Q4_K weights as one resident grid of `blocks` 128-thread blocks whose
/// warps walk the rows with the next row's loads in flight (`matvec_q4k_loop_n1`): for
/// launches of many waves. xk: [k/32] K form; segs as `matvec_multi`'s.
pub fn matvec_q4k_loop(d: &dyn Launch, xk: DevPtr, k: usize, segs: &[Seg], blocks: usize) -> R {
    if !q4k_loop_supports(k, segs) || blocks == 0 {
        return Err(unsupported(format!("matvec_q4k_loop: {} weights of rows of {k} (Q4_K, at most 4096)", segs.len())));
    }
    let mut s = [(0u64, 0u64, 0usize); 3];
    for (slot, &(w, _, rows, y)) in s.iter_mut().zip(segs) {
        *slot = (w, y, rows);
    }
    let args = Q4kLoop {
        xk, k,
        w0: s[0].0, y0: s[0].1, rows0: s[0].2,
        w1: s[1].0, y1: s[1].1, rows1: s[1].2,
        w2: s[2].0, y2: s[2].1, rows2: s[2].2,
        nw: blocks * 4,
    };
    Q4K_LOOP.launch(d, [blocks as u32, 1, 1], [128, 1, 1], &args)
}
