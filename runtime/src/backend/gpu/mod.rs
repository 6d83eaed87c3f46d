//! The GPU backend: CUDA and HIP through one host code path.
//!
//! - [`driver`]: the vendor tables (the only `unsafe` FFI in lode), opened at run time.
//! - [`device`]: buffers, the stream, events, launches, memory info, graph hooks.
//! - [`kernels`]: embedded code objects or NVRTC/hipRTC compiles, cached on disk.
//! - [`ops`]: one typed launcher per kernel (shape checks, grids).
//! - [`prefill`]: matrix-core GEMM and flash attention for two or more tokens.
//! - [`prefill_blas`]: long prefill chunks through a transient f16 slab and the vendor BLAS.
//! - [`selftest`], [`selftest_prefill`]: every kernel against the CPU reference (`lode selftest`).
//!
//! What runs on an NVIDIA GPU is what runs on an AMD one: only `driver/{cuda,hip}.rs`
//! differ, and the kernels are one HIP C++ source built for both.

pub mod arena;
pub mod attn_decode;
pub mod backend;
pub mod decode_mv;
pub mod device;
pub mod driver;
pub mod exact;
pub mod head_mv;
pub mod host_times;
pub mod kernels;
pub mod materialize;
pub mod ops;
pub mod prefill;
pub mod prefill_blas;
pub mod replay;
pub mod selftest;
pub mod selftest_blas;
pub mod selftest_flash;
pub mod selftest_prefill;
pub mod selftest_replay;

pub use backend::GpuBackend;
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

/// Which device the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda,
    Hip,
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(DeviceChoice::Auto),
            "cpu" => Ok(DeviceChoice::Cpu),
            "cuda" | "nvidia" => Ok(DeviceChoice::Cuda),
            "hip" | "rocm" | "amd" => Ok(DeviceChoice::Hip),
            _ => Err(format!("unknown device {s:?} (expected auto, cpu, cuda or hip)")),
        }
    }
}

/// Open the GPU the user asked for. `Ok(None)` means "use the CPU": asked for, or `auto`
/// found no GPU (a one-line note on stderr says so). An explicit `cuda`/`hip` that cannot
/// be opened is an error naming what is missing (e.g. `libcuda.so.1`).
pub fn select(choice: DeviceChoice) -> Result<Option<GpuDevice>, GpuError> {
    match open_device(choice)? {
        Ok(d) => Ok(Some(d)),
        Err(note) => {
            if choice != DeviceChoice::Cpu {
                eprintln!("note: {note}");
            }
            Ok(None)
        }
    }
}

/// Like [`select`] but returns the CPU fallback note instead of printing it:
/// `Ok(Ok(device))`, `Ok(Err(note))` (run on the CPU), or an error for an explicit GPU.
pub fn open_device(choice: DeviceChoice) -> Result<Result<GpuDevice, String>, GpuError> {
    let ordinal = std::env::var("LODE_DEVICE_ORDINAL").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    match choice {
        DeviceChoice::Cpu => Ok(Err("CPU requested".into())),
        DeviceChoice::Cuda => Ok(Ok(GpuDevice::open(Api::Cuda, ordinal)?)),
        DeviceChoice::Hip => Ok(Ok(GpuDevice::open(Api::Hip, ordinal)?)),
        DeviceChoice::Auto => {
            let mut why = Vec::new();
            for api in [Api::Cuda, Api::Hip] {
                match GpuDevice::open(api, ordinal).map_err(GpuError::from) {
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

fn short_reason(e: &GpuError, api: Api) -> String {
    match e {
        GpuError::Driver(DriverError::LibraryMissing { tried, .. }) => format!("{api}: no {}", tried.first().cloned().unwrap_or_default()),
        GpuError::Driver(DriverError::NoDevice { .. }) => format!("{api}: no device"),
        e => e.to_string(),
    }
}
