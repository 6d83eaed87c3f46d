//! Tool calls read back from the model's output, in the format its chat template
//! teaches: Qwen / Hermes `<tool_call>{json}</tool_call>`, Mistral
//! `[TOOL_CALLS] [{json}, ...]`, Llama 3.x a bare JSON object (optionally after
//! `<|python_tag|>`), gpt-oss's harmony channels (`harmony.rs`, which also yields
//! `reasoning_content`). A call is `{"name": ..., "arguments"|"parameters": {...}}`.
//! Text that does not parse as a call stays content.

use serde_json::Value;

use super::api::{FunctionCall, FunctionDelta, ToolCall, ToolCallDelta};
use super::harmony::{self, HarmonyStream};

/// How a model writes its calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolFormat {
    Hermes,
    Mistral,
    Llama3,
    /// gpt-oss: every answer is channels (`harmony.rs`), with tools or not.
    Harmony,
}

impl ToolFormat {
    /// The format a chat template uses (Hermes when it names none: lode's own tool
    /// prompt teaches that one).
    pub fn for_template(source: &str) -> ToolFormat {
        if source.contains("<|channel|>") && source.contains("<|message|>") {
            ToolFormat::Harmony
        } else if source.contains("[TOOL_CALLS]") {
            ToolFormat::Mistral
        } else if source.contains("<tool_call>") {
            ToolFormat::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("<|eom_id|>") {
            ToolFormat::Llama3
        } else {
            ToolFormat::Hermes
        }
    }
}

/// Finds tool calls in a whole answer.
#[derive(Clone, Debug)]
pub struct ToolParser {
    pub format: ToolFormat,
    /// Text the answer was forced to start with (a required or named call): it is part
    /// of the output the parser reads, though the model did not generate it.
    pub prefix: String,
    /// `parallel_tool_calls: false`: only the first call counts.
    pub single: bool,
}

fn new_call_id() -> String {
    format!("call_{:016x}", rand::random::<u64>())
}

/// `{"name", "arguments"|"parameters"}` → a call (arguments as JSON text).
fn to_call(v: &Value) -> Option<ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(Value::Object(Default::default()));
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(ToolCall { id: new_call_id(), kind: "function", function: FunctionCall { name, arguments } })
}

/// Reads the first JSON value at the start of `s`: the value and the bytes it used.
fn json_prefix(s: &str) -> Option<(Value, usize)> {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    let v = it.next()?.ok()?;
    Some((v, it.byte_offset()))
}

impl ToolParser {
    pub fn new(format: ToolFormat, prefix: String) -> ToolParser {
        ToolParser { format, prefix, single: false }
    }

    /// Content (`None` when nothing but calls) and the calls of a whole answer.
    pub fn parse(&self, text: &str) -> (Option<String>, Vec<ToolCall>) {
        let (_, content, calls) = self.parse_message(text);
        (content, calls)
    }

    /// [`Self::parse`] with the reasoning (`reasoning_content`) where the format has it.
    pub fn parse_message(&self, text: &str) -> (Option<String>, Option<String>, Vec<ToolCall>) {
        let full = format!("{}{text}", self.prefix);
        let (content, calls) = match self.format {
            ToolFormat::Hermes => parse_hermes(&full),
            ToolFormat::Mistral => parse_mistral(&full),
            ToolFormat::Llama3 => parse_llama3(&full),
            ToolFormat::Harmony => {
                let p = harmony::parse(&full, true);
                let mut calls: Vec<ToolCall> = p.calls.into_iter().map(harmony_call).collect();
                if self.single {
                    calls.truncate(1);
                }
                let reasoning = (!p.reasoning.is_empty()).then_some(p.reasoning);
                let content = (!p.content.is_empty() || calls.is_empty()).then_some(p.content);
                return (reasoning, content, calls);
            }
        };
        if calls.is_empty() {
            return (None, Some(full), calls);
        }
        let mut calls = calls;
        if self.single {
            calls.truncate(1);
        }
        let content = content.trim().to_string();
        (None, (!content.is_empty()).then_some(content), calls)
    }

    pub fn stream(&self) -> ToolStream {
        let harmony = (self.format == ToolFormat::Harmony).then(|| HarmonyStream::new(&self.prefix));
        ToolStream { parser: self.clone(), buf: self.prefix.clone(), sent: 0, n_calls: 0, plain: false, harmony, reasoning: String::new() }
    }

    /// Where a call may start in `s` (the earliest marker), for streaming.
    fn marker(&self) -> &'static str {
        match self.format {
            ToolFormat::Hermes => "<tool_call>",
            ToolFormat::Mistral => "[TOOL_CALLS]",
            ToolFormat::Llama3 => "{",
            ToolFormat::Harmony => "<|",
        }
    }
}

fn harmony_call(c: harmony::Call) -> ToolCall {
    ToolCall { id: new_call_id(), kind: "function", function: FunctionCall { name: c.name, arguments: c.arguments } }
}

