//! Counters and latency histograms of one direction, and the live counters behind the progress
//! line.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies are recorded in nanoseconds, 3 significant figures, up to a minute (longer ones
/// saturate: a wait times out well before).
const LATENCY_MAX_NS: u64 = 60_000_000_000;

/// I/Os, bytes and latencies of one direction in the measured window.
#[derive(Debug, Clone)]
pub(crate) struct DirStats {
    pub(crate) ios: u64,
    pub(crate) bytes: u64,
    pub(crate) hist: Histogram<u64>,
}

impl DirStats {
    pub(crate) fn new() -> DirStats {
        // Fixed bounds: recording never allocates.
        let hist = Histogram::new_with_bounds(1, LATENCY_MAX_NS, 3).expect("valid histogram bounds");
        DirStats { ios: 0, bytes: 0, hist }
    }

    pub(crate) fn record(&mut self, latency: Duration, bytes: u64) {
        self.ios += 1;
        self.bytes += bytes;
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX).max(1);
        self.hist.saturating_record(ns);
    }

    pub(crate) fn add(&mut self, other: &DirStats) {
        self.ios += other.ios;
        self.bytes += other.bytes;
        // Same bounds on both sides: adding cannot fail.
        self.hist.add(&other.hist).expect("histograms with the same bounds");
    }
}

/// What a job has done so far (all phases), for the progress line. Padded so that jobs on
/// different cores do not share a cache line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Live {
    pub(crate) ios: [AtomicU64; 2],
    pub(crate) bytes: [AtomicU64; 2],
}

impl Live {
    /// Adds a batch of completions: `[read, write]` I/Os and bytes.
    pub(crate) fn add(&self, ios: [u64; 2], bytes: [u64; 2]) {
        for d in 0..2 {
            if ios[d] > 0 {
                self.ios[d].fetch_add(ios[d], Ordering::Relaxed);
                self.bytes[d].fetch_add(bytes[d], Ordering::Relaxed);
            }
        }
    }

    /// `[read, write]` I/Os and bytes so far.
    pub(crate) fn get(&self) -> ([u64; 2], [u64; 2]) {
        let load = |a: &[AtomicU64; 2]| [a[0].load(Ordering::Relaxed), a[1].load(Ordering::Relaxed)];
        (load(&self.ios), load(&self.bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_adds() {
        let mut a = DirStats::new();
        a.record(Duration::from_micros(100), 4096);
        a.record(Duration::from_micros(300), 4096);
        let mut b = DirStats::new();
        b.record(Duration::from_secs(3600), 4096);
        b.record(Duration::ZERO, 4096);
        a.add(&b);
        assert_eq!((a.ios, a.bytes, a.hist.len()), (4, 16384, 4));
        assert_eq!(a.hist.max(), a.hist.highest_equivalent(LATENCY_MAX_NS));
        assert_eq!(a.hist.min(), 1);
        let p50 = a.hist.value_at_quantile(0.5);
        assert!((99_000..=101_000).contains(&p50), "{p50}");
    }
}
