//! `kernels-hip/kvq_attn.hip`: attention over a quantized KV cache (Q8_0 / Q4_0 K or V,
//! f16 allowed on one side) at the f16 cache's speed.
//!
//! - Decode (`kvq_decode_d<HD>`): one query split over its keys as the fused f16 decode
//!   splits them (`attn_decode`: the same parts, part count and merge scratch), each lane
//!   loading 16 elements of one block (its scale once, the bytes as words).
//! - Prefill (`kvq_to_f16`): the rows a chunk's queries see, dequantized into an f16
//!   scratch that `flash_attn` then reads as an f16 cache (the layer's rows only, the
//!   scratch reused by every layer; [`scratch_rows_bytes`] is what `engine::fit` counts).

use super::attention::kv_code;
use super::attn_decode;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::backend::{KvSpec, KvType, KvTypes};
use crate::kernel_args;

type R = Result<(), GpuError>;

kernel_args! {
    /// `kvq_decode_d<HD>(q, kc, vc, out, q8, pos, part, cnt, group, n_kv, ty_k, ty_v, scale,
    /// window, n_split, min_chunk)`.
    pub struct Decode {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, pos: DevPtr, part: DevPtr, cnt: DevPtr,
        group: usize, n_kv: usize, ty_k: usize, ty_v: usize, scale: f32, window: usize, n_split: usize, min_chunk: usize,
    }
}
kernel_args! {
    /// `kvq_to_f16(kc, vc, dk, dv, nk, nv, lo, n_rows, ty_k, ty_v)`.
    pub struct ToF16 { kc: DevPtr, vc: DevPtr, dk: DevPtr, dv: DevPtr, nk: usize, nv: usize, lo: usize, n_rows: usize, ty_k: usize, ty_v: usize }
}

const DECODE: [(usize, Kernel<Decode>); 3] = [(64, Kernel::new("kvq_decode_d64")), (128, Kernel::new("kvq_decode_d128")), (256, Kernel::new("kvq_decode_d256"))];
const TO_F16: Kernel<ToF16> = Kernel::new("kvq_to_f16");

pub const FAMILY: Family = Family {
    name: "kvq_attn",
    source: include_str!("../../../../../kernels-hip/kvq_attn.hip"),
    kernels: &[&[DECODE[0].1.sig(), DECODE[1].1.sig(), DECODE[2].1.sig(), TO_F16.sig()]],
};

/// Threads per decode block (`KQ_THREADS`).
pub const THREADS: usize = 512;

/// The decode kernel for head size `hd` (None: not taken; `attn_kvq` runs it).
pub fn decode_kernel(hd: usize) -> Option<&'static str> {
    DECODE.iter().find(|e| e.0 == hd).map(|e| e.1.name)
}

/// Keys one decode block covers in one iteration (`KQ_WARPS · (32 / (hd / 16)) · KQ_U`):
/// the same lane layout as `attn_decode`, so the same figure.
pub fn keys_per_part(hd: usize) -> usize {
    attn_decode::keys_per_part(hd)
}

/// The kernels' codes of both sides (`KQ_*` = attention.hip's `KVQ_*`).
fn codes(ty: KvTypes) -> Result<(usize, usize), GpuError> {
    match (kv_code(ty.k), kv_code(ty.v)) {
        (Some(k), Some(v)) => Ok((k, v)),
        _ => Err(GpuError::Unsupported(format!("quantized-KV attention over a {ty} cache"))),
    }
}

/// Shapes of one decode launch.
#[derive(Clone, Copy, Debug)]
pub struct DecodeShape {
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub ty: KvTypes,
    /// Multiplier of q·k.
    pub scale: f32,
    /// 0: full causal.
    pub window: usize,
    /// Parts per head (fixed by the cache size) and the fewest keys a part takes.
    pub parts: usize,
    pub min_keys: usize,
}

/// Device buffers of one decode launch.
#[derive(Clone, Copy, Debug)]
pub struct DecodeBufs {
    /// [n_head, hd] f32: the query (roped).
    pub q: DevPtr,
    /// The K and V planes (row p = key p).
    pub kc: DevPtr,
    pub vc: DevPtr,
    /// [n_head, hd] f32, and its q8_1 blocks or none.
    pub out: DevPtr,
    pub q8: Option<DevPtr>,
    /// [1] i32: the query's position.
    pub pos: DevPtr,
    /// `attn_decode::scratch_bytes(n_head, parts, hd)` bytes, counters zero.
    pub scratch: DevPtr,
}

