//! `kernels-hip/decode_mv.hip`: the fused decode kernels, one token's
//! matvecs with their input side in the same launch — RMSNorm (and the residual add)
//! before the q/k/v or gate/up matvecs, the GLU after gate/up, and the activation
//! quantization before a matvec whose f32 input has no quantized form yet. Each kernel
//! stages the activation blocks in shared memory, in the codes `quantize.hip` writes, so
//! the results equal the unfused kernels' (`selftest/norm_mv.rs`).

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;

kernel_args! {
    /// `decode_mv_norm*(x, add, w, out, counter, nblk, n, eps, W0, y0, rows0, ty0, …, ty2)`.
    pub struct NormMulti {
        x: DevPtr, add: Option<DevPtr>, w: Option<DevPtr>, out: DevPtr, counter: DevPtr, nblk: usize, n: usize, eps: f32,
        w0: DevPtr, y0: DevPtr, rows0: usize, ty0: i32,
        w1: DevPtr, y1: DevPtr, rows1: usize, ty1: i32,
        w2: DevPtr, y2: DevPtr, rows2: usize, ty2: i32,
    }
}
kernel_args! {
    /// `decode_mv_norm_walk{,_v}(x, add, w, out, counter, nblk, n, eps, W0, y0, rows0, …,
    /// rows2, ty2, nw)`.
    pub struct NormWalk {
        x: DevPtr, add: Option<DevPtr>, w: Option<DevPtr>, out: DevPtr, counter: DevPtr, nblk: usize, n: usize, eps: f32,
        w0: DevPtr, y0: DevPtr, rows0: usize,
        w1: DevPtr, y1: DevPtr, rows1: usize,
        w2: DevPtr, y2: DevPtr, rows2: usize,
        ty2: i32, nw: usize,
    }
}
kernel_args! {
    /// `decode_mv_glu*(x, add, w, out, counter, nblk, n, eps, G, U, y, rows, ty, act)`.
    pub struct NormGlu {
        x: DevPtr, add: Option<DevPtr>, w: Option<DevPtr>, out: DevPtr, counter: DevPtr, nblk: usize, n: usize, eps: f32,
        gate: DevPtr, up: DevPtr, y: DevPtr, rows: usize, ty: i32, gelu: bool,
    }
}
kernel_args! {
    /// `decode_mv_quant(x, k, W, y, rows, ty, acc, wpr, rpb)`.
    pub struct Quant { x: DevPtr, k: usize, w: DevPtr, y: DevPtr, rows: usize, ty: i32, acc: bool, wpr: usize, rpb: usize }
}
kernel_args! {
    /// `decode_mv_quant2(x, k, W, y, rows, acc, rpb)`.
    pub struct Quant2 { x: DevPtr, k: usize, w: DevPtr, y: DevPtr, rows: usize, acc: bool, rpb: usize }
}
kernel_args! {
    /// `decode_mv_split(xk, k, W, y, rows, ty, nblk)`.
    pub struct Split { xk: DevPtr, k: usize, w: DevPtr, y: DevPtr, rows: usize, ty: i32, nblk: usize }
}

const NORM: [Kernel<NormMulti>; 4] =
    [Kernel::new("decode_mv_norm4"), Kernel::new("decode_mv_norm16"), Kernel::new("decode_mv_norm4_1k"), Kernel::new("decode_mv_norm4_h1k")];
const GLU: [Kernel<NormGlu>; 4] =
    [Kernel::new("decode_mv_glu4"), Kernel::new("decode_mv_glu16"), Kernel::new("decode_mv_glu4_1k"), Kernel::new("decode_mv_glu4_h1k")];
const WALK: Kernel<NormWalk> = Kernel::new("decode_mv_norm_walk");
const WALK_V: Kernel<NormWalk> = Kernel::new("decode_mv_norm_walk_v");
/// The row walks of the mv_dot_low.h types (Q2_K, Q3_K, IQ4_XS segments; see [`walk_kernel`]).
const WALK_LOW: [Kernel<NormWalk>; 3] =
    [Kernel::new("decode_mv_norm_walk_q2k"), Kernel::new("decode_mv_norm_walk_q3k"), Kernel::new("decode_mv_norm_walk_iq4xs")];
