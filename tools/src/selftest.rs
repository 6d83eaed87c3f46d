//! `lode selftest`: every GPU kernel against the CPU reference, on this machine's GPU.
//!
//! The GPU machine has no Rust toolchain, and no AMD GPU exists where lode is built, so
//! the kernel property tests ship inside the binary (as llama.cpp's test-backend-ops
//! does): an AMD user runs `lode selftest --device hip` on their own card.

use lode_runtime::backend::gpu::{self, selftest};
use lode_runtime::backend::DeviceKind;

/// Arguments of `lode selftest`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Device to test: auto, cuda, hip or cpu (cpu checks the CPU reference kernels).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Only checks whose name contains this string (e.g. `matvec_q4_k`, `rope`).
    #[arg(long)]
    pub filter: Option<String>,
    /// Random cases per check.
    #[arg(long, default_value_t = 20)]
    pub cases: usize,
    /// Random seed (the same seed gives the same shapes and data).
    #[arg(long, default_value_t = 0x10de)]
    pub seed: u64,
    /// Also run these GGUF models end to end on the GPU and on the CPU and compare
    /// (greedy tokens, KL divergence, same top-1); skips the kernel checks if
    /// `--cases 0`.
    #[arg(long = "model")]
    pub models: Vec<std::path::PathBuf>,
    /// Kernel-level decode bandwidth benchmarks on the GPU (after the checks).
    #[arg(long)]
    pub bench: bool,
    /// Prefill kernel benchmarks (GEMM shapes of the 4B / 8B presets, flash attention).
    #[arg(long)]
    pub bench_prefill: bool,
    /// Decode steps timed per model (0: none).
    #[arg(long, default_value_t = 128)]
    pub tg: usize,
    /// Only time the GPU (no CPU comparison) for `--model`.
    #[arg(long)]
    pub speed_only: bool,
    /// Greedy steps per model.
    #[arg(long, default_value_t = 32)]
    pub gen: usize,
    /// Run the weight-residency and graph-replay checks on the GPU over this model
    /// (`selftest_residency.rs`).
    #[arg(long)]
    pub residency_check: Option<std::path::PathBuf>,
    /// Decode steps of the residency check's mode comparisons (`mapped` reads every
    /// weight over the bus per step).
    #[arg(long, default_value_t = 8)]
    pub mapped_steps: usize,
    /// Teacher-forced tokens per model for the KL divergence.
    #[arg(long, default_value_t = 128)]
    pub text_tokens: usize,
    /// With `--model`: compare the CPU backend against itself with every norm output
    /// nudged by one f32 rounding step (the KLD floor of any not bit-identical backend);
    /// needs no GPU.
    #[arg(long)]
    pub perturb: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.perturb {
        for m in &args.models {
            crate::selftest_model::perturb_compare(m, args.text_tokens, crate::common::physical_cores())?;
        }
        return Ok(());
    }
    let kind: DeviceKind = args.device.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    let dev = gpu::select(kind, &crate::common::gpu_options().tuning())?;
    if let Some(d) = &dev {
        d.set_memory_cap(crate::common::device_memory()?);
    }
    let mut model_fail = 0;
    if let Some(d) = &dev {
        for m in &args.models {
            match crate::selftest_model::compare(d, m, args.gen, args.text_tokens, crate::common::physical_cores(), args.tg, args.speed_only) {
                Ok(true) => {}
                Ok(false) => model_fail += 1,
                Err(e) => {
                    println!("FAIL model {}: {e:#}", m.display());
                    model_fail += 1
                }
            }
            // A multi-token-prediction block's drafting rows, GPU against CPU.
            match crate::selftest_mtp::compare(d, m, crate::common::physical_cores()) {
                Ok(None | Some(true)) => {}
                Ok(Some(false)) => model_fail += 1,
                Err(e) => {
                    println!("FAIL mtp {}: {e:#}", m.display());
                    model_fail += 1
                }
            }
        }
        if let Some(p) = &args.residency_check {
            if !crate::selftest_residency::check(d, p, args.mapped_steps)? {
                model_fail += 1;
            }
        }
    } else if !args.models.is_empty() {
        println!("SKIP --model: no GPU to compare against the CPU");
    }
    if args.cases == 0 {
        if model_fail > 0 {
            anyhow::bail!("{model_fail} model comparison(s) failed");
        }
        return Ok(());
    }
    let reports = match &dev {
        Some(d) => {
            let t = selftest::GpuTarget(d);
            println!("selftest on {}", selftest::Target::label(&t));
            for (fam, origin) in d.kernel_origins() {
                println!("  kernels {fam:<12} {origin:?}");
            }
            let mut r = selftest::run_checks(&t, args.filter.as_deref(), args.cases, args.seed);
            let prefill = selftest::prefill::GpuPrefill(d);
            r.extend(selftest::prefill::run_checks(&prefill, args.filter.as_deref(), args.cases, args.seed));
            r.extend(selftest::flash::run_checks(&prefill, args.filter.as_deref(), args.cases, args.seed));
            r.extend(selftest::blas::run_checks(d, args.filter.as_deref(), args.cases, args.seed));
            r.extend(selftest::replay::run(d, args.filter.as_deref()));
            r.extend(gpu::selftest::exact::run(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::norm_mv::run(d, args.filter.as_deref(), args.cases, args.seed));
            r.extend(gpu::selftest::rope_attn::run(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::moe::run_checks(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::kvq::run(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::kv_rot::run(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::swa::run(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::upload::run(d, args.filter.as_deref()));
            r.extend(gpu::selftest::delta::run_checks(d, args.filter.as_deref(), args.seed));
            r.extend(gpu::selftest::mmq::run_checks(d, args.filter.as_deref(), args.cases, args.seed));
            r
        }
        None => {
            let t = selftest::HostTarget;
            println!("selftest on {}", selftest::Target::label(&t));
            selftest::run_checks(&t, args.filter.as_deref(), args.cases, args.seed)
        }
    };
    let mut failed = 0;
    let mut passed = 0;
    for r in &reports {
        println!("{}", r.line());
        if !r.skipped {
            if r.passed() {
                passed += 1;
            } else {
                failed += 1;
            }
        }
    }
    println!("{passed} passed, {failed} failed, {} skipped", reports.iter().filter(|r| r.skipped).count());
    if let (true, Some(d)) = (args.bench, &dev) {
        crate::selftest_bench::run(d)?;
    }
    if let (true, Some(d)) = (args.bench_prefill, &dev) {
        selftest::prefill::bench(d)?;
        selftest::blas::bench(d)?;
    }
    if reports.is_empty() {
        anyhow::bail!("no check matches filter {:?}", args.filter);
    }
    if failed > 0 || model_fail > 0 {
        anyhow::bail!("{failed} kernel check(s) and {model_fail} model comparison(s) failed");
    }
    Ok(())
}
