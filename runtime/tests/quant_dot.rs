//! The dot kernels and `matmul` against f64 references:
//! - each kernel (scalar and, where the CPU has it, AVX2) equals the f64 dot of the
//!   dequantized weights and the dequantized quantized activations, within float rounding;
//! - the AVX2 kernels equal the scalar ones exactly when every scale is a power of two
//!   (then all float products are exact and only the integer sums matter);
//! - `matmul` (1 and many tokens, uneven row counts) equals a naive f64 reference.

use lode_runtime::quant::{
    dequantize, kernel, matmul, matmul_with, quantize, quantize_rows, rows_kernel, scalar_kernel,
    vec_dot_type, GgmlType, Isa,
};
use proptest::prelude::*;

const WEIGHT_TYPES: [GgmlType; GgmlType::WEIGHTS.len()] = GgmlType::WEIGHTS;

/// `x` quantized to `ty`; for the grid types (no quantizer) random valid blocks of about
/// `x`'s magnitude, seeded by `x`'s bits.
fn quant(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    if GgmlType::GRID_WEIGHTS.contains(&ty) {
        let seed = x.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3));
        let amp = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        return lode_runtime::quant::grid_random_blocks(ty, x.len() / 256, seed, amp);
    }
    let mut q = vec![0u8; ty.bytes_for(x.len() as u64).unwrap() as usize];
    quantize(ty, x, &mut q).unwrap();
    q
}

fn dequant(ty: GgmlType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize(ty, q, &mut y).unwrap();
    y
}

/// Σ w·x in f64 over the dequantized values, and Σ |w·x| (the scale of rounding error).
fn ref_dot(w: &[f32], x: &[f32]) -> (f64, f64) {
    w.iter().zip(x).fold((0.0, 0.0), |(s, a), (&p, &q)| {
        let t = p as f64 * q as f64;
        (s + t, a + t.abs())
    })
}

/// Tolerance of a kernel against the f64 reference: float rounding of the per-block
/// scaling and sums, plus, for Q8_1 activations, the f16 rounding of the block sum `s`
/// that the Q4_1/Q5_1 min term uses instead of `d·Σq`.
fn tolerance(ty: GgmlType, wq: &[u8], xa: &[f32], mag: f64) -> f64 {
    let mut tol = 2e-5 * mag + 1e-30;
    if vec_dot_type(ty) == GgmlType::Q8_1 {
        let bb = ty.block_bytes();
        for (i, b) in wq.chunks(bb).enumerate() {
            let m = half::f16::from_bits(u16::from_le_bytes([b[2], b[3]]))
                .to_f32()
                .abs() as f64;
            let s: f64 = xa[32 * i..32 * i + 32]
                .iter()
                .map(|v| *v as f64)
                .sum::<f64>()
                .abs();
            tol += m * (s / 1024.0 + 1e-7);
        }
    }
    tol
}

fn check_dot(ty: GgmlType, w: &[f32], x: &[f32], isa: Isa) -> Result<(), TestCaseError> {
    let n = w.len();
    let wq = quant(ty, w);
    let xt = vec_dot_type(ty);
    let xq = quant(xt, x);
    let (wd, xd) = (dequant(ty, &wq, n), dequant(xt, &xq, n));
    let (want, mag) = ref_dot(&wd, &xd);
    let got = kernel(ty, isa).unwrap()(&wq, &xq, n) as f64;
    let tol = tolerance(ty, &wq, &xd, mag);
    prop_assert!(
        (got - want).abs() <= tol,
        "{ty} {isa:?}: got {got} want {want} (tol {tol})"
    );
    Ok(())
}

