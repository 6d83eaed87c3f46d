//! The engine: one sequence's KV cache, prompt processing in chunks, decode steps and
//! the generation loop with its stop conditions. It knows tokens, not text: the caller
//! tokenizes, detokenizes and watches stop strings ([`StopStrings`]) in `on_token`.

mod batch;
mod constraint;
mod drafters;
pub mod fit;
mod sampler;
pub mod speculative;
mod stop;

use std::time::Instant;

pub use batch::{kept_after_truncate, kept_with_window, BatchEngine};
pub use constraint::{Constraint, TokenMask};
pub use drafters::{catch_up, check_same_vocab, draft_greedy, draft_sampler, mtp_draft_batch, ModelDrafter, MtpDrafter, NgramDrafter};
pub use sampler::{argmax_logits, Sampler, SamplerParams};
pub use speculative::{generate_speculative, generate_speculative_with_logits, BatchSequence, Draft, Drafter, SpecOutput, SpecParams, SpecStats};
pub use stop::StopStrings;

/// Keep freed heap memory for reuse (glibc): every decode step hands out a logits row per
/// sequence (0.6 MB for a 152k vocabulary), and glibc's defaults serve each from a fresh
/// mapping returned on free, so 32 sequences page-fault through 19 MB per step. With
/// allocations below 64 MiB served from the heap and freed memory kept, the rows reuse
/// the same pages. Called once by the binary at start.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

use crate::backend::{Backend, BackendError, KvType, KvTypes};
use crate::model::{Model, ModelError, OutputRows};

/// Default upper bound of the context when `--ctx-size` is not given.
pub const DEFAULT_CTX_CAP: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error("the prompt is empty (no tokens to evaluate)")]
    EmptyPrompt,
    #[error("the prompt has {n_prompt} tokens but only {free} of the context's {n_ctx} are free (raise --ctx-size or shorten the prompt)")]
    PromptTooLong { n_prompt: usize, free: usize, n_ctx: usize },
    #[error("invalid argument: {0}")]
    InvalidArg(String),
    /// Refused before any device memory was taken ([`fit::Estimate::refusal`]).
    #[error("{0}")]
    DoesNotFit(String),
}

/// How big the engine's buffers are.
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// KV slots; `None`: min(model's training context, [`DEFAULT_CTX_CAP`]).
    pub ctx_size: Option<usize>,
    /// Tokens per prefill chunk.
    pub batch_size: usize,
    /// The K and V cache types (`-ctk` / `-ctv`).
    pub kv_type: KvTypes,
    /// Full-context K/V for the sliding-window layers too (`--swa-full`); by default
    /// they keep a window-sized cache ([`crate::backend::SwaKv`]).
    pub swa_full: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { ctx_size: None, batch_size: 512, kv_type: KvTypes::from(KvType::F16), swa_full: false }
    }
}

/// What ended a generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-generation token (included in the output).
    Eog,
    MaxTokens,
    /// Every KV slot is used; nothing more can be evaluated.
    ContextFull,
    /// The caller's `on_token` asked to stop (e.g. a stop string).
    Caller,
}

/// Settings of one generation.
#[derive(Clone, Debug)]
pub struct GenParams {
    pub max_tokens: usize,
    /// End-of-generation token ids (the tokenizer's `is_eog` set).
    pub eog: Vec<u32>,
}

/// Tell the engine whether to go on after a token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The result of [`Engine::generate`].
#[derive(Clone, Debug)]
pub struct GenOutput {
    pub tokens: Vec<u32>,
    pub stop: StopReason,
    pub n_prompt: usize,
    pub prompt_secs: f64,
    pub gen_secs: f64,
}

impl GenOutput {
    pub fn prompt_tps(&self) -> f64 {
        self.n_prompt as f64 / self.prompt_secs.max(1e-9)
    }
    /// Decode speed: tokens evaluated after the prompt (the first token comes from the
    /// prompt's logits, so `tokens - 1` decode steps ran).
    pub fn gen_tps(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.gen_secs.max(1e-9)
    }
}

