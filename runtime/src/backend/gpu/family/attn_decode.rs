//! `kernels-hip/attn_decode.hip`: the fused decode attention, one token's
//! q/k norms, RoPE, K/V store and attention over its cache in one launch.
//!
//! The grid is (query heads per KV head, KV heads, parts): the kernel finds its query and
//! KV head without a division. The part count is fixed from the number of keys a query can
//! ever see (the cache size, or the window), never from the position, so a captured decode
//! graph replays unchanged as the cache fills; it is capped at one wave of blocks
//! ([`parts_in_wave`]: long contexts take longer parts, not more waves). The kernel reads
//! the position on the device and uses only as many parts as the keys need (one per
//! [`keys_per_part`] keys at least), merging them through `part` / `cnt` scratch. Inside a
//! block the keys fill the warps in order, so at a short context only the first warps work.

use super::norm_rope::RopeKv;
use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

kernel_args! {
    /// `attn_decode_d<HD>(q, k, v, kc, vc, out, q8, qw, kw, ff, pos, part, cnt, group, n_kv,
    /// n_ctx, n_rot, neox, theta_scale, freq_scale, eps, q_scale, scale, window, n_split,
    /// min_chunk)`.
    pub struct Args {
        q: DevPtr, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>,
        qw: Option<DevPtr>, kw: Option<DevPtr>, ff: Option<DevPtr>, pos: DevPtr, part: DevPtr, cnt: DevPtr,
        group: usize, n_kv: usize, n_ctx: usize, n_rot: usize, neox: bool, theta_scale: f32, freq_scale: f32,
        eps: f32, q_scale: f32, scale: f32, window: usize, n_split: usize, min_chunk: usize,
    }
}

const KERNELS: [(usize, Kernel<Args>); 3] =
    [(64, Kernel::new("attn_decode_d64")), (128, Kernel::new("attn_decode_d128")), (256, Kernel::new("attn_decode_d256"))];

pub const FAMILY: Family = Family {
    name: "attn_decode",
    source: include_str!("../../../../../kernels-hip/attn_decode.hip"),
    kernels: &[&[KERNELS[0].1.sig(), KERNELS[1].1.sig(), KERNELS[2].1.sig()]],
};

/// Threads per block (`AD_THREADS`) and keys each lane-group holds in flight (`AD_U`).
pub const THREADS: usize = 512;
const KEYS_IN_FLIGHT: usize = 4;
/// Head elements per lane (`AD_E`).
const LANE_ELEMS: usize = 16;
/// Most parts a head's keys are split into.
pub const MAX_PARTS: usize = 64;

/// The kernel for head size `hd` (None: not supported; use the unfused ops).
pub fn kernel(hd: usize) -> Option<&'static str> {
    KERNELS.iter().find(|e| e.0 == hd).map(|e| e.1.name)
}

/// Keys one block covers in one iteration (`AD_NSU`): below this the kernel runs one block
/// per head, and a part never holds fewer.
pub fn keys_per_part(hd: usize) -> usize {
    (THREADS / 32) * (32 * LANE_ELEMS / hd) * KEYS_IN_FLIGHT
}

/// The part count for queries that see at most `max_keys` keys, parts of at least
/// `min_keys` keys.
pub fn parts_for(min_keys: usize, max_keys: usize) -> usize {
    max_keys.div_ceil(min_keys.max(1)).clamp(1, MAX_PARTS)
}

/// `parts` capped so that the launch (`n_head` blocks per part) fits one wave of `wave`
/// resident blocks (at least one part). A part count past one wave ran its blocks in waves:
/// on the H200 Qwen3-4B's 32 heads took 17 parts at a 4k cache (4 waves of one block per
/// SM); capped at 4, tg128 @ d4096 went from 402 to 499 t/s (0.6B 998 → 1,195, 8B 344 →
/// 398; BENCHMARKS.md, session 9). Short contexts are unaffected: a part never takes fewer
/// than `keys_per_part` keys, so up to that many keys run one part.
pub fn parts_in_wave(parts: usize, n_head: usize, wave: usize) -> usize {
    parts.min((wave / n_head.max(1)).max(1))
}

/// Bytes of the scratch: `n_head` u32 arrival counters (zero between launches), padded to
/// 256 bytes, then `[n_head, parts, hd + 2]` f32 partial states.
pub fn scratch_bytes(n_head: usize, parts: usize, hd: usize) -> usize {
    counters_bytes(n_head) + n_head * parts * (hd + 2) * 4
}

/// Bytes of the arrival counters at the scratch's start (256-byte padded).
pub fn counters_bytes(n_head: usize) -> usize {
    (n_head * 4).div_ceil(256) * 256
}

