//! Kernel property tests: every kernel against a host reference, over random shapes and
//! data, with outputs poisoned (NaN) before each run. `lode selftest` runs them on a GPU;
//! `cargo test` runs the same check bodies on the CPU target ([`HostTarget`], backed by
//! `quant::matmul` / `quant::dequantize`) where that is meaningful.
//!
//! A [`Target`] method returns `Ok(None)` for an op it does not implement (reported SKIP).

use crate::backend::gpu::family::{norm_rope, quantize};
use crate::backend::gpu::launch;
use super::{GpuError};
use crate::quant::{self, GgmlType};
use launch::ActFmt;

mod act;
pub mod blas;
pub mod flash;
pub mod prefill;
pub mod replay;
pub mod exact;
mod fused;
pub mod kvq;
pub mod kv_rot;
pub mod mmq;
pub mod swa;
pub mod upload;
pub mod delta;
pub mod moe;
pub mod norm_mv;
mod reference;
mod report;
mod rows;
pub mod rope_attn;
mod targets;
pub use reference::*;
pub use report::{Acc, CheckReport, Rng};
pub use targets::{GpuTarget, HostTarget};

type Out<T> = Result<Option<T>, GpuError>;

/// What the checks run against.
pub trait Target {
    fn label(&self) -> String;
    /// y: [ncols, rows]; for quantized weights also the activation blocks the kernel read
    /// (the form `quantize::act_fmt(ty)`).
    fn matvec(&self, w: &[u8], ty: GgmlType, rows: usize, k: usize, x: &[f32], ncols: usize) -> Out<(Vec<f32>, Option<Vec<u8>>)>;
    fn quantize_q8_1(&self, x: &[f32], rows: usize, k: usize) -> Out<Vec<u8>>;
    fn get_rows(&self, w: &[u8], ty: GgmlType, k: usize, ids: &[i32], scale: f32) -> Out<Vec<f32>>;
    fn rmsnorm(&self, x: &[f32], w: Option<&[f32]>, rows: usize, n: usize, eps: f32) -> Out<Vec<f32>>;
    #[allow(clippy::too_many_arguments)]
    fn rope(&self, x: &[f32], pos: &[i32], ff: Option<&[f32]>, n_head: usize, head_dim: usize, n_rot: usize, neox: bool, base: f32, freq_scale: f32, attn_factor: f32) -> Out<Vec<f32>>;
    #[allow(clippy::too_many_arguments)]
    fn attention(&self, q: &[f32], kc: &[u16], vc: &[u16], n_tok: usize, n_head: usize, n_kv: usize, hd: usize, pos0: usize, window: usize, scale: f32) -> Out<Vec<f32>>;
    fn elementwise(&self, op: Elt, a: &[f32], b: &[f32], p: f32) -> Out<Vec<f32>>;
    /// The type a target rounds f32 activations to before a matvec of `ty` weights when
    /// it does not report them (None: exact f32).
    fn activation_type(&self, _ty: GgmlType) -> Option<GgmlType> {
        None
    }
    /// Activation blocks of `fmt` ([rows, k/32] 36-byte blocks) of x [rows, k].
    fn quantize_act(&self, _fmt: ActFmt, _x: &[f32], _rows: usize, _k: usize) -> Out<Vec<u8>> {
        Ok(None)
    }
    /// x [rows, k] quantized to `fmt` and back to f32 (the prefill GEMM's input).
    fn quantize_dq(&self, _fmt: ActFmt, _x: &[f32], _rows: usize, _k: usize) -> Out<Vec<f32>> {
        Ok(None)
    }
    /// Fused rmsnorm + activation blocks of `fmt` (y, block bytes).
    fn rmsnorm_q8(&self, _x: &[f32], _w: Option<&[f32]>, _rows: usize, _n: usize, _eps: f32, _fmt: ActFmt) -> Out<(Vec<f32>, Vec<u8>)> {
        Ok(None)
    }
    /// Fused GLU + activation blocks of `fmt` (y, block bytes).
    fn glu_q8(&self, _g: &[f32], _u: &[f32], _gelu: bool, _fmt: ActFmt) -> Out<(Vec<f32>, Vec<u8>)> {
        Ok(None)
    }
    /// K and V rows into f16 caches of `slots` rows: (kc, vc).
    fn kv_store(&self, _k: &[f32], _v: &[f32], _nk: usize, _nv: usize, _rows: &[i32], _slots: usize) -> Out<(Vec<u16>, Vec<u16>)> {
        Ok(None)
    }
    /// Fused residual add + rmsnorm + activation blocks of `fmt`: (x + r, y, block bytes).
    #[allow(clippy::too_many_arguments)]
    fn add_rmsnorm_q8(&self, _x: &[f32], _r: &[f32], _w: Option<&[f32]>, _rows: usize, _n: usize, _eps: f32, _fmt: ActFmt) -> Out<(Vec<f32>, Vec<f32>, Vec<u8>)> {
        Ok(None)
    }
    /// Fused q/k norm + RoPE + K/V store: (q, k, kc, vc) after the op.
    #[allow(clippy::too_many_arguments)]
    fn rope_kv(&self, _q: &[f32], _k: &[f32], _v: &[f32], _qw: Option<&[f32]>, _kw: Option<&[f32]>, _pos: &[i32], _ff: Option<&[f32]>, _p: &norm_rope::RopeKv, _base: f32, _slots: usize) -> Out<RopeKvOut> {
        Ok(None)
    }
    /// Up to 3 one-column matvecs over one quantized input: (outputs, activation blocks:
    /// the q8_1 form, then the K form when k % 256 == 0).
    fn matvec_multi(&self, _ws: &[(&[u8], GgmlType, usize)], _k: usize, _x: &[f32]) -> Out<(Vec<Vec<f32>>, Vec<u8>)> {
        Ok(None)
    }
    /// `matvec::matvec_q4k_loop` over `blocks` resident blocks (Q4_K weights).
    fn matvec_q4k_loop(&self, _ws: &[(&[u8], GgmlType, usize)], _k: usize, _x: &[f32], _blocks: usize) -> Out<Vec<Vec<f32>>> {
        Ok(None)
    }
    /// `decode_mv::split_walk` over `blocks` resident blocks: (y, the K-form bytes it read).
    fn matvec_split(&self, _w: &[u8], _ty: GgmlType, _rows: usize, _k: usize, _x: &[f32], _blocks: usize) -> Out<(Vec<f32>, Vec<u8>)> {
        Ok(None)
    }
    /// Attention that also writes its output's q8_1 blocks: (out, q8 bytes).
    #[allow(clippy::too_many_arguments)]
    fn attention_q8(&self, _q: &[f32], _kc: &[u16], _vc: &[u16], _n_tok: usize, _n_head: usize, _n_kv: usize, _hd: usize, _pos0: usize, _window: usize, _scale: f32) -> Out<(Vec<f32>, Vec<u8>)> {
        Ok(None)
    }
    /// Prefill GEMM, Q4_K weights × f32 rows: y [n, rows].
    fn gemm_q4_k(&self, _w: &[u8], _rows: usize, _k: usize, _x: &[f32], _n: usize) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn f32_to_f16_rows(&self, src: &[f32], rows: usize, n: usize, stride: usize, row0: usize, dst_rows: usize) -> Out<Vec<u16>>;
    /// The batched decode step's per-row K/V store and attention (`selftest/rows.rs`);
    /// a device-only check: the CPU target has no address tables. Ok(None) = skipped.
    fn attention_rows(&self, _cases: usize, _rng: &mut Rng, _acc: &mut Acc) -> Out<()> {
        Ok(None)
    }
}

