//! Gemma 4 (`gemma4`, text only), as llama.cpp's graph computes it, on the gemma3 and
//! mixture-of-experts paths. What differs from gemma3:
//!
//! - Two kinds of attention layer (`attention.sliding_window_pattern`): sliding layers
//!   with `key_length_swa`-sized heads, `head_count_kv` KV heads, `rope.dimension_count_swa`
//!   rotated dimensions and `rope.freq_base_swa`; full-attention layers with `key_length`
//!   heads, their own KV head count (`head_count_kv` is then a per-layer array) and
//!   proportional RoPE: `rope.dimension_count` dimensions with `rope_freqs.weight`'s
//!   factors (1e30 for the pairs that stay unrotated), applied on these layers only.
//!   [`super::Config::alt_attn`] holds the full layers' shapes; the KV cache stores both
//!   kinds in rows of the wider one's width ([`crate::backend::AltHeads`]).
//! - q and k RMS-normed per head with their weights, V RMS-normed without one; q·k is not
//!   scaled (the norms carry it). A layer without `attn_v` takes V from K's projection
//!   (before K's norm and RoPE).
//! - Each layer's output times `layer_output_scale` (one value), and the final logits
//!   soft-capped: `cap·tanh(logit/cap)` (`final_logit_softcapping`).
//! - MoE members (26B-A4B): every layer keeps its dense GELU FFN (normed by `ffn_norm`,
//!   then `post_ffw_norm_1`) and adds routed experts beside it: their input normed by
//!   `pre_ffw_norm_2`, the router's by a weightless RMS norm times `1/√n_embd` times
//!   `ffn_gate_inp.scale`; softmax over all experts, top k, renormalised, each expert's
//!   output times its `ffn_down_exps.scale`; the sum normed by `post_ffw_norm_2`; the two
//!   added, then `post_ffw_norm` as in a dense layer.
//!
//! Not supported (refused by name): shared-KV layers (`attention.shared_kv_layers` > 0)
//! and per-layer embeddings (`embedding_length_per_layer_input` > 0), which only the
//! E2B / E4B members use.

use super::{ModelError, Scratch};
use crate::backend::{Backend, Buf, MoeFfn, MoeScratch, NormIn};
use crate::gguf::{GgufFile, MetaValue};
use crate::quant::GgmlType;
use crate::weights::{view_at, WeightId, WeightRef};

/// One attention layer's head shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadGeo {
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_rot: usize,
}

/// Layers whose head shapes differ from [`Config`]'s (gemma4's full-attention layers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AltAttn {
    pub geo: HeadGeo,
    /// Per layer: does it use `geo`?
    pub layers: Vec<bool>,
}

/// The keys gemma4 reads beyond the common ones.
pub(super) struct G4Hparams {
    /// The sliding layers' shapes.
    pub swa: HeadGeo,
    /// The full layers' shapes, where any layer is full.
    pub alt: Option<AltAttn>,
}

