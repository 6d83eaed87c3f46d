//! Continuous batching: one engine thread owns the [`BatchEngine`] (one model, one
//! backend, one copy of the weights, a KV cache per slot); each slot thread drives its
//! request through a [`SeqHandle`], which sends the engine thread what to evaluate.
//!
//! Decode steps wait briefly for each other: the engine thread runs one forward pass over
//! the next token of every decoding sequence as soon as all of them have asked (or
//! [`STEP_WINDOW`] after the first ask), so N concurrent requests read the weights once
//! per token instead of N times. Prompts queue ([`super::prefill`]) and are fed a chunk
//! per pass: inside the decode steps (`BatchEngine::step_mixed`, the pass's rows at most
//! `--ubatch-size`), or alone when no stream is decoding, or between steps for models
//! that do not mix; so a long prompt delays the other streams' tokens by one chunk's
//! share of a pass, not by its whole prefill.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lode_runtime::engine::{draft_sampler, mtp_draft_batch, BatchEngine, Draft, Drafter, EngineError, Sampler, SamplerParams, Sequence};
use lode_runtime::model::OutputRows;

use super::metrics::Metrics;
use super::prefill::{Chunk, EvalReply, Prefills};
use super::scheduler::panic_message;
use super::slot::SlotSequence;

/// Fewest prompt tokens worth copying from another sequence's cache instead of
/// evaluating them.
const MIN_SHARED: usize = 8;

/// How long a decode step waits for the other decoding sequences to ask. They normally
/// arrive within microseconds (sampling and detokenizing one token); the window only
/// bounds the wait for a slot that is slow to come back.
const STEP_WINDOW: Duration = Duration::from_millis(3);

type Reply = SyncSender<Result<Vec<f32>, String>>;

enum Msg {
    /// Evaluate a prompt (or its uncached tail) after the sequence's cached tokens; with
    /// `share`, first copy a longer cached start of it from another sequence. The reply
    /// carries the last row's logits and the tokens copied.
    Eval { seq: usize, tokens: Vec<u32>, share: bool, reply: EvalReply },
    /// The next token of a decoding sequence, asked at `at`.
    Step { seq: usize, token: u32, reply: Reply, at: Instant },
    /// A speculative verify chunk (the last token and the drafted ones), evaluated alone;
    /// every row's logits come back.
    Verify { seq: usize, tokens: Vec<u32>, reply: SyncSender<Result<Vec<Vec<f32>>, String>> },
    /// A request starts drafting with the model's MTP block (`--spec-type draft-mtp`)
    /// under these sampler settings: its drafting sampler (`engine::draft_sampler`).
    MtpBegin { seq: usize, sampling: SamplerParams },
    /// Up to `max` tokens to follow `token` (the one about to be evaluated after the
    /// sequence's `n_hist` cached tokens) from the MTP block. Slots drafting together
    /// share its batched rows.
    MtpDraft { seq: usize, token: u32, n_hist: usize, max: usize, reply: DraftReply },
    /// Keep the first `n` cached tokens.
    /// With `reply`, the tokens kept are sent back (window-sized caches decide it).
    Truncate { seq: usize, n: usize, reply: Option<mpsc::SyncSender<usize>> },
    /// Keep exactly the first `n` (a rejected draft; `BatchEngine::rewind`).
    Rewind { seq: usize, n: usize, reply: SyncSender<Result<(), String>> },
    /// The sequence's request is over: steps no longer wait for it.
    Idle { seq: usize },
    /// The mean of the normed last hidden states of `tokens`, evaluated alone on `seq`
    /// (the embeddings sequence, emptied before and after).
    Embed { seq: usize, tokens: Vec<u32>, reply: Reply },
}

/// The embeddings sequence's handle (`--embeddings`): any thread may ask.
#[derive(Clone)]
pub struct EmbedHandle {
    seq: usize,
    tx: Sender<Msg>,
    pub n_ctx: usize,
}

