//! The weight cache's view of a GPU: [`GpuMaterializer`] (allocate, upload, free through
//! [`GpuDevice`], weights placed in one growing [`Arena`]) and [`MappedFile`] (the model
//! file readable by the device in place for `mapped` residency; registered through
//! `register.rs`, whose failure or stall makes the backend fall back to `device`).

use std::sync::Arc;
use std::time::Instant;

use super::arena::Arena;
use super::device::{DeviceBuffer, GpuDevice, PinnedHost};
use super::driver::{DevPtr, DriverError, HostCoherence};
use super::register::{self, Bounds, HostPin, Registered};
use super::upload::{copy_parallel, Stager};
use crate::gguf::GgufFile;
use crate::weights::{DeviceFault, DeviceMemory, Materializer, WeightError};

/// CUDA_ERROR_OUT_OF_MEMORY and hipErrorOutOfMemory are both 2.
const OUT_OF_MEMORY: i32 = 2;

fn fault(e: DriverError) -> DeviceFault {
    let out_of_memory = matches!(e, DriverError::Call { code: OUT_OF_MEMORY, .. });
    DeviceFault { out_of_memory, msg: e.to_string() }
}

fn weight_trace() -> bool {
    crate::weights::stats::trace_enabled()
}

/// One weight's device memory: a block of the arena, or its own allocation (no arena on
/// this driver, `LODE_TUNE=weight_arena=0`, or the arena's reservation is full).
pub enum WeightBuf {
    Arena { ptr: DevPtr, bytes: usize },
    Own(DeviceBuffer),
}

pub struct GpuMaterializer {
    pub dev: GpuDevice,
    arena: Option<Arena>,
    /// Whether making the arena was tried (it is made on the first allocation).
    arena_tried: bool,
    /// Uploads overlapped with compute (`upload.rs`), made on the first upload where
    /// `Tuning::upload_stage` is on; `Err` once making it failed (then plain copies).
    stager: Option<Result<Stager, ()>>,
}

impl GpuMaterializer {
    pub fn new(dev: GpuDevice) -> GpuMaterializer {
        GpuMaterializer { dev, arena: None, arena_tried: false, stager: None }
    }

    fn stager(&mut self) -> Option<&mut Stager> {
        if self.stager.is_none() {
            let s = if self.dev.tuning().upload_stage { Stager::new(&self.dev).map_err(|e| {
                if weight_trace() {
                    eprintln!("weight uploads: no staging ({e}); plain copies");
                }
            }) } else { Err(()) };
            self.stager = Some(s);
        }
        self.stager.as_mut().and_then(|s| s.as_mut().ok())
    }

    /// Bytes of device memory behind the arena (0 without one).
    pub fn arena_bytes(&self) -> usize {
        self.arena.as_ref().map(|a| a.backed()).unwrap_or(0)
    }

    fn arena(&mut self) -> Option<&mut Arena> {
        if !self.arena_tried {
            self.arena_tried = true;
            if self.dev.tuning().weight_arena {
                // Addresses only: reserving the device's whole size costs no memory and
                // means the arena never runs out before the device does.
                self.arena = Arena::new(&self.dev, self.dev.info().total_mem as usize);
            }
            if weight_trace() {
                eprintln!("weight arena: {}", if self.arena.is_some() { "one growing range (virtual memory management)" } else { "none: one allocation per weight" });
            }
        }
        self.arena.as_mut()
    }
}

impl Materializer for GpuMaterializer {
    type Buffer = WeightBuf;
    fn alloc(&mut self, bytes: usize) -> Result<WeightBuf, DeviceFault> {
        let before = self.arena_bytes();
        if let Some(a) = self.arena() {
            if let Some(ptr) = a.alloc(bytes).map_err(fault)? {
                let after = self.arena_bytes();
                // One trace line per 256 MiB of weights (LODE_DEBUG=mem).
                if after >> 28 != before >> 28 {
                    self.dev.mem_mark(&format!("weight arena at {} MiB", after >> 20));
                }
                return Ok(WeightBuf::Arena { ptr, bytes });
            }
        }
        self.dev.alloc(bytes).map(WeightBuf::Own).map_err(fault)
    }
    fn upload(&mut self, buf: &mut WeightBuf, data: &[u8]) -> Result<(), DeviceFault> {
        let dst = self.addr(buf);
        if let Some(s) = self.stager() {
            // Queued on the upload stream; the compute stream waits for it.
            return s.upload(dst, data).map_err(fault);
        }
        self.dev.write(dst, data).map_err(fault)?;
        // `data` may be a packed copy the cache drops on return: wait for the copy (and
        // surface an asynchronous failure here, where the weight is known).
        self.dev.sync().map_err(fault)
    }
    fn free(&mut self, buf: WeightBuf) {
        // An upload into it may still be in flight.
        if let Some(Ok(s)) = &self.stager {
            let _ = s.wait();
        }
        match buf {
            WeightBuf::Arena { ptr, .. } => {
                if let Some(a) = self.arena.as_mut() {
                    a.free(ptr);
                }
            }
            WeightBuf::Own(b) => drop(b),
        }
    }
    fn addr(&self, buf: &WeightBuf) -> u64 {
        match buf {
            WeightBuf::Arena { ptr, .. } => *ptr,
            WeightBuf::Own(b) => b.ptr(),
        }
    }
    fn memory(&self) -> Option<DeviceMemory> {
        let drv = self.dev.mem_info().ok();
        let peak = self.dev.driver_peak_used();
        Some(DeviceMemory {
            allocated_bytes: self.dev.allocated_bytes(),
            peak_allocated_bytes: self.dev.peak_allocated_bytes(),
            driver_used_bytes: drv.map(|(free, total)| total.saturating_sub(free)),
            driver_peak_used_bytes: peak.map(|p| p.0),
            driver_samples: peak.map(|p| p.1),
            driver_total_bytes: drv.map(|(_, total)| total),
            device_memory_cap_bytes: self.dev.memory_cap(),
        })
    }
}

