//! The registration loop against a fake driver that counts every pin and unpin: a whole
//! file, a driver failure at chunk k, the injected failure and stall, a stalled call that
//! returns late (its chunk is still unregistered), the whole-file bound, addresses that do
//! not continue each other. Each ends with nothing left registered.

use super::*;
use crate::backend::gpu::driver::Api;
use std::sync::Mutex;

const MIB: usize = 1 << 20;

/// A driver whose device address of host byte `p` is `BASE + (p - file start)` (as under
/// unified addressing), failing, blocking or jumping at chosen calls (from 1).
#[derive(Default)]
struct Fake {
    start: usize,
    calls: Mutex<usize>,
    pinned: Mutex<Vec<(usize, usize)>>,
    unpinned: Mutex<Vec<(usize, usize)>>,
    fail_at: Option<usize>,
    block: Option<(usize, Duration)>,
    jump_at: Option<usize>,
    per_call: Duration,
}

const BASE: u64 = 0x7f00_0000_0000;

impl HostPin for Fake {
    fn pin(&self, host: &[u8]) -> Result<DevPtr, DriverError> {
        let call = {
            let mut c = self.calls.lock().unwrap();
            *c += 1;
            *c
        };
        std::thread::sleep(self.per_call);
        if let Some((k, d)) = self.block {
            if k == call {
                std::thread::sleep(d);
            }
        }
        if self.fail_at == Some(call) {
            return Err(DriverError::Call { api: Api::Cuda, call: "cuMemHostRegister", code: 2, name: "CUDA_ERROR_OUT_OF_MEMORY".into() });
        }
        self.pinned.lock().unwrap().push((host.as_ptr() as usize, host.len()));
        let jump = if self.jump_at == Some(call) { 1 << 30 } else { 0 };
        Ok(BASE + (host.as_ptr() as usize - self.start) as u64 + jump)
    }
    fn unpin(&self, host: &[u8]) {
        self.unpinned.lock().unwrap().push((host.as_ptr() as usize, host.len()));
    }
}

