//! `lode quantize IN OUT TYPE`: every matrix of a GGUF file re-encoded as TYPE with
//! lode's reference quantizers (llama.cpp's `quantize_row_*_ref` algorithms, no
//! importance matrix), multithreaded over rows, streamed to the output file.
//!
//! As llama.cpp does for its mixes, the LM head (`output.weight`, or `token_embd.weight`
//! when the embeddings are tied) gets `--output-type` (default Q6_K); vectors (norms,
//! biases) are copied as they are; a matrix whose rows are not whole 256-element blocks
//! gets llama.cpp's substitute type (Q2_K, Q3_K, IQ4_XS → IQ4_NL; Q4_K → Q5_0; Q5_K →
//! Q5_1; Q6_K → Q8_0). A quantized input is dequantized first: that adds its
//! own error (a warning says so). llama.cpp's named mixes (Q3_K_M, …) are not built here.

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{bail, Context};
use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue};
use lode_runtime::quant::{self, GgmlType};
use rayon::prelude::*;

/// Arguments of `lode quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The GGUF file to read (F32, F16 or BF16 weights; quantized ones are requantized).
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
    /// The type of the matrices, e.g. Q3_K, Q2_K, IQ4_XS, IQ4_NL, MXFP4, Q4_K, Q8_0.
    #[arg(value_name = "TYPE")]
    pub ty: String,
    /// The type of the LM head (`output.weight`, or the tied `token_embd.weight`); `same`
    /// for TYPE.
    #[arg(long = "output-type", default_value = "Q6_K")]
    pub output_type: String,
    /// Threads (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
}

fn parse_type(s: &str) -> anyhow::Result<GgmlType> {
    match GgmlType::from_name(s) {
        Some(t) if t.is_supported() && !matches!(t, GgmlType::Q8_1 | GgmlType::Q8_K) => Ok(t),
        _ => {
            let ok: Vec<GgmlType> = GgmlType::ALL.into_iter().filter(|t| !matches!(t, GgmlType::Q8_1 | GgmlType::Q8_K)).collect();
            bail!("cannot quantize to `{s}` (types: {})", GgmlType::names(&ok))
        }
    }
}

/// llama.cpp's substitute (`llama_tensor_get_type`) for a 256-element type when a row is
/// not a whole number of super-blocks.
fn fallback(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q2_K | Q3_K | IQ4_XS | IQ3_S => IQ4_NL,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    }
}

/// The type tensor `name` (of shape `dims`, stored as `from`) gets.
fn target(name: &str, dims: &[u64], from: GgmlType, ty: GgmlType, head: GgmlType, tied: bool) -> GgmlType {
    let is_head = name == "output.weight" || (tied && name == "token_embd.weight");
    let mut want = if is_head { head } else { ty };
    let matrix = dims.len() >= 2 && name.ends_with(".weight");
    if dims[0] % want.block_elems() as u64 != 0 {
        want = fallback(want);
    }
    if !matrix || dims[0] % want.block_elems() as u64 != 0 || !from.is_supported() {
        return from;
    }
    want
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let ty = parse_type(&args.ty)?;
    let head = if args.output_type.eq_ignore_ascii_case("same") { ty } else { parse_type(&args.output_type)? };
    let f = GgufFile::open(&args.input).with_context(|| format!("reading {}", args.input.display()))?;
    // Writing over the mapped input would pull the bytes from under the reads.
    if let (Ok(a), Ok(b)) = (std::fs::canonicalize(&args.input), std::fs::canonicalize(&args.output)) {
        if a == b {
            bail!("the output {} is the input file; write to another path", args.output.display());
        }
    }
    let tied = f.tensor("output.weight").is_none();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_kv(k.clone(), v.clone());
    }
    w.add_kv("general.quantized_by", MetaValue::String(format!("lode {} quantize {}", env!("CARGO_PKG_VERSION"), ty.name())));
    let mut plan = Vec::new();
    let mut requant = Vec::new();
    let mut substituted = 0;
    for t in f.tensors() {
        let to = target(&t.name, &t.dims, t.ty, ty, head, tied);
        if t.dims.len() >= 2 && t.dims[0] % to.block_elems().max(1) as u64 == 0 && t.dims[0] % ty.block_elems() as u64 != 0 && to != t.ty {
            substituted += 1;
        }
        if to != t.ty && t.ty.is_quantized() {
            requant.push(format!("{} ({})", t.name, t.ty));
        }
        w.add_tensor_info(t.name.clone(), to, &t.dims);
        plan.push(to);
    }
    if !requant.is_empty() {
        eprintln!(
            "warning: {} tensors are already quantized (e.g. {}): they are dequantized and quantized again, \
             which adds the error of both; quantize from an F32/F16/BF16 file for the best result",
            requant.len(),
            requant[0]
        );
    }
    if substituted > 0 {
        eprintln!(
            "note: {substituted} matrices have rows that are not whole {}-element blocks: they get llama.cpp's \
             substitute ({}) or keep their type",
            ty.block_elems(),
            fallback(ty)
        );
    }
    let pool = rayon::ThreadPoolBuilder::new().num_threads(args.threads.unwrap_or(0)).build()?;
    let n = f.tensors().len();
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&args.output).with_context(|| format!("creating {}", args.output.display()))?);
    let label = args.output.display().to_string();
    w.write_stream(&mut out, &label, |i, info, dst| {
        let t = &f.tensors()[i];
        let src = f.tensor(&t.name).expect("tensor of this file").data;
        let to = plan[i];
        if to == t.ty {
            return dst.write_all(src);
        }
        let row = t.dims[0] as usize;
        let rows = (t.n_elements() / t.dims[0]) as usize;
        let (src_rb, dst_rb) = (t.ty.bytes_for(row as u64).unwrap_or(0) as usize, to.bytes_for(row as u64).unwrap_or(0) as usize);
        let mut bytes = vec![0u8; rows * dst_rb];
        let r: Result<(), quant::QuantError> = pool.install(|| {
            bytes.par_chunks_mut(dst_rb.max(1)).zip(src.par_chunks(src_rb.max(1))).try_for_each(|(d, s)| {
                let mut x = vec![0f32; row];
                quant::dequantize(t.ty, s, &mut x)?;
                quant::quantize(to, &x, d)
            })
        });
        r.map_err(|e| std::io::Error::other(format!("{}: {e}", t.name)))?;
        eprint!("\r[{:>4}/{n}] {:<40} {} -> {}   ", i + 1, info.name, t.ty, to);
        dst.write_all(&bytes)
    })?;
    out.flush()?;
    eprintln!("\nwrote {}", args.output.display());
    Ok(())
}
