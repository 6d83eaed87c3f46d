//! Step replay: the backend's launches between two read-backs (one "step", e.g. one
//! decode token) are recorded; a step whose signature was seen before is run as a
//! device graph with one launch instead of hundreds.
//!
//! A step has a *signature* (its work with buffer addresses left out: kernels, grids,
//! scalar arguments, copy sizes) and *bindings* (the addresses). Instances are kept in a
//! bounded cache keyed by signature ([`instances`]). While a step is recorded its
//! entries are checked, before anything is launched, against the record of a candidate
//! instance with the same signature so far; at the step's end:
//! - same bindings → **hit**: launch the instance as is;
//! - same signature, same physical buffers at other offsets, or an instance bound to a
//!   buffer since freed (the KV cache was reallocated, a scratch buffer grew) →
//!   **rebind**: the instance's node parameters are updated to this step's bindings
//!   (exec update), then launched — a stale pointer is never replayed; if the device
//!   refuses the update → **rebuild**;
//! - same signature, other live buffers (another sequence's KV cache) → a new instance,
//!   so binding sets used alternately each keep theirs;
//! - a signature seen in the previous eager step but not cached → **capture** a new
//!   instance (the step itself already ran eagerly);
//! - the first entry that fits no cached instance launches the matched prefix eagerly
//!   (**fallback**) and the rest of the step runs eagerly.
//!
//! Per-token values never appear as arguments — token ids and positions are uploaded to
//! per-step staging slots whose addresses repeat, and kernels read positions on the
//! device — so decode steps hit token after token. Steps that contain work the record
//! cannot express (a host write into an activation buffer, an allocation, a weight
//! upload) are never captured. `Tuning::graphs` off turns replay off;
//! `Tuning::graph_cache` bounds the instance cache (default 8).
//!
//! The decisions are device-independent: they run over an [`Executor`], which the GPU
//! implements with stream capture and exec update, and tests with host memory.

pub mod executor;
pub mod instances;
pub mod kernel_times;
pub mod signature;

pub use executor::Executor;

use super::device::GpuDevice;
use super::driver::{DevPtr, DriverError, KArg};
use super::launch::Launch;
use instances::Instances;
use signature::{same_shape, same_shape_steps};
use std::cell::RefCell;

/// One recorded piece of device work.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Kernel { name: &'static str, grid: [u32; 3], block: [u32; 3], args: Vec<KArg> },
    Copy { dst: DevPtr, src: DevPtr, bytes: usize },
}

/// Counters for the memory report and `lode bench` (kept with the report they go in).
pub use crate::weights::stats::GraphStats as ReplayStats;

pub struct Replay {
    pub enabled: bool,
    /// This step's work so far.
    step: Vec<Entry>,
    /// The last complete eager step (capture candidate).
    prev: Vec<Entry>,
    /// The step holds work outside the record: never capture it.
    tainted: bool,
    instances: Instances,
    /// The instance this step follows while `replaying`.
    cand: Option<usize>,
    /// True while every entry of this step matched `cand`'s record in shape (nothing
    /// launched yet, unless `early`).
    replaying: bool,
    /// The candidate was launched speculatively at the step's first entry (the host then
    /// only verifies the rest of the step while the GPU already runs it).
    early: bool,
    /// Speculation is allowed: the last step was a verified hit and nothing was
    /// allocated or freed since (a speculative launch must not use a moved binding).
    spec_ok: bool,
    pub stats: ReplayStats,
    /// `LODE_DEBUG=profile`: every eager launch is synchronized and timed, by kernel name
    /// (graphs are then off: timing needs eager launches).
    prof: Option<std::collections::HashMap<&'static str, (u64, f64)>>,
    /// `LODE_DEBUG=kernel-times`: GPU events around every eager launch (graphs off).
    ktimes: Option<kernel_times::KernelTimes>,
}

impl Replay {
    /// As the tuning table says (`graphs`, `graph_cache`), with `LODE_DEBUG=profile`.
    pub fn new(t: &crate::backend::gpu::tuning::Tuning) -> Replay {
        let prof = crate::diag::get().profile.then(Default::default);
        let ktimes = (crate::diag::get().kernel_times && prof.is_none()).then(Default::default);
        let enabled = t.graphs && prof.is_none() && ktimes.is_none();
        let mut r = Replay::with_capacity(t.graph_cache);
        r.enabled = enabled;
        r.prof = prof;
        r.ktimes = ktimes;
        r
    }

