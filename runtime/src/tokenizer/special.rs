//! Special-token partitioning: before either algorithm runs, the literal text of CONTROL,
//! USER_DEFINED and UNKNOWN tokens is cut out of the input and emitted as those ids.
//!
//! Order matters for parity with llama.cpp: tokens are tried longest text first, each
//! one against every text fragment left by the longer ones (not a leftmost scan). With
//! `parse_special = false`, CONTROL and UNKNOWN tokens are skipped but USER_DEFINED ones
//! are still split out (Hugging Face's behaviour, e.g. Gemma's whitespace-run tokens).
//!
//! Trying thousands of tokens against a long text is slow, so an Aho-Corasick scan of the
//! whole input first finds which special tokens occur at all; only those are tried.

use aho_corasick::AhoCorasick;

use super::vocab::attr;

/// A piece of the input after partitioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    /// Byte range of raw text still to be tokenized.
    Text(usize, usize),
    /// A special token, emitted as is.
    Token(u32),
}

/// The special tokens of a vocabulary, ready to partition texts.
#[derive(Clone, Debug)]
pub struct SpecialTokens {
    /// Special ids, longest text first (ties by id).
    ids: Vec<u32>,
    /// Pattern i of the automaton is the text of `ids[i]`.
    finder: Option<AhoCorasick>,
}

impl SpecialTokens {
    pub fn new(tokens: &[String], attrs: &[u32]) -> SpecialTokens {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut ids: Vec<u32> = (0..tokens.len() as u32).filter(|&i| attrs[i as usize] & mask != 0).collect();
        ids.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()).then(a.cmp(&b)));
        let finder = if ids.is_empty() {
            None
        } else {
            match AhoCorasick::new(ids.iter().map(|&i| tokens[i as usize].as_bytes())) {
                Ok(ac) => Some(ac),
                Err(e) => {
                    tracing::warn!("special-token index not built ({e}); scanning token by token");
                    None
                }
            }
        };
        SpecialTokens { ids, finder }
    }

    /// Cut `text` into raw-text fragments and special tokens.
    pub fn partition(&self, text: &str, tokens: &[String], attrs: &[u32], parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let mut frags = vec![Fragment::Text(0, text.len())];
        let present = self.present(text);
        for (rank, &id) in self.ids.iter().enumerate() {
            if let Some(p) = &present {
                if !p[rank] {
                    continue;
                }
            }
            let a = attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = tokens[id as usize].as_str();
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                match f {
                    Fragment::Token(_) => next.push(f),
                    Fragment::Text(s, e) => split_fragment(text, s, e, needle, id, a, &mut next),
                }
            }
            frags = next;
        }
        frags
    }

    /// Which special tokens (by rank in `ids`) occur anywhere in `text`; `None` when
    /// there is no index (every token is then tried).
    fn present(&self, text: &str) -> Option<Vec<bool>> {
        let ac = self.finder.as_ref()?;
        let mut seen = vec![false; self.ids.len()];
        match ac.try_find_overlapping_iter(text.as_bytes()) {
            Ok(iter) => {
                for m in iter {
                    seen[m.pattern().as_usize()] = true;
                }
                Some(seen)
            }
            Err(_) => None,
        }
    }
}

/// Split one text fragment at every occurrence of `needle` (left to right).
fn split_fragment(text: &str, mut s: usize, e: usize, needle: &str, id: u32, a: u32, out: &mut Vec<Fragment>) {
    let is_space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\x0b' | b'\x0c' | b'\r');
    let bytes = text.as_bytes();
    while let Some(off) = text[s..e].find(needle) {
        let m = s + off;
        let mut left_end = m;
        if a & attr::LSTRIP != 0 {
            while left_end > s && is_space(bytes[left_end - 1]) {
                left_end -= 1;
            }
        }
        if left_end > s {
            out.push(Fragment::Text(s, left_end));
        }
        out.push(Fragment::Token(id));
        s = m + needle.len();
        if a & attr::RSTRIP != 0 {
            while s < e && is_space(bytes[s]) {
                s += 1;
            }
        }
    }
    if s < e {
        out.push(Fragment::Text(s, e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (Vec<String>, Vec<u32>) {
        let tokens: Vec<String> = ["a", "<s>", "<start>", "  ", "art>"].iter().map(|s| s.to_string()).collect();
        let attrs = vec![attr::NORMAL, attr::CONTROL, attr::CONTROL, attr::USER_DEFINED, attr::USER_DEFINED];
        (tokens, attrs)
    }

    #[test]
    fn longest_token_wins_even_when_a_shorter_one_starts_earlier() {
        let (tokens, attrs) = setup();
        let sp = SpecialTokens::new(&tokens, &attrs);
        // "<start>" (7 bytes) is tried before "art>" (4 bytes).
        let f = sp.partition("x<start>y", &tokens, &attrs, true);
        assert_eq!(f, [Fragment::Text(0, 1), Fragment::Token(2), Fragment::Text(8, 9)]);
        // Without special parsing only the user-defined tokens split.
        let f = sp.partition("x<start>  y", &tokens, &attrs, false);
        assert_eq!(
            f,
            [Fragment::Text(0, 4), Fragment::Token(4), Fragment::Token(3), Fragment::Text(10, 11)]
        );
    }
}
