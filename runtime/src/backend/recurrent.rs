//! The gated delta net of qwen35's recurrent layers ([`Backend::gated_delta_net`]) and the
//! two small ops of its gated attention layers ([`Backend::split_halves`],
//! [`Backend::mul_sigmoid`]): their parameters, the host arithmetic every backend shares
//! ([`delta_net_seq`]), and defaults that read the operands back to the host, compute
//! there and write the results (the CPU runs the arithmetic directly, `cpu/delta.rs`; the
//! GPU its own kernels, `gpu/backend/delta.rs`).
//!
//! The arithmetic is llama.cpp's `qwen35` graph (`build_layer_attn_linear`, the
//! `ssm_conv` and `gated_delta_net` ops), per token `t` of one sequence:
//!
//! 1. conv: each of the `2·key_dim + value_dim` channels of the `attn_qkv` projection
//!    is convolved with its `d_conv` taps over the last `d_conv` inputs (the `d_conv − 1`
//!    before `t` come from the conv state), then SiLU;
//! 2. the channels split into q (`n_k_heads × head_k_dim`), k (the same) and v
//!    (`n_v_heads × head_v_dim`); q and k of each head are L2-normalised
//!    (`x / max(‖x‖, eps)`);
//! 3. gates per value head: `β = σ(ssm_beta · x)`, decay `exp(g)` with
//!    `g = softplus(ssm_alpha · x + ssm_dt.bias) · ssm_a` (`ssm_a` is `−exp(A_log)`);
//! 4. value head `h` reads key head `h mod n_k_heads` (ggml broadcasts by repeating;
//!    qwen3next's value heads are grouped by key head instead, `h / (n_v/n_k)`,
//!    [`DeltaDims::grouped`]); its state `S` (`head_v_dim` rows of `head_k_dim`) becomes `S ← exp(g)·S`,
//!    `d = β·(v − S k)`, `S ← S + d kᵀ`, and the output is `o = S q / √head_k_dim`;
//! 5. `o` of each head is RMS-normed with `ssm_norm` and multiplied by `silu(z)`, `z` the
//!    `attn_gate` projection.
//!
//! The conv state of a layer is `[channels][d_conv − 1]` (oldest first, as llama.cpp lays
//! it out) and the delta-rule state `[n_v_heads][head_v_dim][head_k_dim]`.

use std::borrow::Cow;

use super::{Backend, BackendError, Buf, Result};
use crate::quant::{self, par_chunks, GgmlType, Parallel};
use crate::weights::WeightRef;

/// The shapes of a gated delta net layer (llama.cpp's `ssm.*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaDims {
    /// `ssm.conv_kernel`: taps of the causal convolution.
    pub d_conv: usize,
    /// `ssm.group_count`: q/k heads.
    pub n_k_heads: usize,
    /// `ssm.time_step_rank`: value heads (one state matrix each).
    pub n_v_heads: usize,
    /// `ssm.state_size`: q/k head width.
    pub head_k_dim: usize,
    /// `ssm.inner_size / time_step_rank`: value head width.
    pub head_v_dim: usize,
    /// The value heads come grouped by key head (qwen3next: value head `h` reads key head
    /// `h / (n_v_heads / n_k_heads)`, llama.cpp's interleaved repeat) rather than tiled
    /// (qwen35: `h mod n_k_heads`, as its converter reorders them).
    pub grouped: bool,
}

impl DeltaDims {
    /// The key head value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        if self.grouped {
            h / (self.n_v_heads / self.n_k_heads).max(1)
        } else {
            h % self.n_k_heads
        }
    }
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_k_dim
    }
    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_v_dim
    }
    /// Channels of the `attn_qkv` projection and of the convolution.
    pub fn channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// f32 values of one layer's conv state.
    pub fn conv_state_len(&self) -> usize {
        (self.d_conv - 1) * self.channels()
    }
    /// f32 values of one layer's delta-rule state.
    pub fn ssm_state_len(&self) -> usize {
        self.n_v_heads * self.head_v_dim * self.head_k_dim
    }
}

