//! `lode synth`.

/// Arguments of `lode synth`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode synth` is not built yet")
}
