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

/// The longest row the norm kernels take (`NORM_MAX` in decode_mv.hip).
pub const NORM_MAX: usize = 4096;
/// The longest row `decode_mv_quant` takes (`QUANT_MAX`).
pub const QUANT_MAX: usize = 16384;
/// Output rows per group: one 256-thread block's warps, one row each.
const ROWS: usize = 8;

/// Blocks of each kernel one multiprocessor holds at once (its launch bounds: registers
/// on sm_90). A launch has at most `sms ×` this many blocks; a larger matrix gives each
/// block more 8-row groups after its one prologue rather than a second wave of blocks
/// that would each repeat it (Qwen3-4B's gate/up: 1,216 groups on 264 blocks).
/// `LODE_MV_BLOCKS_PER_SM=N` overrides it for every kernel (measurements: fewer blocks,
/// more groups each, fewer prologues).
fn blocks_per_sm(kernel: &str) -> usize {
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    if let Some(n) = *OVERRIDE.get_or_init(|| std::env::var("LODE_MV_BLOCKS_PER_SM").ok().and_then(|v| v.parse().ok()).filter(|&n: &usize| n > 0)) {
        return n;
    }
    match kernel {
        "decode_mv_norm4" | "decode_mv_quant" => 4,
        "decode_mv_norm16" | "decode_mv_glu4" => 3,
        _ => 2,
    }
}

fn unsupported(what: String) -> GpuError {
    GpuError::Unsupported(what)
}

fn i(v: usize) -> KArg {
    KArg::I32(v as i32)
}

/// The kernels' weight type code (None: a type they do not take).
pub fn type_code(ty: GgmlType) -> Option<i32> {
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
}

impl Norm {
    fn check(&self, op: &str) -> R {
        if self.n == 0 || self.n % 32 != 0 || self.n > NORM_MAX {
            return Err(unsupported(format!("{op}: rows of {} values (whole 32-value blocks up to {NORM_MAX})", self.n)));
        }
        Ok(())
    }
    /// (kernel for this row length, leading arguments given the block count).
    fn args(&self, base: &'static str, nblk: usize) -> (&'static str, Vec<KArg>) {
        let name = match (base, self.n <= 1024) {
            ("norm", true) => "decode_mv_norm4",
            ("norm", false) => "decode_mv_norm16",
            (_, true) => "decode_mv_glu4",
            (_, false) => "decode_mv_glu16",
        };
        let args = vec![
            KArg::Ptr(self.x),
            KArg::Ptr(self.add.unwrap_or(0)),
            KArg::Ptr(self.w.unwrap_or(0)),
            KArg::Ptr(self.out),
            KArg::Ptr(self.counter),
            i(nblk),
            i(self.n),
            KArg::F32(self.eps),
        ];
        (name, args)
    }
}

/// The blocks each segment of `groups` 8-row groups gets when at most `cap` fit: all its
/// groups when everything fits, else its share of `cap` (at least one block).
fn split_blocks(groups: &[usize], cap: usize) -> Vec<usize> {
    let total: usize = groups.iter().sum();
    if total <= cap {
        return groups.to_vec();
    }
    groups.iter().map(|&g| if g == 0 { 0 } else { (cap * g / total).clamp(1, g) }).collect()
}

