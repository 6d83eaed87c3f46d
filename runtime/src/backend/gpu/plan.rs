//! The one place that decides which kernel runs: pure functions from (op, weight types,
//! shapes, token count, what the device holds, the tuning table) to the kernel and its
//! grid. The backend (`backend.rs` and its `backend/` ops) asks here and then launches
//! what it is told; nothing else chooses. No function here touches a device: the only
//! device figures are the multiprocessor count and the resident blocks per
//! multiprocessor of a kernel, asked through [`Occupancy`] ([`Sm90`] answers with sm_90's
//! figures, for the unit tests below and `lode inspect --plan`).
//!
//! The measured reasons for each threshold are in BENCHMARKS.md and `benchmarks/`; the
//! numbers a user may override are in [`Tuning`].

use crate::backend::gpu::family::{attn_decode, decode_mv, dequant, flash_attn, gemm, head_mv, kvq_attn, matvec, mmq, quantize};
use crate::backend::gpu::launch;
use super::tuning::Tuning;
use crate::quant::GgmlType;
use crate::weights::layout::Layout;

/// The device figures the plan reads.
pub trait Occupancy {
    /// Multiprocessors (compute units).
    fn sms(&mut self) -> usize;
    /// Resident blocks of `block` threads of `kernel` per multiprocessor; `sm90` is the
    /// figure on an H200, for a device that cannot say.
    fn per_sm(&mut self, kernel: &'static str, block: u32, sm90: usize) -> usize;
}

/// A device that answers with sm_90's figures (an H200 has 132 multiprocessors).
#[derive(Clone, Copy, Debug)]
pub struct Sm90 {
    pub sms: usize,
}

impl Default for Sm90 {
    fn default() -> Sm90 {
        Sm90 { sms: 132 }
    }
}

impl Occupancy for Sm90 {
    fn sms(&mut self) -> usize {
        self.sms
    }
    fn per_sm(&mut self, _kernel: &'static str, _block: u32, sm90: usize) -> usize {
        sm90
    }
}

/// A matrix weight as the kernels see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weight {
    pub ty: GgmlType,
    pub layout: Layout,
    pub rows: usize,
    /// Row length (the input's length).
    pub k: usize,
}

/// `decode_mv_quant` / `decode_mv_quant2`: one token, the input quantized in the prologue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantMv {
    /// Warps per row (1, or `decode_mv::quant_warps_per_row`'s figure).
    pub wpr: usize,
    pub rows_per_block: usize,
    /// `decode_mv_quant2` where the rows have that form (`decode_mv::takes_two`).
    pub two: bool,
}

/// Rows per `decode_mv_quant` block: as many as fit 32 warps, up to 16. Fewer, larger
/// blocks leave more multiprocessors empty for the next kernel to start on during this one
/// (H200, Qwen3-0.6B tg128: 16 rows 1,955–1,993 t/s, 8 rows 1,920–1,944, 32 rows
/// 1,952–1,960; with `decode_mv_quant2` 16 stays best or equal).
const QUANT_ROWS: usize = 16;

/// How one matmul runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matmul {
    /// Dequantize to a transient f16 slab, then cuBLAS / hipBLAS (`prefill_blas.rs`).
    Blas,
    /// One token, input quantized inside the launch (`decode_mv::quant_mv`).
    QuantMv(QuantMv),
    /// One token over rows of 2–16 K-quant steps: one warp per step over a resident row
    /// walk of `blocks` blocks (`decode_mv::split_walk`).
    SplitWalk { steps: usize, blocks: usize },
    /// The matrix-core GEMM with this token tile (`gemm::gemm`).
    Gemm { tile: usize },
    /// The multi-column matvec over the input's quantized (or f32) form (`matvec::matvec`).
    Matvec,
    /// Float weights over 2+ tokens: 32 × 32 tiles, one launch (`matvec::float_tile`).
    FloatTile,
    /// A decode batch: the GEMM with one 64-token tile, K split over `splits` blocks of
    /// `per` steps per row tile (`gemm::gemm_split`).
    GemmSplit { splits: usize, per: usize },
    /// A decode batch in `Tuning::mmq`'s range: the integer GEMM over the input's int8
    /// blocks, K split over `splits` ranges of `per` steps, on int8 matrix cores when `mma`
    /// (`mmq::mmq`).
    Mmq { splits: usize, per: usize, mma: bool },
}

