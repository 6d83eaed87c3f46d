//! Large reads (a step's logits: rows × vocabulary f32, 19 MiB for 32 rows of Qwen3) go
//! through one page-locked host buffer: a copy from the device into pageable memory is
//! staged by the driver in small pieces and runs several times slower. The buffer grows
//! to the largest read seen and lives as long as the backend. A decode step's logits are
//! lent to the caller straight from it (`read_pinned`: no second copy; through
//! `Backend::read_with`), which is where pinned memory pays. `Tuning::pinned_read` off
//! reads straight into the caller's memory; a failed pinned allocation does too.
//!
//! A buffer the model reads back every step (`Backend::alloc_readback`: the logits) also
//! has page-locked host memory mapped into the device's address space: the fused LM head
//! (`head_mv`, the one-token decode) writes the logits there across the link as it
//! computes them, so the read is a stream sync and a view, with no copy after the step.
//! On the H200 the copy cost a decode token 13 µs plus ~7 µs between the step's last
//! kernel and its start (nsys, `ci/timeline.py`). Every other op writes the buffer's
//! device copy (kernels that store one value per warp would cross the link in 4-byte
//! pieces: the head did so first, 0.6B decode 1,680 t/s against 1,980), which a read then
//! copies into the mapped memory as before. `Tuning::mapped_out` off keeps such buffers on
//! the device only; a refused host allocation does too.

use super::{derr, GpuBackend};
use crate::backend::gpu::device::{DeviceBuffer, GpuDevice, PinnedHost};
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::driver::DriverError;
use crate::backend::{Backend, BackendError, Buf};

/// Where an activation buffer lives.
pub(super) enum ActMem {
    Device(DeviceBuffer),
    /// A read-back buffer: the device copy every op reads and writes, and mapped
    /// page-locked host memory that the fused LM head writes directly; `direct`: the host
    /// memory holds the latest values (the last write was the head's).
    Mapped { dev: DeviceBuffer, host: PinnedHost, direct: bool },
}

impl ActMem {
    /// The device copy (what ops read and write).
    pub(super) fn ptr(&self) -> DevPtr {
        match self {
            ActMem::Device(d) | ActMem::Mapped { dev: d, .. } => d.ptr(),
        }
    }
}


impl GpuBackend {
    /// `Backend::alloc_readback`: a zeroed buffer in mapped page-locked host memory, or
    /// on the device when that is off or refused.
    pub(super) fn alloc_mapped(&mut self, len: usize) -> crate::backend::Result<Buf> {
        if !self.dev.tuning().mapped_out {
            return self.alloc(len);
        }
        let b = self.alloc(len)?;
        let host = match self.dev.host_alloc(len.max(1) * 4) {
            Ok(h) => h,
            Err(e) => {
                tracing::debug!("mapped read-back buffer of {} bytes refused ({e}); keeping it on the device", len * 4);
                return Ok(b);
            }
        };
        if let Some(e) = self.bufs.remove(&b.0) {
            let (ActMem::Device(dev) | ActMem::Mapped { dev, .. }) = e.0;
            // Zeroed like the device copy: nothing has written it yet.
            self.bufs.insert(b.0, (ActMem::Mapped { dev, host, direct: false }, e.1, e.2));
        }
        Ok(b)
    }

    /// The device address the fused LM head writes `buf`'s values to: its mapped host
    /// memory when it has one (then `head_wrote` records the write), else its device copy.
    pub(super) fn head_out(&self, buf: Buf) -> Option<DevPtr> {
        match self.bufs.get(&buf.0) {
            Some((ActMem::Mapped { host, .. }, _, _)) => Some(host.device_ptr),
            _ => None,
        }
    }

    /// The head wrote `buf`'s mapped memory (call after `touch`, which clears it).
    pub(super) fn head_wrote(&mut self, buf: Buf) {
        if let Some((ActMem::Mapped { direct, .. }, _, _)) = self.bufs.get_mut(&buf.0) {
            *direct = true;
        }
    }

