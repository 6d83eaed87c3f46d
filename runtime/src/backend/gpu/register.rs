//! Registering the model file with the GPU for `mapped` residency, in chunks and bounded
//! in time.
//!
//! Page-locking a file mapping can stall inside the driver (llama.cpp saw an 82 GiB model
//! stuck past 600 s; on the H200 machine `cuMemHostRegister` of a synthesized file spun in
//! the kernel and never returned: BENCHMARKS.md, residency). A stalled call cannot be
//! interrupted, so the calls run on a worker thread and the caller waits with a deadline:
//! per chunk ([`Bounds::per_chunk`], `LODE_TUNE=mapped_stall_s`) and for the whole file
//! ([`Bounds::total`], `LODE_TUNE=mapped_total_s`). On a failure, a stall or chunks whose
//! device addresses do not continue each other, [`register`] returns an error and the
//! caller falls back to copies in device memory. Whatever the worker registered is
//! unregistered: at once on a failure, or, after a stall, when the stalled call returns (if
//! it ever does); the worker holds the file, so its pages outlive the registration.
//!
//! The bounds are `LODE_TUNE` keys, not flags: they are a safety net whose defaults never
//! fire on a healthy machine (a 256 MiB chunk pins in well under a second from the page
//! cache and in a few seconds from a hard disk), and
//! firing costs memory, not the run, so a user has nothing to choose; the fallback's log
//! line says what happened, and a machine whose storage is slow enough to trip them can
//! raise them.
//!
//! The loop knows the driver only through [`HostPin`], so it runs without a GPU
//! (`register_tests.rs` counts every pin and unpin of a fake). [`Inject`]
//! (`LODE_TUNE=mapped_inject=fail:K` / `stall:K`) makes chunk K fail or stall in a real run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::driver::{DevPtr, DriverError};

/// What the loop needs of a driver: page-lock `host` for device reads (returning the
/// device address that reads it), and undo that.
pub trait HostPin: Send + Sync {
    fn pin(&self, host: &[u8]) -> Result<DevPtr, DriverError>;
    fn unpin(&self, host: &[u8]);
}

/// Host bytes that stay put while registered (the model file's mapping).
pub trait HostBytes: Send + Sync {
    fn host_bytes(&self) -> &[u8];
}

impl HostBytes for crate::gguf::GgufFile {
    fn host_bytes(&self) -> &[u8] {
        self.bytes()
    }
}

impl HostBytes for Vec<u8> {
    fn host_bytes(&self) -> &[u8] {
        self
    }
}

/// A simulated registration fault (`LODE_TUNE=mapped_inject=fail:K` or `stall:K`, K from 1):
/// chunk K fails as a driver error would, or never returns until the caller gives up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inject {
    Fail(usize),
    Stall(usize),
}

impl std::str::FromStr for Inject {
    type Err = String;
    fn from_str(s: &str) -> Result<Inject, String> {
        let bad = || format!("`{s}`: expected fail:K or stall:K (K ≥ 1, the chunk)");
        let (what, k) = s.split_once(':').ok_or_else(bad)?;
        let k: usize = k.trim().parse().map_err(|_| bad())?;
        if k == 0 {
            return Err(bad());
        }
        match what.trim() {
            "fail" => Ok(Inject::Fail(k)),
            "stall" => Ok(Inject::Stall(k)),
            _ => Err(bad()),
        }
    }
}

/// Chunk size and time bounds of one registration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Bounds {
    /// Bytes per chunk (a multiple of 4 KiB).
    pub chunk: usize,
    /// Longest one chunk's call may take.
    pub per_chunk: Duration,
    /// Longest the whole registration may take.
    pub total: Duration,
}

impl Bounds {
    /// The bounds for a file of `bytes` from the tuning table's `mapped_chunk`,
    /// `mapped_stall_s` and `mapped_total_s`. The total, when 0 (the default), is 60 s plus
    /// one second per 64 MiB: a floor of 64 MiB/s, which a healthy pin of pages read from
    /// even a hard disk exceeds, so it ends only a registration that crawls chunk by chunk.
    pub fn new(chunk: usize, stall_s: u64, total_s: u64, bytes: usize) -> Bounds {
        let chunk = chunk.max(1 << 16).div_ceil(4096) * 4096;
        let total = match total_s {
            0 => 60 + (bytes as u64 >> 26),
            s => s,
        };
        Bounds { chunk, per_chunk: Duration::from_secs(stall_s.max(1)), total: Duration::from_secs(total) }
    }
}

/// Why a registration was given up (the caller then falls back to device copies).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RegisterError {
    #[error("registering chunk {chunk} of {chunks} ({bytes} bytes at file offset {offset}) failed: {msg}")]
    Failed { chunk: usize, chunks: usize, offset: usize, bytes: usize, msg: String },
    #[error(
        "registering chunk {chunk} of {chunks} (file offset {offset}) had not returned after {waited:.1} s ({limit}); {done} of {chunks} chunks were registered"
    )]
    Stalled { chunk: usize, chunks: usize, offset: usize, done: usize, waited: f64, limit: String },
    #[error("the device addresses of the registered chunks do not continue each other (chunk {chunk} of {chunks}, file offset {offset}, at {device:#x}); LODE_TUNE=mapped_chunk= above the file size registers it in one piece")]
    Discontiguous { chunk: usize, chunks: usize, offset: usize, device: DevPtr },
}

/// The registered file: `device_ptr` reads byte 0 of it. Unregisters every chunk on drop.
pub struct Registered {
    pin: Arc<dyn HostPin>,
    src: Arc<dyn HostBytes>,
    chunks: Vec<(usize, usize)>,
    pub device_ptr: DevPtr,
}