/// What `rope_kv` leaves behind: q, k (in place) and the two f16 caches.
pub type RopeKvOut = (Vec<f32>, Vec<f32>, Vec<u16>, Vec<u16>);

/// The flat elementwise ops.
#[derive(Clone, Copy, Debug)]
pub enum Elt {
    Add,
    Mul,
    Scale,
    SwiGlu,
    GeGlu,
    Softcap,
}

/// Every weight type the matvec and get_rows kernels support: the first eleven, whose
/// checks come first, then [`GgmlType::LOWBIT_WEIGHTS`], whose checks are appended at the
/// end (so the older checks keep their seeds).
pub const WEIGHT_TYPES: [GgmlType; 23] = GgmlType::WEIGHTS;

/// Run every check whose name contains `filter`, `cases` random cases each.
pub fn run_checks(t: &dyn Target, filter: Option<&str>, cases: usize, seed: u64) -> Vec<CheckReport> {
    let mut names: Vec<String> = vec!["quantize_q8_1".into()];
    for ty in GgmlType::BASE_WEIGHTS {
        names.push(format!("matvec_{}", ty.name().to_lowercase()));
    }
    for ty in GgmlType::BASE_WEIGHTS {
        names.push(format!("get_rows_{}", ty.name().to_lowercase()));
    }
    names.push("gemm_q4_k".into());
    for n in ["rmsnorm_q8", "swiglu_q8", "geglu_q8", "kv_store", "add_rmsnorm_q8", "rope_kv", "matvec_multi", "matvec_q4k_loop", "matvec_split", "attention_q8", "attention_rows"] {
        names.push(n.into());
    }
    for n in ["rmsnorm", "rope_norm", "rope_neox", "attention_decode", "attention_prefill", "add", "mul", "scale", "swiglu", "geglu", "softcap", "f32_to_f16_rows"] {
        names.push(n.into());
    }
    // Appended (each check's seed follows its index: the older checks keep theirs).
    names.extend(act::CHECKS.iter().map(|s| s.to_string()));
    for ty in GgmlType::LOWBIT_WEIGHTS.iter().chain(&GgmlType::GRID_WEIGHTS) {
        names.push(format!("matvec_{}", ty.name().to_lowercase()));
        names.push(format!("get_rows_{}", ty.name().to_lowercase()));
    }
    names.push("matvec_multi_grid".into());
    let mut out = Vec::new();
    for (idx, name) in names.iter().enumerate() {
        if let Some(f) = filter {
            if !name.contains(f) {
                continue;
            }
        }
        let mut rng = Rng::new(seed ^ ((idx as u64 + 1) * 0x1234_5678_9abc));
        let rep = match run_one(t, name, cases, &mut rng) {
            Ok(Some(r)) => r,
            Ok(None) => CheckReport { name: name.clone(), cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: true, failure: None },
            Err(e) => CheckReport { name: name.clone(), cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) },
        };
        out.push(rep);
    }
    out
}

