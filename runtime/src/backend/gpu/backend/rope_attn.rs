//! [`Backend::rope_kv_attention`] on the GPU: a decode step's q/k norms, RoPE, K/V store
//! and attention in one launch (`attn_decode.rs`, `kernels-hip/attn_decode.hip`) instead
//! of `rope_kv_f32` + `attn_f16`.
//!
//! Taken where `plan::rope_kv_attention` says (one token, head sizes 64, 128 or 256,
//! `Tuning::fuse` and `fuse_attn` on); anything else goes the trait's default way,
//! `rope_kv_write` then `attention`.
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

use crate::backend::gpu::family::{attn_decode, norm_rope};
use crate::backend::gpu::launch;
use crate::backend::gpu::family::attn_decode::AttnDecode;
use crate::backend::gpu::family::attn_decode::AttnDecodeBufs;
use super::{derr, err, GpuBackend};
use crate::backend::gpu::device::DeviceBuffer;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::plan;
use super::probe::Probe;
use crate::backend::{Attention, Backend, BackendError, Buf, KvCache, QkvPrep, Result, Rope};
use crate::weights::WeightRef;

/// The fused decode attention's scratch (arrival counters + partial states).
#[derive(Default)]
pub(super) struct FuseAttn {
    scratch: Option<DeviceBuffer>,
}

impl GpuBackend {
    /// The fused decode attention on or off (`Tuning::fuse_attn`).
    pub fn set_fuse_attn(&mut self, on: bool) {
        self.tuning.fuse_attn = on;
    }

    /// The fewest keys per part (`Tuning::attn_part_keys`; None: one block iteration).
    pub fn set_attn_part_keys(&mut self, keys: Option<usize>) {
        self.tuning.attn_part_keys = keys.filter(|&n| n > 0);
    }

    /// The `Backend::rope_kv_attention` of fast numerics.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fused_rope_kv_attention(&mut self, q: Buf, k: Buf, v: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &QkvPrep, a: &Attention, out: Buf) -> Result<()> {
        let Some(spec) = self.kvs.get(&kv.0).map(|c| c.spec) else { return Err(BackendError::BadKvHandle(kv)) };
        if let Some(msg) = attn_unsupported(a, &spec) {
            return Err(BackendError::Invalid { op: "attention", msg });
        }
        let hd = p.head_dim;
        let norm_ok = |w: &Option<WeightRef>| w.as_ref().map(|w| w.row_len() * w.n_rows() == hd).unwrap_or(true);
        let bufs = [q, k, v, out];
        let distinct = (0..4).all(|i| (i + 1..4).all(|j| bufs[i] != bufs[j]));
        // The fused decode kernel has no sinks: with them, its unfused form (`attn_f16`).
        let shape = plan::QkvShape::of(p, &spec, norm_ok(&p.q_norm) && norm_ok(&p.k_norm) && distinct && a.sinks.is_none());
        let window = a.window.unwrap_or(0);
        let max_keys = if window > 0 { window.min(spec.n_ctx) } else { spec.n_ctx };
        let attn = (a.head_dim_k, a.head_dim_v, a.n_head, a.n_kv_head);
        let Some(choice) = plan::rope_kv_attention(&shape, pos.len(), attn, max_keys, &self.tuning, &mut Probe { dev: &self.dev, cache: &mut self.occ }) else {
            self.rope_kv_write(q, k, v, kv, layer, pos, p)?;
            return self.attention(q, kv, layer, pos, a, out);
        };
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
        if pos[0] as usize >= spec.n_ctx {
            return Err(BackendError::Invalid { op: OP, msg: format!("position {} past the cache's {} slots", pos[0], spec.n_ctx) });
        }
        self.kv_room(OP, kv, layer, pos)?;
        self.kv_visible(OP, kv, layer, pos, a.window)?;
        let (kc, vc, spec) = self.kv_layer(OP, kv, layer)?;
        let q_norm = p.q_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let k_norm = p.k_norm.as_ref().map(|w| self.weight_f32(w)).transpose()?;
        let freq_factors = self.rope_factors(&p.rope)?;
        let (min_keys, parts) = (choice.min_keys, choice.parts);
        let scratch = self.attn_scratch(attn_decode::scratch_bytes(n_head, parts, hd))?;
        let pos_dev = self.positions(pos)?;
        let values = n_head * hd;
        // As `attention`: out's q8_1 form unless the output projection reads the K form.
        let q8 = if self.act_wants_k(out) { None } else { Some(self.act_producer(out, Some(32), values, OP)?.2) };
        self.touch(out);
        let bufs = AttnDecodeBufs { q: qp, k: kp, v: vp, kc, vc, out: op, q8, q_norm, k_norm, freq_factors, pos: pos_dev, scratch };
        let params = AttnDecode {
            prep: norm_rope::RopeKv::new(1, p),
            n_ctx: spec.n_ctx,
            scale: a.scale,
            window,
            parts,
            min_keys,
        };
        attn_decode::attn_decode(&self.rec(), &bufs, &params).map_err(err(OP))?;
        if q8.is_some() {
            self.act_produced(out, launch::ActFmt::Q8_1, 32, values);
        }
        Ok(())
    }

    /// The scratch of at least `bytes`, its counters zero. It only grows; a replaced one is
    /// kept until the step's work has run.
    pub(super) fn attn_scratch(&mut self, bytes: usize) -> Result<DevPtr> {
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

    /// The K and V arrays of `layer` in `kv` (`[slots, n_kv_head·head_dim]` f16 bits each,
    /// from the layer's first held position), read back after the queued work (the
    /// selftest's view of the cache).
    pub fn read_kv(&mut self, kv: KvCache, layer: usize) -> Result<(Vec<u16>, Vec<u16>)> {
        let (kc, vc, s) = self.kv_arrays("read_kv", kv, layer)?;
        self.end_step()?;
        self.retired.clear();
        let mut k = vec![0u16; s.slots(layer) * s.n_kv_head * s.head_dim_k];
        let mut v = vec![0u16; s.slots(layer) * s.n_kv_head * s.head_dim_v];
        self.dev.read(kc, bytemuck::cast_slice_mut(&mut k)).map_err(derr("read_kv"))?;
        self.dev.read(vc, bytemuck::cast_slice_mut(&mut v)).map_err(derr("read_kv"))?;
        Ok((k, v))
    }

    /// The bytes of `layer`'s K and V planes in `kv` (slot-major rows in the cache's types:
    /// f16, or GGUF blocks), read back after the queued work (the `kvq` selftest's view).
    pub fn read_kv_bytes(&mut self, kv: KvCache, layer: usize) -> Result<(Vec<u8>, Vec<u8>)> {
        let (kc, vc, s) = self.kv_arrays("read_kv_bytes", kv, layer)?;
        self.end_step()?;
        self.retired.clear();
        let mut k = vec![0u8; s.slots(layer) * s.ty.k.bytes(s.n_kv_head * s.head_dim_k)];
        let mut v = vec![0u8; s.slots(layer) * s.ty.v.bytes(s.n_kv_head * s.head_dim_v)];
        self.dev.read(kc, &mut k).map_err(derr("read_kv_bytes"))?;
        self.dev.read(vc, &mut v).map_err(derr("read_kv_bytes"))?;
        Ok((k, v))
    }
}

