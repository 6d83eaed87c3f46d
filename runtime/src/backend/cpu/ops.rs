//! The CPU backend's element-wise kernels, on plain slices. Each is the reference its
//! GPU twin is checked against, so each follows llama.cpp's arithmetic (f32 values,
//! f64 sums where ggml uses them).

use crate::backend::{Glu, RopeMode, Yarn};

/// One row: `out = x / sqrt(mean(x²) + eps) ⊙ w`. `out` may alias nothing; see
/// [`rms_norm_inplace`] for the in-place form.
pub fn rms_norm_row(x: &[f32], out: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let scale = rms_scale(x, eps);
    match w {
        Some(w) => {
            for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
                *o = v * scale * g;
            }
        }
        None => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = v * scale;
            }
        }
    }
}

/// [`rms_norm_row`] in place.
pub fn rms_norm_inplace(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let scale = rms_scale(x, eps);
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * scale * g),
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}

fn rms_scale(x: &[f32], eps: f32) -> f32 {
    // ggml accumulates the squares in double.
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// The cos/sin table of one position: `n_rot/2` pairs, ggml's iterative f32 theta (with
/// YaRN: ggml's `rope_yarn` angle, the ramp between the correction dimensions; its
/// magnitude factor is the model's, in the attention scale).
#[allow(clippy::too_many_arguments)]
pub fn rope_table(
    pos: u32,
    n_rot: usize,
    base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    yarn: Option<&Yarn>,
    cos: &mut [f32],
    sin: &mut [f32],
) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let (ext, corr) = match yarn {
        Some(y) if y.ext_factor != 0.0 => (y.ext_factor, yarn_corr_dims(n_rot, y.n_ctx_orig, base, y.beta_fast, y.beta_slow)),
        _ => (0.0, [0.0; 2]),
    };
    let mut theta = pos as f32;
    for i in 0..n_rot / 2 {
        let ff = factors.map_or(1.0, |f| f[i]);
        let extrap = theta / ff;
        let mut t = freq_scale * extrap;
        if ext != 0.0 {
            let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
            let mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
            t = t * (1.0 - mix) + extrap * mix;
        }
        cos[i] = t.cos();
        sin[i] = t.sin();
        theta *= theta_scale;
    }
}

/// ggml's `ggml_rope_yarn_corr_dims`: the first and last dimensions of YaRN's ramp.
pub fn yarn_corr_dims(n_rot: usize, n_ctx_orig: usize, base: f32, beta_fast: f32, beta_slow: f32) -> [f32; 2] {
    let dim = |beta: f32| n_rot as f32 * (n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    [dim(beta_fast).floor().max(0.0), dim(beta_slow).ceil().min(n_rot as f32 - 1.0)]
}

/// Rotates one head vector with a precomputed table. The rounding is that of ggml's
/// compiled code (gcc contracts its `x0·cos − x1·sin` into a fused multiply-add):
/// `fma(x0, cos, −(x1·sin))` and `fma(x0, sin, x1·cos)`.
pub fn rope_head(x: &mut [f32], mode: RopeMode, n_rot: usize, cos: &[f32], sin: &[f32]) {
    super::vexp::with_fma(|| {
        let half = n_rot / 2;
        for i in 0..half {
            let (a, b) = match mode {
                RopeMode::Norm => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (x[a], x[b]);
            x[a] = x0.mul_add(cos[i], -(x1 * sin[i]));
            x[b] = x0.mul_add(sin[i], x1 * cos[i]);
        }
    })
}

/// `out = act(gate) ⊙ up`, element-wise.
pub fn glu(gate: &[f32], up: &[f32], out: &mut [f32], act: Glu) {
    match act {
        Glu::Silu => super::vexp::with_fma(|| {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = silu(g) * u;
            }
        }),
        Glu::GeluTanh => {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = gelu_tanh_f16(g) * u;
            }
        }
    }
}

/// [`glu`] with the gate values in `gate_out`, overwritten by the result.
pub fn glu_inplace(gate_out: &mut [f32], up: &[f32], act: Glu) {
    match act {
        Glu::Silu => super::vexp::with_fma(|| {
            for (o, &u) in gate_out.iter_mut().zip(up) {
                *o = silu(*o) * u;
            }
        }),
        Glu::GeluTanh => {
            for (o, &u) in gate_out.iter_mut().zip(up) {
                *o = gelu_tanh_f16(*o) * u;
            }
        }
    }
}

