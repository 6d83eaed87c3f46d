//! Checks of the fused decode kernels (residual add + RMSNorm + q8_1; q/k norm + RoPE +
//! K/V store; several matvecs over one q8_1 input; attention writing q8_1), each against
//! the CPU backend's own functions or the f64 references of the parent module.

use crate::backend::gpu::family::{norm_rope, quantize};
use crate::backend::gpu::launch::ActFmt;
use super::{cpu_rope_head, dequant, q8_blocks_check, q8_reference, random_weights, ref_attention, Acc, Rng, Target};
use crate::backend::gpu::GpuError;
use crate::quant::GgmlType;

/// Runs check `name` (`cases` random cases) into `acc`; `Ok(None)` when the target does
/// not implement the op.
pub(super) fn check(t: &dyn Target, name: &str, cases: usize, rng: &mut Rng, acc: &mut Acc) -> Result<Option<()>, GpuError> {
    match name {
        "add_rmsnorm_q8" => {
            for c in 0..cases {
                let (rows, fmt, n) = super::producer_case(rng, c);
                let x = rng.vec(rows * n, 2.0);
                let r = rng.vec(rows * n, 2.0);
                let w = rng.vec(n, 1.5);
                let with_w = rng.f() > -0.5;
                let Some((xo, y, q)) = t.add_rmsnorm_q8(&x, &r, with_w.then_some(&w[..]), rows, n, 1e-6, fmt)? else { return Ok(None) };
                let sum: Vec<f32> = x.iter().zip(&r).map(|(a, b)| a + b).collect();
                let case = format!("rows={rows} n={n}");
                // The residual is an f32 add: bit-exact.
                acc.cmp(&format!("{case} (x + r)"), &xo, &sum.iter().map(|&v| v as f64).collect::<Vec<_>>(), |_| 1e-30);
                let mut want = Vec::with_capacity(rows * n);
                for rr in 0..rows {
                    let mut o = vec![0f32; n];
                    crate::backend::cpu::ops::rms_norm_row(&sum[rr * n..(rr + 1) * n], &mut o, with_w.then_some(&w[..]), 1e-6);
                    want.extend(o.iter().map(|&v| v as f64));
                }
                acc.cmp(&format!("{case} (values)"), &y, &want, |i| 2e-6 * want[i].abs() + 1e-7);
                q8_blocks_check(acc, &case, &y, &q, rows, n, fmt);
            }
        }
        "rope_kv" => {
            for c in 0..cases {
                let hd = [64, 128, 256, 80, 32][rng.range(0, 4)];
                let n_rot = if c % 3 == 2 { hd / 2 } else { hd };
                let n_kv = rng.range(1, 4);
                let n_head = n_kv * rng.range(1, 4);
                let n_tok = if c % 2 == 0 { 1 } else { rng.range(2, 9) };
                let slots = n_tok + rng.range(0, 600);
                let mut rows: Vec<i32> = (0..slots as i32).collect();
                for i in (1..rows.len()).rev() {
                    rows.swap(i, rng.range(0, i));
                }
                rows.truncate(n_tok);
                let q = rng.vec(n_tok * n_head * hd, 2.0);
                let k = rng.vec(n_tok * n_kv * hd, 2.0);
                let v = rng.vec(n_tok * n_kv * hd, 2.0);
                let qw = rng.vec(hd, 1.5);
                let kw = rng.vec(hd, 1.5);
                let norms = c % 4 != 3;
                let ff: Option<Vec<f32>> = (c % 5 == 1).then(|| (0..n_rot / 2).map(|_| 1.0 + 7.0 * rng.f().abs()).collect());
                let base = [10000.0, 1e6, 5e5][rng.range(0, 2)];
                let p = norm_rope::RopeKv {
                    n_tok,
                    n_head,
                    n_kv,
                    head_dim: hd,
                    n_rot,
                    neox: c % 2 == 1,
                    theta_scale: norm_rope::rope_theta_scale(base, n_rot),
                    freq_scale: 1.0 / rng.range(1, 4) as f32,
                    eps: 1e-6,
                    q_scale: if c % 3 == 0 { 0.125 } else { 1.0 },
                };
                let (qwo, kwo) = if norms { (Some(&qw[..]), Some(&kw[..])) } else { (None, None) };
                let Some((qo, ko, kc, vc)) = t.rope_kv(&q, &k, &v, qwo, kwo, &rows, ff.as_deref(), &p, base, slots)? else { return Ok(None) };
                // Reference: the CPU backend's per-head norm, RoPE and scale, in its order.
                let head = |x: &[f32], w: Option<&[f32]>, pos: i32| -> Vec<f32> {
                    let mut h = x.to_vec();
                    if let Some(w) = w {
                        crate::backend::cpu::ops::rms_norm_inplace(&mut h, Some(w), p.eps);
                    }
                    cpu_rope_head(&mut h, pos, n_rot, p.neox, base, p.freq_scale, ff.as_deref(), 1.0);
                    h
                };
                let (mut wq, mut wk) = (Vec::new(), Vec::new());
                for tk in 0..n_tok {
                    for h in 0..n_head {
                        wq.extend(head(&q[(tk * n_head + h) * hd..][..hd], qwo, rows[tk]).iter().map(|&v| (v * p.q_scale) as f64));
                    }
                    for h in 0..n_kv {
                        wk.extend(head(&k[(tk * n_kv + h) * hd..][..hd], kwo, rows[tk]).iter().map(|&v| v as f64));
                    }
                }
                let case = format!("hd={hd} n_rot={n_rot} heads={n_head}/{n_kv} toks={n_tok} norms={norms} neox={}", p.neox);
                acc.cmp(&format!("{case} (q)"), &qo, &wq, |i| 4e-6 * wq[i].abs().max(1.0));
                acc.cmp(&format!("{case} (k)"), &ko, &wk, |i| 4e-6 * wk[i].abs().max(1.0));
                let (mut got, mut want, mut tol) = (Vec::new(), Vec::new(), Vec::new());
                let w = n_kv * hd;
                for (tk, &slot) in rows.iter().enumerate() {
                    for i in 0..w {
                        let kv = wk[tk * w + i];
                        got.push(half::f16::from_bits(kc[slot as usize * w + i]).to_f32());
                        want.push(half::f16::from_f32(kv as f32).to_f32() as f64);
                        // k may round to the neighbouring f16 when it sits on a tie.
                        tol.push(kv.abs() * 1e-3 + 1e-7);
                        got.push(half::f16::from_bits(vc[slot as usize * w + i]).to_f32());
                        want.push(half::f16::from_f32(v[tk * w + i]).to_f32() as f64);
                        tol.push(1e-30);
                    }
                }
                acc.cmp(&format!("{case} (cache)"), &got, &want, |i| tol[i]);
            }
        }
        "matvec_multi" | "matvec_multi_grid" => {
            let types = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K];
            // matvec_multi_grid (appended): a grid type in every case, each in turn.
            let grid = name == "matvec_multi_grid";
            let low: &[GgmlType] = if grid { &GgmlType::GRID_WEIGHTS } else { &GgmlType::LOWBIT_WEIGHTS };
            for c in 0..cases {
                let nw0 = 1 + c % 3;
                let mut tys: Vec<GgmlType> = (0..nw0).map(|_| types[rng.range(0, types.len() - 1)]).collect();
                // Every other case a low-bit type in the last segment (added, or in place of
                // the third), chosen after the older draws.
                if c % 2 == 1 || grid {
                    let ty = if grid { low[c % low.len()] } else { low[(c / 2) % low.len()] };
                    if tys.len() < 3 {
                        tys.push(ty);
                    } else {
                        tys[2] = ty;
                    }
                }
                let nw = tys.len();
                let be = if tys.iter().any(|t| t.block_elems() == 256) { 256 } else { 32 };
                // Every third case long rows.
                let kmax = if c % 3 == 2 { 20480 } else { 4096 };
                let k = be * rng.range(1, kmax / be);
                let ws: Vec<(Vec<u8>, GgmlType, usize)> = tys
                    .iter()
                    .map(|&ty| {
                        let rows = if rng.f() > 0.5 { rng.range(1, 9) * 2 + 1 } else { rng.range(1, 600) };
                        (random_weights(rng, ty, rows, k), ty, rows)
                    })
                    .collect();
                let x = rng.vec(k, 1.0);
                let refs: Vec<(&[u8], GgmlType, usize)> = ws.iter().map(|(w, t, r)| (&w[..], *t, *r)).collect();
                let Some((ys, q8)) = t.matvec_multi(&refs, k, &x)? else { return Ok(None) };
                let half = quantize::q8_1_bytes(k, 1);
                for (i, (w, ty, rows)) in ws.iter().enumerate() {
                    let wf = dequant(*ty, w, rows * k)?;
                    let fmt = quantize::act_fmt(*ty).unwrap_or(ActFmt::Q8_1);
                    let blocks = if fmt == ActFmt::K { q8.get(half..2 * half).unwrap_or(&[]) } else { &q8[..half.min(q8.len())] };
                    let (want, tol) = q8_reference(&wf, *rows, k, blocks, 1, fmt);
                    acc.cmp(&format!("weight {i}/{nw} {ty} rows={rows} k={k}"), &ys[i], &want, |j| tol[j]);
                }
            }
        }
        "matvec_q4k_loop" => {
            // The resident Q4_K row walk against the plain kernel (bit for bit: the same
            // per-row arithmetic) and the reference: rows of 1–16 super-blocks, 1–3
            // segments, grids from one block (every warp many rows) to more than the rows.
            for c in 0..cases {
                let nw = 1 + c % 3;
                let k = 256 * rng.range(1, 16);
                let ws: Vec<(Vec<u8>, GgmlType, usize)> = (0..nw)
                    .map(|_| {
                        let rows = rng.range(1, 3000);
                        (random_weights(rng, GgmlType::Q4_K, rows, k), GgmlType::Q4_K, rows)
                    })
                    .collect();
                let blocks = [1, 3, 64, 800][c % 4];
                let x = rng.vec(k, 1.0);
                let refs: Vec<(&[u8], GgmlType, usize)> = ws.iter().map(|(w, t, r)| (&w[..], *t, *r)).collect();
                let Some(ys) = t.matvec_q4k_loop(&refs, k, &x, blocks)? else { return Ok(None) };
                let Some((plain, q8)) = t.matvec_multi(&refs, k, &x)? else { return Ok(None) };
                let half = quantize::q8_1_bytes(k, 1);
                for (i, (w, ty, rows)) in ws.iter().enumerate() {
                    let case = format!("weight {i}/{nw} rows={rows} k={k} blocks={blocks}");
                    acc.cmp(&format!("{case} (= matvec_multi4)"), &ys[i], &plain[i].iter().map(|&v| v as f64).collect::<Vec<_>>(), |_| 0.0);
                    let wf = dequant(*ty, w, rows * k)?;
                    let (want, tol) = q8_reference(&wf, *rows, k, q8.get(half..2 * half).unwrap_or(&[]), 1, ActFmt::K);
                    acc.cmp(&case, &ys[i], &want, |j| tol[j]);
                }
            }
        }
        "matvec_split" => {
            // One warp per step over a resident row walk (4B / 8B down) against the plain
            // kernel (bit for bit: the same step sums in the same order) and the reference:
            // Q4_K and Q6_K rows of 2–16 steps, grids from one block to more than the rows.
            for c in 0..cases {
                let ty = if c % 2 == 0 { GgmlType::Q4_K } else { GgmlType::Q6_K };
                let step = if ty == GgmlType::Q4_K { 8 } else { 4 };
                let k = [9728, 14336, 4096, 256 * rng.range(step + 1, 16 * step)][c % 4].min(256 * 16 * step);
                let rows = rng.range(1, 3000);
                let blocks = [1, 5, 396, 4000][(c / 2) % 4];
                let w = random_weights(rng, ty, rows, k);
                let x = rng.vec(k, 1.0);
                let Some((ys, q8)) = t.matvec_split(&w, ty, rows, k, &x, blocks)? else { return Ok(None) };
                let Some((plain, _)) = t.matvec(&w, ty, rows, k, &x, 1)? else { return Ok(None) };
                let case = format!("{ty} rows={rows} k={k} blocks={blocks}");
                acc.cmp(&format!("{case} (= matvec)"), &ys, &plain.iter().map(|&v| v as f64).collect::<Vec<_>>(), |_| 0.0);
                let wf = dequant(ty, &w, rows * k)?;
                let (want, tol) = q8_reference(&wf, rows, k, &q8, 1, ActFmt::K);
                acc.cmp(&case, &ys, &want, |j| tol[j]);
            }
        }
        "attention_q8" => {
            for c in 0..cases {
                let hd = [64, 128, 256, 96, 32][rng.range(0, 4)];
                let n_kv = rng.range(1, 4);
                let n_head = n_kv * rng.range(1, 4);
                let (n_tok, pos0) = if c % 2 == 0 { (1, rng.range(0, 700)) } else { (rng.range(2, 20), rng.range(0, 100)) };
                let n_ctx = pos0 + n_tok;
                let window = if rng.f() > 0.3 { rng.range(1, 64) } else { 0 };
                let scale = 1.0 / (hd as f32).sqrt();
                let q = rng.vec(n_tok * n_head * hd, 2.0);
                let kc: Vec<u16> = rng.vec(n_ctx * n_kv * hd, 2.0).iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let vc: Vec<u16> = rng.vec(n_ctx * n_kv * hd, 1.0).iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let Some((y, q8)) = t.attention_q8(&q, &kc, &vc, n_tok, n_head, n_kv, hd, pos0, window, scale)? else { return Ok(None) };
                let want = ref_attention(&q, &kc, &vc, n_tok, n_head, n_kv, hd, pos0, window, scale);
                let case = format!("hd={hd} heads={n_head}/{n_kv} toks={n_tok} pos0={pos0} window={window}");
                acc.cmp(&case, &y, &want, |i| 1e-4 * want[i].abs() + 2e-5);
                q8_blocks_check(acc, &case, &y, &q8, n_tok, n_head * hd, ActFmt::Q8_1);
            }
        }
        _ => return Err(GpuError::Unsupported(format!("unknown fused check {name}"))),
    }
    Ok(Some(()))
}