/// Why the GPU's attention kernels cannot run `p` over a cache of `spec`: a shape that
/// differs from the cache's, or attention sinks (gpt-oss), which they do not add yet.
pub(super) fn attn_unsupported(p: &Attention, spec: &crate::backend::KvSpec) -> Option<String> {
    if p.head_dim_k != p.head_dim_v || p.n_kv_head != spec.n_kv_head || p.head_dim_k != spec.head_dim_k {
        return Some("attention shape differs from the KV cache's".into());
    }
    // Only `attn_f16` adds sinks: not the quantized caches' kernel.
    p.sinks.as_ref().filter(|_| spec.ty.any_quantized()).map(|s| format!("attention sinks (`{}`) with a {} cache: the GPU adds sinks over f16 caches only (use -ctk f16 -ctv f16)", s.name(), spec.ty))
}

/// The per-pair divisors the RoPE kernels read (angle of pair i: `freq_scale · pos ·
/// theta_scale^i / ff_i`): the file's `rope_freqs` (or 1), with YaRN divided by
/// [`crate::backend::Yarn::angle_factors`] (the kernels then get `freq_scale` 1), which
/// is the CPU's angle `extrap · (freq_scale·(1 − mix) + mix)`.
pub(super) fn factors(r: &crate::backend::Rope) -> Result<Vec<f32>> {
    let half = r.n_rot / 2;
    let mut v = match &r.freq_factors {
        Some(f) => {
            let mut v = vec![0f32; f.row_len() * f.n_rows()];
            crate::quant::dequantize(f.ty(), f.data(), &mut v).map_err(|source| BackendError::Quant { op: "rope", weight: f.name().into(), source })?;
            if v.len() < half {
                return Err(BackendError::Invalid { op: "rope", msg: format!("`{}` has {} frequency factors, RoPE of {} dims needs {half}", f.name(), v.len(), r.n_rot) });
            }
            v
        }
        None => vec![1.0; half],
    };
    if let Some(y) = &r.yarn {
        let a = y.angle_factors(r.n_rot, r.freq_base, r.freq_scale);
        v.iter_mut().zip(&a).for_each(|(f, m)| *f /= m);
    }
    Ok(v)
}

/// The key of [`factors`]' upload: the weight's address, or with YaRN a hash of every
/// input with the top bit set (no user-space address has it).
pub(super) fn factors_key(r: &crate::backend::Rope) -> usize {
    use std::hash::{Hash, Hasher};
    let ptr = r.freq_factors.map_or(0, |f| f.data().as_ptr() as usize);
    let Some(y) = &r.yarn else { return ptr };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (ptr, r.n_rot, r.freq_base.to_bits(), r.freq_scale.to_bits(), y.ext_factor.to_bits(), y.beta_fast.to_bits(), y.beta_slow.to_bits(), y.n_ctx_orig).hash(&mut h);
    (h.finish() as usize) | (1 << (usize::BITS - 1))
}

impl GpuBackend {
    /// The rope's frequency divisors as a device f32 vector, uploaded once per weight (with
    /// YaRN: divided by its angle factors, once per parameter set; [`factors`]).
    pub(super) fn rope_factors(&mut self, r: &Rope) -> Result<Option<DevPtr>> {
        if r.freq_factors.is_none() && r.yarn.is_none() {
            return Ok(None);
        }
        let key = factors_key(r);
        if let Some(b) = self.inv_freq.get(&key) {
            return Ok(Some(b.ptr()));
        }
        let v = factors(r)?;
        self.barrier()?;
        let b = self.dev.upload_f32(&v).map_err(derr("rope"))?;
        let p = b.ptr();
        self.inv_freq.insert(key, b);
        Ok(Some(p))
    }
}
