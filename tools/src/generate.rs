//! `lode generate`.

/// Arguments of `lode generate`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode generate` is not built yet")
}
