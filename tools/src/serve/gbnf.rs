//! llama.cpp's GBNF grammars, read and rewritten in the Lark-like syntax llguidance
//! compiles. GBNF: `name ::= alternatives` rules (a rule ends at a newline outside
//! parentheses), `"literals"`, `[character classes]` (`^` negates, `a-z` ranges), `.`
//! (any character), `( groups )`, rule references, and the repetitions `*`, `+`, `?`,
//! `{m}`, `{m,}`, `{m,n}`; `#` comments. `root` is where a text starts.
//!
//! Rules made only of literals, classes and other such rules become Lark terminals
//! (one lexeme each, matched as a regular expression), the rest Lark rules.

use std::collections::HashMap;
use std::fmt::Write;

/// A GBNF expression.
#[derive(Clone, Debug, PartialEq)]
enum Node {
    Lit(String),
    Class { negated: bool, ranges: Vec<(char, char)> },
    Any,
    Ref(String),
    /// A parenthesised group: alternatives of sequences.
    Group(Vec<Vec<Node>>),
    Repeat { node: Box<Node>, min: u32, max: Option<u32> },
}

/// Why a GBNF grammar could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} (line {line}, column {column})")]
pub struct GbnfError {
    pub message: String,
    pub line: usize,
    pub column: usize,
}

/// Most repetitions `{m,n}` may ask for (llguidance expands them).
const MAX_REPEAT: u32 = 10_000;

