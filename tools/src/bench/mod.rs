//! `lode bench`: llama-bench-style speed rows (`pp512`, `tg128`, `tg128 @ d4096`),
//! mean ± sd over repetitions after a warm-up, as a markdown table or llama-bench-named
//! JSON. `--pair-env` / `--pair-arg` compare two configurations run alternately
//! ([`pair`]).

mod measure;
mod pair;
pub mod report;
mod spec_rows;
pub mod stats;

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use lode_runtime::backend::DeviceKind;
use lode_runtime::tokenizer::Tokenizer;

use crate::common::{self, ModelArgs};
use measure::{Kind, Runner, TestSpec};
use report::{ModelInfo, Row};

/// Arguments of `lode bench`.
#[derive(clap::Args, Debug, Clone)]
#[command(args_override_self = true)]
pub struct Args {
    /// GGUF model file (default: Gemma 3 270M Q4_K_M).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Prompt lengths to time (`ppN` rows), comma-separated; 0 for none.
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    pub n_prompt: Vec<usize>,
    /// Generation lengths to time (`tgN` rows), comma-separated; 0 for none.
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    pub n_gen: Vec<usize>,
    /// Tokens already in the KV cache before each test (untimed), comma-separated.
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    pub n_depth: Vec<usize>,
    /// Sequences decoding together for the generation rows, comma-separated: `tgN xS`
    /// rows time N steps of S sequences in one batch each (continuous batching, as
    /// `lode serve` runs concurrent requests) and report tokens/s over all of them.
    #[arg(long = "sequences", value_delimiter = ',', default_value = "1")]
    pub sequences: Vec<usize>,
    /// Timed repetitions per test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    /// Output format: md or json.
    #[arg(short = 'o', long = "output", default_value = "md")]
    pub output: String,
    /// Tokens per forward chunk of a prompt.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    #[command(flatten)]
    pub kv: common::KvArgs,
    /// Device: cpu, cuda, hip or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// CPU threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Memory bandwidth in GB/s: decode rows then show the fraction of the weight-read
    /// roofline (weight bytes per token × tokens/s ÷ bandwidth).
    #[arg(long = "mem-bw", value_name = "GBps")]
    pub mem_bw: Option<f64>,
    /// Seed of the random token ids.
    #[arg(long, default_value_t = 1234)]
    pub seed: u64,
    /// Skip the warm-up run before each test.
    #[arg(long)]
    pub no_warmup: bool,
    /// Compare two values of an environment variable, `NAME=A,B`: each repetition
    /// re-runs lode with NAME=A, then NAME=B (A B A B …).
    #[arg(long, value_name = "NAME=A,B", conflicts_with = "pair_arg")]
    pub pair_env: Option<String>,
    /// Compare two sets of extra arguments; give it twice (A, then B), e.g.
    /// `--pair-arg "-ctk q8_0" --pair-arg "-ctk f16"`.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true, num_args = 1, action = clap::ArgAction::Append)]
    pub pair_arg: Vec<String>,
    #[command(flatten)]
    pub weights: common::WeightArgs,
    /// Speculative rows (with --model-draft or --spec-type): greedy generation from a
    /// fixed passage, plain and with the drafter, acceptance in the row.
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
    /// Also a speculative row whose drafter knows the plain continuation: every draft is
    /// accepted, the ceiling of verifying `--draft-max` tokens per pass.
    #[arg(long = "spec-oracle")]
    pub spec_oracle: bool,
}

pub fn run(args: Args) -> Result<()> {
    if args.output != "md" && args.output != "json" {
        bail!("unknown output format `{}` (expected md or json)", args.output);
    }
    if args.repetitions == 0 {
        bail!("-r 0: at least one repetition is needed");
    }
    if args.pair_env.is_some() || !args.pair_arg.is_empty() {
        return pair::run(&args);
    }
    let rows = measure_rows(&args)?;
    let mut out = std::io::stdout().lock();
    if args.output == "json" {
        writeln!(out, "{}", serde_json::to_string_pretty(&rows)?)?;
    } else {
        write!(out, "{}", report::markdown(&rows))?;
    }
    Ok(())
}

