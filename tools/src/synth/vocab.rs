//! A minimal but complete byte-level BPE ("gpt2") tokenizer for synthetic models: the
//! 256 byte tokens, a few hundred merges built from common words, the architecture's
//! special tokens at their real ids, and `<unused…>` placeholders up to the real
//! vocabulary size (the embedding matrix has that many rows, and llama.cpp requires the
//! token list to match it).

use std::collections::HashSet;

/// Token types as GGUF stores them (`tokenizer.ggml.token_type`).
pub const NORMAL: i32 = 1;
pub const CONTROL: i32 = 3;
pub const UNUSED: i32 = 5;

/// Words whose merges make the vocabulary; each also gets its `Ġ`-prefixed (leading
/// space) form, as byte-level BPE vocabularies have.
const WORDS: &[&str] = &[
    "the", "and", "ing", "that", "with", "for", "this", "you", "are", "was", "have", "not", "but", "from",
    "they", "his", "her", "she", "which", "their", "will", "there", "would", "what", "about", "when",
    "your", "can", "said", "more", "like", "time", "one", "all", "were", "been", "has", "out", "some",
    "into", "them", "than", "then", "only", "could", "over", "also", "after", "just", "first", "new",
    "people", "world", "hello", "model", "token", "Paris", "France", "capital", "is", "of", "in", "to",
    "it", "on", "as", "at", "by", "be", "or", "an", "we", "he", "do", "if", "so", "up", "no", "my",
];

/// The tokenizer's arrays.
pub struct Vocab {
    pub tokens: Vec<String>,
    pub types: Vec<i32>,
    pub merges: Vec<String>,
}

/// GPT-2's reversible byte → printable-char mapping: printable Latin-1 bytes map to
/// themselves, the rest to U+0100 onward in byte order.
pub fn byte_char(b: u8) -> char {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// Build a vocabulary of exactly `n_vocab` tokens with `specials` (id, text) as control
/// tokens at their ids (anywhere: Gemma's and Mistral's sit below the byte tokens).
/// Panics only on a programming error (specials beyond `n_vocab`, or too few free ids
/// for the built tokens), which the presets' unit tests rule out.
pub fn build(n_vocab: usize, specials: &[(usize, &str)]) -> Vocab {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![NORMAL; 256];
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    let mut seen_merges = HashSet::new();
    for word in WORDS {
        for form in [word.to_string(), format!("{}{}", byte_char(b' '), word)] {
            let chars: Vec<String> = form.chars().map(String::from).collect();
            let mut left = chars[0].clone();
            for right in &chars[1..] {
                let merged = format!("{left}{right}");
                if seen_merges.insert((left.clone(), right.clone())) {
                    merges.push(format!("{left} {right}"));
                }
                if known.insert(merged.clone()) {
                    tokens.push(merged.clone());
                    types.push(NORMAL);
                }
                left = merged;
            }
        }
    }
    // Built tokens fill the ids the specials leave free, in order; `<unused…>` the rest.
    // (With every special above the built tokens, as in the Qwen and Llama presets, this
    // is the built list, placeholders, then the specials at their ids.)
    let special: std::collections::HashMap<usize, &str> = specials.iter().copied().collect();
    let free = (0..n_vocab).filter(|i| !special.contains_key(i)).count();
    assert!(tokens.len() <= free && specials.iter().all(|s| s.0 < n_vocab), "specials and built tokens exceed the vocabulary");
    let (built, built_types) = (tokens, types);
    let mut tokens = Vec::with_capacity(n_vocab);
    let mut types = Vec::with_capacity(n_vocab);
    let mut next = built.into_iter().zip(built_types);
    for id in 0..n_vocab {
        if let Some(text) = special.get(&id) {
            tokens.push(text.to_string());
            types.push(CONTROL);
        } else if let Some((t, ty)) = next.next() {
            tokens.push(t);
            types.push(ty);
        } else {
            tokens.push(format!("<unused{id}>"));
            types.push(UNUSED);
        }
    }
    Vocab { tokens, types, merges }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_distinct_and_match_gpt2() {
        let chars: HashSet<char> = (0..=255u8).map(byte_char).collect();
        assert_eq!(chars.len(), 256);
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'A'), 'A');
    }

    #[test]
    fn merges_only_join_known_tokens() {
        let v = build(1000, &[(998, "<|bos|>"), (999, "<|eos|>")]);
        assert_eq!(v.tokens.len(), 1000);
        assert!(v.merges.len() > 200, "{}", v.merges.len());
        let known: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
        assert_eq!(known.len(), 1000, "token texts must be unique");
        for m in &v.merges {
            let (l, r) = m.split_once(' ').unwrap();
            assert!(known.contains(l) && known.contains(r) && known.contains(format!("{l}{r}").as_str()), "{m}");
        }
        assert_eq!(v.types[999], CONTROL);
        assert_eq!(v.types[900], UNUSED);
    }

    /// Specials below the byte tokens keep their ids; the built tokens move past them.
    #[test]
    fn low_special_ids_keep_their_place() {
        let v = build(1000, &[(1, "<eos>"), (2, "<bos>"), (106, "<start_of_turn>")]);
        assert_eq!(v.tokens.len(), 1000);
        assert_eq!((v.tokens[1].as_str(), v.types[1]), ("<eos>", CONTROL));
        assert_eq!(v.tokens[106], "<start_of_turn>");
        assert_eq!(v.tokens[0], byte_char(0).to_string());
        assert_eq!(v.tokens[3], byte_char(1).to_string());
        let known: HashSet<&str> = v.tokens.iter().map(String::as_str).collect();
        assert_eq!(known.len(), 1000);
        for m in &v.merges {
            let (l, r) = m.split_once(' ').unwrap();
            assert!(known.contains(format!("{l}{r}").as_str()), "{m}");
        }
    }
}
