//! Several sequences over one model and one backend: each sequence has its own KV cache
//! and token history; the weights, the backend and the activation buffers are shared.
//! A decode [`BatchEngine::step`] runs the next token of many sequences as ONE forward
//! pass, so every weight is read once per step however many sequences are decoding
//! (continuous batching, as a server needs it). [`super::Engine`] is this with one
//! sequence.
//!
//! A model with recurrent layers (qwen35) also keeps a [`RecurrentState`] per sequence
//! beside its KV cache. That state exists only at the sequence's last position, so such a
//! sequence cannot be cut back: [`BatchEngine::truncate`] to fewer tokens than it holds
//! empties it (see [`kept_after_truncate`]), and [`BatchEngine::copy_prefix`] copies only a
//! source's whole history (its KV and its state), never a shorter prefix. The exception is
//! speculation: [`BatchEngine::start_rewind_log`] checkpoints the state and logs what
//! follows, so [`BatchEngine::rewind`] can go back to any position since (a rejected
//! draft; `model/rewind.rs`).

use crate::backend::{Backend, KvCache, KvSpec, SwaKv};
use crate::model::{KvRows, Model, MtpBufs, MtpState, OutputRows, RecurrentState, Scratch};

use super::{EngineError, EngineOptions, DEFAULT_CTX_CAP};

mod mtp;
mod mixed;

/// One sequence: its cache and the tokens whose K/V it holds (slot = index).
struct Seq {
    kv: KvCache,
    history: Vec<u32>,
    /// The recurrent layers' state after `history` (zeroed when `history` is empty).
    rec: RecurrentState,
    /// The oldest position the window-sized layers still hold (`SwaKv::advance`, as the
    /// backend moves it).
    floor: usize,
    /// The multi-token-prediction block's cache and hidden rows (a model that kept one).
    mtp: Option<MtpState>,
}

/// The tokens a sequence keeps when cut to `n` of its `len`: `n` (at most `len`), or 0
/// for a model with recurrent layers unless `n` is all of them (its state is not kept at
/// earlier positions).
pub fn kept_after_truncate(recurrent: bool, len: usize, n: usize) -> usize {
    match n.min(len) {
        k if recurrent && k < len => 0,
        k => k,
    }
}

/// [`kept_after_truncate`] with window-sized caches whose oldest held position is
/// `floor`: a cut to `k` tokens keeps them only if the next query (at `k`) sees no key
/// older than `floor`; else nothing is kept and the sequence is evaluated again (as
/// llama.cpp re-processes a prompt whose start its SWA cache dropped).
pub fn kept_with_window(recurrent: bool, swa: Option<SwaKv>, floor: usize, len: usize, n: usize) -> usize {
    match kept_after_truncate(recurrent, len, n) {
        k if k < len && swa.is_some_and(|w| w.first_visible(k) < floor) => 0,
        k => k,
    }
}

pub struct BatchEngine {
    model: Model,
    be: Box<dyn Backend>,
    seqs: Vec<Seq>,
    scratch: Option<Scratch>,
    n_ctx: usize,
    /// The sliding-window layers' window-sized cache (`None`: full-context layers only).
    swa: Option<SwaKv>,
    /// The MTP block's shared buffers (a model that kept one: `Model::mtp`).
    mtp_bufs: Option<MtpBufs>,
    /// Whether evaluations run the MTP block after the target ([`Self::set_mtp`]).
    mtp_on: bool,
    /// The device's use before this engine allocated, plus its KV and recurrent state
    /// as fit counts them ([`Self::memory_floor`]).
    floor: Option<u64>,
    /// A mixed step's decode rows during attention (`[q, k, v, att]`, `n_seq` rows each;
    /// `None` where [`Self::step_mixed`] cannot run).
    mix: Option<[crate::backend::Buf; 4]>,
}

