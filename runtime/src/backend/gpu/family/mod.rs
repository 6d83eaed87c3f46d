//! The kernel families: one module per `kernels-hip/<name>.hip` source, named after it.
//! Each declares its kernels' argument structs (`kernel_args!`, in the C signature's
//! order), the typed kernel handles, its [`Family`] entry (source and kernels), and the
//! launchers: shape checks, grids, one function per operation. `tests/kernel_signatures.rs`
//! checks every declared argument list against the preprocessed source.
//!
//! Which launcher runs for an op is `plan.rs`'s choice; the launchers only launch.

use super::launch::Family;

pub mod attention;
pub mod attn_decode;
pub mod decode_mv;
pub mod delta;
pub mod dequant;
pub mod elementwise;
pub mod exact_matmul;
pub mod exact_ops;
pub mod flash_attn;
pub mod gemm;
pub mod head_mv;
pub mod kvq_attn;
pub mod matvec;
pub mod mmq;
pub mod moe;
pub mod norm_rope;
pub mod quantize;

/// Every family, in the order the loader compiles them.
pub const ALL: &[Family] = &[
    quantize::FAMILY,
    matvec::FAMILY,
    decode_mv::FAMILY,
    head_mv::FAMILY,
    norm_rope::FAMILY,
    attention::FAMILY,
    attn_decode::FAMILY,
    elementwise::FAMILY,
    gemm::FAMILY,
    flash_attn::FAMILY,
    dequant::FAMILY,
    exact_matmul::FAMILY,
    exact_ops::FAMILY,
    moe::FAMILY,
    delta::FAMILY,
    mmq::FAMILY,
    kvq_attn::FAMILY,
];
