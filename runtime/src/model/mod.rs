//! Models: an architecture's hyper-parameters ([`Config`]) and its weights, resolved
//! by name and shape-checked at load, plus the forward pass over a
//! [`crate::backend::Backend`] (in `forward`).
//!
//! Loading copies nothing: a [`Model`] holds the mapped file and the index of each
//! weight in its tensor table; [`Model::w`] hands out [`WeightRef`]s on demand.

mod config;
mod forward;
mod gemma4;
mod hybrid;
mod mtp;
mod rewind;

use std::collections::HashMap;
use std::sync::Arc;

pub use config::{AltAttn, Arch, Config, Experts, HeadGeo, SUPPORTED_ARCHS};
pub use gemma4::ParExperts;
pub use forward::{KvRows, OutputRows, Scratch, OUT_ROWS_MAX};
pub use hybrid::RecurrentState;
pub use mtp::{Mtp, MtpBufs, MtpState};

use crate::gguf::{GgufError, GgufFile};
use crate::quant::GgmlType;
use crate::weights::{view_at, WeightId, WeightRef};

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported architecture `{arch}` (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("missing metadata key `{0}`")]
    MissingKey(String),
    #[error("missing tensor `{0}`")]
    MissingTensor(String),
    #[error("tensor `{name}` has shape {got:?}, expected {expected:?}")]
    BadShape { name: String, expected: Vec<u64>, got: Vec<u64> },
    #[error("tensor `{name}` is {ty}, expected {expected}")]
    BadType { name: String, ty: GgmlType, expected: &'static str },
    #[error("tensor `{name}` is {ty}, which lode cannot compute with yet (weight types lode runs: {supported})")]
    UnsupportedType { name: String, ty: GgmlType, supported: String },
    #[error("tensor `{name}`: {source}")]
    BadBlocks { name: String, source: crate::quant::QuantError },
    #[error("bad model configuration: {0}")]
    BadConfig(String),
    #[error(transparent)]
    Backend(#[from] crate::backend::BackendError),
}

/// One transformer block's weights.
#[derive(Clone, Debug)]
pub struct Layer {
    pub attn_norm: WeightId,
    /// Softmax attention's weights; `None` in a recurrent layer.
    pub attn: Option<AttnWeights>,
    /// A gated delta net's weights (qwen35's recurrent layers); `None` elsewhere.
    pub delta: Option<DeltaWeights>,
    pub post_attn_norm: Option<WeightId>,
    /// The FFN's input norm (`ffn_norm`, or qwen35's `post_attention_norm`).
    pub ffn_norm: WeightId,
    /// The FFN's gate, up and down matrices; in a mixture-of-experts layer the 3-D
    /// `ffn_{gate,up,down}_exps` tensors (one matrix per expert), routed by `router`.
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
    /// `ffn_gate_inp`: the router of a mixture-of-experts layer (`[n_embd → n_expert]`).
    pub router: Option<WeightId>,
    /// A shared expert beside the routed ones (qwen35moe).
    pub shared: Option<SharedExpert>,
    /// The router's and experts' biases (gpt-oss): `ffn_gate_inp.bias`,
    /// `ffn_{gate,up,down}_exps.bias`.
    pub moe_bias: Option<[WeightId; 4]>,
    pub post_ffw_norm: Option<WeightId>,
    /// gemma4's routed experts beside the dense FFN (`gate`, `up`, `down` stay dense).
    pub par_experts: Option<ParExperts>,
    /// gemma4's `layer_output_scale`: the layer's output times this value.
    pub out_scale: Option<f32>,
}

/// A shared expert: a gated FFN every token takes, times `sigmoid(gate_inp · x)`.
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// `ffn_gate_inp_shexp` `[n_embd]`: one gate logit per token.
    pub gate_inp: WeightId,
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

/// An attention block's weights.
#[derive(Clone, Debug)]
pub struct AttnWeights {
    /// With [`Config::attn_out_gate`], each head's query is followed by its output gate.
    pub wq: WeightId,
    pub wk: WeightId,
    pub wv: WeightId,
    pub bq: Option<WeightId>,
    pub bk: Option<WeightId>,
    pub bv: Option<WeightId>,
    pub q_norm: Option<WeightId>,
    pub k_norm: Option<WeightId>,
    pub wo: WeightId,
    /// `attn_output.bias` (gpt-oss).
    pub bo: Option<WeightId>,
    /// `attn_sinks.weight` `[n_head]` (gpt-oss).
    pub sinks: Option<WeightId>,
    /// No `attn_v` (gemma4's full-attention layers): V is K's projection (`wv` is `wk`).
    pub v_from_k: bool,
}

/// A gated delta net block's weights (llama.cpp's names; [`crate::backend::recurrent`]
/// has the arithmetic).
#[derive(Clone, Debug)]
pub struct DeltaWeights {
    /// The convolution's input and z (the output gate).
    pub proj: DeltaProj,
    /// The gates' logits, beta and alpha.
    pub gates: DeltaGates,
    /// `ssm_conv1d` `[d_conv, channels]`, `ssm_dt.bias`, `ssm_a` `[n_v_heads]`,
    /// `ssm_norm` `[head_v_dim]`.
    pub conv: WeightId,
    pub dt_bias: WeightId,
    pub a: WeightId,
    pub norm: WeightId,
    /// `ssm_out` `[value_dim → n_embd]`.
    pub out: WeightId,
}

/// A delta net's input projections: `attn_qkv` `[n_embd → channels]` and `attn_gate`
/// `[n_embd → value_dim]`, or qwen3next's older files' one `ssm_in` `[n_embd → channels +
/// value_dim]` whose rows hold, per key head group, that group's q, k, v and z (one
/// matmul; its output taken apart by [`crate::backend::Backend::copy_strided`]).
#[derive(Clone, Copy, Debug)]
pub enum DeltaProj {
    Split { qkv: WeightId, z: WeightId },
    Packed(WeightId),
}

/// A delta net's gate projections: `ssm_beta` and `ssm_alpha` `[n_embd → n_v_heads]`, or
/// qwen3next's `ssm_ba` `[n_embd → 2·n_v_heads]`, per key head group its value heads'
/// beta then their alpha (one matmul; taken apart by `split_halves`).
#[derive(Clone, Copy, Debug)]
pub enum DeltaGates {
    Split { beta: WeightId, alpha: WeightId },
    Packed(WeightId),
}

impl DeltaWeights {
    /// The matrices read by the projections (one or two of each kind).
    pub fn proj_weights(&self) -> Vec<WeightId> {
        let mut v = match self.proj {
            DeltaProj::Split { qkv, z } => vec![qkv, z],
            DeltaProj::Packed(w) => vec![w],
        };
        match self.gates {
            DeltaGates::Split { beta, alpha } => v.extend([beta, alpha]),
            DeltaGates::Packed(w) => v.push(w),
        }
        v
    }
    /// Whether a projection's output must be taken apart (qwen3next).
    pub fn packed(&self) -> bool {
        matches!(self.proj, DeltaProj::Packed(_)) || matches!(self.gates, DeltaGates::Packed(_))
    }
}

/// A loaded model: configuration plus weight ids into the mapped file.
pub struct Model {
    pub cfg: Config,
    file: Arc<GgufFile>,
    pub tok_embd: WeightId,
    pub output_norm: WeightId,
    /// The LM head; `tok_embd` when the file has no `output.weight` (tied).
    pub output: WeightId,
    pub rope_freqs: Option<WeightId>,
    pub layers: Vec<Layer>,
    /// The multi-token-prediction block (`blk.{n_layer}.nextn.*`), loaded only where a run
    /// drafts with it ([`Model::load_with_mtp`]): its weights then count as the model's.
    pub mtp: Option<Mtp>,
}

impl Model {
    /// Reads the configuration and resolves and shape-checks every weight the forward
    /// pass reads (a multi-token-prediction block is left out, unread: [`Self::load_with_mtp`]).
    pub fn load(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        Self::load_impl(file, false)
    }

    /// [`Self::load`], also resolving the file's multi-token-prediction block where it has
    /// one (`Model::mtp`; a run that drafts with it, `--spec-type draft-mtp`).
    pub fn load_with_mtp(file: Arc<GgufFile>) -> Result<Model, ModelError> {
        Self::load_impl(file, true)
    }

    fn load_impl(file: Arc<GgufFile>, with_mtp: bool) -> Result<Model, ModelError> {
        let mut cfg = Config::from_gguf(&file)?;
        let index: HashMap<&str, usize> =
            file.tensors().iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
        let c = cfg.clone();
        let find = |name: &str| index.get(name).map(|&i| WeightId(i as u32));
        let dims = |id: WeightId| file.tensors()[id.0 as usize].dims.clone();
        let get = |name: &str, shape: &[u64]| -> Result<WeightId, ModelError> {
            let id = find(name).ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
            check_shape(name, &dims(id), shape)?;
            Ok(id)
        };
        let opt = |name: &str, shape: &[u64]| -> Result<Option<WeightId>, ModelError> {
            match find(name) {
                Some(_) => get(name, shape).map(Some),
                None => Ok(None),
            }
        };
        let (e, ff) = (c.n_embd as u64, c.n_ff as u64);

        let tok_embd = find("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let n_vocab = match dims(tok_embd).as_slice() {
            [d0, v] if *d0 == e => *v,
            other => {
                return Err(ModelError::BadShape {
                    name: "token_embd.weight".into(),
                    expected: vec![e, 0],
                    got: other.to_vec(),
                })
            }
        };
        cfg.n_vocab = n_vocab as usize;
        let output_norm = get("output_norm.weight", &[e])?;
        let output = opt("output.weight", &[e, n_vocab])?.unwrap_or(tok_embd);
        // gemma4: the full-attention layers' factors (proportional RoPE).
        let freq_pairs = c.alt_attn.as_ref().filter(|_| c.rope_freqs_global_only).map_or(c.n_rot, |a| a.geo.n_rot) / 2;
        let rope_freqs = opt("rope_freqs.weight", &[freq_pairs as u64])?;
        let qk_norm = matches!(c.arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3 | Arch::Qwen35 | Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Gemma4);
        let gemma = matches!(c.arch, Arch::Gemma3 | Arch::Gemma4);
        let gemma4 = c.arch == Arch::Gemma4;
        let oss = c.arch == Arch::GptOss;
        // Block `l`'s weights (`recurrent`: a gated delta net instead of attention).
        let load_layer = |l: usize, recurrent: bool| -> Result<Layer, ModelError> {
            let n = |s: &str| format!("blk.{l}.{s}");
            let req_if = |cond: bool, s: &str, shape: &[u64]| -> Result<Option<WeightId>, ModelError> {
                if cond { get(&n(s), shape).map(Some) } else { opt(&n(s), shape) }
            };
            // In the order a file's tensors are looked up (the first missing one is named).
            let attn_norm = get(&n("attn_norm.weight"), &[e])?;
            // This layer's heads (gemma4's full-attention layers have their own).
            let h = c.heads(l);
            let (hk, hv) = (h.head_dim_k as u64, h.head_dim_v as u64);
            let (qd, kd, vd, od) = (c.n_head as u64 * hk, h.n_head_kv as u64 * hk, h.n_head_kv as u64 * hv, c.n_head as u64 * hv);
            // With an output gate, attn_q holds each head's query then its gate.
            let qd_w = if c.attn_out_gate { 2 * qd } else { qd };
            let (attn, delta) = match (recurrent, c.recurrent) {
                (true, Some(d)) => (None, Some(delta_weights(&get, &|s| find(s).is_some(), l, e, &d)?)),
                _ => {
                    if find(&n("attn_q.weight")).is_none() && find(&n("attn_qkv.weight")).is_some() {
                        return Err(ModelError::BadConfig(
                            "fused `attn_qkv` weights are not supported; lode needs separate attn_q/attn_k/attn_v".into(),
                        ));
                    }
                    let (wq, wk) = (get(&n("attn_q.weight"), &[e, qd_w])?, get(&n("attn_k.weight"), &[e, kd])?);
                    // gemma4 may leave `attn_v` out: V is then K's projection.
                    let v_from_k = gemma4 && find(&n("attn_v.weight")).is_none() && kd == vd;
                    let wv = if v_from_k { wk } else { get(&n("attn_v.weight"), &[e, vd])? };
                    let bq = req_if(c.arch == Arch::Qwen2, "attn_q.bias", &[qd])?;
                    let bk = req_if(c.arch == Arch::Qwen2, "attn_k.bias", &[kd])?;
                    let bv = req_if(c.arch == Arch::Qwen2, "attn_v.bias", &[vd])?;
                    let q_norm = req_if(qk_norm, "attn_q_norm.weight", &[hk])?;
                    let k_norm = req_if(qk_norm, "attn_k_norm.weight", &[hk])?;
                    let wo = get(&n("attn_output.weight"), &[od, e])?;
                    let bo = req_if(oss, "attn_output.bias", &[e])?;
                    let sinks = req_if(oss, "attn_sinks.weight", &[c.n_head as u64])?;
                    (Some(AttnWeights { wq, wk, wv, bq, bk, bv, q_norm, k_norm, wo, bo, sinks, v_from_k }), None)
                }
            };
            // Gemma's norm after attention (qwen35's tensor of that name is its FFN norm).
            let post_attn_norm = if c.ffn_norm_name == "post_attention_norm" { None } else { req_if(gemma, "post_attention_norm.weight", &[e])? };
            let ffn_norm = get(&n(&format!("{}.weight", c.ffn_norm_name)), &[e])?;
            // Dense, or the experts' 3-D tensors and their router.
            let (gate, up, down, router) = match c.experts.filter(|_| !c.dense_with_experts) {
                None => (get(&n("ffn_gate.weight"), &[e, ff])?, get(&n("ffn_up.weight"), &[e, ff])?, get(&n("ffn_down.weight"), &[ff, e])?, None),
                Some(x) => {
                    let (f, ne) = (x.n_ff as u64, x.n_expert as u64);
                    let router = get(&n("ffn_gate_inp.weight"), &[e, ne])?;
                    (get(&n("ffn_gate_exps.weight"), &[e, f, ne])?, get(&n("ffn_up_exps.weight"), &[e, f, ne])?, get(&n("ffn_down_exps.weight"), &[f, e, ne])?, Some(router))
                }
            };
            let shared = match (c.experts, find(&n("ffn_gate_inp_shexp.weight"))) {
                (Some(_), Some(_)) => {
                    let fs = c.n_ff_shared as u64;
                    Some(SharedExpert {
                        gate_inp: get(&n("ffn_gate_inp_shexp.weight"), &[e])?,
                        gate: get(&n("ffn_gate_shexp.weight"), &[e, fs])?,
                        up: get(&n("ffn_up_shexp.weight"), &[e, fs])?,
                        down: get(&n("ffn_down_shexp.weight"), &[fs, e])?,
                    })
                }
                _ => None,
            };
            let moe_bias = match (c.experts, oss) {
                (Some(x), true) => {
                    let (f, ne) = (x.n_ff as u64, x.n_expert as u64);
                    Some([
                        get(&n("ffn_gate_inp.bias"), &[ne])?,
                        get(&n("ffn_gate_exps.bias"), &[f, ne])?,
                        get(&n("ffn_up_exps.bias"), &[f, ne])?,
                        get(&n("ffn_down_exps.bias"), &[e, ne])?,
                    ])
                }
                _ => None,
            };
            let post_ffw_norm = req_if(gemma, "post_ffw_norm.weight", &[e])?;
            let par_experts = match c.experts.filter(|_| c.dense_with_experts) {
                Some(x) => gemma4::load_experts(&get, &opt, l, e, &x)?,
                None => None,
            };
            let out_scale = if gemma4 { gemma4::out_scale(&file, &find, l)? } else { None };
            Ok(Layer { attn_norm, attn, delta, post_attn_norm, ffn_norm, gate, up, down, router, shared, moe_bias, post_ffw_norm, par_experts, out_scale })
        };
        let layers = (0..c.n_layer).map(|l| load_layer(l, c.recurrent_layers[l])).collect::<Result<Vec<_>, _>>()?;
        // The multi-token-prediction block after them, if the file has one (qwen35).
        let mtp = if with_mtp { mtp::load(&file, &c, n_vocab, output_norm, output, tok_embd, &load_layer, &find, &get)? } else { None };
        let model = Model { cfg, file, tok_embd, output_norm, output, rope_freqs, layers, mtp };
        model.check_types()?;
        Ok(model)
    }

    /// Norms, biases and RoPE factors must be float vectors; matrices must be of a type
    /// some backend computes with ([`GgmlType::WEIGHTS`]).
    fn check_types(&self) -> Result<(), ModelError> {
        for id in self.weight_ids() {
            let w = self.w(id);
            if w.view.info.dims.len() >= 2 && !GgmlType::WEIGHTS.contains(&w.ty()) {
                let supported = GgmlType::names(&GgmlType::WEIGHTS);
                return Err(ModelError::UnsupportedType { name: w.name().into(), ty: w.ty(), supported });
            }
            // The types new to lode are checked for NaN/Inf block scales here (one read
            // of each scale field) rather than giving NaN logits later; the older ones
            // are read as they are, as before.
            if w.ty().checks_scales() {
                crate::quant::check_scales(w.ty(), w.data()).map_err(|source| ModelError::BadBlocks { name: w.name().into(), source })?;
            }
        }
        let mut vecs = vec![self.output_norm];
        vecs.extend(self.rope_freqs);
        if let Some(m) = &self.mtp {
            vecs.extend(m.vectors());
        }
        for l in self.layers.iter().chain(self.mtp.as_ref().map(|m| &m.layer)) {
            vecs.extend([l.attn_norm, l.ffn_norm]);
            vecs.extend([l.post_attn_norm, l.post_ffw_norm].into_iter().flatten());
            if let Some(a) = &l.attn {
                vecs.extend([a.bq, a.bk, a.bv, a.q_norm, a.k_norm, a.bo, a.sinks].into_iter().flatten());
            }
            vecs.extend(l.moe_bias.iter().flatten());
            if let Some(x) = &l.par_experts {
                vecs.extend(x.vectors());
            }
            if let Some(d) = &l.delta {
                vecs.extend([d.conv, d.dt_bias, d.a, d.norm]);
            }
            if let Some(sh) = &l.shared {
                vecs.push(sh.gate_inp);
            }
        }
        for id in vecs {
            let w = self.w(id);
            if !matches!(w.ty(), GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                return Err(ModelError::BadType { name: w.name().into(), ty: w.ty(), expected: "F32, F16 or BF16" });
            }
        }
        Ok(())
    }

    /// The weight `id` as a backend sees it.
    pub fn w(&self, id: WeightId) -> WeightRef<'_> {
        // Ids come from this file's table at load, so the view always exists.
        let view = view_at(&self.file, id.0 as usize).expect("weight id from this model's file");
        WeightRef::new(id, view)
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Every distinct weight the forward pass reads.
    pub fn weight_ids(&self) -> Vec<WeightId> {
        let mut v = vec![self.tok_embd, self.output_norm, self.output];
        v.extend(self.rope_freqs);
        if let Some(m) = &self.mtp {
            v.extend(m.own_weights());
        }
        for l in self.layers.iter().chain(self.mtp.as_ref().map(|m| &m.layer)) {
            v.extend([l.attn_norm, l.ffn_norm, l.gate, l.up, l.down]);
            v.extend([l.post_attn_norm, l.post_ffw_norm, l.router].into_iter().flatten());
            if let Some(a) = &l.attn {
                v.extend([a.wq, a.wk, a.wv, a.wo]);
                v.extend([a.bq, a.bk, a.bv, a.q_norm, a.k_norm, a.bo, a.sinks].into_iter().flatten());
            }
            v.extend(l.moe_bias.iter().flatten());
            if let Some(x) = &l.par_experts {
                v.extend(x.vectors());
                v.extend([x.router, x.gate, x.up, x.down]);
            }
            if let Some(d) = &l.delta {
                v.extend(d.proj_weights());
                v.extend([d.conv, d.dt_bias, d.a, d.norm, d.out]);
            }
            if let Some(sh) = &l.shared {
                v.extend([sh.gate_inp, sh.gate, sh.up, sh.down]);
            }
        }
        v.sort();
        v.dedup();
        v
    }
}

/// A recurrent layer's tensors, shape-checked (llama.cpp's `qwen35` / `qwen3next` names
/// and shapes): for qwen3next ([`crate::backend::DeltaDims::grouped`]) its packed `ssm_in`
/// where the file has no `attn_qkv`, its packed `ssm_ba` where it has no `ssm_beta`.
fn delta_weights(get: &dyn Fn(&str, &[u64]) -> Result<WeightId, ModelError>, has: &dyn Fn(&str) -> bool, l: usize, e: u64, d: &crate::backend::DeltaDims) -> Result<DeltaWeights, ModelError> {
    let n = |s: &str| format!("blk.{l}.{s}");
    let (ch, vd, nv) = (d.channels() as u64, d.value_dim() as u64, d.n_v_heads as u64);
    // qwen3next (grouped value heads) only: `ssm_in` where there is no `attn_qkv`.
    let proj = if has(&n("attn_qkv.weight")) || !d.grouped {
        DeltaProj::Split { qkv: get(&n("attn_qkv.weight"), &[e, ch])?, z: get(&n("attn_gate.weight"), &[e, vd])? }
    } else if has(&n("ssm_in.weight")) {
        DeltaProj::Packed(get(&n("ssm_in.weight"), &[e, ch + vd])?)
    } else {
        return Err(ModelError::MissingTensor(format!("{} (or {})", n("attn_qkv.weight"), n("ssm_in.weight"))));
    };
    let conv = get(&n("ssm_conv1d.weight"), &[d.d_conv as u64, ch])?;
    let (dt_bias, a) = (get(&n("ssm_dt.bias"), &[nv])?, get(&n("ssm_a"), &[nv])?);
    // qwen3next: `ssm_ba` (llama.cpp requires it), or split gates where a file has them.
    let gates = if has(&n("ssm_beta.weight")) || !d.grouped {
        DeltaGates::Split { beta: get(&n("ssm_beta.weight"), &[e, nv])?, alpha: get(&n("ssm_alpha.weight"), &[e, nv])? }
    } else {
        DeltaGates::Packed(get(&n("ssm_ba.weight"), &[e, 2 * nv])?)
    };
    Ok(DeltaWeights {
        proj,
        gates,
        conv,
        dt_bias,
        a,
        norm: get(&n("ssm_norm.weight"), &[d.head_v_dim as u64])?,
        out: get(&n("ssm_out.weight"), &[vd, e])?,
    })
}

fn check_shape(name: &str, got: &[u64], expected: &[u64]) -> Result<(), ModelError> {
    // ggml allows trailing 1-dims.
    let trimmed: Vec<u64> = {
        let mut g = got.to_vec();
        while g.len() > expected.len() && g.last() == Some(&1) {
            g.pop();
        }
        g
    };
    if trimmed != expected {
        return Err(ModelError::BadShape { name: name.into(), expected: expected.to_vec(), got: got.to_vec() });
    }
    Ok(())
}
