//! `lode quantize IN OUT TYPE`: llama-quantize's named mixes (`mix.rs`: the per-tensor
//! type choice of llama.cpp's `llama-quant.cpp`) with lode's quantizers (llama.cpp's
//! algorithms), multithreaded over rows, streamed to the output file.
//!
//! The file is laid out as `llama-quantize` writes it: the input's metadata, then
//! `general.quantization_version` and `general.file_type` (and, with `--imatrix`, the
//! `quantize.imatrix.*` keys), the tensors in llama.cpp's loader order. A tensor already
//! of its target type is copied; a quantized input is dequantized first, which adds its
//! own error (a warning says so). The IQ2 / IQ1 / IQ3_XXS types need `--imatrix FILE`
//! (llama.cpp's importance matrix), as llama.cpp requires.

pub mod imatrix;
pub mod mix;

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};
use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue};
use lode_runtime::quant::{self, GgmlType};
use mix::{Ftype, ModelFacts, Options, TensorDesc};
use rayon::prelude::*;

/// Arguments of `lode quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF file to read (F32, F16 or BF16 weights; quantized ones are requantized).
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
    /// llama-quantize's mix: Q4_K_M, Q4_K_S, Q5_K_M, Q6_K, Q8_0, Q3_K_M, Q3_K_S, Q3_K_L,
    /// Q2_K, IQ4_XS, IQ4_NL, IQ3_S, IQ3_M, MXFP4_MOE, IQ3_XXS, IQ2_XXS, IQ2_XS, IQ2_S,
    /// IQ2_M, IQ1_S, IQ1_M, Q4_0, Q5_0, F16, BF16, F32, ...
    #[arg(value_name = "TYPE")]
    pub ty: String,
    /// llama.cpp's importance matrix (`llama-imatrix` output); required by the IQ2 / IQ1 /
    /// IQ3_XXS mixes.
    #[arg(long)]
    pub imatrix: Option<PathBuf>,
    /// Every quantized tensor in the mix's base type (no per-tensor rules).
    #[arg(long)]
    pub pure: bool,
    /// The type of `output.weight` (the LM head).
    #[arg(long = "output-tensor-type", alias = "output-type")]
    pub output_type: Option<String>,
    /// The type of `token_embd.weight`.
    #[arg(long = "token-embedding-type")]
    pub token_embd_type: Option<String>,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

/// Whether lode can write weights of type `t` (the activation-only Q8_1 / Q8_K excluded).
fn writable(t: GgmlType) -> bool {
    (t.is_supported() || GgmlType::GRID_WEIGHTS.contains(&t)) && !matches!(t, GgmlType::Q8_1 | GgmlType::Q8_K)
}

fn writable_names() -> String {
    GgmlType::names(&GgmlType::WEIGHTS.into_iter().filter(|&t| writable(t)).collect::<Vec<_>>())
}

fn parse_type(s: &str) -> anyhow::Result<GgmlType> {
    match GgmlType::from_name(s) {
        Some(t) if writable(t) => Ok(t),
        _ => bail!("cannot quantize to `{s}` (types: {})", writable_names()),
    }
}