const QUANT: Kernel<Quant> = Kernel::new("decode_mv_quant");
const QUANT2: Kernel<Quant2> = Kernel::new("decode_mv_quant2");
const SPLIT: Kernel<Split> = Kernel::new("decode_mv_split");

pub const FAMILY: Family = Family {
    name: "decode_mv",
    source: include_str!("../../../../../kernels-hip/decode_mv.hip"),
    kernels: &[
        &[NORM[0].sig(), NORM[1].sig(), NORM[2].sig(), NORM[3].sig()],
        &[GLU[0].sig(), GLU[1].sig(), GLU[2].sig(), GLU[3].sig()],
        &[WALK.sig(), WALK_V.sig(), QUANT.sig(), QUANT2.sig(), SPLIT.sig()],
        &[WALK_LOW[0].sig(), WALK_LOW[1].sig(), WALK_LOW[2].sig()],
    ],
};

fn by_name<A>(ks: &[Kernel<A>], name: &str) -> Result<Kernel<A>, GpuError> {
    ks.iter().copied().find(|k| k.name == name).ok_or_else(|| GpuError::Unsupported(format!("decode_mv: no kernel {name}")))
}

/// The longest row the norm kernels take (`NORM_MAX` in decode_mv.hip).
pub const NORM_MAX: usize = 4096;
/// The longest row `decode_mv_quant` takes (`QUANT_MAX`).
pub const QUANT_MAX: usize = 16384;
/// Output rows per 256-thread block (one warp each).
const ROWS: usize = 8;

/// Blocks of each kernel one multiprocessor holds at once (registers on sm_90: norm4 64,
/// norm16 80, glu4 80 — capped by its LAUNCH_BOUNDS_MIN —, glu16 102, quant 64 per thread,
/// 256 threads). A kernel that grows past its count here runs its launches in two waves.
pub fn blocks_per_sm(kernel: &str) -> usize {
    match kernel {
        "decode_mv_norm4" | "decode_mv_quant" => 4,
        "decode_mv_norm16" | "decode_mv_glu4" => 3,
        _ => 2,
    }
}

/// The kernel a norm launch over rows of `n` uses (`glu`: the gate/up one).
pub fn norm_kernel(n: usize, glu: bool) -> &'static str {
    match (glu, n <= 1024) {
        (false, true) => "decode_mv_norm4",
        (false, false) => "decode_mv_norm16",
        (true, true) => "decode_mv_glu4",
        (true, false) => "decode_mv_glu16",
    }
}

/// Threads of a wide norm block.
pub const WIDE: u32 = 1024;

/// The wide form of [`norm_kernel`] (blocks of [`WIDE`] threads, 32 rows each), for rows
/// of at most 1024 values: one block per multiprocessor, so the norm prologue that every
/// block repeats runs once per multiprocessor instead of four times, over four times the
/// threads (one element each).
pub fn wide_kernel(n: usize, glu: bool) -> Option<&'static str> {
    (n <= 1024).then_some(if glu { "decode_mv_glu4_1k" } else { "decode_mv_norm4_1k" })
}

/// Whether the half-warp kernels (`decode_mv_norm4_h1k`, `decode_mv_glu4_h1k`) take
/// weights of these types with rows of `n`: every weight Q4_K, rows of 1 to 4 whole
/// super-blocks. Such a row keeps only half of the one-warp body's lanes busy; these
/// kernels give each half-warp a row of its own (q/k/v: two rows per warp, 64 per
/// 1024-thread block; gate/up: the gate row in one half and the up row in the other, 32
/// per block), bit-identical to the wide kernels, with half their dot instructions. On
/// the H200 a 0.6B-shaped layer (`ci/layer-bench`) took 13.5 µs against 14.9.
pub fn half_supports(n: usize, tys: &[GgmlType]) -> bool {
    n % 256 == 0 && (256..=1024).contains(&n) && !tys.is_empty() && tys.iter().all(|&t| t == GgmlType::Q4_K)
}

/// Output rows per block of a half-warp kernel (`glu`: the gate/up one).
pub fn half_rows_per_block(glu: bool) -> usize {
    if glu {
        WIDE as usize / 32
    } else {
        WIDE as usize / 16
    }
}

