//! Unit tests of `decode_mv.rs` (kernel choice, grids, argument checks) without a GPU.
use super::*;

#[test]
fn one_wave_rule_takes_the_small_model_and_leaves_the_large() {
    // Qwen3-0.6B on 132 SMs: q/k/v 4096 rows, gate/up 3072, o / down 1024.
    assert!(fits_one_wave(norm_kernel(1024, false), 4096, 132));
    assert!(fits_one_wave(norm_kernel(1024, true), 3072, 132));
    assert!(fits_one_wave("decode_mv_quant", 1024, 132));
    // Qwen3-4B: q/k/v 6144 rows, gate/up 9728.
    assert!(!fits_one_wave(norm_kernel(2560, false), 6144, 132));
    assert!(!fits_one_wave(norm_kernel(2560, true), 9728, 132));
    assert_eq!(norm_kernel(4096, true), "decode_mv_glu16");
}

#[test]
fn wide_kernels_take_rows_up_to_1024_in_one_wave_of_32_row_blocks() {
    assert_eq!(wide_kernel(1024, false), Some("decode_mv_norm4_1k"));
    assert_eq!(wide_kernel(576, true), Some("decode_mv_glu4_1k"));
    assert_eq!(wide_kernel(2560, false), None);
    // Qwen3-0.6B's q/k/v (2048 + 1024 + 1024 rows: 128 blocks of 32) and gate/up (96)
    // fit 132 SMs at one block each; Qwen3-4B's q/k/v (192 blocks) do not.
    assert!(fits_one_wave_rows(4096, 32, 132, 1));
    assert!(fits_one_wave_rows(3072, 32, 132, 1));
    assert!(!fits_one_wave_rows(6144, 32, 132, 1));
}

/// The launches a launcher makes (name, grid, block).
struct Cap(std::cell::RefCell<Vec<(&'static str, [u32; 3], [u32; 3])>>);
impl Launch for Cap {
    fn launch(&self, name: &'static str, grid: [u32; 3], block: [u32; 3], _: &[crate::backend::gpu::driver::KArg]) -> Result<(), crate::backend::gpu::driver::DriverError> {
        self.0.borrow_mut().push((name, grid, block));
        Ok(())
    }
}

#[test]
fn quant_blocks_hold_at_most_32_warps() {
    assert_eq!(quant_rows_per_block(16, 1), 16);
    assert_eq!(quant_rows_per_block(32, 1), 32);
    assert_eq!(quant_rows_per_block(16, 2), 16);
    assert_eq!(quant_rows_per_block(32, 2), 16);
    assert_eq!(quant_rows_per_block(16, 4), 8);
    assert_eq!(quant_rows_per_block(8, 1), 8);
    // Anything else asks for the 8-row block.
    assert_eq!(quant_rows_per_block(3, 1), 8);
    let c = Cap(Default::default());
    quant_mv(&c, 1, 2048, 2, GgmlType::Q4_K, 1024, 3, true, 1, 16, false).unwrap();
    quant_mv(&c, 1, 3072, 2, GgmlType::Q4_K, 1000, 3, true, 2, 16, false).unwrap();
    assert_eq!(c.0.into_inner(), vec![("decode_mv_quant", [64, 1, 1], [512, 1, 1]), ("decode_mv_quant", [63, 1, 1], [1024, 1, 1])]);
}

#[test]
fn two_step_q4k_rows_of_one_warp_take_the_preloading_kernel() {
    let c = Cap(Default::default());
    // Qwen3-4B's o (Q4_K rows of 4096: two steps), one warp per row: decode_mv_quant2.
    quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 1, 16, true).unwrap();
    // One step (0.6B's o), two warps per row, another type, or switched off: as before.
    quant_mv(&c, 1, 2048, 2, GgmlType::Q4_K, 1024, 3, true, 1, 16, true).unwrap();
    quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 2, 16, true).unwrap();
    quant_mv(&c, 1, 4096, 2, GgmlType::Q6_K, 2560, 3, true, 1, 16, true).unwrap();
    quant_mv(&c, 1, 4096, 2, GgmlType::Q4_K, 2560, 3, true, 1, 16, false).unwrap();
    let names: Vec<_> = c.0.into_inner().into_iter().map(|(n, g, b)| (n, g[0], b[0])).collect();
    assert_eq!(
        names,
        vec![
            ("decode_mv_quant2", 160, 512),
            ("decode_mv_quant", 64, 512),
            ("decode_mv_quant", 160, 1024),
            ("decode_mv_quant", 160, 512),
            ("decode_mv_quant", 160, 512),
        ]
    );
    assert!(takes_two(GgmlType::Q4_K, 2304, 1) && !takes_two(GgmlType::Q4_K, 2048, 1) && !takes_two(GgmlType::Q5_K, 4096, 1));
}

