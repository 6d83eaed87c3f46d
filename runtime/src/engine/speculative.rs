//! Speculative decoding: a [`Drafter`] proposes the next few tokens cheaply, and the
//! target model checks them all in ONE forward chunk (the last sampled token and the
//! `k` drafted ones, `k + 1` rows of logits, the path a prompt chunk takes). The longest
//! prefix the target agrees with is kept, plus one token of the target's own from the
//! first row that disagrees (or from the last row when every draft was accepted), so a
//! pass yields between 1 and `k + 1` tokens. The cache is then cut back to the tokens
//! kept ([`Sequence::rewind`]): the K/V rows past it are stale but never read, since
//! attention reads positions below the query's and the next chunk overwrites them; a
//! recurrent layer's state is brought back through the chunk's rewind log
//! (`model/rewind.rs`).
//!
//! **Acceptance.** Row `i`'s logits go through the same sampler as plain decoding
//! (penalties over the tokens emitted so far, top-k, top-p, min-p, temperature), in
//! order, so `p` is exactly the distribution plain decoding would draw from there.
//! A drafted token `x` drawn from a distribution `q` is accepted with probability
//! `min(1, p(x)/q(x))`; on rejection the token is drawn from `norm(max(0, p − q))`
//! ([`accept_draft`]), which leaves the output distributed as `p`. A drafter without a
//! distribution (n-gram lookup, a greedy draft model) proposes point masses: then the
//! rule is the same as drawing `y ~ p` and accepting `x` iff `y == x`, which is what
//! runs (one uniform number per emitted token, as plain sampling uses), so a seeded run
//! emits the same tokens as plain decoding given the same logits. Greedy (temperature
//! ≤ 0) is the argmax, and the output is plain greedy decoding token for token.
//!
//! **Not supported under speculation:** a [`super::Constraint`] (grammar, JSON schema):
//! its state cannot be rolled back past a rejected draft, so [`generate_speculative`]
//! refuses a sampler that has one.

use std::time::Instant;

use super::{BatchEngine, EngineError, Flow, GenOutput, GenParams, Sampler, Sequence, StopReason};
use crate::model::OutputRows;

/// Proposes tokens to follow a context.
pub trait Drafter {
    /// A short name for logs and reports (`ngram`, `draft-model`).
    fn name(&self) -> &'static str;
    /// Called before a generation with its sampler settings: a drafter that samples its
    /// drafts (handing their distribution over) draws under them.
    fn set_sampling(&mut self, _params: &super::SamplerParams) {}
    /// Called once with the prompt (every cached token) before generation starts: a
    /// draft model evaluates it here, in the prompt's time.
    fn begin(&mut self, _context: &[u32]) -> Result<(), EngineError> {
        Ok(())
    }
    /// Appends up to `max` tokens to `out` that might follow `context` (every token so
    /// far, the last being the one about to be evaluated). Proposing none is fine.
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError>;
    /// [`Self::draft`] with the target at hand (what the generation loop calls): a drafter
    /// made of the target's own heads (MTP) runs them here.
    fn draft_from(&mut self, _target: &mut dyn Sequence, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        self.draft(context, max, out)
    }
    /// The weight-residency counters of the drafter's own backend (a draft model's).
    fn weight_stats(&self) -> Option<crate::weights::WeightStats> {
        None
    }
}

/// Drafted tokens and, where the drafter sampled them, the distribution each was drawn
/// from (`q`, same length as `tokens`); an empty `q` means point masses.
#[derive(Clone, Debug, Default)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub q: Vec<Vec<(u32, f64)>>,
}

impl Draft {
    pub fn clear(&mut self) {
        self.tokens.clear();
        self.q.clear();
    }
    fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
        self.q.truncate(n);
    }
}

/// How much to draft (llama.cpp's `--draft-max`, `--draft-min`).
#[derive(Clone, Copy, Debug)]
pub struct SpecParams {
    /// Tokens drafted per verify pass at most.
    pub draft_max: usize,
    /// A draft shorter than this is dropped (the step decodes one token).
    pub draft_min: usize,
}

