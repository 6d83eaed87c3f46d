//! Diagnostics a user turns on to see inside a run, all from one environment variable:
//! `LODE_DEBUG`, a comma-separated list of
//!
//! - `profile`: every GPU launch synchronized and timed by kernel name (graphs off), a
//!   table at exit;
//! - `kernel-times`: every GPU launch between two GPU events, read at each step's end
//!   (graphs off, no extra synchronization): device time per kernel name and the steps'
//!   device span, a table at exit;
//! - `host-times`: the host's share of a decode token, by span, at exit;
//! - `launches`: every GPU launch printed before it is made (finding a crash);
//! - `mem`: the driver's used-memory figure wherever lode's device footprint changes;
//! - `weights`: one line per weight materialized or mapped;
//! - `repeat=KERNEL[:N]`: launch that kernel N more times (default 1) wherever it runs, so
//!   a benchmark's slowdown is its cost in its real place (idempotent kernels only);
//! - `cpu-dump=DIR[:N]`: the CPU backend writes each op's output to `DIR/<seq>_<op>.f32`
//!   (the first N ops, default 500), to compare tensor by tensor with llama.cpp.
//!
//! Read once per process. None of these changes a result.

use std::path::PathBuf;
use std::sync::OnceLock;

/// The environment variable the diagnostics are read from.
pub const ENV: &str = "LODE_DEBUG";

/// Which diagnostics are on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diag {
    pub profile: bool,
    pub kernel_times: bool,
    pub host_times: bool,
    pub launches: bool,
    pub mem: bool,
    pub weights: bool,
    pub repeat: Option<(String, usize)>,
    pub cpu_dump: Option<(PathBuf, usize)>,
}

impl Diag {
    /// Parse a `LODE_DEBUG` value; unknown entries are returned for the caller to report.
    pub fn parse(spec: &str) -> (Diag, Vec<String>) {
        let mut d = Diag::default();
        let mut unknown = Vec::new();
        for e in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (k, v) = e.split_once('=').map(|(k, v)| (k, Some(v))).unwrap_or((e, None));
            match (k, v) {
                ("1", None) | ("all", None) => {
                    d.host_times = true;
                    d.mem = true;
                    d.weights = true;
                }
                ("profile", None) => d.profile = true,
                ("kernel-times", None) => d.kernel_times = true,
                ("host-times", None) => d.host_times = true,
                ("launches", None) => d.launches = true,
                ("mem", None) => d.mem = true,
                ("weights", None) => d.weights = true,
                ("repeat", Some(v)) => d.repeat = Some(name_count(v, 1)),
                ("cpu-dump", Some(v)) => {
                    let (dir, n) = name_count(v, 500);
                    d.cpu_dump = Some((PathBuf::from(dir), n));
                }
                _ => unknown.push(e.to_string()),
            }
        }
        (d, unknown)
    }
}

/// `name[:n]` → (name, n); n is `default` when absent or unparsable.
fn name_count(v: &str, default: usize) -> (String, usize) {
    match v.rsplit_once(':') {
        Some((k, n)) if n.parse::<usize>().is_ok() => (k.to_string(), n.parse().unwrap_or(default)),
        Some((k, _)) => (k.to_string(), default),
        None => (v.to_string(), default),
    }
}

/// The process's diagnostics (`LODE_DEBUG`, read on first use).
pub fn get() -> &'static Diag {
    static D: OnceLock<Diag> = OnceLock::new();
    D.get_or_init(|| {
        let (d, unknown) = Diag::parse(&std::env::var(ENV).unwrap_or_default());
        if !unknown.is_empty() {
            eprintln!("lode: {ENV}: unknown entries {unknown:?} ignored (known: profile, kernel-times, host-times, launches, mem, weights, repeat=KERNEL[:N], cpu-dump=DIR[:N])");
        }
        d
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_entry() {
        let (d, bad) = Diag::parse("profile, mem,repeat=attn_decode_d128:3,cpu-dump=/tmp/x:20,what");
        assert!(d.profile && d.mem && !d.weights && !d.launches && !d.kernel_times);
        assert!(Diag::parse("kernel-times").0.kernel_times);
        assert_eq!(d.repeat, Some(("attn_decode_d128".into(), 3)));
        assert_eq!(d.cpu_dump, Some((PathBuf::from("/tmp/x"), 20)));
        assert_eq!(bad, ["what"]);
        assert_eq!(Diag::parse("repeat=k").0.repeat, Some(("k".into(), 1)));
        assert_eq!(Diag::parse("repeat=k:x").0.repeat, Some(("k".into(), 1)));
        assert_eq!(Diag::parse("").0, Diag::default());
    }
}
