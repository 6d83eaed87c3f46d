//! Prefill (two or more tokens) on matrix cores: typed launchers for the GEMM family
//! (`kernels-hip/gemm.hip`) and flash attention (`kernels-hip/flash_attn.hip`). Which of
//! them a matmul or an attention takes, and with which tile, is `plan.rs`'s choice.
//!
//! The GEMM reads a weight in the layout `weights::layout::canonical` gives its type, the
//! same copy decode's matvec reads: the stored GGUF blocks, or row64 for Q4_K / Q6_K if the
//! layout policy says so. Whichever it is, there is one resident copy per weight; there is
//! no prefill-only layout and no dequantized copy (each 128-row x 64-element tile is
//! decoded into shared memory inside the kernel).
//!
//! Where a vendor BLAS opens, matmuls of `Tuning::blas_min_tokens` (16) tokens or more go
//! through `prefill_blas.rs` instead (dequantize to a transient f16 slab + cuBLAS /
//! hipBLAS: 3x this GEMM on the H200); this GEMM then serves `--no-blas` or a machine
//! without the library.

use super::driver::{DevPtr, KArg};
use super::launch::Launch;
use super::GpuError;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

type R = Result<(), GpuError>;

/// Every kernel of the `gemm` family (checked against the code objects by tests).
pub const GEMM_KERNELS: &[&str] = &[
    "gemm_q4_0_n64", "gemm_q4_0_n16", "gemm_glu_q4_0_n64", "gemm_q4_0_n128", "gemm_q4_0_m64",
    "gemm_q4_1_n64", "gemm_q4_1_n16", "gemm_glu_q4_1_n64", "gemm_q4_1_n128", "gemm_q4_1_m64",
    "gemm_q5_0_n64", "gemm_q5_0_n16", "gemm_glu_q5_0_n64", "gemm_q5_0_n128", "gemm_q5_0_m64",
    "gemm_q5_1_n64", "gemm_q5_1_n16", "gemm_glu_q5_1_n64", "gemm_q5_1_n128", "gemm_q5_1_m64",
    "gemm_q8_0_n64", "gemm_q8_0_n16", "gemm_glu_q8_0_n64", "gemm_q8_0_n128", "gemm_q8_0_m64",
    "gemm_q4_K_n64", "gemm_q4_K_n16", "gemm_glu_q4_K_n64", "gemm_q4_K_n128", "gemm_q4_K_m64",
    "gemm_q5_K_n64", "gemm_q5_K_n16", "gemm_glu_q5_K_n64", "gemm_q5_K_n128", "gemm_q5_K_m64",
    "gemm_q6_K_n64", "gemm_q6_K_n16", "gemm_glu_q6_K_n64", "gemm_q6_K_n128", "gemm_q6_K_m64",
    "gemm_q4_K_r64_n64", "gemm_q4_K_r64_n16", "gemm_glu_q4_K_r64_n64", "gemm_q4_K_r64_n128", "gemm_q4_K_r64_m64",
    "gemm_q6_K_r64_n64", "gemm_q6_K_r64_n16", "gemm_glu_q6_K_r64_n64", "gemm_q6_K_r64_n128", "gemm_q6_K_r64_m64",
    "gemm_zero_f32",
];

/// Every kernel of the `flash_attn` family.
pub const FLASH_KERNELS: &[&str] = &["flash_attn_f16_d64", "flash_attn_f16_d128", "flash_attn_f16_d256", "flash_attn2_f16_d64", "flash_attn2_f16_d128", "flash_attn2_f16_d256"];

/// Which flash attention kernel serves prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashKernel {
    /// `flash_attn_f16_d*`: 32 keys per step, S and P through shared memory.
    V1,
    /// `flash_attn2_f16_d*`: FlashAttention-2 style, S and the softmax in registers, K/V
    /// pipelined through registers, 64 keys per step (32 at head size 256). Prefill runs it
    /// for every head size up to 256 (V1 is kept for the selftest's comparison only).
    V2,
}

/// Output rows per GEMM block.
const TILE_M: usize = 128;

