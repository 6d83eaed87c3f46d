//! Host-computed tables for the exact kernels: values the CPU backend gets from libm
//! (RoPE's cos/sin) or from a table it builds with libm (GELU), computed here by the CPU
//! backend's own functions and uploaded, so the GPU never evaluates a transcendental
//! where the CPU used libm.

use crate::backend::cpu::ops;
use crate::backend::Rope;
use crate::quant;

/// The RoPE table of positions `0..cap`: `[cap, n_rot/2]` cos, then `[cap, n_rot/2]` sin,
/// row `p` = `cpu::ops::rope_table` of position `p` (the CPU backend's iterative theta,
/// libm's `cos`/`sin`; each position's row depends on that position alone).
pub fn rope_table(cap: usize, rope: &Rope) -> Result<Vec<f32>, quant::QuantError> {
    let half = rope.n_rot / 2;
    let ff = match &rope.freq_factors {
        Some(f) => {
            let mut v = vec![0f32; f.row_len() * f.n_rows()];
            quant::dequantize(f.ty(), f.data(), &mut v)?;
            Some(v)
        }
        None => None,
    };
    let mut out = vec![0f32; 2 * cap * half];
    let (cos, sin) = out.split_at_mut(cap * half);
    for p in 0..cap {
        let (c, s) = (&mut cos[p * half..(p + 1) * half], &mut sin[p * half..(p + 1) * half]);
        ops::rope_table(p as u32, rope.n_rot, rope.freq_base, rope.freq_scale, ff.as_deref(), rope.yarn.as_ref(), c, s);
    }
    Ok(out)
}

/// What a RoPE table depends on: n_rot, base and scale bits, the frequency factors' bits,
/// YaRN's parameters.
pub type RopeKey = (usize, u32, u32, Option<Vec<u32>>, Option<[u32; 4]>);

/// The key of `rope`'s table.
pub fn rope_key(rope: &Rope) -> RopeKey {
    let ff = rope.freq_factors.map(|f| f.data().chunks(4).map(|b| b.iter().fold(0u32, |a, &x| a << 8 | x as u32)).collect());
    let yarn = rope.yarn.map(|y| [y.ext_factor, y.beta_fast, y.beta_slow, y.n_ctx_orig as f32].map(f32::to_bits));
    (rope.n_rot, rope.freq_base.to_bits(), rope.freq_scale.to_bits(), ff, yarn)
}

/// `f16(gelu_tanh(h))` for every f16 bit pattern `h`: the CPU backend's GELU table
/// (`cpu::ops::gelu_tanh_f16` reads the same one; the kernel saturates outside ±10 before
/// it looks up, as the CPU does, so an input just below 10 still reads the entry of
/// f16 10.0). 65,536 × u16.
pub fn gelu_table() -> Vec<u16> {
    (0..=u16::MAX).map(|b| half::f16::from_f32(ops::gelu_tanh(half::f16::from_bits(b).to_f32())).to_bits()).collect()
}
