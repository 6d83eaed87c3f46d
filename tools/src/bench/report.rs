//! What a benchmark row says and how it is printed: llama-bench's markdown table and
//! its JSON field names where they overlap, plus lode's roofline figure.

use std::time::{SystemTime, UNIX_EPOCH};

use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use serde::{Deserialize, Serialize};

use super::stats::mean_sd;

/// Facts about the model every row repeats.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub filename: String,
    /// llama-bench's description: `gemma3 270M Q4_K - Medium`.
    pub desc: String,
    /// Bytes of all tensors.
    pub size: u64,
    pub n_params: u64,
    /// Weight bytes one decode step of one sequence reads: every tensor the forward pass
    /// uses, except that an untied embedding table contributes one row and a routed
    /// expert tensor (`ffn_*_exps`) its used fraction (`expert_used_count / expert_count`).
    pub weight_bytes_per_token: u64,
    /// Bytes of the routed expert tensors, all experts.
    pub expert_bytes: u64,
    /// Experts used per token over experts (0 without experts).
    pub expert_used_frac: f64,
}

impl ModelInfo {
    pub fn new(filename: String, file: &GgufFile, model: &Model) -> ModelInfo {
        let size = file.tensors().iter().map(|t| t.n_bytes).sum();
        let n_params: u64 = file.tensors().iter().map(|t| t.n_elements()).sum();
        let mut per_token = 0u64;
        let mut expert_bytes = 0u64;
        for id in model.weight_ids() {
            let w = model.w(id);
            let bytes = w.data().len() as u64;
            if lode_runtime::backend::moe::expert_tensor_layer(w.name()).is_some() {
                expert_bytes += bytes;
                continue;
            }
            per_token += if id == model.tok_embd && model.tok_embd != model.output { w.row_bytes() as u64 } else { bytes };
        }
        let expert_used_frac = model.cfg.experts.map_or(0.0, |e| e.n_used as f64 / e.n_expert.max(1) as f64);
        per_token += (expert_bytes as f64 * expert_used_frac) as u64;
        let arch = model.cfg.arch.name();
        let label = match file.get_str("general.size_label").ok().flatten() {
            Some(l) if !l.is_empty() => l.to_string(),
            _ => params_label(n_params),
        };
        let ftype = file.get_u64("general.file_type").ok().flatten().map_or("?".to_string(), ftype_name);
        ModelInfo { filename, desc: format!("{arch} {label} {ftype}"), size, n_params, weight_bytes_per_token: per_token, expert_bytes, expert_used_frac }
    }

    /// Weight bytes one step of `seqs` sequences reads: the dense weights once, and of the
    /// experts those any of the sequences' tokens select (expected under uniform routing:
    /// 1 − (1 − used/count)^seqs of them).
    pub fn bytes_per_step(&self, seqs: usize) -> u64 {
        let one = (self.expert_bytes as f64 * self.expert_used_frac) as u64;
        let dense = self.weight_bytes_per_token - one;
        let hit = 1.0 - (1.0 - self.expert_used_frac).powi(seqs.max(1) as i32);
        dense + (self.expert_bytes as f64 * hit) as u64
    }
}

fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n as f64 / 1e6).round())
    }
}

/// llama.cpp's names of `general.file_type` values.
fn ftype_name(ft: u64) -> String {
    match ft {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        other => return format!("ftype {other}"),
    }
    .to_string()
}

