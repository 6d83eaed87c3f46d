//! `kernels-hip/attention.hip`: attention on the CUDA/vector cores over an f16 cache, for
//! one sequence's tokens (`attn_f16`) or a batched decode step whose rows each attend over
//! their own sequence (`attn_f16_rows`). Prefill on matrix cores is `flash_attn`.
//! A cache with a Q8_0 or Q4_0 K or V (`-ctk` / `-ctv`) is written by `kv_store_q` and
//! read by `attn_kvq` (prefill and decode), which dequantizes each element as it loads it.

use crate::backend::gpu::driver::DevPtr;
use crate::backend::{KvType, KvTypes};
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `attn_f16(q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, q8, sinks)`.
    pub struct Attn {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_head: usize, n_kv_head: usize, head_dim: usize,
        pos: DevPtr, window: usize, scale: f32, q8: Option<DevPtr>, sinks: Option<DevPtr>,
    }
}
kernel_args! {
    /// `attn_f16_rows(q, kv, out, n_head, n_kv_head, head_dim, pos, window, scale, sinks)`.
    pub struct AttnRows { q: DevPtr, kv: DevPtr, out: DevPtr, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32, sinks: Option<DevPtr> }
}

kernel_args! {
    /// `attn_kvq(q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, ty_k, ty_v, q8)`.
    pub struct AttnKvq {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_head: usize, n_kv_head: usize, head_dim: usize,
        pos: DevPtr, window: usize, scale: f32, ty_k: usize, ty_v: usize, q8: Option<DevPtr>,
    }
}
kernel_args! {
    /// `kv_store_q(k, v, kc, vc, nk, nv, rows, ty_k, ty_v)`.
    pub struct KvStoreQ { k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, nk: usize, nv: usize, rows: DevPtr, ty_k: usize, ty_v: usize }
}

const ATTN: Kernel<Attn> = Kernel::new("attn_f16");
const ATTN_ROWS: Kernel<AttnRows> = Kernel::new("attn_f16_rows");
const ATTN_KVQ: Kernel<AttnKvq> = Kernel::new("attn_kvq");
const KV_STORE_Q: Kernel<KvStoreQ> = Kernel::new("kv_store_q");

pub const FAMILY: Family = Family {
    name: "attention",
    source: include_str!("../../../../../kernels-hip/attention.hip"),
    kernels: &[&[ATTN.sig(), ATTN_ROWS.sig(), ATTN_KVQ.sig(), KV_STORE_Q.sig()]],
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
    attention_q8(d, q, kc, vc, out, None, n_tok, n_head, n_kv_head, head_dim, pos, window, scale, None)
}

/// [`attention`] that also writes out's q8_1 blocks to `q8` ([n_tok, n_head·head_dim/32];
/// needs head_dim % 32 == 0) for the output projection; `sinks`: `[n_head]` f32 attention
/// sinks (gpt-oss), one more logit per head in each softmax's denominator.
#[allow(clippy::too_many_arguments)]
pub fn attention_q8(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32, sinks: Option<DevPtr>) -> R {
    if q8.is_some() && head_dim % 32 != 0 {
        return Err(GpuError::Unsupported(format!("attention with q8_1 output: head_dim {head_dim} is not a multiple of 32")));
    }
    check(head_dim, n_head, n_kv_head)?;
    let args = Attn { q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, q8, sinks };
    ATTN.launch(d, [n_head as u32, n_tok as u32, 1], [512, 1, 1], &args)
}

/// A batched decode step's attention: query row t attends over its own sequence's caches,
/// whose addresses sit at kv[2t] (K) and kv[2t + 1] (V) (a device u64 table); one launch.
/// q, out: [n_rows, n_head, head_dim] f32; pos: [n_rows] i32 on the device; `sinks` as
/// [`attention_q8`]'s.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows(d: &dyn Launch, q: DevPtr, kv: DevPtr, out: DevPtr, n_rows: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32, sinks: Option<DevPtr>) -> R {
    check(head_dim, n_head, n_kv_head)?;
    if n_rows == 0 {
        return Ok(());
    }
    let args = AttnRows { q, kv, out, n_head, n_kv_head, head_dim, pos, window, scale, sinks };
    ATTN_ROWS.launch(d, [n_head as u32, n_rows as u32, 1], [512, 1, 1], &args)
}

/// The kernels' code of a cache element type (`KVQ_*` in attention.hip); f32 has none.
pub fn kv_code(t: KvType) -> Option<usize> {
    match t {
        KvType::F16 => Some(0),
        KvType::Q8_0 => Some(1),
        KvType::Q4_0 => Some(2),
        KvType::F32 => None,
    }
}

fn codes(ty: KvTypes, nk: usize, nv: usize) -> Result<(usize, usize), GpuError> {
    match (kv_code(ty.k), kv_code(ty.v)) {
        (Some(k), Some(v)) if nk % 32 == 0 && nv % 32 == 0 => Ok((k, v)),
        _ => Err(GpuError::Unsupported(format!("KV cache {ty} with rows of {nk} / {nv} values"))),
    }
}

/// K and V rows into caches of types `ty` (rows of whole 32-value blocks). k: [n_rows, nk]
/// f32, v: [n_rows, nv] f32; kc / vc: slot-major rows; rows: [n_rows] i32 on the device.
#[allow(clippy::too_many_arguments)]
pub fn kv_store_q(d: &dyn Launch, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, nk: usize, nv: usize, rows: DevPtr, n_rows: usize, ty: KvTypes) -> R {
    let (ty_k, ty_v) = codes(ty, nk, nv)?;
    if n_rows == 0 {
        return Ok(());
    }
    KV_STORE_Q.launch(d, [nk.max(nv).div_ceil(256) as u32, n_rows as u32, 1], [256, 1, 1], &KvStoreQ { k, v, kc, vc, nk, nv, rows, ty_k, ty_v })
}

/// [`attention_q8`] over caches of types `ty` (any of f16, q8_0, q4_0 for K and V).
#[allow(clippy::too_many_arguments)]
pub fn attention_kvq(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32, ty: KvTypes) -> R {
    if q8.is_some() && head_dim % 32 != 0 {
        return Err(GpuError::Unsupported(format!("attention with q8_1 output: head_dim {head_dim} is not a multiple of 32")));
    }
    check(head_dim, n_head, n_kv_head)?;
    let (ty_k, ty_v) = codes(ty, n_kv_head * head_dim, n_kv_head * head_dim)?;
    let args = AttnKvq { q, kc, vc, out, n_head, n_kv_head, head_dim, pos, window, scale, ty_k, ty_v, q8 };
    ATTN_KVQ.launch(d, [n_head as u32, n_tok as u32, 1], [512, 1, 1], &args)
}
