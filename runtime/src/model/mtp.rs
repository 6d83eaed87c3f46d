//! Multi-token prediction: the extra block a qwen35 / qwen35moe file may carry after its
//! layers (`blk.{n_layer}`, `{arch}.nextn_predict_layers` = 1; llama.cpp's names), which
//! drafts tokens for speculative decoding from the target's own hidden states.
//!
//! The block's row at position `p` takes the token `x_p` and the target's hidden state
//! at `p − 1` after the output norm (`h_{p−1}`, the vector the LM head reads):
//! `c = [enorm(embed(x_p)), hnorm(h_{p−1})]`, `x = eh_proj · c`, then one full-attention
//! decoder block (the trunk's attention layers' shape, its own KV cache), and
//! `g = shared_head_norm(x)` (the output norm where the file has none), whose LM head
//! (`shared_head_head`, else `output`) gives the logits for `x_{p+1}`. Drafting chains
//! it: the next row takes the drafted token and `g` in place of `h`. The row at
//! position 0 has no previous hidden state and takes zeros.
//!
//! [`Model::mtp_catch_up`] runs the block over every chunk the target evaluates (the
//! prompt's, a verify chunk's; [`Model::mtp_catch_up_rows`] over a batched decode step
//! of several sequences), with the target's hidden states, so its cache holds every
//! position the target holds; [`Model::mtp_draft`] runs one drafting row
//! ([`Model::mtp_draft_rows`]: one row of each of several sequences at once). A rejected
//! draft needs no rollback here: the cache rows past the kept tokens are written again
//! before any query reads them, as in the target's cache.

use crate::backend::{Backend, Buf, KvCache, KvSpec, NormIn};
use crate::gguf::GgufFile;
use crate::weights::WeightId;

use super::forward::LayerGeo;
use super::{Config, KvRows, Layer, Model, ModelError, Scratch, OUT_ROWS_MAX};

/// The multi-token-prediction block's weights.
#[derive(Clone, Debug)]
pub struct Mtp {
    /// Its block index in the file (`n_layer`).
    pub index: usize,
    /// The decoder block (attention, never a delta net; dense or experts as the trunk).
    pub layer: Layer,
    /// `nextn.eh_proj` `[2·n_embd → n_embd]`.
    pub eh_proj: WeightId,
    /// `nextn.enorm`, `nextn.hnorm` `[n_embd]`.
    pub enorm: WeightId,
    pub hnorm: WeightId,
    /// `nextn.shared_head_norm`, else the model's `output_norm`.
    pub head_norm: WeightId,
    /// `nextn.shared_head_head`, else the model's LM head.
    pub head: WeightId,
    /// `nextn.embed_tokens`, else `token_embd`.
    pub embed: WeightId,
}

impl Mtp {
    /// The float vectors among its own weights (the block's are the layer's).
    pub fn vectors(&self) -> Vec<WeightId> {
        vec![self.enorm, self.hnorm, self.head_norm]
    }
    /// Its weights besides the decoder block's (some may be the trunk's own).
    pub fn own_weights(&self) -> Vec<WeightId> {
        vec![self.eh_proj, self.enorm, self.hnorm, self.head_norm, self.head, self.embed]
    }
}

