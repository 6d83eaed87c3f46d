//! Weight uploads overlapped with compute (`Tuning::upload_stage`): a weight's bytes are
//! copied on the host into one of a few page-locked staging buffers and sent to the device
//! on a second stream, and the compute stream waits for that copy (an event) before its
//! next kernel. The host returns at once, so in `device` residency the first prompt's
//! next weights travel while the kernels already queued run (the old path copied from
//! pageable memory on the compute stream and waited for the whole stream each time).
//! Peak device memory is unchanged: a weight's device copy is the one the cache keeps;
//! the staging is host memory (`STAGE_BUFS` × `STAGE_BYTES`).
//!
//! A staging buffer is refilled only after its previous copy has passed (its event), and
//! freed only after the upload stream is idle.

use super::device::{GpuDevice, PinnedHost};
use super::driver::{DevPtr, DriverError, RawHandle};

/// Bytes per staging buffer.
pub const STAGE_BYTES: usize = 32 << 20;
/// Staging buffers in flight.
pub const STAGE_BUFS: usize = 3;

struct Slot {
    buf: PinnedHost,
    /// Recorded after the last copy out of `buf` (None: never used).
    done: Option<RawHandle>,
}

pub struct Stager {
    dev: GpuDevice,
    stream: RawHandle,
    slots: Vec<Slot>,
    next: usize,
    /// Recorded after the last upload: what the compute stream waits for.
    last: RawHandle,
    /// Bytes sent this way (for the trace).
    pub bytes: u64,
}

impl Stager {
    pub fn new(dev: &GpuDevice) -> Result<Stager, DriverError> {
        let drv = dev.driver();
        let stream = drv.stream_create()?;
        let last = match drv.event_create() {
            Ok(e) => e,
            Err(e) => {
                let _ = drv.stream_destroy(stream);
                return Err(e);
            }
        };
        let mut s = Stager { dev: dev.clone(), stream, slots: Vec::new(), next: 0, last, bytes: 0 };
        for _ in 0..STAGE_BUFS {
            let buf = dev.host_alloc(STAGE_BYTES)?; // on error, Drop releases what was made
            s.slots.push(Slot { buf, done: None });
        }
        Ok(s)
    }

    /// Queues `data` → `dst` on the upload stream and makes the compute stream wait for
    /// it; returns once `data` has been copied into staging (it may be dropped).
    pub fn upload(&mut self, dst: DevPtr, data: &[u8]) -> Result<(), DriverError> {
        let drv = self.dev.driver();
        for (i, piece) in data.chunks(STAGE_BYTES).enumerate() {
            let n_slots = self.slots.len();
            let slot = &mut self.slots[self.next];
            self.next = (self.next + 1) % n_slots;
            let ev = match slot.done {
                Some(ev) => {
                    drv.event_sync(ev)?;
                    ev
                }
                None => {
                    let ev = drv.event_create()?;
                    slot.done = Some(ev);
                    ev
                }
            };
            copy_parallel(&mut slot.buf.as_mut_slice()[..piece.len()], piece);
            drv.htod_pinned(dst + (i * STAGE_BYTES) as u64, &slot.buf.as_slice()[..piece.len()], self.stream)?;
            drv.event_record(ev, self.stream)?;
        }
        self.bytes += data.len() as u64;
        drv.event_record(self.last, self.stream)?;
        drv.stream_wait_event(self.dev.stream(), self.last)
    }

    /// Waits until every queued upload has landed (before device memory it may still be
    /// writing is freed), and surfaces an asynchronous failure.
    pub fn wait(&self) -> Result<(), DriverError> {
        self.dev.driver().stream_sync(self.stream)
    }
}

impl Drop for Stager {
    fn drop(&mut self) {
        let drv = self.dev.driver();
        let _ = drv.stream_sync(self.stream);
        for s in &self.slots {
            if let Some(ev) = s.done {
                let _ = drv.event_destroy(ev);
            }
        }
        let _ = drv.event_destroy(self.last);
        let _ = drv.stream_destroy(self.stream);
        // The staging buffers are freed after this (no copy reads them any more).
    }
}

/// Copy `src` into `dst` (same length) on every core: reading a file mapping is bound by
/// page faults more than by memory bandwidth.
pub fn copy_parallel(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    const PIECE: usize = 2 << 20;
    if src.len() <= PIECE {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(PIECE).zip(src.par_chunks(PIECE)).for_each(|(d, s)| d.copy_from_slice(s));
}