/// What [`matmul`] is asked.
#[derive(Clone, Copy, Debug)]
pub struct MatmulIn {
    pub w: Weight,
    pub n_tok: usize,
    /// A BLAS library is open (asked only when [`blas_candidate`] says so).
    pub blas: bool,
    /// The input and output are one buffer.
    pub x_is_y: bool,
    /// The input's quantized form for this weight is already current.
    pub x_ready: bool,
}

/// Whether a matmul of `n_tok` tokens over `w` would go to the BLAS if a library opens
/// (the backend opens it on the first such matmul, never for decode-only runs).
pub fn blas_candidate(w: &Weight, n_tok: usize, t: &Tuning) -> bool {
    t.blas && n_tok >= t.blas_min_tokens.max(2) && dequant::supports(w.ty, w.layout)
}

fn fused_mv(t: &Tuning) -> bool {
    t.fuse && t.fuse_mv
}

/// Whether `kernel` over `rows` rows (8 per block of 256 threads) is one wave here.
fn fits(o: &mut dyn Occupancy, kernel: &'static str, rows: usize) -> bool {
    let sms = o.sms();
    let per_sm = o.per_sm(kernel, decode_mv::BLOCK, decode_mv::blocks_per_sm(kernel));
    decode_mv::fits_one_wave_at(rows, sms, per_sm)
}

