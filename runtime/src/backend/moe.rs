//! The mixture-of-experts feed-forward ([`Backend::moe_ffn`]): its parameters, the
//! router's arithmetic shared by every backend ([`route`]), and the default made of
//! primitive ops ([`moe_ffn_unfused`]).
//!
//! The arithmetic is llama.cpp's `build_moe_ffn` as qwen3moe calls it: router logits
//! `ffn_gate_inp · x`, a softmax over all experts, the `n_used` most probable experts,
//! their probabilities divided by their sum (`norm_top_k`; the sum clamped below at
//! 2^-14 as llama.cpp does), each selected expert's gated FFN, and the weighted outputs
//! summed in the order of the selection (most probable first).

use super::{Backend, BackendError, Buf, Glu, Result};
use crate::weights::WeightRef;

/// One layer's routed experts.
#[derive(Clone, Copy, Debug)]
pub struct MoeFfn<'a, 'w> {
    /// `ffn_gate_inp`: `[n_embd]` → `[n_expert]` router logits.
    pub router: &'a WeightRef<'w>,
    /// `ffn_gate_exps`, `ffn_up_exps` (`[n_embd, n_ff, n_expert]`) and `ffn_down_exps`
    /// (`[n_ff, n_embd, n_expert]`): whole 3-D tensors; expert `e` is
    /// [`WeightRef::expert`]`(e)` of each.
    pub gate: &'a WeightRef<'w>,
    pub up: &'a WeightRef<'w>,
    pub down: &'a WeightRef<'w>,
    /// Experts per token (`{arch}.expert_used_count`).
    pub n_used: usize,
    /// Divide the selected probabilities by their sum (qwen3moe's `norm_topk_prob`).
    pub norm_top_k: bool,
    pub act: Glu,
    /// How the router's logits become the selected experts' weights.
    pub gating: Gating,
    /// Biases of the router and of each expert's projections (gpt-oss).
    pub biases: Option<MoeBiases<'a, 'w>>,
    /// llama.cpp's `swiglu_oai` (gpt-oss) in place of `act`: `min(g, 7)·σ(1.702·min(g, 7))`
    /// times `clamp(up, −7, 7) + 1`.
    pub swiglu_oai: bool,
    /// gemma4: the router reads these rows (`[n_tok, n_embd]`) instead of the experts'
    /// input.
    pub router_x: Option<Buf>,
    /// gemma4's `ffn_down_exps.scale` `[n_expert]`: each expert's output times its value.
    pub expert_scale: Option<&'a WeightRef<'w>>,
    /// `gate` and `up` are one `ffn_gate_up_exps` tensor (`[n_embd, 2·n_ff, n_expert]`:
    /// each expert's gate rows, then its up rows), as gemma4's files carry it.
    pub gate_up_fused: bool,
}

/// llama.cpp's expert gating functions that lode runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// A softmax over every expert's logit, then the top k (qwen3moe).
    Softmax,
    /// The top k logits, then a softmax over those k (gpt-oss: `SOFTMAX_WEIGHT`).
    SoftmaxWeight,
}

/// The biases of a gpt-oss MoE layer: `ffn_gate_inp.bias` `[n_expert]`,
/// `ffn_{gate,up}_exps.bias` `[n_ff, n_expert]`, `ffn_down_exps.bias` `[n_embd, n_expert]`.
#[derive(Clone, Copy, Debug)]
pub struct MoeBiases<'a, 'w> {
    pub router: &'a WeightRef<'w>,
    pub gate: &'a WeightRef<'w>,
    pub up: &'a WeightRef<'w>,
    pub down: &'a WeightRef<'w>,
}

/// llama.cpp's `swiglu_oai` constants (`LLM_FFN_SWIGLU_OAI_MOE`).
pub const OAI_ALPHA: f32 = 1.702;
pub const OAI_LIMIT: f32 = 7.0;

/// `swiglu_oai` of one gate/up pair, as ggml's CPU computes it.
#[inline]
pub fn swiglu_oai(g: f32, u: f32) -> f32 {
    let x = g.min(OAI_LIMIT);
    let y = u.clamp(-OAI_LIMIT, OAI_LIMIT);
    x / (1.0 + (OAI_ALPHA * -x).exp()) * (y + 1.0)
}