impl EmbedHandle {
    /// Mean-pooled hidden state of `tokens` (not normalized).
    pub fn embed(&self, tokens: Vec<u32>) -> Result<Vec<f32>, String> {
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || "the engine thread has stopped".to_string();
        self.tx.send(Msg::Embed { seq: self.seq, tokens, reply }).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?
    }
}

/// Starts the engine thread; returns one handle per slot sequence of `engine`, and with
/// `embeddings` the handle of its last sequence, kept for embeddings.
/// `ubatch` bounds the rows of a pass that carries a prompt chunk (`--ubatch-size`).
/// `mtp_p_min`: the slots draft with the model's MTP block ([`SeqHandle::mtp_drafter`]),
/// stopping below that probability.
pub fn start(engine: BatchEngine, metrics: Arc<Metrics>, embeddings: bool, ubatch: usize, mtp_p_min: Option<f32>) -> std::io::Result<(Vec<SeqHandle>, Option<EmbedHandle>)> {
    let (tx, rx) = mpsc::channel();
    let n_ctx = engine.n_ctx();
    let n_slots = engine.n_seq() - usize::from(embeddings);
    let handles = (0..n_slots)
        .map(|seq| SeqHandle {
            seq,
            tx: tx.clone(),
            history: engine.history(seq).to_vec(),
            n_ctx,
            recurrent: engine.is_recurrent(),
            window: engine.window_kv().is_some(),
            share: true,
            copied: 0,
        })
        .collect();
    let embed = embeddings.then(|| EmbedHandle { seq: n_slots, tx: tx.clone(), n_ctx });
    std::thread::Builder::new().name("lode-engine".into()).spawn(move || engine_thread(engine, rx, metrics, ubatch.max(1), mtp_p_min))?;
    Ok((handles, embed))
}

/// One sequence of the shared engine, as a slot thread sees it. It mirrors the
/// sequence's token history (only this handle changes it), so reading it costs no trip.
pub struct SeqHandle {
    seq: usize,
    tx: Sender<Msg>,
    history: Vec<u32>,
    n_ctx: usize,
    /// The model has recurrent layers: a truncation keeps all or nothing, as the engine's.
    recurrent: bool,
    /// Window-sized caches: whether a cut keeps anything depends on what they still hold,
    /// which only the engine knows (`BatchEngine::truncate`), so a cut asks it.
    window: bool,
    /// Whether a prompt may copy its start from another sequence (the request's
    /// `cache_prompt`, `--no-cache-prompt`).
    share: bool,
    /// Prompt tokens copied from other sequences since [`SlotSequence::take_copied`].
    copied: usize,
}

impl SeqHandle {
    fn ask<T>(&self, msg: impl FnOnce(SyncSender<Result<T, String>>) -> Msg) -> Result<T, EngineError> {
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || EngineError::InvalidArg("the engine thread has stopped".into());
        self.tx.send(msg(reply)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?.map_err(EngineError::InvalidArg)
    }
}

impl SeqHandle {
    /// This slot's drafter under `--spec-type draft-mtp`: the engine thread's MTP block
    /// for this sequence.
    pub fn mtp_drafter(&self) -> MtpHandle {
        MtpHandle { seq: self.seq, tx: self.tx.clone(), sampling: SamplerParams::greedy() }
    }
}

/// One slot's MTP drafter: drafts run on the engine thread, which holds the block's
/// cache and the target's hidden rows of the slot's sequence, batched with the other
/// slots drafting at the same time (`engine::mtp_draft_batch`). A greedy request gets
/// argmax drafts; a sampled one draws them under its own settings, with their
/// distribution, for the exact acceptance rule (as `lode generate`'s `MtpDrafter`).
pub struct MtpHandle {
    seq: usize,
    tx: Sender<Msg>,
    sampling: SamplerParams,
}

impl Drafter for MtpHandle {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn set_sampling(&mut self, params: &SamplerParams) {
        self.sampling = params.clone();
    }

