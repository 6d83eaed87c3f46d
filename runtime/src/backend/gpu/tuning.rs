//! The one tuning table of the GPU backend: every number and on/off choice the dispatch
//! plan (`plan.rs`), the device and the weight materializer read, with the default that
//! was measured best (numbers in BENCHMARKS.md and `benchmarks/`).
//!
//! Read once, when a device opens: the defaults, then `LODE_TUNE` (a comma-separated list
//! of `key=value`, e.g. `LODE_TUNE=graphs=0,blas_min=32`) for an A/B run, then the
//! command line's flags (`--no-blas`). A key this table does not know, or a value that does
//! not parse, is reported once and ignored; nothing else in lode reads the environment to
//! choose a kernel.
//!
//! Variants that were measured and lost are not here: their code is deleted and their
//! numbers stay in the benchmark history.

use super::driver::HostCoherence;
use super::register::Inject;
use crate::weights::ByteSize;

/// The environment variable the tuning table reads its overrides from.
pub const ENV: &str = "LODE_TUNE";

/// Which kernels launch overlapped (programmatic dependent launch, sm_90).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pdl {
    /// None.
    Off,
    /// The decode families and one-token kernels (the measured default).
    Decode,
    /// Every kernel that can.
    All,
}

/// How a mapped (`--residency mapped`) file reaches the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MappedHost {
    /// Register the file's own mapping (no second copy).
    Register,
    /// Copy the file once into driver-allocated page-locked memory.
    Pinned,
}

/// Every tunable of the GPU backend, with its measured default.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// `graphs`: record each step and replay repeated ones as one device graph.
    pub graphs: bool,
    /// `graph_cache`: graph instances kept (one per step shape).
    pub graph_cache: usize,
    /// `pdl`: `0` off, `decode` (default), `1` all.
    pub pdl: Pdl,
    /// `fuse`: the fused decode ops (multi-matvec, add+norm, norm+rope+KV store, attention
    /// writing q8_1). Off: the trait's unfused compositions (selftests compare the two).
    pub fuse: bool,
    /// `fuse_mv`: the fused one-token norm/matvec launches (`decode_mv`, `head_mv`).
    pub fuse_mv: bool,
    /// `fuse_attn`: the fused one-token rope + KV store + attention launch.
    pub fuse_attn: bool,
    /// `delta`: qwen35's gated delta net in its device kernels (`family/delta.rs`); off:
    /// the trait's host default (operands and states read back), for A/B runs.
    pub delta: bool,
    /// `attn_part_keys`: the fewest keys per part of the fused decode attention and of the
    /// quantized caches' decode (`kvq_decode_d<HD>`, the same split; None: one block iteration).
    pub attn_part_keys: Option<usize>,
    /// `blas`: long prefill matmuls through cuBLAS / hipBLAS where the library opens
    /// (also `--no-blas`).
    pub blas: bool,
    /// `blas_min`: the fewest tokens a matmul sends to the BLAS (16).
    pub blas_min_tokens: usize,
    /// `blas_slab`: the transient f16 slab the BLAS path dequantizes into (128MiB).
    pub blas_slab_bytes: usize,
    /// `gemm_min`: the fewest tokens sent to lode's matrix-core GEMM (32; below, the
    /// 8-column matvec reads the same copy).
    pub gemm_min_tokens: usize,
    /// `batch_gemm`: `MIN-MAX` tokens (9-64; `0` off) whose matmuls run the GEMM with
    /// one 64-token tile and split K (`plan::small_batch`: decode batches), ahead of the
    /// BLAS and the 8-column matvec.
    pub batch_gemm: Option<(usize, usize)>,
    /// `mmq`: `MIN-MAX` tokens (`0`: off) whose matmuls run the integer GEMM over int8
    /// activation blocks (`plan::mmq`), ahead of `batch_gemm`. Default 2–32: H100, qwen3-4b,
    /// against the default without it, x8 +27 %, x16 +22 %, x32 +11 %, x64 −4 % (BENCHMARKS).
    pub mmq: Option<(usize, usize)>,
    /// `mmq_mma`: the integer GEMM on int8 matrix cores where its type has them (Q4_K, Q6_K;
    /// NVIDIA sm_80+, elsewhere the same kernels run dp4a); off: dp4a everywhere.
    pub mmq_mma: bool,
    /// `moe_group_min`: the fewest (token, expert) pairs whose expert matvecs run grouped
    /// by expert, 8 pairs per read of an expert's rows (below, one pair per read) (16).
    pub moe_group_min: usize,
    /// `moe_gemm_min`: the fewest pairs per expert (on average) whose expert products run
    /// as one grouped matrix-core GEMM per projection (4).
    pub moe_gemm_min: usize,
    /// `kernels`: `embedded` (default: the code objects in the binary, else a compile)
    /// or `rtc` (always compile at run time with NVRTC / hipRTC).
    pub kernels_rtc: bool,
    /// `weight_arena`: weights in one growing virtual range (where the driver has virtual
    /// memory management; off: one allocation per weight).
    pub weight_arena: bool,
    /// `upload_stage`: weight uploads through page-locked staging on a second stream,
    /// overlapped with the kernels already queued (off: a synchronous copy each).
    pub upload_stage: bool,
    /// `mapped_host`: `register` or `pinned` (default: register on an integrated GPU,
    /// pinned on a discrete one).
    pub mapped_host: Option<MappedHost>,
    /// `mapped_chunk`: bytes per registered chunk of a mapped file (256MiB).
    pub mapped_chunk: usize,
    /// `mapped_stall_s`: seconds one chunk's registration may take before `mapped` gives
    /// up and falls back to device copies (30; a healthy 256 MiB chunk takes well under
    /// 3 s even from a hard disk).
    pub mapped_stall_s: u64,
    /// `mapped_total_s`: seconds the whole file's registration may take (0, the default:
    /// 60 s + 1 s per 64 MiB of file).
    pub mapped_total_s: u64,
    /// `mapped_coherence`: `coarse` (default) or `fine`, how the device caches the
    /// registered file (`driver::HostCoherence`; HIP only).
    pub mapped_coherence: HostCoherence,
    /// `mapped_inject`: test hook, `fail:K` or `stall:K` makes the K-th chunk's
    /// registration fail or never return (`register::Inject`).
    pub mapped_inject: Option<Inject>,
    /// `mapped_out`: read-back buffers (the logits) in mapped host memory.
    pub mapped_out: bool,
    /// `pinned_read`: large reads through one page-locked buffer.
    pub pinned_read: bool,
    /// `pinned_min`: the smallest read that takes it (1MiB).
    pub pinned_min: usize,
    /// `gpu_limits`: `trim` (default: the context's stack, printf FIFO and malloc heap cut
    /// to what lode's kernels use) or `driver` (the driver's defaults).
    pub trim_limits: bool,
    /// `gpu_stack`: per-thread stack bytes when trimmed (256; every kernel has a 0-byte frame).
    pub gpu_stack: usize,
    /// `exact_threads`: the CPU thread count `--numerics exact` attention mirrors
    /// (default: the physical cores, the CLI's default `--threads`).
    pub exact_threads: Option<usize>,
}

