//! [`Backend`] for CUDA and HIP: one implementation over [`GpuDevice`], so the forward
//! pass the model code issues runs the same host code on an NVIDIA or an AMD GPU.
//!
//! Weights: every op asks the `WeightCache` for (weight, canonical layout): the first ask
//! materializes it (`device` residency), or it was copied at load (`upload`), or it is
//! read in place from the registered file mapping (`mapped`). Small f32 vectors (norm
//! weights, biases) that a file stores in another type have the f32 layout (dequantized
//! on the host once, then uploaded).
//! Activations: every `Buf` is a device f32 buffer. Matmuls of quantized weights read them
//! quantized as the CPU backend quantizes them (`act.rs`), from reused scratch buffers.
//! Host slices (token ids, positions) are uploaded to per-step staging slots (an
//! identical position list is staged once per step); kernels read positions on the device.
//! Steps (the work between two read-backs) are recorded and, once two consecutive steps
//! are identical, replayed as one device graph (`replay.rs`; `Tuning::graphs`).
//! KV cache: K and V each f16, Q8_0 or Q4_0 blocks (`-ctk`/`-ctv`; F32 is refused).

use crate::backend::gpu::family::{attention, elementwise, flash_attn, gemm, norm_rope, quantize};
use crate::backend::gpu::launch;
use super::{device::{DeviceBuffer, GpuDevice}, driver::DevPtr, GpuError};
use super::replay::{Entry, Rec, Replay};
use super::plan::{self, GluPlan};
use super::tuning::Tuning;
use crate::backend::{Attention, Backend, BackendError, Buf, DeltaIn, DeltaNet, DeltaState, Glu, KvCache, KvSpec, MoeFfn, MoeScratch, NormIn, QkvPrep, Result, Rope, RopeMode};
use super::materialize::{GpuMaterializer, MappedFile};
use crate::weights::layout::{self, Consumer, DeviceClass, Layout};
use crate::weights::{Residency, WeightCache, WeightRef, WeightStats};
use std::{cell::RefCell, collections::HashMap};

mod act;
mod delta;
mod blas;
mod exact;
mod exact_backend;
pub use exact_backend::ExactBackend;
mod fused;
mod kv_rot;
mod kvq;
mod matmul;
mod moe;
mod norm_mv;
mod probe;
mod readback;
mod ring;
use ring::Kv;
mod rope_attn;
mod rows;
mod setup;
mod staging;
use staging::Scratch;

/// Map a GPU error into the backend's error type, naming the op.
fn err(op: &'static str) -> impl Fn(GpuError) -> BackendError {
    move |e| BackendError::Invalid { op, msg: e.to_string() }
}
fn derr(op: &'static str) -> impl Fn(super::DriverError) -> BackendError {
    move |e| BackendError::Invalid { op, msg: e.to_string() }
}


