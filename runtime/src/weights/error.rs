//! What can go wrong making a weight resident. Every variant names the weight, its
//! bytes and the layout; none leaves anything allocated behind (the cache rolls back).

use super::budget::ByteSize;
use crate::quant::QuantError;

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error(
        "weight `{weight}` ({layout}) needs {} but {} of the weight budget {} is already resident \
         (raise --weight-budget, or use --residency mapped to read stored weights in place)",
        ByteSize(*bytes), ByteSize(*resident), ByteSize(*budget)
    )]
    OverBudget { weight: String, layout: &'static str, bytes: u64, resident: u64, budget: u64 },
    #[error("allocating {} on the device for weight `{weight}` ({layout}) failed: {msg}", ByteSize(*bytes))]
    Alloc { weight: String, layout: &'static str, bytes: u64, msg: String, out_of_memory: bool },
    #[error("uploading weight `{weight}` ({layout}, {}) to the device failed: {msg}", ByteSize(*bytes))]
    Upload { weight: String, layout: &'static str, bytes: u64, msg: String },
    #[error("packing weight `{weight}` into layout {layout} failed: {source}")]
    Pack {
        weight: String,
        layout: &'static str,
        #[source]
        source: QuantError,
    },
    #[error("weight `{weight}` of type {ty} has no {layout} layout")]
    Unsupported { weight: String, ty: crate::quant::GgmlType, layout: &'static str },
    #[error("injected {stage} failure for weight `{weight}` (test hook)")]
    Injected { weight: String, stage: &'static str },
    #[error("registering the model file mapping ({}) with the device failed: {msg} (use --residency device to copy weights instead)", ByteSize(*bytes))]
    Mapping { bytes: u64, msg: String },
}

impl WeightError {
    /// True when the device ran out of memory (or the budget did).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, WeightError::OverBudget { .. } | WeightError::Alloc { out_of_memory: true, .. })
    }
}
