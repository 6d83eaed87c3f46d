//! `y = W·x` over a set of threads ([`Parallel`]: rayon's pool, or the CPU backend's
//! spinning team), as llama.cpp's CPU backend does it: every activation row is
//! converted once to the weight type's `vec_dot_type`, then output rows are split into
//! large chunks (one task per chunk, a few chunks per thread so the threads that finish
//! first take more), and each chunk walks its weight rows once per tile of tokens so a
//! weight row is read from memory once and reused from cache for the whole tile.

use std::sync::Mutex;

use rayon::prelude::*;

use super::dot::{batch_order, expanded_kernel, rows_kernel, stream_kernel, tokens4, Isa, Kernel, BATCH_ORDER_MIN_TOKENS};
use super::q32;
use super::types::GgmlType;
use super::{quantize, vec_dot_type, QuantError};

/// Activation rows already converted to a weight type's `vec_dot_type` — compute this
/// once and reuse it for every weight that reads the same input (q/k/v, gate/up).
#[derive(Clone, Debug)]
pub struct QuantizedRows {
    /// The activation type (`vec_dot_type` of the weights).
    pub ty: GgmlType,
    pub n_rows: usize,
    pub k_len: usize,
    /// Bytes per row: `ty.bytes_for(k_len)`.
    pub row_bytes: usize,
    // [n_rows, row_bytes] u8
    pub data: Vec<u8>,
}

impl QuantizedRows {
    /// Row `t`'s bytes.
    pub fn row(&self, t: usize) -> &[u8] {
        &self.data[t * self.row_bytes..(t + 1) * self.row_bytes]
    }
}

/// Where the tasks of a matmul run.
pub trait Parallel: Sync {
    /// Threads that run tasks at once.
    fn threads(&self) -> usize;
    /// Calls `f(i)` once for every `i < n`, in any order, on any of the threads.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
}

/// rayon's current pool (the caller's, or the global one).
pub struct RayonPool;

impl Parallel for RayonPool {
    fn threads(&self) -> usize {
        rayon::current_num_threads()
    }
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).into_par_iter().for_each(f)
    }
}

/// `f(i, chunk_i)` for the `chunk`-sized pieces of `data`, spread over `par`.
pub fn par_chunks<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    chunk: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let chunk = chunk.max(1);
    if data.len() <= chunk {
        f(0, data);
        return;
    }
    // Each piece behind its own (never contended) lock: the safe way to hand disjoint
    // mutable pieces to tasks that are claimed by index.
    let parts: Vec<Mutex<&mut [T]>> = data.chunks_mut(chunk).map(Mutex::new).collect();
    par.for_each(parts.len(), &|i| {
        let mut p = parts[i].lock().unwrap_or_else(|e| e.into_inner());
        f(i, &mut p)
    });
}

fn row_bytes(ty: GgmlType, k_len: usize) -> Result<usize, QuantError> {
    let be = ty.block_elems();
    if k_len % be != 0 {
        return Err(QuantError::PartialBlock {
            ty,
            n: k_len,
            block: be,
        });
    }
    Ok(k_len / be * ty.block_bytes())
}

fn check_len(what: &'static str, expected: usize, got: usize) -> Result<(), QuantError> {
    if expected != got {
        return Err(QuantError::Shape {
            what,
            expected,
            got,
        });
    }
    Ok(())
}

/// Convert `n_rows` rows of `k_len` f32 (`x`: [n_rows, k_len]) to the activation type
/// that weights of type `weight_ty` pair with.
pub fn quantize_rows(
    weight_ty: GgmlType,
    x: &[f32],
    n_rows: usize,
    k_len: usize,
) -> Result<QuantizedRows, QuantError> {
    quantize_rows_on(&RayonPool, weight_ty, x, n_rows, k_len)
}

