//! `LODE_DEBUG=kernel-times`: device durations per kernel name from a pair of GPU events
//! around each eager launch, read when the step ends (the read-back waits anyway), so the
//! stream is never stalled between launches as `profile`'s synchronized timing does.
//! Graph replay is off under it (events need eager launches); the launches are otherwise
//! issued as in a normal run. cuBLAS / hipBLAS calls are not launches and are not timed.
//!
//! The report has one table per step shape (steps grouped by their number of launches, so
//! one run over several batch sizes, `lode bench --sequences 1,16,32`, keeps each size's
//! decode steps apart): per kernel, calls, total and mean device time, ms per step and its
//! share of the kernels' time; and per step the span from the first launch's start to the
//! last launch's end, so `span − kernels` is the device's idle time inside the steps
//! (launch gaps, host work between launches, BLAS calls).

use super::{Entry, Executor};
use crate::backend::gpu::device::Timer;
use crate::backend::gpu::driver::DriverError;
use std::collections::{BTreeMap, HashMap};

/// Timed launches after which a step's events are read even before it ends (bounds the
/// event pool for long prefill chunks).
const MAX_PENDING: usize = 4096;

/// The steps of one shape: name → (calls, milliseconds); steps read and the sum of their
/// device spans (ms).
#[derive(Default)]
pub struct Shape {
    pub table: HashMap<&'static str, (u64, f64)>,
    pub steps: u64,
    pub span_ms: f64,
}

#[derive(Default)]
pub struct KernelTimes {
    /// Event pairs, reused step after step; `pending` of them are recorded and unread.
    pool: Vec<Timer>,
    /// The names of this step's timed entries (entry i used `pool[i]`).
    pending: Vec<&'static str>,
    /// Per step shape (launches in the step): the table and its steps.
    shapes: BTreeMap<usize, Shape>,
    /// The executor had no timer to give: entries run untimed.
    untimed: bool,
}

fn name_of(e: &Entry) -> &'static str {
    match e {
        Entry::Kernel { name, .. } => name,
        Entry::Copy { .. } => "copy",
    }
}

impl KernelTimes {
    /// Issue `e` between the two events of a pair.
    pub fn issue<X: Executor>(&mut self, x: &X, e: &Entry) -> Result<(), DriverError> {
        let i = self.pending.len();
        if i == self.pool.len() {
            match x.kernel_timer() {
                Some(t) => self.pool.push(t),
                None => {
                    self.untimed = true;
                    return x.issue(e);
                }
            }
        }
        let t = &self.pool[i];
        t.start()?;
        x.issue(e)?;
        t.mark_end()?;
        self.pending.push(name_of(e));
        if self.pending.len() >= MAX_PENDING {
            self.read()?;
        }
        Ok(())
    }

    /// Read the recorded pairs into the table (waits for the last); one step's span.
    pub fn read(&mut self) -> Result<(), DriverError> {
        let n = self.pending.len();
        if n == 0 {
            return Ok(());
        }
        let span = self.pool[n - 1].elapsed_since_ms(&self.pool[0])? as f64;
        let shape = self.shapes.entry(n).or_default();
        for (i, name) in self.pending.drain(..).enumerate() {
            let ms = self.pool[i].elapsed_ms()? as f64;
            let s = shape.table.entry(name).or_insert((0, 0.0));
            s.0 += 1;
            s.1 += ms;
        }
        shape.steps += 1;
        shape.span_ms += span;
        Ok(())
    }

    /// The table, most time first (None when nothing was timed).
    pub fn report(&mut self) -> Option<String> {
        if let Err(e) = self.read() {
            return Some(format!("kernel times: the last events could not be read ({e})"));
        }
        if self.shapes.is_empty() {
            return self.untimed.then(|| "kernel times: this device gave no timing events".to_string());
        }
        Some(format_shapes(&self.shapes))
    }
}

