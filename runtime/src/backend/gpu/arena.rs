//! [`Arena`]: the weights' device memory as one growing range, so a model's ~400 weight
//! copies cost their bytes and not a driver allocation each.
//!
//! Why: `cuMemAlloc` rounds every allocation above a small-size pool to the 2 MiB page,
//! so one allocation per weight tensor wasted ~160 MiB on Qwen3-4B (a 5.6 MiB
//! projection takes 6 MiB, a 2.05 MiB Q6_K `attn_v` takes 4) — measured as the gap between
//! lode's own bytes and the driver's used figure on the H200 (`LODE_MEM_TRACE=1`).
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

pub struct Arena {
    dev: GpuDevice,
    base: DevPtr,
    /// Reserved bytes (addresses only).
    reserved: usize,
    granularity: usize,
    /// Bytes placed: every block lies below `top`.
    top: usize,
    /// Placed blocks in address order: (offset, bytes, freed).
    blocks: Vec<(usize, usize, bool)>,
    /// Physical pieces mapped behind the range, in address order: (offset, bytes, handle).
    mapped: Vec<(usize, usize, u64)>,
}

impl Arena {
    /// An arena reserving `reserve` bytes of addresses on `dev`, or `None` when the
    /// driver has no virtual memory management (or the reservation fails).
    pub fn new(dev: &GpuDevice, reserve: usize) -> Option<Arena> {
        let g = dev.driver().vmm_granularity()?;
        let reserved = reserve.div_ceil(g) * g;
        let base = dev.driver().va_reserve(reserved).ok()?;
        dev.track(base, reserved);
        Some(Arena { dev: dev.clone(), base, reserved, granularity: g, top: 0, blocks: Vec::new(), mapped: Vec::new() })
    }

    /// Bytes of device memory mapped behind the range.
    pub fn backed(&self) -> usize {
        self.mapped.last().map(|&(o, b, _)| o + b).unwrap_or(0)
    }

    /// Place `bytes` at the top; maps more memory if needed. `Ok(None)`: the reservation
    /// is full (the caller allocates elsewhere).
    pub fn alloc(&mut self, bytes: usize) -> Result<Option<DevPtr>, DriverError> {
        let at = self.top.div_ceil(ALIGN) * ALIGN;
        let end = at + bytes.max(1);
        if end > self.reserved {
            return Ok(None);
        }
        let backed = self.backed();
        if end > backed {
            let grow = (end - backed).div_ceil(self.granularity) * self.granularity;
            let h = self.dev.driver().va_map(self.base + backed as u64, grow)?;
            self.mapped.push((backed, grow, h));
            self.dev.account(grow as i64);
        }
        self.blocks.push((at, bytes, false));
        self.top = end;
        Ok(Some(self.base + at as u64))
    }

    /// Release the block at `ptr`; the top of the range shrinks past every freed block,
    /// and memory no block needs any more is unmapped.
    pub fn free(&mut self, ptr: DevPtr) {
        let Some(off) = ptr.checked_sub(self.base).map(|o| o as usize) else { return };
        if let Some(b) = self.blocks.iter_mut().find(|b| b.0 == off) {
            b.2 = true;
        }
        while self.blocks.last().is_some_and(|b| b.2) {
            self.blocks.pop();
        }
        self.top = self.blocks.last().map(|b| b.0 + b.1).unwrap_or(0);
        let mut synced = false;
        while let Some(&(o, b, h)) = self.mapped.last() {
            if o < self.top {
                break;
            }
            if !synced {
                // Kernels may still read what is being unmapped.
                let _ = self.dev.sync();
                synced = true;
            }
            let _ = self.dev.driver().va_unmap(self.base + o as u64, b, h);
            self.dev.account(-(b as i64));
            self.mapped.pop();
        }
    }

    /// Does `ptr` lie inside this arena's range?
    pub fn contains(&self, ptr: DevPtr) -> bool {
        ptr >= self.base && ptr < self.base + self.reserved as u64
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let _ = self.dev.sync();
        while let Some((o, b, h)) = self.mapped.pop() {
            let _ = self.dev.driver().va_unmap(self.base + o as u64, b, h);
            self.dev.account(-(b as i64));
        }
        self.dev.untrack(self.base);
        let _ = self.dev.driver().va_free(self.base, self.reserved);
    }
}
