//! Compiles `kernels-hip/` ahead of time with whatever GPU toolchains this machine has and
//! embeds the results in the `lode` binary.
//!
//! - nvcc (env `LODE_NVCC`, else `nvcc` on PATH, `/usr/local/cuda/bin/nvcc`, or the pip
//!   wheels `nvidia-cuda-nvcc` in python3's site-packages) → one `sm_90` cubin and one
//!   `compute_90` PTX per kernel family (the PTX lets newer NVIDIA GPUs JIT it).
//! - clang (env `LODE_HIP_CLANG`, else `clang-19`, `/opt/rocm/llvm/bin/clang`) →
//!   `gfx1100` and `gfx1151` code objects (`-x hip --cuda-device-only -nogpulib -nogpuinc`;
//!   no ROCm install needed).
//!
//! A machine with neither still builds: the binary then carries only the kernel sources
//! (embedded by the runtime crate) and compiles them at run time with NVRTC / hipRTC.
//! A toolchain that is found but fails to compile is a build error: kernel compile errors
//! are caught here, never on the GPU machine.
//!
//! Output: `$OUT_DIR/kernels_embedded.rs` defining
//! `pub static EMBEDDED: &[(&str /*family*/, &str /*arch*/, &[u8])]` and
//! `pub static EMBEDDED_SOURCES: &[(&str /*family*/, u64 /*fingerprint*/)]` (the sources
//! each family's objects were compiled from), which `src/main.rs` hands to
//! `lode_runtime::backend::gpu::kernels::register_embedded` at start; the runtime ignores
//! objects whose fingerprint differs from the sources it embeds (a stale build directory). The root
//! package owns the blobs (rather than `lode-runtime`) so library builds and tests stay
//! fast; the runtime finds nothing registered there and uses the run-time compilers.
use std::path::{Path, PathBuf};
use std::process::Command;

