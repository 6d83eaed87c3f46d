//! Tests of `attention.rs`: the CPU cache and its attention paths.

use super::*;
use crate::backend::SwaKv;

fn spec(ty: KvType) -> KvSpec {
    KvSpec { n_layer: 1, n_ctx: 8, n_kv_head: 1, head_dim_k: 2, head_dim_v: 2, ty: ty.into(), swa: None, alt: None }
}

fn attn(window: Option<usize>) -> Attention<'static> {
    Attention { n_head: 2, n_kv_head: 1, head_dim_k: 2, head_dim_v: 2, scale: 1.0, window, sinks: None }
}

#[test]
fn single_key_returns_its_value_and_window_masks_old_keys() {
    for ty in [KvType::F32, KvType::F16] {
        let mut kv = Kv::new(spec(ty)).unwrap();
        // Three positions; V rows are (p, 10p).
        let k = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = [0.0, 0.0, 1.0, 10.0, 2.0, 20.0];
        kv.write(0, &k, &v, &[0, 1, 2]).unwrap();
        let q = [5.0, 5.0, -5.0, 0.0]; // two heads, one token
        let mut out = [0.0f32; 4];
        kv.attend(&crate::quant::RayonPool, 0, &q, &[0], &attn(None), &mut out).unwrap();
        assert_eq!(out, [0.0; 4]); // only key 0 visible, value 0
        kv.attend(&crate::quant::RayonPool, 0, &q, &[2], &attn(Some(1)), &mut out).unwrap();
        assert_eq!(out, [2.0, 20.0, 2.0, 20.0]); // window 1: only itself
        kv.attend(&crate::quant::RayonPool, 0, &q, &[2], &attn(None), &mut out).unwrap();
        // head 0 favours key 2 (score 10) over keys 0,1 (score 5).
        assert!(out[0] > 1.9 && out[0] < 2.0, "{out:?}");
    }
}

/// K and V of every pair of types among f16, q8_0, q4_0: the attention of 3 rows
/// (prompt) and 1 row (decode) stays within the types' rounding of the f32 cache's,
/// and a copied prefix attends exactly as the source.
#[test]
fn quantized_caches_attend_like_the_f32_cache_and_copy() {
    let (n_ctx, nkv, d) = (40, 2, 32);
    let shape = |ty: KvTypes| KvSpec { n_layer: 1, n_ctx, n_kv_head: nkv, head_dim_k: d, head_dim_v: d, ty, swa: None, alt: None };
    let a = Attention { n_head: 4, n_kv_head: nkv, head_dim_k: d, head_dim_v: d, scale: 0.2, window: Some(30), sinks: None };
    let val = |i: usize, s: usize| ((i * s % 29) as f32 - 14.0) * 0.07;
    let (k, v): (Vec<f32>, Vec<f32>) = ((0..n_ctx * nkv * d).map(|i| val(i, 7)).collect(), (0..n_ctx * nkv * d).map(|i| val(i, 11)).collect());
    let q: Vec<f32> = (0..3 * 4 * d).map(|i| val(i, 5)).collect();
    let pos: Vec<u32> = (0..n_ctx as u32).collect();
    let run = |ty: KvTypes, rows: &[u32]| {
        let mut kv = Kv::new(shape(ty)).unwrap();
        kv.write(0, &k, &v, &pos).unwrap();
        let mut out = vec![0f32; rows.len() * 4 * d];
        kv.attend(&crate::quant::RayonPool, 0, &q[..rows.len() * 4 * d], rows, &a, &mut out).unwrap();
        (kv, out)
    };
    let types = [KvType::F16, KvType::Q8_0, KvType::Q4_0];
    for rows in [&[20u32, 33, 39][..], &[39]] {
        let (_, want) = run(KvType::F32.into(), rows);
        for tk in types {
            for tv in types {
                let ty = KvTypes { k: tk, v: tv };
                let (kv, got) = run(ty, rows);
                let tol = if ty.k == KvType::Q4_0 || ty.v == KvType::Q4_0 { 0.08 } else { 0.01 };
                let err = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(err < tol, "{ty} rows {rows:?}: max error {err}");
                // A prefix of 36 slots copied into a fresh cache attends as the source.
                let mut dst = Kv::new(shape(ty)).unwrap();
                dst.copy_from(&kv, 36).unwrap();
                let (mut o1, mut o2) = (vec![0f32; 4 * d], vec![0f32; 4 * d]);
                kv.attend(&crate::quant::RayonPool, 0, &q[..4 * d], &[35], &a, &mut o1).unwrap();
                dst.attend(&crate::quant::RayonPool, 0, &q[..4 * d], &[35], &a, &mut o2).unwrap();
                assert_eq!(o1, o2, "{ty}: copied prefix");
            }
        }
    }
    // Heads that are not whole blocks are refused by name.
    let odd = KvSpec { head_dim_k: 8, head_dim_v: 8, ..shape(KvType::Q8_0.into()) };
    assert!(matches!(Kv::new(odd), Err(BackendError::Invalid { .. })));
}

