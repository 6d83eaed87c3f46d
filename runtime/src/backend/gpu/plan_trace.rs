//! The plan of a forward pass without a GPU: [`PlanTrace`] is a [`Backend`] that holds no
//! data and runs no kernel; each op asks `plan.rs` exactly as the GPU backend does (with
//! the same activation-form bookkeeping, `act_forms.rs`) and records the kernel it names.
//! `lode inspect --plan` drives a prefill chunk and a decode step through it.
//!
//! The device figures are [`Sm90`]'s (an H200's occupancy, `sms` multiprocessors), the
//! BLAS is taken to open unless the tuning says `blas=0`, and the LM head's weight is taken
//! to be 16-byte aligned (it is, in every layout lode makes).

use crate::backend::gpu::family::{decode_mv, head_mv, quantize};
use crate::backend::gpu::launch::ActFmt;
use super::act_forms::FormBook;
use super::plan::{self, Attn, GluPlan, Matmul, Multi, NormMv, Sm90};
use super::tuning::Tuning;
use crate::backend::{norm_in, rope_kv_write_unfused, Attention, Backend, BackendError, Buf, DeltaIn, DeltaNet, DeltaState, Glu, KvCache, KvSpec, NormIn, QkvPrep, Result, Rope};
use crate::weights::layout::{self, Consumer, DeviceClass};
use crate::weights::WeightRef;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// One op of the trace: its name, what it reads (weights and shapes) and the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub op: &'static str,
    pub what: String,
    pub kernel: String,
}

/// The trace's shared log (the engine owns the backend; the caller keeps this).
pub type Log = Arc<Mutex<Vec<Step>>>;

/// A backend that records the plan's choices.
pub struct PlanTrace {
    tuning: Tuning,
    occ: Sm90,
    /// Per buffer: (length, version).
    bufs: HashMap<u32, (usize, u64)>,
    kvs: HashMap<u32, KvSpec>,
    next: u32,
    tick: u64,
    book: FormBook,
    log: Log,
}

fn pw(w: &WeightRef) -> plan::Weight {
    plan::Weight { ty: w.ty(), layout: layout::canonical(w.ty(), Consumer::Matrix, DeviceClass::Gpu), rows: w.n_rows(), k: w.row_len() }
}

fn fmt_name(f: ActFmt) -> &'static str {
    match f {
        ActFmt::Q8_1 => "q8_1",
        ActFmt::K => "q8_K",
    }
}

/// A kernel's name for the trace, from the plan's choice.
fn matmul_kernel(m: &Matmul, w: &plan::Weight) -> String {
    let ty = w.ty.name().to_lowercase();
    match m {
        Matmul::Blas => format!("dequant_f16_{ty} + {} f16 GEMM", "vendor BLAS"),
        Matmul::QuantMv(q) if q.two => format!("decode_mv_quant2 ({} rows/block)", q.rows_per_block),
        Matmul::QuantMv(q) => format!("decode_mv_quant ({} warps/row, {} rows/block)", q.wpr, q.rows_per_block),
        Matmul::SplitWalk { steps, blocks } => format!("decode_mv_split ({steps} warps/row, {blocks} blocks)"),
        Matmul::Gemm { tile } => format!("gemm_{ty}_n{tile}"),
        Matmul::Matvec => format!("matvec_{ty}"),
        Matmul::FloatTile => format!("matvec_{ty}_tile"),
        Matmul::GemmSplit { splits, per } => format!("gemm_{ty}_k64 ({splits} splits of {per} K steps) + gemm_ksum"),
        Matmul::Mmq { splits, per, mma } => {
            let k = if *mma { format!("mmq_mma_{ty}") } else { format!("mmq_{ty}") };
            if *splits == 1 { k } else { format!("{k} ({splits} splits of {per} K steps) + mmq_ksum") }
        }
    }
}

impl PlanTrace {
    /// A trace under `tuning` on a device of `sms` multiprocessors, appending to `log`.
    pub fn new(tuning: Tuning, sms: usize, log: Log) -> PlanTrace {
        PlanTrace { tuning, occ: Sm90 { sms }, bufs: HashMap::new(), kvs: HashMap::new(), next: 1, tick: 0, book: FormBook::default(), log }
    }

    fn push(&self, op: &'static str, what: String, kernel: impl Into<String>) {
        if let Ok(mut l) = self.log.lock() {
            l.push(Step { op, what, kernel: kernel.into() });
        }
    }

