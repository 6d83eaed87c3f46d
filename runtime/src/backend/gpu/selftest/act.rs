//! Activation quantization checks (`act_*`): the GPU's activation blocks must equal, byte
//! for byte, what the CPU backend's `quant::quantize` makes of the same values — the q8_1
//! form against the CPU's Q8_1 (and its codes and d against Q8_0), the K form against
//! Q8_K (codes, f32 scale, code sums) — and the prefill GEMM's dequantized activations
//! against the CPU's dequantized blocks, bit for bit. The data has exact ties
//! (x·127/amax = j + 0.5), zero and all-equal blocks, equal magnitudes of both signs (the
//! K form's scale comes from the first), and huge and tiny magnitudes.

use crate::backend::gpu::launch::ActFmt;
use super::{Acc, Out, Rng, Target};
use crate::backend::gpu::GpuError;
use crate::quant::{self, GgmlType};

/// The check names, in run order.
pub const CHECKS: [&str; 5] = ["act_q8_1", "act_q8_0", "act_q8_k", "act_dq_q8_1", "act_dq_q8_k"];

/// What the CPU backend makes of `x` ([rows, n]) in the GPU's `fmt` block layout
/// ([rows, n/32] 36-byte blocks). n whole groups of `fmt`.
pub fn cpu_blocks(fmt: ActFmt, x: &[f32], rows: usize, n: usize) -> Result<Vec<u8>, GpuError> {
    let q = |ty: GgmlType, src: &[f32]| -> Result<Vec<u8>, GpuError> {
        let mut b = vec![0u8; ty.bytes_for(src.len() as u64).unwrap_or(0) as usize];
        quant::quantize(ty, src, &mut b).map_err(|e| GpuError::Unsupported(format!("reference quantize: {e}")))?;
        Ok(b)
    };
    let mut out = Vec::with_capacity(rows * n / 32 * 36);
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        match fmt {
            ActFmt::Q8_1 => out.extend(q(GgmlType::Q8_1, row)?),
            ActFmt::K => {
                // Q8_K: f32 d, 256 codes, 16 i16 sums of 16 → 8 blocks (d half, Σ32, codes).
                for sb in q(GgmlType::Q8_K, row)?.chunks_exact(292) {
                    for j in 0..8 {
                        let half = if j % 2 == 0 { &sb[0..2] } else { &sb[2..4] };
                        let bs = |i: usize| i16::from_le_bytes([sb[260 + 2 * i], sb[261 + 2 * i]]);
                        let s = bs(2 * j).wrapping_add(bs(2 * j + 1));
                        out.extend_from_slice(half);
                        out.extend_from_slice(&s.to_le_bytes());
                        out.extend_from_slice(&sb[4 + 32 * j..4 + 32 * j + 32]);
                    }
                }
            }
        }
    }
    Ok(out)
}

/// Rows of test data, `n` values each: random blocks at several scales mixed with the
/// awkward ones, each 256 values (so every 32- and 256-element group sees them).
pub fn awkward_rows(rng: &mut Rng, rows: usize, n: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * n);
    for _ in 0..rows {
        let mut at = 0;
        while at < n {
            let len = (n - at).min(256);
            let kind = rng.range(0, 9);
            let scale = [1.0f32, 3.0, 1e-3, 250.0, 1e6, 1e-20, 1e30, 7.5][rng.range(0, 7)];
            for i in 0..len {
                let v = match kind {
                    // Ties: the largest magnitude 127 makes 127/amax = 1 (q8_1) and
                    // -127/max = ∓1 (K form), so j + 0.5 lands exactly between codes.
                    0 => {
                        if i % 32 == 0 {
                            if rng.f() > 0.0 { 127.0 } else { -127.0 }
                        } else {
                            (rng.range(0, 252) as f32 - 126.0) + 0.5
                        }
                    }
                    1 => 0.0,
                    2 => 3.25 * scale,
                    // Equal magnitudes of both signs.
                    3 => if rng.f() > 0.0 { 2.5 * scale } else { -2.5 * scale },
                    // One zero 32-block inside a non-zero super-block.
                    4 => if i < 32 { 0.0 } else { rng.f() * scale },
                    // Power-of-two steps: many codes exactly on x·id = j + 0.5 after scaling.
                    5 => (rng.range(0, 64) as f32 - 32.0) * 0.5 * scale.min(8.0),
                    _ => rng.f() * scale,
                };
                x.push(v);
            }
            at += len;
        }
    }
    x
}

