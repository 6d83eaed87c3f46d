//! The plan's [`Occupancy`] on the open device: the multiprocessor count and each
//! kernel's resident blocks per multiprocessor as the driver's occupancy calculator gives
//! them (else sm_90's figures), each read once.

use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::driver::DevAttr;
use crate::backend::gpu::plan::{self, Occupancy};
use crate::weights::WeightRef;
use crate::weights::layout::{self, Consumer, DeviceClass};

/// What was read from the driver.
#[derive(Default)]
pub(super) struct OccCache {
    sms: Option<usize>,
    per_sm: Vec<(&'static str, u32, usize)>,
}

/// The device and its cache, borrowed for one plan question.
pub(super) struct Probe<'a> {
    pub dev: &'a GpuDevice,
    pub cache: &'a mut OccCache,
}

impl Occupancy for Probe<'_> {
    fn sms(&mut self) -> usize {
        if let Some(n) = self.cache.sms {
            return n;
        }
        let n = self.dev.attribute(DevAttr::MultiprocessorCount).ok().filter(|&n| n > 0).unwrap_or(32) as usize;
        self.cache.sms = Some(n);
        n
    }

    fn per_sm(&mut self, kernel: &'static str, block: u32, sm90: usize) -> usize {
        if let Some(&(_, _, n)) = self.cache.per_sm.iter().find(|(k, b, _)| *k == kernel && *b == block) {
            return n;
        }
        let n = self.dev.max_active_blocks(kernel, block).map(|n| n as usize).unwrap_or(sm90);
        tracing::debug!("{kernel}: {n} blocks of {block} threads per multiprocessor");
        self.cache.per_sm.push((kernel, block, n));
        n
    }
}

/// A matrix weight as the plan sees it (its canonical GPU layout).
pub(super) fn weight(w: &WeightRef) -> plan::Weight {
    plan::Weight { ty: w.ty(), layout: layout::canonical(w.ty(), Consumer::Matrix, DeviceClass::Gpu), rows: w.n_rows(), k: w.row_len() }
}
