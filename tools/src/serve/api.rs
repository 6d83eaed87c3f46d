//! The OpenAI wire format: requests are read field by field from the JSON object (so a
//! wrong type names its field in the 400), responses are typed serde structs.
//! Unknown request fields are ignored, as OpenAI-compatible servers do; fields that
//! would change the answer but are not supported are refused with a 400 naming them.

use lode_runtime::engine::SamplerParams;
use lode_runtime::tokenizer::ChatMessage;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::errors::ApiError;
use super::logprobs::MAX_TOP_LOGPROBS;
use super::structured::{self, GrammarSpec};
use super::tool_prompt::{self, ToolRequest};

/// Most stop strings one request may carry.
pub const MAX_STOPS: usize = 16;
/// Most choices (`n`) one request may ask for.
pub const MAX_N: usize = 16;
/// The roles a chat message may have (`developer` is read as `system`).
pub const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// What the model is asked to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// `/v1/chat/completions`: rendered with the model's chat template.
    Chat(Vec<ChatMessage>),
    /// `/v1/completions` with a string prompt.
    Text(String),
    /// `/v1/completions` with token ids.
    Tokens(Vec<u32>),
}

/// A validated generation request (either endpoint).
#[derive(Clone, Debug)]
pub struct GenRequest {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` and no choices.
    pub include_usage: bool,
    pub sampling: SamplerParams,
    /// `max_tokens` / `max_completion_tokens`; `None`: until the context is full.
    pub max_tokens: Option<u64>,
    pub stops: Vec<String>,
    /// Choices to generate (`n`), each with its own seed (`seed + i`).
    pub n: usize,
    /// `Some(k)`: log-probabilities with `k` alternatives per token.
    pub logprobs: Option<usize>,
    /// Chat: the messages as the template sees them (with tool calls and results).
    pub chat_json: Vec<Value>,
    /// Chat: the tools offered, and how.
    pub tools: Option<ToolRequest>,
    /// `response_format` / `json_schema` / `grammar`: what the output must match.
    pub grammar: Option<GrammarSpec>,
    /// llama-server's `cache_prompt` (default true): reuse a cached start of the prompt.
    pub cache_prompt: bool,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_f64() => "a number",
        Value::Number(_) => "an integer",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `obj[key]` as `T`; absent or `null` → `None`; another type → 400 naming the field.
fn get<T: DeserializeOwned>(obj: &Map<String, Value>, key: &str, expected: &str) -> Result<Option<T>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|_| ApiError::invalid_param(key, format!("`{key}` must be {expected}, got {}", type_name(v)))),
    }
}

fn check_range(key: &str, v: f64, lo: f64, hi: f64) -> Result<f32, ApiError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(ApiError::invalid_param(key, format!("`{key}` must be between {lo} and {hi}, got {v}")));
    }
    Ok(v as f32)
}

/// The fields both endpoints share. `body` must be a JSON object.
fn parse_common(obj: &Map<String, Value>, prompt: PromptInput) -> Result<GenRequest, ApiError> {
    let model = get::<String>(obj, "model", "a string")?;
    let stream = get::<bool>(obj, "stream", "a boolean")?.unwrap_or(false);
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => get::<bool>(o, "include_usage", "a boolean")?.unwrap_or(false),
        Some(v) => {
            return Err(ApiError::invalid_param(
                "stream_options",
                format!("`stream_options` must be an object, got {}", type_name(v)),
            ))
        }
    };
    refuse_unsupported(obj)?;
    let grammar = structured::parse(obj)?;
    let n = match get::<i64>(obj, "n", "an integer")? {
        None => 1,
        Some(n) if (1..=MAX_N as i64).contains(&n) => n as usize,
        Some(n) => return Err(ApiError::invalid_param("n", format!("`n` must be between 1 and {MAX_N}, got {n}"))),
    };

    let mut s = SamplerParams::default();
    if let Some(t) = get::<f64>(obj, "temperature", "a number")? {
        s.temp = check_range("temperature", t, 0.0, 100.0)?;
    }
    if let Some(p) = get::<f64>(obj, "top_p", "a number")? {
        s.top_p = check_range("top_p", p, 0.0, 1.0)?;
    }
    if let Some(p) = get::<f64>(obj, "min_p", "a number")? {
        s.min_p = check_range("min_p", p, 0.0, 1.0)?;
    }
    if let Some(k) = get::<i64>(obj, "top_k", "an integer")? {
        if k < 0 {
            return Err(ApiError::invalid_param("top_k", format!("`top_k` must be >= 0 (0: off), got {k}")));
        }
        s.top_k = k as usize;
    }
    if let Some(p) = get::<f64>(obj, "presence_penalty", "a number")? {
        s.presence_penalty = check_range("presence_penalty", p, -2.0, 2.0)?;
    }
    if let Some(p) = get::<f64>(obj, "frequency_penalty", "a number")? {
        s.frequency_penalty = check_range("frequency_penalty", p, -2.0, 2.0)?;
    }
    for key in ["repeat_penalty", "repetition_penalty"] {
        if let Some(p) = get::<f64>(obj, key, "a number")? {
            s.repeat_penalty = check_range(key, p, 0.01, 10.0)?;
        }
    }
    s.seed = match get::<i64>(obj, "seed", "an integer")? {
        Some(seed) if seed >= 0 => seed as u64,
        // Absent or -1 (llama-server's "random"): a fresh seed.
        Some(-1) | None => rand::random(),
        Some(seed) => {
            return Err(ApiError::invalid_param("seed", format!("`seed` must be >= 0 (or -1: random), got {seed}")))
        }
    };

    let mut max_tokens = None;
    for key in ["max_tokens", "max_completion_tokens", "n_predict"] {
        if let Some(m) = get::<i64>(obj, key, "an integer")? {
            if m == -1 && key == "n_predict" {
                continue;
            }
            if m < 1 {
                return Err(ApiError::invalid_param(key, format!("`{key}` must be at least 1, got {m}")));
            }
            max_tokens = Some(m as u64);
        }
    }

    let stops = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            let mut v = Vec::with_capacity(a.len());
            for x in a {
                match x {
                    Value::String(s) => v.push(s.clone()),
                    other => {
                        return Err(ApiError::invalid_param(
                            "stop",
                            format!("`stop` must be a string or an array of strings, found {}", type_name(other)),
                        ))
                    }
                }
            }
            v
        }
        Some(v) => {
            return Err(ApiError::invalid_param(
                "stop",
                format!("`stop` must be a string or an array of strings, got {}", type_name(v)),
            ))
        }
    };
    if stops.len() > MAX_STOPS {
        return Err(ApiError::invalid_param("stop", format!("at most {MAX_STOPS} stop strings, got {}", stops.len())));
    }
    let cache_prompt = get::<bool>(obj, "cache_prompt", "a boolean")?.unwrap_or(true);
    Ok(GenRequest {
        model,
        prompt,
        stream,
        include_usage,
        sampling: s,
        max_tokens,
        stops,
        n,
        logprobs: None,
        chat_json: Vec::new(),
        tools: None,
        grammar,
        cache_prompt,
    })
}

/// Fields that would change the answer but that this server does not implement: a 400
/// naming the field, never a silent answer without them.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let set = |k: &str| obj.get(k).filter(|v| !v.is_null());
    for key in ["functions", "function_call", "prediction", "audio"] {
        if set(key).is_some() {
            return Err(ApiError::invalid_param(key, format!("`{key}` is not supported by this server")));
        }
    }
    if let Some(b) = set("logit_bias") {
        if b.as_object().map_or(true, |m| !m.is_empty()) && b.as_array().map_or(true, |a| !a.is_empty()) {
            return Err(ApiError::invalid_param("logit_bias", "`logit_bias` is not supported by this server"));
        }
    }
    if set("best_of").and_then(Value::as_i64).is_some_and(|b| b != 1) {
        return Err(ApiError::invalid_param("best_of", "only `best_of` = 1 is supported"));
    }
    if set("suffix").and_then(Value::as_str).is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid_param("suffix", "`suffix` is not supported by this server"));
    }
    if let Some(m) = set("modalities") {
        if m.as_array().map_or(true, |a| a.iter().any(|x| x != "text")) {
            return Err(ApiError::invalid_param("modalities", "only the `text` modality is supported"));
        }
    }
    Ok(())
}

fn as_object(body: &Value) -> Result<&Map<String, Value>, ApiError> {
    body.as_object()
        .ok_or_else(|| ApiError::bad_request(format!("the request body must be a JSON object, got {}", type_name(body))))
}

/// A `/v1/chat/completions` body.
pub fn parse_chat(body: &Value) -> Result<GenRequest, ApiError> {
    let obj = as_object(body)?;
    let msgs = match obj.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::invalid_param("messages", "`messages` must not be empty")),
        None | Some(Value::Null) => return Err(ApiError::invalid_param("messages", "`messages` is required")),
        Some(v) => {
            return Err(ApiError::invalid_param("messages", format!("`messages` must be an array, got {}", type_name(v))))
        }
    };
    let mut messages = Vec::with_capacity(msgs.len());
    let mut json_messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let param = format!("messages[{i}]");
        let m = m
            .as_object()
            .ok_or_else(|| ApiError::invalid_param(&param, format!("`{param}` must be an object, got {}", type_name(m))))?;
        let role = get::<String>(m, "role", "a string")
            .map_err(|e| ApiError { param: Some(format!("{param}.role")), ..e })?
            .ok_or_else(|| ApiError::invalid_param(&param, format!("`{param}.role` is required")))?;
        if !ROLES.contains(&role.as_str()) {
            return Err(ApiError::invalid_param(
                &format!("{param}.role"),
                format!("`{param}.role` is `{role}`; it must be one of {}", ROLES.join(", ")),
            ));
        }
        // OpenAI's newer name for the system role.
        let role = if role == "developer" { "system".to_string() } else { role };
        let content = message_content(m.get("content"), &param)?;
        json_messages.push(tool_prompt::message_json(m, &role, &content, &param)?);
        messages.push(ChatMessage::new(role, content));
    }
    let mut req = parse_common(obj, PromptInput::Chat(messages))?;
    req.chat_json = json_messages;
    req.tools = tool_prompt::parse(obj)?;
    if let (Some(_), Some(g)) = (&req.tools, &req.grammar) {
        return Err(ApiError::invalid_param(g.field, format!("`{}` cannot be combined with `tools`", g.field)));
    }
    let top = get::<i64>(obj, "top_logprobs", "an integer")?;
    let want = get::<bool>(obj, "logprobs", "a boolean")?.unwrap_or(false);
    req.logprobs = match (want, top) {
        (_, Some(k)) if k < 0 || k as usize > MAX_TOP_LOGPROBS => {
            return Err(ApiError::invalid_param("top_logprobs", format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}")))
        }
        (false, Some(_)) => {
            return Err(ApiError::invalid_param("top_logprobs", "`top_logprobs` needs `logprobs: true`"))
        }
        (true, k) => Some(k.unwrap_or(0) as usize),
        (false, None) => None,
    };
    Ok(req)
}

/// A message's `content`: a string, or an array of `{"type": "text", "text": …}` parts.
fn message_content(v: Option<&Value>, param: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::invalid_param(
                            &format!("{param}.content"),
                            format!("only text content parts are supported, got type {:?}", kind.unwrap_or("?")),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(v) => Err(ApiError::invalid_param(
            &format!("{param}.content"),
            format!("`content` must be a string or an array of text parts, got {}", type_name(v)),
        )),
    }
}

/// A `/v1/completions` body.
pub fn parse_completion(body: &Value) -> Result<GenRequest, ApiError> {
    let obj = as_object(body)?;
    let bad = |v: &Value| {
        ApiError::invalid_param(
            "prompt",
            format!("`prompt` must be a string, an array of one string, or an array of token ids, got {}", type_name(v)),
        )
    };
    let prompt = match obj.get("prompt") {
        None | Some(Value::Null) => return Err(ApiError::invalid_param("prompt", "`prompt` is required")),
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            PromptInput::Text(a[0].as_str().unwrap_or_default().to_string())
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(|x| x.is_string()) => {
            return Err(ApiError::invalid_param("prompt", "only one prompt per request is supported"))
        }
        Some(v @ Value::Array(a)) => {
            let ids: Option<Vec<u32>> = a.iter().map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok())).collect();
            PromptInput::Tokens(ids.ok_or_else(|| bad(v))?)
        }
        Some(v) => return Err(bad(v)),
    };
    if matches!(obj.get("echo"), Some(Value::Bool(true))) {
        return Err(ApiError::invalid_param("echo", "`echo` is not supported by this server"));
    }
    let mut req = parse_common(obj, prompt)?;
    req.logprobs = match get::<i64>(obj, "logprobs", "an integer")? {
        None => None,
        Some(k) if (0..=MAX_TOP_LOGPROBS as i64).contains(&k) => Some(k as usize),
        Some(k) => {
            return Err(ApiError::invalid_param("logprobs", format!("`logprobs` must be between 0 and {MAX_TOP_LOGPROBS}, got {k}")))
        }
    };
    Ok(req)
}

pub use super::wire::*;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(r: Result<GenRequest, ApiError>) -> ApiError {
        r.expect_err("should be refused")
    }

    #[test]
    fn chat_fields_are_read_and_validated() {
        let r = parse_chat(&json!({
            "model": "m", "messages": [{"role": "developer", "content": "be brief"},
                                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "temperature": 0, "top_k": 5, "stop": "\n", "max_completion_tokens": 7, "seed": 3, "stream": true,
            "stream_options": {"include_usage": true}
        }))
        .unwrap();
        assert_eq!(
            r.prompt,
            PromptInput::Chat(vec![ChatMessage::new("system", "be brief"), ChatMessage::new("user", "hi")])
        );
        assert_eq!((r.sampling.temp, r.sampling.top_k, r.sampling.seed), (0.0, 5, 3));
        assert_eq!((r.max_tokens, r.stops.clone(), r.stream, r.include_usage), (Some(7), vec!["\n".to_string()], true, true));
    }

    #[test]
    fn bad_values_name_their_field() {
        let base = || json!({"messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base();
            b[k] = v;
            parse_chat(&b)
        };
        for (k, v) in [
            ("temperature", json!(-0.5)),
            ("temperature", json!("hot")),
            ("top_p", json!(1.5)),
            ("max_tokens", json!(0)),
            ("max_tokens", json!(-3)),
            ("max_tokens", json!(1e30)),
            ("n", json!(99)),
            ("response_format", json!({"type": "xml"})),
            ("response_format", json!({"type": "json_schema"})),
            ("response_format", json!({"type": "json_schema", "json_schema": {"schema": 5}})),
            ("grammar", json!("root ::= foo")),
            ("grammar", json!(5)),
            ("json_schema", json!("object")),
            ("logit_bias", json!({"42": 5})),
            ("top_logprobs", json!(3)),
            ("stop", json!([1, 2])),
            ("seed", json!(-7)),
            ("stream", json!("yes")),
            ("top_k", json!(-1)),
        ] {
            let e = err(with(k, v.clone()));
            assert_eq!(e.status, 400, "{k}={v}");
            assert_eq!(e.param.as_deref(), Some(k), "{k}={v}: {}", e.message);
        }
        assert_eq!(err(parse_chat(&json!({"messages": []}))).param.as_deref(), Some("messages"));
        assert_eq!(err(parse_chat(&json!({"messages": "hi"}))).param.as_deref(), Some("messages"));
        assert_eq!(err(parse_chat(&json!([1]))).param, None);
        let e = err(parse_chat(&json!({"messages": [{"role": 5, "content": "x"}]})));
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
    }

    #[test]
    fn completion_prompt_forms() {
        let p = |v: Value| parse_completion(&json!({"prompt": v})).map(|r| r.prompt);
        assert_eq!(p(json!("a")).unwrap(), PromptInput::Text("a".into()));
        assert_eq!(p(json!(["a"])).unwrap(), PromptInput::Text("a".into()));
        assert_eq!(p(json!([1, 2])).unwrap(), PromptInput::Tokens(vec![1, 2]));
        assert!(p(json!(["a", "b"])).is_err());
        assert!(p(json!([1, -2])).is_err());
        assert!(p(json!(5)).is_err());
        assert!(parse_completion(&json!({})).is_err());
    }
}
