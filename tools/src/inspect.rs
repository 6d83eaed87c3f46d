//! `lode inspect`.

/// Arguments of `lode inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode inspect` is not built yet")
}
