//! Speculative rows of `lode bench`: greedy generation of N tokens from a fixed passage
//! (a short program and the request to rewrite it, so prompt lookup has something to
//! find), timed plain (`tgN greedy`) and with each drafter (`tgN spec ngram-simple
//! k16`, `tgN spec draft-model k16`, `tgN spec oracle k16`). The oracle drafts the plain
//! run's own continuation, so every draft is accepted: the ceiling of verifying `k`
//! tokens per pass on this device. t/s counts the tokens after the first over the
//! generation time (drafting included), as `lode generate` reports it; the prompt is
//! not timed. Rows at depth 0 and one sequence only.

use anyhow::{Context, Result};
use lode_runtime::engine::{
    generate, generate_speculative, BatchEngine, BatchSequence, Draft, Drafter, EngineError, Flow, GenParams, Sampler,
    SamplerParams,
};
use lode_runtime::tokenizer::Tokenizer;

use super::measure::{Kind, TestSpec};
use super::report::{ModelInfo, Row};
use super::Args;
use crate::common::ModelArgs;

const PASSAGE: &str = "Here is a Python function:\n\n\
def mean_and_spread(values):\n    total = 0\n    for v in values:\n        total += v\n    mean = total / len(values)\n    \
spread = 0\n    for v in values:\n        spread += (v - mean) ** 2\n    spread = (spread / len(values)) ** 0.5\n    \
return mean, spread\n\nRewrite it with the same names, adding a docstring and type hints:\n\n\
def mean_and_spread(values";

/// Prompt tokens the passage takes at most (its token count on any tokenizer is far below).
const PASSAGE_TOKENS_MAX: usize = 256;

pub fn wanted(args: &Args) -> bool {
    args.spec.enabled() || args.spec_oracle
}

/// KV slots the speculative rows need.
pub fn ctx_needed(args: &Args) -> usize {
    let n = args.n_gen.iter().copied().max().unwrap_or(0);
    PASSAGE_TOKENS_MAX + n + args.spec.draft_max + 2
}

/// What the rows share with the plain ones.
pub struct Ctx<'a> {
    pub args: &'a Args,
    pub margs: &'a ModelArgs,
    pub tok: &'a Tokenizer,
    pub bos: Option<u32>,
    pub info: &'a ModelInfo,
    pub backend: &'a str,
    pub threads: usize,
}

/// Drafts the known continuation.
struct Oracle {
    reference: Vec<u32>,
}

impl Drafter for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Draft) -> Result<(), EngineError> {
        if self.reference.starts_with(context) {
            let end = (context.len() + max).min(self.reference.len());
            out.tokens.extend_from_slice(&self.reference[context.len()..end]);
        }
        Ok(())
    }
}

/// One timed run: (generation seconds, tokens generated, accepted, drafted).
type Run = (f64, usize, usize, usize);

fn run_once(engine: &mut BatchEngine, prompt: &[u32], n: usize, drafter: Option<&mut (dyn Drafter + 'static)>, k: &super::Args) -> Result<(Run, Vec<u32>)> {
    engine.truncate(0, 0);
    // Only a run that drafts with the model's MTP block evaluates it.
    engine.set_mtp(drafter.as_ref().is_some_and(|d| d.name() == "mtp"));
    let mut seq = BatchSequence { engine, seq: 0 };
    let params = GenParams { max_tokens: n, eog: vec![] };
    let mut sampler = Sampler::new(SamplerParams::greedy());
    let (out, acc, drafted) = match drafter {
        None => (generate(&mut seq, prompt, &params, &mut sampler, &mut |_| Flow::Continue)?, 0, 0),
        Some(d) => {
            let r = generate_speculative(&mut seq, d, &k.spec.params(), prompt, &params, &mut sampler, &mut |_| Flow::Continue)?;
            (r.out, r.stats.accepted, r.stats.drafted)
        }
    };
    let run = (out.gen_secs, out.tokens.len(), acc, drafted);
    Ok((run, out.tokens))
}

/// The plain and speculative rows for every one-sequence generation test at depth 0.
pub fn measure(c: &Ctx, engine: &mut BatchEngine, tests: &[TestSpec]) -> Result<Vec<Row>> {
    let args = c.args;
    let mut prompt: Vec<u32> = c.bos.into_iter().collect();
    prompt.extend(c.tok.encode(PASSAGE, false, false));
    prompt.truncate(PASSAGE_TOKENS_MAX);
    let greedy = SamplerParams::greedy();
    let mut drafter = args.spec.drafter(c.margs, engine.model(), engine.n_ctx(), &greedy)?;
    let k = args.spec.draft_max;
    let mut rows = Vec::new();
    for t in tests.iter().filter(|t| t.kind == Kind::Gen && t.seqs == 1 && t.depth == 0 && t.n > 1) {
        let (_, reference) = run_once(engine, &prompt, t.n, None, args).context("speculative rows: plain greedy run")?;
        let full: Vec<u32> = prompt.iter().chain(&reference).copied().collect();
        let mut oracle = Oracle { reference: full };
        let mut variants: Vec<(String, Option<&mut (dyn Drafter + 'static)>)> = vec![(format!("tg{} greedy", t.n), None)];
        if let Some(d) = drafter.as_deref_mut() {
            variants.push((format!("tg{} spec {} k{k}", t.n, d.name()), Some(d)));
        }
        if args.spec_oracle {
            variants.push((format!("tg{} spec oracle k{k}", t.n), Some(&mut oracle)));
        }
        for (name, mut d) in variants {
            let has_drafter = d.is_some();
            if !args.no_warmup {
                run_once(engine, &prompt, t.n.min(8), d.as_deref_mut(), args)?;
            }
            let (mut wall, mut acc, mut drafted) = (Vec::new(), 0, 0);
            for _ in 0..args.repetitions {
                let ((secs, n_out, a, dr), _) = run_once(engine, &prompt, t.n, d.as_deref_mut(), args)?;
                // Every row generates all N tokens (no end-of-generation stop).
                debug_assert_eq!(n_out, t.n);
                wall.push((secs * 1e9) as u64);
                acc += a;
                drafted += dr;
            }
            let mut row = super::new_row(args, c.info, c.backend, c.threads, t);
            row.test = name;
            row.n_prompt = prompt.len();
            row.set_samples(wall, t.n - 1);
            row.graphs = engine.weight_stats().and_then(|s| s.graphs);
            if has_drafter {
                row.spec_acceptance = Some(if drafted == 0 { 0.0 } else { acc as f64 / drafted as f64 });
            }
            let acc_note = row.spec_acceptance.map(|a| format!(" (acceptance {:.1} %)", 100.0 * a)).unwrap_or_default();
            eprintln!("bench: {} {:.2} ± {:.2} t/s{acc_note}", row.test, row.avg_ts, row.stddev_ts);
            rows.push(row);
        }
    }
    Ok(rows)
}