    fn begin(&mut self, _context: &[u32]) -> Result<(), EngineError> {
        let msg = Msg::MtpBegin { seq: self.seq, sampling: self.sampling.clone() };
        self.tx.send(msg).map_err(|_| EngineError::InvalidArg("the engine thread has stopped".into()))
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        let Some((&token, cached)) = context.split_last() else { return Ok(()) };
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || EngineError::InvalidArg("the engine thread has stopped".into());
        self.tx.send(Msg::MtpDraft { seq: self.seq, token, n_hist: cached.len(), max, reply }).map_err(|_| gone())?;
        let d = rx.recv().map_err(|_| gone())?.map_err(EngineError::InvalidArg)?;
        out.tokens.extend(d.tokens);
        out.q.extend(d.q);
        Ok(())
    }
}

impl Sequence for SeqHandle {
    fn eval(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        // The engine checks the context too; checking here keeps the typed error the
        // server turns into a 400.
        let free = self.n_ctx - self.history.len();
        if tokens.len() > free {
            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), free, n_ctx: self.n_ctx });
        }
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let seq = self.seq;
        let logits = if tokens.len() == 1 {
            let token = tokens[0];
            self.ask(|reply| Msg::Step { seq, token, reply, at: Instant::now() })?
        } else {
            let (tokens, share) = (tokens.to_vec(), self.share);
            let (logits, copied) = self.ask(|reply| Msg::Eval { seq, tokens, share, reply })?;
            self.copied += copied;
            logits
        };
        self.history.extend_from_slice(tokens);
        Ok(logits)
    }
    fn history(&self) -> &[u32] {
        &self.history
    }
    fn truncate(&mut self, n: usize) {
        let mut n = lode_runtime::engine::kept_after_truncate(self.recurrent, self.history.len(), n);
        if self.window && n < self.history.len() {
            let (reply, rx) = mpsc::sync_channel(1);
            // An engine that has stopped keeps nothing.
            n = match self.tx.send(Msg::Truncate { seq: self.seq, n, reply: Some(reply) }) {
                Ok(()) => rx.recv().unwrap_or(0),
                Err(_) => 0,
            };
        } else {
            let _ = self.tx.send(Msg::Truncate { seq: self.seq, n, reply: None });
        }
        self.history.truncate(n);
    }
    fn rewind(&mut self, n: usize) -> Result<(), EngineError> {
        if !self.recurrent {
            self.truncate(n);
            return Ok(());
        }
        // A recurrent sequence goes back through its rewind log on the engine thread.
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || EngineError::InvalidArg("the engine thread has stopped".into());
        self.tx.send(Msg::Rewind { seq: self.seq, n, reply }).map_err(|_| gone())?;
        let r = rx.recv().map_err(|_| gone())?;
        match r {
            Ok(()) => self.history.truncate(n),
            // The engine emptied the sequence or left it as it was; start over either way.
            Err(_) => {
                self.history.clear();
                let _ = self.tx.send(Msg::Truncate { seq: self.seq, n: 0, reply: None });
            }
        }
        r.map_err(EngineError::InvalidArg)
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn eval_each(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        let free = self.n_ctx - self.history.len();
        if tokens.len() > free {
            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), free, n_ctx: self.n_ctx });
        }
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || EngineError::InvalidArg("the engine thread has stopped".into());
        let msg = Msg::Verify { seq: self.seq, tokens: tokens.to_vec(), reply };
        self.tx.send(msg).map_err(|_| gone())?;
        let rows = rx.recv().map_err(|_| gone())?.map_err(EngineError::InvalidArg)?;
        self.history.extend_from_slice(tokens);
        Ok(rows)
    }
}

impl SlotSequence for SeqHandle {
    fn finished(&mut self) {
        let _ = self.tx.send(Msg::Idle { seq: self.seq });
    }
    fn set_prompt_cache(&mut self, on: bool) {
        self.share = on;
    }
    fn take_copied(&mut self) -> usize {
        std::mem::take(&mut self.copied)
    }
}

