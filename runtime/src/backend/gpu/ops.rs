//! Typed launchers: one function per kernel, checking shapes and types on the host and
//! choosing the grid. Buffers are passed as device addresses with shape comments; the
//! caller owns them (and their sizes). Vendor-neutral: these go through `GpuDevice`.

use super::driver::{DevPtr, KArg};
pub use super::launch::{ActFmt, Launch};
use super::GpuError;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

fn ceil(a: usize, b: usize) -> u32 {
    a.div_ceil(b) as u32
}

fn i(v: usize) -> KArg {
    KArg::I32(v as i32)
}

/// Bytes of q8_1 activations for `rows` rows of `k` values.
pub fn q8_1_bytes(k: usize, rows: usize) -> usize {
    rows * k.div_ceil(32) * 36
}

/// x: [rows, k] f32 → y: [rows, ceil(k/32)] q8_1 blocks.
pub fn quantize_q8_1(d: &dyn Launch, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    let kb = k.div_ceil(32);
    d.launch("quantize_q8_1", [ceil(kb, 8), rows as u32, 1], [256, 1, 1], &[KArg::Ptr(x), KArg::Ptr(y), i(k), i(kb)])?;
    Ok(())
}


/// The activation format matvecs of `ty` read (None: float weights, f32 activations).
pub fn act_fmt(ty: GgmlType) -> Option<ActFmt> {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q8_0 => Some(ActFmt::Q8_1),
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K => Some(ActFmt::K),
        _ => None,
    }
}

fn check_group(op: &str, fmt: ActFmt, n: usize) -> R {
    if n % fmt.group() != 0 {
        return Err(unsupported(format!("{op}: {n} values are not whole {}-value groups of the {fmt:?} activation form", fmt.group())));
    }
    Ok(())
}

/// x: [rows, k] f32 → y: [rows, k/32] blocks of `fmt` (the K form needs k % 256 == 0).
pub fn quantize_act(d: &dyn Launch, fmt: ActFmt, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    match fmt {
        ActFmt::Q8_1 => quantize_q8_1(d, x, y, k, rows),
        ActFmt::K => {
            check_group("quantize_act", fmt, k)?;
            if rows == 0 || k == 0 {
                return Ok(());
            }
            d.launch("quantize_q8_k", [ceil(k, 2048), rows as u32, 1], [256, 1, 1], &[KArg::Ptr(x), KArg::Ptr(y), i(k)])?;
            Ok(())
        }
    }
}

/// y = x quantized to `fmt` and back to f32 (code × scale as the matvec reads it), for the
/// prefill GEMM. x, y: [rows, k] f32 (may alias); k whole groups of `fmt`.
pub fn quantize_dq(d: &dyn Launch, fmt: ActFmt, x: DevPtr, y: DevPtr, k: usize, rows: usize) -> R {
    check_group("quantize_dq", fmt, k)?;
    if rows == 0 || k == 0 {
        return Ok(());
    }
    let (name, grid) = match fmt {
        ActFmt::Q8_1 => ("quantize_dq_q8_1", ceil(k, 256)),
        ActFmt::K => ("quantize_dq_q8_k", ceil(k, 2048)),
    };
    d.launch(name, [grid, rows as u32, 1], [256, 1, 1], &[KArg::Ptr(x), KArg::Ptr(y), i(k)])?;
    Ok(())
}