pub(super) fn hparams(file: &GgufFile, a: &str, n_layer: usize) -> Result<G4Hparams, ModelError> {
    let key = |k: &str| format!("{a}.{k}");
    let get = |k: &str| -> Result<Option<u64>, ModelError> {
        match file.get(&key(k)) {
            Some(MetaValue::Array(..)) => Err(ModelError::BadConfig(format!("{}: expected one integer", key(k)))),
            _ => Ok(file.get_u64(&key(k))?),
        }
    };
    let need = |k: &str| get(k)?.map(|v| v as usize).ok_or_else(|| ModelError::MissingKey(key(k)));
    for (k, what) in [("attention.shared_kv_layers", "shared-KV layers"), ("embedding_length_per_layer_input", "per-layer embeddings")] {
        if let Some(v) = get(k)?.filter(|&v| v > 0) {
            return Err(ModelError::BadConfig(format!("{} = {v}: gemma4's {what} (the E2B / E4B members) are not supported yet", key(k))));
        }
    }
    if n_layer > 128 {
        return Err(ModelError::BadConfig(format!("gemma4 with {n_layer} layers: at most 128 are supported")));
    }
    let pattern = match file.get(&key("attention.sliding_window_pattern")) {
        Some(MetaValue::Array(_, items)) if items.len() == n_layer => items.iter().map(|x| matches!(x, MetaValue::Bool(true))).collect::<Vec<bool>>(),
        _ => return Err(ModelError::BadConfig(format!("{}: expected {n_layer} booleans", key("attention.sliding_window_pattern")))),
    };
    let n_head = need("attention.head_count")?;
    // KV heads: one value, or one per layer (each kind of layer uniform).
    let kv_of = |full: bool| -> Result<usize, ModelError> {
        let k = key("attention.head_count_kv");
        let per_layer: Vec<u64> = match file.get(&k) {
            Some(MetaValue::Array(_, items)) => items.iter().filter_map(int).collect(),
            Some(_) => vec![file.get_u64(&k)?.unwrap_or(n_head as u64); n_layer],
            None => vec![n_head as u64; n_layer],
        };
        if per_layer.len() != n_layer {
            return Err(ModelError::BadConfig(format!("{k}: expected {n_layer} integers")));
        }
        let vals: Vec<u64> = per_layer.iter().zip(&pattern).filter(|(_, &swa)| swa != full).map(|(&v, _)| v).collect();
        match vals.first() {
            Some(&v) if vals.iter().all(|&x| x == v) && v > 0 && n_head % v as usize == 0 => Ok(v as usize),
            None => Ok(n_head),
            _ => Err(ModelError::BadConfig(format!("{k} {per_layer:?}: the {} layers' counts differ or do not divide {n_head} heads", if full { "full-attention" } else { "sliding" }))),
        }
    };
    let (hd_full, hd_v_full) = (need("attention.key_length")?, need("attention.value_length")?);
    let hd_swa = get("attention.key_length_swa")?.map_or(hd_full, |v| v as usize);
    let hd_v_swa = get("attention.value_length_swa")?.map_or(hd_v_full, |v| v as usize);
    let n_rot_full = get("rope.dimension_count")?.map_or(hd_full, |v| v as usize);
    let n_rot_swa = get("rope.dimension_count_swa")?.map_or(n_rot_full, |v| v as usize);
    let swa = HeadGeo { n_head_kv: kv_of(false)?, head_dim_k: hd_swa, head_dim_v: hd_v_swa, n_rot: n_rot_swa };
    let full = HeadGeo { n_head_kv: kv_of(true)?, head_dim_k: hd_full, head_dim_v: hd_v_full, n_rot: n_rot_full };
    for (what, g) in [("sliding", swa), ("full-attention", full)] {
        if g.head_dim_k != g.head_dim_v || g.n_rot > g.head_dim_k || g.n_rot % 2 != 0 || g.head_dim_k == 0 {
            return Err(ModelError::BadConfig(format!("{a}: the {what} layers' heads {g:?}: need equal K and V sizes and an even rotated part within them")));
        }
    }
    let layers: Vec<bool> = pattern.iter().map(|&s| !s).collect();
    let alt = (layers.contains(&true) && full != swa).then_some(AltAttn { geo: full, layers });
    Ok(G4Hparams { swa, alt })
}

fn int(v: &MetaValue) -> Option<u64> {
    match *v {
        MetaValue::U32(x) => Some(x as u64),
        MetaValue::I32(x) => u64::try_from(x).ok(),
        MetaValue::U64(x) => Some(x),
        MetaValue::I64(x) => u64::try_from(x).ok(),
        MetaValue::U16(x) => Some(x as u64),
        MetaValue::U8(x) => Some(x as u64),
        _ => None,
    }
}

/// gemma4's routed experts beside a layer's dense FFN (llama.cpp's names).
#[derive(Clone, Debug)]
pub struct ParExperts {
    /// `ffn_gate_inp` `[n_embd → n_expert]` and its input scale `ffn_gate_inp.scale` `[n_embd]`.
    pub router: WeightId,
    pub router_scale: WeightId,
    /// `ffn_{gate,up,down}_exps`: the 3-D expert tensors (`gate` and `up` the same
    /// `ffn_gate_up_exps` where the file has that).
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
    /// `ffn_down_exps.scale` `[n_expert]`, if the file has it.
    pub down_scale: Option<WeightId>,
    /// `pre_ffw_norm_2` (the experts' input), `post_ffw_norm_1` (after the dense FFN),
    /// `post_ffw_norm_2` (after the experts).
    pub pre_norm: WeightId,
    pub post_norm_dense: WeightId,
    pub post_norm_experts: WeightId,
}

impl ParExperts {
    /// The float vectors (norms and scales).
    pub fn vectors(&self) -> Vec<WeightId> {
        let mut v = vec![self.router_scale, self.pre_norm, self.post_norm_dense, self.post_norm_experts];
        v.extend(self.down_scale);
        v
    }
}

type Get<'a> = dyn Fn(&str, &[u64]) -> Result<WeightId, ModelError> + 'a;
type Opt<'a> = dyn Fn(&str, &[u64]) -> Result<Option<WeightId>, ModelError> + 'a;

/// Layer `l`'s experts, if it has a router (every layer of the MoE members has one).
pub(super) fn load_experts(get: &Get, opt: &Opt, l: usize, e: u64, x: &super::Experts) -> Result<Option<ParExperts>, ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (f, ne) = (x.n_ff as u64, x.n_expert as u64);
    let Some(router) = opt(&n("ffn_gate_inp.weight"), &[e, ne])? else { return Ok(None) };
    // The files carry gate and up as one tensor (`ffn_gate_up_exps`), or as two.
    let (gate, up) = match opt(&n("ffn_gate_up_exps.weight"), &[e, 2 * f, ne])? {
        Some(gu) => (gu, gu),
        None => (get(&n("ffn_gate_exps.weight"), &[e, f, ne])?, get(&n("ffn_up_exps.weight"), &[e, f, ne])?),
    };
    Ok(Some(ParExperts {
        router,
        router_scale: get(&n("ffn_gate_inp.scale"), &[e])?,
        gate,
        up,
        down: get(&n("ffn_down_exps.weight"), &[f, e, ne])?,
        down_scale: opt(&n("ffn_down_exps.scale"), &[ne])?,
        pre_norm: get(&n("pre_ffw_norm_2.weight"), &[e])?,
        post_norm_dense: get(&n("post_ffw_norm_1.weight"), &[e])?,
        post_norm_experts: get(&n("post_ffw_norm_2.weight"), &[e])?,
    }))
}

