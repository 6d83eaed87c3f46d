//! Graph replay's decisions (hit, rebind, rebuild, new instance, eviction, fallback) over
//! an executor that really runs the work in host memory: instances are programs bound to
//! addresses when built or rebound, a launch executes the bound program, and a freed
//! allocation is an illegal address. So a stale binding shows up as wrong tokens or an
//! error, exactly as it would on a GPU. The GPU twin of these checks runs in
//! `lode selftest` (`backend::gpu::selftest::replay`).

mod replay_common;

use lode_runtime::backend::gpu::replay::signature::signature;
use lode_runtime::backend::gpu::replay::{Entry, Replay};
use replay_common::*;

/// Greedy tokens of `n` decode steps from `tok`, starting at position `from`.
fn decode(t: &Tiny, x: &MemExec, r: &mut Replay, tok: u32, from: u32, n: u32) -> Vec<u32> {
    let mut out = vec![tok];
    for p in from..from + n {
        let next = t.step(x, r, *out.last().unwrap(), p).unwrap();
        out.push(next);
    }
    out
}

fn reference(n: u32) -> Vec<u32> {
    let x = MemExec::new();
    let t = Tiny::new(&x, 64);
    let mut r = Replay::with_capacity(8);
    r.enabled = false;
    let v = decode(&t, &x, &mut r, 3, 0, n);
    assert_eq!((r.stats.captures, r.stats.hits), (0, 0), "replay off replays nothing");
    v
}

#[test]
fn decode_steps_hit_one_instance_and_match_eager_tokens() {
    let want = reference(24);
    let x = MemExec::new();
    let t = Tiny::new(&x, 64);
    let mut r = Replay::with_capacity(8);
    assert_eq!(decode(&t, &x, &mut r, 3, 0, 24), want);
    let s = r.stats;
    assert_eq!((s.eager_steps, s.captures, s.hits, s.rebinds, s.rebuilds), (2, 1, 22, 0, 0), "{s:?}");
    assert_eq!(x.counts().launches, 22);
    assert_eq!(r.instances(), 1);
}

#[test]
fn distinct_physical_bindings_give_distinct_instances_used_alternately() {
    let want = reference(12);
    let x = MemExec::new();
    let a = Tiny::new(&x, 64);
    // A second sequence: its own KV arena and staging, same weights and activations.
    let b = a.with_own_cache(&x, 64);
    let mut r = Replay::with_capacity(8);
    let (mut ta, mut tb) = (vec![3u32], vec![3u32]);
    for p in 0..12 {
        ta.push(a.step(&x, &mut r, *ta.last().unwrap(), p).unwrap());
        tb.push(b.step(&x, &mut r, *tb.last().unwrap(), p).unwrap());
    }
    assert_eq!(ta, want);
    assert_eq!(tb, want);
    let s = r.stats;
    // Steps 1-2 eager (A, B: capture of B's), A's second step gets its own instance;
    // from then on each sequence hits its own instance, never rebinding the other's.
    assert_eq!((s.eager_steps, s.captures, s.rebinds, s.rebuilds, s.hits), (2, 2, 0, 0, 21), "{s:?}");
    assert_eq!(r.instances(), 2);
    assert_eq!(x.counts().instantiated, 2);
}

#[test]
fn signature_is_stable_across_runs_and_ignores_addresses() {
    // Two executors place every buffer at different addresses.
    let (x1, x2) = (MemExec::new(), MemExec::with_base(0x7f00_0000_0000));
    let (t1, t2) = (Tiny::new(&x1, 64), Tiny::new(&x2, 64));
    let (s1, s2) = (t1.record(5), t2.record(9));
    assert_ne!(s1, s2, "the records differ in addresses");
    assert_eq!(signature(&s1), signature(&s2));
    // The same work hashes to the same key in every process and build.
    assert_eq!(signature(&s1), GOLDEN_SIGNATURE, "{:#x}", signature(&s1));
    // Any scalar (here the row length) is part of the signature.
    let t3 = Tiny::with_dim(&x1, 64, DIM + 4);
    assert_ne!(signature(&t3.record(0)), signature(&s1));
}

#[test]
fn reallocating_the_kv_arena_rebinds_and_keeps_the_tokens() {
    let want = reference(20);
    for refuse in [false, true] {
        let x = MemExec::new();
        let mut t = Tiny::new(&x, 64);
        let mut r = Replay::with_capacity(8);
        x.refuse_rebind.set(refuse);
        let mut got = decode(&t, &x, &mut r, 3, 0, 8);
        // Grow the cache: new arena elsewhere, contents moved, old arena freed.
        t.realloc_kv(&x, &mut r, 128);
        let more = decode(&t, &x, &mut r, *got.last().unwrap(), 8, 12);
        got.extend_from_slice(&more[1..]);
        assert_eq!(got, want, "refuse rebind: {refuse}");
        let s = r.stats;
        assert_eq!(s.captures, 1, "{s:?}");
        if refuse {
            assert_eq!((s.rebinds, s.rebuilds), (0, 1), "{s:?}");
        } else {
            assert_eq!((s.rebinds, s.rebuilds), (1, 0), "{s:?}");
            assert_eq!(x.counts().rebinds, 1);
        }
        // The step right after the reallocation runs eagerly (the free is a barrier).
        assert_eq!(s.eager_steps, 3, "{s:?}");
        assert_eq!(s.hits, 20 - s.eager_steps - s.rebinds - s.rebuilds, "{s:?}");
        assert_eq!(r.instances(), 1);
    }
}

