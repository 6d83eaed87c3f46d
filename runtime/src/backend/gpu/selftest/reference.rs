//! The host references the checks compare against: random weights of each type, the
//! q8_1 / K-form block decoders, the f64 matvec reference over quantized activations,
//! the CPU backend's RoPE, GeGLU and element-wise references, and f64 attention.

use crate::backend::gpu::launch::ActFmt;
use super::{Acc, Elt, Rng};
use crate::backend::gpu::GpuError;
use crate::quant::{self, GgmlType};

pub(crate) fn f16_bits(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}
pub(crate) fn f16_val(b: &[u8]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
}

/// Random weights of `ty`: random code bits, finite random scales (f16 fields rewritten).
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let n = rows * k;
    match ty {
        GgmlType::F32 => return bytemuck::cast_slice(&rng.vec(n, 1.0)).to_vec(),
        GgmlType::F16 => return rng.vec(n, 1.0).iter().flat_map(|&v| f16_bits(v)).collect(),
        GgmlType::BF16 => return rng.vec(n, 1.0).iter().flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes()).collect(),
        _ => {}
    }
    let bb = ty.block_bytes();
    let nb = n / ty.block_elems();
    let mut w = rng.bytes(nb * bb);
    let f16_fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::IQ3_S | GgmlType::IQ3_XXS | GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        _ => &[],
    };
    for b in 0..nb {
        for &off in f16_fields {
            let v = rng.f() * 0.05;
            w[b * bb + off..b * bb + off + 2].copy_from_slice(&f16_bits(v));
        }
        // MXFP4's E8M0 exponent byte: scales 2^-13 .. 2^-3 (any byte is valid; these keep
        // the products finite and the sums of the magnitude of the other types').
        if ty == GgmlType::MXFP4 {
            w[b * bb] = 115 + (rng.bytes(1)[0] % 11);
        }
        // IQ1_M's f16 scale sits in the top nibbles of its four scale words.
        if ty == GgmlType::IQ1_M {
            let d = half::f16::from_f32(rng.f() * 0.05).to_bits();
            for k in 0..4 {
                let at = b * bb + 48 + 2 * k + 1;
                w[at] = (w[at] & 0x0f) | (((d >> (4 * k)) & 15) as u8) << 4;
            }
        }
    }
    w
}

pub(crate) fn dequant(ty: GgmlType, w: &[u8], n: usize) -> Result<Vec<f32>, GpuError> {
    let mut out = vec![0f32; n];
    quant::dequantize(ty, w, &mut out).map_err(|e| GpuError::Unsupported(format!("reference dequantize: {e}")))?;
    Ok(out)
}

/// Decode q8_1 blocks: (x̂ values, per-block s).
pub(crate) fn decode_q8_1(b: &[u8], k: usize, rows: usize) -> (Vec<f32>, Vec<f32>) {
    decode_act(b, k, rows, ActFmt::Q8_1)
}

/// Decode activation blocks of `fmt`: (x̂ values, per-block s = d·Σq).
pub(crate) fn decode_act(b: &[u8], k: usize, rows: usize, fmt: ActFmt) -> (Vec<f32>, Vec<f32>) {
    let kb = k.div_ceil(32);
    let mut xh = vec![0f32; rows * kb * 32];
    let mut s = vec![0f32; rows * kb];
    for blk in 0..rows * kb {
        let p = &b[blk * 36..blk * 36 + 36];
        let d = match fmt {
            ActFmt::Q8_1 => f16_val(&p[0..2]),
            ActFmt::K => {
                let e = &b[(blk & !1) * 36..];
                f32::from_le_bytes([e[0], e[1], e[36], e[37]])
            }
        };
        s[blk] = match fmt {
            ActFmt::Q8_1 => f16_val(&p[2..4]),
            ActFmt::K => d * i16::from_le_bytes([p[2], p[3]]) as f32,
        };
        for i in 0..32 {
            xh[blk * 32 + i] = d * (p[4 + i] as i8) as f32;
        }
    }
    (xh, s)
}

