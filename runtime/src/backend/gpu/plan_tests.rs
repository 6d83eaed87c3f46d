//! The plan without a GPU: the choices of the three presets' decode and prefill shapes on
//! an H200's figures, and the switches that turn each path off.

use super::*;
use crate::quant::GgmlType::{self, *};

fn w(ty: GgmlType, rows: usize, k: usize) -> Weight {
    Weight { ty, layout: crate::weights::layout::canonical(ty, crate::weights::layout::Consumer::Matrix, crate::weights::layout::DeviceClass::Gpu), rows, k }
}

fn mm(w: Weight, n_tok: usize) -> MatmulIn {
    MatmulIn { w, n_tok, blas: true, x_is_y: false, x_ready: false }
}

fn norm(n: usize) -> NormIn {
    NormIn { n, n_tok: 1, buffers_ok: true, w_addr: 0 }
}

#[test]
fn one_token_matmul_quantizes_in_the_prologue_unless_the_form_is_ready() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    // Qwen3-0.6B's o projection: 1024 rows of 2048.
    let q = mm(w(Q4_K, 1024, 2048), 1);
    assert!(matches!(matmul(&q, &t, o), Matmul::QuantMv(_)));
    // Its input already quantized (by the attention kernel): the plain matvec reads it.
    let ready = MatmulIn { x_ready: true, ..q };
    assert_eq!(matmul(&ready, &t, o), Matmul::Matvec);
    // In place never takes the prologue kernel.
    let inplace = MatmulIn { x_is_y: true, ..q };
    assert!(!matches!(matmul(&inplace, &t, o), Matmul::QuantMv(_)));
    // Fused matvecs off: the plain matvec.
    let off = Tuning { fuse_mv: false, ..Tuning::default() };
    assert_eq!(matmul(&q, &off, o), Matmul::Matvec);
}

#[test]
fn four_b_down_is_a_split_walk() {
    // Qwen3-4B's down: 2560 rows of 9728 (38 super-blocks: too long for the quant kernel's wave).
    let t = Tuning::default();
    let o = &mut Sm90::default();
    let q = MatmulIn { x_ready: true, ..mm(w(Q4_K, 2560, 9728), 1) };
    match matmul(&q, &t, o) {
        Matmul::SplitWalk { steps, blocks } => {
            assert!((2..=16).contains(&steps));
            assert!(blocks > 0 && blocks <= 2560);
        }
        p => panic!("{p:?}"),
    }
}

#[test]
fn prefill_goes_to_the_blas_when_open_else_the_gemm() {
    let t = Tuning { mmq: None, ..Tuning::default() }; // the GEMM paths (the integer GEMM: its own test)
    let o = &mut Sm90::default();
    let q = mm(w(Q4_K, 4096, 4096), 512);
    assert_eq!(matmul(&q, &t, o), Matmul::Blas);
    assert_eq!(matmul(&MatmulIn { blas: false, ..q }, &t, o), Matmul::Gemm { tile: 64 });
    let no_blas = Tuning { blas: false, batch_gemm: None, ..Tuning::default() };
    assert_eq!(matmul(&q, &no_blas, o), Matmul::Gemm { tile: 64 });
    // Few tokens: the 16-token tile; below gemm_min the matvec.
    assert_eq!(matmul(&mm(w(Q4_K, 4096, 4096), 40), &no_blas, o), Matmul::Gemm { tile: 16 });
    assert_eq!(matmul(&mm(w(Q4_K, 4096, 4096), 8), &t, o), Matmul::Matvec);
    // A type the GEMM does not read (F16, the F32 router): the float tiles from 2 tokens.
    assert_eq!(matmul(&mm(w(F16, 4096, 4096), 512), &no_blas, o), Matmul::FloatTile);
    assert_eq!(matmul(&mm(w(F32, 128, 2048), 2), &no_blas, o), Matmul::FloatTile);
    assert!(matches!(matmul(&mm(w(F32, 128, 2048), 1), &no_blas, o), Matmul::Matvec | Matmul::QuantMv(_)));
    // blas_min moves the threshold.
    let late = Tuning { blas_min_tokens: 1024, ..Tuning::default() };
    assert_eq!(matmul(&q, &late, o), Matmul::Gemm { tile: 64 });
}

