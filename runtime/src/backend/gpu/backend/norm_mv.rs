//! The GPU backend's fused one-token matvecs (`decode_mv.rs`, `head_mv.rs`,
//! `kernels-hip/decode_mv.hip`): `norm_matmul_multi` and `norm_matmul_glu` as one launch
//! each, a one-token `matmul` whose f32 input has no current quantized form as one launch
//! that quantizes in its prologue, and the long-row split walk. Which of them runs is
//! `plan.rs`'s answer; this file checks the buffers and launches it.
//!
//! No stale quantized scratch can be read: these kernels write only f32 buffers (each
//! touched, so any cached form of it is invalid) and keep their activation blocks in
//! shared memory; `matmul` takes the prologue kernel only when the scratch does not hold
//! the input's current form, and records the form as the input's hint, so a producer that
//! can write that form (a norm) writes it, and one that cannot (attention, for a K-quant
//! output projection) writes none.

use crate::backend::gpu::family::{decode_mv, head_mv, quantize};
use crate::backend::gpu::launch;
use crate::backend::gpu::family::decode_mv::Norm;
use super::probe::{self, Probe};
use super::{derr, GpuBackend};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::plan::{self, NormMv, QuantMv};
use crate::backend::{norm_in, Backend, BackendError, Buf, Glu, NormIn, Result};
use crate::quant::GgmlType;
use crate::weights::WeightRef;

/// The norm kernels' block counter and the launch counts (the selftest checks its ops
/// took the path the plan names).
#[derive(Default)]
pub(super) struct MvFuse {
    /// One zeroed u32 the norm kernels take tickets from (each launch leaves it zeroed).
    counter: Option<DeviceBuffer>,
    launches: u64,
    head_launches: u64,
    walk_launches: u64,
    split_launches: u64,
    half_launches: u64,
}

fn invalid(op: &'static str, names: &[&WeightRef], e: impl std::fmt::Display) -> BackendError {
    let names: Vec<&str> = names.iter().map(|w| w.name()).collect();
    BackendError::Invalid { op, msg: format!("{}: {e}", names.join(", ")) }
}

impl GpuBackend {
    /// The fused one-token matvecs on or off (`Tuning::fuse_mv`).
    pub fn set_fuse_mv(&mut self, on: bool) {
        self.tuning.fuse_mv = on;
    }

    /// How many fused decode matvec launches this backend has issued.
    pub fn fused_mv_launches(&self) -> u64 {
        self.mv.launches
    }

    /// How many norm + row walk launches (`decode_mv::norm_walk`) this backend has issued.
    pub fn walk_launches(&self) -> u64 {
        self.mv.walk_launches
    }

    /// How many split row walk launches (`decode_mv::split_walk`) this backend has issued.
    pub fn split_launches(&self) -> u64 {
        self.mv.split_launches
    }

    /// How many half-warp norm launches (`decode_mv::half_supports`) this backend has issued.
    pub fn half_launches(&self) -> u64 {
        self.mv.half_launches
    }

    /// How many fused LM head launches (`head_mv.rs`) this backend has issued.
    pub fn head_launches(&self) -> u64 {
        self.mv.head_launches
    }

    /// Whether `kernel` over `rows` rows is one wave of blocks here (the plan's rule, with
    /// the driver's occupancy figure).
    pub(crate) fn mv_fits(&mut self, kernel: &'static str, rows: usize) -> bool {
        let mut o = Probe { dev: &self.dev, cache: &mut self.occ };
        let sms = plan::Occupancy::sms(&mut o);
        let per_sm = plan::Occupancy::per_sm(&mut o, kernel, decode_mv::BLOCK, decode_mv::blocks_per_sm(kernel));
        decode_mv::fits_one_wave_at(rows, sms, per_sm)
    }

    fn mv_counter(&mut self) -> Result<DevPtr> {
        if let Some(c) = &self.mv.counter {
            return Ok(c.ptr());
        }
        // Allocating: outside the step record.
        self.barrier()?;
        let c = self.dev.alloc(256).map_err(derr("norm_matmul"))?;
        self.dev.memset(c.ptr(), 0, 256).map_err(derr("norm_matmul"))?;
        let p = c.ptr();
        self.mv.counter = Some(c);
        Ok(p)
    }

    /// The plan's question for a norm in front of `outs`.
    fn norm_query(&mut self, n: &NormIn, n_tok: usize, first: &WeightRef, outs: &[Buf]) -> Result<plan::NormIn> {
        // The LM head's kernel needs a 16-byte aligned weight: only a one-token single
        // matvec asks, and its weight is read right after anyway.
        let w_addr = if n_tok == 1 && outs.len() == 1 { self.weight(first)? } else { 0 };
        Ok(plan::NormIn { n: n.row_len, n_tok, buffers_ok: plan::norm_buffers_ok(n, outs), w_addr })
    }

