//! [`Arena`]: the weights' device memory as one growing range, so a model's ~400 weight
//! copies cost their bytes and not a driver allocation each.
//!
//! Why: `cuMemAlloc` rounds every allocation above a small-size pool to the 2 MiB page,
//! so one allocation per weight tensor wasted ~160 MiB on Qwen3-4B (a 5.6 MiB
//! projection takes 6 MiB, a 2.05 MiB Q6_K `attn_v` takes 4) — measured as the gap between
//! lode's own bytes and the driver's used figure on the H200 (`LODE_DEBUG=mem`).
//!
//! How: device addresses for the whole device are reserved once (no memory behind them),
//! weights are placed one after another (256-byte aligned), and physical memory is mapped
//! behind the range as it fills, in granularity steps (2 MiB on NVIDIA). The range never
//! moves, so every address handed out stays valid until the arena drops, and graph replay
//! sees one allocation (the range is entered in the device's live registry). Only the top
//! of the range can be given back (a failed materialization's rollback): a freed block
//! below the top waits until everything above it is freed too. Weights live until the
//! model is dropped, so in practice the arena only grows.
//!
//! Drivers without virtual memory management (HIP here) get no arena; the materializer
//! then allocates per weight as before.

use super::device::GpuDevice;
use super::driver::{DevPtr, DriverError};

/// Placement alignment of each block: what every kernel's vector loads need.
const ALIGN: usize = 256;

/// The arena's bookkeeping without the device: where blocks go and which pieces of
/// memory must be mapped or can be unmapped (unit-tested on the CPU).
#[derive(Debug, Default)]
pub struct Placement {
    /// Reserved bytes (addresses only).
    reserved: usize,
    granularity: usize,
    /// Bytes placed: every block lies below `top`.
    top: usize,
    /// Placed blocks in address order: (offset, bytes, freed).
    blocks: Vec<(usize, usize, bool)>,
    /// Pieces of memory mapped behind the range, in address order: (offset, bytes).
    mapped: Vec<(usize, usize)>,
}

impl Placement {
    pub fn new(reserved: usize, granularity: usize) -> Placement {
        let granularity = granularity.max(1);
        Placement { reserved: reserved / granularity * granularity, granularity, ..Default::default() }
    }
    /// Bytes mapped behind the range.
    pub fn backed(&self) -> usize {
        self.mapped.last().map(|&(o, b)| o + b).unwrap_or(0)
    }
    /// Where `bytes` go, and the piece to map first (offset, bytes) if the range must
    /// grow; `None` when the reservation is full. Nothing changes until [`Placement::commit`].
    pub fn plan(&self, bytes: usize) -> Option<(usize, Option<(usize, usize)>)> {
        let at = self.top.div_ceil(ALIGN) * ALIGN;
        let end = at.checked_add(bytes.max(1))?;
        if end > self.reserved {
            return None;
        }
        let backed = self.backed();
        let grow = (end > backed).then(|| (backed, (end - backed).div_ceil(self.granularity) * self.granularity));
        Some((at, grow))
    }
    /// Record a planned block (after its piece, if any, was mapped).
    pub fn commit(&mut self, at: usize, bytes: usize, grown: Option<(usize, usize)>) {
        if let Some(g) = grown {
            self.mapped.push(g);
        }
        self.blocks.push((at, bytes, false));
        self.top = at + bytes.max(1);
    }
    /// Free the block at `offset`; returns the mapped pieces no block needs any more
    /// (top first), already forgotten here: the caller unmaps them.
    pub fn free(&mut self, offset: usize) -> Vec<(usize, usize)> {
        if let Some(b) = self.blocks.iter_mut().find(|b| b.0 == offset) {
            b.2 = true;
        }
        while self.blocks.last().is_some_and(|b| b.2) {
            self.blocks.pop();
        }
        self.top = self.blocks.last().map(|b| b.0 + b.1.max(1)).unwrap_or(0);
        let mut out = Vec::new();
        while let Some(&(o, b)) = self.mapped.last() {
            if o < self.top {
                break;
            }
            out.push((o, b));
            self.mapped.pop();
        }
        out
    }
}

pub struct Arena {
    dev: GpuDevice,
    base: DevPtr,
    place: Placement,
    /// Physical handle of each mapped piece, by offset.
    handles: Vec<(usize, u64)>,
}

impl Arena {
    /// An arena reserving `reserve` bytes of addresses on `dev`, or `None` when the
    /// driver has no virtual memory management (or the reservation fails).
    pub fn new(dev: &GpuDevice, reserve: usize) -> Option<Arena> {
        let g = dev.driver().vmm_granularity()?;
        let place = Placement::new(reserve.div_ceil(g) * g, g);
        let base = dev.driver().va_reserve(place.reserved).ok()?;
        dev.track(base, place.reserved);
        Some(Arena { dev: dev.clone(), base, place, handles: Vec::new() })
    }

