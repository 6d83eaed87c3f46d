//! Chat templates: every template in `fixtures/chat-templates/` renders an ordinary
//! conversation (system, user, assistant, user; generation prompt on), and the two real
//! models' templates render exactly the chat prompt llama.cpp used in `greedy.json` —
//! and tokenize to the same ids.

use std::path::PathBuf;

use lode_runtime::gguf::GgufFile;
use lode_runtime::tokenizer::{ChatMessage, ChatTemplate, TemplateSource, Tokenizer};
use serde_json::Value;

mod real_files;
use real_files::{fixtures_dir, model};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a terse assistant."),
        ChatMessage::new("user", "What is the capital of France?"),
        ChatMessage::new("assistant", "Paris."),
        ChatMessage::new("user", "And of Japan?"),
    ]
}

#[test]
fn every_fixture_template_renders_a_conversation() {
    let Some(dir) = fixtures_dir() else { return };
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir.join("chat-templates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    names.sort();
    assert!(names.len() >= 11, "expected the 11 fixture templates, found {}", names.len());
    let mut failures = Vec::new();
    for path in &names {
        let src = std::fs::read_to_string(path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let result = ChatTemplate::new(&src, "<s>", "</s>").and_then(|t| t.render(&conversation(), true));
        match result {
            Ok(text) => {
                // The content of every turn is in the prompt, in order.
                let mut at = 0;
                for m in conversation().iter().skip(1) {
                    match text[at..].find(&m.content) {
                        Some(i) => at += i + m.content.len(),
                        None => failures.push(format!("{name}: {:?} missing or out of order in\n{text}", m.content)),
                    }
                }
                eprintln!("--- {name}\n{text}");
            }
            Err(e) => failures.push(format!("{name}: {e}")),
        }
    }
    eprintln!("{}/{} templates render", names.len() - failures.len(), names.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn check_greedy_chat(model_file: &str, fixture: &str, want_source: TemplateSource) {
    let (Some(dir), Some(path)) = (fixtures_dir(), model(model_file)) else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    let template = ChatTemplate::for_tokenizer(&tok).unwrap();
    assert_eq!(template.source, want_source);
    let json: Value = serde_json::from_str(&std::fs::read_to_string(dir.join(fixture).join("greedy.json")).unwrap()).unwrap();
    let chats = json["chat"].as_array().unwrap();
    assert!(!chats.is_empty());
    for case in chats {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let prompt = template.apply(&messages, true).unwrap();
        assert_eq!(prompt, case["prompt_text"].as_str().unwrap(), "{fixture} {}", case["id"]);
        let want: Vec<u32> = case["prompt_ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
        let add = case["add_special"].as_bool().unwrap();
        let parse = case["parse_special"].as_bool().unwrap();
        assert_eq!(tok.encode(&prompt, add, parse), want, "{fixture} {} ids", case["id"]);
    }
}

#[test]
fn smollm2_template_renders_the_greedy_fixture_prompt() {
    check_greedy_chat("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m", TemplateSource::Model);
}

#[test]
fn gemma3_without_template_uses_the_builtin_gemma_format() {
    check_greedy_chat("gemma-3-270m-q4_k_m.gguf", "gemma3-270m", TemplateSource::BuiltinGemma);
}

#[test]
fn a_template_starting_with_bos_loses_it_when_the_tokenizer_adds_bos() {
    let Some(path) = model("gemma-3-270m-q4_k_m.gguf") else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    // Gemma 2's published template starts with {{ bos_token }}, as many do.
    let src = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}";
    let t = ChatTemplate::for_tokenizer_with(&tok, Some(src)).unwrap();
    let msgs = [ChatMessage::new("user", "hi")];
    assert_eq!(t.render(&msgs, false).unwrap(), "<bos>hi");
    assert_eq!(t.apply(&msgs, false).unwrap(), "hi");
    let ids = tok.encode(&t.apply(&msgs, false).unwrap(), true, true);
    assert_eq!(ids, tok.encode("hi", true, false));
    assert_eq!(ids.iter().filter(|&&i| i == 2).count(), 1, "exactly one BOS: {ids:?}");
}
