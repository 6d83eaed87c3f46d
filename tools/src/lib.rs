//! lode's subcommands. Each module holds one subcommand: its clap `Args` and its `run`.
//! The library (`lode-runtime`) knows nothing of the command line.

pub mod bench;
pub mod chat;
pub mod common;
pub mod fit;
pub mod generate;
pub mod inspect;
pub mod inspect_plan;
pub mod perplexity;
pub mod quantize;
pub mod selftest;
pub mod selftest_bench;
pub mod selftest_model;
pub mod selftest_mtp;
pub mod selftest_residency;
pub mod serve;
pub mod spec;
pub mod synth;
pub mod tokenize;
