//! `kvq_*` checks: quantized KV caches (`-ctk` / `-ctv` q8_0, q4_0, each beside f16) on
//! the GPU through the trait (`kv_write` → `kv_store_q`, `attention` → what
//! `plan::attention` picks: `kvq_decode_d<HD>`, `kvq_to_f16` + flash, or `attn_kvq`;
//! `copy_kv`), against the CPU backend on the same rows. Per case:
//!
//! - the store: the GPU's K and V planes, read back, equal byte for byte the blocks the
//!   CPU's quantizers make of the same rows (`quant::quantize`: llama.cpp's x86 Q8_0
//!   rounding, Q4_0's reference rounding), and f16 planes the f16 of each value;
//! - attention of `n_tok` queries (prefill chunk or one decode row) at the last positions,
//!   its output NaN before the op: within 3e-2·max|CPU row| + 1e-4 of the CPU's (the CPU
//!   rounds q to Q8_0 for a quantized K as llama.cpp's CPU does; the GPU reads q in f32);
//!   a wrong block decode or a misplaced row is off by the size of the row;
//! - `copy_kv` of a prefix into a fresh cache: the copied bytes equal the source's.
//!
//! Shapes: head sizes 64, 128, 256; GQA groups 1 to 4; windows; 1 to 4097 cached rows;
//! decode rows (`kvq_decode_d<HD>`, split over the keys) and prefill chunks
//! (`kvq_to_f16` + the flash kernel) across their boundaries ([`depth_cases`]).

use super::report::{Acc, CheckReport, Rng};
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::{Attention, Backend, Buf, KvSpec, KvType, KvTypes, QkvPrep, Rope, RopeMode};

#[derive(Clone, Copy, Debug)]
struct Case {
    hd: usize,
    n_head: usize,
    n_kv: usize,
    ty: KvTypes,
    /// Cached rows (positions 0..rows), the queries at the last `n_tok` of them.
    rows: usize,
    n_tok: usize,
    window: Option<usize>,
    /// The rows stored by `rope_kv_write` (RoPE of q and k, then the store: the fused
    /// `rope_kv_f32` quantizing as it stores) instead of `kv_write`.
    rope: bool,
}

fn cases() -> Vec<Case> {
    use KvType::{Q4_0, Q8_0, F16};
    let t = |k, v| KvTypes { k, v };
    vec![
        Case { hd: 64, n_head: 9, n_kv: 3, ty: t(Q8_0, Q8_0), rows: 37, n_tok: 1, window: None, rope: false },
        Case { hd: 64, n_head: 9, n_kv: 3, ty: t(Q8_0, Q8_0), rows: 300, n_tok: 7, window: None, rope: false },
        Case { hd: 64, n_head: 8, n_kv: 8, ty: t(Q4_0, Q4_0), rows: 129, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 16, n_kv: 8, ty: t(Q4_0, Q4_0), rows: 200, n_tok: 5, window: Some(64), rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, F16), rows: 90, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(F16, Q8_0), rows: 90, n_tok: 3, window: None, rope: false },
        Case { hd: 256, n_head: 4, n_kv: 1, ty: t(Q8_0, Q4_0), rows: 1, n_tok: 1, window: None, rope: false },
        Case { hd: 256, n_head: 4, n_kv: 1, ty: t(Q4_0, Q8_0), rows: 260, n_tok: 1, window: Some(100), rope: false },
    ]
    .into_iter()
    .chain(depth_cases())
    .collect()
}

