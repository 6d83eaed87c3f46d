//! `rope_attn_*` checks: the GPU's fused decode attention (`Backend::rope_kv_attention` of
//! one token: q/k norms, RoPE, the K/V store and attention in one kernel,
//! `backend/rope_attn.rs`) through the `Backend` trait, against the [`CpuBackend`]
//! running the trait's default (`rope_kv_write` then `attention`).
//!
//! Each case fills a cache with `P` random history rows, poisons every slot from `P` on
//! (NaN), then runs two decode steps (positions `P` and `P + 1`, fresh q/k/v each, the
//! output buffer NaN before each), each followed by a Q8_0 output projection of `out`.
//! After each step it checks:
//! - the cache (read back): slots before the step untouched, bit for bit; the new V row
//!   equal to f16(v); the new K row within 2^-9 relative + 1e-3 of f16 of the CPU's
//!   normalized and rotated k; every later slot still NaN;
//! - `out` against an f64 attention over the CPU's prepared q and the GPU's cache, within
//!   2e-4·|want| + 5e-5 (a key too many or too few, a wrong rotation or scale, a missed
//!   norm are all far outside it);
//! - `out` against the CPU's own `out`, within 6e-3·max|v| (the CPU rounds q to f16 and
//!   accumulates V in f16: this only confirms the two agree on what the op means);
//! - the projection, whose input blocks the fused kernel wrote (`act.rs`), against
//!   `quant::matmul` of the GPU's `out` on the host, within 2e-3·|y| + 0.05 (a stale or
//!   wrong block is off by the size of y).
//!
//! Shapes: head_dim 64/128/256, GQA 1/2/4/8, NORM and NEOX (partial rotation, frequency
//! factors and scale), q/k norms on and off, windows, positions 0, 1, 127, 128, 255 and
//! past 1000, with caches big enough that the kernel splits the keys over several blocks,
//! forced small parts (`set_attn_part_keys`) at short positions, and keys filling a few
//! warps in order (position 40: three of 16 warps busy); gpt-oss's YaRN RoPE (`_yarn`:
//! its angles in the frequency divisors) and attention sinks (`_sinks`: the unfused
//! store and `attn_f16`, the f64 reference times each head's share beside its sink).

use super::report::{Acc, CheckReport, Rng};
use super::ref_attention;
use crate::backend::cpu::CpuBackend;
use crate::backend::gpu::device::GpuDevice;
use crate::backend::gpu::GpuBackend;
use crate::backend::{Attention, Backend, Buf, KvCache, KvSpec, KvType, QkvPrep, Rope, RopeMode};
use crate::gguf::{GgufFile, GgufWriter};
use crate::quant::{self, GgmlType};
use crate::weights::{WeightId, WeightRef};

/// One case's shape.
#[derive(Clone, Copy, Debug)]
struct Case {
    hd: usize,
    n_head: usize,
    n_kv: usize,
    mode: RopeMode,
    /// Rotated dims (≤ hd).
    n_rot: usize,
    norms: bool,
    window: Option<usize>,
    /// Position of the first of the two steps.
    pos: usize,
    n_ctx: usize,
    freq_factors: bool,
    freq_scale: f32,
    q_scale: Option<f32>,
    scale: f32,
    /// The GPU's fewest keys per part (None: its default, one block iteration).
    part_keys: Option<usize>,
    /// YaRN RoPE (gpt-oss: original context 4096, with `freq_scale` its 1/factor).
    yarn: bool,
    /// Attention sinks (gpt-oss: one logit per head in [−1, 3)); the GPU then runs the
    /// unfused store and `attn_f16`.
    sinks: bool,
}

