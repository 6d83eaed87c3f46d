//! The official `openai` Python client against `lode serve` (ci/serve_client_test.py):
//! chat and completions, streamed and not, errors as the client's exceptions; and
//! (ci/serve_features_test.py) tool calls, logprobs, n, embeddings, CORS, structured
//! output (json_schema validated with `jsonschema`, json_object, GBNF), refusals. Skips
//! with a note when python3 or the `openai` / `jsonschema` package is missing.

mod serve_common;

use std::process::Command;

use serve_common::*;

#[test]
fn openai_python_client_works_against_the_server() {
    let Some(model) = smol() else { return };
    let has_openai = Command::new("python3").args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if !has_openai {
        eprintln!("SKIP: python3 with the `openai` package is not available (python3 -m pip install openai)");
        return;
    }
    let srv = Server::start(&model, &["--parallel", "2", "--ctx-size", "1024", "--api-key", "py-key"]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/ci/serve_client_test.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--base-url", &format!("http://{}/v1", srv.addr), "--api-key", "py-key"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "serve_client_test.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all openai client checks passed"));
}

#[test]
fn openai_python_client_tools_logprobs_n_embeddings_cors() {
    let Some(model) = smol() else { return };
    let has_openai = Command::new("python3").args(["-c", "import openai"]).output().is_ok_and(|o| o.status.success());
    if !has_openai {
        eprintln!("SKIP: python3 with the `openai` package is not available (python3 -m pip install openai)");
        return;
    }
    let has_jsonschema = Command::new("python3").args(["-c", "import jsonschema"]).output().is_ok_and(|o| o.status.success());
    if !has_jsonschema {
        eprintln!("SKIP: python3 with the `jsonschema` package is not available (python3 -m pip install jsonschema)");
        return;
    }
    let origin = "http://ui.example";
    let srv = Server::start(&model, &["--parallel", "3", "--ctx-size", "3072", "--embeddings", "--cors", origin]);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/ci/serve_features_test.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--base-url", &format!("http://{}/v1", srv.addr), "--origin", origin])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(out.status.success(), "serve_features_test.py failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all feature checks passed"));
}
