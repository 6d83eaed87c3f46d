//! The weight cache under the CPU engine: whatever the prefill length, every weight the
//! forward pass reads is resident exactly once; the three residency modes compute on
//! the same bytes (bit-identical logits); over-budget and injected failures are clear
//! errors after which the same process (and the same engine) runs fine.

mod weights_common;

use lode_runtime::backend::cpu::CpuBackend;
use lode_runtime::backend::cached::CachedBackend;
use lode_runtime::weights::{Residency, Stage, WeightOptions};
use weights_common::*;

#[test]
fn one_copy_per_weight_at_every_prefill_length() {
    let f = file();
    let (n, bytes) = used(&f);
    let mut e = engine_on(&f, Box::new(cached(Residency::Device)), 2048 + 128 + 8).unwrap();
    // Nothing is copied at load in `device` residency.
    assert_eq!(e.weight_stats().unwrap().copies, 0);
    let mut hits = 0;
    for (i, len) in [1usize, 7, 64, 127, 513, 2048].into_iter().enumerate() {
        e.clear();
        let logits = run(&mut e, &prompt(len, i as u32), 128).unwrap();
        assert!(logits.iter().flatten().all(|x| x.is_finite()));
        let s = e.weight_stats().unwrap();
        assert_eq!(s.copies, n, "after prefill {len}: {s:?}");
        assert_eq!(s.misses, n, "after prefill {len}");
        assert_eq!(s.duplicates, 0, "after prefill {len}");
        assert!(s.resident_bytes <= bytes, "after prefill {len}: {} > {bytes}", s.resident_bytes);
        assert_eq!(s.failures, 0);
        assert!(s.hits > hits, "later requests hit");
        hits = s.hits;
        let d = s.device.unwrap();
        assert_eq!(d.allocated_bytes, s.resident_bytes);
        assert_eq!(d.peak_allocated_bytes, s.resident_bytes, "no transient weight memory");
    }
}

#[test]
fn residency_modes_give_bit_identical_logits() {
    let f = file();
    let (n, bytes) = used(&f);
    let p = prompt(300, 3);
    let plain = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 512).unwrap(), &p, 16).unwrap();
    for r in [Residency::Mapped, Residency::Device, Residency::Upload] {
        let mut e = engine_on(&f, Box::new(cached(r)), 512).unwrap();
        let at_load = e.weight_stats().unwrap();
        let got = run(&mut e, &p, 16).unwrap();
        assert!(got == plain, "{r}: logits differ from reading the mapping directly");
        let s = e.weight_stats().unwrap();
        match r {
            Residency::Mapped => assert_eq!((s.copies, s.mapped, s.mapped_bytes), (0, n, bytes)),
            Residency::Device => assert_eq!((at_load.copies, s.copies), (0, n)),
            Residency::Upload => assert_eq!((at_load.copies, at_load.resident_bytes, s.copies), (n, bytes, n)),
        }
        assert_eq!(s.duplicates, 0, "{r}");
    }
}

#[test]
fn over_budget_then_a_successful_run_in_the_same_process() {
    let f = file();
    let (n, bytes) = used(&f);
    let p = prompt(40, 9);
    let want = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 128).unwrap(), &p, 4).unwrap();

    // `device`: the first eval runs into the budget.
    let small = WeightOptions { residency: Some(Residency::Device), budget: Some(bytes / 2), ..Default::default() };
    let mut e = engine_on(&f, Box::new(CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &small).unwrap()), 128).unwrap();
    let err = run(&mut e, &p, 4).unwrap_err().to_string();
    assert!(err.contains("weight budget") && err.contains(&format!("{} bytes", bytes / 2)) && err.contains("blk."), "{err}");
    let s = e.weight_stats().unwrap();
    assert!(s.resident_bytes <= bytes / 2 && s.device.unwrap().allocated_bytes == s.resident_bytes);

    // `upload`: loading fails, naming the weight.
    let small_up = WeightOptions { residency: Some(Residency::Upload), ..small };
    let err = engine_on(&f, Box::new(CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &small_up).unwrap()), 128).err().unwrap().to_string();
    assert!(err.contains("weight budget"), "{err}");

    // A budget that fits: same process, right answer.
    let fits = WeightOptions { budget: Some(bytes), ..small };
    let mut e = engine_on(&f, Box::new(CachedBackend::new(Box::new(CpuBackend::new(2).unwrap()), &fits).unwrap()), 128).unwrap();
    assert!(run(&mut e, &p, 4).unwrap() == want);
    assert_eq!(e.weight_stats().unwrap().copies, n);
}

#[test]
fn an_injected_failure_leaves_the_engine_usable() {
    let f = file();
    let (n, _) = used(&f);
    let p = prompt(70, 5);
    let want = run(&mut engine_on(&f, Box::new(CpuBackend::new(2).unwrap()), 256).unwrap(), &p, 3).unwrap();
    for stage in [Stage::Pack, Stage::Alloc, Stage::Upload] {
        for at in [0, 1, n / 2, n - 1] {
            let mut be = cached(Residency::Device);
            be.cache_mut().inject_failure(stage, at);
            let mut e = engine_on(&f, Box::new(be), 256).unwrap();
            let err = run(&mut e, &p, 3).unwrap_err().to_string();
            assert!(err.contains("weight `"), "{stage:?} at {at}: {err}");
            let s = e.weight_stats().unwrap();
            assert_eq!(s.copies, at, "{stage:?}: copies before the failure stay");
            assert_eq!(s.device.unwrap().allocated_bytes, s.resident_bytes, "{stage:?} at {at}: leaked");
            // Same engine, next request: works and computes the same numbers.
            e.clear();
            assert!(run(&mut e, &p, 3).unwrap() == want, "{stage:?} at {at}");
            assert_eq!(e.weight_stats().unwrap().copies, n);
        }
    }
}
