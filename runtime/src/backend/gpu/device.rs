//! A GPU device as the rest of lode sees it: one driver table, one stream, the loaded
//! kernels, and owned buffers. Vendor-neutral: everything here goes through [`Driver`].
//!
//! Buffers free themselves on drop. Work is issued on the device's one stream in order;
//! `download` synchronizes. The graph hooks (capture / instantiate / update / replay)
//! are exposed as-is for the graph-replay work.

use super::capacity::Capacity;
use super::driver::{self, Api, DevAttr, DevPtr, DeviceInfo, Driver, DriverError, KArg, RawHandle};
use super::kernels::KernelSet;
use super::launch::Launch;
use super::tuning::{Pdl, Tuning};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub type Result<T> = std::result::Result<T, DriverError>;


/// Shared device state; buffers hold an `Arc` of it so they can free themselves.
pub struct DeviceCore {
    pub drv: Box<dyn Driver>,
    pub stream: RawHandle,
    kernels: Mutex<Option<KernelSet>>,
    /// Resolved kernels: name → (function, launched overlapped).
    funcs: Mutex<std::collections::HashMap<&'static str, (RawHandle, bool)>>,
    /// Which kernels are launched overlapped (programmatic dependent launch).
    overlap: Pdl,
    /// The tuning table, read once at open (`tuning.rs`).
    tuning: Tuning,
    /// Bytes currently allocated through this device, and the high-water mark.
    pub allocated: AtomicU64,
    pub peak: AtomicU64,
    /// Live allocations: base → (bytes, id). Ids are never reused, so graph replay can
    /// tell a freed-and-reallocated buffer from the one an instance was bound to.
    live: Mutex<std::collections::BTreeMap<DevPtr, (usize, u64)>>,
    next_id: AtomicU64,
    /// What `trim_context` set.
    limits: Mutex<String>,
    /// The driver's used bytes at the last `mem_mark` (the trace prints deltas).
    last_used: AtomicU64,
    /// `--device-memory` and the sampled peak of the driver's use (`capacity.rs`).
    capacity: Capacity,
}

impl Drop for DeviceCore {
    fn drop(&mut self) {
        let _ = self.drv.stream_sync(self.stream);
        if let Ok(mut k) = self.kernels.lock() {
            if let Some(mut k) = k.take() {
                k.unload(self.drv.as_ref());
            }
        }
        let _ = self.drv.stream_destroy(self.stream);
    }
}

/// An open GPU: cheap to clone.
#[derive(Clone)]
pub struct GpuDevice {
    core: Arc<DeviceCore>,
}

/// An owned device allocation. `[bytes]` of raw memory; typed views are the caller's.
pub struct DeviceBuffer {
    core: Arc<DeviceCore>,
    ptr: DevPtr,
    bytes: usize,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// Address `offset` bytes in, checked against the allocation.
    pub fn at(&self, offset: usize) -> DevPtr {
        assert!(offset <= self.bytes, "device offset {offset} past a {}-byte buffer", self.bytes);
        self.ptr + offset as u64
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Frees are ordered after queued work by the driver (cuMemFree/hipFree synchronize).
        let _ = self.core.drv.free(self.ptr);
        self.core.allocated.fetch_sub(self.bytes as u64, Ordering::Relaxed);
        if let Ok(mut l) = self.core.live.lock() {
            l.remove(&self.ptr);
        }
    }
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({:#x}, {} B)", self.ptr, self.bytes)
    }
}

/// A host range registered for device reads (the `mapped` residency mode).
pub struct HostRegistration<'a> {
    core: Arc<DeviceCore>,
    host: &'a [u8],
    pub device_ptr: DevPtr,
}

impl Drop for HostRegistration<'_> {
    fn drop(&mut self) {
        let _ = self.core.drv.stream_sync(self.core.stream);
        let _ = self.core.drv.host_unregister(self.host);
    }
}

/// Page-locked host memory from the driver, readable by the device at `device_ptr`.
/// Freed (after the queued work) on drop.
pub struct PinnedHost {
    core: Arc<DeviceCore>,
    host: usize,
    bytes: usize,
    pub device_ptr: DevPtr,
}

