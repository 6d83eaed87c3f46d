//! Log-probabilities of one position's logits: the next token's log-probability, the
//! argmax and the top-k, all computed the same way for saving and for comparing so a
//! run compared with itself gives exactly zero divergence.

/// Log-softmax summary of one row of logits (`[n_vocab]` f32).
pub struct RowStats {
    /// Maximum logit (the softmax shift).
    pub max: f32,
    /// `ln Σ exp(logit − max)`, summed in f64.
    pub log_sum: f64,
    /// Index of the largest logit (ties to the lowest id).
    pub argmax: u32,
}

impl RowStats {
    pub fn new(logits: &[f32]) -> RowStats {
        let mut max = f32::NEG_INFINITY;
        let mut argmax = 0u32;
        for (i, &l) in logits.iter().enumerate() {
            if l > max {
                max = l;
                argmax = i as u32;
            }
        }
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        RowStats { max, log_sum: sum.ln(), argmax }
    }

    /// `log p(token)` in f64 (what the NLL sums use, like llama.cpp's double sums).
    pub fn logp(&self, logits: &[f32], token: u32) -> f64 {
        (logits[token as usize] - self.max) as f64 - self.log_sum
    }

    /// `log p(token)` rounded to f32: the precision stored in a logits file. Comparisons
    /// round the current run the same way, so equal logits give bit-equal values.
    pub fn logp32(&self, logits: &[f32], token: u32) -> f32 {
        self.logp(logits, token) as f32
    }
}

/// The `k` most probable tokens as `(id, log p)` in descending order (ties: lower id first).
pub fn top_k(logits: &[f32], stats: &RowStats, k: usize) -> Vec<(u32, f32)> {
    let k = k.min(logits.len());
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, desc);
        idx.truncate(k);
    }
    idx.sort_unstable_by(desc);
    idx.into_iter().map(|i| (i, stats.logp32(logits, i))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logp_normalises() {
        let l = [1.0f32, 2.0, 3.0, -1.0];
        let s = RowStats::new(&l);
        let total: f64 = (0..4).map(|t| s.logp(&l, t).exp()).sum();
        assert!((total - 1.0).abs() < 1e-12);
        assert_eq!(s.argmax, 2);
    }

    #[test]
    fn top_k_sorted_with_ties_to_lower_id() {
        let l = [0.5f32, 2.0, 2.0, -3.0, 1.0];
        let s = RowStats::new(&l);
        let t = top_k(&l, &s, 3);
        let ids: Vec<u32> = t.iter().map(|x| x.0).collect();
        assert_eq!(ids, vec![1, 2, 4]);
        assert!(t[0].1 >= t[2].1);
        assert_eq!(top_k(&l, &s, 10).len(), 5);
    }
}
