//! Slots and the queue in front of them.
//!
//! Each slot is a dedicated OS thread owning a [`SlotRunner`] (in the server: an
//! `Engine` with its own KV cache over the one shared model). Requests wait in one
//! FIFO queue; the oldest goes to a free slot as soon as there is one. Compute is
//! blocking, so it never runs on the async runtime; results travel back over an
//! unbounded channel per request.
//!
//! Which free slot ([`pick_slot`]): an idle slot keeps its last request's tokens in its
//! cache (the prefix cache lives in the slots' own KV, no memory besides), so the choice
//! decides which cache a request reuses and which it evicts. The free slot whose cache
//! shares the longest start with the prompt takes it when that start is at least
//! `--slot-prompt-similarity` of the prompt (llama-server's rule); otherwise the least
//! recently used free slot does (an empty one first), evicting the oldest cache. Either
//! way the engine thread then copies a longer cached start from any other sequence
//! (`batcher::share_prefix`).
//!
//! Cancellation: a request's receiver is dropped when its client goes away (axum drops
//! the handler future or the SSE body). A queued request whose receiver is gone is
//! skipped; a running one sees the closed channel at its next token and stops, freeing
//! the slot. A panic inside a runner is caught, reported to that request as a 500, and
//! the slot is reset and keeps serving.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use lode_runtime::engine::SamplerParams;
use tokio::sync::mpsc;

use super::api::{Timings, Usage};
use super::errors::ApiError;
use super::logprobs::TokenLogprob;
use super::metrics::Metrics;

/// One generation request, tokenized and validated.
pub struct Job {
    pub prompt: Vec<u32>,
    pub sampling: SamplerParams,
    /// At least 1; already capped so prompt + completion fit the context.
    pub max_tokens: usize,
    pub stops: Vec<String>,
    /// `Some(k)`: report each token's log-probability and its `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// The compiled grammar the output must match (each choice its own copy).
    pub grammar: Option<llguidance::Matcher>,
    /// Render special tokens as their text (gpt-oss's harmony markers, which the
    /// answer's parser reads).
    pub special: bool,
    pub events: mpsc::UnboundedSender<Event>,
    pub enqueued: Instant,
    /// Reuse cached prompt prefixes (the request's `cache_prompt`, off with
    /// `--no-cache-prompt`): the slot's own and other sequences'.
    pub cache_prompt: bool,
}

/// A piece of generated text and the log-probabilities of the tokens it came from
/// (empty unless the job asked for them; text may lag its tokens: stop strings and
/// incomplete UTF-8 hold it back).
#[derive(Debug, Default, Clone)]
pub struct Piece {
    pub text: String,
    pub logprobs: Vec<TokenLogprob>,
}

impl Piece {
    pub fn text(text: String) -> Piece {
        Piece { text, logprobs: Vec::new() }
    }
}

/// What a request hears from its slot, in order: `Started`, any `Text`, then `Done`
/// or `Error`.
#[derive(Debug)]
pub enum Event {
    Started { slot: usize, queued_ms: f64 },
    Text(Piece),
    Done(Finish),
    Error(ApiError),
}

/// How a generation ended.
#[derive(Clone, Debug)]
pub struct Finish {
    /// OpenAI's `stop` / `length`, or `cancelled` (the client left; nobody reads it).
    pub finish_reason: &'static str,
    pub usage: Usage,
    pub timings: Timings,
}

/// Runs one job on a slot's engine.
pub trait SlotRunner: Send {
    /// Generates for `job`, handing each piece of text (possibly empty) to `emit`, which
    /// returns `false` when the client is gone and generation should stop.
    fn run(&mut self, job: &Job, emit: &mut dyn FnMut(Piece) -> bool) -> Result<Finish, ApiError>;
    /// Forget all state (after a panic left it unknown).
    fn reset(&mut self);
    /// The tokens the runner's cache holds (what a next prompt could reuse).
    fn cached(&self) -> &[u32] {
        &[]
    }
}

/// What the scheduler knows of a slot.
#[derive(Default)]
pub struct SlotView {
    /// Generating, or handed a job it has not finished.
    pub busy: bool,
    /// The tokens its cache held when its last request ended.
    pub cached: Vec<u32>,
    /// When its last request ended (a tick of [`Queue::clock`]; 0: never used).
    pub last_used: u64,
}

struct Queue {
    jobs: VecDeque<Job>,
    slots: Vec<SlotView>,
    /// Each slot's next job, handed over by [`assign`].
    inbox: Vec<Option<Job>>,
    clock: u64,
}

struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
    metrics: Arc<Metrics>,
    similarity: f32,
}

