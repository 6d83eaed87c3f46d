//! Row dot-product kernels: one weight row (stored type) against one activation row
//! (already in [`vec_dot_type`](super::vec_dot_type)), picked per type and instruction set.
//!
//! Every kernel computes exact integer sums per block and scales them like ggml's
//! `ggml_vec_dot_*`; the SIMD kernels compute the same integers, so they differ from the
//! scalar ones only in the order of the float additions.

use super::types::GgmlType;
use super::{float, grid, iq4, kquant, q23k, q32, q6k, q8};

pub use super::{DotFn, RowsFn};
pub(crate) use super::Tokens4Fn;

/// A kernel for one weight type: one row at a time, or (faster) many rows at once.
#[derive(Clone, Copy)]
pub enum Kernel {
    Row(DotFn),
    Rows(RowsFn),
}

impl Kernel {
    /// `out[r] = w_r · x` for the consecutive rows of `w` (`row_bytes` each).
    #[inline]
    pub fn rows(self, w: &[u8], row_bytes: usize, x: &[u8], n: usize, out: &mut [f32]) {
        match self {
            Kernel::Rows(f) => f(&w[..out.len() * row_bytes], x, n, out),
            Kernel::Row(f) => {
                for (o, wr) in out.iter_mut().zip(w.chunks(row_bytes.max(1))) {
                    *o = f(wr, x, n);
                }
            }
        }
    }
}

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
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
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
        GgmlType::Q2_K => q23k::dot_q2_k,
        GgmlType::Q3_K => q23k::dot_q3_k,
        GgmlType::IQ4_NL => iq4::dot_iq4_nl,
        GgmlType::IQ4_XS => iq4::dot_iq4_xs,
        GgmlType::MXFP4 => iq4::dot_mxfp4,
        GgmlType::IQ3_S => grid::dot_iq3_s,
        GgmlType::IQ3_XXS => grid::dot_iq3_xxs,
        GgmlType::IQ2_XXS => grid::dot_iq2_xxs,
        GgmlType::IQ2_XS => grid::dot_iq2_xs,
        GgmlType::IQ2_S => grid::dot_iq2_s,
        GgmlType::IQ1_S => grid::dot_iq1_s,
        GgmlType::IQ1_M => grid::dot_iq1_m,
        _ => return None,
    })
}

/// The one-row kernel for weights of type `ty` on `isa`; falls back to the scalar
/// kernel when `isa` is not available on this CPU or has no kernel for the type.
pub fn kernel(ty: GgmlType, isa: Isa) -> Option<DotFn> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        if let Some((f, _)) = super::simd_avx2::kernels(ty) {
            return Some(f);
        }
    }
    let _ = isa;
    scalar_kernel(ty)
}

/// The kernel for weights streamed from memory once (decode: one activation row): one
/// row at a time. Measured on the 2-core EPYC: several rows read side by side defeat
/// the hardware prefetcher and run ~2.5× slower per CPU-second once the weights are
/// not in cache, although they win when the rows are cached (see [`rows_kernel`]).
/// Where the instruction set has a one-stream many-row kernel (same results as the
/// one-row kernel, row by row) it is used: no call per row, activation blocks prepared
/// once.
pub fn stream_kernel(ty: GgmlType, isa: Isa) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        if let Some(f) = super::simd_avx2::stream_kernel(ty) {
            return Some(Kernel::Rows(f));
        }
    }
    kernel(ty, isa).map(Kernel::Row)
}

/// The fastest kernel for many cache-resident rows of type `ty` on `isa` (scalar
/// fallback as [`kernel`]): used when a band of rows is reused for many tokens.
pub fn rows_kernel(ty: GgmlType, isa: Isa) -> Option<Kernel> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        if let Some((_, f)) = super::simd_avx2::kernels(ty) {
            return Some(Kernel::Rows(f));
        }
    }
    let _ = isa;
    scalar_kernel(ty).map(Kernel::Row)
}


/// For weights of `ty` as stored: a kernel taking four tokens at once (each row's
/// results equal the [`rows_kernel`]'s), where `isa` has one.
pub(crate) fn tokens4(ty: GgmlType, isa: Isa) -> Option<Tokens4Fn> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        return super::simd_avx2::tokens4(ty);
    }
    let _ = (ty, isa);
    None
}

/// Tokens from which llama.cpp's CPU backend switches K-quant weights (those it does
/// not repack) to its tiled GEMM, whose summation order differs from its vector dot's.
pub(crate) const BATCH_ORDER_MIN_TOKENS: usize = 8;

/// For a matmul of ≥ [`BATCH_ORDER_MIN_TOKENS`] tokens on `isa`: kernels (one token;
/// four tokens) that round as llama.cpp's batched path for `ty`, where that differs from
/// [`rows_kernel`] / [`tokens4`].
pub(crate) fn batch_order(ty: GgmlType, isa: Isa) -> Option<(Kernel, Tokens4Fn)> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        return super::simd_avx2::batch_order(ty).map(|(r, q)| (Kernel::Rows(r), q));
    }
    let _ = (ty, isa);
    None
}

/// For many-token matmuls on `isa`: a kernel for row bands first expanded by
/// `q32::expand` (bytes per expanded block alongside), when that is faster than
/// unpacking the packed blocks for every token. `None`: use [`rows_kernel`].
pub(crate) fn expanded_kernel(ty: GgmlType, isa: Isa) -> Option<(Kernel, usize)> {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 && avx2_detected() {
        let eb = q32::expanded_block_bytes(ty)?;
        return super::simd_avx2::expanded_kernel(ty).map(|f| (Kernel::Rows(f), eb));
    }
    let _ = (ty, isa);
    None
}
