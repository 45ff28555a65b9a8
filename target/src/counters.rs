//! The target's [`Counters`]: one set per daemon, in the registry; the volumes' registrations
//! and the sessions' windows hold it by `Arc` to count themselves out when they go.

use std::sync::atomic::AtomicU64;

/// The target's counters: registrations (for STATS), and what the metrics endpoint reports
/// ([`crate::metrics`]).
#[derive(Debug)]
pub struct Counters {
    /// Live volume registrations.
    pub registrations: AtomicU64,
    /// Bytes they pin.
    pub pinned_bytes: AtomicU64,
    /// Memory windows bound (one per QP of the sessions that use them).
    pub windows: AtomicU64,
    /// AUTHs refused (wrong key, unknown host).
    pub auth_failures: AtomicU64,
    /// OPENs refused (access lists, caps, no such volume, busy, ...).
    pub refused_opens: AtomicU64,
    /// JOINs refused by a JOIN cap.
    pub refused_joins: AtomicU64,
    /// Connect requests refused before anything was allocated for them (see
    /// [`crate::admission`]).
    pub crowded: AtomicU64,
    /// Connect requests rejected busy, told when to come back (see
    /// [`Backlog`](crate::admission::Backlog)).
    pub busy_connects: AtomicU64,
    /// Connections accepted.
    pub connections_accepted: AtomicU64,
    /// Sessions opened.
    pub sessions_opened: AtomicU64,
    /// Malformed or refused control messages.
    pub malformed: AtomicU64,
    /// FLUSHes answered (successfully or not).
    pub flushes: AtomicU64,
    /// KEEPALIVEs sent, on every connection.
    pub keepalives_sent: AtomicU64,
    /// KEEPALIVEs received, on every connection.
    pub keepalives_received: AtomicU64,
    /// Asynchronous events of the RDMA devices (port changes, QP and CQ errors).
    pub device_events: AtomicU64,
    /// Bytes written back to durable volumes' backing stores by FLUSHes.
    pub written_back_bytes: AtomicU64,
    /// Write-backs that failed.
    pub writeback_failures: AtomicU64,
    /// Memory windows whose deallocation failed (their QPs were disconnected instead).
    pub window_dealloc_failures: AtomicU64,
    /// FLUSH latency in seconds.
    pub flush_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            registrations: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            windows: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            refused_opens: AtomicU64::new(0),
            refused_joins: AtomicU64::new(0),
            crowded: AtomicU64::new(0),
            busy_connects: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            sessions_opened: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            keepalives_sent: AtomicU64::new(0),
            keepalives_received: AtomicU64::new(0),
            device_events: AtomicU64::new(0),
            written_back_bytes: AtomicU64::new(0),
            writeback_failures: AtomicU64::new(0),
            window_dealloc_failures: AtomicU64::new(0),
            flush_seconds: prometheus_client::metrics::histogram::Histogram::new(flush_buckets()),
        }
    }
}

/// Flush latency buckets, in seconds: 50 us to about 13 s.
pub fn flush_buckets() -> impl Iterator<Item = f64> {
    prometheus_client::metrics::histogram::exponential_buckets(50e-6, 2.0, 19)
}