    /// The first `n` values of a mapped buffer once the queued work has run (copied from
    /// the device copy first when an op other than the head wrote last); None for a
    /// device buffer. `n` is checked against the buffer by the caller.
    pub(super) fn mapped_view(&mut self, buf: Buf, n: usize) -> crate::backend::Result<Option<&[f32]>> {
        let dev = &self.dev;
        match self.bufs.get_mut(&buf.0) {
            Some((ActMem::Mapped { dev: d, host, direct }, _, _)) => {
                if *direct {
                    dev.sync().map_err(derr("read"))?;
                } else {
                    dev.read(d.ptr(), &mut host.as_mut_slice()[..n * 4]).map_err(derr("read"))?;
                }
                // The driver's page-locked allocations are page-aligned.
                let v: &[f32] = bytemuck::try_cast_slice(host.as_slice()).map_err(|e| BackendError::Invalid { op: "read", msg: e.to_string() })?;
                Ok(Some(&v[..n]))
            }
            Some(_) => Ok(None),
            None => Err(BackendError::BadHandle(buf)),
        }
    }

    /// `Backend::read_with`: the values lent from the page-locked buffer; through the
    /// caller's `host` only when pinned reads are off.
    pub(super) fn read_lent(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> crate::backend::Result<()> {
        let (p, len) = self.buf(buf)?;
        Self::check_len("read", buf, len, n)?;
        self.end_step()?;
        self.retired.clear();
        if let Some(v) = self.mapped_view(buf, n)? {
            f(v);
            return Ok(());
        }
        // The driver's page-locked buffers are page-aligned, so the f32 view always exists.
        match self.readback.read_pinned(&self.dev, p, n * 4).map_err(derr("read"))?.map(bytemuck::try_cast_slice::<u8, f32>) {
            Some(Ok(vals)) => f(vals),
            _ => {
                host.resize(n, 0.0);
                self.readback.read(&self.dev, p, bytemuck::cast_slice_mut(&mut host[..n])).map_err(derr("read"))?;
                f(&host[..n]);
            }
        }
        Ok(())
    }
}

/// Large reads through one page-locked buffer. Reads smaller than `Tuning::pinned_min`
/// (1 MiB) go straight to the caller's memory (one logits row of a small vocabulary,
/// positions, test reads): the extra host copy would cost more than it saves.
pub(super) struct Readback {
    buf: Option<PinnedHost>,
    enabled: bool,
    min_bytes: usize,
}

impl Readback {
    pub(super) fn new(t: &crate::backend::gpu::tuning::Tuning) -> Readback {
        Readback { buf: None, enabled: t.pinned_read, min_bytes: t.pinned_min }
    }

    /// Copy `n` bytes from `src` on the device into the page-locked buffer and lend them
    /// out (no second copy); None when pinned reads are off or the buffer was refused.
    pub(super) fn read_pinned(&mut self, dev: &GpuDevice, src: DevPtr, n: usize) -> Result<Option<&[u8]>, DriverError> {
        if !self.enabled || !self.grow(dev, n) {
            return Ok(None);
        }
        let Some(b) = self.buf.as_mut() else { return Ok(None) };
        let staged = &mut b.as_mut_slice()[..n];
        dev.read(src, staged)?;
        Ok(Some(&*staged))
    }

    /// The pinned buffer holds at least `n` bytes (false: refused, pinned reads now off).
    fn grow(&mut self, dev: &GpuDevice, n: usize) -> bool {
        if self.buf.as_ref().is_some_and(|b| b.len() >= n) {
            return true;
        }
        self.buf = None;
        match dev.host_alloc(n.next_power_of_two()) {
            Ok(b) => {
                self.buf = Some(b);
                true
            }
            Err(e) => {
                tracing::debug!("pinned read-back buffer of {n} bytes refused ({e}); reading into pageable memory");
                self.enabled = false;
                false
            }
        }
    }

    /// Copy `dst.len()` bytes from `src` on the device into `dst` (the stream is synchronized).
    pub(super) fn read(&mut self, dev: &GpuDevice, src: DevPtr, dst: &mut [u8]) -> Result<(), DriverError> {
        let n = dst.len();
        if !self.enabled || n < self.min_bytes {
            return dev.read(src, dst);
        }
        if !self.grow(dev, n) {
            return dev.read(src, dst);
        }
        let Some(b) = self.buf.as_mut() else { return dev.read(src, dst) };
        let staged = &mut b.as_mut_slice()[..n];
        dev.read(src, staged)?;
        dst.copy_from_slice(staged);
        Ok(())
    }
}
