//! AVX2 + FMA + F16C dot kernels (placeholder set; filled in per type).

use super::dot::DotFn;
use super::types::GgmlType;

/// The AVX2 kernel for `ty`, if there is one. Callers check the CPU first.
pub(crate) fn kernel(ty: GgmlType) -> Option<DotFn> {
    let _ = ty;
    None
}
