//! The session's statistics: lock-free counters and latency histograms, updated on the I/O path
//! by every lane and read by metrics endpoints ([`EngineCounters`](crate::EngineCounters)).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::link::LinkState;

/// What the engine did so far (the whole session, every lane).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests (zeroes included).
    pub writes: u64,
    /// Writes that read partial blocks first.
    pub read_modify_writes: u64,
    /// FLUSH requests sent to the target.
    pub flushes: u64,
    /// Flushes that had nothing to flush (no write since the last FLUSH): nothing was sent.
    pub flushes_skipped: u64,
    /// Bytes read by requests that succeeded.
    pub read_bytes: u64,
    /// Bytes written (zeroes included) by requests that succeeded.
    pub written_bytes: u64,
    /// DISCARD requests (each zeroed on the target: nothing moved over the link).
    pub discards: u64,
    /// Bytes discarded by requests that succeeded.
    pub discarded_bytes: u64,
    /// Requests that failed (reads, writes, flushes; refused ones included).
    pub errors: u64,
    /// Successful reconnects of the session.
    pub reconnects: u64,
    /// Waits of the threads serving lanes (ublk's queue threads) that went to sleep rather than
    /// finding work while they spun ([`Lane::note_sleep`](crate::Lane::note_sleep)).
    pub sleeps: u64,
}

impl std::ops::AddAssign for EngineStats {
    fn add_assign(&mut self, o: EngineStats) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_modify_writes += o.read_modify_writes;
        self.flushes += o.flushes;
        self.flushes_skipped += o.flushes_skipped;
        self.read_bytes += o.read_bytes;
        self.written_bytes += o.written_bytes;
        self.discards += o.discards;
        self.discarded_bytes += o.discarded_bytes;
        self.errors += o.errors;
        self.reconnects += o.reconnects;
        self.sleeps += o.sleeps;
    }
}

/// Upper bounds of the latency buckets, in microseconds: 1 us, 2 us, 4 us ... 2^25 us (about
/// 34 s); slower requests count in the last, unbounded bucket only.
pub const LATENCY_BUCKETS_US: [u64; 26] = {
    let mut b = [0u64; 26];
    let mut i = 0;
    while i < b.len() {
        b[i] = 1 << i;
        i += 1;
    }
    b
};

/// A latency histogram of lock-free counters: a request's completion is one atomic add on its
/// bucket, the sum and the count, no lock and no allocation.
#[derive(Debug)]
pub(crate) struct AtomicLatency {
    /// Per bucket of [`LATENCY_BUCKETS_US`] (not cumulative), and one more for slower ones.
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for AtomicLatency {
    fn default() -> Self {
        AtomicLatency { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

impl AtomicLatency {
    pub(crate) fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound (2^i us) is at least the latency, rounded up to a us.
        let us = ns.div_ceil(1000).max(1);
        let i = (64 - (us - 1).leading_zeros()) as usize;
        self.buckets[i.min(LATENCY_BUCKETS_US.len())].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> Latency {
        Latency {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of one operation's latency histogram ([`EngineCounters::latency`](crate::EngineCounters::latency)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    buckets: [u64; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: [0; LATENCY_BUCKETS_US.len() + 1], sum_ns: 0 }
    }
}

impl Latency {
    /// Requests measured.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Their latencies added up.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    /// `(upper bound in seconds, requests in this bucket)` for each of [`LATENCY_BUCKETS_US`]
    /// (not cumulative: a request counts in the first bucket it fits), then `(f64::INFINITY,
    /// slower ones)`.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let bounds = LATENCY_BUCKETS_US.iter().map(|&us| us as f64 / 1e6).chain([f64::INFINITY]);
        bounds.zip(self.buckets.iter().copied())
    }
}

impl std::ops::AddAssign for Latency {
    fn add_assign(&mut self, o: Latency) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.sum_ns += o.sum_ns;
    }
}

/// The session-wide counters behind [`EngineStats`]: lock-free, updated on the I/O path.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub rmw: AtomicU64,
    pub flushes: AtomicU64,
    pub skipped: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub discards: AtomicU64,
    pub discarded_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Successful reconnects (the link counts them here).
    pub reconnects: AtomicU64,
    pub sleeps: AtomicU64,
    /// The link's [`LinkState`], as its index in [`LinkState::ALL`].
    pub link: AtomicU8,
    pub read_latency: AtomicLatency,
    pub write_latency: AtomicLatency,
    /// FLUSHes sent (skipped ones take no time worth measuring).
    pub flush_latency: AtomicLatency,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> EngineStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            reads: load(&self.reads),
            writes: load(&self.writes),
            read_modify_writes: load(&self.rmw),
            flushes: load(&self.flushes),
            flushes_skipped: load(&self.skipped),
            read_bytes: load(&self.read_bytes),
            written_bytes: load(&self.written_bytes),
            discards: load(&self.discards),
            discarded_bytes: load(&self.discarded_bytes),
            errors: load(&self.errors),
            reconnects: load(&self.reconnects),
            sleeps: load(&self.sleeps),
        }
    }

    pub(crate) fn set_link(&self, state: LinkState) {
        self.link.store(state as u8, Ordering::Relaxed);
    }

    pub(crate) fn link(&self) -> LinkState {
        LinkState::ALL.get(usize::from(self.link.load(Ordering::Relaxed))).copied().unwrap_or(LinkState::Failed)
    }
}
