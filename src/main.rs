//! The `lode` binary: parses the command line and hands each subcommand to `lode-tools`.

use clap::{Parser, Subcommand};
use lode_tools as tools;

#[derive(Parser)]
#[command(
    name = "lode",
    version,
    about = "Run quantized LLMs from GGUF files on AMD, NVIDIA and the CPU — every weight resident once.",
    long_about = None,
    after_help = env_help()
)]
struct Cli {
    /// Log filter (also RUST_LOG), e.g. `info`, `lode_runtime=debug`.
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// GPU numerics: `fast` (tuned kernels) or `exact` (every op the CPU backend's
    /// arithmetic: logits bit-identical to the CPU's; slower).
    #[arg(long, global = true, default_value = "fast")]
    numerics: lode_runtime::backend::gpu::Numerics,
    /// Prefill matmuls on lode's own matrix-core GEMM, never cuBLAS / hipBLAS.
    #[arg(long = "no-blas", global = true)]
    no_blas: bool,
    /// Treat the device as having SIZE of memory, the driver's own use included (e.g.
    /// 24GiB, 32G, 24000MiB): an H200 then runs as a 24 GiB card would, refusing what
    /// would not fit. Also LODE_DEVICE_MEMORY.
    #[arg(long = "device-memory", global = true, value_name = "SIZE")]
    device_memory: Option<lode_runtime::weights::ByteSize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (default model: Gemma 3 270M Q4_K_M).
    Generate(tools::generate::Args),
    /// Interactive multi-turn chat through the model's chat template (default model:
    /// SmolLM2-135M-Instruct Q4_1).
    Chat(tools::chat::Args),
    /// Print the token ids of a text.
    Tokenize(tools::tokenize::Args),
    /// Perplexity (and KL divergence against saved logits) over a text file.
    Perplexity(tools::perplexity::Args),
    /// llama-bench-style prefill (ppN) and decode (tgN) speed.
    Bench(tools::bench::Args),
    /// Print a GGUF file's metadata and tensor table.
    Inspect(tools::inspect::Args),
    /// Re-encode a GGUF file's matrices as another type (Q3_K, Q2_K, IQ4_XS, …).
    Quantize(tools::quantize::Args),
    /// Write a GGUF with a real architecture's shapes and random weights.
    Synth(tools::synth::Args),
    /// OpenAI-compatible HTTP server.
    Serve(tools::serve::Args),
    /// Check every kernel of a backend against the CPU reference.
    Selftest(tools::selftest::Args),
    /// Will a model fit on the device, and with how much context?
    Fit(tools::fit::Args),
}

/// The environment variables lode reads, for `--help`.
fn env_help() -> String {
    let mut s = String::from("Environment:\n");
    for (name, what) in lode_runtime::environment::VARIABLES {
        s += &format!("  {name:<22} {what}\n");
    }
    s
}

// Kernel code objects compiled by build.rs (see its header); empty without toolchains.
include!(concat!(env!("OUT_DIR"), "/kernels_embedded.rs"));

fn main() -> std::process::ExitCode {
    lode_runtime::engine::keep_freed_memory();
    lode_runtime::backend::gpu::kernels::register_embedded(EMBEDDED, EMBEDDED_SOURCES);
    let cli = Cli::parse_from(tools::common::llama_flags(std::env::args_os()));
    tools::common::set_gpu_options(lode_runtime::backend::GpuOptions {
        numerics: cli.numerics,
        no_blas: cli.no_blas,
        device_memory: cli.device_memory.map(|b| b.0),
    });
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| cli.log.clone());
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Command::Generate(a) => tools::generate::run(a),
        Command::Chat(a) => tools::chat::run(a),
        Command::Tokenize(a) => tools::tokenize::run(a),
        Command::Perplexity(a) => tools::perplexity::run(a),
        Command::Bench(a) => tools::bench::run(a),
        Command::Inspect(a) => tools::inspect::run(a),
        Command::Quantize(a) => tools::quantize::run(a),
        Command::Synth(a) => tools::synth::run(a),
        Command::Serve(a) => tools::serve::run(a),
        Command::Selftest(a) => tools::selftest::run(a),
        Command::Fit(a) => tools::fit::run(a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
