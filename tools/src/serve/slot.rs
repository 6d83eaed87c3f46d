//! The real [`SlotRunner`]: one sequence (its own KV cache) of the server's engine, plus
//! the text side of generation (streaming detokenization and stop strings).
//!
//! Prompt-prefix reuse: the engine keeps the tokens of the slot's last request in its
//! cache; a new prompt that starts the same way (the usual case in a chat, where each
//! turn resends the conversation) only evaluates the part after the common prefix.

use std::sync::Arc;

use lode_runtime::engine::{
    generate_speculative_with_logits, generate_with_logits, Drafter, Engine, EngineError, Flow, GenParams, Sampler, Sequence, SpecParams,
    StopReason, StopStrings,
};
use lode_runtime::tokenizer::{StreamDecoder, Tokenizer};

use super::api::{Timings, Usage};
use super::errors::ApiError;
use super::logprobs::token_logprob;
use super::metrics::Metrics;
use super::scheduler::{Finish, Job, Piece, SlotRunner};
use super::structured::{ErrorCell, GrammarConstraint, GrammarStats};

/// A sequence a slot generates on: an [`Engine`] of its own, or its handle on the
/// server's shared batch engine ([`super::batcher::SeqHandle`]).
pub trait SlotSequence: Sequence + Send {
    /// The request is over (done, failed or cancelled).
    fn finished(&mut self) {}
    /// Whether the next prompts may copy their start from another sequence's cache.
    fn set_prompt_cache(&mut self, _on: bool) {}
    /// Prompt tokens copied from other sequences' caches since the last call.
    fn take_copied(&mut self) -> usize {
        0
    }
}

impl SlotSequence for Engine {}

pub struct EngineSlot<S: SlotSequence> {
    pub engine: S,
    pub tok: Arc<Tokenizer>,
    pub eog: Vec<u32>,
    /// Where structured output's masks are counted.
    pub grammar_stats: Arc<GrammarStats>,
    /// Speculation for requests without a constraint: `--spec-type ngram-simple` (prompt
    /// lookup) or `--model-draft` (this slot's handle on the draft thread).
    pub spec: Option<(Box<dyn Drafter + Send>, SpecParams)>,
    /// Where accepted drafts are counted (`lode_spec_accepted_tokens_total`).
    pub metrics: Option<Arc<Metrics>>,
}

impl<S: SlotSequence> EngineSlot<S> {
    pub fn new(engine: S, tok: Arc<Tokenizer>, grammar_stats: Arc<GrammarStats>) -> EngineSlot<S> {
        let eog = tok.eog_ids();
        EngineSlot { engine, tok, eog, grammar_stats, spec: None, metrics: None }
    }
}

/// How many leading tokens of `prompt` can stay in a cache holding `history`. At least
/// one prompt token is always evaluated again: its logits pick the first new token.
pub fn reusable_prefix(history: &[u32], prompt: &[u32]) -> usize {
    let common = history.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    common.min(prompt.len().saturating_sub(1))
}

impl<S: SlotSequence> SlotRunner for EngineSlot<S> {
    fn run(&mut self, job: &Job, emit: &mut dyn FnMut(Piece) -> bool) -> Result<Finish, ApiError> {
        let r = self.generate(job, emit);
        self.engine.finished();
        r
    }

    fn reset(&mut self) {
        self.engine.truncate(0);
        self.engine.finished();
    }

    fn cached(&self) -> &[u32] {
        self.engine.history()
    }
}

