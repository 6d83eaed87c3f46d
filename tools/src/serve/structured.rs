//! Structured output by constrained sampling: `response_format` (`json_object`,
//! `json_schema`), llama-server's `json_schema` and `grammar` (GBNF, or Lark when it
//! starts with `%llguidance`), compiled by llguidance over lode's vocabulary.
//!
//! [`Grammars`] is built once per server: the token trie (every token's bytes as the
//! detokenizer produces them; control tokens marked special, so no grammar can spell
//! them) and llguidance's parser factory. A request's grammar is compiled before a slot
//! is taken (a schema llguidance rejects is a 400 naming the field). A slot runs it as a
//! [`GrammarConstraint`]: a worker thread computes the next token mask while the model
//! evaluates the last token, so the mask costs the decode loop only what does not
//! overlap. End-of-generation tokens are allowed exactly where the grammar may end.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use lode_runtime::engine::{Constraint, TokenMask};
use lode_runtime::tokenizer::{attr, Tokenizer};
use serde_json::{Map, Value};

use super::errors::ApiError;
use super::gbnf;
use super::scheduler::panic_message;

/// A request's output constraint, as read from the request.
#[derive(Clone, Debug, PartialEq)]
pub struct GrammarSpec {
    /// The request field it came from (`response_format`, `json_schema`, `grammar`).
    pub field: &'static str,
    pub kind: GrammarKind,
}

#[derive(Clone, Debug, PartialEq)]
pub enum GrammarKind {
    JsonSchema(Value),
    /// A Lark grammar (GBNF is rewritten to Lark when the request is read).
    Lark(String),
}

/// The fields that constrain the output: `response_format` (`text`, `json_object`
/// with llama-server's optional `schema`, `json_schema` with `json_schema.schema`),
/// llama-server's `json_schema` (a schema) and `grammar` (GBNF; Lark when it starts
/// with `%llguidance`). At most one of them; `None` when none is set.
pub fn parse(obj: &Map<String, Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let set = |k: &str| obj.get(k).filter(|v| !v.is_null());
    let mut found = Vec::new();
    if let Some(rf) = set("response_format") {
        let bad = |m: String| ApiError::invalid_param("response_format", m);
        let o = rf.as_object().ok_or_else(|| bad("`response_format` must be an object".into()))?;
        match o.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                let schema = o.get("schema").filter(|v| !v.is_null()).cloned().unwrap_or(serde_json::json!({"type": "object"}));
                found.push(GrammarSpec { field: "response_format", kind: GrammarKind::JsonSchema(check_schema(schema, "response_format.schema")?) });
            }
            Some("json_schema") => {
                let js = o
                    .get("json_schema")
                    .and_then(Value::as_object)
                    .ok_or_else(|| bad("`response_format.json_schema` must be an object with the `schema`".into()))?;
                if js.get("name").is_some_and(|n| !n.is_string() && !n.is_null()) {
                    return Err(bad("`response_format.json_schema.name` must be a string".into()));
                }
                if js.get("strict").is_some_and(|s| !s.is_boolean() && !s.is_null()) {
                    return Err(bad("`response_format.json_schema.strict` must be a boolean".into()));
                }
                // No schema: any JSON value.
                let schema = js.get("schema").filter(|v| !v.is_null()).cloned().unwrap_or(serde_json::json!({}));
                found.push(GrammarSpec { field: "response_format", kind: GrammarKind::JsonSchema(check_schema(schema, "response_format.json_schema.schema")?) });
            }
            other => {
                return Err(bad(format!(
                    "`response_format.type` must be `text`, `json_object` or `json_schema`, got {}",
                    other.map_or_else(|| "none".to_string(), |t| format!("`{t}`"))
                )))
            }
        }
    }
    if let Some(schema) = set("json_schema") {
        found.push(GrammarSpec { field: "json_schema", kind: GrammarKind::JsonSchema(check_schema(schema.clone(), "json_schema")?) });
    }
    match set("grammar") {
        None => {}
        Some(Value::String(g)) if g.trim().is_empty() => {}
        Some(Value::String(g)) if g.trim_start().starts_with("%llguidance") => {
            found.push(GrammarSpec { field: "grammar", kind: GrammarKind::Lark(g.clone()) });
        }
        Some(Value::String(g)) => {
            let lark = gbnf::to_lark(g).map_err(|e| ApiError::invalid_param("grammar", format!("`grammar` is not valid GBNF: {e}")))?;
            found.push(GrammarSpec { field: "grammar", kind: GrammarKind::Lark(lark) });
        }
        Some(_) => return Err(ApiError::invalid_param("grammar", "`grammar` must be a string (GBNF)")),
    }
    if found.len() > 1 {
        return Err(ApiError::invalid_param(
            found[1].field,
            format!("`{}` and `{}` cannot both constrain the output; send one", found[0].field, found[1].field),
        ));
    }
    Ok(found.pop())
}

