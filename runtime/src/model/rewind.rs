//! Rolling a sequence's recurrent state back to an earlier position (speculative
//! decoding with qwen35's gated delta nets: a verify chunk advances the state past drafts
//! the target then rejects).
//!
//! A [`RewindLog`] holds, per recurrent layer, a checkpoint of the state (conv and
//! delta-rule) taken when the log started, and the delta net's inputs (the `attn_qkv`,
//! `ssm_beta` and `ssm_alpha` projections, before the conv) of every row evaluated since.
//! Going back to `m` rows after the checkpoint restores it and runs the delta rule over
//! the first `m` logged rows again ([`RewindLog::replay`], through `RecurrentState::rewind`). That costs no weight
//! reads and no matmuls: per layer one state copy and the recurrence over the kept rows.
//!
//! Why not the alternatives: keeping the state after every position of the chunk costs
//! (k + 1) states per layer (Qwen3.5-27B: 48 layers × 3 MiB each, ≈ 2.5 GB for a 16-token
//! draft) and as many state writes per verify; re-running the accepted prefix through
//! the whole model reads every weight a second time, the cost speculation exists to save.
//!
//! The state a rewind produces is the one the chunk passed through: the recurrence is
//! sequential per token, so the first `m` rows of a chunk give the same state as `m` rows
//! alone (bit for bit on the CPU; `tests/spec_cli.rs` checks greedy output against plain
//! decoding).

use crate::backend::{Backend, Buf, DeltaIn, DeltaNet, DeltaState};

use super::{Model, ModelError};

/// One recurrent layer's checkpoint and logged inputs (`cap` rows).
#[derive(Clone, Copy, Debug)]
pub struct LayerLog {
    pub conv: Buf,
    pub ssm: Buf,
    /// `[cap, channels]`, `[cap, n_v_heads]`, `[cap, n_v_heads]`.
    pub qkv: Buf,
    pub beta: Buf,
    pub alpha: Buf,
}

/// See the module doc. `rows` rows are logged after the checkpoint, at most `cap`.
pub struct RewindLog {
    pub layers: Vec<Option<LayerLog>>,
    pub cap: usize,
    pub rows: usize,
    /// Whether evaluations on the sequence append to the log.
    pub armed: bool,
}

impl RewindLog {
    /// A log of `cap` rows for the recurrent layers marked in `layers` (`true`: a gated
    /// delta net layer), its buffers allocated on `be`.
    pub fn new(be: &mut dyn Backend, model: &Model, layers: &[bool], cap: usize) -> Result<RewindLog, ModelError> {
        let Some(d) = model.cfg.recurrent else {
            return Err(ModelError::BadConfig("a rewind log for a model without recurrent layers".into()));
        };
        let mut g = RewindLog { layers: Vec::with_capacity(layers.len()), cap, rows: 0, armed: false };
        for &recurrent in layers {
            if !recurrent {
                g.layers.push(None);
                continue;
            }
            let mut bufs = Vec::with_capacity(5);
            for len in [d.conv_state_len(), d.ssm_state_len(), cap * d.channels(), cap * d.n_v_heads, cap * d.n_v_heads] {
                match be.alloc(len) {
                    Ok(b) => bufs.push(b),
                    Err(e) => {
                        bufs.into_iter().for_each(|b| drop(be.free(b)));
                        let _ = g.free(be);
                        return Err(e.into());
                    }
                }
            }
            g.layers.push(Some(LayerLog { conv: bufs[0], ssm: bufs[1], qkv: bufs[2], beta: bufs[3], alpha: bufs[4] }));
        }
        Ok(g)
    }

    /// Returns the buffers to the backend.
    pub fn free(&mut self, be: &mut dyn Backend) -> Result<(), ModelError> {
        for l in self.layers.drain(..).flatten() {
            for b in [l.conv, l.ssm, l.qkv, l.beta, l.alpha] {
                be.free(b)?;
            }
        }
        Ok(())
    }