#[test]
fn residual_add_only_in_the_prologue_kernel() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    assert!(matmul_residual(&mm(w(Q4_K, 1024, 2048), 1), &t, o).is_some());
    assert!(matmul_residual(&mm(w(Q4_K, 1024, 2048), 512), &t, o).is_none());
}

#[test]
fn projections_of_one_input() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    // 0.6B q/k/v: one fused launch (few rows).
    let qkv = [w(Q4_K, 2048, 1024), w(Q4_K, 1024, 1024), w(Q6_K, 1024, 1024)];
    assert_eq!(matmul_multi(&qkv, 1, &t, o), Multi::Fused);
    // 8B gate/up in Q4_K: 2 x 14336 rows, many waves of the plain kernel: the row walk.
    let gu = [w(Q4_K, 14336, 4096), w(Q4_K, 14336, 4096)];
    assert!(matches!(matmul_multi(&gu, 1, &t, o), Multi::Q4kLoop { .. }));
    assert_eq!(matmul_multi(&gu, 2, &t, o), Multi::Each);
    assert_eq!(matmul_multi(&gu, 1, &Tuning { fuse: false, ..Tuning::default() }, o), Multi::Each);
}

#[test]
fn gate_up_pair_on_the_gemm_only_without_blas() {
    let t = Tuning::default();
    let (g, u) = (w(Q4_K, 9728, 2560), w(Q4_K, 9728, 2560));
    assert_eq!(matmul_glu(&g, &u, 512, true, &t), GluPlan::Separate);
    assert_eq!(matmul_glu(&g, &u, 512, false, &t), GluPlan::GemmGlu);
    assert_eq!(matmul_glu(&g, &w(Q6_K, 9728, 2560), 512, false, &t), GluPlan::Separate);
    assert_eq!(matmul_glu(&g, &u, 1, false, &t), GluPlan::Separate);
}

#[test]
fn norm_and_matvecs_of_one_token() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    // 0.6B q/k/v behind the attention norm: one wave, fused.
    let qkv = [w(Q4_K, 2048, 1024), w(Q4_K, 1024, 1024), w(Q6_K, 1024, 1024)];
    assert!(matches!(norm_multi(&norm(1024), &qkv, &t, o), NormMv::Fused { .. }));
    // Aliased buffers: unfused.
    assert_eq!(norm_multi(&NormIn { buffers_ok: false, ..norm(1024) }, &qkv, &t, o), NormMv::Unfused);
    // 8B q/k/v (4096 + 1024 + 1024 rows of 4096, Q4_K): too many rows for one wave: the walk.
    let big = [w(Q4_K, 4096, 4096), w(Q4_K, 1024, 4096), w(Q4_K, 1024, 4096)];
    assert!(matches!(norm_multi(&norm(4096), &big, &t, o), NormMv::Walk { .. }));
    // The LM head (Q6_K, 151,936 rows of 1024, aligned): the staged head kernel.
    let head = [w(Q6_K, 151_936, 1024)];
    assert!(matches!(norm_multi(&norm(1024), &head, &t, o), NormMv::Head { .. }));
    assert_eq!(norm_multi(&NormIn { w_addr: 8, ..norm(1024) }, &head, &t, o), NormMv::Unfused);
    // Prefill: the norm, then the matmuls.
    assert_eq!(norm_multi(&NormIn { n_tok: 512, ..norm(1024) }, &qkv, &t, o), NormMv::Unfused);
    // Gate/up behind the norm.
    let (g, u) = (w(Q4_K, 3072, 1024), w(Q4_K, 3072, 1024));
    assert!(matches!(norm_glu(&norm(1024), &g, &u, &t, o), NormMv::Fused { .. }));
    assert_eq!(norm_glu(&norm(1024), &g, &u, &Tuning { fuse_mv: false, ..Tuning::default() }, o), NormMv::Unfused);
}

