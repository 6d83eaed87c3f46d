//! The request side of tool calls: `tools`, `tool_choice` and `parallel_tool_calls`
//! read and checked, and the conversation (with `tool_calls` and `role: tool` messages)
//! rendered through the model's chat template. A template that knows `tools` gets them
//! in its context; one that does not (plain ChatML, say) gets lode's Hermes-style
//! polyfill: the tool list in the system turn, calls as `<tool_call>` blocks and results
//! as `<tool_response>` blocks in a user turn, as Qwen 2.5's template writes them.
//! A required or named call is forced by starting the answer with the call's opening
//! (the parser reads that prefix as part of the output).

use lode_runtime::tokenizer::{ChatMessage, ChatTemplate};
use serde_json::{json, Map, Value};

use super::errors::ApiError;
use super::tools::{ToolFormat, ToolParser};

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

/// A request's tools.
#[derive(Clone, Debug)]
pub struct ToolRequest {
    /// OpenAI's `{"type": "function", "function": {...}}` objects, checked.
    pub tools: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

/// `tools`, `tool_choice`, `parallel_tool_calls` of a chat body; `None` without tools.
pub fn parse(obj: &Map<String, Value>) -> Result<Option<ToolRequest>, ApiError> {
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(ApiError::invalid_param("tools", "`tools` must be an array of function tools")),
    };
    let mut names = Vec::new();
    for (i, t) in tools.iter().enumerate() {
        let p = format!("tools[{i}]");
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::invalid_param(&p, format!("`{p}.type` must be `function` (the only tool type supported)")));
        }
        let name = t.pointer("/function/name").and_then(Value::as_str).filter(|n| !n.is_empty());
        let Some(name) = name else {
            return Err(ApiError::invalid_param(&format!("{p}.function.name"), format!("`{p}.function.name` is required")));
        };
        if let Some(params) = t.pointer("/function/parameters") {
            if !params.is_object() {
                return Err(ApiError::invalid_param(&format!("{p}.function.parameters"), "`parameters` must be a JSON Schema object"));
            }
        }
        names.push(name.to_string());
    }
    let choice = match obj.get("tool_choice") {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) if s == "auto" => ToolChoice::Auto,
        Some(Value::String(s)) if s == "none" => ToolChoice::None,
        Some(Value::String(s)) if s == "required" => ToolChoice::Required,
        Some(v) => match v.pointer("/function/name").and_then(Value::as_str) {
            Some(n) if v.get("type").and_then(Value::as_str) == Some("function") => {
                if !names.iter().any(|x| x == n) {
                    return Err(ApiError::invalid_param("tool_choice", format!("`tool_choice` names `{n}`, which is not in `tools`")));
                }
                ToolChoice::Named(n.to_string())
            }
            _ => {
                return Err(ApiError::invalid_param(
                    "tool_choice",
                    "`tool_choice` must be `auto`, `none`, `required` or {\"type\": \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    let parallel = match obj.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid_param("parallel_tool_calls", "`parallel_tool_calls` must be a boolean")),
    };
    // One tool to choose from: a required call is a call of it.
    let choice = match choice {
        ToolChoice::Required if names.len() == 1 => ToolChoice::Named(names[0].clone()),
        c => c,
    };
    if tools.is_empty() {
        if obj.get("tool_choice").is_some_and(|v| !v.is_null()) && choice != ToolChoice::None && choice != ToolChoice::Auto {
            return Err(ApiError::invalid_param("tool_choice", "`tool_choice` needs `tools`"));
        }
        return Ok(None);
    }
    Ok(Some(ToolRequest { tools, choice, parallel }))
}

/// One message as the template sees it: role, content, and for an assistant's calls
/// `tool_calls` (arguments as objects, as Hugging Face templates expect), for a tool's
/// result `tool_call_id` / `name`.
pub fn message_json(m: &Map<String, Value>, role: &str, content: &str, param: &str) -> Result<Value, ApiError> {
    let mut out = json!({"role": role, "content": content});
    if let Some(calls) = m.get("tool_calls").filter(|v| !v.is_null()) {
        let p = format!("{param}.tool_calls");
        let bad = || ApiError::invalid_param(&p, format!("`{p}` must be an array of {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}"));
        if role != "assistant" {
            return Err(ApiError::invalid_param(&p, "only assistant messages carry `tool_calls`"));
        }
        let mut list = Vec::new();
        for c in calls.as_array().ok_or_else(bad)? {
            let name = c.pointer("/function/name").and_then(Value::as_str).ok_or_else(bad)?;
            let args = match c.pointer("/function/arguments") {
                Some(Value::String(s)) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                Some(v @ Value::Object(_)) => v.clone(),
                None | Some(Value::Null) => json!({}),
                Some(_) => return Err(bad()),
            };
            let id = c.get("id").and_then(Value::as_str).unwrap_or("");
            list.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}));
        }
        out["tool_calls"] = Value::Array(list);
    }
    for key in ["tool_call_id", "name"] {
        if let Some(Value::String(s)) = m.get(key) {
            out[key] = json!(s);
        }
    }
    // An assistant's reasoning sent back (`reasoning_content`, as this server returns it):
    // templates read it as `reasoning_content` or, gpt-oss's, as `thinking`.
    match m.get("reasoning_content") {
        None | Some(Value::Null) => {}
        Some(Value::String(r)) if role == "assistant" => {
            out["reasoning_content"] = json!(r);
            out["thinking"] = json!(r);
        }
        Some(_) => {
            let p = format!("{param}.reasoning_content");
            return Err(ApiError::invalid_param(&p, format!("`{p}` must be a string on an assistant message")));
        }
    }
    Ok(out)
}

