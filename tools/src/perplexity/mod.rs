//! `lode perplexity`: llama-perplexity's measurement, so the numbers compare directly.
//!
//! Method (llama.cpp's `perplexity` example, default mode): the text file minus one
//! trailing newline is tokenized with the model's special tokens (BOS when the model
//! adds it, no special-token parsing); it is cut into `n = ⌊tokens / ctx⌋` chunks of
//! `ctx` tokens; each chunk is evaluated from an empty KV cache with its first token
//! replaced by BOS when the model adds BOS; only the second half is scored — logits at
//! positions `ctx/2 ..= ctx−2` predicting the token after them — so every scored token
//! sees at least `ctx/2` tokens of context. PPL = exp(mean NLL), error by llama.cpp's
//! formula ([`stats::PplAcc::ppl_stderr`]).
//!
//! `--save-logits FILE` keeps every scored position's top-k log-probabilities
//! ([`logits_file`]); `--kl-divergence-base FILE` compares this run with such a file
//! (KL divergence, same top-1, PPL ratio) — how two backends or builds are compared.

pub mod logits_file;
pub mod logprobs;
pub mod stats;

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use lode_runtime::backend::DeviceKind;
use lode_runtime::tokenizer::Tokenizer;

use crate::common::{self, ModelArgs};
use logits_file::{Header, LogitsReader, LogitsWriter, Record};
use logprobs::{top_k, RowStats};
use stats::{CompareAcc, PplAcc};

/// Arguments of `lode perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF model file (default: Gemma 3 270M Q4_K_M).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// Chunk length in tokens (llama-perplexity's `-c`).
    #[arg(short = 'c', long = "ctx", visible_alias = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Evaluate at most this many chunks (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Tokens per forward chunk (default: the whole chunk).
    #[arg(short = 'b', long = "batch-size")]
    pub batch_size: Option<usize>,
    #[command(flatten)]
    pub kv: common::KvArgs,
    /// Device: cpu, cuda, hip or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceKind,
    /// CPU threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Save each scored position's top-k log-probabilities to FILE (format: `logits_file`).
    #[arg(long, value_name = "FILE")]
    pub save_logits: Option<PathBuf>,
    /// Tokens kept per position by `--save-logits`.
    #[arg(long, default_value_t = 256)]
    pub save_logits_top: usize,
    /// Compare with a file written by `--save-logits`: KL divergence, same top-1, PPL ratio.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    #[command(flatten)]
    pub weights: common::WeightArgs,
}

