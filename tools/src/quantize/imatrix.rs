//! Reading llama.cpp's importance matrix files (`llama-imatrix -o FILE`) as
//! `llama-quantize --imatrix` does (`common/imatrix-loader.cpp`, `tools/quantize`).
//!
//! The GGUF form holds, per weight matrix, `<tensor>.in_sum2` (F32, `ne0 × n_expert`: the
//! sum over the evaluated tokens of each input column's square) and `<tensor>.counts`
//! (F32, one per expert: the tokens summed), with the keys `imatrix.datasets`,
//! `imatrix.chunk_count` and `imatrix.chunk_size`. A column's weight is its mean square,
//! `in_sum2 / counts` (1 for an expert no token reached). The legacy binary form (before
//! GGUF) is read too: entries of (name, calls, values) whose values are already means
//! times the number of calls.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context};
use lode_runtime::gguf::GgufFile;
use lode_runtime::quant::GgmlType;

/// The per-column weights of every matrix the file covers.
#[derive(Debug, Default)]
pub struct Imatrix {
    /// Tensor name → weights (`ne0` per expert, experts one after another).
    pub weights: HashMap<String, Vec<f32>>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Read `path` (GGUF, or llama.cpp's legacy binary form).
pub fn load(path: &Path) -> anyhow::Result<Imatrix> {
    let bytes = std::fs::read(path).with_context(|| format!("reading the importance matrix {}", path.display()))?;
    let m = if bytes.starts_with(b"GGUF") {
        let f = GgufFile::from_bytes(bytes).with_context(|| format!("importance matrix {}", path.display()))?;
        from_gguf(&f).with_context(|| format!("importance matrix {}", path.display()))?
    } else {
        legacy(&bytes).with_context(|| format!("importance matrix {} (legacy format)", path.display()))?
    };
    if m.weights.is_empty() {
        bail!("importance matrix {} has no entries", path.display());
    }
    for (name, w) in &m.weights {
        if let Some(v) = w.iter().find(|v| !v.is_finite()) {
            bail!("importance matrix {}: entry {name} holds the non-finite value {v}", path.display());
        }
    }
    Ok(m)
}

fn from_gguf(f: &GgufFile) -> anyhow::Result<Imatrix> {
    let datasets = f.get_str_array("imatrix.datasets")?.map(|v| v.into_iter().map(str::to_string).collect());
    let chunk_count = f.get_u64("imatrix.chunk_count")?;
    let chunk_size = f.get_u64("imatrix.chunk_size")?;
    let (Some(datasets), Some(chunk_count), Some(_)) = (datasets, chunk_count, chunk_size) else {
        bail!("missing imatrix metadata (imatrix.datasets, imatrix.chunk_count, imatrix.chunk_size): not a llama-imatrix file");
    };
    let mut pairs: HashMap<String, (Option<Vec<f32>>, Option<Vec<f32>>)> = HashMap::new();
    for v in f.views() {
        let name = &v.info.name;
        let (base, sums) = if let Some(b) = name.strip_suffix(".in_sum2") {
            (b, true)
        } else if let Some(b) = name.strip_suffix(".counts") {
            (b, false)
        } else {
            continue;
        };
        if v.info.ty != GgmlType::F32 {
            bail!("{name} is {}, not F32", v.info.ty);
        }
        let e = pairs.entry(base.to_string()).or_default();
        if sums {
            e.0 = Some(f32s(v.data));
        } else {
            e.1 = Some(f32s(v.data));
        }
    }
    let mut weights = HashMap::new();
    for (name, p) in pairs {
        let (Some(sums), Some(counts)) = p else { bail!("{name} has no matching .in_sum2 / .counts pair") };
        if counts.is_empty() || sums.len() % counts.len() != 0 {
            bail!("{name}: {} sums do not split into {} experts", sums.len(), counts.len());
        }
        let ne0 = sums.len() / counts.len();
        let mut w = vec![1f32; sums.len()];
        for (j, &c) in counts.iter().enumerate() {
            // llama.cpp rounds the stored count to an integer, then divides in f32.
            let c = c.round() as i64 as f32;
            if c > 0.0 {
                for i in 0..ne0 {
                    w[j * ne0 + i] = sums[j * ne0 + i] / c;
                }
            }
        }
        weights.insert(name, w);
    }
    Ok(Imatrix { weights, datasets, chunk_count: chunk_count as u32 })
}

/// The pre-GGUF form: i32 entry count; per entry i32 name length, the name, i32 calls,
/// i32 value count, the f32 values; then optionally i32 chunks and a dataset name.
fn legacy(b: &[u8]) -> anyhow::Result<Imatrix> {
    let mut at = 0usize;
    let mut take = |n: usize| -> anyhow::Result<&[u8]> {
        let s = b.get(at..at + n).context("file ends early")?;
        at += n;
        Ok(s)
    };
    let i32_at = |s: &[u8]| i32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let n = i32_at(take(4)?);
    if n < 1 {
        bail!("no entries");
    }
    let mut m = Imatrix::default();
    for _ in 0..n {
        let len = i32_at(take(4)?);
        let name = String::from_utf8_lossy(take(usize::try_from(len).context("negative name length")?)?).into_owned();
        let calls = i32_at(take(4)?);
        let nval = i32_at(take(4)?);
        if nval < 1 {
            bail!("entry {name} has {nval} values");
        }
        let mut v = f32s(take(nval as usize * 4)?);
        if calls > 0 {
            v.iter_mut().for_each(|x| *x /= calls as f32);
        }
        m.weights.insert(name, v);
    }
    if let Ok(c) = take(4) {
        m.chunk_count = i32_at(c).max(0) as u32;
        if let Ok(l) = take(4) {
            let l = i32_at(l);
            if l > 0 {
                if let Ok(s) = take(l as usize) {
                    m.datasets.push(String::from_utf8_lossy(s).into_owned());
                }
            }
        }
    }
    Ok(m)
}
