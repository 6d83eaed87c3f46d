//! Slots and the queue in front of them.
//!
//! Each slot is a dedicated OS thread owning a [`SlotRunner`] (in the server: an
//! `Engine` with its own KV cache over the one shared model). Requests wait in one
//! FIFO queue; a free slot takes the oldest. Compute is blocking, so it never runs on
//! the async runtime; results travel back over an unbounded channel per request.
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
}

struct Shared {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
    metrics: Arc<Metrics>,
}

/// The queue and its slot threads.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// Starts one thread per runner.
    pub fn start(runners: Vec<Box<dyn SlotRunner>>, metrics: Arc<Metrics>) -> std::io::Result<Scheduler> {
        let shared = Arc::new(Shared { queue: Mutex::new(VecDeque::new()), ready: Condvar::new(), metrics });
        for (slot, runner) in runners.into_iter().enumerate() {
            let sh = shared.clone();
            std::thread::Builder::new().name(format!("lode-slot-{slot}")).spawn(move || worker(slot, runner, sh))?;
        }
        Ok(Scheduler { shared })
    }

    /// Queues a job behind the ones already waiting.
    pub fn submit(&self, job: Job) {
        let mut q = self.shared.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.push_back(job);
        self.shared.metrics.queue_depth.store(q.len(), Relaxed);
        drop(q);
        self.shared.ready.notify_one();
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

fn next_job(sh: &Shared) -> Job {
    let mut q = sh.queue.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if let Some(job) = q.pop_front() {
            sh.metrics.queue_depth.store(q.len(), Relaxed);
            return job;
        }
        q = sh.ready.wait(q).unwrap_or_else(|e| e.into_inner());
    }
}

fn worker(slot: usize, mut runner: Box<dyn SlotRunner>, sh: Arc<Shared>) {
    let m = &sh.metrics;
    loop {
        let job = next_job(&sh);
        if job.events.is_closed() {
            // The client left while queued.
            m.cancelled.fetch_add(1, Relaxed);
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
        let s = Scheduler::start(vec![Box::new(Fake)], m.clone()).unwrap();
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
        let s = Scheduler::start(vec![Box::new(Fake)], m.clone()).unwrap();
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
}
