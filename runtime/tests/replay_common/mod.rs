//! A host-memory executor for graph replay and a tiny decode loop over it.
//!
//! `MemExec` owns f32 allocations at byte addresses (never reused unless asked), runs
//! kernels by name, and keeps "graph instances" as the records they were bound to: a
//! launch executes that bound record, so an instance that was not rebound after its
//! buffers moved reads the old (freed) addresses and fails with an illegal address.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use lode_runtime::backend::gpu::driver::{Api, DevPtr, DriverError, KArg, RawHandle};
use lode_runtime::backend::gpu::replay::signature::same_shape_steps;
use lode_runtime::backend::gpu::replay::{Entry, Executor, Replay};

/// Row length of the tiny model and its vocabulary.
pub const DIM: u32 = 16;
pub const VOCAB: u32 = 11;
/// `signature(Tiny::new(..).record(p))` — the same in every process and build.
pub const GOLDEN_SIGNATURE: u64 = 0x43b8_8ca5_0a4a_a896;

struct Region {
    base: u64,
    data: Vec<f32>,
    id: u64,
    live: bool,
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Counts {
    pub eager: u64,
    pub launches: u64,
    pub instantiated: u64,
    pub rebinds: u64,
    pub destroyed: u64,
}

pub struct MemExec {
    regions: RefCell<Vec<Region>>,
    next_base: Cell<u64>,
    graphs: RefCell<HashMap<RawHandle, Vec<Entry>>>,
    next_graph: Cell<RawHandle>,
    counts: Cell<Counts>,
    /// Refuse every rebind (as a driver refuses a topology change): replay must rebuild.
    pub refuse_rebind: Cell<bool>,
}

fn illegal(what: String) -> DriverError {
    DriverError::Other { api: Api::Cuda, what }
}

impl MemExec {
    pub fn new() -> MemExec {
        MemExec::with_base(0x1000_0000)
    }
    pub fn with_base(base: u64) -> MemExec {
        MemExec {
            regions: RefCell::new(Vec::new()),
            next_base: Cell::new(base),
            graphs: RefCell::new(HashMap::new()),
            next_graph: Cell::new(1),
            counts: Cell::new(Counts::default()),
            refuse_rebind: Cell::new(false),
        }
    }
    pub fn counts(&self) -> Counts {
        self.counts.get()
    }
    fn count(&self, f: impl FnOnce(&mut Counts)) {
        let mut c = self.counts.get();
        f(&mut c);
        self.counts.set(c);
    }

    /// `n` zeroed f32 values at a fresh address.
    pub fn alloc(&self, n: usize) -> DevPtr {
        let base = self.next_base.get();
        self.next_base.set(base + ((n as u64 * 4).div_ceil(256) + 1) * 256);
        let mut r = self.regions.borrow_mut();
        let id = r.len() as u64 + 1;
        r.push(Region { base, data: vec![0.0; n], id, live: true });
        base
    }
    pub fn free(&self, p: DevPtr) {
        let mut r = self.regions.borrow_mut();
        let reg = r.iter_mut().find(|x| x.base == p && x.live).expect("free of a live base");
        reg.live = false;
        reg.data = Vec::new();
    }

    fn locate(&self, p: DevPtr, n: usize) -> Result<(usize, usize), DriverError> {
        let r = self.regions.borrow();
        let i = r
            .iter()
            .position(|x| x.live && p >= x.base && p + n as u64 * 4 <= x.base + x.data.len() as u64 * 4)
            .ok_or_else(|| illegal(format!("illegal address {p:#x} (+{n} values)")))?;
        Ok((i, ((p - r[i].base) / 4) as usize))
    }
    pub fn read(&self, p: DevPtr, n: usize) -> Result<Vec<f32>, DriverError> {
        let (i, o) = self.locate(p, n)?;
        Ok(self.regions.borrow()[i].data[o..o + n].to_vec())
    }
    pub fn write(&self, p: DevPtr, v: &[f32]) -> Result<(), DriverError> {
        let (i, o) = self.locate(p, v.len())?;
        self.regions.borrow_mut()[i].data[o..o + v.len()].copy_from_slice(v);
        Ok(())
    }

