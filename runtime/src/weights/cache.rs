//! [`WeightCache`]: every weight resident at most once per layout, made on first use.
//!
//! Keyed by the weight's *source region* of the mapped file (the file, the byte offset,
//! the length) and the [`Layout`]. The first request materializes: pack on the CPU if the
//! layout differs from the stored one, allocate, upload. Every later request — prefill or
//! decode, any token count — is a hit. Entries live until the cache is dropped (with the
//! model's backend): re-materializing on prefill↔decode transitions was measured in HRX
//! at ~1 s per cycle (seed 000), so there is no eviction.
//!
//! In `mapped` residency, once [`WeightCache::set_mapping`] gave the device address of the
//! registered mapping, a stored-layout request is answered with an address inside it and
//! costs no device copy. A second layout of an already-resident region is served, counted
//! as a duplicate and logged once, at insertion.
//!
//! Failure is safe: a budget overrun is refused before anything is allocated, and an
//! allocation, upload or pack failure frees what that request allocated and inserts
//! nothing, so the next request starts from the same state.

use std::collections::HashMap;
use std::time::Instant;

use super::error::WeightError;
use super::layout::Layout;
use super::residency::Residency;
use super::stats::{trace_enabled, DeviceMemory, WeightStats};
use super::{WeightOptions, WeightRef};
use crate::quant::GgmlType;

/// A device allocation failure as the materializer reports it.
#[derive(Clone, Debug)]
pub struct DeviceFault {
    pub out_of_memory: bool,
    pub msg: String,
}

/// What the cache needs from a device: allocate, upload, free, and the address kernels
/// use. Implemented by the GPU backend over its device, and by
/// [`super::host::HostMaterializer`] over host memory (tests and the CPU engine).
pub trait Materializer {
    type Buffer;
    /// `bytes` of device memory, contents undefined.
    fn alloc(&mut self, bytes: usize) -> Result<Self::Buffer, DeviceFault>;
    /// Copies `data` to the start of `buf` (which holds at least `data.len()` bytes).
    fn upload(&mut self, buf: &mut Self::Buffer, data: &[u8]) -> Result<(), DeviceFault>;
    /// Releases `buf` (after the work that reads it, which the device orders).
    fn free(&mut self, buf: Self::Buffer);
    /// The address kernels read `buf` at.
    fn addr(&self, buf: &Self::Buffer) -> u64;
    /// The device's memory numbers, where it has them.
    fn memory(&self) -> Option<DeviceMemory> {
        None
    }
}

/// Where a materialization can fail; [`WeightCache::inject_failure`] targets one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Pack,
    Alloc,
    Upload,
}

/// A weight's source region: which mapping, where in the file, how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Region {
    /// Host address of the file's byte 0 (identifies the mapping while it lives).
    pub file: usize,
    pub offset: u64,
    pub len: u64,
}

impl Region {
    /// The whole tensor's region, also for one expert's matrix of a 3-D tensor.
    pub fn of(w: &WeightRef) -> Region {
        let p = w.view.data.as_ptr() as usize;
        Region { file: p.wrapping_sub(w.view.file_offset as usize), offset: w.view.file_offset, len: w.view.data.len() as u64 }
    }
}

/// Where `w`'s matrix starts inside the whole tensor's copy in `layout` (0 for a whole
/// tensor): matrix `e` of a 3-D tensor is the `e`-th of equal parts in every layout.
fn part_offset(w: &WeightRef, layout: Layout) -> Result<u64, WeightError> {
    let Some(e) = w.matrix else { return Ok(0) };
    let (ty, lname) = (w.ty(), layout.name(w.ty()));
    let one = layout
        .bytes(ty, w.n_rows(), w.row_len(), w.data().len())
        .map_err(|source| WeightError::Pack { weight: w.name().into(), layout: lname, source })?;
    Ok(e as u64 * one as u64)
}

/// One resident (region, layout).
pub struct Entry<B> {
    pub name: String,
    pub ty: GgmlType,
    pub layout: Layout,
    /// Resident bytes (0 for an in-place mapped weight).
    pub bytes: u64,
    pub addr: u64,
    /// The device copy; `None` when read in place from the registered mapping.
    pub buf: Option<B>,
}

/// The registered file mapping: host range and its device address.
#[derive(Clone, Copy, Debug)]
struct Mapping {
    host: usize,
    len: usize,
    device: u64,
}

