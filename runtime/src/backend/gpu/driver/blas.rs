//! The vendor BLAS (cuBLAS on NVIDIA, hipBLAS on AMD), opened at run time like the
//! drivers: one f16 × f16 → f32 GEMM with f32 accumulation, for prefill
//! (`prefill_blas.rs`). Every symbol lode calls is resolved when the library is opened,
//! so a missing library or symbol is an error naming it (the caller then falls back to
//! lode's own GEMM with a one-line note) — never a panic and no link-time dependency.
//!
//! Where the library is looked for (first that opens wins): `LODE_BLAS_LIB` (a path; only
//! that one), then the dynamic loader's path (`libcublas.so.13`, `.so.12`, `.so`), then
//! the CUDA toolkit's folders (`$CUDA_HOME/lib64`, `$CUDA_PATH/lib64`,
//! `/usr/local/cuda/lib64`, `/usr/local/cuda-*/lib64`, newest first), then, as a last
//! resort, the copy NVIDIA's Python wheels install (`…/site-packages/nvidia/cublas/lib`,
//! which is what PyTorch ships with). A copy opened by path has its `libcublasLt`
//! sibling opened first from the same folder (libcublas needs it and that folder is not
//! on the loader's path).
//!
//! hipBLAS (`libhipblas.so.3`, `.so.2`, `$ROCM_PATH/lib`, `/opt/rocm/lib`) has its own
//! enum values (`HIPBLAS_OP_N` = 111, `HIP_R_16F` = 2, `HIPBLAS_COMPUTE_32F` = 2,
//! `HIPBLAS_GEMM_DEFAULT` = 160): hipBLAS 3 (ROCm 7) takes them in `hipblasGemmEx`,
//! hipBLAS 2 (ROCm 6) in `hipblasGemmEx_v2`. **The hipBLAS table has not been run**: this
//! project has no AMD machine; it was written from hipBLAS's public headers.

use super::{open_first, sym, Api, DevPtr, DriverError, RawHandle, Result};
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};

type Status = c_int;
type GemmEx = unsafe extern "C" fn(
    *mut c_void, // handle
    c_int,       // transa
    c_int,       // transb
    c_int,       // m
    c_int,       // n
    c_int,       // k
    *const c_void,
    *const c_void,
    c_int, // Atype
    c_int, // lda
    *const c_void,
    c_int, // Btype
    c_int, // ldb
    *const c_void,
    *mut c_void,
    c_int, // Ctype
    c_int, // ldc
    c_int, // compute type
    c_int, // algo
) -> Status;

/// The vendor's values for the few enums the one GEMM needs.
#[derive(Clone, Copy, Debug)]
struct Enums {
    op_n: c_int,
    op_t: c_int,
    r16f: c_int,
    r32f: c_int,
    compute_32f: c_int,
    algo_default: c_int,
}

const CUBLAS: Enums = Enums { op_n: 0, op_t: 1, r16f: 2, r32f: 0, compute_32f: 68, algo_default: -1 };
const HIPBLAS: Enums = Enums { op_n: 111, op_t: 112, r16f: 2, r32f: 0, compute_32f: 2, algo_default: 160 };

struct Table {
    create: unsafe extern "C" fn(*mut *mut c_void) -> Status,
    destroy: unsafe extern "C" fn(*mut c_void) -> Status,
    set_stream: unsafe extern "C" fn(*mut c_void, *mut c_void) -> Status,
    /// Absent from hipBLAS before ROCm 6.x: rocBLAS then manages its own workspace.
    set_workspace: Option<unsafe extern "C" fn(*mut c_void, *mut c_void, usize) -> Status>,
    gemm_ex: GemmEx,
}

/// An opened BLAS library with one handle bound to lode's stream.
pub struct Blas {
    api: Api,
    t: Table,
    e: Enums,
    handle: RawHandle,
    /// The file that was opened (reported by the selftest and the note).
    pub library: String,
    _libs: Vec<libloading::Library>,
}

// SAFETY: the handle is used from one thread at a time (the backend owns it, `&mut`
// access); cuBLAS / hipBLAS handles may move between threads.
unsafe impl Send for Blas {}
// SAFETY: as above; the table holds only function pointers.
unsafe impl Sync for Blas {}

