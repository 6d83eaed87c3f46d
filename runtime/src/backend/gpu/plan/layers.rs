//! The plan's choices for the layers other than dense attention and matmuls: a
//! mixture-of-experts FFN and qwen35's gated delta net (part of [`super`], the one place
//! that chooses kernels).

use super::Tuning;
use crate::backend::gpu::family::{delta, gemm, moe};
use crate::quant::GgmlType;

/// How a mixture-of-experts FFN runs (`GpuBackend::moe_ffn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Moe {
    /// Device routing; expert matvecs one (token, expert) pair per read of the expert's
    /// rows (`moe::mv_pairs`): decode.
    Pairs,
    /// Device routing; pairs grouped by expert, tiles of 8 pairs per read
    /// (`moe::mv_grouped`): batched decode, and prefill of types the GEMM does not read.
    Grouped,
    /// Device routing; pairs grouped by expert, one matrix-core GEMM launch per projection
    /// over every expert, tiles of 16 pairs (`gemm::gemm_moe`): prefill.
    Gemm,
    /// The trait's default (host routing, per-expert matmuls): expert types or shapes the
    /// expert kernels do not take, in a layer without gpt-oss's extras.
    Unfused,
    /// The CPU's arithmetic on the rows read back (`cpu::moe::moe_host`): host experts
    /// (`--n-cpu-moe`, or fit's), or experts / extras the kernels do not take.
    Host,
}

/// What a MoE layer is besides its expert tensors: `host_experts` (they stay in host
/// memory), `plain` (`MoeFfn::plain`: qwen3moe's, which the trait's default computes),
/// `device_extras` (gpt-oss's extras are ones the kernels compute: every bias F32, read
/// in place, and gate/up biases only beside `swiglu_oai`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeForm {
    pub host_experts: bool,
    pub plain: bool,
    pub device_extras: bool,
}

/// `p`'s [`MoeForm`], its experts on the host when `host_experts`.
pub fn moe_form(p: &crate::backend::MoeFfn, host_experts: bool) -> MoeForm {
    let f32s = |b: &crate::backend::MoeBiases| [b.router, b.gate, b.up, b.down].iter().all(|w| w.ty() == GgmlType::F32);
    // gemma4's separate router input and expert scales: the host's arithmetic for now.
    let gemma4 = p.router_x.is_some() || p.expert_scale.is_some() || p.gate_up_fused;
    MoeForm { host_experts, plain: p.plain(), device_extras: !gemma4 && p.biases.as_ref().is_none_or(|b| p.swiglu_oai && f32s(b)) }
}

/// How a MoE FFN over `n_tok` tokens runs: `n_exp` experts, `k` used, `experts`: the
/// gate, up and down expert tensors as (type, row length).
pub fn moe_ffn(n_tok: usize, n_exp: usize, k: usize, experts: [(GgmlType, usize); 3], form: MoeForm, t: &Tuning) -> Moe {
    let ok = n_exp <= moe::MAX_EXPERTS && k <= 32 && experts.iter().all(|&(ty, len)| moe::supports(ty, len));
    if form.host_experts || (!form.plain && (!ok || !form.device_extras)) {
        Moe::Host
    } else if !ok {
        Moe::Unfused
    } else if n_tok * k >= t.moe_gemm_min * n_exp && experts.iter().all(|&(ty, len)| gemm::moe_supports(ty, len)) {
        Moe::Gemm
    } else if n_tok * k >= t.moe_group_min {
        Moe::Grouped
    } else {
        Moe::Pairs
    }
}

/// How qwen35's gated delta net runs (`Backend::gated_delta_net`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delta {
    /// `delta_conv_k4`, `delta_rule_h<head_k_dim>` and `delta_norm` (`family/delta.rs`): one
    /// launch of each per layer for a chunk of one sequence or a batched step, the states on
    /// the device.
    Device,
    /// The trait's default (operands and states read back, the host's arithmetic):
    /// dimensions the kernels do not take, or a conv weight not stored as F32 (asking its
    /// f32 form would make a second copy of it).
    Host,
}

/// How a gated delta net layer of dimensions `d` with a conv weight of `conv_ty` runs
/// (`Tuning::delta` off: on the host).
pub fn gated_delta_net(d: &crate::backend::DeltaDims, conv_ty: GgmlType, t: &Tuning) -> Delta {
    if t.delta && delta::supports(d) && conv_ty == GgmlType::F32 {
        Delta::Device
    } else {
        Delta::Host
    }
}
