//! Launchers of the fused decode kernels (`kernels-hip/decode_mv.hip`): one token's
//! matvecs with their input side in the same launch — RMSNorm (and the residual add)
//! before the q/k/v or gate/up matvecs, the GLU after gate/up, and the activation
//! quantization before a matvec whose f32 input has no quantized form yet. Each kernel
//! stages the activation blocks in shared memory, in the codes `quantize.hip` writes, so
//! the results equal the unfused kernels' (`selftest/norm_mv.rs`).

use super::driver::{DevPtr, KArg};
use super::ops::Launch;
use super::GpuError;
use crate::quant::GgmlType;

type R = Result<(), GpuError>;
type R2 = Result<(&'static str, Vec<KArg>), GpuError>;

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

fn i(v: usize) -> KArg {
    KArg::I32(v as i32)
}

/// The kernels' weight type code (None: a type they do not take): the decode matvecs' one
/// numbering.
pub use super::ops::mv_type_code as type_code;

/// Whether the fused kernels take weights of `ty` with rows of `k` (whole blocks, whole
/// 32-value activation blocks).
pub fn supports(ty: GgmlType, k: usize) -> bool {
    type_code(ty).is_some() && k > 0 && k % 32 == 0 && k % ty.block_elems() == 0
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
    /// (kernel for this row length and block size, leading arguments given the block count).
    fn args(&self, base: &'static str, nblk: usize) -> R2 {
        let glu = base == "glu";
        let name = match (self.threads, self.half) {
            (WIDE, true) if self.n <= 1024 => if glu { "decode_mv_glu4_h1k" } else { "decode_mv_norm4_h1k" },
            (256, false) => norm_kernel(self.n, glu),
            (WIDE, false) => wide_kernel(self.n, glu).ok_or_else(|| unsupported(format!("{base}: no {WIDE}-thread kernel for rows of {}", self.n)))?,
            (t, h) => return Err(unsupported(format!("{base}: blocks of {t} threads{}", if h { " (half-warp rows)" } else { "" }))),
        };
        Ok((name, self.lead(nblk)))
    }
    /// The half-warp kernels read Q4_K only: refuse anything else rather than misread it.
    fn check_half(&self, op: &str, tys: &[GgmlType]) -> R {
        if self.half && !half_supports(self.n, tys) {
            return Err(unsupported(format!("{op}: half-warp rows need Q4_K weights with rows of 256 to 1024 (got {tys:?}, rows of {})", self.n)));
        }
        Ok(())
    }
    /// The norm's arguments, every norm kernel's first eight (`nblk`: the launch's blocks,
    /// the count of tickets the last block waits for).
    fn lead(&self, nblk: usize) -> Vec<KArg> {
        vec![
            KArg::Ptr(self.x),
            KArg::Ptr(self.add.unwrap_or(0)),
            KArg::Ptr(self.w.unwrap_or(0)),
            KArg::Ptr(self.out),
            KArg::Ptr(self.counter),
            i(nblk),
            i(self.n),
            KArg::F32(self.eps),
        ]
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
    let mut tail = Vec::with_capacity(12);
    // Blocks per segment; the half-warp kernel lays the segments end to end instead (a
    // block may span two).
    let per = a.rows_per_block(false);
    let (mut nblk, mut rows_all) = (0, 0);
    for s in 0..3 {
        match segs.get(s) {
            Some(&(w, ty, rows, y)) => {
                let code = type_code(ty).filter(|_| supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_multi: {ty} weights with rows of {}", a.n)))?;
                nblk += rows.div_ceil(per);
                rows_all += rows;
                tail.extend([KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(code)]);
            }
            None => tail.extend([KArg::Ptr(0), KArg::Ptr(0), i(0), KArg::I32(-1)]),
        }
    }
    let nblk = if a.half { rows_all.div_ceil(per) } else { nblk };
    if nblk == 0 {
        return Err(unsupported("norm_multi: no output rows".into()));
    }
    let (name, mut args) = a.args("norm", nblk)?;
    args.extend(tail);
    d.launch(name, [nblk as u32, 1, 1], [a.threads, 1, 1], &args)?;
    Ok(())
}

/// Whether [`norm_walk`] takes weights of these types with rows of `n`: rows of whole
/// super-blocks, at most 16 of them (the two slots of the row walk's warp body); every
/// weight Q4_K but the last, which may also be Q6_K (Q4_K_M's attn_v in half the layers)
/// when it follows a Q4_K one (a Q6_K weight alone, the LM head, is `head_mv.rs`'s: the
/// walk loads only the first of a warp's Q6_K rows ahead).
pub fn walk_supports(n: usize, tys: &[GgmlType]) -> bool {
    let Some((last, rest)) = tys.split_last() else { return false };
    let last_ok = *last == GgmlType::Q4_K || (*last == GgmlType::Q6_K && !rest.is_empty());
    n > 0 && n % 256 == 0 && n <= NORM_MAX && tys.len() <= 3 && rest.iter().all(|&t| t == GgmlType::Q4_K) && last_ok
}

/// The kernel of a [`norm_walk`] over weights of these types: `_v` when the last is Q6_K.
pub fn walk_kernel(tys: &[GgmlType]) -> &'static str {
    if tys.last() == Some(&GgmlType::Q6_K) {
        "decode_mv_norm_walk_v"
    } else {
        "decode_mv_norm_walk"
    }
}

/// One launch of `blocks` resident 256-thread blocks (`decode_mv_norm_walk`, or `_v` with a
/// Q6_K last weight): the norm, then y_s = W_s · out for 1 to 3 segments, whose rows the
/// warps walk with the next row's loads in flight — for segments of more rows than one
/// wave of norm blocks holds (4B / 8B q/k/v and gate/up). `a.threads` is not read.
pub fn norm_walk(d: &dyn Launch, a: &Norm, segs: &[(DevPtr, GgmlType, usize, DevPtr)], blocks: usize) -> R {
    a.check("norm_walk")?;
    let tys: Vec<GgmlType> = segs.iter().map(|s| s.1).collect();
    if !walk_supports(a.n, &tys) || blocks == 0 {
        return Err(unsupported(format!("norm_walk: {} weights ({tys:?}) with rows of {} (1 to 3, Q4_K but a last Q6_K, rows of whole super-blocks up to {NORM_MAX})", segs.len(), a.n)));
    }
    // The kernel's segment 2 is the one that may be Q6_K: a Q6_K last weight goes there.
    let v = walk_kernel(&tys) == "decode_mv_norm_walk_v";
    let mut slots: [Option<(DevPtr, GgmlType, usize, DevPtr)>; 3] = [None; 3];
    for (i, s) in segs.iter().enumerate() {
        slots[if v && i + 1 == segs.len() { 2 } else { i }] = Some(*s);
    }
    let mut args = a.lead(blocks);
    for slot in slots {
        match slot {
            Some((w, _, rows, y)) => args.extend([KArg::Ptr(w), KArg::Ptr(y), i(rows)]),
            None => args.extend([KArg::Ptr(0), KArg::Ptr(0), i(0)]),
        }
    }
    args.push(KArg::I32(if v { 12 } else { 10 }));
    args.push(i(blocks * (BLOCK as usize / 32)));
    d.launch(walk_kernel(&tys), [blocks as u32, 1, 1], [BLOCK, 1, 1], &args)?;
    Ok(())
}

/// One launch: the norm, then y[r] = act(gate_r · out) · (up_r · out) (act SiLU, or
/// GELU-tanh when `gelu`). gate, up: [rows, n] of one type; y: [rows] f32.
#[allow(clippy::too_many_arguments)]
pub fn norm_glu(d: &dyn Launch, a: &Norm, gate: DevPtr, up: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, gelu: bool) -> R {
    a.check("norm_glu")?;
    let code = type_code(ty).filter(|_| supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_glu: {ty} weights with rows of {}", a.n)))?;
    a.check_half("norm_glu", &[ty])?;
    if rows == 0 {
        return Err(unsupported("norm_glu: no output rows".into()));
    }
    let nblk = rows.div_ceil(a.rows_per_block(true));
    let (name, mut args) = a.args("glu", nblk)?;
    args.extend([KArg::Ptr(gate), KArg::Ptr(up), KArg::Ptr(y), i(rows), KArg::I32(code), i(gelu as usize)]);
    d.launch(name, [nblk as u32, 1, 1], [a.threads, 1, 1], &args)?;
    Ok(())
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
        d.launch("decode_mv_quant2", [rows.div_ceil(rpb) as u32, 1, 1], [block, 1, 1], &[KArg::Ptr(x), i(k), KArg::Ptr(w), KArg::Ptr(y), i(rows), i(acc as usize), i(rpb)])?;
        return Ok(());
    }
    d.launch("decode_mv_quant", [rows.div_ceil(rpb) as u32, 1, 1], [block, 1, 1], &[KArg::Ptr(x), i(k), KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(code), i(acc as usize), i(wpr), i(rpb)])?;
    Ok(())
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
    d.launch("decode_mv_split", [blocks as u32, 1, 1], [32 * steps as u32, 1, 1], &[KArg::Ptr(xk), i(k), KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(code), i(blocks)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_wave_rule_takes_the_small_model_and_leaves_the_large() {
        // Qwen3-0.6B on 132 SMs: q/k/v 4096 rows, gate/up 3072, o / down 1024.
        assert!(fits_one_wave(norm_kernel(1024, false), 4096, 132));
        assert!(fits_one_wave(norm_kernel(1024, true), 3072, 132));
        assert!(fits_one_wave("decode_mv_quant", 1024, 132));
        // Qwen3-4B: q/k/v 6144 rows, gate/up 9728.
        assert!(!fits_one_wave(norm_kernel(2560, false), 6144, 132));
        assert!(!fits_one_wave(norm_kernel(2560, true), 9728, 132));
        assert_eq!(norm_kernel(4096, true), "decode_mv_glu16");
    }

    #[test]
    fn wide_kernels_take_rows_up_to_1024_in_one_wave_of_32_row_blocks() {
        assert_eq!(wide_kernel(1024, false), Some("decode_mv_norm4_1k"));
        assert_eq!(wide_kernel(576, true), Some("decode_mv_glu4_1k"));
        assert_eq!(wide_kernel(2560, false), None);
        // Qwen3-0.6B's q/k/v (2048 + 1024 + 1024 rows: 128 blocks of 32) and gate/up (96)
        // fit 132 SMs at one block each; Qwen3-4B's q/k/v (192 blocks) do not.
        assert!(fits_one_wave_rows(4096, 32, 132, 1));
        assert!(fits_one_wave_rows(3072, 32, 132, 1));
        assert!(!fits_one_wave_rows(6144, 32, 132, 1));
    }

    /// The launches a launcher makes (name, grid, block).
    struct Cap(std::cell::RefCell<Vec<(&'static str, [u32; 3], [u32; 3])>>);
    impl Launch for Cap {
        fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], _: &[KArg]) -> Result<(), super::super::driver::DriverError> {
            self.0.borrow_mut().push((name, grid, block));
            Ok(())
        }
    }

    #[test]
    fn quant_blocks_hold_at_most_32_warps() {
        assert_eq!(quant_rows_per_block(16, 1), 16);
        assert_eq!(quant_rows_per_block(32, 1), 32);
        assert_eq!(quant_rows_per_block(16, 2), 16);
        assert_eq!(quant_rows_per_block(32, 2), 16);
        assert_eq!(quant_rows_per_block(16, 4), 8);
        assert_eq!(quant_rows_per_block(8, 1), 8);
        // Anything else asks for the 8-row block.
        assert_eq!(quant_rows_per_block(3, 1), 8);
        let c = Cap(Default::default());
        quant_mv(&c, 1, 2048, 2, GgmlType::Q4_K, 1024, 3, true, 1, 16, false).unwrap();
        quant_mv(&c, 1, 3072, 2, GgmlType::Q4_K, 1000, 3, true, 2, 16, false).unwrap();
        assert_eq!(c.0.into_inner(), vec![("decode_mv_quant", [64, 1, 1], [512, 1, 1]), ("decode_mv_quant", [63, 1, 1], [1024, 1, 1])]);
    }

    #[test]
    fn two_step_q4k_rows_of_one_warp_take_the_preloading_kernel() {
        let c = Cap(Default::default());
        // Qwen3-4B's o (Q4_K rows of 4096: two steps), one warp per row: decode_mv_quant2.
        quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 1, 16, true).unwrap();
        // One step (0.6B's o), two warps per row, another type, or switched off: as before.
        quant_mv(&c, 1, 2048, 2, GgmlType::Q4_K, 1024, 3, true, 1, 16, true).unwrap();
        quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 2, 16, true).unwrap();
        quant_mv(&c, 1, 4096, 2, GgmlType::Q6_K, 2560, 3, true, 1, 16, true).unwrap();
        quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 1, 16, false).unwrap();
        let names: Vec<_> = c.0.into_inner().into_iter().map(|(n, g, b)| (n, g[0], b[0])).collect();
        assert_eq!(
            names,
            vec![
                ("decode_mv_quant2", 160, 512),
                ("decode_mv_quant", 64, 512),
                ("decode_mv_quant", 160, 1024),
                ("decode_mv_quant", 160, 512),
                ("decode_mv_quant", 160, 512),
            ]
        );
        assert!(takes_two(GgmlType::Q4_K, 2304, 1) && !takes_two(GgmlType::Q4_K, 2048, 1) && !takes_two(GgmlType::Q5_K, 4096, 1));
    }

    #[test]
    fn launch_shapes_follow_warps_per_row_and_block_width() {
        let c = Cap(Default::default());
        // Down of Qwen3-0.6B (Q6_K, 3072): 4 warps per row, 1024-thread blocks of 8 rows.
        quant_mv(&c, 1, 3072, 2, GgmlType::Q6_K, 1024, 3, true, 4, 8, false).unwrap();
        quant_mv(&c, 1, 3072, 2, GgmlType::Q4_K, 1024, 3, true, 1, 8, false).unwrap();
        // A count that is not the type's own is refused, not launched; so is a block of
        // more than 32 warps.
        assert!(quant_mv(&c, 1, 3072, 2, GgmlType::Q8_0, 1024, 3, false, 2, 8, false).is_err());
        assert!(quant_mv(&c, 1, 3072, 2, GgmlType::Q6_K, 1024, 3, true, 4, 16, false).is_err());
        let n = |threads| Norm { x: 1, add: None, w: None, out: 2, counter: 3, n: 1024, eps: 1e-6, threads, half: false };
        norm_multi(&c, &n(WIDE), &[(4, GgmlType::Q4_K, 2048, 5), (6, GgmlType::Q4_K, 1024, 7), (8, GgmlType::Q6_K, 1024, 9)]).unwrap();
        norm_glu(&c, &n(256), 4, 5, GgmlType::Q4_K, 3072, 6, false).unwrap();
        assert!(norm_multi(&c, &n(512), &[(4, GgmlType::Q4_K, 8, 5)]).is_err());
        let got = c.0.into_inner();
        assert_eq!(
            got,
            vec![
                ("decode_mv_quant", [128, 1, 1], [1024, 1, 1]),
                ("decode_mv_quant", [128, 1, 1], [256, 1, 1]),
                ("decode_mv_norm4_1k", [128, 1, 1], [1024, 1, 1]),
                ("decode_mv_glu4", [384, 1, 1], [256, 1, 1]),
            ]
        );
    }

    #[test]
    fn half_warp_kernels_take_q4k_rows_of_at_most_1024_and_lay_segments_end_to_end() {
        assert!(half_supports(1024, &[GgmlType::Q4_K; 3]));
        assert!(half_supports(256, &[GgmlType::Q4_K]));
        // Q4_K_M's Q6_K v, rows past 1024 or not whole super-blocks, no weights: not taken.
        assert!(!half_supports(1024, &[GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K]));
        assert!(!half_supports(1280, &[GgmlType::Q4_K]));
        assert!(!half_supports(640, &[GgmlType::Q4_K]));
        assert!(!half_supports(1024, &[]));
        let c = Cap(Default::default());
        let a = Norm { x: 1, add: None, w: None, out: 2, counter: 3, n: 1024, eps: 1e-6, threads: WIDE, half: true };
        // Qwen3-0.6B q/k/v: 4096 rows, 64 per block; 33 + 31 rows share one block.
        norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 2048, 5), (6, GgmlType::Q4_K, 1024, 7), (8, GgmlType::Q4_K, 1024, 9)]).unwrap();
        norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 33, 5), (6, GgmlType::Q4_K, 31, 7)]).unwrap();
        norm_glu(&c, &a, 4, 5, GgmlType::Q4_K, 3072, 6, false).unwrap();
        // Any other type is refused, not misread.
        assert!(norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 2048, 5), (8, GgmlType::Q6_K, 1024, 9)]).is_err());
        assert!(norm_glu(&c, &a, 4, 5, GgmlType::Q6_K, 3072, 6, false).is_err());
        assert_eq!(
            c.0.into_inner(),
            vec![
                ("decode_mv_norm4_h1k", [64, 1, 1], [1024, 1, 1]),
                ("decode_mv_norm4_h1k", [1, 1, 1], [1024, 1, 1]),
                ("decode_mv_glu4_h1k", [96, 1, 1], [1024, 1, 1]),
            ]
        );
    }

    #[test]
    fn norm_walk_takes_q4k_rows_of_at_most_16_super_blocks() {
        // Qwen3-4B (2560) and Llama-8B (4096) q/k/v and gate/up, all Q4_K.
        assert!(walk_supports(2560, &[GgmlType::Q4_K; 3]));
        assert!(walk_supports(4096, &[GgmlType::Q4_K, GgmlType::Q4_K]));
        // A Q6_K last weight (Q4_K_M's v) too, but nowhere else, and no other type.
        assert!(walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K]));
        assert!(walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q6_K]));
        assert!(!walk_supports(2560, &[GgmlType::Q6_K, GgmlType::Q4_K]));
        assert!(!walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q5_K]));
        // A Q6_K weight alone (the LM head) is head_mv's.
        assert!(!walk_supports(2560, &[GgmlType::Q6_K]));
        // Rows past 16 super-blocks or not whole ones, no or four weights: not taken.
        assert!(!walk_supports(4352, &[GgmlType::Q4_K]));
        assert!(!walk_supports(2592, &[GgmlType::Q4_K]));
        assert!(!walk_supports(2560, &[]));
        assert!(!walk_supports(2560, &[GgmlType::Q4_K; 4]));
        let c = Cap(Default::default());
        let a = Norm { x: 1, add: Some(10), w: None, out: 2, counter: 3, n: 2560, eps: 1e-6, threads: WIDE, half: false };
        norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 9728, 5), (6, GgmlType::Q4_K, 9728, 7)], 396).unwrap();
        norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 4096, 5), (6, GgmlType::Q6_K, 1024, 7)], 396).unwrap();
        assert!(norm_walk(&c, &a, &[(4, GgmlType::Q6_K, 9728, 5), (6, GgmlType::Q4_K, 9728, 7)], 396).is_err());
        assert!(norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 9728, 5)], 0).is_err());
        // Resident 256-thread blocks whatever a.threads says.
        assert_eq!(c.0.into_inner(), vec![("decode_mv_norm_walk", [396, 1, 1], [256, 1, 1]), ("decode_mv_norm_walk_v", [396, 1, 1], [256, 1, 1])]);
    }

    #[test]
    fn split_walk_takes_rows_of_2_to_16_steps() {
        // Qwen3-4B's down (9728): Q4_K 5 steps, Q6_K 10; Llama-8B's (14336): 7 and 14.
        assert_eq!(split_steps(GgmlType::Q4_K, 9728), Some(5));
        assert_eq!(split_steps(GgmlType::Q6_K, 9728), Some(10));
        assert_eq!(split_steps(GgmlType::Q4_K, 14336), Some(7));
        assert_eq!(split_steps(GgmlType::Q6_K, 14336), Some(14));
        // One step, more than 16, partial super-blocks, other types: not taken.
        assert_eq!(split_steps(GgmlType::Q4_K, 2048), None);
        assert_eq!(split_steps(GgmlType::Q6_K, 17408), None);
        assert_eq!(split_steps(GgmlType::Q4_K, 9760), None);
        assert_eq!(split_steps(GgmlType::Q5_K, 9728), None);
        let c = Cap(Default::default());
        split_walk(&c, 1, 9728, 2, GgmlType::Q6_K, 2560, 3, 396).unwrap();
        split_walk(&c, 1, 9728, 2, GgmlType::Q4_K, 2560, 3, 792).unwrap();
        assert!(split_walk(&c, 1, 9728, 2, GgmlType::Q8_0, 2560, 3, 396).is_err());
        assert!(split_walk(&c, 1, 9728, 2, GgmlType::Q4_K, 2560, 3, 0).is_err());
        assert_eq!(c.0.into_inner(), vec![("decode_mv_split", [396, 1, 1], [320, 1, 1]), ("decode_mv_split", [792, 1, 1], [160, 1, 1])]);
    }

    #[test]
    fn warps_per_row_follow_the_steps() {
        // Qwen3-0.6B: o (2048, one Q4_K step) 1; down (3072) Q4_K 2 steps, Q6_K 3 → 4.
        assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 2048), 1);
        assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 3072), 2);
        assert_eq!(quant_warps_per_row(GgmlType::Q6_K, 3072), 4);
        assert_eq!(quant_warps_per_row(GgmlType::Q6_K, 4096), 4);
        // Qwen3-4B's down (9728: 5 Q4_K steps) and the 32-element types: one warp.
        assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 9728), 1);
        assert_eq!(quant_warps_per_row(GgmlType::Q8_0, 3072), 1);
    }
}
