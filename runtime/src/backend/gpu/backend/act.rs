//! Quantized forms of activation buffers, made as the CPU backend makes them.
//!
//! The CPU backend quantizes a matmul's activations to the weight type's `vec_dot_type`
//! (q8_0 / q8_1 for the 32-element types, q8_K for the K-quants); the GPU must round the
//! same way or the two backends carry independent quantization noise (their KL divergence
//! is then about twice one backend's quantization noise, not ~0). So every quantized GPU
//! matmul reads activations in the form of its type (`ops::ActFmt`, `quantize.hip`):
//! decode's matvecs the int8 blocks, prefill's GEMM their values (code × scale) as f32,
//! which its f16 operand staging rounds once more (≤ 2^-11 relative).
//!
//! Each form has one scratch region and remembers which (buffer, version, row length,
//! values) it holds, so q/k/v (and gate/up) quantize their shared input once. The fused
//! producers (RMSNorm, add + RMSNorm, GLU, decode attention) write the form that the last
//! consumer of their output buffer read (`hint`), so a decode step needs no separate
//! quantize launch once the first step has taught the hints.

use super::{derr, GpuBackend, Scratch};
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::ops::{self, ActFmt};
use crate::backend::{BackendError, Buf, Result};
use std::collections::HashMap;

/// (buffer, version, row length, values); the q8_1 form's blocks do not depend on the row
/// length (any multiple of 32), so its keys say 32.
type Key = (u32, u64, usize, usize);

fn key_k(fmt: ActFmt, k: usize) -> usize {
    if fmt == ActFmt::Q8_1 && k % 32 == 0 {
        32
    } else {
        k
    }
}

/// One form's scratch and what it holds.
#[derive(Default)]
struct Form {
    scratch: Scratch,
    of: Option<Key>,
}

/// The quantized activation forms of a [`GpuBackend`].
#[derive(Default)]
pub(super) struct ActForms {
    q8: Form,
    k: Form,
    /// Prefill: code × scale as f32, and the form it came from.
    dq: Form,
    dq_fmt: Option<ActFmt>,
    /// Per buffer: (form, row length) its last quantized consumer read.
    hint: HashMap<u32, (ActFmt, usize)>,
}

impl ActForms {

    fn form(&mut self, fmt: ActFmt) -> &mut Form {
        match fmt {
            ActFmt::Q8_1 => &mut self.q8,
            ActFmt::K => &mut self.k,
        }
    }
}

impl GpuBackend {
    /// The device address of `x`'s `fmt` blocks ([n_tok, k/32]), quantizing it unless the
    /// scratch already holds them; records `fmt` as the hint for `x`'s producer.
    pub(super) fn act_blocks(&mut self, x: Buf, fmt: ActFmt, k: usize, n_tok: usize, op: &'static str) -> Result<DevPtr> {
        let (xp, _) = self.buf(x)?;
        let key = (x.0, self.version(x), key_k(fmt, k), k * n_tok);
        self.act.hint.insert(x.0, (fmt, k));
        let f = self.act.form(fmt);
        let grown = f.scratch.grown;
        let q = f.scratch.get(&self.dev, ops::q8_1_bytes(k, n_tok)).map_err(derr(op))?;
        let f = self.act.form(fmt);
        if f.of != Some(key) || f.scratch.grown != grown {
            f.of = None;
            ops::quantize_act(&self.rec(), fmt, xp, q, k, n_tok).map_err(|e| BackendError::Invalid { op, msg: e.to_string() })?;
            self.act.form(fmt).of = Some(key);
        }
        Ok(q)
    }

    /// The form a producer writing `out` (rows of `row_len`, `values` in all) should emit,
    /// and the scratch to write it to: the hint's form when its row length fits, else q8_1.
    /// Call [`Self::act_produced`] after the launch.
    pub(super) fn act_producer(&mut self, out: Buf, row_len: Option<usize>, values: usize, op: &'static str) -> Result<(ActFmt, usize, DevPtr)> {
        let (fmt, k) = match self.act.hint.get(&out.0) {
            Some(&(ActFmt::K, k)) if k % 256 == 0 && values % k == 0 && row_len.map(|r| r == k).unwrap_or(true) => (ActFmt::K, k),
            _ => (ActFmt::Q8_1, row_len.unwrap_or(32)),
        };
        let f = self.act.form(fmt);
        let q = f.scratch.get(&self.dev, ops::q8_1_bytes(values, 1)).map_err(derr(op))?;
        Ok((fmt, k, q))
    }

    /// Record that `out` (just written, already touched) has its `fmt` blocks of rows of
    /// `row_len` in that form's scratch.
    pub(super) fn act_produced(&mut self, out: Buf, fmt: ActFmt, row_len: usize, values: usize) {
        let v = self.version(out);
        self.act.form(fmt).of = Some((out.0, v, key_k(fmt, row_len), values));
    }

    /// Whether the `fmt` scratch holds the blocks of `x`'s current contents (one row of
    /// `k`); records `fmt` as `x`'s hint either way, as [`Self::act_blocks`] does, so the
    /// next producer of `x` writes that form where it can.
    pub(super) fn act_ready(&mut self, x: Buf, fmt: ActFmt, k: usize) -> bool {
        let key = (x.0, self.version(x), key_k(fmt, k), k);
        self.act.hint.insert(x.0, (fmt, k));
        self.act.form(fmt).of == Some(key)
    }

    /// Whether the last quantized consumer of `out` read the K form (a producer that can
    /// only write q8_1 then writes none).
    pub(super) fn act_wants_k(&self, out: Buf) -> bool {
        matches!(self.act.hint.get(&out.0), Some((ActFmt::K, _)))
    }

    /// Prefill: the device address of `x`'s values quantized to `fmt` and back
    /// ([n_tok, k] f32).
    pub(super) fn act_values(&mut self, x: Buf, fmt: ActFmt, k: usize, n_tok: usize, op: &'static str) -> Result<DevPtr> {
        let (xp, _) = self.buf(x)?;
        let key = (x.0, self.version(x), k, k * n_tok);
        let f = &mut self.act.dq;
        let grown = f.scratch.grown;
        let y = f.scratch.get(&self.dev, k * n_tok * 4).map_err(derr(op))?;
        if self.act.dq.of != Some(key) || self.act.dq_fmt != Some(fmt) || self.act.dq.scratch.grown != grown {
            self.act.dq.of = None;
            ops::quantize_dq(&self.rec(), fmt, xp, y, k, n_tok).map_err(|e| BackendError::Invalid { op, msg: e.to_string() })?;
            self.act.dq.of = Some(key);
            self.act.dq_fmt = Some(fmt);
        }
        Ok(y)
    }
}
