//! The weight cache over host memory: [`HostMaterializer`], a "device" whose memory is
//! aligned host allocations (`backend::cached::CachedBackend` routes every weight a CPU
//! backend reads through a [`WeightCache`] of it).
//!
//! On the CPU this is the `device` / `upload` residency (weights copied out of the
//! mapping into anonymous memory, as llama.cpp's `--no-mmap`); `mapped` serves the
//! mapping in place. It is also how the cache's invariants are tested end to end without
//! a GPU: the CPU kernels compute on the bytes the cache made resident, so wrong bytes
//! show up as different logits.

use super::cache::{DeviceFault, Materializer};
use super::stats::DeviceMemory;

/// 64-byte aligned storage unit (enough for every block and f32 view).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// One host "device" allocation.
pub struct HostBuffer {
    lines: Vec<Line>,
    len: usize,
}

impl HostBuffer {
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `Line` is 64 plain bytes with no padding; `len <= lines.len() * 64`.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const u8, self.len) }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes the view unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut u8, self.len) }
    }
}

/// Host memory as a device: counts live and peak bytes like a GPU device does.
#[derive(Default)]
pub struct HostMaterializer {
    live: u64,
    peak: u64,
    allocs: u64,
    frees: u64,
}

impl HostMaterializer {
    pub fn new() -> HostMaterializer {
        HostMaterializer::default()
    }
    /// Bytes currently allocated through this materializer.
    pub fn live_bytes(&self) -> u64 {
        self.live
    }
    /// Allocations and frees made (a failed request must free what it allocated).
    pub fn alloc_count(&self) -> (u64, u64) {
        (self.allocs, self.frees)
    }
}

impl Materializer for HostMaterializer {
    type Buffer = HostBuffer;
    fn alloc(&mut self, bytes: usize) -> std::result::Result<HostBuffer, DeviceFault> {
        let n = bytes.div_ceil(64);
        let mut lines = Vec::new();
        lines.try_reserve_exact(n).map_err(|e| DeviceFault { out_of_memory: true, msg: e.to_string() })?;
        lines.resize(n, Line([0; 64]));
        self.live += bytes as u64;
        self.peak = self.peak.max(self.live);
        self.allocs += 1;
        Ok(HostBuffer { lines, len: bytes })
    }
    fn upload(&mut self, buf: &mut HostBuffer, data: &[u8]) -> std::result::Result<(), DeviceFault> {
        let dst = buf.bytes_mut();
        if data.len() > dst.len() {
            return Err(DeviceFault { out_of_memory: false, msg: format!("{} bytes into a {}-byte buffer", data.len(), dst.len()) });
        }
        dst[..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn free(&mut self, buf: HostBuffer) {
        self.live -= buf.len as u64;
        self.frees += 1;
    }
    fn addr(&self, buf: &HostBuffer) -> u64 {
        buf.lines.as_ptr() as u64
    }
    fn memory(&self) -> Option<DeviceMemory> {
        Some(DeviceMemory { allocated_bytes: self.live, peak_allocated_bytes: self.peak, ..Default::default() })
    }
}