    /// Called by the delta net block of layer `l` on `n` rows of one sequence (rows
    /// `row0..row0 + n` of the chunk: all of a sequence's chunk, or its one row of a
    /// batched step), after its projections and before the recurrence: checkpoints the
    /// state (the first rows since the log started) and appends the rows' inputs.
    #[allow(clippy::too_many_arguments)]
    pub fn record(&self, be: &mut dyn Backend, model: &Model, l: usize, st: DeltaState, x: &DeltaIn, row0: usize, n: usize) -> Result<(), ModelError> {
        let (Some(d), Some(Some(g))) = (model.cfg.recurrent, self.layers.get(l)) else {
            return Err(ModelError::BadConfig(format!("layer {l}: a rewind log without this layer")));
        };
        if self.rows + n > self.cap {
            return Err(ModelError::BadConfig(format!("rewind log of {} rows: {} logged, {n} more", self.cap, self.rows)));
        }
        if self.rows == 0 {
            be.copy(st.conv, 0, g.conv, 0, d.conv_state_len())?;
            be.copy(st.ssm, 0, g.ssm, 0, d.ssm_state_len())?;
        }
        let (ch, nv, r) = (d.channels(), d.n_v_heads, self.rows);
        be.copy(x.qkv, row0 * ch, g.qkv, r * ch, n * ch)?;
        be.copy(x.beta, row0 * nv, g.beta, r * nv, n * nv)?;
        be.copy(x.alpha, row0 * nv, g.alpha, r * nv, n * nv)?;
        Ok(())
    }

    /// Brings the `states` (one per layer, as the log's) back to `m` rows after the
    /// checkpoint (`m` at most [`Self::rows`]): the checkpoint restored and the first `m`
    /// logged rows run through each layer's recurrence again, in chunks of `n_max` rows
    /// through the delta net buffers `bufs` (a forward chunk's `[qkv, z, beta, alpha,
    /// core]`, free between chunks). On error the states are undefined.
    pub fn replay(&self, be: &mut dyn Backend, model: &Model, states: &[Option<DeltaState>], bufs: [Buf; 5], n_max: usize, m: usize) -> Result<(), ModelError> {
        let Some(d) = model.cfg.recurrent else { return Ok(()) };
        if m > self.rows || n_max == 0 {
            return Err(ModelError::BadConfig(format!("a rewind of {m} rows past a log of {} (chunks of {n_max})", self.rows)));
        }
        let [qkv, z, beta, alpha, core] = bufs;
        let (ch, nv) = (d.channels(), d.n_v_heads);
        for (l, (st, lg)) in states.iter().zip(&self.layers).enumerate() {
            let (Some(st), Some(lg)) = (st, lg) else { continue };
            let Some(dw) = model.layers.get(l).and_then(|ly| ly.delta.as_ref()) else {
                return Err(ModelError::BadConfig(format!("layer {l} has a recurrent state but no delta net")));
            };
            be.copy(lg.conv, 0, st.conv, 0, d.conv_state_len())?;
            be.copy(lg.ssm, 0, st.ssm, 0, d.ssm_state_len())?;
            let (conv, dt_bias, a, nw) = (model.w(dw.conv), model.w(dw.dt_bias), model.w(dw.a), model.w(dw.norm));
            let p = DeltaNet { conv: &conv, dt_bias: &dt_bias, a: &a, norm: &nw, dims: d, eps: model.cfg.eps };
            let mut done = 0;
            while done < m {
                let n = (m - done).min(n_max);
                be.copy(lg.qkv, done * ch, qkv, 0, n * ch)?;
                be.copy(lg.beta, done * nv, beta, 0, n * nv)?;
                be.copy(lg.alpha, done * nv, alpha, 0, n * nv)?;
                // `z` only shapes the output, which is not wanted here.
                be.gated_delta_net(&p, &DeltaIn { qkv, z, beta, alpha }, n, &[*st], core)?;
                done += n;
            }
        }
        Ok(())
    }
}
