//! Text ↔ token ids from a GGUF file's `tokenizer.ggml.*` metadata, matching llama.cpp
//! id for id.
//!
//! The path of a text: [`special`] cuts out special tokens first; each remaining text
//! fragment goes to [`spm`] (SentencePiece-style merges by score, `llama` model) or to
//! [`pretokenize`] + [`bpe`] (regex pieces, byte-level merges by rank, `gpt2` model).
//! [`vocab`] reads the metadata and derives flags and special ids the way llama.cpp's
//! loader does; [`detok`] goes back to text; [`chat`] renders chat templates.
//!
//! ```no_run
//! # use lode_runtime::{gguf::GgufFile, tokenizer::Tokenizer};
//! let file = GgufFile::open("model.gguf")?;
//! let tok = Tokenizer::from_gguf(&file)?;
//! let ids = tok.encode("Hello world", true, false); // BOS as the model wants, no special parsing
//! assert_eq!(tok.decode(&ids[1..]), "Hello world");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bpe;
pub mod chat;
pub mod detok;
pub mod pretokenize;
pub mod special;
pub mod spm;
pub mod vocab;

pub use chat::{ChatError, ChatMessage, ChatTemplate, TemplateSource};
pub use detok::StreamDecoder;
pub use pretokenize::PreTokenizer;
pub use vocab::{attr, Algorithm, Vocab, VocabInfo};

use crate::gguf::GgufFile;
use special::{Fragment, SpecialTokens};

/// Why a tokenizer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer model '{model}' (tokenizer.ggml.model); supported: {supported}")]
    UnsupportedModel { model: String, supported: String },
    #[error("unsupported pre-tokenizer '{pre}' (tokenizer.ggml.pre); supported: {supported}")]
    UnsupportedPre { pre: String, supported: String },
    #[error("the GGUF file has no '{0}' (a tokenizer needs it)")]
    MissingKey(String),
    #[error("bad tokenizer metadata '{key}': {reason}")]
    BadMetadata { key: String, reason: String },
}

/// A tokenizer built from a model's vocabulary.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    pub(crate) info: VocabInfo,
    special: SpecialTokens,
    merges: bpe::Merges,
    splitter: Option<pretokenize::Splitter>,
    /// GPT-2 byte alphabet, byte → char.
    byte_to_char: [char; 256],
    /// SPM byte-fallback token per byte.
    byte_tokens: [Option<u32>; 256],
    /// Every token's bytes (special tokens as their text), concatenated.
    piece_data: Vec<u8>,
    /// `[n_vocab + 1]` offsets of each token's bytes in `piece_data`.
    piece_offsets: Vec<usize>,
    chat_template: Option<String>,
}

