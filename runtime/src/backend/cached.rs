//! [`CachedBackend`]: a backend whose weights come from a [`WeightCache`] over host memory
//! (`weights::host::HostMaterializer`): every weight the wrapped backend reads is routed
//! through the cache, which hands it the resident copy.
//!
//! On the CPU this is the `device` / `upload` residency (weights copied out of the
//! mapping into anonymous memory, as llama.cpp's `--no-mmap`); `mapped` serves the
//! mapping in place. It is also how the cache's invariants are tested end to end without
//! a GPU: the CPU kernels compute on the bytes the cache made resident, so wrong bytes
//! show up as different logits.

use std::sync::Arc;

use crate::backend::memory::MemoryTarget;
use crate::backend::{Attention, Backend, BackendError, Buf, DeltaIn, DeltaNet, DeltaState, Glu, KvCache, KvSpec, MoeBiases, MoeFfn, MoeScratch, Result, Rope};
use crate::gguf::{GgufFile, TensorView};
use crate::weights::host::HostMaterializer;
use crate::weights::layout::{self, DeviceClass};
use crate::weights::residency::Residency;
use crate::weights::{DeviceMemory, WeightCache, WeightOptions, WeightRef, WeightStats};

/// A backend whose weights come from a [`WeightCache`] over host memory.
///
/// With `--device-memory` ([`WeightOptions::device_memory`]) it is a device of that
/// capacity: it holds the weights (copies, and the mapping's in-place weights, which on
/// the CPU occupy memory too), the KV caches and the activation buffers, refuses what
/// would pass the capacity with an out-of-memory error (nothing allocated, the engine
/// usable after), and reports its figures as the engine's admission check reads them
/// ([`Backend::memory_target`]).
pub struct CachedBackend {
    inner: Box<dyn Backend>,
    cache: WeightCache<HostMaterializer>,
    /// The model file, kept alive while its mapping is registered.
    file: Option<Arc<GgufFile>>,
    /// The capacity, if any.
    capacity: Option<u64>,
    /// Bytes of the activation buffers and KV caches held, by handle.
    bufs: std::collections::HashMap<u32, u64>,
    kvs: std::collections::HashMap<u32, u64>,
    /// High-water mark of [`CachedBackend::used`].
    peak: u64,
}

impl CachedBackend {
    /// Wraps `inner`; `opts.residency` unset means `mapped` (host memory is unified).
    pub fn new(inner: Box<dyn Backend>, opts: &WeightOptions) -> std::result::Result<CachedBackend, String> {
        let residency = Residency::resolve(opts.residency, true)?;
        Ok(CachedBackend {
            inner,
            cache: WeightCache::new(HostMaterializer::new(), residency, opts),
            file: None,
            capacity: opts.device_memory,
            bufs: Default::default(),
            kvs: Default::default(),
            peak: 0,
        })
    }

    /// Bytes held: weights (copies and in place), KV caches, activation buffers.
    pub fn used(&self) -> u64 {
        weight_bytes(&self.cache) + self.held()
    }
    /// High-water mark of [`CachedBackend::used`].
    pub fn peak_used(&self) -> u64 {
        self.peak.max(self.used())
    }

    /// Refuse `bytes` more for `what` if they would pass the capacity.
    fn admit(&self, what: &'static str, bytes: u64) -> Result<()> {
        match self.capacity {
            Some(cap) if self.used().saturating_add(bytes) > cap => Err(BackendError::OutOfMemory { what, bytes }),
            _ => Ok(()),
        }
    }

    fn note_peak(&mut self) {
        self.peak = self.peak.max(self.used());
    }

    /// Under a capacity, the device's figures: everything it holds, not only weight copies.
    fn device_memory(&self) -> Option<DeviceMemory> {
        let cap = self.capacity?;
        Some(DeviceMemory {
            allocated_bytes: self.used(),
            peak_allocated_bytes: self.peak_used(),
            driver_used_bytes: Some(self.used()),
            driver_peak_used_bytes: Some(self.peak_used()),
            driver_samples: None,
            driver_total_bytes: Some(cap),
            device_memory_cap_bytes: Some(cap),
        })
    }