/// Every file to try for `api`, in order (see the module doc).
pub fn candidates(api: Api) -> Vec<String> {
    if let Some(p) = std::env::var_os("LODE_BLAS_LIB") {
        return vec![p.to_string_lossy().into_owned()];
    }
    let env_dir = |k: &str, sub: &str| std::env::var_os(k).map(|v| PathBuf::from(v).join(sub));
    let (names, mut dirs): (&[&str], Vec<PathBuf>) = match api {
        Api::Cuda => {
            let mut d: Vec<PathBuf> = [env_dir("CUDA_HOME", "lib64"), env_dir("CUDA_PATH", "lib64")].into_iter().flatten().collect();
            d.push(PathBuf::from("/usr/local/cuda/lib64"));
            let mut versioned = glob_dirs(Path::new("/usr/local"), "cuda-", "lib64");
            versioned.sort();
            versioned.reverse();
            d.extend(versioned);
            (&["libcublas.so.13", "libcublas.so.12", "libcublas.so"], d)
        }
        Api::Hip => {
            let d: Vec<PathBuf> = [env_dir("ROCM_PATH", "lib")].into_iter().flatten().chain([PathBuf::from("/opt/rocm/lib")]).collect();
            (&["libhipblas.so.3", "libhipblas.so.2", "libhipblas.so"], d)
        }
    };
    if api == Api::Cuda {
        dirs.extend(wheel_dirs());
    }
    let mut out: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    for d in dirs {
        for n in names {
            let p = d.join(n);
            if p.is_file() && !out.contains(&p.to_string_lossy().into_owned()) {
                out.push(p.to_string_lossy().into_owned());
            }
        }
    }
    out
}

/// `base/<prefix>*/<sub>` folders that exist.
fn glob_dirs(base: &Path, prefix: &str, sub: &str) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(base) else { return Vec::new() };
    rd.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path().join(sub))
        .filter(|p| p.is_dir())
        .collect()
}

/// NVIDIA's Python wheel folders (`nvidia/cublas/lib` under each site-packages): the last
/// resort, the same library as the toolkit's, bundled with PyTorch.
fn wheel_dirs() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = vec![PathBuf::from("/usr/local/lib"), PathBuf::from("/usr/lib")];
    if let Some(h) = std::env::var_os("HOME") {
        roots.push(PathBuf::from(h).join(".local/lib"));
    }
    for k in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = std::env::var_os(k) {
            roots.push(PathBuf::from(v).join("lib"));
        }
    }
    let mut out = Vec::new();
    for r in roots {
        for py in glob_dirs(&r, "python3", "") {
            for site in ["site-packages", "dist-packages"] {
                let d = py.join(site).join("nvidia/cublas/lib");
                if d.is_dir() {
                    out.push(d);
                }
            }
        }
    }
    out
}

impl Blas {
    /// Open the BLAS of `api`, create a handle and bind it to `stream`. The caller has
    /// made the device's context current on this thread (any driver call does).
    pub fn open(api: Api, stream: RawHandle) -> Result<Blas> {
        let names = candidates(api);
        let hint = match api {
            Api::Cuda => "cuBLAS (libcublas.so) was not found: install the CUDA toolkit's libraries or set LODE_BLAS_LIB",
            Api::Hip => "hipBLAS (libhipblas.so) was not found: install ROCm's hipBLAS or set LODE_BLAS_LIB",
        };
        // A copy opened by path: its libcublasLt sibling first (glibc then satisfies
        // libcublas's dependency by soname from the already loaded object).
        let mut libs = Vec::new();
        let mut last = None;
        for n in &names {
            let mut pre = Vec::new();
            if let (Api::Cuda, Some(lt)) = (api, lt_sibling(n)) {
                if let Ok((l, _)) = open_first(api, &[lt.as_str()], hint) {
                    pre.push(l);
                }
            }
            match open_first(api, &[n.as_str()], hint) {
                Ok((lib, name)) => {
                    libs.extend(pre);
                    match Self::table(api, &lib, &name) {
                        Ok((t, e)) => {
                            libs.push(lib);
                            return Self::with_table(api, t, e, name, libs, stream);
                        }
                        Err(err) => last = Some(err),
                    }
                }
                Err(err) => last = Some(err),
            }
        }
        Err(match last {
            Some(DriverError::LibraryMissing { reason, .. }) => DriverError::LibraryMissing { api, tried: names, reason, hint },
            Some(e) => e,
            None => DriverError::LibraryMissing { api, tried: names, reason: String::new(), hint },
        })
    }

    fn table(api: Api, lib: &libloading::Library, name: &str) -> Result<(Table, Enums)> {
        Ok(match api {
            Api::Cuda => (
                Table {
                    create: sym(api, lib, name, "cublasCreate_v2")?,
                    destroy: sym(api, lib, name, "cublasDestroy_v2")?,
                    set_stream: sym(api, lib, name, "cublasSetStream_v2")?,
                    set_workspace: Some(sym(api, lib, name, "cublasSetWorkspace_v2")?),
                    gemm_ex: sym(api, lib, name, "cublasGemmEx")?,
                },
                CUBLAS,
            ),
            Api::Hip => (
                Table {
                    create: sym(api, lib, name, "hipblasCreate")?,
                    destroy: sym(api, lib, name, "hipblasDestroy")?,
                    set_stream: sym(api, lib, name, "hipblasSetStream")?,
                    set_workspace: sym(api, lib, name, "hipblasSetWorkspace").ok(),
                    // hipBLAS 2 keeps the old enums on the plain name and the new ones on _v2.
                    gemm_ex: sym(api, lib, name, "hipblasGemmEx_v2").or_else(|_| sym(api, lib, name, "hipblasGemmEx"))?,
                },
                HIPBLAS,
            ),
        })
    }

