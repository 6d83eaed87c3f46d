//! Benchmark of the CPU dot kernels: a decode-shaped matvec (`matmul` with one token)
//! per weight type, scalar vs AVX2, 1 and 2 threads, reported as weight GB/s (weight
//! bytes read per second), mean ± sd over repetitions after a warm-up.
//!
//! ```text
//! cargo run --release -p lode-runtime --example quant_bench -- [--mb 64] [--reps 10] [--types q4_k,q8_0] [--threads 1,2] [--tokens 1]
//! cargo run --release -p lode-runtime --example quant_bench -- --gguf MODEL.gguf [--reps 10] [--threads 1,2]
//! ```
//! The weight matrix (`--mb` MiB, K = 2048) is far larger than the caches, so the numbers
//! are what decode sees: memory bandwidth once the kernel is fast enough.
//!
//! With `--gguf`, every 2-D weight of the model (and the tied output, `token_embd`, when
//! there is no `output.weight`) is multiplied by one activation row, in file order, as a
//! decode step would: the time per pass bounds decode tokens/s from the matmuls alone.

use std::time::Instant;

use lode_runtime::quant::{matmul_quantized, quantize, quantize_rows, GgmlType, Isa};

struct Opts {
    mb: usize,
    reps: usize,
    types: Vec<GgmlType>,
    threads: Vec<usize>,
    tokens: usize,
    k: usize,
    gguf: Option<String>,
    rows: Option<usize>,
}

fn parse() -> Opts {
    let mut o = Opts {
        mb: 64,
        reps: 10,
        types: GgmlType::WEIGHTS.to_vec(),
        threads: vec![1, 2],
        tokens: 1,
        k: 2048,
        gguf: None,
        rows: None,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i + 1 < args.len() {
        let v = &args[i + 1];
        match args[i].as_str() {
            "--mb" => o.mb = v.parse().expect("--mb N"),
            "--reps" => o.reps = v.parse().expect("--reps N"),
            "--tokens" => o.tokens = v.parse().expect("--tokens N"),
            "--k" => o.k = v.parse().expect("--k N"),
            "--gguf" => o.gguf = Some(v.clone()),
            "--rows" => o.rows = Some(v.parse().expect("--rows N")),
            "--threads" => {
                o.threads = v
                    .split(',')
                    .map(|t| t.parse().expect("--threads 1,2"))
                    .collect()
            }
            "--types" => {
                o.types = v
                    .split(',')
                    .map(|t| {
                        *GgmlType::ALL
                            .iter()
                            .chain(&GgmlType::GRID_WEIGHTS)
                            .find(|g| g.name().eq_ignore_ascii_case(t))
                            .unwrap_or_else(|| panic!("unknown type {t}"))
                    })
                    .collect()
            }
            other => panic!("unknown option {other}"),
        }
        i += 2;
    }
    o
}

/// `rows × k` weights of `ty`: 16 distinct quantized rows, tiled.
fn weights(ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let rb = ty.bytes_for(k as u64).unwrap() as usize;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut base = vec![0u8; 16 * rb];
    if GgmlType::GRID_WEIGHTS.contains(&ty) && ty != GgmlType::IQ3_S {
        // No quantizer: random valid blocks.
        base = lode_runtime::quant::grid_random_blocks(ty, 16 * k / 256, 1, 0.05);
    }
    for r in 0..16 {
        if GgmlType::GRID_WEIGHTS.contains(&ty) && ty != GgmlType::IQ3_S {
            break;
        }
        let x: Vec<f32> = (0..k)
            .map(|_| {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
            })
            .collect();
        quantize(ty, &x, &mut base[r * rb..(r + 1) * rb]).unwrap();
    }
    let mut w = vec![0u8; rows * rb];
    for (r, row) in w.chunks_mut(rb).enumerate() {
        row.copy_from_slice(&base[(r % 16) * rb..(r % 16 + 1) * rb]);
    }
    w
}

/// CPU time this thread has run (ns). On a shared machine this measures the kernel,
/// not the neighbours.
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; the call only writes it.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

fn mean_sd(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len().max(2) - 1) as f64;
    (m, var.sqrt())
}