/// True when the matvec for `ty` takes q8_1 activations (else f32).
pub fn matvec_takes_q8_1(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

fn matvec_names(ty: GgmlType) -> Option<(&'static str, &'static str)> {
    Some(match ty {
        GgmlType::F32 => ("matvec_f32_n1", "matvec_f32_n8"),
        GgmlType::F16 => ("matvec_f16_n1", "matvec_f16_n8"),
        GgmlType::BF16 => ("matvec_bf16_n1", "matvec_bf16_n8"),
        GgmlType::Q4_0 => ("matvec_q4_0_n1", "matvec_q4_0_n8"),
        GgmlType::Q4_1 => ("matvec_q4_1_n1", "matvec_q4_1_n8"),
        GgmlType::Q5_0 => ("matvec_q5_0_n1", "matvec_q5_0_n8"),
        GgmlType::Q5_1 => ("matvec_q5_1_n1", "matvec_q5_1_n8"),
        GgmlType::Q8_0 => ("matvec_q8_0_n1", "matvec_q8_0_n8"),
        GgmlType::Q4_K => ("matvec_q4_K_n1", "matvec_q4_K_n8"),
        GgmlType::Q5_K => ("matvec_q5_K_n1", "matvec_q5_K_n8"),
        GgmlType::Q6_K => ("matvec_q6_K_n1", "matvec_q6_K_n8"),
        _ => return None,
    })
}

/// y[c][r] = Σ_k W[r][k]·x[c][k] for c < ncols.
/// w: [rows, k] of `ty` (stored layout); x: [ncols, k] f32, or [ncols, k/32] blocks of
/// `act_fmt(ty)` when [`matvec_takes_q8_1`]; y: [ncols, rows] f32.
pub fn matvec(d: &dyn Launch, w: DevPtr, ty: GgmlType, rows: usize, k: usize, x: DevPtr, y: DevPtr, ncols: usize) -> R {
    let (n1, n8) = matvec_names(ty).ok_or_else(|| unsupported(format!("matvec of {ty} weights")))?;
    if k % ty.block_elems() != 0 {
        return Err(unsupported(format!("matvec: k = {k} is not a multiple of {ty}'s {}-element block", ty.block_elems())));
    }
    let x_col_bytes = if matvec_takes_q8_1(ty) { q8_1_bytes(k, 1) } else { k * 4 };
    let grid = [ceil(rows, 4), 1, 1];
    let mut c = 0;
    while c < ncols {
        let n = (ncols - c).min(8);
        let name = if n == 1 { n1 } else { n8 };
        let xa = x + (c * x_col_bytes) as u64;
        let ya = y + (c * rows * 4) as u64;
        d.launch(name, grid, [128, 1, 1], &[KArg::Ptr(w), KArg::Ptr(xa), KArg::Ptr(ya), i(rows), i(k), i(n)])?;
        c += n;
    }
    Ok(())
}

/// y = x / rms(x) · w over rows of n. x, y: [rows, n] f32 (may alias); w: [n] or none.
pub fn rmsnorm(d: &dyn Launch, x: DevPtr, w: Option<DevPtr>, y: DevPtr, rows: usize, n: usize, eps: f32) -> R {
    d.launch("rmsnorm_f32", [rows as u32, 1, 1], [256, 1, 1], &[KArg::Ptr(x), KArg::Ptr(w.unwrap_or(0)), KArg::Ptr(y), i(n), KArg::F32(eps)])?;
    Ok(())
}

/// RoPE's per-pair angle factor `base^(-2/n_rot)`, computed exactly as the CPU backend
/// does (f32 `powf`): the kernels multiply the position by it once per pair, in f32, as
/// ggml does, so GPU and CPU angles agree to the bit before sin/cos.
pub fn rope_theta_scale(base: f32, n_rot: usize) -> f32 {
    base.powf(-2.0 / n_rot as f32)
}

/// RoPE in place. x: [n_tok, n_head, head_dim] f32; pos: [n_tok] i32; ff: [n_rot/2] f32
/// frequency divisors or none. Angle of pair i: freq_scale · (pos · theta_scale^i / ff_i).
#[allow(clippy::too_many_arguments)]
pub fn rope(d: &dyn Launch, x: DevPtr, pos: DevPtr, ff: Option<DevPtr>, n_tok: usize, n_head: usize, head_dim: usize, n_rot: usize, neox: bool, theta_scale: f32, freq_scale: f32, attn_factor: f32) -> R {
    if n_rot > head_dim || n_rot % 2 != 0 {
        return Err(unsupported(format!("rope: n_rot {n_rot} with head_dim {head_dim}")));
    }
    d.launch(
        "rope_f32",
        [n_tok as u32, n_head as u32, 1],
        [128, 1, 1],
        &[KArg::Ptr(x), KArg::Ptr(pos), KArg::Ptr(ff.unwrap_or(0)), i(n_head), i(head_dim), i(n_rot), i(neox as usize), KArg::F32(theta_scale), KArg::F32(freq_scale), KArg::F32(attn_factor)],
    )?;
    Ok(())
}

/// Shapes and parameters of [`rope_kv`].
#[derive(Clone, Copy, Debug)]
pub struct RopeKv {
    pub n_tok: usize,
    pub n_head: usize,
    pub n_kv: usize,
    pub head_dim: usize,
    pub n_rot: usize,
    pub neox: bool,
    pub theta_scale: f32,
    pub freq_scale: f32,
    pub eps: f32,
    pub q_scale: f32,
}

impl RopeKv {
    /// The launch parameters of `n_tok` tokens prepared as `p` says (RoPE's angle factor
    /// computed as the CPU does, [`rope_theta_scale`]).
    pub fn new(n_tok: usize, p: &crate::backend::QkvPrep) -> RopeKv {
        RopeKv {
            n_tok,
            n_head: p.n_head,
            n_kv: p.n_kv_head,
            head_dim: p.head_dim,
            n_rot: p.rope.n_rot,
            neox: p.rope.mode == crate::backend::RopeMode::Neox,
            theta_scale: rope_theta_scale(p.rope.freq_base, p.rope.n_rot),
            freq_scale: p.rope.freq_scale,
            eps: p.eps,
            q_scale: p.q_scale.unwrap_or(1.0),
        }
    }
}

/// One launch after the q/k/v projections: per-head RMSNorm of q and k (when `qw` / `kw`
/// are given, each [head_dim] f32), RoPE of both, q scaled by `q_scale`, q and k written
/// back, k and v stored as f16 at cache rows pos[t].
/// q: [n_tok, n_head, hd] f32; k, v: [n_tok, n_kv, hd] f32; kc, vc: [n_ctx, n_kv·hd] f16;
/// pos: [n_tok] i32; ff: [n_rot/2] f32 or none.
#[allow(clippy::too_many_arguments)]
pub fn rope_kv(d: &dyn Launch, q: DevPtr, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, qw: Option<DevPtr>, kw: Option<DevPtr>, pos: DevPtr, ff: Option<DevPtr>, p: &RopeKv) -> R {
    if p.n_rot > p.head_dim || p.n_rot % 2 != 0 || p.head_dim > 256 || p.head_dim == 0 {
        return Err(unsupported(format!("rope_kv: n_rot {} with head_dim {}", p.n_rot, p.head_dim)));
    }
    if p.n_tok == 0 {
        return Ok(());
    }
    d.launch(
        "rope_kv_f32",
        [p.n_tok as u32, (p.n_head + 2 * p.n_kv) as u32, 1],
        [128, 1, 1],
        &[
            KArg::Ptr(q), KArg::Ptr(k), KArg::Ptr(v), KArg::Ptr(kc), KArg::Ptr(vc), KArg::Ptr(qw.unwrap_or(0)), KArg::Ptr(kw.unwrap_or(0)),
            KArg::Ptr(pos), KArg::Ptr(ff.unwrap_or(0)), i(p.n_head), i(p.n_kv), i(p.head_dim), i(p.n_rot), i(p.neox as usize),
            KArg::F32(p.theta_scale), KArg::F32(p.freq_scale), KArg::F32(p.eps), KArg::F32(p.q_scale),
        ],
    )?;
    Ok(())
}

/// x += r, then y = rmsnorm(x)·w and y's `fmt` blocks. x, r, y: [rows, n] f32; w: [n] or
/// none; q: [rows, n/32] blocks; n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn add_rmsnorm_q8(d: &dyn Launch, x: DevPtr, r: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> R {
    check_group("add_rmsnorm_q8", fmt, n)?;
    if rows == 0 {
        return Ok(());
    }
    d.launch("add_rmsnorm_q8_f32", [rows as u32, 1, 1], [1024, 1, 1], &[KArg::Ptr(x), KArg::Ptr(r), KArg::Ptr(w.unwrap_or(0)), KArg::Ptr(y), KArg::Ptr(q), i(n), KArg::F32(eps), fmt.flag()])?;
    Ok(())
}

