//! The fused ops' defaults that are sequences of other ops (and a backend's fallback
//! when its fused kernel does not take a shape).

use super::{Attention, Backend, BackendError, Buf, KvCache, QkvPrep, Result};

/// [`Backend::attention_rows`] row by row through one-row buffers (the default, and a
/// backend's fallback).
#[allow(clippy::too_many_arguments)]
pub fn attention_rows_unfused<B: Backend + ?Sized>(be: &mut B, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
    if kvs.len() != pos.len() {
        return Err(BackendError::Invalid { op: "attention_rows", msg: format!("{} caches for {} rows", kvs.len(), pos.len()) });
    }
    let (qd, kd) = (p.n_head * p.head_dim_k, p.n_kv_head * p.head_dim_k);
    let (vd, ad) = (p.n_kv_head * p.head_dim_v, p.n_head * p.head_dim_v);
    let mut tmp = Vec::with_capacity(4);
    let run = |be: &mut B, tmp: &mut Vec<Buf>| -> Result<()> {
        for len in [qd, kd, vd, ad] {
            tmp.push(be.alloc(len)?);
        }
        let (q1, k1, v1, a1) = (tmp[0], tmp[1], tmp[2], tmp[3]);
        for (t, &kv) in kvs.iter().enumerate() {
            let p1 = &pos[t..t + 1];
            be.copy(k, t * kd, k1, 0, kd)?;
            be.copy(v, t * vd, v1, 0, vd)?;
            be.kv_write(kv, layer, k1, v1, p1)?;
            be.copy(q, t * qd, q1, 0, qd)?;
            be.attention(q1, kv, layer, p1, p, a1)?;
            be.copy(a1, 0, out, t * ad, ad)?;
        }
        Ok(())
    };
    let r = run(be, &mut tmp);
    for b in tmp {
        let _ = be.free(b);
    }
    r
}

/// [`Backend::rope_kv_write`] as the separate ops (the default, and a backend's fallback).
#[allow(clippy::too_many_arguments)]
pub fn rope_kv_write_unfused<B: Backend + ?Sized>(be: &mut B, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep) -> Result<()> {
    prepare_qk(be, p, q, k, pos)?;
    be.kv_write(kv, layer, k, v, pos)
}

/// What [`Backend::rope_kv_write`] does before the store: the per-head q/k norms, RoPE of
/// both and the query scale, in place.
pub fn prepare_qk<B: Backend + ?Sized>(be: &mut B, p: &QkvPrep, q: Buf, k: Buf, pos: &[u32]) -> Result<()> {
    let n = pos.len();
    if let Some(qn) = &p.q_norm {
        be.rms_norm(q, q, n * p.n_head, p.head_dim, Some(qn), p.eps)?;
    }
    if let Some(kn) = &p.k_norm {
        be.rms_norm(k, k, n * p.n_kv_head, p.head_dim, Some(kn), p.eps)?;
    }
    be.rope(q, p.n_head, p.head_dim, pos, &p.rope)?;
    be.rope(k, p.n_kv_head, p.head_dim, pos, &p.rope)?;
    if let Some(qs) = p.q_scale {
        be.scale(q, n * p.n_head * p.head_dim, qs)?;
    }
    Ok(())
}