/// One decode step's matmuls over a real model's weights, timed per pass.
fn model_pass(o: &Opts, path: &str) {
    use lode_runtime::gguf::GgufFile;
    let f = GgufFile::open(path).expect("open gguf");
    let heap = std::env::var_os("QB_HEAP").is_some();
    let mut owned: Vec<Vec<u8>> = Vec::new();
    let mut mats: Vec<(String, GgmlType, usize, usize, &[u8])> = Vec::new();
    let has_output = f.tensors().iter().any(|t| t.name == "output.weight");
    for t in f.tensors() {
        let is_mat = t.dims.len() == 2 && t.name != "token_embd.weight";
        let tied_out = t.name == "token_embd.weight" && !has_output;
        if is_mat || tied_out {
            let v = f.tensor(&t.name).unwrap();
            mats.push((
                t.name.clone(),
                t.ty,
                t.dims[1] as usize,
                t.dims[0] as usize,
                v.data,
            ));
            if heap {
                owned.push(v.data.to_vec());
            }
        }
    }
    let mats: Vec<(String, GgmlType, usize, usize, &[u8])> = if heap {
        mats.into_iter()
            .zip(&owned)
            .map(|(m, o)| (m.0, m.1, m.2, m.3, &o[..]))
            .collect()
    } else {
        mats
    };
    let bytes: usize = mats.iter().map(|m| m.4.len()).sum();
    println!(
        "{path}: {} matmuls per token, {:.1} MiB of weights",
        mats.len(),
        bytes as f64 / (1 << 20) as f64
    );
    println!("| threads | ms per token (mean ± sd) | tokens/s | weight GB/s | CPU ms per token (1 thread) |");
    println!("|---|---|---|---|---|");
    let xs: Vec<Vec<f32>> = mats
        .iter()
        .map(|m| {
            (0..m.3)
                .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
                .collect()
        })
        .collect();
    let mut ys: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; m.2]).collect();
    for &t in &o.threads {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(t)
            .build()
            .unwrap();
        let mut ms = Vec::new();
        let mut cpu = Vec::new();
        pool.install(|| {
            for rep in 0..=o.reps {
                let c0 = thread_cpu_ns();
                let t0 = Instant::now();
                for ((m, x), y) in mats.iter().zip(&xs).zip(ys.iter_mut()) {
                    lode_runtime::quant::matmul(m.4, m.1, m.2, m.3, x, 1, y).unwrap();
                }
                if rep > 0 {
                    ms.push(t0.elapsed().as_secs_f64() * 1e3);
                    if let (Some(a), Some(b)) = (c0, thread_cpu_ns()) {
                        cpu.push((b - a) as f64 / 1e6);
                    }
                }
            }
        });
        let (m, sd) = mean_sd(&ms);
        let cpu_col = if t == 1 && !cpu.is_empty() {
            let (cm, csd) = mean_sd(&cpu);
            format!("{cm:.2} ± {csd:.2}")
        } else {
            "–".into()
        };
        println!(
            "| {t} | {m:.2} ± {sd:.2} | {:.1} | {:.1} | {cpu_col} |",
            1e3 / m,
            bytes as f64 / m / 1e6
        );
    }
}

fn main() {
    let o = parse();
    if let Some(p) = &o.gguf {
        model_pass(&o, p);
        return;
    }
    let k = o.k;
    println!("| type | isa | threads | tokens | weight MiB | GB/s wall (mean ± sd) | GB/s per CPU-second (1 thread) |");
    println!("|---|---|---|---|---|---|---|");
    for &ty in &o.types {
        let rb = ty.bytes_for(k as u64).unwrap() as usize;
        let rows = o.rows.unwrap_or((o.mb << 20) / rb / 64 * 64);
        let w = weights(ty, rows, k);
        let x: Vec<f32> = (0..o.tokens * k)
            .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
            .collect();
        let xq = quantize_rows(ty, &x, o.tokens, k).unwrap();
        let mut y = vec![0f32; o.tokens * rows];
        for isa in [Isa::Scalar, Isa::Avx2] {
            if !isa.available() {
                continue;
            }
            for &t in &o.threads {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(t)
                    .build()
                    .unwrap();
                let mut gbs = Vec::new();
                let mut cpu = Vec::new();
                pool.install(|| {
                    matmul_quantized(&w, ty, rows, &xq, &mut y, isa).unwrap(); // warm-up
                    for _ in 0..o.reps {
                        let c0 = thread_cpu_ns();
                        let t0 = Instant::now();
                        matmul_quantized(&w, ty, rows, &xq, &mut y, isa).unwrap();
                        gbs.push(w.len() as f64 / t0.elapsed().as_secs_f64() / 1e9);
                        if let (Some(a), Some(b)) = (c0, thread_cpu_ns()) {
                            cpu.push(w.len() as f64 / (b - a).max(1) as f64);
                        }
                    }
                });
                let (m, sd) = mean_sd(&gbs);
                let cpu_col = if t == 1 && !cpu.is_empty() {
                    let (cm, csd) = mean_sd(&cpu);
                    format!("{cm:.2} ± {csd:.2}")
                } else {
                    "–".to_string()
                };
                let us = w.len() as f64 / m / 1e3;
                println!(
                    "| {} | {} | {} | {} | {:.2} ({us:.1} µs) | {:.2} ± {:.2} | {} |",
                    ty,
                    isa.name(),
                    t,
                    o.tokens,
                    w.len() as f64 / (1 << 20) as f64,
                    m,
                    sd,
                    cpu_col
                );
            }
        }
        std::hint::black_box(&y);
    }
}