fn parse_hermes(s: &str) -> (String, Vec<ToolCall>) {
    let (mut content, mut calls) = (String::new(), Vec::new());
    let mut rest = s;
    while let Some(at) = rest.find("<tool_call>") {
        content.push_str(&rest[..at]);
        let body = &rest[at + "<tool_call>".len()..];
        let (inner, after) = match body.find("</tool_call>") {
            Some(end) => (&body[..end], &body[end + "</tool_call>".len()..]),
            None => (body, ""),
        };
        match json_repaired(inner.trim()).and_then(|v| to_call(&v)) {
            Some(c) => calls.push(c),
            None => content.push_str(&rest[at..rest.len() - after.len()]),
        }
        rest = after;
    }
    content.push_str(rest);
    (content, calls)
}

/// A JSON object, or one whose last closing braces the model left out (an answer cut
/// by a stop string or the token limit).
fn json_repaired(s: &str) -> Option<Value> {
    (0..4).find_map(|k| json_prefix(&format!("{s}{}", "}".repeat(k))).map(|(v, _)| v))
}

fn parse_mistral(s: &str) -> (String, Vec<ToolCall>) {
    let Some(at) = s.find("[TOOL_CALLS]") else { return (s.to_string(), vec![]) };
    let body = s[at + "[TOOL_CALLS]".len()..].trim_start();
    match json_prefix(body) {
        Some((Value::Array(a), used)) => {
            let calls: Vec<ToolCall> = a.iter().filter_map(to_call).collect();
            (format!("{}{}", &s[..at], &body[used..]), calls)
        }
        Some((v @ Value::Object(_), used)) => {
            (format!("{}{}", &s[..at], &body[used..]), to_call(&v).into_iter().collect())
        }
        _ => (s.to_string(), vec![]),
    }
}

fn parse_llama3(s: &str) -> (String, Vec<ToolCall>) {
    let t = s.trim_start();
    let t = t.strip_prefix("<|python_tag|>").unwrap_or(t).trim_start();
    let mut calls = Vec::new();
    let mut rest = t;
    // One object, or several separated by `;` (Llama 3.2's parallel form).
    while let Some((v, used)) = json_prefix(rest) {
        match to_call(&v) {
            Some(c) => calls.push(c),
            None => break,
        }
        rest = rest[used..].trim_start().trim_start_matches(';').trim_start();
    }
    if calls.is_empty() {
        (s.to_string(), calls)
    } else {
        (rest.to_string(), calls)
    }
}

/// Streaming: content passes through until a call may start; from there text is held
/// and each call goes out as one `tool_calls` delta (id, name, whole arguments) once
/// it is complete.
pub struct ToolStream {
    parser: ToolParser,
    buf: String,
    /// Bytes of `buf` already sent as content.
    sent: usize,
    n_calls: usize,
    /// Llama 3: the answer did not start with a call, so it is all content.
    plain: bool,
    harmony: Option<HarmonyStream>,
    /// Reasoning not yet taken ([`Self::take_reasoning`]).
    reasoning: String,
}

fn deltas(calls: Vec<ToolCall>, first: usize) -> Vec<ToolCallDelta> {
    calls
        .into_iter()
        .enumerate()
        .map(|(i, c)| ToolCallDelta {
            index: (first + i) as u32,
            id: Some(c.id),
            kind: Some("function"),
            function: FunctionDelta { name: Some(c.function.name), arguments: c.function.arguments },
        })
        .collect()
}

impl ToolStream {
    /// Whether any call went out.
    pub fn called(&self) -> bool {
        self.n_calls > 0
    }

    /// Drops calls beyond the first when only one may be made.
    fn limit(&self, mut d: Vec<ToolCallDelta>) -> Vec<ToolCallDelta> {
        if self.parser.single {
            d.retain(|c| c.index == 0);
        }
        d
    }

    /// Reasoning (`reasoning_content`) the last [`Self::push`] or [`Self::finish`] read.
    pub fn take_reasoning(&mut self) -> Option<String> {
        (!self.reasoning.is_empty()).then(|| std::mem::take(&mut self.reasoning))
    }

    fn harmony_step(&mut self, step: harmony::Step) -> (Option<String>, Vec<ToolCallDelta>) {
        self.reasoning.push_str(&step.reasoning);
        let d = deltas(step.calls.into_iter().map(harmony_call).collect(), self.n_calls);
        self.n_calls += d.len();
        (Some(step.content), self.limit(d))
    }

