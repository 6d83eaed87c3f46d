//! Which quantized form of which activation buffer is current: the bookkeeping behind the
//! GPU backend's activation scratch (`backend/act.rs`), device-free so that the plan trace
//! (`plan_trace.rs`) follows the same rules as the backend it describes.
//!
//! Each form (q8_1, K) has one scratch region holding the blocks of one (buffer, version,
//! row length, values); a buffer's version changes with every write, so a stale form is
//! never served. Each buffer also keeps a hint: the form and row length its last quantized
//! consumer read, which its next producer (a norm, the GLU, decode attention) writes
//! directly, so a decode step needs no separate quantize launch once the first step has
//! taught the hints.

use crate::backend::gpu::launch::ActFmt;
use std::collections::HashMap;

/// (buffer, version, row length, values); the q8_1 form's blocks do not depend on the row
/// length (any multiple of 32), so its keys say 32.
pub type Key = (u32, u64, usize, usize);

fn key_k(fmt: ActFmt, k: usize) -> usize {
    if fmt == ActFmt::Q8_1 && k % 32 == 0 {
        32
    } else {
        k
    }
}

/// What each form's scratch holds and each buffer's hint.
#[derive(Debug, Default)]
pub struct FormBook {
    q8: Option<Key>,
    k: Option<Key>,
    hint: HashMap<u32, (ActFmt, usize)>,
}

impl FormBook {
    fn slot(&mut self, fmt: ActFmt) -> &mut Option<Key> {
        match fmt {
            ActFmt::Q8_1 => &mut self.q8,
            ActFmt::K => &mut self.k,
        }
    }

    /// The key `x` (at `version`) has in `fmt` for `n_tok` rows of `k`.
    pub fn key(x: u32, version: u64, fmt: ActFmt, k: usize, n_tok: usize) -> Key {
        (x, version, key_k(fmt, k), k * n_tok)
    }

    /// A consumer reads the `fmt` blocks of `x` (at `version`, `n_tok` rows of `k`):
    /// records `fmt` as `x`'s hint; returns the key and whether the scratch holds it.
    pub fn consume(&mut self, x: u32, version: u64, fmt: ActFmt, k: usize, n_tok: usize) -> (Key, bool) {
        self.hint.insert(x, (fmt, k));
        let key = Self::key(x, version, fmt, k, n_tok);
        (key, *self.slot(fmt) == Some(key))
    }

    /// Record that `fmt`'s scratch now holds `key` (quantized, or written by a producer).
    pub fn holds(&mut self, fmt: ActFmt, key: Key) {
        *self.slot(fmt) = Some(key);
    }

    /// Forget what `fmt`'s scratch holds (it was reallocated, or is being rewritten).
    pub fn forget(&mut self, fmt: ActFmt) {
        *self.slot(fmt) = None;
    }

    /// The form a producer writing `out` (rows of `row_len`, `values` in all) should emit:
    /// the hint's when its row length fits, else q8_1; with the row length of its key.
    pub fn producer_form(&self, out: u32, row_len: Option<usize>, values: usize) -> (ActFmt, usize) {
        match self.hint.get(&out) {
            Some(&(ActFmt::K, k)) if k % 256 == 0 && values % k == 0 && row_len.map(|r| r == k).unwrap_or(true) => (ActFmt::K, k),
            _ => (ActFmt::Q8_1, row_len.unwrap_or(32)),
        }
    }

    /// Whether the last quantized consumer of `out` read the K form.
    pub fn wants_k(&self, out: u32) -> bool {
        matches!(self.hint.get(&out), Some((ActFmt::K, _)))
    }
}
