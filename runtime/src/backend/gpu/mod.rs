//! The GPU backend: CUDA and HIP through one host code path.
//!
//! - [`driver`]: the vendor tables (the only `unsafe` FFI in lode), opened at run time.
//! - [`device`]: buffers, the stream, events, launches, memory info, graph hooks.
//! - [`kernels`]: embedded code objects or NVRTC/hipRTC compiles, cached on disk.
//! - [`family`]: one module per kernel source (`kernels-hip/<name>.hip`): typed launch
//!   arguments and launchers (shape checks, grids).
//! - [`plan`]: which kernel each op runs (device-free; `lode inspect --plan` prints it).
//! - [`selftest`]: every kernel against the CPU reference (`lode selftest`), one folder.
//!
//! What runs on an NVIDIA GPU is what runs on an AMD one: only `driver/{cuda,hip}.rs`
//! differ, and the kernels are one HIP C++ source built for both.

pub mod act_forms;
pub mod arena;
pub mod backend;
pub mod capacity;
pub mod device;
pub mod driver;
pub mod exact;
pub mod family;
pub mod host_times;
pub mod kernels;
pub mod launch;
pub mod materialize;
pub mod plan;
pub mod plan_trace;
pub mod register;
pub mod replay;
pub mod selftest;
pub mod tuning;
pub mod upload;

pub use backend::{ExactBackend, GpuBackend};
pub use exact::Numerics;

/// The GPU's refusal of a KV cache whose layers have heads of two shapes (gemma4's
/// full-attention layers beside its sliding ones: `KvSpec::alt`). Its store and
/// attention kernels read rows of one width and heads of at most 256 values (gemma4's
/// full layers have 512); the CPU runs such a model.
pub const ALT_HEADS_NOT_YET: &str = "gemma4's full-attention layers ({}) have other heads than its sliding layers: a KV cache of per-layer head shapes (alloc_kv, kv_write) and attention over heads of more than 256 values (attention, rope_kv_attention) are not on the GPU yet; run it with --device cpu";
use crate::backend::DeviceKind;
use tuning::Tuning;
pub use device::{DeviceBuffer, GpuDevice};
pub use driver::{Api, DriverError};

/// A GPU backend error.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error("GPU backend: {0}")]
    Unsupported(String),
}

/// Open the GPU the user asked for. `Ok(None)` means "use the CPU": asked for, or `auto`
/// found no GPU (a one-line note on stderr says so). An explicit `cuda`/`hip` that cannot
/// be opened is an error naming what is missing (e.g. `libcuda.so.1`).
pub fn select(kind: DeviceKind, tuning: &Tuning) -> Result<Option<GpuDevice>, GpuError> {
    match open_device(kind, tuning)? {
        Ok(d) => Ok(Some(d)),
        Err(note) => {
            if kind != DeviceKind::Cpu {
                eprintln!("note: {note}");
            }
            Ok(None)
        }
    }
}

/// Like [`select`] but returns the CPU fallback note instead of printing it:
/// `Ok(Ok(device))`, `Ok(Err(note))` (run on the CPU), or an error for an explicit GPU.
/// The device is `LODE_DEVICE_ORDINAL` of its kind (default 0).
pub fn open_device(kind: DeviceKind, tuning: &Tuning) -> Result<Result<GpuDevice, String>, GpuError> {
    let ordinal = device_ordinal();
    let open = |api| GpuDevice::open_tuned(api, ordinal, tuning.clone());
    match kind {
        DeviceKind::Cpu => Ok(Err("CPU requested".into())),
        DeviceKind::Cuda => Ok(Ok(open(Api::Cuda)?)),
        DeviceKind::Hip => Ok(Ok(open(Api::Hip)?)),
        DeviceKind::Auto => {
            let mut why = Vec::new();
            for api in [Api::Cuda, Api::Hip] {
                match open(api).map_err(GpuError::from) {
                    Ok(d) => return Ok(Ok(d)),
                    Err(e @ GpuError::Driver(DriverError::LibraryMissing { .. })) | Err(e @ GpuError::Driver(DriverError::NoDevice { .. })) => {
                        why.push(short_reason(&e, api))
                    }
                    Err(e) => return Err(e),
                }
            }
            Ok(Err(format!("no GPU found ({}); running on the CPU", why.join("; "))))
        }
    }
}

/// Which GPU of its kind a run opens: `LODE_DEVICE_ORDINAL` (default 0).
pub fn device_ordinal() -> i32 {
    std::env::var("LODE_DEVICE_ORDINAL").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn short_reason(e: &GpuError, api: Api) -> String {
    match e {
        GpuError::Driver(DriverError::LibraryMissing { tried, .. }) => format!("{api}: no {}", tried.first().cloned().unwrap_or_default()),
        GpuError::Driver(DriverError::NoDevice { .. }) => format!("{api}: no device"),
        e => e.to_string(),
    }
}
