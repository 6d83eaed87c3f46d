//! gpt-oss's output format ("harmony"), read back into OpenAI's message fields. The
//! model answers in messages, each a header, `<|message|>`, a body and a terminator
//! (`<|end|>`, `<|call|>`, `<|return|>`; the last two end generation, so the text may
//! simply stop). The header names a channel and, for a tool call, a recipient:
//!
//! ```text
//! <|channel|>analysis<|message|>…reasoning…<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}<|call|>
//! <|start|>assistant<|channel|>final<|message|>…answer…<|return|>
//! ```
//!
//! (the recipient may also come before the channel: `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`).
//! The `analysis` channel becomes `reasoning_content`, a message to `functions.NAME` a
//! tool call (its body the arguments), anything else (`final`, a `commentary` preamble)
//! `content`. Output that does not start with a header is all content. The server
//! renders special tokens as text for such a model so that these markers reach here.

const START: &str = "<|start|>";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

/// One tool call: the function's name and its arguments as JSON text.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    pub arguments: String,
}

/// What an answer (or the part of it seen so far) says.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parsed {
    pub reasoning: String,
    pub content: String,
    /// Complete calls only (a call whose message is still open is left out).
    pub calls: Vec<Call>,
}

/// The word after `key` in `header`, up to white space or the next marker.
fn field<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(key)? + key.len();
    let rest = &header[at..];
    let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// Whether `text` may still become a header (it is a prefix of one's first marker).
fn may_start_header(text: &str) -> bool {
    CHANNEL.starts_with(text) || START.starts_with(text) || text.starts_with(CHANNEL) || text.starts_with(START)
}

fn push_part(out: &mut String, part: &str) {
    if !out.is_empty() && !part.is_empty() {
        out.push('\n');
    }
    out.push_str(part);
}

/// Reads `text`. With `finished` false (streaming), an open message's body stops
/// before a trailing `<|…` that may be the start of its terminator, and a plain-text
/// answer's tail is held the same way.
pub fn parse(text: &str, finished: bool) -> Parsed {
    let mut out = Parsed::default();
    let lead = text.trim_start();
    if !lead.starts_with("<|") && !(lead.is_empty() || (!finished && may_start_header(lead))) {
        out.content = held(text, finished).to_string();
        return out;
    }
    let mut pos = 0;
    while pos < text.len() {
        let rest = &text[pos..];
        let Some(m) = rest.find(MESSAGE) else { break }; // header not complete yet
        let header = &rest[..m];
        let body_at = m + MESSAGE.len();
        let body_rest = &rest[body_at..];
        let term = ENDS
            .iter()
            .filter_map(|e| body_rest.find(e).map(|i| (i, e.len())))
            .chain(body_rest.find(START).map(|i| (i, 0)))
            .min();
        let (body, complete, used) = match term {
            Some((i, len)) => (&body_rest[..i], true, body_at + i + len),
            None => (held(body_rest, finished), finished, rest.len()),
        };
        let recipient = field(header, "to=");
        match (recipient, field(header, CHANNEL)) {
            (Some(r), _) => {
                if complete {
                    let name = r.strip_prefix("functions.").unwrap_or(r).to_string();
                    out.calls.push(Call { name, arguments: body.trim().to_string() });
                }
            }
            (None, Some("analysis")) => push_part(&mut out.reasoning, body),
            (None, _) => push_part(&mut out.content, body),
        }
        pos += used;
    }
    out
}

/// `s` less a trailing `<|…` with no `|>` after it (unless `finished`).
fn held(s: &str, finished: bool) -> &str {
    if finished {
        return s;
    }
    match s.rfind("<|") {
        Some(i) if !s[i..].contains("|>") => &s[..i],
        _ if s.ends_with('<') => &s[..s.len() - 1],
        _ => s,
    }
}

/// Streaming: the parse of everything seen so far, less what was already sent.
#[derive(Clone, Debug, Default)]
pub struct HarmonyStream {
    buf: String,
    sent_reasoning: usize,
    sent_content: usize,
    sent_calls: usize,
}

/// New text of one step: reasoning, content and the calls completed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Step {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<Call>,
}

impl HarmonyStream {
    /// A stream whose output starts with `prefix` (a forced call's header).
    pub fn new(prefix: &str) -> HarmonyStream {
        HarmonyStream { buf: prefix.to_string(), ..Default::default() }
    }

