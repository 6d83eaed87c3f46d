//! Quantized block formats (ggml's, bit for bit) and the CPU reference kernels.
//!
//! API contract (other modules code against these names):
//! - [`dequantize`] / [`quantize`] convert whole blocks between a type and f32.
//! - [`vec_dot_type`] names the activation format llama.cpp's CPU backend pairs with a
//!   weight type (Q8_K for K-quants, Q8_0 / Q8_1 for the 32-blocks, F16/BF16/F32 for floats).
//! - [`matmul`] computes `y[t][r] = Σ_k W[r][k]·x[t][k]` over rayon's pool, quantizing the
//!   activations to [`vec_dot_type`] first, exactly as llama.cpp does.
//!   [`quantize_rows`] + [`matmul_quantized`] split the two steps so one converted input
//!   can feed several weights.
//! - [`row64`] packs Q4_K / Q6_K into the GPU row-interleaved layout and back.
//!
//! Files: `float` (F32/F16/BF16), `q8` (Q8_0/Q8_1), `q32` (Q4_0/Q4_1/Q5_0/Q5_1),
//! `q23k` (Q2_K/Q3_K), `kquant` (Q4_K/Q5_K), `q6k`, `q8k`, `iq4` (IQ4_NL/IQ4_XS/MXFP4),
//! `grid` (IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M over the codebooks of
//! `iq_grids`), `fit` (the K-quant scale searches), `dot` (kernel choice), `simd_avx2` (the only
//! `unsafe` here), `matmul`, `row64`, `check` (non-finite scales and inputs).

mod check;
mod dot;
mod fit;
mod float;
mod grid;
mod iq1_quant;
mod iq2_quant;
mod iq2s_quant;
mod iq3s_quant;
mod iq3xxs_quant;
mod iq_grids;
mod iq_grids_data;
mod iq4;
mod kquant;
mod matmul;
mod q23k;
mod q32;
mod q6k;
mod q8;
mod q8k;
pub mod row64;
#[cfg(target_arch = "x86_64")]
mod simd_avx2;
mod types;

pub use check::check_scales;
pub use grid::random_blocks as grid_random_blocks;
pub use dot::{kernel, rows_kernel, scalar_kernel, stream_kernel, Isa, Kernel};

/// `Σ_k w[k]·x[k]` over `n` elements: `w` in the weight type, `x` in its activation type
/// (the signature of every dot kernel, scalar or SIMD: `dot.rs` chooses, `simd_avx2`
/// provides).
pub type DotFn = fn(w: &[u8], x: &[u8], n: usize) -> f32;

/// `out[r] = Σ_k w_r[k]·x[k]` for `out.len()` consecutive weight rows in `w` (each
/// `bytes_for(n)` bytes) against one activation row `x`.
pub type RowsFn = fn(w: &[u8], x: &[u8], n: usize, out: &mut [f32]);

/// Four activation rows (`xs`) against the consecutive weight rows of `w`: `out` is
/// `[4, rows]` (token-major).
pub(crate) type Tokens4Fn = fn(w: &[u8], xs: [&[u8]; 4], n: usize, out: &mut [f32]);
pub use matmul::{
    matmul_batch, matmul_batch_on, matmul_quantized, matmul_quantized_on, matmul_quantized_rowwise_on, matmul_with, par_chunks,
    quantize_rows, quantize_rows_on, BatchItem, Parallel, QuantizedRows, RayonPool,
};
pub use types::GgmlType;

/// A quant-kernel usage error (sizes that do not match the type's blocks).
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    #[error("{ty}: {n} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        ty: GgmlType,
        n: usize,
        block: usize,
    },
    #[error("{ty}: expected {expected} bytes, got {got}")]
    ByteLen {
        ty: GgmlType,
        expected: usize,
        got: usize,
    },
    #[error("{0} cannot be quantized to (lode has no quantizer for it yet)")]
    NoQuantizer(GgmlType),
    #[error("{0} needs an importance matrix to quantize to (llama.cpp refuses it without one too): pass --imatrix FILE")]
    NeedsImatrix(GgmlType),
    #[error("{ty}: {n} importance weights do not match rows of {row} elements")]
    ImatrixLen { ty: GgmlType, n: usize, row: usize },
    #[error("{ty} is not supported: lode cannot convert it to or from f32 (supported: {})", GgmlType::names(&GgmlType::ALL), ty = .0)]
    Unsupported(GgmlType),
    #[error("{0} is an activation-only format: there is no dot product with it as weights")]
    NoDot(GgmlType),
    #[error("matmul: {what}: expected {expected} elements, got {got}")]
    Shape {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("{0} has no row64 layout (only Q4_K and Q6_K do)")]
    NoRow64(GgmlType),
    #[error("matmul: {weight} weights need {} activations, got {got}", vec_dot_type(*weight))]
    ActivationType { weight: GgmlType, got: GgmlType },
    #[error("{ty}: block {block} has a non-finite scale ({field} = {value})")]
    NonFiniteScale { ty: GgmlType, block: usize, field: &'static str, value: f32 },
    #[error("{ty}: element {index} to quantize is {value} (only finite values can be quantized)")]
    NonFiniteInput { ty: GgmlType, index: usize, value: f32 },
}

