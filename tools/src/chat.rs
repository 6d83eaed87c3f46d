//! `lode chat`.

/// Arguments of `lode chat`.
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(args: Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("`lode chat` is not built yet")
}
