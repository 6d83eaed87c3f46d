//! The tensor element types (ggml's `ggml_type` ids) and their block shapes.
//!
//! Every id the `gguf` Python package 0.19.0 names is known here, so any valid file
//! opens (`lode inspect`): [`GgmlType::KNOWN`]. Only [`GgmlType::ALL`] can be converted
//! to and from f32, and only [`GgmlType::WEIGHTS`] can be a weight of a model run.

/// A ggml tensor element type, by its GGUF id.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
}

use GgmlType::*;

/// (type, name, elements per block, bytes per block), in id order: ggml.h's
/// `ggml_type` and gguf-py 0.19.0's `GGML_QUANT_SIZES` (except Q8_1, which gguf-py
/// still lists with ggml's old 40-byte layout; ggml's `block_q8_1` is 36 bytes).
const TABLE: [(GgmlType, &str, usize, usize); 34] = [
    (F32, "F32", 1, 4),
    (F16, "F16", 1, 2),
    (Q4_0, "Q4_0", 32, 18),
    (Q4_1, "Q4_1", 32, 20),
    (Q5_0, "Q5_0", 32, 22),
    (Q5_1, "Q5_1", 32, 24),
    (Q8_0, "Q8_0", 32, 34),
    (Q8_1, "Q8_1", 32, 36),
    (Q2_K, "Q2_K", 256, 84),
    (Q3_K, "Q3_K", 256, 110),
    (Q4_K, "Q4_K", 256, 144),
    (Q5_K, "Q5_K", 256, 176),
    (Q6_K, "Q6_K", 256, 210),
    (Q8_K, "Q8_K", 256, 292),
    (IQ2_XXS, "IQ2_XXS", 256, 66),
    (IQ2_XS, "IQ2_XS", 256, 74),
    (IQ3_XXS, "IQ3_XXS", 256, 98),
    (IQ1_S, "IQ1_S", 256, 50),
    (IQ4_NL, "IQ4_NL", 32, 18),
    (IQ3_S, "IQ3_S", 256, 110),
    (IQ2_S, "IQ2_S", 256, 82),
    (IQ4_XS, "IQ4_XS", 256, 136),
    (I8, "I8", 1, 1),
    (I16, "I16", 1, 2),
    (I32, "I32", 1, 4),
    (I64, "I64", 1, 8),
    (F64, "F64", 1, 8),
    (IQ1_M, "IQ1_M", 256, 56),
    (BF16, "BF16", 1, 2),
    (TQ1_0, "TQ1_0", 256, 54),
    (TQ2_0, "TQ2_0", 256, 66),
    (MXFP4, "MXFP4", 32, 17),
    (NVFP4, "NVFP4", 64, 36),
    (Q1_0, "Q1_0", 128, 18),
];

impl GgmlType {
    /// Every type a GGUF file may hold that lode knows by name and block size, in id
    /// order. Files with any of these open; tensors of other types than [`Self::ALL`]
    /// cannot be computed with.
    pub const KNOWN: [GgmlType; 34] = {
        let mut out = [F32; 34];
        let mut i = 0;
        while i < TABLE.len() {
            out[i] = TABLE[i].0;
            i += 1;
        }
        out
    };

    /// Every type lode converts to and from f32 (dequantize and quantize), in id order.
    pub const ALL: [GgmlType; 19] = [
        F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL,
        IQ3_S, IQ4_XS, BF16, MXFP4,
    ];

    /// Every type a weight tensor may have: [`GgmlType::ALL`] without the activation-only
    /// Q8_1 and Q8_K, and the [`Self::GRID_WEIGHTS`] (which lode dequantizes; of them it
    /// quantizes to IQ3_S only). The CPU backend and the GPU's fast numerics cover all of them;
    /// [`Self::BASE_WEIGHTS`] first, then [`Self::LOWBIT_WEIGHTS`], then the grid types.
    pub const WEIGHTS: [GgmlType; 23] = [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4, IQ3_S, IQ3_XXS, IQ2_XXS,
        IQ2_XS, IQ2_S, IQ1_S, IQ1_M,
    ];

    /// The eleven weight types lode read before the low-bit ones (the GPU selftest keeps
    /// their checks first, so their seeds stay).
    pub const BASE_WEIGHTS: [GgmlType; 11] = [F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K];

    /// The low-bit and non-linear types (issue 23): their blocks' scales are checked for
    /// NaN / Inf when a model loads.
    pub const LOWBIT_WEIGHTS: [GgmlType; 5] = [Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4];

