//! [`Backend::rope_kv_attention`] on the GPU: a decode step's q/k norms, RoPE, K/V store
//! and attention in one launch (`attn_decode.rs`, `kernels-hip/attn_decode.hip`) instead
//! of `rope_kv_f32` + `attn_f16`.
//!
//! Taken for one token (`pos.len() == 1`) with head sizes 64, 128 or 256, under fast
//! numerics with `LODE_FUSE` and `LODE_FUSE_ATTN` on (`LODE_FUSE_ATTN=0`: the trait's
//! default, `rope_kv_write` then `attention`, for A/B runs); anything else goes the default
//! way. `--numerics exact` never comes here (backend.rs routes it to the default).
//!
//! What it leaves behind differs from the default in one respect: `q` and `k` are read,
//! not written back (the default leaves them normalized and rotated in place). Nothing
//! reads them after this op (model/forward.rs goes straight to the output projection),
//! and not writing them saves each head a store; the cache, `out` and `out`'s q8_1 form
//! are what the default would leave. `v` is read only, as before.
//!
//! `out`'s q8_1 blocks follow `act.rs`'s producer protocol as `attention` does: written
//! (and recorded) only when the buffer's last quantized consumer read q8_1; `out` is
//! touched first, so a form made from its previous contents can never be served.

use super::{derr, err, GpuBackend};
use crate::backend::gpu::attn_decode::{self, AttnDecode, AttnDecodeBufs};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::exact::Numerics;
use crate::backend::gpu::ops;
use crate::backend::{Attention, Backend, BackendError, Buf, KvCache, QkvPrep, Result};
use crate::weights::WeightRef;

/// The fused decode attention's switch and scratch (arrival counters + partial states).
pub(super) struct FuseAttn {
    on: bool,
    /// `LODE_ATTN_PART_KEYS=N`: parts of at least N keys (default: one block iteration,
    /// `attn_decode::keys_per_part`); fewer keys per part spread a head over more blocks.
    part_keys: Option<usize>,
    /// `LODE_ATTN_SPREAD=1`: a part's keys dealt round all the block's warps (the kernel's
    /// first layout) instead of filling the warps in order (`AttnDecode::spread`).
    spread: bool,
    scratch: Option<DeviceBuffer>,
}

impl FuseAttn {
    pub(super) fn from_env() -> FuseAttn {
        FuseAttn {
            on: std::env::var("LODE_FUSE_ATTN").map(|v| v != "0").unwrap_or(true),
            part_keys: std::env::var("LODE_ATTN_PART_KEYS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0),
            spread: std::env::var("LODE_ATTN_SPREAD").map(|v| v == "1").unwrap_or(false),
            scratch: None,
        }
    }
}

impl GpuBackend {
    /// The fused decode attention on or off (as `LODE_FUSE_ATTN` sets it at start).
    pub fn set_fuse_attn(&mut self, on: bool) {
        self.fuse_attn.on = on;
    }

    /// The fewest keys per part (as `LODE_ATTN_PART_KEYS` sets it; None: one block iteration).
    pub fn set_attn_part_keys(&mut self, keys: Option<usize>) {
        self.fuse_attn.part_keys = keys.filter(|&n| n > 0);
    }

    /// The fused kernel's key layout (as `LODE_ATTN_SPREAD` sets it; `AttnDecode::spread`).
    pub fn set_attn_spread(&mut self, spread: bool) {
        self.fuse_attn.spread = spread;
    }

    /// Whether `rope_kv_attention` of this shape runs as the one fused kernel.
    #[allow(clippy::too_many_arguments)]
    fn attn_fusable(&self, q: Buf, k: Buf, v: Buf, kv: KvCache, pos: &[u32], p: &QkvPrep, a: &Attention, out: Buf) -> bool {
        let Some(spec) = self.kvs.get(&kv.0).map(|c| c.spec) else { return false };
        let hd = p.head_dim;
        let norm_ok = |w: &Option<WeightRef>| w.as_ref().map(|w| w.row_len() * w.n_rows() == hd).unwrap_or(true);
        let bufs = [q, k, v, out];
        let distinct = (0..4).all(|i| (i + 1..4).all(|j| bufs[i] != bufs[j]));
        self.fuse
            && self.fuse_attn.on
            && self.numerics != Numerics::Exact
            && pos.len() == 1
            && attn_decode::kernel(hd).is_some()
            && a.head_dim_k == hd
            && a.head_dim_v == hd
            && spec.head_dim_k == hd
            && spec.head_dim_v == hd
            && p.n_head == a.n_head
            && p.n_kv_head == a.n_kv_head
            && p.n_kv_head == spec.n_kv_head
            && p.n_kv_head > 0
            && p.n_head % p.n_kv_head == 0
            && p.rope.n_rot <= hd
            && p.rope.n_rot % 2 == 0
            && norm_ok(&p.q_norm)
            && norm_ok(&p.k_norm)
            && distinct
    }

