//! [`Backend::matmul`] on the GPU: the plan's choice for one weight times `n_tok` rows,
//! launched (the BLAS, the fused one-token matvecs, the GEMM — whole or split-K for a
//! decode batch — or the plain matvecs).

use super::probe::Probe;
use super::{GpuBackend, GpuError};
use crate::backend::gpu::family::{gemm, matvec, mmq, quantize};
use crate::backend::gpu::plan::{self, Matmul};
use crate::backend::{BackendError, Buf, Result};
use crate::weights::WeightRef;

impl GpuBackend {
    /// `Backend::matmul`: asks `plan::matmul` and launches its choice.
    pub(super) fn planned_matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        let (k, rows) = (w.row_len(), w.n_rows());
        let (xp, xn) = self.buf(x)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", x, xn, n_tok * k)?;
        Self::check_len("matmul", y, yn, n_tok * rows)?;
        let q = self.matmul_query(w, x, n_tok, y)?;
        let choice = plan::matmul(&q, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ });
        let (ty, lay) = (q.w.ty, q.w.layout);
        let map = |e: GpuError| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", w.name()) };
        let r = match choice {
            Matmul::Blas => return self.blas_matmul(w, x, n_tok, y),
            Matmul::QuantMv(m) => return self.run_quant_mv(w, x, y, false, m),
            Matmul::SplitWalk { blocks, .. } => return self.run_split_walk(w, x, y, blocks),
            Matmul::Gemm { tile } => {
                let wp = self.weight(w)?;
                let xa = match quantize::act_fmt(ty) {
                    Some(f) => self.act_values(x, f, k, n_tok, "matmul")?,
                    None => xp,
                };
                gemm::gemm(&self.rec(), wp, ty, lay, rows, k, xa, yp, n_tok, tile).map_err(map)
            }
            Matmul::GemmSplit { splits, per } => {
                let wp = self.weight(w)?;
                let xa = match quantize::act_fmt(ty) {
                    Some(f) => self.act_values(x, f, k, n_tok, "matmul")?,
                    None => xp,
                };
                let part = self.split_part(gemm::split_bytes(rows, n_tok, splits))?;
                gemm::gemm_split(&self.rec(), wp, ty, lay, rows, k, xa, part, yp, n_tok, splits, per).map_err(map)
            }
            Matmul::Mmq { splits, per, mma } => {
                let wp = self.weight(w)?;
                let f = quantize::act_fmt(ty).ok_or_else(|| map(GpuError::Unsupported(format!("mmq of {ty} weights"))))?;
                let xa = self.act_blocks(x, f, k, n_tok, "matmul")?;
                let part = if splits > 1 { self.split_part(mmq::split_bytes(rows, n_tok, splits))? } else { 0 };
                mmq::mmq(&self.rec(), wp, ty, rows, k, xa, yp, n_tok, splits, per, part, mma).map_err(map)
            }
            Matmul::Matvec | Matmul::FloatTile => {
                let wp = self.weight(w)?;
                let xa = match quantize::act_fmt(ty) {
                    Some(f) => self.act_blocks(x, f, k, n_tok, "matmul")?,
                    None => xp,
                };
                let mv = if choice == Matmul::FloatTile { matvec::float_tile } else { matvec::matvec };
                mv(&self.rec(), wp, ty, rows, k, xa, yp, n_tok).map_err(map)
            }
        };
        self.touch(y);
        r
    }
}