pub struct GpuBackend {
    dev: GpuDevice,
    /// Activation buffers: (memory, f32 length, version bumped by every op that writes it).
    bufs: HashMap<u32, (readback::ActMem, usize, u64)>,
    tick: u64,
    /// Quantized forms of activation buffers (`act.rs`): q, k and v (and gate and up)
    /// projections of one input quantize it once, and the norm / GLU kernels before a
    /// projection write the blocks directly.
    act: act::ActForms,
    kvs: HashMap<u32, Kv>,
    next: u32,
    /// Every weight copy (or in-place address), by (file region, layout).
    cache: WeightCache<GpuMaterializer>,
    /// The registered file mapping (`mapped` residency).
    mapped: Option<MappedFile>,
    /// RoPE frequency divisors on the device, by the host address of their weight.
    inv_freq: HashMap<usize, DeviceBuffer>,
    /// Per-step staging of host inputs (ids, positions): slot addresses repeat per step.
    stage: Scratch,
    stage_used: usize,
    /// Staging regions replaced mid-step (kept until the step's work has run).
    retired: Vec<DeviceBuffer>,
    /// Positions staged in this step and where.
    step_pos: Option<(Vec<u32>, DevPtr)>,
    /// The previous step's positions and slot: a replayed decode step predicts its own
    /// positions from them (each one further) and launches its graph at the first op.
    prev_pos: Option<(Vec<u32>, DevPtr)>,
    /// Positions written speculatively into this step's slot, still to be confirmed.
    predicted_pos: Option<(Vec<u32>, DevPtr)>,
    replay: RefCell<Replay>,
    /// The tuning table every dispatch reads (`tuning.rs`; the plan in `plan.rs`).
    tuning: Tuning,
    /// The device figures the plan asks (`probe.rs`).
    occ: probe::OccCache,
    /// The fused decode matvecs' device state (`norm_mv.rs`).
    mv: norm_mv::MvFuse,
    /// The fused decode attention's device state (`rope_attn.rs`).
    fuse_attn: rope_attn::FuseAttn,
    /// The quantized caches' prefill scratch (`kvq.rs`).
    kvq: kvq::KvqScratch,
    /// Large reads through one page-locked buffer (`readback.rs`).
    readback: readback::Readback,
    /// Prefill matmuls through the vendor BLAS (`blas.rs`).
    blas: blas::BlasPrefill,
    /// The exact kernels' device state (used only through [`ExactBackend`]).
    exact: exact::ExactState,
    /// `--n-cpu-moe`: layers below this have host experts, computed on this team (`moe.rs`).
    cpu_experts: Option<(usize, std::sync::Arc<crate::backend::cpu::Team>)>,
    /// Threads for host experts that the engine's fit may place (`place_host_experts`);
    /// `None` where `--n-cpu-moe` fixed the count.
    host_auto: Option<usize>,
}

impl GpuBackend {
    /// Launch target for ops: through the step recorder.
    fn rec(&self) -> Rec<'_> {
        Rec { dev: &self.dev, replay: &self.replay }
    }

    /// Work outside the step record follows (host write, allocation, upload).
    fn barrier(&mut self) -> Result<()> {
        self.replay.get_mut().barrier(&self.dev).map_err(derr("graph replay"))
    }

    fn buf(&self, b: Buf) -> Result<(DevPtr, usize)> {
        self.bufs.get(&b.0).map(|(d, n, _)| (d.ptr(), *n)).ok_or(BackendError::BadHandle(b))
    }

    /// Record that an op wrote `b` (invalidates cached derived data such as its q8_1 form).
    fn touch(&mut self, b: Buf) {
        self.tick += 1;
        if let Some(e) = self.bufs.get_mut(&b.0) {
            e.2 = self.tick;
            if let readback::ActMem::Mapped { direct, .. } = &mut e.0 {
                *direct = false;
            }
        }
    }
    fn version(&self, b: Buf) -> u64 {
        self.bufs.get(&b.0).map(|e| e.2).unwrap_or(0)
    }

    /// The K and V addresses kernels index by position for `layer` of `kv` (`ring.rs`), with the cache's shape.
    fn kv_layer(&self, op: &'static str, kv: KvCache, layer: usize) -> Result<(DevPtr, DevPtr, KvSpec)> {
        let c = self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let (k, v) = c.addrs(layer).ok_or(BackendError::Invalid { op, msg: format!("layer {layer} of {}", c.spec.n_layer) })?;
        Ok((k, v, c.spec))
    }

    fn check_len(op: &'static str, b: Buf, have: usize, need: usize) -> Result<()> {
        if need > have {
            return Err(BackendError::Invalid { op, msg: format!("buffer {b:?} holds {have} values, the op needs {need}") });
        }
        Ok(())
    }

    /// Device address of a matrix weight in its canonical layout (made on first use).
    fn weight(&mut self, w: &WeightRef) -> Result<DevPtr> {
        self.cached(w, layout::canonical(w.ty(), Consumer::Matrix, DeviceClass::Gpu))
    }

    /// Device address of a weight as an f32 vector (norm weights, biases).
    fn weight_f32(&mut self, w: &WeightRef) -> Result<DevPtr> {
        self.cached(w, layout::canonical(w.ty(), Consumer::Vector, DeviceClass::Gpu))
    }

    fn cached(&mut self, w: &WeightRef, layout: Layout) -> Result<DevPtr> {
        if let Some(p) = self.cache.peek(w, layout) {
            return Ok(p);
        }
        // Materializing allocates and uploads: outside the step record.
        self.barrier()?;
        Ok(self.cache.get(w, layout)?)
    }
}

