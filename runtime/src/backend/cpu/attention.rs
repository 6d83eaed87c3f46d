//! KV cache storage and attention over it, on the CPU.
//!
//! Layout per layer: an f16/f32 K is stored transposed, `[n_kv_head, head_dim_k, n_ctx]`,
//! so the scores of consecutive keys are computed side by side in SIMD lanes (see
//! `attn_kernels`); V, and a quantized K, are slot-major, `[n_ctx, n_kv_head * head_dim]`
//! (a quantized row as GGUF blocks), slot = position. Every path rounds as the llama.cpp
//! CPU path it corresponds to ([`Mode`]): an f16 cache as its default flash attention, an
//! f32 cache as its precise variant without it, a quantized K or V as its flash
//! attention's one-pass kernel (`attn_quant`), so each of our runs is comparable with
//! one of llama.cpp's.

use half::f16;

use super::attn_ggml;
use super::attn_kernels::{self as kern, KeysT, Rows};
use super::attn_quant::{self, QRows};
use crate::backend::{Attention, BackendError, KvSpec, KvType, KvTypes, Result};
use crate::quant::{par_chunks, GgmlType, Parallel};

/// Query rows from which llama.cpp's CPU flash attention switches to its tiled kernel.
pub const TILED_MIN_ROWS: usize = 64;

/// Which of llama.cpp's CPU attention paths a call mirrors (its default pairs flash
/// attention with an f16 cache; its precise variant an f32 cache without it).
#[derive(Clone, Copy)]
enum Mode {
    /// Flash attention, fewer than [`TILED_MIN_ROWS`] rows: Q rounded to f16, scores as
    /// `ggml_vec_dot_f16`, online softmax with an f16 V accumulator.
    FlashRows,
    /// Flash attention's tiled kernel: see [`attn_ggml::tiled`].
    FlashTiled,
    /// `K·Q` as `ggml_vec_dot_f32`, softmax and `p·V` as [`attn_ggml::no_fa`] (16 lanes
    /// for a prompt's matrix product, 64 for one row's dot product).
    Plain { lanes_v: usize },
    /// A quantized K or V: flash attention's one pass per query row, at any batch size
    /// and depth (see [`attn_quant`]).
    OnePass,
}

impl Mode {
    fn of(ty: KvTypes, rows: usize) -> Mode {
        if ty.any_quantized() {
            return Mode::OnePass;
        }
        match ty.k {
            KvType::F16 if rows < TILED_MIN_ROWS => Mode::FlashRows,
            KvType::F16 => Mode::FlashTiled,
            _ => Mode::Plain { lanes_v: if rows > 1 { 16 } else { 64 } },
        }
    }
}

/// One layer's K or V.
pub enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    /// GGUF blocks, slot-major: slot `p` at `p * row_bytes`.
    Q { ty: GgmlType, row_bytes: usize, data: Vec<u8> },
}

