//! `kernels-hip/attention.hip`: attention on the CUDA/vector cores over an f16 cache, for
//! one sequence's tokens (`attn_f16`) or a batched decode step whose rows each attend over
//! their own sequence (`attn_f16_rows`). Prefill on matrix cores is `flash_attn`.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `attn_f16(q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, q8)`.
    pub struct Attn {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_head: usize, n_kv_head: usize, head_dim: usize,
        pos: DevPtr, window: usize, scale: f32, q8: Option<DevPtr>,
    }
}
kernel_args! {
    /// `attn_f16_rows(q, kv, out, n_head, n_kv_head, head_dim, pos, window, scale)`.
    pub struct AttnRows { q: DevPtr, kv: DevPtr, out: DevPtr, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32 }
}

const ATTN: Kernel<Attn> = Kernel::new("attn_f16");
const ATTN_ROWS: Kernel<AttnRows> = Kernel::new("attn_f16_rows");

pub const FAMILY: Family = Family {
    name: "attention",
    source: include_str!("../../../../../kernels-hip/attention.hip"),
    kernels: &[&[ATTN.sig(), ATTN_ROWS.sig()]],
};

fn check(head_dim: usize, n_head: usize, n_kv_head: usize) -> R {
    if head_dim % 8 != 0 || head_dim > 256 || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(GpuError::Unsupported(format!("attention: head_dim {head_dim}, heads {n_head}/{n_kv_head}")));
    }
    Ok(())
}

/// Attention of n_tok queries at positions pos[t] (device i32 array) over an f16 cache.
/// q, out: [n_tok, n_head, head_dim] f32; kc, vc: [n_ctx, n_kv_head·head_dim] f16
/// (slots 0..=max pos filled). window = 0: full causal.
#[allow(clippy::too_many_arguments)]
pub fn attention(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    attention_q8(d, q, kc, vc, out, None, n_tok, n_head, n_kv_head, head_dim, pos, window, scale)
}

/// [`attention`] that also writes out's q8_1 blocks to `q8` ([n_tok, n_head·head_dim/32];
/// needs head_dim % 32 == 0) for the output projection.
#[allow(clippy::too_many_arguments)]
pub fn attention_q8(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    if q8.is_some() && head_dim % 32 != 0 {
        return Err(GpuError::Unsupported(format!("attention with q8_1 output: head_dim {head_dim} is not a multiple of 32")));
    }
    check(head_dim, n_head, n_kv_head)?;
    let args = Attn { q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, q8 };
    ATTN.launch(d, [n_head as u32, n_tok as u32, 1], [512, 1, 1], &args)
}

/// A batched decode step's attention: query row t attends over its own sequence's caches,
/// whose addresses sit at kv[2t] (K) and kv[2t + 1] (V) (a device u64 table); one launch.
/// q, out: [n_rows, n_head, head_dim] f32; pos: [n_rows] i32 on the device.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows(d: &dyn Launch, q: DevPtr, kv: DevPtr, out: DevPtr, n_rows: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    check(head_dim, n_head, n_kv_head)?;
    if n_rows == 0 {
        return Ok(());
    }
    let args = AttnRows { q, kv, out, n_head, n_kv_head, head_dim, pos, window, scale };
    ATTN_ROWS.launch(d, [n_head as u32, n_rows as u32, 1], [512, 1, 1], &args)
}