#[test]
fn a_mutable_offset_change_rebinds_the_same_instance() {
    let want = reference(16);
    let x = MemExec::new();
    let mut t = Tiny::new(&x, 256);
    let mut r = Replay::with_capacity(8);
    let mut got = decode(&t, &x, &mut r, 3, 0, 6);
    // The sequence moves to another region of the same arena (same buffer, new offset).
    t.move_kv_offset(&x, 100);
    let more = decode(&t, &x, &mut r, *got.last().unwrap(), 6, 10);
    got.extend_from_slice(&more[1..]);
    assert_eq!(got, want);
    let s = r.stats;
    assert_eq!((s.captures, s.rebinds, s.rebuilds), (1, 1, 0), "{s:?}");
    assert_eq!(r.instances(), 1);
}

#[test]
fn a_new_signature_in_a_reused_record_array_gets_a_new_instance() {
    let x = MemExec::new();
    let t = Tiny::new(&x, 64);
    let mut r = Replay::with_capacity(8);
    let mut tok = 3;
    for p in 0..4 {
        tok = t.step(&x, &mut r, tok, p).unwrap();
    }
    assert_eq!(r.instances(), 1);
    // Build a step of another shape in the very allocation a recorded step used.
    let mut arr: Vec<Entry> = t.record(4);
    let before = arr.as_ptr();
    let wide = Tiny::with_dim(&x, 64, DIM + 4);
    arr.clear();
    arr.extend(wide.record(0));
    assert_eq!(arr.as_ptr(), before, "the array is reused");
    assert!(r.instance_for(&arr).is_none(), "the old instance must not answer for new work");
    // Run the new work through replay twice: captured as its own instance, right logits.
    let mut eager = Replay::with_capacity(8);
    eager.enabled = false;
    let w1 = wide.step(&x, &mut eager, 5, 0).unwrap();
    let w2 = wide.step(&x, &mut eager, 5, 0).unwrap();
    let g1 = wide.step(&x, &mut r, 5, 0).unwrap();
    let g2 = wide.step(&x, &mut r, 5, 0).unwrap();
    let g3 = wide.step(&x, &mut r, 5, 0).unwrap();
    assert_eq!((g1, g2, g3), (w1, w2, w2));
    assert_eq!(r.instances(), 2);
    assert_eq!(r.stats.captures, 2, "{:?}", r.stats);
}

#[test]
fn the_instance_cache_is_bounded_and_eviction_is_safe() {
    let want = reference(10);
    let x = MemExec::new();
    let a = Tiny::new(&x, 64);
    let b = a.with_own_cache(&x, 64);
    let mut r = Replay::with_capacity(1);
    let (mut ta, mut tb) = (vec![3u32], vec![3u32]);
    for p in 0..10 {
        ta.push(a.step(&x, &mut r, *ta.last().unwrap(), p).unwrap());
        tb.push(b.step(&x, &mut r, *tb.last().unwrap(), p).unwrap());
    }
    assert_eq!((ta, tb), (want.clone(), want));
    assert_eq!(r.instances(), 1);
    assert!(r.stats.evictions > 0, "{:?}", r.stats);
    assert_eq!(x.counts().destroyed, r.stats.evictions);
}

#[test]
fn a_step_that_leaves_the_record_midway_runs_eagerly_and_right() {
    let want = reference(12);
    let x = MemExec::new();
    let mut t = Tiny::new(&x, 64);
    let mut r = Replay::with_capacity(8);
    let mut got = decode(&t, &x, &mut r, 3, 0, 6);
    // One step with an extra (no-op) kernel at the end: prefix matches, then diverges.
    t.extra = true;
    got.push(t.step(&x, &mut r, *got.last().unwrap(), 6).unwrap());
    t.extra = false;
    let more = decode(&t, &x, &mut r, *got.last().unwrap(), 7, 5);
    got.extend_from_slice(&more[1..]);
    assert_eq!(got, want);
    assert!(r.stats.fallbacks >= 1, "{:?}", r.stats);
    assert_eq!(r.stats.captures, 1, "{:?}", r.stats);
}

#[test]
fn a_barrier_mid_step_is_never_captured() {
    let x = MemExec::new();
    let t = Tiny::new(&x, 64);
    let mut r = Replay::with_capacity(8);
    for p in 0..5 {
        t.step_with_barrier(&x, &mut r, 3, p).unwrap();
    }
    assert_eq!((r.stats.captures, r.instances()), (0, 0), "{:?}", r.stats);
}