/// One query's attention over a quantized cache, split over its keys.
pub fn decode(d: &dyn Launch, b: &DecodeBufs, s: &DecodeShape) -> R {
    let &(_, kernel) = DECODE.iter().find(|e| e.0 == s.head_dim).ok_or_else(|| GpuError::Unsupported(format!("kvq_decode: head_dim {}", s.head_dim)))?;
    if s.n_kv == 0 || s.n_head % s.n_kv != 0 || s.parts == 0 || s.parts > attn_decode::MAX_PARTS {
        return Err(GpuError::Unsupported(format!("kvq_decode: heads {}/{}, {} parts", s.n_head, s.n_kv, s.parts)));
    }
    let (ty_k, ty_v) = codes(s.ty)?;
    let args = Decode {
        q: b.q, kc: b.kc, vc: b.vc, out: b.out, q8: b.q8, pos: b.pos,
        part: b.scratch + attn_decode::counters_bytes(s.n_head) as u64, cnt: b.scratch,
        group: s.n_head / s.n_kv, n_kv: s.n_kv, ty_k, ty_v, scale: s.scale, window: s.window, n_split: s.parts, min_chunk: s.min_keys.max(1),
    };
    kernel.launch(d, [(s.n_head / s.n_kv) as u32, s.n_kv as u32, s.parts as u32], [THREADS as u32, 1, 1], &args)
}

/// The sides of `ty` the prefill converts (the quantized ones).
fn converted(t: KvType) -> bool {
    t.is_quantized()
}

/// Bytes of the f16 scratch that holds `rows` rows of the quantized sides of a `ty` cache
/// (`n_kv` heads of `hd_k` / `hd_v`): K's rows, then V's, each 256-byte aligned.
pub fn scratch_rows_bytes(ty: KvTypes, rows: usize, n_kv: usize, hd_k: usize, hd_v: usize) -> usize {
    let side = |t: KvType, hd: usize| if converted(t) { (rows * n_kv * hd * 2).div_ceil(256) * 256 } else { 0 };
    side(ty.k, hd_k) + side(ty.v, hd_v)
}

/// Bytes of the prefill scratch for caches of `spec` (what the backend allocates once and
/// `engine::fit` counts): its largest layer's rows, f16, for each quantized side.
pub fn prefill_scratch_bytes(spec: &KvSpec) -> usize {
    let rows = (0..spec.n_layer).map(|l| spec.slots(l)).max().unwrap_or(0);
    scratch_rows_bytes(spec.ty, rows, spec.n_kv_head, spec.head_dim_k, spec.head_dim_v)
}

/// Rows `lo..lo + n_rows` of the quantized sides of planes `kc` / `vc` (type `ty`, rows of
/// `nk` / `nv` values) as f16 into `scratch` ([`scratch_rows_bytes`] of `n_rows`); returns
/// the K and V addresses an f16 kernel reads (row p at `+ p · row`): the scratch moved back
/// by `lo` rows for a converted side, the plane itself for an f16 side.
#[allow(clippy::too_many_arguments)]
pub fn to_f16(d: &dyn Launch, kc: DevPtr, vc: DevPtr, scratch: DevPtr, nk: usize, nv: usize, lo: usize, n_rows: usize, ty: KvTypes) -> Result<(DevPtr, DevPtr), GpuError> {
    let (ty_k, ty_v) = codes(ty)?;
    if nk % 32 != 0 || nv % 32 != 0 {
        return Err(GpuError::Unsupported(format!("kvq_to_f16: rows of {nk} / {nv} values")));
    }
    let (ck, cv) = (converted(ty.k), converted(ty.v));
    let dk = scratch;
    let dv = scratch + if ck { (n_rows * nk * 2).div_ceil(256) as u64 * 256 } else { 0 };
    let back = |p: DevPtr, n: usize| p.wrapping_sub((lo * n * 2) as u64);
    let out = (if ck { back(dk, nk) } else { kc }, if cv { back(dv, nv) } else { vc });
    let (nk, nv) = (if ck { nk } else { 0 }, if cv { nv } else { 0 });
    if n_rows == 0 || nk.max(nv) == 0 {
        return Ok(out);
    }
    let args = ToF16 { kc, vc, dk, dv, nk, nv, lo, n_rows, ty_k, ty_v };
    TO_F16.launch(d, [(n_rows * (nk.max(nv) / 16)).div_ceil(256) as u32, 1, 1], [256, 1, 1], &args)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_counts_the_quantized_sides_only() {
        let q8 = KvTypes::from(KvType::Q8_0);
        assert_eq!(scratch_rows_bytes(q8, 100, 8, 128, 128), 2 * 100 * 8 * 128 * 2);
        let mixed = KvTypes { k: KvType::F16, v: KvType::Q4_0 };
        assert_eq!(scratch_rows_bytes(mixed, 3, 1, 64, 64), 512);
        assert_eq!(scratch_rows_bytes(KvType::F16.into(), 4096, 8, 128, 128), 0);
        assert_eq!(decode_kernel(128), Some("kvq_decode_d128"));
        assert!(decode_kernel(96).is_none());
        assert_eq!(keys_per_part(128), 256);
    }
}
