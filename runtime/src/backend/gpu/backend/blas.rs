//! The backend's side of prefill through the vendor BLAS (`prefill_blas.rs`): the
//! library (opened on first use; a missing one is a one-line note and lode's own GEMM
//! serves every prefill), the transient f16 weight slabs, the f16 activation operand
//! (made once per input buffer version, shared by q/k/v and gate/up) and the workspace.
//!
//! Prefetch: a forward pass uses its weights in the same order chunk after chunk, so the
//! backend learns which weight follows which, and while the GEMM of one weight runs on
//! the stream, a second stream decodes the weight expected next into the other of two
//! slabs (the decode is memory-bound, the GEMM compute-bound, and the GEMM's last wave
//! leaves SMs idle). Events order it: the side stream starts after the main stream has
//! reached the GEMM (so every earlier reader of that slab is done); the main stream waits
//! for the side stream's decode before its GEMM reads it. A wrong guess only wastes the
//! decode (the weight is then decoded on the main stream as without prefetch). Weights
//! larger than one slab go through the main stream in row chunks. Opt-in
//! (`LODE_BLAS_PREFETCH=1`): on the H200 it gained ≤ 1 % (cuBLAS's GEMMs leave the decode
//! little room to run alongside), not worth a second slab.
//!
//! Graph replay: a step that calls the BLAS is taken out of replay (`barrier`): the
//! GEMM and the side stream's work are enqueued outside the step record, so such a step
//! is never captured (prefill chunks are long enough that replay saves nothing there).
//! The workspace is still fixed, so the library never allocates inside a call.

use super::{derr, err, GpuBackend, Scratch};
use crate::backend::gpu::device::{DeviceBuffer, GpuDevice};
use crate::backend::gpu::driver::blas::Blas;
use crate::backend::gpu::driver::{DevPtr, RawHandle};
use crate::backend::gpu::ops;
use crate::backend::gpu::prefill_blas::{self, ActF16, OnStream};
use crate::backend::{BackendError, Buf, Result};
use crate::quant::GgmlType;
use crate::weights::layout::{self, Consumer, DeviceClass, Layout};
use crate::weights::WeightRef;
use std::collections::HashMap;

/// The side stream and its events.
struct Prefetch {
    dev: GpuDevice,
    stream: RawHandle,
    /// Recorded on the side stream after a decode.
    ready: RawHandle,
    /// Recorded on the main stream just before a GEMM.
    go: RawHandle,
}

impl Prefetch {
    fn new(dev: &GpuDevice) -> std::result::Result<Prefetch, crate::backend::gpu::DriverError> {
        let d = dev.driver();
        let stream = d.stream_create()?;
        let ready = d.event_create()?;
        let go = d.event_create()?;
        Ok(Prefetch { dev: dev.clone(), stream, ready, go })
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        let d = self.dev.driver();
        let _ = d.stream_sync(self.stream);
        let _ = d.event_destroy(self.ready);
        let _ = d.event_destroy(self.go);
        let _ = d.stream_destroy(self.stream);
    }
}

/// A weight as the slab decoder needs it.
#[derive(Clone, Copy, Debug, PartialEq)]
struct SlabWeight {
    w: DevPtr,
    ty: GgmlType,
    layout: Layout,
    rows: usize,
    k: usize,
}

/// The BLAS state of a [`GpuBackend`]. (Field order is drop order: the side stream is
/// synchronized before the slabs it writes are freed.)
#[derive(Default)]
pub(super) struct BlasPrefill {
    pf: Option<Prefetch>,
    /// None: not tried yet; Some(None): unavailable (noted once).
    lib: Option<Option<Blas>>,
    _workspace: Option<DeviceBuffer>,
    slabs: [Scratch; 2],
    xh: Scratch,
    /// (buffer, version, k, n, form) the f16 operand in `xh` was made from.
    xh_of: Option<(u32, u64, usize, usize, ActF16)>,
    /// The weight used after each weight (by device address), as last seen.
    next_of: HashMap<DevPtr, SlabWeight>,
    last: Option<DevPtr>,
    /// A decode enqueued on the side stream: (weight address, slab).
    pending: Option<(DevPtr, usize)>,
}