/// Check that `n` elements of `ty` are whole blocks occupying exactly `bytes` bytes.
fn check_blocks(ty: GgmlType, n: usize, bytes: usize) -> Result<(), QuantError> {
    let be = ty.block_elems();
    if n % be != 0 {
        return Err(QuantError::PartialBlock { ty, n, block: be });
    }
    let expected = n / be * ty.block_bytes();
    if bytes != expected {
        return Err(QuantError::ByteLen {
            ty,
            expected,
            got: bytes,
        });
    }
    Ok(())
}

/// Decode `dst.len()` elements of type `ty` from `src` (exactly `ty.bytes_for(dst.len())`
/// bytes). Bit-exact with ggml's `dequantize_row_*` and gguf-py's `dequantize`.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_blocks(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => float::dequant_f32(src, dst),
        GgmlType::F16 => float::dequant_f16(src, dst),
        GgmlType::BF16 => float::dequant_bf16(src, dst),
        GgmlType::Q4_0 => q32::dequant_q4_0(src, dst),
        GgmlType::Q4_1 => q32::dequant_q4_1(src, dst),
        GgmlType::Q5_0 => q32::dequant_q5_0(src, dst),
        GgmlType::Q5_1 => q32::dequant_q5_1(src, dst),
        GgmlType::Q8_0 => q8::dequant_q8_0(src, dst),
        GgmlType::Q8_1 => q8::dequant_q8_1(src, dst),
        GgmlType::Q4_K => kquant::dequant_q4_k(src, dst),
        GgmlType::Q5_K => kquant::dequant_q5_k(src, dst),
        GgmlType::Q6_K => q6k::dequant_q6_k(src, dst),
        GgmlType::Q8_K => q8k::dequant_q8_k(src, dst),
        GgmlType::Q2_K => q23k::dequant_q2_k(src, dst),
        GgmlType::Q3_K => q23k::dequant_q3_k(src, dst),
        GgmlType::IQ4_NL => iq4::dequant_iq4_nl(src, dst),
        GgmlType::IQ4_XS => iq4::dequant_iq4_xs(src, dst),
        GgmlType::MXFP4 => iq4::dequant_mxfp4(src, dst),
        ty if GgmlType::GRID_WEIGHTS.contains(&ty) => grid::dequant(ty, src, dst),
        other => return Err(QuantError::Unsupported(other)),
    }
    Ok(())
}

/// Encode `src` as type `ty` into `dst` (exactly `ty.bytes_for(src.len())` bytes), with
/// ggml's reference quantizers (`quantize_row_*_ref`).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_blocks(ty, src.len(), dst.len())?;
    match ty {
        GgmlType::F32 => float::quant_f32(src, dst),
        GgmlType::F16 => float::quant_f16(src, dst),
        GgmlType::BF16 => float::quant_bf16(src, dst),
        GgmlType::Q4_0 => q32::quant_q4_0(src, dst),
        GgmlType::Q4_1 => q32::quant_q4_1(src, dst),
        GgmlType::Q5_0 => q32::quant_q5_0(src, dst),
        GgmlType::Q5_1 => q32::quant_q5_1(src, dst),
        GgmlType::Q8_0 => q8::quant_q8_0(src, dst),
        GgmlType::Q8_1 => q8::quant_q8_1(src, dst),
        GgmlType::Q4_K => kquant::quant_q4_k(src, dst, None),
        GgmlType::Q5_K => kquant::quant_q5_k(src, dst, None),
        GgmlType::Q6_K => q6k::quant_q6_k(src, dst, None),
        GgmlType::Q8_K => q8k::quant_q8_k(src, dst),
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_NL | GgmlType::IQ4_XS | GgmlType::MXFP4 | GgmlType::IQ3_S | GgmlType::IQ3_XXS | GgmlType::IQ2_S | GgmlType::IQ1_M => {
            // ggml's reference quantizers give meaningless codes for NaN/Inf input; these
            // types only ever hold weights, so say so instead.
            check::finite_input(ty, src)?;
            match ty {
                GgmlType::Q2_K => q23k::quant_q2_k(src, dst),
                GgmlType::Q3_K => q23k::quant_q3_k(src, dst),
                GgmlType::IQ4_NL => iq4::quant_iq4_nl(src, dst, None),
                GgmlType::IQ4_XS => iq4::quant_iq4_xs(src, dst, None),
                GgmlType::IQ3_S => iq3s_quant::quant_iq3_s(src, dst, None),
                GgmlType::IQ3_XXS => iq3xxs_quant::quant_iq3_xxs(src, dst, None),
                GgmlType::IQ2_S => iq2s_quant::quant_iq2_s(src, dst, None),
                GgmlType::IQ1_M => iq1_quant::quant_iq1_m(src, dst, None),
                _ => iq4::quant_mxfp4(src, dst),
            }
        }
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ1_S => return Err(QuantError::NeedsImatrix(ty)),
        ty if GgmlType::GRID_WEIGHTS.contains(&ty) => return Err(QuantError::NoQuantizer(ty)),
        other => return Err(QuantError::Unsupported(other)),
    }
    Ok(())
}

