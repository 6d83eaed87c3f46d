//! llama-server's endpoints beside the OpenAI ones: `/tokenize`, `/detokenize`,
//! `/props`, `/slots`, and `/v1/embeddings` (with `--embeddings`: mean pooling of the
//! last hidden state after the output norm, L2-normalised, as llama-server does by
//! default; `encoding_format` `float` or `base64`).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::errors::ApiError;
use super::routes::{parse_body, AppState};

type St = State<Arc<AppState>>;

fn object(v: &Value) -> Result<&Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))
}

fn flag(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_param(key, format!("`{key}` must be a boolean"))),
    }
}

/// Token ids from a JSON array, each checked against the vocabulary.
fn token_ids(v: &Value, key: &str, n_vocab: usize) -> Result<Vec<u32>, ApiError> {
    let bad = || ApiError::invalid_param(key, format!("`{key}` must be an array of token ids below {n_vocab}"));
    let a = v.as_array().ok_or_else(bad)?;
    a.iter()
        .map(|x| x.as_u64().filter(|&t| (t as usize) < n_vocab).map(|t| t as u32).ok_or_else(bad))
        .collect()
}

/// `POST /tokenize {"content", "add_special"?, "parse_special"?, "with_pieces"?}`.
pub async fn tokenize(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    let obj = object(&v)?;
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(ApiError::invalid_param("content", "`content` (a string) is required")),
    };
    let add_special = flag(obj, "add_special", false)?;
    let parse_special = flag(obj, "parse_special", true)?;
    let with_pieces = flag(obj, "with_pieces", false)?;
    let ids = st.tok.encode(&content, add_special, parse_special);
    let tokens: Vec<Value> = if with_pieces {
        ids.iter()
            .map(|&id| {
                let b = st.tok.token_to_piece(id);
                let piece = match std::str::from_utf8(b) {
                    Ok(s) => json!(s),
                    Err(_) => json!(b),
                };
                json!({"id": id, "piece": piece})
            })
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

/// `POST /detokenize {"tokens": [ids]}`.
pub async fn detokenize(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let v = parse_body(body)?;
    let obj = object(&v)?;
    let ids = token_ids(obj.get("tokens").unwrap_or(&Value::Null), "tokens", st.tok.vocab_size())?;
    Ok(Json(json!({ "content": st.tok.decode(&ids) })).into_response())
}

/// `GET /props`: the server's settings.
pub async fn props(State(st): St) -> Response {
    let d = lode_runtime::engine::SamplerParams::default();
    Json(json!({
        "default_generation_settings": {
            "n_ctx": st.n_ctx,
            "params": {
                "temperature": d.temp, "top_k": d.top_k, "top_p": d.top_p, "min_p": d.min_p,
                "repeat_penalty": d.repeat_penalty, "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty, "repeat_last_n": d.penalty_last_n,
            },
        },
        "total_slots": st.metrics.slots,
        "model_path": st.model_path,
        "model_alias": st.model_id,
        "chat_template": st.tok.chat_template().unwrap_or(""),
        "embeddings": st.embed.is_some(),
        "modalities": { "vision": false, "audio": false },
        "build_info": concat!("lode ", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// `GET /slots`: each slot and whether it is generating.
pub async fn slots(State(st): St) -> Response {
    let v: Vec<Value> = (0..st.metrics.slots)
        .map(|i| json!({"id": i, "n_ctx": st.n_ctx, "is_processing": st.metrics.is_busy(i)}))
        .collect();
    Json(v).into_response()
}

/// The texts (or token lists) of an embeddings `input`.
fn inputs(v: Option<&Value>, n_vocab: usize) -> Result<Vec<Input>, ApiError> {
    let bad = || ApiError::invalid_param("input", "`input` must be a string, an array of strings, or token ids (one array or an array of arrays)");
    let all = match v {
        Some(Value::String(s)) => vec![Input::Text(s.clone())],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_string) => {
            a.iter().map(|s| Input::Text(s.as_str().unwrap_or_default().to_string())).collect()
        }
        Some(v @ Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => vec![Input::Ids(token_ids(v, "input", n_vocab)?)],
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_array) => {
            a.iter().map(|x| token_ids(x, "input", n_vocab).map(Input::Ids)).collect::<Result<_, _>>()?
        }
        _ => return Err(bad()),
    };
    if all.len() > 256 {
        return Err(ApiError::invalid_param("input", format!("at most 256 inputs per request, got {}", all.len())));
    }
    Ok(all)
}

enum Input {
    Text(String),
    Ids(Vec<u32>),
}

/// `POST /v1/embeddings`.
pub async fn embeddings(State(st): St, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let Some(embed) = st.embed.clone() else {
        return Err(ApiError {
            status: StatusCode::NOT_IMPLEMENTED,
            message: "this server does not compute embeddings; start it with --embeddings".into(),
            kind: "not_supported_error",
            param: None,
            code: None,
        });
    };
    let v = parse_body(body)?;
    let obj = object(&v)?;
    let base64 = match obj.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(_) => return Err(ApiError::invalid_param("encoding_format", "`encoding_format` must be `float` or `base64`")),
    };
    if obj.get("dimensions").is_some_and(|d| !d.is_null()) {
        return Err(ApiError::invalid_param("dimensions", "`dimensions` is not supported (the model's width is fixed)"));
    }
    let inputs = inputs(obj.get("input"), st.tok.vocab_size())?;
    let st2 = st.clone();
    let out = tokio::task::spawn_blocking(move || -> Result<(Vec<Vec<f32>>, usize), ApiError> {
        let (mut vecs, mut n_tokens) = (Vec::new(), 0);
        for (i, inp) in inputs.into_iter().enumerate() {
            let ids = match inp {
                Input::Text(t) => st2.tok.encode(&t, true, false),
                Input::Ids(ids) => ids,
            };
            if ids.is_empty() {
                return Err(ApiError::invalid_param("input", format!("input {i} is empty (it has no tokens)")));
            }
            if ids.len() > embed.n_ctx {
                return Err(ApiError::context_exceeded(
                    format!("input {i} has {} tokens but the context holds {}", ids.len(), embed.n_ctx),
                    "input",
                ));
            }
            n_tokens += ids.len();
            let mut e = embed.embed(ids).map_err(|e| ApiError::internal(format!("embedding failed: {e}")))?;
            let norm = e.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
            if norm > 0.0 {
                e.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            }
            vecs.push(e);
        }
        Ok((vecs, n_tokens))
    })
    .await
    .map_err(|e| ApiError::internal(format!("embedding task failed: {e}")))??;
    let (vecs, n_tokens) = out;
    let data: Vec<Value> = vecs
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = e.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(e)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}
