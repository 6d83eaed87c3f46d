//! The flash attention property check (`family/flash_attn.rs`), run over a
//! [`PrefillTarget`] like the GEMM checks of `prefill.rs`:
//! the token-count sweep of the prefill checks plus fixed GQA / window / chunk-offset shapes,
//! against an f64 reference over the same f16 caches, NaN in every cache slot past the last
//! position. Bound: |o − ref| ≤ (2e-3 + 2e-3·A) · Σ_j p_j |v_j| + 1e-5, A the row's largest
//! |score| bound scale·Σ|q k| (q rounds to f16 before QK^T, P to f16 before PV).

use crate::backend::gpu::selftest::{Acc, CheckReport, Rng};
use crate::backend::gpu::selftest::prefill::{token_counts, Out, PrefillTarget, TOKEN_COUNTS};

/// f64 attention over f16 caches: (output, tolerance) per element.
#[allow(clippy::too_many_arguments)]
pub(super) fn ref_flash(q: &[f32], kc: &[u16], vc: &[u16], pos: &[i32], n_head: usize, n_kv: usize, hd: usize, window: usize, scale: f32) -> (Vec<f64>, Vec<f64>) {
    let h2 = |b: u16| half::f16::from_bits(b).to_f32() as f64;
    let stride = n_kv * hd;
    let mut out = vec![0f64; pos.len() * n_head * hd];
    let mut tol = vec![0f64; out.len()];
    for (t, &p) in pos.iter().enumerate() {
        let p = p as usize;
        let k0 = if window > 0 { (p + 1).saturating_sub(window) } else { 0 };
        for h in 0..n_head {
            let kvh = h / (n_head / n_kv);
            let qv = &q[(t * n_head + h) * hd..][..hd];
            let mut a_max = 0f64;
            let s: Vec<f64> = (k0..=p)
                .map(|j| {
                    let kr = &kc[j * stride + kvh * hd..][..hd];
                    let (mut d, mut m) = (0f64, 0f64);
                    for e in 0..hd {
                        let v = qv[e] as f64 * h2(kr[e]);
                        d += v;
                        m += v.abs();
                    }
                    a_max = a_max.max(m * scale as f64);
                    d * scale as f64
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::MIN, f64::max);
            let w: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
            let l: f64 = w.iter().sum();
            for e in 0..hd {
                let (mut o, mut m) = (0f64, 0f64);
                for (j, wj) in (k0..=p).zip(&w) {
                    let v = h2(vc[j * stride + kvh * hd + e]);
                    o += wj * v;
                    m += wj * v.abs();
                }
                out[(t * n_head + h) * hd + e] = o / l;
                tol[(t * n_head + h) * hd + e] = (2e-3 + 2e-3 * a_max) * m / l + 1e-5;
            }
        }
    }
    (out, tol)
}

/// Fixed attention shapes beyond the token-count sweep: (n, heads, kv heads, head_dim,
/// first position, window). Every padded head size (64, 128, 256) and odd ones (8, 80, 160,
/// 200), GQA ratios 1, 2, 4 and 8, windows shorter than a key tile and longer than the chunk
/// (Gemma 3's 512 and 1024 among them), and chunks that start past 0 (the second 512-token
/// chunk over 1,024 keys).
pub(super) const FLASH_SHAPES: [(usize, usize, usize, usize, usize, usize); 15] = [
    (512, 4, 1, 128, 512, 0),
    (512, 8, 1, 128, 512, 300),
    (200, 8, 1, 64, 0, 0),
    (130, 2, 2, 80, 70, 50),
    (97, 4, 1, 256, 0, 0),
    (65, 8, 1, 256, 5, 17),
    (300, 4, 1, 128, 1000, 64),
    (33, 4, 4, 8, 3, 0),
    (129, 8, 2, 128, 0, 1),
    (64, 2, 2, 64, 64, 0),
    (300, 8, 1, 256, 600, 512),
    (200, 4, 1, 256, 1000, 1024),
    (256, 8, 4, 256, 768, 1024),
    (70, 2, 2, 160, 0, 0),
    (130, 4, 1, 200, 40, 33),
];

pub(super) fn check_flash(t: &dyn PrefillTarget, name: &str, cases: usize, rng: &mut Rng) -> Out<CheckReport> {
    let mut acc = Acc::new(name);
    const HDS: [usize; 5] = [128, 64, 256, 80, 96];
    const HEADS: [(usize, usize); 4] = [(4, 2), (4, 1), (2, 2), (8, 2)];
    let mut shapes = Vec::new();
    for (c, n) in token_counts(rng, cases.saturating_sub(TOKEN_COUNTS.len()) / 2).into_iter().enumerate() {
        let hd = if n >= 511 { HDS[c % 2] } else { HDS[c % HDS.len()] };
        let (n_head, n_kv) = if n >= 511 { (2, 1) } else { HEADS[c % HEADS.len()] };
        let pos0 = if c % 3 == 0 { 0 } else { rng.range(1, 40) };
        let window = if c % 4 == 3 { rng.range(1, n + pos0) } else { 0 };
        let sharp = if c % 5 == 4 { 6.0 } else { 1.0 };
        shapes.push((n, n_head, n_kv, hd, pos0, window, sharp));
    }
    for (c, &(n, n_head, n_kv, hd, pos0, window)) in FLASH_SHAPES.iter().enumerate() {
        shapes.push((n, n_head, n_kv, hd, pos0, window, if c % 3 == 2 { 6.0 } else { 1.0 }));
    }
    let f16 = |v: f32| half::f16::from_f32(v).to_bits();
    for (n, n_head, n_kv, hd, pos0, window, sharp) in shapes {
        // Slots past the last position hold NaN: the kernel must never read them.
        let slots = pos0 + n + rng.range(0, 40);
        let filled = pos0 + n;
        let row = n_kv * hd;
        let mk = |rng: &mut Rng| -> Vec<u16> { (0..slots * row).map(|i| if i < filled * row { f16(rng.f()) } else { 0x7e00 }).collect() };
        let kc = mk(rng);
        let vc = mk(rng);
        let q = rng.vec(n * n_head * hd, sharp);
        let pos: Vec<i32> = (0..n).map(|i| (pos0 + i) as i32).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let Some(y) = t.flash(&q, &kc, &vc, &pos, n_head, n_kv, hd, window, scale)? else { return Ok(None) };
        let (want, tol) = ref_flash(&q, &kc, &vc, &pos, n_head, n_kv, hd, window, scale);
        acc.cmp(&format!("n={n} heads={n_head}/{n_kv} hd={hd} pos0={pos0} window={window}"), &y, &want, |i| tol[i]);
    }
    Ok(Some(acc.finish()))
}

/// The flash kernel's check, if its name contains `filter`.
pub fn run_checks(t: &dyn PrefillTarget, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let mut out = Vec::new();
    for name in ["flash_attn"] {
        if filter.map(|f| name.contains(f)).unwrap_or(true) {
            let mut rng = Rng::new(seed ^ 0xf1a5);
            out.push(match check_flash(t, name, cases, &mut rng) {
                Ok(Some(r)) => r,
                Ok(None) => CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: true, failure: None },
                Err(e) => CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) },
            });
        }
    }
    out
}