struct Reader<'a> {
    src: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, message: impl Into<String>) -> GbnfError {
        let before = &self.src[..self.pos];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        GbnfError { message: message.into(), line, column }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    /// Skips blanks and comments; newlines too where `newlines`.
    fn space(&mut self, newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if newlines => {
                    self.bump();
                }
                '#' => {
                    while self.peek().is_some_and(|c| c != '\n' && c != '\r') {
                        self.bump();
                    }
                }
                _ => break,
            }
        }
    }

    fn is_name_char(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    fn name(&mut self) -> Result<String, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(Self::is_name_char) {
            self.bump();
        }
        if self.pos == start {
            return Err(self.err("expected a rule name"));
        }
        Ok(self.src[start..self.pos].to_string())
    }

    fn hex(&mut self, digits: usize) -> Result<char, GbnfError> {
        let start = self.pos;
        for _ in 0..digits {
            match self.bump() {
                Some(c) if c.is_ascii_hexdigit() => {}
                _ => return Err(self.err(format!("expected {digits} hex digits after the escape"))),
            }
        }
        let v = u32::from_str_radix(&self.src[start..self.pos], 16).map_err(|_| self.err("bad hex escape"))?;
        char::from_u32(v).ok_or_else(|| self.err(format!("\\u{{{v:x}}} is not a character")))
    }

    /// One character of a literal or class, with GBNF's escapes.
    fn char(&mut self) -> Result<char, GbnfError> {
        match self.bump() {
            None => Err(self.err("unexpected end of the grammar")),
            Some('\\') => match self.bump() {
                Some('n') => Ok('\n'),
                Some('r') => Ok('\r'),
                Some('t') => Ok('\t'),
                Some('x') => self.hex(2),
                Some('u') => self.hex(4),
                Some('U') => self.hex(8),
                Some(c @ ('\\' | '"' | '[' | ']' | '-' | '^')) => Ok(c),
                Some(c) => Err(self.err(format!("unknown escape \\{c}"))),
                None => Err(self.err("unexpected end of the grammar after \\")),
            },
            Some(c) => Ok(c),
        }
    }

    fn literal(&mut self) -> Result<Node, GbnfError> {
        self.bump(); // "
        let mut s = String::new();
        loop {
            if self.peek() == Some('"') {
                self.bump();
                return Ok(Node::Lit(s));
            }
            if matches!(self.peek(), None | Some('\n')) {
                return Err(self.err("unterminated string literal"));
            }
            s.push(self.char()?);
        }
    }

    fn class(&mut self) -> Result<Node, GbnfError> {
        self.bump(); // [
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let mut ranges = Vec::new();
        loop {
            match self.peek() {
                Some(']') => {
                    self.bump();
                    return Ok(Node::Class { negated, ranges });
                }
                None | Some('\n') => return Err(self.err("unterminated character class")),
                _ => {}
            }
            let lo = self.char()?;
            let hi = if self.peek() == Some('-') && !self.src[self.pos + 1..].starts_with(']') {
                self.bump();
                self.char()?
            } else {
                lo
            };
            if hi < lo {
                return Err(self.err(format!("character range {lo:?}-{hi:?} is backwards")));
            }
            ranges.push((lo, hi));
        }
    }

    fn number(&mut self) -> Result<u32, GbnfError> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        let n: u32 = self.src[start..self.pos].parse().map_err(|_| self.err("expected a number"))?;
        if n > MAX_REPEAT {
            return Err(self.err(format!("a repetition count is at most {MAX_REPEAT}, got {n}")));
        }
        Ok(n)
    }

    /// `{m}`, `{m,}`, `{m,n}` after the `{`.
    fn braces(&mut self) -> Result<(u32, Option<u32>), GbnfError> {
        self.space(true);
        let min = self.number()?;
        self.space(true);
        let max = match self.bump() {
            Some('}') => return Ok((min, Some(min))),
            Some(',') => {
                self.space(true);
                let max = if self.peek() == Some('}') { None } else { Some(self.number()?) };
                self.space(true);
                max
            }
            _ => return Err(self.err("expected `,` or `}` in a repetition")),
        };
        if self.bump() != Some('}') {
            return Err(self.err("expected `}` to close a repetition"));
        }
        if max.is_some_and(|m| m < min) {
            return Err(self.err(format!("repetition {{{min},{}}} has its maximum below its minimum", max.unwrap_or(0))));
        }
        Ok((min, max))
    }

    fn sequence(&mut self, nested: bool) -> Result<Vec<Node>, GbnfError> {
        let mut seq: Vec<Node> = Vec::new();
        loop {
            self.space(nested);
            let node = match self.peek() {
                Some('"') => self.literal()?,
                Some('[') => self.class()?,
                Some('.') => {
                    self.bump();
                    Node::Any
                }
                Some('(') => {
                    self.bump();
                    let alts = self.alternatives(true)?;
                    self.space(true);
                    if self.bump() != Some(')') {
                        return Err(self.err("expected `)`"));
                    }
                    Node::Group(alts)
                }
                Some(c) if Self::is_name_char(c) => {
                    let start = self.pos;
                    let name = self.name()?;
                    let mut ahead = Reader { src: self.src, pos: self.pos };
                    ahead.space(false);
                    if ahead.src[ahead.pos..].starts_with("::=") {
                        // The next rule's head: this sequence ended at the newline.
                        self.pos = start;
                        return Ok(seq);
                    }
                    Node::Ref(name)
                }
                Some(op @ ('*' | '+' | '?' | '{')) => {
                    return Err(self.err(format!("`{op}` must follow something to repeat")));
                }
                Some(c @ '<') => return Err(self.err(format!("`{c}…>` token references are not supported"))),
                _ => return Ok(seq),
            };
            seq.push(node);
            // Postfix repetitions (several may stack: `x?*`).
            loop {
                self.space(nested);
                let (min, max) = match self.peek() {
                    Some('*') => (0, None),
                    Some('+') => (1, None),
                    Some('?') => (0, Some(1)),
                    Some('{') => {
                        self.bump();
                        let r = self.braces()?;
                        let last = seq.pop().unwrap_or(Node::Lit(String::new()));
                        seq.push(Node::Repeat { node: Box::new(last), min: r.0, max: r.1 });
                        continue;
                    }
                    _ => break,
                };
                self.bump();
                let last = seq.pop().unwrap_or(Node::Lit(String::new()));
                seq.push(Node::Repeat { node: Box::new(last), min, max });
            }
        }
    }

    fn alternatives(&mut self, nested: bool) -> Result<Vec<Vec<Node>>, GbnfError> {
        let mut alts = vec![self.sequence(nested)?];
        loop {
            self.space(nested);
            if self.peek() != Some('|') {
                return Ok(alts);
            }
            self.bump();
            self.space(true);
            alts.push(self.sequence(nested)?);
        }
    }
}

/// A rule: its name and its alternatives.
type Rule = (String, Vec<Vec<Node>>);

/// The rules of a grammar, in order of definition.
fn parse(src: &str) -> Result<Vec<Rule>, GbnfError> {
    let mut r = Reader { src, pos: 0 };
    let mut rules: Vec<Rule> = Vec::new();
    loop {
        r.space(true);
        if r.peek().is_none() {
            break;
        }
        let name = r.name()?;
        r.space(false);
        if !r.src[r.pos..].starts_with("::=") {
            return Err(r.err(format!("expected `::=` after the rule name `{name}`")));
        }
        r.pos += 3;
        r.space(true);
        let alts = r.alternatives(false)?;
        r.space(false);
        match r.peek() {
            None | Some('\n' | '\r') => {}
            Some(c) => return Err(r.err(format!("unexpected `{c}` in the rule `{name}`"))),
        }
        if rules.iter().any(|(n, _)| *n == name) {
            return Err(r.err(format!("the rule `{name}` is defined twice")));
        }
        rules.push((name, alts));
    }
    Ok(rules)
}

