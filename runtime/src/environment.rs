//! Every environment variable lode reads, in one table: the source of the table in
//! ARCHITECTURE.md and of `lode --help`'s list (a test checks that the sources name no
//! other `LODE_` variable and that the docs hold this table as generated here). Settings
//! a user chooses per run are flags; these are for where a flag cannot reach (a test
//! harness, a library path, an A/B run of the tuning table).

/// (name, what it sets).
pub const VARIABLES: &[(&str, &str)] = &[
    ("LODE_TUNE", "Overrides of the GPU tuning table, `key=value,...` (`backend::gpu::tuning::KEYS`), e.g. `graphs=0,blas_min=32`; for A/B runs."),
    ("LODE_DEBUG", "Diagnostics, comma-separated: `profile`, `kernel-times`, `host-times`, `launches`, `mem`, `weights`, `repeat=KERNEL[:N]`, `cpu-dump=DIR[:N]` (`diag.rs`)."),
    ("LODE_DEVICE_ORDINAL", "Which GPU of its kind a run opens (default 0)."),
    ("LODE_HIP_ARCH", "The AMD GPU architecture (e.g. `gfx1100`) when the driver does not report it."),
    ("LODE_BLAS_LIB", "The cuBLAS / hipBLAS library file to open instead of searching for it."),
    ("LODE_CACHE_DIR", "Where run-time compiled kernels are cached (default `~/.cache/lode`)."),
    ("LODE_MODELS_DIR", "Where the default model is fetched and looked for (default `~/.cache/lode/models`)."),
    ("LODE_API_KEY", "`lode serve`: the bearer token requests must carry (also `--api-key`)."),
    ("LODE_FIXTURES_DIR", "Tests: the folder of llama.cpp's reference outputs (default `../shared/fixtures`)."),
    ("LODE_DEVICE_MEMORY", "The device's memory, the driver's own use included, as `--device-memory` (which wins), e.g. `24GiB`; tests use it to run out-of-memory paths on any device."),
];

/// [`VARIABLES`] as the markdown table the docs carry.
pub fn markdown_table() -> String {
    let mut s = String::from("| variable | what it sets |\n| --- | --- |\n");
    for (name, what) in VARIABLES {
        s += &format!("| `{name}` | {what} |\n");
    }
    s
}
