//! The GPU backend's fused decode ops (the `Backend` trait's `matmul_multi`,
//! `add_rms_norm`, `rope_kv_write`): one launch where the trait's defaults issue several.
//! Each runs unfused where `plan.rs` says so (`Tuning::fuse` off, or a shape that does
//! not fit).

use crate::backend::gpu::family::{matvec, norm_rope, quantize};
use crate::backend::gpu::launch;
use super::probe::{self, Probe};
use super::{err, GpuBackend};
use crate::backend::gpu::plan::{self, Multi};
use crate::backend::{Backend, BackendError, Buf, KvCache, QkvPrep, Result};
use crate::weights::WeightRef;

impl GpuBackend {
    pub(super) fn fused_matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        let k = outs.first().map(|(w, _)| w.row_len()).unwrap_or(0);
        let pws: Vec<plan::Weight> = outs.iter().map(|(w, _)| probe::weight(w)).collect();
        let choice = plan::matmul_multi(&pws, n_tok, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ });
        if choice == Multi::Each {
            for (w, y) in outs {
                self.matmul(w, x, n_tok, *y)?;
            }
            return Ok(());
        }
        let (_, xn) = self.buf(x)?;
        Self::check_len("matmul", x, xn, k)?;
        let mut segs = Vec::with_capacity(outs.len());
        for (w, y) in outs {
            let (yp, yn) = self.buf(*y)?;
            Self::check_len("matmul", *y, yn, w.n_rows())?;
            let wp = self.weight(w)?;
            segs.push((wp, w.ty(), w.n_rows(), yp));
        }
        // The forms the weights read (q8_1 and / or K); the K form last, so that it is the
        // producer's hint when both are read.
        let mut xq = [0, 0];
        for fmt in [launch::ActFmt::Q8_1, launch::ActFmt::K] {
            if outs.iter().any(|(w, _)| quantize::act_fmt(w.ty()) == Some(fmt)) {
                xq[(fmt == launch::ActFmt::K) as usize] = self.act_blocks(x, fmt, k, 1, "matmul")?;
            }
        }
        let names: Vec<&str> = outs.iter().map(|(w, _)| w.name()).collect();
        let r = match choice {
            Multi::Q4kLoop { blocks } => matvec::matvec_q4k_loop(&self.rec(), xq[1], k, &segs, blocks),
            _ => matvec::matvec_multi(&self.rec(), xq[0], xq[1], k, &segs),
        };
        r.map_err(|e| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", names.join(", ")) })?;
        for (_, y) in outs {
            self.touch(*y);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_add_rms_norm(&mut self, x: Buf, b: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        if !plan::add_rms_norm(row_len, out == x || out == b, &self.tuning) {
            self.add(x, b, x, n_rows * row_len)?;
            return self.rms_norm(x, out, n_rows, row_len, w, eps);
        }
        let n = n_rows * row_len;
        let (xp, xn) = self.buf(x)?;
        let (bp, bn) = self.buf(b)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("add_rms_norm", x, xn, n)?;
        Self::check_len("add_rms_norm", b, bn, n)?;
        Self::check_len("add_rms_norm", out, on, n)?;
        let wp = match w {
            Some(w) => {
                if w.row_len() * w.n_rows() != row_len {
                    return Err(BackendError::Invalid { op: "add_rms_norm", msg: format!("weight `{}` has {} values, rows have {row_len}", w.name(), w.row_len() * w.n_rows()) });
                }
                Some(self.weight_f32(w)?)
            }
            None => None,
        };
        let (fmt, _, q) = self.act_producer(out, Some(row_len), n, "add_rms_norm")?;
        norm_rope::add_rmsnorm_q8(&self.rec(), xp, bp, wp, op, q, n_rows, row_len, eps, fmt).map_err(err("add_rms_norm"))?;
        self.touch(x);
        self.touch(out);
        self.act_produced(out, fmt, row_len, n);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_rope_kv_write(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep) -> Result<()> {
        let spec = self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?.spec;
        let norm_ok = |w: &Option<WeightRef>| w.as_ref().map(|w| w.row_len() * w.n_rows() == p.head_dim).unwrap_or(true);
        let shape = plan::QkvShape::of(p, &spec, norm_ok(&p.q_norm) && norm_ok(&p.k_norm) && q != k && q != v);
        if !plan::rope_kv(&shape, &self.tuning) {
            return crate::backend::rope_kv_write_unfused(self, q, k, v, kv, layer, pos, p);
        }
        let n = pos.len();
        let (qp, qn) = self.buf(q)?;
        let (kp, kn) = self.buf(k)?;
        let (vp, vn) = self.buf(v)?;
        Self::check_len("rope_kv_write", q, qn, n * p.n_head * p.head_dim)?;
        Self::check_len("rope_kv_write", k, kn, n * p.n_kv_head * p.head_dim)?;
        Self::check_len("rope_kv_write", v, vn, n * p.n_kv_head * p.head_dim)?;
        if let Some(&bad) = pos.iter().find(|&&x| x as usize >= spec.n_ctx) {
            return Err(BackendError::Invalid { op: "rope_kv_write", msg: format!("position {bad} past the cache's {} slots", spec.n_ctx) });
        }
        self.kv_room("rope_kv_write", kv, layer, pos)?;
        let (kc, vc, spec) = self.kv_layer("rope_kv_write", kv, layer)?;
        let qw = p.q_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let kw = p.k_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let ff = self.rope_factors(&p.rope)?;
        let pp = self.positions(pos)?;
        let a = norm_rope::RopeKv::new(n, p);
        norm_rope::rope_kv_typed(&self.rec(), qp, kp, vp, kc, vc, qw, kw, pp, ff, &a, spec.ty).map_err(err("rope_kv_write"))?;
        self.touch(q);
        self.touch(k);
        Ok(())
    }
}
