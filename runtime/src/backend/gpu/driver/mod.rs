//! The vendor driver tables behind one trait.
//!
//! CUDA (`libcuda.so.1` + `libnvrtc`) and HIP (`libamdhip64` + `libhiprtc`) are opened at
//! run time with `libloading`; every symbol lode calls is resolved when the table is
//! opened, so a missing library or symbol is an error naming it before any work starts —
//! never a panic, never a link-time dependency. Everything above this module
//! (`device.rs`, `kernels.rs`, the backend) is written once against [`Driver`], so the code
//! that runs on the H200 is the code that runs on an AMD card.
//!
//! This folder is the only place in lode with `unsafe` FFI. Handles cross the trait as
//! plain integers ([`DevPtr`], [`RawHandle`]); the vendor module casts them back.

pub mod blas;
pub mod cuda;
pub mod hip;

use std::fmt;

/// A device address (CUDA `CUdeviceptr`, HIP `void*`).
pub type DevPtr = u64;

/// An opaque vendor handle (stream, event, module, function, graph, graph exec).
pub type RawHandle = usize;

/// Which vendor API a driver table speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Api {
    Cuda,
    Hip,
}

impl fmt::Display for Api {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Api::Cuda => "cuda",
            Api::Hip => "hip",
        })
    }
}

/// A driver-level failure. Every variant names what failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("{api}: could not open any of {tried:?} ({reason}) — {hint}")]
    LibraryMissing { api: Api, tried: Vec<String>, reason: String, hint: &'static str },
    #[error("{api}: symbol `{symbol}` missing from {library}")]
    SymbolMissing { api: Api, library: String, symbol: &'static str },
    #[error("{api}: {call} failed with {code} ({name})")]
    Call { api: Api, call: &'static str, code: i32, name: String },
    #[error("{api}: no GPU device found")]
    NoDevice { api: Api },
    #[error("{api}: run-time compile of {what} for {arch} failed:\n{log}")]
    Compile { api: Api, what: String, arch: String, log: String },
    #[error("{api}: {what}")]
    Other { api: Api, what: String },
}

pub type Result<T> = std::result::Result<T, DriverError>;

/// Per-context reservations (CUDA's `CUlimit` values). Each costs device memory in
/// every context: the stack one is reserved for every thread the GPU can hold
/// (bytes × 2,048 × SMs: 264 MiB on an H200 at the 1 KiB default), and the driver grows
/// it at launch for any kernel that needs more, so a small value is safe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Stack = 0,
    PrintfFifo = 1,
    MallocHeap = 2,
}

/// One kernel argument, passed by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KArg {
    Ptr(DevPtr),
    I32(i32),
    U32(u32),
    F32(f32),
    U64(u64),
}

/// Device properties lode asks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevAttr {
    MultiprocessorCount,
    /// An integrated GPU sharing system memory (e.g. gfx1151 Strix Halo).
    Integrated,
    UnifiedAddressing,
    CanMapHostMemory,
    L2CacheBytes,
    SharedMemPerBlockOptin,
    PageableMemoryAccess,
}

/// How registered host memory is kept coherent with the device's caches. HIP's
/// coherence-control guide: coarse-grained memory is cached by the device and is up to
/// date once a synchronization has passed (the guide's choice for bulk data); fine-grained
/// memory is coherent while either side writes, at the price of bypassing caches. The
/// weights never change once mapped, so `Coarse` (the default) is what they need, with a
/// stream synchronization after registering; `Fine` is the fallback for a device whose
/// coarse-grained reads of host memory prove wrong (`lode selftest --residency-check`).
/// CUDA has one coherence model: its tables ignore this and always register read-only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostCoherence {
    Coarse,
    Fine,
}

/// Static facts about the device a table was opened on.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    pub name: String,
    /// `sm_90`, `gfx1100`, `gfx1151` …
    pub arch: String,
    /// The driver's version number (CUDA: 13000 = 13.0; HIP: its build number).
    pub driver_version: i32,
    pub total_mem: u64,
}

/// The thin table both vendors implement. Methods mirror the vendor calls one to one;
/// policy (caching, pooling, choosing kernels) lives above this trait.
pub trait Driver: Send + Sync {
    fn api(&self) -> Api;
    fn info(&self) -> &DeviceInfo;
    fn attribute(&self, attr: DevAttr) -> Result<i32>;
    /// (free, total) bytes of device memory.
    fn mem_info(&self) -> Result<(u64, u64)>;
    /// Set a context limit; returns the value now in force. Backends without the call
    /// keep their defaults.
    fn set_limit(&self, _limit: Limit, _bytes: usize) -> Result<usize> {
        Err(DriverError::Other { api: Api::Hip, what: "context limits are not set on this backend".into() })
    }

