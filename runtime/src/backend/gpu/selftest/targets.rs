//! The two [`Target`]s: the GPU under test ([`GpuTarget`]: uploads inputs, poisons
//! outputs, launches through `ops`, reads back) and the CPU reference kernels
//! ([`HostTarget`]: `quant::matmul` / `quant::dequantize`, which `cargo test` checks).

use crate::backend::gpu::family::{attention, elementwise, matvec, norm_rope, quantize};
use crate::backend::gpu::launch::ActFmt;
use super::{Elt, Out, RopeKvOut, Target};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::DeviceBuffer;
use crate::backend::gpu::{GpuError};
use crate::quant::{self, GgmlType};

/// The GPU under test: uploads inputs, poisons outputs, launches, reads back.
pub struct GpuTarget<'a>(pub &'a GpuDevice);

impl GpuTarget<'_> {
    fn out_buf(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let b = self.0.alloc(bytes)?;
        self.0.poison(&b)?;
        Ok(b)
    }
    /// A buffer's bytes, read back.
    fn bytes(&self, b: &DeviceBuffer) -> Result<Vec<u8>, GpuError> {
        let mut v = vec![0u8; b.len()];
        self.0.read(b.ptr(), &mut v)?;
        Ok(v)
    }
    /// A matvec launch's weights uploaded and its outputs poisoned: the buffers (weight,
    /// output, rows) and the launchers' segments (w, type, rows, y).
    #[allow(clippy::type_complexity)]
    fn mv_segments(&self, ws: &[(&[u8], GgmlType, usize)]) -> Result<(Vec<(DeviceBuffer, DeviceBuffer, usize)>, Vec<(u64, GgmlType, usize, u64)>), GpuError> {
        let mut bufs = Vec::new();
        let mut segs = Vec::new();
        for &(w, ty, rows) in ws {
            let wb = self.0.upload(w)?;
            let yb = self.out_buf(rows * 4)?;
            segs.push((wb.ptr(), ty, rows, yb.ptr()));
            bufs.push((wb, yb, rows));
        }
        Ok((bufs, segs))
    }
    /// The outputs of [`Self::mv_segments`]' buffers, read back.
    fn mv_outputs(&self, bufs: &[(DeviceBuffer, DeviceBuffer, usize)]) -> Result<Vec<Vec<f32>>, GpuError> {
        bufs.iter().map(|(_, yb, rows)| self.0.read_f32(yb.ptr(), *rows)).collect::<Result<_, _>>().map_err(Into::into)
    }
    /// An optional f32 input (norm weights, frequency factors) uploaded when present.
    fn upload_opt(&self, x: Option<&[f32]>) -> Result<Option<DeviceBuffer>, GpuError> {
        Ok(x.map(|x| self.0.upload_f32(x)).transpose()?)
    }
}