fn cases() -> Vec<Case> {
    use RopeMode::*;
    let c = |hd: usize, n_head, n_kv, mode, norms, window, pos, n_ctx| Case {
        hd,
        n_head,
        n_kv,
        mode,
        n_rot: hd,
        norms,
        window,
        pos,
        n_ctx,
        freq_factors: false,
        freq_scale: 1.0,
        q_scale: None,
        scale: 1.0 / (hd as f32).sqrt(),
        part_keys: None,
        yarn: false,
        sinks: false,
    };
    vec![
        // Qwen3-0.6B's shape from the first token on.
        c(128, 16, 8, Neox, true, None, 0, 64),
        c(128, 16, 8, Neox, true, None, 1, 64),
        c(128, 16, 8, Neox, true, None, 127, 256),
        // 256 then 257 keys: one block per head, then two parts merged.
        c(128, 16, 8, Neox, true, None, 255, 512),
        // Qwen3-4B/8B's grouping, keys split over 4 parts.
        c(128, 32, 8, Neox, true, None, 1000, 2048),
        // No grouping, NORM pairs, a window, a quarter-speed rotation.
        Case { freq_scale: 0.25, ..c(128, 8, 8, Norm, true, Some(100), 300, 512) },
        // SmolLM2-like: head 64, no norms, NORM; partial rotation with frequency factors.
        Case { n_rot: 32, freq_factors: true, ..c(64, 6, 2, Norm, false, None, 128, 300) },
        // GQA 8 with a window longer than one part.
        c(64, 8, 1, Neox, false, Some(700), 1500, 1600),
        // A big cache (several parts possible) at a short position.
        c(64, 4, 2, Neox, true, None, 5, 4096),
        // Gemma 3: head 256, GQA 4, window 512, q scaled, softmax scale 1.
        Case { q_scale: Some(1.0 / 16.0), scale: 1.0, ..c(256, 4, 1, Neox, true, Some(512), 1000, 1100) },
        c(256, 4, 2, Norm, false, None, 127, 200),
        // A window of one key: only the new one.
        c(128, 8, 1, Neox, true, Some(1), 0, 8),
        // Short contexts split into small parts (`Tuning::attn_part_keys`): the merge at 128 keys,
        // parts of 2 keys, and the window's parts past the part cap.
        Case { part_keys: Some(32), ..c(128, 16, 8, Neox, true, None, 126, 1024) },
        Case { part_keys: Some(2), ..c(64, 4, 2, Neox, true, None, 5, 4096) },
        Case { part_keys: Some(7), q_scale: Some(0.125), scale: 1.0, ..c(256, 4, 1, Neox, true, Some(512), 900, 1000) },
        // A few warps' worth of keys.
        c(128, 16, 8, Neox, true, None, 40, 256),
        // gpt-oss: head 64, GQA 8, a 128-key window, YaRN × 32 (past and before the window).
        Case { yarn: true, freq_scale: 1.0 / 32.0, ..c(64, 8, 1, Neox, false, Some(128), 300, 512) },
        Case { yarn: true, freq_scale: 1.0 / 32.0, ..c(64, 16, 2, Neox, false, None, 60, 256) },
        // gpt-oss's attention sinks, windowed and not, from the first token on.
        Case { yarn: true, sinks: true, freq_scale: 1.0 / 32.0, ..c(64, 8, 1, Neox, false, Some(128), 300, 512) },
        Case { yarn: true, sinks: true, freq_scale: 1.0 / 32.0, ..c(64, 16, 2, Neox, false, None, 0, 64) },
        Case { sinks: true, ..c(128, 16, 8, Neox, true, None, 1000, 2048) },
    ]
}

/// What one backend left after one step.
struct Step {
    out: Vec<f32>,
    /// q and k after the op (the CPU's: prepared in place).
    q: Vec<f32>,
    k: Vec<f32>,
    /// The Q8_0 projection of `out`.
    y: Vec<f32>,
    /// The GPU's cache after the step (K, V).
    cache: Option<(Vec<u16>, Vec<u16>)>,
}

/// The case's inputs.
struct Data {
    hist_k: Vec<f32>,
    hist_v: Vec<f32>,
    /// Per step: q, k, v.
    steps: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)>,
    /// Q8_0 projection weight [rows, n_head·hd] and its rows.
    w8: Vec<u8>,
    w8_rows: usize,
}

