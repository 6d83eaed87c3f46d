//! The CPU backend: f32 activations in host vectors, weights read in place from the
//! mapped file through `quant::matmul_*_on` / `quant::dequantize` (zero copies), work
//! spread over a [`Team`] of `threads` threads (the calling thread is one of them). Ops
//! on a single row (a decode step's norms, rope, adds) run inline on the caller: handing
//! them out would cost more than they do.
//!
//! It is the oracle every GPU kernel is checked against, so it keeps llama.cpp's
//! arithmetic (see `ops`) rather than chasing speed with different rounding.

mod attention;
mod attn_ggml;
mod attn_kernels;
mod attn_quant;
mod delta;
mod dump;
pub(crate) mod moe;
pub mod ops;
mod team;
mod vexp;

use std::borrow::Cow;
use std::sync::Arc;

use crate::backend::{
    Attention, Backend, BackendError, Buf, DeltaIn, DeltaNet, DeltaState, Glu, KvCache, KvSpec, MoeFfn, MoeScratch, Result, Rope,
};
use crate::quant::{self, par_chunks, GgmlType, Isa, Parallel};
use crate::weights::WeightRef;

use attention::Kv;
pub use team::Team;

/// Below this many elements an element-wise op runs on the calling thread alone.
const INLINE_MAX: usize = 1 << 14;

impl Parallel for Team {
    fn threads(&self) -> usize {
        Team::threads(self)
    }
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        Team::for_each(self, n, f)
    }
}

/// Host-memory backend.
pub struct CpuBackend {
    /// Shared between backends when several engines run at once (`lode serve`'s slots),
    /// so they split one set of threads instead of oversubscribing the cores.
    pool: Arc<Team>,
    threads: usize,
    isa: Isa,
    /// Indexed by `Buf.0`; `None` once freed.
    bufs: Vec<Option<Vec<f32>>>,
    kvs: Vec<Option<Kv>>,
    /// The last single position's rope table (q and k of a layer, and the layers with
    /// the same base, rotate by the same angles): key, cos, sin.
    rope_memo: Option<(RopeKey, Vec<f32>, Vec<f32>)>,
    /// [`Backend::round_rows_as_decode`].
    rowwise: bool,
}

/// What a rope table depends on: position, `n_rot`, base and scale bits, the frequency
/// factors' bits.
type RopeKey = (u32, usize, u32, u32, Option<Vec<u32>>, Option<[u32; 4]>);

impl CpuBackend {
    /// A backend running on `threads` threads (0: rayon's default).
    pub fn new(threads: usize) -> Result<CpuBackend> {
        Ok(CpuBackend::with_pool(Self::build_pool(threads)?))
    }

    /// A backend running on an existing pool (shared with other backends).
    /// (Backends sharing a team run their ops in turn, each op on every thread.)
    pub fn with_pool(pool: Arc<Team>) -> CpuBackend {
        let threads = pool.threads();
        CpuBackend { pool, threads, isa: Isa::best(), bufs: Vec::new(), kvs: Vec::new(), rope_memo: None, rowwise: false }
    }