impl Target for GpuTarget<'_> {
    fn label(&self) -> String {
        let i = self.0.info();
        format!("{} {} ({})", self.0.api(), i.name, i.arch)
    }
    fn matvec(&self, w: &[u8], ty: GgmlType, rows: usize, k: usize, x: &[f32], ncols: usize) -> Out<(Vec<f32>, Option<Vec<u8>>)> {
        let d = self.0;
        let wb = d.upload(w)?;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(ncols * rows * 4)?;
        let q8 = if let Some(fmt) = quantize::act_fmt(ty) {
            let qb = self.out_buf(quantize::q8_1_bytes(k, ncols))?;
            quantize::quantize_act(d, fmt, xb.ptr(), qb.ptr(), k, ncols)?;
            matvec::matvec(d, wb.ptr(), ty, rows, k, qb.ptr(), yb.ptr(), ncols)?;
            let q = self.bytes(&qb)?;
            Some(q)
        } else {
            // Float weights over 2+ columns take the tiled kernel, as `plan::matmul` chooses.
            let mv = if ncols >= 2 && matvec::float_tile_supports(ty) { matvec::float_tile } else { matvec::matvec };
            mv(d, wb.ptr(), ty, rows, k, xb.ptr(), yb.ptr(), ncols)?;
            None
        };
        Ok(Some((d.read_f32(yb.ptr(), ncols * rows)?, q8)))
    }
    fn quantize_q8_1(&self, x: &[f32], rows: usize, k: usize) -> Out<Vec<u8>> {
        self.quantize_act(ActFmt::Q8_1, x, rows, k)
    }
    fn quantize_act(&self, fmt: ActFmt, x: &[f32], rows: usize, k: usize) -> Out<Vec<u8>> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let qb = self.out_buf(quantize::q8_1_bytes(k, rows))?;
        quantize::quantize_act(d, fmt, xb.ptr(), qb.ptr(), k, rows)?;
        let q = self.bytes(&qb)?;
        Ok(Some(q))
    }
    fn quantize_dq(&self, fmt: ActFmt, x: &[f32], rows: usize, k: usize) -> Out<Vec<f32>> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(x.len() * 4)?;
        quantize::quantize_dq(d, fmt, xb.ptr(), yb.ptr(), k, rows)?;
        Ok(Some(d.read_f32(yb.ptr(), x.len())?))
    }
    fn get_rows(&self, w: &[u8], ty: GgmlType, k: usize, ids: &[i32], scale: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let wb = d.upload(w)?;
        let ib = d.upload_i32(ids)?;
        let yb = self.out_buf(ids.len() * k * 4)?;
        elementwise::get_rows(d, wb.ptr(), ty, k, ib.ptr(), ids.len(), yb.ptr(), scale)?;
        Ok(Some(d.read_f32(yb.ptr(), ids.len() * k)?))
    }
    fn rmsnorm(&self, x: &[f32], w: Option<&[f32]>, rows: usize, n: usize, eps: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let wb = self.upload_opt(w)?;
        let yb = self.out_buf(rows * n * 4)?;
        norm_rope::rmsnorm(d, xb.ptr(), wb.as_ref().map(|b| b.ptr()), yb.ptr(), rows, n, eps)?;
        Ok(Some(d.read_f32(yb.ptr(), rows * n)?))
    }
    fn rope(&self, x: &[f32], pos: &[i32], ff: Option<&[f32]>, n_head: usize, head_dim: usize, n_rot: usize, neox: bool, base: f32, freq_scale: f32, attn_factor: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let pb = d.upload_i32(pos)?;
        let fb = self.upload_opt(ff)?;
        let ts = norm_rope::rope_theta_scale(base, n_rot);
        norm_rope::rope(d, xb.ptr(), pb.ptr(), fb.as_ref().map(|b| b.ptr()), pos.len(), n_head, head_dim, n_rot, neox, ts, freq_scale, attn_factor)?;
        Ok(Some(d.read_f32(xb.ptr(), x.len())?))
    }
    fn add_rmsnorm_q8(&self, x: &[f32], r: &[f32], w: Option<&[f32]>, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> Out<(Vec<f32>, Vec<f32>, Vec<u8>)> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let rb = d.upload_f32(r)?;
        let wb = self.upload_opt(w)?;
        let yb = self.out_buf(rows * n * 4)?;
        let qb = self.out_buf(quantize::q8_1_bytes(n, rows))?;
        norm_rope::add_rmsnorm_q8(d, xb.ptr(), rb.ptr(), wb.as_ref().map(|b| b.ptr()), yb.ptr(), qb.ptr(), rows, n, eps, fmt)?;
        let q = self.bytes(&qb)?;
        Ok(Some((d.read_f32(xb.ptr(), rows * n)?, d.read_f32(yb.ptr(), rows * n)?, q)))
    }
    fn rope_kv(&self, q: &[f32], k: &[f32], v: &[f32], qw: Option<&[f32]>, kw: Option<&[f32]>, pos: &[i32], ff: Option<&[f32]>, p: &norm_rope::RopeKv, _base: f32, slots: usize) -> Out<RopeKvOut> {
        let d = self.0;
        let (qb, kb, vb) = (d.upload_f32(q)?, d.upload_f32(k)?, d.upload_f32(v)?);
        let (qwb, kwb, ffb) = (self.upload_opt(qw)?, self.upload_opt(kw)?, self.upload_opt(ff)?);
        let pb = d.upload_i32(pos)?;
        let w = p.n_kv * p.head_dim;
        let kcb = self.out_buf(slots * w * 2)?;
        let vcb = self.out_buf(slots * w * 2)?;
        let ptr = |b: &Option<DeviceBuffer>| b.as_ref().map(|b| b.ptr());
        norm_rope::rope_kv(d, qb.ptr(), kb.ptr(), vb.ptr(), kcb.ptr(), vcb.ptr(), ptr(&qwb), ptr(&kwb), pb.ptr(), ptr(&ffb), p)?;
        let mut kc = vec![0u16; slots * w];
        let mut vc = vec![0u16; slots * w];
        d.read(kcb.ptr(), bytemuck::cast_slice_mut(&mut kc))?;
        d.read(vcb.ptr(), bytemuck::cast_slice_mut(&mut vc))?;
        Ok(Some((d.read_f32(qb.ptr(), q.len())?, d.read_f32(kb.ptr(), k.len())?, kc, vc)))
    }
    fn matvec_multi(&self, ws: &[(&[u8], GgmlType, usize)], k: usize, x: &[f32]) -> Out<(Vec<Vec<f32>>, Vec<u8>)> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        // Both forms, one after the other (the K form only for whole super-blocks).
        let half = quantize::q8_1_bytes(k, 1);
        let qb = self.out_buf(2 * half)?;
        quantize::quantize_q8_1(d, xb.ptr(), qb.ptr(), k, 1)?;
        let xk = if k % 256 == 0 {
            quantize::quantize_act(d, ActFmt::K, xb.ptr(), qb.ptr() + half as u64, k, 1)?;
            qb.ptr() + half as u64
        } else {
            0
        };
        let (bufs, segs) = self.mv_segments(ws)?;
        matvec::matvec_multi(d, qb.ptr(), xk, k, &segs)?;
        let ys = self.mv_outputs(&bufs)?;
        let q = self.bytes(&qb)?;
        Ok(Some((ys, q)))
    }
    fn matvec_q4k_loop(&self, ws: &[(&[u8], GgmlType, usize)], k: usize, x: &[f32], blocks: usize) -> Out<Vec<Vec<f32>>> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let qb = self.out_buf(quantize::q8_1_bytes(k, 1))?;
        quantize::quantize_act(d, ActFmt::K, xb.ptr(), qb.ptr(), k, 1)?;
        let (bufs, segs) = self.mv_segments(ws)?;
        matvec::matvec_q4k_loop(d, qb.ptr(), k, &segs, blocks)?;
        let ys = self.mv_outputs(&bufs)?;
        Ok(Some(ys))
    }
    fn matvec_split(&self, w: &[u8], ty: GgmlType, rows: usize, k: usize, x: &[f32], blocks: usize) -> Out<(Vec<f32>, Vec<u8>)> {
        let d = self.0;
        let wb = d.upload(w)?;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(rows * 4)?;
        let qb = self.out_buf(quantize::q8_1_bytes(k, 1))?;
        quantize::quantize_act(d, ActFmt::K, xb.ptr(), qb.ptr(), k, 1)?;
        crate::backend::gpu::family::decode_mv::split_walk(d, qb.ptr(), k, wb.ptr(), ty, rows, yb.ptr(), blocks)?;
        let q = self.bytes(&qb)?;
        Ok(Some((d.read_f32(yb.ptr(), rows)?, q)))
    }
    fn attention_q8(&self, q: &[f32], kc: &[u16], vc: &[u16], n_tok: usize, n_head: usize, n_kv: usize, hd: usize, pos0: usize, window: usize, scale: f32) -> Out<(Vec<f32>, Vec<u8>)> {
        let d = self.0;
        let qb = d.upload_f32(q)?;
        let kb = d.upload(bytemuck::cast_slice(kc))?;
        let vb = d.upload(bytemuck::cast_slice(vc))?;
        let ob = self.out_buf(q.len() * 4)?;
        let q8b = self.out_buf(quantize::q8_1_bytes(n_head * hd, n_tok))?;
        let pos: Vec<i32> = (0..n_tok).map(|t| (pos0 + t) as i32).collect();
        let pb = d.upload_i32(&pos)?;
        attention::attention_q8(d, qb.ptr(), kb.ptr(), vb.ptr(), ob.ptr(), Some(q8b.ptr()), n_tok, n_head, n_kv, hd, pb.ptr(), window, scale, None)?;
        let q8 = self.bytes(&q8b)?;
        Ok(Some((d.read_f32(ob.ptr(), q.len())?, q8)))
    }
    fn attention(&self, q: &[f32], kc: &[u16], vc: &[u16], n_tok: usize, n_head: usize, n_kv: usize, hd: usize, pos0: usize, window: usize, scale: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let qb = d.upload_f32(q)?;
        let kb = d.upload(bytemuck::cast_slice(kc))?;
        let vb = d.upload(bytemuck::cast_slice(vc))?;
        let ob = self.out_buf(q.len() * 4)?;
        let pos: Vec<i32> = (0..n_tok).map(|t| (pos0 + t) as i32).collect();
        let pb = d.upload_i32(&pos)?;
        attention::attention(d, qb.ptr(), kb.ptr(), vb.ptr(), ob.ptr(), n_tok, n_head, n_kv, hd, pb.ptr(), window, scale)?;
        Ok(Some(d.read_f32(ob.ptr(), q.len())?))
    }
    fn elementwise(&self, op: Elt, a: &[f32], b: &[f32], p: f32) -> Out<Vec<f32>> {
        let d = self.0;
        let n = a.len();
        let ab = d.upload_f32(a)?;
        let bb = d.upload_f32(b)?;
        let yb = self.out_buf(n * 4)?;
        let (a, b, y) = (ab.ptr(), bb.ptr(), yb.ptr());
        match op {
            Elt::Add => elementwise::add(d, a, b, y, n)?,
            Elt::Mul => elementwise::mul(d, a, b, y, n)?,
            Elt::Scale => elementwise::scale(d, a, y, n, p)?,
            Elt::SwiGlu => elementwise::glu(d, a, b, y, n, false)?,
            Elt::GeGlu => elementwise::glu(d, a, b, y, n, true)?,
            Elt::Softcap => elementwise::softcap(d, a, y, n, p)?,
        }
        Ok(Some(d.read_f32(y, n)?))
    }
    fn rmsnorm_q8(&self, x: &[f32], w: Option<&[f32]>, rows: usize, n: usize, eps: f32, fmt: ActFmt) -> Out<(Vec<f32>, Vec<u8>)> {
        let d = self.0;
        let xb = d.upload_f32(x)?;
        let wb = self.upload_opt(w)?;
        let yb = self.out_buf(rows * n * 4)?;
        let qb = self.out_buf(quantize::q8_1_bytes(n, rows))?;
        norm_rope::rmsnorm_q8(d, xb.ptr(), wb.as_ref().map(|b| b.ptr()), yb.ptr(), qb.ptr(), rows, n, eps, fmt)?;
        let q = self.bytes(&qb)?;
        Ok(Some((d.read_f32(yb.ptr(), rows * n)?, q)))
    }
    fn glu_q8(&self, g: &[f32], u: &[f32], gelu: bool, fmt: ActFmt) -> Out<(Vec<f32>, Vec<u8>)> {
        let d = self.0;
        let n = g.len();
        let gb = d.upload_f32(g)?;
        let ub = d.upload_f32(u)?;
        let yb = self.out_buf(n * 4)?;
        let qb = self.out_buf(quantize::q8_1_bytes(n, 1))?;
        elementwise::glu_q8(d, gb.ptr(), ub.ptr(), yb.ptr(), qb.ptr(), n, gelu, fmt)?;
        let q = self.bytes(&qb)?;
        Ok(Some((d.read_f32(yb.ptr(), n)?, q)))
    }
    fn attention_rows(&self, cases: usize, rng: &mut super::Rng, acc: &mut super::Acc) -> Out<()> {
        super::rows::check(self.0, cases, rng, acc)?;
        Ok(Some(()))
    }
    fn kv_store(&self, k: &[f32], v: &[f32], nk: usize, nv: usize, rows: &[i32], slots: usize) -> Out<(Vec<u16>, Vec<u16>)> {
        let d = self.0;
        let kb = d.upload_f32(k)?;
        let vb = d.upload_f32(v)?;
        let rb = d.upload_i32(rows)?;
        let kcb = self.out_buf(slots * nk * 2)?;
        let vcb = self.out_buf(slots * nv * 2)?;
        elementwise::kv_store(d, kb.ptr(), vb.ptr(), kcb.ptr(), vcb.ptr(), nk, nv, rb.ptr(), rows.len())?;
        let mut kc = vec![0u16; slots * nk];
        let mut vc = vec![0u16; slots * nv];
        d.read(kcb.ptr(), bytemuck::cast_slice_mut(&mut kc))?;
        d.read(vcb.ptr(), bytemuck::cast_slice_mut(&mut vc))?;
        Ok(Some((kc, vc)))
    }
    fn gemm_q4_k(&self, w: &[u8], rows: usize, k: usize, x: &[f32], n: usize) -> Out<Vec<f32>> {
        let d = self.0;
        let wb = d.upload(w)?;
        let xb = d.upload_f32(x)?;
        let yb = self.out_buf(n * rows * 4)?;
        crate::backend::gpu::family::gemm::gemm(d, wb.ptr(), GgmlType::Q4_K, crate::weights::layout::Layout::Stored, rows, k, xb.ptr(), yb.ptr(), n, crate::backend::gpu::plan::tile(n, rows))?;
        Ok(Some(d.read_f32(yb.ptr(), n * rows)?))
    }
    fn f32_to_f16_rows(&self, src: &[f32], rows: usize, n: usize, stride: usize, row0: usize, dst_rows: usize) -> Out<Vec<u16>> {
        let d = self.0;
        let sb = d.upload_f32(src)?;
        let db = self.out_buf(dst_rows * stride * 2)?;
        let idx: Vec<i32> = (0..rows).map(|r| (row0 + r) as i32).collect();
        let ib = d.upload_i32(&idx)?;
        elementwise::f32_to_f16_rows(d, sb.ptr(), db.ptr(), rows, n, stride, ib.ptr())?;
        let mut out = vec![0u16; dst_rows * stride];
        d.read(db.ptr(), bytemuck::cast_slice_mut(&mut out))?;
        Ok(Some(out))
    }
}