    /// The kernel's view of `n` (the plan said a norm kernel takes it).
    fn mv_norm(&mut self, n: &NormIn, threads: u32, half: bool) -> Result<Norm> {
        let k = n.row_len;
        let (xp, xn) = self.buf(n.x)?;
        let (op, on) = self.buf(n.out)?;
        Self::check_len("norm_matmul", n.x, xn, k)?;
        Self::check_len("norm_matmul", n.out, on, k)?;
        let add = match n.add {
            Some(b) => {
                let (bp, bn) = self.buf(b)?;
                Self::check_len("norm_matmul", b, bn, k)?;
                Some(bp)
            }
            None => None,
        };
        let w = match n.w {
            Some(w) => Some(self.weight_f32(w)?),
            None => None,
        };
        let counter = self.mv_counter()?;
        if half {
            self.mv.half_launches += 1;
        }
        Ok(Norm { x: xp, add, w, out: op, counter, n: k, eps: n.eps, threads, half })
    }

    /// The norm's writes: x (when added to) and out, and the outputs.
    fn mv_norm_done(&mut self, n: &NormIn, ys: &[Buf]) {
        if n.add.is_some() {
            self.touch(n.x);
        }
        self.touch(n.out);
        for y in ys {
            self.touch(*y);
        }
    }

    /// The launchers' view of `outs`: (weight, type, rows, output) per weight, each output
    /// checked to hold its rows.
    fn mv_segments(&mut self, op: &'static str, outs: &[(&WeightRef, Buf)]) -> Result<Vec<(DevPtr, GgmlType, usize, DevPtr)>> {
        let mut segs = Vec::with_capacity(outs.len());
        for (w, y) in outs {
            let (yp, yn) = self.buf(*y)?;
            Self::check_len(op, *y, yn, w.n_rows())?;
            segs.push((self.weight(w)?, w.ty(), w.n_rows(), yp));
        }
        Ok(segs)
    }