pub struct WeightCache<M: Materializer> {
    m: M,
    residency: Residency,
    budget: Option<u64>,
    /// Test-only cap on resident bytes, failing like a device out of memory.
    alloc_limit: Option<u64>,
    entries: HashMap<(Region, Layout), Entry<M::Buffer>>,
    /// Layouts resident per region (to spot duplicates).
    layouts: HashMap<Region, Vec<Layout>>,
    mapping: Option<Mapping>,
    stats: WeightStats,
    /// (stage, how many more times to pass it before failing).
    fault: Option<(Stage, u64)>,
    trace: bool,
    report_at_exit: bool,
    device_override: Option<DeviceMemory>,
}

impl<M: Materializer> WeightCache<M> {
    /// An empty cache over `m`. `residency` is the resolved mode.
    pub fn new(m: M, residency: Residency, opts: &WeightOptions) -> WeightCache<M> {
        let stats = WeightStats { residency: Some(residency), budget_bytes: opts.budget, ..Default::default() };
        WeightCache {
            m,
            residency,
            budget: opts.budget,
            alloc_limit: opts.test_alloc_limit,
            entries: HashMap::new(),
            layouts: HashMap::new(),
            mapping: None,
            stats,
            fault: None,
            trace: trace_enabled(),
            report_at_exit: opts.report_at_exit,
            device_override: None,
        }
    }

    pub fn residency(&self) -> Residency {
        self.residency
    }
    pub fn materializer(&self) -> &M {
        &self.m
    }
    pub fn materializer_mut(&mut self) -> &mut M {
        &mut self.m
    }

    /// In `mapped` residency: `host` (the file mapping, or part of it) is readable by
    /// the device at `device`. Stored-layout weights inside it are served in place.
    pub fn set_mapping(&mut self, host: &[u8], device: u64) {
        self.mapping = Some(Mapping { host: host.as_ptr() as usize, len: host.len(), device });
    }
    pub fn has_mapping(&self) -> bool {
        self.mapping.is_some()
    }

    /// The backend could not serve `mapped` (the file's registration failed or stalled):
    /// from now on weights are copied as in `to` (`why` goes to the report).
    pub fn fall_back(&mut self, to: Residency, why: String) {
        self.stats.residency_fallback = Some(format!("{} → {to}: {why}", self.residency));
        self.residency = to;
        self.stats.residency = Some(to);
        self.mapping = None;
    }

    /// Test hook: the `(after + 1)`-th time a materialization reaches `stage`, it fails.
    pub fn inject_failure(&mut self, stage: Stage, after: u64) {
        self.fault = Some((stage, after));
    }
    /// Test hook: a simulated device that holds at most `bytes` of weight copies.
    pub fn set_alloc_limit(&mut self, bytes: Option<u64>) {
        self.alloc_limit = bytes;
    }
    /// Graph replay counters of the backend that owns the cache, for the report it
    /// prints at exit (`--memory-report`).
    pub fn set_graph_stats(&mut self, g: super::stats::GraphStats) {
        self.stats.graphs = Some(g);
    }
    /// Where the experts live, for the report (`--n-cpu-moe`, or fit's placement).
    pub fn set_host_experts(&mut self, h: Option<super::stats::HostExperts>) {
        self.stats.host_experts = h;
    }
    pub fn set_budget(&mut self, bytes: Option<u64>) {
        self.budget = bytes;
        self.stats.budget_bytes = bytes;
    }

    /// The address of `(w, layout)` if it is resident (counts a hit); for one expert's
    /// matrix, its address inside the tensor's copy.
    pub fn peek(&mut self, w: &WeightRef, layout: Layout) -> Option<u64> {
        let layout = super::layout::normalize(layout, w.ty());
        let e = self.entries.get(&(Region::of(w), layout))?;
        let addr = e.addr + part_offset(w, layout).ok()?;
        self.stats.hits += 1;
        Some(addr)
    }

    /// The resident entry of `(w, layout)`, without counting anything.
    pub fn entry(&self, w: &WeightRef, layout: Layout) -> Option<&Entry<M::Buffer>> {
        self.entries.get(&(Region::of(w), super::layout::normalize(layout, w.ty())))
    }

