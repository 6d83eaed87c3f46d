//! A small qwen3moe model (8 experts, 2 used) on the CPU: each 3-D expert tensor is one
//! region of the weight cache (copies = tensors, no duplicates, at every prefill length),
//! an expert's address is inside that one copy, the CPU's direct MoE op equals the
//! trait's default built from primitive ops, and the residency modes give bit-identical
//! logits.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use lode_runtime::backend::cached::CachedBackend;
use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::{moe, Attention, Backend, Buf, Glu, KvCache, KvSpec, MoeFfn, MoeScratch, Result, Rope};
use lode_runtime::engine::{argmax_logits, Engine, EngineOptions};
use lode_runtime::gguf::{GgufFile, GgufWriter, MetaValue};
use lode_runtime::model::Model;
use lode_runtime::quant::{self, GgmlType};
use lode_runtime::weights::host::HostMaterializer;
use lode_runtime::weights::layout::Layout;
use lode_runtime::weights::{Residency, WeightCache, WeightOptions, WeightRef};

const E: u64 = 256;
const H: u64 = 4;
const HKV: u64 = 2;
const D: u64 = 64;
const FE: u64 = 256;
const NE: u64 = 8;
const V: u64 = 320;
const L: usize = 2;

fn values(n: u64, seed: u64, s: f32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * s
        })
        .collect()
}

fn model_bytes() -> Vec<u8> {
    let mut w = GgufWriter::new();
    let arch = "qwen3moe";
    w.add_kv("general.architecture", MetaValue::String(arch.into()));
    for (k, v) in [
        ("context_length", 4096u32),
        ("embedding_length", E as u32),
        ("block_count", L as u32),
        ("feed_forward_length", 768),
        ("expert_feed_forward_length", FE as u32),
        ("expert_count", NE as u32),
        ("expert_used_count", 2),
        ("attention.head_count", H as u32),
        ("attention.head_count_kv", HKV as u32),
        ("attention.key_length", D as u32),
        ("attention.value_length", D as u32),
    ] {
        w.add_kv(format!("{arch}.{k}"), MetaValue::U32(v));
    }
    w.add_kv(format!("{arch}.attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-6));
    w.add_kv(format!("{arch}.rope.freq_base"), MetaValue::F32(1e6));
    let mut seed = 11;
    let mut t = |w: &mut GgufWriter, name: String, dims: &[u64], ty: GgmlType| {
        seed += 1;
        let n: u64 = dims.iter().product();
        let v: Vec<f32> = if dims.len() == 1 { values(n, seed, 0.2).iter().map(|x| 1.0 + x).collect() } else { values(n, seed, 0.6) };
        let mut b = vec![0u8; ty.bytes_for(n).unwrap() as usize];
        quant::quantize(ty, &v, &mut b).unwrap();
        w.add_tensor(name, ty, dims, b);
    };
    use GgmlType::{F32, Q4_K, Q6_K, Q8_0};
    t(&mut w, "token_embd.weight".into(), &[E, V], Q4_K);
    t(&mut w, "output_norm.weight".into(), &[E], F32);
    t(&mut w, "output.weight".into(), &[E, V], Q6_K);
    for l in 0..L {
        let n = |s: &str| format!("blk.{l}.{s}");
        t(&mut w, n("attn_norm.weight"), &[E], F32);
        t(&mut w, n("attn_q.weight"), &[E, H * D], Q4_K);
        t(&mut w, n("attn_k.weight"), &[E, HKV * D], Q8_0);
        t(&mut w, n("attn_v.weight"), &[E, HKV * D], Q8_0);
        t(&mut w, n("attn_output.weight"), &[H * D, E], Q4_K);
        t(&mut w, n("attn_q_norm.weight"), &[D], F32);
        t(&mut w, n("attn_k_norm.weight"), &[D], F32);
        t(&mut w, n("ffn_norm.weight"), &[E], F32);
        t(&mut w, n("ffn_gate_inp.weight"), &[E, NE], F32);
        t(&mut w, n("ffn_gate_exps.weight"), &[E, FE, NE], Q4_K);
        t(&mut w, n("ffn_up_exps.weight"), &[E, FE, NE], Q4_K);
        t(&mut w, n("ffn_down_exps.weight"), &[FE, E, NE], if l == 0 { Q6_K } else { Q4_K });
    }
    w.to_bytes().expect("write gguf")
}

fn file() -> Arc<GgufFile> {
    Arc::new(GgufFile::from_bytes(model_bytes()).expect("parse gguf"))
}

fn engine_on(f: &Arc<GgufFile>, be: Box<dyn Backend>, ctx: usize) -> Engine {
    let m = Model::load(f.clone()).unwrap();
    Engine::new(m, be, EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: Default::default(), swa_full: false }).unwrap()
}

fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) % V as u32).collect()
}