/// [`quantize_rows`] on `par`.
pub fn quantize_rows_on(
    par: &dyn Parallel,
    weight_ty: GgmlType,
    x: &[f32],
    n_rows: usize,
    k_len: usize,
) -> Result<QuantizedRows, QuantError> {
    let ty = vec_dot_type(weight_ty);
    let rb = row_bytes(ty, k_len)?;
    row_bytes(weight_ty, k_len)?;
    check_len("activations (n_tok × k_len)", n_rows * k_len, x.len())?;
    let mut data = vec![0u8; n_rows * rb];
    if n_rows > 1 && n_rows * k_len >= 1 << 15 && rb > 0 {
        // Sizes were checked above, so `quantize` cannot fail here.
        let per = (n_rows / (4 * par.threads().max(1))).max(1);
        par_chunks(par, &mut data, per * rb, &|i, d| {
            let xs = &x[i * per * k_len..][..d.len() / rb * k_len];
            for (d, s) in d.chunks_mut(rb).zip(xs.chunks(k_len)) {
                let _ = quantize_act(ty, s, d);
            }
        });
    } else {
        for (d, s) in data.chunks_mut(rb.max(1)).zip(x.chunks(k_len.max(1))) {
            quantize_act(ty, s, d)?;
        }
    }
    Ok(QuantizedRows {
        ty,
        n_rows,
        k_len,
        row_bytes: rb,
        data,
    })
}

/// [`quantize`] of one activation row, through the AVX2 quantizer where there is one
/// (the same bytes).
fn quantize_act(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    #[cfg(target_arch = "x86_64")]
    if Isa::Avx2.available() && src.len() % 32 == 0 && Some(dst.len() as u64) == ty.bytes_for(src.len() as u64) {
        if let Some(q) = super::simd_avx2::quantizer(ty) {
            q(src, dst);
            return Ok(());
        }
    }
    quantize(ty, src, dst)
}

/// Weight bytes per band of rows when many tokens are multiplied (fits L1/L2 with room
/// for the activation row).
const ROW_BAND_BYTES: usize = 32 * 1024;

/// `y[t*rows + r] = Σ_k W[r][k]·x_t[k]` with `x` already converted ([`quantize_rows`]).
pub fn matmul_quantized(
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    xq: &QuantizedRows,
    y: &mut [f32],
    isa: Isa,
) -> Result<(), QuantError> {
    matmul_quantized_on(&RayonPool, w, ty, rows, xq, y, isa)
}

/// [`matmul_quantized`] on `par`.
pub fn matmul_quantized_on(
    par: &dyn Parallel,
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    xq: &QuantizedRows,
    y: &mut [f32],
    isa: Isa,
) -> Result<(), QuantError> {
    matmul_quantized_impl(par, w, ty, rows, xq, y, isa, false)
}

/// [`matmul_quantized_on`] with every token's row summed as a one-token product sums
/// it (no four-token or batch-order kernels, no expanded bands): a speculative verify
/// chunk's rows then equal the decode steps' bit for bit.
pub fn matmul_quantized_rowwise_on(
    par: &dyn Parallel,
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    xq: &QuantizedRows,
    y: &mut [f32],
    isa: Isa,
) -> Result<(), QuantError> {
    matmul_quantized_impl(par, w, ty, rows, xq, y, isa, true)
}