/// Resolves the block where the file has one: `{arch}.nextn_predict_layers` ≥ 1 and
/// `blk.{n_layer}.nextn.eh_proj.weight` present (a file that names the key but carries no
/// block loads without it). The first block is the one lode runs.
#[allow(clippy::type_complexity)]
pub(super) fn load(
    file: &GgufFile,
    c: &Config,
    n_vocab: u64,
    output_norm: WeightId,
    output: WeightId,
    tok_embd: WeightId,
    load_layer: &dyn Fn(usize, bool) -> Result<Layer, ModelError>,
    find: &dyn Fn(&str) -> Option<WeightId>,
    get: &dyn Fn(&str, &[u64]) -> Result<WeightId, ModelError>,
) -> Result<Option<Mtp>, ModelError> {
    let key = format!("{}.nextn_predict_layers", c.arch.name());
    if file.get_u64(&key)?.unwrap_or(0) == 0 {
        return Ok(None);
    }
    let l = c.n_layer;
    let n = |s: &str| format!("blk.{l}.nextn.{s}");
    if find(&n("eh_proj.weight")).is_none() {
        return Ok(None);
    }
    let e = c.n_embd as u64;
    let opt = |s: &str, shape: &[u64]| -> Result<Option<WeightId>, ModelError> {
        match find(&n(s)) {
            Some(_) => get(&n(s), shape).map(Some),
            None => Ok(None),
        }
    };
    Ok(Some(Mtp {
        index: l,
        eh_proj: get(&n("eh_proj.weight"), &[2 * e, e])?,
        enorm: get(&n("enorm.weight"), &[e])?,
        hnorm: get(&n("hnorm.weight"), &[e])?,
        head_norm: opt("shared_head_norm.weight", &[e])?.unwrap_or(output_norm),
        head: opt("shared_head_head.weight", &[e, n_vocab])?.unwrap_or(output),
        embed: opt("embed_tokens.weight", &[e, n_vocab])?.unwrap_or(tok_embd),
        layer: load_layer(l, false)?,
    }))
}

/// One sequence's MTP state: the block's KV cache and the target's normed hidden rows of
/// the last chunk it evaluated (whose last row, or the one a rewind kept, feeds the
/// first drafting row).
pub struct MtpState {
    pub kv: KvCache,
    /// `[n_max, n_embd]`: `h` of positions `hid_pos ..hid_pos + hid_len`.
    hid: Buf,
    hid_pos: usize,
    hid_len: usize,
    /// `[n_embd]`: the last drafting row's `g`.
    own: Buf,
}

/// Buffers every sequence's MTP rows share: the hidden input `[n_max, n_embd]`, the
/// concatenation `[n_max, 2·n_embd]` and a row of zeros `[n_embd]` (the hidden input
/// where there is none: copied, so a step writes nothing from the host and stays
/// replayable as a device graph).
pub struct MtpBufs {
    h: Buf,
    cat: Buf,
    zero: Buf,
}

impl MtpState {
    /// The block's cache (one layer of `kv`'s shape, no window) and buffers for chunks
    /// of `n_max` rows.
    pub fn new(be: &mut dyn Backend, model: &Model, kv: &KvSpec, n_max: usize) -> Result<MtpState, ModelError> {
        let e = model.cfg.n_embd;
        let kv = be.alloc_kv(&KvSpec { n_layer: 1, swa: None, ..*kv })?;
        let hid = match be.alloc(n_max * e) {
            Ok(b) => b,
            Err(err) => {
                let _ = be.free_kv(kv);
                return Err(err.into());
            }
        };
        match be.alloc(e) {
            Ok(own) => Ok(MtpState { kv, hid, hid_pos: 0, hid_len: 0, own }),
            Err(err) => {
                let _ = be.free_kv(kv);
                let _ = be.free(hid);
                Err(err.into())
            }
        }
    }

    /// Forgets the target's hidden rows (a batched step or a copied prefix did not keep
    /// them): the next row takes zeros for its `h`.
    pub fn forget_hidden(&mut self) {
        self.hid_len = 0;
    }

    /// After `src`'s first `n` positions were copied into this sequence (the prefix
    /// cache): takes `src`'s hidden row of position `n − 1` where `src` still holds it,
    /// so the next row sees what it would after evaluating the prefix itself; else
    /// forgets (zeros).
    pub fn copy_hidden_from(&mut self, be: &mut dyn Backend, src: &MtpState, n: usize, n_embd: usize) -> Result<(), ModelError> {
        self.hid_len = 0;
        if let Some(q) = n.checked_sub(1).filter(|&q| q >= src.hid_pos && q < src.hid_pos + src.hid_len) {
            be.copy(src.hid, (q - src.hid_pos) * n_embd, self.hid, 0, n_embd)?;
            (self.hid_pos, self.hid_len) = (q, 1);
        }
        Ok(())
    }

