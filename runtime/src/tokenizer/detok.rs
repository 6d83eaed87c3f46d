//! Ids back to text: the bytes of each token ([`piece_bytes`]), whole-sequence
//! detokenization with llama.cpp's options ([`detokenize`]), and a streaming decoder that
//! never emits a broken UTF-8 character ([`StreamDecoder`]).

use std::collections::HashMap;

use super::vocab::{attr, Algorithm};
use super::Tokenizer;

/// The bytes a token stands for, special tokens rendered as their text.
/// NORMAL SPM tokens turn `▁` back into spaces; NORMAL BPE tokens map GPT-2's byte
/// alphabet back to bytes; BYTE tokens (`<0xXX>`) are that byte; unused and undefined
/// tokens are empty.
pub(crate) fn piece_bytes(text: &str, a: u32, algorithm: &Algorithm, char_to_byte: &HashMap<char, u8>) -> Vec<u8> {
    if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if a & attr::NORMAL != 0 {
        return match algorithm {
            Algorithm::Spm => text.replace('\u{2581}', " ").into_bytes(),
            Algorithm::Bpe(_) => {
                let mut out = Vec::with_capacity(text.len());
                for ch in text.chars() {
                    match char_to_byte.get(&ch) {
                        Some(&b) => out.push(b),
                        None => {
                            // Not GPT-2 alphabet: say so in the text rather than guess.
                            let mut buf = [0u8; 4];
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            for b in ch.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
                out
            }
        };
    }
    if a & attr::BYTE != 0 {
        if let Some(b) = parse_byte_token(text) {
            return vec![b];
        }
    }
    Vec::new()
}

/// `<0xXX>` → the byte.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's `llama_detokenize`: `remove_special` drops a leading BOS / trailing EOS the
/// tokenizer would add; `unparse_special` renders CONTROL/UNKNOWN tokens as their text
/// (otherwise they vanish). Models with `add_space_prefix` lose the first token's
/// leading space; BPE models with `clean_spaces` lose spaces before `?!.,` and some
/// contractions, as Hugging Face's `clean_up_tokenization_spaces`.
pub(crate) fn detokenize(tok: &Tokenizer, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
    let v = &tok.info;
    let mut ids = ids;
    let mut remove_space = v.add_space_prefix;
    if remove_special && v.add_bos && !ids.is_empty() && Some(ids[0]) == v.bos {
        remove_space = false;
        ids = &ids[1..];
    }
    if remove_special && v.add_eos && !ids.is_empty() && Some(ids[ids.len() - 1]) == v.eos {
        ids = &ids[..ids.len() - 1];
    }
    let mut text = Vec::new();
    for &id in ids {
        let piece = tok.piece(id, unparse_special);
        let piece = if remove_space { piece.strip_prefix(b" ").unwrap_or(piece) } else { piece };
        remove_space = false;
        text.extend_from_slice(piece);
    }
    if v.clean_spaces {
        clean_spaces(&mut text);
    }
    text
}

/// The three in-place passes of llama.cpp's `clean_spaces`.
fn clean_spaces(text: &mut Vec<u8>) {
    // 1: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);

    // 2: a lone apostrophe between spaces loses both spaces.
    let n = text.len();
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0; // the next space is skipped; later reads see it as gone
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    text.truncate(total);

    // 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let joins = matches!(x1, b's' | b'm')
                || (i + 2 < n && matches!((x1, text[i + 2]), (b'r', b'e') | (b'v', b'e')));
            if joins {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

/// Turns a stream of token ids into text without ever splitting a UTF-8 character:
/// bytes of an incomplete character wait for the next token; bytes that can never
/// become valid UTF-8 come out as U+FFFD.
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    /// Render CONTROL/UNKNOWN tokens as their text.
    pub render_special: bool,
}

impl StreamDecoder {
    pub fn new(render_special: bool) -> StreamDecoder {
        StreamDecoder { pending: Vec::new(), render_special }
    }

    /// Add one token; returns the text that is now complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let piece = tok.piece(id, self.render_special);
        self.push_bytes(piece)
    }

    /// Add raw bytes; returns the text that is now complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix is valid UTF-8 by the error's contract.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // An incomplete character at the end: keep it for later.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Bytes still waiting for the rest of their character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: whatever is left, with U+FFFD for an incomplete character.
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_never_splits_a_character() {
        let mut d = StreamDecoder::new(false);
        let euro = "€".as_bytes(); // 3 bytes
        assert_eq!(d.push_bytes(&euro[..1]), "");
        assert_eq!(d.push_bytes(&euro[1..2]), "");
        assert_eq!(d.push_bytes(&[euro[2], b'a']), "€a");
        assert_eq!(d.push_bytes(&[0xFF, b'b']), "\u{FFFD}b");
        assert_eq!(d.push_bytes(&euro[..2]), "");
        assert_eq!(d.flush(), "\u{FFFD}");
    }

    #[test]
    fn clean_spaces_matches_llama_cpp() {
        let mut t = b"Hello , world ! I 'm here ' ok".to_vec();
        clean_spaces(&mut t);
        assert_eq!(String::from_utf8(t).unwrap(), "Hello, world! I'm here'ok");
    }

    #[test]
    fn byte_tokens_parse() {
        assert_eq!(parse_byte_token("<0x0A>"), Some(10));
        assert_eq!(parse_byte_token("<0xzz>"), None);
    }
}
