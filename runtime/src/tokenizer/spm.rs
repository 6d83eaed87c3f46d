//! SentencePiece-style tokenization (`tokenizer.ggml.model = llama`: Gemma, Llama 2,
//! Mistral v1): start from single characters, repeatedly merge the adjacent pair whose
//! concatenation is the vocabulary token with the highest score (ties: leftmost), then
//! emit each symbol's token, falling back to `<0xXX>` byte tokens for characters the
//! vocabulary lacks.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// One candidate merge of two adjacent symbols.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    /// Byte length of the merged text; a stale entry no longer matches it.
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score.total_cmp(&other.score).then_with(|| other.left.cmp(&self.left))
    }
}

/// A symbol: a byte range of the text, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Tokenize one fragment whose spaces are already escaped as U+2581.
/// `byte_token(b)` gives the fallback token of a byte (if the vocabulary has one).
pub fn tokenize(
    text: &str,
    token_to_id: &HashMap<String, u32>,
    scores: &[f32],
    byte_token: impl Fn(u8) -> Option<u32>,
    out: &mut Vec<u32>,
) {
    // [n_chars] one symbol per UTF-8 character
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    for (i, (start, ch)) in text.char_indices().enumerate() {
        symbols.push(Symbol { start, len: ch.len_utf8(), prev: i.checked_sub(1), next: None });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }
    if symbols.is_empty() {
        return;
    }

    let mut queue = BinaryHeap::new();
    let try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else { return };
        let (a, b) = (symbols[l], symbols[r]);
        let merged = &text[a.start..b.start + b.len];
        if let Some(&id) = token_to_id.get(merged) {
            queue.push(Bigram { left: l, right: r, score: scores[id as usize], size: merged.len() });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(bg) = queue.pop() {
        let (l, r) = (symbols[bg.left], symbols[bg.right]);
        // Skip pairs where a side was merged away or grew since the pair was queued.
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
            continue;
        }
        symbols[bg.left].len += r.len;
        symbols[bg.right].len = 0;
        symbols[bg.left].next = r.next;
        if let Some(n) = r.next {
            symbols[n].prev = Some(bg.left);
        }
        try_add(&mut queue, &symbols, symbols[bg.left].prev, Some(bg.left));
        try_add(&mut queue, &symbols, Some(bg.left), symbols[bg.left].next);
    }

    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        let piece = &text[s.start..s.start + s.len];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => {
                // Merged symbols are always tokens, so only single characters get here.
                for &b in piece.as_bytes() {
                    match byte_token(b) {
                        Some(id) => out.push(id),
                        None => tracing::warn!("no token for byte 0x{b:02X}; dropped"),
                    }
                }
            }
        }
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocab(entries: &[(&str, f32)]) -> (HashMap<String, u32>, Vec<f32>) {
        let map = entries.iter().enumerate().map(|(i, (t, _))| (t.to_string(), i as u32)).collect();
        (map, entries.iter().map(|e| e.1).collect())
    }

    #[test]
    fn highest_score_merges_first() {
        // "abc": "ab" (score 1) vs "bc" (score 2): "bc" wins, then "a" stays.
        let (map, scores) = vocab(&[("a", 0.0), ("b", 0.0), ("c", 0.0), ("ab", 1.0), ("bc", 2.0)]);
        let mut out = Vec::new();
        tokenize("abc", &map, &scores, |_| None, &mut out);
        assert_eq!(out, [0, 4]);
    }

    #[test]
    fn ties_go_to_the_leftmost_pair() {
        let (map, scores) = vocab(&[("a", 0.0), ("aa", 1.0)]);
        let mut out = Vec::new();
        tokenize("aaa", &map, &scores, |_| None, &mut out);
        assert_eq!(out, [1, 0]);
    }

    #[test]
    fn unknown_characters_fall_back_to_bytes() {
        let (map, scores) = vocab(&[("a", 0.0), ("<0xC3>", 0.0), ("<0xA9>", 0.0)]);
        let mut out = Vec::new();
        let byte = |b: u8| map.get(&format!("<0x{b:02X}>")).copied();
        tokenize("aé", &map, &scores, byte, &mut out);
        assert_eq!(out, [0, 1, 2]);
    }
}