/// f64 reference of a matvec over the kernel's own q8_1 activations, and per-output
/// tolerances: the min/offset term used s = Σx (f16) instead of Σx̂, bounded per block.
/// wf: [rows, k] dequantized weights; q8: [ncols, ceil(k/32)] blocks. Both [ncols, rows].
pub(crate) fn q8_reference(wf: &[f32], rows: usize, k: usize, q8: &[u8], ncols: usize, fmt: ActFmt) -> (Vec<f64>, Vec<f64>) {
    let (xh, s) = decode_act(q8, k, ncols, fmt);
    let kb = k.div_ceil(32);
    let mut want = vec![0f64; ncols * rows];
    let mut tol = vec![0f64; ncols * rows];
    for col in 0..ncols {
        for r in 0..rows {
            let (mut dot, mut mag, mut sterm) = (0f64, 0f64, 0f64);
            for b in 0..kb {
                let (mut sx, mut wmax, mut wmin) = (0f64, f64::MIN, f64::MAX);
                for i in b * 32..(b * 32 + 32).min(k) {
                    let wv = wf[r * k + i] as f64;
                    let xv = xh[col * kb * 32 + i] as f64;
                    dot += wv * xv;
                    mag += (wv * xv).abs();
                    sx += xv;
                    wmax = wmax.max(wv);
                    wmin = wmin.min(wv);
                }
                let off_bound = 2.0 * wmax.abs().max(wmin.abs()) + (wmax - wmin);
                let sd = (s[col * kb + b] as f64 - sx).abs() + 1e-3 * sx.abs();
                sterm += off_bound * sd;
            }
            want[col * rows + r] = dot;
            tol[col * rows + r] = 2e-5 * mag + sterm + 1e-5;
        }
    }
    (want, tol)
}

/// Checks that activation blocks of `fmt` are, byte for byte, what the CPU backend makes
/// of `vals` ([rows, n]): a producer kernel quantizes exactly what it wrote.
pub(crate) fn q8_blocks_check(acc: &mut Acc, case: &str, vals: &[f32], q: &[u8], rows: usize, n: usize, fmt: ActFmt) {
    match super::act::cpu_blocks(fmt, vals, rows, n) {
        Ok(want) => acc.cmp_bytes(&format!("{case} ({fmt:?} blocks)"), q, &want),
        Err(e) => acc.fail(format!("{case}: {e}")),
    }
    if fmt == ActFmt::K {
        return;
    }
    let (xh, s) = decode_q8_1(q, n, rows);
    let (mut got, mut wq, mut tol) = (Vec::new(), Vec::new(), Vec::new());
    for b in 0..rows * n / 32 {
        let blk = &vals[b * 32..b * 32 + 32];
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
        for i in 0..32 {
            got.push(xh[b * 32 + i]);
            wq.push(blk[i] as f64);
            tol.push(amax * (1.0 / 254.0 + 5e-4) * 1.01 + 1e-6);
        }
        let sq: f64 = (0..32).map(|i| xh[b * 32 + i] as f64).sum();
        got.push(s[b]);
        wq.push(sq);
        tol.push(sq.abs() * 1e-3 + amax * 1e-3 + 1e-5);
    }
    acc.cmp(&format!("{case} (q8_1)"), &got, &wq, |i| tol[i]);
}

/// The CPU backend's RoPE of one head (its own table: ggml's iterative f32 angle).
#[allow(clippy::too_many_arguments)]
pub(crate) fn cpu_rope_head(x: &mut [f32], pos: i32, n_rot: usize, neox: bool, base: f32, freq_scale: f32, ff: Option<&[f32]>, af: f32) {
    let (mut c, mut s) = (vec![0f32; n_rot / 2], vec![0f32; n_rot / 2]);
    crate::backend::cpu::ops::rope_table(pos as u32, n_rot, base, freq_scale, ff, None, &mut c, &mut s);
    c.iter_mut().for_each(|v| *v *= af);
    s.iter_mut().for_each(|v| *v *= af);
    let mode = if neox { crate::backend::RopeMode::Neox } else { crate::backend::RopeMode::Norm };
    crate::backend::cpu::ops::rope_head(x, mode, n_rot, &c, &s);
}

