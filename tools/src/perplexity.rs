//! `lode perplexity`.

/// Arguments of `lode perplexity`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode perplexity` is not built yet")
}
