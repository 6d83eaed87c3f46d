//! The exponential that llama.cpp's CPU backend uses inside its vector loops (softmax,
//! SiLU) on an AVX-512 machine, the kind its fixtures were made on: a range reduction
//! `x = n·ln2 + b` with a two-part ln2, a degree-5 polynomial in `b` evaluated with fused
//! multiply-adds in a fixed grouping, and an exact scaling by `2^n`. It is within about
//! 1.5 ulp of `exp`, but it rounds differently from libm's `expf`, and those one-ulp
//! differences feed the 8-bit activation quantization of the next matmul, so the CPU
//! backend computes the same values (bit for bit) where llama.cpp uses it.
//!
//! Scalar code with `f32::mul_add`; [`with_fma`] runs a closure compiled with the FMA
//! instructions enabled so that `mul_add` is one instruction instead of a libm call.

/// `1.5·2^23`: adding it rounds to an integer.
const SHIFTER: f32 = 12_582_912.0;
const LOG2E: f32 = f32::from_bits(0x3FB8_AA3B);
/// ln 2 split in a short high part and the remainder.
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
/// Polynomial coefficients, degree 1 to 5.
const C1: f32 = f32::from_bits(0x3F7F_FFF6);
const C2: f32 = f32::from_bits(0x3EFF_FEDB);
const C3: f32 = f32::from_bits(0x3E2A_AF33);
const C4: f32 = f32::from_bits(0x3D2B_9F17);
const C5: f32 = f32::from_bits(0x3C07_2010);

/// `exp(x)` as ggml's AVX-512 vector code computes it.
#[inline(always)]
pub fn expf(x: f32) -> f32 {
    let z = x.mul_add(LOG2E, SHIFTER);
    let n = z - SHIFTER;
    let b = (-n).mul_add(LN2_LO, (-n).mul_add(LN2_HI, x));
    if n.abs() > 192.0 || n.is_nan() {
        // Far out of range (and ±inf): 0 below, +inf above (NaN stays NaN through the sum).
        return if n.is_nan() { x } else if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let hi = C5.mul_add(b, C4).mul_add(u, C3.mul_add(b, C2));
    let j = hi.mul_add(u, C1.mul_add(b, 1.0));
    scale2(j, n as i32)
}

/// `j·2^n` rounded once (as `vscalefps`), for |n| ≤ 192 and j in about [0.7, 1.5].
#[inline(always)]
fn scale2(j: f32, n: i32) -> f32 {
    let p2 = |e: i32| f32::from_bits(((e + 127) as u32) << 23);
    if (-126..=127).contains(&n) {
        j * p2(n)
    } else if n > 127 {
        // Exact first step; the second rounds (to inf when it overflows).
        (j * p2(n - 64)) * p2(64)
    } else {
        // Exact first step into the normal range; the second rounds once to a subnormal.
        (j * p2(n + 100)) * p2(-100)
    }
}

/// SiLU with [`expf`]: `x / (1 + exp(0 − x))`.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// `f()` compiled with AVX2+FMA when the CPU has them (so `mul_add` is an instruction),
/// else as is (`mul_add` through libm: the same values, slower).
#[inline(always)]
pub fn with_fma<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if crate::quant::Isa::Avx2.available() {
        #[target_feature(enable = "avx2,fma")]
        fn run<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { run(f) };
    }
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_to_exp_over_the_softmax_range() {
        for i in -20_000..=2_000 {
            let x = i as f32 * 4.4e-3;
            let (a, b) = (expf(x), x.exp());
            assert!(((a - b) / b).abs() < 3e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(expf(f32::NEG_INFINITY), 0.0);
        assert_eq!(expf(-200.0), 0.0);
        assert_eq!(expf(0.0), 1.0);
        assert_eq!(expf(200.0), f32::INFINITY);
        assert!(expf(-100.0) > 0.0 && expf(-100.0) < 1e-43);
    }

    #[test]
    fn fma_build_gives_the_same_bits() {
        let xs: Vec<f32> = (0..5000).map(|i| (i as f32 - 4000.0) * 0.0231).collect();
        let plain: Vec<u32> = xs.iter().map(|&x| expf(x).to_bits()).collect();
        let fast: Vec<u32> = with_fma(|| xs.iter().map(|&x| expf(x).to_bits()).collect());
        assert_eq!(plain, fast);
    }
}
