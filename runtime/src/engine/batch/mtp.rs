//! The multi-token-prediction block's side of [`BatchEngine`] (a model that kept one,
//! `Model::mtp`): every evaluation of a sequence (a chunk in `eval_rows`, a batched
//! [`BatchEngine::step`]) also runs the block over the same rows into the sequence's own
//! one-layer cache, so that cache holds every position the target's does (and a prefix
//! copied from it is whole); drafting runs one row per sequence
//! ([`BatchEngine::mtp_logits`]) or one row of several sequences at once
//! ([`BatchEngine::mtp_draft_rows`], `lode serve`'s slots drafting together).

use super::BatchEngine;
use crate::engine::EngineError;
use crate::model::MtpState;

impl BatchEngine {
    /// Whether evaluations also run the MTP block (on by default where the model kept
    /// one): off, a run that does not draft with it does not pay for it (`lode bench`'s
    /// plain rows). Turned on again, a sequence's block sees zeros for the hidden state
    /// of the positions evaluated while it was off (drafts then only score worse).
    pub fn set_mtp(&mut self, on: bool) {
        self.mtp_on = on;
        if !on {
            for m in self.seqs.iter_mut().filter_map(|s| s.mtp.as_mut()) {
                m.forget_hidden();
            }
        }
    }

    /// Whether the model kept its MTP block (sequences can draft with it).
    pub fn has_mtp(&self) -> bool {
        self.mtp_bufs.is_some()
    }

    /// The model's multi-token-prediction block drafting for `seq`: the logits for the
    /// token after `tok`, where `tok` sits `j` places past the cached tokens (`j = 0`:
    /// the token about to be evaluated, with the target's hidden state of the last cached
    /// one; then the block's own drafts, each after the previous `j`). `None` for a model
    /// without the block.
    pub fn mtp_logits(&mut self, seq: usize, tok: u32, j: usize) -> Result<Option<Vec<f32>>, EngineError> {
        self.check_seq(seq)?;
        self.check_tokens(&[tok])?;
        let len = self.seqs[seq].history.len();
        let pos = len + j;
        if pos >= self.n_ctx {
            return Err(EngineError::PromptTooLong { n_prompt: j + 1, free: self.n_ctx - len, n_ctx: self.n_ctx });
        }
        let (Some(b), Some(st)) = (&self.mtp_bufs, &mut self.seqs[seq].mtp) else { return Ok(None) };
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        Ok(Some(self.model.mtp_draft(self.be.as_mut(), scratch, b, st, tok, pos as u32, j == 0)?))
    }

    /// [`Self::mtp_logits`] for several sequences at once: `rows[i] = (seq, tok, j)`, each
    /// sequence at most once; one pass of the block for all of them. Returns each row's
    /// logits in order. Refused for a model without the block.
    pub fn mtp_draft_rows(&mut self, rows: &[(usize, u32, usize)]) -> Result<Vec<Vec<f32>>, EngineError> {
        if rows.len() == 1 {
            let (seq, tok, j) = rows[0];
            return match self.mtp_logits(seq, tok, j)? {
                Some(l) => Ok(vec![l]),
                None => Err(no_block()),
            };
        }
        let n_max = self.scratch.as_ref().expect("scratch lives as long as the engine").n_max;
        if rows.is_empty() || rows.len() > n_max {
            return Err(EngineError::InvalidArg(format!("a drafting step of {} sequences (1..={n_max} allowed)", rows.len())));
        }
        let mut pos = Vec::with_capacity(rows.len());
        for (i, &(seq, tok, j)) in rows.iter().enumerate() {
            self.check_seq(seq)?;
            self.check_tokens(&[tok])?;
            if rows[..i].iter().any(|r| r.0 == seq) {
                return Err(EngineError::InvalidArg(format!("sequence {seq} appears twice in one drafting step")));
            }
            let len = self.seqs[seq].history.len();
            if len + j >= self.n_ctx {
                return Err(EngineError::PromptTooLong { n_prompt: j + 1, free: self.n_ctx - len, n_ctx: self.n_ctx });
            }
            pos.push((len + j) as u32);
        }
        let Some(b) = &self.mtp_bufs else { return Err(no_block()) };
        let seqs: Vec<usize> = rows.iter().map(|r| r.0).collect();
        let mut states = states_of(&mut self.seqs, &seqs).ok_or_else(no_block)?;
        let toks: Vec<u32> = rows.iter().map(|r| r.1).collect();
        let first: Vec<bool> = rows.iter().map(|r| r.2 == 0).collect();
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        Ok(self.model.mtp_draft_rows(self.be.as_mut(), scratch, b, &mut states, &toks, &pos, &first)?)
    }

    /// After a decode step of `steps` at `pos` (the target's rows still in the scratch):
    /// the block over the same rows (nothing when it is off or absent).
    pub(super) fn mtp_after_step(&mut self, steps: &[(usize, u32)], pos: &[u32]) -> Result<(), EngineError> {
        let (Some(b), true) = (&self.mtp_bufs, self.mtp_on) else { return Ok(()) };
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        let seqs: Vec<usize> = steps.iter().map(|s| s.0).collect();
        let tokens: Vec<u32> = steps.iter().map(|s| s.1).collect();
        let Some(mut states) = states_of(&mut self.seqs, &seqs) else { return Ok(()) };
        if let [st] = &mut states[..] {
            // One sequence: the chunk path `eval_rows` takes.
            self.model.mtp_catch_up(self.be.as_mut(), scratch, b, st, &tokens, pos)?;
        } else {
            self.model.mtp_catch_up_rows(self.be.as_mut(), scratch, b, &mut states, &tokens, pos)?;
        }
        Ok(())
    }

    /// [`Self::copy_prefix`]'s share: the block's cache rows of the first `n` positions,
    /// and the source's hidden row before position `n` where it still holds it.
    pub(super) fn copy_mtp_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<(), EngineError> {
        let e = self.model.cfg.n_embd;
        let (a, b) = if src < dst {
            let (lo, hi) = self.seqs.split_at_mut(dst);
            (&lo[src], &mut hi[0])
        } else {
            let (lo, hi) = self.seqs.split_at_mut(src);
            (&hi[0], &mut lo[dst])
        };
        if let (Some(a), Some(b)) = (&a.mtp, &mut b.mtp) {
            self.be.copy_kv(a.kv, b.kv, n)?;
            b.copy_hidden_from(self.be.as_mut(), a, n, e)?;
        }
        Ok(())
    }
}

fn no_block() -> EngineError {
    EngineError::InvalidArg("the model was loaded without its multi-token-prediction block".into())
}

/// The MTP states of `seqs` (distinct indices), in that order; `None` if one has none.
fn states_of<'a>(all: &'a mut [super::Seq], seqs: &[usize]) -> Option<Vec<&'a mut MtpState>> {
    let mut slots: Vec<Option<&mut MtpState>> = all.iter_mut().map(|s| s.mtp.as_mut()).collect();
    seqs.iter().map(|&q| slots.get_mut(q).and_then(Option::take)).collect()
}
