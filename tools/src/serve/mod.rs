//! `lode serve`: an OpenAI-compatible HTTP server (chat and text completions, streamed
//! over SSE or not, with `n` choices, log-probabilities, tool calls and structured output
//! (`response_format`, `json_schema`, GBNF `grammar`); `/v1/models`,
//! `/v1/embeddings`, `/health`, Prometheus `/metrics`; llama-server's `/tokenize`,
//! `/detokenize`, `/props`, `/slots`; CORS with `--cors`).
//!
//! Layout: [`api`] reads requests, [`wire`] is the response types, [`respond`] shapes
//! them (whole or SSE), [`logprobs`] and [`tools`] add log-probabilities and tool calls,
//! [`structured`] (with [`gbnf`]) constrains the output to a schema or grammar,
//! [`extra`] holds llama-server's endpoints and embeddings, [`routes`] is the HTTP side,
//! [`scheduler`] owns the slots (one OS thread each) and the FIFO queue in front of
//! them, [`slot`] runs one generation on a slot's sequence, [`batcher`] is the engine
//! thread those sequences share, [`metrics`] counts, [`errors`] is the OpenAI error JSON.
//!
//! One backend and one model serve every slot: each slot is a sequence of one
//! `BatchEngine` (its own KV cache; the weights resident once), and the decode steps of
//! all generating slots run together as one forward pass (continuous batching).

pub mod api;
pub mod batcher;
pub mod draft;
pub mod errors;
pub mod extra;
pub mod gbnf;
pub mod harmony;
pub mod logprobs;
pub mod metrics;
pub mod prefill;
pub mod respond;
pub mod routes;
pub mod scheduler;
pub mod slot;
pub mod structured;
pub mod tool_prompt;
pub mod tools;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lode_runtime::backend;
use lode_runtime::engine::{BatchEngine, Drafter, EngineOptions};
use lode_runtime::model::Model;
use lode_runtime::tokenizer::{ChatTemplate, Tokenizer};

use crate::common::{self, ModelArgs};
use crate::spec::ServeSpec;
use metrics::Metrics;
use routes::AppState;
use scheduler::{Scheduler, SlotRunner};
use slot::EngineSlot;

/// Arguments of `lode serve`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the chosen one is printed).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on every endpoint but /health.
    #[arg(long = "api-key", env = "LODE_API_KEY")]
    pub api_key: Option<String>,
    /// Requests generated at once (also -np). --ctx-size is the total KV budget, split
    /// evenly: each slot has its own KV cache of --ctx-size / N tokens (llama-server's
    /// meaning). Requests beyond this wait in a first-come first-served queue.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Rows of one forward pass that carries a prompt chunk (also -ub): a long prompt is
    /// fed in chunks of up to this many tokens minus the decoding streams' next tokens,
    /// inside their decode steps, so their tokens wait one chunk, not a whole prefill.
    /// Capped at --batch-size (as llama.cpp caps it).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: usize,
    /// Another name for the model (listed in `/v1/models`' aliases; any `model` name
    /// is accepted, since one model is served).
    #[arg(long)]
    pub alias: Option<String>,
    /// Serve `/v1/embeddings` (mean-pooled, L2-normalised last hidden states; one more
    /// KV cache of a slot's size).
    #[arg(long)]
    pub embeddings: bool,
    /// Answer browsers calling from ORIGIN (`*`: any origin) with CORS headers, and
    /// their preflight requests (off by default).
    #[arg(long, value_name = "ORIGIN")]
    pub cors: Option<String>,
    /// Speculative decoding per slot (requests without a grammar or schema):
    /// `--spec-type ngram-simple`, `--model-draft FILE` (one draft engine, a sequence per
    /// slot; slots drafting together share its batched steps) or `--spec-type draft-mtp`
    /// (the model's own MTP block, where the GGUF has one: slots drafting together share
    /// its batched rows), `--draft-max`, `--draft-min`, `--draft-p-min`,
    /// `--spec-ngram-size-n`; a verify chunk runs alone, not batched with the other
    /// slots' steps. `/metrics` counts drafted and accepted tokens, and each answer's
    /// `timings` carries `draft_n` and `draft_n_accepted`.
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Reuse cached prompt starts (the default): a slot's own last tokens, or a prefix
    /// copied from another slot's KV cache (live or idle), so a shared system prompt or
    /// an earlier turn is not evaluated again. A request's `cache_prompt: false` opts out.
    #[arg(long = "cache-prompt", overrides_with = "no_cache_prompt")]
    pub cache_prompt: bool,
    /// Evaluate every prompt whole (no prompt cache).
    #[arg(long = "no-cache-prompt", overrides_with = "cache_prompt")]
    pub no_cache_prompt: bool,
    /// How much of a prompt (0 to 1) a free slot's cached start must cover for the
    /// request to go to that slot; otherwise the least recently used free slot takes it,
    /// evicting its cache (also -sps; 0: least recently used only).
    #[arg(long = "slot-prompt-similarity", default_value_t = 0.1, value_parser = similarity)]
    pub slot_prompt_similarity: f32,
}

