//! `upload_stage`: weight uploads through page-locked staging on the second stream
//! (`gpu/upload.rs`) land byte for byte and in order with the compute stream: buffers from
//! 1 byte to several staging buffers long, all queued before any is read back (so every
//! staging buffer is reused while copies are in flight), and one buffer written twice
//! (the compute stream must see the second copy).

use super::CheckReport;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::upload::{Stager, STAGE_BYTES};

pub fn run(dev: &GpuDevice, filter: Option<&str>) -> Vec<CheckReport> {
    if !filter.map(|f| "upload_stage".contains(f)).unwrap_or(true) {
        return Vec::new();
    }
    let r = check(dev);
    vec![CheckReport {
        name: "upload_stage".into(),
        cases: 1,
        max_err: 0.0,
        worst_ratio: if r.is_ok() { 0.0 } else { f64::INFINITY },
        skipped: false,
        failure: r.err(),
    }]
}

fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn check(dev: &GpuDevice) -> Result<(), String> {
    let e = |e: crate::backend::gpu::driver::DriverError| e.to_string();
    let mut s = Stager::new(dev).map_err(e)?;
    let sizes = [1, 4097, STAGE_BYTES, 2 * STAGE_BYTES + 12_345, 3 << 20, 5 * STAGE_BYTES + 1];
    let mut bufs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let data = bytes(n, i as u64 + 1);
        let b = dev.alloc(n).map_err(e)?;
        s.upload(b.ptr(), &data).map_err(e)?;
        bufs.push((b, data));
    }
    // The second buffer again, with other bytes: the later copy wins.
    let again = bytes(sizes[1], 99);
    s.upload(bufs[1].0.ptr(), &again).map_err(e)?;
    bufs[1].1 = again;
    for (i, (b, want)) in bufs.iter().enumerate() {
        let mut got = vec![0u8; want.len()];
        dev.read(b.ptr(), &mut got).map_err(e)?;
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            return Err(format!("upload {i} ({} bytes): byte {at} is {:#x}, want {:#x}", want.len(), got[at], want[at]));
        }
    }
    s.wait().map_err(e)
}
