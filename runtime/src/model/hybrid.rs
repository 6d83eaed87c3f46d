//! qwen35's hybrid layers in the forward pass: the gated delta net block (its
//! projections, [`Backend::gated_delta_net`] and `ssm_out`), the buffers it and the gated
//! attention need ([`HybridScratch`]), and the recurrent state a sequence carries beside
//! its KV cache ([`RecurrentState`]).

use crate::backend::{Backend, Buf, DeltaDims, DeltaIn, DeltaNet, DeltaState, NormIn, Strided};

use super::rewind::RewindLog;
use super::{DeltaGates, DeltaProj, DeltaWeights, Model, ModelError};

/// One sequence's recurrent state: per layer, the conv and delta-rule state of a gated
/// delta net layer (`None` for attention layers). Zero for an empty sequence; it holds
/// the state after the sequence's last evaluated token only, so (unlike the KV cache) it
/// cannot be cut back to an earlier position.
pub struct RecurrentState {
    pub layers: Vec<Option<DeltaState>>,
    /// What a speculative rollback needs (`super::rewind`); allocated on first use.
    pub log: Option<RewindLog>,
}

impl RecurrentState {
    /// Zeroed states for every recurrent layer of `model` (none without one).
    pub fn new(be: &mut dyn Backend, model: &Model) -> Result<RecurrentState, ModelError> {
        let c = &model.cfg;
        let mut s = RecurrentState { layers: Vec::with_capacity(c.n_layer), log: None };
        for l in 0..c.n_layer {
            let st = match c.recurrent.filter(|_| c.recurrent_layers[l]) {
                Some(d) => {
                    let conv = be.alloc(d.conv_state_len())?;
                    match be.alloc(d.ssm_state_len()) {
                        Ok(ssm) => Some(DeltaState { conv, ssm }),
                        Err(e) => {
                            let _ = be.free(conv);
                            let _ = s.free(be);
                            return Err(e.into());
                        }
                    }
                }
                None => None,
            };
            s.layers.push(st);
        }
        Ok(s)
    }

    /// Whether there is any state (a model with recurrent layers).
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(Option::is_none)
    }

    /// Back to the state of an empty sequence.
    pub fn reset(&self, be: &mut dyn Backend, model: &Model) -> Result<(), ModelError> {
        let Some(d) = model.cfg.recurrent else { return Ok(()) };
        let (zc, zs) = (vec![0f32; d.conv_state_len()], vec![0f32; d.ssm_state_len()]);
        for st in self.layers.iter().flatten() {
            be.write(st.conv, &zc)?;
            be.write(st.ssm, &zs)?;
        }
        Ok(())
    }

    /// Makes this state a copy of `src` (another sequence's, of the same model).
    pub fn copy_from(&self, be: &mut dyn Backend, model: &Model, src: &RecurrentState) -> Result<(), ModelError> {
        let Some(d) = model.cfg.recurrent else { return Ok(()) };
        for (a, b) in self.layers.iter().zip(&src.layers) {
            if let (Some(a), Some(b)) = (a, b) {
                be.copy(b.conv, 0, a.conv, 0, d.conv_state_len())?;
                be.copy(b.ssm, 0, a.ssm, 0, d.ssm_state_len())?;
            }
        }
        Ok(())
    }

    pub fn free(&mut self, be: &mut dyn Backend) -> Result<(), ModelError> {
        self.free_log(be)?;
        for st in self.layers.drain(..).flatten() {
            be.free(st.conv)?;
            be.free(st.ssm)?;
        }
        Ok(())
    }
}

impl RecurrentState {
    /// Starts a rewind log (`super::rewind`) from the current position, for up to `cap`
    /// rows (its buffers grow to that). Nothing for a model without recurrent layers.
    pub fn start_log(&mut self, be: &mut dyn Backend, model: &Model, cap: usize) -> Result<(), ModelError> {
        if model.cfg.recurrent.is_none() {
            return Ok(());
        }
        if self.log.as_ref().is_some_and(|g| g.cap < cap) {
            self.free_log(be)?;
        }
        if self.log.is_none() {
            let mask: Vec<bool> = self.layers.iter().map(Option::is_some).collect();
            self.log = Some(RewindLog::new(be, model, &mask, cap)?);
        }
        let g = self.log.as_mut().expect("allocated above");
        g.rows = 0;
        g.armed = true;
        Ok(())
    }

    /// Stops logging (what is logged can no longer be rewound to).
    pub fn stop_log(&mut self) {
        if let Some(g) = &mut self.log {
            g.armed = false;
            g.rows = 0;
        }
    }

    /// The log's rows, when it is armed: a rewind may go back that many rows or fewer.
    pub fn logged(&self) -> Option<usize> {
        self.log.as_ref().filter(|g| g.armed).map(|g| g.rows)
    }

    /// The log, when armed and with room for `n` more rows.
    pub fn log_for(&self, n: usize) -> Option<&RewindLog> {
        self.log.as_ref().filter(|g| g.armed && g.rows + n <= g.cap)
    }