/// What the generation loop needs from one sequence: evaluate tokens after the cached
/// ones. Implemented by [`Engine`] and by a server's handle on one sequence of a shared
/// [`BatchEngine`], so both run the same [`generate`] loop.
pub trait Sequence {
    /// Evaluates `tokens` after the cached ones and returns the last token's logits.
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError>;
    /// Tokens in the cache, in order.
    fn history(&self) -> &[u32];
    /// Keeps the first `n` cached tokens and forgets the rest.
    fn truncate(&mut self, n: usize);
    /// Keeps exactly the first `n` cached tokens after a speculative verify chunk (a
    /// rejected draft), or fails: unlike [`Self::truncate`], a sequence with recurrent
    /// state goes back to `n` rather than to nothing ([`BatchEngine::rewind`]). The
    /// default truncates and checks that `n` tokens stayed.
    fn rewind(&mut self, n: usize) -> Result<(), EngineError> {
        let want = n.min(self.history().len());
        self.truncate(n);
        match self.history().len() {
            k if k == want => Ok(()),
            k => Err(EngineError::InvalidArg(format!("the sequence kept {k} tokens where {want} were to stay"))),
        }
    }
    fn n_ctx(&self) -> usize;
    /// Evaluates `tokens` after the cached ones and returns every position's logits
    /// (a speculative verify chunk). The default evaluates them one at a time.
    fn eval_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        tokens.iter().map(|&t| self.eval(&[t])).collect()
    }
    /// The model's own multi-token-prediction block ([`BatchEngine::mtp_logits`]): the
    /// logits for the token after `tok`, `j` places past the cached tokens. `None`: the
    /// sequence has no such block.
    fn mtp_logits(&mut self, _tok: u32, _j: usize) -> Result<Option<Vec<f32>>, EngineError> {
        Ok(None)
    }
}

/// A model bound to a backend with a KV cache for one sequence.
pub struct Engine {
    inner: BatchEngine,
}

impl Engine {
    pub fn new(model: Model, be: Box<dyn Backend>, opts: EngineOptions) -> Result<Engine, EngineError> {
        Ok(Engine { inner: BatchEngine::new(model, be, opts, 1)? })
    }

    pub fn model(&self) -> &Model {
        self.inner.model()
    }
    pub fn backend_name(&self) -> String {
        self.inner.backend_name()
    }
    /// The backend's weight-residency counters (`--memory-report`, `lode bench`).
    pub fn weight_stats(&self) -> Option<crate::weights::WeightStats> {
        self.inner.weight_stats()
    }
    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }
    /// The sliding-window layers' window-sized cache, if they keep one.
    pub fn window_kv(&self) -> Option<crate::backend::SwaKv> {
        self.inner.window_kv()
    }
    /// Tokens in the cache.
    pub fn n_past(&self) -> usize {
        self.inner.history(0).len()
    }
    pub fn history(&self) -> &[u32] {
        self.inner.history(0)
    }
    /// Forgets everything (the next eval starts at position 0).
    pub fn clear(&mut self) {
        self.inner.truncate(0, 0);
    }
    /// Keeps the first `n` cached tokens (a shared prompt prefix) and forgets the rest.
    pub fn truncate(&mut self, n: usize) {
        self.inner.truncate(0, n);
    }
    /// See [`BatchEngine::start_rewind_log`].
    pub fn start_rewind_log(&mut self, cap: usize) -> Result<(), EngineError> {
        self.inner.start_rewind_log(0, cap)
    }
    /// See [`BatchEngine::can_rewind`].
    pub fn can_rewind(&self, n: usize) -> bool {
        self.inner.can_rewind(0, n)
    }
    /// See [`BatchEngine::rewind`].
    pub fn rewind(&mut self, n: usize) -> Result<(), EngineError> {
        self.inner.rewind(0, n)
    }

    /// Evaluates `tokens` after the cached ones and returns the last token's logits.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut last = Vec::new();
        self.inner.eval_rows(0, tokens, OutputRows::Last, &mut |_, l| last = l.to_vec())?;
        Ok(last)
    }

    /// Evaluates `tokens` and hands every position's logits (`[n_vocab]`, predicting the
    /// next token) to `on_logits(index_in_tokens, logits)` — what perplexity needs.
    pub fn eval_all(&mut self, tokens: &[u32], on_logits: &mut dyn FnMut(usize, &[f32])) -> Result<(), EngineError> {
        self.inner.eval_rows(0, tokens, OutputRows::All, on_logits)
    }

    /// See [`generate`].
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<GenOutput, EngineError> {
        generate(self, prompt, params, sampler, on_token)
    }
}