/// The tests the arguments ask for, in llama-bench's order: prompts, then generations,
/// each at every depth.
pub fn tests_of(args: &Args) -> Vec<TestSpec> {
    let mut v = Vec::new();
    for &depth in &args.n_depth {
        for &n in args.n_prompt.iter().filter(|&&n| n > 0) {
            v.push(TestSpec { kind: Kind::Prompt, n, depth, seqs: 1 });
        }
        for &n in args.n_gen.iter().filter(|&&n| n > 0) {
            for &seqs in args.sequences.iter().filter(|&&s| s > 0) {
                v.push(TestSpec { kind: Kind::Gen, n, depth, seqs });
            }
        }
    }
    v
}

/// Runs every test in this process and returns its rows.
pub fn measure_rows(args: &Args) -> Result<Vec<Row>> {
    let tests = tests_of(args);
    if tests.is_empty() {
        bail!("nothing to measure: every -p and -n value is 0");
    }
    let device: DeviceKind = args.device.parse().map_err(anyhow::Error::msg)?;
    let mut ctx = tests.iter().map(TestSpec::ctx_needed).max().unwrap_or(1);
    if spec_rows::wanted(args) {
        ctx = ctx.max(spec_rows::ctx_needed(args));
    }
    let threads = args.threads.unwrap_or_else(common::physical_cores);
    let margs = ModelArgs {
        model: args.model.clone(),
        device,
        threads: Some(threads),
        ctx_size: Some(ctx),
        batch_size: args.batch_size,
        kv: args.kv.clone(),
        weights: args.weights.clone(),
    };
    let n_seq = tests.iter().map(|t| t.seqs).max().unwrap_or(1);
    let (mut engine, file, path) = common::open_batch_engine_with(&margs, n_seq, args.spec.wants_mtp())?;
    // The MTP block runs only in the rows that draft with it.
    engine.set_mtp(false);
    let tok = Tokenizer::from_gguf(&file).with_context(|| format!("cannot load the tokenizer of {}", path.display()))?;
    let bos = if tok.add_bos() { tok.bos() } else { None };
    let filename = path.file_name().map_or_else(|| path.display().to_string(), |f| f.to_string_lossy().into_owned());
    let info = ModelInfo::new(filename, &file, engine.model());
    let backend = backend_label(&engine.backend_name());
    let mut runner = Runner::new(&mut engine, args.seed, bos);
    let mut rows = Vec::new();
    for t in &tests {
        if !args.no_warmup {
            // Warm caches and the thread pool; a short decode is enough for tg rows.
            let n = if t.kind == Kind::Gen { Some(t.n.min(4)) } else { None };
            let warm = TestSpec { depth: 0, ..*t };
            runner.run_once(&warm, n)?;
        }
        let mut samples = Vec::with_capacity(args.repetitions);
        for _ in 0..args.repetitions {
            samples.push(runner.run_once(t, None)?);
        }
        let wall: Vec<u64> = samples.iter().map(|s| s.wall_ns).collect();
        let cpu: Option<Vec<u64>> = samples.iter().map(|s| s.cpu_ns).collect();
        let mut row = new_row(args, &info, &backend, threads, t);
        row.graphs = runner.engine.weight_stats().and_then(|s| s.graphs);
        row.set_samples(wall, t.tokens());
        row.set_cpu(cpu.unwrap_or_default());
        if let (Some(bw), Kind::Gen) = (args.mem_bw, t.kind) {
            // Weights are read once per step, whatever the number of sequences (the
            // experts any of them selects).
            let steps_per_s = row.avg_ts / t.seqs.max(1) as f64;
            row.roofline_frac = Some(info.bytes_per_step(t.seqs) as f64 * steps_per_s / (bw * 1e9));
        }
        measure_peak(&mut runner, t, &mut row)?;
        let util = match (row.cpu_util, row.cpu_norm_ts) {
            (Some(u), Some(n)) => format!(" (process CPU {:.0} % of {threads} threads; {n:.2} t/s per {threads} CPU-s/s)", u * 100.0),
            _ => String::new(),
        };
        let mem = runner.engine.weight_stats().map(|s| format!(" | {}", s.summary())).unwrap_or_default();
        eprintln!("bench: {} {:.2} ± {:.2} t/s{util}{mem}", row.test, row.avg_ts, row.stddev_ts);
        rows.push(row);
    }
    if spec_rows::wanted(args) {
        let ctx = spec_rows::Ctx { args, margs: &margs, tok: &tok, bos, info: &info, backend: &backend, threads };
        rows.extend(spec_rows::measure(&ctx, runner.engine, &tests)?);
    }
    Ok(rows)
}

