//! `lode tokenize`.

/// Arguments of `lode tokenize`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode tokenize` is not built yet")
}