#[allow(clippy::too_many_arguments)]
fn matmul_quantized_impl(
    par: &dyn Parallel,
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    xq: &QuantizedRows,
    y: &mut [f32],
    isa: Isa,
    rowwise: bool,
) -> Result<(), QuantError> {
    let k_len = xq.k_len;
    let wrb = row_bytes(ty, k_len)?;
    check_len("weight bytes (rows × row bytes)", rows * wrb, w.len())?;
    check_len("output (n_tok × rows)", xq.n_rows * rows, y.len())?;
    if xq.ty != vec_dot_type(ty) {
        return Err(QuantError::ActivationType {
            weight: ty,
            got: xq.ty,
        });
    }
    let kern = rows_kernel(ty, isa).ok_or(QuantError::NoDot(ty))?;
    let n_tok = xq.n_rows;
    if rows == 0 || n_tok == 0 {
        return Ok(());
    }
    let chunk = chunk_rows(par, rows, wrb);
    if n_tok == 1 {
        let kern = stream_kernel(ty, isa).ok_or(QuantError::NoDot(ty))?;
        let x0 = xq.row(0);
        par_chunks(par, y, chunk, &|ci, ys| {
            let r0 = ci * chunk;
            kern.rows(&w[r0 * wrb..(r0 + ys.len()) * wrb], wrb, x0, k_len, ys);
        });
        return Ok(());
    }
    // Each chunk writes its block of outputs as [n_tok, chunk rows]; scattered after.
    // [n_chunks, n_tok, chunk] f32 (the last chunk may be short)
    let mut tmp = vec![0f32; n_tok * rows];
    let expanded = if n_tok >= EXPAND_MIN_TOKENS && !rowwise {
        expanded_kernel(ty, isa)
    } else {
        None
    };
    // llama.cpp sums some types in another order for a larger batch; follow it.
    let (kern, quad) = match batch_order(ty, isa) {
        _ if rowwise => (kern, None),
        Some((k, q)) if n_tok >= BATCH_ORDER_MIN_TOKENS => (k, Some(q)),
        _ => (kern, tokens4(ty, isa)),
    };
    par_chunks(par, &mut tmp, n_tok * chunk, &|ci, out| {
        let r0 = ci * chunk;
        let nr = out.len() / n_tok;
        let w = &w[r0 * wrb..(r0 + nr) * wrb];
        match expanded {
            Some((ek, eb)) => tile_expanded(ty, ek, eb, w, wrb, xq, nr, out),
            None => tile(kern, quad, w, wrb, xq, nr, out),
        }
    });
    let per = n_tok.div_ceil(4 * par.threads().max(1));
    par_chunks(par, y, per * rows, &|i, yts| {
        for (j, yt) in yts.chunks_mut(rows).enumerate() {
            let t = i * per + j;
            for (ci, ys) in yt.chunks_mut(chunk).enumerate() {
                let nr = ys.len();
                let base = ci * chunk * n_tok + t * nr;
                ys.copy_from_slice(&tmp[base..base + nr]);
            }
        }
    });
    Ok(())
}

/// One chunk of `nr` weight rows against every token: a band of rows small enough to
/// stay in L1/L2 is run against each token in turn, so it is read from memory once.
/// With `quad`, tokens go four at a time through it (same results as `kern`).
fn tile(
    kern: Kernel,
    quad: Option<super::dot::Tokens4Fn>,
    w: &[u8],
    wrb: usize,
    xq: &QuantizedRows,
    nr: usize,
    out: &mut [f32],
) {
    let n_tok = xq.n_rows;
    let band = (ROW_BAND_BYTES / wrb.max(1)).clamp(4, nr.max(4)) / 4 * 4;
    // [4, band] f32
    let mut tmp = vec![0f32; 4 * band];
    for r0 in (0..nr).step_by(band) {
        let r1 = (r0 + band).min(nr);
        let wb = &w[r0 * wrb..r1 * wrb];
        let mut t = 0;
        if let Some(k4) = quad {
            let m = r1 - r0;
            while t + 4 <= n_tok {
                let o = &mut tmp[..4 * m];
                k4(wb, [xq.row(t), xq.row(t + 1), xq.row(t + 2), xq.row(t + 3)], xq.k_len, o);
                for (j, oj) in o.chunks_exact(m).enumerate() {
                    out[(t + j) * nr + r0..(t + j) * nr + r1].copy_from_slice(oj);
                }
                t += 4;
            }
        }
        for t in t..n_tok {
            let o = &mut tmp[..r1 - r0];
            kern.rows(wb, wrb, xq.row(t), xq.k_len, o);
            out[t * nr + r0..t * nr + r1].copy_from_slice(o);
        }
    }
}

