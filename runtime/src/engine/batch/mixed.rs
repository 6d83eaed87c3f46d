//! Chunked prefill mixed with decode: [`BatchEngine::step_mixed`] runs a chunk of one
//! sequence's prompt and the next token of every decoding sequence as ONE forward pass,
//! so a long prompt is fed a chunk per step instead of freezing the other streams for
//! its whole prefill, and the weights are still read once per step.
//!
//! The chunk's rows come first (they attend over their own cache as a prompt chunk does:
//! `Backend::attention`, the GPU's flash kernel), the decode rows after them (moved to
//! small buffers for `Backend::attention_rows`); the logits come back for the decode rows
//! and, when the chunk ends its prompt, for the chunk's last row (`OutputRows::Tail`).
//! Models with recurrent layers (whose delta net takes one sequence's rows or one row per
//! sequence) and models that kept an MTP block (whose catch-up follows single-sequence
//! chunks) do not mix: the server alternates chunks and steps for them.

use super::super::fit::mix_rows;
use super::{BatchEngine, EngineError, KvRows, Model, OutputRows};
use crate::backend::{Backend, Buf};

/// The buffers [`BatchEngine::step_mixed`] moves its decode rows to for their attention
/// (`[q, k, v, att]`), where the engine mixes.
pub(super) fn alloc_mix_bufs(be: &mut dyn Backend, model: &Model, n_seq: usize) -> Result<Option<[Buf; 4]>, EngineError> {
    let Some(d) = mix_rows(model, n_seq) else { return Ok(None) };
    let c = &model.cfg;
    let lens = [c.n_head * c.head_dim_k, c.n_head_kv * c.head_dim_k, c.n_head_kv * c.head_dim_v, c.n_head * c.head_dim_v];
    let mut bufs = Vec::with_capacity(4);
    for len in lens {
        match be.alloc(d * len) {
            Ok(b) => bufs.push(b),
            Err(e) => {
                for b in bufs {
                    let _ = be.free(b);
                }
                return Err(e.into());
            }
        }
    }
    Ok(Some([bufs[0], bufs[1], bufs[2], bufs[3]]))
}

impl BatchEngine {
    /// Whether [`Self::step_mixed`] can carry decode rows (more than one sequence, no
    /// recurrent layers, no MTP block kept).
    pub fn can_mix(&self) -> bool {
        self.mix.is_some()
    }

    /// The most rows one forward pass takes (a prompt chunk plus decode rows).
    pub fn max_rows(&self) -> usize {
        self.scratch.as_ref().map_or(1, |s| s.n_max)
    }

    /// One forward pass over `chunk`, the next prompt tokens of `seq` (after its cached
    /// ones), and one decode step of each of `steps` (`(sequence, token)`, as
    /// [`Self::step`]; `seq` not among them). Returns the chunk's last row's logits when
    /// `last` (the chunk ends the prompt) and each step's logits in the order of `steps`.
    /// With no steps it is a plain prompt chunk; with steps the engine must mix
    /// ([`Self::can_mix`]). On error no sequence claims the rows it was given.
    pub fn step_mixed(&mut self, seq: usize, chunk: &[u32], last: bool, steps: &[(usize, u32)]) -> Result<(Option<Vec<f32>>, Vec<Vec<f32>>), EngineError> {
        if steps.is_empty() {
            let mut out = None;
            let rows = if last { OutputRows::Last } else { OutputRows::None };
            self.eval_rows(seq, chunk, rows, &mut |_, l| out = Some(l.to_vec()))?;
            return Ok((out, Vec::new()));
        }
        let Some(tmp) = self.mix else {
            return Err(EngineError::InvalidArg("this model's decode steps cannot carry a prompt chunk (recurrent layers, an MTP block or one sequence)".into()));
        };
        self.check_seq(seq)?;
        let (m, d) = (chunk.len(), steps.len());
        if m == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        if m + d > self.max_rows() {
            return Err(EngineError::InvalidArg(format!("a mixed step of {m} prompt tokens and {d} sequences ({} rows allowed)", self.max_rows())));
        }
        let free = self.n_ctx - self.seqs[seq].history.len();
        if m > free {
            return Err(EngineError::PromptTooLong { n_prompt: m, free, n_ctx: self.n_ctx });
        }
        let mut caches = Vec::with_capacity(d);
        let p0 = self.seqs[seq].history.len() as u32;
        let mut pos: Vec<u32> = (p0..p0 + m as u32).collect();
        let mut tokens = chunk.to_vec();
        for (i, &(s, tok)) in steps.iter().enumerate() {
            self.check_seq(s)?;
            if s == seq || steps[..i].iter().any(|&(other, _)| other == s) {
                return Err(EngineError::InvalidArg(format!("sequence {s} appears twice in one step")));
            }
            let h = &self.seqs[s].history;
            if h.len() >= self.n_ctx {
                return Err(EngineError::PromptTooLong { n_prompt: 1, free: 0, n_ctx: self.n_ctx });
            }
            caches.push(self.seqs[s].kv);
            pos.push(h.len() as u32);
            tokens.push(tok);
        }
        self.check_tokens(&tokens)?;
        // The window-sized layers' floors as the backend moves them (moved even if the
        // pass fails: some layers may have moved).
        if let Some(w) = self.swa {
            let spans: Vec<(usize, usize, usize)> = std::iter::once((seq, p0 as usize, m))
                .chain(steps.iter().map(|&(s, _)| (s, self.seqs[s].history.len(), 1)))
                .collect();
            for (s, a, len) in spans {
                let q = &mut self.seqs[s];
                q.floor = w.advance(q.floor, a, a + len - 1).map_err(EngineError::InvalidArg)?;
            }
        }
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        let kv = KvRows::Mixed { chunk: self.seqs[seq].kv, n_chunk: m, rows: &caches, tmp };
        let mut out = vec![Vec::new(); d];
        let mut first = None;
        let rows = OutputRows::Tail(d + usize::from(last));
        self.model.forward(self.be.as_mut(), scratch, kv, &[], &tokens, &pos, rows, &mut |i, l| {
            if i >= m {
                out[i - m] = l.to_vec();
            } else if i == m - 1 {
                first = Some(l.to_vec());
            }
        })?;
        self.seqs[seq].history.extend_from_slice(chunk);
        for &(s, tok) in steps {
            self.seqs[s].history.push(tok);
        }
        Ok((first, out))
    }
}