    pub fn free(self, be: &mut dyn Backend) -> Result<(), ModelError> {
        be.free_kv(self.kv)?;
        be.free(self.hid)?;
        be.free(self.own)?;
        Ok(())
    }
}

impl MtpBufs {
    pub fn new(be: &mut dyn Backend, model: &Model, n_max: usize) -> Result<MtpBufs, ModelError> {
        let e = model.cfg.n_embd;
        let h = be.alloc(n_max * e)?;
        let cat = match be.alloc(n_max * 2 * e) {
            Ok(cat) => cat,
            Err(err) => {
                let _ = be.free(h);
                return Err(err.into());
            }
        };
        let zero = match be.alloc(e) {
            Ok(z) => z,
            Err(err) => {
                let _ = be.free(h);
                let _ = be.free(cat);
                return Err(err.into());
            }
        };
        if let Err(err) = be.write(zero, &vec![0f32; e]) {
            for b in [h, cat, zero] {
                let _ = be.free(b);
            }
            return Err(err.into());
        }
        Ok(MtpBufs { h, cat, zero })
    }

    pub fn free(self, be: &mut dyn Backend) -> Result<(), ModelError> {
        be.free(self.h)?;
        be.free(self.cat)?;
        be.free(self.zero)?;
        Ok(())
    }
}

impl Model {
    fn mtp_block_of(&self) -> Result<&Mtp, ModelError> {
        self.mtp.as_ref().ok_or_else(|| ModelError::BadConfig("the model has no multi-token-prediction block".into()))
    }

    /// Writes `h_{p−1}` into row 0 of `b.h`: the target's row of position `p − 1` if `st`
    /// still holds it, else zeros (position 0, or a row lost to a batched step).
    fn mtp_prev_hidden(&self, be: &mut dyn Backend, b: &MtpBufs, st: &MtpState, p: usize) -> Result<(), ModelError> {
        let e = self.cfg.n_embd;
        match p.checked_sub(1) {
            Some(q) if q >= st.hid_pos && q < st.hid_pos + st.hid_len => be.copy(st.hid, (q - st.hid_pos) * e, b.h, 0, e)?,
            _ => be.copy(b.zero, 0, b.h, 0, e)?,
        }
        Ok(())
    }

    /// After the target evaluated `tokens` at `pos` (one chunk; its final residual rows
    /// still in `s.x`): keeps their normed hidden rows and runs the block over the chunk
    /// (row `t` pairs `tokens[t]` with the hidden state before it), filling its cache at
    /// the same positions. No logits.
    pub fn mtp_catch_up(&self, be: &mut dyn Backend, s: &Scratch, b: &MtpBufs, st: &mut MtpState, tokens: &[u32], pos: &[u32]) -> Result<(), ModelError> {
        let (c, n) = (&self.cfg, tokens.len());
        let e = c.n_embd;
        if n == 0 || n > s.n_max || pos.len() != n {
            return Err(ModelError::BadConfig(format!("mtp_catch_up: {n} tokens, {} positions, chunk limit {}", pos.len(), s.n_max)));
        }
        self.mtp_prev_hidden(be, b, st, pos[0] as usize)?;
        be.rms_norm(s.x, st.hid, n, e, Some(&self.w(self.output_norm)), c.eps)?;
        (st.hid_pos, st.hid_len) = (pos[0] as usize, n);
        if n > 1 {
            be.copy(st.hid, 0, b.h, e, (n - 1) * e)?;
        }
        let pending = self.mtp_block(be, s, b, KvRows::One(st.kv), tokens, pos)?;
        if pending {
            be.add(s.x, s.xb2, s.x, n * e)?;
        }
        Ok(())
    }

