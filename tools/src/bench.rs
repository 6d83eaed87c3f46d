//! `lode bench`.

/// Arguments of `lode bench`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode bench` is not built yet")
}