impl KvData {
    /// `n_ctx` slots of `width` values.
    fn zeros(ty: KvType, n_ctx: usize, width: usize) -> Result<KvData> {
        let n = n_ctx * width;
        let bytes = ty.bytes(width) as u64 * n_ctx as u64;
        let oom = || BackendError::OutOfMemory { what: "KV cache", bytes };
        fn filled<T: Clone>(n: usize, x: T, oom: impl Fn() -> BackendError) -> Result<Vec<T>> {
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| oom())?;
            v.resize(n, x);
            Ok(v)
        }
        Ok(match ty {
            KvType::F32 => KvData::F32(filled(n, 0.0, oom)?),
            KvType::F16 => KvData::F16(filled(n, f16::ZERO, oom)?),
            KvType::Q8_0 | KvType::Q4_0 => {
                let row_bytes = ty.bytes(width);
                KvData::Q { ty: ty.ggml(), row_bytes, data: filled(n_ctx * row_bytes, 0u8, oom)? }
            }
        })
    }

    /// Slot `p`'s row `src`: down column `p` of a transposed plane (`n_ctx` slots per
    /// row), else at row `p`.
    fn put(&mut self, p: usize, n_ctx: usize, transposed: bool, src: &[f32]) -> Result<()> {
        let (at, step) = if transposed { (p, n_ctx) } else { (p * src.len(), 1) };
        match self {
            KvData::F32(d) => src.iter().enumerate().for_each(|(i, &x)| d[at + i * step] = x),
            KvData::F16(d) => src.iter().enumerate().for_each(|(i, &x)| d[at + i * step] = f16::from_f32(x)),
            KvData::Q { ty, row_bytes, data } => {
                crate::quant::quantize(*ty, src, &mut data[p * *row_bytes..][..*row_bytes])
                    .map_err(|e| invalid(format!("KV store: {e}")))?;
            }
        }
        Ok(())
    }

    fn keys(&self) -> Option<KeysT<'_>> {
        match self {
            KvData::F32(d) => Some(KeysT::F32(d)),
            KvData::F16(d) => Some(KeysT::F16(d)),
            KvData::Q { .. } => None,
        }
    }

    fn rows(&self) -> Option<Rows<'_>> {
        match self {
            KvData::F32(d) => Some(Rows::F32(d)),
            KvData::F16(d) => Some(Rows::F16(d)),
            KvData::Q { .. } => None,
        }
    }

    fn qrows(&self) -> Option<QRows<'_>> {
        match self {
            KvData::Q { ty, row_bytes, data } => Some(QRows { ty: *ty, row_bytes: *row_bytes, data }),
            _ => None,
        }
    }

    /// Moves slots `from..from + n` to `0..n` (a plane of `slots` slots of `width`
    /// values; a transposed plane has `width` rows of `slots` slots).
    fn shift(&mut self, from: usize, n: usize, slots: usize, width: usize, transposed: bool) {
        fn part<T: Copy>(d: &mut [T], from: usize, n: usize, slots: usize, rows: usize, transposed: bool) {
            if transposed {
                for r in 0..rows {
                    d.copy_within(r * slots + from..r * slots + from + n, r * slots);
                }
            } else {
                d.copy_within(from * rows..(from + n) * rows, 0);
            }
        }
        if n == 0 {
            return;
        }
        match self {
            KvData::F32(d) => part(d, from, n, slots, width, transposed),
            KvData::F16(d) => part(d, from, n, slots, width, transposed),
            KvData::Q { row_bytes, data, .. } => part(data, from, n, slots, *row_bytes, false),
        }
    }

    /// Copies slots `0..n` from `src` (same type and shape); a transposed plane has
    /// `rows` rows of `n_ctx` slots.
    fn copy_slots(&mut self, src: &KvData, n: usize, n_ctx: usize, rows: usize, transposed: bool) {
        fn part<T: Copy>(d: &mut [T], s: &[T], n: usize, n_ctx: usize, rows: usize, transposed: bool) {
            if transposed {
                for r in 0..rows {
                    d[r * n_ctx..r * n_ctx + n].copy_from_slice(&s[r * n_ctx..r * n_ctx + n]);
                }
            } else {
                d[..n * rows].copy_from_slice(&s[..n * rows]);
            }
        }
        match (self, src) {
            (KvData::F32(d), KvData::F32(s)) => part(d, s, n, n_ctx, rows, transposed),
            (KvData::F16(d), KvData::F16(s)) => part(d, s, n, n_ctx, rows, transposed),
            (KvData::Q { row_bytes, data: d, .. }, KvData::Q { data: s, .. }) => part(d, s, n, n_ctx, *row_bytes, false),
            _ => unreachable!("one spec, one element type"),
        }
    }
}

/// A whole KV cache.
pub struct Kv {
    pub spec: KvSpec,
    k: Vec<KvData>,
    v: Vec<KvData>,
    /// Per layer, the oldest position it holds (slot = position − base; 0 unless the
    /// layer is window-sized, see [`crate::backend::SwaKv`]).
    base: Vec<usize>,
}