    /// The codebook ("grid") types (issue 23): 8-value groups as indices into a fixed grid
    /// of ggml's, with sign bits. Dequantized and computed with like the low-bit types
    /// (scales checked at load); only IQ3_S is quantized to (llama.cpp makes the IQ2 / IQ1
    /// types only with an importance matrix).
    pub const GRID_WEIGHTS: [GgmlType; 7] = [IQ3_S, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M];

    /// Whether a block of this type has scales that must be checked for NaN / Inf at load
    /// (the low-bit and grid types).
    pub fn checks_scales(self) -> bool {
        Self::LOWBIT_WEIGHTS.contains(&self) || Self::GRID_WEIGHTS.contains(&self)
    }

    /// Whether lode can dequantize this type ([`Self::ALL`] and the grid types).
    pub fn can_dequantize(self) -> bool {
        self.is_supported() || Self::GRID_WEIGHTS.contains(&self)
    }

    /// The type with this GGUF id, or `None` for ids no ggml version lode knows
    /// defines (retired ids such as 4, 5, 31..=33, 36..=38 included).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.0 as u32 == id).map(|e| e.0)
    }

    /// The type named `name` as llama.cpp prints it (any case), among [`Self::KNOWN`].
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TABLE.iter().find(|e| e.1.eq_ignore_ascii_case(name)).map(|e| e.0)
    }

    fn entry(self) -> &'static (GgmlType, &'static str, usize, usize) {
        // Every variant is in TABLE (the `table_covers_every_variant` test).
        TABLE.iter().find(|e| e.0 == self).unwrap_or(&TABLE[0])
    }

    /// The GGUF id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The name llama.cpp prints (`Q4_K`, `F32`, …).
    pub fn name(self) -> &'static str {
        self.entry().1
    }

    /// Elements per block (1 for float and integer types).
    pub fn block_elems(self) -> usize {
        self.entry().2
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        self.entry().3
    }

    /// Bytes needed for `n` elements, or `None` if `n` is not a whole number of blocks
    /// or the size overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if n % be != 0 {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }

    /// True for the block-quantized types.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Whether lode can convert this type to and from f32 (it is in [`Self::ALL`]).
    pub fn is_supported(self) -> bool {
        Self::ALL.contains(&self)
    }

    /// The names of `types`, comma-separated (for messages).
    pub fn names(types: &[GgmlType]) -> String {
        types.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::KNOWN {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        for retired in [4, 5, 31, 32, 33, 36, 37, 38, 42, 43, 1000] {
            assert_eq!(GgmlType::from_id(retired), None);
        }
    }

    #[test]
    fn table_covers_every_variant_in_id_order() {
        let ids: Vec<u32> = TABLE.iter().map(|e| e.0 as u32).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(ids, sorted);
        for t in GgmlType::ALL.iter().chain(&GgmlType::WEIGHTS) {
            assert!(GgmlType::KNOWN.contains(t));
            assert_eq!(t.entry().0, *t);
        }
        assert_eq!(&GgmlType::WEIGHTS[..11], &GgmlType::BASE_WEIGHTS[..]);
        assert_eq!(&GgmlType::WEIGHTS[11..16], &GgmlType::LOWBIT_WEIGHTS[..]);
        assert_eq!(&GgmlType::WEIGHTS[16..], &GgmlType::GRID_WEIGHTS[..]);
        assert_eq!((IQ3_S.block_bytes(), IQ3_XXS.block_bytes(), IQ2_XXS.block_bytes(), IQ2_XS.block_bytes()), (110, 98, 66, 74));
        assert_eq!((IQ2_S.block_bytes(), IQ1_S.block_bytes(), IQ1_M.block_bytes()), (82, 50, 56));
        // Names and sizes of a few by hand (ggml-common.h's static_asserts).
        assert_eq!((Q3_K.name(), Q3_K.block_elems(), Q3_K.block_bytes()), ("Q3_K", 256, 110));
        assert_eq!((IQ4_XS.name(), IQ4_XS.block_bytes()), ("IQ4_XS", 136));
        assert_eq!((MXFP4.id(), MXFP4.block_elems(), MXFP4.block_bytes()), (39, 32, 17));
        assert_eq!((F64.block_elems(), F64.block_bytes()), (1, 8));
    }

    #[test]
    fn bytes_for_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.bytes_for(512), Some(288));
        assert_eq!(GgmlType::Q4_K.bytes_for(100), None);
        assert_eq!(GgmlType::F16.bytes_for(3), Some(6));
        assert_eq!(GgmlType::Q2_K.bytes_for(512), Some(168));
    }
}