    /// [`Self::mtp_catch_up`] after a batched decode step of several sequences: row `i`
    /// (`tokens[i]` at `pos[i]`, its residual in `s.x`) is the next token of the sequence
    /// whose block state is `states[i]`. Each keeps its own normed hidden row, and the
    /// block runs over every row at once, each into its own cache.
    pub fn mtp_catch_up_rows(&self, be: &mut dyn Backend, s: &Scratch, b: &MtpBufs, states: &mut [&mut MtpState], tokens: &[u32], pos: &[u32]) -> Result<(), ModelError> {
        let (c, n) = (&self.cfg, tokens.len());
        let e = c.n_embd;
        if n == 0 || n > s.n_max || pos.len() != n || states.len() != n {
            return Err(ModelError::BadConfig(format!("mtp_catch_up_rows: {n} tokens, {} positions, {} states, chunk limit {}", pos.len(), states.len(), s.n_max)));
        }
        let firsts = vec![true; n];
        self.mtp_inputs(be, b, states, pos, &firsts)?;
        // The rows' normed hidden states (through `b.cat`, free until the block joins).
        be.rms_norm(s.x, b.cat, n, e, Some(&self.w(self.output_norm)), c.eps)?;
        for (i, st) in states.iter_mut().enumerate() {
            be.copy(b.cat, i * e, st.hid, 0, e)?;
            (st.hid_pos, st.hid_len) = (pos[i] as usize, 1);
        }
        let caches: Vec<KvCache> = states.iter().map(|st| st.kv).collect();
        self.mtp_block(be, s, b, KvRows::PerRow(&caches), tokens, pos)?;
        Ok(())
    }

    /// Row `i` of `b.h`: `states[i]`'s hidden input for position `pos[i]`: the target's
    /// row before it where the state still holds it (`first[i]`), else zeros; or the
    /// state's last drafting row's `g` (not `first[i]`).
    fn mtp_inputs(&self, be: &mut dyn Backend, b: &MtpBufs, states: &[&mut MtpState], pos: &[u32], first: &[bool]) -> Result<(), ModelError> {
        let e = self.cfg.n_embd;
        for (i, st) in states.iter().enumerate() {
            let held = (pos[i] as usize).checked_sub(1).filter(|&q| q >= st.hid_pos && q < st.hid_pos + st.hid_len);
            match (first[i], held) {
                (false, _) => be.copy(st.own, 0, b.h, i * e, e)?,
                (true, Some(q)) => be.copy(st.hid, (q - st.hid_pos) * e, b.h, i * e, e)?,
                (true, None) => be.copy(b.zero, 0, b.h, i * e, e)?,
            }
        }
        Ok(())
    }

    /// [`Self::mtp_draft`] for several sequences at once (`lode serve`'s slots drafting
    /// together): row `i` is `toks[i]` at `pos[i]` for the sequence whose block state is
    /// `states[i]`, `first[i]` as `mtp_draft`'s `first`. One pass of the block and one
    /// LM head read (per [`OUT_ROWS_MAX`] rows) for all of them; returns each row's
    /// logits and keeps each row's `g` in its state.
    #[allow(clippy::too_many_arguments)]
    pub fn mtp_draft_rows(&self, be: &mut dyn Backend, s: &Scratch, b: &MtpBufs, states: &mut [&mut MtpState], toks: &[u32], pos: &[u32], first: &[bool]) -> Result<Vec<Vec<f32>>, ModelError> {
        let m = self.mtp_block_of()?;
        let (c, n, e) = (&self.cfg, toks.len(), self.cfg.n_embd);
        if n == 0 || n > s.n_max || pos.len() != n || states.len() != n || first.len() != n {
            return Err(ModelError::BadConfig(format!("mtp_draft_rows: {n} tokens, {} positions, {} states, chunk limit {}", pos.len(), states.len(), s.n_max)));
        }
        self.mtp_inputs(be, b, states, pos, first)?;
        let caches: Vec<KvCache> = states.iter().map(|st| st.kv).collect();
        let pending = self.mtp_block(be, s, b, KvRows::PerRow(&caches), toks, pos)?;
        // Every row's `g` (through `b.cat`), kept for its next row.
        let hn = self.w(m.head_norm);
        crate::backend::norm_in(be, &NormIn { x: s.x, add: pending.then_some(s.xb2), out: b.cat, row_len: e, w: Some(&hn), eps: c.eps }, n)?;
        for (i, st) in states.iter_mut().enumerate() {
            be.copy(b.cat, i * e, st.own, 0, e)?;
        }
        let (head, v) = (self.w(m.head), c.n_vocab);
        let mut out = Vec::with_capacity(n);
        let mut host = s.host.borrow_mut();
        host.resize(OUT_ROWS_MAX.min(n) * v, 0.0);
        for r0 in (0..n).step_by(OUT_ROWS_MAX) {
            let k = OUT_ROWS_MAX.min(n - r0);
            be.copy(b.cat, r0 * e, s.out_x, 0, k * e)?;
            be.matmul(&head, s.out_x, k, s.logits)?;
            be.read(s.logits, &mut host[..k * v])?;
            out.extend(host[..k * v].chunks_exact(v).map(<[f32]>::to_vec));
        }
        Ok(out)
    }