/// A JSON schema is an object (or `true` / `false`).
fn check_schema(schema: Value, what: &str) -> Result<Value, ApiError> {
    if schema.is_object() || schema.is_boolean() {
        return Ok(schema);
    }
    let field = what.split('.').next().unwrap_or(what);
    Err(ApiError::invalid_param(field, format!("`{what}` must be a JSON schema (an object)")))
}

/// The bytes llguidance sees for each token id: what the detokenizer produces, with
/// control and unknown tokens marked special (`0xFF` + their text) so that no text
/// matches them; unused ids are empty.
pub fn token_bytes(tok: &Tokenizer) -> Vec<Vec<u8>> {
    (0..tok.vocab_size() as u32)
        .map(|id| {
            let piece = tok.piece(id, true);
            if tok.token_attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 && !piece.is_empty() {
                let mut b = Vec::with_capacity(piece.len() + 1);
                b.push(TokTrie::SPECIAL_TOKEN_MARKER);
                b.extend_from_slice(piece);
                b
            } else {
                piece.to_vec()
            }
        })
        .collect()
}

/// lode's tokenizer as llguidance's `TokenizerEnv`.
struct LodeTokEnv {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for LodeTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tok.encode(text, false, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    /// Not promised canonical, so llguidance never forces tokens by its own
    /// tokenization (the mask alone decides).
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// The server's grammar compiler: one per model.
pub struct Grammars {
    factory: ParserFactory,
    eog: Vec<u32>,
}

impl Grammars {
    /// Builds the token trie and the parser factory for `tok`'s vocabulary.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars, String> {
        let n = tok.vocab_size();
        let eog: Vec<u32> = tok.eog_ids().into_iter().filter(|&e| (e as usize) < n).collect();
        let Some(&first) = eog.first() else {
            return Err("the model's vocabulary has no end-of-generation token".into());
        };
        let words = token_bytes(&tok);
        let built = catch_unwind(AssertUnwindSafe(|| {
            let info = TokRxInfo::new(n as u32, first);
            let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
            let env: TokEnv = Arc::new(LodeTokEnv { trie, tok: tok.clone() });
            ParserFactory::new_simple(&env).map_err(|e| e.to_string())
        }));
        let mut factory = match built {
            Ok(r) => r?,
            Err(p) => return Err(format!("cannot build the token trie: {}", panic_message(p.as_ref()))),
        };
        factory.quiet();
        Ok(Grammars { factory, eog })
    }

    /// The end-of-generation ids the constraint allows where the grammar may end.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// Compiles a request's grammar; a grammar or schema llguidance rejects is a 400
    /// naming the field and the reason.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Matcher, ApiError> {
        let grammar = match &spec.kind {
            GrammarKind::JsonSchema(schema) => TopLevelGrammar::from_json_schema(with_default_layout(schema)),
            GrammarKind::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        let bad = |why: String| ApiError::invalid_param(spec.field, format!("`{}` cannot be used: {why}", spec.field));
        let parser = catch_unwind(AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|p| bad(format!("the grammar compiler failed ({})", panic_message(p.as_ref()))))?
            .map_err(|e| bad(first_line(&e.to_string())))?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(bad(first_line(&e))),
            None => Ok(m),
        }
    }
}

fn first_line(s: &str) -> String {
    let mut lines = s.lines();
    let first = lines.next().unwrap_or_default().to_string();
    // llguidance's errors may carry a grammar excerpt after the first line; keep a little.
    match lines.next() {
        Some(l) if first.len() < 40 => format!("{first} {}", l.trim()),
        _ => first,
    }
}

/// JSON without free whitespace (`", "` and `": "` between items), unless the schema
/// sets its own layout (`x-guidance`): a small model given free whitespace may spend
/// its tokens on blank lines.
fn with_default_layout(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    s
}