/// A window-sized cache attends bit for bit as the full one through prompt chunks and
/// decode steps past several base moves, for every K/V type (the tiled, split and
/// one-pass paths), and refuses a query older than it holds.
#[test]
fn window_sized_cache_attends_as_the_full_cache() {
    let (n_ctx, nkv, d, window, chunk) = (700, 2, 32, 90, 70);
    let full = |ty: KvTypes| KvSpec { n_layer: 2, n_ctx, n_kv_head: nkv, head_dim_k: d, head_dim_v: d, ty, swa: None, alt: None };
    let a = Attention { n_head: 4, n_kv_head: nkv, head_dim_k: d, head_dim_v: d, scale: 0.2, window: Some(window), sinks: None };
    let val = |i: usize, s: usize| ((i * s % 29) as f32 - 14.0) * 0.07;
    let (ty_f, ty_q) = (KvTypes::from(KvType::F16), KvTypes { k: KvType::Q8_0, v: KvType::Q4_0 });
    for ty in [ty_f, ty_q, KvType::F32.into()] {
        let ring = SwaKv::new(window, chunk, n_ctx, &[true, false]).unwrap();
        let (mut f, mut r) = (Kv::new(full(ty)).unwrap(), Kv::new(KvSpec { swa: Some(ring), ..full(ty) }).unwrap());
        let mut p0 = 0;
        // Prompt chunks of up to `chunk` rows (tiled at ≥ 64), then decode steps (split keys).
        for n in [70, 64, 3, 70, 41, 70, 70].into_iter().chain(std::iter::repeat(1).take(60)) {
            let pos: Vec<u32> = (p0..p0 + n as u32).collect();
            let k: Vec<f32> = (0..n * nkv * d).map(|i| val(i + 7 * p0 as usize, 7)).collect();
            let v: Vec<f32> = (0..n * nkv * d).map(|i| val(i + 3 * p0 as usize, 11)).collect();
            let q: Vec<f32> = (0..n * 4 * d).map(|i| val(i + p0 as usize, 5)).collect();
            let (mut o1, mut o2) = (vec![0f32; n * 4 * d], vec![0f32; n * 4 * d]);
            for c in [&mut f, &mut r] {
                c.write(0, &k, &v, &pos).unwrap();
            }
            f.attend(&crate::quant::RayonPool, 0, &q, &pos, &a, &mut o1).unwrap();
            r.attend(&crate::quant::RayonPool, 0, &q, &pos, &a, &mut o2).unwrap();
            assert_eq!(o1, o2, "{ty}: positions {p0}..{}", p0 as usize + n);
            p0 += n as u32;
        }
        assert!(r.base(0) > 0 && r.base(1) == 0, "the base moved on the windowed layer only");
        let old = r.base(0) as u32 - 1 + window as u32 - 1;
        let mut out = vec![0f32; 4 * d];
        assert!(r.attend(&crate::quant::RayonPool, 0, &vec![0.0; 4 * d], &[old], &a, &mut out).is_err());
    }
}

/// A sink (one more logit in the denominator) scales each head's output by the keys'
/// share, by hand: one key with score 0 and a sink of ln 3 keep 1/4 of the value, in
/// every path (prompt and decode rounding, f32 and f16 caches).
#[test]
fn sinks_take_their_share_of_the_softmax() {
    let mut g = crate::gguf::GgufWriter::new();
    let sk = [3f32.ln(), f32::NEG_INFINITY];
    g.add_tensor("sk", GgmlType::F32, &[2], bytemuck::cast_slice(&sk).to_vec());
    let f = crate::gguf::GgufFile::from_bytes(g.to_bytes().unwrap()).unwrap();
    let w = crate::weights::WeightRef::new(crate::weights::WeightId(0), f.tensor("sk").unwrap());
    for ty in [KvType::F32, KvType::F16] {
        let mut kv = Kv::new(spec(ty)).unwrap();
        kv.write(0, &[0.0, 0.0], &[4.0, 8.0], &[0]).unwrap();
        let a = Attention { sinks: Some(w), ..attn(None) };
        let mut out = [0.0f32; 4];
        kv.attend(&crate::quant::RayonPool, 0, &[1.0, 1.0, 1.0, 1.0], &[0], &a, &mut out).unwrap();
        // Head 0: e^0 / (e^0 + 3) = 1/4 of (4, 8); head 1's sink is −∞: all of it.
        assert!(out.iter().zip([1.0, 2.0, 4.0, 8.0]).all(|(a, b)| (a - b).abs() < 1e-6), "{ty:?}: {out:?}");
        kv.attend_rowwise(&crate::quant::RayonPool, 0, &[1.0, 1.0, 1.0, 1.0], &[0], &a, &mut out).unwrap();
        assert!(out.iter().zip([1.0, 2.0, 4.0, 8.0]).all(|(a, b)| (a - b).abs() < 1e-6), "{ty:?}: {out:?}");
    }
}

#[test]
fn out_of_range_position_is_an_error() {
    let mut kv = Kv::new(spec(KvType::F32)).unwrap();
    assert!(kv.write(0, &[0.0; 2], &[0.0; 2], &[8]).is_err());
    let mut out = [0.0f32; 4];
    assert!(kv.attend(&crate::quant::RayonPool, 0, &[0.0; 4], &[9], &attn(None), &mut out).is_err());
    assert!(kv.attend(&crate::quant::RayonPool, 1, &[0.0; 4], &[0], &attn(None), &mut out).is_err());
}
