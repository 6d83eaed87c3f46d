//! Random but valid tensor bytes, generated block by block without quantizing floats:
//! random code bytes, small f16 scales (positive, but for Q5_1's centring min).
//! Deterministic in (seed, tensor, chunk) whatever the thread count, and produced in
//! bounded pieces so a multi-GB tensor file streams to disk without being held in memory.

use std::io::Write;

use half::f16;
use lode_runtime::quant::GgmlType;
use rayon::prelude::*;

/// Bytes generated (in parallel) before each write: bounds memory per tensor.
const PIECE_BYTES: usize = 32 << 20;
/// Bytes one rayon task generates.
const TASK_BYTES: usize = 256 << 10;

/// wyrand: a tiny, fast, statistically decent generator; one `u64` of state.
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64, stream: u64, index: u64) -> Rng {
        let mut r = Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
        r.next();
        r
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// A small positive f16 in [lo, hi), as little-endian bytes.
fn f16_in(rng: &mut Rng, lo: f32, hi: f32) -> [u8; 2] {
    f16::from_f32(lo + (hi - lo) * rng.unit()).to_le_bytes()
}

/// Overwrite the scale fields of every block in `buf` (random code bytes already in
/// place) so each block decodes to weights of roughly ±0.05. Each bound below is the
/// largest |w| the layout allows at the top of the scale range drawn (ggml-common.h's
/// block structs; `lode_runtime::quant` decodes them the same way).
fn fix_blocks(ty: GgmlType, buf: &mut [u8], rng: &mut Rng) {
    let bb = ty.block_bytes();
    for block in buf.chunks_exact_mut(bb) {
        match ty {
            // d, dmin (f16) then 12 bytes of packed 6-bit scales/mins (any bits valid) and
            // 128 bytes of 4-bit codes: |w| ≤ d·63·15.
            GgmlType::Q4_K => {
                block[0..2].copy_from_slice(&f16_in(rng, 2e-5, 6e-5));
                block[2..4].copy_from_slice(&f16_in(rng, 2e-5, 6e-5));
            }
            // Q5_K as Q4_K plus qh[32] (fifth bits): codes 0..31, w = d·sc·q − dmin·m with
            // 6-bit sc, m: |w| ≤ max(d·63·31, dmin·63) < 0.049.
            GgmlType::Q5_K => {
                block[0..2].copy_from_slice(&f16_in(rng, 1e-5, 2.5e-5));
                block[2..4].copy_from_slice(&f16_in(rng, 1e-5, 2.5e-5));
            }
            // ql[128], qh[64], i8 scales[16], d (f16) last: |w| ≤ d·128·32.
            GgmlType::Q6_K => block[208..210].copy_from_slice(&f16_in(rng, 5e-6, 1.5e-5)),
            // scales[16] (low nibble scale, high nibble min), qs[64] (2-bit codes), d and
            // dmin (f16) at 80 and 82: w = d·sc·q − dmin·m, so −15·dmin ≤ w ≤ 45·d < 0.05.
            GgmlType::Q2_K => {
                block[80..82].copy_from_slice(&f16_in(rng, 4e-4, 1.1e-3));
                block[82..84].copy_from_slice(&f16_in(rng, 4e-4, 1.1e-3));
            }
            // hmask[32], qs[64], scales[12] (6-bit, offset by 32), d (f16) at 108:
            // w = d·(sc − 32)·q with q in −4..3, so |w| ≤ d·32·4 < 0.05.
            GgmlType::Q3_K => block[108..110].copy_from_slice(&f16_in(rng, 1.5e-4, 3.9e-4)),
            // d (f16), scales_h (u16), scales_l[4], qs[128]: w = d·(ls − 32)·K[q] with
            // 6-bit ls and |K| ≤ 127 (kvalues_iq4nl), so |w| ≤ d·32·127 < 0.049.
            GgmlType::IQ4_XS => block[0..2].copy_from_slice(&f16_in(rng, 5e-6, 1.2e-5)),
            // d (f16), qs[64], qh[8], signs[32], scales[4]: w = d·(2s + 1)·g with 4-bit s
            // and grid values g ≤ 15, so |w| ≤ d·31·15 < 0.05.
            GgmlType::IQ3_S => block[0..2].copy_from_slice(&f16_in(rng, 4e-5, 1.05e-4)),
            // d (f16), qs[16]: IQ4_NL w = d·K[q], |w| ≤ d·127; Q4_0 w = d·(q − 8), |w| ≤ d·8.
            GgmlType::IQ4_NL => block[0..2].copy_from_slice(&f16_in(rng, 1.5e-4, 3.9e-4)),
            GgmlType::Q4_0 => block[0..2].copy_from_slice(&f16_in(rng, 2.5e-3, 6e-3)),
            // e (E8M0) then qs[16]: w = 2^(e−128)·M[q] with |M| ≤ 12, so e in 118..=120
            // gives |w| ≤ 12·2^−8 < 0.047.
            GgmlType::MXFP4 => block[0] = 118 + (rng.next() % 3) as u8,
            // d (f16) then codes: Q8_0 |w| ≤ d·128, Q5_0 |w| ≤ d·16.
            GgmlType::Q8_0 => block[0..2].copy_from_slice(&f16_in(rng, 1e-4, 4e-4)),
            GgmlType::Q5_0 => block[0..2].copy_from_slice(&f16_in(rng, 1e-3, 3e-3)),
            // d, m (f16), qh[4], qs[16]: w = d·q + m with q in 0..31; m = −16·d centres
            // it, |w| ≤ d·16.
            GgmlType::Q5_1 => {
                let d = f16_in(rng, 1.5e-3, 3e-3);
                let m = f16::from_f32(-16.0 * f16::from_le_bytes(d).to_f32());
                block[0..2].copy_from_slice(&d);
                block[2..4].copy_from_slice(&m.to_le_bytes());
            }
            _ => {}
        }
    }
}

/// Block types `fill_tensor` can generate: every type a mix of [`super::Quant`] assigns,
/// and their fallbacks for rows that are not whole super-blocks.
pub fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | IQ3_S | IQ4_NL | Q4_0 | Q5_0 | Q5_1 | Q8_0 | MXFP4 | F16 | F32)
}

