//! The code's shape, checked: every `LODE_` environment variable the sources name is in
//! `environment::VARIABLES` (at most 12 of them) and ARCHITECTURE.md carries the table as
//! generated; no Rust source file is over 600 lines. (`ci/import-graph.py` checks the
//! import graph.)

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn sources() -> Vec<PathBuf> {
    let mut v = Vec::new();
    for d in ["runtime", "tools", "src"] {
        rust_files(&repo().join(d), &mut v);
    }
    v.retain(|p| !p.components().any(|c| c.as_os_str() == "target"));
    v
}

/// Every `LODE_[A-Z0-9_]+` in `text`.
fn names(text: &str) -> BTreeSet<String> {
    let b = text.as_bytes();
    let mut out = BTreeSet::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("LODE_") {
        let s = i + at;
        let mut e = s + 5;
        while e < b.len() && (b[e].is_ascii_uppercase() || b[e].is_ascii_digit() || b[e] == b'_') {
            e += 1;
        }
        let before_ok = s == 0 || !(b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_');
        if e > s + 5 && before_ok {
            out.insert(text[s..e].to_string());
        }
        i = e;
    }
    out
}

#[test]
fn environment_variables_are_the_documented_few() {
    let mut found = BTreeSet::new();
    for p in sources() {
        found.extend(names(&std::fs::read_to_string(&p).unwrap()));
    }
    let listed: BTreeSet<String> = lode_runtime::environment::VARIABLES.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(found, listed, "the sources' LODE_ names against environment::VARIABLES");
    assert!(listed.len() <= 12, "{} environment variables", listed.len());
    let arch = std::fs::read_to_string(repo().join("ARCHITECTURE.md")).unwrap();
    let table = lode_runtime::environment::markdown_table();
    assert!(arch.contains(&table), "ARCHITECTURE.md must carry the environment table exactly as generated:\n{table}");
}

#[test]
fn no_source_file_is_over_600_lines() {
    let long: Vec<String> = sources()
        .into_iter()
        .filter_map(|p| {
            let n = std::fs::read_to_string(&p).unwrap().lines().count();
            (n > 600).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "{long:?}");
}

#[test]
fn names_are_found() {
    // Spelled in pieces so that this file names no variable itself.
    let (x, y) = (format!("{}_X_1", "LODE"), format!("{}_Y", "LODE"));
    let text = format!("a {x} `{y}`, X{}_Z, {}_", "LODE", "LODE");
    assert_eq!(names(&text), [x, y].into_iter().collect());
}