/// The weight type code the decode matvec kernels switch on (`matvec_multi_n1` and the
/// fused `decode_mv` kernels; mv_dot.h's numbering). None: not a q8_1 / K-form consumer.
pub fn mv_type_code(ty: GgmlType) -> Option<i32> {
    Some(match ty {
        GgmlType::Q4_0 => 0,
        GgmlType::Q4_1 => 1,
        GgmlType::Q5_0 => 2,
        GgmlType::Q5_1 => 3,
        GgmlType::Q8_0 => 4,
        GgmlType::Q4_K => 10,
        GgmlType::Q5_K => 11,
        GgmlType::Q6_K => 12,
        _ => return None,
    })
}

/// True when `matvec_multi` takes weights of `ty` with rows of `k`.
pub fn multi_supports(ty: GgmlType, k: usize) -> bool {
    mv_type_code(ty).is_some() && k % ty.block_elems() == 0
}

/// Up to 3 one-column matvecs over the same activations, one launch:
/// y_s[r] = Σ_k W_s[r][k]·x[k]. segs: (w [rows, k] of ty, ty, rows, y [rows] f32);
/// x: [k/32] q8_1 form (read by the 32-element types), xk: [k/32] K form (read by the
/// K-quants); a form no segment reads may be 0.
pub fn matvec_multi(d: &dyn Launch, x: DevPtr, xk: DevPtr, k: usize, segs: &[(DevPtr, GgmlType, usize, DevPtr)]) -> R {
    matvec_multi_with(d, x, xk, k, segs, 0)
}

