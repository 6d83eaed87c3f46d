//! Bad input the kernels cannot detect cheaply: non-finite block scales in weights, and
//! non-finite values given to a quantizer.

use super::float::{f16_at, f32_at};
use super::grid::iq1m_d_bits;
use super::types::GgmlType;
use super::QuantError;

/// The scale fields of a block of `ty`: (byte offset, name, f32 rather than f16).
fn scale_fields(ty: GgmlType) -> &'static [(usize, &'static str, bool)] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[(0, "d", false)],
        IQ3_S | IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_S => &[(0, "d", false)],
        Q4_1 | Q5_1 => &[(0, "d", false), (2, "m", false)],
        Q8_1 => &[(0, "d", false), (2, "s", false)],
        Q4_K | Q5_K => &[(0, "d", false), (2, "dmin", false)],
        Q2_K => &[(80, "d", false), (82, "dmin", false)],
        Q3_K => &[(108, "d", false)],
        Q6_K => &[(208, "d", false)],
        Q8_K => &[(0, "d", true)],
        // Floats have no scales; MXFP4's E8M0 exponent is finite for every byte
        // (ggml reads 255 as 2^127).
        _ => &[],
    }
}

/// Every block of `data` (whole blocks of `ty`) has finite scales; else the first
/// block that does not, by index. Types without scale fields always pass.
pub fn check_scales(ty: GgmlType, data: &[u8]) -> Result<(), QuantError> {
    let fields = scale_fields(ty);
    if fields.is_empty() && ty != GgmlType::IQ1_M {
        return Ok(());
    }
    let bb = ty.block_bytes();
    if data.len() % bb != 0 {
        let n = data.len() / bb * ty.block_elems();
        return Err(QuantError::ByteLen { ty, expected: n / ty.block_elems() * bb, got: data.len() });
    }
    for (block, b) in data.chunks_exact(bb).enumerate() {
        if ty == GgmlType::IQ1_M {
            // IQ1_M's f16 scale is spread over the top nibbles of its four scale words.
            let value = half::f16::from_bits(iq1m_d_bits(b)).to_f32();
            if !value.is_finite() {
                return Err(QuantError::NonFiniteScale { ty, block, field: "d", value });
            }
        }
        for &(off, field, is_f32) in fields {
            let value = if is_f32 { f32_at(b, off) } else { f16_at(b, off) };
            if !value.is_finite() {
                return Err(QuantError::NonFiniteScale { ty, block, field, value });
            }
        }
    }
    Ok(())
}

/// Every value of `src` is finite.
pub(crate) fn finite_input(ty: GgmlType, src: &[f32]) -> Result<(), QuantError> {
    match src.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(QuantError::NonFiniteInput { ty, index, value: src[index] }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_finite_scales_are_found_by_block() {
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::IQ4_NL, GgmlType::IQ4_XS, GgmlType::Q4_K, GgmlType::Q8_0] {
            let bb = ty.block_bytes();
            let mut data = vec![0u8; 3 * bb];
            assert!(check_scales(ty, &data).is_ok());
            let (off, field, _) = scale_fields(ty)[scale_fields(ty).len() - 1];
            for bits in [0x7c00u16, 0xfc00, 0x7e00] {
                data[2 * bb + off..2 * bb + off + 2].copy_from_slice(&bits.to_le_bytes());
                let e = check_scales(ty, &data).unwrap_err();
                assert!(matches!(e, QuantError::NonFiniteScale { block: 2, field: f, .. } if f == field), "{ty}: {e}");
                assert!(e.to_string().contains("block 2"), "{e}");
            }
            assert!(check_scales(ty, &data[..bb + 1]).is_err());
        }
        assert!(check_scales(GgmlType::MXFP4, &[0xff; 17]).is_ok());
        for ty in GgmlType::GRID_WEIGHTS {
            let bb = ty.block_bytes();
            let mut data = vec![0u8; 3 * bb];
            assert!(check_scales(ty, &data).is_ok(), "{ty}");
            // +Inf as f16 (0x7c00): IQ1_M holds its nibbles at the top of its scale words.
            if ty == GgmlType::IQ1_M {
                for (k, nib) in [0u8, 0, 0xc, 0x7].iter().enumerate() {
                    data[2 * bb + 48 + 2 * k + 1] = nib << 4;
                }
            } else {
                data[2 * bb..2 * bb + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
            }
            let e = check_scales(ty, &data).unwrap_err();
            assert!(matches!(e, QuantError::NonFiniteScale { block: 2, .. }), "{ty}: {e}");
        }
    }
}
