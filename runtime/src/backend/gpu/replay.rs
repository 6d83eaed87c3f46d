//! Step replay: the backend's launches between two read-backs (one "step", e.g. one
//! decode token) are recorded; when a step's record equals the previous step's, it is
//! captured once as a device graph, and later identical steps replay that graph with one
//! launch instead of hundreds.
//!
//! Why this is safe: a step is compared entry by entry (kernel, grid, block, every
//! argument value: buffer addresses, sizes, scalars). Per-token values never appear as
//! arguments — token ids and positions are uploaded to per-step staging slots whose
//! addresses repeat, and kernels read positions on the device. While replaying, each op is
//! checked against the graph's record *before* anything is launched; the first mismatch
//! (a new shape, a moved buffer, a different kernel) launches the matched prefix eagerly
//! and drops the graph — a stale pointer is never replayed. Steps that contain work the
//! record cannot express (a host write into an activation buffer, a weight upload) are
//! never captured. `LODE_GRAPHS=0` turns replay off.
//!
//! Graph-replay work (signatures, instance caches, node-parameter rebinding) builds on
//! this through `GpuDevice`'s capture / instantiate / update / launch hooks.

use super::device::GpuDevice;
use super::driver::{DevPtr, DriverError, KArg, RawHandle};
use super::ops::Launch;
use std::cell::RefCell;

/// One recorded piece of device work.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Kernel { name: &'static str, grid: [u32; 3], block: [u32; 3], args: Vec<KArg> },
    Copy { dst: DevPtr, src: DevPtr, bytes: usize },
}

/// Counters for reports.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayStats {
    pub captures: u64,
    pub replays: u64,
    pub fallbacks: u64,
    /// Replays launched at the step's first entry.
    pub early: u64,
    pub eager_steps: u64,
}

struct Graph {
    exec: RawHandle,
    record: Vec<Entry>,
}

pub struct Replay {
    pub enabled: bool,
    /// This step's work so far.
    step: Vec<Entry>,
    /// The last complete eager step (capture candidate).
    prev: Vec<Entry>,
    /// The step holds work outside the record: never capture it.
    tainted: bool,
    graph: Option<Graph>,
    /// True while every entry of this step matched `graph.record` (nothing launched yet,
    /// unless `early`).
    replaying: bool,
    /// The graph was launched speculatively at the step's first entry (the host then only
    /// verifies the rest of the step while the GPU already runs it).
    early: bool,
    pub stats: ReplayStats,
    /// `LODE_PROFILE=1`: every eager launch is synchronized and timed, by kernel name
    /// (graphs are then off: timing needs eager launches).
    prof: Option<std::collections::HashMap<&'static str, (u64, f64)>>,
}

impl Replay {
    pub fn new() -> Replay {
        let prof = std::env::var("LODE_PROFILE").map(|v| v == "1").unwrap_or(false).then(Default::default);
        let enabled = std::env::var("LODE_GRAPHS").map(|v| v != "0").unwrap_or(true) && prof.is_none();
        Replay { enabled, step: Vec::new(), prev: Vec::new(), tainted: false, graph: None, replaying: false, early: false, stats: ReplayStats::default(), prof }
    }

    fn issue(dev: &GpuDevice, e: &Entry) -> Result<(), DriverError> {
        match e {
            Entry::Kernel { name, grid, block, args } => dev.launch(name, *grid, *block, args),
            Entry::Copy { dst, src, bytes } => dev.copy(*dst, *src, *bytes),
        }
    }

    fn drop_graph(&mut self, dev: &GpuDevice) {
        if let Some(g) = self.graph.take() {
            let _ = dev.graph_exec_destroy(g.exec);
        }
        self.replaying = false;
    }

    /// Leave replay mid-step: launch the matched prefix eagerly.
    fn fall_back(&mut self, dev: &GpuDevice) -> Result<(), DriverError> {
        if self.replaying {
            // A speculative launch already ran the whole recorded step; the eager re-run
            // of this step's work below recomputes every buffer the step writes.
            self.stats.fallbacks += 1;
            self.replaying = false;
            self.early = false;
            for e in &self.step {
                Self::issue(dev, e)?;
            }
            self.drop_graph(dev);
        }
        Ok(())
    }

    /// True at the first entry of a step that can replay.
    pub fn can_speculate(&self) -> bool {
        self.replaying && self.step.is_empty() && !self.early
    }