    /// Replay on, at most `cap` instances, no profiling (tests, selftests).
    pub fn with_capacity(cap: usize) -> Replay {
        Replay {
            enabled: true,
            step: Vec::new(),
            prev: Vec::new(),
            tainted: false,
            instances: Instances::new(cap),
            cand: None,
            replaying: false,
            early: false,
            spec_ok: false,
            stats: ReplayStats::default(),
            prof: None,
            ktimes: None,
        }
    }

    /// Instances cached now.
    pub fn instances(&self) -> usize {
        self.instances.len()
    }

    /// The executable handle of the instance for `step`'s signature, if cached.
    pub fn instance_for(&self, step: &[Entry]) -> Option<super::driver::RawHandle> {
        self.instances.find(step).map(|i| self.instances.get(i).exec)
    }

    /// Leave replay mid-step: launch the matched prefix eagerly.
    fn fall_back<X: Executor>(&mut self, x: &X) -> Result<(), DriverError> {
        if self.replaying {
            // A speculative launch already ran the whole recorded step; the eager re-run
            // of this step's work below recomputes every buffer the step writes.
            self.stats.fallbacks += 1;
            self.replaying = false;
            self.early = false;
            self.spec_ok = false;
            for e in &self.step {
                x.issue(e)?;
            }
        }
        Ok(())
    }

    /// True at the first entry of a step that can replay speculatively.
    pub fn can_speculate(&self) -> bool {
        self.replaying && self.step.is_empty() && !self.early && self.spec_ok && self.cand.is_some()
    }

    /// Launch the candidate now, before the rest of the step is verified (the caller has
    /// staged every input the graph reads, predicting the ones not yet known; it calls
    /// [`Replay::mispredicted`] when a prediction turns out wrong). Only after a verified
    /// hit, and only while every entry then matches the record exactly.
    pub fn speculate<X: Executor>(&mut self, x: &X, first: &Entry) -> Result<bool, DriverError> {
        if !self.can_speculate() {
            return Ok(false);
        }
        let Some(c) = self.cand else { return Ok(false) };
        if self.instances.get(c).record.first() != Some(first) {
            return Ok(false);
        }
        x.launch(self.instances.get(c).exec)?;
        self.early = true;
        Ok(true)
    }

    /// A predicted input was wrong: the speculative run is void; redo the step eagerly.
    pub fn mispredicted<X: Executor>(&mut self, x: &X) -> Result<(), DriverError> {
        self.fall_back(x)
    }

    /// Does `e`, as the step's next entry, keep following the candidate? Switches to
    /// another cached instance when that one fits and this one does not.
    fn follows(&mut self, e: &Entry) -> bool {
        let i = self.step.len();
        let Some(c) = self.cand else { return false };
        let rec = &self.instances.get(c).record;
        if self.early {
            // The GPU already runs the record: only an exact match keeps it valid.
            return rec.get(i) == Some(e);
        }
        if rec.get(i).is_some_and(|r| same_shape(r, e)) {
            return true;
        }
        match self.instances.find_prefix(&self.step, e, Some(c)) {
            Some(j) => {
                self.cand = Some(j);
                true
            }
            None => false,
        }
    }

    /// Record (and, unless it follows a cached instance, run) one piece of work.
    pub fn submit<X: Executor>(&mut self, x: &X, e: Entry) -> Result<(), DriverError> {
        if self.replaying {
            if self.follows(&e) {
                self.step.push(e);
                return Ok(());
            }
            self.fall_back(x)?;
        }
        if let Some(prof) = &mut self.prof {
            x.sync()?;
            let t = std::time::Instant::now();
            x.issue(&e)?;
            x.sync()?;
            let name = match &e {
                Entry::Kernel { name, .. } => *name,
                Entry::Copy { .. } => "copy",
            };
            let s = prof.entry(name).or_insert((0, 0.0));
            s.0 += 1;
            s.1 += t.elapsed().as_secs_f64();
        } else if let Some(kt) = &mut self.ktimes {
            kt.issue(x, &e)?;
        } else {
            x.issue(&e)?;
        }
        self.step.push(e);
        Ok(())
    }

