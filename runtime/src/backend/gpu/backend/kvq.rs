//! `Backend::attention` over a quantized KV cache (`-ctk` / `-ctv` q8_0, q4_0) on its fast
//! kernels (`family/kvq_attn.rs`): a decode query split over its keys (`kvq_decode_d<HD>`,
//! the fused f16 decode's parts and merge scratch), and a prefill chunk whose visible rows
//! are converted to f16 (`kvq_to_f16`) into one scratch that every layer reuses, then read
//! by the flash kernel as an f16 cache. `plan::attention` chooses.
//!
//! The scratch is allocated once at the size of the largest layer's rows (every slot of
//! a full layer: what `engine::fit` counts for a quantized cache on a GPU) and only grows
//! (a larger cache), so a run's peak is known before it starts.

use super::{derr, err, GpuBackend};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::family::{attn_decode, flash_attn, kvq_attn};
use crate::backend::{Attention, KvSpec, Result};

/// The prefill's f16 rows.
#[derive(Default)]
pub(super) struct KvqScratch {
    rows: Option<DeviceBuffer>,
}

/// The rows `lo..hi` that queries at `pos` read through the flash kernel: from the first
/// key any of them sees, rounded down to 64 (its first tile starts there), to the last
/// position.
pub fn prefill_rows(pos: &[u32], window: usize) -> (usize, usize) {
    let first = |p: u32| if window > 0 { (p as usize + 1).saturating_sub(window) } else { 0 };
    let lo = pos.iter().map(|&p| first(p)).min().unwrap_or(0) / 64 * 64;
    let hi = pos.iter().map(|&p| p as usize + 1).max().unwrap_or(0);
    (lo, hi.max(lo))
}

impl GpuBackend {
    /// One decode query over a quantized cache (`plan::Attn::QuantDecode`). `scratch`: the
    /// decode scratch of `attn_decode::scratch_bytes` (from `attn_scratch`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kvq_decode(&mut self, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, pos: DevPtr, spec: &KvSpec, a: &Attention, window: usize, parts: usize, min_keys: usize, scratch: DevPtr) -> Result<()> {
        let b = kvq_attn::DecodeBufs { q, kc, vc, out, q8, pos, scratch };
        let s = kvq_attn::DecodeShape { n_head: a.n_head, n_kv: a.n_kv_head, head_dim: a.head_dim_k, ty: spec.ty, scale: a.scale, window, parts, min_keys };
        kvq_attn::decode(&self.rec(), &b, &s).map_err(err("attention"))
    }

    /// The decode scratch for `a` split in `parts`.
    pub(super) fn kvq_decode_scratch(&mut self, a: &Attention, parts: usize) -> Result<DevPtr> {
        self.attn_scratch(attn_decode::scratch_bytes(a.n_head, parts, a.head_dim_k))
    }

    /// A prefill chunk over a quantized cache (`plan::Attn::QuantFlash`): the rows the
    /// queries see to f16, then the flash kernel over them.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn kvq_flash(&mut self, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, pos: &[u32], pp: DevPtr, spec: &KvSpec, a: &Attention, window: usize) -> Result<()> {
        let scratch = self.kvq_rows_scratch(kvq_attn::prefill_scratch_bytes(spec))?;
        let (lo, hi) = prefill_rows(pos, window);
        let (nk, nv) = (spec.n_kv_head * spec.head_dim_k, spec.n_kv_head * spec.head_dim_v);
        let (fk, fv) = kvq_attn::to_f16(&self.rec(), kc, vc, scratch, nk, nv, lo, hi - lo, spec.ty).map_err(err("attention"))?;
        flash_attn::flash_attention(&self.rec(), q, fk, fv, out, pos.len(), a.n_head, a.n_kv_head, a.head_dim_k, pp, window, a.scale).map_err(err("attention"))
    }

    /// The prefill scratch of at least `bytes`; it only grows, a replaced one is kept until
    /// the step's work has run.
    fn kvq_rows_scratch(&mut self, bytes: usize) -> Result<DevPtr> {
        if let Some(b) = &self.kvq.rows {
            if b.len() >= bytes {
                return Ok(b.ptr());
            }
        }
        self.barrier()?;
        let b = self.dev.alloc(bytes.max(256)).map_err(derr("attention"))?;
        let ptr = b.ptr();
        if let Some(old) = self.kvq.rows.replace(b) {
            self.retired.push(old);
        }
        Ok(ptr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_reads_from_the_first_tile_of_the_first_visible_key() {
        assert_eq!(prefill_rows(&[0, 1, 2], 0), (0, 3));
        assert_eq!(prefill_rows(&[4096, 4097], 0), (0, 4098));
        // Window 100: position 300 sees 201.., the tile starts at 192.
        assert_eq!(prefill_rows(&[300, 301], 100), (192, 302));
        assert_eq!(prefill_rows(&[10], 100), (0, 11));
    }
}
