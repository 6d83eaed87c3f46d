//! `lode fit`.

/// Arguments of `lode fit`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode fit` is not built yet")
}