impl Kv {
    pub fn new(spec: KvSpec) -> Result<Kv> {
        if let Some(why) = spec.ty.unsupported(spec.head_dim_k, spec.head_dim_v) {
            return Err(BackendError::Invalid { op: "alloc_kv", msg: why });
        }
        if let Some(why) = spec.alt.and_then(|a| spec.ty.unsupported(a.head_dim_k, a.head_dim_v)) {
            return Err(BackendError::Invalid { op: "alloc_kv", msg: why });
        }
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for l in 0..spec.n_layer {
            // Each layer's rows are its own heads' width (gemma4: two kinds of layer).
            let (n, dk, dv) = spec.heads(l);
            k.push(KvData::zeros(spec.ty.k, spec.slots(l), n * dk)?);
            v.push(KvData::zeros(spec.ty.v, spec.slots(l), n * dv)?);
        }
        Ok(Kv { spec, k, v, base: vec![0; spec.n_layer] })
    }

    /// Layer `layer`'s oldest held position.
    #[cfg(test)]
    pub fn base(&self, layer: usize) -> usize {
        self.base.get(layer).copied().unwrap_or(0)
    }

    /// Before positions `min..=max` are written to a window-sized layer: moves the rows
    /// still visible to the front when the write would pass the last slot.
    fn make_room(&mut self, layer: usize, min: usize, max: usize) -> Result<()> {
        let Some(ring) = self.spec.ring(layer) else { return Ok(()) };
        let old = self.base[layer];
        let new = ring.advance(old, min, max).map_err(invalid)?;
        self.base[layer] = new;
        if new <= old {
            return Ok(()); // unchanged, or the sequence starts again (nothing is kept)
        }
        let s = self.spec;
        let (n, dk, dv) = s.heads(layer);
        let (wk, wv) = (n * dk, n * dv);
        let kt = self.k_transposed();
        // Rows new..min are read again (at most the window); older ones are dropped.
        let keep = min.saturating_sub(new).min(ring.slots - (new - old).min(ring.slots));
        self.k[layer].shift(new - old, keep, ring.slots, wk, kt);
        self.v[layer].shift(new - old, keep, ring.slots, wv, false);
        Ok(())
    }

    /// Whether K is stored transposed (f16 / f32) rather than slot-major (quantized).
    fn k_transposed(&self) -> bool {
        !self.spec.ty.k.is_quantized()
    }

    /// Copies positions `0..n` of `src` (same spec) into this cache; a window-sized
    /// layer copies what it holds of them, and takes the source's base.
    pub fn copy_from(&mut self, src: &Kv, n: usize) -> Result<()> {
        let s = self.spec;
        if src.spec != s || n > s.n_ctx {
            return Err(invalid(format!("copy of {n} slots between caches {:?} and {s:?}", src.spec)));
        }
        if let Some(ring) = s.swa {
            if let Some(l) = (0..s.n_layer).find(|&l| ring.is_windowed(l) && ring.first_visible(n) < src.base[l]) {
                return Err(invalid(format!(
                    "a prefix of {n} tokens: the window-sized layer {l} holds positions from {} only",
                    src.base[l]
                )));
            }
        }
        let kt = self.k_transposed();
        for l in 0..s.n_layer {
            let (nh, dk, dv) = s.heads(l);
            let (wk, wv) = (nh * dk, nh * dv);
            let (slots, b) = (s.slots(l), src.base[l]);
            let m = n.saturating_sub(b).min(slots);
            self.k[l].copy_slots(&src.k[l], m, slots, wk, kt);
            self.v[l].copy_slots(&src.v[l], m, slots, wv, false);
            self.base[l] = b;
        }
        Ok(())
    }

