//! `--device-memory SIZE`: a device treated as having SIZE bytes, the driver's own use
//! included, and the driver's used memory sampled for a peak that can be trusted.
//!
//! The cap applies to what the driver reports as used (`total − free`: the context, kernel
//! modules, library workspaces, other processes and lode's allocations alike), so an H200
//! capped at 24 GiB refuses an allocation exactly where a 24 GiB card whose driver held
//! the same would: before it (the driver's use now plus the request would pass the cap),
//! and after it (the driver rounded it past the cap: it is freed again). The refusal is the
//! vendor's out-of-memory code, so every caller reports it as a real card's out-of-memory.
//! Memory figures read through the device (`GpuDevice::mem_info`) are those of the capped
//! card: total = the cap, free = the cap − the driver's use.
//!
//! The peak: every sample of the driver's use (at each allocation and arena growth, at
//! each read-back and stream sync, and at every memory query) raises the high-water mark,
//! which `--memory-report` prints as `driver_peak_used_bytes` with `driver_samples`
//! beside it. Samples are taken while a cap, a memory report or `LODE_DEBUG=mem` asks for
//! them ([`Capacity::watching`]); otherwise nothing is queried on the hot path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::weights::budget::human;

/// The cap and the sampled peak of one device (shared by its clones).
#[derive(Debug, Default)]
pub struct Capacity {
    /// The cap in bytes; 0 = none.
    cap: AtomicU64,
    /// Sample even without a cap (memory report, memory trace).
    watch: AtomicBool,
    peak: AtomicU64,
    samples: AtomicU64,
    /// The over-the-cap warning was printed.
    warned: AtomicBool,
    /// `watch`, the peak and the sample count before a peak window opened.
    window_prev: AtomicBool,
    window_peak: AtomicU64,
    window_samples: AtomicU64,
}

impl Capacity {
    pub fn set_cap(&self, bytes: Option<u64>) {
        self.cap.store(bytes.unwrap_or(0), Ordering::Relaxed);
    }
    pub fn cap(&self) -> Option<u64> {
        Some(self.cap.load(Ordering::Relaxed)).filter(|&c| c > 0)
    }
    pub fn set_watch(&self, on: bool) {
        self.watch.store(on, Ordering::Relaxed);
    }
    /// Whether the driver's use is sampled at allocations and read-backs.
    pub fn watching(&self) -> bool {
        self.cap().is_some() || self.watch.load(Ordering::Relaxed)
    }

    /// One sample of the driver's used bytes.
    pub fn observe(&self, used: u64) {
        self.peak.fetch_max(used, Ordering::Relaxed);
        self.samples.fetch_add(1, Ordering::Relaxed);
    }
    /// Opens a peak window (`lode bench`'s per-row peak, read before closing it): samples
    /// from now on and starts the peak afresh from `used`, the driver's use now.
    pub fn open_window(&self, used: u64) {
        let was = self.watch.swap(true, Ordering::Relaxed);
        self.window_prev.store(was, Ordering::Relaxed);
        self.window_peak.store(self.peak.swap(used, Ordering::Relaxed), Ordering::Relaxed);
        self.window_samples.store(self.samples.swap(1, Ordering::Relaxed), Ordering::Relaxed);
    }
    /// Closes it: sampling as it was asked before the window, and the run's peak (what a
    /// memory report prints) again the highest of before and during the window.
    pub fn close_window(&self) {
        self.watch.store(self.window_prev.load(Ordering::Relaxed), Ordering::Relaxed);
        self.peak.fetch_max(self.window_peak.load(Ordering::Relaxed), Ordering::Relaxed);
        self.samples.fetch_add(self.window_samples.load(Ordering::Relaxed), Ordering::Relaxed);
    }
    /// Highest used bytes sampled, and how many samples (`None` before the first).
    pub fn peak(&self) -> Option<(u64, u64)> {
        let n = self.samples.load(Ordering::Relaxed);
        (n > 0).then(|| (self.peak.load(Ordering::Relaxed), n))
    }

    /// Why `bytes` more cannot be had with the driver using `used` (None: they can).
    pub fn refuse(&self, used: u64, bytes: u64) -> Option<String> {
        let cap = self.cap()?;
        (used.saturating_add(bytes) > cap).then(|| self.explain(used, bytes, cap))
    }