    pub(super) fn fused_norm_matmul_multi(&mut self, norm: &NormIn, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        const OP: &str = "norm_matmul_multi";
        let ws: Vec<&WeightRef> = outs.iter().map(|(w, _)| *w).collect();
        let ys: Vec<Buf> = outs.iter().map(|(_, y)| *y).collect();
        let Some(first) = ws.first() else { return norm_in(self, norm, n_tok) };
        let q = self.norm_query(norm, n_tok, first, &ys)?;
        let pws: Vec<plan::Weight> = ws.iter().map(|w| probe::weight(w)).collect();
        let choice = plan::norm_multi(&q, &pws, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ });
        let r = match choice {
            NormMv::Unfused => {
                norm_in(self, norm, n_tok)?;
                return self.matmul_multi(norm.out, n_tok, outs);
            }
            NormMv::Fused { threads, half } => {
                let a = self.mv_norm(norm, threads, half)?;
                let segs = self.mv_segments(OP, outs)?;
                self.mv.launches += 1;
                decode_mv::norm_multi(&self.rec(), &a, &segs)
            }
            NormMv::Walk { blocks } => {
                let a = self.mv_norm(norm, decode_mv::BLOCK, false)?;
                let segs = self.mv_segments(OP, outs)?;
                self.mv.walk_launches += 1;
                decode_mv::norm_walk(&self.rec(), &a, &segs, blocks)
            }
            NormMv::Head { blocks } => return self.norm_head(norm, first, ys[0], blocks),
        };
        self.mv_norm_done(norm, &ys);
        r.map_err(|e| invalid(OP, &ws, e))
    }

    /// One token's norm and a Q6_K matvec of many rows (the LM head) as one launch
    /// (`head_mv.rs`); a read-back output (the logits) is written straight into its
    /// mapped host memory.
    fn norm_head(&mut self, norm: &NormIn, w: &WeightRef, y: Buf, blocks: usize) -> Result<()> {
        let rows = w.n_rows();
        let wp = self.weight(w)?;
        let a = self.mv_norm(norm, decode_mv::BLOCK, false)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("norm_matmul_multi", y, yn, rows)?;
        let mapped = self.head_out(y);
        self.mv.head_launches += 1;
        let r = head_mv::norm_head(&self.rec(), &a, wp, rows, mapped.unwrap_or(yp), blocks);
        self.mv_norm_done(norm, &[y]);
        if mapped.is_some() {
            self.head_wrote(y);
        }
        r.map_err(|e| invalid("norm_matmul_multi", &[w], e))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_norm_matmul_glu(&mut self, norm: &NormIn, n_tok: usize, gate: &WeightRef, up: &WeightRef, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        let q = plan::NormIn { n: norm.row_len, n_tok, buffers_ok: plan::norm_buffers_ok(norm, &[out, tmp]), w_addr: 0 };
        let (pg, pu) = (probe::weight(gate), probe::weight(up));
        match plan::norm_glu(&q, &pg, &pu, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ }) {
            NormMv::Fused { threads, half } => {
                // The paired kernel writes only `out` (tmp may alias nothing it reads).
                let a = self.mv_norm(norm, threads, half)?;
                let (yp, yn) = self.buf(out)?;
                Self::check_len("norm_matmul_glu", out, yn, gate.n_rows())?;
                let gp = self.weight(gate)?;
                let upp = self.weight(up)?;
                self.mv.launches += 1;
                let r = decode_mv::norm_glu(&self.rec(), &a, gp, upp, gate.ty(), gate.n_rows(), yp, act == Glu::GeluTanh);
                self.mv_norm_done(norm, &[out]);
                r.map_err(|e| invalid("norm_matmul_glu", &[gate, up], e))
            }
            NormMv::Walk { blocks } => {
                let outs = [(gate, out), (up, tmp)];
                let a = self.mv_norm(norm, decode_mv::BLOCK, false)?;
                let segs = self.mv_segments("norm_matmul", &outs)?;
                self.mv.walk_launches += 1;
                let r = decode_mv::norm_walk(&self.rec(), &a, &segs, blocks);
                self.mv_norm_done(norm, &[out, tmp]);
                r.map_err(|e| invalid("norm_matmul", &[gate, up], e))?;
                self.glu(out, tmp, out, gate.n_rows(), act)
            }
            NormMv::Unfused | NormMv::Head { .. } => {
                norm_in(self, norm, n_tok)?;
                self.matmul_glu(gate, up, norm.out, n_tok, out, tmp, act)
            }
        }
    }

    /// `Backend::matmul_residual`: one token, fused, adds the product into the residual in
    /// place (decode_mv_quant's epilogue); otherwise the plain matmul into `y`, left for
    /// the next norm to add.
    pub(super) fn fused_matmul_residual(&mut self, w: &WeightRef, x: Buf, n_tok: usize, residual: Buf, y: Buf) -> Result<bool> {
        let q = self.matmul_query(w, x, n_tok, residual)?;
        if let Some(m) = plan::matmul_residual(&q, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ }) {
            self.run_quant_mv(w, x, residual, true, m)?;
            return Ok(true);
        }
        self.matmul(w, x, n_tok, y)?;
        Ok(false)
    }

    /// The plan's question for a matmul of `x` into `y` (a one-token one asks whether x's
    /// quantized form is current; that records the form as x's hint, as reading it would).
    pub(super) fn matmul_query(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<plan::MatmulIn> {
        let pw = probe::weight(w);
        let blas = plan::blas_candidate(&pw, n_tok, &self.tuning) && self.blas_open();
        let x_ready = match quantize::act_fmt(w.ty()) {
            Some(f) if n_tok == 1 && x != y => self.act_ready(x, f, w.row_len()),
            _ => false,
        };
        Ok(plan::MatmulIn { w: pw, n_tok, blas, x_is_y: x == y, x_ready })
    }

    /// `decode_mv::quant_mv`: y = W x (or y += W x with `acc`), x quantized in the prologue.
    pub(super) fn run_quant_mv(&mut self, w: &WeightRef, x: Buf, y: Buf, acc: bool, m: QuantMv) -> Result<()> {
        let k = w.row_len();
        let (xp, xn) = self.buf(x)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", x, xn, k)?;
        Self::check_len("matmul", y, yn, w.n_rows())?;
        let wp = self.weight(w)?;
        self.mv.launches += 1;
        let r = decode_mv::quant_mv(&self.rec(), xp, k, wp, w.ty(), w.n_rows(), yp, acc, m.wpr, m.rows_per_block, m.two);
        self.touch(y);
        r.map_err(|e| invalid("matmul", &[w], e))
    }

    /// `decode_mv::split_walk`: one warp per step over a resident row walk, reading x's K form.
    pub(super) fn run_split_walk(&mut self, w: &WeightRef, x: Buf, y: Buf, blocks: usize) -> Result<()> {
        let (ty, k, rows) = (w.ty(), w.row_len(), w.n_rows());
        let xk = self.act_blocks(x, launch::ActFmt::K, k, 1, "matmul")?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", y, yn, rows)?;
        let wp = self.weight(w)?;
        self.mv.split_launches += 1;
        let r = decode_mv::split_walk(&self.rec(), xk, k, wp, ty, rows, yp, blocks);
        self.touch(y);
        r.map_err(|e| invalid("matmul", &[w], e))
    }
}
