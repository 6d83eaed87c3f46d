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
/// and the same for V; with `swa`, the sliding-window layers hold `swa.slots` slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub n_layer: usize,
    pub n_ctx: usize,
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub ty: KvTypes,
    /// Window-sized caches for the sliding-window layers (`None`: every layer holds
    /// `n_ctx` slots, llama.cpp's `--swa-full`).
    pub swa: Option<SwaKv>,
    /// Layers whose heads are of another shape (gemma4's full-attention layers), their
    /// rows of their own width. `None`: every layer has `n_kv_head` heads of
    /// `head_dim_k` / `head_dim_v`.
    pub alt: Option<AltHeads>,
}

/// The heads of some layers of a [`KvSpec`] (bit `l` of `layers`: cache layer `l`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AltHeads {
    pub n_kv_head: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub layers: u128,
}

impl KvSpec {
    /// Layer `layer`'s (KV heads, K head size, V head size).
    pub fn heads(&self, layer: usize) -> (usize, usize, usize) {
        match self.alt {
            Some(a) if layer < 128 && a.layers >> layer & 1 == 1 => (a.n_kv_head, a.head_dim_k, a.head_dim_v),
            _ => (self.n_kv_head, self.head_dim_k, self.head_dim_v),
        }
    }

    /// Bytes of one slot's K and V over all layers, in the element types (no padding).
    pub fn bytes_per_token(&self) -> u64 {
        kv_bytes_per_token(self.ty, self.n_layer, self.n_kv_head, self.head_dim_k, self.head_dim_v)
    }

    /// Bytes of the whole cache in the element types (no padding): every layer's slots.
    pub fn bytes(&self) -> u64 {
        (0..self.n_layer).map(|l| (self.slots(l) * self.row_bytes(l)) as u64).sum()
    }

    /// Bytes of one slot's K and V in layer `l`.
    pub fn row_bytes(&self, l: usize) -> usize {
        let (n, dk, dv) = self.heads(l);
        self.ty.k.bytes(n * dk) + self.ty.v.bytes(n * dv)
    }

    /// Slots layer `layer` holds.
    pub fn slots(&self, layer: usize) -> usize {
        match self.swa {
            Some(w) if w.is_windowed(layer) => w.slots,
            _ => self.n_ctx,
        }
    }

    /// The ring of `layer`, if it is a window-sized one.
    pub fn ring(&self, layer: usize) -> Option<SwaKv> {
        self.swa.filter(|w| w.is_windowed(layer))
    }
}

/// Alignment of a window-sized cache's first held position: a multiple of every key
/// tile the attention kernels step by (the GPU's flash attention starts its tiles at a
/// multiple of 64 below the first visible key; the CPU's tiled path at a multiple of 64),
/// so no kernel reads a slot the cache has dropped, and the CPU rounds as with a full cache.
pub const RING_ALIGN: usize = 64;

/// A window-sized cache for the sliding-window layers (llama.cpp's default; `--swa-full`
/// opts out). Such a layer holds `slots` slots; position `p` is at slot `p - base`, where
/// `base` (a multiple of [`RING_ALIGN`]) is the oldest position it holds. When a write
/// would pass the last slot, the held keys still visible to the chunk's first query move
/// to the front (one copy of at most `window` rows, once per `slots - window` positions)
/// and `base` advances: the kernels read a contiguous, position-ordered range as they do
/// in a full cache, at an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwaKv {
    /// The windowed layers' attention window.
    pub window: usize,
    /// Slots each windowed layer holds.
    pub slots: usize,
    /// Which cache layers are windowed (bit `l`: layer `l`).
    pub layers: u128,
}

impl SwaKv {
    /// Slots a windowed layer needs for chunks of at most `chunk` positions: the window,
    /// the chunk, and the alignment of the base.
    pub fn slots_for(window: usize, chunk: usize) -> usize {
        window + chunk.max(1) + RING_ALIGN
    }