/// [`matvec_multi`] with the staged kernels' threshold given (super-blocks per row; 0:
/// never, what decode runs: on the H200 they matched the register-capped warp bodies on
/// rows of 14336 and lost on rows of 2560–9728, every preset 1–2 % slower with them). The
/// selftest forces them on.
pub fn matvec_multi_with(d: &dyn Launch, x: DevPtr, xk: DevPtr, k: usize, segs: &[(DevPtr, GgmlType, usize, DevPtr)], min_sb: usize) -> R {
    if segs.is_empty() || segs.len() > 3 {
        return Err(unsupported(format!("matvec_multi: {} weights (1 to 3)", segs.len())));
    }
    // The staged kernel (8 rows per block) when some segment qualifies, else the plain one.
    let staged = min_sb > 0 && k <= 16384 && k / 256 >= min_sb.max(8) && segs.iter().any(|s| matches!(s.1, GgmlType::Q4_K | GgmlType::Q6_K));
    let rows_per_block = if staged { 8 } else { 4 };
    let mut args = vec![KArg::Ptr(x), KArg::Ptr(xk), i(k)];
    let mut blocks = 0usize;
    for s in 0..3 {
        match segs.get(s) {
            Some(&(w, ty, rows, y)) => {
                if !multi_supports(ty, k) {
                    return Err(unsupported(format!("matvec_multi: {ty} weights with k = {k}")));
                }
                blocks += rows.div_ceil(rows_per_block);
                args.extend([KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(mv_type_code(ty).unwrap_or(-1))]);
            }
            None => args.extend([KArg::Ptr(0), KArg::Ptr(0), i(0), KArg::I32(-1)]),
        }
    }
    if blocks == 0 {
        return Ok(());
    }
    if staged {
        args.push(i(min_sb));
        d.launch("matvec_multi_n1", [blocks as u32, 1, 1], [256, 1, 1], &args)?;
    } else {
        d.launch("matvec_multi4_n1", [blocks as u32, 1, 1], [128, 1, 1], &args)?;
    }
    Ok(())
}

