//! The forward pass of every architecture, as one sequence of backend ops
//! (reference §5). Architecture differences are data in [`Config`] and optional
//! weights in [`Layer`], not branches on the architecture name.

use crate::backend::kv_rot::KvRot;
use crate::backend::{norm_in, Attention, Backend, Buf, KvCache, KvTypes, MoeBiases, MoeFfn, MoeScratch, NormIn, QkvPrep, Rope};

use super::gemma4::HeadGeo;

use super::hybrid::{HybridScratch, RecurrentState};
use super::{Model, ModelError};

/// Rows of the LM head computed at once when every position's logits are wanted
/// (bounds the logits buffer: 16 × 262,144 × 4 B = 16 MiB for Gemma 3). (Measured at 32:
/// a 32-sequence step then replayed as graphs, but its speed did not rise; BENCHMARKS.)
pub const OUT_ROWS_MAX: usize = 16;

/// Where a chunk's rows keep their K/V: one sequence's cache for every row (prompt
/// chunks, single-sequence decode), or one cache per row — a batched decode step in which
/// row `t` is the next token of the sequence whose cache is `caches[t]` (continuous
/// batching: the weights are read once for all sequences, attention stays per sequence).
///
/// `Mixed` is a decode step carrying a prompt chunk (chunked prefill): rows
/// `0..n_chunk` are the next prompt tokens of the sequence whose cache is `chunk`, at
/// consecutive positions; row `n_chunk + i` is the next token of the sequence whose cache
/// is `rows[i]`. `tmp` (`[q, k, v, att]`, at least `rows.len()` rows each) is where the
/// per-row rows move for their attention (the chunk's runs at row 0, as a prompt chunk's).
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    One(KvCache),
    PerRow(&'a [KvCache]),
    Mixed { chunk: KvCache, n_chunk: usize, rows: &'a [KvCache], tmp: [Buf; 4] },
}

/// Where an attention layer sits: its RoPE base and frequency scale, its window (`None`:
/// full context) and its layer index in the KV cache.
#[derive(Clone, Copy, Debug)]
pub(super) struct LayerGeo {
    pub rope: (f32, f32),
    pub window: Option<usize>,
    pub kv_slot: usize,
    /// The layer's heads ([`super::Config::heads`]).
    pub heads: HeadGeo,
}

/// Which positions of a chunk need logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputRows {
    None,
    Last,
    All,
    /// Every position's last hidden state after the output norm (`[n_embd]`, no LM
    /// head): what embeddings pool.
    Hidden,
    /// The last `k` rows (a mixed step: its decode rows, and the prompt chunk's last row
    /// when the chunk ends the prompt).
    Tail(usize),
}

/// Activation buffers for chunks of up to `n_max` tokens, owned by the backend.
pub struct Scratch {
    pub n_max: usize,
    pub(super) x: Buf,      // [n, n_embd] residual stream
    pub(super) xb: Buf,     // [n, n_embd]
    pub(super) xb2: Buf,    // [n, n_embd]
    q: Buf,      // [n, n_head * head_dim_k]
    k: Buf,      // [n, n_head_kv * head_dim_k]
    v: Buf,      // [n, n_head_kv * head_dim_v]
    att: Buf,    // [n, n_head * head_dim_v]
    pub(super) hb: Buf,     // [n, n_ff]
    pub(super) hb2: Buf,    // [n, n_ff]
    /// The mixture-of-experts op's working space (MoE models only).
    moe: Option<MoeScratch>,
    /// qwen35's gated attention and delta net buffers.
    hybrid: Option<HybridScratch>,
    /// gemma4's experts' and router's inputs (`[n, n_embd]` each; MoE members only).
    g4: Option<[Buf; 2]>,
    pub(super) out_x: Buf,  // [OUT_ROWS_MAX, n_embd]
    pub(super) logits: Buf, // [OUT_ROWS_MAX, n_vocab]
    /// The quantized KV cache's rotation ([`KvRot`]): q/k/v rotated before the cache, the
    /// attention output rotated back.
    kv_rot: KvRot,
    /// The cache's element types (a layer's rotation follows its own heads).
    kv_ty: KvTypes,
    /// Host copy of `logits`, kept between calls (a fresh 1 MiB per decode step showed
    /// in profiles). [≤ OUT_ROWS_MAX, n_vocab] f32
    pub(super) host: std::cell::RefCell<Vec<f32>>,
}

