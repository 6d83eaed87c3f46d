//! The engine: one sequence's KV cache, prompt processing in chunks, decode steps and
//! the generation loop with its stop conditions. It knows tokens, not text: the caller
//! tokenizes, detokenizes and watches stop strings ([`StopStrings`]) in `on_token`.

mod sampler;
mod stop;

use std::time::Instant;

pub use sampler::{argmax_logits, Sampler, SamplerParams};
pub use stop::StopStrings;

use crate::backend::{Backend, BackendError, KvCache, KvSpec, KvType};
use crate::model::{Model, ModelError, OutputRows, Scratch};

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
}

/// How big the engine's buffers are.
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// KV slots; `None`: min(model's training context, [`DEFAULT_CTX_CAP`]).
    pub ctx_size: Option<usize>,
    /// Tokens per prefill chunk.
    pub batch_size: usize,
    pub kv_type: KvType,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions { ctx_size: None, batch_size: 512, kv_type: KvType::F16 }
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

/// A model bound to a backend with a KV cache for one sequence.
pub struct Engine {
    model: Model,
    be: Box<dyn Backend>,
    kv: KvCache,
    scratch: Option<Scratch>,
    n_ctx: usize,
    /// Tokens whose K/V are in the cache, in order (slot = index).
    history: Vec<u32>,
}

impl Engine {
    pub fn new(model: Model, mut be: Box<dyn Backend>, opts: EngineOptions) -> Result<Engine, EngineError> {
        let c = &model.cfg;
        let n_ctx = opts.ctx_size.unwrap_or_else(|| c.n_ctx_train.min(DEFAULT_CTX_CAP));
        if n_ctx == 0 || opts.batch_size == 0 {
            return Err(EngineError::InvalidArg(format!(
                "context size {n_ctx} and batch size {} must be at least 1",
                opts.batch_size
            )));
        }
        if n_ctx > c.n_ctx_train {
            tracing::warn!("context {n_ctx} exceeds the model's training context {}", c.n_ctx_train);
        }
        let spec = KvSpec {
            n_layer: c.n_layer,
            n_ctx,
            n_kv_head: c.n_head_kv,
            head_dim_k: c.head_dim_k,
            head_dim_v: c.head_dim_v,
            ty: opts.kv_type,
        };
        let weights: Vec<_> = model.weight_ids().into_iter().map(|id| model.w(id)).collect();
        be.attach_weights(model.file(), &weights)?;
        let kv = be.alloc_kv(&spec)?;
        let scratch = Scratch::new(be.as_mut(), &model, opts.batch_size.min(n_ctx))?;
        Ok(Engine { model, be, kv, scratch: Some(scratch), n_ctx, history: Vec::new() })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }
    pub fn backend_name(&self) -> String {
        self.be.name()
    }
    /// The backend's weight-residency counters (`--memory-report`, `lode bench`).
    pub fn weight_stats(&self) -> Option<crate::weights::WeightStats> {
        self.be.weight_stats()
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Tokens in the cache.
    pub fn n_past(&self) -> usize {
        self.history.len()
    }
    pub fn history(&self) -> &[u32] {
        &self.history
    }
    /// Forgets everything (the next eval starts at position 0).
    pub fn clear(&mut self) {
        self.history.clear();
    }
    /// Keeps the first `n` cached tokens (a shared prompt prefix) and forgets the rest.
    pub fn truncate(&mut self, n: usize) {
        self.history.truncate(n);
    }

    /// Evaluates `tokens` after the cached ones and returns the last token's logits.
    pub fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut last = Vec::new();
        self.eval_rows(tokens, OutputRows::Last, &mut |_, l| last = l.to_vec())?;
        Ok(last)
    }

    /// Evaluates `tokens` and hands every position's logits (`[n_vocab]`, predicting the
    /// next token) to `on_logits(index_in_tokens, logits)` — what perplexity needs.
    pub fn eval_all(&mut self, tokens: &[u32], on_logits: &mut dyn FnMut(usize, &[f32])) -> Result<(), EngineError> {
        self.eval_rows(tokens, OutputRows::All, on_logits)
    }

    fn eval_rows(
        &mut self,
        tokens: &[u32],
        rows: OutputRows,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let free = self.n_ctx - self.history.len();
        if tokens.len() > free {
            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), free, n_ctx: self.n_ctx });
        }
        let n_vocab = self.model.cfg.n_vocab as u32;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= n_vocab) {
            return Err(EngineError::InvalidArg(format!("token id {bad} is outside the vocabulary ({n_vocab})")));
        }
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        let chunk = scratch.n_max;
        let mut done = 0;
        for part in tokens.chunks(chunk) {
            let p0 = self.history.len() as u32;
            let pos: Vec<u32> = (p0..p0 + part.len() as u32).collect();
            let is_last = done + part.len() == tokens.len();
            let r = match rows {
                OutputRows::All => OutputRows::All,
                OutputRows::Last if is_last => OutputRows::Last,
                _ => OutputRows::None,
            };
            let base = done;
            let res = self.model.forward(self.be.as_mut(), scratch, self.kv, part, &pos, r, &mut |i, l| {
                on_logits(base + i, l)
            });
            if let Err(e) = res {
                // The chunk's K/V may be half written: forget it.
                return Err(e.into());
            }
            self.history.extend_from_slice(part);
            done += part.len();
        }
        Ok(())
    }

    /// Evaluates `prompt` after the cached tokens, then samples up to
    /// `params.max_tokens` tokens. `on_token` sees each sampled token that is not an
    /// end-of-generation token. A full context ends generation with
    /// [`StopReason::ContextFull`].
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &GenParams,
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<GenOutput, EngineError> {
        if params.max_tokens == 0 {
            return Err(EngineError::InvalidArg("the number of tokens to generate must be at least 1".into()));
        }
        let t0 = Instant::now();
        let mut logits = self.eval(prompt)?;
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
            if on_token(tok) == Flow::Stop {
                break StopReason::Caller;
            }
            if tokens.len() >= params.max_tokens {
                break StopReason::MaxTokens;
            }
            if self.history.len() >= self.n_ctx {
                break StopReason::ContextFull;
            }
            logits = self.eval(&[tok])?;
        };
        Ok(GenOutput { tokens, stop, n_prompt: prompt.len(), prompt_secs, gen_secs: t1.elapsed().as_secs_f64() })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            let _ = s.free(self.be.as_mut());
        }
        let _ = self.be.free_kv(self.kv);
    }
}
