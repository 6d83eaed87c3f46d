//! Pre-tokenizers of byte-level BPE models: the regex lists that cut a text fragment into
//! pieces before merges run, chosen by `tokenizer.ggml.pre`.
//!
//! Each regex of a list splits every piece the previous one produced; the text between
//! matches is kept as pieces of its own (a regex never drops text). The patterns are the
//! ones llama.cpp applies (its hand-coded GPT-2 and Llama-3 splitters are equivalent to
//! these regexes); `fancy-regex` provides the `(?!\S)` lookahead.

use fancy_regex::Regex;

use super::TokenizerError;

/// GPT-2's pattern.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Llama 3's pattern, with the case-insensitive contractions spelled out.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's pattern: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k) pattern as llama.cpp applies it (`LLAMA_VOCAB_PRE_TYPE_GPT4O`): the
/// tokenizer.json's upper/lower-case letter classes written as "a letter that is not
/// a-z" and "a letter that is not A-Z", contractions spelled out.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A pre-tokenizer family; names that share a regex list map to one variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `default` (and a missing `tokenizer.ggml.pre`): punctuation runs, GPT-2, digit runs, digit triples.
    Default,
    /// `gpt-2` and friends: the GPT-2 pattern alone.
    Gpt2,
    /// `smollm`, `starcoder`, ...: every digit its own piece, then GPT-2.
    Smollm,
    /// `llama-bpe`, `llama3`, ...: Llama 3's pattern (digits in groups of up to three).
    Llama3,
    /// `qwen2`, `deepseek-r1-qwen`, ...: Llama 3's pattern with single digits.
    Qwen2,
    /// `gpt-4o` (gpt-oss's o200k), `llama4`, ...: GPT-4o's pattern.
    Gpt4o,
}

/// Names accepted for each family (llama.cpp's aliases).
const NAMES: &[(PreTokenizer, &[&str])] = &[
    (PreTokenizer::Default, &["default"]),
    (PreTokenizer::Gpt2, &["gpt-2", "phi-2", "mpt", "olmo", "jais", "jina-es", "jina-de", "jina-v2-es", "jina-v2-de", "gigachat", "exaone4", "trillion", "granite-docling"]),
    (PreTokenizer::Smollm, &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"]),
    (PreTokenizer::Llama3, &["llama-bpe", "llama3", "llama-v3", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "dbrx", "smaug-bpe"]),
    (PreTokenizer::Qwen2, &["qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan", "megrez"]),
    (PreTokenizer::Gpt4o, &["gpt-4o", "llama4", "kanana2", "talkie"]),
];

impl PreTokenizer {
    /// The family of `tokenizer.ggml.pre`; a missing name means `default` (with a warning,
    /// as llama.cpp: such files tokenize worse than their model was trained with).
    pub fn from_name(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let Some(name) = name else {
            tracing::warn!("tokenizer.ggml.pre is missing; using the 'default' pre-tokenizer (quality may suffer)");
            return Ok(PreTokenizer::Default);
        };
        for (kind, names) in NAMES {
            if names.contains(&name) {
                return Ok(*kind);
            }
        }
        Err(TokenizerError::UnsupportedPre {
            pre: name.to_string(),
            supported: Self::supported_names().join(", "),
        })
    }

    /// Every accepted `tokenizer.ggml.pre` value.
    pub fn supported_names() -> Vec<&'static str> {
        NAMES.iter().flat_map(|(_, n)| n.iter().copied()).collect()
    }

    /// Llama 3 files tokenize whole pieces that are tokens without merging.
    pub fn ignore_merges(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Llama 3 adds BOS by default; other BPE models only when the file says so.
    pub fn default_add_bos(self) -> bool {
        self == PreTokenizer::Llama3
    }

    /// Whether detokenization removes spaces before punctuation (HF's
    /// `clean_up_tokenization_spaces`); qwen2, smollm, command-r and gpt-4o turn it off.
    pub fn clean_spaces(self) -> bool {
        !matches!(self, PreTokenizer::Smollm | PreTokenizer::Qwen2 | PreTokenizer::Gpt4o)
    }

    fn patterns(self) -> &'static [&'static str] {
        match self {
            PreTokenizer::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            PreTokenizer::Gpt2 => &[GPT2],
            PreTokenizer::Smollm => &[r"\p{N}", GPT2],
            PreTokenizer::Llama3 => &[LLAMA3],
            PreTokenizer::Qwen2 => &[QWEN2],
            PreTokenizer::Gpt4o => &[GPT4O],
        }
    }
}