    fn with_table(api: Api, t: Table, e: Enums, library: String, libs: Vec<libloading::Library>, stream: RawHandle) -> Result<Blas> {
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: out-pointer is a local; the context is current (caller's contract).
        check(api, "blasCreate", unsafe { (t.create)(&mut h) })?;
        let b = Blas { api, t, e, handle: h as RawHandle, library, _libs: libs };
        // SAFETY: `h` is the live handle; `stream` is lode's stream on the same context.
        check(api, "blasSetStream", unsafe { (b.t.set_stream)(h, stream as *mut c_void) })?;
        Ok(b)
    }

    /// Give the library a fixed workspace (so it never allocates during a call; cuBLAS
    /// needs this for stream capture). `false` when the library has no such call.
    pub fn set_workspace(&self, ptr: DevPtr, bytes: usize) -> Result<bool> {
        let Some(f) = self.t.set_workspace else { return Ok(false) };
        // SAFETY: [ptr, ptr + bytes) is a live device allocation the caller keeps until
        // this handle is dropped or given another workspace.
        check(self.api, "blasSetWorkspace", unsafe { f(self.handle as *mut c_void, ptr as *mut c_void, bytes) })?;
        Ok(true)
    }

    /// C[j][i] = Σ_l A[i][l] · B[j][l] for i < m, j < n (f32 accumulation), on the stream.
    /// A: m rows of k f16, row stride lda; B: n rows of k f16, row stride ldb; C: f32, row
    /// j at c + j·ldc. (Column-major BLAS terms: C = Aᵀ·B with A k×m, B k×n, C m×n.)
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_f16_f32(&self, m: usize, n: usize, k: usize, a: DevPtr, lda: usize, b: DevPtr, ldb: usize, c: DevPtr, ldc: usize) -> Result<()> {
        let int = |v: usize, what: &str| -> Result<c_int> {
            c_int::try_from(v).map_err(|_| DriverError::Other { api: self.api, what: format!("BLAS GEMM: {what} = {v} exceeds a 32-bit int") })
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        let e = self.e;
        // SAFETY: a, b, c are device allocations of at least the extents described above
        // (the callers check the shapes); alpha / beta are host f32 (pointer mode host,
        // the default) that outlive the call, which only enqueues work.
        let rc = unsafe {
            (self.t.gemm_ex)(
                self.handle as *mut c_void,
                e.op_t,
                e.op_n,
                int(m, "m")?,
                int(n, "n")?,
                int(k, "k")?,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                e.r16f,
                int(lda, "lda")?,
                b as *const c_void,
                e.r16f,
                int(ldb, "ldb")?,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                e.r32f,
                int(ldc, "ldc")?,
                e.compute_32f,
                e.algo_default,
            )
        };
        check(self.api, "blasGemmEx", rc)
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created in `open` and is destroyed once, here.
        unsafe {
            (self.t.destroy)(self.handle as *mut c_void);
        }
    }
}

fn check(api: Api, call: &'static str, rc: Status) -> Result<()> {
    if rc == 0 {
        return Ok(());
    }
    Err(DriverError::Call { api, call, code: rc, name: format!("BLAS status {rc}") })
}

/// `…/libcublas.so.N` → `…/libcublasLt.so.N` when that file exists (paths only).
fn lt_sibling(path: &str) -> Option<String> {
    let p = Path::new(path);
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty())?;
    let file = p.file_name()?.to_string_lossy().replace("libcublas.so", "libcublasLt.so");
    let lt = dir.join(file);
    lt.is_file().then(|| lt.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_start_with_the_loader_names() {
        if std::env::var_os("LODE_BLAS_LIB").is_some() {
            return;
        }
        let c = candidates(Api::Cuda);
        assert_eq!(&c[..3], ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]);
        let h = candidates(Api::Hip);
        assert_eq!(h[0], "libhipblas.so.3");
    }

    #[test]
    fn a_missing_library_is_an_error_not_a_panic() {
        // No GPU libraries on the CI machine: opening must fail cleanly (or, where a
        // cuBLAS exists but no device, fail at handle creation) — never panic.
        if let Err(e) = Blas::open(Api::Hip, 0) {
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn lt_sibling_only_for_paths() {
        assert_eq!(lt_sibling("libcublas.so.12"), None);
        assert_eq!(lt_sibling("/nonexistent/libcublas.so.12"), None);
    }
}
