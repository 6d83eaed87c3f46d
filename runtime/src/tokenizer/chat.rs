//! Chat templates: render a conversation into the prompt text a model was tuned on.
//!
//! GGUF files carry the Hugging Face Jinja template in `tokenizer.chat_template`; it is
//! rendered with minijinja the way `transformers` does (`trim_blocks`, `lstrip_blocks`,
//! Python string/dict methods through minijinja-contrib's pycompat, plus the
//! `raise_exception` and `strftime_now` globals templates expect).
//!
//! A file without a template gets a documented fallback, with a warning:
//! - a vocabulary with `<start_of_turn>`/`<end_of_turn>` (Gemma) gets llama.cpp's built-in
//!   `gemma` format: roles `user`/`model`, a system message folded into the next user turn;
//! - anything else gets ChatML (`<|im_start|>role\n...<|im_end|>\n`), which is what
//!   llama.cpp's server falls back to.
//!
//! Templates that start with `{{ bos_token }}` would double the BOS the tokenizer adds;
//! [`ChatTemplate::apply`] strips one, as llama.cpp's callers do.

use minijinja::{Environment, ErrorKind, Value};

use super::Tokenizer;

/// One turn of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// Why a template could not be parsed or rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("chat template ({which}) does not parse: {detail}")]
    Parse { which: String, detail: String },
    #[error("chat template ({which}) failed to render: {detail}")]
    Render { which: String, detail: String },
}

/// Where a template came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TemplateSource {
    /// `tokenizer.chat_template` of the model file (or a caller-given template).
    Model,
    /// No template in the file: llama.cpp's built-in Gemma format.
    BuiltinGemma,
    /// No template in the file: ChatML.
    BuiltinChatMl,
}

