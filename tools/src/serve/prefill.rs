//! Chunked prefill on the engine thread: prompts wait in a first-come first-served
//! queue and the one at its head is fed a chunk at a time, inside the decode steps of
//! the other sequences where the engine mixes ([`BatchEngine::step_mixed`]), else
//! between them (a chunk, then a step, then a chunk: recurrent models). A decoding
//! stream then waits at most one chunk for a long prompt, not its whole prefill.
//!
//! The prefix cache applies when a prompt reaches the head of the queue, so a prompt
//! queued behind another that shares its start copies that start once it is evaluated.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::SyncSender;

use lode_runtime::engine::BatchEngine;

use super::batcher::{guarded, share_prefix};
use super::metrics::Metrics;

pub type EvalReply = SyncSender<Result<(Vec<f32>, usize), String>>;

/// A prompt waiting for, or in, its prefill.
pub struct Prefill {
    pub seq: usize,
    tokens: Vec<u32>,
    share: bool,
    reply: EvalReply,
    /// Once at the head: the sequence's cached tokens before the request (restored on
    /// error), the tokens copied from another sequence, and how many of `tokens` are in
    /// the cache. `None`: not started.
    started: Option<Started>,
}

struct Started {
    own: usize,
    shared: usize,
    done: usize,
    /// The sequence's cache length the next chunk follows (a panic elsewhere empties
    /// every sequence: the prompt then fails rather than continue at a wrong position).
    expect: usize,
}

/// The prompts waiting, in arrival order.
#[derive(Default)]
pub struct Prefills {
    queue: VecDeque<Prefill>,
}

/// The next chunk of the head prompt: its sequence, tokens, and whether it ends the prompt.
pub struct Chunk {
    pub seq: usize,
    pub tokens: Vec<u32>,
    pub last: bool,
}

impl Prefills {
    pub fn push(&mut self, seq: usize, tokens: Vec<u32>, share: bool, reply: EvalReply) {
        self.queue.push_back(Prefill { seq, tokens, share, reply, started: None });
    }
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }
    /// Whether `seq` has a prompt waiting or in prefill.
    pub fn holds(&self, seq: usize) -> bool {
        self.queue.iter().any(|p| p.seq == seq)
    }

    /// The head prompt's next chunk of at most `room` tokens (at least one), starting it
    /// first (the prefix cache's copy). A prompt whose copy leaves it one token is still
    /// one chunk. A one-token chunk is avoided before the last (a single row rounds its
    /// attention as a decode step does, not as the prompt's other rows).
    pub fn next_chunk(&mut self, e: &mut BatchEngine, m: &Metrics, room: usize) -> Option<Chunk> {
        loop {
            let p = self.queue.front_mut()?;
            if p.started.is_none() {
                let own = e.history(p.seq).len();
                let r = guarded(e, |e| {
                    // The embeddings sequence is emptied after each use: never a source.
                    let (rest, shared) = if p.share { share_prefix(e, p.seq, &p.tokens) } else { (std::mem::take(&mut p.tokens), 0) };
                    Ok((rest, shared))
                });
                match r {
                    Ok((rest, shared)) => {
                        m.shared_prompt_tokens.fetch_add(shared as u64, Relaxed);
                        p.tokens = rest;
                        p.started = Some(Started { own, shared, done: 0, expect: e.history(p.seq).len() });
                    }
                    Err(why) => {
                        let p = self.queue.pop_front().expect("the head");
                        let _ = p.reply.send(Err(why));
                        continue;
                    }
                }
            }
            let st = p.started.as_ref().expect("started above");
            if e.history(p.seq).len() != st.expect {
                let p = self.queue.pop_front().expect("the head");
                let _ = p.reply.send(Err("the engine forgot this prompt's cache while evaluating it (an internal error)".into()));
                continue;
            }
            let left = p.tokens.len() - st.done;
            let mut n = left.min(room.max(1));
            if left - n == 1 && n > 1 {
                n -= 1;
            }
            let tokens = p.tokens[st.done..st.done + n].to_vec();
            return Some(Chunk { seq: p.seq, last: n == left, tokens });
        }
    }

    /// The outcome of the head's chunk of `n` tokens: its last row's logits when it ended
    /// the prompt.
    pub fn chunk_done(&mut self, e: &mut BatchEngine, m: &Metrics, n: usize, r: Result<Option<Vec<f32>>, String>) {
        let Some(p) = self.queue.front_mut() else { return };
        let st = p.started.as_mut().expect("a chunk ran");
        m.prefill_chunks.fetch_add(1, Relaxed);
        match r {
            Ok(logits) => {
                st.done += n;
                st.expect += n;
                if let Some(l) = logits {
                    let p = self.queue.pop_front().expect("the head");
                    let shared = p.started.as_ref().map_or(0, |s| s.shared);
                    let _ = p.reply.send(Ok((l, shared)));
                }
            }
            Err(why) => {
                let p = self.queue.pop_front().expect("the head");
                // The handle's view: the tokens cached before the request.
                e.truncate(p.seq, p.started.as_ref().map_or(0, |s| s.own));
                let _ = p.reply.send(Err(why));
            }
        }
    }
}
