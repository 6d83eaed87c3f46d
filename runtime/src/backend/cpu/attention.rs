//! KV cache storage and attention over it, on the CPU.
//!
//! Layout per layer: K is stored transposed, `[n_kv_head, head_dim_k, n_ctx]`, so the
//! scores of consecutive keys are computed side by side in SIMD lanes (see
//! `attn_kernels`); V is `[n_ctx, n_kv_head * head_dim_v]`, slot = position. Every path
//! rounds as the llama.cpp CPU path it corresponds to ([`Mode`]): an f16 cache as its
//! default flash attention, an f32 cache as its precise variant without it, so each of
//! our runs is comparable with one of its fixtures.

use half::f16;

use super::attn_ggml;
use super::attn_kernels::{self as kern, KeysT, Rows};
use crate::backend::{Attention, BackendError, KvSpec, KvType, Result};
use crate::quant::{par_chunks, Parallel};

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
}

impl Mode {
    fn of(ty: KvType, rows: usize) -> Mode {
        match ty {
            KvType::F16 if rows < TILED_MIN_ROWS => Mode::FlashRows,
            KvType::F16 => Mode::FlashTiled,
            KvType::F32 => Mode::Plain { lanes_v: if rows > 1 { 16 } else { 64 } },
        }
    }
}

/// One layer's K or V.
pub enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl KvData {
    fn zeros(ty: KvType, n: usize) -> Result<KvData> {
        let bytes = n as u64 * if ty == KvType::F16 { 2 } else { 4 };
        let oom = || BackendError::OutOfMemory { what: "KV cache", bytes };
        Ok(match ty {
            KvType::F32 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, 0.0);
                KvData::F32(v)
            }
            KvType::F16 => {
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| oom())?;
                v.resize(n, f16::ZERO);
                KvData::F16(v)
            }
        })
    }

    /// `src[i]` to element `at + i * step`.
    fn store(&mut self, at: usize, step: usize, src: &[f32]) {
        match self {
            KvData::F32(d) => src.iter().enumerate().for_each(|(i, &x)| d[at + i * step] = x),
            KvData::F16(d) => src.iter().enumerate().for_each(|(i, &x)| d[at + i * step] = f16::from_f32(x)),
        }
    }

    fn keys(&self) -> KeysT<'_> {
        match self {
            KvData::F32(d) => KeysT::F32(d),
            KvData::F16(d) => KeysT::F16(d),
        }
    }

    fn rows(&self) -> Rows<'_> {
        match self {
            KvData::F32(d) => Rows::F32(d),
            KvData::F16(d) => Rows::F16(d),
        }
    }
}

/// A whole KV cache.
pub struct Kv {
    pub spec: KvSpec,
    k: Vec<KvData>,
    v: Vec<KvData>,
}

impl Kv {
    pub fn new(spec: KvSpec) -> Result<Kv> {
        let (mut k, mut v) = (Vec::new(), Vec::new());
        for _ in 0..spec.n_layer {
            k.push(KvData::zeros(spec.ty, spec.n_ctx * spec.n_kv_head * spec.head_dim_k)?);
            v.push(KvData::zeros(spec.ty, spec.n_ctx * spec.n_kv_head * spec.head_dim_v)?);
        }
        Ok(Kv { spec, k, v })
    }

    /// Copies slots `0..n` of `src` (same spec) into this cache.
    pub fn copy_from(&mut self, src: &Kv, n: usize) -> Result<()> {
        let s = self.spec;
        if src.spec != s || n > s.n_ctx {
            return Err(invalid(format!("copy of {n} slots between caches {:?} and {s:?}", src.spec)));
        }
        fn part(d: &mut KvData, s: &KvData, range: std::ops::Range<usize>) {
            match (d, s) {
                (KvData::F32(d), KvData::F32(s)) => d[range.clone()].copy_from_slice(&s[range]),
                (KvData::F16(d), KvData::F16(s)) => d[range.clone()].copy_from_slice(&s[range]),
                _ => unreachable!("one spec, one element type"),
            }
        }
        let (wk, wv) = (s.n_kv_head * s.head_dim_k, s.n_kv_head * s.head_dim_v);
        for l in 0..s.n_layer {
            // K is transposed: each of its `wk` rows holds `n_ctx` slots.
            for r in 0..wk {
                part(&mut self.k[l], &src.k[l], r * s.n_ctx..r * s.n_ctx + n);
            }
            part(&mut self.v[l], &src.v[l], 0..n * wv);
        }
        Ok(())
    }