    /// The per-kernel profile (`LODE_DEBUG=profile` or `kernel-times`), most time first.
    pub fn profile_report(&mut self) -> Option<String> {
        if let Some(kt) = &mut self.ktimes {
            return kt.report();
        }
        let prof = self.prof.as_ref()?;
        let mut v: Vec<_> = prof.iter().collect();
        v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let total: f64 = v.iter().map(|x| x.1 .1).sum();
        let mut s = format!("kernel profile (launch + sync, {:.1} ms total):\n", total * 1e3);
        for (name, (n, t)) in v {
            s.push_str(&format!("  {name:<20} {n:>7} calls {:>9.2} ms {:>7.2} us/call {:>5.1} %\n", t * 1e3, t * 1e6 / *n as f64, 100.0 * t / total));
        }
        Some(s)
    }

    /// Work outside the record is about to happen (a host write, an allocation, a free):
    /// make everything recorded so far run first, and keep this step out of capture.
    pub fn barrier<X: Executor>(&mut self, x: &X) -> Result<(), DriverError> {
        self.fall_back(x)?;
        self.tainted = true;
        self.spec_ok = false;
        Ok(())
    }

    /// Run a step that matched `c`'s signature in full (its entries are still unlaunched,
    /// unless `early`). Among the instances of that signature:
    /// 1. one recorded with exactly these addresses → **hit**;
    /// 2. one bound to the same physical buffers at other offsets (a mutable offset
    ///    moved) → **rebind** it;
    /// 3. one bound to a buffer that has since been freed (e.g. the KV arena was
    ///    reallocated) → **rebind** it;
    /// 4. otherwise these are distinct live buffers (another sequence's cache, say) →
    ///    a new instance (**capture**), so two binding sets used alternately each keep
    ///    their own instance.
    ///
    /// A rebind the device refuses becomes a **rebuild**.
    fn finish_match<X: Executor>(&mut self, x: &X, c: usize, step: Vec<Entry>) -> Result<(), DriverError> {
        if self.early {
            // Every entry matched the launched record exactly (checked in `follows`).
            self.stats.early += 1;
            self.stats.hits += 1;
            self.instances.touch(c);
            self.early = false;
            self.tainted = false;
            return Ok(());
        }
        self.tainted = false;
        let group = self.instances.same_signature(c);
        if let Some(&i) = group.iter().find(|&&i| self.instances.get(i).record == step) {
            x.launch(self.instances.get(i).exec)?;
            self.stats.hits += 1;
            self.spec_ok = true;
            self.instances.touch(i);
            self.cand = Some(i);
            return Ok(());
        }
        let ids = instances::identities(x, &step);
        let same_buffers = group.iter().copied().find(|&i| self.instances.get(i).ids == ids);
        let stale = || group.iter().copied().find(|&i| self.instances.get(i).ids.iter().any(|&(id, _)| id != 0 && !x.is_live(id)));
        // The next step verifies its bindings in full before any speculation.
        self.spec_ok = false;
        let Some(i) = same_buffers.or_else(stale) else {
            let exec = x.instantiate(&step)?;
            self.stats.captures += 1;
            let (i, evicted) = self.instances.insert(step, exec, ids);
            if let Some(old) = evicted {
                x.destroy(old.exec);
                self.stats.evictions += 1;
            }
            x.launch(self.instances.get(i).exec)?;
            self.cand = Some(i);
            return Ok(());
        };
        let exec = self.instances.get(i).exec;
        let rebound = x.rebind(exec, &step).unwrap_or_else(|e| {
            tracing::debug!("graph rebind failed ({e}); rebuilding");
            false
        });
        if rebound {
            self.stats.rebinds += 1;
        } else {
            let fresh = x.instantiate(&step)?;
            x.destroy(exec);
            self.instances.get_mut(i).exec = fresh;
            self.stats.rebuilds += 1;
        }
        let inst = self.instances.get_mut(i);
        inst.record = step;
        inst.ids = ids;
        x.launch(inst.exec)?;
        self.instances.touch(i);
        self.cand = Some(i);
        Ok(())
    }

