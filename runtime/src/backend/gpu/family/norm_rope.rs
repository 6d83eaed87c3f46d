//! `kernels-hip/norm_rope.hip`: RMSNorm (alone, with the activation blocks of the next
//! matvec, after a residual add) and RoPE (alone, or fused with the q/k norms and the K/V
//! store of a prefill chunk).

use super::quantize::check_group;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{ActFmt, Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `rmsnorm_f32(x, w, y, n, eps)`.
    pub struct RmsNorm { x: DevPtr, w: Option<DevPtr>, y: DevPtr, n: usize, eps: f32 }
}
kernel_args! {
    /// `rmsnorm_q8_f32(x, w, y, q, n, eps, kfmt)`.
    pub struct RmsNormQ8 { x: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, n: usize, eps: f32, kfmt: bool }
}
kernel_args! {
    /// `add_rmsnorm_q8_f32(x, r, w, y, q, n, eps, kfmt)`.
    pub struct AddRmsNormQ8 { x: DevPtr, r: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, n: usize, eps: f32, kfmt: bool }
}
kernel_args! {
    /// `rope_f32(x, pos, ff, n_head, head_dim, n_rot, neox, theta_scale, freq_scale, attn_factor)`.
    pub struct Rope {
        x: DevPtr, pos: DevPtr, ff: Option<DevPtr>, n_head: usize, head_dim: usize, n_rot: usize, neox: bool,
        theta_scale: f32, freq_scale: f32, attn_factor: f32,
    }
}
kernel_args! {
    /// `rope_kv_f32(q, k, v, kc, vc, qw, kw, pos, ff, n_head, n_kv, head_dim, n_rot, neox,
    /// theta_scale, freq_scale, eps, q_scale, ty_k, ty_v)`.
    pub struct RopeKvArgs {
        q: DevPtr, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, qw: Option<DevPtr>, kw: Option<DevPtr>, pos: DevPtr, ff: Option<DevPtr>,
        n_head: usize, n_kv: usize, head_dim: usize, n_rot: usize, neox: bool,
        theta_scale: f32, freq_scale: f32, eps: f32, q_scale: f32, ty_k: usize, ty_v: usize,
    }
}

const RMSNORM: Kernel<RmsNorm> = Kernel::new("rmsnorm_f32");
const RMSNORM_Q8: Kernel<RmsNormQ8> = Kernel::new("rmsnorm_q8_f32");
const ROPE: Kernel<Rope> = Kernel::new("rope_f32");
const ADD_RMSNORM_Q8: Kernel<AddRmsNormQ8> = Kernel::new("add_rmsnorm_q8_f32");
const ROPE_KV: Kernel<RopeKvArgs> = Kernel::new("rope_kv_f32");

pub const FAMILY: Family = Family {
    name: "norm_rope",
    source: include_str!("../../../../../kernels-hip/norm_rope.hip"),
    kernels: &[&[RMSNORM.sig(), RMSNORM_Q8.sig(), ROPE.sig(), ADD_RMSNORM_Q8.sig(), ROPE_KV.sig()]],
};

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

/// y = x / rms(x) · w over rows of n. x, y: [rows, n] f32 (may alias); w: [n] or none.
pub fn rmsnorm(d: &dyn Launch, x: DevPtr, w: Option<DevPtr>, y: DevPtr, rows: usize, n: usize, eps: f32) -> R {
    RMSNORM.launch(d, [rows as u32, 1, 1], [256, 1, 1], &RmsNorm { x, w, y, n, eps })
}

/// `rmsnorm` that also writes y's `fmt` blocks. q: [rows, n/32] blocks; n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_q8(d: &dyn Launch, x: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> R {
    check_group("rmsnorm_q8", fmt, n)?;
    RMSNORM_Q8.launch(d, [rows as u32, 1, 1], [1024, 1, 1], &RmsNormQ8 { x, w, y, q, n, eps, kfmt: fmt.flag() })
}

/// x += r, then y = rmsnorm(x)·w and y's `fmt` blocks. x, r, y: [rows, n] f32; w: [n] or
/// none; q: [rows, n/32] blocks; n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm_q8(d: &dyn Launch, x: DevPtr, r: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> R {
    check_group("add_rmsnorm_q8", fmt, n)?;
    if rows == 0 {
        return Ok(());
    }
    ADD_RMSNORM_Q8.launch(d, [rows as u32, 1, 1], [1024, 1, 1], &AddRmsNormQ8 { x, r, w, y, q, n, eps, kfmt: fmt.flag() })
}

/// RoPE's per-pair angle factor `base^(-2/n_rot)`, computed exactly as the CPU backend
/// does (f32 `powf`): the kernels multiply the position by it once per pair, in f32, as
/// ggml does, so GPU and CPU angles agree to the bit before sin/cos.
pub fn rope_theta_scale(base: f32, n_rot: usize) -> f32 {
    base.powf(-2.0 / n_rot as f32)
}