impl PinnedHost {
    pub fn len(&self) -> usize {
        self.bytes
    }
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The host side, for filling.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `host` is a live allocation of `bytes` bytes from the driver, owned by
        // `self` (freed only on drop) and borrowed exclusively through `&mut self`.
        unsafe { std::slice::from_raw_parts_mut(self.host as *mut u8, self.bytes) }
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: as above, shared borrow; the device only reads it.
        unsafe { std::slice::from_raw_parts(self.host as *const u8, self.bytes) }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        let _ = self.core.drv.stream_sync(self.core.stream);
        let _ = self.core.drv.host_free(self.host);
    }
}

/// A pair of timing events.
pub struct Timer {
    core: Arc<DeviceCore>,
    start: RawHandle,
    end: RawHandle,
}

impl Timer {
    pub fn start(&self) -> Result<()> {
        self.core.drv.event_record(self.start, self.core.stream)
    }
    /// Record the end and return milliseconds since `start`.
    pub fn stop_ms(&self) -> Result<f32> {
        self.core.drv.event_record(self.end, self.core.stream)?;
        self.core.drv.event_sync(self.end)?;
        self.core.drv.event_elapsed_ms(self.start, self.end)
    }
    /// Record the end without waiting (read later with [`Timer::elapsed_ms`]).
    pub fn mark_end(&self) -> Result<()> {
        self.core.drv.event_record(self.end, self.core.stream)
    }
    /// Milliseconds from `first`'s start to this timer's end (both recorded; waits for
    /// the end). `first` may be this timer.
    pub fn elapsed_since_ms(&self, first: &Timer) -> Result<f32> {
        self.core.drv.event_sync(self.end)?;
        self.core.drv.event_elapsed_ms(first.start, self.end)
    }
    /// Milliseconds between this timer's start and end (both recorded; waits for the end).
    pub fn elapsed_ms(&self) -> Result<f32> {
        self.elapsed_since_ms(self)
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        let _ = self.core.drv.event_destroy(self.start);
        let _ = self.core.drv.event_destroy(self.end);
    }
}

/// Which kernels are launched overlapped with the kernel before them (programmatic
/// dependent launch, where the driver has it; `Tuning::pdl`): `Decode` (the default) the
/// one-token decode families ([`super::kernels::DEFAULT_OVERLAPPED_FAMILIES`]) and the
/// one-column matvecs ([`super::kernels::one_token_overlapped`]; both measured in
/// BENCHMARKS.md), `All` every [`super::kernels::OVERLAPPED_FAMILIES`] kernel.
fn pdl_applies(pdl: Pdl, name: &str) -> bool {
    match pdl {
        Pdl::Off => false,
        Pdl::Decode => super::kernels::in_families(name, super::kernels::DEFAULT_OVERLAPPED_FAMILIES) || super::kernels::one_token_overlapped(name),
        Pdl::All => super::kernels::overlappable(name),
    }
}

impl GpuDevice {
    /// Open device `ordinal` of `api` and load every kernel family.
    /// The tuning table is the defaults with `LODE_TUNE`'s overrides ([`Tuning::from_env`]).
    pub fn open(api: Api, ordinal: i32) -> Result<GpuDevice> {
        GpuDevice::open_tuned(api, ordinal, Tuning::from_env())
    }

    /// Open device `ordinal` of `api` with this tuning table.
    pub fn open_tuned(api: Api, ordinal: i32, tuning: Tuning) -> Result<GpuDevice> {
        let drv = driver::open(api, ordinal)?;
        let stream = drv.stream_create()?;
        let kernels = KernelSet::load(drv.as_ref(), tuning.kernels_rtc)?;
        let overlap = if drv.overlapped_launches() { tuning.pdl } else { Pdl::Off };
        let core = DeviceCore {
            drv,
            stream,
            kernels: Mutex::new(Some(kernels)),
            funcs: Mutex::new(Default::default()),
            overlap,
            tuning,
            allocated: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            live: Mutex::new(Default::default()),
            next_id: AtomicU64::new(1),
            limits: Mutex::new(String::new()),
            last_used: AtomicU64::new(0),
            capacity: Capacity::default(),
        };
        core.capacity.set_watch(driver::mem_trace());
        let dev = GpuDevice { core: Arc::new(core) };
        dev.mem_mark("context created, kernel modules loaded");
        dev.trim_context();
        dev.mem_mark("context limits set");
        Ok(dev)
    }

