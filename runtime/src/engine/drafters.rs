//! The [`Drafter`]s: n-gram lookup in the context itself (no model; llama.cpp's
//! `--spec-type ngram-simple`, "prompt lookup decoding"), a separate, smaller draft
//! model sharing the target's tokenizer (llama.cpp's `-md/--model-draft`), and the
//! target's own multi-token-prediction block (llama.cpp's `--spec-type draft-mtp`).

use super::speculative::{Draft, Drafter};
use super::Sequence;
use super::{argmax_logits, BatchEngine, Engine, EngineError, Sampler, SamplerParams};
use crate::model::{Model, OutputRows};

/// Prompt lookup: finds the most recent earlier occurrence of the context's last `n`
/// tokens, for `n` from `n_max` down to `n_min`, and proposes the tokens that followed
/// it. Strong on text that repeats its input (code edits, summaries, quotes), free
/// otherwise.
#[derive(Clone, Copy, Debug)]
pub struct NgramDrafter {
    pub n_max: usize,
    pub n_min: usize,
}

impl NgramDrafter {
    pub fn new(n_max: usize, n_min: usize) -> Result<NgramDrafter, EngineError> {
        if n_min == 0 || n_max < n_min {
            return Err(EngineError::InvalidArg(format!(
                "n-gram lookup sizes must satisfy 1 <= min ({n_min}) <= max ({n_max})"
            )));
        }
        Ok(NgramDrafter { n_max, n_min })
    }
}