/// One layer's recurrent weights (f32/f16/bf16 vectors as llama.cpp's converter writes
/// them) and dimensions.
#[derive(Clone, Copy, Debug)]
pub struct DeltaNet<'a, 'w> {
    /// `ssm_conv1d.weight` `[d_conv, channels]`: channel `c`'s taps at `c·d_conv`.
    pub conv: &'a WeightRef<'w>,
    /// `ssm_dt.bias` `[n_v_heads]`.
    pub dt_bias: &'a WeightRef<'w>,
    /// `ssm_a` `[n_v_heads]` (negative: `−exp(A_log)`).
    pub a: &'a WeightRef<'w>,
    /// `ssm_norm.weight` `[head_v_dim]`.
    pub norm: &'a WeightRef<'w>,
    pub dims: DeltaDims,
    /// The model's RMS epsilon (also the L2 norms' floor).
    pub eps: f32,
}

/// A layer's projections of a chunk: `qkv` `[n, channels]`, `z` `[n, value_dim]`,
/// `beta` and `alpha` `[n, n_v_heads]` (before the sigmoid / softplus). `qkv` may be
/// overwritten by the op (the GPU convolves in place).
#[derive(Clone, Copy, Debug)]
pub struct DeltaIn {
    pub qkv: Buf,
    pub z: Buf,
    pub beta: Buf,
    pub alpha: Buf,
}

/// One sequence's state of one recurrent layer: `conv` ([`DeltaDims::conv_state_len`])
/// and `ssm` ([`DeltaDims::ssm_state_len`]), zero for an empty sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaState {
    pub conv: Buf,
    pub ssm: Buf,
}

/// The weights of [`DeltaNet`] as f32 host vectors.
pub struct HostWeights<'a> {
    pub conv: Cow<'a, [f32]>,
    pub dt_bias: Cow<'a, [f32]>,
    pub a: Cow<'a, [f32]>,
    pub norm: Cow<'a, [f32]>,
}

fn bad(msg: String) -> BackendError {
    BackendError::Invalid { op: "gated_delta_net", msg }
}

/// A float vector weight as f32 values (borrowed where the mapping allows).
pub fn float_values<'a>(w: &WeightRef<'a>, want: usize) -> Result<Cow<'a, [f32]>> {
    let n = w.row_len() * w.n_rows();
    if n != want {
        return Err(bad(format!("`{}` has {n} values, expected {want}", w.name())));
    }
    match w.ty() {
        GgmlType::F32 => {
            if let Ok(s) = bytemuck::try_cast_slice::<u8, f32>(w.data()) {
                if s.len() == n {
                    return Ok(Cow::Borrowed(s));
                }
            }
        }
        GgmlType::F16 | GgmlType::BF16 => {}
        ty => return Err(bad(format!("`{}` is {ty}; expected F32, F16 or BF16", w.name()))),
    }
    let mut v = vec![0f32; n];
    quant::dequantize(w.ty(), w.data(), &mut v)
        .map_err(|source| BackendError::Quant { op: "gated_delta_net", weight: w.name().to_string(), source })?;
    Ok(Cow::Owned(v))
}

impl<'w> DeltaNet<'_, 'w> {
    /// The weights as host f32, after checking their sizes against the dimensions.
    pub fn host(&self) -> Result<HostWeights<'w>> {
        let d = &self.dims;
        if d.d_conv < 1 || d.n_k_heads == 0 || d.n_v_heads % d.n_k_heads != 0 || d.head_k_dim == 0 || d.head_v_dim == 0 {
            return Err(bad(format!("unsupported dimensions {d:?}")));
        }
        Ok(HostWeights {
            conv: float_values(self.conv, d.d_conv * d.channels())?,
            dt_bias: float_values(self.dt_bias, d.n_v_heads)?,
            a: float_values(self.a, d.n_v_heads)?,
            norm: float_values(self.norm, d.head_v_dim)?,
        })
    }
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// ggml's softplus: `x` above 20, else `ln(1 + eˣ)`.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// The host operands of [`delta_net_seq`]: one sequence's `n` consecutive rows.
pub struct SeqIn<'a> {
    pub qkv: &'a [f32],
    pub z: &'a [f32],
    pub beta: &'a [f32],
    pub alpha: &'a [f32],
}