/// Whether [`matvec_q4k_loop`] takes these weights: all Q4_K, rows of at most 16
/// super-blocks (two slots of the warp body).
pub fn q4k_loop_supports(k: usize, segs: &[(DevPtr, GgmlType, usize, DevPtr)]) -> bool {
    k % 256 == 0 && k / 256 <= 16 && !segs.is_empty() && segs.len() <= 3 && segs.iter().all(|s| s.1 == GgmlType::Q4_K)
}

/// `matvec_multi` of Q4_K weights as one resident grid of `blocks` 128-thread blocks whose
/// warps walk the rows with the next row's loads in flight (`matvec_q4k_loop_n1`): for
/// launches of many waves. xk: [k/32] K form; segs as `matvec_multi`'s.
pub fn matvec_q4k_loop(d: &dyn Launch, xk: DevPtr, k: usize, segs: &[(DevPtr, GgmlType, usize, DevPtr)], blocks: usize) -> R {
    if !q4k_loop_supports(k, segs) || blocks == 0 {
        return Err(unsupported(format!("matvec_q4k_loop: {} weights of rows of {k} (Q4_K, at most 4096)", segs.len())));
    }
    let mut args = vec![KArg::Ptr(xk), i(k)];
    for s in 0..3 {
        match segs.get(s) {
            Some(&(w, _, rows, y)) => args.extend([KArg::Ptr(w), KArg::Ptr(y), i(rows)]),
            None => args.extend([KArg::Ptr(0), KArg::Ptr(0), i(0)]),
        }
    }
    args.push(i(blocks * 4));
    d.launch("matvec_q4k_loop_n1", [blocks as u32, 1, 1], [128, 1, 1], &args)?;
    Ok(())
}

/// Attention of n_tok queries at positions pos[t] (device i32 array) over an f16 cache.
/// q, out: [n_tok, n_head, head_dim] f32; kc, vc: [n_ctx, n_kv_head·head_dim] f16
/// (slots 0..=max pos filled). window = 0: full causal.
#[allow(clippy::too_many_arguments)]
pub fn attention(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    attention_q8(d, q, kc, vc, out, None, n_tok, n_head, n_kv_head, head_dim, pos, window, scale)
}

/// [`attention`] that also writes out's q8_1 blocks to `q8` ([n_tok, n_head·head_dim/32];
/// needs head_dim % 32 == 0) for the output projection.
#[allow(clippy::too_many_arguments)]
pub fn attention_q8(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, q8: Option<DevPtr>, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    if q8.is_some() && head_dim % 32 != 0 {
        return Err(unsupported(format!("attention with q8_1 output: head_dim {head_dim} is not a multiple of 32")));
    }
    if head_dim % 8 != 0 || head_dim > 256 || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(unsupported(format!("attention: head_dim {head_dim}, heads {n_head}/{n_kv_head}")));
    }
    d.launch(
        "attn_f16",
        [n_head as u32, n_tok as u32, 1],
        [512, 1, 1],
        &[KArg::Ptr(q), KArg::Ptr(kc), KArg::Ptr(vc), KArg::Ptr(out), i(n_head), i(n_kv_head), i(head_dim), KArg::Ptr(pos), i(window), KArg::F32(scale), KArg::Ptr(q8.unwrap_or(0))],
    )?;
    Ok(())
}

/// A batched decode step's attention: query row t attends over its own sequence's caches,
/// whose addresses sit at kv[2t] (K) and kv[2t + 1] (V) (a device u64 table); one launch.
/// q, out: [n_rows, n_head, head_dim] f32; pos: [n_rows] i32 on the device.
#[allow(clippy::too_many_arguments)]
pub fn attention_rows(d: &dyn Launch, q: DevPtr, kv: DevPtr, out: DevPtr, n_rows: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> R {
    if head_dim % 8 != 0 || head_dim > 256 || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(unsupported(format!("attention: head_dim {head_dim}, heads {n_head}/{n_kv_head}")));
    }
    if n_rows == 0 {
        return Ok(());
    }
    d.launch(
        "attn_f16_rows",
        [n_head as u32, n_rows as u32, 1],
        [512, 1, 1],
        &[KArg::Ptr(q), KArg::Ptr(kv), KArg::Ptr(out), i(n_head), i(n_kv_head), i(head_dim), KArg::Ptr(pos), i(window), KArg::F32(scale)],
    )?;
    Ok(())
}