/// Where a generation's constraint reports a failure (the slot turns it into a 500).
pub type ErrorCell = Arc<Mutex<Option<String>>>;

/// What the masks cost, for `/metrics`: how many, the time the worker threads spent
/// computing them, and the part the sampler waited for (not hidden behind the forward
/// pass).
#[derive(Debug, Default)]
pub struct GrammarStats {
    pub masks: AtomicU64,
    pub mask_us: AtomicU64,
    pub wait_us: AtomicU64,
}

/// A compiled grammar driving one generation, its masks computed on a worker thread.
pub struct GrammarConstraint {
    to_worker: Sender<u32>,
    from_worker: Receiver<TokenMask>,
    eog: Vec<u32>,
    error: ErrorCell,
    stats: Arc<GrammarStats>,
}

impl GrammarConstraint {
    /// Starts the worker; it computes the first mask at once (overlapping the prompt).
    pub fn start(matcher: Matcher, eog: Vec<u32>, error: ErrorCell, stats: Arc<GrammarStats>) -> std::io::Result<GrammarConstraint> {
        let (to_worker, tokens) = mpsc::channel();
        let (masks, from_worker) = mpsc::channel();
        let (e, err, st) = (eog.clone(), error.clone(), stats.clone());
        std::thread::Builder::new()
            .name("lode-grammar".into())
            .spawn(move || worker(matcher, &e, &err, &st, tokens, masks))?;
        Ok(GrammarConstraint { to_worker, from_worker, eog, error, stats })
    }

    fn fail(&self, why: String) -> TokenMask {
        fail(&self.error, &self.eog, why)
    }
}

fn eog_only(eog: &[u32]) -> TokenMask {
    let mut m = TokenMask::default();
    eog.iter().for_each(|&e| m.set(e, true));
    m
}

fn fail(error: &ErrorCell, eog: &[u32], why: String) -> TokenMask {
    let mut e = error.lock().unwrap_or_else(|p| p.into_inner());
    e.get_or_insert(why);
    eog_only(eog)
}

/// The mask of the matcher's current state, end-of-generation set where it may end.
pub fn next_mask(m: &mut Matcher, eog: &[u32], error: &ErrorCell) -> TokenMask {
    if m.is_stopped() {
        if let Some(e) = m.get_error() {
            return fail(error, eog, format!("the grammar stopped: {}", first_line(&e)));
        }
        // Complete: nothing more may follow.
        return eog_only(eog);
    }
    let vob = match m.compute_mask() {
        Ok(v) => v,
        Err(e) => return fail(error, eog, format!("the grammar failed: {}", first_line(&e.to_string()))),
    };
    let mut mask = TokenMask::from_words(vob.as_slice().to_vec());
    // llguidance sets the EOS ids where the grammar accepts; keep them as one set.
    let accepting = eog.iter().any(|&e| mask.allows(e));
    eog.iter().for_each(|&e| mask.set(e, accepting));
    if mask.count() == 0 {
        return fail(error, eog, "the grammar allows no token here".into());
    }
    mask
}

fn worker(mut m: Matcher, eog: &[u32], error: &ErrorCell, stats: &GrammarStats, tokens: Receiver<u32>, masks: Sender<TokenMask>) {
    loop {
        let t0 = Instant::now();
        let mask = next_mask(&mut m, eog, error);
        stats.masks.fetch_add(1, Relaxed);
        stats.mask_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
        if masks.send(mask).is_err() {
            return;
        }
        let Ok(tok) = tokens.recv() else { return };
        if eog.contains(&tok) {
            return;
        }
        if let Err(e) = m.consume_token(tok) {
            fail(error, eog, format!("the grammar refused token {tok}: {}", first_line(&e.to_string())));
        }
    }
}

impl Constraint for GrammarConstraint {
    fn allowed(&mut self) -> TokenMask {
        let t0 = Instant::now();
        let r = self.from_worker.recv();
        self.stats.wait_us.fetch_add(t0.elapsed().as_micros() as u64, Relaxed);
        match r {
            Ok(m) => m,
            Err(_) => self.fail("the grammar worker stopped".into()),
        }
    }