/// A row for test `t` before its samples are set.
pub(crate) fn new_row(args: &Args, info: &ModelInfo, backend: &str, threads: usize, t: &TestSpec) -> Row {
    Row {
        model_filename: info.filename.clone(),
        model_type: info.desc.clone(),
        model_size: info.size,
        model_n_params: info.n_params,
        backends: backend.to_string(),
        n_batch: args.batch_size,
        n_ubatch: args.batch_size,
        n_threads: threads,
        type_k: args.kv.types().k.to_string(),
        type_v: args.kv.types().v.to_string(),
        n_prompt: if t.kind == Kind::Prompt { t.n } else { 0 },
        n_gen: if t.kind == Kind::Gen { t.n } else { 0 },
        n_seq: t.seqs,
        n_depth: t.depth,
        test_time: report::now_rfc3339(),
        test: t.name(),
        avg_ns: 0,
        stddev_ns: 0,
        avg_ts: 0.0,
        stddev_ts: 0.0,
        samples_ns: Vec::new(),
        samples_ts: Vec::new(),
        weight_bytes_per_token: info.weight_bytes_per_token,
        samples_cpu_ns: Vec::new(),
        cpu_util: None,
        cpu_norm_ts: None,
        roofline_frac: None,
        graphs: None,
        spec_acceptance: None,
        device_peak_bytes: None,
        device_overhead_bytes: None,
    }
}

/// A GPU row's peak device memory: one more run of `t`, untimed, with the driver's use
/// sampled at every allocation, read-back and sync (sampling is off in the timed runs),
/// and that peak's excess over the floor (weights, KV, recurrent state, context).
fn measure_peak(runner: &mut Runner<'_>, t: &TestSpec, row: &mut Row) -> Result<()> {
    if !runner.engine.memory_window(true)? {
        return Ok(());
    }
    let ran = runner.run_once(t, None);
    // Read inside the window: closing it folds the window's peak back into the run's.
    let stats = runner.engine.weight_stats();
    runner.engine.memory_window(false)?;
    ran?;
    let peak = stats.as_ref().and_then(|s| s.device.as_ref()).and_then(|d| d.driver_peak_used_bytes);
    row.device_peak_bytes = peak;
    if let (Some(p), Some(floor), Some(s)) = (peak, runner.engine.memory_floor(), &stats) {
        row.device_overhead_bytes = Some(p as i64 - (floor + s.resident_bytes) as i64);
    }
    Ok(())
}

/// llama-bench's backend names: `cpu (2 threads)` → `CPU`, `cuda:0 (NVIDIA H200)` → `CUDA`.
fn backend_label(name: &str) -> String {
    name.split([' ', '(', ':']).next().unwrap_or(name).to_uppercase()
}

#[cfg(test)]
mod tests {
    use super::backend_label;

    #[test]
    fn backend_labels() {
        assert_eq!(backend_label("cpu (2 threads)"), "CPU");
        assert_eq!(backend_label("cuda:0 (NVIDIA H200)"), "CUDA");
        assert_eq!(backend_label("hip:1 (gfx1100)"), "HIP");
    }
}