    /// The team `new(threads)` would build (0: one thread per available core), for
    /// [`Self::with_pool`].
    pub fn build_pool(threads: usize) -> Result<Arc<Team>> {
        let n = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        Team::new(n)
            .map(Arc::new)
            .map_err(|e| BackendError::Unavailable(format!("cannot start CPU threads: {e}")))
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    fn buf(&self, b: Buf) -> Result<&Vec<f32>> {
        self.bufs.get(b.0 as usize).and_then(|x| x.as_ref()).ok_or(BackendError::BadHandle(b))
    }

    /// Moves a buffer out so it can be written while others are read; [`Self::put`]
    /// returns it.
    fn take(&mut self, b: Buf) -> Result<Vec<f32>> {
        self.bufs.get_mut(b.0 as usize).and_then(|x| x.take()).ok_or(BackendError::BadHandle(b))
    }

    fn put(&mut self, b: Buf, v: Vec<f32>) {
        self.bufs[b.0 as usize] = Some(v);
    }

    /// `LODE_DEBUG=cpu-dump` (see `dump`): the first `n` values of `b` as the next dump.
    fn dump(&self, op: &str, b: Buf, n: usize) {
        if dump::on() {
            if let Ok(v) = self.buf(b) {
                dump::write(op, &v[..n.min(v.len())]);
            }
        }
    }

    fn kv(&mut self, h: KvCache) -> Result<&mut Kv> {
        self.kvs.get_mut(h.0 as usize).and_then(|x| x.as_mut()).ok_or(BackendError::BadKvHandle(h))
    }

    /// Runs `f(input, output)` with `out` taken out of the table (input may equal output:
    /// then `f` gets `None` as input and works in place).
    fn with_io<F>(&mut self, x: Buf, out: Buf, f: F) -> Result<()>
    where
        F: FnOnce(Option<&[f32]>, &mut [f32], &Team) -> Result<()>,
    {
        let mut o = self.take(out)?;
        let r = if x == out {
            f(None, &mut o, &self.pool)
        } else {
            match self.buf(x) {
                Ok(xv) => f(Some(xv), &mut o, &self.pool),
                Err(e) => Err(e),
            }
        };
        self.put(out, o);
        r
    }
}

/// `len` elements of `buf` from `off`, or an error naming the op.
fn span<'a>(v: &'a [f32], off: usize, len: usize, op: &'static str) -> Result<&'a [f32]> {
    v.get(off..off.saturating_add(len))
        .ok_or_else(|| invalid(op, format!("{len} elements at {off} exceed a buffer of {}", v.len())))
}

fn span_mut<'a>(v: &'a mut [f32], off: usize, len: usize, op: &'static str) -> Result<&'a mut [f32]> {
    let n = v.len();
    v.get_mut(off..off.saturating_add(len))
        .ok_or_else(|| invalid(op, format!("{len} elements at {off} exceed a buffer of {n}")))
}

fn invalid(op: &'static str, msg: String) -> BackendError {
    BackendError::Invalid { op, msg }
}

/// A small f32 weight (norm, bias, rope factors) as f32 values, borrowed when the
/// mapping is aligned, else converted.
pub(crate) fn f32_weight<'a>(w: &WeightRef<'a>, op: &'static str) -> Result<Cow<'a, [f32]>> {
    let n = w.row_len() * w.n_rows();
    match w.ty() {
        GgmlType::F32 => match bytemuck::try_cast_slice::<u8, f32>(w.data()) {
            Ok(s) if s.len() == n => Ok(Cow::Borrowed(s)),
            _ => {
                let mut v = vec![0.0f32; n];
                quant::dequantize(GgmlType::F32, w.data(), &mut v).map_err(|e| quant_err(op, w, e))?;
                Ok(Cow::Owned(v))
            }
        },
        ty @ (GgmlType::F16 | GgmlType::BF16) => {
            let mut v = vec![0.0f32; n];
            quant::dequantize(ty, w.data(), &mut v).map_err(|e| quant_err(op, w, e))?;
            Ok(Cow::Owned(v))
        }
        ty => Err(invalid(op, format!("weight `{}` is {ty}; expected a float vector", w.name()))),
    }
}

fn quant_err(op: &'static str, w: &WeightRef, source: quant::QuantError) -> BackendError {
    BackendError::Quant { op, weight: w.name().to_string(), source }
}

impl Backend for CpuBackend {
    fn name(&self) -> String {
        format!("cpu ({} threads)", self.threads)
    }

    fn round_rows_as_decode(&mut self, on: bool) {
        self.rowwise = on;
    }

    fn weight_types(&self) -> &'static [GgmlType] {
        &GgmlType::WEIGHTS
    }

