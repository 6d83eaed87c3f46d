//! The batched decode step's attention (`elementwise::kv_store_rows` + `attention::attention_rows`):
//! every row has its own K/V caches, found through a device table of addresses. Checked
//! against the f64 reference run row by row over that row's cache after its K/V store.

use crate::backend::gpu::family::{attention, elementwise};
use super::{ref_attention, Acc, Out, Rng};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::{GpuError};

/// One row's inputs: its caches before the step ([slots, n_kv·hd] f16 each) and position.
pub struct RowCase {
    pub kc: Vec<u16>,
    pub vc: Vec<u16>,
    pub pos: usize,
}

/// Output rows ([n, n_head·hd] f32) and every row's caches after the step.
pub type RowsOut = (Vec<f32>, Vec<(Vec<u16>, Vec<u16>)>);

/// The GPU side: uploads each row's caches, stages the address table, launches both ops.
#[allow(clippy::too_many_arguments)]
pub fn gpu_attention_rows(d: &GpuDevice, q: &[f32], k: &[f32], v: &[f32], rows: &[RowCase], n_head: usize, n_kv: usize, hd: usize, window: usize, scale: f32) -> Out<RowsOut> {
    let n = rows.len();
    let caches = rows
        .iter()
        .map(|r| Ok((d.upload(bytemuck::cast_slice(&r.kc))?, d.upload(bytemuck::cast_slice(&r.vc))?)))
        .collect::<Result<Vec<_>, GpuError>>()?;
    let table: Vec<u64> = caches.iter().flat_map(|(kc, vc)| [kc.ptr(), vc.ptr()]).collect();
    let tb = d.upload(bytemuck::cast_slice(&table))?;
    let pos: Vec<i32> = rows.iter().map(|r| r.pos as i32).collect();
    let pb = d.upload_i32(&pos)?;
    let (qb, kb, vb) = (d.upload_f32(q)?, d.upload_f32(k)?, d.upload_f32(v)?);
    let ob = d.alloc(n * n_head * hd * 4)?;
    d.poison(&ob)?;
    elementwise::kv_store_rows(d, kb.ptr(), vb.ptr(), tb.ptr(), n_kv * hd, n_kv * hd, pb.ptr(), n)?;
    attention::attention_rows(d, qb.ptr(), tb.ptr(), ob.ptr(), n, n_head, n_kv, hd, pb.ptr(), window, scale, None)?;
    let mut after = Vec::with_capacity(n);
    for ((kc, vc), r) in caches.iter().zip(rows) {
        let mut k = vec![0u16; r.kc.len()];
        let mut v = vec![0u16; r.vc.len()];
        d.read(kc.ptr(), bytemuck::cast_slice_mut(&mut k))?;
        d.read(vc.ptr(), bytemuck::cast_slice_mut(&mut v))?;
        after.push((k, v));
    }
    Ok(Some((d.read_f32(ob.ptr(), n * n_head * hd)?, after)))
}

/// Random steps of 1–12 rows with different positions, cache sizes, GQA and windows.
pub fn check(d: &GpuDevice, cases: usize, rng: &mut Rng, acc: &mut Acc) -> Result<(), GpuError> {
    let f16 = |x: f32| half::f16::from_f32(x).to_bits();
    for _ in 0..cases {
        let hd = [64, 128, 256, 96, 80][rng.range(0, 4)];
        let n_kv = rng.range(1, 4);
        let n_head = n_kv * rng.range(1, 4);
        let window = if rng.f() > 0.3 { rng.range(1, 64) } else { 0 };
        let scale = 1.0 / (hd as f32).sqrt();
        let n = rng.range(1, 12);
        let row = n_kv * hd;
        let rows: Vec<RowCase> = (0..n)
            .map(|_| {
                let pos = rng.range(0, 400);
                let slots = pos + 1 + rng.range(0, 8);
                RowCase { kc: rng.vec(slots * row, 2.0).into_iter().map(f16).collect(), vc: rng.vec(slots * row, 1.0).into_iter().map(f16).collect(), pos }
            })
            .collect();
        let q = rng.vec(n * n_head * hd, 2.0);
        let (k, v) = (rng.vec(n * row, 2.0), rng.vec(n * row, 1.0));
        let Some((y, after)) = gpu_attention_rows(d, &q, &k, &v, &rows, n_head, n_kv, hd, window, scale)? else { return Ok(()) };
        let case = format!("rows={n} hd={hd} heads={n_head}/{n_kv} window={window}");
        for (t, (r, (kc, vc))) in rows.iter().zip(&after).enumerate() {
            // The store: slot pos holds f16(k_t), every other slot is untouched.
            let mut want_k = r.kc.clone();
            let mut want_v = r.vc.clone();
            for e in 0..row {
                want_k[r.pos * row + e] = f16(k[t * row + e]);
                want_v[r.pos * row + e] = f16(v[t * row + e]);
            }
            if *kc != want_k || *vc != want_v {
                acc.fail(format!("{case}: row {t}'s cache after the K/V store differs"));
                continue;
            }
            let qt = &q[t * n_head * hd..(t + 1) * n_head * hd];
            let want = ref_attention(qt, &want_k, &want_v, 1, n_head, n_kv, hd, r.pos, window, scale);
            acc.cmp(&format!("{case} row {t} pos {}", r.pos), &y[t * n_head * hd..(t + 1) * n_head * hd], &want, |i| 1e-4 * want[i].abs() + 2e-5);
        }
    }
    Ok(())
}