impl Default for SpecParams {
    fn default() -> Self {
        SpecParams { draft_max: 16, draft_min: 0 }
    }
}

/// What speculation did during one generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Forward passes of the target after the prompt (verify chunks and plain steps).
    pub passes: usize,
    /// Tokens drafted (and verified).
    pub drafted: usize,
    /// Drafted tokens the target accepted.
    pub accepted: usize,
    /// Seconds spent drafting (inside the generation time).
    pub draft_secs: f64,
}

impl SpecStats {
    /// Accepted / drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }
}

/// The standard speculative-sampling rule for one drafted token `x` drawn from `q`:
/// accept it when `u_accept < p(x)/q(x)`, else draw from `norm(max(0, p − q))` at
/// `u_resample`. `p`, `q`: `(token, probability)` lists, absent tokens 0. Returns the
/// emitted token and whether it is the accepted draft. With `u_*` uniform in [0, 1)
/// the emitted token is distributed as `p`, whatever `q` is.
pub fn accept_draft(p: &[(u32, f64)], q: &[(u32, f64)], x: u32, u_accept: f64, u_resample: f64) -> (u32, bool) {
    let prob = |d: &[(u32, f64)], t: u32| d.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
    // A `q` without `x` cannot have produced it: take the draft as a point mass.
    let point = [(x, 1.0)];
    let q = if prob(q, x) > 0.0 { q } else { &point[..] };
    let (px, qx) = (prob(p, x), prob(q, x));
    if u_accept * qx < px {
        return (x, true);
    }
    let qm: std::collections::HashMap<u32, f64> = q.iter().copied().collect();
    let residual: Vec<(u32, f64)> =
        p.iter().map(|&(t, pt)| (t, (pt - qm.get(&t).copied().unwrap_or(0.0)).max(0.0))).collect();
    let total: f64 = residual.iter().map(|e| e.1).sum();
    if total <= 0.0 {
        // p ≤ q everywhere means p == q, where `x` is always accepted; only rounding
        // gets here. Draw from p itself.
        return (super::sampler::pick_at(p, u_resample), false);
    }
    let t = super::sampler::pick_at(&residual, u_resample * total);
    (t, false)
}

/// One sequence of a [`BatchEngine`] as a [`Sequence`] (what `lode bench` verifies on).
pub struct BatchSequence<'a> {
    pub engine: &'a mut BatchEngine,
    pub seq: usize,
}

impl Sequence for BatchSequence<'_> {
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut last = Vec::new();
        self.engine.eval_rows(self.seq, tokens, OutputRows::Last, &mut |_, l| last = l.to_vec())?;
        Ok(last)
    }
    fn history(&self) -> &[u32] {
        self.engine.history(self.seq)
    }
    fn truncate(&mut self, n: usize) {
        self.engine.truncate(self.seq, n);
    }
    fn rewind(&mut self, n: usize) -> Result<(), EngineError> {
        self.engine.rewind(self.seq, n)
    }
    fn n_ctx(&self) -> usize {
        self.engine.n_ctx()
    }
    fn eval_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.engine.eval_verify(self.seq, tokens)
    }
    fn mtp_logits(&mut self, tok: u32, j: usize) -> Result<Option<Vec<f32>>, EngineError> {
        self.engine.mtp_logits(self.seq, tok, j)
    }
}

/// The result of [`generate_speculative`].
#[derive(Clone, Debug)]
pub struct SpecOutput {
    pub out: GenOutput,
    pub stats: SpecStats,
}

/// [`super::generate`] with speculation: the same tokens for greedy decoding, the same
/// distribution for sampling (see the module's doc), fewer target passes when the
/// drafts are good.
pub fn generate_speculative(
    seq: &mut dyn Sequence,
    drafter: &mut dyn Drafter,
    spec: &SpecParams,
    prompt: &[u32],
    params: &GenParams,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(u32) -> Flow,
) -> Result<SpecOutput, EngineError> {
    generate_speculative_with_logits(seq, drafter, spec, prompt, params, sampler, &mut |t, _| on_token(t))
}