/// GeGLU reference: the CPU's f16-rounded GELU times `u`; where the kernel's f32 GELU sat
/// on an f16 rounding boundary the neighbouring f16 is accepted too (whichever is closest
/// to what the kernel wrote), so a kernel that skips the f16 rounding still fails.
pub(crate) fn geglu_want(a: f32, u: f32, got: f32) -> f64 {
    let g = crate::backend::cpu::ops::gelu_tanh_f16(a);
    if !(-10.0..10.0).contains(&a) || g == 0.0 {
        return g as f64 * u as f64;
    }
    let h = half::f16::from_f32(g);
    let bits = h.to_bits();
    let (up, down) = (half::f16::from_bits(bits.wrapping_add(1)), half::f16::from_bits(bits.wrapping_sub(1)));
    [h, up, down]
        .iter()
        .map(|c| c.to_f32() as f64 * u as f64)
        .min_by(|x, y| (x - got as f64).abs().total_cmp(&(y - got as f64).abs()))
        .unwrap_or(g as f64 * u as f64)
}

pub(crate) fn ref_elt(op: Elt, a: f64, b: f64, p: f64) -> f64 {
    match op {
        Elt::Add => a + b,
        Elt::Mul => a * b,
        Elt::Scale => a * p,
        Elt::SwiGlu => a / (1.0 + (-a).exp()) * b,
        Elt::GeGlu => crate::backend::cpu::ops::gelu_tanh_f16(a as f32) as f64 * b,
        Elt::Softcap => (a / p).tanh() * p,
    }
}

/// f64 attention reference over f16 caches (layouts as in `ops::attention`).
#[allow(clippy::too_many_arguments)]
pub fn ref_attention(q: &[f32], kc: &[u16], vc: &[u16], n_tok: usize, n_head: usize, n_kv: usize, hd: usize, pos0: usize, window: usize, scale: f32) -> Vec<f64> {
    let h2 = |b: u16| half::f16::from_bits(b).to_f32() as f64;
    let mut out = vec![0f64; n_tok * n_head * hd];
    for t in 0..n_tok {
        let p = pos0 + t;
        let k0 = if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        for h in 0..n_head {
            let kvh = h / (n_head / n_kv);
            let qv = &q[(t * n_head + h) * hd..(t * n_head + h + 1) * hd];
            let scores: Vec<f64> = (k0..=p)
                .map(|j| (0..hd).map(|e| qv[e] as f64 * h2(kc[j * n_kv * hd + kvh * hd + e])).sum::<f64>() * scale as f64)
                .collect();
            let m = scores.iter().cloned().fold(f64::MIN, f64::max);
            let ws: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let l: f64 = ws.iter().sum();
            for e in 0..hd {
                out[(t * n_head + h) * hd + e] = (k0..=p).zip(&ws).map(|(j, w)| w * h2(vc[j * n_kv * hd + kvh * hd + e])).sum::<f64>() / l;
            }
        }
    }
    out
}

/// A fused producer's case shape (norm, add+norm, GLU writing quantized blocks): 1–8 rows of
/// up to 12,800 values (past 8,192 the kernels' strided path); odd cases write the K form,
/// whose rows are whole 256-value super-blocks. Returns (rows, form, row length).
pub(crate) fn producer_case(rng: &mut Rng, case: usize) -> (usize, ActFmt, usize) {
    let rows = rng.range(1, 9);
    let fmt = if case % 2 == 1 { ActFmt::K } else { ActFmt::Q8_1 };
    let n = if fmt == ActFmt::K { 256 * rng.range(1, 50) } else { 32 * rng.range(1, 400) };
    (rows, fmt, n)
}