/// The free slot for `prompt` (see the module's doc), or `None` when every slot is busy.
/// `similarity` is the share of the prompt a slot's cached start must cover to be
/// chosen for it (0: least recently used only). `cache_prompt: false` takes the least
/// recently used slot.
pub fn pick_slot(slots: &[SlotView], prompt: &[u32], similarity: f32, cache_prompt: bool) -> Option<usize> {
    let free = || slots.iter().enumerate().filter(|(_, s)| !s.busy);
    let common = |s: &SlotView| s.cached.iter().zip(prompt).take_while(|(a, b)| a == b).count();
    if cache_prompt && similarity > 0.0 {
        // Longest common start; among equals the least recently used.
        let best = free().map(|(i, s)| (common(s), std::cmp::Reverse(s.last_used), i)).max();
        if let Some((n, _, i)) = best {
            if n > 0 && n as f32 >= similarity * prompt.len() as f32 {
                return Some(i);
            }
        }
    }
    free().min_by_key(|(i, s)| (!s.cached.is_empty(), s.last_used, *i)).map(|(i, _)| i)
}

/// Hands queued jobs to free slots, oldest job first, until one runs out.
fn assign(q: &mut Queue, similarity: f32) -> bool {
    let mut handed = false;
    while let Some(job) = q.jobs.front() {
        let Some(slot) = pick_slot(&q.slots, &job.prompt, similarity, job.cache_prompt) else { break };
        let job = q.jobs.pop_front().expect("a front job");
        q.slots[slot].busy = true;
        q.inbox[slot] = Some(job);
        handed = true;
    }
    handed
}

/// The queue and its slot threads.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// Starts one thread per runner; `similarity` is `--slot-prompt-similarity`.
    pub fn start(runners: Vec<Box<dyn SlotRunner>>, metrics: Arc<Metrics>, similarity: f32) -> std::io::Result<Scheduler> {
        let n = runners.len();
        let queue = Queue {
            jobs: VecDeque::new(),
            slots: (0..n).map(|_| SlotView::default()).collect(),
            inbox: (0..n).map(|_| None).collect(),
            clock: 0,
        };
        let shared = Arc::new(Shared { queue: Mutex::new(queue), ready: Condvar::new(), metrics, similarity });
        for (slot, runner) in runners.into_iter().enumerate() {
            let sh = shared.clone();
            std::thread::Builder::new().name(format!("lode-slot-{slot}")).spawn(move || worker(slot, runner, sh))?;
        }
        Ok(Scheduler { shared })
    }

    /// Queues a job behind the ones already waiting.
    pub fn submit(&self, job: Job) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.jobs.push_back(job);
        let handed = assign(&mut q, self.shared.similarity);
        self.shared.metrics.queue_depth.store(q.jobs.len(), Relaxed);
        drop(q);
        if handed {
            self.shared.ready.notify_all();
        }
    }
}

