//! Shaping what slots produce into OpenAI responses: the whole response of `n` choices,
//! or one SSE stream that interleaves their chunks (each with its choice `index`).

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{stream, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use super::api::{self, Usage};
use super::errors::ApiError;
use super::logprobs::{CompletionLogprobs, TokenLogprob};
use super::scheduler::{Event, Finish};
use super::tools::{ToolParser, ToolStream};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Chat,
    Completion,
}

/// What every response object of one request repeats.
pub struct Meta {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    pub logprobs: bool,
    /// Set when the request offered tools: how to find calls in the model's output.
    pub tools: Option<ToolParser>,
}

/// One finished choice.
pub struct ChoiceOut {
    pub text: String,
    pub fin: Finish,
    pub logprobs: Vec<TokenLogprob>,
}

/// Gathers one choice's events until it ends.
pub async fn collect(mut rx: mpsc::UnboundedReceiver<Event>) -> Result<ChoiceOut, ApiError> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    loop {
        match rx.recv().await {
            Some(Event::Text(p)) => {
                text.push_str(&p.text);
                logprobs.extend(p.logprobs);
            }
            Some(Event::Done(fin)) => return Ok(ChoiceOut { text, fin, logprobs }),
            Some(Event::Error(e)) => return Err(e),
            Some(Event::Started { .. }) => {}
            None => return Err(ApiError::internal("the slot ended the request without an answer")),
        }
    }
}

/// Usage of all choices: the prompt once, every choice's completion.
fn total_usage<'a>(fins: impl Iterator<Item = &'a Finish>) -> Usage {
    let mut u = Usage::default();
    for f in fins {
        u.prompt_tokens = f.usage.prompt_tokens;
        u.completion_tokens += f.usage.completion_tokens;
    }
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

impl Meta {
    pub fn new(kind: Kind, model: String, logprobs: bool) -> Meta {
        let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
        Meta {
            id: format!("{prefix}-{:016x}", rand::random::<u64>()),
            created: api::unix_now(),
            model,
            kind,
            logprobs,
            tools: None,
        }
    }

    pub fn full(self, choices: Vec<ChoiceOut>) -> Response {
        let usage = total_usage(choices.iter().map(|c| &c.fin));
        let timings = choices.first().map(|c| c.fin.timings).unwrap_or_default();
        match self.kind {
            Kind::Chat => {
                let choices = choices
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let (reasoning_content, content, tool_calls) = match &self.tools {
                            Some(p) => p.parse_message(&c.text),
                            None => (None, Some(c.text), Vec::new()),
                        };
                        let finish_reason = if tool_calls.is_empty() { c.fin.finish_reason } else { "tool_calls" };
                        api::ChatChoice {
                            index: i as u32,
                            message: api::AssistantMessage { role: "assistant", content, reasoning_content, tool_calls },
                            logprobs: self.logprobs.then(|| api::ChatLogprobs { content: c.logprobs }),
                            finish_reason,
                        }
                    })
                    .collect();
                Json(api::ChatCompletion {
                    id: self.id,
                    object: "chat.completion",
                    created: self.created,
                    model: self.model,
                    choices,
                    usage,
                    timings,
                })
                .into_response()
            }
            Kind::Completion => {
                let choices = choices
                    .into_iter()
                    .enumerate()
                    .map(|(i, c)| api::CompletionChoice {
                        index: i as u32,
                        logprobs: self.logprobs.then(|| CompletionLogprobs::from_entries(&c.logprobs, 0)),
                        text: c.text,
                        finish_reason: Some(c.fin.finish_reason),
                    })
                    .collect();
                Json(api::Completion {
                    id: self.id,
                    object: "text_completion",
                    created: self.created,
                    model: self.model,
                    choices,
                    usage: Some(usage),
                    timings: Some(timings),
                })
                .into_response()
            }
        }
    }

    /// One chat stream chunk for choice `index`.
    fn chat_chunk(&self, index: usize, delta: api::Delta, logprobs: Vec<TokenLogprob>, fin: Option<(&Finish, &'static str)>) -> String {
        serde_json::to_string(&api::ChatChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            choices: vec![api::ChunkChoice {
                index: index as u32,
                delta,
                logprobs: (self.logprobs && !logprobs.is_empty()).then_some(api::ChatLogprobs { content: logprobs }),
                finish_reason: fin.map(|f| f.1),
            }],
            usage: fin.map(|f| f.0.usage),
            timings: fin.map(|f| f.0.timings),
        })
        .unwrap_or_default()
    }

    /// One completion stream chunk for choice `index`; `offset`: text already sent.
    fn completion_chunk(&self, index: usize, text: String, logprobs: &[TokenLogprob], offset: usize, fin: Option<&Finish>) -> String {
        serde_json::to_string(&api::Completion {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices: vec![api::CompletionChoice {
                index: index as u32,
                text,
                logprobs: (self.logprobs && !logprobs.is_empty()).then(|| CompletionLogprobs::from_entries(logprobs, offset)),
                finish_reason: fin.map(|f| f.finish_reason),
            }],
            usage: fin.map(|f| f.usage),
            timings: fin.map(|f| f.timings),
        })
        .unwrap_or_default()
    }

    /// OpenAI's `stream_options.include_usage` chunk: no choices, just usage.
    fn usage_chunk(&self, usage: Usage) -> String {
        let object = if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
        serde_json::json!({
            "id": self.id, "object": object, "created": self.created, "model": self.model,
            "choices": [], "usage": usage,
        })
        .to_string()
    }
}

