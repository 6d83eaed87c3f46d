//! `lode tokenize`: print the token ids (and pieces) of a text, as llama-tokenize does.
//! Needs only the vocabulary, so vocabulary-only GGUFs work; no tensor is touched.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use lode_runtime::tokenizer::Tokenizer;

/// Arguments of `lode tokenize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// GGUF file (a full model or a vocabulary-only file; default: Gemma 3 270M Q4_K_M,
    /// fetched on first use).
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Print `{"ids": [...], "pieces": [...]}` instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Do not add BOS/EOS even if the model asks for them.
    #[arg(long)]
    pub no_bos: bool,
    /// Turn the text of control tokens (e.g. `<|im_start|>`) into those tokens.
    #[arg(long)]
    pub parse_special: bool,
    /// Print only the ids, space-separated (like llama.cpp's `.out` files).
    #[arg(long, conflicts_with = "json")]
    pub ids: bool,
    /// The text to tokenize (read from stdin when absent).
    pub text: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let path = &crate::common::resolve_model(args.model.as_deref())?;
    let file = crate::common::open_gguf_plain(path, "cannot open")?;
    let tok = Tokenizer::from_gguf(&file).with_context(|| format!("loading the tokenizer of {}", path.display()))?;
    let text = match args.text {
        Some(t) => t,
        None => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading the text from stdin")?;
            s
        }
    };
    let ids = tok.encode(&text, !args.no_bos, args.parse_special);
    let pieces: Vec<String> = ids.iter().map(|&id| String::from_utf8_lossy(tok.token_to_piece(id)).into_owned()).collect();

    let mut out = std::io::stdout().lock();
    if args.json {
        let v = serde_json::json!({ "ids": ids, "pieces": pieces });
        writeln!(out, "{v}")?;
    } else if args.ids {
        let s: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "{}", s.join(" "))?;
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            writeln!(out, "{id:>8} -> {piece:?}")?;
        }
        writeln!(out, "{} tokens", ids.len())?;
    }
    Ok(())
}