impl Scratch {
    /// The delta net's buffers `[qkv, z, beta, alpha, core]` (models with recurrent
    /// layers), free between forward chunks: what a rewind replays through.
    pub fn delta_bufs(&self) -> Option<[Buf; 5]> {
        self.hybrid.as_ref().and_then(|h| h.delta)
    }

    /// Buffers for chunks of up to `n_max` rows over caches of types `kv`.
    pub fn new(be: &mut dyn Backend, model: &Model, n_max: usize, kv: KvTypes) -> Result<Scratch, ModelError> {
        let c = &model.cfg;
        let n = n_max.max(1);
        // A MoE model has no dense FFN: its gate/up rows live in `moe`.
        let n_ff = if c.experts.is_some() && !c.dense_with_experts { 1 } else { c.n_ff };
        let (wq, wk, wv, wo) = c.max_widths();
        let moe = match c.experts {
            Some(x) => Some(MoeScratch::new(be, n, c.n_embd, x.n_expert, x.n_ff, x.n_used)?),
            None => None,
        };
        Ok(Scratch {
            n_max: n,
            x: be.alloc(n * c.n_embd)?,
            xb: be.alloc(n * c.n_embd)?,
            xb2: be.alloc(n * c.n_embd)?,
            q: be.alloc(n * wq)?,
            k: be.alloc(n * wk)?,
            v: be.alloc(n * wv)?,
            att: be.alloc(n * wo)?,
            hb: be.alloc(n * n_ff)?,
            hb2: be.alloc(n * n_ff)?,
            moe,
            hybrid: HybridScratch::new(be, model, n)?,
            g4: if c.experts.is_some() && c.dense_with_experts { Some([be.alloc(n * c.n_embd)?, be.alloc(n * c.n_embd)?]) } else { None },
            out_x: be.alloc(OUT_ROWS_MAX * c.n_embd)?,
            logits: be.alloc_readback(OUT_ROWS_MAX * c.n_vocab)?,
            kv_rot: KvRot::for_cache(kv, c.head_dim_k, c.head_dim_v),
            kv_ty: kv,
            host: Default::default(),
        })
    }

    /// Returns the buffers to the backend.
    pub fn free(self, be: &mut dyn Backend) -> Result<(), ModelError> {
        for b in [
            self.x, self.xb, self.xb2, self.q, self.k, self.v, self.att, self.hb, self.hb2, self.out_x,
            self.logits,
        ]
        .into_iter()
        .chain(self.moe.iter().flat_map(|m| m.bufs()))
        .chain(self.hybrid.iter().flat_map(|h| h.bufs()))
        .chain(self.g4.into_iter().flatten())
        {
            be.free(b)?;
        }
        Ok(())
    }
}