/// A compiled regex list.
#[derive(Clone, Debug)]
pub struct Splitter {
    regexes: Vec<Regex>,
}

impl Splitter {
    pub fn new(pre: PreTokenizer) -> Splitter {
        let regexes = pre
            .patterns()
            .iter()
            // The patterns are constants checked by the tests; a failure is a bug here.
            .map(|p| Regex::new(p).expect("built-in pre-tokenizer regex compiles"))
            .collect();
        Splitter { regexes }
    }

    /// Byte ranges of the pieces of `text`, in order, covering all of it.
    pub fn split(&self, text: &str) -> Vec<(usize, usize)> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut pieces = vec![(0, text.len())];
        for re in &self.regexes {
            let mut next = Vec::with_capacity(pieces.len() * 2);
            for &(s, e) in &pieces {
                split_one(re, text, s, e, &mut next);
            }
            pieces = next;
        }
        pieces
    }
}

/// Split `text[s..e]` by the matches of `re`, keeping the gaps.
fn split_one(re: &Regex, text: &str, s: usize, e: usize, out: &mut Vec<(usize, usize)>) {
    let piece = &text[s..e];
    let mut last = 0;
    for m in re.find_iter(piece) {
        let m = match m {
            Ok(m) => m,
            Err(err) => {
                // Only a backtracking limit can fail here; keep the rest as one piece.
                tracing::warn!("pre-tokenizer regex gave up ({err}); keeping {} bytes unsplit", piece.len() - last);
                break;
            }
        };
        if m.start() > last {
            out.push((s + last, s + m.start()));
        }
        if m.end() > m.start() {
            out.push((s + m.start(), s + m.end()));
        }
        last = m.end();
    }
    if last < piece.len() {
        out.push((s + last, e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(pre: PreTokenizer, text: &str) -> Vec<String> {
        Splitter::new(pre).split(text).into_iter().map(|(s, e)| text[s..e].to_string()).collect()
    }

    #[test]
    fn smollm_splits_every_digit() {
        assert_eq!(pieces(PreTokenizer::Smollm, " 123"), [" ", "1", "2", "3"]);
    }

    #[test]
    fn llama3_groups_digits_by_three_and_keeps_newlines() {
        assert_eq!(pieces(PreTokenizer::Llama3, "1234567"), ["123", "456", "7"]);
        assert_eq!(pieces(PreTokenizer::Llama3, "a  \n\nb"), ["a", "  \n\n", "b"]);
        assert_eq!(pieces(PreTokenizer::Llama3, "I'VE x"), ["I", "'VE", " x"]);
    }

    #[test]
    fn gpt2_whitespace_run_leaves_last_space_to_the_word() {
        assert_eq!(pieces(PreTokenizer::Gpt2, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(PreTokenizer::Gpt2, "a   "), ["a", "   "]);
    }

    /// GPT-4o's pattern: a word keeps its leading punctuation-or-space and splits at a
    /// lower-to-upper case change, digits go in threes, and `/` and newlines stay with
    /// the punctuation before them.
    #[test]
    fn gpt4o_splits_case_runs_digits_and_punctuation() {
        assert_eq!(pieces(PreTokenizer::Gpt4o, "HelloWorld 12345"), ["Hello", "World", " ", "123", "45"]);
        assert_eq!(pieces(PreTokenizer::Gpt4o, "I'VE don't"), ["I'VE", " don't"]);
        assert_eq!(pieces(PreTokenizer::Gpt4o, "a.b/\nc  d"), ["a", ".b", "/\n", "c", " ", " d"]);
        assert_eq!(pieces(PreTokenizer::Gpt4o, "<|start|>user"), ["<|", "start", "|>", "user"]);
    }

    #[test]
    fn unknown_name_lists_the_supported_ones() {
        let err = PreTokenizer::from_name(Some("nope")).unwrap_err().to_string();
        assert!(err.contains("nope") && err.contains("qwen2") && err.contains("llama-bpe"), "{err}");
    }
}
