//! Shared by the CLI integration tests: where the real models are, and running the
//! built `lode` binary with a check that it never panicked.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

/// SmolLM2-135M-Instruct Q4_1: the fastest real model, used by most CLI tests.
pub const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$LODE_MODELS_DIR`, else `~/.cache/lode/models` (where `lode` fetches models).
pub fn models_dir() -> PathBuf {
    std::env::var_os("LODE_MODELS_DIR").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lode/models")
    })
}

/// The model file `name` in [`models_dir`], or `None` after printing a SKIP note.
pub fn model(name: &str) -> Option<PathBuf> {
    let p = models_dir().join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: {} not found (set LODE_MODELS_DIR)", p.display());
        None
    }
}

/// Run the built binary; whatever its exit status, it must not have panicked.
pub fn lode(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_lode")).args(args).output().expect("run lode");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "lode {args:?} panicked: {err}");
    out
}