/// The fast kernels (`kvq_attn.hip`) across their boundaries: decode (`kvq_decode_d<HD>`)
/// at 1, 31, 32, 33, 256, 1000 and 4097 keys (one part up to 256 keys at head size 128,
/// then parts of at least 256, as many as one wave holds), both types, K and V mixed and
/// beside f16, windows, GQA groups 1 to 4; prefill chunks (`kvq_to_f16` + the flash
/// kernel) from position 0 and deep in the cache, windowed (the rows read start at the
/// first visible key's 64-row tile).
fn depth_cases() -> Vec<Case> {
    use KvType::{Q4_0, Q8_0, F16};
    let t = |k, v| KvTypes { k, v };
    let mut v: Vec<Case> = [1, 31, 32, 33, 256, 1000, 4097].into_iter().map(|rows| Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, Q8_0), rows, n_tok: 1, window: None, rope: false }).collect();
    v.extend([
        Case { hd: 128, n_head: 8, n_kv: 8, ty: t(Q4_0, Q4_0), rows: 33, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 8, ty: t(Q4_0, Q4_0), rows: 1000, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q4_0, Q4_0), rows: 4097, n_tok: 1, window: Some(1000), rope: false },
        Case { hd: 64, n_head: 6, n_kv: 2, ty: t(Q8_0, Q4_0), rows: 513, n_tok: 1, window: None, rope: false },
        Case { hd: 64, n_head: 6, n_kv: 2, ty: t(Q4_0, Q8_0), rows: 1000, n_tok: 1, window: Some(300), rope: false },
        Case { hd: 256, n_head: 4, n_kv: 2, ty: t(Q8_0, Q8_0), rows: 1000, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(F16, Q4_0), rows: 4097, n_tok: 1, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, F16), rows: 256, n_tok: 1, window: None, rope: false },
        // Prefill chunks.
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, Q8_0), rows: 33, n_tok: 33, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, Q8_0), rows: 1000, n_tok: 64, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 8, ty: t(Q4_0, Q4_0), rows: 4097, n_tok: 100, window: Some(1000), rope: false },
        Case { hd: 64, n_head: 6, n_kv: 2, ty: t(Q8_0, Q4_0), rows: 256, n_tok: 256, window: Some(100), rope: false },
        Case { hd: 256, n_head: 4, n_kv: 1, ty: t(Q4_0, F16), rows: 300, n_tok: 2, window: None, rope: false },
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(F16, Q8_0), rows: 4097, n_tok: 31, window: None, rope: false },
        // Stored by the fused RoPE + store.
        Case { hd: 128, n_head: 8, n_kv: 2, ty: t(Q8_0, Q8_0), rows: 300, n_tok: 1, window: None, rope: true },
        Case { hd: 64, n_head: 4, n_kv: 4, ty: t(Q4_0, Q8_0), rows: 70, n_tok: 70, window: None, rope: true },
        Case { hd: 256, n_head: 4, n_kv: 2, ty: t(F16, Q4_0), rows: 40, n_tok: 1, window: Some(16), rope: true },
    ]);
    v
}

fn name(c: &Case) -> String {
    let w = c.window.map_or(String::new(), |w| format!("_w{w}"));
    format!("kvq_d{}_g{}_{}_{}_r{}_t{}{w}{}", c.hd, c.n_head / c.n_kv, c.ty.k, c.ty.v, c.rows, c.n_tok, if c.rope { "_rope" } else { "" })
}

/// The bytes the CPU's store makes of `x` (rows of `n` values) in type `t`.
fn stored(t: KvType, x: &[f32]) -> Result<Vec<u8>, String> {
    if t == KvType::F16 {
        return Ok(x.iter().flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes()).collect());
    }
    let mut b = vec![0u8; t.bytes(x.len())];
    crate::quant::quantize(t.ggml(), x, &mut b).map_err(|e| e.to_string())?;
    Ok(b)
}