impl GpuBackend {
    /// Whether a matmul of `n_tok` tokens over `w` goes through the BLAS (opening the
    /// library on the first such matmul).
    pub(super) fn blas_wanted(&mut self, w: &WeightRef, n_tok: usize) -> bool {
        let lay = layout::canonical(w.ty(), Consumer::Matrix, DeviceClass::Gpu);
        if !prefill_blas::wanted(w.ty(), lay, n_tok) {
            return false;
        }
        if self.blas.lib.is_none() {
            let opened = self.open_blas();
            self.blas.lib = Some(opened);
        }
        matches!(self.blas.lib, Some(Some(_)))
    }

    fn open_blas(&mut self) -> Option<Blas> {
        // Creating the handle allocates: outside the step record.
        self.barrier().ok()?;
        // Any driver call makes the context current on this thread (the library's runtime
        // then attaches to it).
        let _ = self.dev.mem_info();
        let b = match Blas::open(self.dev.api(), self.dev.stream()) {
            Ok(b) => b,
            Err(e) => {
                tracing::info!("prefill BLAS unavailable ({e}); lode's matrix-core GEMM serves prefill");
                return None;
            }
        };
        match self.dev.alloc(prefill_blas::WORKSPACE_BYTES).map_err(|e| e.to_string()).and_then(|ws| {
            b.set_workspace(ws.ptr(), ws.len()).map_err(|e| e.to_string())?;
            Ok(ws)
        }) {
            Ok(ws) => self.blas._workspace = Some(ws),
            Err(e) => {
                tracing::info!("prefill BLAS workspace not set ({e}); lode's matrix-core GEMM serves prefill");
                return None;
            }
        }
        if prefill_blas::policy().prefetch {
            match Prefetch::new(&self.dev) {
                Ok(p) => self.blas.pf = Some(p),
                Err(e) => tracing::info!("prefill BLAS: no side stream ({e}); weights are decoded on the main stream"),
            }
        }
        tracing::info!("prefill BLAS: {}", b.library);
        self.dev.mem_mark("BLAS handle and workspace");
        Some(b)
    }

    /// The library in use for prefill, if one was opened.
    pub fn blas_library(&self) -> Option<&str> {
        self.blas.lib.as_ref().and_then(|l| l.as_ref()).map(|b| b.library.as_str())
    }

    /// The f16 operand of x for weights of `ty` ([n_tok, k] f16), made unless it is
    /// already there.
    fn blas_act(&mut self, x: Buf, ty: GgmlType, k: usize, n_tok: usize) -> Result<DevPtr> {
        let (xp, _) = self.buf(x)?;
        let form = match ops::act_fmt(ty) {
            Some(f) if !self.act.prefill_f16 => ActF16::Quant(f),
            _ => ActF16::Plain,
        };
        let key = (x.0, self.version(x), k, n_tok, form);
        let grown = self.blas.xh.grown;
        let y = self.blas.xh.get(&self.dev, 2 * k * n_tok).map_err(derr("matmul"))?;
        if self.blas.xh_of != Some(key) || self.blas.xh.grown != grown {
            self.blas.xh_of = None;
            prefill_blas::act_f16(&self.rec(), form, xp, y, k, n_tok).map_err(err("matmul"))?;
            self.blas.xh_of = Some(key);
        }
        Ok(y)
    }