    /// Shrink the context's fixed reservations to what lode's kernels use: the per-thread
    /// stack (reserved for every thread the GPU can hold: 264 MiB on an H200 at the
    /// driver's 1 KiB), the printf FIFO and the device malloc heap (no lode kernel calls
    /// printf or malloc; the driver clamps 0 to its minimum). `Tuning::trim_limits` off keeps
    /// the driver's defaults. The stack: every lode kernel compiles to a 0-byte frame
    /// (`ptxas -v`); 256 bytes (`Tuning::gpu_stack`) passed every selftest on the H200 at
    /// the same speed and saves 198 MiB there against the driver's 1,024.
    fn trim_context(&self) {
        if !self.core.tuning.trim_limits {
            return;
        }
        let stack = self.core.tuning.gpu_stack;
        let used = || self.core.drv.mem_info().map(|(f, t)| (t - f) >> 20).unwrap_or(0);
        let before = used();
        let mut note = Vec::new();
        for (limit, bytes) in [(driver::Limit::Stack, stack), (driver::Limit::PrintfFifo, 0), (driver::Limit::MallocHeap, 0)] {
            match self.core.drv.set_limit(limit, bytes) {
                Ok(now) => note.push(format!("{limit:?} {now} B")),
                Err(e) => note.push(format!("{limit:?} unchanged ({e})")),
            }
        }
        note.push(format!("driver used {before} → {} MiB", used()));
        tracing::info!("context limits: {}", note.join(", "));
        if let Ok(mut n) = self.core.limits.lock() {
            *n = note.join(", ");
        }
    }

    /// `LODE_DEBUG=mem`: one line with the driver's used memory, its change since the
    /// previous mark, and lode's own allocations — where the context's overhead goes.
    pub fn mem_mark(&self, what: &str) {
        if !driver::mem_trace() {
            return;
        }
        let Ok((free, total)) = self.core.drv.mem_info() else { return };
        let used = total - free;
        let prev = self.core.last_used.swap(used, Ordering::Relaxed);
        eprintln!(
            "mem: {what}: driver used {} MiB ({:+} KiB), lode allocated {} MiB",
            used >> 20,
            (used as i64 - prev as i64) >> 10,
            self.allocated_bytes() >> 20
        );
    }

    /// The tuning table this device was opened with.
    pub fn tuning(&self) -> &Tuning {
        &self.core.tuning
    }

    /// The context limits lode set at open (empty: the driver's defaults).
    pub fn context_limits(&self) -> String {
        self.core.limits.lock().map(|n| n.clone()).unwrap_or_default()
    }

    pub fn api(&self) -> Api {
        self.core.drv.api()
    }
    pub fn info(&self) -> &DeviceInfo {
        self.core.drv.info()
    }
    pub fn driver(&self) -> &dyn Driver {
        self.core.drv.as_ref()
    }
    pub fn stream(&self) -> RawHandle {
        self.core.stream
    }
    pub fn attribute(&self, a: DevAttr) -> Result<i32> {
        self.core.drv.attribute(a)
    }
    /// True on an integrated GPU that shares system memory (the `mapped` default).
    pub fn is_integrated(&self) -> bool {
        self.attribute(DevAttr::Integrated).map(|v| v != 0).unwrap_or(false)
    }
    /// (free, total) bytes of device memory, as a card of `--device-memory`'s size
    /// reports them when a cap is set (`capacity.rs`).
    pub fn mem_info(&self) -> Result<(u64, u64)> {
        let (free, total) = self.core.drv.mem_info()?;
        self.core.capacity.observe(total.saturating_sub(free));
        Ok(self.core.capacity.view(free, total))
    }