    /// One drafting row: `tok` at `pos`, with the target's hidden state before it
    /// (`first`: `tok` follows the cached tokens) or the previous row's `g`; returns the
    /// logits for the token after `tok` and keeps this row's `g` for the next.
    #[allow(clippy::too_many_arguments)]
    pub fn mtp_draft(&self, be: &mut dyn Backend, s: &Scratch, b: &MtpBufs, st: &mut MtpState, tok: u32, pos: u32, first: bool) -> Result<Vec<f32>, ModelError> {
        let m = self.mtp_block_of()?;
        let (c, e) = (&self.cfg, self.cfg.n_embd);
        if first {
            self.mtp_prev_hidden(be, b, st, pos as usize)?;
        } else {
            be.copy(st.own, 0, b.h, 0, e)?;
        }
        let pending = self.mtp_block(be, s, b, KvRows::One(st.kv), &[tok], &[pos])?;
        let (hn, head) = (self.w(m.head_norm), self.w(m.head));
        let norm = NormIn { x: s.x, add: pending.then_some(s.xb2), out: st.own, row_len: e, w: Some(&hn), eps: c.eps };
        be.norm_matmul_multi(&norm, 1, &[(&head, s.logits)])?;
        let mut out = Vec::new();
        let mut host = s.host.borrow_mut();
        be.read_with(s.logits, c.n_vocab, &mut host, &mut |l| out = l.to_vec())?;
        Ok(out)
    }

    /// The block over `tokens` at `pos`, its hidden inputs in `b.h`: the embedding and
    /// hidden norms, their concatenation, `eh_proj` into `s.x`, the decoder block. Returns
    /// whether `s.xb2` is still to be added to `s.x`.
    #[allow(clippy::too_many_arguments)]
    fn mtp_block(&self, be: &mut dyn Backend, s: &Scratch, b: &MtpBufs, kv: KvRows<'_>, tokens: &[u32], pos: &[u32]) -> Result<bool, ModelError> {
        let m = self.mtp_block_of()?;
        let (c, n, e) = (&self.cfg, tokens.len(), self.cfg.n_embd);
        be.get_rows(&self.w(m.embed), tokens, s.xb)?;
        be.rms_norm(s.xb, s.xb, n, e, Some(&self.w(m.enorm)), c.eps)?;
        be.rms_norm(b.h, b.h, n, e, Some(&self.w(m.hnorm)), c.eps)?;
        be.join_halves(s.xb, b.h, n, e, b.cat)?;
        be.matmul(&self.w(m.eh_proj), b.cat, n, s.x)?;
        let attn_norm = self.w(m.layer.attn_norm);
        let norm = NormIn { x: s.x, add: None, out: s.xb, row_len: e, w: Some(&attn_norm), eps: c.eps };
        let geo = LayerGeo { rope: (c.rope_base, c.rope_freq_scale), window: None, kv_slot: 0, heads: c.heads(c.n_layer) };
        let attn_add = self.attention_block(be, s, &norm, &m.layer, geo, kv, pos, n)?;
        self.ffn_block(be, m.index, &m.layer, attn_add, n, s)
    }
}
