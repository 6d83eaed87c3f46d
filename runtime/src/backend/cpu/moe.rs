//! The CPU's direct [`crate::backend::Backend::moe_ffn`]: the same arithmetic as the
//! default ([`crate::backend::moe`]) on host slices, without the per-row copies. Per
//! expert with tokens: its rows gathered and converted once for gate and up (one job over
//! both matrices' rows, as `matmul_multi`), the GLU, the down projection, each output row
//! times its weight into its slot; then the slots summed in the order of the selection,
//! as llama.cpp adds its experts' views.

use crate::backend::moe::{expert, group_by_expert, swiglu_oai};
use crate::backend::{Buf, MoeFfn, Result};
use crate::quant::{self, par_chunks, BatchItem, Isa};

use super::{invalid, ops, quant_err, span, span_mut, CpuBackend, Team};

impl CpuBackend {
    pub(super) fn moe_ffn_direct(&mut self, x: Buf, n: usize, p: &MoeFfn, out: Buf) -> Result<()> {
        if x == out {
            return Err(invalid("moe_ffn", "input and output must be different buffers".into()));
        }
        let (e, n_exp, f) = p.dims()?;
        let k = p.n_used;
        let mut o = self.take(out)?;
        let rx = match p.router_x {
            Some(b) => Some(span(self.buf(b)?, 0, n * e, "moe_ffn")?.to_vec()),
            None => None,
        };
        let r = span(self.buf(x)?, 0, n * e, "moe_ffn").and_then(|xs| moe_host(&self.pool, self.isa, self.rowwise, xs, rx.as_deref(), n, p, (e, n_exp, f, k), &mut o));
        self.put(out, o);
        r?;
        self.dump("moe_ffn", out, n * e);
        Ok(())
    }

}