    /// Counts `n` rows appended by a forward chunk or step.
    pub fn logged_rows(&mut self, n: usize) {
        if let Some(g) = &mut self.log {
            g.rows += n;
        }
    }

    /// Brings the state back to `m` rows after the log's checkpoint (`m` at most
    /// [`Self::logged`]) through [`RewindLog::replay`] over the delta net buffers `bufs`
    /// in chunks of `n_max`. The log stops. On error the state is undefined.
    pub fn rewind(&mut self, be: &mut dyn Backend, model: &Model, bufs: [Buf; 5], n_max: usize, m: usize) -> Result<(), ModelError> {
        let r = match (&self.log, self.logged()) {
            (Some(g), Some(rows)) if m <= rows => g.replay(be, model, &self.layers, bufs, n_max, m),
            (_, have) => Err(ModelError::BadConfig(format!("a rewind of {m} rows past a log of {have:?}"))),
        };
        self.stop_log();
        r
    }

    fn free_log(&mut self, be: &mut dyn Backend) -> Result<(), ModelError> {
        match self.log.take() {
            Some(mut g) => g.free(be),
            None => Ok(()),
        }
    }
}

/// The hybrid layers' activation buffers for chunks of up to `n` tokens.
pub struct HybridScratch {
    /// `[n, 2·n_head·head_dim]`: a gated attention's query and gate, interleaved per head.
    pub qg: Buf,
    /// `[n, n_head·head_dim]`: the gate, split out.
    pub gate: Buf,
    /// The delta net's projections and output (`[n, channels]`, `[n, value_dim]`,
    /// `[n, n_v_heads]` twice, `[n, value_dim]`); absent without recurrent layers.
    pub delta: Option<[Buf; 5]>,
    /// A shared expert's gate and up `[n, n_ff_shared]`, its output `[n, n_embd]` and its
    /// gate logits `[n]` (qwen35moe).
    pub shared: Option<[Buf; 4]>,
    /// qwen3next's packed projections' outputs before they are taken apart: `ssm_in`'s
    /// `[n, channels + value_dim]` and `ssm_ba`'s `[n, 2·n_v_heads]`.
    pub packed: Option<[Buf; 2]>,
}

impl HybridScratch {
    pub fn new(be: &mut dyn Backend, model: &Model, n: usize) -> Result<Option<HybridScratch>, ModelError> {
        let c = &model.cfg;
        if !c.attn_out_gate && c.recurrent.is_none() && model.layers.iter().all(|l| l.shared.is_none()) {
            return Ok(None);
        }
        let qd = c.n_head * c.head_dim_k;
        let (qg, gate) = if c.attn_out_gate { (be.alloc(n * 2 * qd)?, be.alloc(n * qd)?) } else { (be.alloc(1)?, be.alloc(1)?) };
        let delta = match c.recurrent {
            Some(d) => Some([
                be.alloc(n * d.channels())?,
                be.alloc(n * d.value_dim())?,
                be.alloc(n * d.n_v_heads)?,
                be.alloc(n * d.n_v_heads)?,
                be.alloc(n * d.value_dim())?,
            ]),
            None => None,
        };
        let shared = match c.experts {
            Some(_) if model.layers.iter().any(|l| l.shared.is_some()) => {
                let fs = c.n_ff_shared;
                Some([be.alloc(n * fs)?, be.alloc(n * fs)?, be.alloc(n * c.n_embd)?, be.alloc(n)?])
            }
            _ => None,
        };
        let packed = match c.recurrent {
            Some(d) if model.layers.iter().any(|l| l.delta.as_ref().is_some_and(|w| w.packed())) => {
                Some([be.alloc(n * (d.channels() + d.value_dim()))?, be.alloc(n * 2 * d.n_v_heads)?])
            }
            _ => None,
        };
        Ok(Some(HybridScratch { qg, gate, delta, shared, packed }))
    }

    pub fn bufs(&self) -> Vec<Buf> {
        let mut v = vec![self.qg, self.gate];
        v.extend(self.delta.iter().flatten());
        v.extend(self.shared.iter().flatten());
        v.extend(self.packed.iter().flatten());
        v
    }
}

impl Model {
    /// A gated delta net block: `norm` (the attention norm, with the pending residual
    /// add) and the four projections, the recurrent core over `states` (one for the
    /// chunk's sequence, or one per row). Returns the buffer `ssm_out` projects.
    #[allow(clippy::too_many_arguments)]
    /// A shared expert (qwen35moe) on the FFN's normed input `x`, gated by
    /// `sigmoid(gate_inp · x)` and added to the routed experts' sum in `acc`.
    pub(super) fn shared_expert(&self, be: &mut dyn Backend, sh: &super::SharedExpert, hs: &HybridScratch, x: Buf, n: usize, acc: Buf) -> Result<(), ModelError> {
        let Some([g, u, y, logit]) = hs.shared else {
            return Err(ModelError::BadConfig("a shared expert without its buffers".into()));
        };
        let (wg, wu, wd, wi) = (self.w(sh.gate), self.w(sh.up), self.w(sh.down), self.w(sh.gate_inp));
        be.matmul_glu(&wg, &wu, x, n, g, u, self.cfg.act)?;
        be.matmul(&wd, g, n, y)?;
        be.matmul(&wi, x, n, logit)?;
        be.mul_sigmoid(y, logit, n, self.cfg.n_embd, true)?;
        be.add(acc, y, acc, n * self.cfg.n_embd)?;
        Ok(())
    }

