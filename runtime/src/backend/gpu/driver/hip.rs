//! The HIP runtime (`libamdhip64.so.7/.6/.so`) and hipRTC, opened at run time.
//!
//! Attribute ids are ROCm 6's `hipDeviceAttribute_t` values. The architecture name
//! (`gfx1100`, `gfx1151`) has no attribute; it is read from the `gcnArchName` field of
//! `hipDeviceProp_t`, found by scanning the returned struct for a `gfx…` string so that
//! lode does not depend on one ROCm version's struct layout. `LODE_HIP_ARCH` overrides it.
//!
//! No AMD GPU exists where lode is developed: this table is exercised by `lode selftest
//! --device hip` on the user's card (and `ci/rocm-runner.yml`).

use super::{open_first, sym, Api, DevAttr, DevPtr, DeviceInfo, Driver, DriverError, HostCoherence, KArg, RawHandle, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::OnceLock;

type HipResult = c_int;
type P = *mut c_void;

/// `hipHostRegister` flags (hip_runtime_api.h).
const HIP_HOST_REGISTER_MAPPED: c_uint = 0x2;
const HIP_EXT_HOST_REGISTER_COARSE_GRAINED: c_uint = 0x8;

struct Table {
    init: unsafe extern "C" fn(c_uint) -> HipResult,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> HipResult,
    get_device_count: unsafe extern "C" fn(*mut c_int) -> HipResult,
    set_device: unsafe extern "C" fn(c_int) -> HipResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipResult,
    device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> HipResult,
    get_device_properties: unsafe extern "C" fn(P, c_int) -> HipResult,
    get_error_name: unsafe extern "C" fn(HipResult) -> *const c_char,
    mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> HipResult,
    malloc: unsafe extern "C" fn(*mut P, usize) -> HipResult,
    free: unsafe extern "C" fn(P) -> HipResult,
    memset_d8_async: unsafe extern "C" fn(P, u8, usize, P) -> HipResult,
    memcpy_htod_async: unsafe extern "C" fn(P, *const c_void, usize, P) -> HipResult,
    memcpy_dtoh_async: unsafe extern "C" fn(P, P, usize, P) -> HipResult,
    memcpy_dtod_async: unsafe extern "C" fn(P, P, usize, P) -> HipResult,
    host_register: unsafe extern "C" fn(P, usize, c_uint) -> HipResult,
    host_unregister: unsafe extern "C" fn(P) -> HipResult,
    host_get_device_pointer: unsafe extern "C" fn(*mut P, P, c_uint) -> HipResult,
    host_malloc: unsafe extern "C" fn(*mut P, usize, c_uint) -> HipResult,
    host_free: unsafe extern "C" fn(P) -> HipResult,
    stream_create_with_flags: unsafe extern "C" fn(*mut P, c_uint) -> HipResult,
    stream_destroy: unsafe extern "C" fn(P) -> HipResult,
    stream_synchronize: unsafe extern "C" fn(P) -> HipResult,
    event_create: unsafe extern "C" fn(*mut P) -> HipResult,
    event_destroy: unsafe extern "C" fn(P) -> HipResult,
    event_record: unsafe extern "C" fn(P, P) -> HipResult,
    event_synchronize: unsafe extern "C" fn(P) -> HipResult,
    stream_wait_event: unsafe extern "C" fn(P, P, u32) -> HipResult,
    event_elapsed_time: unsafe extern "C" fn(*mut f32, P, P) -> HipResult,
    module_load_data: unsafe extern "C" fn(*mut P, *const c_void) -> HipResult,
    module_unload: unsafe extern "C" fn(P) -> HipResult,
    module_get_function: unsafe extern "C" fn(*mut P, P, *const c_char) -> HipResult,
    module_launch_kernel: unsafe extern "C" fn(P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P, *mut P, *mut P) -> HipResult,
    stream_begin_capture: unsafe extern "C" fn(P, c_int) -> HipResult,
    stream_end_capture: unsafe extern "C" fn(P, *mut P) -> HipResult,
    graph_instantiate: unsafe extern "C" fn(*mut P, P, *mut P, *mut c_char, usize) -> HipResult,
    graph_exec_update: unsafe extern "C" fn(P, P, *mut P, *mut c_int) -> HipResult,
    graph_launch: unsafe extern "C" fn(P, P) -> HipResult,
    graph_destroy: unsafe extern "C" fn(P) -> HipResult,
    graph_exec_destroy: unsafe extern "C" fn(P) -> HipResult,
}

struct HipRtc {
    create: unsafe extern "C" fn(*mut P, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int,
    compile: unsafe extern "C" fn(P, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(P, *mut usize) -> c_int,
    log: unsafe extern "C" fn(P, *mut c_char) -> c_int,
    code_size: unsafe extern "C" fn(P, *mut usize) -> c_int,
    code: unsafe extern "C" fn(P, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut P) -> c_int,
    _lib: libloading::Library,
}

/// `hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, f, blockSize, dynSharedMemPerBlk)`.
type Occupancy = unsafe extern "C" fn(*mut c_int, P, c_int, usize) -> HipResult;

pub struct HipDriver {
    t: Table,
    /// Resolved when present.
    occupancy: Option<Occupancy>,
    dev: c_int,
    info: DeviceInfo,
    rtc: OnceLock<std::result::Result<HipRtc, String>>,
    _lib: libloading::Library,
}

// SAFETY: the HIP runtime is thread-safe; each call selects the device first.
unsafe impl Send for HipDriver {}
// SAFETY: as above; the table is immutable function pointers.
unsafe impl Sync for HipDriver {}

const LIBS: &[&str] = &["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"];
const HINT: &str = "no HIP runtime was found (libamdhip64.so); install ROCm's HIP runtime or use --device cpu";

fn p(x: u64) -> P {
    x as usize as P
}
fn hd(x: RawHandle) -> P {
    x as P
}

/// Find `gfx…` in a `hipDeviceProp_t` image: a NUL-preceded run starting with "gfx".
fn scan_arch(props: &[u8]) -> Option<String> {
    (0..props.len().saturating_sub(6)).find_map(|i| {
        let prev_nul = i == 0 || props[i - 1] == 0;
        if prev_nul && &props[i..i + 3] == b"gfx" && props[i + 3].is_ascii_alphanumeric() {
            let end = props[i..].iter().position(|&b| b == 0 || b == b':')? + i;
            Some(String::from_utf8_lossy(&props[i..end]).into_owned())
        } else {
            None
        }
    })
}

impl HipDriver {
    pub fn open(ordinal: i32) -> Result<HipDriver> {
        let (lib, name) = open_first(Api::Hip, LIBS, HINT)?;
        let a = Api::Hip;
        macro_rules! get {
            ($n:expr) => {
                sym(a, &lib, &name, $n)?
            };
        }
        let props = sym(a, &lib, &name, "hipGetDevicePropertiesR0600").or_else(|_| sym(a, &lib, &name, "hipGetDeviceProperties"))?;
        let t = Table {
            init: get!("hipInit"),
            driver_get_version: get!("hipDriverGetVersion"),
            get_device_count: get!("hipGetDeviceCount"),
            set_device: get!("hipSetDevice"),
            device_get_name: get!("hipDeviceGetName"),
            device_get_attribute: get!("hipDeviceGetAttribute"),
            device_total_mem: get!("hipDeviceTotalMem"),
            get_device_properties: props,
            get_error_name: get!("hipGetErrorName"),
            mem_get_info: get!("hipMemGetInfo"),
            malloc: get!("hipMalloc"),
            free: get!("hipFree"),
            memset_d8_async: get!("hipMemsetD8Async"),
            memcpy_htod_async: get!("hipMemcpyHtoDAsync"),
            memcpy_dtoh_async: get!("hipMemcpyDtoHAsync"),
            memcpy_dtod_async: get!("hipMemcpyDtoDAsync"),
            host_register: get!("hipHostRegister"),
            host_unregister: get!("hipHostUnregister"),
            host_get_device_pointer: get!("hipHostGetDevicePointer"),
            host_malloc: get!("hipHostMalloc"),
            host_free: get!("hipHostFree"),
            stream_create_with_flags: get!("hipStreamCreateWithFlags"),
            stream_destroy: get!("hipStreamDestroy"),
            stream_synchronize: get!("hipStreamSynchronize"),
            event_create: get!("hipEventCreate"),
            event_destroy: get!("hipEventDestroy"),
            event_record: get!("hipEventRecord"),
            event_synchronize: get!("hipEventSynchronize"),
            stream_wait_event: get!("hipStreamWaitEvent"),
            event_elapsed_time: get!("hipEventElapsedTime"),
            module_load_data: get!("hipModuleLoadData"),
            module_unload: get!("hipModuleUnload"),
            module_get_function: get!("hipModuleGetFunction"),
            module_launch_kernel: get!("hipModuleLaunchKernel"),
            stream_begin_capture: get!("hipStreamBeginCapture"),
            stream_end_capture: get!("hipStreamEndCapture"),
            graph_instantiate: get!("hipGraphInstantiate"),
            graph_exec_update: get!("hipGraphExecUpdate"),
            graph_launch: get!("hipGraphLaunch"),
            graph_destroy: get!("hipGraphDestroy"),
            graph_exec_destroy: get!("hipGraphExecDestroy"),
        };
        let occupancy = sym(a, &lib, &name, "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor").ok();
        let mut d = HipDriver {
            occupancy,
            t,
            dev: ordinal,
            info: DeviceInfo { name: String::new(), arch: String::new(), driver_version: 0, total_mem: 0 },
            rtc: OnceLock::new(),
            _lib: lib,
        };
        // SAFETY: hipInit(0) first; all out-pointers are locals or owned buffers large
        // enough for any ROCm version's hipDeviceProp_t (< 2 KiB; we pass 8 KiB).
        unsafe {
            d.check("hipInit", (d.t.init)(0))?;
            let mut n = 0;
            d.check("hipGetDeviceCount", (d.t.get_device_count)(&mut n))?;
            if n <= ordinal {
                return Err(DriverError::NoDevice { api: Api::Hip });
            }
            d.check("hipSetDevice", (d.t.set_device)(ordinal))?;
            let mut nm = [0 as c_char; 256];
            d.check("hipDeviceGetName", (d.t.device_get_name)(nm.as_mut_ptr(), 256, ordinal))?;
            d.info.name = CStr::from_ptr(nm.as_ptr()).to_string_lossy().into_owned();
            let mut buf = vec![0u8; 8192];
            d.check("hipGetDeviceProperties", (d.t.get_device_properties)(buf.as_mut_ptr().cast(), ordinal))?;
            d.info.arch = std::env::var("LODE_HIP_ARCH").ok().or_else(|| scan_arch(&buf[256..])).ok_or_else(|| DriverError::Other {
                api: Api::Hip,
                what: "could not read the GPU architecture (gcnArchName); set LODE_HIP_ARCH=gfx1100 or similar".into(),
            })?;
            let mut ver = 0;
            d.check("hipDriverGetVersion", (d.t.driver_get_version)(&mut ver))?;
            d.info.driver_version = ver;
            let mut total = 0usize;
            d.check("hipDeviceTotalMem", (d.t.device_total_mem)(&mut total, ordinal))?;
            d.info.total_mem = total as u64;
        }
        Ok(d)
    }

    fn check(&self, call: &'static str, code: HipResult) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: hipGetErrorName returns a static string for any code.
        let name = unsafe {
            let s = (self.t.get_error_name)(code);
            if s.is_null() { format!("hipError {code}") } else { CStr::from_ptr(s).to_string_lossy().into_owned() }
        };
        Err(DriverError::Call { api: Api::Hip, call, code, name })
    }

    fn cur(&self) -> Result<()> {
        // SAFETY: the ordinal was validated in open().
        self.check("hipSetDevice", unsafe { (self.t.set_device)(self.dev) })
    }

    fn rtc(&self) -> Result<&HipRtc> {
        let r = self.rtc.get_or_init(|| {
            let names = ["libhiprtc.so.7", "libhiprtc.so.6", "libhiprtc.so"];
            let (lib, n) = open_first(Api::Hip, &names, "hipRTC (libhiprtc.so) is needed to compile kernels for this GPU")
                .map_err(|e| e.to_string())?;
            macro_rules! g {
                ($s:expr) => {
                    sym(Api::Hip, &lib, &n, $s).map_err(|e| e.to_string())
                };
            }
            Ok(HipRtc {
                create: g!("hiprtcCreateProgram")?,
                compile: g!("hiprtcCompileProgram")?,
                log_size: g!("hiprtcGetProgramLogSize")?,
                log: g!("hiprtcGetProgramLog")?,
                code_size: g!("hiprtcGetCodeSize")?,
                code: g!("hiprtcGetCode")?,
                destroy: g!("hiprtcDestroyProgram")?,
                _lib: lib,
            })
        });
        r.as_ref().map_err(|e| DriverError::Other { api: Api::Hip, what: e.clone() })
    }
}

impl Driver for HipDriver {
    fn max_active_blocks(&self, func: RawHandle, block: u32) -> Result<Option<u32>> {
        let Some(occ) = self.occupancy else { return Ok(None) };
        self.cur()?;
        let mut n: c_int = 0;
        // SAFETY: `func` is a function handle of a module loaded by this driver; `n` outlives the call.
        self.check("hipModuleOccupancyMaxActiveBlocksPerMultiprocessor", unsafe { occ(&mut n, hd(func), block as c_int, 0) })?;
        Ok(Some(n.max(0) as u32))
    }

    fn api(&self) -> Api {
        Api::Hip
    }
    fn info(&self) -> &DeviceInfo {
        &self.info
    }
    fn attribute(&self, attr: DevAttr) -> Result<i32> {
        let id = match attr {
            DevAttr::CanMapHostMemory => 3,
            DevAttr::Integrated => 16,
            DevAttr::L2CacheBytes => 19,
            DevAttr::MultiprocessorCount => 63,
            DevAttr::PageableMemoryAccess => 65,
            DevAttr::SharedMemPerBlockOptin => 75,
            DevAttr::UnifiedAddressing => 85,
        };
        let mut v = 0;
        // SAFETY: out-pointer is a local.
        self.check("hipDeviceGetAttribute", unsafe { (self.t.device_get_attribute)(&mut v, id, self.dev) })?;
        Ok(v)
    }
    fn mem_info(&self) -> Result<(u64, u64)> {
        self.cur()?;
        let (mut f, mut t) = (0usize, 0usize);
        // SAFETY: out-pointers are locals.
        self.check("hipMemGetInfo", unsafe { (self.t.mem_get_info)(&mut f, &mut t) })?;
        Ok((f as u64, t as u64))
    }
    fn malloc(&self, bytes: usize) -> Result<DevPtr> {
        self.cur()?;
        let mut q: P = std::ptr::null_mut();
        // SAFETY: out-pointer is a local.
        self.check("hipMalloc", unsafe { (self.t.malloc)(&mut q, bytes.max(1)) })?;
        Ok(q as usize as u64)
    }
    fn free(&self, ptr: DevPtr) -> Result<()> {
        self.cur()?;
        // SAFETY: ptr from malloc(), freed once by its owner.
        self.check("hipFree", unsafe { (self.t.free)(p(ptr)) })
    }
    fn memset_d8(&self, dst: DevPtr, value: u8, bytes: usize, stream: RawHandle) -> Result<()> {
        // SAFETY: range inside a buffer of this device.
        self.check("hipMemsetD8Async", unsafe { (self.t.memset_d8_async)(p(dst), value, bytes, hd(stream)) })
    }
    fn htod_pinned(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()> {
        // SAFETY: `src` is page-locked host memory the caller keeps unchanged until the
        // stream has passed the copy (the trait's contract).
        unsafe { self.check("hipMemcpyHtoDAsync", (self.t.memcpy_htod_async)(p(dst), src.as_ptr().cast(), src.len(), hd(stream))) }
    }
    fn htod(&self, dst: DevPtr, src: &[u8], stream: RawHandle) -> Result<()> {
        // SAFETY: `src` live for the call; HIP stages pageable sources before returning.
        // We synchronize anyway so `src` is free to reuse on every ROCm version.
        unsafe {
            self.check("hipMemcpyHtoDAsync", (self.t.memcpy_htod_async)(p(dst), src.as_ptr().cast(), src.len(), hd(stream)))?;
            self.check("hipStreamSynchronize", (self.t.stream_synchronize)(hd(stream)))
        }
    }
    fn dtoh(&self, dst: &mut [u8], src: DevPtr, stream: RawHandle) -> Result<()> {
        // SAFETY: `dst` exclusive and live; synchronized before return.
        unsafe {
            self.check("hipMemcpyDtoHAsync", (self.t.memcpy_dtoh_async)(dst.as_mut_ptr().cast(), p(src), dst.len(), hd(stream)))?;
            self.check("hipStreamSynchronize", (self.t.stream_synchronize)(hd(stream)))
        }
    }
    fn dtod(&self, dst: DevPtr, src: DevPtr, bytes: usize, stream: RawHandle) -> Result<()> {
        // SAFETY: both ranges inside buffers of this device.
        self.check("hipMemcpyDtoDAsync", unsafe { (self.t.memcpy_dtod_async)(p(dst), p(src), bytes, hd(stream)) })
    }
    fn host_register(&self, host: &[u8], coherence: HostCoherence) -> Result<DevPtr> {
        self.cur()?;
        let mut d: P = std::ptr::null_mut();
        // hipHostRegisterMapped (0x2), and for coarse-grained memory
        // hipExtHostRegisterCoarseGrained (0x8; hipHostRegisterReadOnly has the same value
        // and AMD documents it as ignored, so on ROCm 0x8 means coarse-grained). Without
        // it, registered host memory is fine-grained (HIP's coherence-control table).
        let flags = HIP_HOST_REGISTER_MAPPED | if coherence == HostCoherence::Coarse { HIP_EXT_HOST_REGISTER_COARSE_GRAINED } else { 0 };
        // SAFETY: `host` live; the caller unregisters before it is unmapped.
        unsafe {
            self.check("hipHostRegister", (self.t.host_register)(host.as_ptr() as P, host.len(), flags))?;
            self.check("hipHostGetDevicePointer", (self.t.host_get_device_pointer)(&mut d, host.as_ptr() as P, 0))?;
        }
        Ok(d as usize as u64)
    }
    fn host_unregister(&self, host: &[u8]) -> Result<()> {
        // The registration may end on another thread than the one that made it.
        self.cur()?;
        // SAFETY: registered by host_register.
        self.check("hipHostUnregister", unsafe { (self.t.host_unregister)(host.as_ptr() as P) })
    }
    fn host_alloc(&self, bytes: usize) -> Result<(usize, DevPtr)> {
        self.cur()?;
        let mut h: P = std::ptr::null_mut();
        let mut d: P = std::ptr::null_mut();
        // SAFETY: out-pointers are locals; 0x2 = hipHostMallocMapped. Freed by host_free.
        unsafe {
            self.check("hipHostMalloc", (self.t.host_malloc)(&mut h, bytes.max(1), 0x2))?;
            if let Err(e) = self.check("hipHostGetDevicePointer", (self.t.host_get_device_pointer)(&mut d, h, 0)) {
                (self.t.host_free)(h);
                return Err(e);
            }
        }
        Ok((h as usize, d as usize as u64))
    }
    fn host_free(&self, host: usize) -> Result<()> {
        // SAFETY: `host` came from host_alloc and is freed once.
        self.check("hipHostFree", unsafe { (self.t.host_free)(host as P) })
    }
    fn stream_create(&self) -> Result<RawHandle> {
        self.cur()?;
        let mut s: P = std::ptr::null_mut();
        // SAFETY: out-pointer local; 1 = hipStreamNonBlocking.
        self.check("hipStreamCreateWithFlags", unsafe { (self.t.stream_create_with_flags)(&mut s, 1) })?;
        Ok(s as RawHandle)
    }
    fn stream_destroy(&self, stream: RawHandle) -> Result<()> {
        // SAFETY: created by stream_create, destroyed once.
        self.check("hipStreamDestroy", unsafe { (self.t.stream_destroy)(hd(stream)) })
    }
    fn stream_sync(&self, stream: RawHandle) -> Result<()> {
        // SAFETY: valid stream.
        self.check("hipStreamSynchronize", unsafe { (self.t.stream_synchronize)(hd(stream)) })
    }
    fn event_create(&self) -> Result<RawHandle> {
        self.cur()?;
        let mut e: P = std::ptr::null_mut();
        // SAFETY: out-pointer local.
        self.check("hipEventCreate", unsafe { (self.t.event_create)(&mut e) })?;
        Ok(e as RawHandle)
    }
    fn event_destroy(&self, event: RawHandle) -> Result<()> {
        // SAFETY: created by event_create, destroyed once.
        self.check("hipEventDestroy", unsafe { (self.t.event_destroy)(hd(event)) })
    }
    fn event_record(&self, event: RawHandle, stream: RawHandle) -> Result<()> {
        // SAFETY: valid handles.
        self.check("hipEventRecord", unsafe { (self.t.event_record)(hd(event), hd(stream)) })
    }
    fn event_sync(&self, event: RawHandle) -> Result<()> {
        // SAFETY: valid event.
        self.check("hipEventSynchronize", unsafe { (self.t.event_synchronize)(hd(event)) })
    }
    fn stream_wait_event(&self, stream: RawHandle, event: RawHandle) -> Result<()> {
        // SAFETY: valid handles from this driver; flags 0.
        self.check("hipStreamWaitEvent", unsafe { (self.t.stream_wait_event)(hd(stream), hd(event), 0) })
    }
    fn event_elapsed_ms(&self, start: RawHandle, end: RawHandle) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: recorded events; out-pointer local.
        self.check("hipEventElapsedTime", unsafe { (self.t.event_elapsed_time)(&mut ms, hd(start), hd(end)) })?;
        Ok(ms)
    }
    fn module_load(&self, image: &[u8]) -> Result<RawHandle> {
        self.cur()?;
        let mut m: P = std::ptr::null_mut();
        // SAFETY: `image` is a complete code object alive for the call.
        self.check("hipModuleLoadData", unsafe { (self.t.module_load_data)(&mut m, image.as_ptr().cast()) })?;
        Ok(m as RawHandle)
    }
    fn module_unload(&self, module: RawHandle) -> Result<()> {
        // SAFETY: loaded by module_load, unloaded once.
        self.check("hipModuleUnload", unsafe { (self.t.module_unload)(hd(module)) })
    }
    fn module_function(&self, module: RawHandle, name: &str) -> Result<RawHandle> {
        let c = CString::new(name).map_err(|_| DriverError::Other { api: Api::Hip, what: format!("bad kernel name {name:?}") })?;
        let mut f: P = std::ptr::null_mut();
        // SAFETY: valid module; `c` NUL-terminated.
        self.check("hipModuleGetFunction", unsafe { (self.t.module_get_function)(&mut f, hd(module), c.as_ptr()) })
            .map_err(|e| match e {
                DriverError::Call { api, code, name: n, .. } => DriverError::Call { api, call: "hipModuleGetFunction", code, name: format!("{n}: kernel `{name}`") },
                e => e,
            })?;
        Ok(f as RawHandle)
    }
    fn launch(&self, func: RawHandle, grid: [u32; 3], block: [u32; 3], shared_bytes: u32, stream: RawHandle, args: &[KArg]) -> Result<()> {
        let mut store = Vec::with_capacity(args.len());
        let mut ptrs = super::marshal_args(args, &mut store);
        // SAFETY: `ptrs` point into `store`, alive across the call; HIP copies the values.
        self.check("hipModuleLaunchKernel", unsafe {
            (self.t.module_launch_kernel)(
                hd(func), grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes, hd(stream),
                ptrs.as_mut_ptr(), std::ptr::null_mut(),
            )
        })
    }
    fn capture_begin(&self, stream: RawHandle) -> Result<()> {
        // SAFETY: valid stream; 2 = hipStreamCaptureModeRelaxed.
        self.check("hipStreamBeginCapture", unsafe { (self.t.stream_begin_capture)(hd(stream), 2) })
    }
    fn capture_end(&self, stream: RawHandle) -> Result<RawHandle> {
        let mut g: P = std::ptr::null_mut();
        // SAFETY: capturing stream; out-pointer local.
        self.check("hipStreamEndCapture", unsafe { (self.t.stream_end_capture)(hd(stream), &mut g) })?;
        Ok(g as RawHandle)
    }
    fn graph_instantiate(&self, graph: RawHandle) -> Result<RawHandle> {
        let mut e: P = std::ptr::null_mut();
        // SAFETY: valid graph; no error-node/log buffers requested.
        self.check("hipGraphInstantiate", unsafe {
            (self.t.graph_instantiate)(&mut e, hd(graph), std::ptr::null_mut(), std::ptr::null_mut(), 0)
        })?;
        Ok(e as RawHandle)
    }
    fn graph_exec_update(&self, exec: RawHandle, graph: RawHandle) -> Result<bool> {
        let mut node: P = std::ptr::null_mut();
        let mut res: c_int = 0;
        // SAFETY: valid handles; out-pointers local.
        let r = unsafe { (self.t.graph_exec_update)(hd(exec), hd(graph), &mut node, &mut res) };
        match r {
            0 => Ok(true),
            910 => Ok(false), // hipErrorGraphExecUpdateFailure
            c => self.check("hipGraphExecUpdate", c).map(|_| false),
        }
    }
    fn graph_launch(&self, exec: RawHandle, stream: RawHandle) -> Result<()> {
        // SAFETY: valid instance and stream.
        self.check("hipGraphLaunch", unsafe { (self.t.graph_launch)(hd(exec), hd(stream)) })
    }
    fn graph_destroy(&self, graph: RawHandle) -> Result<()> {
        // SAFETY: destroyed once.
        self.check("hipGraphDestroy", unsafe { (self.t.graph_destroy)(hd(graph)) })
    }
    fn graph_exec_destroy(&self, exec: RawHandle) -> Result<()> {
        // SAFETY: destroyed once.
        self.check("hipGraphExecDestroy", unsafe { (self.t.graph_exec_destroy)(hd(exec)) })
    }
    fn rtc_compile(&self, source: &str, name: &str, arch: &str) -> Result<Vec<u8>> {
        let r = self.rtc()?;
        let fail = |log: String| DriverError::Compile { api: Api::Hip, what: name.to_string(), arch: arch.to_string(), log };
        let src = CString::new(source).map_err(|_| fail("source holds a NUL byte".into()))?;
        let cname = CString::new(name).map_err(|_| fail("bad name".into()))?;
        let opts: Vec<CString> = [format!("--offload-arch={arch}"), "-O3".into(), "-std=c++17".into()]
            .into_iter()
            .map(|o| CString::new(o).unwrap_or_default())
            .collect();
        let optp: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        // SAFETY: all pointers are live NUL-terminated strings; the program is destroyed
        // on every path after creation.
        unsafe {
            let mut prog: P = std::ptr::null_mut();
            if (r.create)(&mut prog, src.as_ptr(), cname.as_ptr(), 0, std::ptr::null(), std::ptr::null()) != 0 {
                return Err(fail("hiprtcCreateProgram failed".into()));
            }
            let rc = (r.compile)(prog, optp.len() as c_int, optp.as_ptr());
            let mut ls = 0usize;
            (r.log_size)(prog, &mut ls);
            let mut log = vec![0u8; ls.max(1)];
            (r.log)(prog, log.as_mut_ptr().cast());
            let log = String::from_utf8_lossy(&log).trim_end_matches('\0').to_string();
            if rc != 0 {
                (r.destroy)(&mut prog);
                return Err(fail(log));
            }
            let mut cs = 0usize;
            (r.code_size)(prog, &mut cs);
            let mut out = vec![0u8; cs];
            let rc2 = (r.code)(prog, out.as_mut_ptr().cast());
            (r.destroy)(&mut prog);
            if rc2 != 0 || cs == 0 {
                return Err(fail(format!("hiprtcGetCode failed ({rc2})")));
            }
            Ok(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::scan_arch;

    #[test]
    fn finds_gcn_arch_name_in_props_image() {
        let mut b = vec![0u8; 600];
        b[..10].copy_from_slice(b"AMD Radeon");
        b[400..423].copy_from_slice(b"gfx1100:sramecc-:xnack-");
        assert_eq!(scan_arch(&b).as_deref(), Some("gfx1100"));
        assert_eq!(scan_arch(&[0u8; 64]), None);
    }
}
