//! `GpuBackend`'s ops under `--numerics exact` (see `gpu::exact`): each op the CPU
//! backend's arithmetic. Fused ops run as the trait's unfused compositions, which is
//! what the CPU backend runs (its `matmul_multi` converts the input once, with the same
//! bytes and per-row sums as separate matmuls). Copies and the K/V store (f32 → f16 to
//! nearest even) are bit operations and stay the fast path's.

use crate::backend::gpu::family::elementwise;
use super::staging::Scratch;
use super::{err, GpuBackend};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::exact::{self, order::ExactType};
use crate::backend::gpu::family::{exact_matmul, exact_ops};
use crate::backend::{Attention, BackendError, Buf, Glu, KvCache, Result, Rope, RopeMode};
use crate::quant::GgmlType;
use crate::weights::{Layout, WeightRef};

/// Device state of the exact path: activation blocks, attention scores, the GELU table.
#[derive(Default)]
pub(super) struct ExactState {
    act: Scratch,
    scores: Scratch,
    gelu: Option<DeviceBuffer>,
    /// RoPE tables by parameters: (key, rows of positions it covers, device table).
    rope: Vec<(exact::tables::RopeKey, usize, DeviceBuffer)>,
    threads: usize,
    /// [`crate::backend::Backend::round_rows_as_decode`]: every row of a chunk in the
    /// one-token orders (matmul order of one token, one-row attention).
    rowwise: bool,
}

fn invalid(op: &'static str, msg: String) -> BackendError {
    BackendError::Invalid { op, msg }
}

impl GpuBackend {
    pub(super) fn set_exact_rowwise(&mut self, on: bool) {
        self.exact.rowwise = on;
    }

    /// A scratch region of at least `bytes` (the old one retired until the step ends).
    fn exact_scratch(&mut self, which: u8, bytes: usize) -> Result<DevPtr> {
        let s = if which == 0 { &self.exact.act } else { &self.exact.scores };
        if s.buf.as_ref().map(|b| b.len() >= bytes).unwrap_or(false) {
            return Ok(s.buf.as_ref().map(|b| b.ptr()).unwrap_or(0));
        }
        self.barrier()?;
        let s = if which == 0 { &mut self.exact.act } else { &mut self.exact.scores };
        if let Some(old) = s.buf.take() {
            self.retired.push(old);
        }
        let s = if which == 0 { &mut self.exact.act } else { &mut self.exact.scores };
        s.get(&self.dev, bytes.max(256)).map_err(super::derr("exact scratch"))
    }