/// From this many tokens on, a band of 32-element-block weights is first expanded to
/// byte codes (`q32::expand`) so the per-token kernel skips the nibble unpacking.
const EXPAND_MIN_TOKENS: usize = 8;

/// [`tile`] for a band expanded to byte codes first (once per band, for all tokens).
#[allow(clippy::too_many_arguments)]
fn tile_expanded(
    ty: GgmlType,
    kern: Kernel,
    eb: usize,
    w: &[u8],
    wrb: usize,
    xq: &QuantizedRows,
    nr: usize,
    out: &mut [f32],
) {
    let n_tok = xq.n_rows;
    let erb = xq.k_len / 32 * eb;
    let band = (ROW_BAND_BYTES / erb.max(1)).clamp(4, nr.max(4)) / 4 * 4;
    // [band, erb] u8: the band's rows as byte codes
    let mut ex = vec![0u8; band * erb];
    let mut tmp = vec![0f32; band];
    for r0 in (0..nr).step_by(band) {
        let r1 = (r0 + band).min(nr);
        let exb = &mut ex[..(r1 - r0) * erb];
        q32::expand(ty, &w[r0 * wrb..r1 * wrb], exb);
        for t in 0..n_tok {
            let o = &mut tmp[..r1 - r0];
            kern.rows(exb, erb, xq.row(t), xq.k_len, o);
            out[t * nr + r0..t * nr + r1].copy_from_slice(o);
        }
    }
}

/// Rows per task: about four tasks per thread, but no more than ~1 MiB of weights per
/// task (so a thread slowed by a neighbour costs the others little waiting at the end:
/// Gemma 3's 170 MiB output head is ~170 tasks), never less than ~64 KiB (task overhead
/// would dominate), and a multiple of 8.
fn chunk_rows(par: &dyn Parallel, rows: usize, row_bytes: usize) -> usize {
    let threads = par.threads().max(1);
    let by_threads = rows.div_ceil(threads * 4);
    let most = (1024 * 1024usize).div_ceil(row_bytes.max(1));
    let least = (64 * 1024usize).div_ceil(row_bytes.max(1));
    let c = by_threads.min(most).max(least).max(1);
    c.div_ceil(8) * 8
}

/// One weight of a [`matmul_batch`]: `rows` rows of type `ty` in `w`, output into `y`
/// (`[n_tok, rows]`).
pub struct BatchItem<'a> {
    pub w: &'a [u8],
    pub ty: GgmlType,
    pub rows: usize,
    pub y: &'a mut [f32],
}