impl BatchEngine {
    /// `n_seq` sequences of `opts.ctx_size` slots each. The shared activation buffers hold
    /// max(batch size, n_seq) rows: a prompt chunk or one step of every sequence.
    pub fn new(model: Model, mut be: Box<dyn Backend>, opts: EngineOptions, n_seq: usize) -> Result<BatchEngine, EngineError> {
        let c = &model.cfg;
        let n_ctx = opts.ctx_size.unwrap_or_else(|| c.n_ctx_train.min(DEFAULT_CTX_CAP));
        if n_ctx == 0 || opts.batch_size == 0 || n_seq == 0 {
            return Err(EngineError::InvalidArg(format!(
                "context size {n_ctx}, batch size {} and sequence count {n_seq} must be at least 1",
                opts.batch_size
            )));
        }
        if n_ctx > c.n_ctx_train {
            tracing::warn!("context {n_ctx} exceeds the model's training context {}", c.n_ctx_train);
        }
        let rows = opts.batch_size.min(n_ctx).max(n_seq);
        let (kh, alt) = c.kv_heads();
        let spec = KvSpec {
            n_layer: c.kv_layers(),
            n_ctx,
            n_kv_head: kh.n_head_kv,
            head_dim_k: kh.head_dim_k,
            head_dim_v: kh.head_dim_v,
            ty: opts.kv_type,
            swa: if opts.swa_full { None } else { super::fit::window_kv(c, n_ctx, rows) },
            alt,
        };
        let weights: Vec<_> = model.weight_ids().into_iter().map(|id| model.w(id)).collect();
        crate::backend::check_weight_types(be.as_ref(), &weights)?;
        // A model that would not fit is refused here, before anything is allocated; a
        // mixture-of-experts model first keeps the fewest layers' experts on the host that
        // make it fit (the device, and `--weight-budget`), unless `--n-cpu-moe` says.
        let shape = super::fit::RunShape { ctx: n_ctx, batch: opts.batch_size, n_seq, kv_type: opts.kv_type, swa_full: opts.swa_full };
        let sized = |t: &crate::backend::memory::MemoryTarget| super::fit::estimate(&model, t, shape).map_err(|e| EngineError::InvalidArg(e.to_string()));
        let refuse = |target: &crate::backend::memory::MemoryTarget| -> Result<(), EngineError> {
            if let Some(mut why) = sized(target)?.refusal() {
                if let Some(n) = super::fit::fewest_host_expert_layers(&model, target, shape) {
                    why += &format!("; with --n-cpu-moe {n} (the first {n} layers' experts in host memory, computed by the CPU) it fits");
                }
                return Err(EngineError::DoesNotFit(why));
            }
            Ok(())
        };
        let mut planned = be.memory_target();
        if let Some(target) = planned.clone() {
            let budget = be.weight_stats().and_then(|s| s.budget_bytes);
            if let Some(n) = super::fit::host_expert_layers_within(&model, &target, shape, budget) {
                let fits = sized(&target)?.fits();
                let host = sized(&crate::backend::memory::MemoryTarget { host_expert_layers: n, ..target.clone() })?.host_experts;
                if be.place_host_experts(n, host)? {
                    let why = if fits { "the weight budget" } else { "the device" };
                    tracing::warn!("experts placed by fit: the experts of the first {n} of {} layers ({}) stay in host memory, computed by the CPU, so that the model fits {why} (--n-cpu-moe N sets the count)", c.n_layer, crate::weights::budget::human(host));
                    planned = be.memory_target().or(planned);
                }
            }
        }
        if let Some(target) = &planned {
            refuse(target)?;
        }
        let floor = match &planned {
            Some(t) => sized(t).ok().map(|e| t.used_at_open + e.kv + e.recurrent),
            None => None,
        };
        be.attach_weights(model.file(), &weights)?;
        // A backend that could not serve `mapped` falls back to copying the weights: count
        // the run again, still before anything is allocated.
        if let (Some(before), Some(now)) = (&planned, be.memory_target()) {
            if now.residency != before.residency {
                refuse(&now).map_err(|e| match e {
                    EngineError::DoesNotFit(why) => EngineError::DoesNotFit(format!("{why} (`{}` residency fell back to `{}`: the weights now need device memory)", before.residency, now.residency)),
                    e => e,
                })?;
            }
        }
        let mut e = BatchEngine { model, be, seqs: Vec::with_capacity(n_seq), scratch: None, n_ctx, swa: spec.swa, mtp_bufs: None, mtp_on: true, floor, mix: None };
        // Built step by step so that Drop releases whatever was allocated if one fails.
        for _ in 0..n_seq {
            let kv = e.be.alloc_kv(&spec)?;
            let rec = match RecurrentState::new(e.be.as_mut(), &e.model) {
                Ok(r) => r,
                Err(err) => {
                    let _ = e.be.free_kv(kv);
                    return Err(err.into());
                }
            };
            e.seqs.push(Seq { kv, history: Vec::new(), rec, floor: 0, mtp: None });
            if e.model.mtp.is_some() {
                let st = MtpState::new(e.be.as_mut(), &e.model, &spec, rows)?;
                e.seqs.last_mut().expect("just pushed").mtp = Some(st);
            }
        }
        e.scratch = Some(Scratch::new(e.be.as_mut(), &e.model, rows, spec.ty)?);
        if e.model.mtp.is_some() {
            e.mtp_bufs = Some(MtpBufs::new(e.be.as_mut(), &e.model, rows)?);
        }
        e.mix = mixed::alloc_mix_bufs(e.be.as_mut(), &e.model, n_seq)?;
        Ok(e)
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
    /// The device memory a run cannot do without, weights aside: the driver's use before
    /// this engine allocated (context, kernels, other processes) plus the KV cache and
    /// recurrent state (`None` without a device). `lode bench` reports its peak above this
    /// plus the resident weights as overhead.
    pub fn memory_floor(&self) -> Option<u64> {
        self.floor
    }
    /// Opens or closes a device-memory peak window ([`Backend::memory_window`]); the peak
    /// reads from [`Self::weight_stats`]. `false`: no device memory to sample.
    pub fn memory_window(&mut self, open: bool) -> Result<bool, EngineError> {
        Ok(self.be.memory_window(open)?)
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    pub fn n_seq(&self) -> usize {
        self.seqs.len()
    }
    /// Tokens in `seq`'s cache, in order.
    pub fn history(&self, seq: usize) -> &[u32] {
        &self.seqs[seq].history
    }
    /// Whether the model has recurrent layers (whose sequences cannot be cut back).
    pub fn is_recurrent(&self) -> bool {
        self.model.cfg.recurrent.is_some()
    }
    /// The sliding-window layers' window-sized cache, if they keep one (a sequence is
    /// then cut back only as [`kept_with_window`] says).
    pub fn window_kv(&self) -> Option<SwaKv> {
        self.swa
    }
    /// The tokens `seq` would keep if cut to `n`.
    pub fn kept_if_truncated(&self, seq: usize, n: usize) -> usize {
        let s = &self.seqs[seq];
        kept_with_window(self.is_recurrent(), self.swa, s.floor, s.history.len(), n)
    }
    /// Keeps the first `n` cached tokens of `seq` (a shared prompt prefix, or a
    /// rejected speculative draft rolled back); with recurrent layers, all or none
    /// ([`kept_after_truncate`]); with window-sized caches, only if they still hold what
    /// the next position sees, else nothing ([`kept_with_window`]). The K/V rows past `n`
    /// stay in the cache unread: attention reads only positions below the query's, and
    /// the next evaluation overwrites them. Returns the tokens kept.
    pub fn truncate(&mut self, seq: usize, n: usize) -> usize {
        let k = self.kept_if_truncated(seq, n);
        let s = &mut self.seqs[seq];
        s.history.truncate(k);
        s.rec.stop_log();
        if k == 0 {
            s.floor = 0;
        }
        k
    }

    /// From now on, evaluations of `seq` (up to `cap` tokens, one sequence at a time)
    /// are logged so that [`Self::rewind`] can go back to any position from here. Needed
    /// only with recurrent layers (nothing to do otherwise). Chunks and batched steps
    /// append to the log while it has room; a truncation or a prefix copy into the
    /// sequence ends it.
    pub fn start_rewind_log(&mut self, seq: usize, cap: usize) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        let s = &mut self.seqs[seq];
        s.rec.start_log(self.be.as_mut(), &self.model, cap)?;
        Ok(())
    }

    /// Whether [`Self::rewind`] to `n` tokens can succeed: `n` at most the history, and
    /// with recurrent layers either all of it or a position the rewind log covers.
    pub fn can_rewind(&self, seq: usize, n: usize) -> bool {
        let Some(s) = self.seqs.get(seq) else { return false };
        let len = s.history.len();
        match s.rec.logged() {
            _ if n > len => false,
            _ if !self.is_recurrent() || n == len => true,
            Some(rows) => n + rows >= len,
            None => false,
        }
    }

    /// Keeps exactly the first `n` cached tokens of `seq` (a rejected speculative draft
    /// rolled back). With recurrent layers the state is brought back through the rewind
    /// log; a position it does not cover is refused (the sequence unchanged), and a
    /// failure while rolling back leaves the sequence empty.
    pub fn rewind(&mut self, seq: usize, n: usize) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        if !self.can_rewind(seq, n) {
            let (len, logged) = (self.seqs[seq].history.len(), self.seqs[seq].rec.logged());
            return Err(EngineError::InvalidArg(format!(
                "sequence {seq} holds {len} tokens and cannot be rewound to {n} (rewind log: {logged:?} rows)"
            )));
        }
        let s = &mut self.seqs[seq];
        let len = s.history.len();
        if n < len && self.model.cfg.recurrent.is_some() {
            let m = s.rec.logged().unwrap_or(0) - (len - n);
            let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
            let Some(bufs) = scratch.delta_bufs() else {
                return Err(EngineError::InvalidArg("a recurrent model without its delta net buffers".into()));
            };
            self.be.round_rows_as_decode(true);
            let r = s.rec.rewind(self.be.as_mut(), &self.model, bufs, scratch.n_max, m);
            self.be.round_rows_as_decode(false);
            if let Err(e) = r {
                s.history.clear();
                return Err(e.into());
            }
        }
        s.history.truncate(n);
        Ok(())
    }

