//! KV cache element types and shapes: llama.cpp's `-ctk` / `-ctv` (`--cache-type-k`,
//! `--cache-type-v`), each of K and V in its own type.
//!
//! The quantized types store GGUF blocks exactly as llama.cpp's cache does (Q8_0: an f16
//! scale and 32 signed bytes, 34 bytes per 32 values; Q4_0: an f16 scale and 32 4-bit
//! codes, 18 bytes per 32 values), so a head of `head_dim` values is `head_dim / 32`
//! whole blocks; a head dimension that is not a multiple of 32 is refused by name.

use crate::quant::GgmlType;

/// Element type of one half (K or V) of the KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// llama.cpp's default.
    #[default]
    F16,
    /// lode's precise variant (llama.cpp's f32 cache without flash attention); K and V
    /// must both be f32.
    F32,
    Q8_0,
    Q4_0,
}

impl KvType {
    /// The names `-ctk` / `-ctv` accept.
    pub const NAMES: &'static str = "f16, f32, q8_0, q4_0";

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::F32 => GgmlType::F32,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    pub fn is_quantized(self) -> bool {
        matches!(self, KvType::Q8_0 | KvType::Q4_0)
    }

    /// Bytes of `n` values (`n` a whole number of blocks for the quantized types).
    pub fn bytes(self, n: usize) -> usize {
        match self {
            KvType::F16 => n * 2,
            KvType::F32 => n * 4,
            KvType::Q8_0 => n / 32 * 34,
            KvType::Q4_0 => n / 32 * 18,
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            "q8_0" => Ok(KvType::Q8_0),
            "q4_0" => Ok(KvType::Q4_0),
            _ => Err(format!("unknown KV cache type `{s}` (expected one of {})", KvType::NAMES)),
        }
    }
}

/// The types of K and V.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl From<KvType> for KvTypes {
    /// The same type for K and V.
    fn from(t: KvType) -> KvTypes {
        KvTypes { k: t, v: t }
    }
}

impl std::fmt::Display for KvTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.k == self.v {
            write!(f, "{}", self.k)
        } else {
            write!(f, "K {} / V {}", self.k, self.v)
        }
    }
}

impl KvTypes {
    pub fn any_quantized(self) -> bool {
        self.k.is_quantized() || self.v.is_quantized()
    }

    /// Why these types cannot hold heads of these sizes (`None`: they can).
    pub fn unsupported(self, head_dim_k: usize, head_dim_v: usize) -> Option<String> {
        if (self.k == KvType::F32) != (self.v == KvType::F32) {
            return Some(format!("KV cache types {self}: f32 is only supported for both K and V"));
        }
        for (what, t, d) in [("K", self.k, head_dim_k), ("V", self.v, head_dim_v)] {
            if t.is_quantized() && d % 32 != 0 {
                return Some(format!(
                    "a {t} {what} cache needs a head dimension that is a multiple of 32 (this model's is {d})"
                ));
            }
        }
        None
    }
}

/// Shape of a KV cache: per layer, `n_ctx` slots of `n_kv_head * head_dim` values for K
/// and the same for V.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub n_layer: usize,
    pub n_ctx: usize,
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub ty: KvTypes,
}

impl KvSpec {
    /// Bytes of one slot's K and V over all layers, in the element types (no padding).
    pub fn bytes_per_token(&self) -> u64 {
        kv_bytes_per_token(self.ty, self.n_layer, self.n_kv_head, self.head_dim_k, self.head_dim_v)
    }
}

/// Bytes of one slot's K and V over `n_layer` layers.
pub fn kv_bytes_per_token(ty: KvTypes, n_layer: usize, n_kv_head: usize, head_dim_k: usize, head_dim_v: usize) -> u64 {
    (n_layer * (ty.k.bytes(n_kv_head * head_dim_k) + ty.v.bytes(n_kv_head * head_dim_v))) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_sizes_are_the_gguf_blocks() {
        for t in [KvType::F16, KvType::F32, KvType::Q8_0, KvType::Q4_0] {
            assert_eq!(t.name().parse::<KvType>().unwrap(), t);
            assert_eq!(Some(t.bytes(64) as u64), t.ggml().bytes_for(64));
        }
        assert_eq!("Q8_0".parse::<KvType>().unwrap(), KvType::Q8_0);
        assert!("q5_1".parse::<KvType>().unwrap_err().contains("q4_0"));
        let mixed = KvTypes { k: KvType::F32, v: KvType::F16 };
        assert!(mixed.unsupported(64, 64).is_some());
        assert!(KvTypes::from(KvType::Q4_0).unsupported(64, 48).unwrap().contains("V"));
        assert!(KvTypes::from(KvType::Q8_0).unsupported(64, 64).is_none());
    }
}
