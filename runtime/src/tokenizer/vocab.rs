//! The vocabulary as the GGUF stores it ([`Vocab`]), and what the loader derives from
//! it: per-token attributes, the special ids, the end-of-generation set and the flags
//! that depend on the tokenizer model and pre-tokenizer ([`VocabInfo`]).
//!
//! The derivation follows llama.cpp's loader so token ids match it exactly: per-model
//! defaults first, then the `tokenizer.ggml.*` keys override; EOT is found by text when
//! the file does not name it, and tokens that look like end-of-turn markers are
//! force-marked CONTROL (which changes how they are split out of text, see `special`).

use std::collections::{BTreeSet, HashMap};

use super::pretokenize::PreTokenizer;
use super::TokenizerError;
use crate::gguf::GgufFile;

/// Per-token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// The tokenizer metadata of a model, as stored (`tokenizer.ggml.*`). `None` means the key
/// is absent; the defaults then come from the tokenizer model (see [`VocabInfo::derive`]).
#[derive(Clone, Debug, Default)]
pub struct Vocab {
    /// `tokenizer.ggml.model`: `llama` (SentencePiece-style) or `gpt2` (byte-level BPE).
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer of a BPE model.
    pub pre: Option<String>,
    /// id → text.
    pub tokens: Vec<String>,
    /// SPM merge priority per id (higher merges first).
    pub scores: Option<Vec<f32>>,
    /// 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// BPE merges `"left right"`, index = rank.
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub pad: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `general.name` (llama.cpp sets strip attributes by model name, e.g. phi-3).
    pub name: Option<String>,
}

/// Which algorithm turns a text fragment into ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// SentencePiece-style merges by score with byte fallback (`tokenizer.ggml.model = llama`).
    Spm,
    /// Byte-level BPE by merge rank (`tokenizer.ggml.model = gpt2`).
    Bpe(PreTokenizer),
}

/// Tokenizer models lode implements.
pub const SUPPORTED_MODELS: &[&str] = &["llama (SentencePiece-style)", "gpt2 (byte-level BPE)"];

/// Everything derived from a [`Vocab`] at load.
#[derive(Clone, Debug)]
pub struct VocabInfo {
    pub algorithm: Algorithm,
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    /// Attribute bits per id (see [`attr`]).
    pub attrs: Vec<u32>,
    pub token_to_id: HashMap<String, u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub eog: BTreeSet<u32>,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub ignore_merges: bool,
    pub clean_spaces: bool,
}

/// Texts that mark an end-of-turn token when the file names none (llama.cpp's list).
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Texts of tokens that end generation (llama.cpp's list); such tokens become CONTROL.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<｜end▁of▁sentence｜>",
];

/// Fill-in-the-middle tokens (prefix, suffix, middle): found by text, forced CONTROL.
const FIM_TEXTS: &[&[&str]] = &[
    &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>"],
    &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>"],
    &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>"],
];

/// Fill-in-the-middle tokens that also end generation (pad, repo, file separator).
const FIM_EOG_TEXTS: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    &["<|file_sep|>"],
];