/// Writes the rows and runs the attention on `be`; returns the output (with `c.rope`, also
/// q and k as RoPE left them, appended).
fn run_on<B: Backend + ?Sized>(be: &mut B, c: &Case, k: &[f32], v: &[f32], q: &[f32]) -> crate::backend::Result<(crate::backend::KvCache, Vec<f32>, Vec<Buf>)> {
    let spec = KvSpec { n_layer: 1, n_ctx: c.rows + 3, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, ty: c.ty, swa: None, alt: None };
    let attn = Attention { n_head: c.n_head, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, scale: 1.0 / (c.hd as f32).sqrt(), window: c.window, sinks: None };
    let kv = be.alloc_kv(&spec)?;
    let mut bufs = Vec::new();
    let mut input = |be: &mut B, x: &[f32]| -> crate::backend::Result<Buf> {
        let b = be.alloc(x.len())?;
        be.write(b, x)?;
        bufs.push(b);
        Ok(b)
    };
    let (kb, vb, qb) = (input(be, k)?, input(be, v)?, input(be, q)?);
    let ob = input(be, &vec![f32::NAN; c.n_tok * c.n_head * c.hd])?;
    let pos: Vec<u32> = (c.rows - c.n_tok..c.rows).map(|p| p as u32).collect();
    if c.rope {
        // Every row's q (the queries are the last n_tok of them), k and v through one store.
        let rope = Rope { mode: RopeMode::Neox, n_rot: c.hd, freq_base: 10000.0, freq_scale: 1.0, freq_factors: None, yarn: None };
        let prep = QkvPrep { n_head: c.n_head, n_kv_head: c.n_kv, head_dim: c.hd, q_norm: None, k_norm: None, eps: 1e-6, rope, q_scale: None };
        let qall: Vec<f32> = (0..c.rows).flat_map(|r| q[(r % c.n_tok) * c.n_head * c.hd..][..c.n_head * c.hd].to_vec()).collect();
        let qa = be.alloc(qall.len())?;
        be.write(qa, &qall)?;
        bufs.push(qa);
        be.rope_kv_write(qa, kb, vb, kv, 0, &(0..c.rows as u32).collect::<Vec<_>>(), &prep)?;
        // The last n_tok rows of q are the queries.
        be.copy(qa, (c.rows - c.n_tok) * c.n_head * c.hd, qb, 0, c.n_tok * c.n_head * c.hd)?;
    } else {
        be.kv_write(kv, 0, kb, vb, &(0..c.rows as u32).collect::<Vec<_>>())?;
    }
    be.attention(qb, kv, 0, &pos, &attn, ob)?;
    let mut out = vec![0f32; c.n_tok * c.n_head * c.hd];
    be.read(ob, &mut out)?;
    if c.rope {
        let (mut qr, mut kr) = (vec![0f32; c.n_tok * c.n_head * c.hd], vec![0f32; k.len()]);
        be.read(qb, &mut qr)?;
        be.read(kb, &mut kr)?;
        out.extend(qr);
        out.extend(kr);
    }
    Ok((kv, out, bufs))
}

