//! `lode generate`: one prompt in, streamed text out (speed on stderr), or a JSON
//! record for scripts.

use std::io::Write;

use anyhow::{bail, Context, Result};
use lode_runtime::engine::{generate_speculative, Flow, GenParams, Sampler, StopReason, StopStrings};
use lode_runtime::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

use crate::common::{self, ModelArgs, SamplingArgs};
use crate::spec::{self, SpecArgs};

/// Arguments of `lode generate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompt (default: read all of stdin).
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Wrap the prompt as one user turn of the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// Print `{prompt_ids, generated_ids, text, stop, timings}` as JSON instead of streaming.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    if args.n_predict == 0 {
        bail!("-n must be at least 1 (the number of tokens to generate)");
    }
    let text = common::prompt_or_stdin(args.prompt.clone())?;
    if text.is_empty() {
        bail!("the prompt is empty: pass -p TEXT or pipe text on stdin");
    }
    let (mut engine, file, _path) = common::open_engine_with(&args.model, args.spec.wants_mtp())?;
    let tok = Tokenizer::from_gguf(&file).context("cannot build the tokenizer")?;
    let prompt_ids = if args.chat {
        let tmpl = ChatTemplate::for_tokenizer(&tok)?;
        let rendered = tmpl.apply(&[ChatMessage::new("user", text.as_str())], true)?;
        tok.encode(&rendered, true, true)
    } else {
        tok.encode(&text, true, false)
    };
    let params = args.sampling.params();
    let seed = params.seed;
    let mut drafter = args.spec.drafter(&args.model, engine.model(), engine.n_ctx(), &params)?;
    let mut sampler = Sampler::new(params);
    let gen = GenParams { max_tokens: args.n_predict, eog: tok.eog_ids() };

    let mut decoder = StreamDecoder::new(false);
    let mut stops = StopStrings::new(args.sampling.stop.clone());
    let mut text_out = String::new();
    let stdout = std::io::stdout();
    let mut io_err = None;
    let mut on_token = |id| {
        let (piece, hit) = stops.push(&decoder.push(&tok, id));
        text_out.push_str(&piece);
        if !args.json && !piece.is_empty() {
            let mut o = stdout.lock();
            if let Err(e) = o.write_all(piece.as_bytes()).and_then(|_| o.flush()) {
                io_err = Some(e);
                return Flow::Stop;
            }
        }
        if hit { Flow::Stop } else { Flow::Continue }
    };
    let (out, spec_stats) = match drafter.as_deref_mut() {
        Some(d) => {
            let r = generate_speculative(&mut engine, d, &args.spec.params(), &prompt_ids, &gen, &mut sampler, &mut on_token)?;
            (r.out, Some((d.name(), r.stats)))
        }
        None => (engine.generate(&prompt_ids, &gen, &mut sampler, &mut on_token)?, None),
    };
    if let Some(e) = io_err {
        return Err(e).context("cannot write to stdout");
    }
    if out.stop != StopReason::Caller {
        let rest = stops.push(&decoder.flush()).0 + &stops.flush();
        text_out.push_str(&rest);
        if !args.json {
            print!("{rest}");
        }
    }
    if args.json {
        let v = serde_json::json!({
            "prompt_ids": prompt_ids,
            "generated_ids": out.tokens,
            "text": text_out,
            "stop": out.stop,
            "seed": seed,
            "timings": {
                "prompt_tokens": out.n_prompt,
                "prompt_secs": out.prompt_secs,
                "prompt_tps": out.prompt_tps(),
                "generated_tokens": out.tokens.len(),
                "gen_secs": out.gen_secs,
                "gen_tps": out.gen_tps(),
            },
            "speculative": spec_stats.map(|(name, s)| serde_json::json!({
                "drafter": name,
                "drafted": s.drafted,
                "accepted": s.accepted,
                "acceptance": s.acceptance(),
                "passes": s.passes,
                "draft_secs": s.draft_secs,
            })),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!();
    }
    if out.stop == StopReason::ContextFull {
        eprintln!(
            "lode: stopped: the context is full ({} tokens); raise --ctx-size to generate more",
            engine.n_ctx()
        );
    }
    eprintln!("lode: {}", common::speed_line(&out));
    if let Some((name, s)) = spec_stats {
        eprintln!("lode: {}", spec::stats_line(name, &s));
    }
    spec::draft_report(&args.model, drafter.as_deref());
    Ok(())
}
