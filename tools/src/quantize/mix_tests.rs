//! The mix rules on small tensor lists: the cases `llama-quantize` decides, checked
//! against what its code gives (whole files are compared by `ci/llama_quant_ref.sh`).
use super::*;
use GgmlType::*;

fn model(n_layer: u64, n_head: u64, n_head_kv: u64) -> ModelFacts {
    ModelFacts { arch: "llama".into(), n_layer, n_head, n_head_kv, n_expert: 0 }
}

/// A dense model's tensors (tied when `tied`), rows of `e` and FFN width `ff`.
fn tensors(n_layer: u64, e: u64, ff: u64, tied: bool) -> Vec<TensorDesc> {
    let mut v = vec![TensorDesc { name: "token_embd.weight".into(), dims: vec![e, 1000], ty: F16 }];
    for i in 0..n_layer {
        for (n, d) in [("attn_norm", vec![e]), ("attn_q", vec![e, e]), ("attn_k", vec![e, e / 4]), ("attn_v", vec![e, e / 4]),
            ("attn_output", vec![e, e]), ("ffn_gate", vec![e, ff]), ("ffn_up", vec![e, ff]), ("ffn_down", vec![ff, e])]
        {
            v.push(TensorDesc { name: format!("blk.{i}.{n}.weight"), dims: d, ty: F16 });
        }
    }
    if !tied {
        v.push(TensorDesc { name: "output.weight".into(), dims: vec![e, 1000], ty: F16 });
    }
    v
}

fn ty(c: &[Choice], t: &[TensorDesc], name: &str) -> GgmlType {
    c[t.iter().position(|t| t.name == name).unwrap()].ty
}

#[test]
fn names_and_default_types() {
    assert_eq!(Ftype::from_name("q4_k_m"), Some(Ftype::Q4_K_M));
    assert_eq!(Ftype::from_name("Q4_K"), Some(Ftype::Q4_K_M));
    assert_eq!(Ftype::Q4_K_M.name(), "Q4_K_M");
    assert_eq!(Ftype::Q3_K_M.name(), "Q3_K_M");
    assert_eq!(Ftype::from_name("Q9_K"), None);
    assert_eq!(Ftype::IQ2_S.default_type(), IQ2_XS);
    assert_eq!(Ftype::IQ2_M.default_type(), IQ2_S);
    assert_eq!(Ftype::MXFP4_MOE as u32, 38);
}

#[test]
fn llama_order_sorts_by_layer_then_name() {
    let names = ["token_embd.weight", "blk.10.attn_q.weight", "blk.2.ffn_up.weight", "blk.2.attn_k.weight", "output_norm.weight"];
    let o: Vec<&str> = llama_order(&names).into_iter().map(|i| names[i]).collect();
    assert_eq!(o, ["output_norm.weight", "token_embd.weight", "blk.2.attn_k.weight", "blk.2.ffn_up.weight", "blk.10.attn_q.weight"]);
}

/// Q4_K_M on 16 layers, GQA 4: attn_v / ffn_down Q6_K on use_more_bits layers, head Q6_K,
/// norms kept, untied token_embd Q4_K.
#[test]
fn q4_k_m_rules() {
    let t = tensors(16, 512, 1024, false);
    let c = assign(Ftype::Q4_K_M, &model(16, 8, 2), &Options::default(), &t).unwrap();
    assert_eq!(ty(&c, &t, "output.weight"), Q6_K);
    assert_eq!(ty(&c, &t, "token_embd.weight"), Q4_K);
    assert_eq!(ty(&c, &t, "blk.0.attn_norm.weight"), F16);
    for i in 0..16 {
        let want = if use_more_bits(i, 16) { Q6_K } else { Q4_K };
        assert_eq!(ty(&c, &t, &format!("blk.{i}.attn_v.weight")), want, "{i}");
        assert_eq!(ty(&c, &t, &format!("blk.{i}.ffn_down.weight")), want, "{i}");
        assert_eq!(ty(&c, &t, &format!("blk.{i}.attn_q.weight")), Q4_K);
    }
    // --pure: every matrix the base type, the head included.
    let c = assign(Ftype::Q4_K_M, &model(16, 8, 2), &Options { pure: true, ..Default::default() }, &t).unwrap();
    assert!(t.iter().zip(&c).all(|(t, c)| c.ty == if t.dims.len() == 1 { F16 } else { Q4_K }));
}

