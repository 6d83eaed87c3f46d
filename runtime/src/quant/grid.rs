//! The codebook ("grid") types: IQ3_S (110 B per 256), IQ3_XXS (98), IQ2_XXS (66),
//! IQ2_XS (74), IQ2_S (82), IQ1_S (50), IQ1_M (56) — ggml-common.h's `block_iq3_s` etc.
//! Each 32-element sub-block is 4 groups of 8 elements; a group's magnitudes are one
//! entry of a fixed grid (`iq_grids.rs`: IQ3 entries hold 4 values, so a group takes two),
//! its signs 8 bits (IQ1: no signs, the grid is signed, plus a shift of ±1/8).
//!
//! ```text
//! IQ3_S:   f16 d | u8 qs[64] | u8 qh[8] | u8 signs[32] | u8 scales[4]  y = d·(1 + 2s)·g
//! IQ3_XXS: f16 d | u8 qs[64] | u32 aux[8]                     y = d·(½ + s)·½·g
//! IQ2_XXS: f16 d | u32 aux[16] (2 per sub-block)              y = d·(½ + s)·¼·g
//! IQ2_XS:  f16 d | u16 qs[32] | u8 scales[8]                  y = d·(½ + s)·¼·g
//! IQ2_S:   f16 d | u8 qs[32] | u8 signs[32] | u8 qh[8] | u8 scales[8]
//! IQ1_S:   f16 d | u8 qs[32] | u16 qh[8]                      y = d·(2s + 1)·(g ± ⅛)
//! IQ1_M:   u8 qs[32] | u8 qh[16] | u16 scales[4] (d in their top nibbles)
//! ```
//! (`s`: a sub-block's 4-bit (IQ1: 3-bit) scale; IQ2_XS/IQ2_S/IQ1_M have one per 16
//! elements.) The sign bytes of IQ3_XXS / IQ2_XXS / IQ2_XS are 7-bit indices into
//! `KSIGNS`. Dequantization follows gguf-py's float steps, so it is bit-exact with it; the
//! dots against Q8_K follow ggml's generic `ggml_vec_dot_iq*_q8_K`: exact integer sums
//! per super-block, then one float step, in block order (the AVX2 kernels share
//! [`sub`] and every float step, so they agree with these bit for bit).

use super::float::{f16_at, f32_at};
use super::iq_grids::{byte, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS};
use super::q8k::{Q8K_QS, Q8_K_BYTES, QK_K};
use super::types::GgmlType;

#[inline(always)]
fn u16_at(b: &[u8], o: usize) -> u32 {
    u16::from_le_bytes([b[o], b[o + 1]]) as u32
}
#[inline(always)]
fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

/// One 32-element sub-block, decoded: the four 8-value group words (grid bytes, value j
/// of group l is byte j of `g[l]`), the 32 sign bits (bit e set: element e negative; 0 for
/// IQ1), the integer scale of each 16-element half as the dot uses it, and IQ1's shift
/// signs (bit l set: group l is shifted by −⅛, else +⅛).
#[derive(Clone, Copy)]
pub(crate) struct Sub {
    pub g: [u64; 4],
    pub signs: u32,
    pub ls: [i32; 2],
    pub neg_delta: u8,
}

/// Two IQ3 entries (4 values each) as one 8-value group word.
#[inline(always)]
fn pair3(t: &[u32], a: usize, b: usize) -> u64 {
    t[a] as u64 | (t[b] as u64) << 32
}

/// The four sign bytes of IQ3_XXS / IQ2_XXS: 7-bit `KSIGNS` indices at bits 7l.
#[inline(always)]
fn ksigns4(aux: u32) -> u32 {
    (0..4).fold(0, |s, l| s | (KSIGNS[((aux >> (7 * l)) & 127) as usize] as u32) << (8 * l))
}

/// IQ1_M's f16 super-block scale, from the top nibbles of its four u16 scale words.
#[inline(always)]
pub(crate) fn iq1m_d_bits(b: &[u8]) -> u16 {
    let sc = |k: usize| u16_at(b, 48 + 2 * k);
    ((sc(0) >> 12) | ((sc(1) >> 8) & 0x00f0) | ((sc(2) >> 4) & 0x0f00) | (sc(3) & 0xf000)) as u16
}

