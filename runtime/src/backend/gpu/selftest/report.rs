//! What a check's verdict is made of: [`CheckReport`] (one line of the report), [`Acc`]
//! (accumulates a check's worst error over its cases) and [`Rng`] (the deterministic
//! generator every check draws its shapes and data from).

/// One line of the report.
#[derive(Clone, Debug)]
pub struct CheckReport {
    pub name: String,
    pub cases: usize,
    pub max_err: f64,
    /// Worst error / tolerance over all elements (≤ 1 passes).
    pub worst_ratio: f64,
    pub skipped: bool,
    pub failure: Option<String>,
}

impl CheckReport {
    pub fn passed(&self) -> bool {
        self.failure.is_none() && self.worst_ratio <= 1.0
    }
    pub fn line(&self) -> String {
        if self.skipped {
            return format!("SKIP {:<22} (not implemented on this target)", self.name);
        }
        let status = if self.passed() { "PASS" } else { "FAIL" };
        let mut s = format!("{status} {:<22} cases={:<3} max_err={:.3e} err/tol={:.3}", self.name, self.cases, self.max_err, self.worst_ratio);
        if let Some(f) = &self.failure {
            s.push_str(&format!("  {f}"));
        }
        s
    }
}

/// splitmix64: deterministic per seed, no dependency.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }
    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
    /// Uniform in [-1, 1).
    pub fn f(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f() * scale).collect()
    }
    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Accumulates one check's verdict over cases.
pub struct Acc {
    rep: CheckReport,
}
impl Acc {
    pub(crate) fn new(name: &str) -> Acc {
        Acc { rep: CheckReport { name: name.into(), cases: 0, max_err: 0.0, worst_ratio: 0.0, skipped: false, failure: None } }
    }
    /// Compare got vs want elementwise with per-element tolerance.
    pub(crate) fn cmp(&mut self, case: &str, got: &[f32], want: &[f64], tol: impl Fn(usize) -> f64) {
        self.rep.cases += 1;
        if got.len() != want.len() {
            self.fail(format!("{case}: {} outputs, expected {}", got.len(), want.len()));
            return;
        }
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            if !g.is_finite() {
                self.fail(format!("{case}: output {i} is {g} (expected {w:.5})"));
                return;
            }
            let e = (g as f64 - w).abs();
            let t = tol(i);
            self.rep.max_err = self.rep.max_err.max(e);
            let r = e / t;
            if r > self.rep.worst_ratio {
                self.rep.worst_ratio = r;
                if r > 1.0 && self.rep.failure.is_none() {
                    self.rep.failure = Some(format!("{case}: output {i} = {g:.6}, expected {w:.6} (tol {t:.2e})"));
                }
            }
        }
    }
    /// Byte-for-byte equality (the first difference is the failure).
    pub(crate) fn cmp_bytes(&mut self, case: &str, got: &[u8], want: &[u8]) {
        self.rep.cases += 1;
        if got.len() != want.len() {
            self.fail(format!("{case}: {} bytes, expected {}", got.len(), want.len()));
        } else if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
            let (lo, hi) = (i.saturating_sub(4), (i + 4).min(got.len()));
            self.fail(format!("{case}: byte {i} (block {} of 36 B) is {:#04x}, expected {:#04x}; got {:02x?} want {:02x?}", i / 36, got[i], want[i], &got[lo..hi], &want[lo..hi]));
        }
    }
    /// Bit-for-bit equality of f32 values (any NaN equals any NaN: payloads differ by vendor;
    /// the q8_1 form's f16 scale overflows to inf for |x| > 127·65504, and 0·inf is NaN on both).
    pub(crate) fn cmp_bits(&mut self, case: &str, got: &[f32], want: &[f32]) {
        self.rep.cases += 1;
        if got.len() != want.len() {
            self.fail(format!("{case}: {} values, expected {}", got.len(), want.len()));
        } else if let Some(i) = got.iter().zip(want).position(|(a, b)| a.to_bits() != b.to_bits() && !(a.is_nan() && b.is_nan())) {
            self.fail(format!("{case}: value {i} is {:e}, expected {:e} (not bit-identical)", got[i], want[i]));
        }
    }
    pub(crate) fn fail(&mut self, msg: String) {
        if self.rep.failure.is_none() {
            self.rep.failure = Some(msg);
        }
        self.rep.worst_ratio = self.rep.worst_ratio.max(f64::INFINITY);
    }
    pub(crate) fn finish(self) -> CheckReport {
        self.rep
    }
}