    /// Takes a piece of output; returns content to send now and completed calls.
    pub fn push(&mut self, text: &str) -> (Option<String>, Vec<ToolCallDelta>) {
        if let Some(h) = self.harmony.as_mut() {
            let step = h.push(text);
            return self.harmony_step(step);
        }
        self.buf.push_str(text);
        let marker = self.parser.marker();
        let pending = &self.buf[self.sent..];
        if self.parser.format == ToolFormat::Llama3 {
            let t = pending.trim_start();
            if !self.plain && self.n_calls == 0 && !t.is_empty() && !t.starts_with('{') && !"<|python_tag|>".starts_with(t) && !t.starts_with("<|python_tag|>") {
                self.plain = true;
            }
            if self.plain {
                self.sent = self.buf.len();
                return (Some(pending.to_string()), vec![]);
            }
            return (None, vec![]); // held until the end
        }
        // Hermes: complete calls can go out now; Mistral: at the end.
        if self.parser.format == ToolFormat::Hermes {
            let mut out_calls = Vec::new();
            let mut content = String::new();
            loop {
                let pending = &self.buf[self.sent..];
                match pending.find(marker) {
                    Some(at) => {
                        content.push_str(&pending[..at]);
                        let Some(end) = pending[at..].find("</tool_call>") else {
                            self.sent += at;
                            break;
                        };
                        let whole = &pending[at..at + end + "</tool_call>".len()];
                        let (c, calls) = parse_hermes(whole);
                        content.push_str(&c);
                        self.sent += at + whole.len();
                        out_calls.extend(deltas(calls, self.n_calls + out_calls.len()));
                    }
                    None => {
                        // Hold a tail that could be the start of the marker.
                        let keep = (1..marker.len()).rev().find(|&k| pending.ends_with(&marker[..k])).unwrap_or(0);
                        let upto = pending.len() - keep;
                        content.push_str(&pending[..upto]);
                        self.sent += upto;
                        break;
                    }
                }
            }
            self.n_calls += out_calls.len();
            return (Some(content), self.limit(out_calls));
        }
        match pending.find(marker) {
            Some(at) => {
                let c = pending[..at].to_string();
                self.sent += at;
                (Some(c), vec![])
            }
            None => {
                let keep = (1..marker.len()).rev().find(|&k| pending.ends_with(&marker[..k])).unwrap_or(0);
                let upto = pending.len() - keep;
                let c = pending[..upto].to_string();
                self.sent += upto;
                (Some(c), vec![])
            }
        }
    }

    /// The end of the output: what was held, as calls or content.
    pub fn finish(&mut self) -> (Option<String>, Vec<ToolCallDelta>) {
        if let Some(h) = self.harmony.as_mut() {
            let step = h.finish();
            let (c, d) = self.harmony_step(step);
            return (c.filter(|c| !c.is_empty()), d);
        }
        let pending = self.buf[self.sent..].to_string();
        self.sent = self.buf.len();
        if pending.is_empty() {
            return (None, vec![]);
        }
        let (content, calls) = match self.parser.format {
            ToolFormat::Hermes => parse_hermes(&pending),
            ToolFormat::Mistral => parse_mistral(&pending),
            ToolFormat::Llama3 => parse_llama3(&pending),
            // (Streams through `HarmonyStream` above.)
            ToolFormat::Harmony => (pending.clone(), Vec::new()),
        };
        let d = deltas(calls, self.n_calls);
        self.n_calls += d.len();
        let d = self.limit(d);
        let content = if d.is_empty() { content } else { content.trim().to_string() };
        ((!content.is_empty()).then_some(content), d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(c: &[ToolCall]) -> Vec<(String, Value)> {
        c.iter().map(|c| (c.function.name.clone(), serde_json::from_str(&c.function.arguments).unwrap())).collect()
    }

    #[test]
    fn the_three_formats_parse() {
        let h = ToolParser::new(ToolFormat::Hermes, String::new());
        let (content, calls) =
            h.parse("Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>");
        assert_eq!(content.as_deref(), Some("Sure."));
        assert_eq!(names(&calls), vec![("f".into(), serde_json::json!({"x": 1})), ("g".into(), serde_json::json!({}))]);
        let m = ToolParser::new(ToolFormat::Mistral, String::new());
        let (content, calls) = m.parse("[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": \"b\"}}]");
        assert_eq!((content, names(&calls)), (None, vec![("f".into(), serde_json::json!({"a": "b"}))]));
        let l = ToolParser::new(ToolFormat::Llama3, String::new());
        let (content, calls) = l.parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {\"q\": 2}}");
        assert_eq!((content, names(&calls)), (None, vec![("f".into(), serde_json::json!({"q": 2}))]));
        assert_eq!(l.parse("Paris is the capital.").1.len(), 0);
        assert_eq!(h.parse("<tool_call>not json</tool_call>").0.as_deref(), Some("<tool_call>not json</tool_call>"));
    }

    #[test]
    fn streaming_sends_content_then_whole_calls() {
        let h = ToolParser::new(ToolFormat::Hermes, String::new());
        let mut s = h.stream();
        let text = "Let me check.<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
        let (mut content, mut calls) = (String::new(), Vec::new());
        for ch in text.chars() {
            let (c, d) = s.push(&ch.to_string());
            content.push_str(&c.unwrap_or_default());
            calls.extend(d);
        }
        let (c, d) = s.finish();
        content.push_str(&c.unwrap_or_default());
        calls.extend(d);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name.as_deref(), Some("f"));
        assert_eq!(calls[0].index, 0);
        assert!(s.called());
    }
}