/// Steps 1–5 of the module doc for `n` consecutive tokens of one sequence, updating its
/// `conv` and `ssm` state in place and writing `out` `[n, value_dim]`.
#[allow(clippy::too_many_arguments)]
pub fn delta_net_seq(d: &DeltaDims, w: &HostWeights, eps: f32, x: &SeqIn, n: usize, conv: &mut [f32], ssm: &mut [f32], out: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let (ch, kd, vd, nv) = (d.channels(), d.key_dim(), d.value_dim(), d.n_v_heads);
    let (hk, hv, taps) = (d.head_k_dim, d.head_v_dim, d.d_conv);
    let sizes = [(x.qkv.len(), n * ch), (x.z.len(), n * vd), (x.beta.len(), n * nv), (x.alpha.len(), n * nv), (conv.len(), d.conv_state_len()), (ssm.len(), d.ssm_state_len()), (out.len(), n * vd)];
    if let Some((got, want)) = sizes.iter().find(|(g, w)| g != w) {
        return Err(bad(format!("an operand of {got} values where {want} were expected ({n} tokens, {d:?})")));
    }
    // 1. The causal convolution over [state | inputs], channel by channel, then SiLU.
    let mut xc = vec![0f32; n * ch];
    let mut hist = vec![0f32; taps - 1 + n];
    for c in 0..ch {
        let st = &mut conv[c * (taps - 1)..(c + 1) * (taps - 1)];
        hist[..taps - 1].copy_from_slice(st);
        for t in 0..n {
            hist[taps - 1 + t] = x.qkv[t * ch + c];
        }
        let k = &w.conv[c * taps..(c + 1) * taps];
        for t in 0..n {
            let mut s = 0f32;
            for (j, &kj) in k.iter().enumerate() {
                s += hist[t + j] * kj;
            }
            xc[t * ch + c] = silu(s);
        }
        st.copy_from_slice(&hist[n..n + taps - 1]);
    }
    // 2. L2 norms of q and k, head by head.
    for t in 0..n {
        for head in xc[t * ch..t * ch + 2 * kd].chunks_exact_mut(hk) {
            let sum: f64 = head.iter().map(|&v| (v * v) as f64).sum();
            let inv = 1.0 / (sum.sqrt() as f32).max(eps);
            head.iter_mut().for_each(|v| *v *= inv);
        }
    }
    // 3. The gates.
    let beta: Vec<f32> = x.beta.iter().map(|&b| sigmoid(b)).collect();
    let decay: Vec<f32> = x.alpha.iter().enumerate().map(|(i, &al)| (softplus(al + w.dt_bias[i % nv]) * w.a[i % nv]).exp()).collect();
    // 4. The delta rule, one value head per task: its state, then its n outputs.
    let (sl, scale) = (hv * hk, 1.0 / (hk as f32).sqrt());
    let mut work = vec![0f32; nv * (sl + n * hv)];
    for h in 0..nv {
        work[h * (sl + n * hv)..][..sl].copy_from_slice(&ssm[h * sl..(h + 1) * sl]);
    }
    par_chunks(par, &mut work, sl + n * hv, &|h, piece| {
        let (s, o) = piece.split_at_mut(sl);
        let kh = d.key_head(h);
        for t in 0..n {
            let row = &xc[t * ch..(t + 1) * ch];
            let q = &row[kh * hk..(kh + 1) * hk];
            let k = &row[kd + kh * hk..kd + (kh + 1) * hk];
            let v = &row[2 * kd + h * hv..2 * kd + (h + 1) * hv];
            let (g, b) = (decay[t * nv + h], beta[t * nv + h]);
            let ot = &mut o[t * hv..(t + 1) * hv];
            for j in 0..hv {
                let sj = &mut s[j * hk..(j + 1) * hk];
                sj.iter_mut().for_each(|e| *e *= g);
                let sk: f32 = sj.iter().zip(k).map(|(a, b)| a * b).sum();
                let dj = (v[j] - sk) * b;
                sj.iter_mut().zip(k).for_each(|(e, &ki)| *e += dj * ki);
                ot[j] = sj.iter().zip(q).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
        }
    });
    // 5. Per head: RMS norm with `ssm_norm`, times silu(z).
    for h in 0..nv {
        let piece = &work[h * (sl + n * hv)..][..sl + n * hv];
        ssm[h * sl..(h + 1) * sl].copy_from_slice(&piece[..sl]);
        for t in 0..n {
            let o = &piece[sl + t * hv..sl + (t + 1) * hv];
            let sum: f64 = o.iter().map(|&v| (v * v) as f64).sum();
            let r = 1.0 / ((sum / hv as f64) as f32 + eps).sqrt();
            let dst = &mut out[t * vd + h * hv..t * vd + (h + 1) * hv];
            let z = &x.z[t * vd + h * hv..t * vd + (h + 1) * hv];
            for j in 0..hv {
                dst[j] = o[j] * r * w.norm[j] * silu(z[j]);
            }
        }
    }
    Ok(())
}

/// Which state each row of a chunk of `n_tok` uses: one sequence's for all (`states.len()
/// == 1`), or row `t` its own (`states.len() == n_tok`, a batched decode step).
pub fn check_states(states: &[DeltaState], n_tok: usize) -> Result<()> {
    if states.len() != 1 && states.len() != n_tok {
        return Err(bad(format!("{} states for {n_tok} rows (one, or one per row)", states.len())));
    }
    Ok(())
}

/// [`Backend::gated_delta_net`] on any backend: the operands read to the host,
/// [`delta_net_seq`] on each sequence, the output and the states written back.
pub fn gated_delta_net_host<B: Backend + ?Sized>(be: &mut B, p: &DeltaNet, x: &DeltaIn, n_tok: usize, states: &[DeltaState], out: Buf) -> Result<()> {
    check_states(states, n_tok)?;
    let d = p.dims;
    let w = p.host()?;
    let rd = |be: &mut B, b: Buf, len: usize| -> Result<Vec<f32>> {
        let mut v = vec![0f32; len];
        be.read(b, &mut v)?;
        Ok(v)
    };
    let (ch, vd, nv) = (d.channels(), d.value_dim(), d.n_v_heads);
    let (qkv, z) = (rd(be, x.qkv, n_tok * ch)?, rd(be, x.z, n_tok * vd)?);
    let (beta, alpha) = (rd(be, x.beta, n_tok * nv)?, rd(be, x.alpha, n_tok * nv)?);
    let mut o = vec![0f32; n_tok * vd];
    let per = if states.len() == 1 { n_tok } else { 1 };
    for (i, st) in states.iter().enumerate() {
        let (t0, t1) = (i * per, (i + 1) * per);
        let mut conv = rd(be, st.conv, d.conv_state_len())?;
        let mut ssm = rd(be, st.ssm, d.ssm_state_len())?;
        let sx = SeqIn { qkv: &qkv[t0 * ch..t1 * ch], z: &z[t0 * vd..t1 * vd], beta: &beta[t0 * nv..t1 * nv], alpha: &alpha[t0 * nv..t1 * nv] };
        delta_net_seq(&d, &w, p.eps, &sx, per, &mut conv, &mut ssm, &mut o[t0 * vd..t1 * vd], &quant::RayonPool)?;
        be.write(st.conv, &conv)?;
        be.write(st.ssm, &ssm)?;
    }
    be.write(out, &o)
}

/// A 3-D block of f32 values that [`Backend::copy_strided`] moves: element `(i, j, e)`
/// (`i < n[0]`, `j < n[1]`, `e < n[2]`, `e` contiguous) goes from
/// `src_off + i·src_stride[0] + j·src_stride[1] + e` to
/// `dst_off + i·dst_stride[0] + j·dst_stride[1] + e`. qwen3next's packed projections
/// (`ssm_in`: q, k, v, z per key head group) are taken apart this way, per token and group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Strided {
    pub n: [usize; 3],
    pub src_off: usize,
    pub src_stride: [usize; 2],
    pub dst_off: usize,
    pub dst_stride: [usize; 2],
}

