//! Which byte layout a weight is resident in, and the one canonical layout per
//! (quant type, consumer, device) that every kernel reads (DESIGN decision 4).
//!
//! The point of a *single* policy function is that decode matvec, prefill GEMM at any
//! token count, fused gate/up, attention projections and the output head all ask it, so
//! they cannot drift apart and make the cache hold a weight twice (what happened in HRX:
//! `ggml-native` for prefill plus a row64 copy for decode, seeds 000 and 003). A second
//! layout of one region is still served, but the cache counts it as a duplicate and logs
//! it once at insertion.

use std::borrow::Cow;

use crate::quant::{self, row64, GgmlType, QuantError};

/// A resident byte layout of one weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layout {
    /// The bytes exactly as the file stores them (HRX's `ggml-native`).
    Stored,
    /// Dequantized to f32 (small vectors read element-wise: norms, biases).
    F32,
    /// Row-interleaved 64-row tiles of Q4_K / Q6_K (`quant::row64`, reference §4.3).
    Row64,
}

/// How a kernel reads a weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consumer {
    /// A matrix read by rows of blocks: matmul at any token count, get_rows.
    Matrix,
    /// A vector read element-wise as f32 (norm weights, biases).
    Vector,
}

/// Which kind of device will hold the weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceClass {
    /// The CPU backend (reads any layout the quant kernels read in host memory).
    Cpu,
    /// The CUDA / HIP backend.
    Gpu,
}

/// The canonical layout of a weight of type `ty` read as `consumer` on `device`.
///
/// Today every GPU matmul kernel (decode matvec and prefill GEMM alike, see
/// `kernels-hip/`) reads the stored block layout, so the stored layout is canonical for
/// every matrix type; when a kernel family moves to row64 for Q4_K/Q6_K, this is the one
/// line that changes, and every consumer moves with it.
pub fn canonical(ty: GgmlType, consumer: Consumer, device: DeviceClass) -> Layout {
    let l = match (consumer, device) {
        (Consumer::Vector, DeviceClass::Gpu) => Layout::F32,
        (Consumer::Vector, DeviceClass::Cpu) => Layout::Stored,
        (Consumer::Matrix, _) => Layout::Stored,
    };
    normalize(l, ty)
}

/// The same bytes can be named two ways (an f32 tensor "dequantized to f32" is its stored
/// bytes); keys always use the stored name so that is never counted as a duplicate.
pub fn normalize(layout: Layout, ty: GgmlType) -> Layout {
    match (layout, ty) {
        (Layout::F32, GgmlType::F32) => Layout::Stored,
        (l, _) => l,
    }
}

impl Layout {
    /// The layout's name in logs and reports (HRX's names where one exists).
    pub fn name(self, ty: GgmlType) -> &'static str {
        match self {
            Layout::Stored => "ggml-native",
            Layout::F32 => "f32",
            Layout::Row64 => row64::layout_name(ty).unwrap_or("row64"),
        }
    }

    /// Whether `ty` can be held in this layout at all.
    pub fn supports(self, ty: GgmlType) -> bool {
        match self {
            Layout::Stored | Layout::F32 => true,
            Layout::Row64 => row64::layout_name(ty).is_some(),
        }
    }

    /// Resident bytes of a `rows` × `k` weight of type `ty` (stored as `stored` bytes).
    pub fn bytes(self, ty: GgmlType, rows: usize, k: usize, stored: usize) -> Result<usize, QuantError> {
        match normalize(self, ty) {
            Layout::Stored => Ok(stored),
            Layout::F32 => Ok(rows * k * 4),
            Layout::Row64 => row64::packed_len(ty, rows, k),
        }
    }

    /// The resident bytes of `src` in this layout: borrowed when no transform is needed.
    pub fn materialize<'a>(self, ty: GgmlType, src: &'a [u8], rows: usize, k: usize) -> Result<Cow<'a, [u8]>, QuantError> {
        match normalize(self, ty) {
            Layout::Stored => Ok(Cow::Borrowed(src)),
            Layout::F32 => {
                // [rows, k] f32
                let mut v = vec![0f32; rows * k];
                quant::dequantize(ty, src, &mut v)?;
                Ok(Cow::Owned(bytemuck::cast_slice(&v).to_vec()))
            }
            Layout::Row64 => {
                let mut dst = vec![0u8; row64::packed_len(ty, rows, k)?];
                row64::pack(ty, src, rows, k, &mut dst)?;
                Ok(Cow::Owned(dst))
            }
        }
    }

    /// True when this layout needs a CPU transform (the "pack" stage).
    pub fn needs_pack(self, ty: GgmlType) -> bool {
        normalize(self, ty) != Layout::Stored
    }
}

/// The consumer a tensor of this shape has in lode's models: 1-D tensors are vectors
/// (norms, biases), everything else a matrix. Used where the backend must pick layouts
/// without a kernel asking (`upload` residency materializes everything at load).
pub fn consumer_for_dims(dims: &[u64]) -> Consumer {
    if dims.iter().skip(1).all(|&d| d == 1) {
        Consumer::Vector
    } else {
        Consumer::Matrix
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_layout_per_type_and_device() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0] {
            // Matrices: the same layout whatever the token count (the policy has no
            // token-count argument at all).
            assert_eq!(canonical(ty, Consumer::Matrix, DeviceClass::Gpu), Layout::Stored);
            assert_eq!(canonical(ty, Consumer::Matrix, DeviceClass::Cpu), Layout::Stored);
        }
        assert_eq!(canonical(GgmlType::F32, Consumer::Vector, DeviceClass::Gpu), Layout::Stored);
        assert_eq!(canonical(GgmlType::F16, Consumer::Vector, DeviceClass::Gpu), Layout::F32);
    }

    #[test]
    fn f32_of_f32_is_stored() {
        assert_eq!(normalize(Layout::F32, GgmlType::F32), Layout::Stored);
        assert!(!Layout::F32.needs_pack(GgmlType::F32));
        assert!(Layout::F32.needs_pack(GgmlType::F16));
    }

    #[test]
    fn materialized_sizes_match_bytes() {
        let src = vec![0u8; GgmlType::Q4_K.block_bytes() * 2 * 64];
        for l in [Layout::Stored, Layout::F32, Layout::Row64] {
            let m = l.materialize(GgmlType::Q4_K, &src, 64, 512).unwrap();
            assert_eq!(m.len(), l.bytes(GgmlType::Q4_K, 64, 512, src.len()).unwrap(), "{l:?}");
        }
        assert!(!Layout::Row64.supports(GgmlType::Q8_0));
    }
}
