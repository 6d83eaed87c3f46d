//! HTTP routes: body → validated request → tokens → a job on the scheduler → JSON or
//! an SSE stream. Everything a client can get wrong ends in an [`ApiError`] before a
//! slot is touched; the body size limit, the API key and request counting are layers.

use std::convert::Infallible;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::{stream, Stream, StreamExt};
use lode_runtime::tokenizer::{ChatTemplate, Tokenizer};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{self, GenRequest, PromptInput};
use super::errors::ApiError;
use super::metrics::Metrics;
use super::scheduler::{Event, Finish, Job, Scheduler};

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
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health))
        .merge(api)
        .fallback(fallback)
        .layer(middleware::from_fn_with_state(state.clone(), count_and_jsonify))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
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

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Completion,
}

async fn chat(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    handle(st, Kind::Chat, body).await
}

async fn completions(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    handle(st, Kind::Completion, body).await
}

/// Bytes → JSON value, with the reason when they are not.
fn parse_body(body: Result<Bytes, BytesRejection>) -> Result<serde_json::Value, ApiError> {
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
    if let Some(m) = &req.model {
        if *m != st.model_id && !st.aliases.contains(m) {
            return Err(ApiError::model_not_found(m, &st.model_id));
        }
    }
    let (prompt_tokens, req) = {
        let st = st.clone();
        tokio::task::spawn_blocking(move || tokenize(&st, &req.prompt).map(|p| (p, req)))
            .await
            .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))??
    };
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

    let (tx, mut rx) = mpsc::unbounded_channel();
    st.scheduler.submit(Job {
        prompt: prompt_tokens,
        sampling: req.sampling.clone(),
        max_tokens,
        stops: req.stops.clone(),
        events: tx,
        enqueued: Instant::now(),
    });
    // Wait for a slot (or an error) before answering, so a failure is still an HTTP status.
    match rx.recv().await {
        Some(Event::Started { slot, queued_ms }) => tracing::debug!("slot {slot} took a request after {queued_ms:.1} ms"),
        Some(Event::Error(e)) => return Err(e),
        _ => return Err(ApiError::internal("the slot ended the request without an answer")),
    }
    let meta = Meta { id: new_id(kind), created: api::unix_now(), model: st.model_id.clone(), kind };
    if req.stream {
        Ok(sse(meta, &req, rx).into_response())
    } else {
        let mut text = String::new();
        loop {
            match rx.recv().await {
                Some(Event::Text(t)) => text.push_str(&t),
                Some(Event::Done(fin)) => return Ok(meta.full(text, fin)),
                Some(Event::Error(e)) => return Err(e),
                Some(Event::Started { .. }) => {}
                None => return Err(ApiError::internal("the slot ended the request without an answer")),
            }
        }
    }
}

fn tokenize(st: &AppState, prompt: &PromptInput) -> Result<Vec<u32>, ApiError> {
    let ids = match prompt {
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
    Ok(ids)
}

fn new_id(kind: Kind) -> String {
    let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
    format!("{prefix}-{:016x}", rand::random::<u64>())
}

/// What every response object of one request repeats.
struct Meta {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Meta {
    fn full(self, text: String, fin: Finish) -> Response {
        match self.kind {
            Kind::Chat => Json(api::ChatCompletion {
                id: self.id,
                object: "chat.completion",
                created: self.created,
                model: self.model,
                choices: vec![api::ChatChoice {
                    index: 0,
                    message: api::AssistantMessage { role: "assistant", content: text },
                    finish_reason: fin.finish_reason,
                }],
                usage: fin.usage,
                timings: fin.timings,
            })
            .into_response(),
            Kind::Completion => Json(api::Completion {
                id: self.id,
                object: "text_completion",
                created: self.created,
                model: self.model,
                choices: vec![api::CompletionChoice { index: 0, text, logprobs: None, finish_reason: Some(fin.finish_reason) }],
                usage: Some(fin.usage),
                timings: Some(fin.timings),
            })
            .into_response(),
        }
    }

    /// One stream chunk: a text delta, or (with `fin`) the closing chunk.
    fn chunk(&self, text: Option<String>, role: bool, fin: Option<&Finish>) -> String {
        let v = match self.kind {
            Kind::Chat => serde_json::to_string(&api::ChatChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk",
                created: self.created,
                model: self.model.clone(),
                choices: vec![api::ChunkChoice {
                    index: 0,
                    delta: api::Delta { role: role.then_some("assistant"), content: text },
                    finish_reason: fin.map(|f| f.finish_reason),
                }],
                usage: fin.map(|f| f.usage),
                timings: fin.map(|f| f.timings),
            }),
            Kind::Completion => serde_json::to_string(&api::Completion {
                id: self.id.clone(),
                object: "text_completion",
                created: self.created,
                model: self.model.clone(),
                choices: vec![api::CompletionChoice {
                    index: 0,
                    text: text.unwrap_or_default(),
                    logprobs: None,
                    finish_reason: fin.map(|f| f.finish_reason),
                }],
                usage: fin.map(|f| f.usage),
                timings: fin.map(|f| f.timings),
            }),
        };
        v.unwrap_or_default()
    }

    /// OpenAI's `stream_options.include_usage` chunk: no choices, just usage.
    fn usage_chunk(&self, fin: &Finish) -> String {
        let object = if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        serde_json::json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": fin.usage,
        })
        .to_string()
    }
}

/// The SSE body: `data: {chunk}` per piece of text, the closing chunk, `data: [DONE]`.
/// Dropping it (the client went away) drops `rx`, which cancels the job.
fn sse(
    meta: Meta,
    req: &GenRequest,
    rx: mpsc::UnboundedReceiver<Event>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let meta = Arc::new(meta);
    let include_usage = req.include_usage;
    let data = |s: String| Ok(SseEvent::default().data(s));
    let first = match meta.kind {
        Kind::Chat => vec![data(meta.chunk(Some(String::new()), true, None))],
        Kind::Completion => vec![],
    };
    let m = meta.clone();
    let rest = UnboundedReceiverStream::new(rx).flat_map(move |ev| {
        let out = match ev {
            Event::Text(t) => vec![data(m.chunk(Some(t), false, None))],
            Event::Done(fin) => {
                let mut v = vec![data(m.chunk(None, false, Some(&fin)))];
                if include_usage {
                    v.push(data(m.usage_chunk(&fin)));
                }
                v.push(data("[DONE]".into()));
                v
            }
            Event::Error(e) => vec![data(e.body_json())],
            Event::Started { .. } => vec![],
        };
        stream::iter(out)
    });
    Sse::new(stream::iter(first).chain(rest)).keep_alive(KeepAlive::default())
}
