//! llama.cpp's named quantization mixes (`llama_ftype`) and the per-tensor type choice of
//! its quantizer (`src/llama-quant.cpp`: `tensor_allows_quantization`,
//! `llama_tensor_get_type`, `tensor_type_fallback`, `tensor_requires_imatrix`), read from
//! the llama.cpp that llama-cpp-python 0.3.36 vendors (commit 0c1e570). One
//! implementation serves `lode quantize` and `lode synth`.
//!
//! The rules count tensors (`attn_v`, `ffn_down`, …) in the order the quantizer visits
//! them: llama.cpp's loader sorts tensors by layer (`blk.N.`; others first), then by name
//! ([`llama_order`]), and the output file keeps that order.

use lode_runtime::quant::GgmlType;

/// A `llama_ftype`: what `llama-quantize`'s TYPE names. The value is `general.file_type`.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ftype {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q8_0 = 7,
    Q5_0 = 8,
    Q5_1 = 9,
    Q2_K = 10,
    Q3_K_S = 11,
    Q3_K_M = 12,
    Q3_K_L = 13,
    Q4_K_S = 14,
    Q4_K_M = 15,
    Q5_K_S = 16,
    Q5_K_M = 17,
    Q6_K = 18,
    IQ2_XXS = 19,
    IQ2_XS = 20,
    Q2_K_S = 21,
    IQ3_XS = 22,
    IQ3_XXS = 23,
    IQ1_S = 24,
    IQ4_NL = 25,
    IQ3_S = 26,
    IQ3_M = 27,
    IQ2_S = 28,
    IQ2_M = 29,
    IQ4_XS = 30,
    IQ1_M = 31,
    BF16 = 32,
    MXFP4_MOE = 38,
}

/// `llama-quantize`'s names (its `QUANT_OPTIONS`, with the aliases Q3_K, Q4_K, Q5_K).
pub const NAMES: [(&str, Ftype); 34] = {
    use Ftype::*;
    [
        ("Q4_0", Q4_0),
        ("Q4_1", Q4_1),
        ("MXFP4_MOE", MXFP4_MOE),
        ("Q5_0", Q5_0),
        ("Q5_1", Q5_1),
        ("IQ2_XXS", IQ2_XXS),
        ("IQ2_XS", IQ2_XS),
        ("IQ2_S", IQ2_S),
        ("IQ2_M", IQ2_M),
        ("IQ1_S", IQ1_S),
        ("IQ1_M", IQ1_M),
        ("Q2_K", Q2_K),
        ("Q2_K_S", Q2_K_S),
        ("IQ3_XXS", IQ3_XXS),
        ("IQ3_S", IQ3_S),
        ("IQ3_M", IQ3_M),
        ("Q3_K", Q3_K_M),
        ("IQ3_XS", IQ3_XS),
        ("Q3_K_S", Q3_K_S),
        ("Q3_K_M", Q3_K_M),
        ("Q3_K_L", Q3_K_L),
        ("IQ4_NL", IQ4_NL),
        ("IQ4_XS", IQ4_XS),
        ("Q4_K", Q4_K_M),
        ("Q4_K_S", Q4_K_S),
        ("Q4_K_M", Q4_K_M),
        ("Q5_K", Q5_K_M),
        ("Q5_K_S", Q5_K_S),
        ("Q5_K_M", Q5_K_M),
        ("Q6_K", Q6_K),
        ("Q8_0", Q8_0),
        ("F16", F16),
        ("BF16", BF16),
        ("F32", F32),
    ]
};