impl Strided {
    fn end(&self, off: usize, st: [usize; 2]) -> usize {
        if self.n.contains(&0) {
            return 0;
        }
        off + (self.n[0] - 1) * st[0] + (self.n[1] - 1) * st[1] + self.n[2]
    }
    /// One past the last source index read (0 for an empty block).
    pub fn src_end(&self) -> usize {
        self.end(self.src_off, self.src_stride)
    }
    /// One past the last destination index written (0 for an empty block).
    pub fn dst_end(&self) -> usize {
        self.end(self.dst_off, self.dst_stride)
    }
    /// `f(src_index, dst_index)` for the start of each contiguous run of `n[2]` values.
    pub fn runs(&self, mut f: impl FnMut(usize, usize)) {
        for i in 0..self.n[0] {
            for j in 0..self.n[1] {
                f(self.src_off + i * self.src_stride[0] + j * self.src_stride[1], self.dst_off + i * self.dst_stride[0] + j * self.dst_stride[1]);
            }
        }
    }
    /// The block on host slices (each long enough: [`Self::src_end`], [`Self::dst_end`]).
    pub fn apply(&self, src: &[f32], dst: &mut [f32]) {
        let w = self.n[2];
        self.runs(|s, d| dst[d..d + w].copy_from_slice(&src[s..s + w]));
    }
}