impl Vocab {
    /// Read the `tokenizer.ggml.*` keys (and `general.name`) of a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> Result<Vocab, TokenizerError> {
        let bad = |key: &str, e: crate::gguf::GgufError| TokenizerError::BadMetadata {
            key: key.to_string(),
            reason: e.to_string(),
        };
        let s = |key: &str| -> Result<Option<String>, TokenizerError> {
            file.get_str(key).map(|v| v.map(str::to_string)).map_err(|e| bad(key, e))
        };
        let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
            match file.get_u64(key).map_err(|e| bad(key, e))? {
                Some(v) => Ok(u32::try_from(v).ok()),
                None => Ok(None),
            }
        };
        let flag = |key: &str| file.get_bool(key).map_err(|e| bad(key, e));

        let model = s("tokenizer.ggml.model")?
            .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.model".into()))?;
        let tokens = file
            .get_str_array("tokenizer.ggml.tokens")
            .map_err(|e| bad("tokenizer.ggml.tokens", e))?
            .ok_or_else(|| TokenizerError::MissingKey("tokenizer.ggml.tokens".into()))?
            .into_iter()
            .map(str::to_string)
            .collect();
        let merges = file
            .get_str_array("tokenizer.ggml.merges")
            .map_err(|e| bad("tokenizer.ggml.merges", e))?
            .map(|m| m.into_iter().map(str::to_string).collect())
            .unwrap_or_default();
        Ok(Vocab {
            model,
            pre: s("tokenizer.ggml.pre")?,
            tokens,
            scores: file
                .get_f32_array("tokenizer.ggml.scores")
                .map_err(|e| bad("tokenizer.ggml.scores", e))?,
            token_types: file
                .get_i32_array("tokenizer.ggml.token_type")
                .map_err(|e| bad("tokenizer.ggml.token_type", e))?,
            merges,
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: flag("tokenizer.ggml.add_bos_token")?,
            add_eos: flag("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
            chat_template: s("tokenizer.chat_template")?,
            name: s("general.name")?,
        })
    }
}

impl VocabInfo {
    /// Apply llama.cpp's defaults and overrides to the stored metadata.
    pub fn derive(v: &Vocab) -> Result<VocabInfo, TokenizerError> {
        let n = v.tokens.len();
        if n == 0 {
            return Err(TokenizerError::BadMetadata {
                key: "tokenizer.ggml.tokens".into(),
                reason: "the vocabulary is empty".into(),
            });
        }
        check_len("tokenizer.ggml.scores", v.scores.as_ref().map(Vec::len), n)?;
        check_len("tokenizer.ggml.token_type", v.token_types.as_ref().map(Vec::len), n)?;

        // Per-model defaults (before the keys override them).
        let (algorithm, mut bos, mut eos, mut unk, mut add_bos, mut add_space_prefix);
        let (mut ignore_merges, mut clean_spaces) = (false, false);
        match v.model.as_str() {
            "llama" => {
                algorithm = Algorithm::Spm;
                (bos, eos, unk) = (Some(1), Some(2), Some(0));
                (add_bos, add_space_prefix) = (true, true);
            }
            "gpt2" => {
                if v.merges.is_empty() {
                    return Err(TokenizerError::MissingKey("tokenizer.ggml.merges".into()));
                }
                let pre = PreTokenizer::from_name(v.pre.as_deref())?;
                (bos, eos, unk) = (Some(11), Some(11), None);
                add_space_prefix = false;
                add_bos = pre.default_add_bos();
                ignore_merges = pre.ignore_merges();
                clean_spaces = pre.clean_spaces();
                algorithm = Algorithm::Bpe(pre);
            }
            other => {
                return Err(TokenizerError::UnsupportedModel {
                    model: other.to_string(),
                    supported: SUPPORTED_MODELS.join(", "),
                })
            }
        }
        if let Some(b) = v.add_space_prefix {
            add_space_prefix = b;
        }

        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id = HashMap::with_capacity(n);
        for (i, t) in v.tokens.iter().enumerate() {
            let text = if t.is_empty() {
                tracing::warn!("empty token at index {i}");
                format!("[EMPTY_{i}]")
            } else {
                t.clone()
            };
            if let Some(prev) = token_to_id.insert(text.clone(), i as u32) {
                return Err(TokenizerError::BadMetadata {
                    key: "tokenizer.ggml.tokens".into(),
                    reason: format!("duplicate token {text:?} at ids {prev} and {i}"),
                });
            }
            tokens.push(text);
        }
        let scores = v.scores.clone().unwrap_or_else(|| vec![0.0; n]);
        let mut attrs: Vec<u32> = match &v.token_types {
            Some(tt) => tt.iter().map(|&t| type_to_attr(t)).collect(),
            None => vec![attr::NORMAL; n],
        };

        // Special ids from the file override the defaults when they are in range.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        for (slot, key) in [(&mut bos, v.bos), (&mut eos, v.eos), (&mut unk, v.unk)] {
            if let Some(id) = key {
                if (id as usize) < n {
                    *slot = Some(id);
                } else {
                    tracing::warn!("special token id {id} is outside the vocabulary ({n}); ignored");
                }
            }
        }
        let mut eot = in_range(v.eot);
        let mut eom = in_range(v.eom);
        if let Some(b) = v.add_bos {
            add_bos = b;
        }
        let add_eos = v.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(TokenizerError::BadMetadata {
                key: "tokenizer.ggml.add_bos_token".into(),
                reason: "is true but the vocabulary has no BOS token".into(),
            });
        }
        if add_eos && eos.is_none() {
            return Err(TokenizerError::BadMetadata {
                key: "tokenizer.ggml.add_eos_token".into(),
                reason: "is true but the vocabulary has no EOS token".into(),
            });
        }

        // EOT/EOM by text when the file names none; the lowest matching id wins so the
        // choice is deterministic (llama.cpp takes whichever its hash map yields first).
        let find = |texts: &[&str]| texts.iter().filter_map(|t| token_to_id.get(*t).copied()).min();
        if eot.is_none() {
            eot = find(EOT_TEXTS);
        }
        if eom.is_none() {
            eom = find(&["<|eom_id|>"]);
        }
        for id in [eot, eom].into_iter().flatten() {
            force_control(&mut attrs, &tokens, id);
        }

        for texts in FIM_TEXTS {
            if let Some(id) = find(texts) {
                force_control(&mut attrs, &tokens, id);
            }
        }
        let mut eog = BTreeSet::new();
        for texts in FIM_EOG_TEXTS {
            if let Some(id) = find(texts) {
                force_control(&mut attrs, &tokens, id);
                eog.insert(id);
            }
        }
        for t in EOG_TEXTS {
            if let Some(&id) = token_to_id.get(*t) {
                force_control(&mut attrs, &tokens, id);
                eog.insert(id);
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        harmony(&mut attrs, &token_to_id, &mut eog);

        // Model-name heuristics for strip attributes (phi-3 strips whitespace after specials).
        let name = v.name.as_deref().unwrap_or("").to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for a in attrs.iter_mut() {
                if *a & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                    *a |= attr::RSTRIP;
                }
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(&id) = token_to_id.get(t) {
                    attrs[id as usize] &= !attr::RSTRIP;
                }
            }
        }

        Ok(VocabInfo {
            algorithm,
            tokens,
            scores,
            attrs,
            token_to_id,
            bos,
            eos,
            eot,
            eom,
            unk,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            ignore_merges,
            clean_spaces,
        })
    }
}

