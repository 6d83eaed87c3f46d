//! Timing one test in process, the way llama-bench does: random token ids, KV cache
//! cleared before every repetition, an untimed prefill of `depth` tokens first, then
//! the timed prompt (`ppN`: one batched evaluation of N tokens) or generation (`tgN`:
//! N single-token steps, each fed a random token).

use std::time::Instant;

use anyhow::{Context, Result};
use lode_runtime::engine::Engine;
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
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `tg128 @ d4096`.
    pub fn name(&self) -> String {
        let base = match self.kind {
            Kind::Prompt => format!("pp{}", self.n),
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
        self.depth + self.n
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

/// Runs tests on one engine with a seeded source of random token ids.
pub struct Runner<'e> {
    pub engine: &'e mut Engine,
    rng: StdRng,
    n_vocab: u32,
    /// BOS to start generation with (llama-bench starts with BOS when the model adds it).
    bos: Option<u32>,
}

impl<'e> Runner<'e> {
    pub fn new(engine: &'e mut Engine, seed: u64, bos: Option<u32>) -> Runner<'e> {
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
        self.engine.clear();
        if t.depth > 0 {
            let d = self.random(t.depth);
            self.engine.eval(&d).with_context(|| format!("{}: prefill of the depth tokens", t.name()))?;
        }
        match t.kind {
            Kind::Prompt => {
                let p = self.random(n);
                let clock = Clock::start();
                self.engine.eval(&p).with_context(|| format!("{}: prompt", t.name()))?;
                Ok(clock.stop())
            }
            Kind::Gen => {
                let mut tok = match self.bos {
                    Some(b) => b,
                    None => self.random(1)[0],
                };
                let clock = Clock::start();
                for _ in 0..n {
                    self.engine.eval(&[tok]).with_context(|| format!("{}: decode step", t.name()))?;
                    tok = self.rng.gen_range(0..self.n_vocab);
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
        assert_eq!(TestSpec { kind: Kind::Prompt, n: 512, depth: 0 }.name(), "pp512");
        assert_eq!(TestSpec { kind: Kind::Gen, n: 128, depth: 4096 }.name(), "tg128 @ d4096");
    }
}