/// [`generate_speculative`], with `on_token` also seeing the logits the token was
/// chosen from (its verify row; for log-probabilities), as
/// [`super::generate_with_logits`].
pub fn generate_speculative_with_logits(
    seq: &mut dyn Sequence,
    drafter: &mut dyn Drafter,
    spec: &SpecParams,
    prompt: &[u32],
    params: &GenParams,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(u32, &[f32]) -> Flow,
) -> Result<SpecOutput, EngineError> {
    if params.max_tokens == 0 {
        return Err(EngineError::InvalidArg("the number of tokens to generate must be at least 1".into()));
    }
    if sampler.has_constraint() {
        return Err(EngineError::InvalidArg(
            "speculative decoding cannot run under a grammar or JSON-schema constraint".into(),
        ));
    }
    let t0 = Instant::now();
    // `rows[i]`: the logits after the cached tokens up to `draft.tokens[..i]`.
    let mut rows = vec![seq.eval(prompt)?];
    for &t in prompt {
        sampler.accept(t);
    }
    drafter.begin(seq.history())?;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut draft = Draft::default();
    let mut stats = SpecStats::default();
    let mut tokens = Vec::new();
    let mut context = Vec::new();
    let stop = 'outer: loop {
        let (n_hist, n_rows) = (seq.history().len(), rows.len());
        let mut pending = None;
        for (i, row) in rows.iter().enumerate() {
            // Tokens the cache keeps if the generation goes on from this row.
            let kept = n_hist - (n_rows - 1 - i);
            let (tok, accepted) = choose(sampler, row, &draft, i);
            sampler.accept(tok);
            tokens.push(tok);
            stats.accepted += accepted as usize;
            let stop = if params.eog.contains(&tok) {
                Some(StopReason::Eog)
            } else if on_token(tok, row) == Flow::Stop {
                Some(StopReason::Caller)
            } else if tokens.len() >= params.max_tokens {
                Some(StopReason::MaxTokens)
            } else if kept >= seq.n_ctx() {
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if (stop.is_some() || !accepted) && kept < n_hist {
                seq.rewind(kept)?;
            }
            if let Some(s) = stop {
                break 'outer s;
            }
            if !accepted {
                // The last row has no draft, so every pass ends here.
                pending = Some(tok);
                break;
            }
        }
        let Some(tok) = pending else {
            return Err(EngineError::InvalidArg("speculation: a verify pass ended without a token".into()));
        };
        // Draft what may follow `tok`: no more than the context has room for after it,
        // nor than the tokens still wanted after the one the last row will give.
        let room = seq.n_ctx() - seq.history().len() - 1;
        let k = spec.draft_max.min(params.max_tokens - tokens.len() - 1).min(room);
        draft.clear();
        if k > 0 {
            let td = Instant::now();
            context.clear();
            context.extend_from_slice(seq.history());
            context.push(tok);
            drafter.draft_from(seq, &context, k, &mut draft)?;
            draft.truncate(k);
            if draft.tokens.len() < spec.draft_min.max(1) {
                draft.clear();
            }
            stats.draft_secs += td.elapsed().as_secs_f64();
        }
        stats.drafted += draft.tokens.len();
        stats.passes += 1;
        rows = if draft.tokens.is_empty() {
            vec![seq.eval(&[tok])?]
        } else {
            let mut chunk = Vec::with_capacity(draft.tokens.len() + 1);
            chunk.push(tok);
            chunk.extend_from_slice(&draft.tokens);
            seq.eval_each(&chunk)?
        };
    };
    let out = GenOutput { tokens, stop, n_prompt: prompt.len(), prompt_secs, gen_secs: t1.elapsed().as_secs_f64() };
    Ok(SpecOutput { out, stats })
}

