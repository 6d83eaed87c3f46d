//! dequant(quant(x)) stays within each type's error bound, on random data (proptest)
//! and on llama.cpp's `test-quantize-fns` cosine pattern (RMSE thresholds).

use lode_runtime::quant::{dequantize, quantize, GgmlType};
use proptest::prelude::*;

/// Every type that has a quantizer and a dequantizer.
const TYPES: [GgmlType; 19] = GgmlType::ALL;

/// Those with a per-element error bound (the linear codes; the CPU-only types' bounds are
/// in the RMSE test below and in `quant_gguf_py.rs`).
fn bounded() -> impl Iterator<Item = GgmlType> {
    TYPES.into_iter().filter(|t| !GgmlType::LOWBIT_WEIGHTS.contains(t) && !GgmlType::GRID_WEIGHTS.contains(t))
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    let mut y = vec![0f32; x.len()];
    dequantize(ty, &q, &mut y).unwrap();
    y
}

/// The largest error type `ty` may make on element `i` of the block `b`.
fn bound(ty: GgmlType, b: &[f32], v: f32) -> f32 {
    let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    let (mn, mx) = b
        .iter()
        .fold((f32::MAX, f32::MIN), |(a, c), &x| (a.min(x), c.max(x)));
    let range = mx - mn;
    let h = 1.0 / 1024.0; // twice an f16 ulp, relative
                          // An f16 scale below 2^-14 is subnormal: absolute error 2^-25 times the largest
                          // multiplier of that scale (code × sub-block scale).
    let mult: f32 = match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => 127.0,
        GgmlType::Q4_0 | GgmlType::Q4_1 => 16.0,
        GgmlType::Q5_0 | GgmlType::Q5_1 => 32.0,
        GgmlType::Q4_K => 16.0 * 63.0,
        GgmlType::Q5_K => 32.0 * 63.0,
        GgmlType::Q6_K => 32.0 * 128.0,
        _ => 0.0,
    };
    let tiny = 1e-6 * amax + mult * 2f32.powi(-25) + 1e-30;
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => v.abs() / 2048.0 + 6e-8,
        GgmlType::BF16 => v.abs() / 256.0 + 1e-38,
        GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 127.0 * (0.5 + 127.0 * h) + tiny,
        GgmlType::Q8_K => amax / 254.0 * 1.0001 + tiny,
        GgmlType::Q4_0 => amax / 8.0 * (1.0 + 8.0 * h) + tiny,
        GgmlType::Q5_0 => amax / 16.0 * (1.0 + 16.0 * h) + tiny,
        GgmlType::Q4_1 => range / 30.0 + (range + mn.abs()) * h + tiny,
        GgmlType::Q5_1 => range / 62.0 + (range + mn.abs()) * h + tiny,
        // K-quants: sub-block scales are themselves 6-/8-bit numbers, so the bound is
        // per super-block: one code step of the widest sub-block, plus rounding.
        GgmlType::Q4_K => range / 15.0 * 1.05 + tiny,
        GgmlType::Q5_K => range / 31.0 * 1.1 + tiny,
        GgmlType::Q6_K => amax / 32.0 * 1.05 + tiny,
        _ => f32::INFINITY,
    }
}

fn check(ty: GgmlType, x: &[f32]) -> Result<(), TestCaseError> {
    let y = round_trip(ty, x);
    let be = ty.block_elems().max(1);
    for (bi, (bx, by)) in x.chunks(be).zip(y.chunks(be)).enumerate() {
        for (i, (&a, &b)) in bx.iter().zip(by).enumerate() {
            let err = (a - b).abs();
            let lim = bound(ty, bx, a);
            prop_assert!(
                err <= lim,
                "{ty}: block {bi} elem {i}: x={a} y={b} err={err} > {lim}"
            );
        }
    }
    Ok(())
}