    /// A sequence about to evaluate from position 0 starts from the zero state.
    fn reset_if_empty(&mut self, seq: usize) -> Result<(), EngineError> {
        let s = &self.seqs[seq];
        if s.history.is_empty() && !s.rec.is_empty() {
            s.rec.reset(self.be.as_mut(), &self.model)?;
        }
        Ok(())
    }

    /// Makes `dst` hold `src`'s first `n` cached tokens, their K/V copied rather than
    /// evaluated again (a prompt shared by several requests, `n > 1` choices).
    pub fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<(), EngineError> {
        self.check_seq(src)?;
        self.check_seq(dst)?;
        let have = self.seqs[src].history.len();
        if n > have {
            return Err(EngineError::InvalidArg(format!("sequence {src} holds {have} tokens, not {n}")));
        }
        let recurrent = self.is_recurrent();
        if recurrent && n != have {
            return Err(EngineError::InvalidArg(format!(
                "sequence {src} holds {have} tokens: a model with recurrent layers can copy only all of them, not {n} (its state is kept at its last position only)"
            )));
        }
        if self.kept_if_truncated(src, n) != n {
            return Err(EngineError::InvalidArg(format!(
                "sequence {src}'s window-sized cache no longer holds what position {n} sees (it holds positions from {})",
                self.seqs[src].floor
            )));
        }
        if src == dst {
            self.truncate(dst, n);
            return Ok(());
        }
        // On failure `dst` claims nothing: its K/V (and state) may be half copied.
        self.seqs[dst].history.clear();
        self.seqs[dst].rec.stop_log();
        self.be.copy_kv(self.seqs[src].kv, self.seqs[dst].kv, n)?;
        self.copy_mtp_prefix(src, dst, n)?;
        if recurrent {
            let (s, d) = (&self.seqs[src].rec, &self.seqs[dst].rec);
            d.copy_from(self.be.as_mut(), &self.model, s)?;
        }
        let h = self.seqs[src].history[..n].to_vec();
        self.seqs[dst].history = h;
        self.seqs[dst].floor = self.seqs[src].floor;
        Ok(())
    }