/// The text a caught panic carries (`panic!` with a literal or a formatted message).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Waits for the job [`assign`] hands `slot`.
fn next_job(sh: &Shared, slot: usize) -> Job {
    let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(job) = q.inbox[slot].take() {
            return job;
        }
        q = sh.ready.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

/// `slot` is free again, its cache holding `cached`: it may take the next queued job.
fn release(sh: &Shared, slot: usize, cached: &[u32]) {
    let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
    q.clock += 1;
    let now = q.clock;
    let view = &mut q.slots[slot];
    view.busy = false;
    view.last_used = now;
    view.cached.clear();
    view.cached.extend_from_slice(cached);
    let handed = assign(&mut q, sh.similarity);
    sh.metrics.queue_depth.store(q.jobs.len(), Relaxed);
    drop(q);
    if handed {
        sh.ready.notify_all();
    }
}

fn worker(slot: usize, mut runner: Box<dyn SlotRunner>, sh: Arc<Shared>) {
    let m = &sh.metrics;
    loop {
        let job = next_job(&sh, slot);
        if job.events.is_closed() {
            // The client left while queued.
            m.cancelled.fetch_add(1, Relaxed);
            release(&sh, slot, runner.cached());
            continue;
        }
        let queued_ms = job.enqueued.elapsed().as_secs_f64() * 1e3;
        let _ = job.events.send(Event::Started { slot, queued_ms });
        m.active_slots.fetch_add(1, Relaxed);
        m.set_busy(slot, true);
        let events = job.events.clone();
        let mut emit = |piece: Piece| {
            m.token();
            if piece.text.is_empty() && piece.logprobs.is_empty() {
                !events.is_closed()
            } else {
                events.send(Event::Text(piece)).is_ok()
            }
        };
        let result = catch_unwind(AssertUnwindSafe(|| runner.run(&job, &mut emit)));
        m.active_slots.fetch_sub(1, Relaxed);
        m.set_busy(slot, false);
        let event = match result {
            Ok(Ok(fin)) => {
                let t = &fin.timings;
                m.prompt_tokens.fetch_add(t.prompt_n as u64, Relaxed);
                m.cached_prompt_tokens.fetch_add(t.cache_n as u64, Relaxed);
                if job.cache_prompt {
                    m.prompt_cache_lookups.fetch_add(1, Relaxed);
                    m.prompt_cache_hits.fetch_add(u64::from(t.cache_n > 0), Relaxed);
                }
                m.generated_tokens.fetch_add(fin.usage.completion_tokens as u64, Relaxed);
                m.prompt_us.fetch_add((t.prompt_ms * 1e3) as u64, Relaxed);
                m.decode_us.fetch_add((t.predicted_ms * 1e3) as u64, Relaxed);
                if fin.finish_reason == "cancelled" {
                    m.cancelled.fetch_add(1, Relaxed);
                }
                Event::Done(fin)
            }
            Ok(Err(e)) => Event::Error(e),
            Err(panic) => {
                m.worker_panics.fetch_add(1, Relaxed);
                let what = panic_message(panic.as_ref());
                tracing::error!("slot {slot}: generation panicked: {what}; resetting the slot");
                if catch_unwind(AssertUnwindSafe(|| runner.reset())).is_err() {
                    tracing::error!("slot {slot}: reset panicked too");
                }
                Event::Error(ApiError::internal(format!("internal error in slot {slot}: {what}")))
            }
        };
        // Free before the answer's end reaches the client, so its next request can land
        // on this slot's cache.
        release(&sh, slot, runner.cached());
        let _ = job.events.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Emits the prompt's ids as text, one per step; prompt `[666]` panics; a prompt
    /// starting with 7 runs until cancelled.
    struct Fake;

    impl SlotRunner for Fake {
        fn run(&mut self, job: &Job, emit: &mut dyn FnMut(Piece) -> bool) -> Result<Finish, ApiError> {
            if job.prompt == [666] {
                panic!("boom");
            }
            let mut n = 0;
            loop {
                let t = job.prompt.get(n).map_or(String::new(), |t| t.to_string());
                if !emit(Piece::text(t)) {
                    return Ok(Finish { finish_reason: "cancelled", usage: Usage::default(), timings: Timings::default() });
                }
                n += 1;
                if n == job.prompt.len() && job.prompt[0] != 7 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            Ok(Finish { finish_reason: "stop", usage: Usage::default(), timings: Timings::default() })
        }
        fn reset(&mut self) {}
    }

    fn job(prompt: Vec<u32>) -> (Job, mpsc::UnboundedReceiver<Event>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let j = Job {
            prompt,
            sampling: SamplerParams::greedy(),
            max_tokens: 1,
            stops: vec![],
            logprobs: None,
            grammar: None,
            special: false,
            events: tx,
            enqueued: Instant::now(),
            cache_prompt: true,
        };
        (j, rx)
    }

    fn collect(mut rx: mpsc::UnboundedReceiver<Event>) -> (String, Option<Event>) {
        let mut text = String::new();
        while let Some(ev) = rx.blocking_recv() {
            match ev {
                Event::Started { .. } => {}
                Event::Text(t) => text.push_str(&t.text),
                end => return (text, Some(end)),
            }
        }
        (text, None)
    }

    #[test]
    fn panic_is_a_500_and_the_slot_keeps_serving() {
        let m = Arc::new(Metrics::new(1));
        let s = Scheduler::start(vec![Box::new(Fake)], m.clone(), 0.1).unwrap();
        let (j, rx) = job(vec![666]);
        s.submit(j);
        match collect(rx).1 {
            Some(Event::Error(e)) => assert_eq!(e.status, 500, "{e}"),
            other => panic!("expected an error, got {other:?}"),
        }
        let (j, rx) = job(vec![1, 2, 3]);
        s.submit(j);
        let (text, end) = collect(rx);
        assert_eq!(text, "123");
        assert!(matches!(end, Some(Event::Done(f)) if f.finish_reason == "stop"));
        assert_eq!(m.worker_panics.load(Relaxed), 1);
    }

    #[test]
    fn dropped_receiver_frees_the_slot_and_the_queue_is_fifo() {
        let m = Arc::new(Metrics::new(1));
        let s = Scheduler::start(vec![Box::new(Fake)], m.clone(), 0.1).unwrap();
        // An endless job; the next ones queue behind it in order.
        let (endless, mut rx_endless) = job(vec![7, 7]);
        s.submit(endless);
        assert!(matches!(rx_endless.blocking_recv(), Some(Event::Started { .. })));
        let (a, rx_a) = job(vec![4]);
        let (b, rx_b) = job(vec![5]);
        let (gone, rx_gone) = job(vec![6]);
        s.submit(a);
        s.submit(gone);
        s.submit(b);
        drop(rx_gone);
        assert_eq!(m.queue_depth.load(Relaxed), 3);
        drop(rx_endless); // the client disconnects mid-stream
        let (ta, _) = collect(rx_a);
        let (tb, _) = collect(rx_b);
        assert_eq!((ta.as_str(), tb.as_str()), ("4", "5"));
        // The endless job and the queued one whose client left.
        assert_eq!(m.cancelled.load(Relaxed), 2);
        assert_eq!(m.queue_depth.load(Relaxed), 0);
    }

    /// The slot choice: the longest cached start when it covers enough of the prompt
    /// (ties: the older), else the least recently used free slot (an empty one first);
    /// busy slots never; `cache_prompt: false` and similarity 0 go by age alone.
    #[test]
    fn slots_are_picked_by_cached_prefix_then_least_recently_used() {
        let view = |busy, cached: &[u32], last_used| SlotView { busy, cached: cached.to_vec(), last_used };
        let sys = [1, 2, 3, 4, 5, 6, 7, 8];
        let prompt = [1, 2, 3, 4, 5, 6, 7, 8, 20, 21];
        let slots = vec![
            view(false, &[9, 9, 9], 1),
            view(false, &[1, 2, 3, 4, 5, 6, 7, 8, 30, 31, 32], 5),
            view(false, &[1, 2, 3, 4, 5, 6, 7, 8, 40], 3),
            view(true, &prompt, 9),
        ];
        // Slots 1 and 2 share 8 of 10 tokens; 2 is older.
        assert_eq!(pick_slot(&slots, &prompt, 0.1, true), Some(2));
        // 8 of 10 is below a 0.9 similarity: the least recently used, slot 0.
        assert_eq!(pick_slot(&slots, &prompt, 0.9, true), Some(0));
        assert_eq!(pick_slot(&slots, &prompt, 0.0, true), Some(0));
        assert_eq!(pick_slot(&slots, &prompt, 0.1, false), Some(0));
        // An empty slot goes before any cache is evicted.
        let mut with_empty: Vec<SlotView> = slots.iter().map(|v| view(v.busy, &v.cached, v.last_used)).collect();
        with_empty.push(view(false, &[], 0));
        assert_eq!(pick_slot(&with_empty, &[50, 51], 0.1, true), Some(4));
        assert_eq!(pick_slot(&with_empty, &sys, 0.1, true), Some(2));
        // Every slot busy: none.
        let busy: Vec<SlotView> = (0..3).map(|_| view(true, &[], 0)).collect();
        assert_eq!(pick_slot(&busy, &prompt, 0.1, true), None);
    }

    /// A queued job goes to the slot that holds its prompt's start when that slot frees,
    /// not to whichever thread wakes first.
    #[test]
    fn a_job_lands_on_the_slot_caching_its_prompt() {
        struct Echo(Vec<u32>);
        impl SlotRunner for Echo {
            fn run(&mut self, job: &Job, _emit: &mut dyn FnMut(Piece) -> bool) -> Result<Finish, ApiError> {
                self.0 = job.prompt.clone();
                Ok(Finish { finish_reason: "stop", usage: Usage::default(), timings: Timings::default() })
            }
            fn reset(&mut self) {}
            fn cached(&self) -> &[u32] {
                &self.0
            }
        }
        let m = Arc::new(Metrics::new(3));
        let runners: Vec<Box<dyn SlotRunner>> = (0..3).map(|_| Box::new(Echo(Vec::new())) as Box<dyn SlotRunner>).collect();
        let s = Scheduler::start(runners, m, 0.1).unwrap();
        let slot_of = |prompt: Vec<u32>| {
            let (j, mut rx) = job(prompt);
            s.submit(j);
            let Some(Event::Started { slot, .. }) = rx.blocking_recv() else { panic!("not started") };
            while rx.blocking_recv().is_some() {}
            slot
        };
        let a = slot_of(vec![1, 2, 3, 4]);
        let b = slot_of(vec![5, 6, 7, 8]);
        let c = slot_of(vec![9, 10]);
        assert!(a != b && b != c && a != c, "empty slots first: {a} {b} {c}");
        for _ in 0..3 {
            assert_eq!(slot_of(vec![5, 6, 7, 9]), b);
            assert_eq!(slot_of(vec![1, 2, 3, 4, 5]), a);
        }
        // Nothing in common: the least recently used (c's slot) is evicted.
        assert_eq!(slot_of(vec![40, 41]), c);
    }
}