fn flat(d: &dyn Launch, name: &'static str, n: usize, args: &[KArg]) -> R {
    if n == 0 {
        return Ok(());
    }
    d.launch(name, [ceil(n, 256), 1, 1], [256, 1, 1], args)?;
    Ok(())
}

/// y = a + b, n f32.
pub fn add(d: &dyn Launch, a: DevPtr, b: DevPtr, y: DevPtr, n: usize) -> R {
    flat(d, "add_f32", n, &[KArg::Ptr(a), KArg::Ptr(b), KArg::Ptr(y), i(n)])
}
/// x[t][i] += b[i] over `total` elements of rows of n. x: [total/n, n] f32; b: [n] f32.
pub fn add_bias(d: &dyn Launch, x: DevPtr, b: DevPtr, n: usize, total: usize) -> R {
    flat(d, "add_bias_f32", total, &[KArg::Ptr(x), KArg::Ptr(b), i(n), i(total)])
}
/// y = a ⊙ b, n f32.
pub fn mul(d: &dyn Launch, a: DevPtr, b: DevPtr, y: DevPtr, n: usize) -> R {
    flat(d, "mul_f32", n, &[KArg::Ptr(a), KArg::Ptr(b), KArg::Ptr(y), i(n)])
}
/// y = s·x, n f32.
pub fn scale(d: &dyn Launch, x: DevPtr, y: DevPtr, n: usize, s: f32) -> R {
    flat(d, "scale_f32", n, &[KArg::Ptr(x), KArg::Ptr(y), i(n), KArg::F32(s)])
}
/// y = act(g) ⊙ u with act = SiLU (gelu = false) or GELU-tanh (gelu = true).
pub fn glu(d: &dyn Launch, g: DevPtr, u: DevPtr, y: DevPtr, n: usize, gelu: bool) -> R {
    flat(d, if gelu { "geglu_f32" } else { "swiglu_f32" }, n, &[KArg::Ptr(g), KArg::Ptr(u), KArg::Ptr(y), i(n)])
}
/// y = tanh(x / cap)·cap.
pub fn softcap(d: &dyn Launch, x: DevPtr, y: DevPtr, n: usize, cap: f32) -> R {
    flat(d, "softcap_f32", n, &[KArg::Ptr(x), KArg::Ptr(y), i(n), KArg::F32(cap)])
}

/// dst row rows_idx[r] ← f16(src row r). src: [rows, n] f32; dst: rows of dst_stride f16;
/// rows_idx: [rows] i32 on the device.
pub fn f32_to_f16_rows(d: &dyn Launch, src: DevPtr, dst: DevPtr, rows: usize, n: usize, dst_stride: usize, rows_idx: DevPtr) -> R {
    if rows == 0 || n == 0 {
        return Ok(());
    }
    d.launch("f32_to_f16_rows", [ceil(n, 256), rows as u32, 1], [256, 1, 1], &[KArg::Ptr(src), KArg::Ptr(dst), i(n), i(dst_stride), KArg::Ptr(rows_idx)])?;
    Ok(())
}