    /// The prefix cache's lookup: the sequence other than `dst` whose cache can give `dst`
    /// the longest start of `tokens` (the whole prompt, `dst`'s cached tokens included),
    /// always leaving the last token to evaluate (its logits pick the next token), as
    /// `(source, tokens it gives)`. A source qualifies only where [`Self::copy_prefix`]
    /// would take that prefix: with recurrent layers only a source whose whole history
    /// is that prefix (its state exists at its last position only), with window-sized
    /// caches only a prefix whose keys the source still holds. Live and idle sequences
    /// alike; ties go to the lowest index.
    pub fn prefix_source(&self, dst: usize, tokens: &[u32]) -> Option<(usize, usize)> {
        let limit = tokens.len().saturating_sub(1);
        let recurrent = self.is_recurrent();
        let mut best: Option<(usize, usize)> = None;
        for (src, s) in self.seqs.iter().enumerate() {
            if src == dst || s.history.is_empty() {
                continue;
            }
            let common = s.history.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(limit);
            let usable = if recurrent && common != s.history.len() { 0 } else { common };
            if usable > best.map_or(0, |b| b.1) && self.kept_if_truncated(src, usable) == usable {
                best = Some((src, usable));
            }
        }
        best
    }

    fn check_seq(&self, seq: usize) -> Result<(), EngineError> {
        if seq >= self.seqs.len() {
            return Err(EngineError::InvalidArg(format!("sequence {seq} does not exist ({} sequences)", self.seqs.len())));
        }
        Ok(())
    }

