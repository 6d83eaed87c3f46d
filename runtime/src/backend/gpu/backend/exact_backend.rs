//! `--numerics exact` as its own backend: [`ExactBackend`] holds a [`GpuBackend`] (its
//! device, buffers, weight cache and KV caches) and routes every arithmetic op to the
//! exact kernels (`exact.rs`, `gpu::exact`). The fused ops are the trait's unfused
//! compositions — which is what the CPU backend runs — so none of the fast path's fused
//! kernels is ever reached from here, and the fast path carries no exact branch.
//! Copies, the K/V store (f32 → f16 to nearest even) and buffer traffic are bit
//! operations and go to the fast backend as they are. A MoE router runs on the host
//! (`moe_ffn`).

use super::GpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::moe::{moe_experts, route_rows, router_logits_host};
use crate::backend::{Attention, Backend, BackendError, Buf, Glu, KvCache, KvSpec, MoeFfn, MoeScratch, Result, Rope};
use crate::weights::{WeightOptions, WeightRef, WeightStats};

/// A GPU backend whose every op computes the CPU backend's exact sequence of f32
/// operations (logits bit-identical to the CPU's).
pub struct ExactBackend(GpuBackend);

impl ExactBackend {
    /// Over a fast backend's state. Graph replay is off: exact mode stages host tables
    /// (RoPE) mid-step, so a step cannot be launched speculatively.
    pub fn wrap(mut inner: GpuBackend) -> ExactBackend {
        inner.set_graphs(false);
        ExactBackend(inner)
    }

    /// On `dev` with the tuning table's defaults and `opts`' weight options.
    pub fn with_options(dev: GpuDevice, opts: &WeightOptions) -> Result<ExactBackend> {
        Ok(ExactBackend::wrap(GpuBackend::with_options(dev, opts)?))
    }

    /// On `dev` with the environment's weight options (selftests).
    pub fn new(dev: GpuDevice) -> ExactBackend {
        ExactBackend::wrap(GpuBackend::new(dev))
    }
}

impl std::ops::Deref for ExactBackend {
    type Target = GpuBackend;
    fn deref(&self) -> &GpuBackend {
        &self.0
    }
}

impl std::ops::DerefMut for ExactBackend {
    fn deref_mut(&mut self) -> &mut GpuBackend {
        &mut self.0
    }
}

impl Backend for ExactBackend {
    fn name(&self) -> String {
        format!("{} exact", self.0.name())
    }
    fn round_rows_as_decode(&mut self, on: bool) {
        self.0.set_exact_rowwise(on)
    }
    fn attach_weights(&mut self, file: &std::sync::Arc<crate::gguf::GgufFile>, weights: &[WeightRef]) -> Result<()> {
        self.0.attach_weights(file, weights)
    }
    fn weight_stats(&self) -> Option<WeightStats> {
        self.0.weight_stats()
    }
    fn memory_target(&self) -> Option<crate::backend::memory::MemoryTarget> {
        self.0.memory_target()
    }
    fn alloc(&mut self, len: usize) -> Result<Buf> {
        self.0.alloc(len)
    }
    fn alloc_readback(&mut self, len: usize) -> Result<Buf> {
        self.0.alloc_readback(len)
    }
    fn free(&mut self, buf: Buf) -> Result<()> {
        self.0.free(buf)
    }
    fn write(&mut self, buf: Buf, src: &[f32]) -> Result<()> {
        self.0.write(buf, src)
    }
    fn read(&mut self, buf: Buf, dst: &mut [f32]) -> Result<()> {
        self.0.read(buf, dst)
    }
    fn read_with(&mut self, buf: Buf, n: usize, host: &mut Vec<f32>, f: &mut dyn FnMut(&[f32])) -> Result<()> {
        self.0.read_with(buf, n, host, f)
    }
    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        if let Some(a) = spec.alt {
            return Err(BackendError::Unavailable(crate::backend::gpu::ALT_HEADS_NOT_YET.replace("{}", &format!("{a:?}"))));
        }
        if spec.ty.any_quantized() {
            return Err(BackendError::Invalid {
                op: "alloc_kv",
                msg: format!("--numerics exact keeps the KV cache in f16, not {} (a quantized KV cache runs in fast numerics, or on the CPU)", spec.ty),
            });
        }
        self.0.alloc_kv(spec)
    }
    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.0.free_kv(kv)
    }
    fn copy_kv(&mut self, src: KvCache, dst: KvCache, n: usize) -> Result<()> {
        self.0.copy_kv(src, dst, n)
    }
    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
        self.0.copy(src, src_off, dst, dst_off, n)
    }
    fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
        self.0.kv_write(kv, layer, k, v, pos)
    }

    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        self.0.exact_get_rows(w, ids, out)
    }
    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        self.0.exact_matmul(w, x, n_tok, y)
    }
    fn matmul_glu(&mut self, gate: &WeightRef, up: &WeightRef, x: Buf, n_tok: usize, out: Buf, tmp: Buf, act: Glu) -> Result<()> {
        self.0.exact_matmul_glu(gate, up, x, n_tok, out, tmp, act)
    }
    fn rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        self.0.exact_rms_norm(x, out, n_rows, row_len, w, eps)
    }
    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        self.0.exact_rope(x, n_head, head_dim, pos, rope)
    }
    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        self.0.exact_add(a, b, out, n)
    }
    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        self.0.exact_add_bias(x, n_tok, bias)
    }
    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        self.0.exact_scale(x, n, s)
    }
    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        self.0.exact_glu(gate, up, out, n, act)
    }
    fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        self.0.exact_attention(q, kv, layer, pos, p, out)
    }
    /// The router (an F32 matrix in qwen3moe files, which the exact kernels lack) on the
    /// host by the CPU backend's own kernels over the input read back, so the routing is
    /// the CPU's; the experts through the exact ops, in the default's order, which sums as
    /// the CPU's direct op does.
    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
        let (e, n_exp, _) = p.dims()?;
        let mut xs = vec![0f32; n_tok * e];
        self.0.read(x, &mut xs)?;
        if !p.plain() {
            // gpt-oss's biases and clamped SwiGLU: the CPU's arithmetic on the rows read back.
            let pool = crate::backend::cpu::CpuBackend::build_pool(1)?;
            let mut o = vec![0f32; n_tok * e];
            let rx = match p.router_x {
                Some(b) => {
                    let mut v = vec![0f32; n_tok * e];
                    self.0.read(b, &mut v)?;
                    Some(v)
                }
                None => None,
            };
            crate::backend::cpu::moe::moe_host(&pool, crate::quant::Isa::best(), false, &xs, rx.as_deref(), n_tok, p, p.dims().map(|(e, n, f)| (e, n, f, p.n_used))?, &mut o)?;
            return self.0.write(out, &o);
        }
        let logits = router_logits_host(p.router, &xs, n_tok)?;
        let routes = route_rows(&logits, n_exp, p.n_used, p.norm_top_k);
        moe_experts(self, x, n_tok, p, &routes, out, tmp)
    }
    #[allow(clippy::too_many_arguments)]
    fn attention_rows(&mut self, q: Buf, k: Buf, v: Buf, kvs: &[KvCache], layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        self.0.exact_attention_rows(q, k, v, kvs, layer, pos, p, out)
    }
}