impl Backend for GpuBackend {
    fn name(&self) -> String {
        let i = self.dev.info();
        format!("{}:0 ({}, {})", self.dev.api(), i.name, i.arch)
    }

    fn attach_weights(&mut self, file: &std::sync::Arc<crate::gguf::GgufFile>, weights: &[WeightRef]) -> Result<()> {
        self.barrier()?;
        match self.cache.residency() {
            Residency::Mapped => match MappedFile::register(&self.dev, file) {
                Ok(m) => {
                    self.cache.set_mapping(file.bytes(), m.device_ptr);
                    self.mapped = Some(m);
                }
                Err(e) => self.fall_back_from_mapped(e, weights)?,
            },
            Residency::Upload => {
                let ws = weights.iter().map(|w| (*w, layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), DeviceClass::Gpu)));
                self.cache.preload(ws)?;
            }
            Residency::Device => {}
        }
        Ok(())
    }

    fn weight_stats(&self) -> Option<WeightStats> {
        Some(WeightStats { graphs: Some(self.replay.borrow().stats), ..self.cache.stats() })
    }

    fn memory_target(&self) -> Option<crate::backend::memory::MemoryTarget> {
        self.target()
    }

    fn memory_window(&mut self, open: bool) -> Result<bool> {
        self.barrier()?;
        self.dev.memory_window(open).map_err(derr("memory window"))?;
        Ok(true)
    }

    fn place_host_experts(&mut self, layers: usize, bytes: u64) -> Result<bool> {
        self.place_experts(layers, bytes)
    }

    fn alloc(&mut self, len: usize) -> Result<Buf> {
        self.barrier()?;
        let b = self.dev.alloc(len * 4).map_err(|e| match e {
            super::DriverError::Call { code: 2, .. } => BackendError::OutOfMemory { what: "activation buffer", bytes: len as u64 * 4 },
            e => BackendError::Invalid { op: "alloc", msg: e.to_string() },
        })?;
        self.dev.memset(b.ptr(), 0, len * 4).map_err(derr("alloc"))?;
        let h = self.next;
        self.next += 1;
        self.tick += 1;
        self.bufs.insert(h, (readback::ActMem::Device(b), len, self.tick));
        Ok(Buf(h))
    }

    fn alloc_readback(&mut self, len: usize) -> Result<Buf> {
        self.alloc_mapped(len)
    }

    fn free(&mut self, buf: Buf) -> Result<()> {
        self.barrier()?;
        self.bufs.remove(&buf.0).map(|_| ()).ok_or(BackendError::BadHandle(buf))
    }

    fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()> {
        let (p, n) = self.buf(buf)?;
        Self::check_len("write", buf, n, src.len())?;
        self.touch(buf);
        self.barrier()?;
        self.dev.write(p, bytemuck::cast_slice(src)).map_err(derr("write"))
    }

    fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()> {
        let (p, n) = self.buf(buf)?;
        Self::check_len("read", buf, n, dst.len())?;
        self.end_step()?;
        self.retired.clear();
        if let Some(h) = self.mapped_view(buf, dst.len())? {
            dst.copy_from_slice(h);
            return Ok(());
        }
        self.readback.read(&self.dev, p, bytemuck::cast_slice_mut(dst)).map_err(derr("read"))
    }

    fn read_with(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        self.read_lent(buf, n, host, f)
    }

    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        self.barrier()?;
        if attention::kv_code(spec.ty.k).is_none() || attention::kv_code(spec.ty.v).is_none() {
            let msg = format!("the GPU backends keep K and V in f16, q8_0 or q4_0, not {} (f32 is the CPU's precise variant)", spec.ty);
            return Err(BackendError::Invalid { op: "alloc_kv", msg });
        }
        if let Some(why) = spec.ty.unsupported(spec.head_dim_k, spec.head_dim_v) {
            return Err(BackendError::Invalid { op: "alloc_kv", msg: why });
        }
        if spec.head_dim_k != spec.head_dim_v {
            return Err(BackendError::Invalid { op: "alloc_kv", msg: format!("head_dim_k {} != head_dim_v {}", spec.head_dim_k, spec.head_dim_v) });
        }
        if let Some(a) = spec.alt {
            return Err(BackendError::Unavailable(crate::backend::gpu::ALT_HEADS_NOT_YET.replace("{}", &format!("{a:?}"))));
        }

        // Each plane slot-major: n_ctx (or a window-sized layer's) rows of n_kv_head·head_dim values (f16, or blocks).
        let total = ring::layout(spec).1;
        let mem = self.dev.alloc(total).map_err(|_| BackendError::OutOfMemory { what: "KV cache", bytes: total as u64 })?;
        self.dev.mem_mark(&format!("KV cache {} MiB", total >> 20));
        let h = self.next;
        self.next += 1;
        self.kvs.insert(h, Kv::new(*spec, mem));
        Ok(KvCache(h))
    }

    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.barrier()?;
        self.kvs.remove(&kv.0).map(|_| ()).ok_or(BackendError::BadKvHandle(kv))
    }

    fn copy_kv(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        self.barrier()?;
        self.copy_kv_rows(src, dst, n)
    }

    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        let k = w.row_len();
        let (o, n) = self.buf(out)?;
        Self::check_len("get_rows", out, n, ids.len() * k)?;
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= w.n_rows()) {
            return Err(BackendError::Invalid { op: "get_rows", msg: format!("row {bad} of `{}` which has {} rows", w.name(), w.n_rows()) });
        }
        let wp = self.weight(w)?;
        let idp = self.stage_bytes(bytemuck::cast_slice(ids))?;
        if let Some(first) = super::replay::first_launch(|d| elementwise::get_rows(d, wp, w.ty(), k, idp, ids.len(), o, 1.0)) {
            self.speculate(&first)?;
        }
        let r = elementwise::get_rows(&self.rec(), wp, w.ty(), k, idp, ids.len(), o, 1.0).map_err(err("get_rows"));
        self.touch(out);
        r
    }

    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        self.planned_matmul(w, x, n_tok, y)
    }

    fn matmul_glu(&mut self, gate: &WeightRef, up: &WeightRef, x: Buf, n_tok: usize, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        let (pg, pu) = (probe::weight(gate), probe::weight(up));
        let blas = plan::blas_candidate(&pg, n_tok, &self.tuning) && self.blas_open();
        if plan::matmul_glu(&pg, &pu, n_tok, blas, &self.tuning) == GluPlan::Separate {
            self.matmul_multi(x, n_tok, &[(gate, out), (up, tmp)])?;
            return self.glu(out, tmp, out, n_tok * gate.n_rows(), act);
        }
        let (ty, lay, k, rows) = (pg.ty, pg.layout, pg.k, pg.rows);
        let (xp, xn) = self.buf(x)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("matmul_glu", x, xn, n_tok * k)?;
        Self::check_len("matmul_glu", out, on, n_tok * rows)?;
        let gp = self.weight(gate)?;
        let upp = self.weight(up)?;
        let xa = match quantize::act_fmt(ty) {
            Some(f) => self.act_values(x, f, k, n_tok, "matmul_glu")?,
            None => xp,
        };
        let r = gemm::gemm_glu(&self.rec(), gp, upp, ty, lay, rows, k, xa, op, n_tok, act == Glu::GeluTanh)
            .map_err(|e| BackendError::Invalid { op: "matmul_glu", msg: format!("{} / {}: {e}", gate.name(), up.name()) });
        self.touch(out);
        r
    }

    fn rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("rms_norm", x, xn, n_rows * row_len)?;
        Self::check_len("rms_norm", out, on, n_rows * row_len)?;
        let wp = match w {
            Some(w) => {
                if w.row_len() * w.n_rows() != row_len {
                    return Err(BackendError::Invalid { op: "rms_norm", msg: format!("weight `{}` has {} values, rows have {row_len}", w.name(), w.row_len() * w.n_rows()) });
                }
                Some(self.weight_f32(w)?)
            }
            None => None,
        };
        if row_len % 32 == 0 {
            let (fmt, _, q) = self.act_producer(out, Some(row_len), n_rows * row_len, "rms_norm")?;
            norm_rope::rmsnorm_q8(&self.rec(), xp, wp, op, q, n_rows, row_len, eps, fmt).map_err(err("rms_norm"))?;
            self.touch(out);
            self.act_produced(out, fmt, row_len, n_rows * row_len);
            return Ok(());
        }
        let r = norm_rope::rmsnorm(&self.rec(), xp, wp, op, n_rows, row_len, eps).map_err(err("rms_norm"));
        self.touch(out);
        r
    }

    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        Self::check_len("rope", x, xn, pos.len() * n_head * head_dim)?;
        let ff = self.rope_factors(rope)?;
        let pp = self.positions(pos)?;
        let ts = norm_rope::rope_theta_scale(rope.freq_base, rope.n_rot);
        let r = norm_rope::rope(&self.rec(), xp, pp, ff, pos.len(), n_head, head_dim, rope.n_rot, rope.mode == RopeMode::Neox, ts, norm_rope::kernel_freq_scale(rope), 1.0).map_err(err("rope"));
        self.touch(x);
        r
    }

    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        let (ap, an) = self.buf(a)?;
        let (bp, bn) = self.buf(b)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("add", a, an, n)?;
        Self::check_len("add", b, bn, n)?;
        Self::check_len("add", out, on, n)?;
        let r = elementwise::add(&self.rec(), ap, bp, op, n).map_err(err("add"));
        self.touch(out);
        r
    }

    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        let n = bias.row_len() * bias.n_rows();
        let (xp, xn) = self.buf(x)?;
        Self::check_len("add_bias", x, xn, n_tok * n)?;
        let bp = self.weight_f32(bias)?;
        let r = elementwise::add_bias(&self.rec(), xp, bp, n, n_tok * n).map_err(err("add_bias"));
        self.touch(x);
        r
    }

    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        let (xp, xn) = self.buf(x)?;
        Self::check_len("scale", x, xn, n)?;
        let r = elementwise::scale(&self.rec(), xp, xp, n, s).map_err(err("scale"));
        self.touch(x);
        r
    }

    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        let (gp, gn) = self.buf(gate)?;
        let (up_, un) = self.buf(up)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("glu", gate, gn, n)?;
        Self::check_len("glu", up, un, n)?;
        Self::check_len("glu", out, on, n)?;
        if n % 32 == 0 {
            let (fmt, row_len, q) = self.act_producer(out, None, n, "glu")?;
            elementwise::glu_q8(&self.rec(), gp, up_, op, q, n, act == Glu::GeluTanh, fmt).map_err(err("glu"))?;
            self.touch(out);
            self.act_produced(out, fmt, row_len, n);
            return Ok(());
        }
        let r = elementwise::glu(&self.rec(), gp, up_, op, n, act == Glu::GeluTanh).map_err(err("glu"));
        self.touch(out);
        r
    }

    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
        let (sp, sn) = self.buf(src)?;
        let (dp, dn) = self.buf(dst)?;
        Self::check_len("copy", src, sn, src_off + n)?;
        Self::check_len("copy", dst, dn, dst_off + n)?;
        if n == 0 {
            return Ok(());
        }
        let e = Entry::Copy { dst: dp + dst_off as u64 * 4, src: sp + src_off as u64 * 4, bytes: n * 4 };
        let r = self.replay.get_mut().submit(&self.dev, e).map_err(derr("copy"));
        self.touch(dst);
        r
    }

    fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
        let (kp, kn) = self.buf(k)?;
        let (vp, vn) = self.buf(v)?;
        self.kv_room("kv_write", kv, layer, pos)?;
        let (kc, vc, s) = self.kv_layer("kv_write", kv, layer)?;
        let (rk, rv) = (s.n_kv_head * s.head_dim_k, s.n_kv_head * s.head_dim_v);
        Self::check_len("kv_write", k, kn, pos.len() * rk)?;
        Self::check_len("kv_write", v, vn, pos.len() * rv)?;
        if let Some(&bad) = pos.iter().find(|&&p| p as usize >= s.n_ctx) {
            return Err(BackendError::Invalid { op: "kv_write", msg: format!("position {bad} past the cache's {} slots", s.n_ctx) });
        }
        let pp = self.positions(pos)?;
        let f = err("kv_write");
        match plan::kv_store(s.ty) {
            plan::KvStore::F16 => elementwise::kv_store(&self.rec(), kp, vp, kc, vc, rk, rv, pp, pos.len()).map_err(&f)?,
            plan::KvStore::Quant => attention::kv_store_q(&self.rec(), kp, vp, kc, vc, rk, rv, pp, pos.len(), s.ty).map_err(&f)?,
        }
        Ok(())
    }

    fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        let (qp, qn) = self.buf(q)?;
        let (op, on) = self.buf(out)?;
        Self::check_len("attention", q, qn, pos.len() * p.n_head * p.head_dim_k)?;
        Self::check_len("attention", out, on, pos.len() * p.n_head * p.head_dim_v)?;
        self.kv_visible("attention", kv, layer, pos, p.window)?;
        let (kc, vc, spec) = self.kv_layer("attention", kv, layer)?;
        if let Some(msg) = rope_attn::attn_unsupported(p, &spec) {
            return Err(BackendError::Invalid { op: "attention", msg });
        }
        let (window, sinks) = (p.window.unwrap_or(0), p.sinks.as_ref().map(|w| self.weight_f32(w)).transpose()?);
        let pp = self.positions(pos)?;
        let values = pos.len() * p.n_head * p.head_dim_v;
        // Decode: the output projection's q8_1 input, written by the attention kernel
        // itself where the plan says (it writes per head, so not the K form a K-quant
        // projection reads).
        let max_keys = if window > 0 { window.min(spec.n_ctx) } else { spec.n_ctx };
        let shape = plan::AttnShape { n_tok: pos.len(), head_dim: p.head_dim_k, n_head: p.n_head, max_keys, wants_k: self.act_wants_k(out), kv: spec.ty, sinks: sinks.is_some() };
        let plan = plan::attention(&shape, &self.tuning, &mut probe::Probe { dev: &self.dev, cache: &mut self.occ });
        let scratch = match plan {
            plan::Attn::Flash { .. } => {
                self.touch(out);
                return flash_attn::flash_attention(&self.rec(), qp, kc, vc, op, pos.len(), p.n_head, p.n_kv_head, p.head_dim_k, pp, window, p.scale).map_err(err("attention"));
            }
            plan::Attn::QuantFlash { .. } => {
                self.touch(out);
                return self.kvq_flash(qp, kc, vc, op, pos, pp, &spec, p, window);
            }
            plan::Attn::QuantDecode { parts, .. } => Some(self.kvq_decode_scratch(p, parts)?),
            _ => None,
        };
        let q8 = match plan {
            plan::Attn::Decode { q8: true } | plan::Attn::Quant { q8: true } | plan::Attn::QuantDecode { q8: true, .. } => Some(self.act_producer(out, Some(32), values, "attention")?.2),
            _ => None,
        };
        self.touch(out);
        match (plan, scratch) {
            (plan::Attn::QuantDecode { parts, min_keys, .. }, Some(s)) => self.kvq_decode(qp, kc, vc, op, q8, pp, &spec, p, window, parts, min_keys, s)?,
            (plan::Attn::Quant { .. }, _) => attention::attention_kvq(&self.rec(), qp, kc, vc, op, q8, pos.len(), p.n_head, p.n_kv_head, p.head_dim_k, pp, window, p.scale, spec.ty).map_err(err("attention"))?,
            _ => attention::attention_q8(&self.rec(), qp, kc, vc, op, q8, pos.len(), p.n_head, p.n_kv_head, p.head_dim_k, pp, window, p.scale, sinks).map_err(err("attention"))?,
        }
        if q8.is_some() {
            self.act_produced(out, launch::ActFmt::Q8_1, 32, values);
        }
        Ok(())
    }

    fn matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        self.fused_matmul_multi(x, n_tok, outs)
    }

    fn add_rms_norm(&mut self, x: Buf, b: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        self.fused_add_rms_norm(x, b, out, n_rows, row_len, w, eps)
    }

    fn matmul_residual(&mut self, w: &WeightRef, x: Buf, n_tok: usize, residual: Buf, y: Buf) -> Result<bool> {
        self.fused_matmul_residual(w, x, n_tok, residual, y)
    }

    fn norm_matmul_multi(&mut self, norm: &NormIn, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        self.fused_norm_matmul_multi(norm, n_tok, outs)
    }

    fn norm_matmul_glu(&mut self, norm: &NormIn, n_tok: usize, gate: &WeightRef, up: &WeightRef, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        self.fused_norm_matmul_glu(norm, n_tok, gate, up, out, tmp, act)
    }

    fn rope_kv_write(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep) -> Result<()> {
        self.fused_rope_kv_write(q, k, v, kv, layer, pos, p)
    }

    fn rope_kv_attention(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], prep: &QkvPrep, attn: &Attention, out: Buf) -> Result<()> {
        self.fused_rope_kv_attention(q, k, v, kv, layer, pos, prep, attn, out)
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_rows(&mut self, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        self.per_row_attention(q, k, v, kvs, layer, pos, p, out)
    }

    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> { self.moe_ffn_device(x, n_tok, p, out, tmp) }
    fn gated_delta_net(&mut self, p: &DeltaNet, x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> { self.delta_net_device(p, x, n_tok, states, out) }
    fn split_halves(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> { self.split_halves_device(src, n_rows, half, a, b) }
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> { self.mul_sigmoid_device(x, gate, n_rows, row_len, per_row) }
    fn copy_strided(&mut self, src: Buf, dst: Buf, s: &crate::backend::Strided) -> Result<()> { self.copy_strided_device(src, dst, s) }
    fn hadamard(&mut self, x: Buf, n: usize, block: usize) -> Result<()> { self.hadamard_device(x, n, block) }
}

impl Drop for GpuBackend {
    fn drop(&mut self) {
        if let Some(r) = self.replay.get_mut().profile_report() {
            eprintln!("{r}");
        }
        if let Some(r) = super::host_times::report() {
            eprintln!("{r}");
        }
        let st = self.replay.get_mut().stats;
        tracing::info!("graph replay: {st:?}");
        self.cache.set_graph_stats(st);
        self.replay.get_mut().release(&self.dev);
    }
}
