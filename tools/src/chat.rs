//! `lode chat`: an interactive multi-turn conversation through the model's chat
//! template. Each turn renders the whole conversation, keeps the KV cache of the
//! longest token prefix it shares with what is already evaluated, and evaluates the rest.
//! Commands: `/exit` (or end of input), `/reset`.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use lode_runtime::engine::{generate_speculative, EngineError, Flow, GenParams, Sampler, StopReason, StopStrings};
use lode_runtime::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};

use crate::common::{self, ModelArgs, SamplingArgs};
use crate::spec::{self, SpecArgs};

/// Arguments of `lode chat`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// System prompt (first turn).
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens to generate at most per reply.
    #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
    pub n_predict: usize,
    /// Print each reply's speed on stderr.
    #[arg(long)]
    pub verbose: bool,
}

pub fn run(args: Args) -> Result<()> {
    if args.n_predict == 0 {
        bail!("-n must be at least 1 (the number of tokens to generate per reply)");
    }
    let mut model_args = args.model.clone();
    let default_model = model_args.model.is_none();
    model_args.model = Some(common::resolve_chat_model(model_args.model.as_deref())?);
    let (mut engine, file, path) = common::open_engine_with(&model_args, args.spec.wants_mtp())?;
    let tok = Tokenizer::from_gguf(&file).context("cannot build the tokenizer")?;
    let tmpl = ChatTemplate::for_tokenizer(&tok)?;
    let params = args.sampling.params();
    let mut drafter = args.spec.drafter(&model_args, engine.model(), engine.n_ctx(), &params)?;
    let mut sampler = Sampler::new(params);
    let gen = GenParams { max_tokens: args.n_predict, eog: tok.eog_ids() };
    let base: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s.as_str())).collect();
    let mut messages = base.clone();
    let interactive = std::io::IsTerminal::is_terminal(&std::io::stdin());
    eprintln!(
        "lode chat: {}{} on {}, context {} tokens. /exit to quit, /reset to start over.",
        path.display(),
        if default_model { " (the default chat model; -m FILE for another)" } else { "" },
        engine.backend_name(),
        engine.n_ctx()
    );
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read stdin")?;
        let input = line.trim_end_matches(['\r', '\n']);
        match input.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = base.clone();
                engine.clear();
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", input));
        let prompt = tok.encode(&tmpl.apply(&messages, true)?, true, true);
        // Reuse the cached prefix; always evaluate at least one token.
        let keep = common_prefix(engine.history(), &prompt).min(prompt.len().saturating_sub(1));
        engine.truncate(keep);
        let mut decoder = StreamDecoder::new(false);
        let mut stops = StopStrings::new(args.sampling.stop.clone());
        let mut reply = String::new();
        let mut stdout = std::io::stdout();
        let mut on_token = |id| {
            let (piece, hit) = stops.push(&decoder.push(&tok, id));
            reply.push_str(&piece);
            let _ = stdout.write_all(piece.as_bytes()).and_then(|_| stdout.flush());
            if hit { Flow::Stop } else { Flow::Continue }
        };
        let res = match drafter.as_deref_mut() {
            Some(d) => generate_speculative(&mut engine, d, &args.spec.params(), &prompt[keep..], &gen, &mut sampler, &mut on_token)
                .map(|r| (r.out, Some((d.name(), r.stats)))),
            None => engine.generate(&prompt[keep..], &gen, &mut sampler, &mut on_token).map(|o| (o, None)),
        };
        let (out, spec_stats) = match res {
            Ok(out) => out,
            Err(e @ EngineError::PromptTooLong { .. }) => {
                messages.pop();
                eprintln!("\nlode: {e}; use /reset to start a new conversation");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        if out.stop != StopReason::Caller {
            let rest = stops.push(&decoder.flush()).0 + &stops.flush();
            reply.push_str(&rest);
            print!("{rest}");
        }
        println!();
        messages.push(ChatMessage::new("assistant", reply.trim()));
        if out.stop == StopReason::ContextFull {
            eprintln!("lode: the context is full ({} tokens); use /reset to start a new conversation", engine.n_ctx());
        }
        if args.verbose {
            eprintln!("lode: {}", common::speed_line(&out));
            if let Some((name, s)) = spec_stats {
                eprintln!("lode: {}", spec::stats_line(name, &s));
            }
        }
    }
    Ok(())
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