    fn commit(&mut self, token: u32) {
        // A closed worker is reported by the next `allowed`.
        let _ = self.to_worker.send(token);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lode_runtime::engine::{Sampler, SamplerParams};
    use lode_runtime::tokenizer::Vocab;
    use serde_json::json;

    /// A small SentencePiece-style vocabulary: `<unk>`, `<s>`, `</s>` (EOS), then text.
    const TEXT: [&str; 15] = ["{", "}", "\"", "a", "b", ":", "\u{2581}", ",", "1", "2", "x", "ab", "{\"", "\u{2581}1", "<0x0A>"];

    fn tokenizer() -> Arc<Tokenizer> {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].iter().map(|s| s.to_string()).collect();
        tokens.extend(TEXT.iter().map(|s| s.to_string()));
        let mut types = vec![2, 3, 3];
        types.extend(TEXT.iter().map(|t| if t.starts_with("<0x") { 6 } else { 1 }));
        let v = Vocab {
            model: "llama".into(),
            scores: Some(vec![0.0; tokens.len()]),
            token_types: Some(types),
            tokens,
            ..Default::default()
        };
        Arc::new(Tokenizer::from_vocab(&v).unwrap())
    }

    fn id(tok: &Tokenizer, text: &str) -> u32 {
        tok.token_id(text).unwrap()
    }

    #[test]
    fn token_bytes_are_the_detokenizers_and_control_tokens_are_special() {
        let tok = tokenizer();
        let b = token_bytes(&tok);
        assert_eq!(b[2], b"\xFF</s>");
        assert_eq!(b[id(&tok, "\u{2581}1") as usize], b" 1");
        assert_eq!(b[id(&tok, "<0x0A>") as usize], b"\n");
        assert_eq!(b[id(&tok, "{\"") as usize], b"{\"");
    }

    #[test]
    fn the_mask_follows_a_schema_and_forbidden_tokens_get_minus_infinity() {
        let tok = tokenizer();
        let g = Grammars::new(tok.clone()).unwrap();
        assert_eq!(g.eog(), &[2]);
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
        let spec = GrammarSpec { field: "response_format", kind: GrammarKind::JsonSchema(schema) };
        let mut m = g.compile(&spec).unwrap();
        let err = ErrorCell::default();
        let n = tok.vocab_size();

        // First token: only those starting with `{`.
        let mask = next_mask(&mut m, g.eog(), &err);
        let allowed: Vec<u32> = (0..n as u32).filter(|&t| mask.allows(t)).collect();
        assert_eq!(allowed, vec![id(&tok, "{"), id(&tok, "{\"")]);
        let mut logits = vec![1.0f32; n + 3]; // a model's logits may be wider than its vocabulary
        mask.apply(&mut logits);
        for (t, l) in logits.iter().enumerate() {
            let want_finite = allowed.contains(&(t as u32));
            assert_eq!(l.is_finite(), want_finite, "token {t} ({:?}): {l}", tok.token_text(t as u32));
        }
        assert_eq!(logits[id(&tok, "x") as usize], f32::NEG_INFINITY);
        assert_eq!(logits[2], f32::NEG_INFINITY, "EOS before the object is complete");

        // Spell `{"a": 12}`; EOS only at the end, then only EOS.
        for piece in ["{\"", "a", "\"", ":", "\u{2581}1", "2"] {
            let mask = next_mask(&mut m, g.eog(), &err);
            assert!(mask.allows(id(&tok, piece)), "{piece} should be allowed");
            assert!(!mask.allows(2), "EOS before `}}`");
            m.consume_token(id(&tok, piece)).unwrap();
        }
        let mask = next_mask(&mut m, g.eog(), &err);
        assert!(!mask.allows(id(&tok, "b")) && !mask.allows(id(&tok, ",")) && mask.allows(id(&tok, "}")));
        m.consume_token(id(&tok, "}")).unwrap();
        let mask = next_mask(&mut m, g.eog(), &err);
        assert_eq!((mask.count(), mask.allows(2)), (1, true), "complete: only EOS");
        assert!(err.lock().unwrap().is_none());
    }

