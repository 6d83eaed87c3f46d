//! `kernels-hip/delta.hip`: qwen35's gated delta net on the device — the causal conv
//! (`delta_conv_k4`, in place over the projection, the conv state shifted), the delta rule
//! per value head and group of 16 state rows (`delta_rule_h<head_k_dim>`: the L2 norms,
//! gates, state update and output read, the rows held in registers over the chunk) and the
//! gated RMS norm (`delta_norm`) — and the gated attention's `split_halves_f32` /
//! `mul_sigmoid_f32`, and `copy_strided_f32` (qwen3next's packed projections taken apart).
//!
//! A chunk's states are one sequence's ([`States::One`]) or one per row of a batched
//! step ([`States::Table`]: a device table of `(conv, ssm)` addresses, row by row).

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::backend::DeltaDims;
use crate::kernel_args;

type R = Result<(), GpuError>;

/// Taps of the one convolution kernel (every qwen35 file has 4).
pub const CONV_TAPS: usize = 4;
/// State rows per block of the delta rule (delta.hip: `DELTA_WARPS` × `DELTA_ROWS`).
pub const ROWS_PER_BLOCK: usize = 16;

kernel_args! {
    /// `delta_conv_k4(qkv, w, conv0, table, ch, per)`.
    pub struct Conv { qkv: DevPtr, w: DevPtr, conv0: Option<DevPtr>, table: Option<DevPtr>, ch: usize, per: usize }
}
kernel_args! {
    /// `delta_rule_h<hk>(xc, beta, alpha, dt_bias, a, out, ssm0, table, per, n_kh, nv, hv, eps, grouped)`.
    pub struct Rule {
        xc: DevPtr, beta: DevPtr, alpha: DevPtr, dt_bias: DevPtr, a: DevPtr,
        out: DevPtr, ssm0: Option<DevPtr>, table: Option<DevPtr>, per: usize, n_kh: usize, nv: usize, hv: usize, eps: f32, grouped: bool,
    }
}
kernel_args! {
    /// `delta_norm(o, z, norm_w, n_rows, hv, eps)`.
    pub struct Norm { o: DevPtr, z: DevPtr, norm_w: DevPtr, n_rows: usize, hv: usize, eps: f32 }
}
kernel_args! {
    /// `split_halves_f32(src, a, b, n_rows, half)`.
    pub struct Split { src: DevPtr, a: DevPtr, b: DevPtr, n_rows: usize, half: usize }
}
kernel_args! {
    /// `copy_strided_f32(src, dst, n0, n1, n2, ss0, ss1, ds0, ds1)`.
    pub struct Copy3 { src: DevPtr, dst: DevPtr, n0: usize, n1: usize, n2: usize, ss0: usize, ss1: usize, ds0: usize, ds1: usize }
}
kernel_args! {
    /// `mul_sigmoid_f32(x, gate, n, row_len, per_row)`.
    pub struct MulSigmoid { x: DevPtr, gate: DevPtr, n: usize, row_len: usize, per_row: bool }
}

const CONV: Kernel<Conv> = Kernel::new("delta_conv_k4");
const RULE: [(usize, Kernel<Rule>); 2] = [(64, Kernel::new("delta_rule_h64")), (128, Kernel::new("delta_rule_h128"))];
const NORM: Kernel<Norm> = Kernel::new("delta_norm");
const SPLIT: Kernel<Split> = Kernel::new("split_halves_f32");
const MUL_SIGMOID: Kernel<MulSigmoid> = Kernel::new("mul_sigmoid_f32");
const COPY3: Kernel<Copy3> = Kernel::new("copy_strided_f32");

pub const FAMILY: Family = Family {
    name: "delta",
    source: include_str!("../../../../../kernels-hip/delta.hip"),
    kernels: &[&[CONV.sig(), RULE[0].1.sig(), RULE[1].1.sig(), NORM.sig(), SPLIT.sig(), MUL_SIGMOID.sig(), COPY3.sig()]],
};

/// Whether the kernels take a layer of these dimensions.
pub fn supports(d: &DeltaDims) -> bool {
    d.d_conv == CONV_TAPS && RULE.iter().any(|r| r.0 == d.head_k_dim) && d.head_v_dim > 0 && d.n_k_heads > 0 && d.n_v_heads % d.n_k_heads == 0
}

/// Whose states a chunk updates.
#[derive(Clone, Copy, Debug)]
pub enum States {
    /// One sequence's conv and delta-rule state (every token of the chunk).
    One { conv: DevPtr, ssm: DevPtr },
    /// Row `t` of a batched step: `table[2t]` (conv) and `table[2t + 1]` (delta rule).
    Table(DevPtr),
}