    fn check_tokens(&self, tokens: &[u32]) -> Result<(), EngineError> {
        let n_vocab = self.model.cfg.n_vocab as u32;
        match tokens.iter().find(|&&t| t >= n_vocab) {
            Some(&bad) => Err(EngineError::InvalidArg(format!("token id {bad} is outside the vocabulary ({n_vocab})"))),
            None => Ok(()),
        }
    }

    /// Evaluates `tokens` after `seq`'s cached ones, in chunks of the batch size, and
    /// hands the requested rows' logits to `on_logits(index_in_tokens, logits)`.
    pub fn eval_rows(
        &mut self,
        seq: usize,
        tokens: &[u32],
        rows: OutputRows,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), EngineError> {
        self.check_seq(seq)?;
        if tokens.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        let free = self.n_ctx - self.seqs[seq].history.len();
        if tokens.len() > free {
            return Err(EngineError::PromptTooLong { n_prompt: tokens.len(), free, n_ctx: self.n_ctx });
        }
        self.check_tokens(tokens)?;
        self.reset_if_empty(seq)?;
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        let s = &mut self.seqs[seq];
        let mut done = 0;
        for part in tokens.chunks(scratch.n_max) {
            let p0 = s.history.len() as u32;
            let pos: Vec<u32> = (p0..p0 + part.len() as u32).collect();
            let is_last = done + part.len() == tokens.len();
            let r = match rows {
                OutputRows::All => OutputRows::All,
                OutputRows::Hidden => OutputRows::Hidden,
                OutputRows::Last if is_last => OutputRows::Last,
                _ => OutputRows::None,
            };
            let base = done;
            // The window-sized layers' floor as the backend moves it (moved even if the
            // chunk fails: some layers may have moved).
            if let Some(w) = self.swa {
                s.floor = w.advance(s.floor, p0 as usize, p0 as usize + part.len() - 1).map_err(EngineError::InvalidArg)?;
            }
            // On error the chunk's K/V may be half written; the history does not claim it.
            // On error the recurrent state may be half advanced: the sequence starts over.
            // An armed rewind log takes the chunk if it has room, else it ends.
            let logging = s.rec.log_for(part.len()).is_some();
            if !logging {
                s.rec.stop_log();
            }
            let states: &[&RecurrentState] = if s.rec.is_empty() { &[] } else { &[&s.rec] };
            let res = self.model.forward(self.be.as_mut(), scratch, KvRows::One(s.kv), states, part, &pos, r, &mut |i, l| {
                on_logits(base + i, l)
            });
            if let Err(err) = res {
                if !s.rec.is_empty() {
                    s.history.clear();
                    s.rec.stop_log();
                }
                return Err(err.into());
            }
            if logging {
                s.rec.logged_rows(part.len());
            }
            s.history.extend_from_slice(part);
            done += part.len();
            // The MTP block follows the target over the same chunk (its cache, the hidden rows).
            if let (Some(st), Some(b), true) = (&mut s.mtp, &self.mtp_bufs, self.mtp_on) {
                self.model.mtp_catch_up(self.be.as_mut(), scratch, b, st, part, &pos)?;
            }
        }
        Ok(())
    }

    /// Speculative verification: evaluates `tokens` after `seq`'s cached ones as one
    /// chunk and returns every row's logits, each rounded as a one-token step would
    /// round it where the backend can ([`Backend::round_rows_as_decode`]). A rejected
    /// tail is rolled back with [`Self::rewind`] (the chunk is logged for it on a model
    /// with recurrent layers).
    pub fn eval_verify(&mut self, seq: usize, tokens: &[u32]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_seq(seq)?;
        if self.is_recurrent() {
            self.start_rewind_log(seq, tokens.len())?;
        }
        let mut rows = Vec::with_capacity(tokens.len());
        self.be.round_rows_as_decode(true);
        let r = self.eval_rows(seq, tokens, OutputRows::All, &mut |_, l| rows.push(l.to_vec()));
        self.be.round_rows_as_decode(false);
        r.map(|_| rows)
    }

