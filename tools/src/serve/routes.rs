//! HTTP routes: body → validated request → tokens → a job on the scheduler → JSON or
//! an SSE stream. Everything a client can get wrong ends in an [`ApiError`] before a
//! slot is touched; the body size limit, the API key and request counting are layers.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lode_runtime::tokenizer::{ChatTemplate, Tokenizer};
use tokio::sync::mpsc;
use tower_http::cors::{Any, CorsLayer};

use super::api::{self, GenRequest, PromptInput};
use super::batcher::EmbedHandle;
use super::errors::ApiError;
use super::extra;
use super::metrics::Metrics;
use super::respond::{self, Kind, Meta};
use super::scheduler::{Event, Job, Scheduler};
use super::structured::Grammars;
use super::tool_prompt;
use super::tools::{ToolFormat, ToolParser};

/// Largest request body accepted (413 beyond).
pub const BODY_LIMIT: usize = 4 << 20;

/// What every handler shares.
pub struct AppState {
    /// The id `/v1/models` lists (the model file's name).
    pub model_id: String,
    /// Other names a request's `model` may use.
    pub aliases: Vec<String>,
    pub model_meta: api::ModelMeta,
    pub created: u64,
    pub tok: Arc<Tokenizer>,
    pub template: Arc<ChatTemplate>,
    pub n_ctx: usize,
    pub api_key: Option<String>,
    pub scheduler: Scheduler,
    pub metrics: Arc<Metrics>,
    /// The model file, as `/props` shows it.
    pub model_path: String,
    /// `--embeddings`: the engine's embeddings sequence.
    pub embed: Option<EmbedHandle>,
    /// `--cors`: the origin browsers may call from (`*`: any).
    pub cors: Option<String>,
    /// The grammar compiler over the model's vocabulary, or why there is none (set by a
    /// background thread once built).
    pub grammars: Arc<std::sync::OnceLock<Result<Grammars, String>>>,
    /// `--cache-prompt` (default) / `--no-cache-prompt`: requests may reuse cached
    /// prompt starts.
    pub cache_prompt: bool,
}

type St = State<Arc<AppState>>;

/// The whole API.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/v1/embeddings", post(extra::embeddings))
        .route("/embeddings", post(extra::embeddings))
        .route("/tokenize", post(extra::tokenize))
        .route("/detokenize", post(extra::detokenize))
        .route("/props", get(extra::props))
        .route("/slots", get(extra::slots))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let cors = state.cors.as_deref().map(cors_layer);
    let app = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .merge(api)
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(state.clone(), count_and_jsonify))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state);
    // Outermost, so a browser's preflight (OPTIONS, no API key) is answered before routing.
    match cors {
        Some(c) => app.layer(c),
        None => app,
    }
}

/// `--cors ORIGIN`: that origin (or `*`: any) may call every endpoint from a browser.
fn cors_layer(origin: &str) -> CorsLayer {
    let base = CorsLayer::new()
        .allow_methods([Method::GET, Method::POST, Method::OPTIONS])
        .allow_headers(Any)
        .max_age(std::time::Duration::from_secs(600));
    match origin {
        "*" => base.allow_origin(Any),
        o => match HeaderValue::from_str(o) {
            Ok(v) => base.allow_origin(v),
            Err(_) => base.allow_origin(Any),
        },
    }
}

async fn auth(State(st): St, req: Request, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Counts every response by route and status, and turns axum's plain-text 405s into
/// OpenAI error JSON.
async fn count_and_jsonify(State(st): St, req: Request, next: Next) -> Response {
    let endpoint = req.extensions().get::<MatchedPath>().map_or("other".to_string(), |p| p.as_str().to_string());
    let method = req.method().clone();
    let mut resp = next.run(req).await;
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED {
        resp = ApiError::with_status(StatusCode::METHOD_NOT_ALLOWED, format!("method {method} is not allowed on {endpoint}"))
            .into_response();
    }
    st.metrics.request(&endpoint, resp.status().as_u16());
    resp
}

async fn fallback(req: Request) -> ApiError {
    ApiError::not_found(req.uri().path())
}

async fn health(State(st): St) -> Response {
    let active = st.metrics.active_slots.load(Relaxed);
    Json(serde_json::json!({
        "status": "ok",
        "slots_idle": st.metrics.slots.saturating_sub(active),
        "slots_processing": active,
        "queue": st.metrics.queue_depth.load(Relaxed),
    }))
    .into_response()
}

async fn metrics(State(st): St) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], st.metrics.render()).into_response()
}

async fn models(State(st): St) -> Json<api::ModelList> {
    Json(api::ModelList {
        object: "list",
        data: vec![api::ModelCard {
            id: st.model_id.clone(),
            object: "model",
            created: st.created,
            owned_by: "lode",
            meta: st.model_meta.clone(),
        }],
    })
}

async fn chat(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    handle(st, Kind::Chat, body).await
}

async fn completions(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    handle(st, Kind::Completion, body).await
}