/// Prefill `p`, then `steps` greedy decode steps; every logits vector.
fn run(e: &mut Engine, p: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut out = vec![e.eval(p).unwrap()];
    for _ in 0..steps {
        let t = argmax_logits(out.last().unwrap());
        out.push(e.eval(&[t]).unwrap());
    }
    out
}

#[test]
fn loads_as_moe_with_whole_expert_tensors() {
    let m = Model::load(file()).unwrap();
    let x = m.cfg.experts.unwrap();
    assert_eq!((x.n_expert, x.n_used, x.n_ff, x.norm_top_k), (8, 2, 256, true));
    // Per layer 12 tensors (3 of them 3-D), plus embedding, output norm, output.
    assert_eq!(m.weight_ids().len(), 12 * L + 3);
    let g = m.w(m.layers[1].gate);
    assert_eq!((g.n_rows(), g.view.info.dims.clone()), (2048, vec![E, FE, NE]));
    let e3 = g.expert(3).unwrap();
    assert_eq!((e3.n_rows(), e3.row_len(), e3.data().len()), (FE as usize, E as usize, g.data().len() / 8));
    assert_eq!(e3.data().as_ptr() as usize - g.data().as_ptr() as usize, 3 * g.data().len() / 8);
    assert!(g.expert(8).is_none() && e3.expert(0).is_none() && m.w(m.layers[0].attn.as_ref().unwrap().wq).expert(0).is_none());
}

/// An expert's address is inside its tensor's one copy: no new region, no new copy.
#[test]
fn an_expert_is_an_address_inside_the_one_copy() {
    let f = file();
    let m = Model::load(f.clone()).unwrap();
    let opts = WeightOptions { residency: Some(Residency::Device), ..Default::default() };
    let mut c = WeightCache::new(HostMaterializer::new(), Residency::Device, &opts);
    let down: WeightRef = m.w(m.layers[0].down);
    let per = down.data().len() as u64 / NE;
    let a5 = c.get(&down.expert(5).unwrap(), Layout::Stored).unwrap();
    let base = c.get(&down, Layout::Stored).unwrap();
    assert_eq!(a5, base + 5 * per);
    assert_eq!(c.get(&down.expert(7).unwrap(), Layout::Stored).unwrap(), base + 7 * per);
    let s = c.stats();
    assert_eq!((s.copies, s.misses, s.duplicates, s.resident_bytes), (1, 1, 0, down.data().len() as u64));
}

#[test]
fn one_copy_per_tensor_at_every_prefill_length() {
    let f = file();
    let m = Model::load(f.clone()).unwrap();
    let ids = m.weight_ids();
    let (n, bytes) = (ids.len() as u64, ids.iter().map(|&id| m.w(id).data().len() as u64).sum::<u64>());
    let opts = WeightOptions { residency: Some(Residency::Device), ..Default::default() };
    let mut e = engine_on(&f, Box::new(CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &opts).unwrap()), 700);
    for (i, len) in [1usize, 7, 64, 513].into_iter().enumerate() {
        e.clear();
        let logits = run(&mut e, &prompt(len, i as u32), 8);
        assert!(logits.iter().flatten().all(|x| x.is_finite()));
        let s = e.weight_stats().unwrap();
        assert_eq!((s.copies, s.misses, s.duplicates, s.failures), (n, n, 0, 0), "after prefill {len}: {s:?}");
        assert_eq!(s.resident_bytes, bytes, "after prefill {len}");
    }
}

#[test]
fn residency_modes_give_bit_identical_logits() {
    let f = file();
    let p = prompt(100, 5);
    let plain = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 256), &p, 6);
    for r in [Residency::Mapped, Residency::Device, Residency::Upload] {
        let opts = WeightOptions { residency: Some(r), ..Default::default() };
        let got = run(&mut engine_on(&f, Box::new(CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &opts).unwrap()), 256), &p, 6);
        assert!(got == plain, "{r}: logits differ");
    }
}

/// The CPU backend with every op delegated except `moe_ffn`, which keeps the trait's
/// default (what the fast GPU backend runs today), or with `.1` computes the router on the
/// host and the experts by primitive ops (what the exact GPU backend runs). With `.2` it
/// reports a GPU-class device to the engine's fit and records the experts it places.
struct DefaultMoe(CpuBackend, bool, Option<Device>);