fn refs<'n>(node: &'n Node, out: &mut Vec<&'n str>) {
    match node {
        Node::Ref(n) => out.push(n),
        Node::Group(alts) => alts.iter().flatten().for_each(|n| refs(n, out)),
        Node::Repeat { node, .. } => refs(node, out),
        _ => {}
    }
}

/// A string literal as Lark reads it (JSON string syntax; DEL escaped too).
fn lark_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A character inside a regex class: letters and digits as they are, the rest escaped.
fn class_char(c: char, out: &mut String) {
    if c.is_ascii_alphanumeric() {
        out.push(c);
    } else {
        let _ = write!(out, "\\x{{{:x}}}", c as u32);
    }
}

struct Emitter<'a> {
    names: &'a HashMap<String, String>,
}

impl Emitter<'_> {
    fn seq(&self, seq: &[Node], out: &mut String) {
        if seq.is_empty() {
            out.push_str("\"\"");
        }
        for (i, n) in seq.iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            self.node(n, out);
        }
    }

    fn alts(&self, alts: &[Vec<Node>], out: &mut String) {
        for (i, s) in alts.iter().enumerate() {
            if i > 0 {
                out.push_str(" | ");
            }
            self.seq(s, out);
        }
    }

    fn node(&self, n: &Node, out: &mut String) {
        match n {
            Node::Lit(s) => out.push_str(&lark_string(s)),
            Node::Any => out.push_str("/(?s:.)/"),
            // `[^]`: any character.
            Node::Class { negated: true, ranges } if ranges.is_empty() => out.push_str("/(?s:.)/"),
            Node::Class { negated, ranges } => {
                out.push_str(if *negated { "/[^" } else { "/[" });
                for &(lo, hi) in ranges {
                    class_char(lo, out);
                    if hi != lo {
                        out.push('-');
                        class_char(hi, out);
                    }
                }
                if ranges.is_empty() && !negated {
                    // `[]` matches nothing; a class that can never match.
                    out.push_str("^\\x{0}-\\x{10ffff}");
                }
                out.push_str("]/");
            }
            Node::Ref(name) => out.push_str(&self.names[name]),
            Node::Group(alts) => {
                out.push('(');
                self.alts(alts, out);
                out.push(')');
            }
            Node::Repeat { node, min, max } => {
                if *max == Some(0) {
                    out.push_str("\"\"");
                    return;
                }
                if matches!(**node, Node::Group(_)) {
                    self.node(node, out);
                } else {
                    out.push('(');
                    self.node(node, out);
                    out.push(')');
                }
                match (*min, *max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (m, None) => {
                        let _ = write!(out, "{{{m},}}");
                    }
                    (m, Some(x)) => {
                        let _ = write!(out, "{{{m},{x}}}");
                    }
                }
            }
        }
    }
}