/// Runs `f` on the engine; a panic becomes an error message and every sequence is
/// forgotten (its cache contents are unknown), so the server keeps serving.
pub(super) fn guarded<T>(engine: &mut BatchEngine, f: impl FnOnce(&mut BatchEngine) -> Result<T, EngineError>) -> Result<T, String> {
    match catch_unwind(AssertUnwindSafe(|| f(engine))) {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(panic) => {
            let what = panic_message(panic.as_ref());
            tracing::error!("engine panicked: {what}; forgetting every sequence's cache");
            for s in 0..engine.n_seq() {
                engine.truncate(s, 0);
            }
            Err(format!("internal error in the engine: {what}"))
        }
    }
}

/// Publishes the weight cache's copies and the device memory the backend holds.
fn publish_memory(engine: &BatchEngine, m: &Metrics) {
    if let Some(w) = engine.weight_stats() {
        m.weight_copies.store(w.copies, Relaxed);
        if let Some(d) = &w.device {
            m.device_memory_bytes.store(d.driver_used_bytes.unwrap_or(d.allocated_bytes), Relaxed);
        }
    }
}

/// The prefix cache, before `seq` evaluates `tokens` after its cached ones: when another
/// sequence's cache (a live slot's or an idle one's, [`BatchEngine::prefix_source`])
/// holds a longer start of the same prompt (the other choices of an `n > 1` request, a
/// shared system prompt, an earlier turn of the conversation), copies that K/V into
/// `seq` instead of evaluating it. Returns the tokens still to evaluate (at least one)
/// and how many were copied.
pub(super) fn share_prefix(e: &mut BatchEngine, seq: usize, tokens: &[u32]) -> (Vec<u32>, usize) {
    let own = e.history(seq).len();
    let full: Vec<u32> = e.history(seq).iter().chain(tokens).copied().collect();
    match e.prefix_source(seq, &full) {
        Some((src, n)) if n >= own + MIN_SHARED => match e.copy_prefix(src, seq, n) {
            Ok(()) => (full[n..].to_vec(), n - own),
            Err(err) => {
                tracing::debug!("cannot share {n} prompt tokens from sequence {src}: {err}");
                // The copy may have failed half way: evaluate the whole prompt again.
                e.truncate(seq, 0);
                (full, 0)
            }
        },
        _ => (tokens.to_vec(), 0),
    }
}

type DraftReply = SyncSender<Result<Draft, String>>;

/// Runs the waiting MTP drafts together (`engine::mtp_draft_batch`, with each sequence's
/// drafting sampler): one batched row of the block per drafted position. A request whose
/// sequence is not where its slot thinks gets no draft.
fn run_mtp_drafts(
    engine: &mut BatchEngine,
    drafts: &mut Vec<(usize, u32, usize, usize, DraftReply)>,
    samplers: &mut [Option<Sampler>],
    p_min: Option<f32>,
    m: &Metrics,
) {
    let Some(p_min) = p_min else {
        drafts.drain(..).for_each(|d| drop(d.4.send(Err("the server does not draft with the MTP block (--spec-type draft-mtp)".into()))));
        return;
    };
    let reqs: Vec<(usize, u32, usize)> =
        drafts.iter().map(|&(seq, token, n_hist, max, _)| (seq, token, if engine.history(seq).len() == n_hist { max } else { 0 })).collect();
    m.draft_batches.fetch_add(1, Relaxed);
    m.draft_requests.fetch_add(reqs.len() as u64, Relaxed);
    match guarded(engine, |e| mtp_draft_batch(e, &reqs, samplers, p_min)) {
        Ok(out) => drafts.drain(..).zip(out).for_each(|(d, t)| drop(d.4.send(Ok(t)))),
        Err(err) => drafts.drain(..).for_each(|d| drop(d.4.send(Err(err.clone())))),
    }
}

/// A decode step waiting for its pass: its sequence, token, reply and when it was asked.
struct Pending {
    seq: usize,
    token: u32,
    reply: Reply,
    at: Instant,
}