/// The case's weights in one GGUF: `qn`, `kn` ([hd]), `ff` ([n_rot/2]), `w8`, `sk`
/// ([n_head] sinks, zero unless the case has them).
fn weights(rng: &mut Rng, c: &Case, w8: &[u8], rows: usize) -> Result<GgufFile, String> {
    let mut g = GgufWriter::new();
    let f32s = |v: Vec<f32>| bytemuck::cast_slice::<f32, u8>(&v).to_vec();
    g.add_tensor("qn", GgmlType::F32, &[c.hd as u64], f32s((0..c.hd).map(|_| 1.0 + 0.5 * rng.f()).collect()));
    g.add_tensor("kn", GgmlType::F32, &[c.hd as u64], f32s((0..c.hd).map(|_| 1.0 + 0.5 * rng.f()).collect()));
    g.add_tensor("ff", GgmlType::F32, &[(c.n_rot / 2).max(1) as u64], f32s((0..(c.n_rot / 2).max(1)).map(|_| 2.0 + rng.f()).collect()));
    g.add_tensor("w8", GgmlType::Q8_0, &[(c.n_head * c.hd) as u64, rows as u64], w8.to_vec());
    let sk: Vec<f32> = (0..c.n_head).map(|_| if c.sinks { 1.0 + 2.0 * rng.f() } else { 0.0 }).collect();
    g.add_tensor("sk", GgmlType::F32, &[c.n_head as u64], f32s(sk));
    GgufFile::from_bytes(g.to_bytes().map_err(|e| e.to_string())?).map_err(|e| e.to_string())
}

/// Case `c`'s weights (one GGUF) and inputs, drawn from `rng` in one fixed order (the
/// GPU check and its host test see the same data for the same seed).
fn case_data(rng: &mut Rng, c: &Case) -> Result<(GgufFile, Data), String> {
    let row = c.n_kv * c.hd;
    let w8_rows = 8;
    let wv = rng.vec(w8_rows * c.n_head * c.hd, 1.0);
    let mut w8 = vec![0u8; GgmlType::Q8_0.bytes_for(wv.len() as u64).ok_or("partial block")? as usize];
    quant::quantize(GgmlType::Q8_0, &wv, &mut w8).map_err(|e| e.to_string())?;
    let f = weights(rng, c, &w8, w8_rows)?;
    let d = Data {
        hist_k: rng.vec(c.pos * row, 2.0),
        hist_v: rng.vec(c.pos * row, 1.5),
        steps: (0..2).map(|_| (rng.vec(c.n_head * c.hd, 2.0), rng.vec(row, 2.0), rng.vec(row, 1.5))).collect(),
        w8,
        w8_rows,
    };
    Ok((f, d))
}

fn wref<'a>(f: &'a GgufFile, name: &str, id: u32) -> WeightRef<'a> {
    WeightRef::new(WeightId(id), f.tensor(name).expect("the case file has the tensor"))
}

/// Weight ids of case `i`'s `qn`, `kn`, `ff`, `w8`, `sk`.
fn ids(i: usize) -> [u32; 5] {
    let b = 5 * i as u32;
    [b + 1, b + 2, b + 3, b + 4, b + 5]
}