    /// Stores `k` `[n_tok, kv_k]` and `v` `[n_tok, kv_v]` at slots `pos`.
    pub fn write(&mut self, layer: usize, k: &[f32], v: &[f32], pos: &[u32]) -> Result<()> {
        let s = self.spec;
        let (wk, wv) = (s.n_kv_head * s.head_dim_k, s.n_kv_head * s.head_dim_v);
        if layer >= s.n_layer || k.len() < pos.len() * wk || v.len() < pos.len() * wv {
            return Err(invalid(format!(
                "layer {layer} of {}, {} tokens: K/V buffers too small",
                s.n_layer,
                pos.len()
            )));
        }
        for (t, &p) in pos.iter().enumerate() {
            let p = p as usize;
            if p >= s.n_ctx {
                return Err(invalid(format!("position {p} outside the cache ({} slots)", s.n_ctx)));
            }
            // K row (all heads: [n_kv_head * head_dim_k]) goes down column `p`.
            self.k[layer].store(p, s.n_ctx, &k[t * wk..(t + 1) * wk]);
            self.v[layer].store(p * wv, 1, &v[t * wv..(t + 1) * wv]);
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
            || dk != s.head_dim_k
            || dv != s.head_dim_v
            || p.n_kv_head != s.n_kv_head
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
        let group = p.n_head / p.n_kv_head;
        let (n_ctx, wv) = (s.n_ctx, s.n_kv_head * dv);
        let (kc, vc) = (self.k[layer].keys(), self.v[layer].rows());
        let mode = Mode::of(s.ty, rows);
        // Query rows (token, head) per task: one each for decode, a few dozen for a
        // prompt so the scratch vectors below are made once per task, not per row.
        let n_rows = pos.len() * p.n_head;
        let per = (n_rows / (8 * par.threads().max(1))).clamp(1, 64);
        par_chunks(par, &mut out[..n_rows * dv], per * dv, &|task, os| {
            let (mut qh, mut scores, mut row, mut acc) = (vec![0.0f32; dk], Vec::new(), vec![0.0f32; dv], Vec::new());
            for (r, o) in os.chunks_exact_mut(dv).enumerate() {
                let i = task * per + r;
                let (t, h) = (i / p.n_head, i % p.n_head);
                let kvh = h / group;
                let pq = pos[t] as usize;
                let lo = match p.window {
                    Some(w) => (pq + 1).saturating_sub(w),
                    None => 0,
                };
                qh.copy_from_slice(&q[(t * p.n_head + h) * dk..][..dk]);
                // This head's transposed K: element (d, key) at d * n_ctx + key.
                let kh = match kc {
                    KeysT::F32(d) => KeysT::F32(&d[kvh * dk * n_ctx..(kvh + 1) * dk * n_ctx]),
                    KeysT::F16(d) => KeysT::F16(&d[kvh * dk * n_ctx..(kvh + 1) * dk * n_ctx]),
                };
                scores.clear();
                scores.resize(pq + 1 - lo, 0.0);
                let voff = kvh * dv;
                match mode {
                    Mode::FlashRows => {
                        qh.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                        kern::scores_tree(&qh, kh, n_ctx, lo, p.scale, 64, &mut scores);
                        match split_keys(rows, pq, par.threads()) {
                            Some(chunk) => split_rows(&scores, vc, wv, voff, lo, chunk, &mut row, &mut acc, o),
                            None => kern::online_f16(&scores, vc, wv, voff, lo, &mut row, o),
                        }
                    }
                    Mode::FlashTiled => {
                        kern::scores(&qh, kh, n_ctx, lo, p.scale, &mut scores);
                        attn_ggml::tiled(&scores, vc, wv, voff, lo, &mut row, o);
                    }
                    Mode::Plain { lanes_v } => {
                        kern::scores_tree(&qh, kh, n_ctx, lo, p.scale, 64, &mut scores);
                        attn_ggml::no_fa(&mut scores, vc, wv, voff, lo, lanes_v, &mut acc, &mut row, o);
                    }
                }
            }
        });
        Ok(())
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

/// The split path's row: per chunk of keys the online softmax with its f16 accumulator
/// (undivided), merged chunk by chunk as `v = fma(v, e^(M−M'), v_c·e^(M_c−M'))` (and the
/// same for the sums), divided at the end.
#[allow(clippy::too_many_arguments)]
fn split_rows(scores: &[f32], v: Rows, stride: usize, off: usize, lo: usize, chunk: usize, row: &mut [f32], part: &mut Vec<f32>, out: &mut [f32]) {
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
        let (mc, sc) = kern::online_f16_part(&scores[a - lo..b - lo], v, stride, off, a, row, part);
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
mod tests {
    use super::*;

    fn spec(ty: KvType) -> KvSpec {
        KvSpec { n_layer: 1, n_ctx: 8, n_kv_head: 1, head_dim_k: 2, head_dim_v: 2, ty }
    }

    fn attn(window: Option<usize>) -> Attention {
        Attention { n_head: 2, n_kv_head: 1, head_dim_k: 2, head_dim_v: 2, scale: 1.0, window }
    }

    #[test]
    fn single_key_returns_its_value_and_window_masks_old_keys() {
        for ty in [KvType::F32, KvType::F16] {
            let mut kv = Kv::new(spec(ty)).unwrap();
            // Three positions; V rows are (p, 10p).
            let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
            let v = [0.0, 0.0, 1.0, 10.0, 2.0, 20.0];
            kv.write(0, &k, &v, &[0, 1, 2]).unwrap();
            let q = [5.0, 5.0, -5.0, 0.0]; // two heads, one token
            let mut out = [0.0f32; 4];
            kv.attend(&crate::quant::RayonPool, 0, &q, &[0], &attn(None), &mut out).unwrap();
            assert_eq!(out, [0.0; 4]); // only key 0 visible, value 0
            kv.attend(&crate::quant::RayonPool, 0, &q, &[2], &attn(Some(1)), &mut out).unwrap();
            assert_eq!(out, [2.0, 20.0, 2.0, 20.0]); // window 1: only itself
            kv.attend(&crate::quant::RayonPool, 0, &q, &[2], &attn(None), &mut out).unwrap();
            // head 0 favours key 2 (score 10) over keys 0,1 (score 5).
            assert!(out[0] > 1.9 && out[0] < 2.0, "{out:?}");
        }
    }

    #[test]
    fn out_of_range_position_is_an_error() {
        let mut kv = Kv::new(spec(KvType::F32)).unwrap();
        assert!(kv.write(0, &[0.0; 2], &[0.0; 2], &[8]).is_err());
        let mut out = [0.0f32; 4];
        assert!(kv.attend(&crate::quant::RayonPool, 0, &[0.0; 4], &[9], &attn(None), &mut out).is_err());
        assert!(kv.attend(&crate::quant::RayonPool, 1, &[0.0; 4], &[0], &attn(None), &mut out).is_err());
    }
}
