//! `lode selftest`.

/// Arguments of `lode selftest`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode selftest` is not built yet")
}
