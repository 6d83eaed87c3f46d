//! `--numerics exact` ([`crate::backend::gpu::ExactBackend`]): a GPU numerics mode whose every op computes,
//! per output element, the CPU backend's exact sequence of f32 operations, so GPU logits
//! equal the CPU backend's bit for bit (KL divergence 0).
//!
//! Why it is needed: activations are quantized to 8 bits before each matmul (as llama.cpp
//! does), so a one-ulp difference anywhere upstream flips int8 codes and grows to the
//! quantization noise (`lode selftest --perturb`: 3.6e-3 mean KLD for CPU vs CPU nudged
//! by one ulp). The `fast` kernels (the default) sum in other orders; these reproduce the
//! CPU's: its 8 SIMD lanes and their fold, FMA where it fuses and separate rounding where
//! it does not, f64 where it sums in f64, its f16 roundings, ggml's vector `exp` and
//! libm's `expf` (ported), and host tables for what it takes from libm (RoPE, GELU).
//!
//! - [`order`]: which CPU order a call takes (by type and token count).
//! - the kernels' launchers: `family/exact_matmul.rs`, `family/exact_ops.rs`.
//! - [`tables`]: RoPE and GELU tables from the CPU backend's functions.
//! - [`libm`]: glibc's `expf`, the host twin of the kernels' port (tested against libm).
//!
//! The backend's routing lives in `backend/exact.rs`. Not exact (an error, never a silent
//! fallback): weight types other than Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K and the low-bit
//! Q2_K/Q3_K/IQ4_NL/IQ4_XS/MXFP4 (embeddings: any type, rows of other types than
//! F32/F16/Q8_0 dequantized on the host), head_dim > 256. One decode row past 256 cached positions splits its keys
//! by the CPU's thread count ([`threads`]).

pub mod libm;
pub mod order;
pub mod tables;

/// The GPU backend's numerics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Numerics {
    /// The tuned kernels (matrix cores, warp reductions): close to the CPU, not equal.
    #[default]
    Fast,
    /// Bit-identical to the CPU backend.
    Exact,
}

impl std::str::FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(Numerics::Fast),
            "exact" => Ok(Numerics::Exact),
            _ => Err(format!("unknown numerics `{s}` (expected fast or exact)")),
        }
    }
}

/// The CPU backend's thread count that exact decode attention mirrors (see
/// [`order::attention_mode`]): `Tuning::exact_threads`, else the physical cores (the
/// CLI's default `--threads`).
pub fn threads(t: &super::tuning::Tuning) -> usize {
    t.exact_threads.unwrap_or_else(physical_cores)
}

/// Physical cores as the CLI counts them (distinct (package, core) pairs), else the
/// available parallelism.
fn physical_cores() -> usize {
    let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else { return logical };
    let (mut set, mut phys) = (std::collections::HashSet::new(), None);
    for line in info.lines() {
        let mut kv = line.splitn(2, ':').map(str::trim);
        match (kv.next(), kv.next()) {
            (Some("physical id"), Some(v)) => phys = Some(v.to_string()),
            (Some("core id"), Some(v)) => {
                set.insert((phys.clone(), v.to_string()));
            }
            _ => {}
        }
    }
    if set.is_empty() { logical } else { set.len().min(logical) }
}
