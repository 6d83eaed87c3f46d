//! `kv_rot_hadamard_*`: the quantized KV cache's rotation (`hadamard_f32`) against
//! `backend::kv_rot::hadamard_slice`, bit for bit (the same butterflies in the same
//! order, one scale), for every block size a head can take and row counts of a decode
//! step, a batched step and a prompt chunk; the values past `n` must stay untouched.

use super::report::{Acc, CheckReport, Rng};
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::kv_rot::hadamard_slice;
use crate::backend::Backend;

/// (block, blocks) pairs: heads of 64…256 (K), 64 (V), and the kernel's limit 1024.
const CASES: [(usize, usize); 7] = [(64, 1), (64, 3 * 32), (128, 32), (128, 512 * 8), (256, 7), (512, 5), (1024, 3)];

pub fn run(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let mut gpu = GpuBackend::new(dev.clone());
    let mut rng = Rng::new(seed ^ 0x4ada_3a4d);
    let mut out = Vec::new();
    for (block, blocks) in CASES {
        let name = format!("kv_rot_hadamard_b{block}_x{blocks}");
        if !filter.map(|f| name.contains(f)).unwrap_or(true) {
            continue;
        }
        let mut acc = Acc::new(&name);
        let n = block * blocks;
        // Wide values (outliers of a few channels, as keys carry) and one sentinel past `n`.
        let x: Vec<f32> = rng.vec(n, 4.0).iter().enumerate().map(|(i, v)| if i % 37 == 0 { v * 50.0 } else { *v }).collect();
        let r = (|| -> crate::backend::Result<Vec<f32>> {
            let b = gpu.alloc(n + 1)?;
            let mut src = x.clone();
            src.push(123.5);
            gpu.write(b, &src)?;
            gpu.hadamard(b, n, block)?;
            let mut got = vec![0f32; n + 1];
            gpu.read(b, &mut got)?;
            gpu.free(b)?;
            Ok(got)
        })();
        match r {
            Ok(got) => {
                let mut want = x.clone();
                hadamard_slice(&mut want, block);
                want.push(123.5);
                acc.cmp_bits(&name, &got, &want);
            }
            Err(e) => acc.fail(e.to_string()),
        }
        out.push(acc.finish());
    }
    out
}