/// Sub-block `ib` (< 8) of a block `b` of the grid type `ty`.
#[inline(always)]
pub(crate) fn sub(ty: GgmlType, b: &[u8], ib: usize) -> Sub {
    let mut s = Sub { g: [0; 4], signs: 0, ls: [0; 2], neg_delta: 0 };
    match ty {
        GgmlType::IQ3_S => {
            let (qs, qh) = (&b[2 + 8 * ib..], b[66 + ib] as usize);
            for l in 0..4 {
                let i0 = qs[2 * l] as usize | ((qh >> (2 * l)) & 1) << 8;
                let i1 = qs[2 * l + 1] as usize | ((qh >> (2 * l + 1)) & 1) << 8;
                s.g[l] = pair3(&IQ3S_GRID, i0, i1);
            }
            s.signs = u32_at(b, 74 + 4 * ib);
            let ls = 2 * ((b[106 + ib / 2] >> (4 * (ib % 2))) & 15) as i32 + 1;
            s.ls = [ls, ls];
        }
        GgmlType::IQ3_XXS => {
            let qs = &b[2 + 8 * ib..];
            for l in 0..4 {
                s.g[l] = pair3(&IQ3XXS_GRID, qs[2 * l] as usize, qs[2 * l + 1] as usize);
            }
            let aux = u32_at(b, 66 + 4 * ib);
            s.signs = ksigns4(aux);
            s.ls = [2 * (aux >> 28) as i32 + 1; 2];
        }
        GgmlType::IQ2_XXS => {
            let (a0, a1) = (u32_at(b, 2 + 8 * ib), u32_at(b, 6 + 8 * ib));
            for l in 0..4 {
                s.g[l] = IQ2XXS_GRID[((a0 >> (8 * l)) & 255) as usize];
            }
            s.signs = ksigns4(a1);
            s.ls = [2 * (a1 >> 28) as i32 + 1; 2];
        }
        GgmlType::IQ2_XS => {
            for l in 0..4 {
                let q = u16_at(b, 2 + 2 * (4 * ib + l));
                s.g[l] = IQ2XS_GRID[(q & 511) as usize];
                s.signs |= (KSIGNS[(q >> 9) as usize] as u32) << (8 * l);
            }
            let sc = b[66 + ib] as i32;
            s.ls = [2 * (sc & 15) + 1, 2 * (sc >> 4) + 1];
        }
        GgmlType::IQ2_S => {
            let qh = b[66 + ib] as usize;
            for l in 0..4 {
                s.g[l] = IQ2S_GRID[b[2 + 4 * ib + l] as usize | ((qh >> (2 * l)) & 3) << 8];
            }
            s.signs = u32_at(b, 34 + 4 * ib);
            let sc = b[74 + ib] as i32;
            s.ls = [2 * (sc & 15) + 1, 2 * (sc >> 4) + 1];
        }
        GgmlType::IQ1_S => {
            let qh = u16_at(b, 34 + 2 * ib) as usize;
            for l in 0..4 {
                s.g[l] = IQ1S_GRID[b[2 + 4 * ib + l] as usize | ((qh >> (3 * l)) & 7) << 8];
            }
            s.ls = [2 * ((qh >> 12) & 7) as i32 + 1; 2];
            s.neg_delta = if qh & 0x8000 != 0 { 15 } else { 0 };
        }
        GgmlType::IQ1_M => {
            for l in 0..4 {
                let h = (b[32 + 2 * ib + l / 2] >> (4 * (l % 2))) as usize;
                s.g[l] = IQ1S_GRID[b[4 * ib + l] as usize | (h & 7) << 8];
                s.neg_delta |= (((h >> 3) & 1) as u8) << l;
            }
            let sc = u16_at(b, 48 + 2 * (ib / 2)) >> (6 * (ib % 2));
            s.ls = [2 * (sc & 7) as i32 + 1, 2 * ((sc >> 3) & 7) as i32 + 1];
        }
        _ => {}
    }
    s
}

/// The super-block scale `d` of a grid-type block.
#[inline(always)]
pub(crate) fn d_of(ty: GgmlType, b: &[u8]) -> f32 {
    if ty == GgmlType::IQ1_M {
        half::f16::from_bits(iq1m_d_bits(b)).to_f32()
    } else {
        f16_at(b, 0)
    }
}

/// The multiplier of the grid values in sub-block `ib`, half `h`, exactly as gguf-py
/// computes it (its float steps).
#[inline(always)]
fn dequant_scale(ty: GgmlType, d: f32, s: &Sub, h: usize) -> f32 {
    // ls = 2s + 1 for every type; the IQ2 / IQ3_XXS forms use (½ + s) = ls / 2.
    let raw = ((s.ls[h] - 1) / 2) as f32;
    match ty {
        GgmlType::IQ3_XXS => d * (0.5 + raw) * 0.5,
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => d * (0.5 + raw) * 0.25,
        _ => d * s.ls[h] as f32,
    }
}

/// Dequantize whole blocks of the grid type `ty`.
pub(crate) fn dequant(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let bb = ty.block_bytes();
    let iq1 = matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M);
    for (b, y) in src.chunks_exact(bb).zip(dst.chunks_exact_mut(QK_K)) {
        let d = d_of(ty, b);
        for (ib, y) in y.chunks_exact_mut(32).enumerate() {
            let s = sub(ty, b, ib);
            let dl = [dequant_scale(ty, d, &s, 0), dequant_scale(ty, d, &s, 1)];
            for (e, y) in y.iter_mut().enumerate() {
                let (l, j) = (e / 8, e % 8);
                let g = byte(s.g[l], j);
                let dh = dl[e / 16];
                *y = if iq1 {
                    let delta = if (s.neg_delta >> l) & 1 != 0 { -0.125f32 } else { 0.125 };
                    dh * (g as i8 as f32 + delta)
                } else {
                    let v = dh * g as f32;
                    if (s.signs >> e) & 1 != 0 {
                        -v
                    } else {
                        v
                    }
                };
            }
        }
    }
}

