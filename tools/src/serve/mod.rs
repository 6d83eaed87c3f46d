//! `lode serve`: an OpenAI-compatible HTTP server (chat and text completions, streamed
//! over SSE or not, `/v1/models`, `/health`, Prometheus `/metrics`).
//!
//! Layout: [`api`] reads requests and shapes responses, [`routes`] is the HTTP side,
//! [`scheduler`] owns the slots (one OS thread and one engine each) and the FIFO queue
//! in front of them, [`slot`] runs one generation on an engine, [`metrics`] counts,
//! [`errors`] is the OpenAI error JSON.
//!
//! Every slot has its own `Engine` (its own KV cache) over the same mapped model file:
//! on the CPU, weights are read in place from the one mapping, and all slots share one
//! rayon pool of `--threads` threads, so a lone request gets every core and concurrent
//! ones split them. Decode steps of different slots are not batched into one forward
//! pass (continuous batching waits for the GPU backend).

pub mod api;
pub mod errors;
pub mod metrics;
pub mod routes;
pub mod scheduler;
pub mod slot;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lode_runtime::backend::{self, cpu::CpuBackend, Backend, DeviceKind};
use lode_runtime::engine::{Engine, EngineOptions};
use lode_runtime::model::Model;
use lode_runtime::tokenizer::{ChatTemplate, Tokenizer};

use crate::common::{self, ModelArgs};
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
    /// Requests generated at once; each slot has its own KV cache of --ctx-size tokens.
    /// Requests beyond this wait in a first-come first-served queue.
    #[arg(long, default_value_t = 4)]
    pub parallel: usize,
    /// Another name requests may use in `model`.
    #[arg(long)]
    pub alias: Option<String>,
}

/// Most slots one server runs.
const MAX_PARALLEL: usize = 256;

pub fn run(args: Args) -> Result<()> {
    if args.parallel == 0 || args.parallel > MAX_PARALLEL {
        bail!("--parallel must be between 1 and {MAX_PARALLEL}, got {}", args.parallel);
    }
    let path = common::resolve_model(args.model.model.as_deref())?;
    let file = common::open_gguf(&path)?;
    let tok = Arc::new(Tokenizer::from_gguf(&file).with_context(|| format!("cannot read the tokenizer of {}", path.display()))?);
    let template = Arc::new(ChatTemplate::for_tokenizer(&tok).context("cannot use the model's chat template")?);
    let threads = args.model.threads.unwrap_or_else(common::physical_cores);
    let opts = EngineOptions { ctx_size: args.model.ctx_size, batch_size: args.model.batch_size, kv_type: args.model.kv_type };

    let mut backends = open_backends(args.model.device, threads, args.parallel)?;
    let mut runners: Vec<Box<dyn SlotRunner>> = Vec::with_capacity(args.parallel);
    let (mut n_ctx, mut n_ctx_train, mut n_vocab, mut n_embd, mut be_name) = (0, 0, 0, 0, String::new());
    for be in backends.drain(..) {
        // Loading only indexes the mapped file: every slot reads the same weights.
        let model = Model::load(file.clone()).with_context(|| format!("cannot load model {}", path.display()))?;
        let engine = Engine::new(model, be, opts)?;
        n_ctx = engine.n_ctx();
        n_ctx_train = engine.model().cfg.n_ctx_train;
        n_vocab = engine.model().cfg.n_vocab;
        n_embd = engine.model().cfg.n_embd;
        be_name = engine.backend_name();
        runners.push(Box::new(EngineSlot::new(engine, tok.clone())));
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

    let metrics = Arc::new(Metrics::new(args.parallel));
    let scheduler = Scheduler::start(runners, metrics.clone()).context("cannot start the slot threads")?;
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
            "lode: serving {model_id} on {be_name}: {} slot(s) of {n_ctx} tokens, {threads} thread(s){}",
            args.parallel,
            if state.api_key.is_some() { ", API key required" } else { "" }
        );
        // Tests and scripts read this line for the port.
        eprintln!("lode: listening on http://{local}");
        let app = routes::router(state);
        axum::serve(listener, app).with_graceful_shutdown(shutdown_signal()).await.context("server failed")
    })
}

/// One backend per slot. On the CPU they share one thread pool.
fn open_backends(device: DeviceKind, threads: usize, n: usize) -> Result<Vec<Box<dyn Backend>>> {
    let cpu = |n: usize| -> Result<Vec<Box<dyn Backend>>> {
        let pool = CpuBackend::build_pool(threads)?;
        Ok((0..n).map(|_| Box::new(CpuBackend::with_pool(pool.clone())) as Box<dyn Backend>).collect())
    };
    if device == DeviceKind::Cpu {
        return cpu(n);
    }
    let (first, note) = backend::open(device, threads)?;
    if let Some(note) = note {
        eprintln!("lode: {note}");
    }
    if first.name().starts_with("cpu") {
        drop(first);
        return cpu(n);
    }
    // A GPU backend per slot (each holds its own KV cache and scratch buffers).
    if n > 1 {
        tracing::warn!(
            "{}: each of the {n} slots uploads its own copy of the weights until GPU backends share them",
            first.name()
        );
    }
    let mut v = vec![first];
    for _ in 1..n {
        v.push(backend::open(device, threads)?.0);
    }
    Ok(v)
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