#[test]
fn decode_attention_fused_and_split_in_one_wave() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    let s = QkvShape { head_dim: 128, n_head: 16, n_kv_head: 8, n_rot: 128, buffers_ok: true, cache_head_dim: (128, 128), cache_kv_heads: 8, cache_f16: true, cache_blocks: false };
    let a = rope_kv_attention(&s, 1, (128, 128, 16, 8), 4096, &t, o).expect("fused");
    assert!(a.parts >= 1 && a.parts <= attn_decode::MAX_PARTS);
    assert!(rope_kv_attention(&s, 2, (128, 128, 16, 8), 4096, &t, o).is_none());
    assert!(rope_kv_attention(&s, 1, (128, 128, 16, 4), 4096, &t, o).is_none());
    assert!(rope_kv_attention(&s, 1, (128, 128, 16, 8), 4096, &Tuning { fuse_attn: false, ..Tuning::default() }, o).is_none());
    let forced = Tuning { attn_part_keys: Some(32), ..Tuning::default() };
    assert_eq!(rope_kv_attention(&s, 1, (128, 128, 16, 8), 4096, &forced, o).unwrap().min_keys, 32);
    assert!(rope_kv(&s, &t));
    assert!(!rope_kv(&QkvShape { n_rot: 127, ..s }, &t));
}

/// `plan::attention` of `n_tok` queries of head size `hd` (32 heads, a 4096-slot cache).
fn attn(n_tok: usize, hd: usize, wants_k: bool, kv: crate::backend::KvTypes, sinks: bool, t: &Tuning) -> Attn {
    attention(&AttnShape { n_tok, head_dim: hd, n_head: 32, max_keys: 4096, wants_k, kv, sinks }, t, &mut Sm90::default())
}

#[test]
fn prefill_attention_is_flash_v2() {
    let t = Tuning::default();
    let f16 = crate::backend::KvType::F16.into();
    assert_eq!(attn(512, 128, false, f16, false, &t), Attn::Flash { kernel: "flash_attn2_f16_d128" });
    assert_eq!(attn(512, 256, false, f16, false, &t), Attn::Flash { kernel: "flash_attn2_f16_d256" });
    assert_eq!(attn(1, 128, false, f16, false, &t), Attn::Decode { q8: true });
    assert_eq!(attn(1, 128, true, f16, false, &t), Attn::Decode { q8: false });
    // Attention sinks (gpt-oss): `attn_f16` at every size (the flash kernel has none).
    assert_eq!(attn(512, 64, false, f16, true, &t), Attn::Decode { q8: true });
    assert_eq!(attn(1, 64, true, f16, true, &t), Attn::Decode { q8: false });
    assert!(add_rms_norm(1024, false, &t) && !add_rms_norm(1000, false, &t) && !add_rms_norm(1024, true, &t));
}

#[test]
fn moe_routes_on_the_device_pairs_then_grouped() {
    let t = Tuning::default();
    let q4 = [(GgmlType::Q4_K, 2048), (GgmlType::Q4_K, 2048), (GgmlType::Q6_K, 768)];
    assert_eq!(moe_ffn(1, 128, 8, q4, QWEN, &t), Moe::Pairs);
    assert_eq!(moe_ffn(2, 128, 8, q4, QWEN, &t), Moe::Grouped);
    assert_eq!(moe_ffn(32, 128, 8, q4, QWEN, &t), Moe::Grouped);
    assert_eq!(moe_ffn(64, 128, 8, q4, QWEN, &t), Moe::Gemm);
    assert_eq!(moe_ffn(512, 128, 8, q4, QWEN, &t), Moe::Gemm);
    // The grid types have no GEMM: grouped matvecs.
    assert_eq!(moe_ffn(512, 128, 8, [(GgmlType::IQ3_S, 2048), (GgmlType::IQ3_S, 2048), q4[2]], QWEN, &t), Moe::Grouped);
    assert_eq!(moe_ffn(2, 128, 8, q4, QWEN, &Tuning { moe_group_min: 64, ..Tuning::default() }), Moe::Pairs);
    // Experts the kernels do not take: float, rows not of the block size, too many experts.
    assert_eq!(moe_ffn(1, 128, 8, [(GgmlType::F16, 2048), q4[1], q4[2]], QWEN, &t), Moe::Unfused);
    assert_eq!(moe_ffn(1, 128, 8, [q4[0], q4[1], (GgmlType::Q6_K, 2880)], QWEN, &t), Moe::Unfused);
    assert_eq!(moe_ffn(1, 2048, 8, q4, QWEN, &t), Moe::Unfused);
    assert_eq!(moe_ffn(1, 32, 4, [(GgmlType::MXFP4, 2880); 3], QWEN, &t), Moe::Pairs);
}