#[test]
fn launch_shapes_follow_warps_per_row_and_block_width() {
    let c = Cap(Default::default());
    // Down of Qwen3-0.6B (Q6_K, 3072): 4 warps per row, 1024-thread blocks of 8 rows.
    quant_mv(&c, 1, 3072, 2, GgmlType::Q6_K, 1024, 3, true, 4, 8, false).unwrap();
    quant_mv(&c, 1, 3072, 2, GgmlType::Q4_K, 1024, 3, true, 1, 8, false).unwrap();
    // A count that is not the type's own is refused, not launched; so is a block of
    // more than 32 warps.
    assert!(quant_mv(&c, 1, 3072, 2, GgmlType::Q8_0, 1024, 3, false, 2, 8, false).is_err());
    assert!(quant_mv(&c, 1, 3072, 2, GgmlType::Q6_K, 1024, 3, true, 4, 16, false).is_err());
    let n = |threads| Norm { x: 1, add: None, w: None, out: 2, counter: 3, n: 1024, eps: 1e-6, threads, half: false };
    norm_multi(&c, &n(WIDE), &[(4, GgmlType::Q4_K, 2048, 5), (6, GgmlType::Q4_K, 1024, 7), (8, GgmlType::Q6_K, 1024, 9)]).unwrap();
    norm_glu(&c, &n(256), 4, 5, GgmlType::Q4_K, 3072, 6, false).unwrap();
    assert!(norm_multi(&c, &n(512), &[(4, GgmlType::Q4_K, 8, 5)]).is_err());
    let got = c.0.into_inner();
    assert_eq!(
        got,
        vec![
            ("decode_mv_quant", [128, 1, 1], [1024, 1, 1]),
            ("decode_mv_quant", [128, 1, 1], [256, 1, 1]),
            ("decode_mv_norm4_1k", [128, 1, 1], [1024, 1, 1]),
            ("decode_mv_glu4", [384, 1, 1], [256, 1, 1]),
        ]
    );
}

#[test]
fn half_warp_kernels_take_q4k_rows_of_at_most_1024_and_lay_segments_end_to_end() {
    assert!(half_supports(1024, &[GgmlType::Q4_K; 3]));
    assert!(half_supports(256, &[GgmlType::Q4_K]));
    // Q4_K_M's Q6_K v, rows past 1024 or not whole super-blocks, no weights: not taken.
    assert!(!half_supports(1024, &[GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K]));
    assert!(!half_supports(1280, &[GgmlType::Q4_K]));
    assert!(!half_supports(640, &[GgmlType::Q4_K]));
    assert!(!half_supports(1024, &[]));
    let c = Cap(Default::default());
    let a = Norm { x: 1, add: None, w: None, out: 2, counter: 3, n: 1024, eps: 1e-6, threads: WIDE, half: true };
    // Qwen3-0.6B q/k/v: 4096 rows, 64 per block; 33 + 31 rows share one block.
    norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 2048, 5), (6, GgmlType::Q4_K, 1024, 7), (8, GgmlType::Q4_K, 1024, 9)]).unwrap();
    norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 33, 5), (6, GgmlType::Q4_K, 31, 7)]).unwrap();
    norm_glu(&c, &a, 4, 5, GgmlType::Q4_K, 3072, 6, false).unwrap();
    // Any other type is refused, not misread.
    assert!(norm_multi(&c, &a, &[(4, GgmlType::Q4_K, 2048, 5), (8, GgmlType::Q6_K, 1024, 9)]).is_err());
    assert!(norm_glu(&c, &a, 4, 5, GgmlType::Q6_K, 3072, 6, false).is_err());
    assert_eq!(
        c.0.into_inner(),
        vec![
            ("decode_mv_norm4_h1k", [64, 1, 1], [1024, 1, 1]),
            ("decode_mv_norm4_h1k", [1, 1, 1], [1024, 1, 1]),
            ("decode_mv_glu4_h1k", [96, 1, 1], [1024, 1, 1]),
        ]
    );
}

#[test]
fn norm_walk_takes_q4k_rows_of_at_most_16_super_blocks() {
    // Qwen3-4B (2560) and Llama-8B (4096) q/k/v and gate/up, all Q4_K.
    assert!(walk_supports(2560, &[GgmlType::Q4_K; 3]));
    assert!(walk_supports(4096, &[GgmlType::Q4_K, GgmlType::Q4_K]));
    // A Q6_K last weight (Q4_K_M's v) too, but nowhere else, and no other type.
    assert!(walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K]));
    assert!(walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q6_K]));
    assert!(!walk_supports(2560, &[GgmlType::Q6_K, GgmlType::Q4_K]));
    assert!(!walk_supports(2560, &[GgmlType::Q4_K, GgmlType::Q5_K]));
    // A Q6_K weight alone (the LM head) is head_mv's.
    assert!(!walk_supports(2560, &[GgmlType::Q6_K]));
    // Rows past 16 super-blocks or not whole ones, no or four weights: not taken.
    assert!(!walk_supports(4352, &[GgmlType::Q4_K]));
    assert!(!walk_supports(2592, &[GgmlType::Q4_K]));
    assert!(!walk_supports(2560, &[]));
    assert!(!walk_supports(2560, &[GgmlType::Q4_K; 4]));
    let c = Cap(Default::default());
    let a = Norm { x: 1, add: Some(10), w: None, out: 2, counter: 3, n: 2560, eps: 1e-6, threads: WIDE, half: false };
    norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 9728, 5), (6, GgmlType::Q4_K, 9728, 7)], 396).unwrap();
    norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 4096, 5), (6, GgmlType::Q6_K, 1024, 7)], 396).unwrap();
    assert!(norm_walk(&c, &a, &[(4, GgmlType::Q6_K, 9728, 5), (6, GgmlType::Q4_K, 9728, 7)], 396).is_err());
    assert!(norm_walk(&c, &a, &[(4, GgmlType::Q4_K, 9728, 5)], 0).is_err());
    // Resident 256-thread blocks whatever a.threads says.
    assert_eq!(c.0.into_inner(), vec![("decode_mv_norm_walk", [396, 1, 1], [256, 1, 1]), ("decode_mv_norm_walk_v", [396, 1, 1], [256, 1, 1])]);
}

