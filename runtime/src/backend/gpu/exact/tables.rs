//! Host-computed tables for the exact kernels: values the CPU backend gets from libm
//! (RoPE's cos/sin) or from a table it builds with libm (GELU), computed here by the CPU
//! backend's own functions and uploaded, so the GPU never evaluates a transcendental
//! where the CPU used libm.

use crate::backend::cpu::ops;
use crate::backend::Rope;
use crate::quant;

/// The RoPE table of `pos`: `[n_tok, n_rot/2]` cos, then `[n_tok, n_rot/2]` sin, each row
/// `cpu::ops::rope_table` of that position (the CPU backend's iterative theta, libm's
/// `cos`/`sin`).
pub fn rope_table(pos: &[u32], rope: &Rope) -> Result<Vec<f32>, quant::QuantError> {
    let half = rope.n_rot / 2;
    let ff = match &rope.freq_factors {
        Some(f) => {
            let mut v = vec![0f32; f.row_len() * f.n_rows()];
            quant::dequantize(f.ty(), f.data(), &mut v)?;
            Some(v)
        }
        None => None,
    };
    let mut out = vec![0f32; 2 * pos.len() * half];
    let (cos, sin) = out.split_at_mut(pos.len() * half);
    for (t, &p) in pos.iter().enumerate() {
        let (c, s) = (&mut cos[t * half..(t + 1) * half], &mut sin[t * half..(t + 1) * half]);
        ops::rope_table(p, rope.n_rot, rope.freq_base, rope.freq_scale, ff.as_deref(), c, s);
    }
    Ok(out)
}

/// `f16(gelu_tanh(h))` for every f16 bit pattern `h`: the CPU backend's GELU table
/// (`cpu::ops::gelu_tanh_f16` reads the same one; the kernel saturates outside ±10 before
/// it looks up, as the CPU does, so an input just below 10 still reads the entry of
/// f16 10.0). 65,536 × u16.
pub fn gelu_table() -> Vec<u16> {
    (0..=u16::MAX).map(|b| half::f16::from_f32(ops::gelu_tanh(half::f16::from_bits(b).to_f32())).to_bits()).collect()
}