/// The shapes' tables, the shapes with the most device time first (at most
/// [`MAX_SHAPES`]; a line sums the rest).
pub fn format_shapes(shapes: &BTreeMap<usize, Shape>) -> String {
    let mut v: Vec<_> = shapes.iter().collect();
    let total = |s: &Shape| s.table.values().map(|x| x.1).sum::<f64>();
    v.sort_by(|a, b| total(b.1).total_cmp(&total(a.1)).then(a.0.cmp(b.0)));
    let mut out: String = v.iter().take(MAX_SHAPES).map(|(n, s)| format!("steps of {n} launches: {}", format_table(&s.table, s.steps, s.span_ms))).collect();
    if v.len() > MAX_SHAPES {
        let rest = &v[MAX_SHAPES..];
        let ms: f64 = rest.iter().map(|(_, s)| total(s)).sum();
        let steps: u64 = rest.iter().map(|(_, s)| s.steps).sum();
        out.push_str(&format!("{} more step shapes: {steps} steps, {ms:.2} ms in kernels\n", rest.len()));
    }
    out
}

/// Step shapes given a table of their own in the report.
pub const MAX_SHAPES: usize = 6;

/// The report's text: per kernel calls, total ms, µs per call, share of the kernels' time.
pub fn format_table(table: &HashMap<&'static str, (u64, f64)>, steps: u64, span_ms: f64) -> String {
    let mut v: Vec<_> = table.iter().collect();
    v.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1).then(a.0.cmp(b.0)));
    let total: f64 = v.iter().map(|x| x.1 .1).sum();
    let per = |ms: f64| if steps > 0 { ms / steps as f64 } else { 0.0 };
    let mut s = format!(
        "kernel times (GPU events, graphs off): {total:.2} ms in kernels over {steps} steps; per step {:.3} ms in kernels, {:.3} ms device span\n",
        per(total),
        per(span_ms)
    );
    for (name, (n, ms)) in v {
        s.push_str(&format!(
            "  {name:<28} {n:>8} calls {:>10.3} ms {:>9.2} us/call {:>9.3} ms/step {:>5.1} %\n",
            ms,
            ms * 1e3 / *n as f64,
            per(*ms),
            100.0 * ms / total.max(f64::MIN_POSITIVE)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_reported_apart_most_time_first() {
        let mut shapes = BTreeMap::new();
        let mut a = Shape::default();
        a.table.insert("k", (3, 1.0));
        a.steps = 3;
        let mut b = Shape::default();
        b.table.insert("k", (2, 4.0));
        b.steps = 1;
        shapes.insert(10, a);
        shapes.insert(20, b);
        let s = format_shapes(&shapes);
        let heads: Vec<&str> = s.lines().filter(|l| l.starts_with("steps of")).collect();
        assert_eq!(heads.len(), 2, "{s}");
        assert!(!s.contains("more step shapes"), "{s}");
        assert!(heads[0].starts_with("steps of 20 launches") && heads[0].contains("over 1 steps"), "{s}");
        assert!(heads[1].starts_with("steps of 10 launches") && heads[1].contains("over 3 steps"), "{s}");
        for n in 0..MAX_SHAPES {
            let mut c = Shape::default();
            c.table.insert("k", (1, 0.5));
            c.steps = 2;
            shapes.insert(100 + n, c);
        }
        let s = format_shapes(&shapes);
        assert_eq!(s.lines().filter(|l| l.starts_with("steps of")).count(), MAX_SHAPES, "{s}");
        assert!(s.contains("2 more step shapes: 4 steps, 1.00 ms in kernels"), "{s}");
    }

    #[test]
    fn table_sorts_by_time_and_gives_per_step_figures() {
        let mut t = HashMap::new();
        t.insert("small_kernel", (4u64, 1.0f64));
        t.insert("big_kernel", (2, 3.0));
        let s = format_table(&t, 2, 5.0);
        let lines: Vec<&str> = s.lines().collect();
        assert!(lines[0].contains("4.00 ms in kernels over 2 steps") && lines[0].contains("2.000 ms in kernels") && lines[0].contains("2.500 ms device span"), "{s}");
        assert!(lines[1].trim_start().starts_with("big_kernel") && lines[1].contains("1500.00 us/call") && lines[1].contains("75.0 %"), "{s}");
        assert!(lines[2].trim_start().starts_with("small_kernel") && lines[2].contains("250.00 us/call") && lines[2].contains("0.500 ms/step"), "{s}");
    }
}