/// Both steps of a case on one backend; `snap` reads the cache back after each step.
#[allow(clippy::type_complexity)]
fn run_steps<B: Backend + ?Sized>(be: &mut B, c: &Case, d: &Data, f: &GgufFile, id: [u32; 5], snap: &mut dyn FnMut(&mut B, KvCache) -> crate::backend::Result<Option<(Vec<u16>, Vec<u16>)>>) -> crate::backend::Result<Vec<Step>> {
    let row = c.n_kv * c.hd;
    let spec = KvSpec { n_layer: 1, n_ctx: c.n_ctx, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, ty: KvType::F16.into(), swa: None, alt: None };
    let (qn, kn, ff, w8) = (wref(f, "qn", id[0]), wref(f, "kn", id[1]), wref(f, "ff", id[2]), wref(f, "w8", id[3]));
    let rope = Rope { mode: c.mode, n_rot: c.n_rot, freq_base: 1_000_000.0, freq_scale: c.freq_scale, freq_factors: c.freq_factors.then_some(ff), yarn: c.yarn.then_some(crate::backend::Yarn { ext_factor: 1.0, beta_fast: 32.0, beta_slow: 1.0, n_ctx_orig: 4096 }) };
    let prep = QkvPrep { n_head: c.n_head, n_kv_head: c.n_kv, head_dim: c.hd, q_norm: c.norms.then_some(qn), k_norm: c.norms.then_some(kn), eps: 1e-6, rope, q_scale: c.q_scale };
    let attn = Attention { n_head: c.n_head, n_kv_head: c.n_kv, head_dim_k: c.hd, head_dim_v: c.hd, scale: c.scale, window: c.window, sinks: c.sinks.then(|| wref(f, "sk", id[4])) };
    let input = |be: &mut B, v: &[f32]| -> crate::backend::Result<Buf> {
        let b = be.alloc(v.len().max(1))?;
        be.write(b, v)?;
        Ok(b)
    };
    let kv = be.alloc_kv(&spec)?;
    let mut bufs = Vec::new();
    if c.pos > 0 {
        let (kb, vb) = (input(be, &d.hist_k)?, input(be, &d.hist_v)?);
        be.kv_write(kv, 0, kb, vb, &(0..c.pos as u32).collect::<Vec<_>>())?;
        bufs.extend([kb, vb]);
    }
    let nan = vec![f32::NAN; (c.n_ctx - c.pos) * row];
    let (kb, vb) = (input(be, &nan)?, input(be, &nan)?);
    be.kv_write(kv, 0, kb, vb, &(c.pos as u32..c.n_ctx as u32).collect::<Vec<_>>())?;
    bufs.extend([kb, vb]);
    let ob = be.alloc(c.n_head * c.hd)?;
    let yb = be.alloc(d.w8_rows)?;
    bufs.extend([ob, yb]);
    let mut out = Vec::new();
    for (s, (q, k, v)) in d.steps.iter().enumerate() {
        let (qb, kb, vb) = (input(be, q)?, input(be, k)?, input(be, v)?);
        be.write(ob, &vec![f32::NAN; c.n_head * c.hd])?;
        be.rope_kv_attention(qb, kb, vb, kv, 0, &[(c.pos + s) as u32], &prep, &attn, ob)?;
        be.matmul(&w8, ob, 1, yb)?;
        let mut st = Step { out: vec![0.0; c.n_head * c.hd], q: vec![0.0; q.len()], k: vec![0.0; k.len()], y: vec![0.0; d.w8_rows], cache: None };
        be.read(ob, &mut st.out)?;
        be.read(qb, &mut st.q)?;
        be.read(kb, &mut st.k)?;
        be.read(yb, &mut st.y)?;
        st.cache = snap(be, kv)?;
        out.push(st);
        bufs.extend([qb, kb, vb]);
    }
    be.free_kv(kv)?;
    for b in bufs {
        be.free(b)?;
    }
    Ok(out)
}

/// `want` (the f64 attention of one query row) times each head's share beside its sink:
/// `l / (l + e^(sink − m))` over the same f64 scores.
fn sink_share(want: &mut [f64], q: &[f32], kc: &[u16], c: &Case, p: usize, sk: &[f32]) {
    let w = c.window.unwrap_or(0);
    let k0 = if w > 0 { (p + 1).saturating_sub(w) } else { 0 };
    for h in 0..c.n_head {
        let kvh = h / (c.n_head / c.n_kv);
        let qv = &q[h * c.hd..(h + 1) * c.hd];
        let s: Vec<f64> = (k0..=p).map(|j| (0..c.hd).map(|e| qv[e] as f64 * h2f(kc[(j * c.n_kv + kvh) * c.hd + e]) as f64).sum::<f64>() * c.scale as f64).collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let l: f64 = s.iter().map(|x| (x - m).exp()).sum();
        let keep = l / (l + (sk[h] as f64 - m).exp());
        want[h * c.hd..(h + 1) * c.hd].iter_mut().for_each(|x| *x *= keep);
    }
}

fn f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
fn h2f(b: u16) -> f32 {
    half::f16::from_bits(b).to_f32()
}