impl Default for Tuning {
    fn default() -> Tuning {
        Tuning {
            graphs: true,
            graph_cache: 8,
            pdl: Pdl::Decode,
            fuse: true,
            fuse_mv: true,
            fuse_attn: true,
            delta: true,
            attn_part_keys: None,
            blas: true,
            blas_min_tokens: 16,
            blas_slab_bytes: 128 << 20,
            gemm_min_tokens: 32,
            batch_gemm: Some((9, 64)),
            mmq: Some((2, 32)),
            mmq_mma: true,
            moe_group_min: 16,
            moe_gemm_min: 4,
            kernels_rtc: false,
            weight_arena: true,
            upload_stage: true,
            mapped_host: None,
            mapped_chunk: 256 << 20,
            mapped_stall_s: 30,
            mapped_total_s: 0,
            mapped_coherence: HostCoherence::Coarse,
            mapped_inject: None,
            mapped_out: true,
            pinned_read: true,
            pinned_min: 1 << 20,
            trim_limits: true,
            gpu_stack: 256,
            exact_threads: None,
        }
    }
}

/// A `LODE_TUNE` entry that could not be applied.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{ENV}: `{entry}`: {why}")]
pub struct TuneError {
    pub entry: String,
    pub why: String,
}

/// Every key `LODE_TUNE` takes, with what it sets (for `--help` texts and the docs).
pub const KEYS: &[(&str, &str)] = &[
    ("graphs", "0/1: replay repeated steps as device graphs"),
    ("graph_cache", "N: graph instances kept"),
    ("pdl", "0, decode or 1: programmatic dependent launch"),
    ("fuse", "0/1: the fused decode ops"),
    ("fuse_mv", "0/1: the fused one-token norm/matvec launches"),
    ("fuse_attn", "0/1: the fused one-token attention launch"),
    ("delta", "0/1: qwen35's gated delta net in its device kernels (0: on the host)"),
    ("attn_part_keys", "N: fewest keys per decode attention part"),
    ("blas", "0/1: prefill matmuls through cuBLAS / hipBLAS"),
    ("blas_min", "N: fewest tokens sent to the BLAS"),
    ("blas_slab", "BYTES: the BLAS path's f16 slab"),
    ("gemm_min", "N: fewest tokens sent to the matrix-core GEMM"),
    ("batch_gemm", "MIN-MAX tokens (≤ 64) through the split-K GEMM, or 0"),
    ("mmq", "MIN-MAX tokens (≤ 64) through the integer GEMM (mmq.hip), or 0"),
    ("mmq_mma", "0/1: the integer GEMM on int8 matrix cores where its type has them"),
    ("moe_group_min", "N: fewest expert pairs whose matvecs run grouped by expert"),
    ("moe_gemm_min", "N: fewest pairs per expert (mean) for the grouped GEMM"),
    ("kernels", "embedded or rtc"),
    ("weight_arena", "0/1: weights in one growing virtual range"),
    ("upload_stage", "0/1: weight uploads staged on a second stream, overlapped with compute"),
    ("mapped_host", "register or pinned"),
    ("mapped_chunk", "BYTES: per registered chunk"),
    ("mapped_stall_s", "SECONDS one chunk's registration may take before `mapped` falls back to device copies"),
    ("mapped_total_s", "SECONDS the whole registration may take (0: 60 + 1 per 64 MiB)"),
    ("mapped_coherence", "coarse or fine: how the GPU caches the registered file (HIP)"),
    ("mapped_inject", "fail:K or stall:K: test hook, the K-th chunk's registration fails or stalls"),
    ("mapped_out", "0/1: read-back buffers in mapped host memory"),
    ("pinned_read", "0/1: large reads through a page-locked buffer"),
    ("pinned_min", "BYTES: smallest read that takes it"),
    ("gpu_limits", "trim or driver"),
    ("gpu_stack", "BYTES: per-thread stack"),
    ("exact_threads", "N: the CPU thread count exact attention mirrors"),
];