    /// Stores `k` `[n_tok, kv_k]` and `v` `[n_tok, kv_v]` at slots `pos`.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], pos: &[u32]) -> Result<()> {
        let s = self.spec;
        let (nkv, dk, dv) = s.heads(layer);
        let (wk, wv) = (nkv * dk, nkv * dv);
        if layer >= s.n_layer || k.len() < pos.len() * wk || v.len() < pos.len() * wv {
            return Err(invalid(format!(
                "layer {layer} of {}, {} tokens: K/V buffers too small",
                s.n_layer,
                pos.len()
            )));
        }
        if let Some(&bad) = pos.iter().find(|&&p| p as usize >= s.n_ctx) {
            return Err(invalid(format!("position {bad} outside the cache ({} slots)", s.n_ctx)));
        }
        if let (Some(&lo), Some(&hi)) = (pos.iter().min(), pos.iter().max()) {
            self.make_room(layer, lo as usize, hi as usize)?;
        }
        let (base, slots) = (self.base[layer], s.slots(layer));
        for (t, &p) in pos.iter().enumerate() {
            let at = p as usize - base;
            // K row (all heads: [n_kv_head * head_dim_k]) goes down column `at` (f16/f32).
            let kt = self.k_transposed();
            self.k[layer].put(at, slots, kt, &k[t * wk..(t + 1) * wk])?;
            self.v[layer].put(at, slots, false, &v[t * wv..(t + 1) * wv])?;
        }
        Ok(())
    }

    /// Causal (optionally windowed) GQA attention; `out` `[pos.len(), n_head*head_dim_v]`.
    pub fn attend(&self, par: &dyn Parallel, layer: usize, q: &[f32], pos: &[u32], p: &Attention, out: &mut [f32]) -> Result<()> {
        self.attend_as(par, layer, q, pos, p, out, pos.len())
    }

    /// [`Self::attend`] with every query row rounded as a one-row (decode) call rounds
    /// it: a speculative verify chunk.
    pub fn attend_rowwise(&self, par: &dyn Parallel, layer: usize, q: &[f32], pos: &[u32], p: &Attention, out: &mut [f32]) -> Result<()> {
        self.attend_as(par, layer, q, pos, p, out, 1)
    }

    /// `rows`: the query count whose rounding the call follows (`pos.len()`, or 1).
    #[allow(clippy::too_many_arguments)]
    fn attend_as(
        &self,
        par: &dyn Parallel,
        layer: usize,
        q: &[f32],
        pos: &[u32],
        p: &Attention,
        out: &mut [f32],
        rows: usize,
    ) -> Result<()> {
        let s = self.spec;
        let (dk, dv) = (p.head_dim_k, p.head_dim_v);
        if layer >= s.n_layer
            || (p.n_kv_head, dk, dv) != s.heads(layer)
            || p.n_head % p.n_kv_head.max(1) != 0
            || q.len() < pos.len() * p.n_head * dk
            || out.len() < pos.len() * p.n_head * dv
        {
            return Err(invalid(format!(
                "layer {layer}: attention shape {p:?} does not fit the cache {s:?} / buffers"
            )));
        }
        if let Some(&bad) = pos.iter().find(|&&x| x as usize >= s.n_ctx) {
            return Err(invalid(format!("position {bad} outside the cache ({} slots)", s.n_ctx)));
        }
        // A window-sized layer: every key a query sees must still be held (slot = key − base).
        let (base, n_ctx) = (self.base[layer], s.slots(layer));
        if let Some(ring) = s.ring(layer) {
            if p.window != Some(ring.window) {
                return Err(invalid(format!("layer {layer}: window {:?} on a cache made for window {}", p.window, ring.window)));
            }
            if let Some(&bad) = pos.iter().find(|&&x| ring.first_visible(x as usize) < base || x as usize >= base + n_ctx) {
                return Err(invalid(format!("layer {layer}: position {bad} is outside the window-sized cache (positions {base}..{})", base + n_ctx)));
            }
        }
        let group = p.n_head / p.n_kv_head;
        let wv = p.n_kv_head * dv;
        let (kd, vd) = (&self.k[layer], &self.v[layer]);
        let mode = Mode::of(s.ty, rows);
        let sinks = match &p.sinks {
            Some(w) => {
                let mut v = vec![0f32; w.row_len() * w.n_rows()];
                crate::quant::dequantize(w.ty(), w.data(), &mut v).map_err(|e| invalid(format!("`{}`: {e}", w.name())))?;
                if v.len() != p.n_head {
                    return Err(invalid(format!("`{}` has {} values for {} heads", w.name(), v.len(), p.n_head)));
                }
                Some(v)
            }
            None => None,
        };
        // Query rows (token, head) per task: one each for decode, a few dozen for a
        // prompt so the scratch vectors below are made once per task, not per row.
        let n_rows = pos.len() * p.n_head;
        let per = (n_rows / (8 * par.threads().max(1))).clamp(1, 64);
        par_chunks(par, &mut out[..n_rows * dv], per * dv, &|task, os| {
            let (mut qh, mut scores, mut row, mut acc) = (vec![0.0f32; dk], Vec::new(), vec![0.0f32; dv], Vec::new());
            let mut q8 = Vec::new();
            for (r, o) in os.chunks_exact_mut(dv).enumerate() {
                let i = task * per + r;
                let (t, h) = (i / p.n_head, i % p.n_head);
                let kvh = h / group;
                let pq = pos[t] as usize;
                let lo = match p.window {
                    Some(w) => (pq + 1).saturating_sub(w),
                    None => 0,
                };
                // The first visible key's slot (the kernels address slots; the split path
                // below cuts keys by position, as with a full cache).
                let la = lo - base;
                qh.copy_from_slice(&q[(t * p.n_head + h) * dk..][..dk]);
                // This head's transposed K: element (d, key) at d * n_ctx + key.
                let kh = kd.keys().map(|kc| match kc {
                    KeysT::F32(d) => KeysT::F32(&d[kvh * dk * n_ctx..(kvh + 1) * dk * n_ctx]),
                    KeysT::F16(d) => KeysT::F16(&d[kvh * dk * n_ctx..(kvh + 1) * dk * n_ctx]),
                });
                scores.clear();
                scores.resize(pq + 1 - lo, 0.0);
                let voff = kvh * dv;
                let sink = sinks.as_ref().map(|v| v[h]);
                if let Mode::OnePass = mode {
                    match (kh, kd.qrows()) {
                        (Some(kh), _) => {
                            qh.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                            kern::scores_tree(&qh, kh, n_ctx, la, p.scale, 64, &mut scores);
                        }
                        (None, Some(kq)) => attn_quant::scores(&qh, kq, kvh, la, p.scale, &mut q8, &mut scores),
                        (None, None) => unreachable!("a K plane is floats or blocks"),
                    }
                    let keep = sink.map(|sk| sink_keep(&scores, sk));
                    match (vd.rows(), vd.qrows()) {
                        (Some(vc), _) => kern::online_f16(&scores, vc, wv, voff, la, &mut row, o),
                        (None, Some(vq)) => attn_quant::online_f32(&scores, vq, kvh, la, &mut row, o),
                        (None, None) => unreachable!("a V plane is floats or blocks"),
                    }
                    apply_keep(o, keep);
                    continue;
                }
                let (kh, vc) = (kh.expect("float K"), vd.rows().expect("float V"));
                match mode {
                    Mode::OnePass => unreachable!("handled above"),
                    Mode::FlashRows => {
                        qh.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                        kern::scores_tree(&qh, kh, n_ctx, la, p.scale, 64, &mut scores);
                        let keep = sink.map(|sk| sink_keep(&scores, sk));
                        match split_keys(rows, pq, par.threads()) {
                            Some(chunk) => split_rows(&scores, vc, wv, voff, lo, base, chunk, &mut row, &mut acc, o),
                            None => kern::online_f16(&scores, vc, wv, voff, la, &mut row, o),
                        }
                        apply_keep(o, keep);
                    }
                    Mode::FlashTiled => {
                        kern::scores(&qh, kh, n_ctx, la, p.scale, &mut scores);
                        let keep = sink.map(|sk| sink_keep(&scores, sk));
                        attn_ggml::tiled(&scores, vc, wv, voff, la, &mut row, o);
                        apply_keep(o, keep);
                    }
                    Mode::Plain { lanes_v } => {
                        kern::scores_tree(&qh, kh, n_ctx, la, p.scale, 64, &mut scores);
                        let keep = sink.map(|sk| sink_keep(&scores, sk));
                        attn_ggml::no_fa(&mut scores, vc, wv, voff, la, lanes_v, &mut acc, &mut row, o);
                        apply_keep(o, keep);
                    }
                }
            }
        });
        Ok(())
    }
}

