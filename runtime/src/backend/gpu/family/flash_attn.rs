//! `kernels-hip/flash_attn.hip`: prefill attention on matrix cores, FlashAttention-2 style
//! (S and the softmax in registers, K/V pipelined through registers; 64 keys per step, 32
//! at head size 256).

use crate::backend::gpu::driver::DevPtr;
use crate::backend::gpu::launch::{Family, Kernel, Launch};
use crate::backend::gpu::GpuError;
use crate::kernel_args;

kernel_args! {
    /// `flash_attn2_f16_d<HD>(q, kc, vc, out, n_tok, n_head, n_kv_head, hd, pos, window, scale)`.
    pub struct Flash {
        q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize,
        pos: DevPtr, window: usize, scale: f32,
    }
}

/// Padded head size → kernel.
const KERNELS: [(usize, Kernel<Flash>); 3] = [
    (64, Kernel::new("flash_attn2_f16_d64")),
    (128, Kernel::new("flash_attn2_f16_d128")),
    (256, Kernel::new("flash_attn2_f16_d256")),
];

pub const FAMILY: Family = Family {
    name: "flash_attn",
    source: include_str!("../../../../../kernels-hip/flash_attn.hip"),
    kernels: &[&[KERNELS[0].1.sig(), KERNELS[1].1.sig(), KERNELS[2].1.sig()]],
};

/// Queries and threads per block.
const QUERIES: usize = 64;
const THREADS: u32 = 128;

/// Head sizes the flash kernel takes: multiples of 8 up to 256.
pub fn flash_supports(head_dim: usize) -> bool {
    head_dim > 0 && head_dim % 8 == 0 && head_dim <= 256
}

/// The kernel for `head_dim` (padded up to 64, 128 or 256).
pub fn kernel_for(head_dim: usize) -> &'static str {
    KERNELS.iter().find(|(hd, _)| head_dim <= *hd).unwrap_or(&KERNELS[2]).1.name
}

/// Causal / sliding-window GQA attention of n_tok queries over an f16 cache, on matrix
/// cores; the arguments and result of `attention::attention`.
/// q, out: [n_tok, n_head, head_dim] f32; kc, vc: [n_ctx, n_kv_head·head_dim] f16 (slots
/// 0..=max pos filled); pos: [n_tok] i32 on the device; window = 0: full causal.
#[allow(clippy::too_many_arguments)]
pub fn flash_attention(d: &dyn Launch, q: DevPtr, kc: DevPtr, vc: DevPtr, out: DevPtr, n_tok: usize, n_head: usize, n_kv_head: usize, head_dim: usize, pos: DevPtr, window: usize, scale: f32) -> Result<(), GpuError> {
    if !flash_supports(head_dim) || n_kv_head == 0 || n_head % n_kv_head != 0 {
        return Err(GpuError::Unsupported(format!("flash attention: head_dim {head_dim}, heads {n_head}/{n_kv_head}")));
    }
    if n_tok == 0 {
        return Ok(());
    }
    let &(_, kernel) = KERNELS.iter().find(|(hd, _)| head_dim <= *hd).unwrap_or(&KERNELS[2]);
    let args = Flash { q, kc, vc, out, n_tok, n_head, n_kv_head, head_dim, pos, window, scale };
    kernel.launch(d, [n_tok.div_ceil(QUERIES) as u32, n_head as u32, 1], [THREADS, 1, 1], &args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flash_head_sizes() {
        assert!(flash_supports(64) && flash_supports(128) && flash_supports(256) && flash_supports(80));
        assert!(!flash_supports(0) && !flash_supports(260) && !flash_supports(100));
        assert_eq!(kernel_for(128), "flash_attn2_f16_d128");
        assert_eq!(kernel_for(80), "flash_attn2_f16_d128");
        assert_eq!(kernel_for(64), "flash_attn2_f16_d64");
        assert_eq!(kernel_for(160), "flash_attn2_f16_d256");
    }
}