/// Several weights that read the same input (q/k/v; gate/up) in one parallel pass: the
/// union of their rows is split into chunks and handed to the pool at once, so a decode
/// step pays one fork/join instead of one per weight. Every weight's `vec_dot_type` must
/// equal `xq.ty`.
pub fn matmul_batch(
    items: &mut [BatchItem<'_>],
    xq: &QuantizedRows,
    isa: Isa,
) -> Result<(), QuantError> {
    matmul_batch_on(&RayonPool, items, xq, isa)
}

/// [`matmul_batch`] on `par`.
pub fn matmul_batch_on(
    par: &dyn Parallel,
    items: &mut [BatchItem<'_>],
    xq: &QuantizedRows,
    isa: Isa,
) -> Result<(), QuantError> {
    let k_len = xq.k_len;
    for it in items.iter() {
        check_len(
            "weight bytes (rows × row bytes)",
            it.rows * row_bytes(it.ty, k_len)?,
            it.w.len(),
        )?;
        check_len("output (n_tok × rows)", xq.n_rows * it.rows, it.y.len())?;
        if xq.ty != vec_dot_type(it.ty) {
            return Err(QuantError::ActivationType {
                weight: it.ty,
                got: xq.ty,
            });
        }
        rows_kernel(it.ty, isa).ok_or(QuantError::NoDot(it.ty))?;
    }
    if xq.n_rows != 1 {
        for it in items.iter_mut() {
            matmul_quantized_on(par, it.w, it.ty, it.rows, xq, it.y, isa)?;
        }
        return Ok(());
    }
    let x0 = xq.row(0);
    // (kernel, weight rows, row bytes, outputs) per task
    // Each behind its own (never contended) lock, claimed once by index.
    type Task<'t> = Mutex<(Kernel, &'t [u8], usize, &'t mut [f32])>;
    let mut tasks: Vec<Task> = Vec::new();
    for it in items.iter_mut() {
        let wrb = row_bytes(it.ty, k_len)?;
        let kern = stream_kernel(it.ty, isa).ok_or(QuantError::NoDot(it.ty))?;
        let chunk = chunk_rows(par, it.rows, wrb);
        for (ci, ys) in it.y.chunks_mut(chunk).enumerate() {
            let r0 = ci * chunk;
            tasks.push(Mutex::new((kern, &it.w[r0 * wrb..(r0 + ys.len()) * wrb], wrb, ys)));
        }
    }
    par.for_each(tasks.len(), &|i| {
        let mut t = tasks[i].lock().unwrap_or_else(|e| e.into_inner());
        let (kern, w, wrb, ref mut ys) = *t;
        kern.rows(w, wrb, x0, k_len, ys);
    });
    Ok(())
}

/// [`quantize_rows`] then [`matmul_quantized`].
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    isa: Isa,
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    k_len: usize,
    x: &[f32],
    n_tok: usize,
    y: &mut [f32],
) -> Result<(), QuantError> {
    let xq = quantize_rows(ty, x, n_tok, k_len)?;
    matmul_quantized(w, ty, rows, &xq, y, isa)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path (one token: the stream kernels; many: bands, expanded bands, four
    /// tokens at a time, leftovers) gives each (row, token) the same bits — except
    /// where a batch sums in llama.cpp's batched order on purpose (Q4_K's four-token
    /// kernel, Q6_K from 8 tokens on); then within a few ulp.
    #[test]
    fn many_tokens_equal_one_token_at_a_time_bit_for_bit() {
        use GgmlType::*;
        let (rows, k, n_tok) = (37, 512, 11);
        let mut s = 0x9e37_79b9_u32;
        let mut rnd = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2001) as f32 / 1000.0 - 1.0
        };
        let w: Vec<f32> = (0..rows * k).map(|_| rnd()).collect();
        let x: Vec<f32> = (0..n_tok * k).map(|_| rnd()).collect();
        for ty in GgmlType::WEIGHTS {
            let mut wq = vec![0u8; rows * row_bytes(ty, k).unwrap()];
            if GgmlType::GRID_WEIGHTS.contains(&ty) {
                wq = crate::quant::grid_random_blocks(ty, rows * k / 256, 5, 1.0);
            } else {
                quantize(ty, &w, &mut wq).unwrap();
            }
            for isa in [Isa::Scalar, Isa::best()] {
                let xq = quantize_rows(ty, &x, n_tok, k).unwrap();
                let mut all = vec![0f32; n_tok * rows];
                matmul_quantized(&wq, ty, rows, &xq, &mut all, isa).unwrap();
                for t in 0..n_tok {
                    let x1 = quantize_rows(ty, &x[t * k..(t + 1) * k], 1, k).unwrap();
                    let mut one = vec![0f32; rows];
                    matmul_quantized(&wq, ty, rows, &x1, &mut one, isa).unwrap();
                    let batch_order = isa != Isa::Scalar && ((ty == Q4_K && t < n_tok - n_tok % 4) || (ty == Q6_K && n_tok >= 8));
                    if batch_order {
                        for (a, b) in all[t * rows..(t + 1) * rows].iter().zip(&one) {
                            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{ty} {isa:?} token {t}: {a} vs {b}");
                        }
                        continue;
                    }
                    let a: Vec<u32> = all[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                    let b: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(a, b, "{ty} {isa:?} token {t}");
                }
            }
        }
    }
}