/// gpt-oss's layers (biases, softmax-weight gating, swiglu_oai) take the same device
/// paths with MXFP4 experts; extras the kernels do not compute, expert types they do not
/// read and host experts run the CPU's arithmetic (never the trait's default, which
/// refuses the extras).
#[test]
fn gpt_oss_moe_runs_on_the_device_and_host_experts_on_the_cpu() {
    let t = Tuning::default();
    let mx = [(GgmlType::MXFP4, 2880); 3];
    let oss = MoeForm { host_experts: false, plain: false, device_extras: true };
    assert_eq!(moe_ffn(1, 32, 4, mx, oss, &t), Moe::Pairs);
    assert_eq!(moe_ffn(8, 32, 4, mx, oss, &t), Moe::Grouped);
    assert_eq!(moe_ffn(512, 32, 4, mx, oss, &t), Moe::Gemm);
    assert_eq!(moe_ffn(512, 32, 4, mx, MoeForm { device_extras: false, ..oss }, &t), Moe::Host);
    assert_eq!(moe_ffn(1, 32, 4, [(GgmlType::F16, 2880); 3], oss, &t), Moe::Host);
    assert_eq!(moe_ffn(1, 32, 4, mx, MoeForm { host_experts: true, ..oss }, &t), Moe::Host);
    assert_eq!(moe_ffn(512, 128, 8, [(GgmlType::Q4_K, 2048); 3], MoeForm { host_experts: true, ..QWEN }, &t), Moe::Host);
}

const QWEN: MoeForm = MoeForm { host_experts: false, plain: true, device_extras: true };

