//! Row dot-product kernels: one weight row (stored type) against one activation row
//! (already in [`vec_dot_type`](super::vec_dot_type)), picked per type and instruction set.
//!
//! Every kernel computes exact integer sums per block and scales them like ggml's
//! `ggml_vec_dot_*`; the SIMD kernels compute the same integers, so they differ from the
//! scalar ones only in the order of the float additions.

use super::types::GgmlType;
use super::{float, kquant, q32, q6k, q8};

/// `Σ_k w[k]·x[k]` over `n` elements: `w` in the weight type, `x` in its activation type.
pub type DotFn = fn(w: &[u8], x: &[u8], n: usize) -> f32;

/// Which kernel family to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The portable reference (what every other path is tested against).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C, chosen at run time.
    Avx2,
}

impl Isa {
    /// The fastest instruction set this CPU supports.
    pub fn best() -> Isa {
        if Isa::Avx2.available() {
            Isa::Avx2
        } else {
            Isa::Scalar
        }
    }

    /// Whether this CPU can run the family.
    pub fn available(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 => avx2_detected(),
        }
    }

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn avx2_detected() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn avx2_detected() -> bool {
    false
}

/// The scalar reference kernel for weights of type `ty`, or `None` for the
/// activation-only types (Q8_1, Q8_K), which are never weights in ggml.
pub fn scalar_kernel(ty: GgmlType) -> Option<DotFn> {
    Some(match ty {
        GgmlType::F32 => float::dot_f32,
        GgmlType::F16 => float::dot_f16,
        GgmlType::BF16 => float::dot_bf16,
        GgmlType::Q4_0 => q32::dot_q4_0,
        GgmlType::Q4_1 => q32::dot_q4_1,
        GgmlType::Q5_0 => q32::dot_q5_0,
        GgmlType::Q5_1 => q32::dot_q5_1,
        GgmlType::Q8_0 => q8::dot_q8_0,
        GgmlType::Q4_K => kquant::dot_q4_k,
        GgmlType::Q5_K => kquant::dot_q5_k,
        GgmlType::Q6_K => q6k::dot_q6_k,
        GgmlType::Q8_1 | GgmlType::Q8_K => return None,
    })
}

/// The kernel for weights of type `ty` on `isa`; falls back to the scalar kernel when
/// `isa` is not available on this CPU or has no kernel for the type.
pub fn kernel(ty: GgmlType, isa: Isa) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        if let Some(f) = super::simd_avx2::kernel(ty) {
            return Some(f);
        }
    }
    let _ = isa;
    scalar_kernel(ty)
}