    /// Both slabs at least `bytes` (the side stream drained first if one must grow).
    fn blas_slabs(&mut self, bytes: usize) -> Result<[DevPtr; 2]> {
        let n = if self.blas.pf.is_some() { 2 } else { 1 };
        let short = self.blas.slabs[..n].iter().any(|s| s.buf.as_ref().map(|b| b.len() < bytes).unwrap_or(true));
        if short {
            if let Some(pf) = &self.blas.pf {
                self.dev.driver().stream_sync(pf.stream).map_err(derr("matmul"))?;
            }
            self.blas.pending = None;
        }
        let mut p = [0; 2];
        for (i, s) in self.blas.slabs[..n].iter_mut().enumerate() {
            p[i] = s.get(&self.dev, bytes).map_err(derr("matmul"))?;
        }
        Ok(p)
    }

    /// y = W·x for `n_tok` tokens through a slab and the BLAS (call after
    /// [`Self::blas_wanted`] said yes). x: [n_tok, k] f32; y: [n_tok, rows] f32.
    pub(super) fn blas_matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        let (k, rows, ty) = (w.row_len(), w.n_rows(), w.ty());
        let lay = layout::canonical(ty, Consumer::Matrix, DeviceClass::Gpu);
        let (_, xn) = self.buf(x)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", x, xn, n_tok * k)?;
        Self::check_len("matmul", y, yn, n_tok * rows)?;
        let wp = self.weight(w)?;
        // The GEMM is enqueued outside the step record (module doc).
        self.barrier()?;
        let xh = self.blas_act(x, ty, k, n_tok)?;
        let bound = prefill_blas::policy().slab_bytes;
        let slabs = self.blas_slabs(prefill_blas::slab_bytes_for(rows, k, bound))?;
        let me = SlabWeight { w: wp, ty, layout: lay, rows, k };
        if let Some(prev) = self.blas.last.replace(wp) {
            self.blas.next_of.insert(prev, me);
        }
        let whole = rows <= prefill_blas::chunk_rows(k, bound);
        let map = |e: crate::backend::gpu::GpuError| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", w.name()) };
        let main = self.dev.stream();
        // Which slab this GEMM reads, and whether the side stream already decoded w there.
        let (s, decoded) = match self.blas.pending.take() {
            Some((pw, p)) if pw == wp && whole => (p, true),
            Some((_, p)) => (1 - p, false),
            None => (0, false),
        };
        if decoded {
            if let Some(pf) = &self.blas.pf {
                self.dev.driver().stream_wait_event(main, pf.ready).map_err(derr("matmul"))?;
            }
        } else if whole {
            prefill_blas::dequant_f16(&self.rec(), wp, ty, lay, 0, rows, k, slabs[s]).map_err(map)?;
        }
        // Decode the expected next weight into the other slab while this GEMM runs.
        if let (Some(pf), Some(nx)) = (&self.blas.pf, self.blas.next_of.get(&wp).copied()) {
            let t = 1 - s;
            let fits = nx.rows <= prefill_blas::chunk_rows(nx.k, bound)
                && self.blas.slabs[t].buf.as_ref().is_some_and(|b| b.len() >= prefill_blas::slab_bytes_for(nx.rows, nx.k, bound));
            if fits {
                let d = self.dev.driver();
                d.event_record(pf.go, main).map_err(derr("matmul"))?;
                d.stream_wait_event(pf.stream, pf.go).map_err(derr("matmul"))?;
                prefill_blas::dequant_f16(&OnStream(&self.dev, pf.stream), nx.w, nx.ty, nx.layout, 0, nx.rows, nx.k, slabs[t]).map_err(map)?;
                d.event_record(pf.ready, pf.stream).map_err(derr("matmul"))?;
                self.blas.pending = Some((nx.w, t));
            }
        }
        let Some(Some(blas)) = &self.blas.lib else {
            return Err(BackendError::Invalid { op: "matmul", msg: "prefill BLAS used before it was opened".into() });
        };
        let r = if whole {
            blas.gemm_f16_f32(rows, n_tok, k, slabs[s], k, xh, k, yp, rows).map_err(|e| map(e.into()))
        } else {
            prefill_blas::matmul(&self.rec(), blas, wp, ty, lay, rows, k, xh, yp, n_tok, slabs[s], bound).map_err(map)
        };
        self.touch(y);
        r
    }
}