    /// Treat the device as having `bytes` of memory, the driver's own use included
    /// (`--device-memory`); `None`: the card's own size.
    pub fn set_memory_cap(&self, bytes: Option<u64>) {
        self.core.capacity.set_cap(bytes);
    }
    pub fn memory_cap(&self) -> Option<u64> {
        self.core.capacity.cap()
    }
    /// Sample the driver's used memory at every allocation and read-back, for a peak
    /// (`--memory-report`); always on under a cap.
    pub fn watch_memory(&self, on: bool) {
        if on {
            self.core.capacity.set_watch(true);
        }
    }
    /// A peak window (`lode bench`'s per-row peak, `Capacity::open_window`): `open`
    /// samples from the driver's use now; closing restores the sampling and the run's peak.
    pub fn memory_window(&self, open: bool) -> Result<()> {
        let c = &self.core.capacity;
        let used = if open { self.core.drv.mem_info().map(|(free, total)| total.saturating_sub(free))? } else { 0 };
        if open { c.open_window(used) } else { c.close_window() }
        Ok(())
    }
    /// The highest driver use sampled and the number of samples (`None`: none taken).
    pub fn driver_peak_used(&self) -> Option<(u64, u64)> {
        self.core.capacity.peak()
    }

    /// The driver's used bytes now (sampled into the peak).
    fn used_now(&self) -> Result<u64> {
        let (free, total) = self.core.drv.mem_info()?;
        let used = total.saturating_sub(free);
        self.core.capacity.observe(used);
        Ok(used)
    }

    /// `grant` `bytes` of device memory under the cap: refused if the driver's use would
    /// pass it, given back (`undo`) if the driver's rounding took it past; sampled.
    fn capped<T>(&self, bytes: usize, what: &'static str, grant: impl FnOnce() -> Result<T>, undo: impl FnOnce(&T)) -> Result<T> {
        let c = &self.core.capacity;
        if let Some(why) = if c.cap().is_some() { c.refuse(self.used_now()?, bytes as u64) } else { None } {
            return Err(out_of_memory(self.api(), what, why));
        }
        let t = grant()?;
        if let Some(why) = if c.watching() { c.over_after(self.used_now()?, bytes as u64) } else { None } {
            undo(&t);
            return Err(out_of_memory(self.api(), what, why));
        }
        Ok(t)
    }