#[test]
fn split_walk_takes_rows_of_2_to_16_steps() {
    // Qwen3-4B's down (9728): Q4_K 5 steps, Q6_K 10; Llama-8B's (14336): 7 and 14.
    assert_eq!(split_steps(GgmlType::Q4_K, 9728), Some(5));
    assert_eq!(split_steps(GgmlType::Q6_K, 9728), Some(10));
    assert_eq!(split_steps(GgmlType::Q4_K, 14336), Some(7));
    assert_eq!(split_steps(GgmlType::Q6_K, 14336), Some(14));
    // One step, more than 16, partial super-blocks, other types: not taken.
    assert_eq!(split_steps(GgmlType::Q4_K, 2048), None);
    assert_eq!(split_steps(GgmlType::Q6_K, 17408), None);
    assert_eq!(split_steps(GgmlType::Q4_K, 9760), None);
    assert_eq!(split_steps(GgmlType::Q5_K, 9728), None);
    let c = Cap(Default::default());
    split_walk(&c, 1, 9728, 2, GgmlType::Q6_K, 2560, 3, 396).unwrap();
    split_walk(&c, 1, 9728, 2, GgmlType::Q4_K, 2560, 3, 792).unwrap();
    assert!(split_walk(&c, 1, 9728, 2, GgmlType::Q8_0, 2560, 3, 396).is_err());
    assert!(split_walk(&c, 1, 9728, 2, GgmlType::Q4_K, 2560, 3, 0).is_err());
    assert_eq!(c.0.into_inner(), vec![("decode_mv_split", [396, 1, 1], [320, 1, 1]), ("decode_mv_split", [792, 1, 1], [160, 1, 1])]);
}

#[test]
fn warps_per_row_follow_the_steps() {
    // Qwen3-0.6B: o (2048, one Q4_K step) 1; down (3072) Q4_K 2 steps, Q6_K 3 → 4.
    assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 2048), 1);
    assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 3072), 2);
    assert_eq!(quant_warps_per_row(GgmlType::Q6_K, 3072), 4);
    assert_eq!(quant_warps_per_row(GgmlType::Q6_K, 4096), 4);
    // Qwen3-4B's down (9728: 5 Q4_K steps) and the 32-element types: one warp.
    assert_eq!(quant_warps_per_row(GgmlType::Q4_K, 9728), 1);
    assert_eq!(quant_warps_per_row(GgmlType::Q8_0, 3072), 1);
}

#[test]
fn low_walks_put_another_type_last_in_segment_two() {
    use crate::quant::GgmlType::*;
    let c = Cap(Default::default());
    let a = Norm { x: 1, add: None, w: None, out: 2, counter: 3, n: 4096, eps: 1e-6, threads: BLOCK, half: false };
    // q, k Q3_K, v Q4_K: the Q3_K walk; q and v alone (segment 1 empty) too.
    norm_walk(&c, &a, &[(10, Q3_K, 4096, 11), (12, Q3_K, 1024, 13), (14, Q4_K, 1024, 15)], 264).unwrap();
    norm_walk(&c, &a, &[(10, IQ4_XS, 4096, 11), (14, Q5_K, 1024, 15)], 264).unwrap();
    norm_walk(&c, &a, &[(10, Q2_K, 14336, 11), (12, Q2_K, 14336, 13)], 264).unwrap();
    assert_eq!(
        c.0.into_inner(),
        vec![
            ("decode_mv_norm_walk_q3k", [264, 1, 1], [256, 1, 1]),
            ("decode_mv_norm_walk_iq4xs", [264, 1, 1], [256, 1, 1]),
            ("decode_mv_norm_walk_q2k", [264, 1, 1], [256, 1, 1]),
        ]
    );
    // A Q3_K weight after a Q4_K one, or after another low type: refused, not misread.
    let c = Cap(Default::default());
    assert!(norm_walk(&c, &a, &[(10, Q4_K, 4096, 11), (12, Q3_K, 1024, 13)], 264).is_err());
    assert!(norm_walk(&c, &a, &[(10, Q3_K, 4096, 11), (12, IQ4_XS, 1024, 13), (14, Q4_K, 1024, 15)], 264).is_err());
    assert!(c.0.into_inner().is_empty());
}