/// [`Backend::copy_strided`] through host read-back (the default): the source and the
/// destination's prefix read, the block moved, the prefix written back.
pub fn copy_strided_host<B: Backend + ?Sized>(be: &mut B, src: Buf, dst: Buf, s: &Strided) -> Result<()> {
    if src == dst {
        return Err(BackendError::Invalid { op: "copy_strided", msg: "source and destination must be different buffers".into() });
    }
    let (se, de) = (s.src_end(), s.dst_end());
    if de == 0 {
        return Ok(());
    }
    let (mut sv, mut dv) = (vec![0f32; se], vec![0f32; de]);
    be.read(src, &mut sv)?;
    be.read(dst, &mut dv)?;
    s.apply(&sv, &mut dv);
    be.write(dst, &dv)
}

/// [`Backend::join_halves`] as device copies, two per row (the default).
pub fn join_halves_copies<B: Backend + ?Sized>(be: &mut B, a: Buf, b: Buf, n_rows: usize, half: usize, dst: Buf) -> Result<()> {
    for r in 0..n_rows {
        be.copy(a, r * half, dst, 2 * r * half, half)?;
        be.copy(b, r * half, dst, (2 * r + 1) * half, half)?;
    }
    Ok(())
}

/// [`Backend::split_halves`] on the host: row `r` of `src` (`2·half` values) gives row
/// `r` of `a` (its first half) and of `b` (its second).
pub fn split_halves_host<B: Backend + ?Sized>(be: &mut B, src: Buf, n_rows: usize, half: usize, a: Buf, b: Buf) -> Result<()> {
    let mut s = vec![0f32; n_rows * 2 * half];
    be.read(src, &mut s)?;
    let (mut va, mut vb) = (Vec::with_capacity(n_rows * half), Vec::with_capacity(n_rows * half));
    for row in s.chunks_exact(2 * half) {
        va.extend_from_slice(&row[..half]);
        vb.extend_from_slice(&row[half..]);
    }
    be.write(a, &va)?;
    be.write(b, &vb)
}

/// [`Backend::mul_sigmoid`] on the host slices: `x[i] *= σ(gate[i])`, or with `per_row`
/// `x[r][j] *= σ(gate[r])` over rows of `row_len`.
pub fn mul_sigmoid_slice(x: &mut [f32], gate: &[f32], row_len: usize, per_row: bool) {
    if per_row {
        x.chunks_mut(row_len.max(1)).zip(gate).for_each(|(row, &g)| {
            let s = sigmoid(g);
            row.iter_mut().for_each(|v| *v *= s);
        });
    } else {
        x.iter_mut().zip(gate).for_each(|(v, &g)| *v *= sigmoid(g));
    }
}