/// Whether `kernel` over `rows` output rows runs as one wave of blocks on `sms`
/// multiprocessors. Every block repeats the prologue, so a second wave repeats it too
/// and costs more than the launch it saves: on the H200 Qwen3-4B decoded at 257 t/s with
/// its q/k/v (768 blocks) and gate/up (1,216 blocks) fused, 372 t/s without. The backend
/// fuses only launches that fit (Qwen3-0.6B: 512, 384 and 128 blocks on 132 SMs).
pub fn fits_one_wave(kernel: &str, rows: usize, sms: usize) -> bool {
    fits_one_wave_at(rows, sms, blocks_per_sm(kernel))
}

/// [`fits_one_wave`] with the blocks per multiprocessor given (the driver's occupancy
/// figure for the compiled kernel, where it has one).
pub fn fits_one_wave_at(rows: usize, sms: usize, per_sm: usize) -> bool {
    fits_one_wave_rows(rows, ROWS, sms, per_sm)
}

/// [`fits_one_wave_at`] for blocks of `per_block` rows.
pub fn fits_one_wave_rows(rows: usize, per_block: usize, sms: usize, per_sm: usize) -> bool {
    rows.div_ceil(per_block) <= sms * per_sm
}

/// The threads of every decode_mv block.
pub const BLOCK: u32 = 256;

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

/// The type code of a weight the fused kernels take (`matvec::mv_type_code`'s numbering;
/// None: a type they do not take): the mv_dot.h types, Q4_0 … Q8_0 and Q4_K … Q6_K, and
/// mv_dot_low.h's IQ4_NL (5), Q2_K (13), Q3_K (14) and IQ4_XS (15), whose steps in
/// decode_mv.hip are their plain matvecs' slots. MXFP4 and the grid types run through
/// `matvec_multi4_n1` and the plain matvecs.
pub fn type_code(ty: GgmlType) -> Option<i32> {
    super::matvec::mv_type_code(ty).filter(|&c| c <= 5 || (10..=15).contains(&c))
}

/// Whether the fused kernels take weights of `ty` with rows of `k` (whole blocks, whole
/// 32-value activation blocks).
pub fn supports(ty: GgmlType, k: usize) -> bool {
    type_code(ty).is_some() && k > 0 && k % 32 == 0 && k % ty.block_elems() == 0
}

/// Whether the one-wave norm kernels (`decode_mv_norm*`, `decode_mv_glu*`) take weights of
/// `ty` with rows of `k`: [`supports`] but Q3_K, whose body would cost those kernels
/// registers for every type; its norm launches take [`norm_walk`] at any row count.
pub fn norm_supports(ty: GgmlType, k: usize) -> bool {
    supports(ty, k) && ty != GgmlType::Q3_K
}

/// The norm in front of the matvecs: `x += add` (when given), `out = x / rms(x) · w`.
/// x, add, out: [n] f32; w: [n] f32 or none; counter: a zeroed device u32 the kernel
/// leaves zeroed (the last-block ticket of the write-back of x).
#[derive(Clone, Copy, Debug)]
pub struct Norm {
    pub x: DevPtr,
    pub add: Option<DevPtr>,
    pub w: Option<DevPtr>,
    pub out: DevPtr,
    pub counter: DevPtr,
    pub n: usize,
    pub eps: f32,
    /// Threads per block: 256 (8 rows per block), or [`WIDE`] (rows of at most 1024
    /// values: 32 rows per block, one block per multiprocessor; see [`wide_kernel`]).
    pub threads: u32,
    /// The half-warp kernels ([`half_supports`]; `threads` is then [`WIDE`]).
    pub half: bool,
}