/// The model facts the mix rules read, from the input's metadata.
fn facts(f: &GgufFile) -> anyhow::Result<ModelFacts> {
    let arch = f.get_str("general.architecture")?.unwrap_or("").to_string();
    let first = |key: &str| -> anyhow::Result<u64> {
        let k = format!("{arch}.{key}");
        Ok(match f.get_u64(&k) {
            Ok(v) => v.unwrap_or(0),
            // Per-layer arrays (e.g. head_count_kv): llama.cpp's n_gqa() reads layer 0.
            Err(_) => f.get_u64_array(&k)?.and_then(|v| v.first().copied()).unwrap_or(0),
        })
    };
    Ok(ModelFacts {
        n_layer: first("block_count")?,
        n_head: first("attention.head_count")?,
        n_head_kv: first("attention.head_count_kv")?,
        n_expert: first("expert_count")?,
        arch,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ftype = Ftype::from_name(&args.ty).with_context(|| format!("unknown quantization type `{}` (types: {})", args.ty, Ftype::all_names()))?;
    let f = GgufFile::open(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    // Writing over the mapped input would pull the bytes from under the reads.
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(&args.input), std::fs::canonicalize(&args.output)) {
        if a == b {
            bail!("the output {} is the input file; write to another path", args.output.display());
        }
    }
    let im = args.imatrix.as_deref().map(imatrix::load).transpose()?;
    let opts = Options {
        has_imatrix: im.is_some(),
        pure: args.pure,
        output_type: args.output_type.as_deref().map(parse_type).transpose()?,
        token_embd_type: args.token_embd_type.as_deref().map(parse_type).transpose()?,
    };
    let descs: Vec<TensorDesc> = f.tensors().iter().map(|t| TensorDesc { name: t.name.clone(), dims: t.dims.clone(), ty: t.ty }).collect();
    let choice = mix::assign(ftype, &facts(&f)?, &opts, &descs).map_err(anyhow::Error::msg)?;
    let order = mix::llama_order(&descs.iter().map(|t| t.name.as_str()).collect::<Vec<_>>());

    // Refuse before writing anything, as llama.cpp does.
    for &i in &order {
        let (t, c) = (&descs[i], choice[i]);
        if c.ty != t.ty && !writable(c.ty) {
            bail!("{}: lode cannot write {} (types: {})", t.name, c.ty, writable_names());
        }
        if c.ty != t.ty && c.needs_imatrix && im.as_ref().is_none_or(|m| !m.weights.contains_key(&t.name)) {
            bail!(
                "{}: the {} mix makes it {}, which needs an importance matrix{} (llama.cpp refuses too); \
                 make one with llama.cpp's llama-imatrix and pass --imatrix FILE",
                t.name,
                ftype.name(),
                c.ty,
                if im.is_some() { ", and the given one has no entry for it" } else { "" }
            );
        }
        if let Some(w) = im.as_ref().and_then(|m| m.weights.get(&t.name)) {
            let want = t.dims[0] * t.dims.get(2).copied().unwrap_or(1);
            if c.ty != t.ty && w.len() as u64 != want && t.name != "token_embd.weight" {
                bail!("importance matrix entry {} has {} values, the tensor needs {want}", t.name, w.len());
            }
        }
    }

    let mut w = GgufWriter::new();
    let appended = ["general.quantization_version", "general.file_type", "split.no", "split.count", "split.tensors.count"];
    for (k, v) in f.metadata() {
        if !appended.contains(&k.as_str()) {
            w.add_kv(k.clone(), v.clone());
        }
    }
    w.add_kv("general.quantization_version", MetaValue::U32(2));
    w.add_kv("general.file_type", MetaValue::U32(ftype as u32));
    if let (Some(m), Some(p)) = (&im, &args.imatrix) {
        w.add_kv("quantize.imatrix.file", MetaValue::String(p.display().to_string().chars().take(127).collect()));
        if let Some(d) = m.datasets.first() {
            w.add_kv("quantize.imatrix.dataset", MetaValue::String(d.chars().take(127).collect()));
        }
        w.add_kv("quantize.imatrix.entries_count", MetaValue::U32(m.weights.len() as u32));
        if m.chunk_count > 0 {
            w.add_kv("quantize.imatrix.chunks_count", MetaValue::U32(m.chunk_count));
        }
    }
    let mut requant = Vec::new();
    let (mut fell_back, mut unweighted) = (0, Vec::new());
    for &i in &order {
        let (t, c) = (&f.tensors()[i], choice[i]);
        if c.ty != t.ty && t.ty.is_quantized() {
            requant.push(format!("{} ({})", t.name, t.ty));
        }
        fell_back += usize::from(c.fell_back);
        w.add_tensor_info(t.name.clone(), c.ty, &t.dims);
    }
    if !requant.is_empty() {
        eprintln!(
            "warning: {} tensors are already quantized (e.g. {}): they are dequantized and quantized again, \
             which adds the error of both; quantize from an F32/F16/BF16 file for the best result",
            requant.len(),
            requant[0]
        );
    }
    if fell_back > 0 {
        eprintln!("note: {fell_back} matrices have rows that are not whole blocks of their type: they get llama.cpp's substitute");
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let n = order.len();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&args.output).with_context(|| format!("creating {}", args.output.display()))?);
    let label = args.output.display().to_string();
    w.write_stream(&mut out, &label, |k, info, dst| {
        let i = order[k];
        let t = &f.tensors()[i];
        let src = f.tensor(&t.name).map(|v| v.data).unwrap_or_default();
        let to = choice[i].ty;
        eprint!("\r[{:>4}/{n}] {:<40} {} -> {}   ", k + 1, info.name, t.ty, to);
        if to == t.ty {
            return dst.write_all(src);
        }
        let row = t.dims[0] as usize;
        let rows = (t.n_elements() / t.dims[0]) as usize;
        let rows_per_expert = t.dims.get(1).copied().unwrap_or(1).max(1) as usize;
        let weights = im.as_ref().and_then(|m| m.weights.get(&t.name)).filter(|w| w.len() % row.max(1) == 0 && !w.is_empty());
        let (src_rb, dst_rb) = (t.ty.bytes_for(row as u64).unwrap_or(0) as usize, to.bytes_for(row as u64).unwrap_or(0) as usize);
        let mut bytes = vec![0u8; rows * dst_rb];
        let used: Result<Vec<bool>, quant::QuantError> = pool.install(|| {
            bytes
                .par_chunks_mut(dst_rb.max(1))
                .zip(src.par_chunks(src_rb.max(1)))
                .enumerate()
                .map(|(r, (d, s))| {
                    let mut x = vec![0f32; row];
                    quant::dequantize(t.ty, s, &mut x)?;
                    let e = r / rows_per_expert;
                    let qw = weights.and_then(|w| w.get(e * row..(e + 1) * row));
                    quant::quantize_weighted(to, &x, d, qw)
                })
                .collect()
        });
        let used = used.map_err(|e| std::io::Error::other(format!("{}: {e}", t.name)))?;
        if weights.is_some() && used.iter().any(|u| !u) && !unweighted.contains(&to) {
            unweighted.push(to);
        }
        dst.write_all(&bytes)
    })?;
    out.flush()?;
    eprintln!("\nwrote {}", args.output.display());
    if !unweighted.is_empty() {
        eprintln!(
            "note: lode's {} quantizers take no importance matrix yet: those tensors were quantized without it \
             (llama.cpp weights them)",
            GgmlType::names(&unweighted)
        );
    }
    Ok(())
}