/// RoPE in place. x: [n_tok, n_head, head_dim] f32; pos: [n_tok] i32; ff: [n_rot/2] f32
/// frequency divisors or none. Angle of pair i: freq_scale · (pos · theta_scale^i / ff_i).
#[allow(clippy::too_many_arguments)]
pub fn rope(d: &dyn Launch, x: DevPtr, pos: DevPtr, ff: Option<DevPtr>, n_tok: usize, n_head: usize, head_dim: usize, n_rot: usize, neox: bool, theta_scale: f32, freq_scale: f32, attn_factor: f32) -> R {
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(unsupported(format!("rope: n_rot {n_rot} with head_dim {head_dim}")));
    }
    let args = Rope { x, pos, ff, n_head, head_dim, n_rot, neox, theta_scale, freq_scale, attn_factor };
    ROPE.launch(d, [n_tok as u32, n_head as u32, 1], [128, 1, 1], &args)
}

/// The `freq_scale` the RoPE kernels get: with YaRN, 1 (its per-pair angle factors are in
/// the frequency divisors the backend uploads, `backend/rope_attn.rs` `factors`).
pub fn kernel_freq_scale(r: &crate::backend::Rope) -> f32 {
    if r.yarn.is_some() {
        1.0
    } else {
        r.freq_scale
    }
}

/// Shapes and parameters of [`rope_kv`].
#[derive(Clone, Copy, Debug)]
pub struct RopeKv {
    pub n_tok: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub neox: bool,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub eps: f32,
    pub q_scale: f32,
}

impl RopeKv {
    /// The launch parameters of `n_tok` tokens prepared as `p` says (RoPE's angle factor
    /// computed as the CPU does, [`rope_theta_scale`]).
    pub fn new(n_tok: usize, p: &crate::backend::QkvPrep) -> RopeKv {
        RopeKv {
            n_tok,
            n_head: p.n_head,
            n_kv: p.n_kv_head,
            head_dim: p.head_dim,
            n_rot: p.rope.n_rot,
            neox: p.rope.mode == crate::backend::RopeMode::Neox,
            theta_scale: rope_theta_scale(p.rope.freq_base, p.rope.n_rot),
            freq_scale: kernel_freq_scale(&p.rope),
            eps: p.eps,
            q_scale: p.q_scale.unwrap_or(1.0),
        }
    }
}

/// One launch after the q/k/v projections: per-head RMSNorm of q and k (when `qw` / `kw`
/// are given, each [head_dim] f32), RoPE of both, q scaled by `q_scale`, q and k written
/// back, k and v stored as f16 at cache rows pos[t].
/// q: [n_tok, n_head, hd] f32; k, v: [n_tok, n_kv, hd] f32; kc, vc: [n_ctx, n_kv·hd] f16;
/// pos: [n_tok] i32; ff: [n_rot/2] f32 or none.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv(d: &dyn Launch, q: DevPtr, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, qw: Option<DevPtr>, kw: Option<DevPtr>, pos: DevPtr, ff: Option<DevPtr>, p: &RopeKv) -> R {
    rope_kv_typed(d, q, k, v, kc, vc, qw, kw, pos, ff, p, crate::backend::KvType::F16.into())
}

/// [`rope_kv`] into caches of types `ty` (f16, Q8_0 or Q4_0 each; a quantized side needs
/// head_dim % 32 == 0), the blocks quantized as `kv_store_q` quantizes them.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_typed(d: &dyn Launch, q: DevPtr, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, qw: Option<DevPtr>, kw: Option<DevPtr>, pos: DevPtr, ff: Option<DevPtr>, p: &RopeKv, ty: crate::backend::KvTypes) -> R {
    if p.n_rot > p.head_dim || p.n_rot % 2 != 0 || p.head_dim > 256 || p.head_dim == 0 {
        return Err(unsupported(format!("rope_kv: n_rot {} with head_dim {}", p.n_rot, p.head_dim)));
    }
    let (Some(ty_k), Some(ty_v)) = (super::attention::kv_code(ty.k), super::attention::kv_code(ty.v)) else {
        return Err(unsupported(format!("rope_kv: a {ty} cache")));
    };
    if ty.any_quantized() && p.head_dim % 32 != 0 {
        return Err(unsupported(format!("rope_kv: a {ty} cache with head_dim {}", p.head_dim)));
    }
    if p.n_tok == 0 {
        return Ok(());
    }
    let args = RopeKvArgs {
        q, k, v, kc, vc, qw, kw, pos, ff,
        n_head: p.n_head, n_kv: p.n_kv, head_dim: p.head_dim, n_rot: p.n_rot, neox: p.neox,
        theta_scale: p.theta_scale, freq_scale: p.freq_scale, eps: p.eps, q_scale: p.q_scale, ty_k, ty_v,
    };
    ROPE_KV.launch(d, [p.n_tok as u32, (p.n_head + 2 * p.n_kv) as u32, 1], [128, 1, 1], &args)
}