/// Whether a conversation needs the tool path (calls or results in it).
pub fn has_tool_turns(messages: &[Value]) -> bool {
    messages.iter().any(|m| m["role"] == "tool" || m.get("tool_calls").is_some())
}

/// The rendered prompt, and how to read the answer.
pub struct Rendered {
    pub text: String,
    pub parser: Option<ToolParser>,
    /// A stop string the forced call adds (its closing marker, one call only).
    pub stop: Option<String>,
}

fn tool_prompt(tools: &[Value]) -> String {
    let list: Vec<String> = tools.iter().map(|t| t.get("function").unwrap_or(t).to_string()).collect();
    format!(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{}\n</tools>\n\n\
         For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
         <tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>",
        list.join("\n")
    )
}

/// lode's polyfill for a template without tools: plain messages in Hermes' format.
fn polyfill(messages: &[Value], tools: Option<&[Value]>) -> Vec<ChatMessage> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut out: Vec<ChatMessage> = Vec::new();
    for m in messages {
        let (role, content) = (s(&m["role"]), s(&m["content"]));
        match role.as_str() {
            "assistant" if m.get("tool_calls").is_some() => {
                let mut c = content;
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let f = &call["function"];
                    let body = json!({"name": f["name"], "arguments": f["arguments"]});
                    c.push_str(&format!("{}<tool_call>\n{body}\n</tool_call>", if c.is_empty() { "" } else { "\n" }));
                }
                out.push(ChatMessage::new("assistant", c));
            }
            "tool" => {
                let block = format!("<tool_response>\n{content}\n</tool_response>");
                match out.last_mut() {
                    // Consecutive results share one user turn.
                    Some(last) if last.role == "user" && last.content.ends_with("</tool_response>") => {
                        last.content.push('\n');
                        last.content.push_str(&block);
                    }
                    _ => out.push(ChatMessage::new("user", block)),
                }
            }
            _ => out.push(ChatMessage::new(role, content)),
        }
    }
    if let Some(tools) = tools {
        let p = tool_prompt(tools);
        match out.first_mut() {
            Some(first) if first.role == "system" => first.content = format!("{}\n\n{p}", first.content),
            _ => out.insert(0, ChatMessage::new("system", p)),
        }
    }
    out
}