/// The position of a (type, layout) in the prefill kernel tables (the GEMM's five kernels
/// per entry here, the dequantize kernel per entry in `prefill_blas.rs`), or None if
/// neither reads that combination.
pub(super) fn type_layout_index(ty: GgmlType, layout: Layout) -> Option<usize> {
    Some(match (ty, layout) {
        (GgmlType::Q4_0, Layout::Stored) => 0,
        (GgmlType::Q4_1, Layout::Stored) => 1,
        (GgmlType::Q5_0, Layout::Stored) => 2,
        (GgmlType::Q5_1, Layout::Stored) => 3,
        (GgmlType::Q8_0, Layout::Stored) => 4,
        (GgmlType::Q4_K, Layout::Stored) => 5,
        (GgmlType::Q5_K, Layout::Stored) => 6,
        (GgmlType::Q6_K, Layout::Stored) => 7,
        (GgmlType::Q4_K, Layout::Row64) => 8,
        (GgmlType::Q6_K, Layout::Row64) => 9,
        _ => return None,
    })
}

/// The five kernels (128x64, 128x16, paired 128x64, 128x128, 64x64 tiles) of a (type,
/// layout), or None if the GEMM does not read that combination.
fn names(ty: GgmlType, layout: Layout) -> Option<[&'static str; 5]> {
    let i = type_layout_index(ty, layout)?;
    let k = &GEMM_KERNELS[5 * i..5 * i + 5]; // (the list ends with gemm_zero_f32)
    Some([k[0], k[1], k[2], k[3], k[4]])
}

/// Whether the GEMM reads `ty` weights held in `layout`.
pub fn gemm_supports(ty: GgmlType, layout: Layout) -> bool {
    names(ty, layout).is_some()
}

fn check_k(ty: GgmlType, k: usize) -> R {
    let qk = ty.block_elems();
    if k == 0 || k % qk != 0 {
        return Err(GpuError::Unsupported(format!("gemm: k = {k} is not whole {ty} blocks of {qk}")));
    }
    Ok(())
}

fn i(v: usize) -> KArg {
    KArg::I32(v as i32)
}

/// Tile code of the 64-row x 64-token blocks.
pub const M64: usize = 6464;

/// y[t][r] = Σ_k W[r][k]·x[t][k] with the token tile `tile` (16 or 64: `plan::gemm_tile`).
/// w: [m, k] of `ty` in `layout`; x: [n, k] f32; y: [n, m] f32.
#[allow(clippy::too_many_arguments)]
pub fn gemm(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize, tile: usize) -> R {
    gemm_tiled(d, w, ty, layout, m, k, x, y, n, tile, 1)
}

/// [`gemm`] with an explicit token tile (16, 64, 128, or [`M64`] for 64 x 64 blocks) and
/// split-K factor (1 or 2); the kernel bench and the selftest use every one.
#[allow(clippy::too_many_arguments)]
pub fn gemm_tiled(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize, bn: usize, ksplit: usize) -> R {
    let nm = names(ty, layout).ok_or_else(|| GpuError::Unsupported(format!("gemm of {ty} weights in the {} layout", layout.name(ty))))?;
    check_k(ty, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let (name, bm, bn) = match bn {
        16 => (nm[1], TILE_M, 16),
        128 => (nm[3], TILE_M, 128),
        M64 => (nm[4], 64, 64),
        _ => (nm[0], TILE_M, 64),
    };
    let ksplit = ksplit.clamp(1, 2);
    if ksplit > 1 {
        d.launch("gemm_zero_f32", [(m * n).div_ceil(256) as u32, 1, 1], [256, 1, 1], &[KArg::Ptr(y), i(m * n)])?;
    }
    let grid = [m.div_ceil(bm) as u32, n.div_ceil(bn) as u32, ksplit as u32];
    d.launch(name, grid, [2 * bm as u32, 1, 1], &[KArg::Ptr(w), KArg::Ptr(x), KArg::Ptr(y), i(m), i(n), i(k), i(ksplit)])?;
    Ok(())
}

/// Paired gate/up with the GLU in the epilogue: y[t][r] = act(G·x_t)[r] · (U·x_t)[r],
/// act = GELU-tanh when `gelu`, else SiLU. g, u: [m, k] of `ty` in `layout`; x: [n, k] f32;
/// y: [n, m] f32.
#[allow(clippy::too_many_arguments)]
pub fn gemm_glu(d: &dyn Launch, g: DevPtr, u: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize, gelu: bool) -> R {
    let nm = names(ty, layout).ok_or_else(|| GpuError::Unsupported(format!("gemm_glu of {ty} weights in the {} layout", layout.name(ty))))?;
    check_k(ty, k)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let grid = [m.div_ceil(TILE_M) as u32, n.div_ceil(64) as u32, 1];
    d.launch(nm[2], grid, [256, 1, 1], &[KArg::Ptr(g), KArg::Ptr(u), KArg::Ptr(x), KArg::Ptr(y), i(m), i(n), i(k), i(gelu as usize)])?;
    Ok(())
}

/// Head sizes the flash kernel takes: multiples of 8 up to 256.
pub fn flash_supports(head_dim: usize) -> bool {
    head_dim > 0 && head_dim % 8 == 0 && head_dim <= 256
}

/// Causal / sliding-window GQA attention of n_tok queries over an f16 cache, on matrix
/// cores; the arguments and result of `ops::attention`, with V2.
/// q, out: [n_tok, n_head, head_dim] f32; kc, vc: [n_ctx, n_kv_head·head_dim] f16 (slots
/// 0..=max pos filled); pos: [n_tok] i32 on the device; window = 0: full causal.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    flash_attention_with(d, FlashKernel::V2, q, kc, vc, out, n_tok, n_head, n_kv_head, head_dim, pos, window, scale)
}