/// Runs one pass: the pending steps, with the head prompt's next chunk where the engine
/// mixes (`chunk`), and answers them. Steps that waited for a prompt chunk (one in their
/// pass, or one evaluated alone since they asked, ending at `chunk_end`) count in the
/// prefill-wait metric.
fn run_step(e: &mut BatchEngine, m: &Metrics, pending: &mut Vec<Pending>, prefills: &mut Prefills, chunk: Option<Chunk>, chunk_end: Option<Instant>) {
    let steps: Vec<(usize, u32)> = pending.iter().map(|p| (p.seq, p.token)).collect();
    let n = m.batch_steps.fetch_add(1, Relaxed);
    m.batch_rows.fetch_add(steps.len() as u64, Relaxed);
    let mixed = chunk.is_some();
    let r = match &chunk {
        Some(c) => {
            m.prefill_chunks_mixed.fetch_add(1, Relaxed);
            let r = guarded(e, |e| e.step_mixed(c.seq, &c.tokens, c.last, &steps));
            let (first, rows) = match r {
                Ok((first, rows)) => (Ok(first), Ok(rows)),
                Err(why) => (Err(why.clone()), Err(why)),
            };
            prefills.chunk_done(e, m, c.tokens.len(), first);
            rows
        }
        None => guarded(e, |e| e.step(&steps)),
    };
    let now = Instant::now();
    for p in pending.iter() {
        if mixed || chunk_end.is_some_and(|t| t > p.at) {
            m.prefill_wait(now - p.at);
        }
    }
    match r {
        Ok(rows) => pending.drain(..).zip(rows).for_each(|(p, l)| drop(p.reply.send(Ok(l)))),
        Err(e) => pending.drain(..).for_each(|p| drop(p.reply.send(Err(e.clone())))),
    }
    if n % 64 == 0 {
        publish_memory(e, m);
    }
}

