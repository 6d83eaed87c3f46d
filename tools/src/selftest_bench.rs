//! `lode selftest --bench`: kernel-level decode bandwidth on the GPU. Each quantized
//! matvec (q8_1 activations, one column) runs on a weight larger than the L2 cache;
//! reported as achieved GB/s of weight bytes read, next to a device-to-device copy
//! (read + write bytes), the practical ceiling.

use lode_runtime::backend::gpu::family::{elementwise, matvec, quantize};
use anyhow::Result;
use lode_runtime::backend::gpu::{selftest, GpuDevice};
use lode_runtime::quant::GgmlType;

fn time_ms(dev: &GpuDevice, reps: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    for _ in 0..3 {
        f()?;
    }
    let t = dev.timer()?;
    t.start()?;
    for _ in 0..reps {
        f()?;
    }
    Ok(t.stop_ms()? as f64 / reps as f64)
}

pub fn run(dev: &GpuDevice) -> Result<()> {
    let bytes = 1usize << 30;
    let a = dev.alloc(bytes)?;
    let b = dev.alloc(bytes)?;
    let ms = time_ms(dev, 10, || Ok(dev.copy(b.ptr(), a.ptr(), bytes)?))?;
    println!("bench d2d copy {} MiB: {:.3} ms, {:.0} GB/s (read+write)", bytes >> 20, ms, 2.0 * bytes as f64 / ms / 1e6);
    drop((a, b));
    let mut rng = selftest::Rng::new(1);
    // Shapes of the synthetic presets' decode matvecs (4B: 2560 / 9728; 8B: 4096 / 14336)
    // and the big heads. Each weight is uploaded in enough copies (cycled) to total
    // ≥ 256 MiB, so the 60 MB L2 cannot serve repetitions: these are DRAM figures.
    for (ty, rows, k) in [
        (GgmlType::Q4_K, 14336, 4096),
        (GgmlType::Q6_K, 4096, 14336),
        (GgmlType::Q4_K, 4096, 14336),
        (GgmlType::Q4_K, 4096, 4096),
        (GgmlType::Q4_K, 9728, 2560),
        (GgmlType::Q6_K, 2560, 9728),
        (GgmlType::Q4_K, 2560, 4096),
        (GgmlType::Q4_K, 1024, 2560),
        (GgmlType::Q5_K, 16384, 4096),
        (GgmlType::Q8_0, 16384, 4096),
        (GgmlType::Q4_0, 16384, 4096),
        (GgmlType::Q4_1, 16384, 4096),
        (GgmlType::Q5_0, 16384, 4096),
        (GgmlType::F16, 8192, 4096),
        (GgmlType::Q6_K, 151936, 1024),
        (GgmlType::Q6_K, 128256, 4096),
    ] {
        let w = selftest::random_weights(&mut rng, ty, rows, k);
        let copies = ((256usize << 20) / w.len()).clamp(1, 64);
        let wbs: Vec<_> = (0..copies).map(|_| dev.upload(&w)).collect::<std::result::Result<_, _>>()?;
        let x = rng.vec(k * 8, 1.0);
        let xb = dev.upload_f32(&x)?;
        let qb = dev.alloc(quantize::q8_1_bytes(k, 8))?;
        let yb = dev.alloc(rows * 8 * 4)?;
        let q8 = matvec::matvec_takes_q8_1(ty);
        if let Some(f) = quantize::act_fmt(ty) {
            quantize::quantize_act(dev, f, xb.ptr(), qb.ptr(), k, 8)?;
        }
        let xin = if q8 { qb.ptr() } else { xb.ptr() };
        for ncols in [1usize, 8] {
            let mut i = 0;
            let ms = time_ms(dev, 40, || {
                i += 1;
                Ok(matvec::matvec(dev, wbs[i % copies].ptr(), ty, rows, k, xin, yb.ptr(), ncols)?)
            })?;
            println!(
                "bench matvec {ty:<5} {rows:>6}x{k:<5} ncols={ncols}: {:8.1} us  {:6.0} GB/s weights ({copies} copies)",
                ms * 1e3,
                w.len() as f64 / ms / 1e6
            );
        }
    }
    // Small launches: the per-kernel floor that decode of small models sees.
    let xb = dev.alloc(4096 * 4)?;
    let ms = time_ms(dev, 200, || Ok(elementwise::scale(dev, xb.ptr(), xb.ptr(), 1024, 1.0)?))?;
    println!("bench tiny kernel (scale 1024): {:.1} us per launch", ms * 1e3);
    Ok(())
}