/// The attn_v counter follows llama.cpp's order (layer 10 after layer 9, not after 1).
#[test]
fn q3_k_m_counts_in_loader_order() {
    let t = tensors(12, 512, 1024, true);
    let c = assign(Ftype::Q3_K_M, &model(12, 8, 8), &Options::default(), &t).unwrap();
    assert_eq!(ty(&c, &t, "blk.0.attn_v.weight"), Q5_K);
    assert_eq!(ty(&c, &t, "blk.1.attn_v.weight"), Q5_K);
    assert_eq!(ty(&c, &t, "blk.10.attn_v.weight"), Q4_K);
    assert_eq!(ty(&c, &t, "blk.0.attn_output.weight"), Q4_K);
    assert_eq!(ty(&c, &t, "blk.0.ffn_down.weight"), Q4_K); // 0 < 12/16 is false
    assert_eq!(ty(&c, &t, "blk.0.ffn_up.weight"), Q3_K);
    assert_eq!(ty(&c, &t, "token_embd.weight"), Q6_K); // tied: the LM head's type
}

/// Rows that are not whole super-blocks: llama.cpp's substitutes, the head Q8_0.
#[test]
fn fallbacks_for_odd_rows() {
    let t = tensors(4, 576, 1536, true);
    let c = assign(Ftype::Q2_K, &model(4, 9, 3), &Options::default(), &t).unwrap();
    assert_eq!(ty(&c, &t, "token_embd.weight"), Q8_0);
    assert_eq!(ty(&c, &t, "blk.0.attn_q.weight"), Q4_0);
    assert_eq!(ty(&c, &t, "blk.0.attn_v.weight"), Q4_0); // Q3_K (n_gqa 3) → Q4_0
    assert_eq!(ty(&c, &t, "blk.0.ffn_down.weight"), Q3_K);
    assert!(c[t.iter().position(|t| t.name == "blk.0.attn_q.weight").unwrap()].fell_back);
    assert_eq!(fallback(IQ2_XXS, 576), IQ4_NL);
    assert_eq!(fallback(Q6_K, 1000), F16);
}

/// The IQ2 mixes need an importance matrix for their grid tensors (not the embeddings),
/// and IQ3_XXS's attn_v is IQ3_S without one.
#[test]
fn imatrix_requirements() {
    let t = tensors(8, 512, 1024, false);
    let c = assign(Ftype::IQ2_XXS, &model(8, 8, 8), &Options::default(), &t).unwrap();
    assert_eq!(ty(&c, &t, "token_embd.weight"), Q2_K);
    assert_eq!(ty(&c, &t, "output.weight"), Q5_K);
    assert_eq!(ty(&c, &t, "blk.0.attn_v.weight"), Q2_K);
    assert_eq!(ty(&c, &t, "blk.0.ffn_down.weight"), Q2_K);
    assert_eq!(ty(&c, &t, "blk.1.ffn_down.weight"), IQ2_XXS);
    let q = t.iter().position(|t| t.name == "blk.3.attn_q.weight").unwrap();
    assert!(c[q].needs_imatrix && c[q].ty == IQ2_XXS);
    assert!(!c[0].needs_imatrix);
    let c = assign(Ftype::IQ3_XXS, &model(8, 8, 8), &Options::default(), &t).unwrap();
    assert_eq!(ty(&c, &t, "blk.0.attn_v.weight"), IQ3_S);
    assert_eq!(ty(&c, &t, "blk.0.attn_q.weight"), IQ2_S);
    assert_eq!(ty(&c, &t, "blk.0.ffn_down.weight"), Q4_K);
    assert_eq!(ty(&c, &t, "blk.5.ffn_down.weight"), Q3_K);
    let c = assign(Ftype::IQ3_XXS, &model(8, 8, 8), &Options { has_imatrix: true, ..Default::default() }, &t).unwrap();
    assert_eq!(ty(&c, &t, "blk.0.attn_v.weight"), IQ3_XXS);
    assert_eq!(ty(&c, &t, "blk.5.ffn_down.weight"), IQ3_XXS);
}

/// MXFP4_MOE: expert tensors MXFP4, all other matrices Q8_0; an expert model's layer is
/// read from the tensor name.
#[test]
fn mxfp4_moe() {
    let t = vec![
        TensorDesc { name: "token_embd.weight".into(), dims: vec![256, 100], ty: F32 },
        TensorDesc { name: "blk.0.ffn_gate_inp.weight".into(), dims: vec![256, 4], ty: F32 },
        TensorDesc { name: "blk.0.ffn_down_exps.weight".into(), dims: vec![512, 256, 4], ty: F32 },
        TensorDesc { name: "blk.0.attn_q.weight".into(), dims: vec![256, 256], ty: F32 },
    ];
    let m = ModelFacts { n_expert: 4, ..model(1, 4, 4) };
    let c = assign(Ftype::MXFP4_MOE, &m, &Options::default(), &t).unwrap();
    assert_eq!(c.iter().map(|c| c.ty).collect::<Vec<_>>(), [Q8_0, F32, MXFP4, Q8_0]);
    let bad = vec![TensorDesc { name: "ffn_down_exps.weight".into(), dims: vec![512, 256, 4], ty: F32 }];
    assert!(assign(Ftype::Q4_K_M, &m, &Options::default(), &bad).unwrap_err().contains("ffn_down_exps"));
}
