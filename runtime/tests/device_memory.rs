//! `--device-memory` on the host-memory executor (`CachedBackend` over the CPU backend):
//! a device of that capacity holds weights, KV caches and activations; a model that does
//! not fit is refused before anything is allocated, naming a context that fits; that
//! context runs within the capacity; an allocation past it later is an out-of-memory
//! error after which the backend is as usable as before.

mod weights_common;

use lode_runtime::backend::cached::CachedBackend;
use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::{Backend, BackendError, KvSpec, KvType};
use lode_runtime::engine::fit::{self, RunShape};
use lode_runtime::engine::EngineError;
use lode_runtime::model::Model;
use lode_runtime::weights::{Residency, WeightOptions};
use weights_common::*;

fn capped(residency: Residency, cap: u64) -> CachedBackend {
    let o = WeightOptions { residency: Some(residency), device_memory: Some(cap), ..Default::default() };
    CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &o).unwrap()
}

/// The engine's own estimate of `ctx` on a capped device.
fn need(ctx: usize, cap: u64) -> fit::Estimate {
    let f = file();
    let m = Model::load(f).unwrap();
    let t = capped(Residency::Mapped, cap).memory_target().unwrap();
    fit::estimate(&m, &t, RunShape { ctx, batch: 512, n_seq: 1, kv_type: KvType::F16.into(), swa_full: false }).unwrap()
}

