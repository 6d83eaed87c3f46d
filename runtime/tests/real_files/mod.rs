//! Shared by the tests that read the real models and llama.cpp's fixtures: where they
//! are, and a SKIP note (not a failure) when they are absent. CI fetches both first.
#![allow(dead_code)]

use std::path::PathBuf;

/// The model file `name` in `$LODE_MODELS_DIR` (else `~/.cache/lode/models`, where
/// `lode` fetches models), or `None` after printing a SKIP note.
pub fn model(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("LODE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/lode/models"));
    let p = dir.join(name);
    if p.exists() {
        Some(p)
    } else {
        eprintln!("SKIP: {} not found (set LODE_MODELS_DIR)", p.display());
        None
    }
}

/// `$LODE_FIXTURES_DIR`, else `shared/fixtures` beside the checkout (or beside a git
/// worktree one level deeper), or `None` after printing a SKIP note.
pub fn fixtures_dir() -> Option<PathBuf> {
    let candidates = match std::env::var_os("LODE_FIXTURES_DIR") {
        Some(d) => vec![PathBuf::from(d)],
        None => vec![
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures")),
            PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures")),
        ],
    };
    let found = candidates.into_iter().find(|d| d.is_dir());
    if found.is_none() {
        eprintln!("SKIP: fixtures not found (set LODE_FIXTURES_DIR)");
    }
    found
}
