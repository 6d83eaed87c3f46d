//! The GPU backend's fused decode matvecs (`decode_mv.rs`, `kernels-hip/decode_mv.hip`):
//! `norm_matmul_multi` and `norm_matmul_glu` as one launch each, and a one-token `matmul`
//! whose f32 input has no valid quantized form yet as one launch that quantizes in its
//! prologue. Batch 1, `--numerics fast`, `LODE_FUSE` and `LODE_FUSE_MV` on (either `=0`
//! turns it off), a launch of one wave of blocks (`decode_mv::fits_one_wave`: the small
//! models); every other case, shape or type takes the trait's default composition —
//! except a one-token `norm_matmul_multi` with one Q6_K weight too large for one wave (the
//! LM head): that runs as `head_mv.rs`'s one launch (`LODE_HEAD=0` off).
//!
//! No stale quantized scratch can be read: these kernels write only f32 buffers (each
//! touched, so any cached form of it is invalid) and keep their activation blocks in
//! shared memory; `matmul` takes the fused path only when the scratch does not hold the
//! input's current form, and records the form as the input's hint, so a producer that
//! can write that form (a norm) writes it, and one that cannot (attention, for a K-quant
//! output projection) writes none.

use super::{derr, GpuBackend};
use crate::backend::gpu::decode_mv::{self, Norm};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::head_mv;
use crate::backend::gpu::ops;
use crate::backend::{norm_in, Backend, BackendError, Buf, Glu, NormIn, Result};
use crate::weights::WeightRef;

