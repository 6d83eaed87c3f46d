//! What a backend tells the engine about its device's memory before anything is
//! allocated ([`super::Backend::memory_target`]): enough to count a model's bytes as the
//! backend will allocate them (`engine::fit`), and the memory there is to hold them.

use super::gpu::tuning::Tuning;
use crate::weights::layout::DeviceClass;
use crate::weights::Residency;

/// A device's memory as a run will use it.
#[derive(Clone, Debug)]
pub struct MemoryTarget {
    /// Short device name for messages (`cuda:0 (NVIDIA H200)`, `cpu`).
    pub name: String,
    pub class: DeviceClass,
    pub residency: Residency,
    /// Bytes free now (a `--device-memory` cap's free share where one is set).
    pub free: u64,
    /// The device's total (the cap where one is set).
    pub total: u64,
    /// GPU: device memory in use already (context, kernels, other processes), so the
    /// driver's figure during a run is `used_at_open` + what the run allocates.
    pub used_at_open: u64,
    /// GPU: weights share one arena (rounded once to 2 MiB) instead of a driver
    /// allocation each.
    pub arena: bool,
    /// GPU: the tuning table (BLAS and GEMM choices size the prefill scratch).
    pub tuning: Option<Tuning>,
    /// `--device-memory`, if set.
    pub cap: Option<u64>,
    /// `--n-cpu-moe`: the expert tensors of layers below this stay in host memory.
    pub host_expert_layers: usize,
}
