//! Typed launchers of the exact kernels (`kernels-hip/exact_matmul.hip`,
//! `exact_ops.hip`): shape checks and grids. Buffers are device addresses; the caller
//! owns them and their sizes.

use super::order::ExactType;
use crate::backend::gpu::driver::{DevPtr, KArg};
use crate::backend::gpu::ops::Launch;
use crate::backend::gpu::GpuError;

type R = Result<(), GpuError>;

fn i(v: usize) -> KArg {
    KArg::I32(v as i32)
}

fn ceil(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

fn unsupported(msg: String) -> GpuError {
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
    d.launch("exact_quantize", [ceil(k / qk, 64), rows as u32, 1], [64, 1, 1], &[KArg::Ptr(x), KArg::Ptr(xq), i(k), KArg::I32(kind)])?;
    Ok(())
}

/// y: [n_tok, rows] = W · xq (already quantized by [`quantize`]), in the order the CPU
/// backend uses for `n_tok` tokens.
#[allow(clippy::too_many_arguments)]
pub fn matmul(d: &dyn Launch, ty: ExactType, w: DevPtr, xq: DevPtr, y: DevPtr, rows: usize, k: usize, n_tok: usize) -> R {
    let (_, qk, _) = ty.act();
    if k % qk != 0 {
        return Err(unsupported(format!("{ty:?} rows of {k} values are not whole {qk}-value blocks")));
    }
    if rows == 0 || n_tok == 0 {
        return Ok(());
    }
    let args = [KArg::Ptr(w), KArg::Ptr(xq), KArg::Ptr(y), i(rows), i(k), KArg::I32(ty as i32), KArg::I32(ty.order(n_tok))];
    if ty == ExactType::Q4K {
        // One thread per output (Q4_K's chain has no lane structure to spread).
        d.launch("exact_matmul", [ceil(rows, 128), n_tok as u32, 1], [128, 1, 1], &args)?;
    } else {
        // The CPU's 8 SIMD lanes on 8 threads per output.
        d.launch("exact_matmul_lanes", [ceil(rows, 16), n_tok as u32, 1], [128, 1, 1], &args)?;
    }
    Ok(())
}

/// Embedding rows: `ty` 0 f32, 1 f16, 2 Q8_0. w: [n_rows, k]; ids: [n] i32; y: [n, k].
pub fn get_rows(d: &dyn Launch, ty: i32, w: DevPtr, ids: DevPtr, y: DevPtr, k: usize, n: usize) -> R {
    if n == 0 || k == 0 {
        return Ok(());
    }
    d.launch("exact_get_rows", [ceil(k, 256), n as u32, 1], [256, 1, 1], &[KArg::Ptr(w), KArg::Ptr(ids), KArg::Ptr(y), i(k), KArg::I32(ty)])?;
    Ok(())
}

/// out = rmsnorm(x) ⊙ w per row of n (w = 0: none). x, out: [rows, n] (may alias).
pub fn rmsnorm(d: &dyn Launch, x: DevPtr, w: DevPtr, out: DevPtr, rows: usize, n: usize, eps: f32) -> R {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    d.launch("exact_rmsnorm", [rows as u32, 1, 1], [128, 1, 1], &[KArg::Ptr(x), KArg::Ptr(w), KArg::Ptr(out), i(n), KArg::F32(eps)])?;
    Ok(())
}

/// out = a + b over n.
pub fn add(d: &dyn Launch, a: DevPtr, b: DevPtr, out: DevPtr, n: usize) -> R {
    binary(d, a, b, out, n, 0.0, 0)
}

/// x = x · s over n.
pub fn scale(d: &dyn Launch, x: DevPtr, n: usize, s: f32) -> R {
    binary(d, x, 0, x, n, s, 1)
}

fn binary(d: &dyn Launch, a: DevPtr, b: DevPtr, out: DevPtr, n: usize, s: f32, op: i32) -> R {
    if n == 0 {
        return Ok(());
    }
    d.launch("exact_binary", [ceil(n, 256), 1, 1], [256, 1, 1], &[KArg::Ptr(a), KArg::Ptr(b), KArg::Ptr(out), i(n), KArg::F32(s), KArg::I32(op)])?;
    Ok(())
}

/// out = act(g) ⊙ u over n; `gelu`: the device GELU table (act 1), else SiLU.
pub fn glu(d: &dyn Launch, g: DevPtr, u: DevPtr, out: DevPtr, n: usize, gelu: Option<DevPtr>) -> R {
    if n == 0 {
        return Ok(());
    }
    let args = [KArg::Ptr(g), KArg::Ptr(u), KArg::Ptr(out), KArg::Ptr(gelu.unwrap_or(0)), i(n), KArg::I32(gelu.is_some() as i32)];
    d.launch("exact_glu", [ceil(n, 256), 1, 1], [256, 1, 1], &args)?;
    Ok(())
}

/// RoPE of x [n_tok, n_head, head_dim] in place; token t at `pos[t]` (device i32), its
/// angles row `pos[t]` of the table `cs` (`cap` rows of n_rot/2 cos, then `cap` of sin).
#[allow(clippy::too_many_arguments)]
pub fn rope(d: &dyn Launch, x: DevPtr, cs: DevPtr, pos: DevPtr, cap: usize, n_tok: usize, n_head: usize, head_dim: usize, n_rot: usize, neox: bool) -> R {
    let half = n_rot / 2;
    if n_tok == 0 || n_head == 0 || half == 0 {
        return Ok(());
    }
    let args = [KArg::Ptr(x), KArg::Ptr(cs), KArg::Ptr(pos), i(n_head), i(head_dim), i(half), i(cap), KArg::I32(neox as i32)];
    d.launch("exact_rope", [ceil(half, 64), n_head as u32, n_tok as u32], [64, 1, 1], &args)?;
    Ok(())
}

/// Attention of the query rows over the f16 caches (see `exact_attention`): `stride` is
/// the scores scratch's row length (≥ the last position + 1), `mode`/`chunk` from
/// [`super::order::attention_mode`].
pub struct AttnArgs {
    pub q: DevPtr,
    pub kc: DevPtr,
    pub vc: DevPtr,
    pub out: DevPtr,
    pub pos: DevPtr,
    pub scores: DevPtr,
    pub n_tok: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub stride: usize,
    pub window: usize,
    pub scale: f32,
    pub mode: i32,
    pub chunk: i32,
}

pub fn attention(d: &dyn Launch, a: &AttnArgs) -> R {
    if a.head_dim > 256 || a.n_kv_head == 0 || a.n_head % a.n_kv_head != 0 {
        return Err(unsupported(format!("attention with head_dim {} (≤ 256), {} heads over {} KV heads", a.head_dim, a.n_head, a.n_kv_head)));
    }
    if a.n_tok == 0 {
        return Ok(());
    }
    let args = [
        KArg::Ptr(a.q),
        KArg::Ptr(a.kc),
        KArg::Ptr(a.vc),
        KArg::Ptr(a.out),
        KArg::Ptr(a.pos),
        KArg::Ptr(a.scores),
        i(a.n_head),
        i(a.n_kv_head),
        i(a.head_dim),
        i(a.stride),
        i(a.window),
        KArg::F32(a.scale),
        KArg::I32(a.mode),
        KArg::I32(a.chunk),
    ];
    d.launch("exact_attention", [a.n_head as u32, a.n_tok as u32, 1], [64, 1, 1], &args)?;
    Ok(())
}
