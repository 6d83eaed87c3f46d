//! [`Backend::moe_ffn`] on the GPU: the router's top-k on the device and the selected
//! experts' rows read inside the one copy of each 3-D expert tensor by expert-indexed
//! matvecs (`family/moe.rs`), with no host round trip, so a step with MoE layers is
//! replayed as a graph like any other.
//!
//! `plan::moe_ffn` chooses: `Pairs` (decode: each (token, expert) pair reads its expert's
//! rows), `Grouped` (batched decode and prefill: pairs grouped by expert on the device, 8
//! per read of an expert's rows), `Gemm` (prefill: the grouped GEMM), `Unfused` (the
//! trait's default, for expert types the kernels do not take) or `Host` (the CPU's
//! arithmetic on the rows read back: host experts, `--n-cpu-moe`).
//!
//! The arithmetic is the default's: router logits by `matmul`, softmax, top-k, the
//! renormalised weights, each pair's gated FFN with its activations quantized as the
//! matvecs of its types read them, and the weighted sum in slot order. gpt-oss adds the
//! router bias (added as `moe_route` reads the logits), softmax-weight gating (top-k
//! logits, then a softmax over those), the gate/up expert biases and `swiglu_oai` in one
//! kernel over the pairs' rows (`moe_swiglu_oai`, in place of the GLU; the GEMM's paired
//! GLU epilogue is not used), and the down bias in the weighted sum (`moe_wsum`): the
//! CPU's order (`cpu::moe::moe_host`): bias after each product, then the weight.
//! Selection ties and near-ties may resolve differently from the CPU (the device's
//! exponentials round differently); `lode selftest`'s `moe_ffn_*` checks the rest.

use super::{err, GpuBackend};
use crate::backend::gpu::family::moe::{self as fam, ExpSeg, RouteBufs};
use crate::backend::gpu::family::{gemm, quantize};
use crate::backend::gpu::plan::{self, Moe};
use crate::backend::gpu::driver::DevPtr;
use crate::backend::moe::{moe_ffn_unfused, route_len, Gating, MoeFfn, MoeScratch};
use crate::backend::{Backend, BackendError, Buf, Result};
use crate::weights::WeightRef;

const OP: &str = "moe_ffn";

/// Bytes of one expert's matrix of the 3-D tensor `w` (its rows in the stored layout).
fn expert_bytes(w: &WeightRef) -> usize {
    w.expert(0).map(|m| m.row_bytes() * m.n_rows()).unwrap_or(0)
}

