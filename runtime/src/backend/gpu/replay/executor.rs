//! What replay needs from a device: run an entry now, turn a record into a graph
//! instance, rebind an instance to a record of the same signature, launch, destroy.
//!
//! [`GpuDevice`] implements it with stream capture, `cuGraphExecUpdate` /
//! `hipGraphExecUpdate` and graph launches; tests implement it over host memory, so
//! the replay decisions (hit, rebind, rebuild, eviction) run on a CPU-only machine
//! with results that come from actually executing the bound work.

use super::Entry;
use crate::backend::gpu::device::{GpuDevice, Timer};
use crate::backend::gpu::driver::{DevPtr, DriverError, RawHandle};

pub trait Executor {
    /// Run one entry now (eagerly).
    fn issue(&self, e: &Entry) -> Result<(), DriverError>;
    /// Build an instance that runs `record` (without running it).
    fn instantiate(&self, record: &[Entry]) -> Result<RawHandle, DriverError>;
    /// Point `exec`'s nodes at `record`'s bindings (`record` has the signature `exec`
    /// was built from). `Ok(false)`: the device refused; the caller rebuilds.
    fn rebind(&self, exec: RawHandle, record: &[Entry]) -> Result<bool, DriverError>;
    fn launch(&self, exec: RawHandle) -> Result<(), DriverError>;
    fn destroy(&self, exec: RawHandle);
    /// The allocation holding address `p`: an id never reused in this process (`None`:
    /// not an allocation the executor knows, e.g. a registered host mapping).
    fn allocation(&self, _p: DevPtr) -> Option<u64> {
        None
    }
    /// Is allocation `id` still live (not freed)?
    fn is_live(&self, _id: u64) -> bool {
        true
    }
    /// Wait for everything issued (profiling only).
    fn sync(&self) -> Result<(), DriverError> {
        Ok(())
    }
    /// A pair of timing events on the work stream (`LODE_DEBUG=kernel-times`; `None`:
    /// this executor cannot time).
    fn kernel_timer(&self) -> Option<Timer> {
        None
    }
}

impl GpuDevice {
    /// Stream-capture `record` into a graph (nothing runs).
    fn capture_record(&self, record: &[Entry]) -> Result<RawHandle, DriverError> {
        self.capture_begin()?;
        let mut res = Ok(());
        for e in record {
            res = Executor::issue(self, e);
            if res.is_err() {
                break;
            }
        }
        let graph = self.capture_end();
        res?;
        graph
    }
}

/// `LODE_DEBUG=launches`: print every launch before it is made (finding a crash).
fn trace() -> bool {
    crate::diag::get().launches
}

impl Executor for GpuDevice {
    fn issue(&self, e: &Entry) -> Result<(), DriverError> {
        if trace() {
            eprintln!("launch {e:?}");
        }
        match e {
            Entry::Kernel { name, grid, block, args } => self.launch(name, *grid, *block, args),
            Entry::Copy { dst, src, bytes } => self.copy(*dst, *src, *bytes),
        }
    }
    fn instantiate(&self, record: &[Entry]) -> Result<RawHandle, DriverError> {
        let graph = self.capture_record(record)?;
        let exec = self.graph_instantiate(graph);
        let _ = self.graph_destroy(graph);
        self.mem_mark(&format!("graph of {} launches instantiated", record.len()));
        exec
    }
    fn rebind(&self, exec: RawHandle, record: &[Entry]) -> Result<bool, DriverError> {
        let graph = self.capture_record(record)?;
        let ok = self.graph_update(exec, graph);
        let _ = self.graph_destroy(graph);
        ok
    }
    fn launch(&self, exec: RawHandle) -> Result<(), DriverError> {
        if trace() {
            eprintln!("graph launch {exec:#x}");
        }
        self.graph_launch(exec)
    }
    fn destroy(&self, exec: RawHandle) {
        let _ = self.graph_exec_destroy(exec);
    }
    fn sync(&self) -> Result<(), DriverError> {
        GpuDevice::sync(self)
    }
    fn kernel_timer(&self) -> Option<Timer> {
        self.timer().ok()
    }
    fn allocation(&self, p: DevPtr) -> Option<u64> {
        self.allocation_of(p)
    }
    fn is_live(&self, id: u64) -> bool {
        self.allocation_live(id)
    }
}