    pub(super) fn delta_block(&self, be: &mut dyn Backend, norm: &NormIn, n: usize, l: usize, dw: &DeltaWeights, hs: &HybridScratch, states: &[&RecurrentState]) -> Result<Buf, ModelError> {
        let (Some(d), Some([qkv, z, beta, alpha, core])) = (self.cfg.recurrent, hs.delta) else {
            return Err(ModelError::BadConfig(format!("layer {l} is recurrent but the model has no delta net dimensions")));
        };
        let st: Vec<DeltaState> = states.iter().filter_map(|s| s.layers.get(l).copied().flatten()).collect();
        if st.len() != states.len() || st.is_empty() {
            return Err(ModelError::BadConfig(format!("layer {l}: {} recurrent states for {} sequences", st.len(), states.len())));
        }
        // The projections, each into its buffer or (qwen3next's packed ones) into `packed`,
        // then taken apart.
        let pk = hs.packed;
        let mut outs = Vec::with_capacity(4);
        match (dw.proj, pk) {
            (DeltaProj::Split { qkv: wq, z: wz }, _) => outs.extend([(self.w(wq), qkv), (self.w(wz), z)]),
            (DeltaProj::Packed(w), Some([p, _])) => outs.push((self.w(w), p)),
            (DeltaProj::Packed(_), None) => return Err(ModelError::BadConfig(format!("layer {l}: a packed ssm_in without its buffer"))),
        }
        match (dw.gates, pk) {
            (DeltaGates::Split { beta: wb, alpha: wa }, _) => outs.extend([(self.w(wb), beta), (self.w(wa), alpha)]),
            (DeltaGates::Packed(w), Some([_, p])) => outs.push((self.w(w), p)),
            (DeltaGates::Packed(_), None) => return Err(ModelError::BadConfig(format!("layer {l}: a packed ssm_ba without its buffer"))),
        }
        let refs: Vec<(&crate::weights::WeightRef, Buf)> = outs.iter().map(|(w, b)| (w, *b)).collect();
        be.norm_matmul_multi(norm, n, &refs)?;
        if let (DeltaProj::Packed(_), Some([p, _])) = (dw.proj, pk) {
            unpack_qkvz(be, &d, p, n, qkv, z)?;
        }
        if let (DeltaGates::Packed(_), Some([_, p])) = (dw.gates, pk) {
            // Per key head group: its value heads' beta, then their alpha.
            be.split_halves(p, n * d.n_k_heads, d.n_v_heads / d.n_k_heads, beta, alpha)?;
        }
        let (conv, dt_bias, a, nw) = (self.w(dw.conv), self.w(dw.dt_bias), self.w(dw.a), self.w(dw.norm));
        let p = DeltaNet { conv: &conv, dt_bias: &dt_bias, a: &a, norm: &nw, dims: d, eps: self.cfg.eps };
        let x = DeltaIn { qkv, z, beta, alpha };
        // Sequences whose rewind log is armed: checkpoint and log before the recurrence
        // (one sequence's chunk, or each row of a batched step).
        if let ([s0], [st0]) = (states, &st[..]) {
            if let Some(g) = s0.log_for(n) {
                g.record(be, self, l, *st0, &x, 0, n)?;
            }
        } else {
            for (i, (s, st)) in states.iter().zip(&st).enumerate() {
                if let Some(g) = s.log_for(1) {
                    g.record(be, self, l, *st, &x, i, 1)?;
                }
            }
        }
        be.gated_delta_net(&p, &x, n, &st, core)?;
        Ok(core)
    }
}

/// qwen3next's `ssm_in` output `packed` (`[n, channels + value_dim]`: per key head group
/// its q, k, v and z) into `qkv` (`[n, channels]`: every q, every k, every v) and `z`
/// (`[n, value_dim]`), with four strided copies over (token, group).
fn unpack_qkvz(be: &mut dyn Backend, d: &DeltaDims, packed: Buf, n: usize, qkv: Buf, z: Buf) -> Result<(), ModelError> {
    let (hk, nk, ch, vd) = (d.head_k_dim, d.n_k_heads, d.channels(), d.value_dim());
    let gv = vd / nk; // v (and z) values of one group
    let g = 2 * hk + 2 * gv;
    let src_stride = [nk * g, g];
    let part = |width: usize, src_off: usize, dst_off: usize, row: usize| Strided { n: [n, nk, width], src_off, src_stride, dst_off, dst_stride: [row, width] };
    be.copy_strided(packed, qkv, &part(hk, 0, 0, ch))?;
    be.copy_strided(packed, qkv, &part(hk, hk, nk * hk, ch))?;
    be.copy_strided(packed, qkv, &part(gv, 2 * hk, 2 * nk * hk, ch))?;
    be.copy_strided(packed, z, &part(gv, 2 * hk + gv, 0, vd))?;
    Ok(())
}