    /// Why the driver, now at `used` after granting `bytes`, is over the cap (None: it is not).
    pub fn over_after(&self, used: u64, bytes: u64) -> Option<String> {
        let cap = self.cap()?;
        (used > cap).then(|| self.explain(used.saturating_sub(bytes), bytes, cap))
    }

    fn explain(&self, used: u64, bytes: u64, cap: u64) -> String {
        format!(
            "out of memory: {} requested while the driver holds {} of the device's {} (--device-memory; {} free)",
            human(bytes),
            human(used),
            human(cap),
            human(cap.saturating_sub(used))
        )
    }

    /// The driver's `(free, total)` as a card of the cap's size reports them.
    pub fn view(&self, free: u64, total: u64) -> (u64, u64) {
        match self.cap() {
            Some(cap) if cap < total => {
                let used = total.saturating_sub(free);
                (cap.saturating_sub(used).min(free), cap)
            }
            _ => (free, total),
        }
    }

    /// A read-back found the driver past the cap without lode allocating (a library's
    /// workspace, kernel modules): said once, since a card of that size would have
    /// refused whatever took it.
    pub fn warn_if_over(&self, used: u64) {
        if let Some(cap) = self.cap() {
            if used > cap && !self.warned.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    "the driver holds {} on a device capped at {} (--device-memory): memory lode did not allocate itself \
                     (library workspaces, kernel modules) went past the cap; a card of that size would have refused it",
                    human(used),
                    human(cap)
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    #[test]
    fn no_cap_refuses_nothing_and_changes_no_figure() {
        let c = Capacity::default();
        assert!(!c.watching());
        assert_eq!(c.refuse(140 * GIB, 10 * GIB), None);
        assert_eq!(c.view(100 * GIB, 141 * GIB), (100 * GIB, 141 * GIB));
    }

    /// The driver's own use counts: with 1 GiB held by the context, a 24 GiB card has
    /// 23 GiB for lode, and a request is refused before and after the driver's rounding.
    #[test]
    fn the_cap_counts_the_drivers_use() {
        let c = Capacity::default();
        c.set_cap(Some(24 * GIB));
        assert!(c.watching());
        assert_eq!(c.view(140 * GIB, 141 * GIB), (23 * GIB, 24 * GIB));
        assert_eq!(c.refuse(GIB, 23 * GIB), None);
        let why = c.refuse(GIB, 23 * GIB + 1).unwrap();
        assert!(why.contains("out of memory") && why.contains("24.00 GiB") && why.contains("1.00 GiB"), "{why}");
        // Granted below the cap but rounded past it by the driver.
        assert!(c.over_after(24 * GIB + (2 << 20), 23 * GIB).is_some());
        assert_eq!(c.over_after(24 * GIB, 23 * GIB), None);
        // A cap above the card changes nothing: the card's own figures stand.
        c.set_cap(Some(200 * GIB));
        assert_eq!(c.view(100 * GIB, 141 * GIB), (100 * GIB, 141 * GIB));
        // Free never exceeds what the real card has free.
        c.set_cap(Some(24 * GIB));
        assert_eq!(c.view(2 * GIB, 141 * GIB).0, 0);
    }

    #[test]
    fn the_peak_is_the_highest_sample() {
        let c = Capacity::default();
        assert_eq!(c.peak(), None);
        for used in [3, 9, 4] {
            c.observe(used * GIB);
        }
        assert_eq!(c.peak(), Some((9 * GIB, 3)));
    }

    #[test]
    fn a_window_has_its_own_peak_and_restores_the_sampling() {
        let c = Capacity::default();
        c.observe(9 * GIB);
        c.open_window(5 * GIB);
        assert!(c.watching());
        assert_eq!(c.peak(), Some((5 * GIB, 1)));
        c.observe(7 * GIB);
        c.observe(6 * GIB);
        assert_eq!(c.peak(), Some((7 * GIB, 3)));
        c.close_window();
        assert!(!c.watching(), "sampling was not asked before the window");
        assert_eq!(c.peak(), Some((9 * GIB, 4)), "the run's peak survives the window");
        c.set_watch(true);
        c.open_window(GIB);
        c.close_window();
        assert!(c.watching(), "a memory report's sampling survives a window");
    }
}