/// One result row. Field names follow llama-bench's JSON output where they overlap;
/// `test`, `weight_bytes_per_token` and `roofline_frac` are lode's.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub backends: String,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    /// Sequences decoding together (`tgN xS`); t/s counts the tokens of all of them.
    #[serde(default = "one")]
    pub n_seq: usize,
    pub n_depth: usize,
    pub test_time: String,
    pub test: String,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
    pub weight_bytes_per_token: u64,
    /// Process CPU time (all threads) per sample; empty where unknown.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub samples_cpu_ns: Vec<u64>,
    /// Mean of cpu / (wall × n_threads): below 1 on a loaded machine (or while threads wait).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cpu_util: Option<f64>,
    /// Mean of tokens ÷ (CPU seconds ÷ n_threads): the speed had every thread run all the
    /// time — an estimate for an idle machine when neighbours take the cores.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub cpu_norm_ts: Option<f64>,
    /// Decode rows with `--mem-bw`: weight bytes per token × tokens/s ÷ bandwidth.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub roofline_frac: Option<f64>,
    /// GPU graph replay counters since the engine was made (captures, hits, rebinds,
    /// rebuilds, fallbacks, eager steps), after this test.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub graphs: Option<lode_runtime::backend::gpu::replay::ReplayStats>,
    /// Speculative rows: drafted tokens the target accepted, over all samples.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub spec_acceptance: Option<f64>,
    /// GPU: the driver's highest used bytes over one more, untimed run of the test
    /// (sampled at every allocation, read-back and sync; the timed runs do not sample).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub device_peak_bytes: Option<u64>,
    /// That peak above the floor: the resident weights, the KV cache and recurrent state,
    /// and the driver's use before the engine allocated (context, kernels). What lode
    /// holds besides: activations, scratch, library workspaces, the BLAS slab.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub device_overhead_bytes: Option<i64>,
}

fn one() -> usize {
    1
}

impl Row {
    /// Fills the statistics from the timed samples (`n_tokens` per sample).
    pub fn set_samples(&mut self, samples_ns: Vec<u64>, n_tokens: usize) {
        let ns: Vec<f64> = samples_ns.iter().map(|&x| x as f64).collect();
        let ts: Vec<f64> = ns.iter().map(|&x| n_tokens as f64 * 1e9 / x.max(1.0)).collect();
        let (m, s) = mean_sd(&ns);
        let (mt, st) = mean_sd(&ts);
        self.avg_ns = m.round() as u64;
        self.stddev_ns = s.round() as u64;
        self.avg_ts = mt;
        self.stddev_ts = st;
        self.samples_ns = samples_ns;
        self.samples_ts = ts;
    }

    /// Records the CPU time of each sample (same order as `samples_ns`).
    pub fn set_cpu(&mut self, cpu_ns: Vec<u64>) {
        if cpu_ns.len() != self.samples_ns.len() || self.n_threads == 0 {
            self.samples_cpu_ns.clear();
            self.cpu_util = None;
            self.cpu_norm_ts = None;
            return;
        }
        let u: Vec<f64> = cpu_ns
            .iter()
            .zip(&self.samples_ns)
            .map(|(&c, &w)| c as f64 / (w.max(1) as f64 * self.n_threads as f64))
            .collect();
        self.cpu_util = Some(mean_sd(&u).0);
        let n_tok = (self.n_prompt + self.n_gen) as f64;
        let norm: Vec<f64> =
            cpu_ns.iter().map(|&c| n_tok * 1e9 * self.n_threads as f64 / c.max(1) as f64).collect();
        self.cpu_norm_ts = Some(mean_sd(&norm).0);
        self.samples_cpu_ns = cpu_ns;
    }
}