/// Quantize weights as `llama-quantize` does (`ggml_quantize_chunk`): [`quantize`], except
/// Q8_0's reference rounding, with llama.cpp's per-column importance weights
/// (`quant_weights`, one per element of a row; `src` is whole rows of that length).
/// Returns whether the weights were used: `false` when given to a type whose lode
/// quantizer has no weighted form.
pub fn quantize_weighted(ty: GgmlType, src: &[f32], dst: &mut [u8], weights: Option<&[f32]>) -> Result<bool, QuantError> {
    if ty == GgmlType::Q8_0 {
        // llama.cpp's Q8_0 weight quantizer takes no importance weights.
        check_blocks(ty, src.len(), dst.len())?;
        q8::quant_q8_0_ref(src, dst);
        return Ok(true);
    }
    let Some(qw) = weights else {
        quantize(ty, src, dst)?;
        return Ok(true);
    };
    // The types whose quantizer takes importance weights (llama.cpp's MXFP4 ignores them).
    use GgmlType::*;
    if !matches!(ty, IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | IQ4_NL | IQ4_XS | Q4_0 | Q5_0 | Q4_1 | Q5_1 | Q2_K | Q3_K | Q4_K | Q5_K | Q6_K) {
        quantize(ty, src, dst)?;
        return Ok(matches!(ty, F32 | F16 | BF16 | MXFP4));
    }
    check_blocks(ty, src.len(), dst.len())?;
    if qw.is_empty() || qw.len() % ty.block_elems() != 0 || src.len() % qw.len() != 0 {
        return Err(QuantError::ImatrixLen { ty, n: qw.len(), row: src.len() });
    }
    check::finite_input(ty, src)?;
    check::finite_input(ty, qw)?;
    match ty {
        GgmlType::IQ2_XXS => iq2_quant::quant_iq2_xxs(src, dst, qw),
        GgmlType::IQ2_XS => iq2_quant::quant_iq2_xs(src, dst, qw),
        GgmlType::IQ2_S => iq2s_quant::quant_iq2_s(src, dst, Some(qw)),
        GgmlType::IQ4_NL => iq4::quant_iq4_nl(src, dst, Some(qw)),
        GgmlType::Q4_0 | GgmlType::Q5_0 => q32::quant_q4_5_0_weighted(ty, src, dst, qw),
        GgmlType::Q4_1 | GgmlType::Q5_1 => q32::quant_q4_5_1_weighted(ty, src, dst, qw),
        GgmlType::IQ4_XS => iq4::quant_iq4_xs(src, dst, Some(qw)),
        GgmlType::IQ1_S => iq1_quant::quant_iq1_s(src, dst, qw),
        GgmlType::IQ1_M => iq1_quant::quant_iq1_m(src, dst, Some(qw)),
        GgmlType::IQ3_S => iq3s_quant::quant_iq3_s(src, dst, Some(qw)),
        GgmlType::Q2_K => q23k::quant_q2_k_weighted(src, dst, qw),
        GgmlType::Q3_K => q23k::quant_q3_k_weighted(src, dst, qw),
        GgmlType::Q4_K => kquant::quant_q4_k(src, dst, Some(qw)),
        GgmlType::Q5_K => kquant::quant_q5_k(src, dst, Some(qw)),
        GgmlType::Q6_K => q6k::quant_q6_k(src, dst, Some(qw)),
        _ => iq3xxs_quant::quant_iq3_xxs(src, dst, Some(qw)),
    }
    Ok(true)
}

/// The activation type llama.cpp's CPU dot product pairs with weights of type `ty`
/// (F32 for the types lode has no dot product for: their kernel lookup fails).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
        GgmlType::Q2_K
        | GgmlType::Q3_K
        | GgmlType::Q4_K
        | GgmlType::Q5_K
        | GgmlType::Q6_K
        | GgmlType::Q8_K
        | GgmlType::IQ4_XS
        | GgmlType::IQ3_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ1_S
        | GgmlType::IQ1_M => GgmlType::Q8_K,
        _ => GgmlType::F32,
    }
}

/// `y[t*rows + r] = Σ_k W[r][k] · x[t*k_len + k]` for `t < n_tok`.
/// `w` holds `rows` rows of `k_len` elements of type `ty`; runs the fastest kernels this
/// CPU has ([`Isa::best`]) on rayon's current pool.
pub fn matmul(
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    k_len: usize,
    x: &[f32],
    n_tok: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    matmul_with(Isa::best(), w, ty, rows, k_len, x, n_tok, y)
}
