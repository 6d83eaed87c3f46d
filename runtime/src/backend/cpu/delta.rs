//! The CPU's direct [`crate::backend::Backend::gated_delta_net`], `split_halves` and
//! `mul_sigmoid`: the shared host arithmetic ([`crate::backend::recurrent`]) on the
//! backend's own buffers (no read-back copies), the delta rule's heads spread over the team.

use crate::backend::recurrent::{check_states, delta_net_seq, mul_sigmoid_slice, SeqIn};
use crate::backend::{Buf, DeltaIn, DeltaNet, DeltaState, Result, Strided};

use super::{invalid, span, span_mut, CpuBackend};

impl CpuBackend {
    pub(super) fn delta_net_direct(&mut self, p: &DeltaNet, x: &DeltaIn, n: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        check_states(states, n)?;
        let ins = [x.qkv, x.z, x.beta, x.alpha];
        for st in states {
            if ins.contains(&st.conv) || ins.contains(&st.ssm) || ins.contains(&out) || st.conv == out || st.ssm == out || st.conv == st.ssm {
                return Err(invalid("gated_delta_net", "inputs, states and output must be different buffers".into()));
            }
        }
        let d = p.dims;
        let w = p.host()?;
        let (ch, vd, nv) = (d.channels(), d.value_dim(), d.n_v_heads);
        let mut o = self.take(out)?;
        let per = if states.len() == 1 { n } else { 1 };
        let mut r = Ok(());
        for (i, st) in states.iter().enumerate() {
            let t0 = i * per;
            // Both handles are checked before either is taken out.
            if let Err(e) = self.buf(st.conv).and(self.buf(st.ssm)) {
                r = Err(e);
                break;
            }
            let (mut conv, mut ssm) = (self.take(st.conv)?, self.take(st.ssm)?);
            r = (|| {
                let sx = SeqIn {
                    qkv: span(self.buf(x.qkv)?, t0 * ch, per * ch, "gated_delta_net")?,
                    z: span(self.buf(x.z)?, t0 * vd, per * vd, "gated_delta_net")?,
                    beta: span(self.buf(x.beta)?, t0 * nv, per * nv, "gated_delta_net")?,
                    alpha: span(self.buf(x.alpha)?, t0 * nv, per * nv, "gated_delta_net")?,
                };
                let conv_s = span_mut(&mut conv, 0, d.conv_state_len(), "gated_delta_net")?;
                let ssm_s = span_mut(&mut ssm, 0, d.ssm_state_len(), "gated_delta_net")?;
                let os = span_mut(&mut o, t0 * vd, per * vd, "gated_delta_net")?;
                delta_net_seq(&d, &w, p.eps, &sx, per, conv_s, ssm_s, os, &*self.pool)
            })();
            self.put(st.conv, conv);
            self.put(st.ssm, ssm);
            if r.is_err() {
                break;
            }
        }
        self.put(out, o);
        r?;
        self.dump("gated_delta_net", out, n * vd);
        Ok(())
    }

    pub(super) fn split_halves_direct(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        if src == a || src == b || a == b {
            return Err(invalid("split_halves", "source and halves must be different buffers".into()));
        }
        self.buf(a).and(self.buf(b))?;
        let (mut va, mut vb) = (self.take(a)?, self.take(b)?);
        let r = (|| {
            let s = span(self.buf(src)?, 0, n_rows * 2 * half, "split_halves")?;
            let (da, db) = (span_mut(&mut va, 0, n_rows * half, "split_halves")?, span_mut(&mut vb, 0, n_rows * half, "split_halves")?);
            for (i, row) in s.chunks_exact(2 * half).enumerate() {
                da[i * half..(i + 1) * half].copy_from_slice(&row[..half]);
                db[i * half..(i + 1) * half].copy_from_slice(&row[half..]);
            }
            Ok(())
        })();
        self.put(a, va);
        self.put(b, vb);
        r
    }

    pub(super) fn copy_strided_direct(&mut self, src: Buf, dst: Buf, s: &Strided) -> Result<()> {
        if src == dst {
            return Err(invalid("copy_strided", "source and destination must be different buffers".into()));
        }
        let (se, de) = (s.src_end(), s.dst_end());
        if de == 0 {
            return Ok(());
        }
        self.with_io(src, dst, |sv, dv, _| {
            let sv = span(sv.unwrap_or(&[]), 0, se, "copy_strided")?;
            s.apply(sv, span_mut(dv, 0, de, "copy_strided")?);
            Ok(())
        })
    }

    pub(super) fn mul_sigmoid_direct(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        let (n, ng) = (n_rows * row_len, if per_row { n_rows } else { n_rows * row_len });
        if x == gate {
            return Err(invalid("mul_sigmoid", "x and gate must be different buffers".into()));
        }
        self.with_io(gate, x, |g, xv, _| {
            let g = span(g.unwrap_or(&[]), 0, ng, "mul_sigmoid")?;
            mul_sigmoid_slice(span_mut(xv, 0, n, "mul_sigmoid")?, g, row_len, per_row);
            Ok(())
        })
    }
}