fn check_case(gpu: &mut GpuBackend, cpu: &mut CpuBackend, rng: &mut Rng, c: &Case, acc: &mut Acc) -> Result<(), String> {
    let row = c.n_kv * c.hd;
    let (k, v) = (rng.vec(c.rows * row, 1.5), rng.vec(c.rows * row, 1.0));
    let q = rng.vec(c.n_tok * c.n_head * c.hd, 2.0);
    let (ckv, mut want, cbufs) = run_on(cpu, c, &k, &v, &q).map_err(|e| format!("cpu: {e}"))?;
    let (gkv, mut got, gbufs) = run_on(gpu, c, &k, &v, &q).map_err(|e| format!("gpu: {e}"))?;
    let (gk, gv) = gpu.read_kv_bytes(gkv, 0).map_err(|e| e.to_string())?;
    let n_out = c.n_tok * c.n_head * c.hd;
    // With RoPE: q and k as each backend rotated them (close), and the GPU's K plane the
    // CPU quantizer's bytes of the GPU's own rotated k (exact).
    let k_stored = if c.rope { got[2 * n_out..].to_vec() } else { k.clone() };
    if c.rope {
        for (what, at, len) in [("rope q", n_out, n_out), ("rope k", 2 * n_out, k.len())] {
            let w64: Vec<f64> = want[at..][..len].iter().map(|&x| x as f64).collect();
            let m = w64.iter().fold(0f64, |m, x| m.max(x.abs()));
            acc.cmp(what, &got[at..][..len], &w64, |_| 1e-4 * m + 1e-6);
        }
        got.truncate(n_out);
        want.truncate(n_out);
    }
    let (wk, wv) = (stored(c.ty.k, &k_stored)?, stored(c.ty.v, &v)?);
    acc.cmp_bytes("K store", &gk[..wk.len()], &wk);
    acc.cmp_bytes("V store", &gv[..wv.len()], &wv);
    let hd = c.hd;
    let want64: Vec<f64> = want.iter().map(|&x| x as f64).collect();
    acc.cmp("attention", &got, &want64, |i| {
        let r = &want[i / hd * hd..][..hd];
        3e-2 * r.iter().fold(0f32, |m, x| m.max(x.abs())) as f64 + 1e-4
    });
    // A copied prefix is the source's bytes.
    let spec = KvSpec { n_layer: 1, n_ctx: c.rows + 3, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, ty: c.ty, swa: None, alt: None };
    let dst = gpu.alloc_kv(&spec).map_err(|e| e.to_string())?;
    let n = c.rows.div_ceil(2);
    gpu.copy_kv(gkv, dst, n).map_err(|e| e.to_string())?;
    let (dk, dv) = gpu.read_kv_bytes(dst, 0).map_err(|e| e.to_string())?;
    let (bk, bv) = (n * c.ty.k.bytes(row), n * c.ty.v.bytes(row));
    acc.cmp_bytes("copy_kv K", &dk[..bk], &gk[..bk]);
    acc.cmp_bytes("copy_kv V", &dv[..bv], &gv[..bv]);
    for kv in [gkv, dst] {
        gpu.free_kv(kv).map_err(|e| e.to_string())?;
    }
    cpu.free_kv(ckv).map_err(|e| e.to_string())?;
    for b in gbufs {
        gpu.free(b).map_err(|e| e.to_string())?;
    }
    for b in cbufs {
        cpu.free(b).map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub fn run(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let named: Vec<(String, Case)> = cases().into_iter().map(|c| (name(&c), c)).filter(|(n, _)| filter.map(|f| n.contains(f)).unwrap_or(true)).collect();
    if named.is_empty() {
        return Vec::new();
    }
    let mut gpu = GpuBackend::new(dev.clone());
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => return named.into_iter().map(|(n, _)| CheckReport { name: n, cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }).collect(),
    };
    let mut rng = Rng::new(seed ^ 0x6b76_7104);
    named
        .into_iter()
        .map(|(n, c)| {
            let mut acc = Acc::new(&n);
            if let Err(e) = check_case(&mut gpu, &mut cpu, &mut rng, &c, &mut acc) {
                acc.fail(e);
            }
            acc.finish()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The check's CPU half and its tolerance: the CPU's quantized-cache attention against
    /// the f32 cache's attention of the same rows is within the GPU bar for q8_0 (the GPU
    /// output differs from the CPU's by less than the CPU's own quantization does), and
    /// the stored bytes are what `stored` predicts (so the byte comparison can hold).
    #[test]
    fn cpu_half_of_the_kvq_check() {
        let mut rng = Rng::new(7);
        for c in cases() {
            let row = c.n_kv * c.hd;
            let (k, v) = (rng.vec(c.rows * row, 1.5), rng.vec(c.rows * row, 1.0));
            let q = rng.vec(c.n_tok * c.n_head * c.hd, 2.0);
            let mut cpu = CpuBackend::new(2).unwrap();
            let (_, got, _) = run_on(&mut cpu, &c, &k, &v, &q).unwrap();
            let f32c = Case { ty: KvType::F32.into(), ..c };
            let (_, want, _) = run_on(&mut cpu, &f32c, &k, &v, &q).unwrap();
            assert!(got.iter().all(|x| x.is_finite()), "{}", name(&c));
            if c.ty == KvType::Q8_0.into() {
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    let r = &want[i / c.hd * c.hd..][..c.hd];
                    let tol = 3e-2 * r.iter().fold(0f32, |m, x| m.max(x.abs())) + 1e-4;
                    assert!((a - b).abs() <= tol, "{} output {i}: {a} vs f32 {b}", name(&c));
                }
            }
            assert_eq!(stored(KvType::Q8_0, &k[..32]).unwrap().len(), 34);
        }
    }
}
