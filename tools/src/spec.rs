//! Speculative decoding's flags (llama.cpp's names), shared by `lode generate` and
//! `lode bench`, and the drafter they ask for.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use lode_runtime::backend;
use lode_runtime::engine::{BatchEngine, Drafter, Engine, EngineOptions, ModelDrafter, MtpDrafter, NgramDrafter, SamplerParams, SpecParams, SpecStats};
use lode_runtime::model::Model;

use crate::common::{self, ModelArgs};

/// Speculation without a draft model (llama.cpp's `--spec-type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SpecType {
    #[default]
    None,
    /// Prompt lookup: what followed the latest earlier occurrence of the last tokens.
    NgramSimple,
    /// The model's own multi-token-prediction block (`blk.N.nextn.*`, qwen35).
    DraftMtp,
}

impl std::str::FromStr for SpecType {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(SpecType::None),
            "ngram-simple" => Ok(SpecType::NgramSimple),
            "draft-mtp" => Ok(SpecType::DraftMtp),
            _ => Err(format!("unknown speculation type `{s}` (lode has: none, ngram-simple, draft-mtp)")),
        }
    }
}

/// The speculative-decoding flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SpecArgs {
    /// Draft model for speculative decoding (llama.cpp's -md): a smaller GGUF with the
    /// target's tokenizer, run on the same device. Greedy output is unchanged; sampled
    /// output keeps its distribution.
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// Speculation without a draft model: none, ngram-simple (prompt lookup: propose the
    /// tokens that followed the latest earlier occurrence of the context's last n-gram) or
    /// draft-mtp (the model's own multi-token-prediction block, where the file has one:
    /// Qwen3.5/3.6 MTP GGUFs; in lode serve, slots drafting together share its batched
    /// rows).
    #[arg(long = "spec-type", value_name = "TYPE", default_value = "none")]
    pub spec_type: SpecType,
    /// ngram-simple: the longest n-gram looked up (shorter ones are tried down to 2).
    #[arg(long = "spec-ngram-size-n", value_name = "N", default_value_t = 12)]
    pub ngram_size_n: usize,
    /// Tokens drafted per verify pass at most.
    #[arg(long = "draft-max", visible_aliases = ["draft", "draft-n", "spec-draft-n-max"], value_name = "N", default_value_t = 16)]
    pub draft_max: usize,
    /// Drafts shorter than this are not verified (the step decodes one token).
    #[arg(long = "draft-min", visible_alias = "draft-n-min", value_name = "N", default_value_t = 0)]
    pub draft_min: usize,
    /// Draft model or MTP block: stop drafting at a token the draft gives less than this
    /// probability.
    #[arg(long = "draft-p-min", visible_alias = "spec-draft-p-min", value_name = "P", default_value_t = 0.8)]
    pub draft_p_min: f32,
}

impl SpecArgs {
    /// Whether any speculation was asked for.
    pub fn enabled(&self) -> bool {
        self.model_draft.is_some() || self.spec_type != SpecType::None
    }

    /// Whether the run drafts with the model's MTP block (the engine must keep it).
    pub fn wants_mtp(&self) -> bool {
        self.spec_type == SpecType::DraftMtp
    }

    pub fn params(&self) -> SpecParams {
        SpecParams { draft_max: self.draft_max, draft_min: self.draft_min }
    }

