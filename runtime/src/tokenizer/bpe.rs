//! Byte-level BPE (`tokenizer.ggml.model = gpt2`: Llama 3, Qwen2/3, SmolLM2, GPT-2).
//!
//! Each pre-tokenized piece is mapped to GPT-2's printable byte alphabet (every byte a
//! code point; space → `Ġ`, newline → `Ċ`), split into characters, and the adjacent pair
//! with the lowest merge rank is merged until no pair has a rank (ties: leftmost).

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

/// GPT-2's byte → code point table: printable Latin-1 bytes map to themselves, the rest
/// to 256, 257, ... in byte order.
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut extra = 0;
    for b in 0..256u32 {
        let cp = if printable(b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        // Every value here is below 0x180, a valid scalar.
        table[b as usize] = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// The inverse of [`byte_to_char_table`].
pub fn char_to_byte_map() -> HashMap<char, u8> {
    byte_to_char_table().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect()
}

/// Merge ranks, keyed by the merge text `"left right"`.
#[derive(Clone, Debug, Default)]
pub struct Merges {
    ranks: HashMap<String, u32>,
}

impl Merges {
    /// `merges[i]` is `"left right"` with rank `i`; an entry without a separating space
    /// (after its first character) can never match and is kept only for its rank.
    pub fn new(merges: &[String]) -> Merges {
        let mut ranks = HashMap::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            ranks.entry(m.clone()).or_insert(i as u32);
        }
        Merges { ranks }
    }

    fn rank(&self, key: &mut String, left: &str, right: &str) -> Option<u32> {
        key.clear();
        key.push_str(left);
        key.push(' ');
        key.push_str(right);
        self.ranks.get(key.as_str()).copied()
    }
}

/// A candidate merge; the heap pops the lowest rank, then the leftmost.
#[derive(PartialEq, Eq)]
struct Bigram {
    key: Reverse<(u32, usize)>,
    right: usize,
    /// Byte lengths of both sides when queued; a stale entry no longer matches them.
    left_len: usize,
    right_len: usize,
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key.cmp(&other.key)
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// Tokenize one byte-encoded piece.
pub fn tokenize(
    word: &str,
    token_to_id: &HashMap<String, u32>,
    merges: &Merges,
    ignore_merges: bool,
    out: &mut Vec<u32>,
) {
    if word.is_empty() {
        return;
    }
    if ignore_merges {
        if let Some(&id) = token_to_id.get(word) {
            out.push(id);
            return;
        }
    }
    // [n_chars] one symbol per character of the encoded piece
    let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
    for (i, (start, ch)) in word.char_indices().enumerate() {
        symbols.push(Symbol { start, len: ch.len_utf8(), prev: i.checked_sub(1), next: None });
        if i > 0 {
            symbols[i - 1].next = Some(i);
        }
    }

    let mut key = String::new();
    let mut queue = BinaryHeap::new();
    let mut try_add = |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: Option<usize>, right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else { return };
        let (a, b) = (symbols[l], symbols[r]);
        let (lt, rt) = (&word[a.start..a.start + a.len], &word[b.start..b.start + b.len]);
        if let Some(rank) = merges.rank(&mut key, lt, rt) {
            queue.push(Bigram { key: Reverse((rank, l)), right: r, left_len: a.len, right_len: b.len });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }
    while let Some(bg) = queue.pop() {
        let l = bg.key.0 .1;
        let (ls, rs) = (symbols[l], symbols[bg.right]);
        if ls.len == 0 || rs.len == 0 || ls.len != bg.left_len || rs.len != bg.right_len {
            continue;
        }
        symbols[l].len += rs.len;
        symbols[bg.right].len = 0;
        symbols[l].next = rs.next;
        if let Some(n) = rs.next {
            symbols[n].prev = Some(l);
        }
        try_add(&mut queue, &symbols, symbols[l].prev, Some(l));
        try_add(&mut queue, &symbols, Some(l), symbols[l].next);
    }

    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        let piece = &word[s.start..s.start + s.len];
        match token_to_id.get(piece) {
            Some(&id) => out.push(id),
            None => {
                // A leftover that is no token: emit its single-byte characters that are.
                for ch in piece.chars() {
                    match token_to_id.get(ch.encode_utf8(&mut [0; 4]) as &str) {
                        Some(&id) if ch.is_ascii() => out.push(id),
                        _ => tracing::debug!("BPE symbol {piece:?} has no token; {ch:?} dropped"),
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

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(char_to_byte_map().len(), 256);
    }

    #[test]
    fn lowest_rank_merges_first() {
        let toks = ["a", "b", "c", "ab", "bc", "abc"];
        let map: HashMap<String, u32> = toks.iter().enumerate().map(|(i, t)| (t.to_string(), i as u32)).collect();
        // "b c" has rank 0, so "abc" becomes a + bc, and "a bc" is not a merge.
        let merges = Merges::new(&["b c".to_string(), "a b".to_string()]);
        let mut out = Vec::new();
        tokenize("abc", &map, &merges, false, &mut out);
        assert_eq!(out, [0, 4]);
        // ignore_merges takes a whole-token piece as is.
        out.clear();
        tokenize("abc", &map, &merges, true, &mut out);
        assert_eq!(out, [5]);
    }
}