/// The share of a row's softmax its keys keep beside an attention sink `sink` (one more
/// logit in the denominator, with no value): `S / (S + e^(sink − M))`, `M` the scores'
/// maximum and `S = Σ e^(score − M)`. The normalised output times this is the output
/// with the sink, as llama.cpp's softmax and flash attention compute it.
fn sink_keep(scores: &[f32], sink: f32) -> f32 {
    let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return 0.0;
    }
    let s: f32 = scores.iter().map(|&x| (x - m).exp()).sum();
    s / (s + (sink - m).exp())
}

fn apply_keep(o: &mut [f32], keep: Option<f32>) {
    if let Some(f) = keep {
        o.iter_mut().for_each(|x| *x *= f);
    }
}

/// KV length llama.cpp attends over: the used cells padded to 256.
const KV_PAD: usize = 256;

/// For one query row (decode) whose padded KV length is ≥ 512, llama.cpp's flash
/// attention splits the keys into `threads` equal chunks (one per thread) and merges the
/// chunks' partial softmaxes; `Some(chunk length)` then. The rounding depends on the
/// thread count, as there.
fn split_keys(rows: usize, pq: usize, threads: usize) -> Option<usize> {
    let n_kv = (pq + 1).div_ceil(KV_PAD) * KV_PAD;
    (rows == 1 && n_kv >= 512).then(|| n_kv.div_ceil(threads.max(1)))
}

