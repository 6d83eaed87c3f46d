//! `kernels-hip/exact_ops.hip`: the norms, element-wise ops, RoPE and attention of
//! `--numerics exact` (`ExactBackend`), each in the CPU backend's order of f32 operations.

use super::exact_matmul::unsupported;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `exact_rmsnorm(x, w, out, n, eps)`.
    pub struct RmsNorm { x: DevPtr, w: Option<DevPtr>, out: DevPtr, n: usize, eps: f32 }
}
kernel_args! {
    /// `exact_binary(a, b, out, n, s, op)`: op 0 a + b, 1 a · s.
    pub struct Binary { a: DevPtr, b: DevPtr, out: DevPtr, n: usize, s: f32, op: i32 }
}
kernel_args! {
    /// `exact_glu(g, u, out, gelu_table, n, act)`.
    pub struct Glu { g: DevPtr, u: DevPtr, out: DevPtr, table: Option<DevPtr>, n: usize, gelu: bool }
}
kernel_args! {
    /// `exact_rope(x, cs, pos, n_head, head_dim, half, cap, neox)`.
    pub struct Rope { x: DevPtr, cs: DevPtr, pos: DevPtr, n_head: usize, head_dim: usize, half: usize, cap: usize, neox: bool }
}
kernel_args! {
    /// Attention of the query rows over the f16 caches (`exact_attention`): `stride` is the
    /// scores scratch's row length (≥ the last position + 1), `mode`/`chunk` from
    /// `exact::order::attention_mode`.
    pub struct AttnArgs {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, pos: DevPtr, scores: DevPtr,
        n_head: usize, n_kv_head: usize, head_dim: usize, stride: usize, window: usize, scale: f32, mode: i32, chunk: i32,
    }
}

const RMSNORM: Kernel<RmsNorm> = Kernel::new("exact_rmsnorm");
const BINARY: Kernel<Binary> = Kernel::new("exact_binary");
const GLU: Kernel<Glu> = Kernel::new("exact_glu");
const ROPE: Kernel<Rope> = Kernel::new("exact_rope");
const ATTENTION: Kernel<AttnArgs> = Kernel::new("exact_attention");

pub const FAMILY: Family = Family {
    name: "exact_ops",
    source: include_str!("../../../../../kernels-hip/exact_ops.hip"),
    kernels: &[&[RMSNORM.sig(), BINARY.sig(), GLU.sig(), ROPE.sig(), ATTENTION.sig()]],
};

fn ceil(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

/// out = rmsnorm(x) ⊙ w per row of n (w none: no weight). x, out: [rows, n] (may alias).
pub fn rmsnorm(d: &dyn Launch, x: DevPtr, w: Option<DevPtr>, out: DevPtr, rows: usize, n: usize, eps: f32) -> R {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    RMSNORM.launch(d, [rows as u32, 1, 1], [128, 1, 1], &RmsNorm { x, w, out, n, eps })
}

/// out = a + b over n.
pub fn add(d: &dyn Launch, a: DevPtr, b: DevPtr, out: DevPtr, n: usize) -> R {
    binary(d, Binary { a, b, out, n, s: 0.0, op: 0 })
}

/// x = x · s over n.
pub fn scale(d: &dyn Launch, x: DevPtr, n: usize, s: f32) -> R {
    binary(d, Binary { a: x, b: 0, out: x, n, s, op: 1 })
}

fn binary(d: &dyn Launch, a: Binary) -> R {
    if a.n == 0 {
        return Ok(());
    }
    BINARY.launch(d, [ceil(a.n, 256), 1, 1], [256, 1, 1], &a)
}

/// out = act(g) ⊙ u over n; `gelu`: the device GELU table (act 1), else SiLU.
pub fn glu(d: &dyn Launch, g: DevPtr, u: DevPtr, out: DevPtr, n: usize, gelu: Option<DevPtr>) -> R {
    if n == 0 {
        return Ok(());
    }
    GLU.launch(d, [ceil(n, 256), 1, 1], [256, 1, 1], &Glu { g, u, out, table: gelu, n, gelu: gelu.is_some() })
}

/// RoPE of x [n_tok, n_head, head_dim] in place; token t at `pos[t]` (device i32), its
/// angles row `pos[t]` of the table `cs` (`cap` rows of n_rot/2 cos, then `cap` of sin).
#[allow(clippy::too_many_arguments)]
pub fn rope(d: &dyn Launch, x: DevPtr, cs: DevPtr, pos: DevPtr, cap: usize, n_tok: usize, n_head: usize, head_dim: usize, n_rot: usize, neox: bool) -> R {
    let half = n_rot / 2;
    if n_tok == 0 || n_head == 0 || half == 0 {
        return Ok(());
    }
    ROPE.launch(d, [ceil(half, 64), n_head as u32, n_tok as u32], [64, 1, 1], &Rope { x, cs, pos, n_head, head_dim, half, cap, neox })
}

/// Attention of `n_tok` query rows (see [`AttnArgs`]).
pub fn attention(d: &dyn Launch, n_tok: usize, a: &AttnArgs) -> R {
    if a.head_dim > 256 || a.n_kv_head == 0 || a.n_head % a.n_kv_head != 0 {
        return Err(unsupported(format!("attention with head_dim {} (≤ 256), {} heads over {} KV heads", a.head_dim, a.n_head, a.n_kv_head)));
    }
    if n_tok == 0 {
        return Ok(());
    }
    ATTENTION.launch(d, [a.n_head as u32, n_tok as u32, 1], [64, 1, 1], a)
}