pub fn run(args: Args) -> Result<()> {
    if args.ctx < 4 {
        bail!("--ctx {} is too small (at least 4 tokens: half of each chunk is context, half is scored)", args.ctx);
    }
    if args.chunks == Some(0) {
        bail!("--chunks 0: nothing to evaluate");
    }
    let mut text = std::fs::read_to_string(&args.file).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::InvalidData {
            "it is not UTF-8 text".to_string()
        } else {
            lode_runtime::gguf::io_words(&e)
        };
        anyhow::anyhow!("cannot read text file {}: {why}", args.file.display())
    })?;
    if text.ends_with('\n') {
        text.pop();
    }
    let margs = ModelArgs {
        model: args.model.clone(),
        device: args.device,
        threads: args.threads,
        ctx_size: Some(args.ctx),
        batch_size: args.batch_size.unwrap_or(args.ctx),
        kv: args.kv.clone(),
        weights: args.weights.clone(),
    };
    let (mut engine, file, path) = common::open_engine(&margs)?;
    let tok = Tokenizer::from_gguf(&file).with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let n_vocab = engine.model().cfg.n_vocab;

    let t_tok = Instant::now();
    let tokens = tok.encode(&text, true, false);
    eprintln!("perplexity: tokenized {} in {:.0} ms: {} tokens", args.file.display(), t_tok.elapsed().as_secs_f64() * 1e3, tokens.len());
    let ctx = args.ctx;
    if tokens.len() < 2 * ctx {
        bail!("the text has {} tokens; perplexity with a context of {ctx} needs at least {} (as llama-perplexity)", tokens.len(), 2 * ctx);
    }
    let bos = if tok.add_bos() {
        Some(tok.bos().context("the model adds BOS but its vocabulary has no BOS token")?)
    } else {
        None
    };
    let mut n_chunks = tokens.len() / ctx;
    if let Some(c) = args.chunks {
        n_chunks = n_chunks.min(c);
    }
    let fnv = logits_file::tokens_fnv(&tokens);

    let mut base = match &args.kl_divergence_base {
        Some(p) => {
            let r = LogitsReader::open(p)?;
            let h = r.header;
            if h.n_ctx as usize != ctx {
                bail!("{} was saved with --ctx {}, this run uses {ctx}", p.display(), h.n_ctx);
            }
            if h.n_vocab as usize != n_vocab {
                bail!("{} has a vocabulary of {}, this model {n_vocab}", p.display(), h.n_vocab);
            }
            if h.n_tokens != tokens.len() as u64 || h.tokens_fnv != fnv {
                bail!(
                    "{} was computed over other tokens ({} tokens, hash {:016x}; this run: {}, {fnv:016x}): another text or tokenizer",
                    p.display(),
                    h.n_tokens,
                    h.tokens_fnv,
                    tokens.len()
                );
            }
            if (h.n_chunks as usize) < n_chunks {
                eprintln!("perplexity: the base file has {} chunks; evaluating those only", h.n_chunks);
                n_chunks = h.n_chunks as usize;
            }
            Some(r)
        }
        None => None,
    };
    let mut writer = match &args.save_logits {
        Some(p) => {
            if args.save_logits_top == 0 {
                bail!("--save-logits-top must be at least 1");
            }
            let h = Header {
                n_vocab: n_vocab as u32,
                top_k: args.save_logits_top.min(n_vocab) as u32,
                n_ctx: ctx as u32,
                n_chunks: n_chunks as u32,
                n_tokens: tokens.len() as u64,
                tokens_fnv: fnv,
            };
            Some(LogitsWriter::create(p, h)?)
        }
        None => None,
    };
    eprintln!(
        "perplexity: {} on {}, {n_chunks} chunks of {ctx} tokens, {} scored per chunk, BOS {}",
        path.display(),
        engine.backend_name(),
        logits_file::scored_per_chunk(ctx),
        if bos.is_some() { "replaces each chunk's first token" } else { "not added" }
    );

    let first = ctx / 2;
    let mut ppl = PplAcc::default();
    let mut cmp = base.as_ref().map(|_| CompareAcc::default());
    let mut out = std::io::stdout().lock();
    let t0 = Instant::now();
    for i in 0..n_chunks {
        let t_chunk = Instant::now();
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if let Some(b) = bos {
            chunk[0] = b;
        }
        engine.clear();
        engine.eval(&chunk[..first]).with_context(|| format!("chunk {}", i + 1))?;
        let mut failure: Option<anyhow::Error> = None;
        let topk = writer.as_ref().map_or(0, |w| w.header().top_k as usize);
        engine
            .eval_all(&chunk[first..], &mut |j, logits| {
                let pos = first + j;
                if pos + 1 >= ctx || failure.is_some() {
                    return;
                }
                let next = chunk[pos + 1];
                let s = RowStats::new(logits);
                ppl.add(-s.logp(logits, next));
                let r = (|| -> Result<()> {
                    if let Some(w) = writer.as_mut() {
                        w.write(&Record { next_token: next, logp_next: s.logp32(logits, next), top: top_k(logits, &s, topk) })?;
                    }
                    if let (Some(b), Some(c)) = (base.as_mut(), cmp.as_mut()) {
                        let rec = b.next_record()?;
                        if rec.next_token != next {
                            bail!("base file predicts token {} at chunk {} position {pos}, this run {next}", rec.next_token, i + 1);
                        }
                        c.add(&rec, logits, &s);
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failure = Some(e);
                }
            })
            .with_context(|| format!("chunk {}", i + 1))?;
        if let Some(e) = failure {
            return Err(e);
        }
        if i == 0 {
            let s = t_chunk.elapsed().as_secs_f64();
            eprintln!("perplexity: {s:.2} s per chunk, about {:.1} min for {n_chunks} chunks", s * n_chunks as f64 / 60.0);
        }
        write!(out, "[{}]{:.4},", i + 1, ppl.ppl())?;
        out.flush()?;
    }
    writeln!(out)?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!("perplexity: {} tokens evaluated in {secs:.1} s ({:.1} t/s)", n_chunks * ctx, (n_chunks * ctx) as f64 / secs);
    match ppl.ppl_stderr() {
        Some(se) => writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", ppl.ppl(), se)?,
        None => writeln!(out, "Final estimate: PPL = {:.4}", ppl.ppl())?,
    }
    if let Some(w) = writer {
        w.finish()?;
        if let Some(p) = &args.save_logits {
            eprintln!("perplexity: saved the log-probabilities of {} positions to {}", ppl.count, p.display());
        }
    }
    if let Some(c) = cmp {
        print_comparison(&mut out, &c)?;
    }
    Ok(())
}

fn print_comparison(out: &mut impl Write, c: &CompareAcc) -> Result<()> {
    let se = |a: &PplAcc| a.ppl_stderr().unwrap_or(0.0);
    let (ratio, ratio_se) = c.ppl_ratio();
    let (kl, kl_se) = c.mean_kld();
    let (same, same_se) = c.same_top();
    writeln!(out)?;
    writeln!(out, "====== Perplexity statistics ({} positions) ======", c.n())?;
    writeln!(out, "Mean PPL(Q)          : {:10.6} ± {:10.6}", c.nll_q.ppl(), se(&c.nll_q))?;
    writeln!(out, "Mean PPL(base)       : {:10.6} ± {:10.6}", c.nll_base.ppl(), se(&c.nll_base))?;
    writeln!(out, "PPL ratio Q/base     : {:10.6} ± {:10.6}", ratio, ratio_se)?;
    writeln!(out, "====== KL divergence statistics ======")?;
    writeln!(out, "Mean KLD             : {:10.6} ± {:10.6}", kl, kl_se)?;
    writeln!(out, "Maximum KLD          : {:10.6}", c.kld_quantile(1.0))?;
    writeln!(out, "99.0%   KLD          : {:10.6}", c.kld_quantile(0.99))?;
    writeln!(out, "95.0%   KLD          : {:10.6}", c.kld_quantile(0.95))?;
    writeln!(out, "90.0%   KLD          : {:10.6}", c.kld_quantile(0.90))?;
    writeln!(out, "Median  KLD          : {:10.6}", c.kld_quantile(0.5))?;
    writeln!(out, "Minimum KLD          : {:10.6}", c.kld_quantile(0.0))?;
    writeln!(out, "Same top-1           : {:8.3} ± {:6.3} %", same * 100.0, same_se * 100.0)?;
    Ok(())
}