    fn check(&self) -> Result<()> {
        if self.model_draft.is_some() && self.spec_type != SpecType::None {
            bail!("--model-draft and --spec-type {:?} both ask for a drafter: choose one", self.spec_type);
        }
        if self.draft_max == 0 {
            bail!("--draft-max must be at least 1 with speculative decoding");
        }
        if self.ngram_size_n == 0 {
            bail!("--spec-ngram-size-n must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            bail!("--draft-p-min {} is not a probability (0 to 1)", self.draft_p_min);
        }
        Ok(())
    }

    /// The drafter these flags ask for (`None` without speculation). A draft model opens
    /// on `margs`' device with the target's context size.
    pub fn drafter(&self, margs: &ModelArgs, target: &Model, n_ctx: usize, sampling: &SamplerParams) -> Result<Option<Box<dyn Drafter>>> {
        self.check()?;
        if self.spec_type == SpecType::NgramSimple {
            let n = self.ngram_size_n;
            return Ok(Some(Box::new(NgramDrafter::new(n, n.min(2))?)));
        }
        if self.wants_mtp() {
            return Ok(Some(Box::new(MtpDrafter::new(target, sampling, self.draft_p_min)?)));
        }
        let Some(path) = &self.model_draft else { return Ok(None) };
        let engine = open_draft(margs, path, n_ctx)?;
        let d = ModelDrafter::new(engine, target, sampling, self.draft_p_min)
            .with_context(|| format!("cannot use {} as the draft model", path.display()))?;
        Ok(Some(Box::new(d)))
    }
}

/// `lode serve`'s drafting: n-gram lookup per slot, one draft model for all slots, or
/// the target's own MTP block (on the engine thread, batched across slots).
pub enum ServeSpec {
    Ngram(NgramDrafter),
    /// The draft model's engine, one sequence per slot.
    Model { engine: BatchEngine, p_min: f32 },
    /// `--spec-type draft-mtp`: the target (loaded with [`Model::load_with_mtp`]) drafts
    /// with its block, stopping below `p_min`.
    Mtp { p_min: f32 },
}

impl SpecArgs {
    /// `lode serve`'s drafting for `n_slots` slots of `target` (opened first, so that the
    /// draft is sized against what is left; with draft-mtp, loaded with its block).
    pub fn serve_drafter(&self, margs: &ModelArgs, target: &Model, n_ctx: usize, n_slots: usize) -> Result<Option<(ServeSpec, SpecParams)>> {
        if !self.enabled() {
            return Ok(None);
        }
        self.check()?;
        if self.wants_mtp() {
            if target.mtp.is_none() {
                bail!("the model carries no multi-token-prediction block (`nextn_predict_layers` and `blk.N.nextn.*` tensors): --spec-type draft-mtp needs one");
            }
            return Ok(Some((ServeSpec::Mtp { p_min: self.draft_p_min }, self.params())));
        }
        if let Some(path) = &self.model_draft {
            let (model, be, opts) = draft_parts(margs, path, n_ctx)?;
            lode_runtime::engine::check_same_vocab(target, &model).with_context(|| format!("cannot use {} as the draft model", path.display()))?;
            let engine = BatchEngine::new(model, be, opts, n_slots).with_context(|| format!("cannot open the draft model {}", path.display()))?;
            tracing::info!("draft model {} on {} ({n_slots} sequences)", path.display(), engine.backend_name());
            return Ok(Some((ServeSpec::Model { engine, p_min: self.draft_p_min }, self.params())));
        }
        let n = self.ngram_size_n;
        Ok(Some((ServeSpec::Ngram(NgramDrafter::new(n, n.min(2))?), self.params())))
    }
}

/// The draft model's engine: its own backend of the target's kind and weight options.
fn open_draft(margs: &ModelArgs, path: &std::path::Path, n_ctx: usize) -> Result<Engine> {
    let (model, be, opts) = draft_parts(margs, path, n_ctx)?;
    let e = Engine::new(model, be, opts).with_context(|| format!("cannot open the draft model {}", path.display()))?;
    tracing::info!("draft model {} on {}", path.display(), e.backend_name());
    Ok(e)
}

/// The draft model, its backend (the target's device and weight options, its memory
/// report printed by the caller) and its engine options (the target's context).
fn draft_parts(margs: &ModelArgs, path: &std::path::Path, n_ctx: usize) -> Result<(Model, Box<dyn backend::Backend>, EngineOptions)> {
    let file = common::open_gguf(path).map_err(|e| anyhow::anyhow!("draft model: {e:#}"))?;
    let model = Model::load(file).with_context(|| format!("cannot load the draft model {}", path.display()))?;
    let threads = margs.threads.unwrap_or_else(common::physical_cores);
    // Its memory report is printed by the caller (`draft_report`), labelled, not at exit.
    let mut wopts = margs.weights.options()?;
    wopts.report_at_exit = false;
    let (be, _note) = backend::open_with(margs.device, threads, &wopts, &common::gpu_options())?;
    let opts = EngineOptions { ctx_size: Some(n_ctx), batch_size: margs.batch_size, kv_type: margs.kv.types(), swa_full: margs.kv.swa_full };
    Ok((model, be, opts))
}

/// `speculative (ngram): 120 drafted, 90 accepted (75.0 %), 40 target passes` for stderr.
pub fn stats_line(name: &str, s: &SpecStats) -> String {
    format!(
        "speculative ({name}): {} drafted, {} accepted ({:.1} %), {} target passes, {:.2} s drafting",
        s.drafted,
        s.accepted,
        100.0 * s.acceptance(),
        s.passes,
        s.draft_secs
    )
}

/// With `--memory-report`: the draft model's weight counters, on stderr (the target's
/// JSON report follows at exit).
pub fn draft_report(margs: &ModelArgs, drafter: Option<&dyn Drafter>) {
    if let (true, Some(s)) = (margs.weights.memory_report, drafter.and_then(|d| d.weight_stats())) {
        eprintln!("lode: draft model {}", s.summary());
    }
}