/// A Q8_0 / Q4_0 K or V: a prefill chunk converts its rows to f16 for the flash kernel, a
/// decode row runs the split-keys block kernel (parts as the f16 decode's: 32 heads on 132
/// SMs of one block each take 4 parts of a 4096-slot cache), other head sizes `attn_kvq`;
/// the store quantizes (`rope_kv` quantizing as it stores), the fused decode attention
/// (`attn_decode`) and the batched rows kernels are not taken.
#[test]
fn quantized_kv_caches_take_the_block_kernels() {
    use crate::backend::{KvType, KvTypes};
    let t = Tuning::default();
    let o = &mut Sm90::default();
    for ty in [KvTypes::from(KvType::Q8_0), KvTypes { k: KvType::F16, v: KvType::Q4_0 }, KvTypes { k: KvType::Q4_0, v: KvType::F16 }] {
        assert_eq!(attn(512, 128, false, ty, false, &t), Attn::QuantFlash { kernel: "flash_attn2_f16_d128" });
        assert_eq!(attn(2, 64, false, ty, false, &t), Attn::QuantFlash { kernel: "flash_attn2_f16_d64" });
        assert_eq!(attn(1, 128, false, ty, false, &t), Attn::QuantDecode { kernel: "kvq_decode_d128", q8: true, parts: 4, min_keys: 256 });
        assert_eq!(attn(1, 256, true, ty, false, &t), Attn::QuantDecode { kernel: "kvq_decode_d256", q8: false, parts: 4, min_keys: 128 });
        // A short window: one part per 256 keys.
        let short = AttnShape { n_tok: 1, head_dim: 128, n_head: 32, max_keys: 300, wants_k: false, kv: ty, sinks: false };
        assert_eq!(attention(&short, &t, o), Attn::QuantDecode { kernel: "kvq_decode_d128", q8: true, parts: 2, min_keys: 256 });
        // `attn_part_keys` set: its part size, no wave cap.
        let forced = Tuning { attn_part_keys: Some(32), ..Tuning::default() };
        assert_eq!(attention(&short, &forced, o), Attn::QuantDecode { kernel: "kvq_decode_d128", q8: true, parts: 10, min_keys: 32 });
        // Head sizes the block kernels do not take.
        assert_eq!(attn(1, 96, false, ty, false, &t), Attn::Quant { q8: true });
        assert_eq!(attn(1, 96, true, ty, false, &t), Attn::Quant { q8: false });
        assert_eq!(attn(512, 288, false, ty, false, &t), Attn::Quant { q8: false });
        assert_eq!(kv_store(ty), KvStore::Quant);
        assert!(!attention_rows_batched(ty));
        let s = QkvShape { head_dim: 128, n_head: 16, n_kv_head: 8, n_rot: 128, buffers_ok: true, cache_head_dim: (128, 128), cache_kv_heads: 8, cache_f16: false, cache_blocks: true };
        assert!(rope_kv_attention(&s, 1, (128, 128, 16, 8), 4096, &t, o).is_none());
        // The norms, RoPE and the quantizing store in one launch (`rope_kv_f32` with types),
        // at head sizes of whole blocks only.
        assert!(rope_kv(&s, &t));
        assert!(!rope_kv(&QkvShape { head_dim: 80, cache_head_dim: (80, 80), n_rot: 80, ..s }, &t));
        assert!(!rope_kv(&QkvShape { cache_blocks: false, ..s }, &t));
    }
    assert_eq!(kv_store(KvType::F16.into()), KvStore::F16);
    assert!(attention_rows_batched(KvType::F16.into()));
}

#[test]
fn decode_batches_split_k_over_one_64_token_tile() {
    let t = Tuning { mmq: None, ..Tuning::default() }; // split-K where the integer GEMM is off
    let o = &mut Sm90::default();
    // qwen3-4b's output projection at 32 sequences: 20 row tiles, 40 K steps → 14 splits
    // wanted, capped at 20 (2 steps each): 3 steps per split, 14 splits.
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 32), &t, o), Matmul::GemmSplit { splits: 14, per: 3 });
    // A K/V projection (8 row tiles): as many splits as 2-step ranges allow.
    assert_eq!(matmul(&mm(w(Q6_K, 1024, 2560), 64), &t, o), Matmul::GemmSplit { splits: 20, per: 2 });
    // The LM head fills the device by its rows: one 64-token tile, no split.
    assert_eq!(matmul(&mm(w(Q6_K, 151_936, 2560), 32), &t, o), Matmul::Gemm { tile: 64 });
    // Outside the range: the 8-column matvec below, the BLAS above.
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 8), &t, o), Matmul::Matvec);
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 65), &t, o), Matmul::Blas);
    // Off: the BLAS from 16 tokens, as before.
    let off = Tuning { batch_gemm: None, ..t.clone() };
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 32), &off, o), Matmul::Blas);
    // Gate and up of a decode batch run as separate split matmuls.
    let g = w(Q4_K, 9728, 2560);
    assert_eq!(matmul_glu(&g, &g, 32, true, &t), GluPlan::Separate);
    // The tuning key.
    let mut k = Tuning::default();
    assert!(k.apply("batch_gemm=16-48").is_empty());
    assert_eq!(k.batch_gemm, Some((16, 48)));
    assert!(k.apply("batch_gemm=0").is_empty());
    assert_eq!(k.batch_gemm, None);
    assert_eq!(k.apply("batch_gemm=8-100").len(), 1);
}