fn vecs(n: usize) -> impl Strategy<Value = (Vec<f32>, Vec<f32>)> {
    (
        prop::collection::vec(-1.0f32..1.0, n),
        prop::collection::vec(-1.0f32..1.0, n),
        -4i32..4,
    )
        .prop_map(|(w, mut x, e)| {
            let s = 2f32.powi(e);
            x.iter_mut().for_each(|v| *v *= s);
            (w, x)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn dot_equals_f64_dot_of_dequantized((w, x) in vecs(1024)) {
        for ty in WEIGHT_TYPES {
            check_dot(ty, &w, &x, Isa::Scalar)?;
            if Isa::Avx2.available() {
                check_dot(ty, &w, &x, Isa::Avx2)?;
            }
        }
    }

    /// Blocks whose scales are powers of two make every float product exact, so the
    /// SIMD and scalar kernels must agree bit for bit: their integer sums are equal.
    #[test]
    fn simd_equals_scalar_exactly_with_exact_scales(seed in any::<u64>(), n_blocks in 1usize..6) {
        prop_assume!(Isa::Avx2.available());
        for ty in WEIGHT_TYPES {
            let n = 256 * n_blocks;
            let (wq, xq) = exact_scale_blocks(ty, n, seed);
            let s = scalar_kernel(ty).unwrap()(&wq, &xq, n);
            let v = kernel(ty, Isa::Avx2).unwrap()(&wq, &xq, n);
            prop_assert!(same_or_lane_rounded(ty, s, v), "{}: scalar {} avx2 {}", ty, s, v);
        }
    }

    /// The many-rows kernels (four rows per pass, then the rest) equal the scalar
    /// one-row kernel row by row, exactly, under exact scales.
    #[test]
    fn rows_kernels_equal_scalar_exactly(seed in any::<u64>(), n_rows in 1usize..11) {
        prop_assume!(Isa::Avx2.available());
        for ty in WEIGHT_TYPES {
            let n = 256;
            let rb = ty.bytes_for(n as u64).unwrap() as usize;
            let mut w = Vec::new();
            let mut xq = Vec::new();
            for r in 0..n_rows {
                let (wr, x) = exact_scale_blocks(ty, n, seed.wrapping_add(r as u64 * 7919));
                w.extend_from_slice(&wr);
                if r == 0 { xq = x; }
            }
            let mut out = vec![f32::NAN; n_rows];
            rows_kernel(ty, Isa::Avx2).unwrap().rows(&w, rb, &xq, n, &mut out);
            for r in 0..n_rows {
                let s = scalar_kernel(ty).unwrap()(&w[r * rb..(r + 1) * rb], &xq, n);
                prop_assert!(same_or_lane_rounded(ty, s, out[r]), "{} row {}: scalar {} rows-kernel {}", ty, r, s, out[r]);
            }
        }
    }

    #[test]
    fn matmul_equals_naive_reference(
        rows in 1usize..70, n_tok in 1usize..20, kb in 1usize..3, seed in any::<u64>()
    ) {
        for ty in WEIGHT_TYPES {
            check_matmul(ty, rows, 256 * kb, n_tok, seed)?;
        }
    }
}

/// Bit-equal. (Q6_K's AVX2 kernel keeps llama.cpp's lane sums, where a lane's integer could
/// pass 2^24 with full-range sub-block scales and round in its conversion to f32; the
/// generator keeps those scales within ±2, so every order is exact.)
fn same_or_lane_rounded(_ty: GgmlType, a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits()
}

/// Random raw blocks for `ty` (weights) and its activation type with every f16/f32 scale
/// set to a small power of two (and Q8_K's bsums made consistent).
fn exact_scale_blocks(ty: GgmlType, n: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = Lcg(seed | 1);
    let xt = vec_dot_type(ty);
    // Start from real quantized data, then overwrite the scale fields.
    let w: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let (mut wq, mut xq) = (quant(ty, &w), quant(xt, &x));
    // One power of two for every scale of the case: all partial sums stay integers times
    // that power, far below 2^24, so every float step is exact in any order.
    let p2 = 2f32.powi(rng.below(6) as i32 - 3);
    let p2_f16 = half::f16::from_f32(p2).to_bits().to_le_bytes();
    let set_f16 = |b: &mut [u8], off: usize, _: &mut Lcg| b[off..off + 2].copy_from_slice(&p2_f16);
    let small_int = |i: usize, m: usize| (i % m) as f32 - (m / 2) as f32;
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 => &[0, 2],
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K | GgmlType::Q3_K => &[if ty == GgmlType::Q6_K { 208 } else { 108 }],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::IQ3_S | GgmlType::IQ3_XXS | GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ1_S => &[0],
        _ => &[],
    };
    if ty.is_quantized() {
        for b in wq.chunks_mut(ty.block_bytes()) {
            for &f in fields {
                set_f16(b, f, &mut rng);
            }
            if ty == GgmlType::MXFP4 {
                // The E8M0 exponent: 2^(e − 128), a power of two already; keep it small.
                b[0] = 124 + (rng.below(6) as u8);
            }
            if ty == GgmlType::Q6_K {
                // Q6_K's sixteen int8 sub-block scales multiply the integer sums too: kept
                // within ±2 the partial sums stay below 2^24 (with 8-bit scales a 256-element
                // super-block can reach 10^8, where f32 steps are 8 and the order shows).
                for (j, sc) in b[192..208].iter_mut().enumerate() {
                    *sc = ((j % 5) as i8 - 2) as u8;
                }
            }
        }
    } else {
        let v: Vec<f32> = (0..n).map(|i| small_int(i, 7)).collect();
        wq = quant(ty, &v);
    }
    match xt {
        GgmlType::Q8_0 | GgmlType::Q8_1 => {
            for b in xq.chunks_mut(xt.block_bytes()) {
                set_f16(b, 0, &mut rng);
                if xt == GgmlType::Q8_1 {
                    set_f16(b, 2, &mut rng);
                }
            }
        }
        GgmlType::Q8_K => {
            for b in xq.chunks_mut(292) {
                b[0..4].copy_from_slice(&p2.to_le_bytes());
            }
        }
        _ => {
            let v: Vec<f32> = (0..n).map(|i| small_int(i * 3, 5)).collect();
            xq = quant(xt, &v);
        }
    }
    (wq, xq)
}

fn check_matmul(
    ty: GgmlType,
    rows: usize,
    k: usize,
    n_tok: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    let mut rng = Lcg(seed | 1);
    let w: Vec<f32> = (0..rows * k).map(|_| rng.f32()).collect();
    let x: Vec<f32> = (0..n_tok * k).map(|_| rng.f32()).collect();
    let wq = quant(ty, &w);
    let wd = dequant(ty, &wq, rows * k);
    let xq = quantize_rows(ty, &x, n_tok, k).unwrap();
    let xd = dequant(xq.ty, &xq.data, n_tok * k);
    for isa in [Isa::Scalar, Isa::Avx2] {
        let mut y = vec![f32::NAN; n_tok * rows];
        if isa == Isa::Scalar {
            matmul_with(isa, &wq, ty, rows, k, &x, n_tok, &mut y).unwrap();
        } else {
            matmul(&wq, ty, rows, k, &x, n_tok, &mut y).unwrap();
        }
        for t in 0..n_tok {
            for r in 0..rows {
                let (want, mag) = ref_dot(&wd[r * k..(r + 1) * k], &xd[t * k..(t + 1) * k]);
                let rb = k / ty.block_elems() * ty.block_bytes();
                let tol = tolerance(ty, &wq[r * rb..(r + 1) * rb], &xd[t * k..(t + 1) * k], mag);
                let got = y[t * rows + r] as f64;
                prop_assert!(
                    (got - want).abs() <= tol,
                    "{ty} {isa:?} rows={rows} k={k} t={t} r={r}: {got} vs {want}"
                );
            }
        }
    }
    Ok(())
}

#[test]
fn matmul_rejects_bad_shapes() {
    let w = vec![0u8; 144];
    let mut y = vec![0f32; 1];
    assert!(matmul(&w, GgmlType::Q4_K, 1, 256, &[0.0; 255], 1, &mut y).is_err());
    assert!(matmul(&w, GgmlType::Q4_K, 2, 256, &[0.0; 256], 1, &mut y).is_err());
    assert!(matmul(&w, GgmlType::Q4_K, 1, 128, &[0.0; 128], 1, &mut y).is_err());
    assert!(matmul(&w, GgmlType::Q8_K, 1, 256, &[0.0; 256], 1, &mut y).is_err());
}

/// A tiny deterministic generator (the tests need reproducible raw bytes).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn f32(&mut self) -> f32 {
        (self.next() % 2_000_001) as f32 / 1_000_000.0 - 1.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// `matmul_batch` (q/k/v-style weights sharing one input, one parallel pass) gives each
/// weight exactly what `matmul_quantized` gives it alone.
#[test]
fn matmul_batch_equals_separate_matmuls() {
    use lode_runtime::quant::{matmul_batch, matmul_quantized, BatchItem};
    let k = 512;
    let mut rng = Lcg(42);
    for (types, n_tok) in [
        (vec![GgmlType::Q5_0, GgmlType::Q5_0, GgmlType::Q8_0], 1),
        (vec![GgmlType::Q4_K, GgmlType::Q6_K], 1),
        (vec![GgmlType::Q4_1, GgmlType::Q4_1], 3),
    ] {
        let rows = [37usize, 64, 200];
        let ws: Vec<Vec<u8>> = types
            .iter()
            .zip(rows)
            .map(|(&ty, r)| quant(ty, &(0..r * k).map(|_| rng.f32()).collect::<Vec<_>>()))
            .collect();
        let x: Vec<f32> = (0..n_tok * k).map(|_| rng.f32()).collect();
        let xq = quantize_rows(types[0], &x, n_tok, k).unwrap();
        let mut want: Vec<Vec<f32>> = Vec::new();
        for (i, &ty) in types.iter().enumerate() {
            let mut y = vec![0f32; n_tok * rows[i]];
            matmul_quantized(&ws[i], ty, rows[i], &xq, &mut y, Isa::best()).unwrap();
            want.push(y);
        }
        let mut got: Vec<Vec<f32>> = types
            .iter()
            .zip(rows)
            .map(|(_, r)| vec![f32::NAN; n_tok * r])
            .collect();
        let mut items: Vec<BatchItem> = got
            .iter_mut()
            .enumerate()
            .map(|(i, y)| BatchItem {
                w: &ws[i],
                ty: types[i],
                rows: rows[i],
                y,
            })
            .collect();
        matmul_batch(&mut items, &xq, Isa::best()).unwrap();
        assert_eq!(got, want, "{types:?}");
    }
}

/// A Q8_0 weight code of −128 is legal in a file (no quantizer writes it); the SIMD
/// kernel must still multiply it exactly, against positive and negative activations.
#[test]
fn q8_0_weight_code_minus_128_is_exact() {
    let mut w = vec![0u8; 34 * 2];
    let mut x = vec![0u8; 34 * 2];
    for b in 0..2 {
        w[34 * b..34 * b + 2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
        x[34 * b..34 * b + 2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
        for i in 0..32 {
            w[34 * b + 2 + i] = if i % 3 == 0 {
                0x80
            } else {
                (i as i8 - 16) as u8
            };
            x[34 * b + 2 + i] = ((i as i32 * 37 % 255) - 127) as i8 as u8;
        }
    }
    let s = scalar_kernel(GgmlType::Q8_0).unwrap()(&w, &x, 64);
    for isa in [Isa::Scalar, Isa::Avx2] {
        assert_eq!(
            kernel(GgmlType::Q8_0, isa).unwrap()(&w, &x, 64),
            s,
            "{isa:?}"
        );
    }
}

/// Many tokens (where 32-element-block bands are expanded to byte codes first) give each
/// token exactly what a one-token matmul gives it — except the rows that llama.cpp's CPU
/// backend sums in a batched order, which we follow on AVX2 (Q4_K: the first
/// `n − n % 4` tokens; Q6_K: every token of a batch of ≥ 8): those agree within a few ulp.
#[test]
fn many_token_matmul_equals_one_token_matmuls() {
    let (rows, k, n_tok) = (45usize, 512usize, 33usize);
    let mut rng = Lcg(7);
    let batched = Isa::best() == Isa::Avx2;
    for ty in WEIGHT_TYPES {
        let w = quant(ty, &(0..rows * k).map(|_| rng.f32()).collect::<Vec<_>>());
        let x: Vec<f32> = (0..n_tok * k).map(|_| rng.f32()).collect();
        let mut y = vec![f32::NAN; n_tok * rows];
        matmul(&w, ty, rows, k, &x, n_tok, &mut y).unwrap();
        for t in 0..n_tok {
            let mut y1 = vec![f32::NAN; rows];
            matmul(&w, ty, rows, k, &x[t * k..(t + 1) * k], 1, &mut y1).unwrap();
            let other_order = batched
                && ((ty == GgmlType::Q4_K && t < n_tok - n_tok % 4) || ty == GgmlType::Q6_K);
            if other_order {
                for (a, b) in y[t * rows..(t + 1) * rows].iter().zip(&y1) {
                    assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{ty} token {t}: {a} vs {b}");
                }
            } else {
                assert_eq!(&y[t * rows..(t + 1) * rows], &y1[..], "{ty} token {t}");
            }
        }
    }
}

/// The CPU-only types' AVX2 kernels keep their scalar twins' float steps (only the
/// integer sums are vectorized), so they agree bit for bit with any scales, not only
/// powers of two: one row, many rows, and through `matmul`.
#[test]
fn cpu_only_types_avx2_equals_scalar_bit_for_bit() {
    if !Isa::Avx2.available() {
        eprintln!("SKIP: no AVX2");
        return;
    }
    let mut rng = Lcg(23);
    for ty in GgmlType::LOWBIT_WEIGHTS.into_iter().chain(GgmlType::GRID_WEIGHTS) {
        for (rows, k) in [(1usize, 256usize), (7, 1024), (33, 2560)] {
            let w: Vec<f32> = (0..rows * k).map(|_| rng.f32() * 3.0).collect();
            let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
            let wq = quant(ty, &w);
            let xq = quant(vec_dot_type(ty), &x);
            let rb = wq.len() / rows;
            let mut out = vec![f32::NAN; rows];
            rows_kernel(ty, Isa::Avx2).unwrap().rows(&wq, rb, &xq, k, &mut out);
            for r in 0..rows {
                let s = scalar_kernel(ty).unwrap()(&wq[r * rb..(r + 1) * rb], &xq, k);
                let v = kernel(ty, Isa::Avx2).unwrap()(&wq[r * rb..(r + 1) * rb], &xq, k);
                assert_eq!(s.to_bits(), v.to_bits(), "{ty} k={k} row {r}: scalar {s} avx2 {v}");
                assert_eq!(s.to_bits(), out[r].to_bits(), "{ty} k={k} row {r}: rows kernel");
            }
            let (mut a, mut b) = (vec![0f32; 3 * rows], vec![0f32; 3 * rows]);
            let xs: Vec<f32> = (0..3 * k).map(|_| rng.f32()).collect();
            matmul_with(Isa::Scalar, &wq, ty, rows, k, &xs, 3, &mut a).unwrap();
            matmul_with(Isa::Avx2, &wq, ty, rows, k, &xs, 3, &mut b).unwrap();
            assert_eq!(a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), "{ty} matmul");
        }
    }
}
