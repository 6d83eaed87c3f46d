//! The weight cache over host memory: one copy per (region, layout), hits afterwards,
//! duplicates counted, budget and failures refused without leaking, `mapped` in place.

mod weights_common;

use lode_runtime::gguf::GgufFile;
use lode_runtime::model::Model;
use lode_runtime::quant::{self, row64, GgmlType};
use lode_runtime::weights::host::HostMaterializer;
use lode_runtime::weights::{Layout, Residency, Stage, WeightCache, WeightError, WeightOptions, WeightRef};
use std::sync::Arc;
use weights_common::*;

fn cache(r: Residency) -> WeightCache<HostMaterializer> {
    WeightCache::new(HostMaterializer::new(), r, &WeightOptions::default())
}

fn weights(m: &Model) -> Vec<WeightRef<'_>> {
    m.weight_ids().into_iter().map(|id| m.w(id)).collect()
}

fn model(f: &Arc<GgufFile>) -> Model {
    Model::load(f.clone()).unwrap()
}

/// Live device bytes equal resident bytes: nothing leaked, nothing double-counted.
fn no_leak(c: &WeightCache<HostMaterializer>) {
    let s = c.stats();
    assert_eq!(c.materializer().live_bytes(), s.resident_bytes, "{s:?}");
    let (a, f) = c.materializer().alloc_count();
    assert_eq!(a - f, s.copies, "allocations {a}, frees {f}, copies {}", s.copies);
}

fn check_contents(c: &WeightCache<HostMaterializer>, ws: &[WeightRef]) {
    for w in ws {
        let e = c.entry(w, Layout::Stored).unwrap_or_else(|| panic!("{} not resident", w.name()));
        assert_eq!(e.buf.as_ref().unwrap().bytes(), w.data(), "{}", w.name());
    }
}

#[test]
fn first_use_copies_later_uses_hit() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let mut c = cache(Residency::Device);
    for round in 0..3 {
        for w in &ws {
            c.get(w, Layout::Stored).unwrap();
        }
        let s = c.stats();
        assert_eq!((s.copies, s.misses, s.hits), (n, n, n * round), "round {round}");
    }
    let s = c.stats();
    assert_eq!(s.duplicates, 0);
    assert_eq!(s.resident_bytes, bytes);
    assert_eq!(s.source_bytes, bytes);
    assert_eq!(s.bytes_per_layout.get("ggml-native"), Some(&bytes));
    check_contents(&c, &ws);
    no_leak(&c);
}

#[test]
fn a_second_layout_is_served_and_counted_as_a_duplicate() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let w = ws.iter().find(|w| w.ty() == GgmlType::Q4_K).unwrap();
    let mut c = cache(Residency::Device);
    c.get(w, Layout::Stored).unwrap();
    c.get(w, Layout::Row64).unwrap();
    c.get(w, Layout::Row64).unwrap();
    let s = c.stats();
    assert_eq!((s.copies, s.duplicates, s.hits), (2, 1, 1));
    let (rows, k) = (w.n_rows(), w.row_len());
    let mut packed = vec![0u8; row64::packed_len(GgmlType::Q4_K, rows, k).unwrap()];
    row64::pack(GgmlType::Q4_K, w.data(), rows, k, &mut packed).unwrap();
    assert_eq!(s.duplicate_bytes, packed.len() as u64);
    assert_eq!(c.entry(w, Layout::Row64).unwrap().buf.as_ref().unwrap().bytes(), &packed[..]);
    assert_eq!(s.bytes_per_layout.get("q4k-i4-k32-row64"), Some(&(packed.len() as u64)));

    // An f32 "dequantized" view of an f32 tensor is its stored bytes: no duplicate.
    let v = ws.iter().find(|w| w.ty() == GgmlType::F32).unwrap();
    c.get(v, Layout::Stored).unwrap();
    c.get(v, Layout::F32).unwrap();
    assert_eq!(c.stats().duplicates, 1);

    // An f16 norm as f32: dequantized bytes.
    let h = ws.iter().find(|w| w.ty() == GgmlType::F16).unwrap();
    c.get(h, Layout::F32).unwrap();
    let mut want = vec![0f32; h.row_len() * h.n_rows()];
    quant::dequantize(GgmlType::F16, h.data(), &mut want).unwrap();
    assert_eq!(c.entry(h, Layout::F32).unwrap().buf.as_ref().unwrap().bytes(), bytemuck::cast_slice::<f32, u8>(&want));
    no_leak(&c);

    // A layout the type does not have is an error naming it.
    let err = c.get(h, Layout::Row64).unwrap_err().to_string();
    assert!(err.contains(h.name()) && err.contains("row64"), "{err}");
}

#[test]
fn over_budget_is_a_clear_error_and_the_cache_stays_usable() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let budget = bytes / 2;
    let mut c = WeightCache::new(HostMaterializer::new(), Residency::Device, &WeightOptions { budget: Some(budget), ..Default::default() });
    let mut failed = None;
    for w in &ws {
        if let Err(e) = c.get(w, Layout::Stored) {
            failed = Some((w.name().to_string(), w.data().len(), e));
            break;
        }
    }
    let (name, len, e) = failed.expect("half the bytes cannot hold every weight");
    assert!(matches!(e, WeightError::OverBudget { .. }) && e.is_out_of_memory());
    let msg = e.to_string();
    assert!(msg.contains(&name) && msg.contains(&format!("{len} bytes")) && msg.contains(&format!("{budget} bytes")) && msg.contains("weight budget"), "{msg}");
    assert!(c.stats().resident_bytes <= budget);
    no_leak(&c);

    c.set_budget(Some(bytes));
    for w in &ws {
        c.get(w, Layout::Stored).unwrap();
    }
    assert_eq!(c.stats().copies, n);
    assert_eq!(c.stats().failures, 1);
    check_contents(&c, &ws);
    no_leak(&c);
}