/// `LODE_FUSE_MV` and the norm kernels' block counter.
pub(super) struct MvFuse {
    pub(super) on: bool,
    /// One zeroed u32 the norm kernels take tickets from (each launch leaves it zeroed).
    counter: Option<DeviceBuffer>,
    /// Fused launches issued (the selftest checks its ops took the fused path).
    launches: u64,
    /// `LODE_HEAD` (default on): the fused LM head (`head_mv.rs`) for a one-token
    /// `norm_matmul_multi` too large for one wave; and its launches.
    head: bool,
    head_launches: u64,
    /// The device's multiprocessors (the launches' block cap), read once.
    sms: Option<usize>,
    /// Blocks per multiprocessor of each kernel, from the driver's occupancy calculator
    /// (else `decode_mv::blocks_per_sm`'s sm_90 figures), read once per kernel and block size.
    per_sm: Vec<(&'static str, u32, usize)>,
    /// `LODE_MV_SPLIT` (default on): `decode_mv_quant` gives a row of 2–4 steps one warp
    /// per step (`decode_mv::quant_warps_per_row`).
    pub(super) split: bool,
    /// `LODE_MV_WIDE` (see `norm_threads`): (the wide q/k/v kernel, the wide gate/up one).
    pub(super) wide: (bool, bool),
    /// `LODE_MV_LOOP` (default on): many-wave Q4_K `matvec_multi`s as a resident row walk.
    pub(super) row_loop: bool,
    /// `LODE_MV_NORMWALK` (default on): a one-token norm and many-wave Q4_K matvecs as one
    /// resident launch (`decode_mv::norm_walk`); and its launches.
    walk: bool,
    walk_launches: u64,
    /// `LODE_MV_SPLITWALK` (default on): a one-token matmul of long K-quant rows whose
    /// input has its K form as one warp per step over a resident row walk
    /// (`decode_mv::split_walk`); and its launches.
    split_walk: bool,
    split_launches: u64,
    /// `LODE_MV_HALF` (default on): the wide kernels' half-warp form for Q4_K rows of at
    /// most 1024 values (`decode_mv::half_supports`); and its launches.
    half: bool,
    half_launches: u64,
    /// `LODE_MV_QUANT_ROWS` (8, 16 or 32; default 16): rows per `decode_mv_quant` block,
    /// as many as fit 32 warps. Fewer, larger blocks leave more multiprocessors empty for
    /// the next kernel's one-per-SM blocks to start on during this one (H200, Qwen3-0.6B
    /// tg128: 16 rows 1,955–1,993 t/s, 8 rows 1,920–1,944, 32 rows 1,952–1,960).
    quant_rows: usize,
    /// `LODE_MV_QUANT2` (default on): `decode_mv_quant2` for Q4_K rows of two or more steps
    /// one warp per row (`decode_mv::takes_two`).
    pub(super) quant2: bool,
}

impl MvFuse {
    pub(super) fn from_env() -> MvFuse {
        // A switch that is on unless the variable is "0".
        let on = |name: &str| std::env::var(name).map(|v| v != "0").unwrap_or(true);
        MvFuse {
            on: on("LODE_FUSE_MV"),
            counter: None,
            launches: 0,
            head: on("LODE_HEAD"),
            head_launches: 0,
            sms: None,
            per_sm: Vec::new(),
            split: on("LODE_MV_SPLIT"),
            wide: match std::env::var("LODE_MV_WIDE").as_deref() {
                Ok("0") => (false, false),
                Ok("norm") => (true, false),
                _ => (true, true),
            },
            row_loop: on("LODE_MV_LOOP"),
            walk: on("LODE_MV_NORMWALK"),
            walk_launches: 0,
            split_walk: on("LODE_MV_SPLITWALK"),
            split_launches: 0,
            quant_rows: std::env::var("LODE_MV_QUANT_ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(16),
            half: on("LODE_MV_HALF"),
            half_launches: 0,
            quant2: on("LODE_MV_QUANT2"),
        }
    }
}

impl GpuBackend {
    /// The fused decode matvecs on or off (as `LODE_FUSE_MV` sets it at start).
    pub fn set_fuse_mv(&mut self, on: bool) {
        self.mv.on = on;
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

    /// Whether the half-warp norm kernels are on (`LODE_MV_HALF`, with the wide ones).
    pub fn half_enabled(&self) -> bool {
        self.mv.half && self.mv.wide.0 && self.mv.wide.1
    }

    /// Take the half-warp kernel for a wide launch over weights of these types.
    fn mv_half(&mut self, a: &mut Norm, tys: &[crate::quant::GgmlType]) {
        if self.mv.half && a.threads == decode_mv::WIDE && decode_mv::half_supports(a.n, tys) {
            a.half = true;
            self.mv.half_launches += 1;
        }
    }

    /// How many fused LM head launches (`head_mv.rs`) this backend has issued.
    pub fn head_launches(&self) -> u64 {
        self.mv.head_launches
    }

    /// Whether the fused decode matvecs may run (batch 1 is checked by the callers).
    fn mv_enabled(&self) -> bool {
        self.fuse && self.mv.on && self.numerics == super::Numerics::Fast
    }

    pub(super) fn mv_sms(&mut self) -> usize {
        if let Some(n) = self.mv.sms {
            return n;
        }
        let n = self.dev.attribute(crate::backend::gpu::driver::DevAttr::MultiprocessorCount).ok().filter(|&n| n > 0).unwrap_or(32) as usize;
        self.mv.sms = Some(n);
        n
    }

    /// Whether `kernel` over `rows` rows is one wave of blocks here (`decode_mv::fits_one_wave`,
    /// with the compiled kernel's occupancy as the driver reports it: a kernel whose
    /// register count grows is then never launched in two waves by mistake).
    pub(crate) fn mv_fits(&mut self, kernel: &'static str, rows: usize) -> bool {
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm(kernel, decode_mv::BLOCK, || decode_mv::blocks_per_sm(kernel));
        decode_mv::fits_one_wave_at(rows, sms, per_sm)
    }

    /// Blocks of the resident Q4_K row walk (`ops::matvec_q4k_loop`) for a one-token
    /// `matvec_multi` of these segments: taken when they qualify and the plain kernel
    /// (4 rows per 128-thread block) would run more than one wave; `LODE_MV_LOOP=0`: never.
    pub(super) fn q4k_loop_blocks(&mut self, k: usize, segs: &[(DevPtr, crate::quant::GgmlType, usize, DevPtr)]) -> Option<usize> {
        if !self.mv.row_loop || !ops::q4k_loop_supports(k, segs) {
            return None;
        }
        let sms = self.mv_sms();
        let plain = self.mv_per_sm("matvec_multi4_n1", 128, || 8);
        let rows: usize = segs.iter().map(|s| s.2).sum();
        if rows.div_ceil(4) <= sms * plain {
            return None;
        }
        let per_sm = self.mv_per_sm("matvec_q4k_loop_n1", 128, || 6);
        (per_sm > 0).then_some(sms * per_sm)
    }

    /// Threads per block of a fused norm launch over segments of `rows` rows of `n`: the
    /// wide kernel (`decode_mv::wide_kernel`) when it exists, is switched on
    /// (`LODE_MV_WIDE`: both kernels by default, `norm` the q/k/v one only, `0` neither) and
    /// its blocks fit one wave; else 256.
    fn norm_threads(&mut self, n: usize, glu: bool, rows: &[usize]) -> u32 {
        let on = if glu { self.mv.wide.1 } else { self.mv.wide.0 };
        let Some(kernel) = decode_mv::wide_kernel(n, glu).filter(|_| on) else { return decode_mv::BLOCK };
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm(kernel, decode_mv::WIDE, || 1);
        let blocks: usize = rows.iter().map(|r| r.div_ceil(decode_mv::WIDE as usize / 32)).sum();
        if blocks <= sms * per_sm {
            decode_mv::WIDE
        } else {
            decode_mv::BLOCK
        }
    }

    /// Warps per row for a `decode_mv_quant` launch (`decode_mv::quant_warps_per_row`) when
    /// its larger blocks still fit one wave, else 1; `LODE_MV_SPLIT=0`: always 1.
    fn quant_wpr(&mut self, ty: crate::quant::GgmlType, k: usize, rows: usize) -> usize {
        let wpr = decode_mv::quant_warps_per_row(ty, k);
        if wpr == 1 || !self.mv.split {
            return 1;
        }
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm("decode_mv_quant", decode_mv::BLOCK * wpr as u32, || 4 / wpr);
        if decode_mv::fits_one_wave_at(rows, sms, per_sm) {
            wpr
        } else {
            1
        }
    }

    /// Resident blocks of `block` threads of `kernel` per multiprocessor (the driver's
    /// figure, else `fallback`), read once per kernel and block size.
    pub(super) fn mv_per_sm(&mut self, kernel: &'static str, block: u32, fallback: impl FnOnce() -> usize) -> usize {
        match self.mv.per_sm.iter().find(|(k, b, _)| *k == kernel && *b == block) {
            Some(&(_, _, n)) => n,
            None => {
                let n = self.dev.max_active_blocks(kernel, block).map(|n| n as usize).unwrap_or_else(fallback);
                tracing::debug!("{kernel}: {n} blocks of {block} threads per multiprocessor");
                self.mv.per_sm.push((kernel, block, n));
                n
            }
        }
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

    /// The kernel's view of `n` when it can run fused with weights `ws` (all rows of
    /// `n.row_len`) writing `outs`: None for a shape, type or aliasing it does not take.
    fn mv_norm(&mut self, n: &NormIn, ws: &[&WeightRef], outs: &[Buf]) -> Result<Option<Norm>> {
        let k = n.row_len;
        let shape_ok = k <= decode_mv::NORM_MAX && ws.iter().all(|w| w.row_len() == k && decode_mv::supports(w.ty(), k));
        let w_ok = n.w.map(|w| w.row_len() * w.n_rows() == k).unwrap_or(true);
        // The kernel reads x and add in every block and writes x, out and the outputs:
        // none of those may be one buffer.
        let mut seen = vec![n.x, n.out];
        seen.extend(n.add);
        seen.extend_from_slice(outs);
        let distinct = seen.iter().enumerate().all(|(i, a)| !seen[..i].contains(a));
        if !(shape_ok && w_ok && distinct) {
            return Ok(None);
        }
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
        Ok(Some(Norm { x: xp, add, w, out: op, counter, n: k, eps: n.eps, threads: decode_mv::BLOCK, half: false }))
    }

    /// The norm's writes: x (when added to) and out.
    fn mv_norm_done(&mut self, n: &NormIn) {
        if n.add.is_some() {
            self.touch(n.x);
        }
        self.touch(n.out);
    }

    pub(super) fn fused_norm_matmul_multi(&mut self, norm: &NormIn, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        let ws: Vec<&WeightRef> = outs.iter().map(|(w, _)| *w).collect();
        let ys: Vec<Buf> = outs.iter().map(|(_, y)| *y).collect();
        let rows: usize = ws.iter().map(|w| w.n_rows()).sum();
        let fusable = self.mv_enabled() && n_tok == 1 && (1..=3).contains(&outs.len()) && self.mv_fits(decode_mv::norm_kernel(norm.row_len, false), rows);
        if !fusable && n_tok == 1 && self.norm_walk(norm, outs)? {
            return Ok(());
        }
        if !fusable && n_tok == 1 && outs.len() == 1 && self.norm_head(norm, outs[0].0, outs[0].1)? {
            return Ok(());
        }
        let Some(mut a) = (if fusable { self.mv_norm(norm, &ws, &ys)? } else { None }) else {
            norm_in(self, norm, n_tok)?;
            return self.matmul_multi(norm.out, n_tok, outs);
        };
        let seg_rows: Vec<usize> = ws.iter().map(|w| w.n_rows()).collect();
        a.threads = self.norm_threads(norm.row_len, false, &seg_rows);
        self.mv_half(&mut a, &ws.iter().map(|w| w.ty()).collect::<Vec<_>>());
        let segs = self.mv_segments("norm_matmul_multi", outs)?;
        self.mv.launches += 1;
        let r = decode_mv::norm_multi(&self.rec(), &a, &segs).map_err(|e| {
            let names: Vec<&str> = ws.iter().map(|w| w.name()).collect();
            BackendError::Invalid { op: "norm_matmul_multi", msg: format!("{}: {e}", names.join(", ")) }
        });
        self.mv_norm_done(norm);
        for y in ys {
            self.touch(y);
        }
        r
    }

    /// The launchers' view of `outs`: (weight, type, rows, output) per weight, each output
    /// checked to hold its rows.
    fn mv_segments(&mut self, op: &'static str, outs: &[(&WeightRef, Buf)]) -> Result<Vec<(DevPtr, crate::quant::GgmlType, usize, DevPtr)>> {
        let mut segs = Vec::with_capacity(outs.len());
        for (w, y) in outs {
            let (yp, yn) = self.buf(*y)?;
            Self::check_len(op, *y, yn, w.n_rows())?;
            segs.push((self.weight(w)?, w.ty(), w.n_rows(), yp));
        }
        Ok(segs)
    }

    /// One token's norm and 1 to 3 matvecs too large for one wave of norm blocks (Q4_K; the
    /// last may be Q6_K), as one launch of resident blocks whose warps walk the rows
    /// (`decode_mv::norm_walk`); `LODE_MV_NORMWALK=0` never. Ok(false): not taken (the
    /// caller runs the usual path).
    fn norm_walk(&mut self, norm: &NormIn, outs: &[(&WeightRef, Buf)]) -> Result<bool> {
        let tys: Vec<_> = outs.iter().map(|(w, _)| w.ty()).collect();
        if !self.mv_enabled() || !self.mv.walk || !decode_mv::walk_supports(norm.row_len, &tys) {
            return Ok(false);
        }
        let ws: Vec<&WeightRef> = outs.iter().map(|(w, _)| *w).collect();
        let ys: Vec<Buf> = outs.iter().map(|(_, y)| *y).collect();
        // mv_norm refuses weights whose rows are not the norm's length, and aliased buffers.
        let Some(a) = self.mv_norm(norm, &ws, &ys)? else { return Ok(false) };
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm(decode_mv::walk_kernel(&tys), decode_mv::BLOCK, || 2);
        if per_sm == 0 {
            return Ok(false);
        }
        let segs = self.mv_segments("norm_matmul", outs)?;
        self.mv.walk_launches += 1;
        let r = decode_mv::norm_walk(&self.rec(), &a, &segs, sms * per_sm).map_err(|e| {
            let names: Vec<&str> = ws.iter().map(|w| w.name()).collect();
            BackendError::Invalid { op: "norm_matmul", msg: format!("{}: {e}", names.join(", ")) }
        });
        self.mv_norm_done(norm);
        for y in ys {
            self.touch(y);
        }
        r.map(|_| true)
    }

    /// One token's norm and a Q6_K matvec of many rows (the LM head) as one launch
    /// (`head_mv.rs`). Ok(false): not taken (the caller runs the usual path).
    fn norm_head(&mut self, norm: &NormIn, w: &WeightRef, y: Buf) -> Result<bool> {
        let (n, rows) = (norm.row_len, w.n_rows());
        if !self.mv_enabled() || !self.mv.head || w.row_len() != n || !head_mv::supports(w.ty(), n, rows, 0) {
            return Ok(false);
        }
        let wp = self.weight(w)?;
        if !head_mv::supports(w.ty(), n, rows, wp) {
            return Ok(false);
        }
        let Some(a) = self.mv_norm(norm, &[w], &[y])? else { return Ok(false) };
        let (yp, yn) = self.buf(y)?;
        Self::check_len("norm_matmul_multi", y, yn, rows)?;
        // A read-back buffer (the logits): written straight into its mapped host memory.
        let mapped = self.head_out(y);
        let yp = mapped.unwrap_or(yp);
        let kernel = head_mv::kernel(n);
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm(kernel, head_mv::BLOCK, || 3);
        self.mv.head_launches += 1;
        let r = head_mv::norm_head(&self.rec(), &a, wp, rows, yp, head_mv::grid(rows, sms, per_sm))
            .map_err(|e| BackendError::Invalid { op: "norm_matmul_multi", msg: format!("{}: {e}", w.name()) });
        self.mv_norm_done(norm);
        self.touch(y);
        if mapped.is_some() {
            self.head_wrote(y);
        }
        r.map(|_| true)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_norm_matmul_glu(&mut self, norm: &NormIn, n_tok: usize, gate: &WeightRef, up: &WeightRef, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        let same = gate.ty() == up.ty() && gate.n_rows() == up.n_rows() && gate.row_len() == up.row_len();
        let fusable = self.mv_enabled() && n_tok == 1 && same && self.mv_fits(decode_mv::norm_kernel(norm.row_len, true), gate.n_rows());
        if !fusable && n_tok == 1 && same && self.norm_walk(norm, &[(gate, out), (up, tmp)])? {
            return self.glu(out, tmp, out, gate.n_rows(), act);
        }
        let Some(mut a) = (if fusable { self.mv_norm(norm, &[gate, up], &[out])? } else { None }) else {
            norm_in(self, norm, n_tok)?;
            return self.matmul_glu(gate, up, norm.out, n_tok, out, tmp, act);
        };
        a.threads = self.norm_threads(norm.row_len, true, &[gate.n_rows()]);
        self.mv_half(&mut a, &[gate.ty()]);
        let (yp, yn) = self.buf(out)?;
        Self::check_len("norm_matmul_glu", out, yn, gate.n_rows())?;
        let gp = self.weight(gate)?;
        let upp = self.weight(up)?;
        self.mv.launches += 1;
        let r = decode_mv::norm_glu(&self.rec(), &a, gp, upp, gate.ty(), gate.n_rows(), yp, act == Glu::GeluTanh)
            .map_err(|e| BackendError::Invalid { op: "norm_matmul_glu", msg: format!("{} / {}: {e}", gate.name(), up.name()) });
        self.mv_norm_done(norm);
        self.touch(out);
        r
    }

    /// `Backend::matmul_residual`: one token, fused, adds the product into the residual in
    /// place (decode_mv_quant's epilogue); otherwise the plain matmul into `y`, left for
    /// the next norm to add.
    pub(super) fn fused_matmul_residual(&mut self, w: &WeightRef, x: Buf, n_tok: usize, residual: Buf, y: Buf) -> Result<bool> {
        if n_tok == 1 && self.numerics == super::Numerics::Fast && !(self.gemm_prefill && self.blas_wanted(w, n_tok)) {
            let (_, rn) = self.buf(residual)?;
            Self::check_len("matmul_residual", residual, rn, w.n_rows())?;
            if self.quant_matmul(w, x, residual, true)? {
                return Ok(true);
            }
        }
        self.matmul(w, x, n_tok, y)?;
        Ok(false)
    }

    /// `matmul` of one token with rows of 2–16 K-quant steps (4B / 8B down projections):
    /// one warp per step over a resident row walk (`decode_mv::split_walk`), reading the
    /// input's K form. Ok(false): not taken (the caller runs the usual path).
    pub(super) fn split_matmul(&mut self, w: &WeightRef, x: Buf, y: Buf) -> Result<bool> {
        let (ty, k, rows) = (w.ty(), w.row_len(), w.n_rows());
        let Some(steps) = decode_mv::split_steps(ty, k) else { return Ok(false) };
        if !self.mv_enabled() || !self.mv.split_walk || x == y || ops::act_fmt(ty) != Some(ops::ActFmt::K) {
            return Ok(false);
        }
        let sms = self.mv_sms();
        let per_sm = self.mv_per_sm("decode_mv_split", 32 * steps as u32, || 2);
        if per_sm == 0 {
            return Ok(false);
        }
        let xk = self.act_blocks(x, ops::ActFmt::K, k, 1, "matmul")?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", y, yn, rows)?;
        let wp = self.weight(w)?;
        self.mv.split_launches += 1;
        let r = decode_mv::split_walk(&self.rec(), xk, k, wp, ty, rows, yp, (sms * per_sm).min(rows)).map_err(|e| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", w.name()) });
        self.touch(y);
        r.map(|_| true)
    }

    /// `matmul` of one token whose input has no valid quantized form: one launch that
    /// quantizes `x` in its prologue. Ok(false): not taken (the caller runs the usual path).
    /// With `acc`, `y` is that buffer and the product is added to it (`y[r] = y[r] + W x`,
    /// the residual add of [`Backend::matmul_residual`]).
    pub(super) fn quant_matmul(&mut self, w: &WeightRef, x: Buf, y: Buf, acc: bool) -> Result<bool> {
        let (ty, k) = (w.ty(), w.row_len());
        let Some(fmt) = ops::act_fmt(ty) else { return Ok(false) };
        if !self.mv_enabled() || x == y || k > decode_mv::QUANT_MAX || !decode_mv::supports(ty, k) || !self.mv_fits("decode_mv_quant", w.n_rows()) || self.act_ready(x, fmt, k) {
            return Ok(false);
        }
        let (xp, xn) = self.buf(x)?;
        let (yp, yn) = self.buf(y)?;
        Self::check_len("matmul", x, xn, k)?;
        Self::check_len("matmul", y, yn, w.n_rows())?;
        let wp = self.weight(w)?;
        self.mv.launches += 1;
        let wpr = self.quant_wpr(ty, k, w.n_rows());
        let rpb = decode_mv::quant_rows_per_block(self.mv.quant_rows, wpr);
        let r = decode_mv::quant_mv(&self.rec(), xp, k, wp, ty, w.n_rows(), yp, acc, wpr, rpb, self.mv.quant2).map_err(|e| BackendError::Invalid { op: "matmul", msg: format!("{}: {e}", w.name()) });
        self.touch(y);
        r.map(|_| true)
    }
}
