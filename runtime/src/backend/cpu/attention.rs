//! KV cache storage and attention over it, on the CPU.
//!
//! Layout per layer: K is `[n_ctx, n_kv_head * head_dim_k]`, V is
//! `[n_ctx, n_kv_head * head_dim_v]`, slot = position. With an f16 cache and fewer than
//! [`TILED_MIN_ROWS`] query rows the query is rounded to f16 before `q·k`, as llama.cpp's
//! CPU flash attention does for small batches and decode (its tiled kernel for larger
//! batches keeps Q in f32), so an f16 run is comparable with llama.cpp's default; sums
//! are f32.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::backend::{Attention, BackendError, KvSpec, KvType, Result};
use crate::quant::{par_chunks, Parallel};

/// Query rows from which llama.cpp's CPU flash attention switches to its tiled kernel.
pub const TILED_MIN_ROWS: usize = 64;

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

    fn store(&mut self, at: usize, src: &[f32]) {
        match self {
            KvData::F32(d) => d[at..at + src.len()].copy_from_slice(src),
            KvData::F16(d) => d[at..at + src.len()].convert_from_f32_slice(src),
        }
    }

    /// Row `at..at+dst.len()` as f32.
    fn load(&self, at: usize, dst: &mut [f32]) {
        match self {
            KvData::F32(d) => dst.copy_from_slice(&d[at..at + dst.len()]),
            KvData::F16(d) => d[at..at + dst.len()].convert_to_f32_slice(dst),
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
            self.k[layer].store(p * wk, &k[t * wk..(t + 1) * wk]);
            self.v[layer].store(p * wv, &v[t * wv..(t + 1) * wv]);
        }
        Ok(())
    }

    /// Causal (optionally windowed) GQA attention; `out` `[pos.len(), n_head*head_dim_v]`.
    pub fn attend(
        &self,
        par: &dyn Parallel,
        layer: usize,
        q: &[f32],
        pos: &[u32],
        p: &Attention,
        out: &mut [f32],
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
        let (wk, wv) = (s.n_kv_head * dk, s.n_kv_head * dv);
        let (kc, vc) = (&self.k[layer], &self.v[layer]);
        let round_q = s.ty == KvType::F16 && pos.len() < TILED_MIN_ROWS;
        par_chunks(par, &mut out[..pos.len() * p.n_head * dv], dv, &|i, o| {
                let (t, h) = (i / p.n_head, i % p.n_head);
                let kvh = h / group;
                let pq = pos[t] as usize;
                let lo = match p.window {
                    Some(w) => (pq + 1).saturating_sub(w),
                    None => 0,
                };
                let mut qh = q[(t * p.n_head + h) * dk..][..dk].to_vec();
                if round_q {
                    qh.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32());
                }
                let mut row = vec![0.0f32; dk.max(dv)];
                if round_q {
                    online_f16(&qh, kc, vc, lo..=pq, (wk, kvh * dk), (wv, kvh * dv), p.scale, &mut row, o);
                    return;
                }
                let mut scores = Vec::with_capacity(pq + 1 - lo);
                let mut max = f32::NEG_INFINITY;
                for pk in lo..=pq {
                    kc.load(pk * wk + kvh * dk, &mut row[..dk]);
                    let d: f32 = qh.iter().zip(&row[..dk]).map(|(a, b)| a * b).sum();
                    let sc = d * p.scale;
                    max = max.max(sc);
                    scores.push(sc);
                }
                let mut sum = 0.0f32;
                for sc in scores.iter_mut() {
                    *sc = (*sc - max).exp();
                    sum += *sc;
                }
                o.fill(0.0);
                for (j, pk) in (lo..=pq).enumerate() {
                    vc.load(pk * wv + kvh * dv, &mut row[..dv]);
                    let w = scores[j] / sum;
                    o.iter_mut().zip(&row[..dv]).for_each(|(a, &b)| *a += w * b);
                }
        });
        Ok(())
    }
}

/// One query head over keys `keys` with an online softmax whose V accumulator is kept
/// in f16 (rounded after every key), as llama.cpp's CPU flash attention does for small
/// batches and decode with an f16 cache. `k_at`/`v_at` are (row stride, head offset).
#[allow(clippy::too_many_arguments)]
fn online_f16(
    q: &[f32],
    kc: &KvData,
    vc: &KvData,
    keys: std::ops::RangeInclusive<usize>,
    k_at: (usize, usize),
    v_at: (usize, usize),
    scale: f32,
    row: &mut [f32],
    out: &mut [f32],
) {
    let (dk, dv) = (q.len(), out.len());
    let mut acc = vec![f16::ZERO; dv];
    let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
    for pk in keys {
        kc.load(pk * k_at.0 + k_at.1, &mut row[..dk]);
        let s = q.iter().zip(&row[..dk]).map(|(a, b)| a * b).sum::<f32>() * scale;
        let (mut ms, mut vs) = (1.0f32, 1.0f32);
        if s > m {
            ms = (m - s).exp();
            m = s;
            acc.iter_mut().for_each(|a| *a = f16::from_f32(a.to_f32() * ms));
        } else {
            vs = (s - m).exp();
        }
        vc.load(pk * v_at.0 + v_at.1, &mut row[..dv]);
        acc.iter_mut().zip(&row[..dv]).for_each(|(a, &v)| *a = f16::from_f32(v.mul_add(vs, a.to_f32())));
        sum = sum * ms + vs;
    }
    let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    out.iter_mut().zip(&acc).for_each(|(o, a)| *o = a.to_f32() * inv);
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