/// Write `n_bytes` of random valid `ty` data for tensor number `stream`.
/// F32 tensors (norm weights) get values in [0.9, 1.1); F16 ones (the last fallback of
/// a quantized matrix) weights in [−0.05, 0.05).
pub fn fill_tensor(ty: GgmlType, n_bytes: u64, seed: u64, stream: u64, out: &mut dyn Write) -> std::io::Result<()> {
    let bb = ty.block_bytes();
    let task = TASK_BYTES / bb * bb;
    let piece = PIECE_BYTES / task * task;
    let mut buf = vec![0u8; piece.min(n_bytes as usize)];
    let mut done = 0u64;
    while done < n_bytes {
        let len = (n_bytes - done).min(buf.len() as u64) as usize;
        let first_task = done / task as u64;
        buf[..len].par_chunks_mut(task).enumerate().for_each(|(i, chunk)| {
            let mut rng = Rng::new(seed, stream, first_task + i as u64);
            if ty == GgmlType::F32 {
                for w in chunk.chunks_exact_mut(4) {
                    w.copy_from_slice(&(0.9 + 0.2 * rng.unit()).to_le_bytes());
                }
            } else if ty == GgmlType::F16 {
                for w in chunk.chunks_exact_mut(2) {
                    w.copy_from_slice(&f16_in(&mut rng, -0.05, 0.05));
                }
            } else {
                rng.fill(chunk);
                fix_blocks(ty, chunk, &mut rng);
            }
        });
        out.write_all(&buf[..len])?;
        done += len as u64;
    }
    Ok(())
}