/// How `mapped` residency makes the file readable by the device (`Tuning::mapped_host`):
/// `Register` registers the file's own mapping (read-only, in chunks, bounded in time:
/// `register.rs`; no second copy anywhere; the driver pins the mapping's page-cache
/// pages); `Pinned` copies the file once into page-locked host memory the driver
/// allocates (`cuMemHostAlloc`: a host copy, still no device copy, and no pin of
/// file-backed pages, which the H200 machine's kernel did not complete: see
/// BENCHMARKS.md). The page cache behind the mapping stays reclaimable, so the host holds
/// the weights about once either way.
pub use super::tuning::MappedHost;

/// The tuning table's choice; else `register` on an integrated GPU (where
/// a second copy would cost the same memory the GPU computes from) and `pinned` on a
/// discrete one: on the H200 machine (Linux 6.18 guest, driver 580.159) registering
/// a freshly written model file's mapping never returned (the thread spun in the
/// kernel), while driver-allocated pinned memory of the same size took 0.2 s.
pub fn choose_mapped_host(dev: &GpuDevice) -> MappedHost {
    match dev.tuning().mapped_host {
        Some(h) => h,
        None if dev.is_integrated() => MappedHost::Register,
        None => MappedHost::Pinned,
    }
}

/// The registration loop's view of the device: read-only registration with the tuning
/// table's coherence.
struct DevicePin {
    dev: GpuDevice,
    coherence: HostCoherence,
}

impl HostPin for DevicePin {
    fn pin(&self, host: &[u8]) -> Result<DevPtr, DriverError> {
        self.dev.driver().host_register(host, self.coherence)
    }
    fn unpin(&self, host: &[u8]) {
        let _ = self.dev.driver().host_unregister(host);
    }
}

enum Host {
    /// Unregistered on drop.
    Registered { _chunks: Registered },
    /// The pinned copy, freed on drop.
    Pinned { _copy: PinnedHost },
}

/// The model file, readable by the device in place. The registration holds the file, so
/// the mapping outlives it; unregisters (or frees the pinned copy) on drop, after the
/// kernels that read it.
pub struct MappedFile {
    dev: GpuDevice,
    _host: Host,
    pub device_ptr: DevPtr,
    /// How it was made readable and how long that took.
    pub how: MappedHost,
    pub ms: f64,
}

/// A progress bar on a terminal (hidden elsewhere) for a file of more than one chunk.
fn bar(bytes: usize, chunk: usize) -> indicatif::ProgressBar {
    if bytes <= chunk {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(bytes as u64);
    b.set_style(
        indicatif::ProgressStyle::with_template("registering the model with the GPU {bar:40} {bytes}/{total_bytes} ({elapsed}) {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    b
}

impl MappedFile {
    pub fn register(dev: &GpuDevice, file: &Arc<GgufFile>) -> Result<MappedFile, WeightError> {
        let how = choose_mapped_host(dev);
        let len = file.bytes().len();
        let fail = |msg: String| WeightError::Mapping { bytes: len as u64, msg };
        let trace = weight_trace();
        let t = Instant::now();
        let tune = dev.tuning();
        let (host, device_ptr) = match how {
            MappedHost::Register => {
                // The device addresses of the chunks must continue each other (they do
                // under unified addressing) for a weight to span two chunks.
                let bounds = Bounds::new(tune.mapped_chunk, tune.mapped_stall_s, tune.mapped_total_s, len);
                if trace {
                    eprintln!("mapped: registering {len} bytes ({:?} coherence) in chunks of {} bytes, {} s per chunk, {} s in all ...", tune.mapped_coherence, bounds.chunk, bounds.per_chunk.as_secs(), bounds.total.as_secs());
                }
                let pin = Arc::new(DevicePin { dev: dev.clone(), coherence: tune.mapped_coherence });
                let pb = bar(len, bounds.chunk);
                let r = register::register(file.clone(), pin, bounds, tune.mapped_inject, trace, &|p| {
                    pb.set_position(p.bytes as u64);
                    pb.set_message(format!("chunk {}/{}", p.done, p.chunks));
                });
                pb.finish_and_clear();
                let r = r.map_err(|e| fail(e.to_string()))?;
                // Coarse-grained host memory is up to date for the device once a
                // synchronization has passed (HIP's coherence control).
                dev.sync().map_err(|e| fail(e.to_string()))?;
                let d = r.device_ptr;
                (Host::Registered { _chunks: r }, d)
            }
            MappedHost::Pinned => {
                if trace {
                    eprintln!("mapped: cuMemHostAlloc {len} bytes (pinned host copy of the file) ...");
                }
                let mut p = dev.host_alloc(len).map_err(|e| fail(e.to_string()))?;
                copy_parallel(p.as_mut_slice(), file.bytes());
                let d = p.device_ptr;
                (Host::Pinned { _copy: p }, d)
            }
        };
        let ms = t.elapsed().as_secs_f64() * 1e3;
        if trace {
            eprintln!("mapped: {how:?}: {len} bytes readable by the device at {device_ptr:#x} after {ms:.1} ms");
        }
        dev.mem_mark(&format!("file mapped ({how:?})"));
        Ok(MappedFile { dev: dev.clone(), _host: host, device_ptr, how, ms })
    }
}

impl Drop for MappedFile {
    fn drop(&mut self) {
        // Kernels reading the mapping must be done before its pages are released (the
        // fields, dropped after this, unregister or free them).
        let _ = self.dev.sync();
    }
}