/// Markdown table in llama-bench's layout (plus a roofline column when known).
pub fn markdown(rows: &[Row]) -> String {
    let roof = rows.iter().any(|r| r.roofline_frac.is_some());
    let mem = rows.iter().any(|r| r.device_peak_bytes.is_some());
    let mut s = String::new();
    s += "| model                          |       size |     params | backend    | threads |            test |                  t/s |";
    s += if roof { " roofline |" } else { "" };
    s += if mem { "   peak MiB | over MiB |\n" } else { "\n" };
    s += "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |";
    s += if roof { " -------: |" } else { "" };
    s += if mem { " ---------: | -------: |\n" } else { "\n" };
    for r in rows {
        s += &format!(
            "| {:<30} | {:>10} | {:>10} | {:<10} | {:>7} | {:>15} | {:>20} |",
            r.model_type,
            format!("{:.2} MiB", r.model_size as f64 / (1u64 << 20) as f64),
            format!("{:.2} M", r.model_n_params as f64 / 1e6),
            r.backends,
            r.n_threads,
            match r.spec_acceptance {
                Some(a) => format!("{} (acc {:.1} %)", r.test, a * 100.0),
                None => r.test.clone(),
            },
            format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
        );
        if roof {
            match r.roofline_frac {
                Some(f) => s += &format!(" {:>7.1}% |", f * 100.0),
                None => s += "          |",
            }
        }
        if mem {
            let mib = |b: f64| b / (1u64 << 20) as f64;
            match r.device_peak_bytes {
                Some(p) => s += &format!(" {:>10.0} |", mib(p as f64)),
                None => s += "            |",
            }
            match r.device_overhead_bytes {
                Some(o) => s += &format!(" {:>8.0} |", mib(o as f64)),
                None => s += "          |",
            }
        }
        s += "\n";
    }
    s
}

/// Current UTC time as RFC 3339 (`2026-11-29T09:30:00Z`), as llama-bench's `test_time`.
pub fn now_rfc3339() -> String {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86400, secs % 86400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(params_label(268_098_176), "268M");
        assert_eq!(params_label(8_030_000_000), "8.0B");
        assert_eq!(ftype_name(15), "Q4_K - Medium");
        assert_eq!(ftype_name(99), "ftype 99");
    }

    #[test]
    fn rfc3339_shape() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20);
        assert!(t.starts_with("20") && t.ends_with('Z'));
    }

    #[test]
    fn a_step_reads_the_experts_its_tokens_select() {
        // 100 dense bytes, 1000 expert bytes, 1 of 4 experts per token.
        let m = ModelInfo { filename: String::new(), desc: String::new(), size: 1100, n_params: 0, weight_bytes_per_token: 350, expert_bytes: 1000, expert_used_frac: 0.25 };
        assert_eq!(m.bytes_per_step(1), 350);
        assert_eq!(m.bytes_per_step(2), 100 + 437);
        assert!(m.bytes_per_step(64) >= 1099 && m.bytes_per_step(64) <= 1100);
        let dense = ModelInfo { expert_bytes: 0, expert_used_frac: 0.0, weight_bytes_per_token: 100, ..m };
        assert_eq!(dense.bytes_per_step(32), 100);
    }

    #[test]
    fn peak_columns_only_where_a_row_has_one() {
        let mut r = Row {
            model_filename: String::new(), model_type: "llama 8B".into(), model_size: 1 << 30, model_n_params: 8, backends: "CUDA".into(),
            n_batch: 512, n_ubatch: 512, n_threads: 1, type_k: "f16".into(), type_v: "f16".into(), n_prompt: 512, n_gen: 0, n_seq: 1,
            n_depth: 0, test_time: String::new(), test: "pp512".into(), avg_ns: 1, stddev_ns: 0, avg_ts: 1.0, stddev_ts: 0.0,
            samples_ns: vec![], samples_ts: vec![], weight_bytes_per_token: 0, samples_cpu_ns: vec![], cpu_util: None, cpu_norm_ts: None,
            roofline_frac: None, graphs: None, spec_acceptance: None, device_peak_bytes: None, device_overhead_bytes: None,
        };
        assert!(!markdown(std::slice::from_ref(&r)).contains("peak MiB"));
        r.device_peak_bytes = Some(5641 << 20);
        r.device_overhead_bytes = Some(-(3 << 20));
        let md = markdown(&[r]);
        assert!(md.contains("peak MiB | over MiB"), "{md}");
        assert!(md.contains("5641 |") && md.contains("-3 |"), "{md}");
    }
}