/// A GBNF grammar rewritten as a Lark grammar for llguidance (`start` derives `root`).
pub fn to_lark(src: &str) -> Result<String, GbnfError> {
    let rules = parse(src)?;
    let at_end = || {
        let line = src.matches('\n').count() + 1;
        GbnfError { message: String::new(), line, column: 1 }
    };
    if !rules.iter().any(|(n, _)| n == "root") {
        return Err(GbnfError { message: "the grammar has no `root` rule".into(), ..at_end() });
    }
    let index: HashMap<&str, usize> = rules.iter().enumerate().map(|(i, (n, _))| (n.as_str(), i)).collect();
    let deps: Vec<Vec<usize>> = rules
        .iter()
        .map(|(name, alts)| {
            let mut r = Vec::new();
            alts.iter().flatten().for_each(|n| refs(n, &mut r));
            r.iter()
                .map(|d| {
                    index.get(d).copied().ok_or_else(|| GbnfError {
                        message: format!("the rule `{name}` refers to `{d}`, which is not defined"),
                        ..at_end()
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        })
        .collect::<Result<_, _>>()?;
    // A rule is a terminal once everything it refers to is (never through a cycle);
    // `root` stays a rule.
    let mut terminal = vec![false; rules.len()];
    loop {
        let mut changed = false;
        for i in 0..rules.len() {
            if !terminal[i] && rules[i].0 != "root" && deps[i].iter().all(|&d| terminal[d]) {
                terminal[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    // Lark names: rules lowercase, terminals uppercase; prefixed so none is `start`,
    // numbered so two GBNF names differing only in case stay apart.
    let mut names = HashMap::new();
    for (i, (name, _)) in rules.iter().enumerate() {
        let clean: String = name.chars().map(|c| if c == '_' { '-' } else { c }).collect();
        let lark = if terminal[i] {
            format!("G{i}-{}", clean.to_ascii_uppercase())
        } else {
            format!("g{i}-{}", clean.to_ascii_lowercase())
        };
        names.insert(name.clone(), lark);
    }
    let e = Emitter { names: &names };
    let mut out = format!("start: {}\n", names["root"]);
    for (name, alts) in &rules {
        out.push_str(&names[name]);
        out.push_str(": ");
        e.alts(alts, &mut out);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_become_lark_rules_and_terminals() {
        let g = "# a list\nroot ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [a-z]+ | num\nnum ::= [0-9]{1,3}\n";
        let lark = to_lark(g).unwrap();
        assert_eq!(
            lark,
            "start: g0-root\n\
             g0-root: \"[\" G1-ITEM (\",\" G1-ITEM)* \"]\"\n\
             G1-ITEM: (/[a-z]/)+ | G2-NUM\n\
             G2-NUM: (/[0-9]/){1,3}\n"
        );
    }

    #[test]
    fn escapes_classes_and_groups_over_lines() {
        let g = "root ::= (\n  \"a\\n\\\"\" |\n  [^\"\\\\\\x00-\\x1f] . \n) \"\\u00e9\"? ws\nws ::= [ \\t]*";
        let lark = to_lark(g).unwrap();
        assert!(lark.contains("(\"a\\u000a\\\"\" | /[^\\x{22}\\x{5c}\\x{0}-\\x{1f}]/ /(?s:.)/)"), "{lark}");
        assert!(lark.contains("(\"é\")?"), "{lark}");
        assert!(lark.contains("WS: (/[\\x{20}\\x{9}]/)*"), "{lark}");
    }

    #[test]
    fn recursion_stays_a_rule() {
        let lark = to_lark("root ::= \"(\" root \")\" | \"x\"").unwrap();
        assert!(lark.contains("g0-root: \"(\" g0-root \")\" | \"x\""), "{lark}");
    }

    #[test]
    fn malformed_grammars_are_errors_never_panics() {
        // Every prefix of real grammars, then strings drawn from GBNF's own characters: each
        // is converted or refused; a panic fails the test.
        let seeds = [
            "root ::= \"[\" item (\",\" item)* \"]\"\nitem ::= [a-z]+ | num\nnum ::= [0-9]{1,3}\n",
            "root ::= (\n  \"a\\n\\\"\" |\n  [^\"\\\\\\x00-\\x1f] . \n) \"\\u00e9\"? ws\nws ::= [ \\t]*",
        ];
        for g in seeds {
            for (i, _) in g.char_indices() {
                let _ = to_lark(&g[..i]);
            }
        }
        let alphabet: Vec<char> = "root::=|()[]^-*+?{},.\"\\xu0a9 \n#abz".chars().collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            let len = (x >> 59) as usize + 1;
            let mut g = String::from("root ::= ");
            for _ in 0..len {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                g.push(alphabet[(x >> 33) as usize % alphabet.len()]);
            }
            let _ = to_lark(&g);
        }
    }

    #[test]
    fn bad_grammars_say_what_and_where() {
        let e = to_lark("item ::= \"a\"").unwrap_err();
        assert!(e.message.contains("no `root`"), "{e}");
        let e = to_lark("root ::= foo").unwrap_err();
        assert!(e.message.contains("`foo`, which is not defined"), "{e}");
        let e = to_lark("root ::= \"abc").unwrap_err();
        assert!(e.message.contains("unterminated"), "{e}");
        let e = to_lark("root ::= \"a\"\nroot ::= \"b\"").unwrap_err();
        assert!(e.message.contains("defined twice") && e.line == 2, "{e}");
        let e = to_lark("root = \"a\"").unwrap_err();
        assert!(e.message.contains("::="), "{e}");
        let e = to_lark("root ::= [z-a]").unwrap_err();
        assert!(e.message.contains("backwards"), "{e}");
        let e = to_lark("root ::= \"a\"{5,2}").unwrap_err();
        assert!(e.message.contains("maximum below"), "{e}");
        let e = to_lark("root ::= * \"a\"").unwrap_err();
        assert!(e.message.contains("must follow"), "{e}");
    }
}