/// One launch: the norm, then y_s = W_s · out for each of 1 to 3 segments
/// (w [rows, n] of ty, ty, rows, y [rows] f32). `sms`: the device's multiprocessors.
pub fn norm_multi(d: &dyn Launch, a: &Norm, segs: &[(DevPtr, GgmlType, usize, DevPtr)], sms: usize) -> R {
    a.check("norm_multi")?;
    if segs.is_empty() || segs.len() > 3 {
        return Err(unsupported(format!("norm_multi: {} weights (1 to 3)", segs.len())));
    }
    let name = if a.n <= 1024 { "decode_mv_norm4" } else { "decode_mv_norm16" };
    let groups: Vec<usize> = (0..3).map(|s| segs.get(s).map(|g| g.2.div_ceil(ROWS)).unwrap_or(0)).collect();
    let nbs = split_blocks(&groups, sms.max(1) * blocks_per_sm(name));
    let mut tail = Vec::with_capacity(15);
    for s in 0..3 {
        match segs.get(s) {
            Some(&(w, ty, rows, y)) => {
                let code = type_code(ty).filter(|_| supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_multi: {ty} weights with rows of {}", a.n)))?;
                tail.extend([KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(code), i(nbs[s])]);
            }
            None => tail.extend([KArg::Ptr(0), KArg::Ptr(0), i(0), KArg::I32(-1), i(0)]),
        }
    }
    let nblk: usize = nbs.iter().sum();
    if nblk == 0 {
        return Err(unsupported("norm_multi: no output rows".into()));
    }
    let (_, mut args) = a.args("norm", nblk);
    debug_assert_eq!(args.len(), 8);
    args.extend(tail);
    d.launch(name, [nblk as u32, 1, 1], [256, 1, 1], &args)?;
    Ok(())
}

/// One launch: the norm, then y[r] = act(gate_r · out) · (up_r · out) (act SiLU, or
/// GELU-tanh when `gelu`). gate, up: [rows, n] of one type; y: [rows] f32.
#[allow(clippy::too_many_arguments)]
pub fn norm_glu(d: &dyn Launch, a: &Norm, gate: DevPtr, up: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, gelu: bool, sms: usize) -> R {
    a.check("norm_glu")?;
    let code = type_code(ty).filter(|_| supports(ty, a.n)).ok_or_else(|| unsupported(format!("norm_glu: {ty} weights with rows of {}", a.n)))?;
    if rows == 0 {
        return Err(unsupported("norm_glu: no output rows".into()));
    }
    let name = if a.n <= 1024 { "decode_mv_glu4" } else { "decode_mv_glu16" };
    let nblk = rows.div_ceil(ROWS).min(sms.max(1) * blocks_per_sm(name));
    let (_, mut args) = a.args("glu", nblk);
    args.extend([KArg::Ptr(gate), KArg::Ptr(up), KArg::Ptr(y), i(rows), KArg::I32(code), i(gelu as usize)]);
    d.launch(name, [nblk as u32, 1, 1], [256, 1, 1], &args)?;
    Ok(())
}

/// One launch: y = W · x with x [k] f32 quantized inside the kernel to the form `ty`
/// reads. w: [rows, k] of ty; y: [rows] f32; k <= [`QUANT_MAX`].
#[allow(clippy::too_many_arguments)]
pub fn quant_mv(d: &dyn Launch, x: DevPtr, k: usize, w: DevPtr, ty: GgmlType, rows: usize, y: DevPtr, sms: usize) -> R {
    let code = type_code(ty).filter(|_| supports(ty, k) && k <= QUANT_MAX).ok_or_else(|| unsupported(format!("quant_mv: {ty} weights with rows of {k}")))?;
    if rows == 0 {
        return Ok(());
    }
    let nblk = rows.div_ceil(ROWS).min(sms.max(1) * blocks_per_sm("decode_mv_quant"));
    d.launch("decode_mv_quant", [nblk as u32, 1, 1], [256, 1, 1], &[KArg::Ptr(x), i(k), KArg::Ptr(w), KArg::Ptr(y), i(rows), KArg::I32(code), i(nblk)])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::split_blocks;

    #[test]
    fn blocks_split_by_rows_within_the_cap() {
        assert_eq!(split_blocks(&[256, 128, 128], 528), vec![256, 128, 128]);
        let b = split_blocks(&[512, 128, 128], 396);
        assert!(b.iter().sum::<usize>() <= 396 && b.iter().zip([512, 128, 128]).all(|(&n, g)| n >= 1 && n <= g), "{b:?}");
        assert_eq!(split_blocks(&[1000, 1, 0], 10), vec![9, 1, 0]);
    }
}
