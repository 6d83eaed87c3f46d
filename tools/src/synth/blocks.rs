//! Random but valid tensor bytes, generated block by block without quantizing floats:
//! random code bytes, small positive f16 scales. Deterministic in (seed, tensor, chunk)
//! whatever the thread count, and produced in bounded pieces so a multi-GB tensor file
//! streams to disk without being held in memory.

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
/// place) so each block decodes to weights of roughly ±0.05.
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
            // ql[128], qh[64], i8 scales[16], d (f16) last: |w| ≤ d·128·32.
            GgmlType::Q6_K => block[208..210].copy_from_slice(&f16_in(rng, 5e-6, 1.5e-5)),
            // d (f16) then codes: Q8_0 |w| ≤ d·128, Q5_0 |w| ≤ d·16.
            GgmlType::Q8_0 => block[0..2].copy_from_slice(&f16_in(rng, 1e-4, 4e-4)),
            GgmlType::Q5_0 => block[0..2].copy_from_slice(&f16_in(rng, 1e-3, 3e-3)),
            _ => {}
        }
    }
}

/// Block types `fill_tensor` can generate.
pub fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::F32)
}

/// Write `n_bytes` of random valid `ty` data for tensor number `stream`.
/// F32 tensors (norm weights) get values in [0.9, 1.1).
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
