//! lode's runtime library.
//!
//! The path of a token: [`gguf`] maps and validates a file without copying it;
//! [`tokenizer`] turns text into ids from the file's metadata; [`model`] turns the
//! file's metadata and tensor views into a forward pass expressed over a
//! [`backend::Backend`]; [`engine`] owns the KV cache, prefill/decode steps and the
//! sampler. [`quant`] holds the block formats and the CPU reference kernels every GPU
//! kernel is checked against; [`weights`] decides where and in which layout a weight is
//! resident.
//!
//! Only `backend::gpu::driver` touches raw GPU calls; the mmap is opened in one
//! place (`gguf::mapping`).

pub mod backend;
pub mod diag;
pub mod environment;
pub mod engine;
pub mod gguf;
pub mod model;
pub mod quant;
pub mod tokenizer;
pub mod weights;