/// The MoE FFN of `n` host rows `xs` into `o` on `pool`: the CPU backend's arithmetic,
/// also run by a GPU backend for the layers whose experts stay in host memory
/// (`--n-cpu-moe`). (e, n_exp, f, k): [`MoeFfn::dims`] and the experts used; `rowwise`:
/// every token's rows sum as a one-token product (`round_rows_as_decode`).
#[allow(clippy::too_many_arguments)]
pub fn moe_host(pool: &Team, isa: Isa, rowwise: bool, xs: &[f32], router_xs: Option<&[f32]>, n: usize, p: &MoeFfn, (e, n_exp, f, k): (usize, usize, usize, usize), o: &mut [f32]) -> Result<()> {
    {
        let mm = if rowwise { quant::matmul_quantized_rowwise_on } else { quant::matmul_quantized_on };
        let xs = span(xs, 0, n * e, "moe_ffn")?;
        let o = span_mut(o, 0, n * e, "moe_ffn")?;

        let router = p.router;
        // gemma4: the router has its own input rows.
        let rxs = span(router_xs.unwrap_or(xs), 0, n * e, "moe_ffn")?;
        let xq = quant::quantize_rows_on(pool, router.ty(), rxs, n, e).map_err(|er| quant_err("moe_ffn", router, er))?;
        let mut logits = vec![0f32; n * n_exp];
        mm(pool, router.data(), router.ty(), n_exp, &xq, &mut logits, isa).map_err(|er| quant_err("moe_ffn", router, er))?;
        // gpt-oss: the biases as f32 (router [n_exp], gate/up [n_exp, f], down [n_exp, e]).
        let biases = match &p.biases {
            Some(b) => Some([b.router, b.gate, b.up, b.down].map(|w| super::f32_weight(w, "moe_ffn")).into_iter().collect::<Result<Vec<_>>>()?),
            None => None,
        };
        if let Some(b) = &biases {
            logits.chunks_exact_mut(n_exp).for_each(|row| row.iter_mut().zip(b[0].iter()).for_each(|(l, c)| *l += c));
        }
        let routes = p.routes(&logits, n_exp);
        let scales = match p.expert_scale {
            Some(w) => Some(super::f32_weight(w, "moe_ffn")?),
            None => None,
        };
        let add_rows = |y: &mut [f32], b: &[f32]| y.chunks_exact_mut(b.len()).for_each(|r| r.iter_mut().zip(b).for_each(|(a, c)| *a += c));

        // [k, n, e]: slot s of token t at (s·n + t)·e.
        let mut acc = vec![0f32; k * n * e];
        for (ex, toks) in group_by_expert(&routes, n_exp, k).into_iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let m = toks.len();
            let (g, u, d) = (expert(p.gate, ex)?, expert(p.up, ex)?, expert(p.down, ex)?);
            let mut xe = Vec::with_capacity(m * e);
            for &(t, _) in &toks {
                xe.extend_from_slice(&xs[t * e..][..e]);
            }
            let (mut hg, mut hu) = (vec![0f32; m * f], vec![0f32; m * f]);
            if p.gate_up_fused {
                // One product over the expert's 2·f rows (gate, then up), split per token.
                let xq = quant::quantize_rows_on(pool, g.ty(), &xe, m, e).map_err(|er| quant_err("moe_ffn", &g, er))?;
                let mut gu = vec![0f32; m * 2 * f];
                mm(pool, g.data(), g.ty(), 2 * f, &xq, &mut gu, isa).map_err(|er| quant_err("moe_ffn", &g, er))?;
                for (j, row) in gu.chunks_exact(2 * f).enumerate() {
                    hg[j * f..][..f].copy_from_slice(&row[..f]);
                    hu[j * f..][..f].copy_from_slice(&row[f..]);
                }
            } else if quant::vec_dot_type(g.ty()) == quant::vec_dot_type(u.ty()) && !(rowwise && m > 1) {
                let xq = quant::quantize_rows_on(pool, g.ty(), &xe, m, e).map_err(|er| quant_err("moe_ffn", &g, er))?;
                let mut items = [
                    BatchItem { w: g.data(), ty: g.ty(), rows: f, y: &mut hg },
                    BatchItem { w: u.data(), ty: u.ty(), rows: f, y: &mut hu },
                ];
                quant::matmul_batch_on(pool, &mut items, &xq, isa).map_err(|er| quant_err("moe_ffn", &g, er))?;
            } else {
                for (w, y) in [(&g, &mut hg), (&u, &mut hu)] {
                    let xq = quant::quantize_rows_on(pool, w.ty(), &xe, m, e).map_err(|er| quant_err("moe_ffn", w, er))?;
                    mm(pool, w.data(), w.ty(), f, &xq, y, isa).map_err(|er| quant_err("moe_ffn", w, er))?;
                }
            }
            if let Some(b) = &biases {
                add_rows(&mut hg, &b[1][ex * f..][..f]);
                add_rows(&mut hu, &b[2][ex * f..][..f]);
            }
            let per = if hg.len() <= 1024 { hg.len() } else { hg.len().div_ceil(2 * pool.threads()).max(512) };
            if p.swiglu_oai {
                par_chunks(pool, &mut hg, per.max(1), &|i, h| {
                    let n = h.len();
                    h.iter_mut().zip(&hu[i * per..][..n]).for_each(|(g, &u)| *g = swiglu_oai(*g, u))
                });
            } else {
                par_chunks(pool, &mut hg, per.max(1), &|i, h| ops::glu_inplace(h, &hu[i * per..][..h.len()], p.act));
            }
            let hq = quant::quantize_rows_on(pool, d.ty(), &hg, m, f).map_err(|er| quant_err("moe_ffn", &d, er))?;
            let mut ye = vec![0f32; m * e];
            mm(pool, d.data(), d.ty(), e, &hq, &mut ye, isa).map_err(|er| quant_err("moe_ffn", &d, er))?;
            if let Some(b) = &biases {
                add_rows(&mut ye, &b[3][ex * e..][..e]);
            }
            if let Some(sc) = &scales {
                ye.iter_mut().for_each(|y| *y *= sc[ex]);
            }
            for (j, &(t, s)) in toks.iter().enumerate() {
                let w = routes[t * k + s].1;
                let dst = &mut acc[(s * n + t) * e..][..e];
                dst.iter_mut().zip(&ye[j * e..][..e]).for_each(|(a, y)| *a = y * w);
            }
        }
        o.copy_from_slice(&acc[..n * e]);
        for s in 1..k {
            o.iter_mut().zip(&acc[s * n * e..][..n * e]).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}