/// Per-choice state of a stream.
struct ChoiceState {
    sent: usize,
    tools: Option<ToolStream>,
    fin: Option<Finish>,
}

/// The SSE body: `data: {chunk}` per piece of each choice, each choice's closing chunk,
/// the usage chunk when asked, `data: [DONE]`. Dropping it (the client went away) drops
/// the receivers, which cancels the jobs.
pub fn sse(
    meta: Meta,
    include_usage: bool,
    rxs: Vec<mpsc::UnboundedReceiver<Event>>,
) -> Sse<impl Stream<Item = Result<SseEvent, Infallible>>> {
    let meta = Arc::new(meta);
    let n = rxs.len();
    let data = |s: String| Ok(SseEvent::default().data(s));
    let first: Vec<_> = match meta.kind {
        Kind::Chat => (0..n)
            .map(|i| {
                let d = api::Delta { role: Some("assistant"), content: Some(String::new()), ..Default::default() };
                data(meta.chat_chunk(i, d, vec![], None))
            })
            .collect(),
        Kind::Completion => vec![],
    };
    let mut states: Vec<ChoiceState> =
        (0..n).map(|_| ChoiceState { sent: 0, tools: meta.tools.as_ref().map(ToolParser::stream), fin: None }).collect();
    let merged = stream::select_all(
        rxs.into_iter().enumerate().map(|(i, rx)| UnboundedReceiverStream::new(rx).map(move |ev| (i, ev))),
    );
    let m = meta.clone();
    let rest = merged.flat_map(move |(i, ev)| {
        let mut out = Vec::new();
        let st = &mut states[i];
        match ev {
            Event::Text(p) => match m.kind {
                Kind::Chat => {
                    let (content, calls) = match &mut st.tools {
                        Some(ts) => ts.push(&p.text),
                        None => (Some(p.text), vec![]),
                    };
                    let reasoning_content = st.tools.as_mut().and_then(ToolStream::take_reasoning);
                    let content = content.filter(|c| !c.is_empty() || reasoning_content.is_none());
                    if content.as_ref().is_some_and(|c| !c.is_empty()) || reasoning_content.is_some() || !calls.is_empty() || !p.logprobs.is_empty() {
                        let d = api::Delta { role: None, content, reasoning_content, tool_calls: calls };
                        out.push(data(m.chat_chunk(i, d, p.logprobs, None)));
                    }
                }
                Kind::Completion => {
                    let len = p.text.len();
                    out.push(data(m.completion_chunk(i, p.text, &p.logprobs, st.sent, None)));
                    st.sent += len;
                }
            },
            Event::Done(fin) => {
                match m.kind {
                    Kind::Chat => {
                        let (content, calls) = st.tools.as_mut().map(ToolStream::finish).unwrap_or((None, vec![]));
                        let reasoning_content = st.tools.as_mut().and_then(ToolStream::take_reasoning);
                        let called = st.tools.as_ref().is_some_and(ToolStream::called);
                        if content.as_ref().is_some_and(|c| !c.is_empty()) || reasoning_content.is_some() || !calls.is_empty() {
                            let d = api::Delta { role: None, content, reasoning_content, tool_calls: calls };
                            out.push(data(m.chat_chunk(i, d, vec![], None)));
                        }
                        let reason = if called { "tool_calls" } else { fin.finish_reason };
                        out.push(data(m.chat_chunk(i, api::Delta::default(), vec![], Some((&fin, reason)))));
                    }
                    Kind::Completion => out.push(data(m.completion_chunk(i, String::new(), &[], st.sent, Some(&fin)))),
                }
                st.fin = Some(fin);
                if states.iter().all(|s| s.fin.is_some()) {
                    if include_usage {
                        out.push(data(m.usage_chunk(total_usage(states.iter().filter_map(|s| s.fin.as_ref())))));
                    }
                    out.push(data("[DONE]".into()));
                }
            }
            Event::Error(e) => out.push(data(e.body_json())),
            Event::Started { .. } => {}
        }
        stream::iter(out)
    });
    Sse::new(stream::iter(first).chain(rest)).keep_alive(KeepAlive::default())
}
