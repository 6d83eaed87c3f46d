//! The C ABI of libcuda and NVRTC as lode calls them: the function-pointer tables
//! resolved at open, and the structs and constants passed by pointer. Layouts follow
//! `cuda.h` of CUDA 12/13 (`_v2` entry points where the header's macros select them).

use std::ffi::{c_char, c_int, c_uint, c_void};

pub(super) type CuResult = c_int;
pub(super) type Ctx = *mut c_void;

/// Function pointers into libcuda, resolved once.
#[allow(clippy::type_complexity)]
pub(super) struct Table {
    pub(super) init: unsafe extern "C" fn(c_uint) -> CuResult,
    pub(super) driver_get_version: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(super) device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    pub(super) device_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult,
    pub(super) device_get_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult,
    pub(super) device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> CuResult,
    pub(super) device_total_mem: unsafe extern "C" fn(*mut usize, c_int) -> CuResult,
    pub(super) primary_ctx_retain: unsafe extern "C" fn(*mut Ctx, c_int) -> CuResult,
    pub(super) ctx_set_current: unsafe extern "C" fn(Ctx) -> CuResult,
    pub(super) ctx_set_limit: unsafe extern "C" fn(c_int, usize) -> CuResult,
    pub(super) ctx_get_limit: unsafe extern "C" fn(*mut usize, c_int) -> CuResult,
    pub(super) get_error_name: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    pub(super) mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> CuResult,
    pub(super) mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    pub(super) mem_free: unsafe extern "C" fn(u64) -> CuResult,
    pub(super) memset_d8_async: unsafe extern "C" fn(u64, u8, usize, *mut c_void) -> CuResult,
    pub(super) memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, *mut c_void) -> CuResult,
    pub(super) memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, *mut c_void) -> CuResult,
    pub(super) memcpy_dtod_async: unsafe extern "C" fn(u64, u64, usize, *mut c_void) -> CuResult,
    pub(super) mem_host_register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> CuResult,
    pub(super) mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, c_uint) -> CuResult,
    pub(super) mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    pub(super) mem_free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    pub(super) stream_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) stream_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> CuResult,
    pub(super) event_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) event_record: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult,
    pub(super) event_synchronize: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) stream_wait_event: unsafe extern "C" fn(*mut c_void, *mut c_void, c_uint) -> CuResult,
    pub(super) event_elapsed_time: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> CuResult,
    pub(super) module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CuResult,
    pub(super) module_unload: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> CuResult,
    pub(super) launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> CuResult,
    pub(super) stream_begin_capture: unsafe extern "C" fn(*mut c_void, c_int) -> CuResult,
    pub(super) stream_end_capture: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> CuResult,
    pub(super) graph_instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u64) -> CuResult,
    pub(super) graph_exec_update: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut [u64; 3]) -> CuResult,
    pub(super) graph_launch: unsafe extern "C" fn(*mut c_void, *mut c_void) -> CuResult,
    pub(super) graph_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
    pub(super) graph_exec_destroy: unsafe extern "C" fn(*mut c_void) -> CuResult,
}

/// The virtual memory management calls (CUDA 10.2+), resolved when all are present.
pub(super) struct Vmm {
    pub(super) granularity: unsafe extern "C" fn(*mut usize, *const AllocProp, c_int) -> CuResult,
    pub(super) reserve: unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> CuResult,
    pub(super) free: unsafe extern "C" fn(u64, usize) -> CuResult,
    pub(super) create: unsafe extern "C" fn(*mut u64, usize, *const AllocProp, u64) -> CuResult,
    pub(super) release: unsafe extern "C" fn(u64) -> CuResult,
    pub(super) map: unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CuResult,
    pub(super) unmap: unsafe extern "C" fn(u64, usize) -> CuResult,
    pub(super) set_access: unsafe extern "C" fn(u64, usize, *const AccessDesc, usize) -> CuResult,
}

/// `CUmemLocation`: type 1 = a device, `id` its ordinal.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Location {
    pub(super) ty: c_int,
    pub(super) id: c_int,
}

/// `CUmemAllocationProp` (32 bytes): pinned (1) device memory, no exportable handle.
#[repr(C)]
pub(super) struct AllocProp {
    pub(super) ty: c_int,
    pub(super) handle_types: c_int,
    pub(super) location: Location,
    pub(super) win32_meta: *mut c_void,
    pub(super) alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`: flags 3 = read and write.
#[repr(C)]
pub(super) struct AccessDesc {
    pub(super) location: Location,
    pub(super) flags: c_int,
}

/// NVRTC, opened on first run-time compile.
pub(super) struct Nvrtc {
    pub(super) create: unsafe extern "C" fn(*mut *mut c_void, *const c_char, *const c_char, c_int, *const *const c_char, *const *const c_char) -> c_int,
    pub(super) compile: unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int,
    pub(super) log_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    pub(super) log: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    pub(super) cubin_size: unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int,
    pub(super) cubin: unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int,
    pub(super) destroy: unsafe extern "C" fn(*mut *mut c_void) -> c_int,
    pub(super) _lib: libloading::Library,
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor(numBlocks, func, blockSize, dynamicSMemSize)`.
pub(super) type Occupancy = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, usize) -> CuResult;
pub(super) type LaunchKernelEx = unsafe extern "C" fn(*const LaunchConfig, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> CuResult;

/// `CUlaunchAttribute`: a 4-byte id, padding to 8, then a 64-byte value union.
#[repr(C)]
pub(super) struct LaunchAttribute {
    pub(super) id: c_uint,
    pub(super) pad: [u8; 4],
    pub(super) value: [u64; 8],
}

/// `CUlaunchConfig`.
#[repr(C)]
pub(super) struct LaunchConfig {
    pub(super) grid: [c_uint; 3],
    pub(super) block: [c_uint; 3],
    pub(super) shared_bytes: c_uint,
    pub(super) stream: *mut c_void,
    pub(super) attrs: *const LaunchAttribute,
    pub(super) num_attrs: c_uint,
}

/// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`.
pub(super) const ATTR_PROGRAMMATIC_STREAM_SERIALIZATION: c_uint = 6;