/// The one-token matmul whose input has no current quantized form, as one launch that
/// quantizes in its prologue: when the rows fit one wave of its blocks.
pub fn quant_mv(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Option<QuantMv> {
    let (ty, k, rows) = (q.w.ty, q.w.k, q.w.rows);
    if !fused_mv(t) || q.n_tok != 1 || quantize::act_fmt(ty).is_none() || q.x_is_y || q.x_ready {
        return None;
    }
    if k > decode_mv::QUANT_MAX || !decode_mv::supports(ty, k) || !fits(o, "decode_mv_quant", rows) {
        return None;
    }
    // A row of 2–4 steps one warp per step, when those larger blocks still fit one wave.
    let mut wpr = decode_mv::quant_warps_per_row(ty, k);
    if wpr > 1 {
        let sms = o.sms();
        let per_sm = o.per_sm("decode_mv_quant", decode_mv::BLOCK * wpr as u32, 4 / wpr);
        if !decode_mv::fits_one_wave_at(rows, sms, per_sm) {
            wpr = 1;
        }
    }
    Some(QuantMv { wpr, rows_per_block: decode_mv::quant_rows_per_block(QUANT_ROWS, wpr), two: decode_mv::takes_two(ty, k, wpr) })
}

/// One token with rows of 2–16 K-quant steps (4B / 8B down) reading the input's K form.
fn split_walk(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Option<(usize, usize)> {
    let steps = decode_mv::split_steps(q.w.ty, q.w.k)?;
    if !fused_mv(t) || q.n_tok != 1 || q.x_is_y || quantize::act_fmt(q.w.ty) != Some(launch::ActFmt::K) {
        return None;
    }
    let sms = o.sms();
    let per_sm = o.per_sm("decode_mv_split", 32 * steps as u32, 2);
    (per_sm > 0).then(|| (steps, (sms * per_sm).min(q.w.rows)))
}

/// The GEMM's token tile for `n` tokens over `m` rows, when the GEMM takes the matmul:
/// two or more tokens, at least `gemm_min` (below, the matvec reading the same copy wins:
/// H200, at 16 tokens it won 4 of 6 qwen3-4b shapes by up to 2.2×), a type the GEMM reads.
/// 16 tokens per tile for few tokens (less padding; also up to 64 tokens when m is small,
/// for more blocks), else 64. (Measured and dropped: the 128-token tile spilled and ran
/// 20–35 % slower; 64-row blocks ran 0.55–0.75× on every preset shape but one.)
pub fn gemm_tile(w: &Weight, n_tok: usize, t: &Tuning) -> Option<usize> {
    if n_tok < 2 || n_tok < t.gemm_min_tokens || !gemm::gemm_supports(w.ty, w.layout) {
        return None;
    }
    Some(tile(n_tok, w.rows))
}

/// The GEMM's token tile for `n` tokens over `m` rows (see [`gemm_tile`]).
pub fn tile(n: usize, m: usize) -> usize {
    if n < 48 || (n <= 64 && m < 8192) {
        16
    } else {
        64
    }
}

/// Whether a matmul of `n_tok` tokens over `w` is a decode batch for [`small_batch`].
pub fn is_small_batch(w: &Weight, n_tok: usize, t: &Tuning) -> bool {
    matches!(t.batch_gemm, Some((lo, hi)) if (lo..=hi).contains(&n_tok)) && gemm::gemm_supports(w.ty, w.layout)
}

/// A decode batch (`Tuning::batch_gemm` tokens): one 64-token tile, so each weight is
/// read once for every sequence, and the K steps split over enough blocks per row tile
/// that the row tiles fill every multiprocessor twice (each split at least 2 steps; a
/// 2560-row projection has 20 row tiles). The 16-token tile (86 µs per Q4_K projection at
/// 32 tokens on the H100) and dequantize + BLAS lost to llama.cpp 0.26× at 32 sequences.
fn small_batch(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Option<Matmul> {
    if !is_small_batch(&q.w, q.n_tok, t) {
        return None;
    }
    let (tiles, steps) = (gemm::row_tiles(q.w.rows), gemm::k_steps(q.w.k));
    let want = (2 * o.sms()).div_ceil(tiles).min(steps / 2);
    if want <= 1 {
        return Some(Matmul::Gemm { tile: 64 });
    }
    let per = steps.div_ceil(want);
    Some(Matmul::GemmSplit { splits: steps.div_ceil(per), per })
}

/// Whether `Tuning::mmq` holds `n_tok` and the integer GEMM reads `w`.
fn mmq_takes(w: &Weight, n_tok: usize, t: &Tuning) -> bool {
    matches!(t.mmq, Some((lo, hi)) if (lo..=hi).contains(&n_tok)) && mmq::supports(w.ty, w.layout, w.k)
}

/// The integer GEMM for a decode batch, its K steps split so that the row blocks fill one
/// wave (each split at least 2 steps). Ahead of `batch_gemm` where both ranges hold.
fn mmq(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Option<Matmul> {
    let mma = t.mmq_mma && mmq::has_mma(q.w.ty);
    let name = mmq::kernel_name(q.w.ty, q.n_tok, mma).filter(|_| mmq_takes(&q.w, q.n_tok, t))?;
    let (blocks, steps) = (mmq::row_blocks(q.w.ty, q.w.rows), mmq::k_steps(q.w.k));
    let wave = o.sms() * o.per_sm(name, 256, 2).max(1);
    let per = steps.div_ceil(wave.div_ceil(blocks).min(steps / 2).max(1));
    Some(Matmul::Mmq { splits: steps.div_ceil(per), per, mma })
}

/// How one matmul runs.
pub fn matmul(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Matmul {
    if let Some(m) = mmq(q, t, o).or_else(|| small_batch(q, t, o)) {
        return m;
    }
    if q.blas && blas_candidate(&q.w, q.n_tok, t) {
        return Matmul::Blas;
    }
    if let Some(m) = quant_mv(q, t, o) {
        return Matmul::QuantMv(m);
    }
    if let Some((steps, blocks)) = split_walk(q, t, o) {
        return Matmul::SplitWalk { steps, blocks };
    }
    match gemm_tile(&q.w, q.n_tok, t) {
        Some(tile) => Matmul::Gemm { tile },
        // H200, qwen3-30b-a3b pp512: the n8 matvec over the 128-row F32 router took 82 %
        // of prefill (64 launches of 99 µs per layer).
        None if q.n_tok >= 2 && matvec::float_tile_supports(q.w.ty) => Matmul::FloatTile,
        None => Matmul::Matvec,
    }
}

/// A projection into the residual stream: `Some` when one launch adds the product into
/// the residual in its epilogue (`decode_mv_quant` with `acc`); else the plain [`matmul`]
/// writes a separate output for the next norm to add.
pub fn matmul_residual(q: &MatmulIn, t: &Tuning, o: &mut dyn Occupancy) -> Option<QuantMv> {
    if q.blas && blas_candidate(&q.w, q.n_tok, t) {
        return None;
    }
    quant_mv(q, t, o)
}

/// How the projections of one input (q/k/v, gate/up) run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Multi {
    /// One matvec launch over 1–3 weights (`matvec::matvec_multi`).
    Fused,
    /// Q4_K weights too many rows for one wave of the plain kernel: a resident row walk
    /// of `blocks` blocks (`matvec::matvec_q4k_loop`).
    Q4kLoop { blocks: usize },
    /// Each weight as its own [`matmul`].
    Each,
}

/// How `matmul_multi` of these weights runs.
pub fn matmul_multi(ws: &[Weight], n_tok: usize, t: &Tuning, o: &mut dyn Occupancy) -> Multi {
    let k = ws.first().map(|w| w.k).unwrap_or(0);
    if !t.fuse || n_tok != 1 || !(1..=3).contains(&ws.len()) || !ws.iter().all(|w| w.k == k && matvec::multi_supports(w.ty, k)) {
        return Multi::Each;
    }
    let q4k = k % 256 == 0 && k / 256 <= 16 && ws.iter().all(|w| w.ty == GgmlType::Q4_K);
    if q4k {
        let sms = o.sms();
        let plain = o.per_sm("matvec_multi4_n1", 128, 8);
        let rows: usize = ws.iter().map(|w| w.rows).sum();
        if rows.div_ceil(4) > sms * plain {
            let per_sm = o.per_sm("matvec_q4k_loop_n1", 128, 6);
            if per_sm > 0 {
                return Multi::Q4kLoop { blocks: sms * per_sm };
            }
        }
    }
    Multi::Fused
}

/// How gate/up with the GLU runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluPlan {
    /// The paired GEMM with the GLU in its epilogue (`gemm::gemm_glu`).
    GemmGlu,
    /// `matmul_multi` of gate and up, then the GLU.
    Separate,
}

/// How `matmul_glu` runs; `blas`: both weights would go to an open BLAS.
pub fn matmul_glu(gate: &Weight, up: &Weight, n_tok: usize, blas: bool, t: &Tuning) -> GluPlan {
    let same = gate == up;
    let both_blas = blas && blas_candidate(gate, n_tok, t) && blas_candidate(up, n_tok, t);
    // A decode batch splits K (or runs the integer GEMM): each projection by itself, the GLU after.
    if !both_blas && same && gemm_tile(gate, n_tok, t).is_some() && !is_small_batch(gate, n_tok, t) && !mmq_takes(gate, n_tok, t) {
        GluPlan::GemmGlu
    } else {
        GluPlan::Separate
    }
}

/// How a one-token norm and the matvecs after it run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormMv {
    /// One launch of one wave: the norm in every block's prologue (`decode_mv::norm_multi`
    /// / `norm_glu`); `threads` per block, `half`: the half-warp form.
    Fused { threads: u32, half: bool },
    /// One launch of `blocks` resident blocks whose warps walk the rows
    /// (`decode_mv::norm_walk`).
    Walk { blocks: usize },
    /// The LM head: a staged Q6_K walk of `blocks` blocks (`head_mv::norm_head`).
    Head { blocks: usize },
    /// The norm, then the matmuls.
    Unfused,
}

/// What [`norm_multi`] / [`norm_glu`] are asked.
#[derive(Clone, Copy, Debug)]
pub struct NormIn {
    /// The norm's row length.
    pub n: usize,
    pub n_tok: usize,
    /// The norm weight (if any) has `n` values and no two of the launch's buffers are one.
    pub buffers_ok: bool,
    /// The first weight's device address (the LM head's bulk copies need 16 bytes).
    pub w_addr: u64,
}

/// Whether the norm's weight has a row's values and no two of a fused launch's buffers
/// (x, out, add and the outputs: the kernel reads x and add in every block and writes x,
/// out and the outputs) are one: [`NormIn::buffers_ok`].
pub fn norm_buffers_ok(n: &crate::backend::NormIn, outs: &[crate::backend::Buf]) -> bool {
    let w_ok = n.w.map(|w| w.row_len() * w.n_rows() == n.row_len).unwrap_or(true);
    let mut seen = vec![n.x, n.out];
    seen.extend(n.add);
    seen.extend_from_slice(outs);
    w_ok && seen.iter().enumerate().all(|(i, a)| !seen[..i].contains(a))
}

/// Whether the norm kernels take weights `ws` behind a norm of rows of `n` (`one_wave`:
/// the one-wave kernels, which take no Q3_K: `decode_mv::norm_supports`).
fn norm_takes(n: &NormIn, ws: &[Weight], one_wave: bool) -> bool {
    let ok = |ty| if one_wave { decode_mv::norm_supports(ty, n.n) } else { decode_mv::supports(ty, n.n) };
    n.buffers_ok && n.n <= decode_mv::NORM_MAX && ws.iter().all(|w| w.k == n.n && ok(w.ty))
}

/// Threads per block of a fused norm launch over segments of `rows`: the wide kernel when
/// one exists for `n` and its blocks fit one wave; else 256.
fn norm_threads(o: &mut dyn Occupancy, n: usize, glu: bool, rows: &[usize]) -> u32 {
    let Some(kernel) = decode_mv::wide_kernel(n, glu) else { return decode_mv::BLOCK };
    let sms = o.sms();
    let per_sm = o.per_sm(kernel, decode_mv::WIDE, 1);
    let blocks: usize = rows.iter().map(|r| r.div_ceil(decode_mv::WIDE as usize / 32)).sum();
    if blocks <= sms * per_sm {
        decode_mv::WIDE
    } else {
        decode_mv::BLOCK
    }
}

fn fused(o: &mut dyn Occupancy, n: usize, glu: bool, ws: &[Weight], rows: &[usize]) -> NormMv {
    let threads = norm_threads(o, n, glu, rows);
    let tys: Vec<GgmlType> = ws.iter().map(|w| w.ty).collect();
    NormMv::Fused { threads, half: threads == decode_mv::WIDE && decode_mv::half_supports(n, &tys[..if glu { 1 } else { tys.len() }]) }
}

/// The resident row walk for a norm and 1–3 Q4_K matvecs (the last may be Q6_K), or 1–3
/// of one of Q2_K / Q3_K / IQ4_XS (the last may be another K-quant): `decode_mv::walk_kernel`.
fn walk(n: &NormIn, ws: &[Weight], o: &mut dyn Occupancy) -> Option<NormMv> {
    let tys: Vec<GgmlType> = ws.iter().map(|w| w.ty).collect();
    let kernel = decode_mv::walk_kernel(n.n, &tys)?;
    if !norm_takes(n, ws, false) {
        return None;
    }
    let sms = o.sms();
    let per_sm = o.per_sm(kernel, decode_mv::BLOCK, 2);
    (per_sm > 0).then_some(NormMv::Walk { blocks: sms * per_sm })
}

/// How `norm_matmul_multi` of one token runs (more tokens: always [`NormMv::Unfused`]).
pub fn norm_multi(n: &NormIn, ws: &[Weight], t: &Tuning, o: &mut dyn Occupancy) -> NormMv {
    if !fused_mv(t) || n.n_tok != 1 {
        return NormMv::Unfused;
    }
    let rows: usize = ws.iter().map(|w| w.rows).sum();
    let fit = (1..=3).contains(&ws.len()) && fits(o, decode_mv::norm_kernel(n.n, false), rows);
    if fit && norm_takes(n, ws, true) {
        let seg_rows: Vec<usize> = ws.iter().map(|w| w.rows).collect();
        return fused(o, n.n, false, ws, &seg_rows);
    }
    // Rows past one wave, or Q3_K weights (which the one-wave kernels do not take).
    if let Some(p) = walk(n, ws, o) {
        return p;
    }
    if fit {
        return NormMv::Unfused;
    }
    if let [w] = ws {
        if head_mv::supports(w.ty, n.n, w.rows, n.w_addr) && norm_takes(n, ws, false) {
            let sms = o.sms();
            let per_sm = o.per_sm(head_mv::kernel(n.n), head_mv::BLOCK, 3);
            return NormMv::Head { blocks: head_mv::grid(w.rows, sms, per_sm) };
        }
    }
    NormMv::Unfused
}

/// How `norm_matmul_glu` of one token runs ([`NormMv::Head`] never).
pub fn norm_glu(n: &NormIn, gate: &Weight, up: &Weight, t: &Tuning, o: &mut dyn Occupancy) -> NormMv {
    if !fused_mv(t) || n.n_tok != 1 || gate != up {
        return NormMv::Unfused;
    }
    if fits(o, decode_mv::norm_kernel(n.n, true), gate.rows) && norm_takes(n, &[*gate, *up], true) {
        return fused(o, n.n, true, &[*gate], &[gate.rows]);
    }
    walk(n, &[*gate, *up], o).unwrap_or(NormMv::Unfused)
}

/// Whether `x += b; out = rms_norm(x)` runs as one launch (`norm_rope::add_rmsnorm_q8`).
pub fn add_rms_norm(row_len: usize, aliased: bool, t: &Tuning) -> bool {
    t.fuse && row_len % 32 == 0 && !aliased
}

/// The shapes of a q/k/v preparation as [`rope_kv`] and [`rope_kv_attention`] see them.
#[derive(Clone, Copy, Debug)]
pub struct QkvShape {
    pub head_dim: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub n_rot: usize,
    /// The per-head norms (if any) have `head_dim` values; q, k, v (and out) are distinct.
    pub buffers_ok: bool,
    /// The cache's head size (K and V) and KV heads.
    pub cache_head_dim: (usize, usize),
    pub cache_kv_heads: usize,
    /// f16 K and V (the fused decode attention's only cache); `rope_kv` also stores Q8_0 /
    /// Q4_0 blocks beside f16 (`cache_blocks`).
    pub cache_f16: bool,
    pub cache_blocks: bool,
}

impl QkvShape {
    /// The shape of `p` against a cache of `spec`.
    pub fn of(p: &crate::backend::QkvPrep, spec: &crate::backend::KvSpec, buffers_ok: bool) -> QkvShape {
        QkvShape {
            head_dim: p.head_dim,
            n_head: p.n_head,
            n_kv_head: p.n_kv_head,
            n_rot: p.rope.n_rot,
            buffers_ok,
            cache_head_dim: (spec.head_dim_k, spec.head_dim_v),
            cache_kv_heads: spec.n_kv_head,
            cache_f16: spec.ty == crate::backend::KvType::F16.into(),
            cache_blocks: spec.ty.any_quantized() && ![spec.ty.k, spec.ty.v].contains(&crate::backend::KvType::F32),
        }
    }

    fn matches_cache(&self) -> bool { self.cache_f16 && self.matches_shape() }
    fn matches_shape(&self) -> bool {
        self.cache_head_dim == (self.head_dim, self.head_dim) && self.cache_kv_heads == self.n_kv_head && self.n_rot <= self.head_dim && self.n_rot % 2 == 0
    }
}

/// Whether the per-head norms, RoPE and the K/V store run as one launch (`norm_rope::rope_kv`).
pub fn rope_kv(s: &QkvShape, t: &Tuning) -> bool {
    t.fuse && s.head_dim <= 256 && s.buffers_ok && (s.matches_cache() || (s.cache_blocks && s.head_dim % 32 == 0 && s.matches_shape()))
}

/// The fused one-token attention: keys per part and parts per head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnDecode {
    pub kernel: &'static str,
    pub min_keys: usize,
    pub parts: usize,
}

/// Whether `rope_kv_attention` of one token runs as the one fused kernel
/// (`attn_decode::attn_decode`), and how its keys split: parts of at least one block
/// iteration of keys (or `attn_part_keys`), at most one wave of blocks (long contexts
/// then take longer parts, not more waves). `max_keys`: the cache's slots (or the window).
/// `attn`: the attention's (head_dim_k, head_dim_v, n_head, n_kv_head).
pub fn rope_kv_attention(s: &QkvShape, n_tok: usize, attn: (usize, usize, usize, usize), max_keys: usize, t: &Tuning, o: &mut dyn Occupancy) -> Option<AttnDecode> {
    let hd = s.head_dim;
    let kernel = attn_decode::kernel(hd)?;
    let ok = t.fuse && t.fuse_attn && n_tok == 1 && attn == (hd, hd, s.n_head, s.n_kv_head) && s.n_kv_head > 0 && s.n_head % s.n_kv_head == 0 && s.buffers_ok && s.matches_cache();
    if !ok {
        return None;
    }
    let min_keys = t.attn_part_keys.unwrap_or_else(|| attn_decode::keys_per_part(hd));
    let mut parts = attn_decode::parts_for(min_keys, max_keys);
    if t.attn_part_keys.is_none() {
        let sms = o.sms();
        let wave = sms * o.per_sm(kernel, attn_decode::THREADS as u32, 1);
        parts = attn_decode::parts_in_wave(parts, s.n_head, wave);
    }
    Some(AttnDecode { kernel, min_keys, parts })
}

/// How attention over the cache runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attn {
    /// Two or more queries: the FlashAttention-2 style kernel on matrix cores.
    Flash { kernel: &'static str },
    /// Per query, one block per head; `q8`: it also writes the output projection's q8_1 input.
    Decode { q8: bool },
    /// One query over a Q8_0 / Q4_0 K or V: `kvq_decode_d<HD>`, split over the keys as the
    /// fused f16 decode (`parts` per head of at least `min_keys` keys); `q8` as `Decode`.
    QuantDecode { kernel: &'static str, q8: bool, parts: usize, min_keys: usize },
    /// Two or more queries over such a cache: their rows to an f16 scratch (`kvq_to_f16`),
    /// then the flash `kernel` over it.
    QuantFlash { kernel: &'static str },
    /// Such a cache at other head sizes: `attn_kvq` (one block per query and head).
    Quant { q8: bool },
}

/// What `attention` is asked: `max_keys`, the most keys a query can see (cache slots or
/// window); `wants_k`, the output projection reads the K form (the per-head kernels cannot
/// write it); `sinks`, attention sinks (gpt-oss).
#[derive(Clone, Copy, Debug)]
pub struct AttnShape { pub n_tok: usize, pub head_dim: usize, pub n_head: usize, pub max_keys: usize, pub wants_k: bool, pub kv: crate::backend::KvTypes, pub sinks: bool }

/// How `attention` of `s.n_tok` queries runs. Over a quantized cache a decode query splits
/// its keys as `rope_kv_attention` does; a prefill chunk converts the rows it sees to f16
/// once per layer for the flash kernel (why not a flash kernel over the blocks: kvq_attn.rs).
pub fn attention(s: &AttnShape, t: &Tuning, o: &mut dyn Occupancy) -> Attn {
    let q8 = t.fuse && s.n_tok == 1 && s.head_dim % 32 == 0 && !s.wants_k;
    if s.kv.any_quantized() {
        if s.n_tok >= 2 && flash_attn::flash_supports(s.head_dim) && !s.sinks {
            return Attn::QuantFlash { kernel: flash_attn::kernel_for(s.head_dim) };
        }
        if let (1, Some(kernel)) = (s.n_tok, kvq_attn::decode_kernel(s.head_dim)) {
            let min_keys = t.attn_part_keys.unwrap_or_else(|| kvq_attn::keys_per_part(s.head_dim));
            let mut parts = attn_decode::parts_for(min_keys, s.max_keys);
            if t.attn_part_keys.is_none() {
                let wave = o.sms() * o.per_sm(kernel, kvq_attn::THREADS as u32, 1);
                parts = attn_decode::parts_in_wave(parts, s.n_head, wave);
            }
            return Attn::QuantDecode { kernel, q8, parts, min_keys };
        }
        return Attn::Quant { q8 };
    }
    // Attention sinks (gpt-oss): only `attn_f16` adds them, prefill included.
    if s.n_tok >= 2 && flash_attn::flash_supports(s.head_dim) && !s.sinks {
        return Attn::Flash { kernel: flash_attn::kernel_for(s.head_dim) };
    }
    Attn::Decode { q8: t.fuse && s.head_dim % 32 == 0 && !s.wants_k }
}

/// How new K/V rows are stored: converted to f16 (`kv_store_f16`) or, with a Q8_0 / Q4_0
/// K or V, quantized block by block (`kv_store_q`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvStore { F16, Quant }

pub fn kv_store(kv: crate::backend::KvTypes) -> KvStore {
    if kv.any_quantized() { KvStore::Quant } else { KvStore::F16 }
}

/// Whether a batched decode step's rows store and attend in one launch each
/// (`kv_store_f16_rows`, `attn_f16_rows`: f16 caches), else row by row.
pub fn attention_rows_batched(kv: crate::backend::KvTypes) -> bool {
    !kv.any_quantized()
}

mod layers;
pub use layers::*;

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