    pub(super) fn exact_get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        let k = w.row_len();
        let (o, n) = self.buf(out)?;
        Self::check_len("get_rows", out, n, ids.len() * k)?;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= w.n_rows()) {
            return Err(invalid("get_rows", format!("row {bad} of `{}` which has {} rows", w.name(), w.n_rows())));
        }
        let ty = match w.ty() {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q8_0 => 2,
            // Every other type (Qwen3's Q6_K and Llama's Q4_K embeddings in Q4_K_M files): the
            // rows dequantized on the host by the CPU backend's own code.
            _ => return self.exact_get_rows_host(w, ids, out, k),
        };
        let wp = self.cached(w, Layout::Stored)?;
        let idp = self.stage_bytes(bytemuck::cast_slice(ids))?;
        let r = exact_matmul::get_rows(&self.rec(), ty, wp, idp, o, k, ids.len()).map_err(err("get_rows"));
        self.touch(out);
        r
    }

    /// `get_rows` of a type without an exact GPU kernel: `quant::dequantize` (what the CPU
    /// backend's get_rows runs, so the rows are its own bit for bit) on the host, then
    /// written into `out` (a few KB per decode token; exact mode replays no graphs).
    fn exact_get_rows_host(&mut self, w: &WeightRef, ids: &[u32], out: Buf, k: usize) -> Result<()> {
        let rb = w.row_bytes();
        let mut rows = vec![0f32; ids.len() * k];
        for (row, &id) in rows.chunks_exact_mut(k).zip(ids) {
            let at = id as usize * rb;
            let src = w.data().get(at..at + rb).ok_or_else(|| invalid("get_rows", format!("row {id} of `{}` lies past its data", w.name())))?;
            crate::quant::dequantize(w.ty(), src, row).map_err(|e| invalid("get_rows", format!("`{}`: {e}", w.name())))?;
        }
        crate::backend::Backend::write(self, out, &rows)
    }

    pub(super) fn exact_matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        let (k, rows) = (w.row_len(), w.n_rows());
        let (xp, xn) = self.buf(x)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", x, xn, n_tok * k)?;
        Self::check_len("matmul", y, yn, n_tok * rows)?;
        if x == y {
            return Err(invalid("matmul", "input and output must be different buffers".into()));
        }
        let Some(ty) = ExactType::of(w.ty()) else {
            return Err(invalid("matmul", format!("exact numerics: weights of type {} (`{}`) are not implemented", w.ty(), w.name())));
        };
        let wp = self.cached(w, Layout::Stored)?;
        let q = self.exact_scratch(0, exact_matmul::act_bytes(ty, k, n_tok))?;
        let map = |e| invalid("matmul", format!("{}: {e}", w.name()));
        exact_matmul::quantize(&self.rec(), ty, xp, q, k, n_tok).map_err(map)?;
        let order = ty.order(if self.exact.rowwise { 1 } else { n_tok });
        let r = exact_matmul::matmul_in_order(&self.rec(), ty, wp, q, yp, rows, k, n_tok, order).map_err(map);
        self.touch(y);
        r
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn exact_matmul_glu(&mut self, gate: &WeightRef, up: &WeightRef, x: Buf, n_tok: usize, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        self.exact_matmul(gate, x, n_tok, out)?;
        self.exact_matmul(up, x, n_tok, tmp)?;
        self.exact_glu(out, tmp, out, n_tok * gate.n_rows(), act)
    }

    pub(super) fn exact_rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("rms_norm", x, xn, n_rows * row_len)?;
        Self::check_len("rms_norm", out, on, n_rows * row_len)?;
        let wp = match w {
            Some(w) if w.row_len() * w.n_rows() != row_len => {
                return Err(invalid("rms_norm", format!("weight `{}` has {} values, rows have {row_len}", w.name(), w.row_len() * w.n_rows())));
            }
            Some(w) => self.weight_f32(w)?,
            None => 0,
        };
        let r = exact_ops::rmsnorm(&self.rec(), xp, (wp != 0).then_some(wp), op, n_rows, row_len, eps).map_err(err("rms_norm"));
        self.touch(out);
        r
    }

    pub(super) fn exact_rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        Self::check_len("rope", x, xn, pos.len() * n_head * head_dim)?;
        if rope.n_rot > head_dim || rope.n_rot % 2 != 0 {
            return Err(invalid("rope", format!("n_rot {} with head_dim {head_dim}", rope.n_rot)));
        }
        // One table per parameter set, indexed by position, grown (and uploaded) only when a
        // position passes its end: no host copy per call.
        let key = exact::tables::rope_key(rope);
        let need = pos.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        let at = self.exact.rope.iter().position(|e| e.0 == key);
        let (cap, tp) = match at.map(|i| &self.exact.rope[i]) {
            Some((_, cap, buf)) if *cap >= need => (*cap, buf.ptr()),
            _ => {
                let cap = need.next_power_of_two().max(1024);
                let table = exact::tables::rope_table(cap, rope).map_err(|source| BackendError::Quant { op: "rope", weight: "rope_freqs".into(), source })?;
                self.barrier()?;
                let buf = self.dev.upload(bytemuck::cast_slice(&table)).map_err(super::derr("rope"))?;
                let ptr = buf.ptr();
                match at {
                    Some(i) => {
                        let old = std::mem::replace(&mut self.exact.rope[i], (key, cap, buf));
                        self.retired.push(old.2);
                    }
                    None => self.exact.rope.push((key, cap, buf)),
                }
                (cap, ptr)
            }
        };
        let pp = self.positions(pos)?;
        let r = exact_ops::rope(&self.rec(), xp, tp, pp, cap, pos.len(), n_head, head_dim, rope.n_rot, rope.mode == RopeMode::Neox).map_err(err("rope"));
        self.touch(x);
        r
    }

    pub(super) fn exact_add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        let (ap, an) = self.buf(a)?;
        let (bp, bn) = self.buf(b)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("add", a, an, n)?;
        Self::check_len("add", b, bn, n)?;
        Self::check_len("add", out, on, n)?;
        let r = exact_ops::add(&self.rec(), ap, bp, op, n).map_err(err("add"));
        self.touch(out);
        r
    }

    pub(super) fn exact_scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        Self::check_len("scale", x, xn, n)?;
        let r = exact_ops::scale(&self.rec(), xp, n, s).map_err(err("scale"));
        self.touch(x);
        r
    }

    pub(super) fn exact_add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        let n = bias.row_len() * bias.n_rows();
        let (xp, xn) = self.buf(x)?;
        Self::check_len("add_bias", x, xn, n_tok * n)?;
        let bp = self.weight_f32(bias)?;
        for t in 0..n_tok {
            let row = xp + (t * n * 4) as u64;
            exact_ops::add(&self.rec(), row, bp, row, n).map_err(err("add_bias"))?;
        }
        self.touch(x);
        Ok(())
    }

    pub(super) fn exact_glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        let (gp, gn) = self.buf(gate)?;
        let (upp, un) = self.buf(up)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("glu", gate, gn, n)?;
        Self::check_len("glu", up, un, n)?;
        Self::check_len("glu", out, on, n)?;
        let table = match act {
            Glu::Silu => None,
            Glu::GeluTanh => {
                if self.exact.gelu.is_none() {
                    self.barrier()?;
                    let t = exact::tables::gelu_table();
                    self.exact.gelu = Some(self.dev.upload(bytemuck::cast_slice(&t)).map_err(super::derr("glu"))?);
                }
                self.exact.gelu.as_ref().map(|b| b.ptr())
            }
        };
        let r = exact_ops::glu(&self.rec(), gp, upp, op, n, table).map_err(err("glu"));
        self.touch(out);
        r
    }

    /// The attention of rows `t0..t0 + n` of `q` (positions staged at `pp`) over one
    /// cache, into the same rows of `out`.
    #[allow(clippy::too_many_arguments)]
    fn exact_attend(&mut self, q: DevPtr, kv: KvCache, layer: usize, pos: &[u32], pp: DevPtr, p: &Attention, out: DevPtr) -> Result<()> {
        self.kv_visible("attention", kv, layer, pos, p.window)?;
        let (kc, vc, spec) = self.kv_layer("attention", kv, layer)?;
        if p.head_dim_k != p.head_dim_v || p.n_kv_head != spec.n_kv_head || p.head_dim_k != spec.head_dim_k {
            return Err(invalid("attention", "attention shape differs from the KV cache's".into()));
        }
        if let Some(&bad) = pos.iter().find(|&&x| x as usize >= spec.n_ctx) {
            return Err(invalid("attention", format!("position {bad} outside the cache ({} slots)", spec.n_ctx)));
        }
        let stride = pos.iter().map(|&x| x as usize + 1).max().unwrap_or(1);
        if self.exact.threads == 0 {
            self.exact.threads = exact::threads(self.dev.tuning());
        }
        let (mode, chunk) = exact::order::attention_mode(pos.len(), pos.last().copied().unwrap_or(0) as usize, self.exact.threads);
        let scores = self.exact_scratch(1, pos.len() * p.n_head * stride * 4)?;
        let a = exact_ops::AttnArgs {
            q,
            kc,
            vc,
            out,
            pos: pp,
            scores,
            n_head: p.n_head,
            n_kv_head: p.n_kv_head,
            head_dim: p.head_dim_k,
            stride,
            window: p.window.unwrap_or(0),
            scale: p.scale,
            mode,
            chunk,
        };
        exact_ops::attention(&self.rec(), pos.len(), &a).map_err(err("attention"))
    }

    pub(super) fn exact_attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        if let Some(s) = &p.sinks {
            return Err(invalid("attention", format!("attention sinks (`{}`) are not supported by the exact kernels yet", s.name())));
        }
        if q == out {
            return Err(invalid("attention", "q and out must be different buffers".into()));
        }
        let (qp, qn) = self.buf(q)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("attention", q, qn, pos.len() * p.n_head * p.head_dim_k)?;
        Self::check_len("attention", out, on, pos.len() * p.n_head * p.head_dim_v)?;
        let pp = self.positions(pos)?;
        let r = if self.exact.rowwise && pos.len() > 1 {
            // Each row as a one-row call (the decode step's mode and key split).
            let (qd, ad) = ((p.n_head * p.head_dim_k) as u64 * 4, (p.n_head * p.head_dim_v) as u64 * 4);
            (0..pos.len()).try_for_each(|t| {
                let t64 = t as u64;
                self.exact_attend(qp + t64 * qd, kv, layer, &pos[t..t + 1], pp + t64 * 4, p, op + t64 * ad)
            })
        } else {
            self.exact_attend(qp, kv, layer, pos, pp, p, op)
        };
        self.touch(out);
        r
    }

    /// The trait's default `attention_rows` (what the CPU backend runs): per row, its K/V
    /// stored in its own cache, then one-row attention over that cache.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn exact_attention_rows(&mut self, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        let n = pos.len();
        let super::rows::RowsOperands { qp, kp, vp, op, qd, ad, rk, rv } = self.rows_operands(q, k, v, out, kvs, n, p)?;
        let pp = self.positions(pos)?;
        for (t, &kv) in kvs.iter().enumerate() {
            self.kv_room("attention_rows", kv, layer, &pos[t..t + 1])?;
            let (kc, vc, s) = self.kv_layer("attention_rows", kv, layer)?;
            if pos[t] as usize >= s.n_ctx || s.n_kv_head * s.head_dim_k != rk {
                return Err(invalid("attention_rows", format!("row {t}: position {} or shape does not fit its cache", pos[t])));
            }
            let (t4, pt) = (t as u64 * 4, pp + t as u64 * 4);
            elementwise::kv_store(&self.rec(), kp + t4 * rk as u64, vp + t4 * rv as u64, kc, vc, rk, rv, pt, 1).map_err(err("kv_write"))?;
            self.exact_attend(qp + t4 * qd as u64, kv, layer, &pos[t..t + 1], pt, p, op + t4 * ad as u64)?;
        }
        self.touch(out);
        Ok(())
    }
}