    /// Back `[ptr, ptr+bytes)` of a reserved range with device memory (the weight arena's
    /// growth): counted and capped like [`GpuDevice::alloc`]. Returns the driver's handle.
    pub fn va_map(&self, ptr: DevPtr, bytes: usize) -> Result<u64> {
        let h = self.capped(bytes, "device memory map", || self.core.drv.va_map(ptr, bytes), |&h| {
            let _ = self.core.drv.va_unmap(ptr, bytes, h);
        })?;
        self.account(bytes as i64);
        Ok(h)
    }
    /// How each kernel family was obtained (embedded arch, cache file, compiled).
    pub fn kernel_origins(&self) -> Vec<(&'static str, super::kernels::Origin)> {
        self.core.kernels.lock().map(|k| k.as_ref().map(|k| k.origins.clone()).unwrap_or_default()).unwrap_or_default()
    }
    pub fn allocated_bytes(&self) -> u64 {
        self.core.allocated.load(Ordering::Relaxed)
    }
    pub fn peak_allocated_bytes(&self) -> u64 {
        self.core.peak.load(Ordering::Relaxed)
    }

    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        let ptr = self.capped(bytes, "device allocation", || self.core.drv.malloc(bytes), |&p| {
            let _ = self.core.drv.free(p);
        })?;
        let now = self.core.allocated.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
        self.core.peak.fetch_max(now, Ordering::Relaxed);
        let id = self.core.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.core.live.lock() {
            l.insert(ptr, (bytes, id));
        }
        Ok(DeviceBuffer { core: self.core.clone(), ptr, bytes })
    }
    /// Enter memory lode did not get from [`GpuDevice::alloc`] (a weight arena's address
    /// range) in the live-allocation registry, so graph replay sees one stable
    /// allocation; returns its id. [`GpuDevice::untrack`] removes it.
    pub fn track(&self, ptr: DevPtr, bytes: usize) -> u64 {
        let id = self.core.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut l) = self.core.live.lock() {
            l.insert(ptr, (bytes, id));
        }
        id
    }
    pub fn untrack(&self, ptr: DevPtr) {
        if let Ok(mut l) = self.core.live.lock() {
            l.remove(&ptr);
        }
    }
    /// Count `bytes` of device memory obtained outside [`GpuDevice::alloc`] (positive:
    /// backed, negative: released) in lode's allocated bytes and their peak.
    pub fn account(&self, bytes: i64) {
        if bytes >= 0 {
            let now = self.core.allocated.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
            self.core.peak.fetch_max(now, Ordering::Relaxed);
        } else {
            self.core.allocated.fetch_sub(bytes.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// The id of the live allocation holding `p` (ids are never reused).
    pub fn allocation_of(&self, p: DevPtr) -> Option<u64> {
        let l = self.core.live.lock().ok()?;
        let (&base, &(bytes, id)) = l.range(..=p).next_back()?;
        (p < base + bytes.max(1) as u64).then_some(id)
    }
    /// Is allocation `id` still live?
    pub fn allocation_live(&self, id: u64) -> bool {
        self.core.live.lock().map(|l| l.values().any(|&(_, i)| i == id)).unwrap_or(false)
    }
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let b = self.alloc(data.len())?;
        self.core.drv.htod(b.ptr, data, self.core.stream)?;
        Ok(b)
    }
    pub fn upload_f32(&self, data: &[f32]) -> Result<DeviceBuffer> {
        self.upload(bytemuck::cast_slice(data))
    }
    pub fn upload_i32(&self, data: &[i32]) -> Result<DeviceBuffer> {
        self.upload(bytemuck::cast_slice(data))
    }
    /// Write host bytes at `dst` (inside a buffer the caller owns).
    pub fn write(&self, dst: DevPtr, data: &[u8]) -> Result<()> {
        super::host_times::span("host-to-device write", || self.core.drv.htod(dst, data, self.core.stream))
    }
    pub fn copy(&self, dst: DevPtr, src: DevPtr, bytes: usize) -> Result<()> {
        self.core.drv.dtod(dst, src, bytes, self.core.stream)
    }
    /// Read `out.len()` bytes at `src` (waits for all queued work).
    pub fn read(&self, src: DevPtr, out: &mut [u8]) -> Result<()> {
        let r = super::host_times::span("device-to-host read", || self.core.drv.dtoh(out, src, self.core.stream));
        super::host_times::result_ready();
        self.sample_at_readback();
        r
    }

    /// A read-back point: sample the driver's use (while watching), and say once if it
    /// went past the cap outside lode's allocations.
    pub fn sample_at_readback(&self) {
        if self.core.capacity.watching() {
            if let Ok(used) = self.used_now() {
                self.core.capacity.warn_if_over(used);
            }
        }
    }
    pub fn read_f32(&self, src: DevPtr, n: usize) -> Result<Vec<f32>> {
        let mut v = vec![0f32; n];
        self.read(src, bytemuck::cast_slice_mut(&mut v))?;
        Ok(v)
    }
    pub fn memset(&self, dst: DevPtr, value: u8, bytes: usize) -> Result<()> {
        self.core.drv.memset_d8(dst, value, bytes, self.core.stream)
    }
    /// Fill a buffer with 0xFF bytes: every f32 and f16 in it reads as NaN.
    pub fn poison(&self, b: &DeviceBuffer) -> Result<()> {
        self.memset(b.ptr, 0xFF, b.bytes)
    }
    pub fn sync(&self) -> Result<()> {
        let r = super::host_times::span("stream sync", || self.core.drv.stream_sync(self.core.stream));
        super::host_times::result_ready();
        self.sample_at_readback();
        r
    }
    pub fn register_host<'a>(&self, host: &'a [u8], coherence: driver::HostCoherence) -> Result<HostRegistration<'a>> {
        let device_ptr = self.core.drv.host_register(host, coherence)?;
        Ok(HostRegistration { core: self.core.clone(), host, device_ptr })
    }
    /// `bytes` of page-locked host memory the device reads in place.
    pub fn host_alloc(&self, bytes: usize) -> Result<PinnedHost> {
        let (host, device_ptr) = self.core.drv.host_alloc(bytes)?;
        Ok(PinnedHost { core: self.core.clone(), host, bytes, device_ptr })
    }
    pub fn timer(&self) -> Result<Timer> {
        let start = self.core.drv.event_create()?;
        let end = self.core.drv.event_create()?;
        Ok(Timer { core: self.core.clone(), start, end })
    }

    /// Kernel `name`'s function handle and whether it is launched overlapped; true the
    /// first time it is resolved.
    fn function(&self, name: &'static str) -> Result<((RawHandle, bool), bool)> {
        let mut cache = self.core.funcs.lock().map_err(|_| poisoned())?;
        Ok(match cache.get(name) {
            Some(&f) => (f, false),
            None => {
                let k = self.core.kernels.lock().map_err(|_| poisoned())?;
                let f = (k.as_ref().ok_or_else(poisoned)?.get(name)?, pdl_applies(self.core.overlap, name));
                cache.insert(name, f);
                (f, true)
            }
        })
    }

    /// Blocks of `block` threads of kernel `name` one multiprocessor holds at once, from the
    /// driver's occupancy calculator (None: the driver has no such call, or it failed).
    pub fn max_active_blocks(&self, name: &'static str, block: u32) -> Option<u32> {
        // Looked up without entering the launch cache, so the first launch still shows in
        // the memory trace.
        let cached = self.core.funcs.lock().ok()?.get(name).map(|&(f, _)| f);
        let f = match cached {
            Some(f) => f,
            None => self.core.kernels.lock().ok()?.as_ref()?.get(name).ok()?,
        };
        self.core.drv.max_active_blocks(f, block).ok().flatten()
    }

    /// Launch kernel `name` on the device stream.
    pub fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        self.launch_on(self.core.stream, name, grid, block, args)
    }

    /// Launch kernel `name` on `stream` (a second stream of this device's context).
    pub fn launch_on(&self, stream: RawHandle, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        let ((f, overlap), first) = self.function(name)?;
        let r = if overlap {
            self.core.drv.launch_overlapped(f, grid, block, 0, stream, args)
        } else {
            self.core.drv.launch(f, grid, block, 0, stream, args)
        };
        if first {
            // The driver loads a function's code (and grows the thread stack for its
            // frame) at its first launch: what that costs shows here.
            self.mem_mark(&format!("first launch of {name}"));
        }
        r
    }

    // ---- graph hooks ----
    pub fn capture_begin(&self) -> Result<()> {
        self.core.drv.capture_begin(self.core.stream)
    }
    pub fn capture_end(&self) -> Result<RawHandle> {
        self.core.drv.capture_end(self.core.stream)
    }
    pub fn graph_instantiate(&self, graph: RawHandle) -> Result<RawHandle> {
        self.core.drv.graph_instantiate(graph)
    }
    pub fn graph_update(&self, exec: RawHandle, graph: RawHandle) -> Result<bool> {
        self.core.drv.graph_exec_update(exec, graph)
    }
    pub fn graph_launch(&self, exec: RawHandle) -> Result<()> {
        super::host_times::launching();
        super::host_times::span("graph launch", || self.core.drv.graph_launch(exec, self.core.stream))
    }
    pub fn graph_destroy(&self, graph: RawHandle) -> Result<()> {
        self.core.drv.graph_destroy(graph)
    }
    pub fn graph_exec_destroy(&self, exec: RawHandle) -> Result<()> {
        self.core.drv.graph_exec_destroy(exec)
    }
}

/// The vendors' out-of-memory code (CUDA_ERROR_OUT_OF_MEMORY = hipErrorOutOfMemory = 2),
/// as a capped device refuses: callers tell it from other failures by the code.
fn out_of_memory(api: Api, call: &'static str, why: String) -> DriverError {
    DriverError::Call { api, call, code: 2, name: why }
}

fn poisoned() -> DriverError {
    DriverError::Other { api: Api::Cuda, what: "kernel table lock poisoned".into() }
}

impl Launch for GpuDevice {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<()> {
        GpuDevice::launch(self, name, grid, block, args)
    }
}
