//! `LODE_DEBUG=host-times`: the host's share of a decode token, measured in the process (no
//! tracer, which inflates driver calls several times over). Each span's durations are
//! kept and summarized when the backend is dropped: the graph launch call, the staging
//! writes, the wait for the step, and the host's time between a step's result and the
//! next step's launch (the engine's sampling and the forward pass's first op).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

fn on() -> bool {
    crate::diag::get().host_times
}

fn spans() -> &'static Mutex<BTreeMap<&'static str, Vec<f64>>> {
    static S: OnceLock<Mutex<BTreeMap<&'static str, Vec<f64>>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// The instant a step's result became available (the start of the "between" span).
fn ready_at() -> &'static Mutex<Option<Instant>> {
    static R: OnceLock<Mutex<Option<Instant>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Run `f`, recording its host duration under `name` when enabled.
pub fn span<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if !on() {
        return f();
    }
    let t0 = Instant::now();
    let r = f();
    record(name, t0.elapsed().as_secs_f64());
    r
}

fn record(name: &'static str, secs: f64) {
    if let Ok(mut s) = spans().lock() {
        s.entry(name).or_default().push(secs);
    }
}

/// A step's result is on the host now.
pub fn result_ready() {
    if on() {
        if let Ok(mut r) = ready_at().lock() {
            *r = Some(Instant::now());
        }
    }
}

/// The next step's work is being launched: closes the "between steps" span.
pub fn launching() {
    if !on() {
        return;
    }
    let t = ready_at().lock().ok().and_then(|mut r| r.take());
    if let Some(t) = t {
        record("result -> next launch", t.elapsed().as_secs_f64());
    }
}

/// Median, 10th and 90th percentile of each span, in µs; None when disabled or empty.
pub fn report() -> Option<String> {
    if !on() {
        return None;
    }
    let s = spans().lock().ok()?;
    if s.is_empty() {
        return None;
    }
    let mut out = String::from("host times (LODE_DEBUG=host-times): span, count, p10 / median / p90 µs\n");
    for (name, v) in s.iter() {
        let mut v = v.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        let q = |f: f64| v[((v.len() - 1) as f64 * f) as usize] * 1e6;
        out += &format!("  {name:<24} {:>7}  {:8.2} {:8.2} {:8.2}\n", v.len(), q(0.1), q(0.5), q(0.9));
    }
    Some(out)
}