/// Runs the `act_*` check `name`.
pub(super) fn check(t: &dyn Target, name: &str, cases: usize, rng: &mut Rng, acc: &mut Acc) -> Out<()> {
    let fmt = if name.ends_with("q8_k") { ActFmt::K } else { ActFmt::Q8_1 };
    for c in 0..cases.max(4) {
        let rows = rng.range(1, 5);
        let n = fmt.group() * rng.range(1, if fmt == ActFmt::K { 24 } else { 150 });
        let x = if c % 4 == 3 { rng.vec(rows * n, 2.0) } else { awkward_rows(rng, rows, n) };
        let case = format!("rows={rows} n={n}");
        if name.starts_with("act_dq_") {
            let Some(got) = t.quantize_dq(fmt, &x, rows, n)? else { return Ok(None) };
            let ty = if fmt == ActFmt::K { GgmlType::Q8_K } else { GgmlType::Q8_1 };
            let mut b = vec![0u8; ty.bytes_for(n as u64).unwrap_or(0) as usize];
            let mut want = vec![0f32; rows * n];
            for r in 0..rows {
                quant::quantize(ty, &x[r * n..(r + 1) * n], &mut b).map_err(|e| GpuError::Unsupported(e.to_string()))?;
                quant::dequantize(ty, &b, &mut want[r * n..(r + 1) * n]).map_err(|e| GpuError::Unsupported(e.to_string()))?;
            }
            acc.cmp_bits(&case, &got, &want);
            continue;
        }
        let Some(got) = t.quantize_act(fmt, &x, rows, n)? else { return Ok(None) };
        if name == "act_q8_0" {
            // The q8_1 form's d and codes are the CPU's Q8_0 block (d, codes).
            let mut want = vec![0u8; rows * n / 32 * 34];
            for r in 0..rows {
                let per = n / 32 * 34;
                quant::quantize(GgmlType::Q8_0, &x[r * n..(r + 1) * n], &mut want[r * per..(r + 1) * per]).map_err(|e| GpuError::Unsupported(e.to_string()))?;
            }
            let got: Vec<u8> = got.chunks_exact(36).flat_map(|b| b[0..2].iter().chain(&b[4..36]).copied()).collect();
            acc.cmp_bytes(&case, &got, &want);
        } else {
            acc.cmp_bytes(&case, &got, &cpu_blocks(fmt, &x, rows, n)?);
        }
    }
    Ok(Some(()))
}

#[cfg(test)]
mod tests {
    use super::super::{run_checks, Elt, HostTarget};
    use super::*;

    /// The CPU target (its own blocks) passes; one that rounds ties away from zero, or
    /// stores the K form's scale as f16, is caught.
    #[test]
    fn act_checks_pass_on_the_cpu_and_catch_wrong_rounding() {
        for r in run_checks(&HostTarget, Some("act_"), 6, 11) {
            assert!(!r.skipped && r.passed(), "{}", r.line());
        }
        struct Wrong(bool);
        impl Target for Wrong {
            fn label(&self) -> String {
                "wrong".into()
            }
            fn quantize_act(&self, fmt: ActFmt, x: &[f32], rows: usize, k: usize) -> Out<Vec<u8>> {
                let mut b = cpu_blocks(fmt, x, rows, k)?;
                if self.0 {
                    // Ties away from zero: re-round every code from x·id with f32::round.
                    for (blk, xs) in b.chunks_exact_mut(36).zip(x.chunks_exact(32)) {
                        let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                        let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                        for (o, &v) in blk[4..].iter_mut().zip(xs) {
                            *o = (v * id).round() as i8 as u8;
                        }
                    }
                } else {
                    // The K form's f32 scale through f16 (low half kept, high half from f16).
                    for sb in b.chunks_exact_mut(36 * 8) {
                        let d = f32::from_le_bytes([sb[0], sb[1], sb[36], sb[37]]);
                        let r = half::f16::from_f32(d).to_f32().to_le_bytes();
                        sb[0..2].copy_from_slice(&r[0..2]);
                        sb[36..38].copy_from_slice(&r[2..4]);
                    }
                }
                Ok(Some(b))
            }
            fn matvec(&self, _: &[u8], _: GgmlType, _: usize, _: usize, _: &[f32], _: usize) -> Out<(Vec<f32>, Option<Vec<u8>>)> { Ok(None) }
            fn quantize_q8_1(&self, _: &[f32], _: usize, _: usize) -> Out<Vec<u8>> { Ok(None) }
            fn get_rows(&self, _: &[u8], _: GgmlType, _: usize, _: &[i32], _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn rmsnorm(&self, _: &[f32], _: Option<&[f32]>, _: usize, _: usize, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn rope(&self, _: &[f32], _: &[i32], _: Option<&[f32]>, _: usize, _: usize, _: usize, _: bool, _: f32, _: f32, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn attention(&self, _: &[f32], _: &[u16], _: &[u16], _: usize, _: usize, _: usize, _: usize, _: usize, _: usize, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn elementwise(&self, _: Elt, _: &[f32], _: &[f32], _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn f32_to_f16_rows(&self, _: &[f32], _: usize, _: usize, _: usize, _: usize, _: usize) -> Out<Vec<u16>> { Ok(None) }
        }
        let r = run_checks(&Wrong(true), Some("act_q8_1"), 6, 11);
        assert!(!r[0].passed(), "ties away from zero not caught: {}", r[0].line());
        let r = run_checks(&Wrong(false), Some("act_q8_k"), 6, 11);
        assert!(!r[0].passed(), "f16 K scale not caught: {}", r[0].line());
    }

    /// The awkward data holds exact ties of the q8_1 rounding.
    #[test]
    fn awkward_rows_hold_ties() {
        let mut rng = Rng::new(5);
        let x = awkward_rows(&mut rng, 4, 4096);
        let ties = x.chunks_exact(32).filter(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            amax > 0.0 && b.iter().any(|&v| ((v * (127.0 / amax)).fract().abs() - 0.5).abs() < 1e-6)
        });
        assert!(ties.count() > 4);
    }
}
