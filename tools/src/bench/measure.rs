//! Timing one test in process, the way llama-bench does: random token ids, KV cache
//! cleared before every repetition, an untimed prefill of `depth` tokens first, then
//! the timed prompt (`ppN`: one batched evaluation of N tokens) or generation (`tgN`:
//! N single-token steps, each fed a random token). `tgN xS` times N steps of S sequences
//! decoding together (continuous batching): S × N tokens per sample.

use std::time::Instant;

use anyhow::{Context, Result};
use lode_runtime::engine::BatchEngine;
use lode_runtime::model::OutputRows;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// What one row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Prompt,
    Gen,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    pub kind: Kind,
    /// Tokens timed (prompt length or generated tokens).
    pub n: usize,
    /// Tokens already in the cache, untimed.
    pub depth: usize,
    /// Sequences decoding together (generation rows; 1 otherwise).
    pub seqs: usize,
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `tg128 @ d4096`.
    pub fn name(&self) -> String {
        let base = match self.kind {
            Kind::Prompt => format!("pp{}", self.n),
            Kind::Gen if self.seqs > 1 => format!("tg{} x{}", self.n, self.seqs),
            Kind::Gen => format!("tg{}", self.n),
        };
        if self.depth > 0 {
            format!("{base} @ d{}", self.depth)
        } else {
            base
        }
    }
    /// KV slots this test needs.
    pub fn ctx_needed(&self) -> usize {
        self.depth + self.n + 1
    }
    /// Tokens one sample produces.
    pub fn tokens(&self) -> usize {
        self.n * self.seqs.max(1)
    }
}

/// One timed repetition.
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    pub wall_ns: u64,
    /// CPU time of the whole process (all threads) over the same span, when
    /// `/proc/self/stat` is readable. On a shared machine `cpu / (wall × threads)` says
    /// how much of its threads' time the run actually got.
    pub cpu_ns: Option<u64>,
}

struct Clock {
    t0: Instant,
    cpu0: Option<u64>,
}

impl Clock {
    fn start() -> Clock {
        Clock { cpu0: process_cpu_ns(), t0: Instant::now() }
    }
    fn stop(self) -> Sample {
        let wall_ns = self.t0.elapsed().as_nanos() as u64;
        let cpu_ns = match (self.cpu0, process_cpu_ns()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a)),
            _ => None,
        };
        Sample { wall_ns, cpu_ns }
    }
}

/// User + system time of this process from `/proc/self/stat` (Linux; clock ticks of
/// 10 ms, the kernel's USER_HZ of 100 on every mainstream architecture).
pub fn process_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 10_000_000)
}

/// Runs tests on one engine (sequence 0; all of them for `xS` rows) with a seeded
/// source of random token ids.
pub struct Runner<'e> {
    pub engine: &'e mut BatchEngine,
    rng: StdRng,
    n_vocab: u32,
    /// BOS to start generation with (llama-bench starts with BOS when the model adds it).
    bos: Option<u32>,
}

impl<'e> Runner<'e> {
    pub fn new(engine: &'e mut BatchEngine, seed: u64, bos: Option<u32>) -> Runner<'e> {
        let n_vocab = engine.model().cfg.n_vocab as u32;
        Runner { engine, rng: StdRng::seed_from_u64(seed), n_vocab, bos }
    }

    fn random(&mut self, n: usize) -> Vec<u32> {
        (0..n).map(|_| self.rng.gen_range(0..self.n_vocab)).collect()
    }

    /// One repetition; returns the timed wall and process-CPU nanoseconds. `n_override`
    /// shortens the test (for a warm-up).
    pub fn run_once(&mut self, t: &TestSpec, n_override: Option<usize>) -> Result<Sample> {
        let n = n_override.unwrap_or(t.n);
        let seqs = t.seqs.max(1);
        if seqs > self.engine.n_seq() {
            anyhow::bail!("{}: {seqs} sequences, the engine has {}", t.name(), self.engine.n_seq());
        }
        for s in 0..seqs {
            self.engine.truncate(s, 0);
            if t.depth > 0 {
                let d = self.random(t.depth);
                self.engine
                    .eval_rows(s, &d, OutputRows::None, &mut |_, _| {})
                    .with_context(|| format!("{}: prefill of the depth tokens", t.name()))?;
            }
        }
        match t.kind {
            Kind::Prompt => {
                let p = self.random(n);
                let clock = Clock::start();
                self.engine.eval_rows(0, &p, OutputRows::Last, &mut |_, _| {}).with_context(|| format!("{}: prompt", t.name()))?;
                Ok(clock.stop())
            }
            Kind::Gen => {
                let first = match self.bos {
                    Some(b) => b,
                    None => self.random(1)[0],
                };
                let mut steps: Vec<(usize, u32)> = (0..seqs).map(|s| (s, first)).collect();
                let clock = Clock::start();
                for _ in 0..n {
                    if seqs == 1 {
                        self.engine
                            .eval_rows(0, &[steps[0].1], OutputRows::Last, &mut |_, _| {})
                            .with_context(|| format!("{}: decode step", t.name()))?;
                    } else {
                        // The logits are read (as llama-batched-bench reads them) and lent, not kept.
                        self.engine.step_with(&steps, &mut |_, _| {}).with_context(|| format!("{}: decode step", t.name()))?;
                    }
                    for s in steps.iter_mut() {
                        s.1 = self.rng.gen_range(0..self.n_vocab);
                    }
                }
                Ok(clock.stop())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read() {
        if std::path::Path::new("/proc/self/stat").exists() {
            let a = process_cpu_ns().expect("parse /proc/self/stat");
            let mut x = 0u64;
            for i in 0..50_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(i);
            }
            std::hint::black_box(x);
            assert!(process_cpu_ns().unwrap() >= a);
        }
    }

    #[test]
    fn names() {
        assert_eq!(TestSpec { kind: Kind::Prompt, n: 512, depth: 0, seqs: 1 }.name(), "pp512");
        assert_eq!(TestSpec { kind: Kind::Gen, n: 128, depth: 4096, seqs: 1 }.name(), "tg128 @ d4096");
        assert_eq!(TestSpec { kind: Kind::Gen, n: 128, depth: 0, seqs: 8 }.name(), "tg128 x8");
    }
}
