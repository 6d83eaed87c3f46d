//! Checks on tensor records: shape, type and block size per tensor; alignment, bounds
//! and overlap across the data section. Shared by the reader and the writer so that
//! whatever the writer accepts, the reader accepts.

use super::{GgufError, TensorInfo};
use crate::quant::GgmlType;

/// `x` rounded up to a multiple of `align` (a power of two), `None` on overflow.
pub fn align_up(x: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

/// Build a [`TensorInfo`] from a raw record: dims must be non-negative, the type known,
/// the row length a whole number of blocks, and element count and byte size must fit
/// in `i64` (as ggml requires). `at` is the record's byte offset, for messages.
pub(crate) fn tensor_info(
    name: String,
    ne: &[i64],
    ty_id: u32,
    offset: u64,
    at: u64,
) -> Result<TensorInfo, GgufError> {
    if ne.is_empty() || ne.len() > 4 {
        return Err(GgufError::BadDimCount { tensor: name, offset: at, n_dims: ne.len() as u32 });
    }
    let mut dims = Vec::with_capacity(ne.len());
    for (index, &value) in ne.iter().enumerate() {
        if value < 0 {
            return Err(GgufError::BadDim { tensor: name, offset: at, index, value });
        }
        dims.push(value as u64);
    }
    let Some(ty) = GgmlType::from_id(ty_id) else {
        return Err(GgufError::UnknownTensorType { id: ty_id, tensor: name, offset: at });
    };
    let n_bytes = shape_bytes(&name, ty, &dims)?;
    Ok(TensorInfo { name, ty, dims, offset, n_bytes })
}

/// Bytes a tensor of type `ty` and shape `dims` occupies, with every overflow and
/// partial-block case reported.
pub(crate) fn shape_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
    let overflow = || GgufError::ShapeOverflow { tensor: name.to_string(), dims: dims.to_vec() };
    let n = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).ok_or_else(overflow)?;
    if n > i64::MAX as u64 {
        return Err(overflow());
    }
    let block = ty.block_elems() as u64;
    if dims[0] % block != 0 {
        return Err(GgufError::PartialBlock {
            tensor: name.to_string(),
            ty: ty.name().to_string(),
            ne0: dims[0],
            block,
        });
    }
    // ne[0] is a multiple of the block, so n is too; bytes_for only fails on overflow.
    match ty.bytes_for(n) {
        Some(b) if b <= i64::MAX as u64 => Ok(b),
        _ => Err(overflow()),
    }
}

/// Every tensor's offset aligned, its bytes inside the file, and no two tensors sharing
/// a byte. Tensors need not be stored in offset order.
pub(crate) fn tensor_data(
    tensors: &[TensorInfo],
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if t.offset % alignment != 0 {
            return Err(GgufError::MisalignedOffset {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::DataOutOfBounds {
                    tensor: t.name.clone(),
                    start: start.unwrap_or(u64::MAX),
                    end: end.unwrap_or(u64::MAX),
                    file_len,
                })
            }
        }
    }
    let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
    order.sort_by_key(|t| t.offset);
    for pair in order.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // Both ends are in bounds (checked above), so this cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::Overlap { a: a.name.clone(), b: b.name.clone(), offset: b.offset });
        }
    }
    Ok(())
}