impl MoeFfn<'_, '_> {
    /// (n_embd, n_expert, n_ff of one expert), after checking that the four tensors and
    /// `n_used` agree.
    pub fn dims(&self) -> Result<(usize, usize, usize)> {
        let bad = |msg: String| Err(BackendError::Invalid { op: "moe_ffn", msg });
        let (e, n_exp) = (self.router.row_len(), self.router.n_rows());
        let d3 = |w: &WeightRef| -> Option<(u64, u64, u64)> {
            match (w.matrix, w.view.info.dims.as_slice()) {
                (None, [a, b, c]) => Some((*a, *b, *c)),
                _ => None,
            }
        };
        let (Some(g), Some(u), Some(d)) = (d3(self.gate), d3(self.up), d3(self.down)) else {
            return bad(format!("`{}`, `{}`, `{}` must be whole 3-D expert tensors", self.gate.name(), self.up.name(), self.down.name()));
        };
        let f = if self.gate_up_fused { g.1 / 2 } else { g.1 };
        let (e64, n64) = (e as u64, n_exp as u64);
        let g = if self.gate_up_fused && g.1 == 2 * f { (g.0, f, g.2) } else { g };
        let u = if self.gate_up_fused && u.1 == 2 * f { (u.0, f, u.2) } else { u };
        if g != (e64, f, n64) || u != g || d != (f, e64, n64) {
            return bad(format!(
                "router `{}` maps {e} to {n_exp} experts; gate {g:?}, up {u:?}, down {d:?} do not match (want [{e}, F, {n_exp}] and [F, {e}, {n_exp}])",
                self.router.name()
            ));
        }
        if self.n_used == 0 || self.n_used > n_exp {
            return bad(format!("{} experts used of {n_exp}", self.n_used));
        }
        if let Some(b) = &self.biases {
            let len = |w: &WeightRef| w.row_len() * w.n_rows();
            let (fu, eu) = (f as usize, e);
            if len(b.router) != n_exp || len(b.gate) != fu * n_exp || len(b.up) != fu * n_exp || len(b.down) != eu * n_exp {
                return bad(format!(
                    "biases `{}`, `{}`, `{}`, `{}` do not match {n_exp} experts of {fu} rows over {eu}",
                    b.router.name(), b.gate.name(), b.up.name(), b.down.name()
                ));
            }
        }
        if let Some(sc) = self.expert_scale.filter(|w| w.row_len() * w.n_rows() != n_exp) {
            return bad(format!("expert scale `{}` has {} values for {n_exp} experts", sc.name(), sc.row_len() * sc.n_rows()));
        }
        Ok((e, n_exp, f as usize))
    }

    /// Whether the trait's default ([`moe_ffn_unfused`], made of primitive ops) computes
    /// this layer: not with biases, `swiglu_oai` or another gating (a backend then runs
    /// the CPU's arithmetic, [`crate::backend::cpu::moe::moe_host`]).
    pub fn plain(&self) -> bool {
        self.biases.is_none() && !self.swiglu_oai && self.gating == Gating::Softmax && self.router_x.is_none() && self.expert_scale.is_none() && !self.gate_up_fused
    }

    /// Every token's routing from its router logits (the router's bias already added),
    /// by this layer's gating.
    pub fn routes(&self, logits: &[f32], n_expert: usize) -> Vec<(u32, f32)> {
        match self.gating {
            Gating::Softmax => route_rows(logits, n_expert, self.n_used, self.norm_top_k),
            Gating::SoftmaxWeight => {
                let mut all = Vec::with_capacity(logits.len() / n_expert.max(1) * self.n_used);
                for row in logits.chunks_exact(n_expert.max(1)) {
                    route_weight(row, self.n_used, self.norm_top_k, &mut all);
                }
                all
            }
        }
    }
}

/// [`Gating::SoftmaxWeight`] of one token, appended to `out`: the `n_used` largest logits
/// (ties: the lower index first), weighted by a softmax over those (ggml's: max
/// subtracted, f64 sum, times the f32 reciprocal), then renormalised if `norm_top_k`.
pub fn route_weight(logits: &[f32], n_used: usize, norm_top_k: bool, out: &mut Vec<(u32, f32)>) {
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let sel = &idx[..n_used.min(idx.len())];
    let max = sel.iter().map(|&i| logits[i as usize]).fold(f32::NEG_INFINITY, f32::max);
    let p: Vec<f32> = sel.iter().map(|&i| (logits[i as usize] - max).exp()).collect();
    let inv = (1.0 / p.iter().map(|&v| v as f64).sum::<f64>()) as f32;
    let start = out.len();
    out.extend(sel.iter().zip(&p).map(|(&i, &v)| (i, v * inv)));
    if norm_top_k {
        let s: f32 = out[start..].iter().map(|x| x.1).sum::<f32>().max(MIN_WEIGHT_SUM);
        out[start..].iter_mut().for_each(|x| x.1 /= s);
    }
}