#[test]
fn an_injected_failure_at_every_materialization_point_rolls_back() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let n = ws.len();
    for stage in [Stage::Pack, Stage::Alloc, Stage::Upload] {
        for at in 0..n {
            let mut c = cache(Residency::Device);
            c.inject_failure(stage, at as u64);
            let mut errs = Vec::new();
            for (i, w) in ws.iter().enumerate() {
                if let Err(e) = c.get(w, Layout::Stored) {
                    errs.push((i, e.to_string()));
                }
            }
            assert_eq!(errs.len(), 1, "{stage:?} at {at}: {errs:?}");
            assert_eq!(errs[0].0, at, "{stage:?}");
            assert!(errs[0].1.contains(ws[at].name()), "{}", errs[0].1);
            no_leak(&c);
            assert_eq!(c.stats().copies as usize, n - 1);
            // The failed weight materializes on the next request.
            c.get(&ws[at], Layout::Stored).unwrap();
            assert_eq!(c.stats().copies as usize, n);
            check_contents(&c, &ws);
            no_leak(&c);
        }
    }
}

#[test]
fn the_test_allocator_limit_fails_like_a_full_device() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let mut c = WeightCache::new(HostMaterializer::new(), Residency::Device, &WeightOptions { test_alloc_limit: Some(bytes / 3), ..Default::default() });
    let e = ws.iter().find_map(|w| c.get(w, Layout::Stored).err()).expect("limit reached");
    assert!(matches!(e, WeightError::Alloc { out_of_memory: true, .. }), "{e}");
    no_leak(&c);
    c.set_alloc_limit(None);
    for w in &ws {
        c.get(w, Layout::Stored).unwrap();
    }
    assert_eq!(c.stats().copies, n);
    no_leak(&c);
}

#[test]
fn preload_is_all_or_nothing() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let mut c = cache(Residency::Upload);
    c.inject_failure(Stage::Upload, n / 2);
    let e = c.preload(ws.iter().map(|w| (*w, Layout::Stored))).unwrap_err();
    assert!(e.to_string().contains(ws[n as usize / 2].name()), "{e}");
    assert!(c.is_empty());
    assert_eq!((c.stats().copies, c.stats().resident_bytes, c.materializer().live_bytes()), (0, 0, 0));
    c.preload(ws.iter().map(|w| (*w, Layout::Stored))).unwrap();
    let s = c.stats();
    assert_eq!((s.copies, s.resident_bytes, s.duplicates), (n, bytes, 0));
    check_contents(&c, &ws);
    no_leak(&c);
}

#[test]
fn mapped_reads_stored_weights_in_place() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let mut c = cache(Residency::Mapped);
    let base = 0x7000_0000_0000u64;
    c.set_mapping(f.bytes(), base);
    for w in &ws {
        assert_eq!(c.get(w, Layout::Stored).unwrap(), base + w.view.file_offset, "{}", w.name());
        assert_eq!(c.get(w, Layout::Stored).unwrap(), base + w.view.file_offset);
    }
    let s = c.stats();
    assert_eq!((s.copies, s.mapped, s.mapped_bytes, s.resident_bytes, s.hits), (0, n, bytes, 0, n));
    // A layout other than the stored one still gets (one) device copy.
    let h = ws.iter().find(|w| w.ty() == GgmlType::F16).unwrap();
    c.get(h, Layout::F32).unwrap();
    c.get(h, Layout::F32).unwrap();
    let s = c.stats();
    assert_eq!((s.copies, s.duplicates), (1, 1));
    no_leak(&c);

    // Without a registered mapping, `mapped` falls back to a copy.
    let mut c = cache(Residency::Mapped);
    c.get(&ws[0], Layout::Stored).unwrap();
    assert_eq!(c.stats().copies, 1);
}

/// A backend whose file registration failed falls back to `device`: every stored-layout
/// weight is then copied (byte for byte), none is served in place, and the report says
/// which mode fell back and why.
#[test]
fn a_fallback_from_mapped_copies_and_is_reported() {
    let f = file();
    let m = model(&f);
    let ws = weights(&m);
    let (n, bytes) = used(&f);
    let mut c = cache(Residency::Mapped);
    c.set_mapping(f.bytes(), 0x7000_0000_0000);
    c.fall_back(Residency::Device, "registering chunk 1 of 3 failed: injected".into());
    assert_eq!(c.residency(), Residency::Device);
    assert!(!c.has_mapping());
    for w in &ws {
        let p = c.get(w, Layout::Stored).unwrap();
        assert!(p < 0x7000_0000_0000 || p >= 0x7000_0000_0000 + f.bytes().len() as u64, "{} served from the dropped mapping", w.name());
    }
    check_contents(&c, &ws);
    let s = c.stats();
    assert_eq!((s.copies, s.mapped, s.resident_bytes), (n, 0, bytes));
    assert_eq!(s.residency, Some(Residency::Device));
    assert_eq!(s.residency_fallback.as_deref(), Some("mapped → device: registering chunk 1 of 3 failed: injected"));
    assert!(s.summary().contains("residency fell back (mapped → device: registering chunk 1 of 3"), "{}", s.summary());
    no_leak(&c);
}