/// The factor ggml's generic dot applies to the whole sum (the grids hold the values
/// doubled, quadrupled or octupled).
#[inline(always)]
pub(crate) fn final_scale(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => 0.125,
        GgmlType::IQ3_XXS => 0.25,
        _ => 1.0,
    }
}

/// One super-block's float step (shared with the AVX2 kernels): `isum` the exact
/// `Σ ls·Σ g·q` with signs, `dsum` IQ1's `Σ ls·(±1)·Σ q`.
#[inline(always)]
pub(crate) fn block_step(ty: GgmlType, b: &[u8], y: &[u8], isum: i32, dsum: i32) -> f32 {
    let d = d_of(ty, b) * f32_at(y, 0);
    if matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M) {
        d * (isum as f32 + 0.125 * dsum as f32)
    } else {
        d * isum as f32
    }
}

/// Grid type · Q8_K, scalar: per sub-block the exact integer sums of each 16-element half,
/// scaled by its integer scale; then [`block_step`] per super-block, in block order.
pub(crate) fn dot(ty: GgmlType, w: &[u8], x: &[u8], n: usize) -> f32 {
    let bb = ty.block_bytes();
    let mut acc = 0f32;
    for (b, y) in w.chunks_exact(bb).zip(x.chunks_exact(Q8_K_BYTES)).take(n / QK_K) {
        let (mut isum, mut dsum) = (0i32, 0i32);
        for ib in 0..8 {
            let s = sub(ty, b, ib);
            let q = &y[Q8K_QS + 32 * ib..Q8K_QS + 32 * ib + 32];
            let mut half = [0i32; 2];
            let mut dh = [0i32; 2];
            for (e, &qe) in q.iter().enumerate() {
                let (l, j) = (e / 8, e % 8);
                let qe = qe as i8 as i32;
                let g = byte(s.g[l], j);
                let v = if matches!(ty, GgmlType::IQ1_S | GgmlType::IQ1_M) {
                    let sgn = if (s.neg_delta >> l) & 1 != 0 { -1 } else { 1 };
                    dh[e / 16] += sgn * qe;
                    g as i8 as i32
                } else if (s.signs >> e) & 1 != 0 {
                    -(g as i32)
                } else {
                    g as i32
                };
                half[e / 16] += v * qe;
            }
            isum += s.ls[0] * half[0] + s.ls[1] * half[1];
            dsum += s.ls[0] * dh[0] + s.ls[1] * dh[1];
        }
        acc += block_step(ty, b, y, isum, dsum);
    }
    final_scale(ty) * acc
}

pub(crate) fn dot_iq3_s(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ3_S, w, x, n)
}
pub(crate) fn dot_iq3_xxs(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ3_XXS, w, x, n)
}
pub(crate) fn dot_iq2_xxs(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ2_XXS, w, x, n)
}
pub(crate) fn dot_iq2_xs(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ2_XS, w, x, n)
}
pub(crate) fn dot_iq2_s(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ2_S, w, x, n)
}
pub(crate) fn dot_iq1_s(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ1_S, w, x, n)
}
pub(crate) fn dot_iq1_m(w: &[u8], x: &[u8], n: usize) -> f32 {
    dot(GgmlType::IQ1_M, w, x, n)
}

/// The largest `|y| / d` a block of the grid type `ty` can hold.
fn value_bound(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::IQ3_S => 31.0 * 15.0,
        GgmlType::IQ3_XXS => 15.5 * 0.5 * 62.0,
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => 15.5 * 0.25 * 43.0,
        _ => 15.0 * 1.125,
    }
}

/// `n_blocks` random valid blocks of the grid type `ty`: any code bytes (every bit
/// pattern is a valid grid index, sign or scale), `d` a positive f16 between ½ and 1 of
/// the value for which the largest representable value is `amp`. Test data and `lode
/// synth`'s weights: lode has no quantizer for these types.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64, amp: f32) -> Vec<u8> {
    assert!(GgmlType::GRID_WEIGHTS.contains(&ty), "{ty} is not a grid type");
    let bb = ty.block_bytes();
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut out = vec![0u8; n_blocks * bb];
    for b in out.chunks_exact_mut(bb) {
        for c in b.chunks_mut(8) {
            let r = next().to_le_bytes();
            c.copy_from_slice(&r[..c.len()]);
        }
        let frac = 0.5 + (next() % 1024) as f32 / 2048.0;
        let d = half::f16::from_f32(frac * amp / value_bound(ty)).to_bits();
        if ty == GgmlType::IQ1_M {
            for k in 0..4 {
                let nib = ((d >> (4 * k)) & 15) as u8;
                b[48 + 2 * k + 1] = (b[48 + 2 * k + 1] & 0x0f) | (nib << 4);
            }
        } else {
            b[0..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    out
}
