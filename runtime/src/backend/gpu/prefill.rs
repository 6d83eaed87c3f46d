//! Prefill (two or more tokens) on matrix cores: typed launchers and the dispatch policy
//! for the GEMM family (`kernels-hip/gemm.hip`) and flash attention
//! (`kernels-hip/flash_attn.hip`).
//!
//! The GEMM reads a weight in the layout `weights::layout::canonical` gives its type, the
//! same copy decode's matvec reads: the stored GGUF blocks, or row64 for Q4_K / Q6_K if the
//! policy says so. Whichever it is, there is one resident copy per weight; there is no
//! prefill-only layout and no dequantized copy (each 128-row x 64-element tile is decoded
//! into shared memory inside the kernel).
//!
//! Environment: `LODE_GEMM=0` turns the GEMM off (prefill then runs decode's 8-column
//! matvec), `LODE_FLASH=0` the flash attention (`LODE_FLASH=2` picks the FlashAttention-2
//! style kernel, `LODE_FLASH=1` the first one; default: [`DEFAULT_FLASH`]), `LODE_FLASH256=1` keeps
//! head sizes 129..=256 on V1 (default [`DEFAULT_FLASH256_V2`]: V2 there too), `LODE_GLU_FUSE=0` the paired gate/up,
//! `LODE_GEMM_MIN=N` sets the smallest token count sent to the GEMM (default 32),
//! `LODE_GEMM_N128=N` the token count from which the 128-token tile is used (default never),
//! `LODE_SPLIT_K=1` turns on split-K for under-filled shapes (default off: not yet measured).
//!
//! Where a vendor BLAS opens, matmuls of `LODE_BLAS_MIN` (16) tokens or more go through
//! `prefill_blas.rs` instead (dequantize to a transient f16 slab + cuBLAS / hipBLAS: 3x this
//! GEMM on the H200); this GEMM then serves only `LODE_BLAS=0` or a machine without the
//! library.

use super::driver::{DevPtr, KArg};
use super::ops::Launch;
use super::GpuError;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;
use std::sync::OnceLock;

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
    /// for every head size up to 256 (`LODE_FLASH256=1`: V1 above 128).
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

struct Policy {
    gemm: bool,
    flash: bool,
    /// The flash kernel (`LODE_FLASH=1` / `2`).
    flash_kernel: FlashKernel,
    /// V2 also for head sizes 129..=256 (`LODE_FLASH256=2` / `1`; default [`DEFAULT_FLASH256_V2`]).
    flash256_v2: bool,
    min_tokens: usize,
    /// Token count from which the 128-token tile is used (0: never).
    n128_from: usize,
    /// Gate/up through the paired kernel.
    fuse_glu: bool,
    /// Split-K for under-filled shapes (`LODE_SPLIT_K=1` turns it on).
    split_k: bool,
}

fn policy() -> &'static Policy {
    static P: OnceLock<Policy> = OnceLock::new();
    P.get_or_init(|| {
        let off = |k: &str| std::env::var(k).map(|v| v == "0").unwrap_or(false);
        let num = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
        Policy {
            gemm: !off("LODE_GEMM"),
            flash: !off("LODE_FLASH"),
            flash_kernel: match std::env::var("LODE_FLASH").as_deref() {
                Ok("2") => FlashKernel::V2,
                Ok("1") | Ok("old") => FlashKernel::V1,
                _ => DEFAULT_FLASH,
            },
            flash256_v2: match std::env::var("LODE_FLASH256").as_deref() {
                Ok("2") => true,
                Ok("1") => false,
                _ => DEFAULT_FLASH256_V2,
            },
            min_tokens: num("LODE_GEMM_MIN", DEFAULT_MIN_TOKENS).max(1),
            n128_from: num("LODE_GEMM_N128", DEFAULT_N128_FROM),
            fuse_glu: num("LODE_GLU_FUSE", DEFAULT_FUSE_GLU as usize) != 0,
            split_k: num("LODE_SPLIT_K", DEFAULT_SPLIT_K as usize) != 0,
        }
    })
}

/// Below this many tokens decode's multi-column matvec serves the matmul (it reads the
/// same weight copy). H200, kernel bench: at 16 tokens the matvec (8 columns per launch)
/// won on 4 of 6 qwen3-4b shapes, by up to 2.2x; the GEMM is flat up to 64 tokens while the
/// matvec grows with every 8, so they cross at about 32 (BENCHMARKS.md).
const DEFAULT_MIN_TOKENS: usize = 32;
/// See [`Policy::n128_from`] (measured on the H200, BENCHMARKS.md).
/// (Off: with 128 registers it spills and ran 20-35 % slower than the 64-token tile.)
const DEFAULT_N128_FROM: usize = 0;
/// See [`Policy::fuse_glu`] (measured on the H200, BENCHMARKS.md: pp2048 +3 % on qwen3-4b).
const DEFAULT_FUSE_GLU: bool = true;
/// Below this many 128 x 64 blocks the 64 x 64 tile is used instead, for twice the
/// blocks. None (never): on the H200 the 64 x 64 tile ran 0.55-0.75x the 128 x 64 one on
/// every preset shape except the 1024-row K/V projections at 512 tokens (+9 %).
const FEW_BLOCKS: Option<usize> = None;

/// The flash kernel used unless `LODE_FLASH` says otherwise (`LODE_FLASH=1`: the first
/// kernel). V2 on the H200 (BENCHMARKS.md, session 4 close): selftest passed, pp2048
/// qwen3-4b 24,676 → 28,918, llama-8b 18,629 → 20,794; head_dim > 128 keeps V1.
pub const DEFAULT_FLASH: FlashKernel = FlashKernel::V2;