    /// The `Backend::rope_kv_attention` of fast numerics.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_rope_kv_attention(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep, a: &Attention, out: Buf) -> Result<()> {
        if !self.attn_fusable(q, k, v, kv, pos, p, a, out) {
            self.rope_kv_write(q, k, v, kv, layer, pos, p)?;
            return self.attention(q, kv, layer, pos, a, out);
        }
        const OP: &str = "rope_kv_attention";
        let (hd, n_head, n_kv) = (p.head_dim, p.n_head, p.n_kv_head);
        let (qp, qn) = self.buf(q)?;
        let (kp, kn) = self.buf(k)?;
        let (vp, vn) = self.buf(v)?;
        let (op, on) = self.buf(out)?;
        Self::check_len(OP, q, qn, n_head * hd)?;
        Self::check_len(OP, k, kn, n_kv * hd)?;
        Self::check_len(OP, v, vn, n_kv * hd)?;
        Self::check_len(OP, out, on, n_head * hd)?;
        let (kc, vc, spec) = self.kv_layer(OP, kv, layer)?;
        if pos[0] as usize >= spec.n_ctx {
            return Err(BackendError::Invalid { op: OP, msg: format!("position {} past the cache's {} slots", pos[0], spec.n_ctx) });
        }
        let q_norm = p.q_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let k_norm = p.k_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let freq_factors = self.rope_factors(&p.rope)?;
        let window = a.window.unwrap_or(0);
        let max_keys = if window > 0 { window.min(spec.n_ctx) } else { spec.n_ctx };
        let min_keys = self.fuse_attn.part_keys.unwrap_or_else(|| attn_decode::keys_per_part(hd));
        let mut parts = attn_decode::parts_for(min_keys, max_keys);
        if self.fuse_attn.part_keys.is_none() {
            // At most one wave of blocks: long contexts then take longer parts, not more waves.
            let kernel = attn_decode::kernel(hd).unwrap_or("attn_decode_d128");
            let wave = self.mv_sms() * self.mv_per_sm(kernel, attn_decode::THREADS as u32, || 1);
            parts = attn_decode::parts_in_wave(parts, n_head, wave);
        }
        let scratch = self.attn_scratch(attn_decode::scratch_bytes(n_head, parts, hd))?;
        let pos_dev = self.positions(pos)?;
        let values = n_head * hd;
        // As `attention`: out's q8_1 form unless the output projection reads the K form.
        let q8 = if self.act_wants_k(out) { None } else { Some(self.act_producer(out, Some(32), values, OP)?.2) };
        self.touch(out);
        let bufs = AttnDecodeBufs { q: qp, k: kp, v: vp, kc, vc, out: op, q8, q_norm, k_norm, freq_factors, pos: pos_dev, scratch };
        let params = AttnDecode {
            prep: ops::RopeKv::new(1, p),
            n_ctx: spec.n_ctx,
            scale: a.scale,
            window,
            parts,
            min_keys,
            spread: self.fuse_attn.spread,
        };
        attn_decode::attn_decode(&self.rec(), &bufs, &params).map_err(err(OP))?;
        if q8.is_some() {
            self.act_produced(out, ops::ActFmt::Q8_1, 32, values);
        }
        Ok(())
    }

    /// The scratch of at least `bytes`, its counters zero. It only grows; a replaced one is
    /// kept until the step's work has run.
    fn attn_scratch(&mut self, bytes: usize) -> Result<DevPtr> {
        if let Some(b) = &self.fuse_attn.scratch {
            if b.len() >= bytes {
                return Ok(b.ptr());
            }
        }
        // Allocating and clearing are outside the step record.
        self.barrier()?;
        let b = self.dev.alloc(bytes.next_power_of_two().max(4096)).map_err(derr("rope_kv_attention"))?;
        self.dev.memset(b.ptr(), 0, b.len()).map_err(derr("rope_kv_attention"))?;
        let ptr = b.ptr();
        if let Some(old) = self.fuse_attn.scratch.replace(b) {
            self.retired.push(old);
        }
        Ok(ptr)
    }

    /// The K and V arrays of `layer` in `kv` (`[n_ctx, n_kv_head·head_dim]` f16 bits each),
    /// read back after the queued work (the selftest's view of the cache).
    pub fn read_kv(&mut self, kv: KvCache, layer: usize) -> Result<(Vec<u16>, Vec<u16>)> {
        let (kc, vc, s) = self.kv_layer("read_kv", kv, layer)?;
        self.end_step()?;
        self.retired.clear();
        let mut k = vec![0u16; s.n_ctx * s.n_kv_head * s.head_dim_k];
        let mut v = vec![0u16; s.n_ctx * s.n_kv_head * s.head_dim_v];
        self.dev.read(kc, bytemuck::cast_slice_mut(&mut k)).map_err(derr("read_kv"))?;
        self.dev.read(vc, bytemuck::cast_slice_mut(&mut v)).map_err(derr("read_kv"))?;
        Ok((k, v))
    }
}