fn similarity(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("expected a number from 0 to 1, got {s:?}")),
    }
}

/// Most slots one server runs.
const MAX_PARALLEL: usize = 256;

/// Each slot's context for `--ctx-size total` over `parallel` slots: the total split
/// evenly, as llama-server splits it (without a unified KV cache; it also rounds each
/// share up to a multiple of 256, which lode does not). Without --ctx-size: the model's
/// training context split the same way (llama-server's `-c 0`), at most
/// [`DEFAULT_CTX_CAP`](lode_runtime::engine::DEFAULT_CTX_CAP) tokens per slot.
pub fn slot_ctx(total: Option<usize>, parallel: usize, n_ctx_train: usize) -> Result<usize> {
    let parallel = parallel.max(1);
    match total {
        Some(t) if t < parallel => bail!("--ctx-size {t} is the total over --parallel {parallel} slots: less than one token per slot"),
        Some(t) => Ok(t / parallel),
        None => Ok((n_ctx_train / parallel).clamp(1, lode_runtime::engine::DEFAULT_CTX_CAP)),
    }
}

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 || args.parallel > MAX_PARALLEL {
        bail!("--parallel must be between 1 and {MAX_PARALLEL}, got {}", args.parallel);
    }
    let path = common::resolve_model(args.model.model.as_deref())?;
    let file = common::open_gguf(&path)?;
    let tok = Arc::new(Tokenizer::from_gguf(&file).with_context(|| format!("cannot read the tokenizer of {}", path.display()))?);
    let template = Arc::new(ChatTemplate::for_tokenizer(&tok).context("cannot use the model's chat template")?);
    let threads = args.model.threads.unwrap_or_else(common::physical_cores);
    if args.ubatch_size == 0 {
        bail!("--ubatch-size must be at least 1");
    }

    // One backend and one copy of the weights; a KV cache per slot.
    let (be, note) = backend::open_with(args.model.device, threads, &args.model.weights.options()?, &common::gpu_options())?;
    if let Some(note) = note {
        eprintln!("lode: {note}");
    }
    // `--spec-type draft-mtp` keeps the model's multi-token-prediction block (its weights
    // and a one-layer cache per sequence, which the engine's fit check counts).
    let load = if args.spec.wants_mtp() { Model::load_with_mtp } else { Model::load };
    let model = load(file.clone()).with_context(|| format!("cannot load model {}", path.display()))?;
    let ctx = slot_ctx(args.model.ctx_size, args.parallel, model.cfg.n_ctx_train)?;
    let opts = EngineOptions { ctx_size: Some(ctx), batch_size: args.model.batch_size, kv_type: args.model.kv.types(), swa_full: args.model.kv.swa_full };
    let engine = BatchEngine::new(model, be, opts, args.parallel + usize::from(args.embeddings))?;
    let (n_ctx, be_name) = (engine.n_ctx(), engine.backend_name());
    let c = &engine.model().cfg;
    let (n_ctx_train, n_vocab, n_embd) = (c.n_ctx_train, c.n_vocab, c.n_embd);
    let metrics = Arc::new(Metrics::new(args.parallel));
    // After the target, so a draft model is sized against what is left.
    let spec = args.spec.serve_drafter(&args.model, engine.model(), n_ctx, args.parallel)?;
    let mtp_p_min = match &spec {
        Some((ServeSpec::Mtp { p_min }, _)) => Some(*p_min),
        _ => None,
    };
    let ubatch = args.ubatch_size.min(args.model.batch_size);
    let (handles, embed) = batcher::start(engine, metrics.clone(), args.embeddings, ubatch, mtp_p_min).context("cannot start the engine thread")?;
    let (mut drafters, spec_params): (Vec<Box<dyn Drafter + Send>>, _) = match spec {
        None => (Vec::new(), None),
        Some((ServeSpec::Mtp { .. }, sp)) => (handles.iter().map(|h| Box::new(h.mtp_drafter()) as Box<dyn Drafter + Send>).collect(), Some(sp)),
        Some((ServeSpec::Ngram(ngram), sp)) => ((0..args.parallel).map(|_| Box::new(ngram) as Box<dyn Drafter + Send>).collect(), Some(sp)),
        Some((ServeSpec::Model { engine, p_min }, sp)) => {
            let h = draft::start(engine, p_min, metrics.clone()).context("cannot start the draft model's thread")?;
            (h.into_iter().map(|d| Box::new(d) as Box<dyn Drafter + Send>).collect(), Some(sp))
        }
    };
    drafters.reverse();
    let runners: Vec<Box<dyn SlotRunner>> =
        handles
        .into_iter()
        .map(|h| {
            let mut slot = EngineSlot::new(h, tok.clone(), metrics.grammar.clone());
            slot.spec = spec_params.and_then(|sp| drafters.pop().map(|d| (d, sp)));
            slot.metrics = Some(metrics.clone());
            Box::new(slot) as Box<dyn SlotRunner>
        })
        .collect();
    // Built in the background (seconds for a 262k vocabulary); the first request with a
    // grammar waits for it.
    let grammars = Arc::new(std::sync::OnceLock::new());
    {
        let (g, tok) = (grammars.clone(), tok.clone());
        std::thread::Builder::new()
            .name("lode-grammars".into())
            .spawn(move || {
                let t0 = std::time::Instant::now();
                let r = structured::Grammars::new(tok);
                tracing::info!("structured output: token trie and grammar compiler built in {:.0} ms", t0.elapsed().as_secs_f64() * 1e3);
                if let Err(why) = &r {
                    eprintln!("lode: structured output (response_format, json_schema, grammar) is off: {why}");
                }
                let _ = g.set(r);
            })
            .context("cannot start the grammar compiler's thread")?;
    }

    let model_id = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let mut aliases: Vec<String> = Vec::new();
    if let Some(stem) = path.file_stem() {
        aliases.push(stem.to_string_lossy().into_owned());
    }
    if let Ok(Some(name)) = file.get_str("general.name") {
        aliases.push(name.to_string());
    }
    aliases.extend(args.alias.clone());
    aliases.retain(|a| *a != model_id);
    aliases.dedup();

    let scheduler = Scheduler::start(runners, metrics.clone(), args.slot_prompt_similarity).context("cannot start the slot threads")?;
    let state = Arc::new(AppState {
        model_id: model_id.clone(),
        model_meta: api::ModelMeta {
            n_ctx,
            n_ctx_train,
            n_vocab,
            n_embd,
            size: file.bytes().len() as u64,
            aliases: aliases.clone(),
        },
        aliases,
        created: api::unix_now(),
        tok,
        template,
        n_ctx,
        api_key: args.api_key.clone().filter(|k| !k.is_empty()),
        scheduler,
        metrics,
        model_path: path.display().to_string(),
        embed,
        cors: args.cors.clone().filter(|c| !c.is_empty()),
        grammars,
        cache_prompt: !args.no_cache_prompt,
    });

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("lode-http")
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        // (host, port) resolves names and IPv6 literals (`::1`) alike.
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let local: SocketAddr = listener.local_addr()?;
        eprintln!(
            "lode: serving {model_id} on {be_name}: {} slot(s) of {n_ctx} tokens ({} in all), {threads} thread(s){}",
            args.parallel,
            args.parallel * n_ctx,
            if state.api_key.is_some() { ", API key required" } else { "" }
        );
        // Tests and scripts read this line for the port.
        eprintln!("lode: listening on http://{local}");
        let app = routes::router(state);
        axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await.context("server failed")
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("lode: shutting down");
}