impl Ftype {
    /// The mix `name` names (case-insensitive), as `llama-quantize` reads TYPE.
    pub fn from_name(name: &str) -> Option<Ftype> {
        NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, f)| f)
    }

    /// The canonical name (the first of [`NAMES`] that is not an alias).
    pub fn name(self) -> &'static str {
        NAMES.iter().rev().find(|&&(_, f)| f == self).map(|&(n, _)| n).unwrap_or("?")
    }

    /// Every name, comma-separated, for error messages.
    pub fn all_names() -> String {
        NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
    }

    /// The type of every tensor no rule moves (`llama_ftype_get_default_type`).
    pub fn default_type(self) -> GgmlType {
        use GgmlType as G;
        match self {
            Ftype::F32 => G::F32,
            Ftype::F16 => G::F16,
            Ftype::BF16 => G::BF16,
            Ftype::Q4_0 => G::Q4_0,
            Ftype::Q4_1 => G::Q4_1,
            Ftype::Q5_0 => G::Q5_0,
            Ftype::Q5_1 => G::Q5_1,
            Ftype::Q8_0 => G::Q8_0,
            Ftype::MXFP4_MOE => G::MXFP4,
            Ftype::Q2_K | Ftype::Q2_K_S => G::Q2_K,
            Ftype::IQ3_XS | Ftype::IQ3_S | Ftype::IQ3_M => G::IQ3_S,
            Ftype::Q3_K_S | Ftype::Q3_K_M | Ftype::Q3_K_L => G::Q3_K,
            Ftype::Q4_K_S | Ftype::Q4_K_M => G::Q4_K,
            Ftype::Q5_K_S | Ftype::Q5_K_M => G::Q5_K,
            Ftype::Q6_K => G::Q6_K,
            Ftype::IQ2_XXS => G::IQ2_XXS,
            Ftype::IQ2_XS | Ftype::IQ2_S => G::IQ2_XS,
            Ftype::IQ2_M => G::IQ2_S,
            Ftype::IQ3_XXS => G::IQ3_XXS,
            Ftype::IQ1_S => G::IQ1_S,
            Ftype::IQ1_M => G::IQ1_M,
            Ftype::IQ4_NL => G::IQ4_NL,
            Ftype::IQ4_XS => G::IQ4_XS,
        }
    }

    /// The very-low-bit mixes whose LM head is Q5_K and whose rules move attn_v / ffn_down.
    fn is_iq2_family(self) -> bool {
        use Ftype::*;
        matches!(self, IQ2_XXS | IQ2_XS | IQ1_S | IQ2_S | IQ2_M | IQ1_M)
    }
}

/// The model facts the rules read (llama.cpp's `hparams` and `model.type`).
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    pub arch: String,
    /// `{arch}.block_count`.
    pub n_layer: u64,
    pub n_head: u64,
    pub n_head_kv: u64,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u64,
}

impl ModelFacts {
    fn n_gqa(&self) -> u64 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }
    /// llama.cpp's `LLM_TYPE_70B`: a `llama` model of 80 layers with grouped-query attention.
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }
    fn falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// `llama-quantize`'s options that change the choice.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// `--imatrix` was given.
    pub has_imatrix: bool,
    /// `--pure`: every quantized tensor in the default type (no mix rules).
    pub pure: bool,
    /// `--output-tensor-type`.
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub token_embd_type: Option<GgmlType>,
}

/// One tensor of the input: its name, GGUF dims (row length first) and stored type.
#[derive(Clone, Debug)]
pub struct TensorDesc {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: GgmlType,
}

/// The choice for one tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Choice {
    pub ty: GgmlType,
    /// Quantizing it to `ty` needs an importance matrix (`tensor_requires_imatrix`).
    pub needs_imatrix: bool,
    /// The rules' type did not fit the row length and was replaced.
    pub fell_back: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cat {
    Output,
    TokenEmbd,
    Qkv,
    KvB,
    V,
    K,
    Q,
    AttnOut,
    Up,
    Gate,
    Down,
    Other,
}

fn category(name: &str) -> Cat {
    let has = |s: &str| name.contains(s);
    if name == "output.weight" {
        Cat::Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Cat::TokenEmbd
    } else if has("attn_qkv.weight") {
        Cat::Qkv
    } else if has("attn_kv_b.weight") {
        Cat::KvB
    } else if has("attn_v.weight") {
        Cat::V
    } else if has("attn_k.weight") {
        Cat::K
    } else if has("attn_q.weight") {
        Cat::Q
    } else if has("attn_output.weight") {
        Cat::AttnOut
    } else if has("ffn_up") {
        Cat::Up
    } else if has("ffn_gate") {
        Cat::Gate
    } else if has("ffn_down") {
        Cat::Down
    } else {
        Cat::Other
    }
}