impl Tokenizer {
    /// Build the tokenizer a GGUF file describes. Needs no tensors (vocabulary-only
    /// files work).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_vocab(&Vocab::from_gguf(file)?)
    }

    /// Build from in-memory metadata.
    pub fn from_vocab(vocab: &Vocab) -> Result<Tokenizer, TokenizerError> {
        let info = VocabInfo::derive(vocab)?;
        let special = SpecialTokens::new(&info.tokens, &info.attrs);
        let (merges, splitter) = match &info.algorithm {
            Algorithm::Bpe(pre) => (bpe::Merges::new(&vocab.merges), Some(pretokenize::Splitter::new(*pre))),
            Algorithm::Spm => (bpe::Merges::default(), None),
        };
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            let hex = format!("<0x{b:02X}>");
            *slot = info.token_to_id.get(&hex).copied().or_else(|| {
                // Fall back to the raw byte as a one-character token (ASCII only: other
                // single bytes are not text).
                (b < 0x80).then(|| info.token_to_id.get(&(b as u8 as char).to_string()).copied()).flatten()
            });
        }
        let char_to_byte = bpe::char_to_byte_map();
        let mut piece_data = Vec::new();
        let mut piece_offsets = Vec::with_capacity(info.tokens.len() + 1);
        piece_offsets.push(0);
        for (text, &a) in info.tokens.iter().zip(&info.attrs) {
            piece_data.extend(detok::piece_bytes(text, a, &info.algorithm, &char_to_byte));
            piece_offsets.push(piece_data.len());
        }
        Ok(Tokenizer {
            info,
            special,
            merges,
            splitter,
            byte_to_char: bpe::byte_to_char_table(),
            byte_tokens,
            piece_data,
            piece_offsets,
            chat_template: vocab.chat_template.clone(),
        })
    }

    /// Text → ids. `add_special`: add BOS/EOS as the model's metadata says;
    /// `parse_special`: turn the text of CONTROL tokens (e.g. `<|im_start|>`) into those
    /// tokens (USER_DEFINED tokens are always recognised).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.info;
        let frags = self.special.partition(text, &v.tokens, &v.attrs, parse_special);
        let mut out = Vec::new();
        if add_special && v.add_bos {
            if let Some(bos) = v.bos {
                out.push(bos);
            }
        }
        match &v.algorithm {
            Algorithm::Spm => {
                let mut prev_special = true;
                for f in frags {
                    match f {
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                        Fragment::Text(s, e) => {
                            let mut t = String::with_capacity(e - s + 3);
                            if v.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..e]);
                            let t = t.replace(' ', "\u{2581}");
                            spm::tokenize(&t, &v.token_to_id, &v.scores, |b| self.byte_tokens[b as usize], &mut out);
                            prev_special = false;
                        }
                    }
                }
            }
            Algorithm::Bpe(_) => {
                let mut word = String::new();
                for f in frags {
                    match f {
                        Fragment::Token(id) => out.push(id),
                        Fragment::Text(s, e) => {
                            let frag = &text[s..e];
                            let pieces = self.splitter.as_ref().map(|sp| sp.split(frag)).unwrap_or_default();
                            for (ps, pe) in pieces {
                                word.clear();
                                word.extend(frag[ps..pe].bytes().map(|b| self.byte_to_char[b as usize]));
                                bpe::tokenize(&word, &v.token_to_id, &self.merges, v.ignore_merges, &mut out);
                            }
                        }
                    }
                }
            }
        }
        if add_special && v.add_bos && out.len() >= 2 && Some(out[1]) == v.bos {
            tracing::warn!("the prompt starts with BOS and the model adds one: it now starts with two");
        }
        if add_special && v.add_eos {
            if let Some(eos) = v.eos {
                out.push(eos);
            }
        }
        out
    }

    /// The bytes of a token, special tokens rendered as their text. Empty for an id
    /// outside the vocabulary.
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        self.piece(id, true)
    }

    /// The bytes of a token; with `special = false` CONTROL and UNKNOWN tokens are empty.
    pub fn piece(&self, id: u32, special: bool) -> &[u8] {
        let i = id as usize;
        if i + 1 >= self.piece_offsets.len() {
            return &[];
        }
        if !special && self.info.attrs[i] & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        &self.piece_data[self.piece_offsets[i]..self.piece_offsets[i + 1]]
    }

    /// Ids → text as llama.cpp's `llama_detokenize(ids, remove_special=false,
    /// unparse_special=false)`: control tokens vanish, invalid UTF-8 becomes U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    /// Ids → bytes with llama.cpp's options (see [`detok::detokenize`]).
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        detok::detokenize(self, ids, remove_special, unparse_special)
    }

    /// A streaming decoder for this tokenizer's output (special tokens not rendered).
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(false)
    }

    pub fn bos(&self) -> Option<u32> {
        self.info.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.info.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.info.eot
    }
    /// Whether encoding with `add_special` puts BOS first.
    pub fn add_bos(&self) -> bool {
        self.info.add_bos && self.info.bos.is_some()
    }
    pub fn add_eos(&self) -> bool {
        self.info.add_eos && self.info.eos.is_some()
    }
    /// End of generation: EOS ∪ EOT ∪ EOM ∪ the tokens llama.cpp recognises by text.
    pub fn is_eog(&self, id: u32) -> bool {
        self.info.eog.contains(&id)
    }
    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.info.eog.iter().copied().collect()
    }
    pub fn vocab_size(&self) -> usize {
        self.info.tokens.len()
    }
    /// The stored text of a token (`▁`/`Ġ` spellings as in the vocabulary).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.info.tokens.get(id as usize).map(String::as_str)
    }
    /// The id of a token by its stored text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.info.token_to_id.get(text).copied()
    }
    /// Attribute bits of a token (see [`attr`]); 0 outside the vocabulary.
    pub fn token_attr(&self, id: u32) -> u32 {
        self.info.attrs.get(id as usize).copied().unwrap_or(0)
    }
    pub fn algorithm(&self) -> &Algorithm {
        &self.info.algorithm
    }
    /// `tokenizer.chat_template`, if the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }
}