fn check_len(key: &str, got: Option<usize>, n: usize) -> Result<(), TokenizerError> {
    match got {
        Some(m) if m < n => Err(TokenizerError::BadMetadata {
            key: key.into(),
            reason: format!("{m} entries for {n} tokens"),
        }),
        _ => Ok(()),
    }
}

fn type_to_attr(t: i32) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => 0,
    }
}

/// gpt-oss's o200k_harmony vocabulary, as llama.cpp treats it: the message-structure
/// tokens are USER_DEFINED (always rendered), and with both `<|return|>` and `<|call|>`
/// ending generation, `<|end|>` (the end of every message) does not.
fn harmony(attrs: &mut [u32], token_to_id: &std::collections::HashMap<String, u32>, eog: &mut BTreeSet<u32>) {
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(&id) = token_to_id.get(t) {
            attrs[id as usize] = attr::USER_DEFINED;
        }
    }
    let id = |t: &str| token_to_id.get(t).copied().filter(|i| eog.contains(i));
    if let (Some(_), Some(_), Some(end)) = (id("<|return|>"), id("<|call|>"), id("<|end|>")) {
        eog.remove(&end);
        attrs[end as usize] = attr::USER_DEFINED;
    }
}

fn force_control(attrs: &mut [u32], tokens: &[String], id: u32) {
    let a = &mut attrs[id as usize];
    if *a & attr::CONTROL == 0 {
        tracing::debug!(
            "control-looking token {id} {:?} was not control-type; marking it control",
            tokens[id as usize]
        );
        *a |= attr::CONTROL;
    }
}