fn ty_by_lower(s: &str) -> Option<GgmlType> {
    WEIGHT_TYPES.iter().copied().find(|t| t.name().to_lowercase() == s)
}

fn run_one(t: &dyn Target, name: &str, cases: usize, rng: &mut Rng) -> Result<Option<CheckReport>, GpuError> {
    let mut acc = Acc::new(name);
    if let Some(ty) = name.strip_prefix("matvec_").and_then(ty_by_lower) {
        for c in 0..cases {
            let be = ty.block_elems();
            let k = if ty.is_quantized() { be * rng.range(1, 4096 / be) } else { rng.range(1, 1500) };
            let rows = if c % 3 == 0 { rng.range(1, 9) * 2 + 1 } else { rng.range(1, 300) };
            let ncols = if c % 2 == 0 { 1 } else if c % 4 == 1 { rng.range(2, 11) } else if ty.is_quantized() { rng.range(9, 21) } else { rng.range(9, 80) };
            let w = random_weights(rng, ty, rows, k);
            let x = rng.vec(ncols * k, 1.0);
            let Some((y, q8)) = t.matvec(&w, ty, rows, k, &x, ncols)? else { return Ok(None) };
            let wf = dequant(ty, &w, rows * k)?;
            let case = format!("rows={rows} k={k} ncols={ncols}");
            match q8 {
                Some(q8) => {
                    let (want, tol) = q8_reference(&wf, rows, k, &q8, ncols, quantize::act_fmt(ty).unwrap_or(ActFmt::Q8_1));
                    acc.cmp(&case, &y, &want, |i| tol[i]);
                }
                None => {
                    // A target without q8_1 (the CPU) quantizes activations to
                    // vec_dot_type(ty); the reference reads the same rounded activations.
                    let vt = t.activation_type(ty).unwrap_or(GgmlType::F32);
                    let mut xq = vec![0u8; vt.bytes_for(k as u64).unwrap_or(0) as usize];
                    let mut xh = vec![0f32; ncols * k];
                    for col in 0..ncols {
                        let src = &x[col * k..(col + 1) * k];
                        if quant::quantize(vt, src, &mut xq).is_ok() && quant::dequantize(vt, &xq, &mut xh[col * k..(col + 1) * k]).is_ok() {
                            continue;
                        }
                        xh[col * k..(col + 1) * k].copy_from_slice(src);
                    }
                    let mut want = vec![0f64; ncols * rows];
                    let mut tol = vec![0f64; ncols * rows];
                    for col in 0..ncols {
                        for r in 0..rows {
                            let (mut dot, mut mag) = (0f64, 0f64);
                            for i in 0..k {
                                let p = wf[r * k + i] as f64 * xh[col * k + i] as f64;
                                dot += p;
                                mag += p.abs();
                            }
                            want[col * rows + r] = dot;
                            tol[col * rows + r] = 5e-5 * mag + 1e-5;
                        }
                    }
                    acc.cmp(&case, &y, &want, |i| tol[i]);
                }
            }
        }
        return Ok(Some(acc.finish()));
    }
    if let Some(ty) = name.strip_prefix("get_rows_").and_then(ty_by_lower) {
        for _ in 0..cases {
            let be = ty.block_elems();
            let k = if ty.is_quantized() { be * rng.range(1, 2048 / be) } else { rng.range(1, 1000) };
            let n_rows_w = rng.range(1, 64);
            let w = random_weights(rng, ty, n_rows_w, k);
            let ids: Vec<i32> = (0..rng.range(1, 9)).map(|_| rng.range(0, n_rows_w - 1) as i32).collect();
            let scale = if rng.f() > 0.0 { 1.0 } else { 25.3 };
            let Some(y) = t.get_rows(&w, ty, k, &ids, scale)? else { return Ok(None) };
            let wf = dequant(ty, &w, n_rows_w * k)?;
            let want: Vec<f64> = ids.iter().flat_map(|&id| wf[id as usize * k..(id as usize + 1) * k].iter().map(|&v| v as f64 * scale as f64)).collect();
            acc.cmp(&format!("k={k} ids={}", ids.len()), &y, &want, |i| 1e-6 * want[i].abs() + 1e-7);
        }
        return Ok(Some(acc.finish()));
    }
    match name {
        "gemm_q4_k" => {
            let ns = [1usize, 2, 7, 15, 16, 17, 63, 64, 65, 127, 128, 129];
            for c in 0..cases {
                let n = if c < ns.len() { ns[c] } else { rng.range(1, 300) };
                let k = 256 * rng.range(1, 8);
                let rows = rng.range(1, 200);
                let w = random_weights(rng, GgmlType::Q4_K, rows, k);
                let x = rng.vec(n * k, 1.0);
                let Some(y) = t.gemm_q4_k(&w, rows, k, &x, n)? else { return Ok(None) };
                let wf = dequant(GgmlType::Q4_K, &w, rows * k)?;
                let mut want = vec![0f64; n * rows];
                let mut tol = vec![0f64; n * rows];
                for tk in 0..n {
                    for r in 0..rows {
                        let (mut dot, mut mag) = (0f64, 0f64);
                        for i in 0..k {
                            let p = wf[r * k + i] as f64 * x[tk * k + i] as f64;
                            dot += p;
                            mag += p.abs();
                        }
                        want[tk * rows + r] = dot;
                        // f16 operands: each product off by ≤ ~2·2^-11 relative.
                        tol[tk * rows + r] = 1.5e-3 * mag + 1e-5;
                    }
                }
                acc.cmp(&format!("rows={rows} k={k} n={n}"), &y, &want, |i| tol[i]);
            }
        }
        "rmsnorm_q8" | "swiglu_q8" | "geglu_q8" => {
            for c in 0..cases {
                let (rows, fmt, n) = producer_case(rng, c);
                let x = rng.vec(rows * n, 2.0);
                let u = rng.vec(rows * n, 2.0);
                let w = rng.vec(n, 1.5);
                let (y, q, want) = if name == "rmsnorm_q8" {
                    let Some((y, q)) = t.rmsnorm_q8(&x, Some(&w), rows, n, 1e-6, fmt)? else { return Ok(None) };
                    let mut want = Vec::with_capacity(rows * n);
                    for r in 0..rows {
                        let row = &x[r * n..(r + 1) * n];
                        let sc = 1.0 / (row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64 + 1e-6).sqrt();
                        want.extend((0..n).map(|i| row[i] as f64 * sc * w[i] as f64));
                    }
                    (y, q, want)
                } else {
                    let op = if name == "swiglu_q8" { Elt::SwiGlu } else { Elt::GeGlu };
                    let Some((y, q)) = t.glu_q8(&x, &u, name == "geglu_q8", fmt)? else { return Ok(None) };
                    let want = x.iter().zip(&u).zip(&y).map(|((&a, &b), &g)| if name == "geglu_q8" { geglu_want(a, b, g) } else { ref_elt(op, a as f64, b as f64, 0.0) }).collect();
                    (y, q, want)
                };
                acc.cmp(&format!("rows={rows} n={n} (values)"), &y, &want, |i| 2e-5 * want[i].abs() + 1e-6);
                // The blocks must be the CPU's quantization of the values just written.
                q8_blocks_check(&mut acc, &format!("rows={rows} n={n}"), &y, &q, if name == "rmsnorm_q8" { rows } else { 1 }, if name == "rmsnorm_q8" { n } else { rows * n }, fmt);
            }
        }
        "kv_store" => {
            for _ in 0..cases {
                let n_rows = rng.range(1, 9);
                let (nk, nv) = (8 * rng.range(1, 64), 8 * rng.range(1, 64));
                let slots = n_rows + rng.range(0, 20);
                let mut rows: Vec<i32> = (0..slots as i32).collect();
                for i in (1..rows.len()).rev() {
                    rows.swap(i, rng.range(0, i));
                }
                rows.truncate(n_rows);
                let k = rng.vec(n_rows * nk, 4.0);
                let v = rng.vec(n_rows * nv, 4.0);
                let Some((kc, vc)) = t.kv_store(&k, &v, nk, nv, &rows, slots)? else { return Ok(None) };
                let (mut got, mut want) = (Vec::new(), Vec::new());
                for (r, &slot) in rows.iter().enumerate() {
                    for i in 0..nk {
                        got.push(half::f16::from_bits(kc[slot as usize * nk + i]).to_f32());
                        want.push(half::f16::from_f32(k[r * nk + i]).to_f32() as f64);
                    }
                    for i in 0..nv {
                        got.push(half::f16::from_bits(vc[slot as usize * nv + i]).to_f32());
                        want.push(half::f16::from_f32(v[r * nv + i]).to_f32() as f64);
                    }
                }
                acc.cmp(&format!("rows={n_rows} nk={nk} nv={nv}"), &got, &want, |_| 1e-9);
            }
        }
        "quantize_q8_1" => {
            for _ in 0..cases {
                let rows = rng.range(1, 7);
                let k = rng.range(1, 3000);
                let x = rng.vec(rows * k, 3.0);
                let Some(q) = t.quantize_q8_1(&x, rows, k)? else { return Ok(None) };
                let (xh, s) = decode_q8_1(&q, k, rows);
                let kb = k.div_ceil(32);
                let mut got = Vec::new();
                let mut want = Vec::new();
                let mut tol = Vec::new();
                for r in 0..rows {
                    for b in 0..kb {
                        let blk: Vec<f64> = (b * 32..b * 32 + 32).map(|i| if i < k { x[r * k + i] as f64 } else { 0.0 }).collect();
                        let amax = blk.iter().fold(0f64, |a, v| a.max(v.abs()));
                        for (i, &v) in blk.iter().enumerate() {
                            got.push(xh[(r * kb + b) * 32 + i]);
                            want.push(v);
                            // Rounding to the code (d/2) plus d stored as f16 (127·d·2^-11).
                            tol.push(amax * (1.0 / 254.0 + 5e-4) * 1.01 + 1e-6);
                        }
                        // s = d·Σq of the block's own codes (stored as f16).
                        let sq: f64 = (0..32).map(|i| xh[(r * kb + b) * 32 + i] as f64).sum();
                        got.push(s[r * kb + b]);
                        want.push(sq);
                        tol.push(sq.abs() * 1e-3 + amax * 1e-3 + 1e-5);
                    }
                }
                acc.cmp(&format!("rows={rows} k={k}"), &got, &want, |i| tol[i]);
            }
        }
        "rmsnorm" => {
            for _ in 0..cases {
                let rows = rng.range(1, 40);
                let n = rng.range(1, 3000);
                let x = rng.vec(rows * n, 2.0);
                let w = rng.vec(n, 1.5);
                let with_w = rng.f() > -0.5;
                let eps = 1e-6;
                let Some(y) = t.rmsnorm(&x, with_w.then_some(&w[..]), rows, n, eps)? else { return Ok(None) };
                let mut want = Vec::with_capacity(rows * n);
                for r in 0..rows {
                    let row = &x[r * n..(r + 1) * n];
                    let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
                    let sc = 1.0 / (ms + eps as f64).sqrt();
                    for i in 0..n {
                        want.push(row[i] as f64 * sc * if with_w { w[i] as f64 } else { 1.0 });
                    }
                }
                acc.cmp(&format!("rows={rows} n={n}"), &y, &want, |i| 2e-5 * want[i].abs() + 1e-6);
            }
        }
        "rope_norm" | "rope_neox" => {
            // Against the CPU backend's own RoPE (same f32 angles), so only sin/cos and the
            // rotation's rounding may differ.
            let neox = name == "rope_neox";
            for _ in 0..cases {
                let hd = [32, 64, 80, 128, 256][rng.range(0, 4)];
                let n_rot = if rng.f() > 0.5 { hd / 2 } else { hd };
                let n_head = rng.range(1, 12);
                let n_tok = rng.range(1, 9);
                let x = rng.vec(n_tok * n_head * hd, 1.0);
                let pos: Vec<i32> = (0..n_tok).map(|_| rng.range(0, 9000) as i32).collect();
                let factors: Option<Vec<f32>> = (rng.f() > 0.3).then(|| (0..n_rot / 2).map(|_| 1.0 + 7.0 * rng.f().abs()).collect());
                let base = [10000.0, 1e6, 5e5][rng.range(0, 2)];
                let fs = 1.0 / rng.range(1, 8) as f32;
                let af = 1.0 + 0.1 * rng.f();
                let Some(y) = t.rope(&x, &pos, factors.as_deref(), n_head, hd, n_rot, neox, base, fs, af)? else { return Ok(None) };
                let mut want = x.clone();
                for tk in 0..n_tok {
                    for h in 0..n_head {
                        let base_i = (tk * n_head + h) * hd;
                        cpu_rope_head(&mut want[base_i..base_i + hd], pos[tk], n_rot, neox, base, fs, factors.as_deref(), af);
                    }
                }
                let want: Vec<f64> = want.iter().map(|&v| v as f64).collect();
                acc.cmp(&format!("hd={hd} n_rot={n_rot} heads={n_head} toks={n_tok}"), &y, &want, |_| 3e-6);
            }
        }
        n if n.starts_with("act_") => {
            if act::check(t, n, cases, rng, &mut acc)?.is_none() {
                return Ok(None);
            }
        }
        "add_rmsnorm_q8" | "rope_kv" | "matvec_multi" | "matvec_multi_grid" | "matvec_q4k_loop" | "matvec_split" | "attention_q8" => {
            if fused::check(t, name, cases, rng, &mut acc)?.is_none() {
                return Ok(None);
            }
        }
        "attention_rows" => {
            if t.attention_rows(cases, rng, &mut acc)?.is_none() {
                return Ok(None);
            }
        }
        "attention_decode" | "attention_prefill" => {
            for _ in 0..cases {
                let hd = [64, 128, 256, 96, 80, 40][rng.range(0, 5)];
                let n_kv = rng.range(1, 4);
                let n_head = n_kv * rng.range(1, 4);
                let (n_tok, pos0) = if name == "attention_decode" { (1, rng.range(0, 700)) } else { (rng.range(2, 40), rng.range(0, 100)) };
                let n_ctx = pos0 + n_tok;
                let window = if rng.f() > 0.3 { rng.range(1, 64) } else { 0 };
                let scale = 1.0 / (hd as f32).sqrt();
                let q = rng.vec(n_tok * n_head * hd, 2.0);
                let kc: Vec<u16> = rng.vec(n_ctx * n_kv * hd, 2.0).iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let vc: Vec<u16> = rng.vec(n_ctx * n_kv * hd, 1.0).iter().map(|&v| half::f16::from_f32(v).to_bits()).collect();
                let Some(y) = t.attention(&q, &kc, &vc, n_tok, n_head, n_kv, hd, pos0, window, scale)? else { return Ok(None) };
                let want = ref_attention(&q, &kc, &vc, n_tok, n_head, n_kv, hd, pos0, window, scale);
                acc.cmp(&format!("hd={hd} heads={n_head}/{n_kv} toks={n_tok} pos0={pos0} window={window}"), &y, &want, |i| 1e-4 * want[i].abs() + 2e-5);
            }
        }
        "f32_to_f16_rows" => {
            for _ in 0..cases {
                let rows = rng.range(1, 9);
                let n = rng.range(1, 700);
                let stride = n + rng.range(0, 40);
                let row0 = rng.range(0, 20);
                let dst_rows = row0 + rows + rng.range(0, 3);
                let src = rng.vec(rows * n, 10.0);
                let Some(y) = t.f32_to_f16_rows(&src, rows, n, stride, row0, dst_rows)? else { return Ok(None) };
                // Only the written rows are compared (the rest stays poisoned on purpose).
                let mut got = Vec::new();
                let mut want = Vec::new();
                for r in 0..rows {
                    for i in 0..n {
                        got.push(half::f16::from_bits(y[(row0 + r) * stride + i]).to_f32());
                        want.push(half::f16::from_f32(src[r * n + i]).to_f32() as f64);
                    }
                }
                acc.cmp(&format!("rows={rows} n={n}"), &got, &want, |_| 1e-9);
            }
        }
        _ => {
            let op = match name {
                "add" => Elt::Add,
                "mul" => Elt::Mul,
                "scale" => Elt::Scale,
                "swiglu" => Elt::SwiGlu,
                "geglu" => Elt::GeGlu,
                "softcap" => Elt::Softcap,
                _ => return Err(GpuError::Unsupported(format!("unknown check {name}"))),
            };
            for _ in 0..cases {
                let n = rng.range(1, 100_000);
                let a = rng.vec(n, 6.0);
                let b = rng.vec(n, 3.0);
                let p = 0.5 + 30.0 * rng.f().abs();
                let Some(y) = t.elementwise(op, &a, &b, p)? else { return Ok(None) };
                let want: Vec<f64> = a.iter().zip(&b).zip(&y).map(|((&a, &b), &g)| if matches!(op, Elt::GeGlu) { geglu_want(a, b, g) } else { ref_elt(op, a as f64, b as f64, p as f64) }).collect();
                acc.cmp(&format!("n={n}"), &y, &want, |i| 1e-5 * want[i].abs() + 1e-6);
            }
        }
    }
    Ok(Some(acc.finish()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The selftest's check bodies on the CPU target: quant::matmul and quant::dequantize
    /// against the f64 references (the GPU runs the same bodies in `lode selftest`).
    #[test]
    fn cpu_target_passes_the_kernel_checks() {
        let reports = run_checks(&HostTarget, None, 4, 7);
        assert!(reports.iter().any(|r| !r.skipped));
        for r in &reports {
            assert!(r.skipped || r.passed(), "{}", r.line());
        }
    }

    /// A check must be able to fail: a target that perturbs one output is caught.
    #[test]
    fn a_wrong_matvec_is_caught() {
        struct Off;
        impl Target for Off {
            fn label(&self) -> String {
                "off-by-one-block".into()
            }
            fn matvec(&self, w: &[u8], ty: GgmlType, rows: usize, k: usize, x: &[f32], ncols: usize) -> Out<(Vec<f32>, Option<Vec<u8>>)> {
                let mut y = HostTarget.matvec(w, ty, rows, k, x, ncols)?.unwrap().0;
                // Drop the last 32 elements' contribution of row 0 (a classic tail bug).
                let mut wf = vec![0f32; k];
                quant::dequantize(ty, &w[..ty.bytes_for(k as u64).unwrap() as usize], &mut wf).unwrap();
                y[0] -= (k - 32..k).map(|i| wf[i] * x[i]).sum::<f32>();
                Ok(Some((y, None)))
            }
            fn quantize_q8_1(&self, _: &[f32], _: usize, _: usize) -> Out<Vec<u8>> { Ok(None) }
            fn activation_type(&self, ty: GgmlType) -> Option<GgmlType> { HostTarget.activation_type(ty) }
            fn get_rows(&self, _: &[u8], _: GgmlType, _: usize, _: &[i32], _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn rmsnorm(&self, _: &[f32], _: Option<&[f32]>, _: usize, _: usize, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn rope(&self, _: &[f32], _: &[i32], _: Option<&[f32]>, _: usize, _: usize, _: usize, _: bool, _: f32, _: f32, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn attention(&self, _: &[f32], _: &[u16], _: &[u16], _: usize, _: usize, _: usize, _: usize, _: usize, _: usize, _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn elementwise(&self, _: Elt, _: &[f32], _: &[f32], _: f32) -> Out<Vec<f32>> { Ok(None) }
            fn f32_to_f16_rows(&self, _: &[f32], _: usize, _: usize, _: usize, _: usize, _: usize) -> Out<Vec<u16>> { Ok(None) }
        }
        let reports = run_checks(&Off, Some("matvec_q8_0"), 4, 3);
        assert_eq!(reports.len(), 1);
        assert!(!reports[0].passed(), "{}", reports[0].line());
    }

    #[test]
    fn attention_reference_is_softmax_weighted_values() {
        // One key: the output is that key's value row whatever the scores.
        let h = |v: f32| half::f16::from_f32(v).to_bits();
        let out = ref_attention(&[1.0, 2.0], &[h(3.0), h(4.0)], &[h(0.5), h(-1.5)], 1, 1, 1, 2, 0, 0, 1.0);
        assert_eq!(out, vec![0.5, -1.5]);
    }
}