    fn step(&mut self, finished: bool) -> Step {
        let p = parse(&self.buf, finished);
        // Held text only ever grows into what is sent next, so the parts only grow.
        let tail = |s: &str, sent: &mut usize| {
            let t = s.get(*sent..).unwrap_or_default().to_string();
            *sent = s.len().max(*sent);
            t
        };
        let reasoning = tail(&p.reasoning, &mut self.sent_reasoning);
        let content = tail(&p.content, &mut self.sent_content);
        let calls = p.calls.get(self.sent_calls..).unwrap_or_default().to_vec();
        self.sent_calls = p.calls.len().max(self.sent_calls);
        Step { reasoning, content, calls }
    }

    pub fn push(&mut self, text: &str) -> Step {
        self.buf.push_str(text);
        self.step(false)
    }

    /// The end of the output: whatever was held back.
    pub fn finish(&mut self) -> Step {
        self.step(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALL: &str = "<|channel|>analysis<|message|>Need the weather; call the tool.<|end|>\
        <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";

    #[test]
    fn channels_become_reasoning_content_and_calls() {
        let p = parse(CALL, true);
        assert_eq!(p.reasoning, "Need the weather; call the tool.");
        assert_eq!(p.content, "");
        assert_eq!(p.calls, vec![Call { name: "get_weather".into(), arguments: "{\"city\": \"Paris\"}".into() }]);

        let answer = "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>";
        let p = parse(answer, true);
        assert_eq!((p.reasoning.as_str(), p.content.as_str(), p.calls.len()), ("Simple.", "It is sunny.", 0));

        // The recipient before the channel, two calls, a commentary preamble as content.
        let two = "<|channel|>commentary<|message|>Checking both.<|end|>\
            <|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|>\
            <|start|>assistant to=functions.b<|channel|>commentary json<|message|>{\"x\":1}<|call|>";
        let p = parse(two, true);
        assert_eq!(p.content, "Checking both.");
        assert_eq!(p.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(p.calls[1].arguments, "{\"x\":1}");

        // A model that ignores the format: all content.
        assert_eq!(parse("Paris.", true).content, "Paris.");
    }

    #[test]
    fn an_open_message_holds_its_call_and_a_partial_marker() {
        let p = parse(&CALL[..CALL.len() - 3], false);
        assert!(p.calls.is_empty(), "{p:?}");
        let p = parse("<|channel|>final<|message|>Hello <|e", false);
        assert_eq!(p.content, "Hello ");
        assert_eq!(parse("<|chan", false), Parsed::default());
    }

    #[test]
    fn streaming_token_by_token_matches_the_whole_parse() {
        let text = format!("{CALL}<|call|>");
        // Split as a tokenizer would: special tokens whole, other text in short pieces.
        let mut pieces: Vec<String> = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let n = if rest.starts_with("<|") { rest.find("|>").unwrap() + 2 } else { rest.find("<|").unwrap_or(rest.len()).min(3) };
            let n = (1..=n).rev().find(|&k| rest.is_char_boundary(k)).unwrap();
            pieces.push(rest[..n].to_string());
            rest = &rest[n..];
        }
        let mut s = HarmonyStream::new("");
        let mut all = Step::default();
        for (i, p) in pieces.iter().enumerate() {
            let st = s.push(p);
            if i + 1 < pieces.len() {
                assert!(st.calls.is_empty(), "a call went out before its message closed");
            }
            all.reasoning.push_str(&st.reasoning);
            all.content.push_str(&st.content);
            all.calls.extend(st.calls);
        }
        let st = s.finish();
        all.reasoning.push_str(&st.reasoning);
        all.content.push_str(&st.content);
        all.calls.extend(st.calls);
        let whole = parse(&text, true);
        assert_eq!((all.reasoning, all.content, all.calls), (whole.reasoning, whole.content, whole.calls));

        // A forced call's header as the prefix; the model writes only the arguments.
        let mut s = HarmonyStream::new("<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>");
        assert!(s.push("{}").calls.is_empty());
        assert_eq!(s.finish().calls, vec![Call { name: "get_time".into(), arguments: "{}".into() }]);
    }
}