/// Shapes and parameters of one launch.
#[derive(Clone, Copy, Debug)]
pub struct AttnDecode {
    /// Heads, head size, the q/k norm's eps, RoPE and q's scale (one token), as the
    /// separate `rope_kv` launch takes them.
    pub prep: RopeKv,
    /// Cache slots (positions at or past it are never served).
    pub n_ctx: usize,
    /// Multiplier of q·k.
    pub scale: f32,
    /// 0: full causal.
    pub window: usize,
    /// From [`parts_for`].
    pub parts: usize,
    /// The fewest keys a part takes (default [`keys_per_part`]).
    pub min_keys: usize,
}

/// Device buffers of one launch.
#[derive(Clone, Copy, Debug)]
pub struct AttnDecodeBufs {
    /// [n_head, hd] f32, [n_kv, hd] f32, [n_kv, hd] f32: the new token's projections (read only).
    pub q: DevPtr,
    pub k: DevPtr,
    pub v: DevPtr,
    /// [n_ctx, n_kv·hd] f16 each; slot pos[0] is written.
    pub kc: DevPtr,
    pub vc: DevPtr,
    /// [n_head, hd] f32.
    pub out: DevPtr,
    /// out's q8_1 blocks [n_head·hd / 32], or none.
    pub q8: Option<DevPtr>,
    /// [hd] f32 norm weights (none: no norm); [n_rot / 2] f32 frequency divisors.
    pub q_norm: Option<DevPtr>,
    pub k_norm: Option<DevPtr>,
    pub freq_factors: Option<DevPtr>,
    /// [1] i32: the new token's position.
    pub pos: DevPtr,
    /// [`scratch_bytes`] bytes, counters zeroed once at allocation.
    pub scratch: DevPtr,
}

/// One launch of the fused decode attention (one token).
pub fn attn_decode(d: &dyn Launch, b: &AttnDecodeBufs, a: &AttnDecode) -> Result<(), GpuError> {
    let p = &a.prep;
    let &(_, kernel) = KERNELS.iter().find(|e| e.0 == p.head_dim).ok_or_else(|| GpuError::Unsupported(format!("attn_decode: head_dim {}", p.head_dim)))?;
    if p.n_kv == 0 || p.n_head % p.n_kv != 0 || p.n_rot > p.head_dim || p.n_rot % 2 != 0 || a.parts == 0 || a.parts > MAX_PARTS || a.n_ctx == 0 {
        return Err(GpuError::Unsupported(format!("attn_decode: heads {}/{}, n_rot {} of {}, {} parts", p.n_head, p.n_kv, p.n_rot, p.head_dim, a.parts)));
    }
    let args = Args {
        q: b.q, k: b.k, v: b.v, kc: b.kc, vc: b.vc, out: b.out, q8: b.q8,
        qw: b.q_norm, kw: b.k_norm, ff: b.freq_factors, pos: b.pos, part: b.scratch + counters_bytes(p.n_head) as u64, cnt: b.scratch,
        group: p.n_head / p.n_kv, n_kv: p.n_kv, n_ctx: a.n_ctx, n_rot: p.n_rot, neox: p.neox, theta_scale: p.theta_scale, freq_scale: p.freq_scale,
        eps: p.eps, q_scale: p.q_scale, scale: a.scale, window: a.window, n_split: a.parts, min_chunk: a.min_keys.max(1),
    };
    kernel.launch(d, [(p.n_head / p.n_kv) as u32, p.n_kv as u32, a.parts as u32], [THREADS as u32, 1, 1], &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_follow_the_keys_a_query_can_see() {
        assert_eq!(keys_per_part(128), 256);
        assert_eq!(keys_per_part(64), 512);
        assert_eq!(keys_per_part(256), 128);
        assert_eq!(parts_for(256, 1), 1);
        assert_eq!(parts_for(256, 256), 1);
        assert_eq!(parts_for(256, 257), 2);
        assert_eq!(parts_for(128, 512), 4);
        assert_eq!(parts_for(512, 1 << 20), MAX_PARTS);
        assert_eq!(scratch_bytes(16, 2, 128), 256 + 16 * 2 * 130 * 4);
        assert!(kernel(80).is_none() && kernel(128).is_some());
    }

    #[test]
    fn parts_fit_one_wave() {
        // Qwen3-4B (32 heads) on 132 SMs of one block each: 4 parts, not 17.
        assert_eq!(parts_in_wave(parts_for(256, 4224), 32, 132), 4);
        // Qwen3-0.6B (16 heads): 8; Gemma 3 270M's 4 heads keep their 4 window parts.
        assert_eq!(parts_in_wave(parts_for(256, 4224), 16, 132), 8);
        assert_eq!(parts_in_wave(parts_for(128, 512), 4, 132), 4);
        // More heads than the wave holds: still one part.
        assert_eq!(parts_in_wave(17, 200, 132), 1);
        assert_eq!(parts_in_wave(3, 8, 0), 1);
    }
}
