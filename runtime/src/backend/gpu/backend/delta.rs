//! qwen35's ops on the GPU: [`Backend::gated_delta_net`] as `family/delta.rs`'s three
//! launches per layer (the conv in place over `qkv`, the delta rule per value head and
//! group of state rows, the gated norm) over states that stay in device memory, and `split_halves` / `mul_sigmoid` as one
//! element-wise launch each (`copy_strided`, qwen3next's unpacking, too). No host round trip, so a qwen35 decode step replays as a
//! graph; `plan::gated_delta_net` sends the layers the kernels do not take to the
//! trait's default (the host).
//!
//! A batched step (one state per row) stages a table of the rows' state addresses, as
//! `attention_rows` stages its cache table; one sequence's chunk passes its two state
//! addresses directly.

use super::{err, GpuBackend};
use crate::backend::gpu::family::delta::{self as fam, Operands, States};
use crate::backend::gpu::plan::{self, Delta};
use crate::backend::recurrent::{check_states, copy_strided_host, gated_delta_net_host, mul_sigmoid_host, split_halves_host};
use crate::backend::{BackendError, Buf, DeltaIn, DeltaNet, DeltaState, Result, Strided};
use crate::weights::WeightRef;

const OP: &str = "gated_delta_net";

fn invalid(op: &'static str, msg: String) -> BackendError {
    BackendError::Invalid { op, msg }
}

/// `w`'s value count is `want`.
fn check_weight(w: &WeightRef, want: usize) -> Result<()> {
    let n = w.row_len() * w.n_rows();
    if n != want {
        return Err(invalid(OP, format!("`{}` has {n} values, expected {want}", w.name())));
    }
    Ok(())
}

impl GpuBackend {
    pub(super) fn delta_net_device(&mut self, p: &DeltaNet, x: &DeltaIn, n: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        check_states(states, n)?;
        let d = p.dims;
        if plan::gated_delta_net(&d, p.conv.ty(), &self.tuning) == Delta::Host {
            return gated_delta_net_host(self, p, x, n, states, out);
        }
        let ins = [x.qkv, x.z, x.beta, x.alpha, out];
        for st in states {
            if ins.contains(&st.conv) || ins.contains(&st.ssm) || st.conv == st.ssm {
                return Err(invalid(OP, "inputs, states and output must be different buffers".into()));
            }
        }
        if ins[..4].contains(&out) {
            return Err(invalid(OP, "the output must not be an input".into()));
        }
        let (ch, vd, nv) = (d.channels(), d.value_dim(), d.n_v_heads);
        let ptr = |b: Buf, need: usize| -> Result<u64> {
            let (p, have) = self.buf(b)?;
            Self::check_len(OP, b, have, need)?;
            Ok(p)
        };
        let (qkv, z, beta, alpha, o) = (ptr(x.qkv, n * ch)?, ptr(x.z, n * vd)?, ptr(x.beta, n * nv)?, ptr(x.alpha, n * nv)?, ptr(out, n * vd)?);
        let mut addrs = Vec::with_capacity(2 * states.len());
        for st in states {
            addrs.push(ptr(st.conv, d.conv_state_len())?);
            addrs.push(ptr(st.ssm, d.ssm_state_len())?);
        }
        for (w, want) in [(p.conv, d.d_conv * ch), (p.dt_bias, nv), (p.a, nv), (p.norm, d.head_v_dim)] {
            check_weight(w, want)?;
        }
        let conv_w = self.weight(p.conv)?;
        let (dt_bias, a, norm) = (self.weight_f32(p.dt_bias)?, self.weight_f32(p.a)?, self.weight_f32(p.norm)?);
        let (st, n_states, per) = if states.len() == 1 {
            (States::One { conv: addrs[0], ssm: addrs[1] }, 1, n)
        } else {
            (States::Table(self.stage_bytes(bytemuck::cast_slice(&addrs))?), n, 1)
        };
        let ops = Operands { qkv, z, beta, alpha, out: o, conv_w, dt_bias, a, norm };
        let r = fam::gated_delta_net(&self.rec(), &d, &ops, st, n_states, per, p.eps).map_err(err(OP));
        self.touch(x.qkv);
        self.touch(out);
        for s in states {
            self.touch(s.conv);
            self.touch(s.ssm);
        }
        r
    }

    pub(super) fn split_halves_device(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        if src == a || src == b || a == b {
            return Err(invalid("split_halves", "source and halves must be different buffers".into()));
        }
        let (sp, sn) = self.buf(src)?;
        let (ap, an) = self.buf(a)?;
        let (bp, bn) = self.buf(b)?;
        Self::check_len("split_halves", src, sn, n_rows * 2 * half)?;
        Self::check_len("split_halves", a, an, n_rows * half)?;
        Self::check_len("split_halves", b, bn, n_rows * half)?;
        if n_rows * half > i32::MAX as usize / 2 {
            return split_halves_host(self, src, n_rows, half, a, b);
        }
        let r = fam::split_halves(&self.rec(), sp, ap, bp, n_rows, half).map_err(err("split_halves"));
        self.touch(a);
        self.touch(b);
        r
    }

    pub(super) fn copy_strided_device(&mut self, src: Buf, dst: Buf, s: &Strided) -> Result<()> {
        if src == dst {
            return Err(invalid("copy_strided", "source and destination must be different buffers".into()));
        }
        let (sp, sn) = self.buf(src)?;
        let (dp, dn) = self.buf(dst)?;
        let (se, de) = (s.src_end(), s.dst_end());
        if de == 0 {
            return Ok(());
        }
        Self::check_len("copy_strided", src, sn, se)?;
        Self::check_len("copy_strided", dst, dn, de)?;
        if se.max(de) > i32::MAX as usize {
            return copy_strided_host(self, src, dst, s);
        }
        let r = fam::copy_strided(&self.rec(), sp + 4 * s.src_off as u64, dp + 4 * s.dst_off as u64, s.n, s.src_stride, s.dst_stride).map_err(err("copy_strided"));
        self.touch(dst);
        r
    }

    pub(super) fn mul_sigmoid_device(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        if x == gate {
            return Err(invalid("mul_sigmoid", "x and gate must be different buffers".into()));
        }
        let (xp, xn) = self.buf(x)?;
        let (gp, gn) = self.buf(gate)?;
        Self::check_len("mul_sigmoid", x, xn, n_rows * row_len)?;
        Self::check_len("mul_sigmoid", gate, gn, if per_row { n_rows } else { n_rows * row_len })?;
        if n_rows * row_len > i32::MAX as usize {
            return mul_sigmoid_host(self, x, gate, n_rows, row_len, per_row);
        }
        let r = fam::mul_sigmoid(&self.rec(), xp, gp, n_rows, row_len, per_row).map_err(err("mul_sigmoid"));
        self.touch(x);
        r
    }
}