const FAMILIES: &[&str] = &["quantize", "matvec", "decode_mv", "head_mv", "norm_rope", "attention", "attn_decode", "elementwise", "gemm", "flash_attn", "dequant", "exact_matmul", "exact_ops", "moe", "delta", "mmq", "kvq_attn"];
/// The headers the families include, in `kernels::HEADERS`' order (the fingerprint's).
const HEADERS: &[&str] = &["common.h", "mma.h", "mv_dot.h", "mv_dot_b32.h", "mv_dot_low.h", "dequant_low.h", "iq_grids.h"];
const AMD_ARCHS: &[&str] = &["gfx1100", "gfx1151"];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=kernels-hip");
    for f in FAMILIES {
        println!("cargo:rerun-if-changed=kernels-hip/{f}.hip");
    }
    for h in HEADERS {
        println!("cargo:rerun-if-changed=kernels-hip/{h}");
    }
    println!("cargo:rerun-if-env-changed=LODE_NVCC");
    println!("cargo:rerun-if-env-changed=LODE_HIP_CLANG");
    println!("cargo:rerun-if-env-changed=LODE_NO_KERNEL_BUILD");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels-hip");
    let skip = std::env::var_os("LODE_NO_KERNEL_BUILD").is_some();
    let nvcc = if skip { None } else { find_nvcc() };
    let clang = if skip { None } else { find_clang() };
    if nvcc.is_none() {
        println!("cargo:warning=lode: nvcc not found; NVIDIA kernels will be compiled at run time by NVRTC");
    }
    if clang.is_none() {
        println!("cargo:warning=lode: clang-19 not found; AMD kernels will be compiled at run time by hipRTC");
    }

    let mut jobs: Vec<(String, String, PathBuf, Command)> = Vec::new();
    for fam in FAMILIES {
        let file = src.join(format!("{fam}.hip"));
        if !file.exists() {
            continue;
        }
        if let Some(nvcc) = &nvcc {
            for (kind, arch, ext) in [("-cubin", "sm_90", "cubin"), ("-ptx", "compute_90", "ptx")] {
                let o = out.join(format!("{fam}.{arch}.{ext}"));
                let mut c = Command::new(&nvcc.0);
                c.arg(kind).arg(format!("-arch={arch}")).arg("-O3").arg("-std=c++17").arg("-I").arg(&src);
                for inc in &nvcc.1 {
                    c.arg("-I").arg(inc);
                }
                c.arg("-x").arg("cu").arg(&file).arg("-o").arg(&o);
                jobs.push((fam.to_string(), arch.to_string(), o, c));
            }
        }
        if let Some(clang) = &clang {
            for arch in AMD_ARCHS {
                let o = out.join(format!("{fam}.{arch}.co"));
                let mut c = Command::new(clang);
                c.args(["-x", "hip", "--cuda-device-only", "--no-gpu-bundle-output", "-nogpulib", "-nogpuinc", "-O3", "-std=c++17"])
                    .arg(format!("--offload-arch={arch}"))
                    .arg("-I")
                    .arg(&src)
                    .arg("-c")
                    .arg(&file)
                    .arg("-o")
                    .arg(&o);
                jobs.push((fam.to_string(), arch.to_string(), o, c));
            }
        }
    }

    // Run the compiles a few at a time (the build machine may be small and shared).
    let par = std::env::var("LODE_KERNEL_JOBS").ok().and_then(|v| v.parse().ok()).unwrap_or(4usize).max(1);
    let mut entries = Vec::new();
    for chunk in jobs.chunks_mut(par) {
        let children: Vec<_> = chunk
            .iter_mut()
            .map(|(f, a, o, c)| {
                c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
                let child = c.spawn().map_err(|e| format!("could not run {:?}: {e}", c.get_program()));
                (f.clone(), a.clone(), o.clone(), format!("{c:?}"), child)
            })
            .collect();
        for (fam, arch, o, cmd, child) in children {
            match child.and_then(|ch| ch.wait_with_output().map_err(|e| e.to_string())) {
                Ok(r) if r.status.success() => entries.push((fam, arch, o)),
                Ok(r) => panic!(
                    "kernel compile failed: {cmd}\n{}{}",
                    String::from_utf8_lossy(&r.stdout),
                    String::from_utf8_lossy(&r.stderr)
                ),
                Err(e) => panic!("{e}"),
            }
        }
    }

    let mut rs = String::from("/// Kernel code objects compiled by build.rs: (family, arch, bytes).\npub static EMBEDDED: &[(&str, &str, &[u8])] = &[\n");
    for (fam, arch, o) in &entries {
        rs.push_str(&format!("    ({fam:?}, {arch:?}, include_bytes!({:?})),\n", o.display().to_string()));
    }
    rs.push_str("];\n");
    rs.push_str("/// Fingerprints of the sources each family was compiled from.\npub static EMBEDDED_SOURCES: &[(&str, u64)] = &[\n");
    for fam in FAMILIES {
        let read = |p: PathBuf| std::fs::read(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
        let mut parts: Vec<_> = HEADERS.iter().map(|h| read(src.join(h))).collect();
        parts.push(read(src.join(format!("{fam}.hip"))));
        let refs: Vec<&[u8]> = parts.iter().map(|v| v.as_slice()).collect();
        rs.push_str(&format!("    ({fam:?}, {:#x}),\n", fingerprint(&refs)));
    }
    rs.push_str("];\n");
    std::fs::write(out.join("kernels_embedded.rs"), rs).expect("write kernels_embedded.rs");
}

/// FNV-1a over the parts, each followed by a 0xff separator; the runtime's
/// `kernels::source_fingerprint` computes the same over its embedded sources.
fn fingerprint(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(std::iter::once(&0xffu8)) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// nvcc plus the extra include folders the pip wheels need.
fn find_nvcc() -> Option<(PathBuf, Vec<PathBuf>)> {
    if let Some(p) = std::env::var_os("LODE_NVCC") {
        let p = PathBuf::from(p);
        let inc = p.parent().and_then(|b| b.parent()).map(|r| vec![r.join("include"), r.join("include/cccl")]).unwrap_or_default();
        return Some((p, inc));
    }
    for cand in ["nvcc", "/usr/local/cuda/bin/nvcc"] {
        if Command::new(cand).arg("--version").output().map(|o| o.status.success()).unwrap_or(false) {
            return Some((PathBuf::from(cand), vec![]));
        }
    }
    let out = Command::new("python3")
        .args(["-c", "import site;print('\\n'.join(site.getsitepackages()+[site.getusersitepackages()]))"])
        .output()
        .ok()?;
    for dir in String::from_utf8_lossy(&out.stdout).lines() {
        for sub in ["nvidia/cu13", "nvidia/cuda_nvcc"] {
            let root = Path::new(dir).join(sub);
            let nvcc = root.join("bin/nvcc");
            if nvcc.exists() {
                return Some((nvcc, vec![root.join("include"), root.join("include/cccl")]));
            }
        }
    }
    None
}

fn find_clang() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("LODE_HIP_CLANG") {
        return Some(PathBuf::from(p));
    }
    ["clang-19", "/opt/rocm/llvm/bin/clang"].into_iter().map(PathBuf::from).find(|c| {
        Command::new(c).arg("--version").output().map(|o| o.status.success()).unwrap_or(false)
    })
}