    fn version(&self, b: Buf) -> u64 {
        self.bufs.get(&b.0).map(|e| e.1).unwrap_or(0)
    }

    fn touch(&mut self, b: Buf) {
        self.tick += 1;
        if let Some(e) = self.bufs.get_mut(&b.0) {
            e.1 = self.tick;
        }
    }

    /// `act_blocks`: x's `fmt` blocks are quantized unless current; then current.
    fn quantize(&mut self, x: Buf, fmt: ActFmt, k: usize, n_tok: usize) -> bool {
        let (key, held) = self.book.consume(x.0, self.version(x), fmt, k, n_tok);
        self.book.holds(fmt, key);
        !held
    }

    /// A producer wrote `out` with its quantized form (`act_producer` + `act_produced`).
    fn produce(&mut self, out: Buf, row_len: Option<usize>, values: usize) -> ActFmt {
        let (fmt, k) = self.book.producer_form(out.0, row_len, values);
        self.touch(out);
        let key = FormBook::key(out.0, self.version(out), fmt, row_len.unwrap_or(k), 1);
        self.book.holds(fmt, (key.0, key.1, key.2, values));
        fmt
    }

    fn names(ws: &[&WeightRef]) -> String {
        ws.iter().map(|w| format!("{} {} {}×{}", w.name(), w.ty().name(), w.n_rows(), w.row_len())).collect::<Vec<_>>().join(", ")
    }

    fn blas_open(&self) -> bool {
        self.tuning.blas
    }
}