impl Tuning {
    /// The defaults with `LODE_TUNE`'s overrides; bad entries are reported (once per
    /// process) and skipped.
    pub fn from_env() -> Tuning {
        let mut t = Tuning::default();
        if let Ok(spec) = std::env::var(ENV) {
            for e in t.apply(&spec) {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| tracing::warn!("{e}; ignored"));
            }
        }
        t
    }

    /// Apply `key=value,...` over this table; returns the entries that did not apply.
    pub fn apply(&mut self, spec: &str) -> Vec<TuneError> {
        let mut errs = Vec::new();
        for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            if let Err(why) = self.set(entry) {
                errs.push(TuneError { entry: entry.to_string(), why });
            }
        }
        errs
    }

    fn set(&mut self, entry: &str) -> Result<(), String> {
        let (k, v) = entry.split_once('=').ok_or("expected key=value")?;
        let (k, v) = (k.trim(), v.trim());
        let flag = || match v {
            "1" | "on" | "true" => Ok(true),
            "0" | "off" | "false" => Ok(false),
            _ => Err(format!("`{v}` is not 0 or 1")),
        };
        let num = || v.parse::<usize>().map_err(|e| format!("`{v}`: {e}"));
        let bytes = || v.parse::<ByteSize>().map(|b| b.0 as usize).map_err(|e| format!("`{v}`: {e}"));
        match k {
            "graphs" => self.graphs = flag()?,
            "graph_cache" => self.graph_cache = num()?,
            "pdl" => {
                self.pdl = match v {
                    "0" | "off" => Pdl::Off,
                    "decode" => Pdl::Decode,
                    "1" | "all" => Pdl::All,
                    _ => return Err(format!("`{v}`: expected 0, decode or 1")),
                }
            }
            "fuse" => self.fuse = flag()?,
            "fuse_mv" => self.fuse_mv = flag()?,
            "fuse_attn" => self.fuse_attn = flag()?,
            "delta" => self.delta = flag()?,
            "attn_part_keys" => self.attn_part_keys = Some(num()?).filter(|&n| n > 0),
            "blas" => self.blas = flag()?,
            "blas_min" => self.blas_min_tokens = num()?.max(2),
            "blas_slab" => self.blas_slab_bytes = bytes()?.max(1 << 20),
            "gemm_min" => self.gemm_min_tokens = num()?.max(1),
            "batch_gemm" => self.batch_gemm = token_range(v)?,
            "mmq" => self.mmq = token_range(v)?,
            "mmq_mma" => self.mmq_mma = flag()?,
            "moe_group_min" => self.moe_group_min = num()?.max(1),
            "moe_gemm_min" => self.moe_gemm_min = num()?.max(1),
            "kernels" => {
                self.kernels_rtc = match v {
                    "rtc" => true,
                    "embedded" => false,
                    _ => return Err(format!("`{v}`: expected embedded or rtc")),
                }
            }
            "weight_arena" => self.weight_arena = flag()?,
            "upload_stage" => self.upload_stage = flag()?,
            "mapped_host" => {
                self.mapped_host = Some(match v {
                    "register" => MappedHost::Register,
                    "pinned" => MappedHost::Pinned,
                    _ => return Err(format!("`{v}`: expected register or pinned")),
                })
            }
            "mapped_chunk" => self.mapped_chunk = bytes()?.max(1 << 16),
            "mapped_stall_s" => self.mapped_stall_s = num()?.max(1) as u64,
            "mapped_total_s" => self.mapped_total_s = num()? as u64,
            "mapped_coherence" => {
                self.mapped_coherence = match v {
                    "coarse" => HostCoherence::Coarse,
                    "fine" => HostCoherence::Fine,
                    _ => return Err(format!("`{v}`: expected coarse or fine")),
                }
            }
            "mapped_inject" => self.mapped_inject = if v == "0" { None } else { Some(v.parse()?) },
            "mapped_out" => self.mapped_out = flag()?,
            "pinned_read" => self.pinned_read = flag()?,
            "pinned_min" => self.pinned_min = bytes()?,
            "gpu_limits" => {
                self.trim_limits = match v {
                    "trim" => true,
                    "driver" => false,
                    _ => return Err(format!("`{v}`: expected trim or driver")),
                }
            }
            "gpu_stack" => self.gpu_stack = bytes()?,
            "exact_threads" => self.exact_threads = Some(num()?).filter(|&n| n > 0),
            _ => return Err(format!("unknown key `{k}` (known: {})", KEYS.iter().map(|k| k.0).collect::<Vec<_>>().join(", "))),
        }
        Ok(())
    }
}