    /// The step ends (a read-back follows): launch the matching instance, or capture one
    /// when two consecutive eager steps had the same signature.
    pub fn end_step<X: Executor>(&mut self, x: &X) -> Result<(), DriverError> {
        if let Some(kt) = &mut self.ktimes {
            kt.read()?;
        }
        let step = std::mem::take(&mut self.step);
        if self.replaying {
            if let Some(c) = self.cand.filter(|&c| self.instances.get(c).record.len() == step.len()) {
                return self.finish_match(x, c, step);
            }
            // Matched a prefix only: run it eagerly; this step is not a capture candidate.
            self.step = step;
            self.fall_back(x)?;
            self.step.clear();
            self.prev.clear();
            self.tainted = false;
            self.rearm();
            return Ok(());
        }
        self.stats.eager_steps += 1;
        let capturable = self.enabled && !self.tainted && !step.is_empty();
        self.tainted = false;
        if capturable && same_shape_steps(&step, &self.prev) && self.instances.find(&step).is_none() {
            match x.instantiate(&step) {
                Ok(exec) => {
                    self.stats.captures += 1;
                    let ids = instances::identities(x, &step);
                    let (i, evicted) = self.instances.insert(step, exec, ids);
                    if let Some(old) = evicted {
                        x.destroy(old.exec);
                        self.stats.evictions += 1;
                    }
                    self.prev.clear();
                    self.cand = Some(i);
                    self.replaying = true;
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!("graph capture failed ({e}); running eagerly");
                    self.enabled = false;
                }
            }
        }
        self.prev = if capturable { step } else { Vec::new() };
        self.rearm();
        Ok(())
    }

    /// Follow the most recently used instance from the next step's first entry.
    fn rearm(&mut self) {
        self.early = false;
        self.cand = if self.enabled { self.instances.latest() } else { None };
        self.replaying = self.cand.is_some();
    }

    /// Destroy every instance.
    pub fn release<X: Executor>(&mut self, x: &X) {
        for i in self.instances.drain() {
            x.destroy(i.exec);
        }
        self.cand = None;
        self.replaying = false;
    }
}

impl Default for Replay {
    fn default() -> Self {
        Replay::new(&Default::default())
    }
}

/// A [`Launch`] target that routes kernels through the step recorder.
pub struct Rec<'a, X: Executor = GpuDevice> {
    pub dev: &'a X,
    pub replay: &'a RefCell<Replay>,
}

impl<X: Executor> Launch for Rec<'_, X> {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<(), DriverError> {
        for _ in 0..1 + repeats(name) {
            self.replay.borrow_mut().submit(self.dev, Entry::Kernel { name, grid, block, args: args.to_vec() })?;
        }
        Ok(())
    }
}

/// A measurement knob: `LODE_DEBUG=repeat=name[:n]` launches kernel `name` n more times
/// wherever it runs, so that a benchmark's slowdown is that kernel's cost in its real place
/// in the step (graph, overlap and all) — which a profiler that serializes kernels does not
/// show. Only for kernels whose launch is idempotent (every output a function of inputs it
/// does not write: the fused norm matvecs without a residual add, the decode attention);
/// results are then unchanged.
fn repeats(name: &str) -> usize {
    match &crate::diag::get().repeat {
        Some((k, n)) if k == name => *n,
        _ => 0,
    }
}

/// The first launch `f` makes, as a replay entry, without running it (None where `f`
/// fails or launches nothing): how the backend predicts a step's first kernel.
pub fn first_launch(f: impl FnOnce(&dyn Launch) -> Result<(), super::GpuError>) -> Option<Entry> {
    struct Cap(RefCell<Option<Entry>>);
    impl Launch for Cap {
        fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<(), DriverError> {
            let mut c = self.0.borrow_mut();
            if c.is_none() {
                *c = Some(Entry::Kernel { name, grid, block, args: args.to_vec() });
            }
            Ok(())
        }
    }
    let c = Cap(Default::default());
    f(&c).ok()?;
    c.0.into_inner()
}