/// Whether head sizes 129..=256 (Gemma 3) take V2's `flash_attn2_f16_d256` when V2 is the
/// flash kernel (`LODE_FLASH256=1`: V1 there). On: on the H200 it passed the selftest and
/// took Gemma 3 270M's pp512 / pp2048 from 118,448 / 109,095 to 141,420 / 136,060 t/s
/// (BENCHMARKS.md), although it still spills on sm_90.
pub const DEFAULT_FLASH256_V2: bool = true;

/// The kernel prefill runs for `head_dim` under the policy: V2 above 128 only when opted in.
fn prefill_kernel(which: FlashKernel, head_dim: usize, wide_v2: bool) -> FlashKernel {
    if which == FlashKernel::V2 && head_dim > 128 && !wide_v2 {
        FlashKernel::V1
    } else {
        which
    }
}

/// Whether gate/up of `n_tok` tokens should go through the paired kernel.
pub fn use_glu(ty: GgmlType, layout: Layout, n_tok: usize) -> bool {
    policy().fuse_glu && use_gemm(ty, layout, n_tok)
}

/// Whether a matmul of `n_tok` tokens over `ty`/`layout` weights goes to the GEMM.
pub fn use_gemm(ty: GgmlType, layout: Layout, n_tok: usize) -> bool {
    let p = policy();
    p.gemm && n_tok >= 2 && n_tok >= p.min_tokens && gemm_supports(ty, layout)
}

/// Whether attention of `n_tok` queries with this head size goes to the flash kernel.
pub fn use_flash(n_tok: usize, head_dim: usize) -> bool {
    policy().flash && n_tok >= 2 && flash_supports(head_dim)
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

/// Token tile for n tokens and m rows: 16 for few tokens (less padding; also up to 64
/// tokens when m is small, for more blocks), 128 from `n128_from`, else 64 — with 64-row
/// blocks (tile code 6464) when 128-row ones would be too few to fill the GPU.
fn tile_n(n: usize, m: usize) -> usize {
    let p = policy();
    if p.n128_from > 0 && n >= p.n128_from {
        128
    } else if n < 48 || (n <= 64 && m < 8192) {
        16
    } else if FEW_BLOCKS.is_some_and(|few| m.div_ceil(TILE_M) * n.div_ceil(64) < few) {
        M64
    } else {
        64
    }
}

/// Tile code of the 64-row x 64-token blocks.
pub const M64: usize = 6464;

/// y[t][r] = Σ_k W[r][k]·x[t][k].
/// w: [m, k] of `ty` in `layout`; x: [n, k] f32; y: [n, m] f32.
#[allow(clippy::too_many_arguments)]
pub fn gemm(d: &dyn Launch, w: DevPtr, ty: GgmlType, layout: Layout, m: usize, k: usize, x: DevPtr, y: DevPtr, n: usize) -> R {
    let bn = tile_n(n, m);
    gemm_tiled(d, w, ty, layout, m, k, x, y, n, bn, k_split(m, n, k, bn))
}

/// Split-K factor: 2 when the 128 x 64 tiles would leave the GPU under-filled (fewer than
/// SPLIT_BLOCKS) and K is long enough that each half still amortizes its tile (H200: the
/// 1024- and 2560-row projections at 512 tokens); else 1.
fn k_split(m: usize, n: usize, k: usize, bn: usize) -> usize {
    let p = policy();
    if !p.split_k || bn != 64 || k < 2048 {
        return 1;
    }
    if m.div_ceil(TILE_M) * n.div_ceil(64) < SPLIT_BLOCKS {
        2
    } else {
        1
    }
}

/// See [`k_split`]: two 128 x 64 blocks per SM of an H200.
const SPLIT_BLOCKS: usize = 264;
/// Off until measured: the split-K kernels were written after the session's last GPU run
/// (the selftest covers them in rotation; `--bench-prefill` times split 1 vs 2).
const DEFAULT_SPLIT_K: bool = false;

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
/// cores; the arguments and result of `ops::attention`, with the policy's kernel.
/// q, out: [n_tok, n_head, head_dim] f32; kc, vc: [n_ctx, n_kv_head·head_dim] f16 (slots
/// 0..=max pos filled); pos: [n_tok] i32 on the device; window = 0: full causal.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    let p = policy();
    flash_attention_with(d, prefill_kernel(p.flash_kernel, head_dim, p.flash256_v2), q, kc, vc, out, n_tok, n_head, n_kv_head, head_dim, pos, window, scale)
}

/// The kernel name, queries per block and threads per block `which` launches for `head_dim`
/// (V2 at 129..=256 is `flash_attn2_f16_d256`; whether prefill takes it is the policy's
/// `LODE_FLASH256` switch, applied by [`flash_attention`]).
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

    #[test]
    fn d256_v2_switch() {
        // Prefill keeps V1 above 128 when the wide V2 is off (LODE_FLASH256=1); ≤ 128 is unaffected.
        assert_eq!(prefill_kernel(FlashKernel::V2, 256, false), FlashKernel::V1);
        assert_eq!(prefill_kernel(FlashKernel::V2, 256, true), FlashKernel::V2);
        assert_eq!(prefill_kernel(FlashKernel::V2, 128, false), FlashKernel::V2);
        assert_eq!(prefill_kernel(FlashKernel::V1, 256, true), FlashKernel::V1);
        // Measured on the H200 (BENCHMARKS.md): on by default.
        assert!(DEFAULT_FLASH256_V2);
    }
}
