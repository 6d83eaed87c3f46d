//! `lode inspect`: a GGUF file's header, metadata, tensor table and per-type totals,
//! as text or JSON. Long arrays are summarised (type, length, first items) and long
//! strings cut, so a tokenizer's 262k tokens do not flood the terminal.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use lode_runtime::gguf::{GgufFile, MetaValue, TensorInfo};
use lode_runtime::quant::GgmlType;
use serde_json::{json, Value};

/// Arrays longer than this are summarised.
const ARRAY_SHOWN: usize = 8;
/// Strings longer than this (in chars) are cut in text output.
const STRING_SHOWN: usize = 120;

/// Arguments of `lode inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF file.
    pub file: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print which GPU kernel each op of a prefill chunk and of a decode step runs (as the
    /// dispatch plan decides it; needs no GPU: an H200's occupancy figures).
    #[arg(long)]
    pub plan: bool,
    /// With `--plan`: tokens in the prefill chunk.
    #[arg(long, default_value_t = 512)]
    pub tokens: usize,
    /// With `--plan`: the GPU's multiprocessors (an H200 has 132).
    #[arg(long, default_value_t = 132)]
    pub sms: usize,
    /// With `--plan`: the KV cache's types (`-ctk` / `-ctv`).
    #[command(flatten)]
    pub kv: crate::common::KvArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let f = crate::common::open_gguf_plain(&args.file, "cannot inspect")?;
    let out = if args.plan {
        crate::inspect_plan::run(&args.file, std::sync::Arc::new(f), args.tokens, args.sms, args.kv.types())?
    } else if args.json {
        serde_json::to_string_pretty(&to_json(&args.file, &f))? + "\n"
    } else {
        to_text(&args.file, &f)
    };
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    // A closed pipe (`lode inspect f | head`) is not an error worth reporting.
    match stdout.write_all(out.as_bytes()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// Count and bytes per tensor type, in type-id order.
pub fn totals(f: &GgufFile) -> BTreeMap<GgmlType, (usize, u64)> {
    let mut m = BTreeMap::new();
    for t in f.tensors() {
        let e = m.entry(t.ty).or_insert((0usize, 0u64));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    m
}

/// The multi-token-prediction blocks a file carries (`{arch}.nextn_predict_layers`, the
/// last blocks of `block_count`, llama.cpp's `blk.N.nextn.*` and the block's own
/// attention and FFN): (blocks, first block index, tensors, bytes).
pub fn mtp_summary(f: &GgufFile) -> Option<(u64, u64, usize, u64)> {
    let arch = f.get_str("general.architecture").ok().flatten()?;
    let n = f.get_u64(&format!("{arch}.nextn_predict_layers")).ok().flatten().filter(|&n| n > 0)?;
    let blocks = f.get_u64(&format!("{arch}.block_count")).ok().flatten()?;
    let first = blocks.checked_sub(n)?;
    let of_mtp = |t: &&TensorInfo| {
        t.name.strip_prefix("blk.").and_then(|r| r.split('.').next()).and_then(|i| i.parse::<u64>().ok()).is_some_and(|i| i >= first)
    };
    let ts: Vec<&TensorInfo> = f.tensors().iter().filter(of_mtp).collect();
    Some((n, first, ts.len(), ts.iter().map(|t| t.n_bytes).sum()))
}

fn shape(t: &TensorInfo) -> String {
    let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
    format!("[{}]", dims.join(", "))
}

fn to_text(path: &std::path::Path, f: &GgufFile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "file: {} ({} bytes)", path.display(), f.bytes().len());
    let _ = writeln!(
        s,
        "GGUF v{}, alignment {}, data offset {}",
        f.version(),
        f.alignment(),
        f.data_offset()
    );

    let _ = writeln!(s, "\nmetadata ({} keys):", f.metadata().len());
    let kw = f.metadata().iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in f.metadata() {
        let _ = writeln!(s, "  {k:<kw$}  {:<8}  {}", short_type(v), text_value(v));
    }

    if let Some((n, first, nt, b)) = mtp_summary(f) {
        let _ = writeln!(
            s,
            "\nmulti-token prediction: {n} block(s) from blk.{first} ({nt} tensors, {b} bytes), not run by the forward pass; lode drafts with it under --spec-type draft-mtp"
        );
    }

    let _ = writeln!(s, "\ntensors ({}):", f.tensors().len());
    let nw = f.tensors().iter().map(|t| t.name.len()).max().unwrap_or(4).max(4);
    let _ = writeln!(s, "  {:<nw$}  {:<7}  {:<22}  {:>12}  {:>12}", "name", "type", "shape", "bytes", "file offset");
    for t in f.tensors() {
        let _ = writeln!(
            s,
            "  {:<nw$}  {:<7}  {:<22}  {:>12}  {:>12}",
            t.name,
            t.ty.name(),
            shape(t),
            t.n_bytes,
            f.data_offset() + t.offset
        );
    }

    let _ = writeln!(s, "\ntotals per type:");
    let (mut n_all, mut b_all) = (0, 0);
    for (ty, (n, b)) in totals(f) {
        let _ = writeln!(s, "  {:<7}  {:>5} tensors  {:>14} bytes", ty.name(), n, b);
        n_all += n;
        b_all += b;
    }
    let _ = writeln!(s, "  {:<7}  {:>5} tensors  {:>14} bytes", "all", n_all, b_all);
    s
}

/// `u32`, `str`, `[str]`, `[[i32]]`.
fn short_type(v: &MetaValue) -> String {
    match v {
        MetaValue::Array(t, items) => match items.first() {
            Some(first) if *t == lode_runtime::gguf::ValueType::Array => format!("[{}]", short_type(first)),
            _ => format!("[{}]", t.name()),
        },
        v => v.value_type().name().to_string(),
    }
}

fn text_value(v: &MetaValue) -> String {
    match v {
        MetaValue::String(st) => {
            let n = st.chars().count();
            if n > STRING_SHOWN {
                let cut: String = st.chars().take(STRING_SHOWN).collect();
                format!("{:?}… ({} chars)", cut, n)
            } else {
                format!("{st:?}")
            }
        }
        MetaValue::Array(_, items) => {
            let shown: Vec<String> = items.iter().take(ARRAY_SHOWN).map(text_value).collect();
            if items.len() > ARRAY_SHOWN {
                format!("{} items: [{}, …]", items.len(), shown.join(", "))
            } else {
                format!("[{}]", shown.join(", "))
            }
        }
        v => v.to_string(),
    }
}

fn json_value(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        // Non-finite floats have no JSON number; print them as strings.
        MetaValue::F32(x) if x.is_finite() => json!(x),
        MetaValue::F64(x) if x.is_finite() => json!(x),
        MetaValue::F32(x) => json!(x.to_string()),
        MetaValue::F64(x) => json!(x.to_string()),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(x) => json!(x),
        MetaValue::Array(t, items) => {
            let head: Vec<Value> = items.iter().take(ARRAY_SHOWN).map(json_value).collect();
            if items.len() > ARRAY_SHOWN {
                json!({ "array_of": t.name(), "len": items.len(), "first": head })
            } else {
                Value::Array(head)
            }
        }
    }
}

fn to_json(path: &std::path::Path, f: &GgufFile) -> Value {
    let metadata: Vec<Value> = f
        .metadata()
        .iter()
        .map(|(k, v)| json!({ "key": k, "type": short_type(v), "value": json_value(v) }))
        .collect();
    let tensors: Vec<Value> = f
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ty.name(),
                "shape": t.dims,
                "bytes": t.n_bytes,
                "offset": t.offset,
                "file_offset": f.data_offset() + t.offset,
            })
        })
        .collect();
    let totals: Vec<Value> = totals(f)
        .into_iter()
        .map(|(ty, (n, b))| json!({ "type": ty.name(), "count": n, "bytes": b }))
        .collect();
    json!({
        "file": path.display().to_string(),
        "file_bytes": f.bytes().len(),
        "version": f.version(),
        "alignment": f.alignment(),
        "data_offset": f.data_offset(),
        "metadata": metadata,
        "tensors": tensors,
        "totals": totals,
        "n_tensors": f.tensors().len(),
        "tensor_bytes": f.tensors().iter().map(|t| t.n_bytes).sum::<u64>(),
        "mtp": mtp_summary(f).map(|(n, first, nt, b)| json!({ "blocks": n, "first_block": first, "tensors": nt, "bytes": b })),
    })
}