    /// Hot sampling over random logits through the worker thread: every output matches
    /// the grammar and ends with EOS.
    #[test]
    fn sampling_under_a_gbnf_grammar_only_produces_matches() {
        let tok = tokenizer();
        let g = Grammars::new(tok.clone()).unwrap();
        let spec = parse(json!({"grammar": "root ::= \"x\" [12]{2,3} (\",\" ab)?\nab ::= \"a\" | \"b\"+"}).as_object().unwrap())
            .unwrap()
            .unwrap();
        let m = g.compile(&spec).unwrap();
        let mut seen = std::collections::HashSet::new();
        let stats = Arc::new(GrammarStats::default());
        let mut draws = 0;
        for seed in 0..40u64 {
            let err = ErrorCell::default();
            let c = GrammarConstraint::start(m.clone(), g.eog().to_vec(), err.clone(), stats.clone()).unwrap();
            let p = SamplerParams { temp: 1.5, top_k: 0, top_p: 1.0, min_p: 0.0, seed, ..Default::default() };
            let mut s = Sampler::new(p).with_constraint(Box::new(c));
            let mut rng = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            let mut out = Vec::new();
            loop {
                let logits: Vec<f32> = (0..tok.vocab_size())
                    .map(|_| {
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        (rng >> 40) as f32 / (1u64 << 24) as f32 * 4.0
                    })
                    .collect();
                let t = s.sample(&logits);
                draws += 1;
                if t == 2 {
                    break;
                }
                out.push(t);
                assert!(out.len() < 20, "runaway output {:?}", tok.decode(&out));
            }
            let text = tok.decode(&out);
            let (head, tail) = text.split_once(',').unwrap_or((&text, ""));
            let digits = &head[1..];
            assert!(head.starts_with('x') && (2..=3).contains(&digits.len()) && digits.chars().all(|c| c == '1' || c == '2'), "{text}");
            assert!(tail.is_empty() && !text.contains(',') || tail == "a" || (!tail.is_empty() && tail.chars().all(|c| c == 'b')), "{text}");
            assert!(err.lock().unwrap().is_none());
            seen.insert(text);
        }
        assert!(seen.len() > 5, "hot sampling should vary: {seen:?}");
        // One mask per token drawn, EOS included.
        assert_eq!(stats.masks.load(Relaxed), draws, "{stats:?}");
    }

    #[test]
    fn request_fields_are_read_and_refused_by_name() {
        let p = |v: Value| parse(v.as_object().unwrap());
        assert_eq!(p(json!({"response_format": {"type": "text"}})).unwrap(), None);
        let s = p(json!({"response_format": {"type": "json_object"}})).unwrap().unwrap();
        assert_eq!((s.field, s.kind), ("response_format", GrammarKind::JsonSchema(json!({"type": "object"}))));
        let schema = json!({"type": "array"});
        let s = p(json!({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}}));
        assert_eq!(s.unwrap().unwrap().kind, GrammarKind::JsonSchema(json!({"type": "array"})));
        assert_eq!(p(json!({"json_schema": {"type": "string"}})).unwrap().unwrap().field, "json_schema");
        let s = p(json!({"grammar": "%llguidance {}\nstart: \"a\""})).unwrap().unwrap();
        assert!(matches!(s.kind, GrammarKind::Lark(ref t) if t.starts_with("%llguidance")));
        assert!(matches!(p(json!({"grammar": "root ::= \"a\""})).unwrap().unwrap().kind, GrammarKind::Lark(_)));
        assert_eq!(p(json!({"grammar": ""})).unwrap(), None);
        for (body, field) in [
            (json!({"response_format": "json"}), "response_format"),
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"response_format": {"type": "json_schema", "json_schema": {"schema": [1]}}}), "response_format"),
            (json!({"response_format": {"type": "json_schema", "json_schema": {"strict": "yes"}}}), "response_format"),
            (json!({"grammar": "root ::= \"a"}), "grammar"),
            (json!({"grammar": 1}), "grammar"),
            (json!({"json_schema": 3}), "json_schema"),
            (json!({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""}), "grammar"),
        ] {
            let e = p(body.clone()).expect_err(&body.to_string());
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)), "{body}: {}", e.message);
        }
        // What llguidance rejects is a 400 naming the field, with its reason.
        let g = Grammars::new(tokenizer()).unwrap();
        let bad = GrammarSpec { field: "json_schema", kind: GrammarKind::JsonSchema(json!({"$ref": "#/nowhere"})) };
        let e = g.compile(&bad).err().expect("refused");
        assert_eq!(e.param.as_deref(), Some("json_schema"));
        assert!(e.message.contains("nowhere"), "{}", e.message);
        let bad = GrammarSpec { field: "grammar", kind: GrammarKind::Lark("start: UNDEFINED".into()) };
        assert_eq!(g.compile(&bad).err().expect("refused").param.as_deref(), Some("grammar"));
    }
}
