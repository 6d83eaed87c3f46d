//! The CLI's conventions: a file error names the path once, in words; bad magic bytes are
//! shown as text and hex; `lode fit` exits 1 when the model does not fit; `-s` means the
//! seed everywhere (bench's sequences have only a long flag); `lode chat` without `-m`
//! uses the instruct model and says so.

use std::io::Write;
use std::process::{Command, Stdio};

mod common;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = common::lode(args);
    let code = out.status.code().unwrap_or(-1);
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn tmp_dir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lode-cli-conv-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn file_errors_name_the_path_once_in_words() {
    let dir = tmp_dir();
    let missing = dir.join("no-such-model.gguf");
    let bad = dir.join("bad-magic.gguf");
    std::fs::write(&bad, b"root\0\0\0\0\0\0\0\0").unwrap();
    let (m, d, b) = (missing.to_str().unwrap(), dir.to_str().unwrap(), bad.to_str().unwrap());
    for cmd in [&["inspect", m][..], &["generate", "-m", m, "-p", "x"], &["fit", "-m", m], &["tokenize", "-m", m, "x"]] {
        let (code, _, err) = run(cmd);
        assert_ne!(code, 0, "{cmd:?}");
        assert_eq!(err.matches(m).count(), 1, "{cmd:?}: path not named exactly once: {err}");
        assert!(err.contains("no such file"), "{cmd:?}: {err}");
        assert!(!err.contains("os error"), "{cmd:?}: {err}");
    }
    if let Some(model) = common::model(common::SMOL) {
        let (code, _, err) = run(&["perplexity", "-m", model.to_str().unwrap(), "-f", m, "--device", "cpu"]);
        assert_ne!(code, 0);
        assert_eq!(err.matches(m).count(), 1, "{err}");
        assert!(err.contains("no such file") && !err.contains("os error"), "{err}");
    }
    let (code, _, err) = run(&["inspect", d]);
    assert_ne!(code, 0);
    assert_eq!(err.matches(d).count(), 1, "{err}");
    assert!(err.contains("is a directory") && !err.contains("No such device") && !err.contains("os error"), "{err}");
    let (code, _, err) = run(&["generate", "-m", b, "-p", "x"]);
    assert_ne!(code, 0);
    assert_eq!(err.matches(b).count(), 1, "{err}");
    assert!(err.contains("\"root\" (72 6f 6f 74)") && !err.contains("[72"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn fit_exits_1_when_the_model_does_not_fit() {
    let Some(m) = common::model(common::SMOL) else { return };
    let m = m.to_str().unwrap();
    let (code, out, err) = run(&["fit", "-m", m, "--ctx", "1000", "--device", "cpu"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("fits: yes"), "{out}");
    // 10^9 tokens of KV cache (23 KB each) fit no machine.
    let (code, out, err) = run(&["fit", "-m", m, "--ctx", "1000000000", "--device", "cpu"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("fits: no") && err.contains("does not fit"), "{out}{err}");
    let (code, out, _) = run(&["fit", "-m", m, "--ctx", "1000000000", "--device", "cpu", "--json"]);
    assert_eq!(code, 1);
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["fits"], false);
}

#[test]
fn short_s_is_the_seed_and_not_sequences() {
    let (code, _, err) = run(&["bench", "-s", "1,8", "--help"]);
    assert_ne!(code, 0, "bench accepted -s: {err}");
    let (code, out, _) = run(&["bench", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--sequences") && !out.contains("-s, --sequences"), "{out}");
    for sub in ["generate", "chat"] {
        let (_, out, _) = run(&[sub, "--help"]);
        assert!(out.contains("-s, --seed"), "{sub}: {out}");
    }
}

#[test]
fn chat_without_model_uses_the_instruct_model_and_says_so() {
    if common::model(common::SMOL).is_none() {
        return;
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_lode"))
        .args(["chat", "--device", "cpu", "-t", "2", "-n", "8", "--temp", "0", "-c", "256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"What is the capital of France?\n/exit\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let reply = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    assert!(err.contains(common::SMOL) && err.contains("default chat model"), "{err}");
    assert!(!err.contains("WARN"), "{err}");
    assert!(!reply.trim().is_empty(), "empty reply; stderr: {err}");
}