/// Case `idx` on both backends, checked as the module comment says. Its weight file joins
/// `files`, which outlives the backends: their weight caches know a weight by the address
/// of its bytes, so a freed file's address must not come back as another weight.
fn check_case(gpu: &mut GpuBackend, cpu: &mut CpuBackend, rng: &mut Rng, c: &Case, idx: usize, files: &mut Vec<GgufFile>, acc: &mut Acc) -> Result<(), String> {
    let row = c.n_kv * c.hd;
    let (file, d) = case_data(rng, c)?;
    files.push(file);
    let f: &GgufFile = files.last().ok_or("no file")?;
    gpu.set_attn_part_keys(c.part_keys);
    let g = run_steps(gpu, c, &d, f, ids(idx), &mut |be: &mut GpuBackend, kv| be.read_kv(kv, 0).map(Some)).map_err(|e| format!("gpu: {e}"))?;
    let h = run_steps(cpu, c, &d, f, ids(idx), &mut |_: &mut CpuBackend, _| Ok(None)).map_err(|e| format!("cpu: {e}"))?;
    let name = format!("hd {} heads {}/{} {:?} rot {} norms {} window {:?} ctx {}", c.hd, c.n_head, c.n_kv, c.mode, c.n_rot, c.norms, c.window, c.n_ctx);
    let vmax = d.steps.iter().map(|s| &s.2).chain([&d.hist_v]).flat_map(|v| v.iter()).fold(0f32, |m, x| m.max(x.abs())) as f64;
    let mut prev: Option<(Vec<u16>, Vec<u16>)> = None;
    for (s, (gs, hs)) in g.iter().zip(&h).enumerate() {
        let p = c.pos + s;
        let case = format!("{name} pos {p}");
        let (kc, vc) = gs.cache.as_ref().ok_or("no GPU cache read back")?;
        // The cache: earlier slots as they were, the new row, later slots still NaN.
        let before = p * row;
        let (want_k, want_v): (Vec<u16>, Vec<u16>) = match &prev {
            None => (d.hist_k.iter().map(|&x| f16(x)).collect(), d.hist_v.iter().map(|&x| f16(x)).collect()),
            Some((k, v)) => (k[..before].to_vec(), v[..before].to_vec()),
        };
        if kc[..before] != want_k[..] || vc[..before] != want_v[..] {
            acc.fail(format!("{case}: cache slots before the new one changed"));
            return Ok(());
        }
        let (k_new, v_new) = (&kc[before..before + row], &vc[before..before + row]);
        if let Some(i) = (0..row).find(|&i| v_new[i] != f16(d.steps[s].2[i])) {
            acc.fail(format!("{case}: new V element {i} is {} (want {})", h2f(v_new[i]), d.steps[s].2[i]));
            return Ok(());
        }
        if let Some(i) = (0..row).find(|&i| {
            let (gk, ck) = (h2f(k_new[i]), h2f(f16(hs.k[i])));
            // Written so that a NaN on either side counts as a difference.
            #[allow(clippy::neg_cmp_op_on_partial_ord)]
            let bad = !((gk - ck).abs() <= ck.abs() / 512.0 + 1e-3);
            bad
        }) {
            acc.fail(format!("{case}: new K element {i} is {} (CPU's prepared k: {})", h2f(k_new[i]), hs.k[i]));
            return Ok(());
        }
        if kc[before + row..].iter().chain(&vc[before + row..]).any(|&b| !h2f(b).is_nan()) {
            acc.fail(format!("{case}: a cache slot past the new one was written"));
            return Ok(());
        }
        // out against f64 over the CPU's prepared q and the GPU's cache.
        let mut want = ref_attention(&hs.q, kc, vc, 1, c.n_head, c.n_kv, c.hd, p, c.window.unwrap_or(0), c.scale);
        if c.sinks {
            let sk = f.tensor("sk").ok_or("no sinks tensor")?;
            let sk: &[f32] = bytemuck::try_cast_slice(sk.data).map_err(|e| e.to_string())?;
            sink_share(&mut want, &hs.q, kc, c, p, sk);
        }
        acc.cmp(&format!("{case} vs f64"), &gs.out, &want, |i| 2e-4 * want[i].abs() + 5e-5);
        let cpu_out: Vec<f64> = hs.out.iter().map(|&x| x as f64).collect();
        acc.cmp(&format!("{case} vs cpu"), &gs.out, &cpu_out, |_| 6e-3 * vmax);
        // The projection read the q8_1 blocks the kernel wrote.
        let mut y = vec![0f32; d.w8_rows];
        quant::matmul(&d.w8, GgmlType::Q8_0, d.w8_rows, c.n_head * c.hd, &gs.out, 1, &mut y).map_err(|e| e.to_string())?;
        let yw: Vec<f64> = y.iter().map(|&x| x as f64).collect();
        acc.cmp(&format!("{case} projection"), &gs.y, &yw, |i| 2e-3 * yw[i].abs() + 0.05);
        prev = Some((kc.clone(), vc.clone()));
    }
    Ok(())
}