impl Sequence for Engine {
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        Engine::eval(self, tokens)
    }
    fn history(&self) -> &[u32] {
        Engine::history(self)
    }
    fn truncate(&mut self, n: usize) {
        Engine::truncate(self, n)
    }
    fn rewind(&mut self, n: usize) -> Result<(), EngineError> {
        Engine::rewind(self, n)
    }
    fn n_ctx(&self) -> usize {
        Engine::n_ctx(self)
    }
    /// One forward chunk for all of `tokens` ([`BatchEngine::eval_verify`]).
    fn eval_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.inner.eval_verify(0, tokens)
    }
    fn mtp_logits(&mut self, tok: u32, j: usize) -> Result<Option<Vec<f32>>, EngineError> {
        self.inner.mtp_logits(0, tok, j)
    }
}

/// Evaluates `prompt` after `seq`'s cached tokens, then samples up to
/// `params.max_tokens` tokens. `on_token` sees each sampled token that is not an
/// end-of-generation token. A full context ends generation with
/// [`StopReason::ContextFull`].
pub fn generate(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    params: &GenParams,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(u32) -> Flow,
) -> Result<GenOutput, EngineError> {
    generate_with_logits(seq, prompt, params, sampler, &mut |tok, _| on_token(tok))
}

/// [`generate`], with `on_token` also seeing the logits the token was sampled from
/// (for log-probabilities): under a [`Constraint`], with every token its mask forbade at
/// −∞. An end-of-generation token is not shown.
pub fn generate_with_logits(
    seq: &mut dyn Sequence,
    prompt: &[u32],
    params: &GenParams,
    sampler: &mut Sampler,
    on_token: &mut dyn FnMut(u32, &[f32]) -> Flow,
) -> Result<GenOutput, EngineError> {
    if params.max_tokens == 0 {
        return Err(EngineError::InvalidArg("the number of tokens to generate must be at least 1".into()));
    }
    let t0 = Instant::now();
    let mut logits = seq.eval(prompt)?;
    for &t in prompt {
        sampler.accept(t);
    }
    let prompt_secs = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut tokens = Vec::new();
    let stop = loop {
        let tok = sampler.sample(&logits);
        sampler.accept(tok);
        tokens.push(tok);
        if params.eog.contains(&tok) {
            break StopReason::Eog;
        }
        // (A mask that allowed nothing in range left the draw unconstrained.)
        if let Some(m) = sampler.last_mask().filter(|m| m.allows(tok)) {
            m.apply(&mut logits);
        }
        if on_token(tok, &logits) == Flow::Stop {
            break StopReason::Caller;
        }
        if tokens.len() >= params.max_tokens {
            break StopReason::MaxTokens;
        }
        if seq.history().len() >= seq.n_ctx() {
            break StopReason::ContextFull;
        }
        logits = seq.eval(&[tok])?;
    };
    Ok(GenOutput { tokens, stop, n_prompt: prompt.len(), prompt_secs, gen_secs: t1.elapsed().as_secs_f64() })
}