/// The token row `i` gives, and whether it is the accepted draft `draft.tokens[i]`.
fn choose(sampler: &mut Sampler, row: &[f32], draft: &Draft, i: usize) -> (u32, bool) {
    let Some(&x) = draft.tokens.get(i) else {
        return (sampler.sample(row), false);
    };
    match draft.q.get(i) {
        Some(q) => {
            let p = sampler.distribution(row);
            let (ua, ur) = (sampler.uniform(), sampler.uniform());
            accept_draft(&p, q, x, ua, ur)
        }
        None => {
            let y = sampler.sample(row);
            (y, y == x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::sampler::Xoshiro;
    use super::*;

    /// Emits tokens many times from a fixed `p` and `q` (draft drawn from `q`, then the
    /// rule) and returns the total-variation distance of the output histogram from `p`.
    fn tv_of_rule(p: &[(u32, f64)], q: &[(u32, f64)], n: usize, seed: u64) -> (f64, f64) {
        let mut rng = Xoshiro::seeded(seed);
        let mut counts = [0usize; 8];
        let mut accepted = 0;
        for _ in 0..n {
            let x = super::super::sampler::pick_at(q, rng.next_f64());
            let (t, acc) = accept_draft(p, q, x, rng.next_f64(), rng.next_f64());
            counts[t as usize] += 1;
            accepted += acc as usize;
        }
        let prob = |t: u32| p.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
        let tv = (0..8u32).map(|t| (counts[t as usize] as f64 / n as f64 - prob(t)).abs()).sum::<f64>() / 2.0;
        (tv, accepted as f64 / n as f64)
    }

    #[test]
    fn sampled_rule_reproduces_p() {
        // A vocabulary of 8; q disagrees with p on purpose (it even puts mass on token 6,
        // which p never emits, and none on token 2, which p likes).
        let p = [(0, 0.30), (1, 0.25), (2, 0.20), (3, 0.15), (4, 0.10)];
        let q = [(0, 0.10), (1, 0.40), (3, 0.30), (6, 0.20)];
        let n = 200_000;
        let (tv, acc) = tv_of_rule(&p, &q, n, 7);
        // Sampling noise of a TV estimate over 8 bins at n = 200k is ~0.003.
        assert!(tv < 0.01, "output distribution is {tv} away from p");
        // Acceptance is sum(min(p, q)) = 0.1 + 0.25 + 0.15 = 0.5.
        assert!((acc - 0.5).abs() < 0.01, "acceptance {acc}");
        // The rule is what makes it right: emitting the draft as is would give q (TV 0.45).
        let mut rng = Xoshiro::seeded(7);
        let mut c = [0usize; 8];
        for _ in 0..n {
            c[super::super::sampler::pick_at(&q, rng.next_f64()) as usize] += 1;
        }
        let prob = |t: u32| p.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
        let tv_q = (0..8u32).map(|t| (c[t as usize] as f64 / n as f64 - prob(t)).abs()).sum::<f64>() / 2.0;
        assert!(tv_q > 0.4, "{tv_q}");
        // Same p and q: everything accepted.
        let (tv, acc) = tv_of_rule(&p, &p, 50_000, 3);
        assert!(tv < 0.015 && acc == 1.0, "{tv} {acc}");
    }

    /// A target over a vocabulary of 4 whose next-token logits depend on the last token
    /// only (a fixed Markov chain), as a [`Sequence`].
    struct Chain {
        history: Vec<u32>,
    }

    const V: usize = 4;
    const TARGET: [[f32; V]; V] = [[0.2, 1.1, -0.4, 0.5], [1.0, -0.3, 0.6, 0.0], [-0.5, 0.4, 1.2, 0.3], [0.7, 0.1, -0.2, 0.9]];
    /// What the drafter believes: deliberately unlike the target.
    const DRAFT: [[f64; V]; V] = [[0.1, 0.2, 0.6, 0.1], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.0, 0.5, 0.2, 0.3]];

    impl Sequence for Chain {
        fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
            self.history.extend_from_slice(tokens);
            Ok(TARGET[*tokens.last().unwrap() as usize].to_vec())
        }
        fn history(&self) -> &[u32] {
            &self.history
        }
        fn truncate(&mut self, n: usize) {
            self.history.truncate(n);
        }
        fn n_ctx(&self) -> usize {
            64
        }
        fn eval_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
            self.history.extend_from_slice(tokens);
            Ok(tokens.iter().map(|&t| TARGET[t as usize].to_vec()).collect())
        }
    }

    /// Drafts from [`DRAFT`], handing its distribution over as `q`.
    struct ChainDrafter(Xoshiro);

    impl Drafter for ChainDrafter {
        fn name(&self) -> &'static str {
            "chain"
        }
        fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
            let mut last = *context.last().unwrap();
            for _ in 0..max {
                let q: Vec<(u32, f64)> = DRAFT[last as usize].iter().enumerate().filter(|e| *e.1 > 0.0).map(|(t, &p)| (t as u32, p)).collect();
                last = super::super::sampler::pick_at(&q, self.0.next_f64());
                out.tokens.push(last);
                out.q.push(q);
            }
            Ok(())
        }
    }

    /// The whole loop (verify rows, the rule, rejections and the bonus token) keeps the
    /// output distributed as plain sampling: three tokens sampled at temperature 1 with
    /// drafts of two from an unlike distribution, 60k times, against the exact
    /// distribution of three tokens of the chain. Emitting the drafts unchecked would be
    /// the draft chain's distribution, TV 0.25 away.
    #[test]
    fn speculative_sampling_keeps_the_target_distribution() {
        let softmax = |l: &[f32]| {
            let z: f64 = l.iter().map(|&x| (x as f64).exp()).sum();
            l.iter().map(|&x| (x as f64).exp() / z).collect::<Vec<f64>>()
        };
        let p: Vec<Vec<f64>> = TARGET.iter().map(|r| softmax(r)).collect();
        let want = |a: usize, b: usize, c: usize| p[0][a] * p[a][b] * p[b][c];
        let drafted = |a: usize, b: usize, c: usize| p[0][a] * DRAFT[a][b] * DRAFT[b][c];
        let n = 60_000;
        let mut counts = vec![0usize; V * V * V];
        let mut drafter = ChainDrafter(Xoshiro::seeded(99));
        let (mut acc, mut dr) = (0, 0);
        for seed in 0..n as u64 {
            let mut seq = Chain { history: Vec::new() };
            let sp = super::super::SamplerParams { temp: 1.0, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..Default::default() };
            let params = GenParams { max_tokens: 3, eog: vec![] };
            let spec = SpecParams { draft_max: 2, draft_min: 0 };
            let r = generate_speculative(&mut seq, &mut drafter, &spec, &[0], &params, &mut Sampler::new(sp), &mut |_| Flow::Continue).unwrap();
            let t = &r.out.tokens;
            counts[(t[0] as usize * V + t[1] as usize) * V + t[2] as usize] += 1;
            (acc, dr) = (acc + r.stats.accepted, dr + r.stats.drafted);
        }
        let tv = |f: &dyn Fn(usize, usize, usize) -> f64| {
            (0..V * V * V).map(|i| (counts[i] as f64 / n as f64 - f(i / (V * V), i / V % V, i % V)).abs()).sum::<f64>() / 2.0
        };
        let (got, unchecked) = (tv(&want), tv(&drafted));
        // 64 bins at n = 60k: the TV estimate's noise is about 0.01.
        assert!(got < 0.025, "speculative sampling is {got} (TV) from the target's distribution");
        assert!(unchecked > 0.15, "the draft chain is only {unchecked} away: the test cannot tell them apart");
        assert!(dr > 0 && acc > 0 && acc < dr, "{acc} of {dr} drafts accepted: not both outcomes");
    }

    #[test]
    fn greedy_target_takes_its_argmax() {
        let p = [(3, 1.0)];
        assert_eq!(accept_draft(&p, &[(3, 1.0)], 3, 0.99, 0.5), (3, true));
        assert_eq!(accept_draft(&p, &[(5, 1.0)], 5, 0.0, 0.5), (3, false));
        assert_eq!(accept_draft(&p, &[(5, 0.6), (3, 0.4)], 5, 0.0, 0.99), (3, false));
    }
}
