//! Debug aid: with `LODE_DEBUG=cpu-dump=<dir>[:N]` ([`crate::diag`]) every CPU op writes
//! its output buffer to `<dir>/<seq>_<op>.f32` (raw little-endian f32, in op order), so a
//! forward pass can be compared tensor by tensor with llama.cpp's intermediate tensors;
//! the first N (default 500) ops only. Off (one cached lookup) otherwise.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

static DIR: OnceLock<Option<(PathBuf, usize)>> = OnceLock::new();
static SEQ: AtomicUsize = AtomicUsize::new(0);

/// Whether dumping is on.
pub fn on() -> bool {
    DIR.get_or_init(|| crate::diag::get().cpu_dump.clone()).is_some()
}

/// Writes `data` as the next dump named `op` (best effort: a failed write is reported
/// on stderr, never an error of the op).
pub fn write(op: &str, data: &[f32]) {
    let Some(Some((dir, max))) = DIR.get() else { return };
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    if n >= *max {
        return;
    }
    let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
    if let Err(e) = std::fs::write(dir.join(format!("{n:05}_{op}.f32")), bytes) {
        eprintln!("cpu-dump: {e}");
    }
}
