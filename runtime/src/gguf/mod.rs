//! GGUF: the file format llama.cpp writes. Reading maps the file and validates every
//! header field, metadata record and tensor record; tensor data is never copied —
//! [`TensorView`]s borrow the mapping.
//!
//! API contract (other modules code against these names; the bodies are filled in by
//! the GGUF work):
//! - [`GgufFile::open`] / [`GgufFile::from_bytes`] parse and validate.
//! - [`GgufFile::get`] and the typed accessors (`get_u64`, `get_f32`, `get_str`,
//!   `get_str_array`, `get_f32_array`, `get_i32_array`, `get_bool`) read metadata; integer
//!   accessors accept any integer width that fits.
//! - [`GgufFile::tensors`] lists [`TensorInfo`]; [`GgufFile::tensor`] gives a [`TensorView`]
//!   whose `data` borrows the mapping.
//! - [`GgufWriter`] writes a file llama.cpp can read (tests, fixtures, `lode synth`).

mod error;
mod mapping;
mod reader;
mod validate;
mod value;
mod writer;

use std::collections::HashMap;

pub use error::{io_words, GgufError};
pub use reader::{DEFAULT_ALIGNMENT, MAX_ARRAY_DEPTH};
pub use validate::align_up;
pub use value::{MetaValue, ValueType};
pub use writer::GgufWriter;

use mapping::Mapping;

use crate::quant::GgmlType;

/// One tensor's record in the file, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// ggml `ne`: `dims[0]` is the row length (fastest varying). 1..=4 entries.
    pub dims: Vec<u64>,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Bytes the tensor occupies (type × shape).
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of dims).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims[0]
    }
    /// Number of rows (product of dims[1..]).
    pub fn n_rows(&self) -> u64 {
        self.dims[1..].iter().product()
    }
}

/// A tensor whose bytes borrow the file mapping.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    /// Exactly `info.n_bytes` bytes, at `file_offset` in the file.
    pub data: &'a [u8],
    /// Absolute byte offset of `data` in the file (the weight cache keys on it).
    pub file_offset: u64,
}

/// A parsed, validated GGUF file. Owns its mapping (or buffer); `Send + Sync`.
pub struct GgufFile {
    map: Mapping,
    version: u32,
    alignment: u64,
    data_offset: u64,
    tensor_info_offset: u64,
    metadata: Vec<(String, MetaValue)>,
    meta_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("bytes", &self.bytes().len())
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Map and validate the file at `path`. Copies no tensor data. The file must not be
    /// truncated or rewritten while the returned value lives (see `mapping.rs`).
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile, GgufError> {
        Self::from_mapping(Mapping::open(path.as_ref())?)
    }

    /// Parse and validate an in-memory file (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_mapping(Mapping::Owned(bytes))
    }

    fn from_mapping(map: Mapping) -> Result<GgufFile, GgufError> {
        let p = reader::parse(map.bytes())?;
        let meta_index = p.metadata.iter().enumerate().map(|(i, (k, _))| (k.clone(), i)).collect();
        let tensor_index = p.tensors.iter().enumerate().map(|(i, t)| (t.name.clone(), i)).collect();
        Ok(GgufFile {
            map,
            version: p.version,
            alignment: p.alignment,
            data_offset: p.data_offset,
            tensor_info_offset: p.tensor_info_offset,
            metadata: p.metadata,
            meta_index,
            tensors: p.tensors,
            tensor_index,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// `general.alignment`, or 32.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Absolute offset where the tensor-info records start (right after the metadata).
    pub fn tensor_info_offset(&self) -> u64 {
        self.tensor_info_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        &self.metadata
    }

    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Any integer type whose value is non-negative. Errors if present with a
    /// non-integer type or a value that does not fit.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let i = v.as_int().ok_or_else(|| GgufError::type_mismatch(key, "an integer", v))?;
        u64::try_from(i).map(Some).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            target: "u64",
        })
    }

    /// Any integer type whose value fits in `i64`.
    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let i = v.as_int().ok_or_else(|| GgufError::type_mismatch(key, "an integer", v))?;
        i64::try_from(i).map(Some).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            target: "i64",
        })
    }

    /// f32, or f64 rounded to f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let f = v.as_float().ok_or_else(|| GgufError::type_mismatch(key, "a float", v))?;
        Ok(Some(f as f32))
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(GgufError::type_mismatch(key, "a bool", v)),
        }
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.get(key) {
            None => Ok(None),
            Some(MetaValue::String(s)) => Ok(Some(s)),
            Some(v) => Err(GgufError::type_mismatch(key, "a string", v)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(items) = self.array_of(key, ValueType::String, "an array of string")? else {
            return Ok(None);
        };
        Ok(Some(items.iter().filter_map(MetaValue::as_str).collect()))
    }

    /// An array of f32 (or f64, rounded).
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_array() {
            Some((ValueType::F32 | ValueType::F64, items)) => {
                Ok(Some(items.iter().filter_map(|x| x.as_float().map(|f| f as f32)).collect()))
            }
            _ => Err(GgufError::type_mismatch(key, "an array of f32", v)),
        }
    }

    /// An array of any integer type whose every element fits in `i32`.
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        self.int_array(key, "i32", |i| i32::try_from(i).ok())
    }

    /// An array of any integer type whose every element fits in `u64` (per-layer
    /// hyper-parameters such as `feed_forward_length` may be stored this way).
    pub fn get_u64_array(&self, key: &str) -> Result<Option<Vec<u64>>, GgufError> {
        self.int_array(key, "u64", |i| u64::try_from(i).ok())
    }

    fn int_array<T>(
        &self,
        key: &str,
        target: &'static str,
        conv: impl Fn(i128) -> Option<T>,
    ) -> Result<Option<Vec<T>>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        let items = match v.as_array() {
            Some((t, items)) if t != ValueType::Array && items.iter().all(|x| x.as_int().is_some()) => items,
            _ => return Err(GgufError::type_mismatch(key, "an array of integers", v)),
        };
        let mut out = Vec::with_capacity(items.len());
        for x in items {
            let i = x.as_int().unwrap_or_default();
            out.push(conv(i).ok_or_else(|| GgufError::OutOfRange {
                key: key.to_string(),
                value: i.to_string(),
                target,
            })?);
        }
        Ok(Some(out))
    }

    fn array_of(
        &self,
        key: &str,
        elem: ValueType,
        expected: &'static str,
    ) -> Result<Option<&[MetaValue]>, GgufError> {
        let Some(v) = self.get(key) else { return Ok(None) };
        match v.as_array() {
            Some((t, items)) if t == elem => Ok(Some(items)),
            _ => Err(GgufError::type_mismatch(key, expected, v)),
        }
    }

    /// Tensor records in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        self.tensor_index.get(name).map(|&i| self.view(&self.tensors[i]))
    }

    /// Views of every tensor, in file order.
    pub fn views(&self) -> impl Iterator<Item = TensorView<'_>> {
        self.tensors.iter().map(|t| self.view(t))
    }

    fn view<'a>(&'a self, info: &'a TensorInfo) -> TensorView<'a> {
        // Bounds were validated at parse time: data_offset + offset + n_bytes <= len.
        let start = self.data_offset + info.offset;
        let data = &self.bytes()[start as usize..(start + info.n_bytes) as usize];
        TensorView { info, data, file_offset: start }
    }

    /// The whole file's bytes (the mapping).
    pub fn bytes(&self) -> &[u8] {
        self.map.bytes()
    }
}

#[cfg(test)]
mod tests;
