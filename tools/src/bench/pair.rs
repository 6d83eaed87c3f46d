//! Paired comparison of two configurations of one model: for each repetition, lode is
//! re-run once with configuration A and once with B (A B A B …), each child doing its
//! own warm-up and one timed repetition of every test and reporting JSON rows. Settings
//! read at process start (environment variables such as `LODE_TUNE`) therefore take
//! effect, and slow drifts of the machine hit both sides alike. The ratio B/A comes
//! with a paired t-interval on ln(B_i/A_i) ([`super::stats::paired_ratio`]).

use std::io::Write;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::report::{self, Row};
use super::stats::{mean_sd, paired_ratio};
use super::Args;

/// One side of the comparison.
struct Side {
    label: String,
    env: Option<(String, String)>,
    extra: Vec<String>,
}

fn sides(args: &Args) -> Result<[Side; 2]> {
    if let Some(spec) = &args.pair_env {
        let (name, vals) = spec.split_once('=').context("--pair-env wants NAME=A,B")?;
        let (a, b) = vals.split_once(',').context("--pair-env wants NAME=A,B (two values)")?;
        if name.is_empty() {
            bail!("--pair-env wants NAME=A,B (empty NAME)");
        }
        let side = |v: &str| Side { label: format!("{name}={v}"), env: Some((name.into(), v.into())), extra: vec![] };
        return Ok([side(a), side(b)]);
    }
    if args.pair_arg.len() != 2 {
        bail!("--pair-arg must be given exactly twice (A, then B); got {}", args.pair_arg.len());
    }
    let side = |s: &String| Side {
        label: if s.is_empty() { "(none)".into() } else { s.clone() },
        env: None,
        extra: s.split_whitespace().map(String::from).collect(),
    };
    Ok([side(&args.pair_arg[0]), side(&args.pair_arg[1])])
}

/// The child's command line: the same test options, one repetition, JSON out.
fn child_args(args: &Args, extra: &[String]) -> Vec<String> {
    let list = |v: &[usize]| v.iter().map(usize::to_string).collect::<Vec<_>>().join(",");
    let mut a = vec!["bench".to_string()];
    if let Some(m) = &args.model {
        a.extend(["-m".into(), m.display().to_string()]);
    }
    a.extend(["-p".into(), list(&args.n_prompt), "-n".into(), list(&args.n_gen), "-d".into(), list(&args.n_depth)]);
    a.extend(["-r".into(), "1".into(), "-o".into(), "json".into()]);
    a.extend(["-b".into(), args.batch_size.to_string()]);
    a.extend(args.kv.to_args());
    a.extend(["--device".into(), args.device.clone(), "--seed".into(), args.seed.to_string()]);
    if let Some(t) = args.threads {
        a.extend(["--threads".into(), t.to_string()]);
    }
    if let Some(bw) = args.mem_bw {
        a.extend(["--mem-bw".into(), bw.to_string()]);
    }
    if args.no_warmup {
        a.push("--no-warmup".into());
    }
    if let Some(r) = args.weights.residency {
        a.extend(["--residency".into(), r.to_string()]);
    }
    if let Some(b) = &args.weights.weight_budget {
        a.extend(["--weight-budget".into(), b.0.to_string()]);
    }
    a.extend(extra.iter().cloned());
    a
}

fn run_child(side: &Side, args: &Args) -> Result<Vec<Row>> {
    let exe = std::env::current_exe().context("cannot find the lode executable to re-run")?;
    let mut cmd = Command::new(exe);
    cmd.args(child_args(args, &side.extra));
    if let Some((k, v)) = &side.env {
        cmd.env(k, v);
    }
    let out = cmd.output().with_context(|| format!("cannot run lode for configuration {}", side.label))?;
    if !out.status.success() {
        bail!(
            "configuration {} failed ({}):\n{}",
            side.label,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim_end()
        );
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("configuration {}: cannot parse the child's JSON rows", side.label))
}

pub fn run(args: &Args) -> Result<()> {
    let sides = sides(args)?;
    // samples[side][test] → t/s per repetition
    let mut rows: [Vec<Row>; 2] = [Vec::new(), Vec::new()];
    for rep in 0..args.repetitions {
        for (s, side) in sides.iter().enumerate() {
            let got = run_child(side, args)?;
            if rows[s].is_empty() {
                rows[s] = got;
            } else {
                if got.len() != rows[s].len() {
                    bail!("configuration {} returned {} rows, earlier {}", side.label, got.len(), rows[s].len());
                }
                for (acc, g) in rows[s].iter_mut().zip(got) {
                    let mut ns = acc.samples_ns.clone();
                    ns.extend(g.samples_ns);
                    let mut cpu = acc.samples_cpu_ns.clone();
                    cpu.extend(g.samples_cpu_ns);
                    let n = acc.n_prompt + acc.n_gen;
                    let before = acc.avg_ts;
                    acc.set_samples(ns, n);
                    acc.set_cpu(cpu);
                    // The fraction scales with the speed (the bytes per step are the row's).
                    if let Some(f) = acc.roofline_frac.filter(|_| before > 0.0) {
                        acc.roofline_frac = Some(f * acc.avg_ts / before);
                    }
                }
            }
            eprintln!("bench: pair repetition {}/{} {} done", rep + 1, args.repetitions, side.label);
        }
    }
    if rows[0].len() != rows[1].len() || rows[0].iter().zip(&rows[1]).any(|(a, b)| a.test != b.test) {
        bail!("the two configurations ran different tests");
    }
    let mut out = std::io::stdout().lock();
    let mut ratios = Vec::new();
    for (a, b) in rows[0].iter().zip(&rows[1]) {
        let (r, lo, hi) = paired_ratio(&a.samples_ts, &b.samples_ts);
        ratios.push((a.test.clone(), r, lo, hi));
    }
    if args.output == "json" {
        let v = json!({
            "a": { "config": sides[0].label, "rows": rows[0] },
            "b": { "config": sides[1].label, "rows": rows[1] },
            "interval": "paired t-interval (95 %) on ln(B_i/A_i), pairs run back to back",
            "ratios": ratios.iter().map(|(t, r, lo, hi)| json!({
                "test": t, "ratio_ts": r,
                "ci95_low": if lo.is_finite() { json!(lo) } else { json!(null) },
                "ci95_high": if hi.is_finite() { json!(hi) } else { json!(null) },
            })).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&v)?)?;
        return Ok(());
    }
    writeln!(out, "A: {}", sides[0].label)?;
    write!(out, "{}", report::markdown(&rows[0]))?;
    writeln!(out, "\nB: {}", sides[1].label)?;
    write!(out, "{}", report::markdown(&rows[1]))?;
    writeln!(
        out,
        "\nB/A over {} alternating pairs (95 % paired t-interval on ln(B_i/A_i)):\n",
        args.repetitions
    )?;
    writeln!(out, "| test | A t/s | B t/s | B/A | 95 % interval |")?;
    writeln!(out, "| --- | ---: | ---: | ---: | --- |")?;
    for ((a, b), (t, r, lo, hi)) in rows[0].iter().zip(&rows[1]).zip(&ratios) {
        let (ma, sa) = mean_sd(&a.samples_ts);
        let (mb, sb) = mean_sd(&b.samples_ts);
        let ci = if lo.is_finite() { format!("[{lo:.4}, {hi:.4}]") } else { "(needs ≥ 2 pairs)".into() };
        writeln!(out, "| {t} | {ma:.2} ± {sa:.2} | {mb:.2} ± {sb:.2} | {r:.4} | {ci} |")?;
    }
    Ok(())
}
