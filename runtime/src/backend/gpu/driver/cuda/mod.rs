//! The CUDA driver API (`libcuda.so.1`) and NVRTC, opened at run time.
//!
//! lode uses the device's primary context, made current on whichever thread calls in
//! (each call sets it; the cost is a TLS write). Signatures follow `cuda.h` of CUDA 12/13;
//! the `_v2` names are the ones the header's macros select.

use super::{open_first, sym, Api, DevAttr, DevPtr, DeviceInfo, Driver, DriverError, HostCoherence, KArg, Limit, RawHandle, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

mod abi;
use abi::*;

pub struct CudaDriver {
    t: Table,
    ctx: Ctx,
    dev: c_int,
    info: DeviceInfo,
    nvrtc: OnceLock<std::result::Result<Nvrtc, String>>,
    vmm: Option<(Vmm, usize)>,
    /// `cuLaunchKernelEx` (CUDA 12+), used for programmatic dependent launches on sm_90+.
    launch_ex: Option<LaunchKernelEx>,
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`, resolved when present.
    occupancy: Option<Occupancy>,
    _lib: libloading::Library,
}


// SAFETY: the CUDA driver API is thread-safe; the context handle is a process-wide
// primary context that every call makes current on its own thread first.
unsafe impl Send for CudaDriver {}
// SAFETY: as above; the table holds only function pointers and immutable data.
unsafe impl Sync for CudaDriver {}

const LIBS: &[&str] = &["libcuda.so.1", "libcuda.so"];
const HINT: &str = "no CUDA driver was found (libcuda.so.1); install the NVIDIA driver or use --device cpu";

impl CudaDriver {
    pub fn open(ordinal: i32) -> Result<CudaDriver> {
        let (lib, name) = open_first(Api::Cuda, LIBS, HINT)?;
        let a = Api::Cuda;
        let s = |n| (a, &lib, name.as_str(), n);
        macro_rules! get {
            ($n:expr) => {{
                let (a, l, ln, n) = s($n);
                sym(a, l, ln, n)?
            }};
        }
        let elapsed = sym(a, &lib, &name, "cuEventElapsedTime_v2").or_else(|_| sym(a, &lib, &name, "cuEventElapsedTime"))?;
        let t = Table {
            init: get!("cuInit"),
            driver_get_version: get!("cuDriverGetVersion"),
            device_get_count: get!("cuDeviceGetCount"),
            device_get: get!("cuDeviceGet"),
            device_get_name: get!("cuDeviceGetName"),
            device_get_attribute: get!("cuDeviceGetAttribute"),
            device_total_mem: get!("cuDeviceTotalMem_v2"),
            primary_ctx_retain: get!("cuDevicePrimaryCtxRetain"),
            ctx_set_current: get!("cuCtxSetCurrent"),
            ctx_set_limit: get!("cuCtxSetLimit"),
            ctx_get_limit: get!("cuCtxGetLimit"),
            get_error_name: get!("cuGetErrorName"),
            mem_get_info: get!("cuMemGetInfo_v2"),
            mem_alloc: get!("cuMemAlloc_v2"),
            mem_free: get!("cuMemFree_v2"),
            memset_d8_async: get!("cuMemsetD8Async"),
            memcpy_htod_async: get!("cuMemcpyHtoDAsync_v2"),
            memcpy_dtoh_async: get!("cuMemcpyDtoHAsync_v2"),
            memcpy_dtod_async: get!("cuMemcpyDtoDAsync_v2"),
            mem_host_register: get!("cuMemHostRegister_v2"),
            mem_host_unregister: get!("cuMemHostUnregister"),
            mem_host_get_device_pointer: get!("cuMemHostGetDevicePointer_v2"),
            mem_host_alloc: get!("cuMemHostAlloc"),
            mem_free_host: get!("cuMemFreeHost"),
            stream_create: get!("cuStreamCreate"),
            stream_destroy: get!("cuStreamDestroy_v2"),
            stream_synchronize: get!("cuStreamSynchronize"),
            event_create: get!("cuEventCreate"),
            event_destroy: get!("cuEventDestroy_v2"),
            event_record: get!("cuEventRecord"),
            event_synchronize: get!("cuEventSynchronize"),
            stream_wait_event: get!("cuStreamWaitEvent"),
            event_elapsed_time: elapsed,
            module_load_data: get!("cuModuleLoadData"),
            module_unload: get!("cuModuleUnload"),
            module_get_function: get!("cuModuleGetFunction"),
            launch_kernel: get!("cuLaunchKernel"),
            stream_begin_capture: get!("cuStreamBeginCapture_v2"),
            stream_end_capture: get!("cuStreamEndCapture"),
            graph_instantiate: get!("cuGraphInstantiateWithFlags"),
            graph_exec_update: get!("cuGraphExecUpdate_v2"),
            graph_launch: get!("cuGraphLaunch"),
            graph_destroy: get!("cuGraphDestroy"),
            graph_exec_destroy: get!("cuGraphExecDestroy"),
        };
        let vmm = (|| -> Result<Vmm> {
            Ok(Vmm {
                granularity: get!("cuMemGetAllocationGranularity"),
                reserve: get!("cuMemAddressReserve"),
                free: get!("cuMemAddressFree"),
                create: get!("cuMemCreate"),
                release: get!("cuMemRelease"),
                map: get!("cuMemMap"),
                unmap: get!("cuMemUnmap"),
                set_access: get!("cuMemSetAccess"),
            })
        })()
        .ok();
        let launch_ex = sym(a, &lib, &name, "cuLaunchKernelEx").ok();
        let occupancy = sym(a, &lib, &name, "cuOccupancyMaxActiveBlocksPerMultiprocessor").ok();
        let mut d = CudaDriver {
            t,
            launch_ex,
            occupancy,
            ctx: std::ptr::null_mut(),
            dev: 0,
            info: DeviceInfo { name: String::new(), arch: String::new(), driver_version: 0, total_mem: 0 },
            nvrtc: OnceLock::new(),
            vmm: None,
            _lib: lib,
        };
        // SAFETY: cuInit(0) is the documented first call; the out-pointers are locals.
        unsafe {
            d.check("cuInit", (d.t.init)(0))?;
            let mut n = 0;
            d.check("cuDeviceGetCount", (d.t.device_get_count)(&mut n))?;
            if n <= ordinal {
                return Err(DriverError::NoDevice { api: Api::Cuda });
            }
            let mut dev = 0;
            d.check("cuDeviceGet", (d.t.device_get)(&mut dev, ordinal))?;
            d.dev = dev;
            let mut ctx = std::ptr::null_mut();
            d.check("cuDevicePrimaryCtxRetain", (d.t.primary_ctx_retain)(&mut ctx, d.dev))?;
            d.ctx = ctx;
            d.check("cuCtxSetCurrent", (d.t.ctx_set_current)(d.ctx))?;
            let mut name = [0 as c_char; 256];
            d.check("cuDeviceGetName", (d.t.device_get_name)(name.as_mut_ptr(), 256, d.dev))?;
            d.info.name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
            let (mut major, mut minor) = (0, 0);
            d.check("cuDeviceGetAttribute", (d.t.device_get_attribute)(&mut major, 75, d.dev))?;
            d.check("cuDeviceGetAttribute", (d.t.device_get_attribute)(&mut minor, 76, d.dev))?;
            d.info.arch = format!("sm_{major}{minor}");
            let mut ver = 0;
            d.check("cuDriverGetVersion", (d.t.driver_get_version)(&mut ver))?;
            d.info.driver_version = ver;
            let mut total = 0usize;
            d.check("cuDeviceTotalMem", (d.t.device_total_mem)(&mut total, d.dev))?;
            d.info.total_mem = total as u64;
        }
        // Attribute 102: CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED.
        if let (Some(v), Ok(1)) = (vmm, d.attribute_id(102)) {
            let mut g = 0usize;
            // SAFETY: `prop` is a valid CUmemAllocationProp; the out-pointer is a local.
            let rc = unsafe { (v.granularity)(&mut g, &d.alloc_prop(), 0) };
            if rc == 0 && g > 0 {
                d.vmm = Some((v, g));
            }
        }
        Ok(d)
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorName writes a pointer to a static string (or leaves null).
        let name = unsafe {
            (self.t.get_error_name)(code, &mut p);
            if p.is_null() { format!("CUresult {code}") } else { CStr::from_ptr(p).to_string_lossy().into_owned() }
        };
        Err(DriverError::Call { api: Api::Cuda, call, code, name })
    }

    fn attribute_id(&self, id: c_int) -> Result<i32> {
        let mut v = 0;
        // SAFETY: out-pointer is a local; `dev` is a valid device ordinal from open().
        self.check("cuDeviceGetAttribute", unsafe { (self.t.device_get_attribute)(&mut v, id, self.dev) })?;
        Ok(v)
    }

    fn alloc_prop(&self) -> AllocProp {
        AllocProp { ty: 1, handle_types: 0, location: Location { ty: 1, id: self.dev }, win32_meta: std::ptr::null_mut(), alloc_flags: [0; 8] }
    }

    /// Make the primary context current on the calling thread.
    fn cur(&self) -> Result<()> {
        // SAFETY: `ctx` was retained in `open` and is never released while `self` lives.
        self.check("cuCtxSetCurrent", unsafe { (self.t.ctx_set_current)(self.ctx) })
    }

    fn nvrtc(&self) -> Result<&Nvrtc> {
        let r = self.nvrtc.get_or_init(|| {
            let names = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];
            let (lib, n) = open_first(Api::Cuda, &names, "NVRTC (libnvrtc.so) is needed to compile kernels for this GPU")
                .map_err(|e| e.to_string())?;
            macro_rules! g {
                ($s:expr) => {
                    sym(Api::Cuda, &lib, &n, $s).map_err(|e| e.to_string())
                };
            }
            Ok(Nvrtc {
                create: g!("nvrtcCreateProgram")?,
                compile: g!("nvrtcCompileProgram")?,
                log_size: g!("nvrtcGetProgramLogSize")?,
                log: g!("nvrtcGetProgramLog")?,
                cubin_size: g!("nvrtcGetCUBINSize")?,
                cubin: g!("nvrtcGetCUBIN")?,
                destroy: g!("nvrtcDestroyProgram")?,
                _lib: lib,
            })
        });
        r.as_ref().map_err(|e| DriverError::Other { api: Api::Cuda, what: e.clone() })
    }
}

fn h(p: RawHandle) -> *mut c_void {
    p as *mut c_void
}

impl Driver for CudaDriver {
    fn api(&self) -> Api {
        Api::Cuda
    }
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn attribute(&self, attr: DevAttr) -> Result<i32> {
        let id = match attr {
            DevAttr::MultiprocessorCount => 16,
            DevAttr::Integrated => 18,
            DevAttr::CanMapHostMemory => 19,
            DevAttr::L2CacheBytes => 38,
            DevAttr::UnifiedAddressing => 41,
            DevAttr::PageableMemoryAccess => 88,
            DevAttr::SharedMemPerBlockOptin => 97,
        };
        self.attribute_id(id)
    }
    fn set_limit(&self, limit: Limit, bytes: usize) -> Result<usize> {
        self.cur()?;
        let id = limit as c_int;
        // SAFETY: `id` is a CUlimit value (0 stack, 1 printf FIFO, 2 malloc heap); the
        // out-pointer is a local.
        unsafe {
            self.check("cuCtxSetLimit", (self.t.ctx_set_limit)(id, bytes))?;
            let mut now = 0usize;
            self.check("cuCtxGetLimit", (self.t.ctx_get_limit)(&mut now, id))?;
            Ok(now)
        }
    }
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.cur()?;
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: out-pointers are locals.
        self.check("cuMemGetInfo", unsafe { (self.t.mem_get_info)(&mut f, &mut t) })?;
        Ok((f as u64, t as u64))
    }
    fn malloc(&self, bytes: usize) -> Result<DevPtr> {
        self.cur()?;
        let mut p = 0u64;
        // SAFETY: out-pointer is a local; a zero-size request is rounded up to 1 byte.
        self.check("cuMemAlloc", unsafe { (self.t.mem_alloc)(&mut p, bytes.max(1)) })?;
        Ok(p)
    }
    fn free(&self, ptr: DevPtr) -> Result<()> {
        self.cur()?;
        // SAFETY: `ptr` came from malloc() of this driver (the caller's buffer owns it once).
        self.check("cuMemFree", unsafe { (self.t.mem_free)(ptr) })
    }
    fn memset_d8(&self, dst: DevPtr, value: u8, bytes: usize, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: the caller's buffer covers [dst, dst+bytes) on this device.
        self.check("cuMemsetD8Async", unsafe { (self.t.memset_d8_async)(dst, value, bytes, h(stream)) })
    }
    fn htod_pinned(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()> {
        // From page-locked memory the copy is queued and returns at once (`htod`'s call);
        // the caller keeps `src` unchanged until the stream has passed it.
        self.htod(dst, src, stream)
    }
    fn htod(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: `src` is a live slice; from pageable memory the call returns after the
        // bytes are staged, so `src` may be reused when it returns.
        self.check("cuMemcpyHtoDAsync", unsafe { (self.t.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), h(stream)) })
    }
    fn dtoh(&self, dst: &mut [u8], src: DevPtr, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: `dst` is a live exclusive slice and we synchronize before returning.
        unsafe {
            self.check("cuMemcpyDtoHAsync", (self.t.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), src, dst.len(), h(stream)))?;
            self.check("cuStreamSynchronize", (self.t.stream_synchronize)(h(stream)))
        }
    }
    fn dtod(&self, dst: DevPtr, src: DevPtr, bytes: usize, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: both ranges lie inside buffers of this device (checked by the caller).
        self.check("cuMemcpyDtoDAsync", unsafe { (self.t.memcpy_dtod_async)(dst, src, bytes, h(stream)) })
    }
    fn host_register(&self, host: &[u8], _coherence: HostCoherence) -> Result<DevPtr> {
        self.cur()?;
        let mut d = 0u64;
        // CU_MEMHOSTREGISTER_DEVICEMAP (0x2) | CU_MEMHOSTREGISTER_READ_ONLY (0x8): the
        // device only reads it, and the driver requires READ_ONLY to register a mapping the
        // CPU has read-only (the model file). One coherence model: `_coherence` is HIP's.
        // SAFETY: `host` is live; the caller unregisters before freeing.
        unsafe {
            self.check("cuMemHostRegister", (self.t.mem_host_register)(host.as_ptr() as *mut c_void, host.len(), 0x2 | 0x8))?;
            self.check("cuMemHostGetDevicePointer", (self.t.mem_host_get_device_pointer)(&mut d, host.as_ptr() as *mut c_void, 0))?;
        }
        Ok(d)
    }
    fn host_unregister(&self, host: &[u8]) -> Result<()> {
        self.cur()?;
        // SAFETY: `host` was registered by host_register.
        self.check("cuMemHostUnregister", unsafe { (self.t.mem_host_unregister)(host.as_ptr() as *mut c_void) })
    }
    fn host_alloc(&self, bytes: usize) -> Result<(usize, DevPtr)> {
        self.cur()?;
        let mut h: *mut c_void = std::ptr::null_mut();
        let mut d = 0u64;
        // SAFETY: out-pointers are locals; flags 0x2 = CU_MEMHOSTALLOC_DEVICEMAP. The
        // caller frees the pages with host_free once no work reads them.
        unsafe {
            self.check("cuMemHostAlloc", (self.t.mem_host_alloc)(&mut h, bytes.max(1), 0x2))?;
            if let Err(e) = self.check("cuMemHostGetDevicePointer", (self.t.mem_host_get_device_pointer)(&mut d, h, 0)) {
                (self.t.mem_free_host)(h);
                return Err(e);
            }
        }
        Ok((h as usize, d))
    }
    fn host_free(&self, host: usize) -> Result<()> {
        self.cur()?;
        // SAFETY: `host` came from host_alloc and is freed once.
        self.check("cuMemFreeHost", unsafe { (self.t.mem_free_host)(host as *mut c_void) })
    }
    fn vmm_granularity(&self) -> Option<usize> {
        self.vmm.as_ref().map(|v| v.1)
    }
    fn va_reserve(&self, bytes: usize) -> Result<DevPtr> {
        let Some((v, g)) = &self.vmm else { return Err(DriverError::Other { api: Api::Cuda, what: "no VMM".into() }) };
        self.cur()?;
        let mut p = 0u64;
        // SAFETY: out-pointer is a local; alignment is the granularity; no fixed address.
        self.check("cuMemAddressReserve", unsafe { (v.reserve)(&mut p, bytes, *g, 0, 0) })?;
        Ok(p)
    }
    fn va_free(&self, ptr: DevPtr, bytes: usize) -> Result<()> {
        let Some((v, _)) = &self.vmm else { return Ok(()) };
        self.cur()?;
        // SAFETY: the range was reserved by va_reserve with this size and is unmapped.
        self.check("cuMemAddressFree", unsafe { (v.free)(ptr, bytes) })
    }
    fn va_map(&self, ptr: DevPtr, bytes: usize) -> Result<u64> {
        let Some((v, _)) = &self.vmm else { return Err(DriverError::Other { api: Api::Cuda, what: "no VMM".into() }) };
        self.cur()?;
        let prop = self.alloc_prop();
        let access = AccessDesc { location: prop.location, flags: 3 };
        let mut h = 0u64;
        // SAFETY: `prop`/`access` are valid structs for the calls; `[ptr, ptr+bytes)` lies in
        // a reservation of this driver, granularity-aligned and not mapped yet (the arena's
        // invariant). Every failure path releases what this call made.
        unsafe {
            self.check("cuMemCreate", (v.create)(&mut h, bytes, &prop, 0))?;
            if let Err(e) = self.check("cuMemMap", (v.map)(ptr, bytes, 0, h, 0)) {
                (v.release)(h);
                return Err(e);
            }
            if let Err(e) = self.check("cuMemSetAccess", (v.set_access)(ptr, bytes, &access, 1)) {
                (v.unmap)(ptr, bytes);
                (v.release)(h);
                return Err(e);
            }
        }
        Ok(h)
    }
    fn va_unmap(&self, ptr: DevPtr, bytes: usize, handle: u64) -> Result<()> {
        let Some((v, _)) = &self.vmm else { return Ok(()) };
        self.cur()?;
        // SAFETY: `[ptr, ptr+bytes)` was mapped to `handle` by va_map; no queued work reads
        // it (the arena synchronizes first).
        unsafe {
            self.check("cuMemUnmap", (v.unmap)(ptr, bytes))?;
            self.check("cuMemRelease", (v.release)(handle))
        }
    }
    fn stream_create(&self) -> Result<RawHandle> {
        self.cur()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: out-pointer is a local; flag 1 = non-blocking w.r.t. the legacy stream.
        self.check("cuStreamCreate", unsafe { (self.t.stream_create)(&mut s, 1) })?;
        Ok(s as RawHandle)
    }
    fn stream_destroy(&self, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: the stream was created by stream_create and is destroyed once.
        self.check("cuStreamDestroy", unsafe { (self.t.stream_destroy)(h(stream)) })
    }
    fn stream_sync(&self, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: valid stream handle (or 0, the legacy stream).
        self.check("cuStreamSynchronize", unsafe { (self.t.stream_synchronize)(h(stream)) })
    }
    fn event_create(&self) -> Result<RawHandle> {
        self.cur()?;
        let mut e = std::ptr::null_mut();
        // SAFETY: out-pointer is a local; flags 0 = timing-enabled event.
        self.check("cuEventCreate", unsafe { (self.t.event_create)(&mut e, 0) })?;
        Ok(e as RawHandle)
    }
    fn event_destroy(&self, event: RawHandle) -> Result<()> {
        // SAFETY: event from event_create, destroyed once.
        self.check("cuEventDestroy", unsafe { (self.t.event_destroy)(h(event)) })
    }
    fn event_record(&self, event: RawHandle, stream: RawHandle) -> Result<()> {
        // SAFETY: valid handles from this driver.
        self.check("cuEventRecord", unsafe { (self.t.event_record)(h(event), h(stream)) })
    }
    fn event_sync(&self, event: RawHandle) -> Result<()> {
        // SAFETY: valid event handle.
        self.check("cuEventSynchronize", unsafe { (self.t.event_synchronize)(h(event)) })
    }
    fn stream_wait_event(&self, stream: RawHandle, event: RawHandle) -> Result<()> {
        // SAFETY: valid handles from this driver; flags 0.
        self.check("cuStreamWaitEvent", unsafe { (self.t.stream_wait_event)(h(stream), h(event), 0) })
    }
    fn event_elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: valid recorded events; out-pointer is a local.
        self.check("cuEventElapsedTime", unsafe { (self.t.event_elapsed_time)(&mut ms, h(start), h(end)) })?;
        Ok(ms)
    }
    fn module_load(&self, image: &[u8]) -> Result<RawHandle> {
        self.cur()?;
        let mut m = std::ptr::null_mut();
        // PTX must be NUL-terminated; cubins carry their own length in the ELF header.
        let owned: Vec<u8>;
        let img: &[u8] = if image.starts_with(b"\x7fELF") || image.last() == Some(&0) {
            image
        } else {
            owned = image.iter().copied().chain(std::iter::once(0)).collect();
            &owned
        };
        let before = if super::mem_trace() { self.mem_info().ok() } else { None };
        // SAFETY: `img` is a complete cubin/PTX image alive for the call (the driver copies it).
        self.check("cuModuleLoadData", unsafe { (self.t.module_load_data)(&mut m, img.as_ptr().cast()) })?;
        if let (Some((f0, t)), Ok((f1, _))) = (before, self.mem_info()) {
            eprintln!("mem: module load ({} B image): driver used {} MiB ({:+} KiB)", image.len(), (t - f1) >> 20, (f0 as i64 - f1 as i64) >> 10);
        }
        Ok(m as RawHandle)
    }
    fn module_unload(&self, module: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: module from module_load, unloaded once.
        self.check("cuModuleUnload", unsafe { (self.t.module_unload)(h(module)) })
    }
    fn module_function(&self, module: RawHandle, name: &str) -> Result<RawHandle> {
        let c = CString::new(name).map_err(|_| DriverError::Other { api: Api::Cuda, what: format!("bad kernel name {name:?}") })?;
        let mut f = std::ptr::null_mut();
        // SAFETY: valid module; `c` is NUL-terminated and alive for the call.
        self.check("cuModuleGetFunction", unsafe { (self.t.module_get_function)(&mut f, h(module), c.as_ptr()) })
            .map_err(|e| match e {
                DriverError::Call { api, code, name: n, .. } => DriverError::Call { api, call: "cuModuleGetFunction", code, name: format!("{n}: kernel `{name}`") },
                e => e,
            })?;
        Ok(f as RawHandle)
    }
    fn launch(&self, func: RawHandle, grid: [u32; 3], block: [u32; 3], shared_bytes: u32, stream: RawHandle, args: &[KArg]) -> Result<()> {
        self.cur()?;
        let mut store = Vec::with_capacity(args.len());
        let mut ptrs = super::marshal_args(args, &mut store);
        // SAFETY: `ptrs` point into `store`, alive across the call; the driver copies the
        // argument values at launch. Argument count/types match the kernel's signature by
        // construction in kernels.rs (each launch site names the kernel's parameters).
        self.check("cuLaunchKernel", unsafe {
            (self.t.launch_kernel)(
                h(func), grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes, h(stream),
                ptrs.as_mut_ptr(), std::ptr::null_mut(),
            )
        })
    }
    fn launch_overlapped(&self, func: RawHandle, grid: [u32; 3], block: [u32; 3], shared_bytes: u32, stream: RawHandle, args: &[KArg]) -> Result<()> {
        let Some(launch_ex) = self.launch_ex.filter(|_| self.overlapped_launches()) else {
            return self.launch(func, grid, block, shared_bytes, stream, args);
        };
        self.cur()?;
        let mut store = Vec::with_capacity(args.len());
        let mut ptrs = super::marshal_args(args, &mut store);
        let mut value = [0u64; 8];
        value[0] = 1; // programmaticStreamSerializationAllowed = 1 (an int at offset 0)
        let attr = LaunchAttribute { id: ATTR_PROGRAMMATIC_STREAM_SERIALIZATION, pad: [0; 4], value };
        let cfg = LaunchConfig { grid, block, shared_bytes, stream: h(stream), attrs: &attr, num_attrs: 1 };
        // SAFETY: `cfg` and `attr` are locals alive across the call and laid out as
        // `CUlaunchConfig` / `CUlaunchAttribute`; `ptrs` point into `store` (see `launch`).
        self.check("cuLaunchKernelEx", unsafe { launch_ex(&cfg, h(func), ptrs.as_mut_ptr(), std::ptr::null_mut()) })
    }
    fn max_active_blocks(&self, func: RawHandle, block: u32) -> Result<Option<u32>> {
        let Some(occ) = self.occupancy else { return Ok(None) };
        self.cur()?;
        let mut n: c_int = 0;
        // SAFETY: `func` is a function handle of this context's loaded module; `n` outlives the call.
        self.check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe { occ(&mut n, h(func), block as c_int, 0) })?;
        Ok(Some(n.max(0) as u32))
    }
    fn overlapped_launches(&self) -> bool {
        // Programmatic dependent launch needs compute capability 9.0.
        self.launch_ex.is_some() && self.info.arch.strip_prefix("sm_").and_then(|v| v.parse::<u32>().ok()).is_some_and(|v| v >= 90)
    }
    fn capture_begin(&self, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: valid stream; mode 2 = CU_STREAM_CAPTURE_MODE_RELAXED.
        self.check("cuStreamBeginCapture", unsafe { (self.t.stream_begin_capture)(h(stream), 2) })
    }
    fn capture_end(&self, stream: RawHandle) -> Result<RawHandle> {
        let mut g = std::ptr::null_mut();
        // SAFETY: valid capturing stream; out-pointer is a local.
        self.check("cuStreamEndCapture", unsafe { (self.t.stream_end_capture)(h(stream), &mut g) })?;
        Ok(g as RawHandle)
    }
    fn graph_instantiate(&self, graph: RawHandle) -> Result<RawHandle> {
        let mut e = std::ptr::null_mut();
        // SAFETY: valid graph; out-pointer is a local.
        self.check("cuGraphInstantiate", unsafe { (self.t.graph_instantiate)(&mut e, h(graph), 0) })?;
        Ok(e as RawHandle)
    }
    fn graph_exec_update(&self, exec: RawHandle, graph: RawHandle) -> Result<bool> {
        let mut info = [0u64; 3];
        // SAFETY: valid handles; `info` matches CUgraphExecUpdateResultInfo (enum + 2 pointers).
        let r = unsafe { (self.t.graph_exec_update)(h(exec), h(graph), &mut info) };
        match r {
            0 => Ok(true),
            910 => Ok(false), // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
            c => self.check("cuGraphExecUpdate", c).map(|_| false),
        }
    }
    fn graph_launch(&self, exec: RawHandle, stream: RawHandle) -> Result<()> {
        self.cur()?;
        // SAFETY: valid instantiated graph and stream.
        self.check("cuGraphLaunch", unsafe { (self.t.graph_launch)(h(exec), h(stream)) })
    }
    fn graph_destroy(&self, graph: RawHandle) -> Result<()> {
        // SAFETY: graph from capture_end, destroyed once.
        self.check("cuGraphDestroy", unsafe { (self.t.graph_destroy)(h(graph)) })
    }
    fn graph_exec_destroy(&self, exec: RawHandle) -> Result<()> {
        // SAFETY: exec from graph_instantiate, destroyed once.
        self.check("cuGraphExecDestroy", unsafe { (self.t.graph_exec_destroy)(h(exec)) })
    }
    fn rtc_compile(&self, source: &str, name: &str, arch: &str) -> Result<Vec<u8>> {
        let n = self.nvrtc()?;
        let fail = |log: String| DriverError::Compile { api: Api::Cuda, what: name.to_string(), arch: arch.to_string(), log };
        let src = CString::new(source).map_err(|_| fail("source holds a NUL byte".into()))?;
        let cname = CString::new(name).map_err(|_| fail("bad name".into()))?;
        let opts: Vec<CString> = [format!("--gpu-architecture={arch}"), "-default-device".into(), "--std=c++17".into()]
            .into_iter()
            .map(|o| CString::new(o).unwrap_or_default())
            .collect();
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: every pointer passed is a live NUL-terminated string; the program is
        // destroyed on every path after creation.
        unsafe {
            let mut prog = std::ptr::null_mut();
            if (n.create)(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()) != 0 {
                return Err(fail("nvrtcCreateProgram failed".into()));
            }
            let rc = (n.compile)(prog, optp.len() as c_int, optp.as_ptr());
            let mut ls = 0usize;
            (n.log_size)(prog, &mut ls);
            let mut log = vec![0u8; ls.max(1)];
            (n.log)(prog, log.as_mut_ptr().cast());
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_string();
            if rc != 0 {
                (n.destroy)(&mut prog);
                return Err(fail(log));
            }
            let mut cs = 0usize;
            (n.cubin_size)(prog, &mut cs);
            let mut out = vec![0u8; cs];
            let rc2 = (n.cubin)(prog, out.as_mut_ptr().cast());
            (n.destroy)(&mut prog);
            if rc2 != 0 || cs == 0 {
                return Err(fail(format!("nvrtcGetCUBIN failed ({rc2})")));
            }
            Ok(out)
        }
    }
}
