//! Making a `GpuBackend`: its weight options and residency, every per-op state's start
//! value from the tuning table, and the few switches tests and tools flip afterwards.

use super::{act, blas, norm_mv, readback, rope_attn, BackendError, GpuBackend, Result, Scratch};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::tuning::Tuning;
use crate::backend::gpu::materialize::GpuMaterializer;
use crate::backend::gpu::replay::{Replay, ReplayStats};
use crate::weights::{Residency, WeightCache, WeightOptions};
use std::cell::RefCell;
use std::collections::HashMap;

impl GpuBackend {
    /// A backend with the environment's weight options (`LODE_DEVICE_MEMORY`; an
    /// unreadable value is reported and ignored) and the device's default residency.
    pub fn new(dev: GpuDevice) -> GpuBackend {
        let opts = WeightOptions::from_env().unwrap_or_else(|e| {
            eprintln!("lode: {e}; ignored");
            WeightOptions::default()
        });
        let residency = Residency::resolve(None, dev.is_integrated()).unwrap_or_else(|e| {
            eprintln!("lode: {e}; ignored");
            Residency::default_for(dev.is_integrated())
        });
        GpuBackend::with_residency(dev, residency, &opts)
    }

    /// A backend holding weights as `opts` says (`--residency`, `--weight-budget`).
    pub fn with_options(dev: GpuDevice, opts: &WeightOptions) -> Result<GpuBackend> {
        let residency = Residency::resolve(opts.residency, dev.is_integrated()).map_err(BackendError::Unavailable)?;
        Ok(GpuBackend::with_residency(dev, residency, opts))
    }

    fn with_residency(dev: GpuDevice, residency: Residency, opts: &WeightOptions) -> GpuBackend {
        if opts.device_memory.is_some() {
            dev.set_memory_cap(opts.device_memory);
        }
        dev.watch_memory(opts.report_at_exit);
        let tuning = dev.tuning().clone();
        let cache = WeightCache::new(GpuMaterializer::new(dev.clone()), residency, opts);
        let be = GpuBackend {
            dev,
            bufs: HashMap::new(),
            tick: 0,
            act: act::ActForms::default(),
            kvs: HashMap::new(),
            next: 1,
            cache,
            mapped: None,
            inv_freq: HashMap::new(),
            stage: Scratch::default(),
            stage_used: 0,
            retired: Vec::new(),
            step_pos: None,
            prev_pos: None,
            predicted_pos: None,
            replay: RefCell::new(Replay::new(&tuning)),
            occ: Default::default(),
            mv: norm_mv::MvFuse::default(),
            fuse_attn: rope_attn::FuseAttn::default(),
            kvq: Default::default(),
            readback: readback::Readback::new(&tuning),
            blas: blas::BlasPrefill::default(),
            tuning,
            exact: Default::default(),
            cpu_experts: None,
        };
        be
    }

    /// `--n-cpu-moe`: the expert tensors of the first `layers` layers stay in host memory
    /// (never copied to the device) and `threads` CPU threads compute those experts.
    pub fn set_host_experts(&mut self, layers: usize, threads: usize) -> Result<()> {
        self.cpu_experts = match layers {
            0 => None,
            n => Some((n, crate::backend::cpu::CpuBackend::build_pool(threads)?)),
        };
        Ok(())
    }

    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// `Backend::memory_target`: the device's free memory now (a `--device-memory` cap's
    /// share where set) and what sizes the run's allocations.
    pub(super) fn target(&self) -> Option<crate::backend::memory::MemoryTarget> {
        let (free, total) = self.dev.mem_info().ok()?;
        let info = self.dev.info();
        Some(crate::backend::memory::MemoryTarget {
            name: format!("{}:{} ({})", self.dev.api(), crate::backend::gpu::device_ordinal(), info.name),
            class: crate::weights::layout::DeviceClass::Gpu,
            residency: self.cache.residency(),
            free,
            total,
            used_at_open: total.saturating_sub(free),
            arena: self.dev.driver().vmm_granularity().is_some() && self.tuning.weight_arena,
            tuning: Some(self.tuning.clone()),
            cap: self.dev.memory_cap(),
            host_expert_layers: self.cpu_experts.as_ref().map_or(0, |c| c.0),
        })
    }

    /// Graph capture / replay counters.
    pub fn replay_stats(&self) -> ReplayStats {
        self.replay.borrow().stats
    }

    /// The weight cache (test hooks: injected failures, allocation limit).
    pub fn weight_cache_mut(&mut self) -> &mut WeightCache<GpuMaterializer> {
        &mut self.cache
    }

    /// The tuning table the plan reads (the device's, copied at open); selftests flip its
    /// switches to compare a fused path with the unfused one.
    pub fn tuning(&self) -> &Tuning {
        &self.tuning
    }

    pub fn tuning_mut(&mut self) -> &mut Tuning {
        &mut self.tuning
    }

    /// Graph replay on or off (`Tuning::graphs` at start).
    pub fn set_graphs(&mut self, on: bool) {
        self.replay.get_mut().enabled = on;
    }
}