impl Model {
    /// Runs `tokens` (at positions `pos`, one chunk of at most `s.n_max`) through the
    /// model, writing their K/V into `kv` (per row for a batched step) and advancing the
    /// recurrent `states` (qwen35; one per sequence as `kv`, empty for other models), and hands the logits of the requested rows to
    /// `on_logits(row_in_chunk, logits)` (`[n_vocab]` f32; with [`OutputRows::Hidden`], the
    /// normed hidden state `[n_embd]` instead).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        be: &mut dyn Backend,
        s: &Scratch,
        kv: KvRows<'_>,
        states: &[&RecurrentState],
        tokens: &[u32],
        pos: &[u32],
        rows: OutputRows,
        on_logits: &mut dyn FnMut(usize, &[f32]),
    ) -> Result<(), ModelError> {
        let c = &self.cfg;
        let n = tokens.len();
        let per_row_ok = match kv {
            KvRows::One(_) => true,
            KvRows::PerRow(caches) => caches.len() == n,
            KvRows::Mixed { n_chunk, rows, .. } => n_chunk >= 1 && n_chunk + rows.len() == n,
        };
        let n_states = match kv {
            KvRows::One(_) => 1,
            KvRows::PerRow(caches) => caches.len(),
            // The delta net takes one sequence's rows or one row per sequence, not both.
            KvRows::Mixed { .. } => usize::MAX,
        };
        let states_ok = if c.recurrent.is_some() { states.len() == n_states } else { states.is_empty() };
        if n == 0 || n > s.n_max || pos.len() != n || !per_row_ok || !states_ok {
            return Err(ModelError::BadConfig(format!(
                "forward: {n} tokens, {} positions, chunk limit {}, {kv:?}, {} recurrent states",
                pos.len(),
                s.n_max,
                states.len()
            )));
        }
        let e = c.n_embd;

        be.get_rows(&self.w(self.tok_embd), tokens, s.x)?;
        if let Some(sc) = c.embd_scale {
            be.scale(s.x, n * e, sc)?;
        }
        // The FFN output of the previous layer is added to the residual together with
        // the next norm (one fused op on backends that have it).
        let mut pending_add = false;
        for (l, ly) in self.layers.iter().enumerate() {
            // Attention block (or the gated delta net of a recurrent layer).
            let attn_norm = self.w(ly.attn_norm);
            let norm = NormIn { x: s.x, add: pending_add.then_some(s.xb2), out: s.xb, row_len: e, w: Some(&attn_norm), eps: c.eps };
            let attn_add = match (&ly.delta, &s.hybrid) {
                (Some(dw), Some(hs)) => {
                    let core = self.delta_block(be, &norm, n, l, dw, hs, states)?;
                    self.project(be, dw.out, ly.post_attn_norm, core, n, s)?
                }
                _ => {
                    // The cache holds the attention layers only.
                    let geo = LayerGeo { rope: c.rope_for_layer(l), window: c.swa_layers[l].then_some(c.n_swa), kv_slot: c.kv_slot(l), heads: c.heads(l) };
                    self.attention_block(be, s, &norm, ly, geo, kv, pos, n)?
                }
            };
            pending_add = self.ffn_block(be, l, ly, attn_add, n, s)?;
            // gemma4: the layer's output (residual included) times its scale.
            if let Some(sc) = ly.out_scale {
                if pending_add {
                    be.add(s.x, s.xb2, s.x, n * e)?;
                    pending_add = false;
                }
                be.scale(s.x, n * e, sc)?;
            }
        }
        let (norm, head) = (self.w(self.output_norm), self.w(self.output));
        if n == 1 && matches!(rows, OutputRows::Last | OutputRows::All | OutputRows::Tail(1..)) {
            // One token (decode): the last residual add, the output norm and the LM head
            // as one fused op (one launch on the GPU instead of four).
            let out_norm = NormIn { x: s.x, add: pending_add.then_some(s.xb2), out: s.xb, row_len: e, w: Some(&norm), eps: c.eps };
            be.norm_matmul_multi(&out_norm, 1, &[(&head, s.logits)])?;
            let mut host = s.host.borrow_mut();
            match c.logit_softcap {
                Some(cap) => {
                    let mut row = Vec::new();
                    be.read_with(s.logits, c.n_vocab, &mut host, &mut |l| row = l.to_vec())?;
                    super::gemma4::softcap(&mut row, cap);
                    on_logits(0, &row);
                }
                None => be.read_with(s.logits, c.n_vocab, &mut host, &mut |l| on_logits(0, l))?,
            }
            return Ok(());
        }
        if pending_add {
            be.add(s.x, s.xb2, s.x, n * e)?;
        }

        let first = match rows {
            OutputRows::None | OutputRows::Tail(0) => return Ok(()),
            OutputRows::Last => n - 1,
            OutputRows::Tail(k) => n.saturating_sub(k),
            OutputRows::All | OutputRows::Hidden => 0,
        };
        let mut host = s.host.borrow_mut();
        if rows == OutputRows::Hidden {
            host.resize(OUT_ROWS_MAX.min(n) * e, 0.0);
            for r0 in (0..n).step_by(OUT_ROWS_MAX) {
                let m = OUT_ROWS_MAX.min(n - r0);
                be.copy(s.x, r0 * e, s.out_x, 0, m * e)?;
                be.rms_norm(s.out_x, s.out_x, m, e, Some(&norm), c.eps)?;
                be.read(s.out_x, &mut host[..m * e])?;
                for (i, row) in host[..m * e].chunks_exact(e).enumerate() {
                    on_logits(r0 + i, row);
                }
            }
            return Ok(());
        }
        let mut r0 = first;
        while r0 < n {
            let m = OUT_ROWS_MAX.min(n - r0);
            be.copy(s.x, r0 * e, s.out_x, 0, m * e)?;
            be.rms_norm(s.out_x, s.out_x, m, e, Some(&norm), c.eps)?;
            be.matmul(&head, s.out_x, m, s.logits)?;
            // Lent rows (the GPU's page-locked read buffer): no host copy of m × n_vocab,
            // except where gemma4's soft-cap rewrites them.
            let mut capped: Vec<f32> = Vec::new();
            be.read_with(s.logits, m * c.n_vocab, &mut host, &mut |l| {
                let l = match c.logit_softcap {
                    Some(cap) => {
                        capped.clear();
                        capped.extend_from_slice(l);
                        super::gemma4::softcap(&mut capped, cap);
                        &capped[..]
                    }
                    None => l,
                };
                for (i, row) in l.chunks_exact(c.n_vocab).enumerate() {
                    on_logits(r0 + i, row);
                }
            })?;
            r0 += m;
        }
        Ok(())
    }

    /// A softmax-attention block (its norm `norm`, q/k/v, the q/k norms, RoPE, the K/V
    /// store, attention, qwen35's output gate and the output projection) of `n` rows at
    /// `pos`, its residual left as [`Model::project`] leaves it. Returns whether `s.xb2`
    /// is still to be added.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn attention_block(
        &self,
        be: &mut dyn Backend,
        s: &Scratch,
        norm: &NormIn,
        ly: &super::Layer,
        geo: LayerGeo,
        kv: KvRows<'_>,
        pos: &[u32],
        n: usize,
    ) -> Result<bool, ModelError> {
        let c = &self.cfg;
        let Some(aw) = &ly.attn else {
            return Err(ModelError::BadConfig("a layer has neither attention nor a delta net".into()));
        };
        let hs = &s.hybrid;
        let h = geo.heads;
        // gemma4's proportional RoPE factors are the full-attention layers' alone.
        let rope_freqs = self.rope_freqs.filter(|_| !(c.rope_freqs_global_only && geo.window.is_some())).map(|id| self.w(id));
        let (wq, wk, wv) = (self.w(aw.wq), self.w(aw.wk), self.w(aw.wv));
        // A gated attention's q projection holds each head's query then its gate.
        let gated = match hs {
            Some(h) if c.attn_out_gate => Some(h),
            _ => None,
        };
        let q_dst = gated.map_or(s.q, |h| h.qg);
        if aw.v_from_k {
            // gemma4: V is K's projection, before K's norm and RoPE.
            be.norm_matmul_multi(&norm, n, &[(&wq, q_dst), (&wk, s.k)])?;
            be.copy(s.k, 0, s.v, 0, n * h.n_head_kv * h.head_dim_k)?;
        } else {
            be.norm_matmul_multi(&norm, n, &[(&wq, q_dst), (&wk, s.k), (&wv, s.v)])?;
        }
        if c.v_norm {
            be.rms_norm(s.v, s.v, n * h.n_head_kv, h.head_dim_v, None, c.eps)?;
        }
        if let Some(g) = gated {
            be.split_halves(g.qg, n * c.n_head, h.head_dim_k, s.q, g.gate)?;
        }
        for (b, dst) in [(aw.bq, s.q), (aw.bk, s.k), (aw.bv, s.v)] {
            if let Some(b) = b {
                be.add_bias(dst, n, &self.w(b))?;
            }
        }
        let (base, scale) = geo.rope;
        let rope = Rope {
            mode: c.rope_mode,
            n_rot: h.n_rot,
            freq_base: base,
            freq_scale: scale,
            freq_factors: rope_freqs,
            yarn: c.yarn,
        };
        let prep = QkvPrep {
            n_head: c.n_head,
            n_kv_head: h.n_head_kv,
            head_dim: h.head_dim_k,
            q_norm: aw.q_norm.map(|id| self.w(id)),
            k_norm: aw.k_norm.map(|id| self.w(id)),
            eps: c.eps,
            rope,
            q_scale: c.q_scale,
        };
        let attn = Attention {
            n_head: c.n_head,
            n_kv_head: h.n_head_kv,
            head_dim_k: h.head_dim_k,
            head_dim_v: h.head_dim_v,
            scale: c.attn_scale,
            window: geo.window,
            sinks: aw.sinks.map(|id| self.w(id)),
        };
        let kl = geo.kv_slot;
        let rot = if h.head_dim_k == c.head_dim_k && h.head_dim_v == c.head_dim_v { s.kv_rot } else { KvRot::for_cache(s.kv_ty, h.head_dim_k, h.head_dim_v) };
        match kv {
            // One cache: q/k norms, RoPE, the K/V store and attention in one (fused) op.
            KvRows::One(cache) if !rot.any() => be.rope_kv_attention(s.q, s.k, s.v, cache, kl, pos, &prep, &attn, s.att)?,
            // A rotated (quantized) cache: the rotations between RoPE and the store.
            KvRows::One(cache) => {
                crate::backend::prepare_qk(be, &prep, s.q, s.k, pos)?;
                rotate_qkv(be, c, h, rot, n, s)?;
                be.kv_write(cache, kl, s.k, s.v, pos)?;
                be.attention(s.q, cache, kl, pos, &attn, s.att)?;
            }
            // Per-row caches: the K/V store happens in `attention_rows`.
            KvRows::PerRow(caches) => {
                crate::backend::prepare_qk(be, &prep, s.q, s.k, pos)?;
                rotate_qkv(be, c, h, rot, n, s)?;
                be.attention_rows(s.q, s.k, s.v, caches, kl, pos, &attn, s.att)?;
            }
            // A prompt chunk (rows from 0, one cache) and decode rows (moved to `tmp`).
            KvRows::Mixed { chunk, n_chunk: m, rows, tmp: [tq, tk, tv, ta] } => {
                crate::backend::prepare_qk(be, &prep, s.q, s.k, pos)?;
                rotate_qkv(be, c, h, rot, n, s)?;
                be.kv_write(chunk, kl, s.k, s.v, &pos[..m])?;
                be.attention(s.q, chunk, kl, &pos[..m], &attn, s.att)?;
                let d = rows.len();
                let (qd, kd) = (c.n_head * c.head_dim_k, c.n_head_kv * c.head_dim_k);
                let (vd, ad) = (c.n_head_kv * c.head_dim_v, c.n_head * c.head_dim_v);
                be.copy(s.q, m * qd, tq, 0, d * qd)?;
                be.copy(s.k, m * kd, tk, 0, d * kd)?;
                be.copy(s.v, m * vd, tv, 0, d * vd)?;
                be.attention_rows(tq, tk, tv, rows, kl, &pos[m..], &attn, ta)?;
                be.copy(ta, 0, s.att, m * ad, d * ad)?;
            }
        }
        if let Some(b) = rot.v {
            be.hadamard(s.att, n * c.n_head * h.head_dim_v, b)?;
        }
        if let Some(g) = gated {
            be.mul_sigmoid(s.att, g.gate, n, c.n_head * h.head_dim_v, false)?;
        }
        Ok(match aw.bo {
            // gpt-oss: the output projection's bias, added before the residual.
            Some(bo) => {
                be.matmul(&self.w(aw.wo), s.att, n, s.xb2)?;
                be.add_bias(s.xb2, n, &self.w(bo))?;
                true
            }
            None => self.project(be, aw.wo, ly.post_attn_norm, s.att, n, s)?,
        })
    }

    /// The feed-forward block of layer `l` (after its attention or delta net, whose output
    /// `s.xb2` is still to be added when `attn_add`). Returns whether `s.xb2` (the FFN's
    /// output) is still to be added (by the next norm).
    pub(super) fn ffn_block(&self, be: &mut dyn Backend, l: usize, ly: &super::Layer, attn_add: bool, n: usize, s: &Scratch) -> Result<bool, ModelError> {
        let (c, e) = (&self.cfg, self.cfg.n_embd);
        let ffn_norm = self.w(ly.ffn_norm);
        let norm = NormIn { x: s.x, add: attn_add.then_some(s.xb2), out: s.xb, row_len: e, w: Some(&ffn_norm), eps: c.eps };
        if let (Some(x), Some(bufs), Some(moe)) = (&ly.par_experts, s.g4, &s.moe) {
            return self.par_experts_ffn(be, ly, x, attn_add, n, s, bufs, moe);
        }
        let (gate, up) = (self.w(ly.gate), self.w(ly.up));
        match ly.router {
            Some(r) => {
                // Routed experts: their weighted sum goes to `s.xb2`, added by the next norm.
                let (Some(x), Some(tmp)) = (c.experts, &s.moe) else {
                    return Err(ModelError::BadConfig(format!("layer {l} has a router but the model has no experts")));
                };
                norm_in(be, &norm, n)?;
                let (router, down) = (self.w(r), self.w(ly.down));
                let bw = ly.moe_bias.map(|ids| ids.map(|id| self.w(id)));
                let biases = bw.as_ref().map(|[router, gate, up, down]| MoeBiases { router, gate, up, down });
                let p = MoeFfn {
                    router: &router,
                    gate: &gate,
                    up: &up,
                    down: &down,
                    n_used: x.n_used,
                    norm_top_k: x.norm_top_k,
                    act: c.act,
                    gating: x.gating,
                    biases,
                    swiglu_oai: x.swiglu_oai,
                    router_x: None,
                    expert_scale: None,
                    gate_up_fused: false,
                };
                be.moe_ffn(s.xb, n, &p, s.xb2, tmp)?;
                if let (Some(sh), Some(hs)) = (&ly.shared, &s.hybrid) {
                    self.shared_expert(be, sh, hs, s.xb, n, s.xb2)?;
                }
                if let Some(pn) = ly.post_ffw_norm {
                    be.rms_norm(s.xb2, s.xb2, n, e, Some(&self.w(pn)), c.eps)?;
                }
                Ok(true)
            }
            None => {
                be.norm_matmul_glu(&norm, n, &gate, &up, s.hb, s.hb2, c.act)?;
                self.project(be, ly.down, ly.post_ffw_norm, s.hb, n, s)
            }
        }
    }

    /// The projection closing a block (`w` of `input`) on its way into the residual `s.x`:
    /// with a post-norm (Gemma) the product goes to `s.xb2` and is normed there; without,
    /// the backend may add it to `s.x` itself. Returns whether `s.xb2` still has to be
    /// added (by the next norm).
    fn project(&self, be: &mut dyn Backend, w: super::WeightId, post_norm: Option<super::WeightId>, input: Buf, n: usize, s: &Scratch) -> Result<bool, ModelError> {
        let w = self.w(w);
        let Some(pn) = post_norm else {
            return Ok(!be.matmul_residual(&w, input, n, s.x, s.xb2)?);
        };
        be.matmul(&w, input, n, s.xb2)?;
        be.rms_norm(s.xb2, s.xb2, n, self.cfg.n_embd, Some(&self.w(pn)), self.cfg.eps)?;
        Ok(true)
    }
}

/// A quantized cache's rotations of `n` rows before the store: q and k (K quantized), v
/// (V quantized).
fn rotate_qkv(be: &mut dyn Backend, c: &super::Config, h: HeadGeo, rot: KvRot, n: usize, s: &Scratch) -> Result<(), ModelError> {
    if let Some(b) = rot.k {
        be.hadamard(s.q, n * c.n_head * h.head_dim_k, b)?;
        be.hadamard(s.k, n * h.n_head_kv * h.head_dim_k, b)?;
    }
    if let Some(b) = rot.v {
        be.hadamard(s.v, n * h.n_head_kv * h.head_dim_v, b)?;
    }
    Ok(())
}
