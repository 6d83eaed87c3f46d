//! Every way a GGUF file can be wrong, each naming what and where.
//!
//! Byte offsets are absolute positions in the file. `what` fields are short phrases
//! such as `"value of key 'general.name'"` or `"name of tensor #3"`.

/// A GGUF parse, validation, lookup or write error. Messages say what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file cannot be opened or mapped; the reason in words (the `io::Error` is
    /// kept, not chained, so a report names the reason once).
    #[error("cannot read {path}: {}", io_words(err))]
    Io { path: String, err: std::io::Error },
    #[error("cannot read {path}: it is a directory, not a GGUF file")]
    NotAFile { path: String },
    /// Catch-all for conditions that have no variant of their own.
    #[error("not a GGUF file: {0}")]
    Invalid(String),

    // ---- header ----
    #[error("bad magic {} at byte 0 (expected \"GGUF\", 47 47 55 46): not a GGUF file", show_bytes(found))]
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


impl GgufError {
    /// For an error about the file itself (cannot be read, is a directory): the reason
    /// in words without the path, so a caller can name the path once in its own words.
    pub fn file_reason(&self) -> Option<String> {
        match self {
            GgufError::Io { err, .. } => Some(io_words(err)),
            GgufError::NotAFile { .. } => Some("it is a directory, not a GGUF file".into()),
            _ => None,
        }
    }
}

/// An I/O error in words, without the OS error number.
pub fn io_words(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound => "no such file".into(),
        K::PermissionDenied => "permission denied".into(),
        K::IsADirectory => "it is a directory, not a file".into(),
        _ => {
            let s = e.to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            c.next().map_or(s.clone(), |f| f.to_lowercase().chain(c).collect())
        }
    }
}

/// Bytes as quoted text (non-printable bytes as `\xNN`) and as hex: `"root" (72 6f 6f 74)`.
pub fn show_bytes(b: &[u8]) -> String {
    let text: String = b
        .iter()
        .map(|&c| if (0x20..0x7f).contains(&c) && c != b'"' && c != b'\\' { (c as char).to_string() } else { format!("\\x{c:02x}") })
        .collect();
    let hex: Vec<String> = b.iter().map(|c| format!("{c:02x}")).collect();
    if b.is_empty() {
        "(none: the file is empty)".into()
    } else {
        format!("\"{text}\" ({})", hex.join(" "))
    }
}