    /// Bytes of the KV caches and activation buffers held.
    fn held(&self) -> u64 {
        self.bufs.values().sum::<u64>() + self.kvs.values().sum::<u64>()
    }
    pub fn cache(&self) -> &WeightCache<HostMaterializer> {
        &self.cache
    }
    pub fn cache_mut(&mut self) -> &mut WeightCache<HostMaterializer> {
        &mut self.cache
    }
    pub fn inner(&self) -> &dyn Backend {
        self.inner.as_ref()
    }
}

/// Weight bytes the cache holds: copies and in-place weights.
fn weight_bytes(cache: &WeightCache<HostMaterializer>) -> u64 {
    let s = cache.stats();
    s.resident_bytes + s.mapped_bytes
}

/// [`resident`] under a capacity `cap` with `held` bytes of buffers and caches: a weight
/// not yet held must fit (else an out-of-memory error, nothing changed).
fn capped<'c, 'w: 'c>(cache: &'c mut WeightCache<HostMaterializer>, cap: Option<u64>, held: u64, peak: &mut u64, w: &WeightRef<'w>) -> Result<WeightRef<'c>> {
    if let Some(cap) = cap {
        let layout = layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), DeviceClass::Cpu);
        if cache.entry(w, layout).is_none() {
            // The whole tensor: an expert's view still makes the one copy of its 3-D tensor.
            let (used, bytes) = (weight_bytes(cache) + held, w.view.data.len() as u64);
            if used.saturating_add(bytes) > cap {
                return Err(crate::weights::WeightError::Alloc {
                    weight: w.name().into(),
                    layout: layout.name(w.ty()),
                    bytes,
                    msg: format!("out of memory: {used} of the device's {cap} bytes are held (--device-memory)"),
                    out_of_memory: true,
                }
                .into());
            }
            *peak = (*peak).max(used + bytes);
        }
    }
    resident(cache, w)
}

/// [`capped`] on a `CachedBackend`'s fields (disjoint borrows: the result borrows the cache only).
macro_rules! weight {
    ($s:ident, $w:expr) => {{
        let held = $s.held();
        capped(&mut $s.cache, $s.capacity, held, &mut $s.peak, $w)?
    }};
}

/// `w` with its bytes replaced by the cache's resident copy (or the mapping, in place):
/// the whole tensor's copy, of which an expert's `WeightRef` reads its own matrix.
fn resident<'c, 'w: 'c>(cache: &'c mut WeightCache<HostMaterializer>, w: &WeightRef<'w>) -> Result<WeightRef<'c>> {
    let layout = make_resident(cache, w)?;
    view_in(cache, w, layout)
}

/// Materializes `w` (on first use) in its canonical layout; returns that layout.
fn make_resident(cache: &mut WeightCache<HostMaterializer>, w: &WeightRef) -> Result<layout::Layout> {
    let layout = layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), DeviceClass::Cpu);
    cache.get(w, layout)?;
    Ok(layout)
}

/// `w` over its resident bytes (after [`make_resident`]).
fn view_in<'c, 'w: 'c>(cache: &'c WeightCache<HostMaterializer>, w: &WeightRef<'w>, layout: layout::Layout) -> Result<WeightRef<'c>> {
    let e = cache.entry(w, layout).ok_or_else(|| BackendError::Invalid { op: "weight", msg: format!("`{}` missing after materializing", w.name()) })?;
    let data = match &e.buf {
        Some(b) => b.bytes(),
        None => w.view.data,
    };
    Ok(WeightRef { id: w.id, view: TensorView { info: w.view.info, data, file_offset: w.view.file_offset }, matrix: w.matrix })
}

