//! `lode selftest`'s graph-replay checks on the real device: the replay decisions of
//! `replay/` (hit, new instance for distinct live buffers, rebind after the "KV arena"
//! is freed and reallocated, rebind on an offset change, new signature) driven through
//! stream capture, `cuGraphExecUpdate` / `hipGraphExecUpdate` and graph launches, with
//! every step's result read back and compared exactly with the host's arithmetic.
//!
//! A step is `y = kv + x; y *= 2; out ← y` over real kernels (`add_f32`, `scale_f32`, a
//! device copy); `kv` plays the KV arena, `x` changes every step (a host write before
//! the step, as staged inputs are). Both operations are exact in f32 (one rounding, then
//! a power of two), so the GPU must match the host bit for bit.

use crate::backend::gpu::family::elementwise;
use std::cell::RefCell;

use crate::backend::gpu::device::{DeviceBuffer, GpuDevice};
use crate::backend::gpu::driver::DriverError;
use crate::backend::gpu::replay::{Entry, Rec, Replay, ReplayStats};
use crate::backend::gpu::selftest::CheckReport;

const N: usize = 4096;

struct Step<'a> {
    dev: &'a GpuDevice,
    replay: RefCell<Replay>,
    x: DeviceBuffer,
    y: DeviceBuffer,
    out: DeviceBuffer,
    n: usize,
    k: u32,
}

impl<'a> Step<'a> {
    fn new(dev: &'a GpuDevice) -> Result<Step<'a>, DriverError> {
        Ok(Step { dev, replay: RefCell::new(Replay::with_capacity(8)), x: dev.alloc(N * 4)?, y: dev.alloc(N * 4)?, out: dev.alloc(N * 4)?, n: N, k: 0 })
    }

    /// One step reading the arena at `kv` (holding `kv_vals`); checks the result.
    fn run(&mut self, kv: u64, kv_vals: &[f32]) -> Result<(), String> {
        self.k += 1;
        let xs: Vec<f32> = (0..self.n).map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(self.k * 977) % 1000) as f32 * 0.013 - 6.0).collect();
        self.dev.write(self.x.ptr(), bytemuck::cast_slice(&xs)).map_err(txt)?;
        let rec = Rec { dev: self.dev, replay: &self.replay };
        elementwise::add(&rec, kv, self.x.ptr(), self.y.ptr(), self.n).map_err(txt)?;
        elementwise::scale(&rec, self.y.ptr(), self.y.ptr(), self.n, 2.0).map_err(txt)?;
        self.replay.borrow_mut().submit(self.dev, Entry::Copy { dst: self.out.ptr(), src: self.y.ptr(), bytes: self.n * 4 }).map_err(txt)?;
        self.replay.borrow_mut().end_step(self.dev).map_err(txt)?;
        let got = self.dev.read_f32(self.out.ptr(), self.n).map_err(txt)?;
        for i in 0..self.n {
            let want = (kv_vals[i] + xs[i]) * 2.0;
            if got[i].to_bits() != want.to_bits() {
                return Err(format!("step {}: out[{i}] = {} , want {want}", self.k, got[i]));
            }
        }
        Ok(())
    }

    fn stats(&self) -> ReplayStats {
        self.replay.borrow().stats
    }
}

fn arena(dev: &GpuDevice, n: usize, seed: u32) -> Result<(DeviceBuffer, Vec<f32>), DriverError> {
    let v: Vec<f32> = (0..n).map(|i| ((i as u32 ^ seed).wrapping_mul(40503) % 2000) as f32 * 0.25 - 250.0).collect();
    let b = dev.alloc(n * 4)?;
    dev.write(b.ptr(), bytemuck::cast_slice(&v))?;
    Ok((b, v))
}

fn report(name: &str, cases: usize, r: Result<(), String>) -> CheckReport {
    CheckReport { name: name.into(), cases, max_err: 0.0, worst_ratio: if r.is_ok() { 0.0 } else { f64::INFINITY }, skipped: false, failure: r.err() }
}

fn expect(s: ReplayStats, what: &str, ok: bool) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(format!("{what}: {s:?}"))
    }
}