/// Name parts of tensors llama.cpp never quantizes (small, or read by exact index).
const KEEP: [&str; 34] = [
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight", "time_mix_first.weight",
    "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_v0.weight", "time_mix_v1.weight",
    "time_mix_v2.weight", "time_mix_a0.weight", "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight",
    "time_mix_g2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight",
    "attn_rel_b.weight", ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
    ".patch_merger", "a.rvq.codebook",
];

/// `ggml_n_dims`: the dimensions up to the last that is not 1.
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1)
}

/// Whether llama.cpp's quantizer may change this tensor's type at all.
pub fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    n_dims(dims) >= 2
        && name.ends_with("weight")
        && !KEEP.iter().any(|k| name.contains(k))
        && !name.contains("mm.a.code_embd")
        && name != "position_embd.weight"
        && name != "token_types.weight"
}

/// llama.cpp's `use_more_bits` (the layers whose attn_v / ffn_down get more bits in the
/// _M mixes): the first and last eighth of the layers, and every third layer in between.
pub fn use_more_bits(i_layer: u64, n_layer: u64) -> bool {
    let (i, n) = (i_layer as i64, n_layer as i64);
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// llama.cpp's `tensor_type_fallback`: a type whose block does not divide the row length
/// `ncols` becomes IQ4_NL (the 256-element grid and IQ4_XS types), Q4_0 (Q2_K, Q3_K),
/// Q5_0 (Q4_K), Q5_1 (Q5_K), Q8_0 (Q6_K); F16 when even that does not divide it.
pub fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    use GgmlType::*;
    let fits = |t: GgmlType| ncols % t.block_elems() as u64 == 0;
    if fits(ty) {
        return ty;
    }
    let alt = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_K | Q3_K => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if fits(alt) {
        alt
    } else {
        F16
    }
}

/// The order llama.cpp's loader visits (and its quantizer writes) the tensors: those
/// outside `blk.N.` first, then by layer, each group by name.
pub fn llama_order<S: AsRef<str>>(names: &[S]) -> Vec<usize> {
    let layer = |s: &str| -> i64 {
        s.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|d| d.parse().ok()).unwrap_or(-1)
    };
    let mut idx: Vec<usize> = (0..names.len()).collect();
    idx.sort_by(|&a, &b| {
        let (a, b) = (names[a].as_ref(), names[b].as_ref());
        layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
    });
    idx
}

/// The tensor layer a `blk.N.` name names.
fn name_layer(name: &str) -> Option<u64> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

#[derive(Default)]
struct Counters {
    n_attention_wv: u64,
    i_attention_wv: u64,
    i_ffn_down: u64,
    i_ffn_gate: u64,
    i_ffn_up: u64,
    tied: bool,
}

/// The type of every tensor (in `tensors`' order) under `ftype`, as `llama-quantize` picks
/// it. Errors name a tensor of an expert model whose layer cannot be read from its name.
pub fn assign(ftype: Ftype, m: &ModelFacts, o: &Options, tensors: &[TensorDesc]) -> Result<Vec<Choice>, String> {
    let order = llama_order(&tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>());
    let mut c = Counters { tied: true, ..Default::default() };
    for t in tensors {
        match category(&t.name) {
            Cat::V | Cat::Qkv | Cat::KvB => c.n_attention_wv += 1,
            Cat::Output => c.tied = false,
            _ => {}
        }
    }
    let default = ftype.default_type();
    let mut out = vec![Choice { ty: GgmlType::F32, needs_imatrix: false, fell_back: false }; tensors.len()];
    for i in order {
        let t = &tensors[i];
        let cat = category(&t.name);
        let mut choice = Choice { ty: t.ty, needs_imatrix: false, fell_back: false };
        if allows_quantization(&t.name, &t.dims) {
            choice.ty = if let (Some(ty), Cat::TokenEmbd) = (o.token_embd_type, cat) {
                ty
            } else if let (Some(ty), Cat::Output) = (o.output_type, cat) {
                ty
            } else if default.is_quantized() {
                let want = if o.pure { default } else { rule(&mut c, ftype, m, o, t, cat, default)? };
                let ty = fallback(want, t.dims[0]);
                choice.fell_back = ty != want;
                ty
            } else {
                default
            };
            choice.needs_imatrix = requires_imatrix(&t.name, choice.ty, ftype);
        }
        out[i] = choice;
    }
    Ok(out)
}

