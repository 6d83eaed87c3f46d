//! `lode serve`.

/// Arguments of `lode serve`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode serve` is not built yet")
}
