//! glibc's `expf` (since 2.27: the Arm optimized-routines algorithm, x86-64 FMA build) in
//! Rust, the host twin of `libm_expf` in `kernels-hip/exact_ops.hip`. The CPU backend
//! calls `f32::exp` (libm) in its online softmax; the test below checks this port
//! against the host's libm, so a machine whose libm rounds otherwise is caught here
//! before the GPU comparison shows it.

/// 2^(i/32) as binary64 bits minus `i << 47`.
const T: [u64; 32] = [
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
];

/// `expf(x)` as glibc computes it (double-precision table and cubic, FMA build).
pub fn expf(x: f32) -> f32 {
    let ux = x.to_bits();
    let abstop = (ux >> 20) & 0x7ff;
    if abstop >= 0x42b {
        if ux == 0xff80_0000 {
            return 0.0;
        }
        if abstop >= 0x7f8 {
            return x + x;
        }
        if x > f32::from_bits(0x42b1_7217) {
            return f32::INFINITY;
        }
        if x < f32::from_bits(0xc2cf_f1b4) {
            return 0.0;
        }
    }
    let inv_ln2_n = f64::from_bits(0x3ff7_1547_652b_82fe) * 32.0;
    let shift = f64::from_bits(0x4338_0000_0000_0000); // 0x1.8p52
    let xd = x as f64;
    let mut kd = inv_ln2_n.mul_add(xd, shift);
    let ki = kd.to_bits();
    kd -= shift;
    let r = inv_ln2_n.mul_add(xd, -kd);
    let t = T[(ki % 32) as usize].wrapping_add(ki << 47);
    let s = f64::from_bits(t);
    let c0 = f64::from_bits(0x3fac_6af8_4b91_2394) / 32768.0;
    let c1 = f64::from_bits(0x3fce_bfce_50fa_c4f3) / 1024.0;
    let c2 = f64::from_bits(0x3fe6_2e42_ff0c_52d6) / 32.0;
    let z = c0.mul_add(r, c1);
    let r2 = r * r;
    let y = z.mul_add(r2, c2.mul_add(r, 1.0));
    (y * s) as f32
}

#[cfg(test)]
mod tests {
    /// Against the host's libm over the arguments the online softmax sees (≤ 0, down to
    /// where the result underflows) and a few positive ones.
    #[test]
    fn equals_the_host_libm() {
        let mut bad = Vec::new();
        let mut check = |x: f32| {
            let (a, b) = (super::expf(x), x.exp());
            if a.to_bits() != b.to_bits() && bad.len() < 8 {
                bad.push((x, a, b));
            }
        };
        // Every 97th f32 below zero down to −110, and every 997th above zero up to 90.
        let (neg_lo, pos_hi) = ((-110.0f32).to_bits(), 90.0f32.to_bits());
        for b in (0x8000_0000u32..=neg_lo).step_by(97) {
            check(f32::from_bits(b));
        }
        for b in (0u32..=pos_hi).step_by(997) {
            check(f32::from_bits(b));
        }
        for x in [f32::NEG_INFINITY, f32::INFINITY, -0.0, 0.0, 88.7, -103.9, -104.0] {
            check(x);
        }
        assert!(bad.is_empty(), "port ≠ host libm at (x, port, libm): {bad:?}");
    }
}