/// Working buffers of [`Backend::moe_ffn`] for chunks of up to `n_max` tokens. The default
/// ([`moe_ffn_unfused`]) uses the first part of each; a backend that routes on the device
/// (the GPU's `moe_ffn`) uses them per (token, expert) pair: `n_used · n_max` pairs.
#[derive(Clone, Copy, Debug)]
pub struct MoeScratch {
    /// `[n_max, n_expert]` router logits.
    pub logits: Buf,
    /// `[n_used · n_max, n_embd]`: the rows routed to one expert, gathered (the device
    /// path: the pairs' quantized input rows grouped by expert).
    pub xe: Buf,
    /// `[n_used · n_max, n_ff]` each: the gate (then GLU) and up outputs of an expert's
    /// rows, or of every pair.
    pub gate: Buf,
    pub up: Buf,
    /// `[n_max, n_embd]` the expert's down outputs (and a summand).
    pub ye: Buf,
    /// `[n_embd]` one weighted row.
    pub row: Buf,
    /// `[n_used, n_max, n_embd]` each token's weighted expert outputs, slot-major (the
    /// device path: every pair's down output).
    pub acc: Buf,
    /// [`route_len`] 4-byte words: the device path's routing (expert ids, weights, the
    /// grouping by expert).
    pub route: Buf,
}

/// Values of the routing buffer for `n_pairs` (token, expert) pairs over `n_expert`
/// experts: ids, weights, the grouped order and its inverse (`n_pairs` each), each
/// expert's offset (`n_expert + 1`), the tile count, and two values per tile (at most
/// `ceil(n_pairs / 8) + min(n_expert, n_pairs)` tiles of up to 8 pairs of one expert).
pub fn route_len(n_pairs: usize, n_expert: usize) -> usize {
    4 * n_pairs + n_expert + 2 + 2 * (n_pairs.div_ceil(8) + n_expert.min(n_pairs))
}

impl MoeScratch {
    /// The length of each buffer, in [`Self::bufs`]'s order.
    pub fn lens(n_max: usize, n_embd: usize, n_expert: usize, n_ff: usize, n_used: usize) -> [usize; 8] {
        let pairs = n_used * n_max;
        [n_max * n_expert, pairs * n_embd, pairs * n_ff, pairs * n_ff, n_max * n_embd, n_embd, pairs * n_embd, route_len(pairs, n_expert)]
    }
    /// Allocates the buffers on `be`.
    pub fn new<B: Backend + ?Sized>(be: &mut B, n_max: usize, n_embd: usize, n_expert: usize, n_ff: usize, n_used: usize) -> Result<MoeScratch> {
        let l = Self::lens(n_max, n_embd, n_expert, n_ff, n_used);
        Ok(MoeScratch {
            logits: be.alloc(l[0])?,
            xe: be.alloc(l[1])?,
            gate: be.alloc(l[2])?,
            up: be.alloc(l[3])?,
            ye: be.alloc(l[4])?,
            row: be.alloc(l[5])?,
            acc: be.alloc(l[6])?,
            route: be.alloc(l[7])?,
        })
    }
    pub fn bufs(&self) -> [Buf; 8] {
        [self.logits, self.xe, self.gate, self.up, self.ye, self.row, self.acc, self.route]
    }
}

/// The smallest sum of selected probabilities llama.cpp divides by (the smallest normal
/// f16, 2^-14).
pub const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// One token's routing from its `n_expert` router logits: `(expert, weight)` for the
/// `n_used` selected experts, most probable first (ties: the lower index first).
///
/// Softmax as ggml's CPU computes it (max subtracted, `exp` in f32, the sum in f64, then
/// multiplied by the f32 reciprocal); the selected probabilities divided by their f32
/// sum (clamped below at [`MIN_WEIGHT_SUM`]) when `norm_top_k`.
pub fn route(logits: &[f32], n_used: usize, norm_top_k: bool, out: &mut Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut p: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f64 = p.iter().map(|&v| v as f64).sum();
    let inv = (1.0 / sum) as f32;
    p.iter_mut().for_each(|v| *v *= inv);
    let mut idx: Vec<u32> = (0..p.len() as u32).collect();
    // Descending probability; a stable sort, so ties keep the lower index first.
    idx.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]));
    out.clear();
    out.extend(idx.iter().take(n_used).map(|&i| (i, p[i as usize])));
    if norm_top_k {
        let s: f32 = out.iter().map(|x| x.1).sum::<f32>().max(MIN_WEIGHT_SUM);
        out.iter_mut().for_each(|x| x.1 /= s);
    }
}