    fn run(&self, e: &Entry) -> Result<(), DriverError> {
        let (name, args) = match e {
            Entry::Copy { dst, src, bytes } => {
                let v = self.read(*src, bytes / 4)?;
                return self.write(*dst, &v);
            }
            Entry::Kernel { name, args, .. } => (*name, args),
        };
        let p = |i: usize| match args.get(i) {
            Some(KArg::Ptr(p)) => Ok(*p),
            a => Err(illegal(format!("{name}: argument {i} is {a:?}, not a pointer"))),
        };
        let u = |i: usize| match args.get(i) {
            Some(KArg::U32(v)) => Ok(*v as usize),
            a => Err(illegal(format!("{name}: argument {i} is {a:?}, not a u32"))),
        };
        match name {
            // [table, ids, out, dim]: out = table[ids[0]]
            "embed" => {
                let d = u(3)?;
                let tok = self.read(p(1)?, 1)?[0] as u64;
                let row = self.read(p(0)? + tok * d as u64 * 4, d)?;
                self.write(p(2)?, &row)
            }
            // [x, kv, pos, dim]: kv[pos] = x
            "kv_store" => {
                let d = u(3)?;
                let pos = self.read(p(2)?, 1)?[0] as u64;
                let x = self.read(p(0)?, d)?;
                self.write(p(1)? + pos * d as u64 * 4, &x)
            }
            // [kv, pos, out, dim]: out = Σ_{j ≤ pos} kv[j] / (1 + pos - j)
            "attend" => {
                let d = u(3)?;
                let pos = self.read(p(1)?, 1)?[0] as usize;
                let kv = self.read(p(0)?, (pos + 1) * d)?;
                let out: Vec<f32> = (0..d).map(|i| (0..=pos).map(|j| kv[j * d + i] / (1 + pos - j) as f32).sum()).collect();
                self.write(p(2)?, &out)
            }
            // [a, b, out, n, s]: out = a + s·b
            "mix" => {
                let n = u(3)?;
                let s = match args.get(4) {
                    Some(KArg::F32(s)) => *s,
                    a => return Err(illegal(format!("mix: scale is {a:?}"))),
                };
                let (a, b) = (self.read(p(0)?, n)?, self.read(p(1)?, n)?);
                let out: Vec<f32> = a.iter().zip(&b).map(|(a, b)| a + s * b).collect();
                self.write(p(2)?, &out)
            }
            // [w, x, out, dim, vocab]: out = W·x
            "logits" => {
                let (d, v) = (u(3)?, u(4)?);
                let (w, x) = (self.read(p(0)?, d * v)?, self.read(p(1)?, d)?);
                let out: Vec<f32> = (0..v).map(|r| (0..d).map(|i| w[r * d + i] * x[i]).sum()).collect();
                self.write(p(2)?, &out)
            }
            // [x, n]: reads x, writes nothing
            "nop" => self.read(p(0)?, u(1)?).map(|_| ()),
            _ => Err(illegal(format!("unknown kernel {name}"))),
        }
    }
}

impl Executor for MemExec {
    fn issue(&self, e: &Entry) -> Result<(), DriverError> {
        self.count(|c| c.eager += 1);
        self.run(e)
    }
    fn instantiate(&self, record: &[Entry]) -> Result<RawHandle, DriverError> {
        let h = self.next_graph.get();
        self.next_graph.set(h + 1);
        self.graphs.borrow_mut().insert(h, record.to_vec());
        self.count(|c| c.instantiated += 1);
        Ok(h)
    }
    fn rebind(&self, exec: RawHandle, record: &[Entry]) -> Result<bool, DriverError> {
        let mut g = self.graphs.borrow_mut();
        let bound = g.get_mut(&exec).ok_or_else(|| illegal(format!("no instance {exec}")))?;
        if self.refuse_rebind.get() || !same_shape_steps(bound, record) {
            return Ok(false);
        }
        *bound = record.to_vec();
        self.count(|c| c.rebinds += 1);
        Ok(true)
    }
    fn launch(&self, exec: RawHandle) -> Result<(), DriverError> {
        let rec = self.graphs.borrow().get(&exec).cloned().ok_or_else(|| illegal(format!("launch of destroyed instance {exec}")))?;
        self.count(|c| c.launches += 1);
        rec.iter().try_for_each(|e| self.run(e))
    }
    fn destroy(&self, exec: RawHandle) {
        self.graphs.borrow_mut().remove(&exec);
        self.count(|c| c.destroyed += 1);
    }
    fn allocation(&self, p: DevPtr) -> Option<u64> {
        let r = self.regions.borrow();
        r.iter().find(|x| x.live && p >= x.base && p < x.base + (x.data.len() as u64 * 4).max(1)).map(|x| x.id)
    }
    fn is_live(&self, id: u64) -> bool {
        self.regions.borrow().iter().any(|x| x.id == id && x.live)
    }
}

fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        })
        .collect()
}

/// One sequence of a tiny decoder: embed → KV store → attend → mix → logits.
#[derive(Clone)]
pub struct Tiny {
    pub dim: u32,
    table: DevPtr,
    w: DevPtr,
    kv: DevPtr,
    kv_off: u64,
    ids: DevPtr,
    pos: DevPtr,
    h: DevPtr,
    a: DevPtr,
    y: DevPtr,
    logits: DevPtr,
    /// Add a no-op kernel at the end of the step (a step that leaves the record).
    pub extra: bool,
}

