//! Quantized forms of activation buffers, made as the CPU backend makes them.
//!
//! The CPU backend quantizes a matmul's activations to the weight type's `vec_dot_type`
//! (q8_0 / q8_1 for the 32-element types, q8_K for the K-quants); the GPU must round the
//! same way or the two backends carry independent quantization noise (their KL divergence
//! is then about twice one backend's quantization noise, not ~0). So every quantized GPU
//! matmul reads activations in the form of its type (`launch::ActFmt`, `quantize.hip`):
//! decode's matvecs the int8 blocks, prefill's GEMM their values (code × scale) as f32,
//! which its f16 operand staging rounds once more (≤ 2^-11 relative).
//!
//! Each form has one scratch region; which (buffer, version, row length, values) it holds
//! and each buffer's hint are `act_forms::FormBook`'s, so q/k/v (and gate/up) quantize
//! their shared input once and the fused producers (RMSNorm, add + RMSNorm, GLU, decode
//! attention) write the form the last consumer of their output buffer read.

use crate::backend::gpu::family::quantize;
use crate::backend::gpu::launch::ActFmt;
use super::{derr, GpuBackend, Scratch};
use crate::backend::gpu::act_forms::FormBook;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::{BackendError, Buf, Result};

/// The quantized activation forms of a [`GpuBackend`]: one scratch per form, and the book
/// of what each holds.
#[derive(Default)]
pub(super) struct ActForms {
    q8: Scratch,
    k: Scratch,
    book: FormBook,
    /// Prefill: code × scale as f32, and the (key, form) it was made from.
    dq: Scratch,
    dq_of: Option<((u32, u64, usize, usize), ActFmt)>,
}

impl ActForms {
    fn scratch(&mut self, fmt: ActFmt) -> &mut Scratch {
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
        let (key, held) = self.act.book.consume(x.0, self.version(x), fmt, k, n_tok);
        let f = self.act.scratch(fmt);
        let grown = f.grown;
        let q = f.get(&self.dev, quantize::q8_1_bytes(k, n_tok)).map_err(derr(op))?;
        if !held || self.act.scratch(fmt).grown != grown {
            self.act.book.forget(fmt);
            quantize::quantize_act(&self.rec(), fmt, xp, q, k, n_tok).map_err(|e| BackendError::Invalid { op, msg: e.to_string() })?;
            self.act.book.holds(fmt, key);
        }
        Ok(q)
    }

    /// The form a producer writing `out` (rows of `row_len`, `values` in all) should emit,
    /// and the scratch to write it to: the hint's form when its row length fits, else q8_1.
    /// Call [`Self::act_produced`] after the launch.
    pub(super) fn act_producer(&mut self, out: Buf, row_len: Option<usize>, values: usize, op: &'static str) -> Result<(ActFmt, usize, DevPtr)> {
        let (fmt, k) = self.act.book.producer_form(out.0, row_len, values);
        let q = self.act.scratch(fmt).get(&self.dev, quantize::q8_1_bytes(values, 1)).map_err(derr(op))?;
        Ok((fmt, k, q))
    }

    /// Record that `out` (just written, already touched) has its `fmt` blocks of rows of
    /// `row_len` in that form's scratch.
    pub(super) fn act_produced(&mut self, out: Buf, fmt: ActFmt, row_len: usize, values: usize) {
        let key = FormBook::key(out.0, self.version(out), fmt, row_len, values / row_len.max(1));
        self.act.book.holds(fmt, (key.0, key.1, key.2, values));
    }

    /// Whether the `fmt` scratch holds the blocks of `x`'s current contents (one row of
    /// `k`); records `fmt` as `x`'s hint either way, as [`Self::act_blocks`] does, so the
    /// next producer of `x` writes that form where it can.
    pub(super) fn act_ready(&mut self, x: Buf, fmt: ActFmt, k: usize) -> bool {
        self.act.book.consume(x.0, self.version(x), fmt, k, 1).1
    }

    /// Whether the last quantized consumer of `out` read the K form (a producer that can
    /// only write q8_1 then writes none).
    pub(super) fn act_wants_k(&self, out: Buf) -> bool {
        self.act.book.wants_k(out.0)
    }

    /// Prefill: the device address of `x`'s values quantized to `fmt` and back
    /// ([n_tok, k] f32).
    pub(super) fn act_values(&mut self, x: Buf, fmt: ActFmt, k: usize, n_tok: usize, op: &'static str) -> Result<DevPtr> {
        let (xp, _) = self.buf(x)?;
        let key = (x.0, self.version(x), k, k * n_tok);
        let grown = self.act.dq.grown;
        let y = self.act.dq.get(&self.dev, k * n_tok * 4).map_err(derr(op))?;
        if self.act.dq_of != Some((key, fmt)) || self.act.dq.grown != grown {
            self.act.dq_of = None;
            quantize::quantize_dq(&self.rec(), fmt, xp, y, k, n_tok).map_err(|e| BackendError::Invalid { op, msg: e.to_string() })?;
            self.act.dq_of = Some((key, fmt));
        }
        Ok(y)
    }
}