impl GpuBackend {
    pub(super) fn moe_ffn_device(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
        let (e, n_exp, f) = p.dims()?;
        let k = p.n_used;
        let host_layer = self.cpu_experts.as_ref().is_some_and(|(layers, _)| crate::backend::moe::expert_tensor_layer(p.gate.name()).is_some_and(|l| l < *layers));
        let types = [(p.gate.ty(), e), (p.up.ty(), e), (p.down.ty(), f)];
        let choice = plan::moe_ffn(n_tok, n_exp, k, types, plan::moe_form(p, host_layer), &self.tuning);
        if choice == Moe::Host {
            // The layer's experts live in the file mapping (or the kernels take neither its
            // experts nor its extras): the CPU computes it on the rows read back (a sync
            // point, as llama.cpp's copy), on a host pool of one thread per core.
            if self.cpu_experts.is_none() {
                self.cpu_experts = Some((0, crate::backend::cpu::CpuBackend::build_pool(0)?));
            }
            let pool = self.cpu_experts.as_ref().map(|c| c.1.clone()).ok_or_else(|| BackendError::Invalid { op: OP, msg: "no host pool".into() })?;
            let mut xs = vec![0f32; n_tok * e];
            self.read(x, &mut xs)?;
            let rx = match p.router_x {
                Some(b) => {
                    let mut v = vec![0f32; n_tok * e];
                    self.read(b, &mut v)?;
                    Some(v)
                }
                None => None,
            };
            let mut o = vec![0f32; n_tok * e];
            crate::backend::cpu::moe::moe_host(&pool, crate::quant::Isa::best(), false, &xs, rx.as_deref(), n_tok, p, (e, n_exp, f, k), &mut o)?;
            return self.write(out, &o);
        }
        if choice == Moe::Unfused || n_tok == 0 {
            return moe_ffn_unfused(self, x, n_tok, p, out, tmp);
        }
        let pairs = n_tok * k;
        for (b, need) in [(x, n_tok * e), (out, n_tok * e), (tmp.logits, n_tok * n_exp), (tmp.xe, pairs * e), (tmp.gate, pairs * f), (tmp.up, pairs * f), (tmp.acc, pairs * e), (tmp.route, route_len(pairs, n_exp))] {
            let (_, have) = self.buf(b)?;
            Self::check_len(OP, b, have, need)?;
        }
        let fmt = |w: &WeightRef| quantize::act_fmt(w.ty()).ok_or_else(|| BackendError::Invalid { op: OP, msg: format!("`{}`: {} experts take no quantized activations", w.name(), w.ty()) });
        let (fg, fu, fd) = (fmt(p.gate)?, fmt(p.up)?, fmt(p.down)?);

        // gpt-oss's biases (F32, read in place: `plan::moe_form`).
        let bias = match &p.biases {
            Some(b) => Some([self.weight_f32(b.router)?, self.weight_f32(b.gate)?, self.weight_f32(b.up)?, self.weight_f32(b.down)?]),
            None => None,
        };
        // Router logits and the top-k, on the device.
        self.matmul(p.router, x, n_tok, tmp.logits)?;
        let (rp, _) = self.buf(tmp.route)?;
        let r = RouteBufs::carve(rp, pairs, n_exp);
        let (lp, _) = self.buf(tmp.logits)?;
        let gate = fam::Gate { bias: bias.map(|b| b[0]), weight: p.gating == Gating::SoftmaxWeight, norm: p.norm_top_k };
        fam::route(&self.rec(), lp, &r, n_tok, n_exp, k, gate).map_err(err(OP))?;
        self.touch(tmp.route);

        let (wg, wu, wd) = (self.weight(p.gate)?, self.weight(p.up)?, self.weight(p.down)?);
        let (gp, _) = self.buf(tmp.gate)?;
        let (up, _) = self.buf(tmp.up)?;
        let (ap, _) = self.buf(tmp.acc)?;
        let (op, _) = self.buf(out)?;
        let seg = |w, wr: &WeightRef, rows, x, y| ExpSeg { w, ty: wr.ty(), rows, ebytes: expert_bytes(wr), x, y };
        if choice == Moe::Gemm {
            return self.moe_experts_gemm(x, n_tok, p, out, tmp, &r, [wg, wu, wd], bias);
        }
        let grouped = choice == Moe::Grouped;

        // Gate and up of every pair.
        let xg = self.act_blocks(x, fg, e, n_tok, OP)?;
        let xu = if fu == fg { xg } else { self.act_blocks(x, fu, e, n_tok, OP)? };
        let (sg, su) = (seg(wg, p.gate, f, xg, gp), seg(wu, p.up, f, xu, up));
        if grouped {
            fam::sort(&self.rec(), &r, pairs, n_exp, fam::TILE).map_err(err(OP))?;
            let (xe, _) = self.buf(tmp.xe)?;
            let row = quantize::q8_1_bytes(e, 1);
            if fu == fg && p.gate.ty() == p.up.ty() {
                fam::gather(&self.rec(), xg, &r, xe, row, k, pairs).map_err(err(OP))?;
                fam::mv_grouped(&self.rec(), &r, n_exp, e, xe, pairs, &[sg, su]).map_err(err(OP))?;
            } else {
                for s in [sg, su] {
                    fam::gather(&self.rec(), s.x, &r, xe, row, k, pairs).map_err(err(OP))?;
                    fam::mv_grouped(&self.rec(), &r, n_exp, e, xe, pairs, &[s]).map_err(err(OP))?;
                }
            }
            self.touch(tmp.xe);
        } else {
            fam::mv_pairs(&self.rec(), &r, n_exp, e, k, pairs, &[sg, su]).map_err(err(OP))?;
        }
        self.touch(tmp.gate);
        self.touch(tmp.up);
        self.expert_act(p, tmp, &r, grouped, bias, n_exp, f, pairs)?;

        // Down of every pair (rows already in the pairs' order: grouped or not), then the
        // weighted sum per token.
        let xd = self.act_blocks(tmp.gate, fd, f, pairs, OP)?;
        let sd = seg(wd, p.down, e, xd, ap);
        if grouped {
            fam::mv_grouped(&self.rec(), &r, n_exp, f, xd, pairs, &[sd]).map_err(err(OP))?;
        } else {
            fam::mv_pairs(&self.rec(), &r, n_exp, f, 1, pairs, &[sd]).map_err(err(OP))?;
        }
        self.touch(tmp.acc);
        fam::wsum(&self.rec(), ap, &r, grouped, bias.map(|b| b[3]), op, n_tok, n_exp, k, e).map_err(err(OP))?;
        self.touch(out);
        Ok(())
    }