impl Registered {
    /// (file offset, bytes) of each registered chunk.
    pub fn chunks(&self) -> &[(usize, usize)] {
        &self.chunks
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        let bytes = self.src.host_bytes();
        for &(o, n) in &self.chunks {
            self.pin.unpin(&bytes[o..o + n]);
        }
    }
}

/// Progress as the caller sees it: chunks done of all, bytes done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    pub done: usize,
    pub chunks: usize,
    pub bytes: usize,
}

enum Msg {
    /// Chunk `i` (from 0) registered after `ms`.
    Chunk { i: usize, device: DevPtr, ms: f64 },
    Done(Registered),
    Failed(RegisterError),
}

/// Register `src` through `pin` in chunks within `bounds` (see the module doc).
/// `progress` is called after each chunk; `trace` prints each call's time.
pub fn register(
    src: Arc<dyn HostBytes>,
    pin: Arc<dyn HostPin>,
    bounds: Bounds,
    inject: Option<Inject>,
    trace: bool,
    progress: &dyn Fn(Progress),
) -> Result<Registered, RegisterError> {
    let len = src.host_bytes().len();
    let chunk = bounds.chunk.max(4096);
    let chunks = len.div_ceil(chunk).max(1);
    let abandon = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let worker = {
        let abandon = abandon.clone();
        let (src, pin) = (src.clone(), pin.clone());
        move || run_worker(src, pin, chunk, inject, &abandon, &tx)
    };
    if let Err(e) = std::thread::Builder::new().name("lode-register".into()).spawn(worker) {
        return Err(RegisterError::Failed { chunk: 1, chunks, offset: 0, bytes: len.min(chunk), msg: format!("cannot start the registration thread: {e}") });
    }
    let start = Instant::now();
    let mut done = 0;
    let mut last = start;
    loop {
        let total_left = bounds.total.saturating_sub(start.elapsed());
        let chunk_left = bounds.per_chunk.saturating_sub(last.elapsed());
        let wait = total_left.min(chunk_left);
        match rx.recv_timeout(wait) {
            Ok(Msg::Chunk { i, device, ms }) => {
                done = i + 1;
                last = Instant::now();
                if trace {
                    eprintln!("mapped: registered chunk {done}/{chunks} in {ms:.1} ms, device {device:#x}");
                }
                progress(Progress { done, chunks, bytes: (done * chunk).min(len) });
            }
            Ok(Msg::Done(r)) => return Ok(r),
            Ok(Msg::Failed(e)) => return Err(e),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The worker is inside a driver call that may never return: leave it; it
                // unregisters what it holds if the call comes back.
                abandon.store(true, Ordering::SeqCst);
                let limit = if total_left <= chunk_left {
                    format!("the whole file's bound is {} s, LODE_TUNE=mapped_total_s", bounds.total.as_secs())
                } else {
                    format!("the per-chunk bound is {} s, LODE_TUNE=mapped_stall_s", bounds.per_chunk.as_secs())
                };
                let waited = last.elapsed().as_secs_f64();
                return Err(RegisterError::Stalled { chunk: done + 1, chunks, offset: done * chunk, done, waited, limit });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(RegisterError::Failed { chunk: done + 1, chunks, offset: done * chunk, bytes: 0, msg: "the registration thread ended without a result".into() });
            }
        }
    }
}

/// The worker: registers chunk after chunk into a [`Registered`] it owns until it hands it
/// over, so whatever path ends it (failure, abandonment, a result nobody receives) drops
/// it and unregisters every chunk.
fn run_worker(src: Arc<dyn HostBytes>, pin: Arc<dyn HostPin>, chunk: usize, inject: Option<Inject>, abandon: &AtomicBool, tx: &mpsc::Sender<Msg>) {
    let mut reg = Registered { pin: pin.clone(), src: src.clone(), chunks: Vec::new(), device_ptr: 0 };
    let bytes = src.host_bytes();
    let chunks = bytes.len().div_ceil(chunk).max(1);
    let mut base: Option<DevPtr> = None;
    for i in 0..chunks {
        let off = i * chunk;
        let part = &bytes[off..(off + chunk).min(bytes.len())];
        let t = Instant::now();
        let r = match inject {
            Some(Inject::Fail(k)) if k == i + 1 => Err(format!("injected failure (LODE_TUNE=mapped_inject=fail:{k})")),
            Some(Inject::Stall(k)) if k == i + 1 => {
                // A call that does not come back until the caller has given up.
                while !abandon.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(2));
                }
                return;
            }
            _ => pin.pin(part).map_err(|e| e.to_string()),
        };
        let d = match r {
            Ok(d) => d,
            Err(msg) => {
                drop(reg); // unregister before the caller hears of it
                let _ = tx.send(Msg::Failed(RegisterError::Failed { chunk: i + 1, chunks, offset: off, bytes: part.len(), msg }));
                return;
            }
        };
        reg.chunks.push((off, part.len()));
        if abandon.load(Ordering::SeqCst) {
            return;
        }
        let b = *base.get_or_insert(d.wrapping_sub(off as u64));
        if b.wrapping_add(off as u64) != d {
            drop(reg);
            let _ = tx.send(Msg::Failed(RegisterError::Discontiguous { chunk: i + 1, chunks, offset: off, device: d }));
            return;
        }
        if tx.send(Msg::Chunk { i, device: d, ms: t.elapsed().as_secs_f64() * 1e3 }).is_err() {
            return;
        }
    }
    reg.device_ptr = base.unwrap_or(0);
    let _ = tx.send(Msg::Done(reg));
}

#[cfg(test)]
#[path = "register_tests.rs"]
mod tests;
