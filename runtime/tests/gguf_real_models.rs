//! The reader on the two real models: they parse, their tensor tables add up, and the
//! metadata the engine needs is readable through the typed accessors.

use std::collections::BTreeMap;

use lode_runtime::gguf::GgufFile;

mod real_files;
use real_files::model;

fn type_counts(f: &GgufFile) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for t in f.tensors() {
        *m.entry(t.ty.name().to_string()).or_insert(0) += 1;
    }
    m
}

#[test]
fn gemma3_270m_q4_k_m_parses() {
    let Some(p) = model("gemma-3-270m-q4_k_m.gguf") else { return };
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("gemma3"));
    assert_eq!(f.tensors().len(), 236);
    let counts = type_counts(&f);
    let want: BTreeMap<String, usize> =
        [("F32", 109), ("Q5_0", 81), ("Q4_K", 27), ("Q8_0", 10), ("Q6_K", 9)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
    assert_eq!(counts, want);
    assert_eq!(f.get_u64("gemma3.embedding_length").unwrap(), Some(640));
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len() as u64, f.tensor("token_embd.weight").unwrap().info.dims[1]);
    // The last tensor ends inside the file, and every view has its record's length.
    for v in f.views() {
        assert_eq!(v.data.len() as u64, v.info.n_bytes);
        assert!(v.file_offset + v.info.n_bytes <= f.bytes().len() as u64);
    }
}

#[test]
fn smollm2_135m_q4_1_parses() {
    let Some(p) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else { return };
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), Some("llama"));
    assert!(f.get_str_array("tokenizer.ggml.merges").unwrap().unwrap().len() > 1000);
    let n_layer = f.get_u64("llama.block_count").unwrap().unwrap();
    assert_eq!(f.tensors().iter().filter(|t| t.name.ends_with("attn_q.weight")).count() as u64, n_layer);
}