impl Norm {
    fn check(&self, op: &str) -> R {
        if self.n == 0 || self.n % 32 != 0 || self.n > NORM_MAX {
            return Err(unsupported(format!("{op}: rows of {} values (whole 32-value blocks up to {NORM_MAX})", self.n)));
        }
        Ok(())
    }
    /// Output rows per block (`glu`: of the gate/up kernel).
    fn rows_per_block(&self, glu: bool) -> usize {
        if self.half {
            half_rows_per_block(glu)
        } else {
            self.threads as usize / 32
        }
    }
    /// The kernel for this row length and block size.
    fn kernel_name(&self, base: &'static str) -> Result<&'static str, GpuError> {
        let glu = base == "glu";
        let name = match (self.threads, self.half) {
            (WIDE, true) if self.n <= 1024 => if glu { "decode_mv_glu4_h1k" } else { "decode_mv_norm4_h1k" },
            (256, false) => norm_kernel(self.n, glu),
            (WIDE, false) => wide_kernel(self.n, glu).ok_or_else(|| unsupported(format!("{base}: no {WIDE}-thread kernel for rows of {}", self.n)))?,
            (t, h) => return Err(unsupported(format!("{base}: blocks of {t} threads{}", if h { " (half-warp rows)" } else { "" }))),
        };
        Ok(name)
    }
    /// The half-warp kernels read Q4_K only: refuse anything else rather than misread it.
    fn check_half(&self, op: &str, tys: &[GgmlType]) -> R {
        if self.half && !half_supports(self.n, tys) {
            return Err(unsupported(format!("{op}: half-warp rows need Q4_K weights with rows of 256 to 1024 (got {tys:?}, rows of {})", self.n)));
        }
        Ok(())
    }
}

/// One launch: the norm, then y_s = W_s · out for each of 1 to 3 segments
/// (w [rows, n] of ty, ty, rows, y [rows] f32).
pub fn norm_multi(d: &dyn Launch, a: &Norm, segs: &[(DevPtr, GgmlType, usize, DevPtr)]) -> R {
    a.check("norm_multi")?;
    if segs.is_empty() || segs.len() > 3 {
        return Err(unsupported(format!("norm_multi: {} weights (1 to 3)", segs.len())));
    }
    a.check_half("norm_multi", &segs.iter().map(|s| s.1).collect::<Vec<_>>())?;
    let mut t = [(0u64, 0u64, 0usize, -1i32); 3];
    // Blocks per segment; the half-warp kernel lays the segments end to end instead (a
    // block may span two).
    let per = a.rows_per_block(false);
    let (mut nblk, mut rows_all) = (0, 0);
    for (slot, &(w, ty, rows, y)) in t.iter_mut().zip(segs) {
        let code = type_code(ty).filter(|_| norm_supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_multi: {ty} weights with rows of {}", a.n)))?;
        nblk += rows.div_ceil(per);
        rows_all += rows;
        *slot = (w, y, rows, code);
    }
    let nblk = if a.half { rows_all.div_ceil(per) } else { nblk };
    if nblk == 0 {
        return Err(unsupported("norm_multi: no output rows".into()));
    }
    let kernel = by_name(&NORM, a.kernel_name("norm")?)?;
    let args = NormMulti {
        x: a.x, add: a.add, w: a.w, out: a.out, counter: a.counter, nblk, n: a.n, eps: a.eps,
        w0: t[0].0, y0: t[0].1, rows0: t[0].2, ty0: t[0].3,
        w1: t[1].0, y1: t[1].1, rows1: t[1].2, ty1: t[1].3,
        w2: t[2].0, y2: t[2].1, rows2: t[2].2, ty2: t[2].3,
    };
    kernel.launch(d, [nblk as u32, 1, 1], [a.threads, 1, 1], &args)
}

/// Whether [`norm_walk`] takes weights of these types with rows of `n` ([`walk_kernel`]).
pub fn walk_supports(n: usize, tys: &[GgmlType]) -> bool {
    walk_kernel(n, tys).is_some()
}

/// The row walk of a type whose steps decode_mv.hip walks as one stream (`walk_low_run`).
fn low_walk(ty: GgmlType) -> Option<Kernel<NormWalk>> {
    match ty {
        GgmlType::Q2_K => Some(WALK_LOW[0]),
        GgmlType::Q3_K => Some(WALK_LOW[1]),
        GgmlType::IQ4_XS => Some(WALK_LOW[2]),
        _ => None,
    }
}

/// The kernel of a [`norm_walk`] over 1 to 3 weights of these types with rows of `n`
/// (whole super-blocks, at most [`NORM_MAX`] values), None where no walk takes them:
/// - every weight Q4_K but the last, which may also be Q6_K (Q4_K_M's attn_v in half the
///   layers) when it follows a Q4_K one: `decode_mv_norm_walk` (`_v`); a Q6_K weight
///   alone, the LM head, is `head_mv.rs`'s (the walk loads only the first of a warp's
///   Q6_K rows ahead);
/// - every weight of one mv_dot_low.h type T (Q2_K, Q3_K, IQ4_XS) but the last, which may
///   also be any K-form type of the fused kernels when it follows a T one (Q3_K_M's v:
///   Q4_K / Q5_K; IQ4_XS's: Q5_K; Q2_K's: Q3_K): `decode_mv_norm_walk_{q2k,q3k,iq4xs}`.
pub fn walk_kernel(n: usize, tys: &[GgmlType]) -> Option<&'static str> {
    let (last, rest) = tys.split_last()?;
    if n == 0 || n % 256 != 0 || n > NORM_MAX || tys.len() > 3 {
        return None;
    }
    if rest.iter().all(|&t| t == GgmlType::Q4_K) && (*last == GgmlType::Q4_K || (*last == GgmlType::Q6_K && !rest.is_empty())) {
        return Some(if *last == GgmlType::Q6_K { "decode_mv_norm_walk_v" } else { "decode_mv_norm_walk" });
    }
    let main = tys[0];
    let k = low_walk(main)?;
    let last_ok = *last == main || (!rest.is_empty() && matches!(type_code(*last), Some(10..=15)));
    (rest.iter().all(|&t| t == main) && last_ok).then_some(k.name)
}

/// One launch of `blocks` resident 256-thread blocks (`decode_mv_norm_walk`, or `_v` with a
/// Q6_K last weight): the norm, then y_s = W_s · out for 1 to 3 segments, whose rows the
/// warps walk with the next row's loads in flight — for segments of more rows than one
/// wave of norm blocks holds (4B / 8B q/k/v and gate/up). `a.threads` is not read.
pub fn norm_walk(d: &dyn Launch, a: &Norm, segs: &[(DevPtr, GgmlType, usize, DevPtr)], blocks: usize) -> R {
    a.check("norm_walk")?;
    let tys: Vec<GgmlType> = segs.iter().map(|s| s.1).collect();
    let Some(name) = walk_kernel(a.n, &tys).filter(|_| blocks > 0) else {
        return Err(unsupported(format!(
            "norm_walk: {} weights ({tys:?}) with rows of {} (1 to 3, Q4_K but a last Q6_K, or Q2_K / Q3_K / IQ4_XS but a last K-quant, rows of whole super-blocks up to {NORM_MAX})",
            segs.len(),
            a.n
        )));
    };
    if let Some(k) = low_walk(tys[0]).filter(|k| k.name == name) {
        return norm_walk_low(d, a, segs, blocks, k);
    }
    // The kernel's segment 2 is the one that may be Q6_K: a Q6_K last weight goes there.
    let v = name == "decode_mv_norm_walk_v";
    let mut t = [(0u64, 0u64, 0usize); 3];
    for (i, &(w, _, rows, y)) in segs.iter().enumerate() {
        t[if v && i + 1 == segs.len() { 2 } else { i }] = (w, y, rows);
    }
    let args = NormWalk {
        x: a.x, add: a.add, w: a.w, out: a.out, counter: a.counter, nblk: blocks, n: a.n, eps: a.eps,
        w0: t[0].0, y0: t[0].1, rows0: t[0].2,
        w1: t[1].0, y1: t[1].1, rows1: t[1].2,
        w2: t[2].0, y2: t[2].1, rows2: t[2].2,
        ty2: if v { 12 } else { 10 },
        nw: blocks * (BLOCK as usize / 32),
    };
    (if v { WALK_V } else { WALK }).launch(d, [blocks as u32, 1, 1], [BLOCK, 1, 1], &args)
}

/// [`norm_walk`] by a `decode_mv_norm_walk_{q2k,q3k,iq4xs}` kernel: segments 0 and 1 are of
/// its type; segment 2 holds a last weight of another type (its code as ty2), or of the
/// same type when there are three.
fn norm_walk_low(d: &dyn Launch, a: &Norm, segs: &[(DevPtr, GgmlType, usize, DevPtr)], blocks: usize, k: Kernel<NormWalk>) -> R {
    let main = segs[0].1;
    let mut t = [(0u64, 0u64, 0usize); 3];
    let mut ty2 = type_code(main).ok_or_else(|| unsupported(format!("norm_walk: {main}")))?;
    for (i, &(w, ty, rows, y)) in segs.iter().enumerate() {
        let slot = if ty != main { 2 } else { i };
        if ty != main || slot == 2 {
            ty2 = type_code(ty).ok_or_else(|| unsupported(format!("norm_walk: {ty}")))?;
        }
        t[slot] = (w, y, rows);
    }
    let args = NormWalk {
        x: a.x, add: a.add, w: a.w, out: a.out, counter: a.counter, nblk: blocks, n: a.n, eps: a.eps,
        w0: t[0].0, y0: t[0].1, rows0: t[0].2,
        w1: t[1].0, y1: t[1].1, rows1: t[1].2,
        w2: t[2].0, y2: t[2].1, rows2: t[2].2,
        ty2,
        nw: blocks * (BLOCK as usize / 32),
    };
    k.launch(d, [blocks as u32, 1, 1], [BLOCK, 1, 1], &args)
}

/// One launch: the norm, then y[r] = act(gate_r · out) · (up_r · out) (act SiLU, or
/// GELU-tanh when `gelu`). gate, up: [rows, n] of one type; y: [rows] f32.
#[allow(clippy::too_many_arguments)]
pub fn norm_glu(d: &dyn Launch, a: &Norm, gate: DevPtr, up: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, gelu: bool) -> R {
    a.check("norm_glu")?;
    let code = type_code(ty).filter(|_| norm_supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_glu: {ty} weights with rows of {}", a.n)))?;
    a.check_half("norm_glu", &[ty])?;
    if rows == 0 {
        return Err(unsupported("norm_glu: no output rows".into()));
    }
    let nblk = rows.div_ceil(a.rows_per_block(true));
    let kernel = by_name(&GLU, a.kernel_name("glu")?)?;
    let args = NormGlu { x: a.x, add: a.add, w: a.w, out: a.out, counter: a.counter, nblk, n: a.n, eps: a.eps, gate, up, y, rows, ty: code, gelu };
    kernel.launch(d, [nblk as u32, 1, 1], [a.threads, 1, 1], &args)
}

/// Warps per row `decode_mv_quant` can give a row of `k` values of `ty`: one per step of
/// the one-warp loop (a step: 8 Q4_K or 4 Q5_K / Q6_K super-blocks) when that is 2 or 4
/// (3 steps take 4 warps, one idle), else 1. The 32-element types add two slots per step
/// and stay at 1 (their split sums would not be the one-warp loop's, bit for bit).
pub fn quant_warps_per_row(ty: GgmlType, k: usize) -> usize {
    let step = match ty {
        GgmlType::Q4_K => 8 * 256,
        GgmlType::Q5_K | GgmlType::Q6_K => 4 * 256,
        _ => return 1,
    };
    match k.div_ceil(step) {
        2 => 2,
        3 | 4 => 4,
        _ => 1,
    }
}

/// One launch: y = W · x with x [k] f32 quantized inside the kernel to the form `ty`
/// reads (`acc`: y = y + W · x, the residual add in the epilogue). w: [rows, k] of ty;
/// y: [rows] f32; k <= [`QUANT_MAX`]; `wpr`: warps per row (1, or
/// [`quant_warps_per_row`]'s figure); `rpb`: rows per block (8, 16 or 32, `rpb · wpr ≤ 32`;
/// see [`quant_rows_per_block`]), blocks of 32 `rpb` `wpr` threads. (The one-wave checks
/// count 8-row blocks of 256 `wpr` threads: the registers, which bound these blocks, scale
/// with the rows, so the answer is the same for 16 or 32.)
///
/// `two`: Q4_K rows of two or more steps taken one warp per row (4B / 8B's o, where the
/// two-warp form does not fit one wave) run as `decode_mv_quant2`, which loads both first
/// steps before its wait (the same sums bit for bit; [`takes_two`]).
#[allow(clippy::too_many_arguments)]
pub fn quant_mv(d: &dyn Launch, x: DevPtr, k: usize, w: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, acc: bool, wpr: usize, rpb: usize, two: bool) -> R {
    let code = type_code(ty).filter(|_| supports(ty, k) && k <= QUANT_MAX).ok_or_else(|| unsupported(format!("quant_mv: {ty} weights with rows of {k}")))?;
    if wpr != 1 && wpr != quant_warps_per_row(ty, k) {
        return Err(unsupported(format!("quant_mv: {wpr} warps per row for {ty} rows of {k}")));
    }
    if ![8, 16, 32].contains(&rpb) || rpb * wpr > 32 {
        return Err(unsupported(format!("quant_mv: {rpb} rows per block of {wpr} warps each")));
    }
    if rows == 0 {
        return Ok(());
    }
    let block = (32 * rpb * wpr) as u32;
    if two && takes_two(ty, k, wpr) {
        return QUANT2.launch(d, [rows.div_ceil(rpb) as u32, 1, 1], [block, 1, 1], &Quant2 { x, k, w, y, rows, acc, rpb });
    }
    QUANT.launch(d, [rows.div_ceil(rpb) as u32, 1, 1], [block, 1, 1], &Quant { x, k, w, y, rows, ty: code, acc, wpr, rpb })
}

/// Whether a `decode_mv_quant` launch of these rows has a `decode_mv_quant2` form: Q4_K
/// rows of more than one step (8 super-blocks) taken one warp per row.
pub fn takes_two(ty: GgmlType, k: usize, wpr: usize) -> bool {
    ty == GgmlType::Q4_K && wpr == 1 && k > 8 * 256
}

/// Rows per `decode_mv_quant` block for rows of `wpr` warps: `want` (8, 16 or 32), as
/// many as 32 warps hold.
pub fn quant_rows_per_block(want: usize, wpr: usize) -> usize {
    let most = 32 / wpr.clamp(1, 4);
    [32, 16, 8].into_iter().find(|&r| r <= want && r <= most).unwrap_or(8)
}

/// The most warps (steps) per row of [`split_walk`] (`SPLIT_MAX`).
pub const SPLIT_MAX: usize = 16;

/// Warps per row of [`split_walk`] for rows of `k` values of `ty`: one per step (8 Q4_K or
/// 4 Q6_K super-blocks); None for a type, shape or step count it does not take (it serves
/// rows of 2 to [`SPLIT_MAX`] steps).
pub fn split_steps(ty: GgmlType, k: usize) -> Option<usize> {
    let step = match ty {
        GgmlType::Q4_K => 8 * 256,
        GgmlType::Q6_K => 4 * 256,
        _ => return None,
    };
    let steps = k.div_ceil(step);
    (k > 0 && k % 256 == 0 && (2..=SPLIT_MAX).contains(&steps)).then_some(steps)
}

/// One launch of `blocks` resident blocks (`decode_mv_split`): y = W · x for one token with
/// rows of 2–16 steps, one warp per step, each warp's activation kept in registers while
/// the block walks the rows. xk: x's K form [k/32] (already written); w: [rows, k] of ty.
#[allow(clippy::too_many_arguments)]
pub fn split_walk(d: &dyn Launch, xk: DevPtr, k: usize, w: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, blocks: usize) -> R {
    let steps = split_steps(ty, k).ok_or_else(|| unsupported(format!("split_walk: {ty} weights with rows of {k} (Q4_K or Q6_K, 2 to {SPLIT_MAX} steps)")))?;
    let code = type_code(ty).ok_or_else(|| unsupported(format!("split_walk: {ty}")))?;
    if rows == 0 {
        return Ok(());
    }
    if blocks == 0 {
        return Err(unsupported("split_walk: no blocks".into()));
    }
    SPLIT.launch(d, [blocks as u32, 1, 1], [32 * steps as u32, 1, 1], &Split { xk, k, w, y, rows, ty: code, nblk: blocks })
}

#[cfg(test)]
#[path = "decode_mv_tests.rs"]
mod tests;
