//! `lode generate` and `lode bench` with speculative decoding: greedy `--json` output
//! identical to plain decoding with `--spec-type ngram-simple` and with `--model-draft`
//! (SmolLM2 drafting for itself: every draft accepted); a draft of another vocabulary,
//! a missing draft file and conflicting drafters are clear errors; bench prints the
//! speculative rows with their acceptance.

mod common;

fn json_run(args: &[&str]) -> serde_json::Value {
    let out = common::lode(args);
    assert!(out.status.success(), "lode {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("--json output")
}

const PROMPT: &str = "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick";

#[test]
fn generate_greedy_is_unchanged_by_speculation() {
    let Some(m) = common::model(common::SMOL) else { return };
    let m = m.to_str().unwrap();
    let base = ["generate", "--device", "cpu", "-t", "2", "-m", m, "-p", PROMPT, "-n", "40", "--temp", "0", "--json"];
    let plain = json_run(&base);
    assert!(plain["speculative"].is_null());
    let want = &plain["generated_ids"];
    let ngram = json_run(&[&base[..], &["--spec-type", "ngram-simple", "--draft-max", "6"]].concat());
    assert_eq!(&ngram["generated_ids"], want, "n-gram lookup changed the greedy output");
    assert_eq!(ngram["speculative"]["drafter"], "ngram");
    assert!(ngram["speculative"]["drafted"].as_u64().unwrap() > 0, "{}", ngram["speculative"]);
    let draft = json_run(&[&base[..], &["--model-draft", m, "--draft-max", "8", "--draft-p-min", "0"]].concat());
    assert_eq!(&draft["generated_ids"], want, "the draft model changed the greedy output");
    let s = &draft["speculative"];
    assert!(s["drafted"].as_u64().unwrap() > 0 && s["accepted"] == s["drafted"], "self-drafting: {s}");
    assert!(s["passes"].as_u64().unwrap() < 20, "40 tokens in {} passes with 8 drafted per pass", s["passes"]);
}

#[test]
fn bad_drafters_are_clear_errors() {
    let Some(m) = common::model(common::SMOL) else { return };
    let m = m.to_str().unwrap();
    let base = ["generate", "--device", "cpu", "-t", "2", "-m", m, "-p", "Hi", "-n", "4", "--temp", "0"];
    let check = |extra: &[&str], needle: &str| {
        let out = common::lode(&[&base[..], extra].concat());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("error:") && err.contains(needle), "{extra:?}: want `{needle}` in {err}");
    };
    check(&["--model-draft", "/no/such/draft.gguf"], "/no/such/draft.gguf");
    check(&["--model-draft", m, "--spec-type", "ngram-simple"], "choose one");
    check(&["--spec-type", "eagle3"], "ngram-simple");
    if let Some(g) = common::model("gemma-3-270m-q4_k_m.gguf") {
        check(&["--model-draft", g.to_str().unwrap()], "tokenizer");
    }
}

#[test]
fn bench_prints_speculative_rows() {
    let Some(m) = common::model(common::SMOL) else { return };
    let m = m.to_str().unwrap();
    let args = ["bench", "--device", "cpu", "-t", "2", "-m", m, "-p", "0", "-n", "16", "-r", "1", "--no-warmup"];
    let extra = ["--spec-type", "ngram-simple", "--spec-oracle", "--draft-max", "4", "-o", "json"];
    let out = common::lode(&[&args[..], &extra[..]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tests: Vec<&str> = rows.as_array().unwrap().iter().map(|r| r["test"].as_str().unwrap()).collect();
    assert_eq!(tests, ["tg16", "tg16 greedy", "tg16 spec ngram k4", "tg16 spec oracle k4"]);
    let rows = rows.as_array().unwrap();
    assert!(rows[1]["spec_acceptance"].is_null());
    assert_eq!(rows[3]["spec_acceptance"], 1.0, "the oracle's drafts are the plain run's tokens");
    assert!(rows.iter().all(|r| r["avg_ts"].as_f64().unwrap() > 0.0));
}

/// The synthetic presets (random weights of real shapes): a dense Q4_K_M model and the
/// tiny mixture of experts, each drafting for itself and with n-gram lookup.
#[test]
fn synthetic_presets_greedy_is_unchanged_by_speculation() {
    let dir = std::env::temp_dir().join(format!("lode-spec-synth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (preset, quant) in [("qwen3moe-tiny", None), ("qwen3-0.6b", Some("q4_k_m"))] {
        let path = dir.join(format!("{preset}.gguf"));
        let p = path.to_str().unwrap();
        let mut synth = vec!["synth", "--preset", preset, "-o", p, "--seed", "11"];
        if let Some(q) = quant {
            synth.extend(["--quant", q]);
        }
        assert!(common::lode(&synth).status.success(), "synth {preset}");
        let base = ["generate", "--device", "cpu", "-t", "2", "-m", p, "-p", "one two three one two three one two", "-n", "16", "-c", "256", "--temp", "0", "--json"];
        let want = json_run(&base)["generated_ids"].clone();
        let ngram = json_run(&[&base[..], &["--spec-type", "ngram-simple", "--spec-ngram-size-n", "3", "--draft-max", "4"]].concat());
        assert_eq!(ngram["generated_ids"], want, "{preset}: n-gram lookup changed the greedy output");
        let draft = json_run(&[&base[..], &["--model-draft", p, "--draft-max", "5", "--draft-p-min", "0"]].concat());
        assert_eq!(draft["generated_ids"], want, "{preset}: self-drafting changed the greedy output");
        let s = &draft["speculative"];
        assert!(s["drafted"].as_u64().unwrap() > 0 && s["accepted"] == s["drafted"], "{preset}: {s}");
        let _ = std::fs::remove_file(&path);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `lode fit --model-draft` sizes the draft as `lode serve` runs it: one sequence per
/// slot, so with `--parallel 3` the draft needs two more KV caches than with one.
#[test]
fn fit_counts_a_draft_sequence_per_slot() {
    let Some(m) = common::model(common::SMOL) else { return };
    let m = m.to_str().unwrap();
    // -c is the total over the slots (as lode serve splits it): 1024 tokens each.
    let fit = |p: &str, c: &str| json_run(&["fit", "-m", m, "--model-draft", m, "--json", "-c", c, "--device", "cpu", "--parallel", p]);
    let (one, three) = (fit("1", "1024"), fit("3", "3072"));
    let kv = one["kv_bytes"].as_u64().unwrap();
    let (d1, d3) = (one["draft_need_bytes"].as_u64().unwrap(), three["draft_need_bytes"].as_u64().unwrap());
    // And the rows a mixed step moves (`BatchEngine::step_mixed`): SmolLM2's q, k, v and
    // attention rows (9 × 64, 3 × 64, 3 × 64, 9 × 64 f32) for two more decode rows.
    let mixed = 2 * (576 + 192 + 192 + 576) * 4;
    assert_eq!(d3 - d1, 2 * kv + mixed, "the draft is the target's model here: two more slots add two of its KV caches ({d1} -> {d3})");
}