#[test]
fn decode_batches_take_the_integer_gemm_in_its_range() {
    let o = &mut Sm90::default();
    let mut t = Tuning::default();
    assert_eq!(t.mmq, Some((2, 32)), "measured: the default takes 2-32 rows");
    assert!(t.apply("mmq=2-64").is_empty());
    // qwen3-4b at 32 sequences (264 blocks a wave on the H200's figures). The output
    // projection: 40 blocks of 64 rows, 10 K steps → 7 splits wanted, capped at 5 (2 steps).
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 32), &t, o), Matmul::Mmq { splits: 5, per: 2, mma: true });
    // Gate / up: 152 blocks → 2 splits of 5 steps; each a matmul of its own, the GLU after.
    let g = w(Q4_K, 9728, 2560);
    assert_eq!(matmul(&mm(g, 32), &t, o), Matmul::Mmq { splits: 2, per: 5, mma: true });
    assert_eq!(matmul_glu(&g, &g, 40, false, &Tuning { batch_gemm: None, ..t.clone() }), GluPlan::Separate);
    // Down (Q6_K, 32 rows a block): 80 blocks, 38 steps → 4 splits of 10.
    assert_eq!(matmul(&mm(w(Q6_K, 2560, 9728), 2), &t, o), Matmul::Mmq { splits: 4, per: 10, mma: true });
    // The LM head fills the wave by its rows: no split. A 32-element type likewise.
    assert_eq!(matmul(&mm(w(Q6_K, 151_936, 2560), 64), &t, o), Matmul::Mmq { splits: 1, per: 10, mma: true });
    assert_eq!(matmul(&mm(w(Q8_0, 151_936, 2560), 9), &t, o), Matmul::Mmq { splits: 1, per: 10, mma: false });
    // Q4_K / Q6_K on matrix cores unless `mmq_mma=0` (the same split: same block and rows).
    let dp4a = Tuning { mmq_mma: false, ..t.clone() };
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 32), &dp4a, o), Matmul::Mmq { splits: 5, per: 2, mma: false });
    // A type it does not read, one token, or a batch outside its range: as before.
    assert_eq!(matmul(&mm(w(Q3_K, 2560, 2560), 32), &t, o), Matmul::GemmSplit { splits: 14, per: 3 });
    assert!(matches!(matmul(&mm(w(Q4_K, 2560, 2560), 1), &t, o), Matmul::QuantMv(_)));
    assert!(t.apply("mmq=2-16").is_empty());
    assert_eq!(matmul(&mm(w(Q4_K, 2560, 2560), 32), &t, o), Matmul::GemmSplit { splits: 14, per: 3 });
    assert!(t.apply("mmq=0").is_empty() && t.mmq.is_none());
    assert_eq!(t.apply("mmq=1-64").len(), 1);
}

/// qwen35's delta net: the device kernels for the shapes of every qwen35 file (4 taps, key
/// heads of 128, the tiny preset's 64), the host default for what they do not take and
/// under `LODE_TUNE=delta=0`.
#[test]
fn gated_delta_net_on_the_device_where_the_kernels_take_it() {
    use crate::backend::DeltaDims;
    let d = |d_conv, n_k_heads, n_v_heads, head_k_dim, head_v_dim| DeltaDims { d_conv, n_k_heads, n_v_heads, head_k_dim, head_v_dim, grouped: false };
    for dims in [d(4, 16, 48, 128, 128), d(4, 16, 32, 128, 128), d(4, 2, 4, 64, 64), d(4, 1, 3, 64, 40)] {
        assert_eq!(gated_delta_net(&dims, F32, &Tuning::default()), Delta::Device, "{dims:?}");
        assert_eq!(gated_delta_net(&dims, F32, &Tuning { delta: false, ..Tuning::default() }), Delta::Host, "{dims:?}");
    }
    // Another conv width, key heads of 256, a conv weight in F16 (its f32 form would be a
    // second copy), value heads not a multiple of the key heads.
    for (dims, ty) in [(d(3, 16, 48, 128, 128), F32), (d(4, 16, 48, 256, 128), F32), (d(4, 16, 48, 128, 128), F16), (d(4, 16, 40, 128, 128), F32)] {
        assert_eq!(gated_delta_net(&dims, ty, &Tuning::default()), Delta::Host, "{dims:?} {ty}");
    }
}

