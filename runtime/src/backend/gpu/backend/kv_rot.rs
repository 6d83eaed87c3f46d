//! The quantized KV cache's rotation on the device (`hadamard_f32`; the arithmetic is
//! `backend::kv_rot`'s, bit for bit).

use super::{err, GpuBackend};
use crate::backend::gpu::family::elementwise as fam;
use crate::backend::{BackendError, Buf, Result};

impl GpuBackend {
    pub(super) fn hadamard_device(&mut self, x: Buf, n: usize, block: usize) -> Result<()> {
        if !block.is_power_of_two() || !(2..=1024).contains(&block) || n % block != 0 || n / block > u32::MAX as usize {
            let msg = format!("{n} values in blocks of {block} (a power of two from 2 to 1024 dividing them)");
            return Err(BackendError::Invalid { op: "hadamard", msg });
        }
        let (xp, xn) = self.buf(x)?;
        Self::check_len("hadamard", x, xn, n)?;
        let r = fam::hadamard(&self.rec(), xp, n, block).map_err(err("hadamard"));
        self.touch(x);
        r
    }
}
