//! Debug aid: with `LODE_CPU_DUMP=<dir>` every CPU op writes its output buffer to
//! `<dir>/<seq>_<op>.f32` (raw little-endian f32, in op order), so a forward pass can be
//! compared tensor by tensor with llama.cpp's intermediate tensors; the first
//! `LODE_CPU_DUMP_MAX` (default 500) ops only. Off (one cached environment lookup)
//! otherwise.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Whether dumping is on.
pub fn on() -> bool {
    DIR.get_or_init(|| std::env::var_os("LODE_CPU_DUMP").map(PathBuf::from)).is_some()
}

/// Writes `data` as the next dump named `op` (best effort: a failed write is reported
/// on stderr, never an error of the op).
pub fn write(op: &str, data: &[f32]) {
    let Some(Some(dir)) = DIR.get() else { return };
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let max = std::env::var("LODE_CPU_DUMP_MAX").ok().and_then(|m| m.parse().ok()).unwrap_or(500);
    if n >= max {
        return;
    }
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    if let Err(e) = std::fs::write(dir.join(format!("{n:05}_{op}.f32")), bytes) {
        eprintln!("LODE_CPU_DUMP: {e}");
    }
}