/// Every token's routing: `n_used` `(expert, weight)` per token, token-major.
pub fn route_rows(logits: &[f32], n_expert: usize, n_used: usize, norm_top_k: bool) -> Vec<(u32, f32)> {
    let mut all = Vec::with_capacity(logits.len() / n_expert.max(1) * n_used);
    let mut one = Vec::with_capacity(n_used);
    for row in logits.chunks_exact(n_expert.max(1)) {
        route(row, n_used, norm_top_k, &mut one);
        all.extend_from_slice(&one);
    }
    all
}

/// Per expert, the `(token, slot)` pairs routed to it, in token order.
pub fn group_by_expert(routes: &[(u32, f32)], n_expert: usize, n_used: usize) -> Vec<Vec<(usize, usize)>> {
    let mut groups = vec![Vec::new(); n_expert];
    for (i, &(e, _)) in routes.iter().enumerate() {
        if let Some(g) = groups.get_mut(e as usize) {
            g.push((i / n_used, i % n_used));
        }
    }
    groups
}

/// The layer of an expert tensor (`blk.N.ffn_{gate,up,down}_exps.weight`), `None` for any
/// other name.
pub fn expert_tensor_layer(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, tail) = rest.split_once('.')?;
    if !tail.starts_with("ffn_") || !tail.contains("_exps") {
        return None;
    }
    n.parse().ok()
}

/// The primitive-op default refuses what it does not compute (biases, `swiglu_oai`,
/// other gating), naming the layer.
fn not_plain(p: &MoeFfn) -> Result<()> {
    if p.plain() {
        return Ok(());
    }
    Err(BackendError::Invalid { op: "moe_ffn", msg: format!("`{}`: expert biases, swiglu_oai, softmax-weight gating, a separate router input and expert scales run only in the CPU's MoE arithmetic (moe_host)", p.gate.name()) })
}

/// Matrix `e` of the 3-D tensor `w`, or an error naming it.
pub fn expert<'w>(w: &WeightRef<'w>, e: usize) -> Result<WeightRef<'w>> {
    w.expert(e).ok_or_else(|| BackendError::Invalid { op: "moe_ffn", msg: format!("`{}` has no expert {e}", w.name()) })
}

/// [`Backend::moe_ffn`] as primitive ops: the router matmul, a host read of its logits
/// and the top-k on the host ([`route`]), then per expert with tokens: its rows gathered,
/// `matmul_glu` and `matmul` on the expert's matrices (views into the one copy of each
/// 3-D tensor), each output row scaled by its weight into its slot, and the slots summed
/// (one token: its experts in slot order, added up as they come).
/// Runs on every backend as it is; the GPU's device-side top-k and expert-indexed
/// matvecs (no host read) are the next step of issue 25.
pub fn moe_ffn_unfused<B: Backend + ?Sized>(be: &mut B, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
    let (_, n_exp, _) = p.dims()?;
    not_plain(p)?;
    be.matmul(p.router, x, n_tok, tmp.logits)?;
    let mut logits = vec![0f32; n_tok * n_exp];
    be.read(tmp.logits, &mut logits)?;
    let routes = route_rows(&logits, n_exp, p.n_used, p.norm_top_k);
    moe_experts(be, x, n_tok, p, &routes, out, tmp)
}

/// The router's logits `[n_tok, n_expert]` of the host rows `x` `[n_tok, n_embd]`, computed
/// on the host by the CPU backend's own kernels (a backend without a kernel for the
/// router's type, such as the exact GPU backend and F32 routers, gets the CPU's numbers).
pub fn router_logits_host(router: &WeightRef, x: &[f32], n_tok: usize) -> Result<Vec<f32>> {
    let qe = |source| BackendError::Quant { op: "moe_ffn", weight: router.name().to_string(), source };
    let xq = crate::quant::quantize_rows(router.ty(), x, n_tok, router.row_len()).map_err(qe)?;
    let mut y = vec![0f32; n_tok * router.n_rows()];
    crate::quant::matmul_quantized(router.data(), router.ty(), router.n_rows(), &xq, &mut y, crate::quant::Isa::best()).map_err(qe)?;
    Ok(y)
}