impl States {
    fn split(self) -> (Option<DevPtr>, Option<DevPtr>, Option<DevPtr>) {
        match self {
            States::One { conv, ssm } => (Some(conv), Some(ssm), None),
            States::Table(t) => (None, None, Some(t)),
        }
    }
}

/// A layer's device operands: `qkv` (`[n, channels]`, overwritten by the convolution's
/// output), `z` and `out` (`[n, value_dim]`), `beta`, `alpha` (`[n, n_v_heads]`) and the
/// weights as f32 (`conv` `[channels][4]`, `dt_bias`, `a`, `norm`).
#[derive(Clone, Copy, Debug)]
pub struct Operands {
    pub qkv: DevPtr,
    pub z: DevPtr,
    pub beta: DevPtr,
    pub alpha: DevPtr,
    pub out: DevPtr,
    pub conv_w: DevPtr,
    pub dt_bias: DevPtr,
    pub a: DevPtr,
    pub norm: DevPtr,
}

/// The recurrent core over `n_states` states of `per` tokens each: the conv, the rule,
/// the norm.
pub fn gated_delta_net(dev: &dyn Launch, d: &DeltaDims, x: &Operands, st: States, n_states: usize, per: usize, eps: f32) -> R {
    if !supports(d) {
        return Err(GpuError::Unsupported(format!("gated_delta_net: {d:?} (4 taps, key heads of 64 or 128)")));
    }
    if n_states == 0 || per == 0 {
        return Ok(());
    }
    let (conv0, ssm0, table) = st.split();
    let ch = d.channels();
    CONV.launch(dev, [ch.div_ceil(128) as u32, n_states as u32, 1], [128, 1, 1], &Conv { qkv: x.qkv, w: x.conv_w, conv0, table, ch, per })?;
    let kernel = RULE.iter().find(|r| r.0 == d.head_k_dim).map(|r| r.1).ok_or_else(|| GpuError::Unsupported(format!("delta rule: heads of {}", d.head_k_dim)))?;
    let args = Rule {
        xc: x.qkv, beta: x.beta, alpha: x.alpha, dt_bias: x.dt_bias, a: x.a,
        out: x.out, ssm0, table, per, n_kh: d.n_k_heads, nv: d.n_v_heads, hv: d.head_v_dim, eps, grouped: d.grouped,
    };
    let groups = d.head_v_dim.div_ceil(ROWS_PER_BLOCK) as u32;
    kernel.launch(dev, [d.n_v_heads as u32, groups, n_states as u32], [128, 1, 1], &args)?;
    let n_rows = n_states * per * d.n_v_heads;
    NORM.launch(dev, [n_rows.div_ceil(4) as u32, 1, 1], [128, 1, 1], &Norm { o: x.out, z: x.z, norm_w: x.norm, n_rows, hv: d.head_v_dim, eps })
}

/// Row `r` of `src` (`2·half` values) into row `r` of `a` (first half) and `b` (second).
pub fn split_halves(dev: &dyn Launch, src: DevPtr, a: DevPtr, b: DevPtr, n_rows: usize, half: usize) -> R {
    let n = n_rows * half;
    if n == 0 {
        return Ok(());
    }
    SPLIT.launch(dev, [n.div_ceil(256) as u32, 1, 1], [256, 1, 1], &Split { src, a, b, n_rows, half })
}

/// `x[i] *= σ(gate[i])`, or with `per_row` `x[r][j] *= σ(gate[r])` over rows of `row_len`.
pub fn mul_sigmoid(dev: &dyn Launch, x: DevPtr, gate: DevPtr, n_rows: usize, row_len: usize, per_row: bool) -> R {
    let n = n_rows * row_len;
    if n == 0 {
        return Ok(());
    }
    MUL_SIGMOID.launch(dev, [n.div_ceil(256) as u32, 1, 1], [256, 1, 1], &MulSigmoid { x, gate, n, row_len, per_row })
}

/// The 3-D block `n` (`n[2]` contiguous) from `src` (strides `ss`) to `dst` (strides `ds`),
/// both already offset to the block's first element.
pub fn copy_strided(dev: &dyn Launch, src: DevPtr, dst: DevPtr, n: [usize; 3], ss: [usize; 2], ds: [usize; 2]) -> R {
    let total = n[0] * n[1] * n[2];
    if total == 0 {
        return Ok(());
    }
    let args = Copy3 { src, dst, n0: n[0], n1: n[1], n2: n[2], ss0: ss[0], ss1: ss[1], ds0: ds[0], ds1: ds[1] };
    COPY3.launch(dev, [total.div_ceil(256) as u32, 1, 1], [256, 1, 1], &args)
}