/// The split path's row (keys `lo..`, at slot `key − base`): per chunk of keys the online softmax with its f16 accumulator
/// (undivided), merged chunk by chunk as `v = fma(v, e^(M−M'), v_c·e^(M_c−M'))` (and the
/// same for the sums), divided at the end.
#[allow(clippy::too_many_arguments)]
fn split_rows(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, base: usize, chunk: usize, row: &mut [f32], part: &mut Vec<f32>, out: &mut [f32]) {
    let hi = lo + scores.len();
    let dv = out.len();
    part.clear();
    part.resize(dv, 0.0);
    out.fill(0.0);
    let (mut m, mut s) = (f32::NEG_INFINITY, 0.0f32);
    let mut c0 = 0;
    while c0 < hi {
        let (a, b) = (c0.max(lo), (c0 + chunk).min(hi));
        c0 += chunk;
        if a >= b {
            continue;
        }
        let (mc, sc) = kern::online_f16_part(&scores[a - lo..b - lo], v, stride, off, a - base, row, part);
        if sc == 0.0 {
            continue;
        }
        let m_new = m.max(mc);
        let (so, sn) = ((m - m_new).exp(), (mc - m_new).exp());
        out.iter_mut().zip(part.iter()).for_each(|(o, &p)| *o = o.mul_add(so, p * sn));
        s = s.mul_add(so, sc * sn);
        m = m_new;
    }
    let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
    out.iter_mut().for_each(|o| *o *= inv);
}

fn invalid(msg: String) -> BackendError {
    BackendError::Invalid { op: "attention", msg }
}

#[cfg(test)]
#[path = "attention_tests.rs"]
mod tests;
