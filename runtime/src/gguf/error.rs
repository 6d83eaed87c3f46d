//! Every way a GGUF file can be wrong, each naming where.

/// A GGUF parse, validation or write error. Messages say what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: {0}")]
    Invalid(String),
}