/// Bytes → JSON value, with the reason when they are not.
pub fn parse_body(body: Result<Bytes, BytesRejection>) -> Result<serde_json::Value, ApiError> {
    let bytes = body.map_err(|r| ApiError::with_status(r.status(), r.body_text()))?;
    if let Err(e) = std::str::from_utf8(&bytes) {
        return Err(ApiError::bad_request(format!(
            "the request body is not valid UTF-8 (bad byte at offset {})",
            e.valid_up_to()
        )));
    }
    serde_json::from_slice(&bytes).map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

async fn handle(st: Arc<AppState>, kind: Kind, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let value = parse_body(body)?;
    let req = match kind {
        Kind::Chat => api::parse_chat(&value)?,
        Kind::Completion => api::parse_completion(&value)?,
    };
    drop(value);
    // One model is served: any `model` name means it (llama-server's convention; most
    // local clients send a fixed name).
    let ((prompt_tokens, parser, tool_stop), grammar, req) = {
        let st = st.clone();
        tokio::task::spawn_blocking(move || {
            let p = tokenize(&st, &req)?;
            // Compiled before a slot is taken: a rejected schema is a 400.
            let g = match (&req.grammar, st.grammars.wait()) {
                (None, _) => None,
                (Some(spec), Ok(g)) => Some(g.compile(spec)?),
                (Some(spec), Err(why)) => {
                    return Err(ApiError::invalid_param(spec.field, format!("`{}` cannot be used with this model: {why}", spec.field)))
                }
            };
            Ok((p, g, req))
        })
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))??
    };
    let mut stops = req.stops.clone();
    stops.extend(tool_stop);
    let param = if kind == Kind::Chat { "messages" } else { "prompt" };
    let n = prompt_tokens.len();
    if n >= st.n_ctx {
        return Err(ApiError::context_exceeded(
            format!(
                "the prompt has {n} tokens but the context holds {} (and at least one more is needed for the answer); \
                 shorten the prompt or restart the server with a larger --ctx-size",
                st.n_ctx
            ),
            param,
        ));
    }
    let room = st.n_ctx - n;
    let max_tokens = match req.max_tokens {
        Some(m) if m > st.n_ctx as u64 => {
            return Err(ApiError::context_exceeded(
                format!("max_tokens is {m} but the context holds only {} tokens (the prompt has {n})", st.n_ctx),
                "max_tokens",
            ))
        }
        // Capped so prompt + completion fit the context.
        Some(m) => (m as usize).min(room),
        None => room,
    };

    // One job per choice, each with its own seed; they run on free slots side by side.
    let special = parser.as_ref().is_some_and(|p| p.format == ToolFormat::Harmony);
    let mut rxs = Vec::with_capacity(req.n);
    for i in 0..req.n {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sampling = req.sampling.clone();
        sampling.seed = sampling.seed.wrapping_add(i as u64);
        st.scheduler.submit(Job {
            prompt: prompt_tokens.clone(),
            sampling,
            max_tokens,
            stops: stops.clone(),
            logprobs: req.logprobs,
            grammar: grammar.clone(),
            special,
            events: tx,
            enqueued: Instant::now(),
            cache_prompt: req.cache_prompt && st.cache_prompt,
        });
        rxs.push(rx);
    }
    // Wait for the first choice's slot (or an error) before answering, so a failure is
    // still an HTTP status.
    let first = rxs.first_mut().ok_or_else(|| ApiError::internal("no choices"))?;
    match first.recv().await {
        Some(Event::Started { slot, queued_ms }) => tracing::debug!("slot {slot} took a request after {queued_ms:.1} ms"),
        Some(Event::Error(e)) => return Err(e),
        _ => return Err(ApiError::internal("the slot ended the request without an answer")),
    }
    let mut meta = Meta::new(kind, st.model_id.clone(), req.logprobs.is_some());
    meta.tools = parser;
    if req.stream {
        Ok(respond::sse(meta, req.include_usage, rxs).into_response())
    } else {
        let mut choices = Vec::with_capacity(rxs.len());
        for rx in rxs {
            choices.push(respond::collect(rx).await?);
        }
        Ok(meta.full(choices))
    }
}

/// The prompt's tokens; with tools (or a harmony template, whose every answer is
/// parsed), the answer's parser and the forced call's stop.
fn tokenize(st: &AppState, req: &GenRequest) -> Result<(Vec<u32>, Option<ToolParser>, Option<String>), ApiError> {
    let harmony = matches!(req.prompt, PromptInput::Chat(_)) && ToolFormat::for_template(st.template.text()) == ToolFormat::Harmony;
    if req.tools.is_some() || tool_prompt::has_tool_turns(&req.chat_json) || harmony {
        let r = tool_prompt::render(&st.template, &req.chat_json, req.tools.as_ref())?;
        let ids = st.tok.encode(&r.text, true, true);
        return Ok((ids, r.parser, r.stop));
    }
    let ids = match &req.prompt {
        PromptInput::Chat(messages) => {
            let text = st
                .template
                .apply(messages, true)
                .map_err(|e| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}")))?;
            st.tok.encode(&text, true, true)
        }
        PromptInput::Text(text) => st.tok.encode(text, true, true),
        PromptInput::Tokens(ids) => {
            let n_vocab = st.tok.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(ApiError::invalid_param("prompt", format!("token id {bad} is outside the vocabulary ({n_vocab})")));
            }
            ids.clone()
        }
    };
    if ids.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty (it has no tokens)"));
    }
    Ok((ids, None, None))
}

