//! The backend's side of prefill through the vendor BLAS (`prefill_blas.rs`): the
//! library (opened on first use; a missing one is a one-line note and lode's own GEMM
//! serves every prefill), the transient f16 weight slab, the f16 activation operand
//! (made once per input buffer version, shared by q/k/v and gate/up) and the workspace.
//! Weights larger than the slab go through it in row chunks. (Measured and dropped: a
//! second slab decoded on a side stream while the GEMM runs gained ≤ 1 % on the H200.)
//!
//! Graph replay: a step that calls the BLAS is taken out of replay (`barrier`): the
//! GEMM is enqueued outside the step record, so such a step is never captured (prefill
//! chunks are long enough that replay saves nothing there). The workspace is still
//! fixed, so the library never allocates inside a call.

use crate::backend::gpu::family::{dequant, quantize};
use crate::backend::gpu::family::dequant::ActF16;
use super::{derr, err, GpuBackend, Scratch};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::blas::Blas;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::{BackendError, Buf, Result};
use crate::quant::GgmlType;
use crate::weights::layout::{self, Consumer, DeviceClass};
use crate::weights::WeightRef;

/// The BLAS state of a [`GpuBackend`].
#[derive(Default)]
pub(super) struct BlasPrefill {
    /// None: not tried yet; Some(None): unavailable (noted once).
    lib: Option<Option<Blas>>,
    _workspace: Option<DeviceBuffer>,
    slab: Scratch,
    xh: Scratch,
    /// (buffer, version, k, n, form) the f16 operand in `xh` was made from.
    xh_of: Option<(u32, u64, usize, usize, ActF16)>,
}

impl GpuBackend {
    /// Whether a BLAS library is open (opening it on the first call).
    pub(super) fn blas_open(&mut self) -> bool {
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
        match self.dev.alloc(dequant::WORKSPACE_BYTES).map_err(|e| e.to_string()).and_then(|ws| {
            b.set_workspace(ws.ptr(), ws.len()).map_err(|e| e.to_string())?;
            Ok(ws)
        }) {
            Ok(ws) => self.blas._workspace = Some(ws),
            Err(e) => {
                tracing::info!("prefill BLAS workspace not set ({e}); lode's matrix-core GEMM serves prefill");
                return None;
            }
        }
        tracing::info!("prefill BLAS: {}", b.library);
        self.dev.mem_mark("BLAS handle and workspace");
        Some(b)
    }

    /// The partial sums of a split-K GEMM (`Matmul::GemmSplit`, decode batches): the
    /// slab's memory (a matmul takes one path or the other), grown outside the step record.
    pub(super) fn split_part(&mut self, bytes: usize) -> Result<DevPtr> {
        if self.blas.slab.buf.as_ref().map(|b| b.len() < bytes).unwrap_or(true) {
            self.barrier()?;
        }
        self.blas.slab.get(&self.dev, bytes).map_err(derr("matmul"))
    }

    /// The library in use for prefill, if one was opened.
    pub fn blas_library(&self) -> Option<&str> {
        self.blas.lib.as_ref().and_then(|l| l.as_ref()).map(|b| b.library.as_str())
    }

    /// The f16 operand of x for weights of `ty` ([n_tok, k] f16), made unless it is
    /// already there.
    fn blas_act(&mut self, x: Buf, ty: GgmlType, k: usize, n_tok: usize) -> Result<DevPtr> {
        let (xp, _) = self.buf(x)?;
        let form = match quantize::act_fmt(ty) {
            Some(f) => ActF16::Quant(f),
            None => ActF16::Plain,
        };
        let key = (x.0, self.version(x), k, n_tok, form);
        let grown = self.blas.xh.grown;
        let y = self.blas.xh.get(&self.dev, 2 * k * n_tok).map_err(derr("matmul"))?;
        if self.blas.xh_of != Some(key) || self.blas.xh.grown != grown {
            self.blas.xh_of = None;
            dequant::act_f16(&self.rec(), form, xp, y, k, n_tok).map_err(err("matmul"))?;
            self.blas.xh_of = Some(key);
        }
        Ok(y)
    }

    /// y = W·x for `n_tok` tokens through the slab and the BLAS (the plan chose
    /// `Matmul::Blas`, so the library is open). x: [n_tok, k] f32; y: [n_tok, rows] f32.
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
        let bound = self.tuning.blas_slab_bytes;
        let slab = self.blas.slab.get(&self.dev, dequant::slab_bytes_for(rows, k, bound)).map_err(derr("matmul"))?;
        let whole = rows <= dequant::chunk_rows(k, bound);
        let map = |e: crate::backend::gpu::GpuError| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", w.name()) };
        let Some(Some(blas)) = &self.blas.lib else {
            return Err(BackendError::Invalid { op: "matmul", msg: "prefill BLAS used before it was opened".into() });
        };
        let r = if whole {
            dequant::dequant_f16(&self.rec(), wp, ty, lay, 0, rows, k, slab).map_err(map)?;
            blas.gemm_f16_f32(rows, n_tok, k, slab, k, xh, k, yp, rows).map_err(|e| map(e.into()))
        } else {
            dequant::matmul(&self.rec(), blas, wp, ty, lay, rows, k, xh, yp, n_tok, slab, bound).map_err(map)
        };
        self.touch(y);
        r
    }
}