#[test]
fn low_bit_mixes_take_the_fused_walks() {
    let t = Tuning::default();
    let o = &mut Sm90::default();
    // llama-8b Q3_K_M: q/k Q3_K, v Q4_K (Q5_K in the first layers): the Q3_K walk.
    for v in [Q4_K, Q5_K, Q3_K] {
        let qkv = [w(Q3_K, 4096, 4096), w(Q3_K, 1024, 4096), w(v, 1024, 4096)];
        assert!(matches!(norm_multi(&norm(4096), &qkv, &t, o), NormMv::Walk { .. }), "{v}");
        assert_eq!(decode_mv::walk_kernel(4096, &[Q3_K, Q3_K, v]), Some("decode_mv_norm_walk_q3k"));
    }
    // Gate/up (14336 rows each) of Q3_K, IQ4_XS, Q2_K: the walk of that type.
    for (ty, k) in [(Q3_K, "decode_mv_norm_walk_q3k"), (IQ4_XS, "decode_mv_norm_walk_iq4xs"), (Q2_K, "decode_mv_norm_walk_q2k")] {
        let (g, u) = (w(ty, 14336, 4096), w(ty, 14336, 4096));
        assert!(matches!(norm_glu(&norm(4096), &g, &u, &t, o), NormMv::Walk { .. }), "{ty}");
        assert_eq!(decode_mv::walk_kernel(4096, &[ty, ty]), Some(k));
    }
    // IQ4_XS's v is Q5_K.
    let qkv = [w(IQ4_XS, 4096, 4096), w(IQ4_XS, 1024, 4096), w(Q5_K, 1024, 4096)];
    assert!(matches!(norm_multi(&norm(4096), &qkv, &t, o), NormMv::Walk { .. }));
    // Its o (4096 rows of 4096) and down (4096 of 14336): the prologue-quantizing kernel.
    assert!(matches!(matmul(&mm(w(IQ4_XS, 4096, 4096), 1), &t, o), Matmul::QuantMv(QuantMv { wpr: 1, two: false, .. })));
    assert!(matches!(matmul(&mm(w(IQ4_XS, 4096, 14336), 1), &t, o), Matmul::QuantMv(_)));
    // Small shapes: one wave of the norm kernels, any mix of their types; Q3_K (which
    // they do not take) the walk even there.
    let small = [w(Q2_K, 1024, 1024), w(IQ4_XS, 512, 1024), w(IQ4_NL, 512, 1024)];
    assert!(matches!(norm_multi(&norm(1024), &small, &t, o), NormMv::Fused { .. }));
    let small_q3 = [w(Q3_K, 2048, 1024), w(Q3_K, 1024, 1024), w(Q4_K, 1024, 1024)];
    assert!(matches!(norm_multi(&norm(1024), &small_q3, &t, o), NormMv::Walk { .. }));
    assert!(matches!(norm_glu(&norm(1024), &w(Q3_K, 3072, 1024), &w(Q3_K, 3072, 1024), &t, o), NormMv::Walk { .. }));
    assert_eq!(norm_multi(&norm(1024), &[w(Q3_K, 2048, 1024), w(IQ4_NL, 512, 1024)], &t, o), NormMv::Unfused);
    // What no walk takes: a Q4_K weight before a Q3_K one, MXFP4, the grid types.
    assert_eq!(decode_mv::walk_kernel(4096, &[Q4_K, Q3_K]), None);
    assert_eq!(decode_mv::walk_kernel(4096, &[Q3_K, IQ4_XS, Q4_K]), None);
    assert_eq!(decode_mv::walk_kernel(4096, &[Q3_K, MXFP4]), None);
    let grid = [w(IQ3_S, 4096, 4096), w(IQ3_S, 1024, 4096)];
    assert_eq!(norm_multi(&norm(4096), &grid, &t, o), NormMv::Unfused);
    // Rows past NORM_MAX: no walk.
    assert_eq!(decode_mv::walk_kernel(5120, &[Q3_K, Q3_K]), None);
}
