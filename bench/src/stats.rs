//! Counters and latency histograms of one direction, the live counters behind the progress
//! line and fio's bandwidth and IOPS samples, and a thread's own CPU time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;

/// The directions, as fio numbers them (its `ddir`): every per-direction array is indexed by
/// these.
pub(crate) const DIRS: usize = 3;
/// The directions' names, by index: what fio calls them.
pub(crate) const DIR_NAMES: [&str; DIRS] = ["read", "write", "trim"];
/// Index of reads, writes, trims.
pub(crate) const READ: usize = 0;
pub(crate) const WRITE: usize = 1;
pub(crate) const TRIM: usize = 2;

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
    pub(crate) ios: [AtomicU64; DIRS],
    pub(crate) bytes: [AtomicU64; DIRS],
}

impl Live {
    /// Adds a batch of completions: I/Os and bytes by direction.
    pub(crate) fn add(&self, ios: [u64; DIRS], bytes: [u64; DIRS]) {
        for d in 0..DIRS {
            if ios[d] > 0 {
                self.ios[d].fetch_add(ios[d], Ordering::Relaxed);
                self.bytes[d].fetch_add(bytes[d], Ordering::Relaxed);
            }
        }
    }

    /// I/Os and bytes so far, by direction.
    pub(crate) fn get(&self) -> ([u64; DIRS], [u64; DIRS]) {
        let load = |a: &[AtomicU64; DIRS]| a.each_ref().map(|x| x.load(Ordering::Relaxed));
        (load(&self.ios), load(&self.bytes))
    }
}

/// A thread's resource use (`getrusage(RUSAGE_THREAD)`), as fio reports it per job: CPU time,
/// context switches, page faults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ThreadUsage {
    pub(crate) user: Duration,
    pub(crate) system: Duration,
    /// Voluntary and involuntary context switches (fio's `ctx`).
    pub(crate) ctx: u64,
    /// Major page faults (fio's `majf`).
    pub(crate) majf: u64,
    /// Minor page faults (fio's `minf`).
    pub(crate) minf: u64,
}

impl ThreadUsage {
    /// The calling thread's use so far; `None` where the kernel does not say.
    pub(crate) fn now() -> Option<ThreadUsage> {
        use nix::sys::resource::{getrusage, UsageWho};
        let u = getrusage(UsageWho::RUSAGE_THREAD).ok()?;
        let time = |t: nix::sys::time::TimeVal| {
            Duration::from_secs(t.tv_sec().max(0) as u64) + Duration::from_micros(t.tv_usec().max(0) as u64)
        };
        let count = |n: std::ffi::c_long| n.max(0) as u64;
        Some(ThreadUsage {
            user: time(u.user_time()),
            system: time(u.system_time()),
            ctx: count(u.voluntary_context_switches()) + count(u.involuntary_context_switches()),
            majf: count(u.major_page_faults()),
            minf: count(u.minor_page_faults()),
        })
    }

    /// What was used between `earlier` and `self`.
    pub(crate) fn since(&self, earlier: &ThreadUsage) -> ThreadUsage {
        ThreadUsage {
            user: self.user.saturating_sub(earlier.user),
            system: self.system.saturating_sub(earlier.system),
            ctx: self.ctx.saturating_sub(earlier.ctx),
            majf: self.majf.saturating_sub(earlier.majf),
            minf: self.minf.saturating_sub(earlier.minf),
        }
    }

    /// Both added (a group of threads).
    pub(crate) fn plus(&self, other: &ThreadUsage) -> ThreadUsage {
        ThreadUsage {
            user: self.user + other.user,
            system: self.system + other.system,
            ctx: self.ctx + other.ctx,
            majf: self.majf + other.majf,
            minf: self.minf + other.minf,
        }
    }
}

/// fio's bandwidth and IOPS samples of one job: one per [`SAMPLE_INTERVAL`] of its measured
/// window and direction (as fio's `bw_avg` and `iops_avg_time`, 500 ms), taken by the main
/// thread from the job's [`Live`] counters, so the I/O path does nothing for them. A window's
/// last, partial interval is not sampled, nor is a direction the workload does not do.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Rates {
    /// KiB/s, by direction.
    pub(crate) bw: [Vec<f64>; DIRS],
    /// I/Os per second, by direction.
    pub(crate) iops: [Vec<f64>; DIRS],
}

/// fio's default `bw_avg` and `iops_avg_time`.
pub(crate) const SAMPLE_INTERVAL: Duration = Duration::from_millis(500);

/// Smallest, largest, mean and (sample) standard deviation of `xs`, all 0 when empty, as fio
/// reports its bandwidth and IOPS samples.
pub(crate) fn sample_stats(xs: &[f64]) -> (f64, f64, f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0, 0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let dev = if xs.len() > 1 { (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt() } else { 0.0 };
    (min, max, mean, dev)
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

    #[test]
    fn sample_statistics() {
        assert_eq!(sample_stats(&[]), (0.0, 0.0, 0.0, 0.0));
        assert_eq!(sample_stats(&[5.0]), (5.0, 5.0, 5.0, 0.0));
        let (min, max, mean, dev) = sample_stats(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!((min, max, mean), (2.0, 9.0, 5.0));
        assert!((dev - 2.138).abs() < 1e-3, "{dev}");
    }

    #[test]
    fn a_thread_sees_its_own_cpu_time() {
        let before = ThreadUsage::now().expect("getrusage(RUSAGE_THREAD) on Linux");
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let used = ThreadUsage::now().unwrap().since(&before);
        assert!(used.user + used.system >= Duration::from_millis(20), "{used:?}");
    }
}
