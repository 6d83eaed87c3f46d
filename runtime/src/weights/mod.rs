//! How model code names a weight when it asks a backend to use it.
//!
//! A [`WeightRef`] is a weight's identity (a stable [`WeightId`] for the model's
//! lifetime plus its tensor view of the mapped file). It carries no layout and no device
//! copy: the backend decides where and how the weight lives. The CPU backend reads
//! `view.data` in place; a GPU backend keys its cache on `(view.file_offset, layout)`
//! (the residency work builds the real `WeightCache` behind this).

use crate::gguf::{GgufFile, TensorInfo, TensorView};
use crate::quant::GgmlType;

/// Index of a tensor in its file's tensor table; stable while the file is open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WeightId(pub u32);

/// One weight as the model hands it to a backend.
#[derive(Clone, Copy, Debug)]
pub struct WeightRef<'a> {
    pub id: WeightId,
    pub view: TensorView<'a>,
}

impl<'a> WeightRef<'a> {
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
    /// Number of rows (output features of a linear weight, vocabulary of an embedding).
    pub fn n_rows(&self) -> usize {
        self.view.info.n_rows() as usize
    }
    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.view.data.len() / self.n_rows().max(1)
    }
    pub fn data(&self) -> &'a [u8] {
        self.view.data
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