/// `blk.{l}.layer_output_scale.weight` (one float), read from the mapping at load.
pub(super) fn out_scale(file: &std::sync::Arc<GgufFile>, find: &dyn Fn(&str) -> Option<WeightId>, l: usize) -> Result<Option<f32>, ModelError> {
    let name = format!("blk.{l}.layer_output_scale.weight");
    let Some(id) = find(&name) else { return Ok(None) };
    let view = view_at(file, id.0 as usize).ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
    let w = WeightRef::new(id, view);
    if w.row_len() * w.n_rows() != 1 || !matches!(w.ty(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Err(ModelError::BadShape { name, expected: vec![1], got: w.view.info.dims.clone() });
    }
    let mut v = [0f32];
    crate::quant::dequantize(w.ty(), w.data(), &mut v).map_err(|source| ModelError::BadBlocks { name, source })?;
    Ok(Some(v[0]))
}

impl super::Model {
    /// A gemma4 MoE layer's FFN: the dense FFN and the routed experts, both from the
    /// attention's output `s.x` (+ `s.xb2` when `attn_add`), their normed sum left in
    /// `s.xb2` (normed by `post_ffw_norm`) for the next norm to add. `bufs`: two rows of
    /// `n_embd` per token (the experts' and the router's inputs).
    pub(super) fn par_experts_ffn(&self, be: &mut dyn Backend, ly: &super::Layer, x: &ParExperts, attn_add: bool, n: usize, s: &Scratch, bufs: [Buf; 2], moe: &MoeScratch) -> Result<bool, ModelError> {
        let (c, e) = (&self.cfg, self.cfg.n_embd);
        let Some(xp) = c.experts else {
            return Err(ModelError::BadConfig("a layer has experts but the model has no expert count".into()));
        };
        if attn_add {
            be.add(s.x, s.xb2, s.x, n * e)?;
        }
        // The dense FFN, normed by `post_ffw_norm_1`, into `s.xb2`.
        let (ffn_norm, gate, up) = (self.w(ly.ffn_norm), self.w(ly.gate), self.w(ly.up));
        let norm = NormIn { x: s.x, add: None, out: s.xb, row_len: e, w: Some(&ffn_norm), eps: c.eps };
        be.norm_matmul_glu(&norm, n, &gate, &up, s.hb, s.hb2, c.act)?;
        be.matmul(&self.w(ly.down), s.hb, n, s.xb2)?;
        be.rms_norm(s.xb2, s.xb2, n, e, Some(&self.w(x.post_norm_dense)), c.eps)?;
        // The experts' input, and the router's: RMS norm × scale / √n_embd.
        let [xe, xr] = bufs;
        be.rms_norm(s.x, xe, n, e, Some(&self.w(x.pre_norm)), c.eps)?;
        be.rms_norm(s.x, xr, n, e, Some(&self.w(x.router_scale)), c.eps)?;
        be.scale(xr, n * e, 1.0 / (e as f32).sqrt())?;
        let (router, eg, eu, ed) = (self.w(x.router), self.w(x.gate), self.w(x.up), self.w(x.down));
        let scale = x.down_scale.map(|id| self.w(id));
        let p = MoeFfn {
            router: &router,
            gate: &eg,
            up: &eu,
            down: &ed,
            n_used: xp.n_used,
            norm_top_k: xp.norm_top_k,
            act: c.act,
            gating: xp.gating,
            biases: None,
            swiglu_oai: false,
            router_x: Some(xr),
            expert_scale: scale.as_ref(),
            gate_up_fused: x.gate == x.up,
        };
        be.moe_ffn(xe, n, &p, s.xb, moe)?;
        be.rms_norm(s.xb, s.xb, n, e, Some(&self.w(x.post_norm_experts)), c.eps)?;
        be.add(s.xb2, s.xb, s.xb2, n * e)?;
        if let Some(pn) = ly.post_ffw_norm {
            be.rms_norm(s.xb2, s.xb2, n, e, Some(&self.w(pn)), c.eps)?;
        }
        Ok(true)
    }
}

/// `cap·tanh(logit/cap)` over a row of logits, in f32 as ggml's scale, tanh, scale.
pub(super) fn softcap(row: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    row.iter_mut().for_each(|l| *l = (*l * inv).tanh() * cap);
}
