//! Accounting of the weight cache (DESIGN decision 6): copies, bytes per layout,
//! duplicates, hits and misses, time materializing, peak device memory.
//!
//! `--memory-report` prints [`WeightStats`] as JSON at exit; `LODE_DEBUG=weights` makes
//! the cache print one line per copy it makes ([`trace_enabled`]).

use std::collections::BTreeMap;

use super::residency::Residency;

/// Device memory as the device itself reports it (`None` fields: not known there).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// Bytes lode holds in device allocations now (weights, KV cache, activations, scratch).
    pub allocated_bytes: u64,
    /// High-water mark of `allocated_bytes` since the device was opened.
    pub peak_allocated_bytes: u64,
    /// `total - free` from the driver now (includes the context itself).
    pub driver_used_bytes: Option<u64>,
    /// Highest `total - free` the driver reported over the run: sampled at every device
    /// allocation and arena growth, every read-back and stream sync, and every memory
    /// query (GPU `--memory-report` or `--device-memory`; else at each materialization
    /// and at the report only). `driver_samples` says how many samples it is the maximum of.
    pub driver_peak_used_bytes: Option<u64>,
    /// Samples behind `driver_peak_used_bytes`.
    pub driver_samples: Option<u64>,
    /// The device's total: the card's, or `--device-memory`'s when that is smaller.
    pub driver_total_bytes: Option<u64>,
    /// `--device-memory` (the capacity the device is treated as having, the driver's
    /// own use included), if set.
    pub device_memory_cap_bytes: Option<u64>,
}

/// Everything the weight cache counted.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct WeightStats {
    pub residency: Option<Residency>,
    /// Set when the asked residency could not be served and the cache fell back to
    /// another (`mapped → device: ...` with the reason).
    pub residency_fallback: Option<String>,
    /// Device copies made (one per (region, layout) materialized).
    pub copies: u64,
    /// Weights read in place from the registered mapping (no device copy).
    pub mapped: u64,
    /// Bytes of those in-place weights (they cost no device memory).
    pub mapped_bytes: u64,
    /// Bytes of device copies now resident.
    pub resident_bytes: u64,
    /// High-water mark of `resident_bytes`.
    pub peak_resident_bytes: u64,
    /// Stored (GGUF) bytes of the distinct regions the copies were made from.
    pub source_bytes: u64,
    /// Resident bytes per layout name (`ggml-native`, `f32`, `q4k-i4-k32-row64` …).
    pub bytes_per_layout: BTreeMap<String, u64>,
    /// Copies per layout name.
    pub copies_per_layout: BTreeMap<String, u64>,
    /// Copies of a region that already had another layout resident.
    pub duplicates: u64,
    /// Extra bytes those duplicates cost.
    pub duplicate_bytes: u64,
    pub hits: u64,
    pub misses: u64,
    /// Materializations that failed (budget, allocation, upload, pack), all rolled back.
    pub failures: u64,
    pub pack_ns: u64,
    pub alloc_ns: u64,
    pub upload_ns: u64,
    /// The budget in force, if any.
    pub budget_bytes: Option<u64>,
    /// The device's own numbers, where it has them.
    pub device: Option<DeviceMemory>,
    /// Graph replay counters (captures, hits, rebinds, rebuilds …) of a GPU backend.
    pub graphs: Option<GraphStats>,
    /// Expert tensors kept in host memory (the file mapping) and computed by the CPU.
    pub host_experts: Option<HostExperts>,
}

/// Where a mixture-of-experts model's experts live when some stay on the host.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct HostExperts {
    /// The first `layers` layers' expert tensors (`ffn_*_exps`) are on the host, the
    /// others on the device.
    pub layers: usize,
    /// `--n-cpu-moe`, or `fit` (the fewest layers that let the run fit the device and the
    /// weight budget).
    pub chosen_by: String,
    /// Their bytes, where the chooser counted them (fit does).
    pub bytes: Option<u64>,
}

impl WeightStats {
    /// Milliseconds spent materializing (pack + allocate + upload).
    pub fn materialize_ms(&self) -> f64 {
        (self.pack_ns + self.alloc_ns + self.upload_ns) as f64 / 1e6
    }

    /// Pretty JSON for `--memory-report`.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// One line for `lode bench` beside the speed.
    pub fn summary(&self) -> String {
        use super::budget::human;
        let peak = self
            .device
            .map(|d| format!(", device peak {} (driver {})", human(d.peak_allocated_bytes), d.driver_peak_used_bytes.map(human).unwrap_or_else(|| "n/a".into())))
            .unwrap_or_default();
        let graphs = self
            .graphs
            .map(|g| format!(" | graphs: {} captures, {} hits, {} rebinds, {} rebuilds, {} fallbacks, {} eager steps", g.captures, g.hits, g.rebinds, g.rebuilds, g.fallbacks, g.eager_steps))
            .unwrap_or_default();
        let host = self.host_experts.as_ref().map(|h| format!(", experts of {} layers on the host ({})", h.layers, h.chosen_by)).unwrap_or_default();
        let fell = self.residency_fallback.as_ref().map(|f| format!(" | residency fell back ({f})")).unwrap_or_default();
        format!(
            "weights: {} copies ({}), {} mapped{host}, {} duplicates, {:.1} ms materializing{peak}{graphs}{fell}",
            self.copies,
            human(self.resident_bytes),
            self.mapped,
            self.duplicates,
            self.materialize_ms()
        )
    }
}

/// `LODE_DEBUG=weights` ([`crate::diag`]).
pub fn trace_enabled() -> bool {
    crate::diag::get().weights
}

/// Graph replay's counters (`backend::gpu::replay`), for the memory report and `lode bench`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GraphStats {
    /// Instances built for a new signature.
    pub captures: u64,
    /// Steps replayed with the bindings recorded.
    pub hits: u64,
    /// Steps replayed after updating an instance to new bindings.
    pub rebinds: u64,
    /// Rebinds the device refused: the instance was rebuilt.
    pub rebuilds: u64,
    /// Instances destroyed to keep the cache bounded.
    pub evictions: u64,
    /// Steps that left replay midway (their matched prefix launched eagerly).
    pub fallbacks: u64,
    /// Hits launched speculatively at the step's first entry.
    pub early: u64,
    pub eager_steps: u64,
}
