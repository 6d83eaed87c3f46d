//! Helpers shared by the GGUF integration tests: a small valid file, and a raw byte
//! builder for files the writer would refuse to produce.
#![allow(dead_code)]

use lode_runtime::gguf::{GgufWriter, MetaValue, ValueType};
use lode_runtime::quant::GgmlType;

/// A small valid file exercising every structural feature: scalars, a string array,
/// a nested array, three tensors of block and float types. Its last tensor is a whole
/// multiple of the alignment, so the file has no trailing padding and *every* proper
/// prefix of it is invalid.
pub fn small_valid() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", MetaValue::String("llama".into()))
        .add_kv("llama.block_count", MetaValue::U32(1))
        .add_kv("llama.rope.freq_base", MetaValue::F32(10000.0))
        .add_kv("t.flag", MetaValue::Bool(true))
        .add_kv(
            "tokenizer.ggml.tokens",
            MetaValue::Array(ValueType::String, vec![MetaValue::String("a".into()), MetaValue::String("bc".into())]),
        )
        .add_kv(
            "t.nested",
            MetaValue::Array(
                ValueType::Array,
                vec![MetaValue::Array(ValueType::I16, vec![MetaValue::I16(-1), MetaValue::I16(2)])],
            ),
        );
    w.add_tensor("blk.0.attn_q.weight", GgmlType::Q8_0, &[32, 1], vec![1; 34]);
    w.add_tensor("blk.0.ffn_up.weight", GgmlType::Q4_K, &[256], vec![2; 144]);
    w.add_tensor("output_norm.weight", GgmlType::F32, &[8, 2], vec![3; 64]);
    w.to_bytes().unwrap()
}

/// (start of tensor-info records, start of data) in a valid file.
pub fn regions(bytes: &[u8]) -> (usize, usize) {
    let f = lode_runtime::gguf::GgufFile::from_bytes(bytes.to_vec()).unwrap();
    (f.tensor_info_offset() as usize, f.data_offset() as usize)
}

/// Builds GGUF bytes field by field.
#[derive(Default)]
pub struct Raw {
    pub b: Vec<u8>,
}

impl Raw {
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.b.extend_from_slice(b"GGUF");
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.b.push(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.b.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.b.extend_from_slice(s.as_bytes());
        self
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key).u32(4).u32(v)
    }
    pub fn tensor(&mut self, name: &str, dims: &[i64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.i64(d);
        }
        self.u32(ty).u64(offset)
    }
    pub fn pad(&mut self, align: usize) -> &mut Self {
        while self.b.len() % align != 0 {
            self.b.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.b.resize(self.b.len() + n, 0);
        self
    }
}
