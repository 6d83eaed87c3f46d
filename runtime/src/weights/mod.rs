//! How model code names a weight when it asks a backend to use it.
//!
//! A [`WeightRef`] is a weight's identity (a stable [`WeightId`] for the model's
//! lifetime plus its tensor view of the mapped file). It carries no layout and no device
//! copy: the backend decides where and how the weight lives. The CPU backend reads
//! `view.data` in place; a GPU backend keys its cache on `(view.file_offset, layout)`
//! through [`WeightCache`].
//!
//! - [`cache`]: the `WeightCache` (region × layout → one resident copy) over a
//!   [`Materializer`] (allocate / upload / free on some device).
//! - [`layout`]: the layouts and the one canonical layout per (type, consumer, device).
//! - [`residency`]: `device` / `mapped` / `upload`; [`budget`]: `--weight-budget`.
//! - [`stats`]: the accounting behind `--memory-report`; [`host`]: the cache over host
//!   memory (CPU `device`/`upload` residency, and the tests).

pub mod budget;
pub mod cache;
pub mod error;
pub mod host;
pub mod layout;
pub mod residency;
pub mod stats;

pub use budget::ByteSize;
pub use cache::{DeviceFault, Materializer, Stage, WeightCache};
pub use error::WeightError;
pub use layout::Layout;
pub use residency::Residency;
pub use stats::{DeviceMemory, HostExperts, WeightStats};

use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::GgmlType;

/// Environment variable of the device capacity (bytes, `24GiB`-style suffixes): what
/// `--device-memory` sets, for runs and tests that pass no flag (the flag wins).
pub const DEVICE_MEMORY_ENV: &str = "LODE_DEVICE_MEMORY";

/// How a backend should hold weights: the `--residency`, `--weight-budget` flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WeightOptions {
    /// `None`: the device's default.
    pub residency: Option<Residency>,
    /// Cap on device bytes of weight copies.
    pub budget: Option<u64>,
    /// Test hook: the cache fails allocations past this many resident bytes, as a full
    /// device would ([`WeightCache::set_alloc_limit`]).
    pub test_alloc_limit: Option<u64>,
    /// `--device-memory` / `LODE_DEVICE_MEMORY`: the device is treated as having this
    /// many bytes, the driver's own use included (GPU: `backend::gpu::capacity`; CPU: the
    /// bytes the cached backend holds, `backend::cached`).
    pub device_memory: Option<u64>,
    /// `--memory-report`: the cache prints its accounting as one JSON line on stderr when
    /// it is dropped (with the model, at exit).
    pub report_at_exit: bool,
    /// `--n-cpu-moe N` (llama.cpp's flag): the expert tensors (`ffn_*_exps`) of the first N
    /// layers stay in the file mapping and the CPU computes those layers' experts; a GPU
    /// backend never copies them (`backend::gpu`'s `moe_ffn`). `None`: the engine chooses
    /// the count when the experts do not fit (`engine::fit::host_expert_layers_within`).
    pub n_cpu_moe: Option<usize>,
}

impl WeightOptions {
    /// Defaults plus `LODE_DEVICE_MEMORY` (an unreadable value is an error naming it).
    pub fn from_env() -> Result<WeightOptions, String> {
        Ok(WeightOptions { device_memory: device_memory_from_env()?, ..Default::default() })
    }
}

/// `LODE_DEVICE_MEMORY`, parsed (unset or empty: `None`).
pub fn device_memory_from_env() -> Result<Option<u64>, String> {
    match std::env::var(DEVICE_MEMORY_ENV) {
        Ok(v) if !v.trim().is_empty() => Ok(Some(v.parse::<ByteSize>().map_err(|e| format!("{DEVICE_MEMORY_ENV}: {e}"))?.0)),
        _ => Ok(None),
    }
}

/// Index of a tensor in its file's tensor table; stable while the file is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

/// One weight as the model hands it to a backend.
///
/// A mixture-of-experts tensor (`ffn_{gate,up,down}_exps`) is 3-D: `dims[2]` matrices of
/// `dims[1]` rows each, one per expert. [`WeightRef::matrix`] names one of them: the
/// accessors (`n_rows`, `data`, `row_bytes`) then describe that matrix alone, so every
/// kernel and `matmul` reads it as an ordinary 2-D weight, while the weight cache keys on
/// the whole tensor ([`cache::Region::of`]) and hands out an address inside its one copy.
/// There is never a per-expert region or a second copy.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub id: WeightId,
    /// The whole tensor.
    pub view: TensorView<'a>,
    /// `Some(e)`: only matrix `e` of a 3-D tensor (expert `e`).
    pub matrix: Option<u32>,
}

impl<'a> WeightRef<'a> {
    /// The whole tensor `view`.
    pub fn new(id: WeightId, view: TensorView<'a>) -> WeightRef<'a> {
        WeightRef { id, view, matrix: None }
    }
    /// Matrix `e` of this 3-D tensor (expert `e` of an `_exps` tensor), or `None` when the
    /// tensor is not 3-D or has no matrix `e`.
    pub fn expert(&self, e: usize) -> Option<WeightRef<'a>> {
        match self.view.info.dims.as_slice() {
            [_, _, n] if (e as u64) < *n && self.matrix.is_none() => Some(WeightRef { matrix: Some(e as u32), ..*self }),
            _ => None,
        }
    }
    /// The same tensor, whole.
    pub fn whole(&self) -> WeightRef<'a> {
        WeightRef { matrix: None, ..*self }
    }
    pub fn name(&self) -> &'a str {
        &self.view.info.name
    }
    pub fn ty(&self) -> GgmlType {
        self.view.info.ty
    }
    /// Row length (ggml `ne[0]`; the reduction length K of a linear weight).
    pub fn row_len(&self) -> usize {
        self.view.info.dims[0] as usize
    }
    /// Number of rows (output features of a linear weight, vocabulary of an embedding);
    /// of the one matrix when [`Self::matrix`] is set.
    pub fn n_rows(&self) -> usize {
        match self.matrix {
            Some(_) => self.view.info.dims[1] as usize,
            None => self.view.info.n_rows() as usize,
        }
    }
    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.view.data.len() / (self.view.info.n_rows() as usize).max(1)
    }
    /// The stored bytes of this weight (of the one matrix when [`Self::matrix`] is set).
    pub fn data(&self) -> &'a [u8] {
        // `expert` checks the index; a hand-made out-of-range one reads as empty (the
        // kernels then refuse it by its length) rather than panicking.
        let (off, len) = self.span();
        self.view.data.get(off..off + len).unwrap_or(&[])
    }
    /// Which part of the whole tensor's stored bytes [`Self::data`] is: (offset, length).
    pub fn span(&self) -> (usize, usize) {
        match self.matrix {
            Some(e) => {
                let len = self.n_rows() * self.row_bytes();
                (e as usize * len, len)
            }
            None => (0, self.view.data.len()),
        }
    }
}

/// Builds the [`TensorView`] of tensor `index` of `file` without a name lookup.
/// Returns `None` if the index is out of range or the record points outside the file
/// (the reader validates this, so `None` means a caller bug or a truncated mapping).
pub fn view_at(file: &GgufFile, index: usize) -> Option<TensorView<'_>> {
    let info: &TensorInfo = file.tensors().get(index)?;
    let start = file.data_offset().checked_add(info.offset)?;
    let end = start.checked_add(info.n_bytes)?;
    let data = file.bytes().get(start as usize..end as usize)?;
    Some(TensorView { info, data, file_offset: start })
}