    /// Launch the graph now, before the rest of the step is verified (the caller has
    /// staged every input the graph reads, predicting the ones not yet known; it calls
    /// [`Replay::mispredicted`] when a prediction turns out wrong).
    pub fn speculate(&mut self, dev: &GpuDevice, first: &Entry) -> Result<bool, DriverError> {
        if !self.can_speculate() || self.graph.as_ref().and_then(|g| g.record.first()) != Some(first) {
            return Ok(false);
        }
        let exec = self.graph.as_ref().map(|g| g.exec).unwrap_or(0);
        dev.graph_launch(exec)?;
        self.early = true;
        Ok(true)
    }

    /// A predicted input was wrong: the speculative run is void; redo the step eagerly.
    pub fn mispredicted(&mut self, dev: &GpuDevice) -> Result<(), DriverError> {
        self.fall_back(dev)
    }

    /// Record (and, unless replaying a match, run) one piece of work.
    pub fn submit(&mut self, dev: &GpuDevice, e: Entry) -> Result<(), DriverError> {
        if self.replaying {
            let i = self.step.len();
            if self.graph.as_ref().and_then(|g| g.record.get(i)) == Some(&e) {
                self.step.push(e);
                return Ok(());
            }
            self.fall_back(dev)?;
        }
        if let Some(prof) = &mut self.prof {
            dev.sync()?;
            let t = std::time::Instant::now();
            Self::issue(dev, &e)?;
            dev.sync()?;
            let name = match &e {
                Entry::Kernel { name, .. } => *name,
                Entry::Copy { .. } => "copy",
            };
            let s = prof.entry(name).or_insert((0, 0.0));
            s.0 += 1;
            s.1 += t.elapsed().as_secs_f64();
        } else {
            Self::issue(dev, &e)?;
        }
        self.step.push(e);
        Ok(())
    }

    /// The per-kernel profile (`LODE_PROFILE=1`), most time first.
    pub fn profile_report(&self) -> Option<String> {
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

    /// Work outside the record is about to happen (a host write, an allocation): make
    /// everything recorded so far run first, and keep this step out of capture.
    pub fn barrier(&mut self, dev: &GpuDevice) -> Result<(), DriverError> {
        self.fall_back(dev)?;
        self.tainted = true;
        Ok(())
    }

    /// The step ends (a read-back follows): launch the graph for a full match, capture a
    /// graph when two consecutive eager steps were identical.
    pub fn end_step(&mut self, dev: &GpuDevice) -> Result<(), DriverError> {
        let step = std::mem::take(&mut self.step);
        if self.replaying {
            let full = self.graph.as_ref().map(|g| g.record.len() == step.len()).unwrap_or(false);
            if full {
                if self.early {
                    self.stats.early += 1;
                } else {
                    let exec = self.graph.as_ref().map(|g| g.exec).unwrap_or(0);
                    dev.graph_launch(exec)?;
                }
                self.early = false;
                self.stats.replays += 1;
                self.tainted = false;
                return Ok(());
            }
            self.step = step;
            self.fall_back(dev)?;
            self.step.clear();
            self.prev.clear();
            self.tainted = false;
            return Ok(());
        }
        self.stats.eager_steps += 1;
        let capturable = self.enabled && !self.tainted && !step.is_empty();
        self.tainted = false;
        if capturable && step == self.prev && self.graph.is_none() {
            match Self::capture(dev, &step) {
                Ok(exec) => {
                    self.stats.captures += 1;
                    self.graph = Some(Graph { exec, record: step });
                    self.replaying = true;
                    self.prev.clear();
                    return Ok(());
                }
                Err(e) => {
                    tracing::warn!("graph capture failed ({e}); running eagerly");
                    self.enabled = false;
                }
            }
        }
        self.prev = if capturable { step } else { Vec::new() };
        if self.graph.is_some() {
            self.replaying = true;
        }
        Ok(())
    }

    /// Capture `record` as a device graph and instantiate it.
    fn capture(dev: &GpuDevice, record: &[Entry]) -> Result<RawHandle, DriverError> {
        dev.capture_begin()?;
        let mut res = Ok(());
        for e in record {
            res = Self::issue(dev, e);
            if res.is_err() {
                break;
            }
        }
        let graph = dev.capture_end();
        res?;
        let graph = graph?;
        let exec = dev.graph_instantiate(graph);
        let _ = dev.graph_destroy(graph);
        exec
    }

    pub fn release(&mut self, dev: &GpuDevice) {
        self.drop_graph(dev);
    }
}

impl Default for Replay {
    fn default() -> Self {
        Replay::new()
    }
}

/// A [`Launch`] target that routes kernels through the step recorder.
pub struct Rec<'a> {
    pub dev: &'a GpuDevice,
    pub replay: &'a RefCell<Replay>,
}

impl Launch for Rec<'_> {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<(), DriverError> {
        self.replay.borrow_mut().submit(self.dev, Entry::Kernel { name, grid, block, args: args.to_vec() })
    }
}
