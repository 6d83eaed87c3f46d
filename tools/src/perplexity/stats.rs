//! Running sums for perplexity and for the comparison against a base run, with
//! llama-perplexity's formulas.

use super::logits_file::Record;
use super::logprobs::RowStats;

/// Σ NLL and Σ NLL² over scored tokens.
#[derive(Default, Clone, Copy, Debug)]
pub struct PplAcc {
    pub nll: f64,
    pub nll2: f64,
    pub count: u64,
}

impl PplAcc {
    pub fn add(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// exp(mean NLL).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count.max(1) as f64).exp()
    }

    /// llama.cpp's error: PPL × sqrt((E[nll²] − E[nll]²) / (count − 1)) (the delta
    /// method on the mean NLL). `None` with fewer than two tokens or no spread.
    pub fn ppl_stderr(&self) -> Option<f64> {
        if self.count < 2 {
            return None;
        }
        let n = self.count as f64;
        let mean = self.nll / n;
        let var = self.nll2 / n - mean * mean;
        (var > 0.0).then(|| (var / (n - 1.0)).sqrt() * mean.exp())
    }
}

/// KL divergence of one position: base `P` (top-k + tail from the file) against the
/// current logits `Q`. Exact over the base's top-k; the remaining mass of each side is
/// one bucket. Current log-probs are rounded to f32 as the file's are, so a run
/// compared with itself gives exactly 0.
pub fn kld(base: &Record, logits: &[f32], q: &RowStats) -> f64 {
    let (mut sum_p, mut sum_q, mut kl) = (0.0f64, 0.0f64, 0.0f64);
    for &(id, lp) in &base.top {
        let lp = lp as f64;
        let lq = q.logp32(logits, id) as f64;
        let p = lp.exp();
        sum_p += p;
        sum_q += lq.exp();
        kl += p * (lp - lq);
    }
    let rest_p = (1.0 - sum_p).max(0.0);
    let rest_q = (1.0 - sum_q).max(0.0);
    if rest_p > 0.0 {
        kl += rest_p * (rest_p / rest_q.max(1e-30)).ln();
    }
    kl
}

/// Everything the comparison with a base run accumulates.
#[derive(Default, Debug)]
pub struct CompareAcc {
    /// Per scored position.
    pub kld: Vec<f64>,
    pub same_top: u64,
    /// NLL of the current run (f32-rounded log-probs, as the base's) and the base's.
    pub nll_q: PplAcc,
    pub nll_base: PplAcc,
    /// Σ (nll_q − nll_base) and its square, for the PPL ratio's error.
    pub d: f64,
    pub d2: f64,
}

impl CompareAcc {
    pub fn add(&mut self, base: &Record, logits: &[f32], q: &RowStats) {
        self.kld.push(kld(base, logits, q));
        if base.top.first().is_some_and(|t| t.0 == q.argmax) {
            self.same_top += 1;
        }
        let nq = -(q.logp32(logits, base.next_token) as f64);
        let nb = -(base.logp_next as f64);
        self.nll_q.add(nq);
        self.nll_base.add(nb);
        self.d += nq - nb;
        self.d2 += (nq - nb) * (nq - nb);
    }

    pub fn n(&self) -> usize {
        self.kld.len()
    }

    /// (mean, standard error of the mean).
    pub fn mean_kld(&self) -> (f64, f64) {
        mean_se(&self.kld)
    }

    /// Fraction of positions with the same top-1 token, and its standard error.
    pub fn same_top(&self) -> (f64, f64) {
        let n = self.n().max(1) as f64;
        let p = self.same_top as f64 / n;
        (p, (p * (1.0 - p) / (n - 1.0).max(1.0)).sqrt())
    }

    /// PPL(Q)/PPL(base) = exp(mean(nll_q − nll_base)), with its standard error.
    pub fn ppl_ratio(&self) -> (f64, f64) {
        let n = self.n().max(1) as f64;
        let mean = self.d / n;
        let var = (self.d2 / n - mean * mean).max(0.0);
        let r = mean.exp();
        (r, r * (var / (n - 1.0).max(1.0)).sqrt())
    }

    /// The `p`-quantile (0..=1) of the KLD values, linear between ranks.
    pub fn kld_quantile(&self, p: f64) -> f64 {
        quantile(&self.kld, p)
    }
}

fn mean_se(v: &[f64]) -> (f64, f64) {
    let n = v.len().max(1) as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0).max(1.0);
    (mean, (var / n).sqrt())
}

/// Quantile of unsorted values, linear interpolation between closest ranks.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let x = p.clamp(0.0, 1.0) * (s.len() - 1) as f64;
    let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
    s[lo] + (s[hi] - s[lo]) * (x - lo as f64)
}

#[cfg(test)]
mod tests {
    use super::super::logprobs::top_k;
    use super::*;

    #[test]
    fn ppl_of_uniform_is_vocab_size() {
        let mut a = PplAcc::default();
        for _ in 0..10 {
            a.add((8.0f64).ln());
        }
        assert!((a.ppl() - 8.0).abs() < 1e-12);
        assert!(a.ppl_stderr().unwrap_or(0.0) < 1e-6, "no spread, (almost) no error");
        a.add(0.0);
        assert!(a.ppl_stderr().unwrap() > 0.0);
    }

    fn record(logits: &[f32], k: usize, next: u32) -> Record {
        let s = RowStats::new(logits);
        Record { next_token: next, logp_next: s.logp32(logits, next), top: top_k(logits, &s, k) }
    }

    #[test]
    fn self_kld_is_zero_and_shift_invariant() {
        let l: Vec<f32> = (0..50).map(|i| ((i * 37 % 11) as f32) * 0.3 - 1.0).collect();
        let base = record(&l, 8, 3);
        let mut acc = CompareAcc::default();
        acc.add(&base, &l, &RowStats::new(&l));
        assert_eq!(acc.kld[0], 0.0);
        assert_eq!(acc.same_top(), (1.0, 0.0));
        assert_eq!(acc.ppl_ratio().0, 1.0);
        let shifted: Vec<f32> = l.iter().map(|x| x + 4.0).collect();
        assert!(kld(&base, &shifted, &RowStats::new(&shifted)).abs() < 1e-6);
    }

    #[test]
    fn kld_matches_full_vocab_when_k_is_all() {
        let p: Vec<f32> = vec![2.0, 1.0, 0.0, -1.0];
        let q: Vec<f32> = vec![1.0, 2.0, 0.5, -2.0];
        let base = record(&p, 4, 0);
        let (sp, sq) = (RowStats::new(&p), RowStats::new(&q));
        let exact: f64 = (0..4u32).map(|t| sp.logp(&p, t).exp() * (sp.logp(&p, t) - sq.logp(&q, t))).sum();
        assert!((kld(&base, &q, &sq) - exact).abs() < 1e-6);
        // With a tail bucket the value is a lower bound of the exact one.
        let base2 = record(&p, 2, 0);
        let approx = kld(&base2, &q, &sq);
        assert!(approx <= exact + 1e-7 && approx > 0.0);
    }

    #[test]
    fn quantiles() {
        let v = [3.0, 1.0, 2.0, 4.0, 5.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 1.0), 5.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 0.125), 1.5);
    }
}
