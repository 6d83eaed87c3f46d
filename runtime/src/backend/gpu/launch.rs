//! The one interface between a typed launcher and whatever runs its kernel: [`Launch`]
//! (the device's stream, the step recorder of graph replay, a capture of one launch), and
//! the activation forms the launchers name ([`ActFmt`]). Every kernel family's launchers
//! take a `&dyn Launch`; nothing else of the device is theirs to see.

use super::driver::{DriverError, KArg};

/// Where launches go: straight to the device, or through a recorder (the backend's
/// graph capture records every launch of a step).
pub trait Launch {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], args: &[KArg]) -> Result<(), DriverError>;
}

/// The activation blocks a quantized matvec reads (`kernels-hip/quantize.hip`), each
/// rounded as the CPU backend rounds the weight type's `vec_dot_type`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash)]
pub enum ActFmt {
    /// 32-element q8_1 blocks: the codes and d of the CPU's q8_0 and q8_1 (Q4_0 … Q8_0).
    Q8_1,
    /// The codes and f32 scale of the CPU's q8_K, in 36-byte blocks (the K-quants).
    K,
}

impl ActFmt {
    /// Values per scale group (the `k` granularity the format needs).
    pub fn group(self) -> usize {
        match self {
            ActFmt::Q8_1 => 32,
            ActFmt::K => 256,
        }
    }
    /// The kernel flag (`kfmt`) of the fused producers.
    pub(crate) fn flag(self) -> KArg {
        KArg::I32((self == ActFmt::K) as i32)
    }
}
