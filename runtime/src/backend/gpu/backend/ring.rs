//! The GPU's KV caches, with window-sized layers (`SwaKv`, llama.cpp's default for
//! sliding-window layers; `--swa-full` opts out).
//!
//! A window-sized layer holds `slots` rows; position `p` is at row `p − base`. Kernels
//! take a cache address and index it by position, as in a full cache, so the address
//! they are given is the array's start moved back by `base` rows: they read and write
//! only positions in `base..base + slots` (the host checks it before each launch; a
//! flash attention tile starts at a multiple of 64 at or after `base`, `RING_ALIGN`), and
//! no kernel changes. When a write would pass the last row, the rows still visible to its
//! first query are copied to the front through the step record (device copies of at
//! most `base`-distance rows each, so none overlaps) and `base` advances.

use super::{derr, DeviceBuffer, DevPtr, Entry, GpuBackend};
use crate::backend::{BackendError, KvCache, KvSpec, Result};

pub(super) struct Kv {
    pub spec: KvSpec,
    /// Every layer's K and V in one allocation (one per array rounded each up to the
    /// driver's 2 MiB page: 126 MiB on Qwen3-4B at 2,176 tokens).
    _mem: DeviceBuffer,
    /// Per layer: K then V, each [slots, n_kv_head * head_dim] f16 or blocks, from its
    /// first held position.
    pub layers: Vec<(DevPtr, DevPtr)>,
    /// Per layer: the first held position (0 unless window-sized).
    pub base: Vec<usize>,
    /// When the cache was last written (the backend's tick): the last step's cache.
    pub stamp: u64,
}

/// Per layer the offsets of K and V in one allocation, and its size.
pub(super) fn layout(spec: &KvSpec) -> (Vec<(usize, usize)>, usize) {
    let (mut at, mut offs) = (0, Vec::with_capacity(spec.n_layer));
    for l in 0..spec.n_layer {
        let kb = (spec.slots(l) * spec.ty.k.bytes(spec.n_kv_head * spec.head_dim_k)).div_ceil(256) * 256;
        let vb = (spec.slots(l) * spec.ty.v.bytes(spec.n_kv_head * spec.head_dim_v)).div_ceil(256) * 256;
        offs.push((at, at + kb));
        at += kb + vb;
    }
    (offs, at)
}

impl Kv {
    pub fn new(spec: KvSpec, mem: DeviceBuffer) -> Kv {
        let layers = layout(&spec).0.iter().map(|&(k, v)| (mem.at(k), mem.at(v))).collect();
        Kv { spec, _mem: mem, layers, base: vec![0; spec.n_layer], stamp: 0 }
    }

    /// Bytes of one row of K and of V.
    fn rows(&self) -> (u64, u64) {
        let s = &self.spec;
        (s.ty.k.bytes(s.n_kv_head * s.head_dim_k) as u64, s.ty.v.bytes(s.n_kv_head * s.head_dim_v) as u64)
    }

    /// The addresses kernels index by position for `layer`.
    pub fn addrs(&self, layer: usize) -> Option<(DevPtr, DevPtr)> {
        let (k, v) = *self.layers.get(layer)?;
        let b = self.base[layer] as u64;
        let (rk, rv) = self.rows();
        Some((k.wrapping_sub(b * rk), v.wrapping_sub(b * rv)))
    }

    /// Whether a decode step at `p` needs no base move (a replayed step may run early).
    pub fn room_for(&self, p: usize) -> bool {
        (0..self.spec.n_layer).all(|l| self.spec.ring(l).is_none_or(|r| r.advance(self.base[l], p, p) == Ok(self.base[l])))
    }
}

impl GpuBackend {
    /// The K and V arrays of `layer` of `kv` as allocated (row 0: the first held position).
    pub(super) fn kv_arrays(&self, op: &'static str, kv: KvCache, layer: usize) -> Result<(DevPtr, DevPtr, KvSpec)> {
        let c = self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let (k, v) = c.layers.get(layer).ok_or(BackendError::Invalid { op, msg: format!("layer {layer} of {}", c.spec.n_layer) })?;
        Ok((*k, *v, c.spec))
    }