impl Backend for CachedBackend {
    fn name(&self) -> String {
        format!("{} (weights: {})", self.inner.name(), self.cache.residency())
    }
    fn round_rows_as_decode(&mut self, on: bool) {
        self.inner.round_rows_as_decode(on)
    }
    fn weight_stats(&self) -> Option<WeightStats> {
        let mut s = self.cache.stats();
        if self.capacity.is_some() {
            s.device = self.device_memory();
        }
        Some(s)
    }
    fn weight_types(&self) -> &'static [crate::quant::GgmlType] {
        self.inner.weight_types()
    }
    fn attach_weights(&mut self, file: &Arc<GgufFile>, weights: &[WeightRef]) -> Result<()> {
        match self.cache.residency() {
            Residency::Mapped => {
                // Host memory needs no registration: the "device address" is the host one.
                self.cache.set_mapping(file.bytes(), file.bytes().as_ptr() as u64);
                self.file = Some(file.clone());
            }
            Residency::Upload => {
                let ws = weights.iter().map(|w| (*w, layout::canonical(w.ty(), layout::consumer_for_dims(&w.view.info.dims), DeviceClass::Cpu)));
                self.cache.preload(ws)?;
            }
            Residency::Device => {}
        }
        Ok(())
    }
    fn memory_target(&self) -> Option<MemoryTarget> {
        let cap = self.capacity?;
        let used = self.used();
        Some(MemoryTarget {
            name: self.inner.name(),
            class: DeviceClass::Cpu,
            residency: self.cache.residency(),
            free: cap.saturating_sub(used),
            total: cap,
            used_at_open: used,
            arena: false,
            tuning: None,
            cap: Some(cap),
            host_expert_layers: 0,
        })
    }
    fn alloc(&mut self, len: usize) -> Result<Buf> {
        self.admit("activation buffer", len as u64 * 4)?;
        let b = self.inner.alloc(len)?;
        self.bufs.insert(b.0, len as u64 * 4);
        self.note_peak();
        Ok(b)
    }
    fn alloc_readback(&mut self, len: usize) -> Result<Buf> {
        self.admit("read-back buffer", len as u64 * 4)?;
        let b = self.inner.alloc_readback(len)?;
        self.bufs.insert(b.0, len as u64 * 4);
        self.note_peak();
        Ok(b)
    }
    fn free(&mut self, buf: Buf) -> Result<()> {
        self.inner.free(buf)?;
        self.bufs.remove(&buf.0);
        Ok(())
    }
    fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()> {
        self.inner.write(buf, src)
    }
    fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()> {
        self.inner.read(buf, dst)
    }
    fn read_with(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        self.inner.read_with(buf, n, host, f)
    }
    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        let bytes = spec.bytes();
        self.admit("KV cache", bytes)?;
        let kv = self.inner.alloc_kv(spec)?;
        self.kvs.insert(kv.0, bytes);
        self.note_peak();
        Ok(kv)
    }
    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.inner.free_kv(kv)?;
        self.kvs.remove(&kv.0);
        Ok(())
    }
    fn copy_kv(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        self.inner.copy_kv(src, dst, n)
    }
    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        let w = weight!(self, w);
        self.inner.get_rows(&w, ids, out)
    }
    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        let w = weight!(self, w);
        self.inner.matmul(&w, x, n_tok, y)
    }
    fn rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        let w = match w {
            Some(w) => Some(weight!(self, w)),
            None => None,
        };
        self.inner.rms_norm(x, out, n_rows, row_len, w.as_ref(), eps)
    }
    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        let freq_factors = match &rope.freq_factors {
            Some(f) => Some(weight!(self, f)),
            None => None,
        };
        let r = Rope { freq_factors, ..*rope };
        self.inner.rope(x, n_head, head_dim, pos, &r)
    }
    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        self.inner.add(a, b, out, n)
    }
    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        let b = weight!(self, bias);
        self.inner.add_bias(x, n_tok, &b)
    }
    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        self.inner.scale(x, n, s)
    }
    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        self.inner.glu(gate, up, out, n, act)
    }
    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
        self.inner.copy(src, src_off, dst, dst_off, n)
    }
    fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
        self.inner.kv_write(kv, layer, k, v, pos)
    }
    fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        // gpt-oss's sinks through the cache like any vector.
        let sinks = match &p.sinks {
            Some(w) => Some(weight!(self, w)),
            None => None,
        };
        self.inner.attention(q, kv, layer, pos, &Attention { sinks, ..*p }, out)
    }
    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
        // Each 3-D expert tensor through the cache whole (one region, one copy); the inner
        // backend reads its experts' matrices out of that copy.
        // With gpt-oss's biases: those four vectors too.
        let mut ws = vec![p.router, p.gate, p.up, p.down];
        if let Some(b) = &p.biases {
            ws.extend([b.router, b.gate, b.up, b.down]);
        }
        ws.extend(p.expert_scale);
        let mut layouts = Vec::with_capacity(ws.len());
        for &w in &ws {
            // Under `--device-memory`, refused before anything is made if it does not fit.
            if self.capacity.is_some() {
                let held = self.held();
                capped(&mut self.cache, self.capacity, held, &mut self.peak, w)?;
            }
            layouts.push(make_resident(&mut self.cache, w)?);
        }
        let c = &self.cache;
        let v = ws.iter().zip(&layouts).map(|(w, &l)| view_in(c, w, l)).collect::<Result<Vec<_>>>()?;
        let biases = p.biases.map(|_| MoeBiases { router: &v[4], gate: &v[5], up: &v[6], down: &v[7] });
        // gemma4's expert scales: the last one, when present.
        let expert_scale = p.expert_scale.map(|_| &v[v.len() - 1]);
        let r = MoeFfn { router: &v[0], gate: &v[1], up: &v[2], down: &v[3], biases, expert_scale, ..*p };
        self.inner.moe_ffn(x, n_tok, &r, out, tmp)
    }
    fn gated_delta_net(&mut self, p: &DeltaNet, x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> {
        // The four vectors through the cache (as moe_ffn's tensors), then read from it.
        let ws = [p.conv, p.dt_bias, p.a, p.norm];
        let mut layouts = Vec::with_capacity(4);
        for w in ws {
            if self.capacity.is_some() {
                let held = self.held();
                capped(&mut self.cache, self.capacity, held, &mut self.peak, w)?;
            }
            layouts.push(make_resident(&mut self.cache, w)?);
        }
        let c = &self.cache;
        let [conv, dt_bias, a, norm] = [0, 1, 2, 3].map(|i| view_in(c, ws[i], layouts[i]));
        let (conv, dt_bias, a, norm) = (conv?, dt_bias?, a?, norm?);
        let r = DeltaNet { conv: &conv, dt_bias: &dt_bias, a: &a, norm: &norm, ..*p };
        self.inner.gated_delta_net(&r, x, n_tok, states, out)
    }
    fn split_halves(&mut self, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
        self.inner.split_halves(src, n_rows, half, a, b)
    }
    fn mul_sigmoid(&mut self, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
        self.inner.mul_sigmoid(x, gate, n_rows, row_len, per_row)
    }
    fn copy_strided(&mut self, src: Buf, dst: Buf, s: &super::Strided) -> Result<()> {
        self.inner.copy_strided(src, dst, s)
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_rows(&mut self, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        let sinks = match &p.sinks {
            Some(w) => Some(weight!(self, w)),
            None => None,
        };
        self.inner.attention_rows(q, k, v, kvs, layer, pos, &Attention { sinks, ..*p }, out)
    }
}

impl Drop for CachedBackend {
    fn drop(&mut self) {
        // The memory report the cache prints as it drops shows this device's figures.
        let d = self.device_memory();
        if d.is_some() {
            self.cache.set_device_memory(d);
        }
    }
}