/// [`Backend::mul_sigmoid`] through host read-back.
pub fn mul_sigmoid_host<B: Backend + ?Sized>(be: &mut B, x: Buf, gate: Buf, n_rows: usize, row_len: usize, per_row: bool) -> Result<()> {
    let (mut xv, mut gv) = (vec![0f32; n_rows * row_len], vec![0f32; if per_row { n_rows } else { n_rows * row_len }]);
    be.read(x, &mut xv)?;
    be.read(gate, &mut gv)?;
    mul_sigmoid_slice(&mut xv, &gv, row_len, per_row);
    be.write(x, &xv)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One head of width 2, kernel 2, by hand: conv, norms, gates and the delta rule
    /// over two tokens, against the same arithmetic written out step by step.
    #[test]
    fn two_tokens_by_hand() {
        let d = DeltaDims { d_conv: 2, n_k_heads: 1, n_v_heads: 1, head_k_dim: 2, head_v_dim: 2, grouped: false };
        let w = HostWeights {
            conv: Cow::Owned(vec![0.5, 1.0, 0.25, 1.0, 1.0, -1.0, 2.0, 0.5, -0.5, 1.5, 1.0, 1.0]),
            dt_bias: Cow::Owned(vec![0.1]),
            a: Cow::Owned(vec![-0.7]),
            norm: Cow::Owned(vec![1.0, 2.0]),
        };
        let qkv = [0.3, -0.2, 0.5, 0.1, 0.4, -0.6, -0.1, 0.2, 0.3, 0.7, 0.2, 0.05];
        let z = [0.2, -0.4, 1.0, 0.3];
        let (beta, alpha) = ([0.4], [-0.3]);
        let (beta2, alpha2) = ([0.4, -1.0], [-0.3, 0.8]);
        let x = SeqIn { qkv: &qkv, z: &z, beta: &beta2, alpha: &alpha2 };
        let (mut conv, mut ssm, mut out) = (vec![0f32; 6], vec![0f32; 4], vec![0f32; 4]);
        delta_net_seq(&d, &w, 1e-6, &x, 2, &mut conv, &mut ssm, &mut out, &quant::RayonPool).unwrap();
        // Token by token from zero state gives the same.
        let (mut c1, mut s1, mut o1) = (vec![0f32; 6], vec![0f32; 4], vec![0f32; 4]);
        let x0 = SeqIn { qkv: &qkv[..6], z: &z[..2], beta: &beta, alpha: &alpha };
        delta_net_seq(&d, &w, 1e-6, &x0, 1, &mut c1, &mut s1, &mut o1[..2], &quant::RayonPool).unwrap();
        let x1 = SeqIn { qkv: &qkv[6..], z: &z[2..], beta: &beta2[1..], alpha: &alpha2[1..] };
        delta_net_seq(&d, &w, 1e-6, &x1, 1, &mut c1, &mut s1, &mut o1[2..], &quant::RayonPool).unwrap();
        assert_eq!((&conv, &ssm, &out), (&c1, &s1, &o1));
        assert_eq!(conv, qkv[6..].to_vec(), "the conv state holds the last input of each channel");
        // The first token by hand (state zero: only the last tap sees the input).
        let xc: Vec<f32> = (0..6).map(|c| silu(qkv[c] * w.conv[c * 2 + 1])).collect();
        let l2 = |v: &[f32]| { let n = (v[0] * v[0] + v[1] * v[1]).sqrt(); [v[0] / n, v[1] / n] };
        let (q, k, v) = (l2(&xc[0..2]), l2(&xc[2..4]), [xc[4], xc[5]]);
        let b = sigmoid(0.4);
        // S = 0 → d = β v, S = d kᵀ, o = S q / √2.
        let o: Vec<f32> = (0..2).map(|j| b * v[j] * (k[0] * q[0] + k[1] * q[1]) / 2f32.sqrt()).collect();
        let r = 1.0 / ((o[0] * o[0] + o[1] * o[1]) / 2.0 + 1e-6).sqrt();
        let want = [o[0] * r * silu(0.2), o[1] * r * 2.0 * silu(-0.4)];
        assert!((out[0] - want[0]).abs() < 1e-5 && (out[1] - want[1]).abs() < 1e-5, "{out:?} vs {want:?}");
        let g = (softplus(-0.3 + 0.1) * -0.7f32).exp();
        assert!(g < 1.0 && g > 0.0);
    }

    /// qwen3next's grouped value heads read key head h / (n_v/n_k), qwen35's h mod n_k; a
    /// strided block moves (token, group) runs and leaves the rest of the destination.
    #[test]
    fn grouped_key_heads_and_strided_blocks() {
        let d = DeltaDims { d_conv: 4, n_k_heads: 2, n_v_heads: 6, head_k_dim: 4, head_v_dim: 4, grouped: true };
        assert_eq!((0..6).map(|h| d.key_head(h)).collect::<Vec<_>>(), [0, 0, 0, 1, 1, 1]);
        let t = DeltaDims { grouped: false, ..d };
        assert_eq!((0..6).map(|h| t.key_head(h)).collect::<Vec<_>>(), [0, 1, 0, 1, 0, 1]);
        // Two rows of two groups [a a b b b]: the b runs to a destination of rows of 7 from 1.
        let src: Vec<f32> = (0..20).map(|i| i as f32).collect();
        let s = Strided { n: [2, 2, 3], src_off: 2, src_stride: [10, 5], dst_off: 1, dst_stride: [7, 3] };
        assert_eq!((s.src_end(), s.dst_end()), (20, 14));
        let mut dst = vec![-1f32; 14];
        s.apply(&src, &mut dst);
        assert_eq!(dst, [-1., 2., 3., 4., 7., 8., 9., -1., 12., 13., 14., 17., 18., 19.]);
    }
}