/// `tensor_requires_imatrix`: the grid types of 3 bits and fewer, and Q2_K in a Q2_K_S
/// file; never the embeddings or the LM head.
pub fn requires_imatrix(name: &str, ty: GgmlType, ftype: Ftype) -> bool {
    use GgmlType::*;
    if matches!(category(name), Cat::Output | Cat::TokenEmbd) {
        return false;
    }
    match ty {
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_M | IQ1_S => true,
        Q2_K => ftype == Ftype::Q2_K_S,
        _ => false,
    }
}

/// `llama_tensor_get_type_impl`: the mix's rule for one tensor (counters advance as
/// llama.cpp's do).
fn rule(c: &mut Counters, f: Ftype, m: &ModelFacts, o: &Options, t: &TensorDesc, cat: Cat, new: GgmlType) -> Result<GgmlType, String> {
    use Ftype as F;
    use GgmlType::*;
    let n_gqa = m.n_gqa();
    // The FFN rules' layer: the counter for a dense model, the name's layer with experts.
    let layer = |i: u64| -> Result<(u64, u64), String> {
        if m.n_expert.max(1) > 1 {
            match name_layer(&t.name) {
                Some(l) if l < m.n_layer => Ok((l, m.n_layer)),
                _ => Err(format!("cannot read the layer of expert tensor {} (of {} layers)", t.name, m.n_layer)),
            }
        } else {
            Ok((i, m.n_layer))
        }
    };
    if cat == Cat::Output || (c.tied && cat == Cat::TokenEmbd) {
        if let Some(ty) = o.output_type {
            return Ok(ty);
        }
        return Ok(if f == F::MXFP4_MOE || m.falcon() || t.dims[0] % new.block_elems() as u64 != 0 {
            Q8_0
        } else if f.is_iq2_family() || f == F::IQ3_XXS {
            Q5_K
        } else if new != Q8_0 {
            Q6_K
        } else {
            new
        });
    }
    if f == F::MXFP4_MOE {
        // Expert tensors (3-D) MXFP4, everything else Q8_0.
        return Ok(if t.dims.get(2).copied().unwrap_or(1) > 1 { MXFP4 } else { Q8_0 });
    }
    if cat == Cat::TokenEmbd {
        return Ok(match f {
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M => Q2_K,
            F::IQ2_S | F::IQ2_M | F::IQ3_XXS => IQ3_S,
            _ => new,
        });
    }
    let attn_v = matches!(cat, Cat::V | Cat::Qkv | Cat::KvB);
    let m2 = |a, b| if matches!(f, F::IQ2_S | F::IQ2_M) { a } else { b };
    if f.is_iq2_family() {
        let mut ty = new;
        if attn_v {
            ty = if n_gqa >= 4 || m.n_expert >= 4 { Q4_K } else { m2(IQ3_S, Q2_K) };
            c.i_attention_wv += 1;
        } else if m.n_expert == 8 && cat == Cat::K {
            ty = Q4_K;
        } else if cat == Cat::Down {
            if c.i_ffn_down < m.n_layer / 8 {
                ty = m2(IQ3_S, Q2_K);
            }
            c.i_ffn_down += 1;
        } else if cat == Cat::AttnOut {
            if m.n_expert == 8 {
                ty = Q5_K;
            } else if matches!(f, F::IQ1_S | F::IQ1_M) {
                ty = IQ2_XXS;
            } else if matches!(f, F::IQ2_S | F::IQ2_M) {
                ty = IQ3_S;
            }
        }
        return Ok(ty);
    }
    let mut ty = new;
    match cat {
        _ if attn_v => {
            let i = c.i_attention_wv;
            ty = match f {
                F::Q2_K => if n_gqa >= 4 { Q4_K } else { Q3_K },
                F::Q2_K_S if n_gqa >= 4 => Q4_K,
                F::IQ3_XXS => if n_gqa >= 4 { Q4_K } else if !o.has_imatrix { IQ3_S } else { IQ3_XXS },
                F::IQ3_XS | F::IQ3_S if n_gqa >= 4 => Q4_K,
                F::IQ3_M => Q4_K,
                F::Q3_K_M => if i < 2 { Q5_K } else { Q4_K },
                F::Q3_K_L => Q5_K,
                F::IQ4_NL | F::IQ4_XS if n_gqa >= 4 => Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, c.n_attention_wv) => Q6_K,
                F::Q4_K_S if i < 4 => Q5_K,
                _ => ty,
            };
            if m.is_70b() && matches!(ty, Q3_K | Q4_K) {
                ty = Q5_K;
            }
            if m.n_expert == 8 {
                ty = Q8_0;
            }
            c.i_attention_wv += 1;
        }
        Cat::K => {
            if m.n_expert == 8 {
                ty = Q8_0;
            } else if f == F::IQ3_XS {
                ty = IQ3_XXS;
            } else if f == F::IQ3_XXS {
                ty = IQ2_S;
            }
        }
        Cat::Q => {
            if f == F::IQ3_XS {
                ty = IQ3_XXS;
            } else if f == F::IQ3_XXS {
                ty = IQ2_S;
            }
        }
        Cat::Down => {
            let (il, n) = layer(c.i_ffn_down)?;
            let more = use_more_bits(il, n);
            ty = match f {
                F::Q2_K => Q3_K,
                F::Q2_K_S => if il < n / 8 { Q4_K } else { ty },
                F::IQ3_XXS if !o.has_imatrix => if il < n / 8 { Q4_K } else { Q3_K },
                F::Q3_K_M => if il < n / 16 { Q5_K } else if !m.falcon() || more { Q4_K } else { Q3_K },
                F::IQ3_M if il < n / 8 || (m.n_expert == 8 && more) => Q4_K,
                F::Q3_K_L => if m.falcon() { Q4_K } else { Q5_K },
                F::Q4_K_M if m.falcon() => if il < n / 16 { Q6_K } else if more { Q5_K } else { Q4_K },
                F::Q4_K_M => if more { Q6_K } else { ty },
                F::IQ4_NL | F::IQ4_XS if il < n / 8 && !o.has_imatrix => Q5_K,
                F::Q5_K_M if more => Q6_K,
                F::Q4_K_S if !m.falcon() && il < n / 8 => Q5_K,
                F::Q4_0 if o.has_imatrix && il < n / 8 => Q4_1,
                F::Q5_0 if o.has_imatrix && il < n / 8 => Q5_1,
                _ => ty,
            };
            c.i_ffn_down += 1;
        }
        Cat::AttnOut => {
            if !m.falcon() {
                if m.n_expert == 8 {
                    use Ftype::*;
                    if matches!(f, Q2_K | IQ3_XS | IQ3_XXS | Q3_K_S | Q3_K_M | IQ4_NL | Q4_K_S | Q4_K_M | IQ3_S | IQ3_M | IQ4_XS) {
                        ty = GgmlType::Q5_K;
                    }
                } else {
                    ty = match f {
                        F::Q2_K => Q3_K,
                        F::IQ3_XXS => IQ3_S,
                        F::Q3_K_M | F::IQ3_M => Q4_K,
                        F::Q3_K_L => Q5_K,
                        _ => ty,
                    };
                }
            } else if f == F::Q3_K_L {
                ty = Q4_K;
            }
        }
        Cat::Gate | Cat::Up => {
            let ctr = if cat == Cat::Gate { &mut c.i_ffn_gate } else { &mut c.i_ffn_up };
            let (il, n) = layer(*ctr)?;
            if f == F::IQ3_XS && il >= n / 8 && il < 7 * n / 8 {
                ty = IQ3_XXS;
            }
            *ctr += 1;
        }
        _ => {}
    }
    Ok(ty)
}

#[cfg(test)]
#[path = "mix_tests.rs"]
mod tests;