    /// Before `pos` is written to `layer` of `kv`: where the layer is window-sized, moves
    /// the rows still visible to the front when the write would pass its last row.
    pub(super) fn kv_room(&mut self, op: &'static str, kv: KvCache, layer: usize, pos: &[u32]) -> Result<()> {
        self.tick += 1;
        let tick = self.tick;
        let c = self.kvs.get_mut(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        c.stamp = tick;
        let (Some(ring), Some(&min), Some(&max)) = (c.spec.ring(layer), pos.iter().min(), pos.iter().max()) else { return Ok(()) };
        let old = c.base[layer];
        let new = ring.advance(old, min as usize, max as usize).map_err(|msg| BackendError::Invalid { op, msg })?;
        if new == old {
            return Ok(());
        }
        c.base[layer] = new;
        if new < old {
            return Ok(()); // the sequence starts again: nothing is kept
        }
        let (dist, keep) = (new - old, (min as usize).saturating_sub(new).min(ring.slots.saturating_sub(new - old)));
        let (rk, rv) = c.rows();
        let (k, v) = c.layers[layer];
        let mut copies = Vec::new();
        let mut i = 0;
        while i < keep {
            let n = dist.min(keep - i) as u64;
            for (a, r) in [(k, rk), (v, rv)] {
                copies.push(Entry::Copy { dst: a + i as u64 * r, src: a + (i + dist) as u64 * r, bytes: (n * r) as usize });
            }
            i += dist;
        }
        for e in copies {
            self.replay.get_mut().submit(&self.dev, e).map_err(derr(op))?;
        }
        Ok(())
    }

    /// Before attention over `layer` of `kv` at `pos`: every key the queries see is held.
    pub(super) fn kv_visible(&self, op: &'static str, kv: KvCache, layer: usize, pos: &[u32], window: Option<usize>) -> Result<()> {
        let c = self.kvs.get(&kv.0).ok_or(BackendError::BadKvHandle(kv))?;
        let Some(ring) = c.spec.ring(layer) else { return Ok(()) };
        let base = c.base[layer];
        if window != Some(ring.window) {
            return Err(BackendError::Invalid { op, msg: format!("layer {layer}: window {window:?} on a cache made for window {}", ring.window) });
        }
        match pos.iter().find(|&&p| ring.first_visible(p as usize) < base || p as usize >= base + ring.slots) {
            Some(p) => Err(BackendError::Invalid {
                op,
                msg: format!("layer {layer}: position {p} is outside the window-sized cache (positions {base}..{})", base + ring.slots),
            }),
            None => Ok(()),
        }
    }

    /// Whether the cache written last has room for a decode step at `p` without a base
    /// move (a step replayed before its ops are seen must not write past a layer's rows).
    pub(super) fn ring_room(&self, p: u32) -> bool {
        self.kvs.values().max_by_key(|c| c.stamp).is_none_or(|c| c.room_for(p as usize))
    }

    /// `Backend::copy_kv`: positions `0..n` of `src` into `dst` (same spec); a
    /// window-sized layer copies the rows it holds of them and takes the source's base.
    pub(super) fn copy_kv_rows(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        let (s, d) = (self.kvs.get(&src.0).ok_or(BackendError::BadKvHandle(src))?, self.kvs.get(&dst.0).ok_or(BackendError::BadKvHandle(dst))?);
        if s.spec != d.spec || n > s.spec.n_ctx {
            return Err(BackendError::Invalid { op: "copy_kv", msg: format!("{n} slots from {:?} to {:?}", s.spec, d.spec) });
        }
        let spec = s.spec;
        if let Some(l) = (0..spec.n_layer).find(|&l| spec.ring(l).is_some_and(|r| r.first_visible(n) < s.base[l])) {
            let msg = format!("a prefix of {n} tokens: the window-sized layer {l} holds positions from {} only", s.base[l]);
            return Err(BackendError::Invalid { op: "copy_kv", msg });
        }
        let (rk, rv) = s.rows();
        let mut work = Vec::new();
        for l in 0..spec.n_layer {
            // Each layer's K and V are slot-major rows (f16 or whole blocks): a prefix is contiguous.
            let m = n.saturating_sub(s.base[l]).min(spec.slots(l)) as u64;
            let ((sk, sv), (dk, dv)) = (s.layers[l], d.layers[l]);
            work.push((dk, sk, (m * rk) as usize));
            work.push((dv, sv, (m * rv) as usize));
        }
        let base = s.base.clone();
        for (to, from, bytes) in work {
            self.dev.copy(to, from, bytes).map_err(derr("copy_kv"))?;
        }
        if let Some(d) = self.kvs.get_mut(&dst.0) {
            d.base = base;
        }
        Ok(())
    }
}