fn engine_thread(mut engine: BatchEngine, rx: Receiver<Msg>, m: Arc<Metrics>, ubatch: usize, mtp_p_min: Option<f32>) {
    publish_memory(&engine, &m);
    let mut decoding = vec![false; engine.n_seq()];
    let mut pending: Vec<Pending> = Vec::new();
    let mut prefills = Prefills::default();
    let mix = engine.can_mix();
    let max_rows = engine.max_rows();
    // MTP drafts wait for each other as the steps do (`Msg::MtpDraft`).
    let mut drafts: Vec<(usize, u32, usize, usize, DraftReply)> = Vec::new();
    // Each sequence's drafting sampler (`Msg::MtpBegin`; `None`: argmax drafts).
    let mut samplers: Vec<Option<Sampler>> = (0..engine.n_seq()).map(|_| None).collect();
    let mut deadline = Instant::now();
    // When the last pass ended, and the last prompt chunk evaluated alone.
    let mut last_pass = Instant::now();
    let mut chunk_end: Option<Instant> = None;
    // Where the engine does not mix: a prompt chunk is due before the next step.
    let mut chunk_due = false;
    let mut open = true;
    while open || !pending.is_empty() || !prefills.is_empty() || !drafts.is_empty() {
        let now = Instant::now();
        // Sequences expected to ask for a step: decoding ones not in a prefill.
        let asking = (0..decoding.len()).filter(|&s| decoding[s] && !prefills.holds(s)).count();
        let waiting = pending.len() + drafts.len();
        let due = waiting > 0 && (!open || waiting >= asking || now >= deadline);
        if due && !drafts.is_empty() {
            run_mtp_drafts(&mut engine, &mut drafts, &mut samplers, mtp_p_min, &m);
            if pending.is_empty() {
                continue;
            }
        }
        let ready = due && !pending.is_empty();
        if ready && !(chunk_due && !prefills.is_empty()) {
            let room = ubatch.saturating_sub(pending.len()).min(max_rows - pending.len());
            let chunk = if mix { prefills.next_chunk(&mut engine, &m, room) } else { None };
            run_step(&mut engine, &m, &mut pending, &mut prefills, chunk, chunk_end);
            chunk_due = !mix && !prefills.is_empty();
            last_pass = Instant::now();
            continue;
        }
        // A chunk alone: where the engine does not mix (after each step), or while no
        // decoding sequence asks within a step window.
        let quiet = pending.is_empty() && (asking == 0 || !open || now >= last_pass + STEP_WINDOW);
        if !prefills.is_empty() && (chunk_due || quiet) {
            if let Some(c) = prefills.next_chunk(&mut engine, &m, ubatch.min(max_rows)) {
                let r = guarded(&mut engine, |e| e.step_mixed(c.seq, &c.tokens, c.last, &[]).map(|(first, _)| first));
                // Its end, taken before the reply: the prompt's own slot may ask for its
                // first step at once, and that step did not wait behind this chunk.
                chunk_end = Some(Instant::now());
                prefills.chunk_done(&mut engine, &m, c.tokens.len(), r);
                if c.last {
                    publish_memory(&engine, &m);
                }
            }
            chunk_due = false;
            last_pass = Instant::now();
            continue;
        }
        let wait_until = if !pending.is_empty() || !drafts.is_empty() {
            Some(deadline)
        } else if !prefills.is_empty() {
            Some(last_pass + STEP_WINDOW)
        } else {
            None
        };
        let msg = match wait_until {
            None => match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            },
            Some(t) => match rx.recv_timeout(t.saturating_duration_since(Instant::now())) {
                Ok(m) => m,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => {
                    open = false;
                    continue;
                }
            },
        };
        match msg {
            Msg::Eval { seq, tokens, share, reply } => {
                decoding[seq] = true;
                prefills.push(seq, tokens, share, reply);
            }
            Msg::Step { seq, token, reply, at } => {
                decoding[seq] = true;
                if pending.is_empty() && drafts.is_empty() {
                    deadline = Instant::now() + STEP_WINDOW;
                }
                pending.push(Pending { seq, token, reply, at });
            }
            Msg::MtpBegin { seq, sampling } => samplers[seq] = draft_sampler(&sampling),
            Msg::MtpDraft { seq, token, n_hist, max, reply } => {
                decoding[seq] = true;
                if pending.is_empty() && drafts.is_empty() {
                    deadline = Instant::now() + STEP_WINDOW;
                }
                drafts.push((seq, token, n_hist, max, reply));
            }
            Msg::Verify { seq, tokens, reply } => {
                decoding[seq] = true;
                m.spec_passes.fetch_add(1, Relaxed);
                m.spec_drafted.fetch_add(tokens.len().saturating_sub(1) as u64, Relaxed);
                let _ = reply.send(guarded(&mut engine, |e| e.eval_verify(seq, &tokens)));
            }
            Msg::Truncate { seq, n, reply } => {
                let kept = engine.truncate(seq, n);
                if let Some(r) = reply {
                    let _ = r.send(kept);
                }
            }
            Msg::Rewind { seq, n, reply } => {
                let _ = reply.send(guarded(&mut engine, |e| e.rewind(seq, n)));
            }
            Msg::Idle { seq } => decoding[seq] = false,
            Msg::Embed { seq, tokens, reply } => {
                let r = guarded(&mut engine, |e| {
                    e.truncate(seq, 0);
                    let mut sum: Vec<f64> = Vec::new();
                    let r = e.eval_rows(seq, &tokens, OutputRows::Hidden, &mut |_, h| {
                        sum.resize(h.len(), 0.0);
                        sum.iter_mut().zip(h).for_each(|(s, &x)| *s += x as f64);
                    });
                    e.truncate(seq, 0);
                    r?;
                    Ok(sum.iter().map(|&s| (s / tokens.len().max(1) as f64) as f32).collect())
                });
                let _ = reply.send(r);
            }
        }
    }
}