/// The context the refusal names (`-c N`).
fn named_ctx(msg: &str) -> usize {
    let i = msg.find("-c ").unwrap_or_else(|| panic!("no context named: {msg}"));
    msg[i + 3..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
}

#[test]
fn a_model_that_does_not_fit_is_refused_first_naming_a_context_that_runs() {
    let f = file();
    let big = need(4096, u64::MAX);
    // Room for the weights and scratch and ~1000 tokens of KV, not 4096.
    let cap = big.fixed() + 1000 * big.kv_per_token;
    for r in [Residency::Mapped, Residency::Device, Residency::Upload] {
        // `upload` would copy every weight at load: refused before that (an error from the
        // copies would be a weight's out-of-memory, not this).
        let err = match engine_on(&f, Box::new(capped(r, cap)), 4096) {
            Err(e) => e,
            Ok(_) => panic!("{r}: 4096 tokens fit in {cap} bytes"),
        };
        let EngineError::DoesNotFit(msg) = &err else { panic!("{r}: {err}") };
        assert!(msg.contains("--device-memory") && msg.contains("KV cache"), "{msg}");
        let n = named_ctx(msg);
        assert!((900..=1000).contains(&n), "{r}: suggested -c {n}");
        // The context it names runs, a prompt filling it included, within the capacity.
        let mut e = engine_on(&f, Box::new(capped(r, cap)), n).unwrap();
        let logits = run(&mut e, &prompt(n - 9, 1), 8).unwrap();
        assert!(logits.iter().flatten().all(|x| x.is_finite()));
        let d = e.weight_stats().unwrap().device.unwrap();
        let peak = d.driver_peak_used_bytes.unwrap();
        assert!(peak <= cap, "{r}: peak {peak} over the capacity {cap}");
        assert_eq!(d.device_memory_cap_bytes, Some(cap));
        // The estimate is what was held (the CPU allocates exactly what it counts).
        assert!(peak <= need(n, cap).need, "{r}: peak {peak} above the estimate {}", need(n, cap).need);
        // One token more than suggested does not fit.
        assert!(matches!(engine_on(&f, Box::new(capped(r, cap)), n + 2), Err(EngineError::DoesNotFit(_))), "{r}: -c {}", n + 2);
    }
}

/// Weights that cannot fit at all: the refusal says the weights must shrink.
#[test]
fn weights_alone_too_large_say_so() {
    let f = file();
    let (_, bytes) = used(&f);
    match engine_on(&f, Box::new(capped(Residency::Device, bytes / 2)), 256) {
        Err(EngineError::DoesNotFit(msg)) => assert!(msg.contains("the weights alone need"), "{msg}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("fits in half its weights"),
    }
}

/// The capacity counts every buffer and cache; an allocation past it is refused with
/// nothing allocated, and once memory is freed the same backend allocates again.
#[test]
fn allocations_past_the_capacity_fail_and_the_backend_stays_usable() {
    let mut be = capped(Residency::Device, 1 << 20);
    let t = be.memory_target().unwrap();
    assert_eq!((t.free, t.total, t.cap), (1 << 20, 1 << 20, Some(1 << 20)));
    let a = be.alloc(100_000).unwrap(); // 400,000 bytes
    let b = be.alloc(100_000).unwrap();
    assert_eq!(be.used(), 800_000);
    assert_eq!(be.memory_target().unwrap().free, (1 << 20) - 800_000);
    match be.alloc(100_000) {
        Err(BackendError::OutOfMemory { what, bytes }) => assert_eq!((what, bytes), ("activation buffer", 400_000)),
        other => panic!("{other:?}"),
    }
    assert_eq!(be.used(), 800_000, "a refused allocation holds nothing");
    // 2 layers × 64 slots × (8 + 8) values × 2 bytes = 4,096 bytes of f16 KV: fits; a
    // 1 << 20-slot cache does not.
    let spec = KvSpec { n_layer: 2, n_ctx: 64, n_kv_head: 1, head_dim_k: 8, head_dim_v: 8, ty: KvType::F16.into(), swa: None, alt: None };
    let kv = be.alloc_kv(&spec).unwrap();
    assert_eq!(be.used(), 804_096);
    assert!(matches!(be.alloc_kv(&KvSpec { n_ctx: 1 << 20, ..spec }), Err(BackendError::OutOfMemory { what: "KV cache", .. })));
    be.free(a).unwrap();
    be.free_kv(kv).unwrap();
    assert_eq!(be.used(), 400_000);
    let c = be.alloc(100_000).unwrap();
    be.write(c, &vec![1.5; 100_000]).unwrap();
    let mut back = vec![0f32; 100_000];
    be.read(c, &mut back).unwrap();
    assert!(back.iter().all(|&x| x == 1.5));
    assert_eq!(be.peak_used(), 804_096);
    be.free(b).unwrap();
    be.free(c).unwrap();
    assert_eq!(be.used(), 0);
}

/// The estimate for a GPU (no GPU needed: it is arithmetic over the model and the
/// device's figures): weights in one arena rounded once to 2 MiB, none for `mapped`
/// weights read in place, one page-rounded KV allocation per sequence, and a largest
/// context that fits while a larger one does not; capped at the training context.
#[test]
fn gpu_estimate_rounds_as_the_driver_allocates() {
    use lode_runtime::backend::memory::MemoryTarget;
    use lode_runtime::weights::layout::DeviceClass;
    const PAGE: u64 = 2 << 20;
    let f = file();
    let m = Model::load(f.clone()).unwrap();
    let (_, bytes) = used(&f);
    let target = |residency, free| MemoryTarget {
        name: "gpu".into(),
        class: DeviceClass::Gpu,
        residency,
        free,
        total: free + (500 << 20),
        used_at_open: 500 << 20,
        arena: true,
        tuning: Some(Default::default()),
        cap: None,
        host_expert_layers: 0,
    };
    let est = |t: &MemoryTarget, ctx, n_seq| fit::estimate(&m, t, RunShape { ctx, batch: 512, n_seq, kv_type: KvType::F16.into(), swa_full: false }).unwrap();
    let big = target(Residency::Device, 64 << 30);
    let e = est(&big, 1000, 1);
    assert_eq!(e.weights % PAGE, 0);
    assert!(e.weights >= bytes && e.weights < bytes + PAGE + 256 * e.n_tensors as u64, "{} for {bytes}", e.weights);
    assert_eq!(e.kv % PAGE, 0);
    assert_eq!(est(&big, 1000, 3).kv, 3 * e.kv);
    assert_eq!(e.predicted_device_used(), Some((500 << 20) + e.need));
    // Mapped: the stored weights cost no device memory.
    let mapped = est(&target(Residency::Mapped, 64 << 30), 1000, 1);
    let copied = |e: &fit::Estimate| e.per_layout.values().sum::<u64>();
    assert!(mapped.in_place > 0 && mapped.weights <= e.weights);
    assert_eq!(copied(&mapped) + mapped.in_place, copied(&e));
    // The largest context at a tight capacity fits, and 1 % more does not.
    let tight = target(Residency::Device, e.fixed() + 3000 * e.kv_per_token);
    let n = est(&tight, 1000, 1).max_ctx() as usize;
    assert!(n > 2000 && n <= 3000, "{n}");
    assert!(est(&tight, n, 1).fits());
    assert!(!est(&tight, n + n / 100 + 1, 1).fits());
    // Past the training context, the largest context is capped there.
    assert_eq!(e.max_ctx(), m.cfg.n_ctx_train as u64);
    assert!(e.max_ctx_memory > m.cfg.n_ctx_train as u64);
}

/// `-ctk` / `-ctv`: the estimate counts K and V in their own types (Q8_0 34 bytes, Q4_0 18
/// bytes per 32 values), the largest context grows with them, a refusal at f16 names the
/// KV type that holds the asked context, and a q8_0 run of that context fits the capacity.
#[test]
fn quantized_kv_types_are_counted_and_suggested() {
    use lode_runtime::backend::KvTypes;
    use lode_runtime::engine::{Engine, EngineOptions};
    let f = file();
    let m = Model::load(f.clone()).unwrap();
    let est = |ty: KvTypes, cap: u64| {
        let t = capped(Residency::Mapped, cap).memory_target().unwrap();
        fit::estimate(&m, &t, RunShape { ctx: 4096, batch: 512, n_seq: 1, kv_type: ty, swa_full: false }).unwrap()
    };
    let per = (L * HKV as usize * D as usize) as u64; // K (or V) values per token
    assert_eq!(est(KvType::F16.into(), u64::MAX).kv_per_token, per * 2 * 2);
    let q8 = est(KvType::Q8_0.into(), u64::MAX);
    assert_eq!(q8.kv_per_token, per / 32 * 34 * 2);
    assert_eq!(est(KvTypes { k: KvType::Q4_0, v: KvType::F16 }, u64::MAX).kv_per_token, per / 32 * 18 + per * 2);
    // Room for 4096 tokens at q8_0, not at f16.
    let cap = q8.need + (1 << 16);
    let e = est(KvType::F16.into(), cap);
    let msg = e.refusal().expect("4096 tokens of f16 KV do not fit");
    assert!(msg.contains("-ctk q8_0 -ctv q8_0"), "{msg}");
    let max = |t: KvType| e.max_ctx_by_kv.iter().find(|(k, _)| *k == t).unwrap().1;
    assert!(max(KvType::F16) < 4096 && max(KvType::Q8_0) >= 4096 && max(KvType::Q4_0) > max(KvType::Q8_0), "{:?}", e.max_ctx_by_kv);
    assert_eq!(max(KvType::F16), e.max_ctx_memory);
    let opts = EngineOptions { ctx_size: Some(4096), batch_size: 512, kv_type: KvType::Q8_0.into(), swa_full: false };
    let mut eng = Engine::new(Model::load(f.clone()).unwrap(), Box::new(capped(Residency::Mapped, cap)), opts).unwrap();
    let logits = run(&mut eng, &prompt(600, 3), 4).unwrap();
    assert!(logits.iter().flatten().all(|x| x.is_finite()));
    let peak = eng.weight_stats().unwrap().device.unwrap().driver_peak_used_bytes.unwrap();
    assert!(peak <= cap, "peak {peak} over the capacity {cap}");
}
