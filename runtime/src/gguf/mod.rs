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
mod value;

pub use error::GgufError;
pub use value::{MetaValue, ValueType};

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

/// A parsed, validated GGUF file.
pub struct GgufFile {
    _private: (),
}

impl GgufFile {
    /// Map and validate the file at `path`. Copies no tensor data.
    pub fn open(path: impl AsRef<std::path::Path>) -> Result<GgufFile, GgufError> {
        let _ = path;
        todo!("gguf reader")
    }
    /// Parse and validate an in-memory file (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        let _ = bytes;
        todo!("gguf reader")
    }
    pub fn version(&self) -> u32 {
        todo!()
    }
    pub fn alignment(&self) -> u64 {
        todo!()
    }
    /// Absolute offset of the data section.
    pub fn data_offset(&self) -> u64 {
        todo!()
    }
    /// All metadata, in file order.
    pub fn metadata(&self) -> &[(String, MetaValue)] {
        todo!()
    }
    pub fn get(&self, key: &str) -> Option<&MetaValue> {
        let _ = key;
        todo!()
    }
    /// Errors if present with a non-integer type or a value that does not fit.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn get_i32_array(&self, key: &str) -> Result<Option<Vec<i32>>, GgufError> {
        let _ = key;
        todo!()
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        todo!()
    }
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let _ = name;
        todo!()
    }
    /// The whole file's bytes (the mapping).
    pub fn bytes(&self) -> &[u8] {
        todo!()
    }
}

/// Builds a GGUF file in memory and writes it out as llama.cpp would.
#[derive(Default)]
pub struct GgufWriter {
    _private: (),
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }
    /// Version 3, alignment 32 unless `general.alignment` is set.
    pub fn add_kv(&mut self, key: impl Into<String>, value: MetaValue) -> &mut Self {
        let _ = (key.into(), value);
        todo!()
    }
    /// `data` must be exactly `ty.bytes_for(product(dims))` bytes.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ty: GgmlType,
        dims: &[u64],
        data: Vec<u8>,
    ) -> &mut Self {
        let _ = (name.into(), ty, dims, data);
        todo!()
    }
    pub fn to_bytes(&self) -> Result<Vec<u8>, GgufError> {
        todo!()
    }
    pub fn write_to(&self, path: impl AsRef<std::path::Path>) -> Result<(), GgufError> {
        let _ = path;
        todo!()
    }
}
