//! Making a `GpuBackend`: its weight options and residency, every per-op state's start
//! value from the environment, and the few switches tests and tools flip afterwards.

use super::{act, blas, norm_mv, readback, rope_attn, BackendError, GpuBackend, Numerics, Result, Scratch};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::materialize::GpuMaterializer;
use crate::backend::gpu::replay::{Replay, ReplayStats};
use crate::weights::{Residency, WeightCache, WeightOptions};
use std::cell::RefCell;
use std::collections::HashMap;

impl GpuBackend {
    /// A backend with the environment's weight options (`LODE_RESIDENCY`, else the
    /// device's default; an unreadable variable is reported and ignored).
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
        let cache = WeightCache::new(GpuMaterializer::new(dev.clone()), residency, opts);
        let mut be = GpuBackend {
            dev,
            bufs: HashMap::new(),
            tick: 0,
            act: act::ActForms::from_env(),
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
            replay: RefCell::new(Replay::new()),
            gemm_prefill: std::env::var("LODE_GEMM").map(|v| v != "0").unwrap_or(true),
            fuse: std::env::var("LODE_FUSE").map(|v| v != "0").unwrap_or(true),
            mv: norm_mv::MvFuse::from_env(),
            fuse_attn: rope_attn::FuseAttn::from_env(),
            readback: readback::Readback::from_env(),
            blas: blas::BlasPrefill::default(),
            numerics: Numerics::from_env(),
            exact: Default::default(),
        };
        // Exact mode stages host tables (RoPE) mid-step: no speculative graph launches.
        if be.numerics == Numerics::Exact {
            be.set_graphs(false);
        }
        be
    }

    pub fn device(&self) -> &GpuDevice {
        &self.dev
    }

    /// Graph capture / replay counters.
    pub fn replay_stats(&self) -> ReplayStats {
        self.replay.borrow().stats
    }

    /// The weight cache (test hooks: injected failures, allocation limit).
    pub fn weight_cache_mut(&mut self) -> &mut WeightCache<GpuMaterializer> {
        &mut self.cache
    }

    /// `--numerics` (as `LODE_NUMERICS` sets it at start).
    pub fn set_numerics(&mut self, n: Numerics) {
        self.numerics = n;
        if n == Numerics::Exact {
            self.set_graphs(false);
        }
    }

    /// Graph replay on or off (as `LODE_GRAPHS` sets it at start).
    pub fn set_graphs(&mut self, on: bool) {
        self.replay.get_mut().enabled = on;
    }
}
