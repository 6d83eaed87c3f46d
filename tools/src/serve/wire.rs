//! The OpenAI wire format's response side: typed serde structs for every response and
//! stream chunk, and llama-server's `timings`.

use serde::Serialize;

use super::logprobs::TokenLogprob;

/// `usage` of a response.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

/// llama-server's `timings`: prompt tokens evaluated (after the slot's cached prefix)
/// and generated tokens, with their wall times.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Timings {
    /// Prompt tokens reused from the slot's KV cache (not evaluated again).
    pub cache_n: usize,
    pub prompt_n: usize,
    pub prompt_ms: f64,
    pub prompt_per_token_ms: f64,
    pub prompt_per_second: f64,
    pub predicted_n: usize,
    pub predicted_ms: f64,
    pub predicted_per_token_ms: f64,
    pub predicted_per_second: f64,
    /// Speculative decoding (llama-server's names): tokens drafted, and of those accepted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draft_n_accepted: Option<usize>,
}

impl Timings {
    pub fn new(cache_n: usize, prompt_n: usize, prompt_secs: f64, predicted_n: usize, predicted_secs: f64) -> Timings {
        let per = |n: usize, s: f64| if n == 0 { 0.0 } else { n as f64 / s.max(1e-9) };
        let per_tok_ms = |n: usize, s: f64| if n == 0 { 0.0 } else { s * 1e3 / n as f64 };
        Timings {
            cache_n,
            prompt_n,
            prompt_ms: prompt_secs * 1e3,
            prompt_per_token_ms: per_tok_ms(prompt_n, prompt_secs),
            prompt_per_second: per(prompt_n, prompt_secs),
            predicted_n,
            predicted_ms: predicted_secs * 1e3,
            predicted_per_token_ms: per_tok_ms(predicted_n, predicted_secs),
            predicted_per_second: per(predicted_n, predicted_secs),
            draft_n: None,
            draft_n_accepted: None,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct AssistantMessage {
    pub role: &'static str,
    /// `null` when the answer is only tool calls (as OpenAI sends it).
    pub content: Option<String>,
    /// The model's reasoning where its format separates it (gpt-oss's analysis channel),
    /// as llama-server and DeepSeek's API name it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

/// One function call the model asked for.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: FunctionCall,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct FunctionCall {
    pub name: String,
    /// The arguments as a JSON text (OpenAI's convention).
    pub arguments: String,
}

/// A streamed piece of a tool call (`index` says which call it belongs to).
#[derive(Clone, Debug, Serialize)]
pub struct ToolCallDelta {
    pub index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    pub function: FunctionDelta,
}

#[derive(Clone, Debug, Serialize)]
pub struct FunctionDelta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub arguments: String,
}

/// A chat choice's `logprobs`: one entry per generated token.
#[derive(Clone, Debug, Serialize)]
pub struct ChatLogprobs {
    pub content: Vec<TokenLogprob>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: AssistantMessage,
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: &'static str,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatCompletion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
    pub timings: Timings,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Delta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallDelta>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChunkChoice {
    pub index: u32,
    pub delta: Delta,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
    pub finish_reason: Option<&'static str>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ChatChunk {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChunkChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub logprobs: Option<super::logprobs::CompletionLogprobs>,
    pub finish_reason: Option<&'static str>,
}

/// A `/v1/completions` response, and (with `object: "text_completion"` too, as OpenAI
/// does) each of its stream chunks.
#[derive(Clone, Debug, Serialize)]
pub struct Completion {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelCard {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
    /// lode's extra facts about the model (like llama-server's `meta`).
    pub meta: ModelMeta,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelMeta {
    pub n_ctx: usize,
    pub n_ctx_train: usize,
    pub n_vocab: usize,
    pub n_embd: usize,
    pub size: u64,
    pub aliases: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ModelList {
    pub object: &'static str,
    pub data: Vec<ModelCard>,
}

/// Seconds since the Unix epoch (`created`).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