/// y[r] = scale · dequant(W[ids[r]]). w: [n_rows_w, k] of `ty`; ids: [n_ids] i32; y: [n_ids, k] f32.
pub fn get_rows(d: &dyn Launch, w: DevPtr, ty: GgmlType, k: usize, ids: DevPtr, n_ids: usize, y: DevPtr, scale: f32) -> R {
    let name = match ty {
        GgmlType::F32 => "get_rows_f32",
        GgmlType::F16 => "get_rows_f16",
        GgmlType::BF16 => "get_rows_bf16",
        GgmlType::Q4_0 => "get_rows_q4_0",
        GgmlType::Q4_1 => "get_rows_q4_1",
        GgmlType::Q5_0 => "get_rows_q5_0",
        GgmlType::Q5_1 => "get_rows_q5_1",
        GgmlType::Q8_0 => "get_rows_q8_0",
        GgmlType::Q4_K => "get_rows_q4_K",
        GgmlType::Q5_K => "get_rows_q5_K",
        GgmlType::Q6_K => "get_rows_q6_K",
        _ => return Err(unsupported(format!("get_rows of {ty}"))),
    };
    let row_bytes = ty.bytes_for(k as u64).ok_or_else(|| unsupported(format!("get_rows: k = {k} not whole {ty} blocks")))? as usize;
    if n_ids == 0 {
        return Ok(());
    }
    d.launch(name, [n_ids as u32, k.div_ceil(256) as u32, 1], [256, 1, 1], &[KArg::Ptr(w), KArg::Ptr(ids), KArg::Ptr(y), i(k), i(row_bytes), KArg::F32(scale)])?;
    Ok(())
}

/// `rmsnorm` that also writes y's `fmt` blocks. q: [rows, n/32] blocks; n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn rmsnorm_q8(d: &dyn Launch, x: DevPtr, w: Option<DevPtr>, y: DevPtr, q: DevPtr, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> R {
    check_group("rmsnorm_q8", fmt, n)?;
    d.launch("rmsnorm_q8_f32", [rows as u32, 1, 1], [1024, 1, 1], &[KArg::Ptr(x), KArg::Ptr(w.unwrap_or(0)), KArg::Ptr(y), KArg::Ptr(q), i(n), KArg::F32(eps), fmt.flag()])?;
    Ok(())
}

/// `glu` that also writes y's `fmt` blocks. n whole groups of `fmt`.
#[allow(clippy::too_many_arguments)]
pub fn glu_q8(d: &dyn Launch, g: DevPtr, u: DevPtr, y: DevPtr, q: DevPtr, n: usize, gelu: bool, fmt: ActFmt) -> R {
    check_group("glu_q8", fmt, n)?;
    flat(d, "glu_q8_f32", n, &[KArg::Ptr(g), KArg::Ptr(u), KArg::Ptr(y), KArg::Ptr(q), i(n), i(gelu as usize), fmt.flag()])
}

/// A batched decode step's K and V rows, row r into its own sequence's caches (kv[2r],
/// kv[2r + 1], a device u64 table) at slot pos[r]. k: [n_rows, nk] f32, v: [n_rows, nv] f32.
#[allow(clippy::too_many_arguments)]
pub fn kv_store_rows(d: &dyn Launch, k: DevPtr, v: DevPtr, kv: DevPtr, nk: usize, nv: usize, pos: DevPtr, n_rows: usize) -> R {
    if n_rows == 0 {
        return Ok(());
    }
    d.launch("kv_store_f16_rows", [ceil(nk.max(nv), 256), n_rows as u32, 1], [256, 1, 1], &[KArg::Ptr(k), KArg::Ptr(v), KArg::Ptr(kv), i(nk), i(nv), KArg::Ptr(pos)])?;
    Ok(())
}

/// K and V rows into the f16 caches. k: [n_rows, nk] f32, v: [n_rows, nv] f32;
/// kc: rows of nk f16, vc: rows of nv f16; rows: [n_rows] i32 on the device.
pub fn kv_store(d: &dyn Launch, k: DevPtr, v: DevPtr, kc: DevPtr, vc: DevPtr, nk: usize, nv: usize, rows: DevPtr, n_rows: usize) -> R {
    if n_rows == 0 {
        return Ok(());
    }
    d.launch("kv_store_f16", [ceil(nk.max(nv), 256), n_rows as u32, 1], [256, 1, 1], &[KArg::Ptr(k), KArg::Ptr(v), KArg::Ptr(kc), KArg::Ptr(vc), i(nk), i(nv), KArg::Ptr(rows)])?;
    Ok(())
}