    fn alloc(&mut self, len: usize) -> Result<Buf> {
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| BackendError::OutOfMemory { what: "activations", bytes: 4 * len as u64 })?;
        v.resize(len, 0.0);
        self.bufs.push(Some(v));
        Ok(Buf(self.bufs.len() as u32 - 1))
    }

    fn free(&mut self, buf: Buf) -> Result<()> {
        self.take(buf).map(drop)
    }

    fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()> {
        let mut v = self.take(buf)?;
        let r = span_mut(&mut v, 0, src.len(), "write").map(|d| d.copy_from_slice(src));
        self.put(buf, v);
        r
    }

    fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()> {
        let v = self.buf(buf)?;
        dst.copy_from_slice(span(v, 0, dst.len(), "read")?);
        Ok(())
    }

    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        self.kvs.push(Some(Kv::new(*spec)?));
        Ok(KvCache(self.kvs.len() as u32 - 1))
    }

    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.kv(kv)?;
        self.kvs[kv.0 as usize] = None;
        Ok(())
    }

    fn copy_kv(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        self.kv(src)?;
        if src == dst {
            return Ok(());
        }
        let mut d = self.kvs.get_mut(dst.0 as usize).and_then(Option::take).ok_or(BackendError::BadKvHandle(dst))?;
        let r = self.kv(src).and_then(|s| d.copy_from(s, n));
        self.kvs[dst.0 as usize] = Some(d);
        r
    }

    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        let (n, rows, rb) = (w.row_len(), w.n_rows(), w.row_bytes());
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= rows) {
            return Err(invalid("get_rows", format!("token id {bad} outside `{}` ({rows} rows)", w.name())));
        }
        let mut o = self.take(out)?;
        let r = (|| {
            let dst = span_mut(&mut o, 0, ids.len() * n, "get_rows")?;
            for (row, &id) in dst.chunks_exact_mut(n).zip(ids) {
                let src = &w.data()[id as usize * rb..][..rb];
                quant::dequantize(w.ty(), src, row).map_err(|e| quant_err("get_rows", w, e))?;
            }
            Ok(())
        })();
        self.put(out, o);
        r
    }

    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        if x == y {
            return Err(invalid("matmul", "input and output must be different buffers".into()));
        }
        let (k, rows, isa, rowwise) = (w.row_len(), w.n_rows(), self.isa, self.rowwise);
        self.with_io(x, y, |xv, yv, pool| {
            let xs = span(xv.unwrap_or(&[]), 0, n_tok * k, "matmul")?;
            let ys = span_mut(yv, 0, n_tok * rows, "matmul")?;
            let xq = quant::quantize_rows_on(pool, w.ty(), xs, n_tok, k).map_err(|e| quant_err("matmul", w, e))?;
            let mm = if rowwise { quant::matmul_quantized_rowwise_on } else { quant::matmul_quantized_on };
            mm(pool, w.data(), w.ty(), rows, &xq, ys, isa).map_err(|e| quant_err("matmul", w, e))
        })?;
        self.dump("matmul", y, n_tok * rows);
        Ok(())
    }

    fn matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        let ws: Vec<&WeightRef> = outs.iter().map(|o| o.0).collect();
        let ys: Vec<Buf> = outs.iter().map(|o| o.1).collect();
        let (ws, ys) = (&ws[..], &ys[..]);
        let k = ws.first().map_or(0, |w| w.row_len());
        let same_input = ws.iter().all(|w| w.row_len() == k && quant::vec_dot_type(w.ty()) == quant::vec_dot_type(ws[0].ty()));
        let distinct = ys.iter().enumerate().all(|(i, y)| *y != x && !ys[..i].contains(y));
        if ws.len() != ys.len() || ws.len() < 2 || !same_input || !distinct || (self.rowwise && n_tok > 1) {
            for (w, &y) in ws.iter().zip(ys) {
                self.matmul(w, x, n_tok, y)?;
            }
            return Ok(());
        }
        // One conversion of the input, one job for the union of the weights' rows.
        let xq = {
            let xs = span(self.buf(x)?, 0, n_tok * k, "matmul")?;
            quant::quantize_rows_on(&*self.pool, ws[0].ty(), xs, n_tok, k).map_err(|e| quant_err("matmul", ws[0], e))?
        };
        let mut outs = Vec::with_capacity(ys.len());
        for &y in ys {
            match self.take(y) {
                Ok(v) => outs.push(v),
                Err(e) => {
                    for (&y, v) in ys.iter().zip(outs) {
                        self.put(y, v);
                    }
                    return Err(e);
                }
            }
        }
        let r = (|| {
            let mut items = Vec::with_capacity(ws.len());
            for (w, o) in ws.iter().zip(outs.iter_mut()) {
                let y = span_mut(o, 0, n_tok * w.n_rows(), "matmul")?;
                items.push(quant::BatchItem { w: w.data(), ty: w.ty(), rows: w.n_rows(), y });
            }
            quant::matmul_batch_on(&*self.pool, &mut items, &xq, self.isa).map_err(|e| quant_err("matmul", ws[0], e))
        })();
        for (&y, v) in ys.iter().zip(outs) {
            self.put(y, v);
        }
        for (w, &y) in ws.iter().zip(ys) {
            self.dump("matmul", y, n_tok * w.n_rows());
        }
        r
    }

    fn rms_norm(
        &mut self,
        x: Buf,
        out: Buf,
        n_rows: usize,
        row_len: usize,
        w: Option<&WeightRef>,
        eps: f32,
    ) -> Result<()> {
        let wv = w.map(|w| f32_weight(w, "rms_norm")).transpose()?;
        if let Some(wv) = &wv {
            if wv.len() != row_len {
                return Err(invalid("rms_norm", format!("weight has {} values, rows have {row_len}", wv.len())));
            }
        }
        let wv = wv.as_deref();
        self.with_io(x, out, |xv, ov, pool| {
            let o = span_mut(ov, 0, n_rows * row_len, "rms_norm")?;
            if row_len == 0 {
                return Ok(());
            }
            let xs = match xv {
                Some(xv) => Some(span(xv, 0, n_rows * row_len, "rms_norm")?),
                None => None,
            };
            // Rows per task: a few tasks per thread, or everything inline when small.
            let per = if o.len() <= INLINE_MAX { n_rows } else { n_rows.div_ceil(4 * pool.threads()) };
            par_chunks(pool, o, per.max(1) * row_len, &|i, o| match xs {
                None => o.chunks_exact_mut(row_len).for_each(|r| ops::rms_norm_inplace(r, wv, eps)),
                Some(xs) => {
                    let xs = &xs[i * per * row_len..][..o.len()];
                    for (r, x) in o.chunks_exact_mut(row_len).zip(xs.chunks_exact(row_len)) {
                        ops::rms_norm_row(x, r, wv, eps);
                    }
                }
            });
            Ok(())
        })?;
        self.dump("rms_norm", out, n_rows * row_len);
        Ok(())
    }

    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        if rope.n_rot > head_dim || rope.n_rot % 2 != 0 {
            return Err(invalid("rope", format!("n_rot {} with head_dim {head_dim}", rope.n_rot)));
        }
        let ff = rope.freq_factors.as_ref().map(|w| f32_weight(w, "rope")).transpose()?;
        if let Some(f) = &ff {
            if f.len() < rope.n_rot / 2 {
                return Err(invalid("rope", format!("{} frequency factors for n_rot {}", f.len(), rope.n_rot)));
            }
        }
        let ff = ff.as_deref();
        let mut v = self.take(x)?;
        let width = n_head * head_dim;
        if let [p] = *pos {
            let key = (p, rope.n_rot, rope.freq_base.to_bits(), rope.freq_scale.to_bits(), ff.map(|f| f[..rope.n_rot / 2].iter().map(|x| x.to_bits()).collect()), rope.yarn.map(|y| [y.ext_factor, y.beta_fast, y.beta_slow, y.n_ctx_orig as f32].map(f32::to_bits)));
            let half = rope.n_rot / 2;
            let memo = match self.rope_memo.take() {
                Some(m) if m.0 == key => m,
                _ => {
                    let (mut c, mut s) = (vec![0.0f32; half], vec![0.0f32; half]);
                    ops::rope_table(p, rope.n_rot, rope.freq_base, rope.freq_scale, ff, rope.yarn.as_ref(), &mut c, &mut s);
                    (key, c, s)
                }
            };
            let r = span_mut(&mut v, 0, width, "rope").map(|tok| {
                for head in tok.chunks_exact_mut(head_dim) {
                    ops::rope_head(head, rope.mode, rope.n_rot, &memo.1, &memo.2);
                }
            });
            self.rope_memo = Some(memo);
            self.put(x, v);
            return r;
        }
        let r = span_mut(&mut v, 0, pos.len() * width, "rope").map(|xs| {
            if width == 0 {
                return;
            }
            let per = if xs.len() <= INLINE_MAX { pos.len() } else { pos.len().div_ceil(4 * self.pool.threads()) };
            par_chunks(&*self.pool, xs, per.max(1) * width, &|i, toks| {
                let half = rope.n_rot / 2;
                let (mut c, mut s) = (vec![0.0f32; half], vec![0.0f32; half]);
                for (tok, &p) in toks.chunks_exact_mut(width).zip(&pos[i * per..]) {
                    ops::rope_table(p, rope.n_rot, rope.freq_base, rope.freq_scale, ff, rope.yarn.as_ref(), &mut c, &mut s);
                    for head in tok.chunks_exact_mut(head_dim) {
                        ops::rope_head(head, rope.mode, rope.n_rot, &c, &s);
                    }
                }
            });
        });
        self.put(x, v);
        self.dump("rope", x, pos.len() * width);
        r
    }

    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        // out = a + b; the common case is the residual `x = x + y` (out == a).
        let (src, acc) = if out == a { (b, a) } else if out == b { (a, b) } else {
            self.copy(a, 0, out, 0, n)?;
            (b, out)
        };
        if src == acc {
            return self.scale(acc, n, 2.0);
        }
        self.with_io(src, acc, |sv, ov, _| {
            let s = span(sv.unwrap_or(&[]), 0, n, "add")?;
            let o = span_mut(ov, 0, n, "add")?;
            o.iter_mut().zip(s).for_each(|(o, s)| *o += s);
            Ok(())
        })?;
        self.dump("add", acc, n);
        Ok(())
    }

    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        let bv = f32_weight(bias, "add_bias")?;
        let mut v = self.take(x)?;
        let r = span_mut(&mut v, 0, n_tok * bv.len(), "add_bias").map(|xs| {
            for row in xs.chunks_exact_mut(bv.len()) {
                row.iter_mut().zip(bv.iter()).for_each(|(a, b)| *a += b);
            }
        });
        self.put(x, v);
        r
    }

    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        let mut v = self.take(x)?;
        let r = span_mut(&mut v, 0, n, "scale").map(|xs| xs.iter_mut().for_each(|a| *a *= s));
        self.put(x, v);
        r
    }

    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        if out == up || gate == up {
            return Err(invalid("glu", "out must not alias up, gate must not alias up".into()));
        }
        if out != gate {
            self.copy(gate, 0, out, 0, n)?;
        }
        // Now out holds the gate values: out = act(out) ⊙ up, in place.
        self.with_io(up, out, |uv, ov, pool| {
            let u = span(uv.unwrap_or(&[]), 0, n, "glu")?;
            let o = span_mut(ov, 0, n, "glu")?;
            // SiLU's `exp` and GELU's f16 round trips make each element a few ns: split
            // from a thousand on.
            let per = if n <= 1024 { n } else { n.div_ceil(2 * pool.threads()).max(512) };
            par_chunks(pool, o, per, &|i, o| ops::glu_inplace(o, &u[i * per..][..o.len()], act));
            Ok(())
        })?;
        self.dump("glu", out, n);
        Ok(())
    }

    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
        if src == dst {
            let mut v = self.take(src)?;
            let r = if src_off.max(dst_off) + n <= v.len() {
                v.copy_within(src_off..src_off + n, dst_off);
                Ok(())
            } else {
                Err(invalid("copy", format!("{n} elements exceed a buffer of {}", v.len())))
            };
            self.put(src, v);
            return r;
        }
        self.with_io(src, dst, |sv, dv, _| {
            let s = span(sv.unwrap_or(&[]), src_off, n, "copy")?;
            span_mut(dv, dst_off, n, "copy")?.copy_from_slice(s);
            Ok(())
        })
    }

    fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
        let kt = self.take(k)?;
        let vt = match self.take(v) {
            Ok(vt) => vt,
            Err(e) => {
                self.put(k, kt);
                return Err(e);
            }
        };
        let r = self.kv(kv).and_then(|c| c.write(layer, &kt, &vt, pos));
        self.put(k, kt);
        self.put(v, vt);
        r
    }

    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, _tmp: &MoeScratch) -> Result<()> {
        self.moe_ffn_direct(x, n_tok, p, out)
    }
    fn gated_delta_net(&mut self, p: &DeltaNet, x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        self.delta_net_direct(p, x, n_tok, states, out)
    }
    fn split_halves(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        self.split_halves_direct(src, n_rows, half, a, b)
    }
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        self.mul_sigmoid_direct(x, gate, n_rows, row_len, per_row)
    }
    fn copy_strided(&mut self, src: Buf, dst: Buf, s: &crate::backend::Strided) -> Result<()> {
        self.copy_strided_direct(src, dst, s)
    }

    fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        if q == out {
            return Err(invalid("attention", "q and out must be different buffers".into()));
        }
        let mut o = self.take(out)?;
        let r = (|| {
            let qv = self.bufs.get(q.0 as usize).and_then(|x| x.as_ref()).ok_or(BackendError::BadHandle(q))?;
            let c = self.kvs.get(kv.0 as usize).and_then(|x| x.as_ref()).ok_or(BackendError::BadKvHandle(kv))?;
            if self.rowwise {
                c.attend_rowwise(&*self.pool, layer, qv, pos, p, &mut o)
            } else {
                c.attend(&*self.pool, layer, qv, pos, p, &mut o)
            }
        })();
        self.put(out, o);
        self.dump("attention", out, pos.len() * p.n_head * p.head_dim_v);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RopeMode;

    /// `read_with`'s default hands over the buffer's first values through the caller's
    /// scratch, and refuses a read past the buffer's end with an error.
    #[test]
    fn read_with_hands_over_the_values() {
        let mut be = CpuBackend::new(1).unwrap();
        let buf = be.alloc(5).unwrap();
        be.write(buf, &[1.0, 2.0, 3.0, 4.0, 5.0]).unwrap();
        let (mut host, mut got) = (Vec::new(), Vec::new());
        be.read_with(buf, 3, &mut host, &mut |v| got.extend_from_slice(v)).unwrap();
        assert_eq!(got, [1.0, 2.0, 3.0]);
        assert!(be.read_with(buf, 6, &mut host, &mut |_| {}).is_err());
    }

    /// One-position rope reuses its table only for the same position and parameters.
    #[test]
    fn rope_table_memo_never_goes_stale() {
        let mut be = CpuBackend::new(2).unwrap();
        let x: Vec<f32> = (0..16).map(|i| i as f32 * 0.25 - 1.0).collect();
        let buf = be.alloc(16).unwrap();
        let rope = |base: f32| Rope { mode: RopeMode::Neox, n_rot: 8, freq_base: base, freq_scale: 1.0, freq_factors: None, yarn: None };
        let want = |p: u32, base: f32| {
            let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
            ops::rope_table(p, 8, base, 1.0, None, None, &mut c, &mut s);
            let mut y = x.clone();
            y.chunks_exact_mut(8).for_each(|h| ops::rope_head(h, RopeMode::Neox, 8, &c, &s));
            y
        };
        for (p, base) in [(3, 10000.0), (3, 10000.0), (3, 500.0), (4, 500.0), (3, 10000.0)] {
            be.write(buf, &x).unwrap();
            be.rope(buf, 2, 8, &[p], &rope(base)).unwrap();
            let mut got = vec![0.0; 16];
            be.read(buf, &mut got).unwrap();
            assert_eq!(got, want(p, base), "pos {p} base {base}");
        }
    }
}