impl Tiny {
    pub fn new(x: &MemExec, ctx: usize) -> Tiny {
        Tiny::with_dim(x, ctx, DIM)
    }
    pub fn with_dim(x: &MemExec, ctx: usize, dim: u32) -> Tiny {
        let d = dim as usize;
        let v = VOCAB as usize;
        let table = x.alloc(v * d);
        x.write(table, &values(v * d, 1)).unwrap();
        let w = x.alloc(v * d);
        x.write(w, &values(v * d, 2)).unwrap();
        Tiny { dim, table, w, kv: x.alloc(ctx * d), kv_off: 0, ids: x.alloc(1), pos: x.alloc(1), h: x.alloc(d), a: x.alloc(d), y: x.alloc(d), logits: x.alloc(v), extra: false }
    }
    /// Another sequence: its own KV arena and staging slots, everything else shared.
    pub fn with_own_cache(&self, x: &MemExec, ctx: usize) -> Tiny {
        Tiny { kv: x.alloc(ctx * self.dim as usize), kv_off: 0, ids: x.alloc(1), pos: x.alloc(1), ..self.clone() }
    }

    /// The step's entries (positions and ids are read on the device, not arguments).
    pub fn record(&self, _pos: u32) -> Vec<Entry> {
        use KArg::{Ptr, F32, U32};
        let k = |name: &'static str, args: Vec<KArg>| Entry::Kernel { name, grid: [1, 1, 1], block: [32, 1, 1], args };
        let kv = self.kv + self.kv_off;
        let d = self.dim;
        let mut v = vec![
            k("embed", vec![Ptr(self.table), Ptr(self.ids), Ptr(self.h), U32(d)]),
            k("kv_store", vec![Ptr(self.h), Ptr(kv), Ptr(self.pos), U32(d)]),
            k("attend", vec![Ptr(kv), Ptr(self.pos), Ptr(self.a), U32(d)]),
            k("mix", vec![Ptr(self.h), Ptr(self.a), Ptr(self.y), U32(d), F32(0.5)]),
            k("logits", vec![Ptr(self.w), Ptr(self.y), Ptr(self.logits), U32(d), U32(VOCAB)]),
        ];
        if self.extra {
            v.push(k("nop", vec![Ptr(self.y), U32(d)]));
        }
        v
    }

    fn stage(&self, x: &MemExec, tok: u32, pos: u32) -> Result<(), DriverError> {
        x.write(self.ids, &[tok as f32])?;
        x.write(self.pos, &[pos as f32])
    }

    fn finish(&self, x: &MemExec, r: &mut Replay) -> Result<u32, DriverError> {
        r.end_step(x)?;
        let l = x.read(self.logits, VOCAB as usize)?;
        Ok((0..l.len()).max_by(|&i, &j| l[i].total_cmp(&l[j]).then(j.cmp(&i))).unwrap_or(0) as u32)
    }

    /// One decode step through `r`; the greedy next token.
    pub fn step(&self, x: &MemExec, r: &mut Replay, tok: u32, pos: u32) -> Result<u32, DriverError> {
        self.stage(x, tok, pos)?;
        for e in self.record(pos) {
            r.submit(x, e)?;
        }
        self.finish(x, r)
    }

    /// A step with work outside the record in its middle.
    pub fn step_with_barrier(&self, x: &MemExec, r: &mut Replay, tok: u32, pos: u32) -> Result<u32, DriverError> {
        self.stage(x, tok, pos)?;
        for (i, e) in self.record(pos).into_iter().enumerate() {
            if i == 2 {
                r.barrier(x)?;
            }
            r.submit(x, e)?;
        }
        self.finish(x, r)
    }

    /// Grow the KV arena as a backend does: allocate anew, move the contents, free the
    /// old arena (a free is a replay barrier).
    pub fn realloc_kv(&mut self, x: &MemExec, r: &mut Replay, ctx: usize) {
        r.barrier(x).unwrap();
        let d = self.dim as usize;
        let fresh = x.alloc(ctx * d);
        let keep = ctx.min(64);
        let old = x.read(self.kv + self.kv_off, keep * d).unwrap();
        x.write(fresh, &old).unwrap();
        x.free(self.kv);
        self.kv = fresh;
        self.kv_off = 0;
    }

    /// Move the sequence `by` positions further into the same arena (a mutable offset).
    pub fn move_kv_offset(&mut self, x: &MemExec, by: usize) {
        let d = self.dim as usize;
        let from = self.kv + self.kv_off;
        let old = x.read(from, by * d).unwrap();
        self.kv_off += (by * d * 4) as u64;
        x.write(self.kv + self.kv_off, &old).unwrap();
        // The old region is someone else's now: a stale binding reads garbage.
        x.write(from, &values(by * d, 99).iter().map(|v| v * 1e3).collect::<Vec<_>>()).unwrap();
    }
}
