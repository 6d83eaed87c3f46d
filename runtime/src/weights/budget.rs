//! `--weight-budget BYTES`: a cap on device bytes held by weights.
//!
//! Going over it is an error naming the weight, its bytes and the budget, raised before
//! anything is allocated — the process stays usable (DESIGN decision 5).

use std::fmt;
use std::str::FromStr;

/// A byte count parsed from `4GiB`, `512MiB`, `1.5G`, `3000000000`, `64k` …
/// (`K/M/G/T` and `KiB/MiB/…` are powers of 1024, `KB/MB/GB/TB` powers of 1000).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let bad = || format!("cannot read `{s}` as a byte count (examples: 4GiB, 512MiB, 1.5G, 3000000000)");
        if num.is_empty() {
            return Err(bad());
        }
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "m" | "mib" => 1 << 20,
            "g" | "gib" => 1 << 30,
            "t" | "tib" => 1 << 40,
            "kb" => 1_000,
            "mb" => 1_000_000,
            "gb" => 1_000_000_000,
            "tb" => 1_000_000_000_000,
            _ => return Err(bad()),
        };
        if let Ok(n) = num.parse::<u64>() {
            return n.checked_mul(mult).map(ByteSize).ok_or_else(|| format!("`{s}` is too large"));
        }
        let f: f64 = num.parse().map_err(|_| bad())?;
        let v = f * mult as f64;
        if !v.is_finite() || v >= u64::MAX as f64 {
            return Err(format!("`{s}` is too large"));
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    /// `3.50 GiB (3758096384 bytes)`: readable, and exact for comparing.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({} bytes)", human(self.0), self.0)
    }
}

/// `1.23 GiB`, `512.0 MiB`, `17 B`.
pub fn human(b: u64) -> String {
    const U: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < U.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.2} {}", U[i])
}

/// The weight budget of one cache: `None` = unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Budget(pub Option<u64>);

impl Budget {
    /// Would holding `more` bytes on top of `resident` stay within the budget?
    pub fn allows(self, resident: u64, more: u64) -> bool {
        match self.0 {
            None => true,
            Some(b) => resident.checked_add(more).is_some_and(|t| t <= b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_suffixes() {
        assert_eq!("4GiB".parse(), Ok(ByteSize(4 << 30)));
        assert_eq!("4G".parse(), Ok(ByteSize(4 << 30)));
        assert_eq!("4gb".parse(), Ok(ByteSize(4_000_000_000)));
        assert_eq!("512 MiB".parse(), Ok(ByteSize(512 << 20)));
        assert_eq!("1.5G".parse(), Ok(ByteSize(3 << 29)));
        assert_eq!("123".parse(), Ok(ByteSize(123)));
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("4XB".parse::<ByteSize>().unwrap_err().contains("4XB"));
        assert!("99999999999T".parse::<ByteSize>().is_err());
    }

    #[test]
    fn budget_checks() {
        assert!(Budget(None).allows(u64::MAX, 1));
        assert!(Budget(Some(10)).allows(4, 6));
        assert!(!Budget(Some(10)).allows(5, 6));
        assert!(!Budget(Some(10)).allows(u64::MAX, 1));
        assert_eq!(human(3 << 29), "1.50 GiB");
    }
}
