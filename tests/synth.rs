//! `lode synth` through the real binary: the qwen3-0.6b Q4_K_M file loads in
//! `lode inspect`, follows llama.cpp's Q4_K_M type mix layer by layer, and every tensor
//! has the bytes its type and shape need.

use std::collections::BTreeMap;
use std::process::Command;

use lode_runtime::gguf::GgufFile;
use lode_runtime::quant::GgmlType;

fn lode(args: &[&str]) -> std::process::Output {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).args(args).output().unwrap();
    assert!(out.status.success(), "lode {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    out
}

#[test]
fn synth_qwen3_0_6b_q4_k_m() {
    let dir = std::env::temp_dir().join(format!("lode-synth-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("qwen3-0.6b.gguf");
    let p = path.to_str().unwrap();
    lode(&["synth", "--preset", "qwen3-0.6b", "--quant", "q4_k_m", "-o", p, "--seed", "7"]);

    // Through `lode inspect --json`.
    let v: serde_json::Value = serde_json::from_slice(&lode(&["inspect", "--json", p]).stdout).unwrap();
    let totals: BTreeMap<String, u64> = v["totals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["type"].as_str().unwrap().to_string(), t["count"].as_u64().unwrap()))
        .collect();
    let want: BTreeMap<String, u64> =
        [("F32", 113), ("Q4_K", 168), ("Q6_K", 29)].into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    assert_eq!(totals, want);

    // Through the library: types per tensor, shapes, sizes, metadata.
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 310);
    // llama.cpp's use_more_bits layers for 28 layers.
    let more = [0, 1, 2, 5, 8, 11, 14, 17, 20, 23, 24, 25, 26, 27];
    for i in 0..28 {
        let want = if more.contains(&i) { GgmlType::Q6_K } else { GgmlType::Q4_K };
        for t in ["attn_v", "ffn_down"] {
            assert_eq!(f.tensor(&format!("blk.{i}.{t}.weight")).unwrap().info.ty, want, "blk.{i}.{t}");
        }
        assert_eq!(f.tensor(&format!("blk.{i}.attn_q.weight")).unwrap().info.dims, vec![1024, 2048]);
        assert_eq!(f.tensor(&format!("blk.{i}.attn_k.weight")).unwrap().info.dims, vec![1024, 1024]);
        assert_eq!(f.tensor(&format!("blk.{i}.ffn_down.weight")).unwrap().info.dims, vec![3072, 1024]);
        assert_eq!(f.tensor(&format!("blk.{i}.attn_q_norm.weight")).unwrap().info.dims, vec![128]);
    }
    let embd = f.tensor("token_embd.weight").unwrap();
    assert_eq!((embd.info.ty, embd.info.dims.clone()), (GgmlType::Q6_K, vec![1024, 151936]));
    assert!(f.tensor("output.weight").is_none(), "qwen3-0.6b ties its embeddings");
    let mut end = f.data_offset();
    for t in f.tensors() {
        assert_eq!(Some(t.n_bytes), t.ty.bytes_for(t.n_elements()), "{}", t.name);
        end = end.max(f.data_offset() + t.offset + t.n_bytes);
    }
    assert!(f.bytes().len() as u64 - end < 32, "only alignment padding after the last tensor");
    for (k, n) in [
        ("qwen3.embedding_length", 1024),
        ("qwen3.block_count", 28),
        ("qwen3.attention.head_count", 16),
        ("qwen3.attention.head_count_kv", 8),
        ("qwen3.attention.key_length", 128),
        ("qwen3.feed_forward_length", 3072),
        ("qwen3.vocab_size", 151936),
        ("general.file_type", 15),
        ("general.quantization_version", 2),
    ] {
        assert_eq!(f.get_u64(k).unwrap(), Some(n), "{k}");
    }
    assert_eq!(f.get_f32("qwen3.rope.freq_base").unwrap(), Some(1e6));
    assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), Some("gpt2"));
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap().unwrap();
    assert_eq!(tokens.len(), 151936);
    assert_eq!(tokens[151645], "<|im_end|>");
    assert_eq!(f.get_u64("tokenizer.ggml.eos_token_id").unwrap(), Some(151645));
    assert!(f.get_str_array("tokenizer.ggml.merges").unwrap().unwrap().len() > 200);

    // Blocks carry small positive f16 scales (Q4_K: d at bytes 0..2 of each 144-byte block).
    let q = f.tensor("blk.3.attn_q.weight").unwrap();
    for block in q.data.chunks_exact(144).step_by(97) {
        let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
        assert!(d > 0.0 && d < 1e-3, "d = {d}");
    }

    // Blocks decode to small finite weights with some spread.
    for name in ["blk.3.attn_q.weight", "blk.0.attn_v.weight", "token_embd.weight"] {
        let t = f.tensor(name).unwrap();
        let n = (t.info.row_len() * 64) as usize;
        let bytes = t.info.ty.bytes_for(n as u64).unwrap() as usize;
        let mut w = vec![0f32; n];
        lode_runtime::quant::dequantize(t.info.ty, &t.data[..bytes], &mut w).unwrap();
        let max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let rms = (w.iter().map(|x| x * x).sum::<f32>() / n as f32).sqrt();
        assert!(w.iter().all(|x| x.is_finite()) && max < 0.1 && rms > 0.005, "{name}: max {max} rms {rms}");
    }

    // The minimal tokenizer loads and round-trips text.
    let tok = lode_runtime::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    let ids = tok.encode("hello world, the capital of France is Paris", false, false);
    assert!(ids.len() < 20, "merges should shorten common words: {ids:?}");
    assert_eq!(tok.decode(&ids), "hello world, the capital of France is Paris");
    assert_eq!(tok.eos(), Some(151645));

    // Same seed, same bytes (threading does not change the output).
    let path2 = dir.join("again.gguf");
    lode(&["synth", "--preset", "qwen3-0.6b", "-o", path2.to_str().unwrap(), "--seed", "7"]);
    assert!(std::fs::read(&path2).unwrap() == f.bytes(), "synth is not deterministic");

    // The model layer resolves every weight it needs from the synthetic file.
    let again = std::sync::Arc::new(GgufFile::open(&path2).unwrap());
    lode_runtime::model::Model::load(again).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The llama-8b layout (untied output, rope_freqs, Llama-3 specials) at toy width, so
/// the model layer and tokenizer can be checked against it without writing 5 GB.
#[test]
fn synth_llama_layout_loads_at_toy_width() {
    use lode_tools::synth::{hparams, plan, synth, Hparams, Preset, Quant};
    let h = Hparams { n_embd: 256, n_layer: 2, n_head: 2, n_head_kv: 1, n_ff: 512, ..hparams(Preset::Llama8b) };
    let dir = std::env::temp_dir().join(format!("lode-synth-llama-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("toy-llama.gguf");
    synth(&h, Quant::Q4KM, &path, 1).unwrap();
    let f = GgufFile::open(&path).unwrap();
    let names: Vec<&str> = f.tensors().iter().map(|t| t.name.as_str()).collect();
    let planned = plan(&h, Quant::Q4KM);
    assert_eq!(names, planned.iter().map(|t| t.name.as_str()).collect::<Vec<_>>());
    assert_eq!(f.tensor("output.weight").unwrap().info.ty, GgmlType::Q6_K);
    assert_eq!(f.tensor("token_embd.weight").unwrap().info.ty, GgmlType::Q4_K);
    let rope = f.tensor("rope_freqs.weight").unwrap();
    assert_eq!(rope.info.dims, vec![64]);
    assert_eq!(f32::from_le_bytes(rope.data[252..256].try_into().unwrap()), 8.0);
    let tok = lode_runtime::tokenizer::Tokenizer::from_gguf(&f).unwrap();
    assert_eq!(tok.bos(), Some(128000));
    assert_eq!(tok.decode(&tok.encode("the world", false, false)), "the world");
    lode_runtime::model::Model::load(std::sync::Arc::new(f)).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
}
