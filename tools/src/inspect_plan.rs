//! `lode inspect --plan`: which kernel each op of a prefill chunk and of a decode step
//! runs on a GPU, as `backend::gpu::plan` decides it — computed without a GPU (the plan
//! trace backend, an H200's occupancy figures), so a user or a reviewer sees the path
//! without reading code. Layers that make the same choices are folded into one line with
//! a count (`blk.*`).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use lode_runtime::backend::gpu::plan_trace::{Log, PlanTrace, Step};
use lode_runtime::backend::KvTypes;
use lode_runtime::engine::{Engine, EngineOptions};
use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;

/// The plan of `tokens` prompt tokens (one chunk) and one decode step after them.
pub fn run(path: &Path, file: Arc<GgufFile>, tokens: usize, sms: usize, kv_type: KvTypes) -> Result<String> {
    let model = Model::load(file).with_context(|| format!("cannot load model {}", path.display()))?;
    let n_vocab = model.cfg.n_vocab.max(1);
    let experts = model.cfg.experts;
    let log: Log = Arc::new(Mutex::new(Vec::new()));
    let tuning = crate::common::gpu_options().tuning();
    let blas = tuning.blas;
    let be = PlanTrace::new(tuning, sms, log.clone());
    let tokens = tokens.max(1);
    let opts = EngineOptions { ctx_size: Some(tokens + 8), batch_size: tokens, kv_type, swa_full: false };
    let mut e = Engine::new(model, Box::new(be), opts)?;
    let ids: Vec<u32> = (0..tokens).map(|i| (i % n_vocab) as u32).collect();
    e.eval(&ids)?;
    let prefill = std::mem::take(&mut *log.lock().map_err(|_| anyhow::anyhow!("plan log poisoned"))?);
    e.eval(&[1 % n_vocab as u32])?;
    let decode = std::mem::take(&mut *log.lock().map_err(|_| anyhow::anyhow!("plan log poisoned"))?);
    let mut s = String::new();
    let _ = writeln!(s, "plan of {} on a GPU of {sms} multiprocessors (sm_90 occupancy; BLAS {}; LODE_TUNE and --no-blas applied)", path.display(), if blas { "assumed present" } else { "off" });
    if let Some(x) = experts {
        // The top-k runs on the device (`moe_route`); a layer the kernels do not take
        // reads its rows back (`host`).
        let _ = writeln!(s, "mixture of experts: {} of {} experts per token, routed on the device", x.n_used, x.n_expert);
    }
    let _ = writeln!(s, "\n== prefill: one chunk of {tokens} tokens");
    table(&mut s, &prefill);
    let _ = writeln!(s, "\n== decode: one token at position {tokens}");
    table(&mut s, &decode);
    Ok(s)
}

/// `blk.12.attn_q.weight` → `blk.*.attn_q.weight`.
fn fold_layer(what: &str) -> String {
    let mut out = String::with_capacity(what.len());
    let mut rest = what;
    while let Some(i) = rest.find("blk.") {
        out.push_str(&rest[..i + 4]);
        rest = &rest[i + 4..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 {
            out.push('*');
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Steps folded over layers (first appearance order), with counts.
fn fold(steps: &[Step]) -> Vec<(Step, usize)> {
    let mut order: Vec<(Step, usize)> = Vec::new();
    let mut at: HashMap<(String, String, String), usize> = HashMap::new();
    for st in steps {
        let key = (st.op.to_string(), fold_layer(&st.what), st.kernel.clone());
        match at.get(&key) {
            Some(&i) => order[i].1 += 1,
            None => {
                at.insert(key.clone(), order.len());
                order.push((Step { op: st.op, what: key.1, kernel: key.2 }, 1));
            }
        }
    }
    order
}

fn table(s: &mut String, steps: &[Step]) {
    let rows = fold(steps);
    let wo = rows.iter().map(|(r, _)| r.op.len()).max().unwrap_or(2).max(2);
    let ww = rows.iter().map(|(r, _)| r.what.chars().count()).max().unwrap_or(6).clamp(6, 90);
    let _ = writeln!(s, "  {:>4}  {:<wo$}  {:<ww$}  kernel", "×", "op", "reads");
    for (r, n) in rows {
        let what: String = if r.what.chars().count() > ww { r.what.chars().take(ww - 1).chain(std::iter::once('…')).collect() } else { r.what.clone() };
        let _ = writeln!(s, "  {n:>4}  {:<wo$}  {what:<ww$}  {}", r.op, r.kernel);
    }
    let _ = writeln!(s, "  ({} ops)", steps.len());
}

#[cfg(test)]
mod tests {
    #[test]
    fn layers_fold() {
        assert_eq!(super::fold_layer("blk.12.attn_q.weight Q4_K 2048×1024, blk.3.x"), "blk.*.attn_q.weight Q4_K 2048×1024, blk.*.x");
        assert_eq!(super::fold_layer("token_embd.weight"), "token_embd.weight");
    }
}