    /// Number of resident (region, layout) entries, copies and in-place ones alike.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The address of `w` in `layout`, materializing it on first use. One expert's matrix
    /// materializes the whole tensor (one copy, one entry) and gets its address inside it.
    pub fn get(&mut self, w: &WeightRef, layout: Layout) -> Result<u64, WeightError> {
        if let Some(a) = self.peek(w, layout) {
            return Ok(a);
        }
        self.stats.misses += 1;
        let layout = super::layout::normalize(layout, w.ty());
        match part_offset(w, layout).and_then(|off| Ok(self.materialize(&w.whole(), layout)? + off)) {
            Ok(a) => Ok(a),
            Err(e) => {
                self.stats.failures += 1;
                Err(e)
            }
        }
    }

    /// Materializes every `(weight, layout)` now (`upload` residency). On failure the
    /// weights this call materialized are released again and the error is returned.
    pub fn preload<'a>(&mut self, ws: impl IntoIterator<Item = (WeightRef<'a>, Layout)>) -> Result<(), WeightError> {
        let mut added = Vec::new();
        for (w, layout) in ws {
            let key = (Region::of(&w), super::layout::normalize(layout, w.ty()));
            if self.entries.contains_key(&key) {
                continue;
            }
            if let Err(e) = self.get(&w.whole(), layout) {
                for k in added {
                    self.remove(k);
                }
                return Err(e);
            }
            added.push(key);
        }
        Ok(())
    }

    /// Counters, with the device's current memory numbers.
    pub fn stats(&self) -> WeightStats {
        let mut s = self.stats.clone();
        s.device = self.device_override.or_else(|| self.device_sample());
        s
    }

    /// The device's numbers as its owner counts them (a cached backend under
    /// `--device-memory` holds more than the weights); `stats` reports these instead.
    pub fn set_device_memory(&mut self, d: Option<DeviceMemory>) {
        self.device_override = d;
    }

    /// The device's numbers now, the driver's peak merged with earlier samples.
    fn device_sample(&self) -> Option<DeviceMemory> {
        let prev = self.stats.device.and_then(|d| d.driver_peak_used_bytes);
        let mut d = self.m.memory()?;
        d.driver_peak_used_bytes = [prev, d.driver_peak_used_bytes, d.driver_used_bytes].into_iter().flatten().max();
        Some(d)
    }

    fn sample_device(&mut self) {
        if let Some(d) = self.device_sample() {
            self.stats.device = Some(d);
        }
    }

    /// Counts one pass through `stage`; true if an injected failure fires here.
    fn fault_at(&mut self, stage: Stage) -> bool {
        match &mut self.fault {
            Some((s, n)) if *s == stage => {
                if *n == 0 {
                    self.fault = None;
                    true
                } else {
                    *n -= 1;
                    false
                }
            }
            _ => false,
        }
    }

    fn materialize(&mut self, w: &WeightRef, layout: Layout) -> Result<u64, WeightError> {
        let layout = super::layout::normalize(layout, w.ty());
        let (ty, name) = (w.ty(), w.name());
        let lname = layout.name(ty);
        if !layout.supports(ty) {
            return Err(WeightError::Unsupported { weight: name.into(), ty, layout: lname });
        }
        let region = Region::of(w);

        // In place: a stored-layout weight inside the registered mapping.
        if let (Residency::Mapped, Layout::Stored, Some(m)) = (self.residency, layout, self.mapping) {
            let p = w.data().as_ptr() as usize;
            if p >= m.host && p + w.data().len() <= m.host + m.len {
                let addr = m.device + (p - m.host) as u64;
                self.stats.mapped += 1;
                self.stats.mapped_bytes += region.len;
                self.insert(region, Entry { name: name.into(), ty, layout, bytes: 0, addr, buf: None });
                return Ok(addr);
            }
        }

        let (rows, k) = (w.n_rows(), w.row_len());
        let bytes = layout.bytes(ty, rows, k, w.data().len()).map_err(|source| WeightError::Pack { weight: name.into(), layout: lname, source })? as u64;
        let resident = self.stats.resident_bytes;
        if let Some(budget) = self.budget.filter(|&b| resident.checked_add(bytes).is_none_or(|t| t > b)) {
            return Err(WeightError::OverBudget { weight: name.into(), layout: lname, bytes, resident, budget });
        }

        let t = Instant::now();
        if self.fault_at(Stage::Pack) {
            return Err(WeightError::Injected { weight: name.into(), stage: "pack" });
        }
        let data = layout.materialize(ty, w.data(), rows, k).map_err(|source| WeightError::Pack { weight: name.into(), layout: lname, source })?;
        self.stats.pack_ns += t.elapsed().as_nanos() as u64;

        let t = Instant::now();
        let over_limit = self.alloc_limit.is_some_and(|l| resident + bytes > l);
        let alloc = if self.fault_at(Stage::Alloc) || over_limit {
            Err(DeviceFault { out_of_memory: true, msg: "out of memory (test allocator limit)".into() })
        } else {
            self.m.alloc(data.len())
        };
        let mut buf = alloc.map_err(|f| WeightError::Alloc { weight: name.into(), layout: lname, bytes, msg: f.msg, out_of_memory: f.out_of_memory })?;
        self.stats.alloc_ns += t.elapsed().as_nanos() as u64;

        let t = Instant::now();
        let up = if self.fault_at(Stage::Upload) {
            Err(DeviceFault { out_of_memory: false, msg: "injected upload failure (test)".into() })
        } else {
            self.m.upload(&mut buf, &data)
        };
        if let Err(f) = up {
            self.m.free(buf);
            return Err(WeightError::Upload { weight: name.into(), layout: lname, bytes, msg: f.msg });
        }
        self.stats.upload_ns += t.elapsed().as_nanos() as u64;

        let addr = self.m.addr(&buf);
        let s = &mut self.stats;
        s.copies += 1;
        s.resident_bytes += bytes;
        s.peak_resident_bytes = s.peak_resident_bytes.max(s.resident_bytes);
        *s.bytes_per_layout.entry(lname.into()).or_default() += bytes;
        *s.copies_per_layout.entry(lname.into()).or_default() += 1;
        if self.trace {
            eprintln!("weight copy: {name} {ty} {lname} {bytes} bytes ({} of {} in the file)", region.len, region.offset);
        }
        self.insert(region, Entry { name: name.into(), ty, layout, bytes, addr, buf: Some(buf) });
        self.sample_device();
        Ok(addr)
    }

    /// Records a new entry; a region's second layout is a duplicate, logged here once.
    fn insert(&mut self, region: Region, e: Entry<M::Buffer>) {
        let have = self.layouts.entry(region).or_default();
        if have.is_empty() {
            self.stats.source_bytes += region.len;
        } else {
            let first = have[0];
            let before: u64 = have.iter().filter_map(|l| self.entries.get(&(region, *l))).map(|x| x.bytes).sum();
            self.stats.duplicates += 1;
            self.stats.duplicate_bytes += e.bytes;
            tracing::warn!(
                "weight `{}` is now resident in two layouts: {} ({} bytes) and {} ({} bytes); the kernels reading it should share one layout",
                e.name,
                first.name(e.ty),
                before,
                e.layout.name(e.ty),
                e.bytes
            );
            if self.trace {
                eprintln!("weight duplicate: {} {} + {} ({} + {} bytes)", e.name, first.name(e.ty), e.layout.name(e.ty), before, e.bytes);
            }
        }
        have.push(e.layout);
        self.entries.insert((region, e.layout), e);
    }

    /// Drops one entry, undoing its accounting (rollback of a failed preload).
    fn remove(&mut self, key: (Region, Layout)) {
        let Some(e) = self.entries.remove(&key) else { return };
        let lname = e.layout.name(e.ty).to_string();
        if let Some(v) = self.layouts.get_mut(&key.0) {
            v.retain(|l| *l != key.1);
            if v.is_empty() {
                self.layouts.remove(&key.0);
                self.stats.source_bytes -= key.0.len;
            } else {
                self.stats.duplicates -= 1;
                self.stats.duplicate_bytes -= e.bytes;
            }
        }
        match e.buf {
            Some(b) => {
                let s = &mut self.stats;
                s.copies -= 1;
                s.resident_bytes -= e.bytes;
                if let Some(x) = s.bytes_per_layout.get_mut(&lname) {
                    *x -= e.bytes;
                }
                if let Some(x) = s.copies_per_layout.get_mut(&lname) {
                    *x -= 1;
                }
                self.m.free(b);
            }
            None => {
                self.stats.mapped -= 1;
                self.stats.mapped_bytes -= key.0.len;
            }
        }
    }
}

impl<M: Materializer> Drop for WeightCache<M> {
    fn drop(&mut self) {
        if self.report_at_exit {
            let r = serde_json::json!({ "memory_report": self.stats() });
            eprintln!("{r}");
        }
        for (_, e) in self.entries.drain() {
            if let Some(b) = e.buf {
                self.m.free(b);
            }
        }
    }
}
