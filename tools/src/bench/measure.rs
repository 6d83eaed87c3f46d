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

    /// One repetition; returns the timed nanoseconds. `n_override` shortens the test
    /// (for a warm-up).
    pub fn run_once(&mut self, t: &TestSpec, n_override: Option<usize>) -> Result<u64> {
        let n = n_override.unwrap_or(t.n);
        self.engine.clear();
        if t.depth > 0 {
            let d = self.random(t.depth);
            self.engine.eval(&d).with_context(|| format!("{}: prefill of the depth tokens", t.name()))?;
        }
        match t.kind {
            Kind::Prompt => {
                let p = self.random(n);
                let t0 = Instant::now();
                self.engine.eval(&p).with_context(|| format!("{}: prompt", t.name()))?;
                Ok(t0.elapsed().as_nanos() as u64)
            }
            Kind::Gen => {
                let mut tok = match self.bos {
                    Some(b) => b,
                    None => self.random(1)[0],
                };
                let t0 = Instant::now();
                for _ in 0..n {
                    self.engine.eval(&[tok]).with_context(|| format!("{}: decode step", t.name()))?;
                    tok = self.rng.gen_range(0..self.n_vocab);
                }
                Ok(t0.elapsed().as_nanos() as u64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(TestSpec { kind: Kind::Prompt, n: 512, depth: 0 }.name(), "pp512");
        assert_eq!(TestSpec { kind: Kind::Gen, n: 128, depth: 4096 }.name(), "tg128 @ d4096");
    }
}