/// Every `rope_attn_*` check whose name contains `filter` (one per case).
pub fn run(dev: &GpuDevice, filter: Option<&str>, seed: u64) -> Vec<CheckReport> {
    let all = cases();
    let named: Vec<(usize, String, Case)> = all
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let parts = c.part_keys.map(|n| format!("_k{n}")).unwrap_or_default();
            let extra = format!("{}{}", if c.yarn { "_yarn" } else { "" }, if c.sinks { "_sinks" } else { "" });
            (i, format!("rope_attn_d{}_g{}_p{}{parts}{extra}", c.hd, c.n_head / c.n_kv, c.pos), *c)
        })
        .collect();
    let named: Vec<(usize, String, Case)> = named.into_iter().filter(|(_, n, _)| filter.map(|f| n.contains(f)).unwrap_or(true)).collect();
    if named.is_empty() {
        return Vec::new();
    }
    let mut gpu = GpuBackend::new(dev.clone());
    gpu.set_fuse_attn(true);
    let mut cpu = match CpuBackend::new(4) {
        Ok(c) => c,
        Err(e) => return named.into_iter().map(|(_, n, _)| CheckReport { name: n, cases: 0, max_err: 0.0, worst_ratio: f64::INFINITY, skipped: false, failure: Some(e.to_string()) }).collect(),
    };
    let mut rng = Rng::new(seed ^ 0x0a77_d3c0);
    let mut files = Vec::new();
    let reports = named
        .into_iter()
        .map(|(idx, name, c)| {
            let mut acc = Acc::new(&name);
            if let Err(e) = check_case(&mut gpu, &mut cpu, &mut rng, &c, idx, &mut files, &mut acc) {
                acc.fail(e);
            }
            acc.finish()
        })
        .collect();
    drop(gpu);
    drop(cpu);
    drop(files);
    reports
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host half of the check: the CPU's default op against the same f64 reference
    /// (over its own prepared q and the cache it must have stored), which is what the GPU
    /// check's CPU tolerance rests on; prints the worst error / max|v| per case.
    #[test]
    fn cpu_default_matches_the_reference_the_gpu_check_uses() {
        let mut cpu = CpuBackend::new(2).expect("cpu backend");
        let mut rng = Rng::new(7);
        for c in cases() {
            let (f, d) = case_data(&mut rng, &c).unwrap();
            let id = ids(0);
            let h = run_steps(&mut cpu, &c, &d, &f, id, &mut |_: &mut CpuBackend, _| Ok(None)).unwrap();
            let vmax = d.steps.iter().map(|s| &s.2).chain([&d.hist_v]).flat_map(|v| v.iter()).fold(0f32, |m, x| m.max(x.abs())) as f64;
            let mut kc: Vec<u16> = d.hist_k.iter().map(|&x| f16(x)).collect();
            let mut vc: Vec<u16> = d.hist_v.iter().map(|&x| f16(x)).collect();
            for (s, hs) in h.iter().enumerate() {
                kc.extend(hs.k.iter().map(|&x| f16(x)));
                vc.extend(d.steps[s].2.iter().map(|&x| f16(x)));
                let p = c.pos + s;
                let mut want = ref_attention(&hs.q, &kc, &vc, 1, c.n_head, c.n_kv, c.hd, p, c.window.unwrap_or(0), c.scale);
                if c.sinks {
                    let sk: &[f32] = bytemuck::try_cast_slice(f.tensor("sk").unwrap().data).unwrap();
                    sink_share(&mut want, &hs.q, &kc, &c, p, sk);
                }
                let worst = hs.out.iter().zip(&want).map(|(&g, &w)| (g as f64 - w).abs()).fold(0f64, f64::max);
                eprintln!("{c:?} pos {p}: cpu vs f64 {worst:.3e} = {:.4} max|v|", worst / vmax);
                assert!(worst <= 6e-3 * vmax, "{c:?} pos {p}: {worst}");
            }
        }
    }
}