impl Fake {
    fn pinned(&self) -> Vec<(usize, usize)> {
        let mut v = self.pinned.lock().unwrap().clone();
        v.sort();
        v
    }
    fn unpinned(&self) -> Vec<(usize, usize)> {
        let mut v = self.unpinned.lock().unwrap().clone();
        v.sort();
        v
    }
    /// Waits (up to 3 s) until every pinned range was unpinned once, and says whether so.
    fn all_released(&self) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if self.pinned() == self.unpinned() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

fn file(len: usize) -> Arc<Vec<u8>> {
    Arc::new((0..len).map(|i| (i * 7) as u8).collect())
}

fn bounds(per_chunk_ms: u64, total_ms: u64) -> Bounds {
    Bounds { chunk: MIB, per_chunk: Duration::from_millis(per_chunk_ms), total: Duration::from_millis(total_ms) }
}

fn go(src: &Arc<Vec<u8>>, fake: Fake, b: Bounds, inject: Option<Inject>) -> (Result<Registered, RegisterError>, Arc<Fake>, Vec<Progress>) {
    let fake = Arc::new(Fake { start: src.as_ptr() as usize, ..fake });
    let seen = Mutex::new(Vec::new());
    let r = register(src.clone(), fake.clone(), b, inject, false, &|p| seen.lock().unwrap().push(p));
    (r, fake, seen.into_inner().unwrap())
}

#[test]
fn a_whole_file_registers_in_chunks_and_unregisters_on_drop() {
    let src = file(10 * MIB + 12345);
    let (r, fake, seen) = go(&src, Fake::default(), bounds(5000, 60_000), None);
    let r = r.unwrap();
    assert_eq!(r.device_ptr, BASE);
    assert_eq!(r.chunks().len(), 11);
    assert_eq!(r.chunks()[10], (10 * MIB, 12345));
    assert_eq!(seen.len(), 11);
    assert_eq!(seen.last(), Some(&Progress { done: 11, chunks: 11, bytes: src.len() }));
    assert!(seen.windows(2).all(|w| w[1].bytes > w[0].bytes));
    assert_eq!(fake.pinned().len(), 11);
    assert!(fake.unpinned().is_empty(), "nothing unregistered while in use");
    drop(r);
    assert_eq!(fake.pinned(), fake.unpinned());
}

#[test]
fn a_driver_failure_at_chunk_k_names_it_and_leaves_nothing_registered() {
    let src = file(8 * MIB);
    let (r, fake, seen) = go(&src, Fake { fail_at: Some(4), ..Default::default() }, bounds(5000, 60_000), None);
    match r {
        Err(RegisterError::Failed { chunk, chunks, offset, bytes, msg }) => {
            assert_eq!((chunk, chunks, offset, bytes), (4, 8, 3 * MIB, MIB));
            assert!(msg.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{msg}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("registered despite a failing call"),
    }
    assert_eq!(seen.len(), 3);
    assert_eq!(fake.pinned().len(), 3);
    // Unregistered before the error was returned, not later.
    assert_eq!(fake.pinned(), fake.unpinned());
}

#[test]
fn an_injected_failure_fails_that_chunk() {
    let src = file(5 * MIB);
    let (r, fake, _) = go(&src, Fake::default(), bounds(5000, 60_000), Some(Inject::Fail(3)));
    let e = r.err().expect("the injected failure");
    assert!(matches!(&e, RegisterError::Failed { chunk: 3, chunks: 5, .. }), "{e}");
    assert!(e.to_string().contains("mapped_inject=fail:3"), "{e}");
    assert_eq!(fake.pinned().len(), 2);
    assert_eq!(fake.pinned(), fake.unpinned());
}

#[test]
fn an_injected_stall_is_given_up_at_the_chunk_bound() {
    let src = file(6 * MIB);
    let t = Instant::now();
    let (r, fake, seen) = go(&src, Fake::default(), bounds(150, 60_000), Some(Inject::Stall(2)));
    let took = t.elapsed();
    match r {
        Err(RegisterError::Stalled { chunk, chunks, done, offset, waited, limit }) => {
            assert_eq!((chunk, chunks, done, offset), (2, 6, 1, MIB));
            assert!(waited >= 0.14, "{waited}");
            assert!(limit.contains("mapped_stall_s"), "{limit}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a stalled chunk registered"),
    }
    assert!(took < Duration::from_secs(2), "gave up after {took:?}");
    assert_eq!(seen.len(), 1);
    // The first chunk was registered; the worker releases it once it sees the caller left.
    assert_eq!(fake.pinned().len(), 1);
    assert!(fake.all_released(), "pinned {:?}, unpinned {:?}", fake.pinned(), fake.unpinned());
}

#[test]
fn a_call_that_returns_after_the_bound_is_unregistered_when_it_does() {
    let src = file(6 * MIB);
    let fake = Fake { block: Some((3, Duration::from_millis(700))), ..Default::default() };
    let t = Instant::now();
    let (r, fake, _) = go(&src, fake, bounds(150, 60_000), None);
    assert!(t.elapsed() < Duration::from_millis(650), "waited for the stalled call: {:?}", t.elapsed());
    assert!(matches!(r, Err(RegisterError::Stalled { chunk: 3, done: 2, .. })));
    // The late call then registers chunk 3; the worker sees it was abandoned and releases
    // all three, so nothing stays page-locked.
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(fake.pinned().len(), 3, "{:?}", fake.pinned());
    assert!(fake.all_released(), "pinned {:?}, unpinned {:?}", fake.pinned(), fake.unpinned());
    assert_eq!(*fake.calls.lock().unwrap(), 3, "no chunk after the abandoned one was tried");
}

#[test]
fn the_whole_file_bound_ends_a_registration_that_crawls() {
    let src = file(20 * MIB);
    let fake = Fake { per_call: Duration::from_millis(40), ..Default::default() };
    let (r, fake, seen) = go(&src, fake, bounds(5000, 200), None);
    match r {
        Err(RegisterError::Stalled { done, limit, .. }) => {
            assert!((1..=6).contains(&done), "{done} chunks in 200 ms at 40 ms each");
            assert_eq!(seen.len(), done);
            assert!(limit.contains("mapped_total_s"), "{limit}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("20 chunks of 40 ms within 200 ms"),
    }
    assert!(fake.all_released(), "pinned {:?}, unpinned {:?}", fake.pinned(), fake.unpinned());
}

#[test]
fn chunks_whose_addresses_do_not_continue_are_refused() {
    let src = file(4 * MIB);
    let (r, fake, _) = go(&src, Fake { jump_at: Some(2), ..Default::default() }, bounds(5000, 60_000), None);
    match r {
        Err(RegisterError::Discontiguous { chunk, offset, device, .. }) => {
            assert_eq!((chunk, offset), (2, MIB));
            assert_eq!(device, BASE + MIB as u64 + (1 << 30));
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a gap between chunks was accepted"),
    }
    assert_eq!(fake.pinned().len(), 2);
    assert_eq!(fake.pinned(), fake.unpinned());
}

#[test]
fn injections_parse_and_bounds_round() {
    assert_eq!("fail:3".parse::<Inject>(), Ok(Inject::Fail(3)));
    assert_eq!(" stall:1".parse::<Inject>(), Ok(Inject::Stall(1)));
    for bad in ["fail:0", "stall", "hang:2", "fail:x"] {
        assert!(bad.parse::<Inject>().is_err(), "{bad}");
    }
    let b = Bounds::new(256 * MIB, 30, 0, 10 << 30);
    assert_eq!((b.chunk, b.per_chunk), (256 * MIB, Duration::from_secs(30)));
    assert_eq!(b.total, Duration::from_secs(60 + 160), "60 s + 1 s per 64 MiB");
    let b = Bounds::new(1_000_000, 0, 90, 10 << 30);
    assert_eq!((b.chunk, b.per_chunk, b.total), (1_003_520, Duration::from_secs(1), Duration::from_secs(90)));
}
