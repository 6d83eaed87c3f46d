//! Log-probabilities of generated tokens (`logprobs` / `top_logprobs`): the log-softmax
//! of the logits the token was sampled from (the model's distribution before any
//! sampling filter, as OpenAI and llama-server report it), in OpenAI's two shapes. Under
//! a grammar or JSON schema it is the constrained distribution: the tokens the mask
//! forbade have logit −∞ and are never listed, so fewer than `top` may be.

use lode_runtime::tokenizer::Tokenizer;
use serde::Serialize;

/// Most alternatives per token a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// One alternative token and its log-probability.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
}

/// One generated token with its log-probability and the `top` most likely tokens at
/// that step (OpenAI's chat `logprobs.content[i]`).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f32,
    pub bytes: Vec<u8>,
    pub top_logprobs: Vec<TopLogprob>,
}

fn entry(tok: &Tokenizer, id: u32, logprob: f32) -> TopLogprob {
    let bytes = tok.token_to_piece(id).to_vec();
    TopLogprob { token: String::from_utf8_lossy(&bytes).into_owned(), logprob, bytes }
}

/// The log-probability of `id` under `logits` and the `top` most likely tokens, most
/// likely first.
pub fn token_logprob(tok: &Tokenizer, logits: &[f32], id: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_z = max as f64 + sum.ln();
    let lp = |i: usize| (logits[i] as f64 - log_z) as f32;
    let mut best: Vec<usize> = Vec::with_capacity(top + 1);
    if top > 0 {
        for i in 0..logits.len() {
            if logits[i] == f32::NEG_INFINITY {
                continue;
            }
            if best.len() < top || logits[i] > logits[best[best.len() - 1]] {
                let at = best.partition_point(|&b| logits[b] >= logits[i]);
                best.insert(at, i);
                best.truncate(top);
            }
        }
    }
    let e = entry(tok, id, lp(id as usize));
    TokenLogprob {
        token: e.token,
        logprob: e.logprob,
        bytes: e.bytes,
        top_logprobs: best.into_iter().map(|i| entry(tok, i as u32, lp(i))).collect(),
    }
}

/// `/v1/completions`' legacy `logprobs` object.
#[derive(Clone, Debug, Serialize, Default)]
pub struct CompletionLogprobs {
    pub tokens: Vec<String>,
    pub token_logprobs: Vec<f32>,
    pub top_logprobs: Vec<serde_json::Map<String, serde_json::Value>>,
    pub text_offset: Vec<usize>,
}

impl CompletionLogprobs {
    /// From per-token entries; `offset` is the length of the text before the first one.
    pub fn from_entries(entries: &[TokenLogprob], mut offset: usize) -> CompletionLogprobs {
        let mut out = CompletionLogprobs::default();
        for e in entries {
            out.tokens.push(e.token.clone());
            out.token_logprobs.push(e.logprob);
            out.top_logprobs.push(e.top_logprobs.iter().map(|t| (t.token.clone(), serde_json::json!(t.logprob))).collect());
            out.text_offset.push(offset);
            offset += e.token.len();
        }
        out
    }
}