/// The kernel name, queries per block and threads per block `which` launches for `head_dim`
/// (V2 at 129..=256 is `flash_attn2_f16_d256`).
pub fn flash_launch(which: FlashKernel, head_dim: usize) -> (&'static str, usize, usize) {
    match (which, head_dim) {
        (FlashKernel::V2, 0..=64) => (FLASH_KERNELS[3], 64, 128),
        (FlashKernel::V2, 65..=128) => (FLASH_KERNELS[4], 64, 128),
        (FlashKernel::V2, _) => (FLASH_KERNELS[5], 64, 128),
        // V1: 2 threads per query.
        (_, 0..=64) => (FLASH_KERNELS[0], 64, 128),
        (_, 65..=128) => (FLASH_KERNELS[1], 64, 128),
        _ => (FLASH_KERNELS[2], 32, 64),
    }
}

/// [`flash_attention`] through the kernel `which` (the selftest and the bench run both).
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_with(d: &dyn Launch, which: FlashKernel, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    if !flash_supports(head_dim) || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(GpuError::Unsupported(format!("flash attention: head_dim {head_dim}, heads {n_head}/{n_kv_head}")));
    }
    if n_tok == 0 {
        return Ok(());
    }
    let (name, bq, threads) = flash_launch(which, head_dim);
    d.launch(
        name,
        [n_tok.div_ceil(bq) as u32, n_head as u32, 1],
        [threads as u32, 1, 1],
        &[KArg::Ptr(q), KArg::Ptr(kc), KArg::Ptr(vc), KArg::Ptr(out), i(n_tok), i(n_head), i(n_kv_head), i(head_dim), KArg::Ptr(pos), i(window), KArg::F32(scale)],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_five_distinct_kernels() {
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let n = names(ty, Layout::Stored).unwrap();
            let t = ty.name().to_lowercase();
            assert!(n.iter().all(|s| s.to_lowercase().contains(&t)), "{ty}: {n:?}");
            assert!(n[0].ends_with("_n64") && n[1].ends_with("_n16") && n[2].starts_with("gemm_glu_") && n[3].ends_with("_n128") && n[4].ends_with("_m64"));
        }
        assert!(names(GgmlType::Q4_K, Layout::Row64).unwrap()[0].contains("r64"));
        assert!(!gemm_supports(GgmlType::Q8_0, Layout::Row64));
        assert!(!gemm_supports(GgmlType::F16, Layout::Stored));
    }

    #[test]
    fn flash_head_sizes() {
        assert!(flash_supports(64) && flash_supports(128) && flash_supports(256) && flash_supports(80));
        assert!(!flash_supports(0) && !flash_supports(260) && !flash_supports(100));
        assert_eq!(flash_launch(FlashKernel::V2, 128).0, "flash_attn2_f16_d128");
        assert_eq!(flash_launch(FlashKernel::V2, 80).0, "flash_attn2_f16_d128");
        assert_eq!(flash_launch(FlashKernel::V2, 64).0, "flash_attn2_f16_d64");
        assert_eq!(flash_launch(FlashKernel::V2, 256), ("flash_attn2_f16_d256", 64, 128));
        assert_eq!(flash_launch(FlashKernel::V2, 160).0, "flash_attn2_f16_d256");
        assert_eq!(flash_launch(FlashKernel::V1, 256), ("flash_attn_f16_d256", 32, 64));
        assert_eq!(flash_launch(FlashKernel::V1, 128).0, "flash_attn_f16_d128");
    }
}