    /// One decode step of several sequences at once: `steps[i] = (seq, token)` appends
    /// `token` to `seq` and returns the logits after it, in the order of `steps`. Each
    /// sequence appears at most once.
    pub fn step(&mut self, steps: &[(usize, u32)]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = vec![Vec::new(); steps.len()];
        self.step_with(steps, &mut |i, l| out[i] = l.to_vec())?;
        Ok(out)
    }
    /// [`Self::step`] handing row `i`'s logits to `on_row(i, logits)` as they are read, lent
    /// (no copy, no allocation: a 32-sequence step of a 152k vocabulary reads 19 MB).
    pub fn step_with(&mut self, steps: &[(usize, u32)], on_row: &mut dyn FnMut(usize, &[f32])) -> Result<(), EngineError> {
        let n = steps.len();
        let n_max = self.scratch.as_ref().expect("scratch lives as long as the engine").n_max;
        if n == 0 || n > n_max {
            return Err(EngineError::InvalidArg(format!("a step of {n} sequences (1..={n_max} allowed)")));
        }
        let mut caches = Vec::with_capacity(n);
        let mut pos = Vec::with_capacity(n);
        let mut tokens = Vec::with_capacity(n);
        for (i, &(seq, tok)) in steps.iter().enumerate() {
            self.check_seq(seq)?;
            if steps[..i].iter().any(|&(other, _)| other == seq) {
                return Err(EngineError::InvalidArg(format!("sequence {seq} appears twice in one step")));
            }
            let s = &self.seqs[seq];
            if s.history.len() >= self.n_ctx {
                return Err(EngineError::PromptTooLong { n_prompt: 1, free: 0, n_ctx: self.n_ctx });
            }
            caches.push(s.kv);
            pos.push(s.history.len() as u32);
            tokens.push(tok);
        }
        self.check_tokens(&tokens)?;
        for &(seq, _) in steps {
            self.reset_if_empty(seq)?;
            // An armed rewind log takes the step's row if it has room, else it ends.
            let r = &mut self.seqs[seq].rec;
            if r.log_for(1).is_none() {
                r.stop_log();
            }
        }
        if let Some(w) = self.swa {
            for &(seq, _) in steps {
                let s = &mut self.seqs[seq];
                s.floor = w.advance(s.floor, s.history.len(), s.history.len()).map_err(EngineError::InvalidArg)?;
            }
        }
        let scratch = self.scratch.as_ref().expect("scratch lives as long as the engine");
        let states: Vec<&RecurrentState> = steps.iter().map(|&(seq, _)| &self.seqs[seq].rec).filter(|r| !r.is_empty()).collect();
        // One sequence: the single-sequence path (no per-row copies), bit-identical to `eval`.
        let kv = if n == 1 { KvRows::One(caches[0]) } else { KvRows::PerRow(&caches) };
        let res = self.model.forward(self.be.as_mut(), scratch, kv, &states, &tokens, &pos, OutputRows::All, on_row);
        if let Err(err) = res {
            // The stepped sequences' recurrent states may be half advanced: they start over.
            if !states.is_empty() {
                for &(seq, _) in steps {
                    self.seqs[seq].history.clear();
                    self.seqs[seq].rec.stop_log();
                }
            }
            return Err(err.into());
        }
        for &(seq, tok) in steps {
            let s = &mut self.seqs[seq];
            if s.rec.logged().is_some() {
                s.rec.logged_rows(1);
            }
            s.history.push(tok);
        }
        // The MTP block follows the target over the step's rows too.
        self.mtp_after_step(steps, &pos)?;
        Ok(())
    }
}

impl Drop for BatchEngine {
    fn drop(&mut self) {
        if let Some(s) = self.scratch.take() {
            let _ = s.free(self.be.as_mut());
        }
        if let Some(b) = self.mtp_bufs.take() {
            let _ = b.free(self.be.as_mut());
        }
        for b in self.mix.take().into_iter().flatten() {
            let _ = self.be.free(b);
        }
        for mut s in self.seqs.drain(..) {
            let _ = self.be.free_kv(s.kv);
            let _ = s.rec.free(self.be.as_mut());
            if let Some(m) = s.mtp.take() {
                let _ = m.free(self.be.as_mut());
            }
        }
    }
}