/// llama.cpp's built-in `gemma` format as Jinja.
pub const GEMMA_TEMPLATE: &str = "\
{%- set ns = namespace(sys='') -%}
{%- for m in messages -%}
  {%- if m.role == 'system' -%}
    {%- set ns.sys = m.content | trim -%}
  {%- else -%}
    {%- set role = 'model' if m.role == 'assistant' else m.role -%}
    {{- '<start_of_turn>' ~ role ~ '\\n' -}}
    {%- if ns.sys and role != 'model' -%}{{- ns.sys ~ '\\n\\n' -}}{%- set ns.sys = '' -%}{%- endif -%}
    {{- (m.content | trim) ~ '<end_of_turn>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}";

/// ChatML as Jinja.
pub const CHATML_TEMPLATE: &str = "\
{%- for m in messages -%}
  {{- '<|im_start|>' ~ m.role ~ '\\n' ~ m.content ~ '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/// A parsed chat template with the special-token texts it is rendered with.
pub struct ChatTemplate {
    env: Environment<'static>,
    pub source: TemplateSource,
    bos_token: String,
    eos_token: String,
    /// The BOS text to strip from a rendered prompt, when the tokenizer adds BOS itself.
    strip_bos: Option<String>,
    /// The template's Jinja text.
    text: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("source", &self.source).field("bos_token", &self.bos_token).finish()
    }
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Parse `template` (Jinja); `bos_token`/`eos_token` are the texts templates see.
    pub fn new(template: &str, bos_token: &str, eos_token: &str) -> Result<ChatTemplate, ChatError> {
        Self::with_source(template, bos_token, eos_token, TemplateSource::Model)
    }

    fn with_source(template: &str, bos: &str, eos: &str, source: TemplateSource) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, template.to_string()).map_err(|e| ChatError::Parse {
            which: format!("{source:?}"),
            detail: format!("{e:#}"),
        })?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos.to_string(),
            eos_token: eos.to_string(),
            strip_bos: None,
            text: template.to_string(),
        })
    }

    /// The template of the tokenizer's model, or the documented fallback (with a warning).
    pub fn for_tokenizer(tok: &Tokenizer) -> Result<ChatTemplate, ChatError> {
        Self::for_tokenizer_with(tok, None)
    }

    /// Like [`for_tokenizer`](Self::for_tokenizer), with `template` (e.g. from the command
    /// line) taking the place of the model's own.
    pub fn for_tokenizer_with(tok: &Tokenizer, template: Option<&str>) -> Result<ChatTemplate, ChatError> {
        let text = |id: Option<u32>| id.and_then(|i| tok.token_text(i)).unwrap_or("").to_string();
        let (bos, eos) = (text(tok.bos()), text(tok.eos()));
        let mut t = match template.or(tok.chat_template()) {
            Some(src) => Self::with_source(src, &bos, &eos, TemplateSource::Model)?,
            None if tok.token_id("<start_of_turn>").is_some() && tok.token_id("<end_of_turn>").is_some() => {
                tracing::warn!("the model has no chat template; using the built-in Gemma format");
                Self::with_source(GEMMA_TEMPLATE, &bos, &eos, TemplateSource::BuiltinGemma)?
            }
            None => {
                tracing::warn!("the model has no chat template; falling back to ChatML");
                Self::with_source(CHATML_TEMPLATE, &bos, &eos, TemplateSource::BuiltinChatMl)?
            }
        };
        if tok.add_bos() && !bos.is_empty() {
            t.strip_bos = Some(bos);
        }
        Ok(t)
    }

    /// Render exactly as the template says. A template that rejects a system turn (Gemma
    /// 2's raises "System role not supported") gets the system text folded into the first
    /// user turn instead, separated by a blank line, as llama.cpp's template polyfills do.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatError> {
        match self.render_raw(messages, add_generation_prompt) {
            Err(first) if messages.first().is_some_and(|m| m.role == "system") => {
                let folded = fold_system(messages);
                match self.render_raw(&folded, add_generation_prompt) {
                    Ok(text) => {
                        tracing::debug!("chat template rejects a system turn; folded it into the first user turn");
                        Ok(text)
                    }
                    Err(_) => Err(self.render_err(first)),
                }
            }
            r => r.map_err(|e| self.render_err(e)),
        }
    }

    fn render_raw(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, minijinja::Error> {
        let tmpl = self.env.get_template(NAME)?;
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        tmpl.render(ctx)
    }

    /// Render the prompt to tokenize (with special parsing): like [`render`](Self::render),
    /// minus a leading BOS text when the tokenizer adds BOS itself.
    pub fn apply(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatError> {
        let text = self.render(messages, add_generation_prompt)?;
        match &self.strip_bos {
            Some(bos) => match text.strip_prefix(bos.as_str()) {
                Some(rest) => Ok(rest.to_string()),
                None => Ok(text),
            },
            None => Ok(text),
        }
    }

    /// The template's Jinja text (to see which features it knows, e.g. `tools`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Like [`apply`](Self::apply), with the messages as JSON objects (so fields beyond
    /// role and content, such as `tool_calls` and `tool_call_id`, reach the template)
    /// and `tools` (OpenAI's list of function tools) in the template's context.
    pub fn apply_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let tmpl = self.env.get_template(NAME).map_err(|e| self.render_err(e))?;
        let ctx = minijinja::context! {
            messages => Value::from_serialize(messages),
            tools => tools.map(Value::from_serialize),
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        };
        let text = tmpl.render(ctx).map_err(|e| self.render_err(e))?;
        match &self.strip_bos {
            Some(bos) => Ok(text.strip_prefix(bos.as_str()).map_or(text.clone(), str::to_string)),
            None => Ok(text),
        }
    }

    fn render_err(&self, e: minijinja::Error) -> ChatError {
        ChatError::Render { which: format!("{:?}", self.source), detail: format!("{e:#}") }
    }
}

/// The system turn's text prepended to the next user turn (or made a user turn).
fn fold_system(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    let (sys, rest) = messages.split_first().expect("caller checked a first message");
    let mut out = Vec::with_capacity(messages.len());
    match rest.first() {
        Some(u) if u.role == "user" => {
            out.push(ChatMessage::new("user", format!("{}\n\n{}", sys.content, u.content)));
            out.extend_from_slice(&rest[1..]);
        }
        _ => {
            out.push(ChatMessage::new("user", sys.content.clone()));
            out.extend_from_slice(rest);
        }
    }
    out
}