/// The CPU reference kernels as a target: `quant::matmul` and `quant::dequantize`.
pub struct HostTarget;

impl Target for HostTarget {
    fn label(&self) -> String {
        "cpu (quant::matmul / quant::dequantize)".into()
    }
    fn matvec(&self, w: &[u8], ty: GgmlType, rows: usize, k: usize, x: &[f32], ncols: usize) -> Out<(Vec<f32>, Option<Vec<u8>>)> {
        let mut y = vec![f32::NAN; ncols * rows];
        quant::matmul(w, ty, rows, k, x, ncols, &mut y).map_err(|e| GpuError::Unsupported(e.to_string()))?;
        Ok(Some((y, None)))
    }
    fn quantize_q8_1(&self, _: &[f32], _: usize, _: usize) -> Out<Vec<u8>> {
        Ok(None)
    }
    /// The CPU's own blocks (so `cargo test` runs the `act_*` check bodies: a tautology
    /// for the bytes, but it exercises the layout conversion and the data generator).
    fn quantize_act(&self, fmt: ActFmt, x: &[f32], rows: usize, k: usize) -> Out<Vec<u8>> {
        Ok(Some(super::act::cpu_blocks(fmt, x, rows, k)?))
    }
    /// From the K-form bytes (not from `quant::dequantize`), so the conversion is checked.
    fn quantize_dq(&self, fmt: ActFmt, x: &[f32], rows: usize, k: usize) -> Out<Vec<f32>> {
        let b = super::act::cpu_blocks(fmt, x, rows, k)?;
        let (xh, _) = super::decode_act(&b, k, rows, fmt);
        Ok(Some(xh))
    }
    fn activation_type(&self, ty: GgmlType) -> Option<GgmlType> {
        Some(quant::vec_dot_type(ty))
    }
    fn get_rows(&self, w: &[u8], ty: GgmlType, k: usize, ids: &[i32], scale: f32) -> Out<Vec<f32>> {
        let rb = ty.bytes_for(k as u64).unwrap_or(0) as usize;
        let mut y = vec![f32::NAN; ids.len() * k];
        for (r, &id) in ids.iter().enumerate() {
            let id = id as usize;
            quant::dequantize(ty, &w[id * rb..(id + 1) * rb], &mut y[r * k..(r + 1) * k]).map_err(|e| GpuError::Unsupported(e.to_string()))?;
            y[r * k..(r + 1) * k].iter_mut().for_each(|v| *v *= scale);
        }
        Ok(Some(y))
    }
    fn rmsnorm(&self, _: &[f32], _: Option<&[f32]>, _: usize, _: usize, _: f32) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn rope(&self, _: &[f32], _: &[i32], _: Option<&[f32]>, _: usize, _: usize, _: usize, _: bool, _: f32, _: f32, _: f32) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn attention(&self, _: &[f32], _: &[u16], _: &[u16], _: usize, _: usize, _: usize, _: usize, _: usize, _: usize, _: f32) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn elementwise(&self, _: Elt, _: &[f32], _: &[f32], _: f32) -> Out<Vec<f32>> {
        Ok(None)
    }
    fn f32_to_f16_rows(&self, _: &[f32], _: usize, _: usize, _: usize, _: usize, _: usize) -> Out<Vec<u16>> {
        Ok(None)
    }
}