impl Backend for PlanTrace {
    fn name(&self) -> String {
        format!("plan trace ({} multiprocessors, sm_90 occupancy)", self.occ.sms)
    }
    fn alloc(&mut self, len: usize) -> Result<Buf> {
        let h = self.next;
        self.next += 1;
        self.tick += 1;
        self.bufs.insert(h, (len, self.tick));
        Ok(Buf(h))
    }
    fn free(&mut self, buf: Buf) -> Result<()> {
        self.bufs.remove(&buf.0).map(|_| ()).ok_or(BackendError::BadHandle(buf))
    }
    fn write(&mut self, buf: Buf, _src: &[f32]) -> Result<()> {
        self.touch(buf);
        Ok(())
    }
    fn read(&mut self, _buf: Buf, dst: &mut [f32]) -> Result<()> {
        dst.fill(0.0);
        Ok(())
    }
    // qwen35's ops: `plan::gated_delta_net` chooses the device kernels or the host default.
    fn gated_delta_net(&mut self, p: &DeltaNet, _x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        let d = p.dims;
        let what = format!("{n_tok} tok × {}/{} heads × {}, {} state(s), conv {}", d.n_v_heads, d.n_k_heads, d.head_v_dim, states.len(), d.d_conv);
        let how = match super::plan::gated_delta_net(&d, p.conv.ty(), &self.tuning) {
            super::plan::Delta::Device => format!("delta_conv_k4 + delta_rule_h{} + delta_norm (states on the device)", d.head_k_dim),
            super::plan::Delta::Host => "host: operands and states read back, written again".into(),
        };
        self.push("gated_delta_net", what, how);
        self.touch(out);
        Ok(())
    }
    // `plan::moe_ffn` chooses (the experts of every layer on the device here).
    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &crate::backend::MoeFfn, out: Buf, tmp: &crate::backend::MoeScratch) -> Result<()> {
        let (e, n_exp, f) = p.dims()?;
        let types = [(p.gate.ty(), e), (p.up.ty(), e), (p.down.ty(), f)];
        let form = super::plan::moe_form(p, false);
        let act = if p.swiglu_oai { "moe_swiglu_oai (expert biases)" } else { "GLU" };
        let how = match super::plan::moe_ffn(n_tok, n_exp, p.n_used, types, form, &self.tuning) {
            super::plan::Moe::Unfused => return crate::backend::moe::moe_ffn_unfused(self, x, n_tok, p, out, tmp),
            super::plan::Moe::Host => "host: rows read back, the CPU's MoE, written again".to_string(),
            super::plan::Moe::Pairs => format!("moe_route + moe_mv_n1 (gate|up) + {act} + moe_mv_n1 (down) + moe_wsum"),
            super::plan::Moe::Grouped => format!("moe_route + moe_sort + moe_gather + moe_mv8_{} + {act} + moe_mv8 (down) + moe_wsum", p.gate.ty().to_string().to_lowercase()),
            super::plan::Moe::Gemm => format!("moe_route + moe_sort + moe_gather + gemm_moe_{} + {act} + gemm_moe (down) + moe_wsum", p.gate.ty().to_string().to_lowercase()),
        };
        let what = format!("{}, {} ({}/{}/{} {n_exp}×{f}×{e}) × {n_tok} tok", p.router.name(), p.down.name(), p.gate.ty().name(), p.up.ty().name(), p.down.ty().name());
        self.push("moe_ffn", what, how);
        self.touch(out);
        Ok(())
    }
    fn split_halves(&mut self, _src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        self.push("split_halves", format!("{n_rows}×2×{half}"), "split_halves_f32");
        self.touch(a);
        self.touch(b);
        Ok(())
    }
    fn copy_strided(&mut self, _src: Buf, dst: Buf, s: &crate::backend::Strided) -> Result<()> {
        self.push("copy_strided", format!("{}×{}×{}", s.n[0], s.n[1], s.n[2]), "copy_strided_f32");
        self.touch(dst);
        Ok(())
    }
    fn mul_sigmoid(&mut self, x: Buf, _gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        self.push("mul_sigmoid", format!("{n_rows}×{row_len}{}", if per_row { " (a gate per row)" } else { "" }), "mul_sigmoid_f32");
        self.touch(x);
        Ok(())
    }
    fn hadamard(&mut self, x: Buf, n: usize, block: usize) -> Result<()> {
        self.push("hadamard", format!("{}×{block} (the quantized cache's rotation)", n / block.max(1)), "hadamard_f32");
        self.touch(x);
        Ok(())
    }
    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        let h = self.next;
        self.next += 1;
        self.kvs.insert(h, *spec);
        Ok(KvCache(h))
    }
    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.kvs.remove(&kv.0).map(|_| ()).ok_or(BackendError::BadKvHandle(kv))
    }
    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        self.push("get_rows", format!("{} × {} ids", Self::names(&[w]), ids.len()), format!("get_rows_{}", w.ty().name()));
        self.touch(out);
        Ok(())
    }

    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        let p = pw(w);
        let fmt = quantize::act_fmt(w.ty());
        let x_ready = match fmt {
            Some(f) if n_tok == 1 && x != y => self.book.consume(x.0, self.version(x), f, w.row_len(), 1).1,
            _ => false,
        };
        let q = plan::MatmulIn { w: p, n_tok, blas: self.blas_open(), x_is_y: x == y, x_ready };
        let m = plan::matmul(&q, &self.tuning, &mut self.occ);
        let mut kernel = matmul_kernel(&m, &p);
        match (m, fmt) {
            (Matmul::SplitWalk { .. }, _) => {
                self.quantize(x, ActFmt::K, w.row_len(), 1);
            }
            (Matmul::Matvec | Matmul::Mmq { .. }, Some(f)) => {
                if self.quantize(x, f, w.row_len(), n_tok) {
                    kernel = format!("quantize_{} + {kernel}", fmt_name(f));
                }
            }
            _ => {}
        }
        self.push("matmul", format!("{} × {n_tok} tok", Self::names(&[w])), kernel);
        self.touch(y);
        Ok(())
    }

    fn matmul_glu(&mut self, gate: &WeightRef, up: &WeightRef, x: Buf, n_tok: usize, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        let (g, u) = (pw(gate), pw(up));
        if plan::matmul_glu(&g, &u, n_tok, self.blas_open(), &self.tuning) == GluPlan::Separate {
            self.matmul_multi(x, n_tok, &[(gate, out), (up, tmp)])?;
            return self.glu(out, tmp, out, n_tok * gate.n_rows(), act);
        }
        self.push("matmul_glu", format!("{} × {n_tok} tok", Self::names(&[gate, up])), format!("gemm_glu_{}_n64", g.ty.name().to_lowercase()));
        self.touch(out);
        Ok(())
    }

    fn rms_norm(&mut self, _x: Buf, out: Buf, n_rows: usize, row_len: usize, _w: Option<&WeightRef>, _eps: f32) -> Result<()> {
        if row_len % 32 == 0 {
            let f = self.produce(out, Some(row_len), n_rows * row_len);
            self.push("rms_norm", format!("{n_rows}×{row_len}"), format!("rmsnorm_q8 (writes {})", fmt_name(f)));
        } else {
            self.push("rms_norm", format!("{n_rows}×{row_len}"), "rmsnorm");
            self.touch(out);
        }
        Ok(())
    }

    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], _rope: &Rope) -> Result<()> {
        self.push("rope", format!("{} tok × {n_head}×{head_dim}", pos.len()), "rope_f32");
        self.touch(x);
        Ok(())
    }
    fn add(&mut self, _a: Buf, _b: Buf, out: Buf, n: usize) -> Result<()> {
        self.push("add", format!("{n}"), "add_f32");
        self.touch(out);
        Ok(())
    }
    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        self.push("add_bias", format!("{} × {n_tok} tok", bias.name()), "add_bias_f32");
        self.touch(x);
        Ok(())
    }
    fn scale(&mut self, x: Buf, n: usize, _s: f32) -> Result<()> {
        self.push("scale", format!("{n}"), "scale_f32");
        self.touch(x);
        Ok(())
    }
    fn glu(&mut self, _gate: Buf, _up: Buf, out: Buf, n: usize, _act: Glu) -> Result<()> {
        if n % 32 == 0 {
            let f = self.produce(out, None, n);
            self.push("glu", format!("{n}"), format!("glu_q8 (writes {})", fmt_name(f)));
        } else {
            self.push("glu", format!("{n}"), "glu_f32");
            self.touch(out);
        }
        Ok(())
    }
    fn copy(&mut self, _src: Buf, _so: usize, dst: Buf, _do: usize, n: usize) -> Result<()> {
        self.push("copy", format!("{n}"), "memcpy");
        self.touch(dst);
        Ok(())
    }
    fn kv_write(&mut self, kv: KvCache, _layer: usize, _k: Buf, _v: Buf, pos: &[u32]) -> Result<()> {
        let spec = *self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let kernel = if spec.ty.any_quantized() { format!("kv_store_q ({})", spec.ty) } else { "kv_store_f16".into() };
        self.push("kv_write", format!("{} tok", pos.len()), kernel);
        Ok(())
    }

    fn attention(&mut self, _q: Buf, kv: KvCache, _layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        let spec = *self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let values = pos.len() * p.n_head * p.head_dim_v;
        let what = format!("{} tok × {} heads ({} kv) × {}", pos.len(), p.n_head, p.n_kv_head, p.head_dim_k);
        let window = p.window.unwrap_or(0);
        let max_keys = if window > 0 { window.min(spec.n_ctx) } else { spec.n_ctx };
        let shape = plan::AttnShape { n_tok: pos.len(), head_dim: p.head_dim_k, n_head: p.n_head, max_keys, wants_k: self.book.wants_k(out.0), kv: spec.ty, sinks: p.sinks.is_some() };
        let choice = plan::attention(&shape, &self.tuning, &mut self.occ);
        match choice {
            Attn::Flash { kernel } => {
                self.push("attention", what, kernel);
                self.touch(out);
            }
            Attn::QuantFlash { kernel } => {
                self.push("attention", what, format!("kvq_to_f16 ({}) + {kernel}", spec.ty));
                self.touch(out);
            }
            Attn::Decode { q8 } | Attn::Quant { q8 } | Attn::QuantDecode { q8, .. } => {
                self.touch(out);
                if q8 {
                    let key = FormBook::key(out.0, self.version(out), ActFmt::Q8_1, 32, 1);
                    self.book.holds(ActFmt::Q8_1, (key.0, key.1, key.2, values));
                }
                let kernel = match choice {
                    Attn::QuantDecode { kernel, parts, .. } => format!("{kernel} ({}, {parts} parts)", spec.ty),
                    _ if spec.ty.any_quantized() => format!("attn_kvq ({})", spec.ty),
                    _ => "attn_f16".into(),
                };
                self.push("attention", what, if q8 { format!("{kernel} (writes q8_1)") } else { kernel });
            }
        }
        Ok(())
    }

    fn matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        let ws: Vec<plan::Weight> = outs.iter().map(|(w, _)| pw(w)).collect();
        let choice = plan::matmul_multi(&ws, n_tok, &self.tuning, &mut self.occ);
        if choice == Multi::Each {
            for (w, y) in outs {
                self.matmul(w, x, n_tok, *y)?;
            }
            return Ok(());
        }
        let k = ws[0].k;
        let mut quantized = Vec::new();
        for fmt in [ActFmt::Q8_1, ActFmt::K] {
            if ws.iter().any(|w| quantize::act_fmt(w.ty) == Some(fmt)) && self.quantize(x, fmt, k, 1) {
                quantized.push(format!("quantize_{} + ", fmt_name(fmt)));
            }
        }
        let kernel = match choice {
            Multi::Q4kLoop { blocks } => format!("matvec_q4k_loop_n1 ({blocks} blocks)"),
            _ => "matvec_multi4_n1".to_string(),
        };
        let names: Vec<&WeightRef> = outs.iter().map(|(w, _)| *w).collect();
        self.push("matmul_multi", Self::names(&names), format!("{}{kernel}", quantized.concat()));
        for (_, y) in outs {
            self.touch(*y);
        }
        Ok(())
    }

    fn add_rms_norm(&mut self, x: Buf, b: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        if !plan::add_rms_norm(row_len, out == x || out == b, &self.tuning) {
            self.add(x, b, x, n_rows * row_len)?;
            return self.rms_norm(x, out, n_rows, row_len, w, eps);
        }
        self.touch(x);
        let f = self.produce(out, Some(row_len), n_rows * row_len);
        self.push("add_rms_norm", format!("{n_rows}×{row_len}"), format!("add_rmsnorm_q8 (writes {})", fmt_name(f)));
        Ok(())
    }

    fn matmul_residual(&mut self, w: &WeightRef, x: Buf, n_tok: usize, residual: Buf, y: Buf) -> Result<bool> {
        let p = pw(w);
        let x_ready = match quantize::act_fmt(w.ty()) {
            Some(f) if n_tok == 1 && x != residual => self.book.consume(x.0, self.version(x), f, w.row_len(), 1).1,
            _ => false,
        };
        let q = plan::MatmulIn { w: p, n_tok, blas: self.blas_open(), x_is_y: x == residual, x_ready };
        if let Some(m) = plan::matmul_residual(&q, &self.tuning, &mut self.occ) {
            self.push("matmul_residual", format!("{} × 1 tok", Self::names(&[w])), format!("{} + residual", matmul_kernel(&Matmul::QuantMv(m), &p)));
            self.touch(residual);
            return Ok(true);
        }
        self.matmul(w, x, n_tok, y)?;
        Ok(false)
    }

    fn norm_matmul_multi(&mut self, norm: &NormIn, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        let ws: Vec<plan::Weight> = outs.iter().map(|(w, _)| pw(w)).collect();
        let ys: Vec<Buf> = outs.iter().map(|(_, y)| *y).collect();
        let q = plan::NormIn { n: norm.row_len, n_tok, buffers_ok: plan::norm_buffers_ok(norm, &ys), w_addr: 0 };
        let kernel = match plan::norm_multi(&q, &ws, &self.tuning, &mut self.occ) {
            NormMv::Unfused => {
                norm_in(self, norm, n_tok)?;
                return self.matmul_multi(norm.out, n_tok, outs);
            }
            NormMv::Fused { threads, half } => norm_kernel(norm.row_len, false, threads, half),
            NormMv::Walk { blocks } => format!("{} ({blocks} blocks)", decode_mv::walk_kernel(norm.row_len, &ws.iter().map(|w| w.ty).collect::<Vec<_>>()).unwrap_or("?")),
            NormMv::Head { blocks } => format!("{} ({blocks} blocks)", head_mv::kernel(norm.row_len)),
        };
        let names: Vec<&WeightRef> = outs.iter().map(|(w, _)| *w).collect();
        self.push("norm_matmul_multi", Self::names(&names), kernel);
        norm_done(self, norm, &ys);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn norm_matmul_glu(&mut self, norm: &NormIn, n_tok: usize, gate: &WeightRef, up: &WeightRef, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        let q = plan::NormIn { n: norm.row_len, n_tok, buffers_ok: plan::norm_buffers_ok(norm, &[out, tmp]), w_addr: 0 };
        let what = Self::names(&[gate, up]);
        match plan::norm_glu(&q, &pw(gate), &pw(up), &self.tuning, &mut self.occ) {
            NormMv::Fused { threads, half } => {
                self.push("norm_matmul_glu", what, norm_kernel(norm.row_len, true, threads, half));
                norm_done(self, norm, &[out]);
                Ok(())
            }
            NormMv::Walk { blocks } => {
                self.push("norm_matmul_glu", what, format!("{} ({blocks} blocks)", decode_mv::walk_kernel(norm.row_len, &[gate.ty(), up.ty()]).unwrap_or("?")));
                norm_done(self, norm, &[out, tmp]);
                self.glu(out, tmp, out, gate.n_rows(), act)
            }
            NormMv::Unfused | NormMv::Head { .. } => {
                norm_in(self, norm, n_tok)?;
                self.matmul_glu(gate, up, norm.out, n_tok, out, tmp, act)
            }
        }
    }

    fn rope_kv_write(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep) -> Result<()> {
        let spec = *self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let norm_ok = |w: &Option<WeightRef>| w.as_ref().map(|w| w.row_len() * w.n_rows() == p.head_dim).unwrap_or(true);
        let s = plan::QkvShape::of(p, &spec, norm_ok(&p.q_norm) && norm_ok(&p.k_norm) && q != k && q != v);
        if !plan::rope_kv(&s, &self.tuning) {
            return rope_kv_write_unfused(self, q, k, v, kv, layer, pos, p);
        }
        self.push("rope_kv_write", format!("{} tok × {}/{} heads × {}", pos.len(), p.n_head, p.n_kv_head, p.head_dim), "rope_kv_f32 (q/k norms, RoPE, K/V store)");
        self.touch(q);
        self.touch(k);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn rope_kv_attention(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep, a: &Attention, out: Buf) -> Result<()> {
        let spec = *self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let norm_ok = |w: &Option<WeightRef>| w.as_ref().map(|w| w.row_len() * w.n_rows() == p.head_dim).unwrap_or(true);
        let bufs = [q, k, v, out];
        let distinct = (0..4).all(|i| (i + 1..4).all(|j| bufs[i] != bufs[j]));
        let s = plan::QkvShape::of(p, &spec, norm_ok(&p.q_norm) && norm_ok(&p.k_norm) && distinct && a.sinks.is_none());
        let window = a.window.unwrap_or(0);
        let max_keys = if window > 0 { window.min(spec.n_ctx) } else { spec.n_ctx };
        let shape = (a.head_dim_k, a.head_dim_v, a.n_head, a.n_kv_head);
        let Some(c) = plan::rope_kv_attention(&s, pos.len(), shape, max_keys, &self.tuning, &mut self.occ) else {
            self.rope_kv_write(q, k, v, kv, layer, pos, p)?;
            return self.attention(q, kv, layer, pos, a, out);
        };
        let values = p.n_head * p.head_dim;
        let q8 = !self.book.wants_k(out.0);
        self.touch(out);
        if q8 {
            let key = FormBook::key(out.0, self.version(out), ActFmt::Q8_1, 32, 1);
            self.book.holds(ActFmt::Q8_1, (key.0, key.1, key.2, values));
        }
        let what = format!("1 tok × {}/{} heads × {}, {} cache slots", p.n_head, p.n_kv_head, p.head_dim, spec.n_ctx);
        self.push("rope_kv_attention", what, format!("{} ({} parts of ≥ {} keys{})", c.kernel, c.parts, c.min_keys, if q8 { ", writes q8_1" } else { "" }));
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn attention_rows(&mut self, _q: Buf, _k: Buf, _v: Buf, kvs: &[KvCache], _layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        self.push("attention_rows", format!("{} rows × {} heads × {}", pos.len().min(kvs.len()), p.n_head, p.head_dim_k), "kv_store_rows + attn_rows_f16");
        self.touch(out);
        Ok(())
    }
}

/// The fused norm kernel a [`NormMv::Fused`] launch runs.
fn norm_kernel(n: usize, glu: bool, threads: u32, half: bool) -> String {
    let name = if threads == decode_mv::WIDE { decode_mv::wide_kernel(n, glu).unwrap_or("?") } else { decode_mv::norm_kernel(n, glu) };
    format!("{name} ({threads} threads{})", if half { ", half-warp" } else { "" })
}

fn norm_done(t: &mut PlanTrace, n: &NormIn, ys: &[Buf]) {
    if n.add.is_some() {
        t.touch(n.x);
    }
    t.touch(n.out);
    for y in ys {
        t.touch(*y);
    }
}