    /// The pairs' activation in place over `tmp.gate` (rows in grouped order when
    /// `grouped`): `swiglu_oai` with the expert's gate/up biases (gpt-oss), else the GLU.
    #[allow(clippy::too_many_arguments)]
    fn expert_act(&mut self, p: &MoeFfn, tmp: &MoeScratch, r: &RouteBufs, grouped: bool, bias: Option<[DevPtr; 4]>, n_exp: usize, f: usize, pairs: usize) -> Result<()> {
        if !p.swiglu_oai {
            return self.glu(tmp.gate, tmp.up, tmp.gate, pairs * f, p.act);
        }
        let (gp, _) = self.buf(tmp.gate)?;
        let (up, _) = self.buf(tmp.up)?;
        fam::swiglu_oai(&self.rec(), gp, up, r, grouped, bias.map(|b| (b[1], b[2])), n_exp, f, pairs).map_err(err(OP))?;
        self.touch(tmp.gate);
        Ok(())
    }

    /// The experts as grouped GEMMs (`plan::Moe::Gemm`), after the routing: pairs grouped
    /// by expert in tiles of 16, the input rows (their quantized values as f32, as the GEMM
    /// reads activations) gathered in that order, gate/up as one paired launch (two and the
    /// GLU when their types differ), down as one, the weighted sum through the inverse order.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts_gemm(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch, r: &RouteBufs, w: [DevPtr; 3], bias: Option<[DevPtr; 4]>) -> Result<()> {
        let (e, n_exp, f) = p.dims()?;
        let (k, pairs) = (p.n_used, n_tok * p.n_used);
        let [wg, wu, wd] = w;
        let fmt = |w: &WeightRef| quantize::act_fmt(w.ty()).ok_or_else(|| BackendError::Invalid { op: OP, msg: format!("`{}`: no activation form", w.name()) });
        let (fg, fu, fd) = (fmt(p.gate)?, fmt(p.up)?, fmt(p.down)?);
        fam::sort(&self.rec(), r, pairs, n_exp, gemm::MOE_TILE).map_err(err(OP))?;
        let (xe, _) = self.buf(tmp.xe)?;
        let (gp, _) = self.buf(tmp.gate)?;
        let (up, _) = self.buf(tmp.up)?;
        let (ap, _) = self.buf(tmp.acc)?;
        let (op, _) = self.buf(out)?;
        let gelu = p.act == crate::backend::Glu::GeluTanh;
        let map = |e: crate::backend::gpu::GpuError| BackendError::Invalid { op: OP, msg: format!("{} / {} / {}: {e}", p.gate.name(), p.up.name(), p.down.name()) };
        let xg = self.act_values(x, fg, e, n_tok, OP)?;
        fam::gather(&self.rec(), xg, r, xe, e * 4, k, pairs).map_err(err(OP))?;
        if p.gate.ty() == p.up.ty() && fg == fu && p.swiglu_oai {
            // gpt-oss: gate and up over the same gathered rows, then the biased swiglu_oai.
            gemm::gemm_moe(&self.rec(), r, n_exp, wg, None, p.gate.ty(), expert_bytes(p.gate), f, e, xe, gp, pairs, false).map_err(map)?;
            gemm::gemm_moe(&self.rec(), r, n_exp, wu, None, p.up.ty(), expert_bytes(p.up), f, e, xe, up, pairs, false).map_err(map)?;
            self.touch(tmp.gate);
            self.touch(tmp.up);
            self.expert_act(p, tmp, r, true, bias, n_exp, f, pairs)?;
        } else if p.gate.ty() == p.up.ty() && fg == fu {
            gemm::gemm_moe(&self.rec(), r, n_exp, wg, Some(wu), p.gate.ty(), expert_bytes(p.gate), f, e, xe, gp, pairs, gelu).map_err(map)?;
            self.touch(tmp.gate);
        } else {
            gemm::gemm_moe(&self.rec(), r, n_exp, wg, None, p.gate.ty(), expert_bytes(p.gate), f, e, xe, gp, pairs, false).map_err(map)?;
            let xu = self.act_values(x, fu, e, n_tok, OP)?;
            fam::gather(&self.rec(), xu, r, xe, e * 4, k, pairs).map_err(err(OP))?;
            gemm::gemm_moe(&self.rec(), r, n_exp, wu, None, p.up.ty(), expert_bytes(p.up), f, e, xe, up, pairs, false).map_err(map)?;
            self.touch(tmp.gate);
            self.touch(tmp.up);
            self.expert_act(p, tmp, r, true, bias, n_exp, f, pairs)?;
        }
        self.touch(tmp.xe);
        let xd = self.act_values(tmp.gate, fd, f, pairs, OP)?;
        gemm::gemm_moe(&self.rec(), r, n_exp, wd, None, p.down.ty(), expert_bytes(p.down), e, f, xd, ap, pairs, false).map_err(map)?;
        self.touch(tmp.acc);
        fam::wsum(&self.rec(), ap, r, true, bias.map(|b| b[3]), op, n_tok, n_exp, k, e).map_err(err(OP))?;
        self.touch(out);
        Ok(())
    }
}
