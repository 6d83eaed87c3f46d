//! AVX2 activation quantizers for Q8_0 and Q8_1, the same numbers as the portable
//! `q8::quant_q8_{0,1}`: `amax` by lane-wise max (exact in any order), `id = 127/amax`,
//! codes `round_ties_even(x·id)` (`vroundps` to nearest), `d` and `s` rounded to f16
//! to nearest even (`vcvtps2ph`), the code sum exact in integers.

use std::arch::x86_64::*;

use super::hsum;

const QK: usize = 32;

/// One block: writes `d`'s f16 at `b[0..2]`, the codes at `b[codes..codes+32]`, and
/// returns `(d, Σ codes)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn block(x: &[f32], b: &mut [u8], codes: usize) -> (f32, i32) {
    let x = &x[..QK];
    // SAFETY: `x` is 32 readable f32 (four unaligned 8-lane loads).
    let v: [__m256; 4] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(8 * k)) });
    let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_and_ps(v[0], abs);
    for vk in &v[1..] {
        m = _mm256_max_ps(m, _mm256_and_ps(*vk, abs));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let q: [__m256i; 4] = std::array::from_fn(|k| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(v[k], id));
        _mm256_cvtps_epi32(r)
    });
    // i32 → i16 → i8 (packs interleave 128-bit lanes; the permute restores order).
    let p01 = _mm256_packs_epi32(q[0], q[1]);
    let p23 = _mm256_packs_epi32(q[2], q[3]);
    let p = _mm256_packs_epi16(p01, p23);
    let p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    let out = &mut b[codes..codes + QK];
    // SAFETY: `out` is 32 writable bytes; unaligned store.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, p) };
    let sum = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let sum = hsum(_mm256_cvtepi32_ps(sum)) as i32; // |Σ| ≤ 32·127: exact in f32
    b[0..2].copy_from_slice(&f16(d).to_le_bytes());
    (d, sum)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16(x: f32) -> u16 {
    _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16
}

/// Q8_0 blocks of `src` into `dst` (34 bytes each).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quant_q8_0(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(34)) {
        block(x, b, 2);
    }
}

/// Q8_1 blocks of `src` into `dst` (36 bytes each): `s = d·Σq`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quant_q8_1(src: &[f32], dst: &mut [u8]) {
    for (x, b) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(36)) {
        let (d, sum) = block(x, b, 4);
        b[2..4].copy_from_slice(&f16(sum as f32 * d).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::{quantize, GgmlType, Isa};

    #[test]
    fn same_bytes_as_the_portable_quantizers() {
        if !Isa::Avx2.available() {
            return;
        }
        // Ramps with exact ties (k/2 steps against amax 127), zeros, negatives, tiny values.
        let mut x: Vec<f32> = (0..32 * 8).map(|i| (i as f32 - 100.0) * 0.5).collect();
        x[64..96].fill(0.0);
        x.extend((0..32 * 8).map(|i| ((i * 7919 % 1013) as f32 - 506.0) * 1e-3));
        for (ty, bytes) in [(GgmlType::Q8_0, 34), (GgmlType::Q8_1, 36)] {
            let n = x.len() / 32 * bytes;
            let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
            quantize(ty, &x, &mut a).unwrap();
            super::super::quantizer(ty).unwrap()(&x, &mut b);
            assert_eq!(a, b, "{ty}");
        }
    }
}
