//! Which summation order the CPU backend uses for a given call, so the exact kernels can
//! take the same one. Each choice names the CPU code it mirrors; if that code changes its
//! choice, the `exact_*` selftests fail.

use crate::quant::GgmlType;

/// A weight type the exact matmul supports, with its kernel code (`exact_matmul.hip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExactType {
    Q4_0 = 0,
    Q4_1 = 1,
    Q5_0 = 2,
    Q5_1 = 3,
    Q8_0 = 4,
    Q4K = 5,
    Q6K = 6,
    Q2K = 7,
    Q3K = 8,
    Iq4Nl = 9,
    Iq4Xs = 10,
    Mxfp4 = 11,
    Iq3S = 12,
    Iq3Xxs = 13,
    Iq2Xxs = 14,
    Iq2Xs = 15,
    Iq2S = 16,
    Iq1S = 17,
    Iq1M = 18,
}

impl ExactType {
    pub fn of(ty: GgmlType) -> Option<ExactType> {
        Some(match ty {
            GgmlType::Q4_0 => ExactType::Q4_0,
            GgmlType::Q4_1 => ExactType::Q4_1,
            GgmlType::Q5_0 => ExactType::Q5_0,
            GgmlType::Q5_1 => ExactType::Q5_1,
            GgmlType::Q8_0 => ExactType::Q8_0,
            GgmlType::Q4_K => ExactType::Q4K,
            GgmlType::Q6_K => ExactType::Q6K,
            GgmlType::Q2_K => ExactType::Q2K,
            GgmlType::Q3_K => ExactType::Q3K,
            GgmlType::IQ4_NL => ExactType::Iq4Nl,
            GgmlType::IQ4_XS => ExactType::Iq4Xs,
            GgmlType::MXFP4 => ExactType::Mxfp4,
            GgmlType::IQ3_S => ExactType::Iq3S,
            GgmlType::IQ3_XXS => ExactType::Iq3Xxs,
            GgmlType::IQ2_XXS => ExactType::Iq2Xxs,
            GgmlType::IQ2_XS => ExactType::Iq2Xs,
            GgmlType::IQ2_S => ExactType::Iq2S,
            GgmlType::IQ1_S => ExactType::Iq1S,
            GgmlType::IQ1_M => ExactType::Iq1M,
            _ => return None,
        })
    }

    /// The activation blocks the CPU pairs with this type (`quant::vec_dot_type`):
    /// (kernel kind: 0 q8_0, 1 q8_1, 2 q8_K; elements per block; bytes per block).
    pub fn act(self) -> (i32, usize, usize) {
        match self {
            ExactType::Q4_0 | ExactType::Q5_0 | ExactType::Q8_0 | ExactType::Iq4Nl | ExactType::Mxfp4 => (0, 32, 34),
            ExactType::Q4_1 | ExactType::Q5_1 => (1, 32, 36),
            // Q4_K, Q6_K, Q2_K, Q3_K, IQ4_XS and the grid types.
            _ => (2, 256, 292),
        }
    }

    /// The kernel's `order` argument for a matmul of `n_tok` tokens, as
    /// `quant::matmul_quantized_on` picks its kernels on AVX2:
    /// - Q4_K: tokens go four at a time through `q4_k_body4` (one FMA per 64 elements)
    ///   and the last `n_tok % 4` one at a time through `q4_k_body` (one per super-block);
    ///   tokens below the returned index take the first order. One token: `q4_k_body`.
    /// - Q6_K: from `BATCH_ORDER_MIN_TOKENS` (8) tokens on the tiled order (1), else the
    ///   vector-dot order (0).
    /// - The 32-element types sum alike in every path (one, four or expanded rows): 0.
    /// - The low-bit types (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4) and the grid types too:
    ///   every CPU kernel of theirs is bit-equal to the scalar dot.
    pub fn order(self, n_tok: usize) -> i32 {
        match self {
            ExactType::Q4K => (n_tok / 4 * 4) as i32,
            ExactType::Q6K => (n_tok >= 8) as i32,
            _ => 0,
        }
    }
}

/// llama.cpp's (and the CPU backend's) KV length padding.
const KV_PAD: usize = 256;
/// Query rows from which the CPU's flash attention uses its tiled kernel
/// (`cpu::attention::TILED_MIN_ROWS`).
const TILED_MIN_ROWS: usize = 64;

/// The attention kernel's (mode, chunk) for `rows` query tokens, the last at `pq`, as
/// `cpu::attention::Mode::of` (f16 cache) and `split_keys` choose: flash rows (0) below
/// 64 rows, tiled (1) from there; one decode row whose padded KV length reaches 512 splits
/// its keys into `threads` chunks (the CPU backend's thread count: the rounding depends on
/// it, as in llama.cpp).
pub fn attention_mode(rows: usize, pq: usize, threads: usize) -> (i32, i32) {
    if rows >= TILED_MIN_ROWS {
        return (1, 0);
    }
    let n_kv = (pq + 1).div_ceil(KV_PAD) * KV_PAD;
    let chunk = if rows == 1 && n_kv >= 512 { n_kv.div_ceil(threads.max(1)) } else { 0 };
    (0, chunk as i32)
}
