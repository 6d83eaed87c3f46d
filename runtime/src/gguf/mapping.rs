//! The bytes a [`super::GgufFile`] reads: a read-only memory map of a file, or an owned
//! buffer (tests, fuzzing). This is the only place in lode that maps a file.

use std::path::Path;

use super::GgufError;

/// A file's bytes, either mapped or owned. Both are `Send + Sync` and immutable.
pub(crate) enum Mapping {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Mapping {
    /// Map `path` read-only.
    ///
    /// Soundness: the mapping is created read-only and private (`MAP_PRIVATE`,
    /// `PROT_READ`), so nothing in this process can write through it, and the returned
    /// `&[u8]` never aliases a mutable reference. The remaining hazard is outside the
    /// process: **the file must not be truncated or rewritten while it is mapped**.
    /// Truncation makes reads past the new end raise SIGBUS; concurrent writes by another
    /// process may show through a private mapping on some systems (pages not yet copied).
    /// lode treats model files as immutable inputs and documents that contract here;
    /// it is the same contract llama.cpp's mmap loading relies on.
    pub(crate) fn open(path: &Path) -> Result<Mapping, GgufError> {
        let io_err = |err| GgufError::Io {
            path: path.display().to_string(),
            err,
        };
        let file = std::fs::File::open(path).map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        if meta.is_dir() {
            return Err(GgufError::NotAFile { path: path.display().to_string() });
        }
        let len = meta.len();
        if len == 0 {
            // Zero-length maps are an error on some platforms; an empty buffer parses
            // to the same "truncated" error.
            return Ok(Mapping::Owned(Vec::new()));
        }
        // SAFETY: read-only private mapping of a file lode never writes; the caller's
        // contract (documented above) is that the file is not truncated while mapped.
        let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }.map_err(io_err)?;
        Ok(Mapping::Mapped(map))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        match self {
            Mapping::Mapped(m) => m,
            Mapping::Owned(v) => v,
        }
    }
}