/// SiLU as llama.cpp's CPU backend computes it in its fused SwiGLU: with its vector
/// exponential ([`super::vexp`]), not libm's.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    super::vexp::silu(x)
}

/// GELU as ggml's CPU backend computes it: the input rounded to f16, GELU of that,
/// the result rounded to f16 (ggml reads a 64K-entry f16 table); saturated outside
/// ±10. Matching this rounding is measurable in Gemma's top-1 agreement.
pub fn gelu_tanh_f16(x: f32) -> f32 {
    use half::f16;
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_table()[f16::from_f32(x).to_bits() as usize].to_f32()
    }
}

/// `f16(gelu_tanh(h))` for every f16 bit pattern `h` (128 KiB, built on first use):
/// the rounding above makes GELU a function of 65,536 inputs.
fn gelu_table() -> &'static [half::f16] {
    use half::f16;
    static TABLE: std::sync::OnceLock<Vec<f16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..=u16::MAX).map(|b| f16::from_f32(gelu_tanh(f16::from_bits(b).to_f32()))).collect())
}

/// GELU, tanh form: `0.5x(1 + tanh(√(2/π)·x·(1 + 0.044715x²)))`, rounded as ggml's
/// compiled table builder does (gcc contracts `1 + a·x·x` into one fused multiply-add).
pub fn gelu_tanh(x: f32) -> f32 {
    #[allow(clippy::excessive_precision)]
    const SQRT_2_OVER_PI: f32 = 0.797_884_560_802_865_355_879_892_119_868_76;
    const COEF_A: f32 = 0.044715;
    let inner = (COEF_A * x).mul_add(x, 1.0);
    (0.5 * x) * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_unit_rms() {
        let x = [3.0f32, -4.0, 0.0, 1.0];
        let mut y = [0.0; 4];
        rms_norm_row(&x, &mut y, None, 0.0);
        let ms: f32 = y.iter().map(|v| v * v).sum::<f32>() / 4.0;
        assert!((ms - 1.0).abs() < 1e-5);
        let mut z = x;
        rms_norm_inplace(&mut z, Some(&[2.0; 4]), 0.0);
        for (a, b) in z.iter().zip(&y) {
            assert!((a - 2.0 * b).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_position_zero_is_identity_and_preserves_norm() {
        let (mut c, mut s) = (vec![0.0; 4], vec![0.0; 4]);
        rope_table(0, 8, 10000.0, 1.0, None, None, &mut c, &mut s);
        let mut x: Vec<f32> = (0..8).map(|i| i as f32).collect();
        let orig = x.clone();
        rope_head(&mut x, RopeMode::Neox, 8, &c, &s);
        assert_eq!(x, orig);
        rope_table(17, 8, 10000.0, 1.0, None, None, &mut c, &mut s);
        for mode in [RopeMode::Norm, RopeMode::Neox] {
            let mut y = orig.clone();
            rope_head(&mut y, mode, 8, &c, &s);
            let n0: f32 = orig.iter().map(|v| v * v).sum();
            let n1: f32 = y.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3, "{mode:?}");
            assert_ne!(y, orig);
        }
    }

    #[test]
    fn rope_pair_choice_differs_by_mode() {
        // Pair 0 rotated by 90°: NORM moves x[1] into x[0]; NEOX moves x[2] into x[0].
        let cos = [0.0, 1.0];
        let sin = [1.0, 0.0];
        let mut a = [1.0f32, 2.0, 3.0, 4.0];
        rope_head(&mut a, RopeMode::Norm, 4, &cos, &sin);
        assert_eq!(a, [-2.0, 1.0, 3.0, 4.0]);
        let mut b = [1.0f32, 2.0, 3.0, 4.0];
        rope_head(&mut b, RopeMode::Neox, 4, &cos, &sin);
        assert_eq!(b, [-3.0, 2.0, 1.0, 4.0]);
    }

    #[test]
    fn gelu_table_equals_the_direct_rounding() {
        use half::f16;
        // Inside the unsaturated range (±10): every f16 input's neighbourhood.
        for i in -13_000..13_000 {
            let x = i as f32 * 7.3e-4;
            let direct = f16::from_f32(gelu_tanh(f16::from_f32(x).to_f32())).to_f32();
            assert_eq!(gelu_tanh_f16(x).to_bits(), direct.to_bits(), "{x}");
        }
    }

    #[test]
    fn activations_known_values() {
        assert!((silu(1.0) - 0.731_058_6).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
        assert_eq!(gelu_tanh(0.0), 0.0);
    }
}
