//! A batched decode step's attention (`Backend::attention_rows`): row `t` is the next token
//! of a different sequence, so its K/V go into, and its query attends over, that
//! sequence's own cache. One staged table of cache addresses (K and V per row) and one
//! staged positions array let all rows run in two launches per layer (measured and dropped:
//! two launches per row).

use crate::backend::gpu::family::{attention, elementwise};
use super::{err, GpuBackend};
use crate::backend::gpu::plan;
use crate::backend::{Attention, BackendError, Buf, KvCache, Result};

/// A batched step's buffers, checked against the row count and the attention shape:
/// addresses and the per-row widths (q / out, K / V) in f32 elements.
pub(super) struct RowsOperands {
    pub qp: u64,
    pub kp: u64,
    pub vp: u64,
    pub op: u64,
    pub qd: usize,
    pub ad: usize,
    pub rk: usize,
    pub rv: usize,
}

impl GpuBackend {
    /// The operands of `attention_rows` (one cache per row), or a clear error.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rows_operands(&self, q: Buf, k: Buf, v: Buf, out: Buf, kvs: &[KvCache], n: usize, p: &Attention) -> Result<RowsOperands> {
        if kvs.len() != n {
            return Err(BackendError::Invalid { op: "attention_rows", msg: format!("{} caches for {n} rows", kvs.len()) });
        }
        let (qd, ad) = (p.n_head * p.head_dim_k, p.n_head * p.head_dim_v);
        let (rk, rv) = (p.n_kv_head * p.head_dim_k, p.n_kv_head * p.head_dim_v);
        let (qp, qn) = self.buf(q)?;
        let (kp, kn) = self.buf(k)?;
        let (vp, vn) = self.buf(v)?;
        let (op, on) = self.buf(out)?;
        GpuBackend::check_len("attention_rows", q, qn, n * qd)?;
        GpuBackend::check_len("attention_rows", k, kn, n * rk)?;
        GpuBackend::check_len("attention_rows", v, vn, n * rv)?;
        GpuBackend::check_len("attention_rows", out, on, n * ad)?;
        Ok(RowsOperands { qp, kp, vp, op, qd, ad, rk, rv })
    }

    /// Each row over its own cache: one K/V store and one attention launch for all rows,
    /// through a staged table of the rows' cache addresses.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn per_row_attention(&mut self, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        let n = pos.len();
        if let Some(kv) = kvs.first() {
            let (_, _, s) = self.kv_layer("attention_rows", *kv, layer)?;
            if let Some(msg) = super::rope_attn::attn_unsupported(p, &s) {
                return Err(crate::backend::BackendError::Invalid { op: "attention_rows", msg });
            }
            if !plan::attention_rows_batched(s.ty) {
                return crate::backend::attention_rows_unfused(self, q, k, v, kvs, layer, pos, p, out);
            }
        }
        let RowsOperands { qp, kp, vp, op, rk, rv, .. } = self.rows_operands(q, k, v, out, kvs, n, p)?;
        let mut caches = Vec::with_capacity(n);
        for (t, kv) in kvs.iter().enumerate() {
            self.kv_room("attention_rows", *kv, layer, &pos[t..t + 1])?;
            self.kv_visible("attention_rows", *kv, layer, &pos[t..t + 1], p.window)?;
            let (kc, vc, s) = self.kv_layer("attention_rows", *kv, layer)?;
            if p.head_dim_k != p.head_dim_v || p.n_kv_head != s.n_kv_head || p.head_dim_k != s.head_dim_k {
                return Err(BackendError::Invalid { op: "attention_rows", msg: "attention shape differs from the KV cache's".into() });
            }
            if pos[t] as usize >= s.n_ctx {
                return Err(BackendError::Invalid { op: "attention_rows", msg: format!("position {} past the cache's {} slots", pos[t], s.n_ctx) });
            }
            caches.push((kc, vc));
        }
        let sinks = p.sinks.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let pp = self.positions(pos)?;
        let window = p.window.unwrap_or(0);
        let table: Vec<u64> = caches.iter().flat_map(|&(kc, vc)| [kc, vc]).collect();
        let tp = self.stage_bytes(bytemuck::cast_slice(&table))?;
        elementwise::kv_store_rows(&self.rec(), kp, vp, tp, rk, rv, pp, n).map_err(err("kv_write"))?;
        attention::attention_rows(&self.rec(), qp, tp, op, n, p.n_head, p.n_kv_head, p.head_dim_k, pp, window, p.scale, sinks).map_err(err("attention"))?;
        self.touch(out);
        Ok(())
    }
}