    /// Bytes of device memory mapped behind the range.
    pub fn backed(&self) -> usize {
        self.place.backed()
    }

    /// Place `bytes` at the top; maps more memory if needed. `Ok(None)`: the reservation
    /// is full (the caller allocates elsewhere).
    pub fn alloc(&mut self, bytes: usize) -> Result<Option<DevPtr>, DriverError> {
        let Some((at, grow)) = self.place.plan(bytes) else { return Ok(None) };
        if let Some((o, b)) = grow {
            let h = self.dev.va_map(self.base + o as u64, b)?;
            self.handles.push((o, h));
        }
        self.place.commit(at, bytes, grow);
        Ok(Some(self.base + at as u64))
    }

    /// Release the block at `ptr`; memory no block needs any more is unmapped.
    pub fn free(&mut self, ptr: DevPtr) {
        let Some(off) = ptr.checked_sub(self.base) else { return };
        let pieces = self.place.free(off as usize);
        if !pieces.is_empty() {
            // Kernels may still read what is being unmapped.
            let _ = self.dev.sync();
        }
        for (o, b) in pieces {
            if let Some(i) = self.handles.iter().position(|&(ho, _)| ho == o) {
                let (_, h) = self.handles.remove(i);
                let _ = self.dev.driver().va_unmap(self.base + o as u64, b, h);
                self.dev.account(-(b as i64));
            }
        }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = self.dev.sync();
        let pieces: Vec<(usize, usize)> = std::mem::take(&mut self.place.mapped);
        for (o, b) in pieces.into_iter().rev() {
            if let Some(&(_, h)) = self.handles.iter().find(|&&(ho, _)| ho == o) {
                let _ = self.dev.driver().va_unmap(self.base + o as u64, b, h);
                self.dev.account(-(b as i64));
            }
        }
        self.dev.untrack(self.base);
        let _ = self.dev.driver().va_free(self.base, self.place.reserved);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// Place and map as the arena does; returns the block's offset.
    fn place(p: &mut Placement, bytes: usize) -> Option<usize> {
        let (at, grow) = p.plan(bytes)?;
        p.commit(at, bytes, grow);
        Some(at)
    }

    #[test]
    fn blocks_are_aligned_and_memory_grows_by_granularity() {
        let mut p = Placement::new(64 * MIB, 2 * MIB);
        assert_eq!(place(&mut p, 5 * MIB + 3), Some(0));
        assert_eq!(p.backed(), 6 * MIB);
        // Next block starts at the next 256-byte boundary, inside what is mapped.
        let b = place(&mut p, 1000).unwrap();
        assert_eq!(b, (5 * MIB + 3).div_ceil(256) * 256);
        assert_eq!(p.backed(), 6 * MIB);
        // 400 weights of 5.6 MiB cost their bytes rounded once, not 6 MiB each.
        let mut q = Placement::new(4096 * MIB, 2 * MIB);
        for _ in 0..400 {
            place(&mut q, 5_898_240).unwrap();
        }
        assert_eq!(q.backed(), (400 * 5_898_240usize).div_ceil(2 * MIB) * 2 * MIB);
    }

    #[test]
    fn a_full_reservation_says_so() {
        let mut p = Placement::new(4 * MIB, 2 * MIB);
        assert!(place(&mut p, 3 * MIB).is_some());
        assert_eq!(p.plan(2 * MIB), None);
        assert!(p.plan(MIB / 2).is_some());
    }

    #[test]
    fn freeing_the_top_unmaps_what_no_block_needs() {
        let mut p = Placement::new(64 * MIB, 2 * MIB);
        let a = place(&mut p, 3 * MIB).unwrap();
        let b = place(&mut p, 4 * MIB).unwrap();
        assert_eq!(p.backed(), 8 * MIB);
        // A block below the top waits for the ones above it.
        assert!(p.free(a).is_empty());
        assert_eq!(p.backed(), 8 * MIB);
        // Freeing the top releases both, and both pieces (the newest first).
        assert_eq!(p.free(b), vec![(4 * MIB, 4 * MIB), (0, 4 * MIB)]);
        assert_eq!(p.backed(), 0);
        // A rollback of the last block keeps what the block below still uses.
        let a = place(&mut p, 3 * MIB).unwrap();
        let b = place(&mut p, 4 * MIB).unwrap();
        assert_eq!(p.free(b), vec![(4 * MIB, 4 * MIB)]);
        assert_eq!(p.backed(), 4 * MIB);
        assert_eq!(place(&mut p, 10), Some((3 * MIB).div_ceil(256) * 256));
        let _ = a;
    }
}
