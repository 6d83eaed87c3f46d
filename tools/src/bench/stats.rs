//! Small statistics for benchmark samples: mean, sample standard deviation, and the
//! paired t-interval used to compare two configurations.

/// Mean and sample standard deviation (n − 1); sd is 0 for fewer than two values.
pub fn mean_sd(v: &[f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    if v.len() < 2 {
        return (mean, 0.0);
    }
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// Two-sided 97.5 % quantile of Student's t with `df` degrees of freedom.
pub fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => T[df - 1],
        _ => {
            // Cornish–Fisher expansion around the normal quantile.
            let z = 1.959964f64;
            let d = df as f64;
            z + (z.powi(3) + z) / (4.0 * d) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * d * d)
        }
    }
}

/// Ratio B/A of paired speed samples (A_i and B_i ran back to back), with a 95 %
/// interval: a paired t-interval on ln(B_i/A_i), exponentiated. Pairing cancels slow
/// drifts of the machine (thermal, other load) that an unpaired test would count as
/// noise. Returns (ratio, low, high); low/high are NaN with fewer than two pairs.
pub fn paired_ratio(a: &[f64], b: &[f64]) -> (f64, f64, f64) {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| (y / x).ln()).collect();
    let (m, sd) = mean_sd(&d);
    if d.len() < 2 {
        return (m.exp(), f64::NAN, f64::NAN);
    }
    let h = t975(d.len() - 1) * sd / (d.len() as f64).sqrt();
    (m.exp(), (m - h).exp(), (m + h).exp())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_sd_basic() {
        let (m, s) = mean_sd(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(m, 5.0);
        assert!((s - 2.138089935).abs() < 1e-9);
        assert_eq!(mean_sd(&[3.0]), (3.0, 0.0));
    }

    #[test]
    fn t_quantiles() {
        assert_eq!(t975(4), 2.776);
        assert!((t975(60) - 2.000).abs() < 0.002);
        assert!((t975(1000) - 1.962).abs() < 0.001);
    }

    #[test]
    fn paired_ratio_of_constant_factor() {
        let a = [100.0, 90.0, 110.0, 95.0];
        let b: Vec<f64> = a.iter().map(|x| x * 1.1).collect();
        let (r, lo, hi) = paired_ratio(&a, &b);
        assert!((r - 1.1).abs() < 1e-12 && (lo - 1.1).abs() < 1e-9 && (hi - 1.1).abs() < 1e-9);
        let (r, lo, hi) = paired_ratio(&[100.0, 100.0, 100.0], &[101.0, 99.0, 100.0]);
        assert!(lo < r && r < hi && lo < 1.0 && hi > 1.0);
    }
}