impl<S: SlotSequence> EngineSlot<S> {
    fn generate(&mut self, job: &Job, emit: &mut dyn FnMut(Piece) -> bool) -> Result<Finish, ApiError> {
        let EngineSlot { engine, tok, eog, grammar_stats, spec, metrics } = self;
        let prompt = &job.prompt;
        // `cache_prompt: false` (or `--no-cache-prompt`): the whole prompt is evaluated.
        let keep = if job.cache_prompt { reusable_prefix(engine.history(), prompt) } else { 0 };
        engine.truncate(keep);
        engine.set_prompt_cache(job.cache_prompt);
        engine.take_copied();
        // What the sequence kept (a recurrent model keeps all of its history or none).
        let cached = engine.history().len();
        let mut sampler = Sampler::new(job.sampling.clone());
        let grammar_error = ErrorCell::default();
        if let Some(m) = &job.grammar {
            let c = GrammarConstraint::start(m.clone(), eog.clone(), grammar_error.clone(), grammar_stats.clone())
                .map_err(|e| ApiError::internal(format!("cannot start the grammar thread: {e}")))?;
            sampler = sampler.with_constraint(Box::new(c));
        }
        // Penalties see the whole prompt, as if it had been evaluated now.
        for &t in &prompt[..cached] {
            sampler.accept(t);
        }
        let mut dec = StreamDecoder::new(job.special);
        let mut stops = StopStrings::new(job.stops.clone());
        let (mut cancelled, mut stop_hit) = (false, false);
        let params = GenParams { max_tokens: job.max_tokens, eog: eog.clone() };
        let tk: &Tokenizer = tok;
        let mut on_token = |id, logits: &[f32]| {
            let piece = dec.push(tk, id);
            let (text, hit) = stops.push(&piece);
            let logprobs = job.logprobs.map(|k| vec![token_logprob(tk, logits, id, k)]).unwrap_or_default();
            if !emit(Piece { text, logprobs }) {
                cancelled = true;
                return Flow::Stop;
            }
            if hit {
                stop_hit = true;
                return Flow::Stop;
            }
            Flow::Continue
        };
        let mut drafted = None;
        let result = match spec {
            // A constraint cannot be rolled back past a rejected draft: plain decoding.
            Some((drafter, sp)) if job.grammar.is_none() => {
                drafter.set_sampling(&job.sampling);
                generate_speculative_with_logits(engine, drafter.as_mut(), sp, &prompt[cached..], &params, &mut sampler, &mut on_token).map(|r| {
                    drafted = Some((r.stats.drafted, r.stats.accepted));
                    r.out
                })
            }
            _ => generate_with_logits(engine, &prompt[cached..], &params, &mut sampler, &mut on_token),
        };
        if let (Some((_, accepted)), Some(m)) = (drafted, metrics.as_ref()) {
            m.spec_accepted.fetch_add(accepted as u64, std::sync::atomic::Ordering::Relaxed);
        }
        let out = match result {
            Ok(out) => out,
            Err(e) => {
                engine.truncate(0);
                return Err(match e {
                    EngineError::PromptTooLong { n_prompt, free, n_ctx } => ApiError::context_exceeded(
                        format!("the prompt has {n_prompt} tokens but only {free} of the context's {n_ctx} are free"),
                        "messages",
                    ),
                    other => ApiError::internal(format!("generation failed: {other}")),
                });
            }
        };
        drop(sampler);
        if let Some(why) = grammar_error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(ApiError::internal(format!("structured output failed: {why}")));
        }
        if !cancelled && !stop_hit {
            let (text, hit) = stops.push(&dec.flush());
            let mut tail = text;
            if !hit {
                tail.push_str(&stops.flush());
            }
            if !tail.is_empty() && !emit(Piece::text(tail)) {
                cancelled = true;
            }
        }
        let finish_reason = if cancelled {
            "cancelled"
        } else {
            match out.stop {
                StopReason::Eog | StopReason::Caller => "stop",
                StopReason::MaxTokens | StopReason::ContextFull => "length",
            }
        };
        let n_gen = out.tokens.len();
        // The prompt's start copied from another sequence's cache counts as cached.
        let cached = cached + engine.take_copied();
        let mut timings = Timings::new(cached, prompt.len() - cached, out.prompt_secs, n_gen, out.gen_secs);
        (timings.draft_n, timings.draft_n_accepted) = (drafted.map(|d| d.0), drafted.map(|d| d.1));
        Ok(Finish {
            finish_reason,
            usage: Usage { prompt_tokens: prompt.len(), completion_tokens: n_gen, total_tokens: prompt.len() + n_gen },
            timings,
        })
    }

}

#[cfg(test)]
mod tests {
    use super::reusable_prefix;

    #[test]
    fn prefix_reuse_keeps_one_token_to_evaluate() {
        assert_eq!(reusable_prefix(&[1, 2, 3, 9], &[1, 2, 3, 4, 5]), 3);
        assert_eq!(reusable_prefix(&[1, 2, 3], &[1, 2, 3]), 2);
        assert_eq!(reusable_prefix(&[1, 2, 3, 4], &[1, 2]), 1);
        assert_eq!(reusable_prefix(&[], &[1]), 0);
        assert_eq!(reusable_prefix(&[5], &[1, 2]), 0);
    }
}