/// The expert half of [`moe_ffn_unfused`], given every token's routing (`n_used`
/// `(expert, weight)` per token, token-major, as [`route_rows`] gives it).
#[allow(clippy::too_many_arguments)]
pub fn moe_experts<B: Backend + ?Sized>(be: &mut B, x: Buf, n_tok: usize, p: &MoeFfn, routes: &[(u32, f32)], out: Buf, tmp: &MoeScratch) -> Result<()> {
    let (e, n_exp, _) = p.dims()?;
    not_plain(p)?;
    let k = p.n_used;
    if routes.len() != n_tok * k {
        return Err(BackendError::Invalid { op: "moe_ffn", msg: format!("{} routes for {n_tok} tokens of {k} experts", routes.len()) });
    }
    if n_tok == 1 {
        // One token (decode): its experts in slot order, each product scaled in place and
        // added to `out` directly (the same sums, half the launches).
        for (s, &(ex, w)) in routes.iter().enumerate() {
            let ex = ex as usize;
            let (g, u, d) = (expert(p.gate, ex)?, expert(p.up, ex)?, expert(p.down, ex)?);
            be.matmul_glu(&g, &u, x, 1, tmp.gate, tmp.up, p.act)?;
            be.matmul(&d, tmp.gate, 1, tmp.ye)?;
            be.scale(tmp.ye, e, w)?;
            if s == 0 {
                be.copy(tmp.ye, 0, out, 0, e)?;
            } else {
                be.add(out, tmp.ye, out, e)?;
            }
        }
        return Ok(());
    }
    for (ex, toks) in group_by_expert(routes, n_exp, k).into_iter().enumerate() {
        if toks.is_empty() {
            continue;
        }
        let m = toks.len();
        for (j, &(t, _)) in toks.iter().enumerate() {
            be.copy(x, t * e, tmp.xe, j * e, e)?;
        }
        let (g, u, d) = (expert(p.gate, ex)?, expert(p.up, ex)?, expert(p.down, ex)?);
        be.matmul_glu(&g, &u, tmp.xe, m, tmp.gate, tmp.up, p.act)?;
        be.matmul(&d, tmp.gate, m, tmp.ye)?;
        for (j, &(t, s)) in toks.iter().enumerate() {
            be.copy(tmp.ye, j * e, tmp.row, 0, e)?;
            be.scale(tmp.row, e, routes[t * k + s].1)?;
            be.copy(tmp.row, 0, tmp.acc, (s * n_tok + t) * e, e)?;
        }
    }
    let n = n_tok * e;
    be.copy(tmp.acc, 0, out, 0, n)?;
    for s in 1..k {
        be.copy(tmp.acc, s * n, tmp.ye, 0, n)?;
        be.add(out, tmp.ye, out, n)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Softmax, top-k (most probable first) and the renormalisation, by hand.
    #[test]
    fn route_picks_the_most_probable_and_renormalises() {
        let logits = [0.0f32, 2.0, -1.0, 1.0];
        let mut r = Vec::new();
        route(&logits, 2, false, &mut r);
        let z: f32 = logits.iter().map(|l| (l - 2.0f32).exp()).sum();
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0].1 - 1.0 / z).abs() < 1e-6 && (r[1].1 - (-1.0f32).exp() / z).abs() < 1e-6, "{r:?}");
        route(&logits, 2, true, &mut r);
        let (a, b) = (1.0, (-1.0f32).exp());
        assert!((r[0].1 - a / (a + b)).abs() < 1e-6 && (r[1].1 - b / (a + b)).abs() < 1e-6, "{r:?}");
        assert!((r[0].1 + r[1].1 - 1.0).abs() < 1e-6);
        // Ties: the lower index first.
        route(&[1.0, 1.0, 1.0], 2, true, &mut r);
        assert_eq!((r[0].0, r[1].0), (0, 1));
        assert_eq!((r[0].1, r[1].1), (0.5, 0.5));
    }

    #[test]
    fn expert_tensors_are_known_by_name() {
        assert_eq!(expert_tensor_layer("blk.3.ffn_gate_exps.weight"), Some(3));
        assert_eq!(expert_tensor_layer("blk.47.ffn_down_exps.weight"), Some(47));
        assert_eq!(expert_tensor_layer("blk.3.ffn_gate.weight"), None);
        assert_eq!(expert_tensor_layer("blk.3.ffn_gate_inp.weight"), None);
        assert_eq!(expert_tensor_layer("blk.x.ffn_up_exps.weight"), None);
        assert_eq!(expert_tensor_layer("output.weight"), None);
    }

    #[test]
    fn groups_list_tokens_and_slots_per_expert() {
        // Two tokens, two slots: token 0 → experts 2, 0; token 1 → experts 0, 1.
        let routes = [(2, 0.6), (0, 0.4), (0, 0.7), (1, 0.3)];
        let g = group_by_expert(&routes, 3, 2);
        assert_eq!(g, vec![vec![(0, 1), (1, 0)], vec![(1, 1)], vec![(0, 0)]]);
    }
}