    fn malloc(&self, bytes: usize) -> Result<DevPtr>;
    fn free(&self, ptr: DevPtr) -> Result<()>;
    fn memset_d8(&self, dst: DevPtr, value: u8, bytes: usize, stream: RawHandle) -> Result<()>;
    /// Copy host → device. Returns once `src` may be reused.
    fn htod(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()>;
    /// Copy host → device from page-locked memory (`host_alloc`), queued on `stream`
    /// without waiting: the caller leaves `src` unchanged until the stream has passed the
    /// copy (an event recorded after it). The default waits as `htod` does.
    fn htod_pinned(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()> {
        self.htod(dst, src, stream)
    }
    /// Copy device → host and wait for it.
    fn dtoh(&self, dst: &mut [u8], src: DevPtr, stream: RawHandle) -> Result<()>;
    fn dtod(&self, dst: DevPtr, src: DevPtr, bytes: usize, stream: RawHandle) -> Result<()>;
    /// Page-lock `host` for device reads only (it may be a read-only file mapping) and
    /// return the device address that reads it; `coherence` is how the device caches it
    /// ([`HostCoherence`]). The caller keeps `host` alive and unregisters it before
    /// freeing it.
    fn host_register(&self, host: &[u8], coherence: HostCoherence) -> Result<DevPtr>;
    fn host_unregister(&self, host: &[u8]) -> Result<()>;
    /// Page-locked host memory the device reads in place (`cuMemHostAlloc` /
    /// `hipHostMalloc` with the mapped flag): (host address, device address). Unlike
    /// [`Driver::host_register`] the driver allocates the pages itself, so nothing of the
    /// caller's (file-backed) mappings is pinned.
    fn host_alloc(&self, bytes: usize) -> Result<(usize, DevPtr)>;
    fn host_free(&self, host: usize) -> Result<()>;

    /// Virtual memory management (a growable device arena: reserve addresses once, back
    /// them with physical memory as it fills). `None` where the driver has no such calls
    /// (callers then allocate with [`Driver::malloc`]); otherwise the mapping granularity.
    fn vmm_granularity(&self) -> Option<usize> {
        None
    }
    /// Reserve `bytes` (a multiple of the granularity) of device addresses, unbacked.
    fn va_reserve(&self, _bytes: usize) -> Result<DevPtr> {
        Err(DriverError::Other { api: self.api(), what: "no virtual memory management on this backend".into() })
    }
    fn va_free(&self, _ptr: DevPtr, _bytes: usize) -> Result<()> {
        Ok(())
    }
    /// Back `[ptr, ptr+bytes)` (inside a reservation, granularity-aligned) with new
    /// physical device memory, readable and writable by the device. Returns its handle.
    fn va_map(&self, _ptr: DevPtr, _bytes: usize) -> Result<u64> {
        Err(DriverError::Other { api: self.api(), what: "no virtual memory management on this backend".into() })
    }
    /// Undo one [`Driver::va_map`] (same range, same handle) and free its memory.
    fn va_unmap(&self, _ptr: DevPtr, _bytes: usize, _handle: u64) -> Result<()> {
        Ok(())
    }

    fn stream_create(&self) -> Result<RawHandle>;
    fn stream_destroy(&self, stream: RawHandle) -> Result<()>;
    fn stream_sync(&self, stream: RawHandle) -> Result<()>;
    fn event_create(&self) -> Result<RawHandle>;
    fn event_destroy(&self, event: RawHandle) -> Result<()>;
    fn event_record(&self, event: RawHandle, stream: RawHandle) -> Result<()>;
    fn event_sync(&self, event: RawHandle) -> Result<()>;
    fn event_elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32>;
    /// Make `stream`'s later work wait for `event`'s latest record (on any stream).
    fn stream_wait_event(&self, stream: RawHandle, event: RawHandle) -> Result<()>;

    /// Load a code object (cubin / PTX / AMD HSA code object).
    fn module_load(&self, image: &[u8]) -> Result<RawHandle>;
    fn module_unload(&self, module: RawHandle) -> Result<()>;
    fn module_function(&self, module: RawHandle, name: &str) -> Result<RawHandle>;
    fn launch(
        &self,
        func: RawHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: RawHandle,
        args: &[KArg],
    ) -> Result<()>;
    /// Launch `func` allowed to start before the previous kernel in `stream` has finished
    /// (NVIDIA's programmatic dependent launch). Only for kernels whose first statement
    /// is `pdl_entry()` (kernels-hip/common.h), which waits for that kernel: the result
    /// is the same as [`Driver::launch`], with the launch latency hidden behind the
    /// previous kernel's tail. Drivers without it launch the ordinary way. `GpuDevice`
    /// chooses which kernels take it (`device::Pdl`).
    fn launch_overlapped(
        &self,
        func: RawHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_bytes: u32,
        stream: RawHandle,
        args: &[KArg],
    ) -> Result<()> {
        self.launch(func, grid, block, shared_bytes, stream, args)
    }
    /// Whether [`Driver::launch_overlapped`] really overlaps on this device.
    fn overlapped_launches(&self) -> bool {
        false
    }
    /// How many blocks of `block` threads of `func` one multiprocessor holds at once (the
    /// driver's occupancy calculator: registers, shared memory, the block limit), or `None`
    /// where the driver lacks the call.
    fn max_active_blocks(&self, _func: RawHandle, _block: u32) -> Result<Option<u32>> {
        Ok(None)
    }

    // Graph hooks (issue 7 builds replay on these).
    fn capture_begin(&self, stream: RawHandle) -> Result<()>;
    /// End capture and return the captured graph.
    fn capture_end(&self, stream: RawHandle) -> Result<RawHandle>;
    fn graph_instantiate(&self, graph: RawHandle) -> Result<RawHandle>;
    /// Update an instantiated graph's kernel parameters from a newly captured graph of the
    /// same topology. `Ok(false)` when the topology differs and a new instance is needed.
    fn graph_exec_update(&self, exec: RawHandle, graph: RawHandle) -> Result<bool>;
    fn graph_launch(&self, exec: RawHandle, stream: RawHandle) -> Result<()>;
    fn graph_destroy(&self, graph: RawHandle) -> Result<()>;
    fn graph_exec_destroy(&self, exec: RawHandle) -> Result<()>;

    /// Compile kernel source at run time (NVRTC / hipRTC) for `arch`; returns a loadable
    /// image. The RTC library is opened on first use, so a missing one only fails here.
    fn rtc_compile(&self, source: &str, name: &str, arch: &str) -> Result<Vec<u8>>;
}

/// `LODE_DEBUG=mem`: print the driver's used-memory figure at each point where lode's
/// device footprint changes shape (context, each module, weights, KV, scratch, graphs).
pub fn mem_trace() -> bool {
    crate::diag::get().mem
}

/// Open the first library of `names` that loads; the error lists every name tried.
pub(crate) fn open_first(api: Api, names: &[&str], hint: &'static str) -> Result<(libloading::Library, String)> {
    let mut reasons = Vec::new();
    for name in names {
        // SAFETY: opening a vendor runtime runs its initialisers; these are the vendors'
        // own shared libraries, loaded the same way their runtimes document.
        match unsafe { libloading::Library::new(name) } {
            Ok(lib) => return Ok((lib, (*name).to_string())),
            Err(e) => reasons.push(e.to_string()),
        }
    }
    Err(DriverError::LibraryMissing {
        api,
        tried: names.iter().map(|s| s.to_string()).collect(),
        reason: reasons.last().cloned().unwrap_or_default(),
        hint,
    })
}

/// Resolve `symbol` in `lib` as a function pointer of type `T` (copied out of the
/// library so the table can own both).
pub(crate) fn sym<T: Copy>(api: Api, lib: &libloading::Library, lib_name: &str, symbol: &'static str) -> Result<T> {
    let mut cname = symbol.as_bytes().to_vec();
    cname.push(0);
    // SAFETY: `T` is the function-pointer type of this symbol's C declaration (each call
    // site names the vendor header's signature); the Library outlives the pointer
    // because the table stores both and drops the pointer table first.
    unsafe {
        lib.get::<T>(&cname)
            .map(|s| *s)
            .map_err(|_| DriverError::SymbolMissing { api, library: lib_name.to_string(), symbol })
    }
}

/// Marshal kernel arguments into the `void**` array both vendors' launch calls take.
/// `store` must outlive the launch call; the returned pointers point into it.
pub(crate) fn marshal_args(args: &[KArg], store: &mut Vec<u64>) -> Vec<*mut std::ffi::c_void> {
    store.clear();
    store.extend(args.iter().map(|a| match *a {
        KArg::Ptr(p) | KArg::U64(p) => p,
        KArg::I32(v) => v as u32 as u64,
        KArg::U32(v) => v as u64,
        KArg::F32(v) => v.to_bits() as u64,
    }));
    // Little-endian: the low 4 bytes of each u64 slot are the 32-bit value.
    store.iter_mut().map(|s| s as *mut u64 as *mut std::ffi::c_void).collect()
}

/// Open the driver table for `api` on device `ordinal`.
pub fn open(api: Api, ordinal: i32) -> Result<Box<dyn Driver>> {
    match api {
        Api::Cuda => Ok(Box::new(cuda::CudaDriver::open(ordinal)?)),
        Api::Hip => Ok(Box::new(hip::HipDriver::open(ordinal)?)),
    }
}