/// The start of the most recent earlier occurrence of `ctx`'s last `n` tokens.
fn last_match(ctx: &[u32], n: usize) -> Option<usize> {
    if ctx.len() <= n {
        return None;
    }
    let tail = &ctx[ctx.len() - n..];
    (0..ctx.len() - n).rev().find(|&j| &ctx[j..j + n] == tail)
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        for n in (self.n_min..=self.n_max).rev() {
            if let Some(j) = last_match(context, n) {
                let from = j + n;
                let to = (from + max).min(context.len());
                if to > from {
                    out.tokens.extend_from_slice(&context[from..to]);
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// Refuses a draft model whose vocabulary differs from the target's: the token ids it
/// proposes must mean the same text.
pub fn check_same_vocab(target: &Model, draft: &Model) -> Result<(), EngineError> {
    let (nt, nd) = (target.cfg.n_vocab, draft.cfg.n_vocab);
    if nt != nd {
        return Err(EngineError::InvalidArg(format!(
            "the draft model's vocabulary has {nd} tokens but the target's has {nt}: the draft must share the target's tokenizer"
        )));
    }
    let key = "tokenizer.ggml.tokens";
    fn tokens<'a>(m: &'a Model, key: &str) -> Option<Vec<&'a str>> {
        m.file().get_str_array(key).ok().flatten()
    }
    if let (Some(a), Some(b)) = (tokens(target, key), tokens(draft, key)) {
        if let Some(i) = (0..a.len().max(b.len())).find(|&i| a.get(i) != b.get(i)) {
            return Err(EngineError::InvalidArg(format!(
                "the draft model's token {i} is {:?} but the target's is {:?} ({key}): the draft must share the target's tokenizer",
                b.get(i).copied().unwrap_or("<none>"),
                a.get(i).copied().unwrap_or("<none>"),
            )));
        }
    }
    Ok(())
}

/// A smaller model of the same tokenizer, with its own engine (KV cache and backend),
/// drafting one token per forward pass. Greedy targets get its argmax (point masses);
/// sampled ones get draws from its own distribution under the target's sampler settings
/// (without penalties), handed over as `q` for the exact acceptance rule. Drafting stops
/// at a token whose draft probability is below `p_min` (llama.cpp's `--draft-p-min`).
pub struct ModelDrafter {
    engine: Engine,
    sampler: Option<Sampler>,
    p_min: f32,
}

impl ModelDrafter {
    /// `params`: the target's sampler settings (greedy when its temperature is ≤ 0).
    pub fn new(engine: Engine, target: &Model, params: &SamplerParams, p_min: f32) -> Result<ModelDrafter, EngineError> {
        check_same_vocab(target, engine.model())?;
        Ok(ModelDrafter { engine, sampler: draft_sampler(params), p_min })
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Brings the draft's cache to `context` ([`catch_up`]) and returns the logits after it.
    fn catch_up(&mut self, context: &[u32]) -> Result<Vec<f32>, EngineError> {
        catch_up(&mut self.engine.inner, 0, context)
    }
}

/// Brings sequence `seq` of a draft engine to `context`, keeping the longest common
/// prefix it can (a recurrent draft rewinds through the log of its last drafting, or
/// else starts over), and returns the logits after it. At least the last token is
/// evaluated again, for its logits.
pub fn catch_up(e: &mut BatchEngine, seq: usize, context: &[u32]) -> Result<Vec<f32>, EngineError> {
    if context.is_empty() {
        return Err(EngineError::EmptyPrompt);
    }
    let have = e.history(seq);
    let common = have.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
    if e.can_rewind(seq, common) {
        e.rewind(seq, common)?;
    } else {
        e.truncate(seq, common);
    }
    // What stayed: `common`, or nothing (a recurrent draft without a log).
    let kept = e.history(seq).len();
    let mut last = Vec::new();
    e.eval_rows(seq, &context[kept..], OutputRows::Last, &mut |_, l| last = l.to_vec())?;
    Ok(last)
}

/// Greedy drafting for several sequences of one draft engine at once (`lode serve`'s
/// slots): `reqs[i] = (seq, context, max)`. Each sequence is caught up to its context
/// ([`catch_up`], one at a time), then every request still drafting takes its argmax and
/// advances by one token in ONE batched step of all of them, so the draft's weights are
/// read once per drafted position, not once per slot. A request stops after `max`
/// tokens, at the context's end, or before a token whose probability is below `p_min`.
/// Returns each request's tokens. The drafted tokens are logged for the next catch-up's
/// rewind. Each sequence appears at most once.
pub fn draft_greedy(e: &mut BatchEngine, reqs: &[(usize, &[u32], usize)], p_min: f32) -> Result<Vec<Vec<u32>>, EngineError> {
    let mut out = vec![Vec::new(); reqs.len()];
    let mut live: Vec<Option<(Vec<f32>, usize)>> = Vec::with_capacity(reqs.len());
    for &(seq, ctx, max) in reqs {
        let max = max.min((e.n_ctx() + 1).saturating_sub(ctx.len()));
        if max == 0 || ctx.is_empty() {
            live.push(None);
            continue;
        }
        let logits = catch_up(e, seq, ctx)?;
        e.start_rewind_log(seq, max)?;
        live.push(Some((logits, max)));
    }
    loop {
        let (mut steps, mut who) = (Vec::new(), Vec::new());
        for (i, slot) in live.iter_mut().enumerate() {
            let Some((logits, max)) = slot else { continue };
            let t = argmax_logits(logits);
            if softmax_prob(logits, t) < p_min as f64 {
                *slot = None;
                continue;
            }
            out[i].push(t);
            if out[i].len() < *max {
                steps.push((reqs[i].0, t));
                who.push(i);
            } else {
                *slot = None;
            }
        }
        if steps.is_empty() {
            return Ok(out);
        }
        for (i, row) in who.into_iter().zip(e.step(&steps)?) {
            if let Some((logits, _)) = &mut live[i] {
                *logits = row;
            }
        }
    }
}

/// Drafting with the target's own MTP block for several sequences of one engine at
/// once (`lode serve --spec-type draft-mtp`'s slots): `reqs[i] = (seq, token, max)`,
/// `token` being the one about to be evaluated after `seq`'s cached tokens. Every request
/// still drafting picks its token and advances in ONE batched row of the block for all
/// of them ([`BatchEngine::mtp_draft_rows`]), so the block's weights and the LM head are
/// read once per drafted position, not once per slot. `samplers[seq]`: that sequence's
/// drafting sampler ([`draft_sampler`] of its request's settings; `None`: argmax), whose
/// draws come with their distribution (`Draft::q`) as [`MtpDrafter`]'s do. A request
/// stops after `max` tokens, at the context's end, or before a token whose probability
/// is below `p_min`. Each sequence appears at most once.
pub fn mtp_draft_batch(e: &mut BatchEngine, reqs: &[(usize, u32, usize)], samplers: &mut [Option<Sampler>], p_min: f32) -> Result<Vec<Draft>, EngineError> {
    let mut out = vec![Draft::default(); reqs.len()];
    // (request, its last token, tokens it may still draft)
    let mut live: Vec<(usize, u32, usize)> = reqs
        .iter()
        .enumerate()
        .map(|(i, &(seq, tok, max))| (i, tok, max.min(e.n_ctx().saturating_sub(e.history(seq).len()))))
        .filter(|r| r.2 > 0)
        .collect();
    let mut j = 0;
    while !live.is_empty() {
        let rows: Vec<(usize, u32, usize)> = live.iter().map(|&(i, tok, _)| (reqs[i].0, tok, j)).collect();
        let logits = e.mtp_draft_rows(&rows)?;
        let mut next = Vec::with_capacity(live.len());
        for (&(i, _, max), l) in live.iter().zip(&logits) {
            let sampler = samplers.get_mut(reqs[i].0).and_then(Option::as_mut);
            let Some(t) = pick_draft(sampler, l, p_min, &mut out[i]) else { continue };
            if out[i].tokens.len() < max {
                next.push((i, t, max));
            }
        }
        live = next;
        j += 1;
    }
    Ok(out)
}

/// The sampler a drafter draws with under the target's settings `params`: none for a
/// greedy target (argmax drafts), else the same truncation and temperature without
/// penalties, its own seed.
pub fn draft_sampler(params: &SamplerParams) -> Option<Sampler> {
    (params.temp > 0.0).then(|| {
        let own = SamplerParams {
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: params.seed ^ 0x5eed_d4af_7000_0001,
            ..params.clone()
        };
        Sampler::new(own)
    })
}

/// Drafts one token from `logits` (the argmax, or a draw whose distribution goes to
/// `out.q`) and appends it to `out`; `None` (nothing appended) when its probability is
/// below `p_min`.
fn pick_draft(sampler: Option<&mut Sampler>, logits: &[f32], p_min: f32, out: &mut Draft) -> Option<u32> {
    let (tok, prob) = match sampler {
        None => {
            let t = argmax_logits(logits);
            (t, softmax_prob(logits, t))
        }
        Some(s) => {
            let q = s.distribution(logits);
            let t = s.pick(&q);
            let pr = q.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
            out.q.push(q);
            (t, pr)
        }
    };
    if prob < p_min as f64 {
        out.q.truncate(out.tokens.len());
        return None;
    }
    out.tokens.push(tok);
    Some(tok)
}

/// The target's own multi-token-prediction block as the drafter (a qwen35 file with
/// `blk.{n_layer}.nextn.*`, loaded with it kept): each drafted token is one row of the
/// block on the target's backend ([`Sequence::mtp_logits`]), chained on its own output,
/// with the target's weights read once (the LM head is shared). Tokens are chosen as
/// [`ModelDrafter`] chooses them (argmax, or draws handed over as `q`), and drafting
/// stops below `p_min`.
pub struct MtpDrafter {
    sampler: Option<Sampler>,
    p_min: f32,
}

impl MtpDrafter {
    /// Refuses a model loaded without the block.
    pub fn new(target: &Model, params: &SamplerParams, p_min: f32) -> Result<MtpDrafter, EngineError> {
        if target.mtp.is_none() {
            return Err(EngineError::InvalidArg(
                "the model carries no multi-token-prediction block (`nextn_predict_layers` and `blk.N.nextn.*` tensors): draft-mtp needs one".into(),
            ));
        }
        Ok(MtpDrafter { sampler: draft_sampler(params), p_min })
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    /// Without the target there is nothing to run: no drafts.
    fn draft(&mut self, _context: &[u32], _max: usize, _out: &mut Draft) -> Result<(), EngineError> {
        Ok(())
    }

    fn draft_from(&mut self, target: &mut dyn Sequence, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        let Some(&(mut tok)) = context.last() else { return Ok(()) };
        for j in 0..max {
            let Some(logits) = target.mtp_logits(tok, j)? else { break };
            let Some(t) = pick_draft(self.sampler.as_mut(), &logits, self.p_min, out) else { break };
            tok = t;
        }
        Ok(())
    }
}

/// The softmax probability of `tok` under `logits`.
fn softmax_prob(logits: &[f32], tok: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    (logits[tok as usize] as f64 - max).exp() / sum
}

impl Drafter for ModelDrafter {
    fn name(&self) -> &'static str {
        "draft-model"
    }

    fn weight_stats(&self) -> Option<crate::weights::WeightStats> {
        self.engine.weight_stats()
    }

    fn begin(&mut self, context: &[u32]) -> Result<(), EngineError> {
        if !context.is_empty() && context.len() <= self.engine.n_ctx() {
            self.catch_up(context)?;
        }
        Ok(())
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        // The draft's cache holds the context and all but the last drafted token.
        let max = max.min((self.engine.n_ctx() + 1).saturating_sub(context.len()));
        if max == 0 || context.is_empty() {
            return Ok(());
        }
        let mut logits = self.catch_up(context)?;
        // The drafted tokens are logged so the next catch-up can rewind a recurrent
        // draft to the accepted ones (nothing to do for other models).
        self.engine.start_rewind_log(max)?;
        for j in 0..max {
            let Some(tok) = pick_draft(self.sampler.as_mut(), &logits, self.p_min, out) else { break };
            if j + 1 < max {
                logits = self.engine.eval(&[tok])?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ngram(ctx: &[u32], max: usize) -> Vec<u32> {
        let mut d = Draft::default();
        NgramDrafter::new(4, 1).unwrap().draft(ctx, max, &mut d).unwrap();
        d.tokens
    }

    #[test]
    fn ngram_proposes_what_followed_the_longest_recent_match() {
        // Tail [7, 8]: the 2-gram occurs at 1 (followed by 9, 4) and at 5 (followed by 1).
        // Longest first: the 3-gram [6, 7, 8] occurs only at 4, followed by 1, 2.
        assert_eq!(ngram(&[5, 7, 8, 9, 6, 7, 8, 1, 2, 6, 7, 8], 2), vec![1, 2]);
        // Most recent of equal length: [3] last seen at 4, followed by 8.
        assert_eq!(ngram(&[3, 1, 2, 0, 3, 8, 3], 1), vec![8]);
        // Capped at `max` and at the context's end (the match may run into the tail).
        assert_eq!(ngram(&[1, 2, 1, 2, 1, 2], 10), vec![1, 2]);
        assert!(ngram(&[1, 2, 3, 4], 5).is_empty());
        assert!(ngram(&[], 5).is_empty());
        assert!(NgramDrafter::new(2, 0).is_err() && NgramDrafter::new(1, 3).is_err());
    }
}
