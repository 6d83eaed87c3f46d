//! Every way a GGUF file can be wrong, each naming what and where.
//!
//! Byte offsets are absolute positions in the file. `what` fields are short phrases
//! such as `"value of key 'general.name'"` or `"name of tensor #3"`.

/// A GGUF parse, validation, lookup or write error. Messages say what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Catch-all for conditions that have no variant of their own.
    #[error("not a GGUF file: {0}")]
    Invalid(String),

    // ---- header ----
    #[error("bad magic {found:02x?} at byte 0 (expected \"GGUF\")")]
    BadMagic { found: Vec<u8> },
    #[error("unsupported GGUF version {version} at byte 4 (lode reads 2 and 3){hint}")]
    UnsupportedVersion { version: u32, hint: &'static str },

    // ---- structure ----
    #[error("file truncated: {what} at byte {offset} needs {need} bytes, only {have} left")]
    Truncated { what: String, offset: u64, need: u64, have: u64 },
    #[error("{what} at byte {offset} is {len}, larger than the {remaining} bytes left in the file")]
    LengthTooLarge { what: String, offset: u64, len: u64, remaining: u64 },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: String, offset: u64 },
    #[error("empty metadata key at byte {offset}")]
    EmptyKey { offset: u64 },
    #[error("duplicate metadata key '{key}' at byte {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("unknown value type id {id} for {what} at byte {offset}")]
    UnknownValueType { id: u32, what: String, offset: u64 },
    #[error("bool {what} at byte {offset} has byte value {value} (expected 0 or 1)")]
    BadBool { what: String, offset: u64, value: u8 },
    #[error("arrays nested deeper than {max} levels in key '{key}' at byte {offset}")]
    ArrayTooDeep { key: String, offset: u64, max: usize },
    #[error("general.alignment: {reason}")]
    BadAlignment { reason: String },

    // ---- tensor infos ----
    #[error("duplicate tensor name '{name}' at byte {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error("tensor '{tensor}' (info at byte {offset}): unknown tensor type id {id} (not one of ggml's types up to id 41; retired or newer)")]
    UnknownTensorType { id: u32, tensor: String, offset: u64 },
    #[error("tensor '{tensor}' (info at byte {offset}): {n_dims} dims (must be 1..=4)")]
    BadDimCount { tensor: String, offset: u64, n_dims: u32 },
    #[error("tensor '{tensor}' (info at byte {offset}): dim {index} is {value}")]
    BadDim { tensor: String, offset: u64, index: usize, value: i64 },
    #[error("tensor '{tensor}': shape {dims:?} overflows (element count or byte size)")]
    ShapeOverflow { tensor: String, dims: Vec<u64> },
    #[error("tensor '{tensor}': row length {ne0} is not a multiple of {ty}'s block size {block}")]
    PartialBlock { tensor: String, ty: String, ne0: u64, block: u64 },
    #[error("tensor '{tensor}': data offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedOffset { tensor: String, offset: u64, alignment: u64 },
    #[error(
        "tensor '{tensor}': data [{start}, {end}) (absolute bytes) lies outside the {file_len}-byte file"
    )]
    DataOutOfBounds { tensor: String, start: u64, end: u64, file_len: u64 },
    #[error("tensors '{a}' and '{b}' overlap at data offset {offset}")]
    Overlap { a: String, b: String, offset: u64 },
    #[error("tensor '{tensor}': {got} bytes given, type and shape need {expected}")]
    ByteSizeMismatch { tensor: String, expected: u64, got: u64 },

    // ---- typed accessors ----
    #[error("metadata key '{key}' is {found}, expected {expected}")]
    TypeMismatch { key: String, expected: &'static str, found: String },
    #[error("metadata key '{key}' value {value} does not fit in {target}")]
    OutOfRange { key: String, value: String, target: &'static str },
}

impl GgufError {
    pub(crate) fn type_mismatch(key: &str, expected: &'static str, found: &super::MetaValue) -> Self {
        GgufError::TypeMismatch {
            key: key.to_string(),
            expected,
            found: found.type_name(),
        }
    }
}