/// Every replay check whose name contains `filter`.
pub fn run(dev: &GpuDevice, filter: Option<&str>) -> Vec<CheckReport> {
    let checks: [(&str, fn(&GpuDevice) -> Result<(), String>); 5] = [
        ("replay_hit", hit),
        ("replay_two_instances", two_instances),
        ("replay_kv_realloc", kv_realloc),
        ("replay_offset_rebind", offset_rebind),
        ("replay_new_signature", new_signature),
    ];
    checks.iter().filter(|(n, _)| filter.map(|f| n.contains(f)).unwrap_or(true)).map(|(n, f)| report(n, 1, f(dev))).collect()
}

fn err(e: DriverError) -> String {
    e.to_string()
}

fn txt<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Same bindings every step: one capture, then hits, right values.
fn hit(dev: &GpuDevice) -> Result<(), String> {
    let mut s = Step::new(dev).map_err(err)?;
    let (kv, v) = arena(dev, N, 1).map_err(err)?;
    for _ in 0..8 {
        s.run(kv.ptr(), &v)?;
    }
    let st = s.stats();
    expect(st, "want 2 eager steps, 1 capture, 6 hits", (st.eager_steps, st.captures, st.hits) == (2, 1, 6))
}

/// Two arenas used alternately: two instances, each hit, never rebound.
fn two_instances(dev: &GpuDevice) -> Result<(), String> {
    let mut s = Step::new(dev).map_err(err)?;
    let (a, va) = arena(dev, N, 2).map_err(err)?;
    let (b, vb) = arena(dev, N, 3).map_err(err)?;
    for _ in 0..6 {
        s.run(a.ptr(), &va)?;
        s.run(b.ptr(), &vb)?;
    }
    let st = s.stats();
    let n = s.replay.borrow().instances();
    expect(st, "want 2 instances, 0 rebinds, 9 hits", n == 2 && st.captures == 2 && st.rebinds + st.rebuilds == 0 && st.hits == 9)
}

/// The arena is freed and reallocated elsewhere: the instance is rebound (exec update),
/// never launched with the freed address.
fn kv_realloc(dev: &GpuDevice) -> Result<(), String> {
    let mut s = Step::new(dev).map_err(err)?;
    let (old, v) = arena(dev, N, 4).map_err(err)?;
    for _ in 0..4 {
        s.run(old.ptr(), &v)?;
    }
    // New arena first (so its address differs), then free the old one, as a grown
    // cache does; the free is a barrier in the backend.
    let (fresh, vf) = arena(dev, 2 * N, 5).map_err(err)?;
    s.replay.borrow_mut().barrier(dev).map_err(err)?;
    drop(old);
    for _ in 0..5 {
        s.run(fresh.ptr(), &vf)?;
    }
    let st = s.stats();
    expect(st, "want 1 capture and 1 rebind (or rebuild)", st.captures == 1 && st.rebinds + st.rebuilds == 1 && s.replay.borrow().instances() == 1)
}

/// The step reads the arena at another offset: same buffer, rebind.
fn offset_rebind(dev: &GpuDevice) -> Result<(), String> {
    let mut s = Step::new(dev).map_err(err)?;
    let (kv, v) = arena(dev, 2 * N, 6).map_err(err)?;
    for _ in 0..4 {
        s.run(kv.ptr(), &v[..N])?;
    }
    for _ in 0..4 {
        s.run(kv.ptr() + 1024 * 4, &v[1024..1024 + N])?;
    }
    let st = s.stats();
    expect(st, "want 1 capture, 1 rebind (or rebuild), 5 hits", st.captures == 1 && st.rebinds + st.rebuilds == 1 && st.hits == 5)
}

/// Another element count is another signature: a new instance, right values.
fn new_signature(dev: &GpuDevice) -> Result<(), String> {
    let mut s = Step::new(dev).map_err(err)?;
    let (kv, v) = arena(dev, N, 7).map_err(err)?;
    for _ in 0..3 {
        s.run(kv.ptr(), &v)?;
    }
    s.n = N / 2;
    for _ in 0..3 {
        s.run(kv.ptr(), &v)?;
    }
    let st = s.stats();
    expect(st, "want 2 captures, 0 rebinds", st.captures == 2 && st.rebinds + st.rebuilds == 0 && s.replay.borrow().instances() == 2)
}
