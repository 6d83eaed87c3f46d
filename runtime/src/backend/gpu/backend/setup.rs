//! Making a `GpuBackend`: its weight options and residency, every per-op state's start
//! value from the tuning table, and the few switches tests and tools flip afterwards.

use super::{act, blas, norm_mv, readback, rope_attn, BackendError, GpuBackend, Result, Scratch};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::tuning::Tuning;
use crate::backend::gpu::materialize::GpuMaterializer;
use crate::backend::gpu::replay::{Replay, ReplayStats};
use crate::weights::layout::{self, DeviceClass, Layout};
use crate::weights::{Residency, WeightCache, WeightError, WeightOptions, WeightRef};
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
            host_auto: Some(0),
        };
        be
    }

    /// `--n-cpu-moe`: the expert tensors of the first `layers` layers stay in host memory
    /// (never copied to the device) and `threads` CPU threads compute those experts.
    /// `None`: none unless the engine's fit places some (`place_experts`).
    pub fn set_host_experts(&mut self, layers: Option<usize>, threads: usize) -> Result<()> {
        self.host_auto = if layers.is_none() { Some(threads) } else { None };
        self.cpu_experts = match layers.unwrap_or(0) {
            0 => None,
            n => Some((n, crate::backend::cpu::CpuBackend::build_pool(threads)?)),
        };
        let by = |n| crate::weights::HostExperts { layers: n, chosen_by: "--n-cpu-moe".into(), bytes: None };
        self.cache.set_host_experts(layers.filter(|&n| n > 0).map(by));
        Ok(())
    }

    /// `Backend::place_host_experts`: fit's count, unless `--n-cpu-moe` fixed one.
    pub(super) fn place_experts(&mut self, layers: usize, bytes: u64) -> Result<bool> {
        let Some(threads) = self.host_auto else { return Ok(false) };
        self.set_host_experts(Some(layers), threads)?;
        self.host_auto = Some(threads);
        self.cache.set_host_experts(Some(crate::weights::HostExperts { layers, chosen_by: "fit".into(), bytes: Some(bytes) }));
        Ok(true)
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

    /// `mapped` could not make the file readable by the device (`e`: the registration
    /// failed, stalled or its addresses did not continue; or no pinned copy): fall back to
    /// `device` residency, whose weights travel through the staged uploads on first use,
    /// and say so once with what it costs: device memory for the weights `mapped` would
    /// have read in place (on an integrated GPU, a second copy of them in system memory).
    /// The engine counts the run again before allocating anything (`BatchEngine::new`).
    ///
    /// A stalled registration call may hold a lock inside the driver; the fallback needs
    /// the driver, so it first checks that a call still returns (within 10 s). If none
    /// does, the error says so rather than hanging in the fallback.
    pub(super) fn fall_back_from_mapped(&mut self, e: WeightError, weights: &[WeightRef]) -> Result<()> {
        if !driver_answers(&self.dev, std::time::Duration::from_secs(10)) {
            return Err(BackendError::Unavailable(format!(
                "{e}; and the GPU driver no longer answers (a memory query made after it did not return within 10 s), so the run cannot fall back to device copies in this process"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let in_place: u64 = weights
            .iter()
            .filter(|w| layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), DeviceClass::Gpu) == Layout::Stored)
            .filter(|w| seen.insert(w.data().as_ptr() as usize))
            .map(|w| w.data().len() as u64)
            .sum();
        let unified = if self.dev.is_integrated() { " (this GPU shares system memory: a second copy of those weights beside the file's pages)" } else { "" };
        let why = e.to_string();
        tracing::warn!(
            "mapped residency is unavailable: {why}. Falling back to `device` residency: each weight is copied into device memory when first used (staged uploads), which takes {} of device memory that `mapped` would have read from the file in place{unified}.",
            crate::weights::budget::human(in_place)
        );
        self.cache.fall_back(Residency::Device, why);
        Ok(())
    }
}

/// Whether a driver call (a memory query) returns within `limit`, asked on a thread of
/// its own so that a driver blocked for good does not block the caller.
fn driver_answers(dev: &GpuDevice, limit: std::time::Duration) -> bool {
    let (tx, rx) = std::sync::mpsc::channel();
    let d = dev.clone();
    let asked = std::thread::Builder::new().name("lode-driver-probe".into()).spawn(move || {
        let _ = tx.send(d.driver().mem_info().is_ok());
    });
    asked.is_ok() && rx.recv_timeout(limit).is_ok()
}