/// `raise_exception(msg)`: templates reject unsupported conversations with it.
fn raise_exception(msg: String) -> Result<Value, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("template raised: {msg}")))
}

/// `tojson` as `transformers` defines it (Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent)`): `", "`/`": "` separators, no HTML escaping, keys in insertion order
/// as Python keeps them (serde_json's `preserve_order`).
fn tojson(value: Value, kwargs: minijinja::value::Kwargs) -> Result<Value, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let _: Option<bool> = kwargs.get("ensure_ascii")?; // accepted; output is always UTF-8
    let _: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = String::new();
    write_py_json(&json, indent, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

fn write_py_json(v: &serde_json::Value, indent: Option<usize>, depth: usize, out: &mut String) {
    use serde_json::Value as J;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let sep = if indent.is_some() { "," } else { ", " };
    match v {
        J::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                write_py_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push(']');
        }
        J::Object(map) if !map.is_empty() => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(sep);
                }
                newline(out, depth + 1);
                out.push_str(&J::String(k.clone()).to_string());
                out.push_str(": ");
                write_py_json(item, indent, depth + 1, out);
            }
            newline(out, depth);
            out.push('}');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// `strftime_now(fmt)`: the current UTC time, for templates that print today's date.
fn strftime_now(fmt: String) -> Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(strftime(&fmt, secs))
}

/// A small strftime over a Unix time (UTC): `%Y %y %m %d %e %B %b %A %a %H %I %M %S %p %j %%`.
pub fn strftime(fmt: &str, unix_secs: i64) -> String {
    const MONTHS: [&str; 12] = [
        "January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November",
        "December",
    ];
    const DAYS: [&str; 7] = ["Thursday", "Friday", "Saturday", "Sunday", "Monday", "Tuesday", "Wednesday"];
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let yday = days - days_from_civil(y, 1, 1) + 1;
    let (hh, mm, ss) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = DAYS[days.rem_euclid(7) as usize];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('A') => out.push_str(weekday),
            Some('a') => out.push_str(&weekday[..3]),
            Some('H') => out.push_str(&format!("{hh:02}")),
            Some('I') => out.push_str(&format!("{:02}", if hh % 12 == 0 { 12 } else { hh % 12 })),
            Some('M') => out.push_str(&format!("{mm:02}")),
            Some('S') => out.push_str(&format!("{ss:02}")),
            Some('p') => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_a_known_date() {
        // 2024-07-26 13:05:09 UTC was a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-07-26 13:05:09");
        assert_eq!(strftime("%d %b %Y, %A %j %I%p", t), "26 Jul 2024, Friday 208 01PM");
    }

    #[test]
    fn gemma_builtin_folds_system_into_user() {
        let t = ChatTemplate::with_source(GEMMA_TEMPLATE, "<bos>", "<eos>", TemplateSource::BuiltinGemma).unwrap();
        let msgs = [ChatMessage::new("system", "Be brief."), ChatMessage::new("user", "Hi"), ChatMessage::new("assistant", "Hello")];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn tojson_writes_like_python_json_dumps() {
        let t = ChatTemplate::new("{{ x | tojson }}|{{ x | tojson(indent=2) }}", "", "").unwrap();
        let env_ctx = minijinja::context! { x => minijinja::context! { b => vec![1, 2], a => "<é>" } };
        let text = t.env.get_template(NAME).unwrap().render(env_ctx).unwrap();
        assert_eq!(text, "{\"b\": [1, 2], \"a\": \"<é>\"}|{\n  \"b\": [\n    1,\n    2\n  ],\n  \"a\": \"<é>\"\n}");
    }

    #[test]
    fn raise_exception_is_a_render_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}", "", "").unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }
}