fn data() -> impl Strategy<Value = Vec<f32>> {
    (
        prop::collection::vec(-1.0f32..1.0, 512),
        -8i32..10,
        0usize..4,
    )
        .prop_map(|(mut v, e, kind)| {
            let s = 2f32.powi(e);
            for x in v.iter_mut() {
                *x *= s;
            }
            match kind {
                1 => v.iter_mut().for_each(|x| *x = x.abs()), // all positive (min > 0 paths)
                2 => v[7] *= 40.0,                            // one outlier
                3 => v[256..].iter_mut().for_each(|x| *x = 0.0), // an all-zero super-block
                _ => {}
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn every_type_round_trips_within_its_bound(x in data()) {
        for ty in bounded() {
            check(ty, &x)?;
        }
    }
}

#[test]
fn zeros_and_constants_round_trip_exactly() {
    for ty in TYPES {
        let z = vec![0f32; 512];
        assert_eq!(round_trip(ty, &z), z, "{ty} zeros");
        let c = vec![0.5f32; 512];
        let y = round_trip(ty, &c);
        // IQ3_S: a constant is not a point its search prefers; llama.cpp's quantizer (whose
        // bytes lode's match) writes values 0.43 .. 0.62 for it.
        let tol = if ty == GgmlType::IQ3_S { 0.13 } else { 0.5 / 256.0 };
        for v in y {
            assert!(
                (v - 0.5).abs() <= tol,
                "{ty}: constant 0.5 became {v}"
            );
        }
    }
}

/// llama.cpp's `test-quantize-fns` data, `0.1 + 2·cos(i)`: the RMSE of each type stays
/// under what uniform rounding to its code step would give.
#[test]
fn cosine_pattern_rmse_like_llama_cpp() {
    let n = 32 * 256;
    let x: Vec<f32> = (0..n).map(|i| 0.1 + 2.0 * (i as f32 + 0.0).cos()).collect();
    for ty in TYPES {
        let y = round_trip(ty, &x);
        let rmse = (x
            .iter()
            .zip(&y)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum::<f64>()
            / n as f64)
            .sqrt();
        // A uniform rounding error of one code step s has RMSE s/√12; the data spans
        // [-1.9, 2.1], so the step is ~4/(2^bits − 1) (per block, often less).
        let limit = match ty {
            GgmlType::F32 => 0.0,
            GgmlType::F16 => 2e-3 / 3.46,
            GgmlType::BF16 => 1.6e-2 / 3.46,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K => 4.2 / 254.0 / 3.46,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K => 4.2 / 15.0 / 3.46,
            GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Q5_K => 4.2 / 31.0 / 3.46,
            GgmlType::Q6_K => 4.2 / 63.0 / 3.46,
            GgmlType::Q2_K => 4.2 / 3.0 / 3.46,
            GgmlType::Q3_K => 4.2 / 7.0 / 3.46,
            GgmlType::IQ4_NL | GgmlType::IQ4_XS => 4.2 / 15.0 / 3.46,
            // E2M1: eight magnitudes 0..6, the step 2 of 12 (a sixth of the range) at the top.
            GgmlType::MXFP4 => 4.2 / 12.0 / 3.46 * 1.2,
            // llama.cpp's test-quantize-fns allows its 3-bit IQ types 0.0050 of total error
            // against Q3_K's 0.0040: Q3_K's bound times 1.25.
            GgmlType::IQ3_S => 4.2 / 7.0 / 3.46 * 1.25,
            other => panic!("{other}: no limit"),
        };
        assert!(rmse <= limit * 1.05, "{ty}: rmse {rmse} > {limit}");
        eprintln!("{ty}: rmse {rmse:.6}");
    }
}

#[test]
fn wrong_sizes_are_errors_not_panics() {
    let mut q = vec![0u8; 10];
    assert!(quantize(GgmlType::Q4_K, &[0.0; 100], &mut q).is_err());
    assert!(quantize(GgmlType::Q4_0, &[0.0; 32], &mut q).is_err());
    let mut y = vec![0f32; 33];
    assert!(dequantize(GgmlType::Q8_0, &[0u8; 34], &mut y).is_err());
}
