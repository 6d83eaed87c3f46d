//! `lode serve --model-draft`: one draft model for every slot. A draft thread owns the
//! draft's [`BatchEngine`] (one sequence per slot, its own KV caches, one copy of its
//! weights); each slot's [`DraftHandle`] is that slot's [`Drafter`]. Requests that are
//! waiting together are drafted together ([`draft_greedy`]: one batched draft step per
//! drafted position for all of them). Drafts are greedy (point masses), which the exact
//! acceptance rule takes for greedy and sampled requests alike.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;

use lode_runtime::engine::{catch_up, draft_greedy, BatchEngine, Draft, Drafter, EngineError};

use super::metrics::Metrics;

type Reply = SyncSender<Result<Vec<u32>, String>>;

enum Req {
    /// Catch up with a prompt (in the prompt's time).
    Begin { seq: usize, context: Vec<u32>, reply: Reply },
    /// Up to `max` tokens to follow `context`.
    Draft { seq: usize, context: Vec<u32>, max: usize, reply: Reply },
}

/// One slot's drafter: its sequence of the draft thread's engine.
pub struct DraftHandle {
    seq: usize,
    tx: Sender<Req>,
}

impl DraftHandle {
    fn ask(&self, req: impl FnOnce(Reply) -> Req) -> Result<Vec<u32>, EngineError> {
        let (reply, rx) = mpsc::sync_channel(1);
        let gone = || EngineError::InvalidArg("the draft model's thread has stopped".into());
        self.tx.send(req(reply)).map_err(|_| gone())?;
        rx.recv().map_err(|_| gone())?.map_err(|e| EngineError::InvalidArg(format!("draft model: {e}")))
    }
}

impl Drafter for DraftHandle {
    fn name(&self) -> &'static str {
        "draft-model"
    }

    fn begin(&mut self, context: &[u32]) -> Result<(), EngineError> {
        let (seq, context) = (self.seq, context.to_vec());
        self.ask(|reply| Req::Begin { seq, context, reply }).map(drop)
    }

    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        let (seq, context) = (self.seq, context.to_vec());
        out.tokens.extend(self.ask(|reply| Req::Draft { seq, context, max, reply })?);
        Ok(())
    }
}

/// Starts the draft thread over `engine` (one sequence per slot); returns a handle per
/// sequence.
pub fn start(engine: BatchEngine, p_min: f32, metrics: Arc<Metrics>) -> std::io::Result<Vec<DraftHandle>> {
    let (tx, rx) = mpsc::channel();
    let handles = (0..engine.n_seq()).map(|seq| DraftHandle { seq, tx: tx.clone() }).collect();
    std::thread::Builder::new().name("lode-draft".into()).spawn(move || draft_thread(engine, rx, p_min, &metrics))?;
    Ok(handles)
}

fn draft_thread(mut e: BatchEngine, rx: Receiver<Req>, p_min: f32, m: &Metrics) {
    while let Ok(first) = rx.recv() {
        // Whatever else is waiting is drafted together with it.
        let mut waiting = vec![first];
        waiting.extend(rx.try_iter());
        let mut drafts = Vec::new();
        for req in waiting {
            match req {
                Req::Begin { seq, context, reply } => {
                    let r = if context.is_empty() || context.len() > e.n_ctx() { Ok(()) } else { catch_up(&mut e, seq, &context).map(drop) };
                    if r.is_err() {
                        e.truncate(seq, 0);
                    }
                    let _ = reply.send(r.map(|_| Vec::new()).map_err(|err| err.to_string()));
                }
                Req::Draft { seq, context, max, reply } => drafts.push((seq, context, max, reply)),
            }
        }
        if drafts.is_empty() {
            continue;
        }
        let reqs: Vec<(usize, &[u32], usize)> = drafts.iter().map(|(s, c, k, _)| (*s, &c[..], *k)).collect();
        m.draft_batches.fetch_add(1, Relaxed);
        m.draft_requests.fetch_add(reqs.len() as u64, Relaxed);
        match draft_greedy(&mut e, &reqs, p_min) {
            Ok(out) => drafts.into_iter().zip(out).for_each(|((.., reply), t)| drop(reply.send(Ok(t)))),
            Err(err) => {
                // The drafted sequences' caches are unknown: they start over.
                let why = err.to_string();
                for (seq, .., reply) in drafts {
                    e.truncate(seq, 0);
                    let _ = reply.send(Err(why.clone()));
                }
            }
        }
    }
}
