//! Quantized block formats (ggml's, bit for bit) and the CPU reference kernels.
//!
//! API contract (other modules code against these names):
//! - [`dequantize`] / [`quantize`] convert whole blocks between a type and f32.
//! - [`vec_dot_type`] names the activation format llama.cpp's CPU backend pairs with a
//!   weight type (Q8_K for K-quants, Q8_0 / Q8_1 for the 32-blocks, F16/BF16/F32 for floats).
//! - [`matmul`] computes `y[t][r] = Σ_k W[r][k]·x[t][k]` over rayon's pool, quantizing the
//!   activations to [`vec_dot_type`] first, exactly as llama.cpp does.
//! - `row64` packs Q4_K / Q6_K into the GPU row-interleaved layout and back.

mod types;

pub use types::GgmlType;

/// A quant-kernel usage error (sizes that do not match the type's blocks).
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{ty}: {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock { ty: GgmlType, n: usize, block: usize },
    #[error("{ty}: expected {expected} bytes, got {got}")]
    ByteLen { ty: GgmlType, expected: usize, got: usize },
    #[error("{0} cannot be quantized to")]
    NoQuantizer(GgmlType),
}

/// Decode `dst.len()` elements of type `ty` from `src`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!("quant")
}

/// Encode `src` as type `ty` into `dst` (exactly `ty.bytes_for(src.len())` bytes).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let _ = (ty, src, dst);
    todo!("quant")
}

/// The activation type llama.cpp's CPU dot product pairs with weights of type `ty`.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    let _ = ty;
    todo!("quant")
}

/// `y[t*rows + r] = Σ_k W[r][k] · x[t*k_len + k]` for `t < n_tok`.
/// `w` holds `rows` rows of `k_len` elements of type `ty`.
pub fn matmul(
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    k_len: usize,
    x: &[f32],
    n_tok: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let _ = (w, ty, rows, k_len, x, n_tok, y);
    todo!("quant")
}