/// `MIN-MAX` with 2 ≤ MIN ≤ MAX ≤ 64, or `0` (None).
fn token_range(v: &str) -> Result<Option<(usize, usize)>, String> {
    let bad = || format!("`{v}`: expected MIN-MAX with 2 ≤ MIN ≤ MAX ≤ 64, or 0");
    match v.split_once('-') {
        None if v == "0" => Ok(None),
        Some((a, b)) => match (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
            (Ok(a), Ok(b)) if a >= 2 && a <= b && b <= 64 => Ok(Some((a, b))),
            _ => Err(bad()),
        },
        None => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_apply_and_bad_entries_are_named() {
        let mut t = Tuning::default();
        let errs = t.apply("graphs=0, blas_min=64,pdl=1,blas_slab=64MiB,kernels=rtc,bogus=1,fuse=maybe,novalue");
        assert!(!t.graphs && t.blas_min_tokens == 64 && t.pdl == Pdl::All && t.blas_slab_bytes == 64 << 20 && t.kernels_rtc);
        let bad: Vec<&str> = errs.iter().map(|e| e.entry.as_str()).collect();
        assert_eq!(bad, ["bogus=1", "fuse=maybe", "novalue"]);
        assert!(errs[0].to_string().contains("unknown key `bogus`"));
        assert!(t.fuse, "a bad value leaves the default");
    }

    #[test]
    fn mapped_registration_keys() {
        let mut t = Tuning::default();
        assert_eq!((t.mapped_stall_s, t.mapped_total_s, t.mapped_coherence, t.mapped_inject), (30, 0, HostCoherence::Coarse, None));
        assert!(t.apply("mapped_stall_s=5,mapped_total_s=90,mapped_coherence=fine,mapped_inject=fail:3").is_empty());
        assert_eq!((t.mapped_stall_s, t.mapped_total_s, t.mapped_coherence, t.mapped_inject), (5, 90, HostCoherence::Fine, Some(Inject::Fail(3))));
        let bad: Vec<String> = t.apply("mapped_coherence=strict,mapped_inject=stall:0,mapped_stall_s=x").into_iter().map(|e| e.entry).collect();
        assert_eq!(bad, ["mapped_coherence=strict", "mapped_inject=stall:0", "mapped_stall_s=x"]);
        assert!(t.apply("mapped_inject=0").is_empty());
        assert_eq!(t.mapped_inject, None);
    }

    #[test]
    fn every_key_is_documented_and_settable() {
        for (k, _) in KEYS {
            let mut t = Tuning::default();
            let v = match *k {
                "pdl" => "decode",
                "kernels" => "embedded",
                "mapped_host" => "pinned",
                "mapped_coherence" => "fine",
                "mapped_inject" => "stall:2",
                "gpu_limits" => "driver",
                "blas_slab" | "mapped_chunk" | "pinned_min" | "gpu_stack" => "2MiB",
                "batch_gemm" | "mmq" => "9-64",
                _ => "1",
            };
            assert!(t.apply(&format!("{k}={v}")).is_empty(), "{k}");
        }
    }
}