    /// The window-sized cache for `windowed` layers (a cache layer each) of `window`
    /// keys, written in chunks of at most `chunk` positions, in a context of `n_ctx`;
    /// `None` when no layer is windowed, there are more than 128 layers, or a full cache
    /// would be no larger.
    pub fn new(window: usize, chunk: usize, n_ctx: usize, windowed: &[bool]) -> Option<SwaKv> {
        let slots = Self::slots_for(window, chunk);
        if window == 0 || windowed.len() > 128 || !windowed.contains(&true) || slots >= n_ctx {
            return None;
        }
        let layers = windowed.iter().enumerate().filter(|(_, &w)| w).fold(0u128, |m, (l, _)| m | 1 << l);
        Some(SwaKv { window, slots, layers })
    }

    pub fn is_windowed(&self, layer: usize) -> bool {
        layer < 128 && self.layers >> layer & 1 == 1
    }

    pub fn n_windowed(&self) -> usize {
        self.layers.count_ones() as usize
    }

    /// The first position a query at `p` sees.
    pub fn first_visible(&self, p: usize) -> usize {
        (p + 1).saturating_sub(self.window)
    }

    /// A windowed layer's base after positions `min..=max` are written to it while it
    /// held positions from `base`: 0 when they start at 0, unchanged while they fit, else the furthest aligned
    /// base that keeps every key the first of them sees. An error names what cannot be:
    /// a query older than the cache still holds (the sequence must be evaluated again),
    /// or a chunk longer than the cache was made for.
    pub fn advance(&self, base: usize, min: usize, max: usize) -> Result<usize, String> {
        let lo = self.first_visible(min);
        // A sequence that starts again from position 0 keeps nothing.
        let base = if min == 0 { 0 } else { base };
        if lo < base {
            return Err(format!(
                "position {min} sees keys from {lo}, but this window-sized cache holds positions from {base} only (evaluate the sequence again, or use --swa-full)"
            ));
        }
        if max < base + self.slots {
            return Ok(base);
        }
        let new = lo / RING_ALIGN * RING_ALIGN;
        if max >= new + self.slots {
            return Err(format!(
                "positions {min}..={max}: a chunk longer than this window-sized cache of {} slots was made for",
                self.slots
            ));
        }
        Ok(new)
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

    /// The base moves only when a write would pass the last slot, stays aligned, keeps
    /// every key the chunk's first query sees, and refuses what it cannot hold.
    #[test]
    fn ring_base_advances_only_as_needed() {
        let w = SwaKv::new(100, 16, 4096, &[true, false, true]).unwrap();
        assert_eq!(w.slots, 100 + 16 + RING_ALIGN);
        assert!(w.is_windowed(0) && !w.is_windowed(1) && w.is_windowed(2) && !w.is_windowed(3));
        assert_eq!(w.advance(0, 0, 15), Ok(0));
        assert_eq!(w.advance(0, 179, 179), Ok(0));
        // Position 180 is the first past the last slot: the base moves to 64 (81 aligned down).
        assert_eq!(w.advance(0, 180, 180), Ok(64));
        let mut base = 0;
        for p in 0..5000 {
            base = w.advance(base, p, p).unwrap();
            assert!(base % RING_ALIGN == 0 && base <= w.first_visible(p) && p < base + w.slots, "p {p} base {base}");
        }
        // A query older than the cache holds, and a chunk too long, are errors.
        assert!(w.advance(base, 100, 100).is_err());
        assert!(w.advance(0, 0, 500).is_err());
        assert_eq!(w.advance(base, 0, 15), Ok(0), "a sequence started again");
        // A cache that would be no smaller than the full one is not made.
        assert!(SwaKv::new(4000, 512, 4096, &[true]).is_none());
        assert!(SwaKv::new(100, 16, 4096, &[false]).is_none());
        // A spec's bytes count each layer's slots.
        let spec = KvSpec { n_layer: 3, n_ctx: 4096, n_kv_head: 2, head_dim_k: 32, head_dim_v: 32, ty: KvType::F16.into(), swa: Some(w), alt: None };
        assert_eq!(spec.bytes(), (2 * 180 + 4096) * 2 * 128);
        assert_eq!(KvSpec { swa: None, ..spec }.bytes(), spec.bytes_per_token() * 4096);
    }
}