/// Renders the conversation with its tools; the answer's parser when tools are offered.
pub fn render(t: &ChatTemplate, messages: &[Value], req: Option<&ToolRequest>) -> Result<Rendered, ApiError> {
    let offered = req.filter(|r| r.choice != ToolChoice::None);
    let tools = offered.map(|r| r.tools.as_slice());
    let native = t.text().contains("tools");
    let err = |e: lode_runtime::tokenizer::ChatError| ApiError::invalid_param("messages", format!("cannot apply the chat template: {e}"));
    let (mut text, format) = if native {
        let format = ToolFormat::for_template(t.text());
        // gpt-oss's template prints every tool's description unguarded; OpenAI's API makes
        // it optional.
        let described: Option<Vec<Value>> = tools.filter(|_| format == ToolFormat::Harmony).map(|ts| {
            ts.iter()
                .map(|t| {
                    let mut t = t.clone();
                    if let Some(f) = t.get_mut("function").and_then(Value::as_object_mut) {
                        f.entry("description").or_insert(json!(""));
                    }
                    t
                })
                .collect()
        });
        (t.apply_json(messages, described.as_deref().or(tools), true).map_err(err)?, format)
    } else {
        (t.apply(&polyfill(messages, tools), true).map_err(err)?, ToolFormat::Hermes)
    };
    let Some(r) = offered else {
        // A harmony answer is channels even without tools: always parsed.
        let parser = (format == ToolFormat::Harmony).then(|| ToolParser::new(format, String::new()));
        return Ok(Rendered { text, parser, stop: None });
    };
    let name = match &r.choice {
        ToolChoice::Named(n) => Some(n.as_str()),
        _ => None,
    };
    let (prefix, stop) = match (&r.choice, format) {
        (ToolChoice::Auto, _) => (String::new(), None),
        (_, ToolFormat::Hermes) => (
            match name {
                Some(n) => format!("<tool_call>\n{{\"name\": {}, \"arguments\": ", json!(n)),
                None => "<tool_call>\n{\"name\": \"".to_string(),
            },
            Some("</tool_call>".to_string()),
        ),
        (_, ToolFormat::Mistral) => (
            match name {
                Some(n) => format!("[TOOL_CALLS] [{{\"name\": {}, \"arguments\": ", json!(n)),
                None => "[TOOL_CALLS] [{\"name\": \"".to_string(),
            },
            None,
        ),
        (_, ToolFormat::Harmony) => (
            match name {
                Some(n) => format!("<|channel|>commentary to=functions.{n} <|constrain|>json<|message|>"),
                None => "<|channel|>commentary to=functions.".to_string(),
            },
            None,
        ),
        (_, ToolFormat::Llama3) => (
            match name {
                Some(n) => format!("{{\"name\": {}, \"parameters\": ", json!(n)),
                None => "{\"name\": \"".to_string(),
            },
            None,
        ),
    };
    text.push_str(&prefix);
    let mut parser = ToolParser::new(format, prefix);
    parser.single = !r.parallel;
    Ok(Rendered { text, parser: Some(parser), stop })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(name: &str) -> Option<ChatTemplate> {
        let dir = [concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures"), concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/fixtures")]
            .into_iter()
            .map(std::path::PathBuf::from)
            .chain(std::env::var_os("LODE_FIXTURES_DIR").map(std::path::PathBuf::from))
            .find(|d| d.is_dir());
        let Some(dir) = dir else {
            eprintln!("SKIP: fixtures not found (set LODE_FIXTURES_DIR)");
            return None;
        };
        let text = std::fs::read_to_string(dir.join("chat-templates").join(name)).ok()?;
        Some(ChatTemplate::new(&text, "<s>", "</s>").unwrap())
    }

    fn request(choice: Value) -> ToolRequest {
        let body = json!({
            "tools": [
                {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
            ],
            "tool_choice": choice,
        });
        parse(body.as_object().unwrap()).unwrap().unwrap()
    }

    fn conversation() -> Vec<Value> {
        vec![
            json!({"role": "user", "content": "Weather in Paris?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "{\"sky\": \"sunny\"}"}),
        ]
    }

    #[test]
    fn templates_with_tools_render_them_and_pick_their_format() {
        for (file, format, marker) in [
            ("Qwen-Qwen3-0.6B.jinja", ToolFormat::Hermes, "<tool_call>"),
            ("meta-llama-Llama-3.1-8B-Instruct.jinja", ToolFormat::Llama3, "get_weather"),
            ("Qwen-Qwen2.5-7B-Instruct.jinja", ToolFormat::Hermes, "<tool_response>"),
        ] {
            let Some(t) = template(file) else { return };
            let r = render(&t, &conversation(), Some(&request(json!("auto")))).unwrap();
            assert!(r.text.contains("get_time") && r.text.contains("sunny") && r.text.contains(marker), "{file}: {}", r.text);
            assert_eq!(r.parser.as_ref().unwrap().format, format, "{file}");
            let named = render(&t, &conversation(), Some(&request(json!({"type": "function", "function": {"name": "get_time"}})))).unwrap();
            assert!(named.text.ends_with("\"get_time\", \"arguments\": ") || named.text.ends_with("\"get_time\", \"parameters\": "), "{file}: {}", named.text);
            let none = render(&t, &conversation(), Some(&request(json!("none")))).unwrap();
            assert!(none.parser.is_none() && !none.text.contains("get_time"), "{file}");
        }
    }

    /// gpt-oss's template (harmony): the tools as a TypeScript namespace in the developer
    /// turn, the call and its result as harmony messages, a forced call's header as the
    /// answer's start, and a parser even without tools (every answer is channels).
    #[test]
    fn gpt_oss_renders_tools_and_calls_in_harmony() {
        let src = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/data/chat-templates/openai-gpt-oss-120b.jinja"));
        let t = ChatTemplate::new(src, "<|startoftext|>", "<|return|>").unwrap();
        assert_eq!(ToolFormat::for_template(t.text()), ToolFormat::Harmony);
        let r = render(&t, &conversation(), Some(&request(json!("auto")))).unwrap();
        for part in [
            "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {",
            "type get_weather = (_: {\ncity?: string,\n}) => any;",
            "type get_time = () => any;",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>",
            "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"{\\\"sky\\\": \\\"sunny\\\"}\"<|end|>",
        ] {
            assert!(r.text.contains(part), "{part:?} not in {}", r.text);
        }
        assert!(r.text.ends_with("<|start|>assistant"), "{}", r.text);
        let p = r.parser.unwrap();
        assert_eq!(p.format, ToolFormat::Harmony);
        let (reasoning, content, calls) =
            p.parse_message("<|channel|>analysis<|message|>Done.<|end|><|start|>assistant<|channel|>final<|message|>Sunny in Paris.");
        assert_eq!((reasoning.as_deref(), content.as_deref(), calls.len()), (Some("Done."), Some("Sunny in Paris."), 0));

        let named = render(&t, &conversation(), Some(&request(json!({"type": "function", "function": {"name": "get_time"}})))).unwrap();
        assert!(named.text.ends_with("<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>"), "{}", named.text);
        let (_, content, calls) = named.parser.unwrap().parse_message("{}");
        assert_eq!((content, calls.len(), calls[0].function.name.as_str(), calls[0].function.arguments.as_str()), (None, 1, "get_time", "{}"));

        let plain = render(&t, &[json!({"role": "user", "content": "Hi"})], None).unwrap();
        assert!(!plain.text.contains("namespace functions") && plain.parser.is_some_and(|p| p.format == ToolFormat::Harmony));

        // The reasoning before a call, sent back as `reasoning_content`, renders as the
        // analysis channel (gpt-oss's `thinking`); on another role it is refused by name.
        let mut conv = conversation();
        let m = conv[1].as_object().unwrap().clone();
        let with = message_json(&m.into_iter().chain([("reasoning_content".to_string(), json!("Need the weather tool."))]).collect(), "assistant", "", "messages[1]").unwrap();
        conv[1] = with;
        let r = render(&t, &conv, Some(&request(json!("auto")))).unwrap();
        assert!(r.text.contains("<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>"), "{}", r.text);
        let user = json!({"role": "user", "content": "x", "reasoning_content": "y"});
        let e = message_json(user.as_object().unwrap(), "user", "x", "messages[0]").unwrap_err();
        assert!(format!("{e:?}").contains("messages[0].reasoning_content"), "{e:?}");
    }

    #[test]
    fn a_template_without_tools_gets_the_polyfill() {
        let t = ChatTemplate::new(
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            "",
            "",
        )
        .unwrap();
        let r = render(&t, &conversation(), Some(&request(json!("required")))).unwrap();
        assert!(r.text.starts_with("<|im_start|>system\n# Tools"), "{}", r.text);
        // serde_json keeps insertion order (llguidance turns on `preserve_order`): name first.
        assert!(r.text.contains("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"), "{}", r.text);
        assert!(r.text.contains("<|im_start|>user\n<tool_response>\n{\"sky\": \"sunny\"}\n</tool_response>"), "{}", r.text);
        assert!(r.text.ends_with("<|im_start|>assistant\n<tool_call>\n{\"name\": \""), "{}", r.text);
        assert_eq!(r.stop.as_deref(), Some("</tool_call>"));
        let (content, calls) = r.parser.unwrap().parse("get_time\", \"arguments\": {}}\n");
        assert_eq!((content, calls.len(), calls[0].function.name.as_str()), (None, 1, "get_time"));
    }

    #[test]
    fn bad_tool_fields_name_themselves() {
        let bad = |v: Value| parse(v.as_object().unwrap()).unwrap_err().param.unwrap();
        assert_eq!(bad(json!({"tools": [{"type": "retrieval"}]})), "tools[0]");
        assert_eq!(bad(json!({"tools": [{"type": "function", "function": {}}]})), "tools[0].function.name");
        assert_eq!(bad(json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})), "tool_choice");
        assert_eq!(bad(json!({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": "yes"})), "parallel_tool_calls");
        assert_eq!(bad(json!({"tool_choice": "required"})), "tool_choice");
        assert!(parse(json!({"tools": []}).as_object().unwrap()).unwrap().is_none());
    }
}