/// A GPU-class device of `free` bytes with a weight budget; `host`: the host expert layers
/// placed (`Backend::place_host_experts`), which a `fixed` count (`--n-cpu-moe`) refuses.
#[derive(Clone)]
struct Device {
    free: u64,
    budget: Option<u64>,
    host: Arc<std::sync::atomic::AtomicUsize>,
    fixed: bool,
}

fn gpu_target(free: u64, host: usize) -> lode_runtime::backend::memory::MemoryTarget {
    lode_runtime::backend::memory::MemoryTarget {
        name: "test gpu".into(),
        class: lode_runtime::weights::layout::DeviceClass::Gpu,
        residency: Residency::Device,
        free,
        total: free,
        used_at_open: 0,
        arena: true,
        tuning: None,
        cap: None,
        host_expert_layers: host,
    }
}

impl Backend for DefaultMoe {
    fn memory_target(&self) -> Option<lode_runtime::backend::memory::MemoryTarget> {
        self.2.as_ref().map(|d| gpu_target(d.free, d.host.load(Relaxed)))
    }
    fn weight_stats(&self) -> Option<lode_runtime::weights::WeightStats> {
        self.2.as_ref().map(|d| lode_runtime::weights::WeightStats { budget_bytes: d.budget, ..Default::default() })
    }
    fn place_host_experts(&mut self, layers: usize, _bytes: u64) -> Result<bool> {
        match &self.2 {
            Some(d) if !d.fixed => {
                d.host.store(layers, Relaxed);
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn name(&self) -> String {
        "cpu with the default moe_ffn".into()
    }
    fn alloc(&mut self, len: usize) -> Result<Buf> {
        self.0.alloc(len)
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
    fn alloc_kv(&mut self, spec: &KvSpec) -> Result<KvCache> {
        self.0.alloc_kv(spec)
    }
    fn free_kv(&mut self, kv: KvCache) -> Result<()> {
        self.0.free_kv(kv)
    }
    fn get_rows(&mut self, w: &WeightRef, ids: &[u32], out: Buf) -> Result<()> {
        self.0.get_rows(w, ids, out)
    }
    fn matmul(&mut self, w: &WeightRef, x: Buf, n_tok: usize, y: Buf) -> Result<()> {
        self.0.matmul(w, x, n_tok, y)
    }
    fn matmul_multi(&mut self, x: Buf, n_tok: usize, outs: &[(&WeightRef, Buf)]) -> Result<()> {
        self.0.matmul_multi(x, n_tok, outs)
    }
    fn rms_norm(&mut self, x: Buf, out: Buf, n_rows: usize, row_len: usize, w: Option<&WeightRef>, eps: f32) -> Result<()> {
        self.0.rms_norm(x, out, n_rows, row_len, w, eps)
    }
    fn rope(&mut self, x: Buf, n_head: usize, head_dim: usize, pos: &[u32], rope: &Rope) -> Result<()> {
        self.0.rope(x, n_head, head_dim, pos, rope)
    }
    fn add(&mut self, a: Buf, b: Buf, out: Buf, n: usize) -> Result<()> {
        self.0.add(a, b, out, n)
    }
    fn add_bias(&mut self, x: Buf, n_tok: usize, bias: &WeightRef) -> Result<()> {
        self.0.add_bias(x, n_tok, bias)
    }
    fn scale(&mut self, x: Buf, n: usize, s: f32) -> Result<()> {
        self.0.scale(x, n, s)
    }
    fn glu(&mut self, gate: Buf, up: Buf, out: Buf, n: usize, act: Glu) -> Result<()> {
        self.0.glu(gate, up, out, n, act)
    }
    fn copy(&mut self, src: Buf, src_off: usize, dst: Buf, dst_off: usize, n: usize) -> Result<()> {
        self.0.copy(src, src_off, dst, dst_off, n)
    }
    fn kv_write(&mut self, kv: KvCache, layer: usize, k: Buf, v: Buf, pos: &[u32]) -> Result<()> {
        self.0.kv_write(kv, layer, k, v, pos)
    }
    fn attention(&mut self, q: Buf, kv: KvCache, layer: usize, pos: &[u32], p: &Attention, out: Buf) -> Result<()> {
        self.0.attention(q, kv, layer, pos, p, out)
    }
    fn moe_ffn(&mut self, x: Buf, n_tok: usize, p: &MoeFfn, out: Buf, tmp: &MoeScratch) -> Result<()> {
        if !self.1 {
            return moe::moe_ffn_unfused(self, x, n_tok, p, out, tmp);
        }
        let (e, n_exp, _) = p.dims()?;
        let mut xs = vec![0f32; n_tok * e];
        self.0.read(x, &mut xs)?;
        let logits = moe::router_logits_host(p.router, &xs, n_tok)?;
        let routes = moe::route_rows(&logits, n_exp, p.n_used, p.norm_top_k);
        moe::moe_experts(self, x, n_tok, p, &routes, out, tmp)
    }
}

/// The default `moe_ffn` (gather, matmuls on expert views, per-row scale, slot sums),
/// also with the router on the host, gives the CPU's direct op's logits bit for bit:
/// same routing, same order of sums.
#[test]
fn default_op_equals_the_cpu_direct_op() {
    let f = file();
    let p = prompt(70, 2);
    let direct = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 128), &p, 6);
    for host_router in [false, true] {
        let default = run(&mut engine_on(&f, Box::new(DefaultMoe(CpuBackend::new(2).unwrap(), host_router, None)), 128), &p, 6);
        assert!(direct == default, "the default moe_ffn (host router: {host_router}) differs from the CPU's");
    }
}

/// A tensor's new (name, dims), or `None` to drop it.
type TensorEdit<'a> = &'a dyn Fn(&str, &[u64]) -> Option<(String, Vec<u64>)>;

/// The model rewritten with its metadata and tensors passed through `meta` and `tensor`.
fn rewrite(meta: &dyn Fn(&str, &MetaValue) -> MetaValue, tensor: TensorEdit) -> Arc<GgufFile> {
    let f = GgufFile::from_bytes(model_bytes()).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        w.add_kv(k.clone(), meta(k, v));
    }
    for t in f.tensors() {
        let view = f.tensor(&t.name).unwrap();
        if let Some((name, dims)) = tensor(&t.name, &t.dims) {
            // Same element count, so the bytes still fit the type.
            w.add_tensor(name, t.ty, &dims, view.data.to_vec());
        }
    }
    Arc::new(GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap())
}

/// Bad expert metadata or tensors are a clear error naming the key or tensor, never a
/// panic.
#[test]
fn bad_expert_metadata_or_tensors_are_clear_errors() {
    let same = |_: &str, v: &MetaValue| v.clone();
    let keep = |n: &str, d: &[u64]| Some((n.to_string(), d.to_vec()));
    let err = |f: Arc<GgufFile>| Model::load(f).err().expect("must not load").to_string();

    let used9 = |k: &str, v: &MetaValue| if k == "qwen3moe.expert_used_count" { MetaValue::U32(9) } else { v.clone() };
    let e = err(rewrite(&used9, &keep));
    assert!(e.contains("9 experts used of 8"), "{e}");

    let no_ff = |k: &str, v: &MetaValue| if k == "qwen3moe.expert_feed_forward_length" { MetaValue::U32(0) } else { v.clone() };
    let e = err(rewrite(&no_ff, &keep));
    assert!(e.contains("expert FFN length 0"), "{e}");

    let no_router = |n: &str, d: &[u64]| (n != "blk.1.ffn_gate_inp.weight").then(|| (n.to_string(), d.to_vec()));
    let e = err(rewrite(&same, &no_router));
    assert!(e.contains("missing tensor `blk.1.ffn_gate_inp.weight`"), "{e}");

    // 16 experts of half the rows: same bytes, wrong shape.
    let reshaped = |n: &str, d: &[u64]| Some((n.to_string(), if n == "blk.0.ffn_up_exps.weight" { vec![d[0], d[1] / 2, d[2] * 2] } else { d.to_vec() }));
    let e = err(rewrite(&same, &reshaped));
    assert!(e.contains("blk.0.ffn_up_exps.weight") && e.contains("shape"), "{e}");
}

/// `--n-cpu-moe`: on a GPU-class target too small for every expert, the estimate names the
/// fewest layers whose experts must stay in host memory; with that many they are not
/// counted on the device and the run fits, with one fewer it does not.
#[test]
fn fit_names_the_fewest_host_expert_layers() {
    use lode_runtime::backend::KvType;
    use lode_runtime::engine::fit::{estimate, fewest_host_expert_layers, RunShape};
    let m = Model::load(file()).unwrap();
    let shape = RunShape { ctx: 64, batch: 32, n_seq: 1, kv_type: KvType::F16.into(), swa_full: false };
    let target = gpu_target;
    let all = estimate(&m, &target(u64::MAX / 4, 0), shape).unwrap();
    let host = estimate(&m, &target(u64::MAX / 4, L), shape).unwrap();
    let experts: u64 = m.weight_ids().into_iter().map(|id| m.w(id)).filter(|w| moe::expert_tensor_layer(w.name()).is_some()).map(|w| w.data().len() as u64).sum();
    assert!(experts > 0 && host.in_place >= experts && host.weights < all.weights, "{} {} {experts}", host.weights, all.weights);
    // Room for all but one layer's experts: one layer must stay in host memory.
    let free = all.need - experts / L as u64 / 2;
    assert!(!estimate(&m, &target(free, 0), shape).unwrap().fits());
    let n = fewest_host_expert_layers(&m, &target(free, 0), shape).expect("a count that fits");
    assert!(n >= 1 && n <= L, "{n}");
    assert!(estimate(&m, &target(free, n), shape).unwrap().fits());
    assert!(!estimate(&m, &target(free, n - 1), shape).unwrap().fits());
    // It fits already, or nothing helps: no hint.
    assert_eq!(fewest_host_expert_layers(&m, &target(u64::MAX / 4, 0), shape), None);
    assert_eq!(fewest_host_expert_layers(&m, &target(1 << 10, 0), shape), None);
}

/// Fit's placement: under a weight budget smaller than the weights (a device with room),
/// the fewest host expert layers whose device copies fit the budget; the engine asks the
/// backend to place them and runs, with the same logits as the run with every expert
/// on the device; a count fixed by `--n-cpu-moe` (the backend refuses) is refused with the
/// count named; a device too small for every expert places them too.
#[test]
fn fit_places_host_experts_under_a_budget_or_a_small_device() {
    use lode_runtime::backend::KvType;
    use lode_runtime::engine::fit::{estimate, host_expert_layers_within, RunShape};
    let f = file();
    let m = Model::load(f.clone()).unwrap();
    let (ctx, big) = (128, u64::MAX / 4);
    let shape = RunShape { ctx, batch: 512, n_seq: 1, kv_type: KvType::F16.into(), swa_full: false };
    let all = estimate(&m, &gpu_target(big, 0), shape).unwrap();
    let one = estimate(&m, &gpu_target(big, 1), shape).unwrap();
    assert!(one.weights < all.weights && one.host_experts > 0 && all.host_experts == 0);
    // A budget between one and no host layer's device bytes: exactly one layer.
    let budget = (one.weights + all.weights) / 2;
    assert_eq!(host_expert_layers_within(&m, &gpu_target(big, 0), shape, Some(budget)), Some(1));
    assert_eq!(host_expert_layers_within(&m, &gpu_target(big, 0), shape, Some(one.weights)), Some(1));
    // Under that: both layers, if their device bytes (whole arena pages) are smaller still.
    let two = estimate(&m, &gpu_target(big, 2), shape).unwrap();
    assert_eq!(host_expert_layers_within(&m, &gpu_target(big, 0), shape, Some(one.weights - 1)), (two.weights < one.weights).then_some(2));
    assert_eq!(host_expert_layers_within(&m, &gpu_target(big, 0), shape, Some(all.weights)), None);
    // No budget a count can meet (the dense weights alone are over it): none.
    assert_eq!(host_expert_layers_within(&m, &gpu_target(big, 0), shape, Some(1 << 10)), None);

    let p = prompt(40, 5);
    let want = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), ctx), &p, 4);
    let device = |free, budget, fixed| Device { free, budget, host: Default::default(), fixed };
    for (d, placed) in [(device(big, Some(budget), false), 1), (device(all.need - 1, None, false), 1)] {
        let be = DefaultMoe(CpuBackend::new(2).unwrap(), false, Some(d.clone()));
        let got = run(&mut engine_on(&f, Box::new(be), ctx), &p, 4);
        assert_eq!(d.host.load(Relaxed), placed, "free {} budget {:?}", d.free, d.budget);
        assert!(got == want, "the run with {placed} host expert layers differs");
    }
    let d = device(all.need - 1, None, true);
    let e = Engine::new(m, Box::new(DefaultMoe(CpuBackend::new(2).unwrap(), false, Some(d.clone()))), EngineOptions { ctx_size: Some(ctx), batch_size: 512, kv_type: Default::default(), swa_full: false });
    let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(msg.contains("--n-cpu-moe 1") && d.host.load(Relaxed) == 0, "{msg}");
}
