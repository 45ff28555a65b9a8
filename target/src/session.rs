//! Sessions: a protection domain shared by the session's QPs, and (after OPEN) the session's one
//! registration of its volume, and the random values (nonces, tokens) of the control protocol.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::{Mr, Pd};
use rblk_proto::{OpenMode, NONCE_LEN, TOKEN_LEN};
use subtle::ConstantTimeEq;

use crate::volume::Volume;

/// The target's counters: registrations (for STATS), and what the metrics endpoint reports
/// ([`crate::metrics`]).
#[derive(Debug)]
pub struct Counters {
    /// Live volume registrations.
    pub registrations: AtomicU64,
    /// Bytes they pin.
    pub pinned_bytes: AtomicU64,
    /// AUTHs refused (wrong key, unknown host).
    pub auth_failures: AtomicU64,
    /// OPENs refused (access lists, caps, no such volume, busy, ...).
    pub refused_opens: AtomicU64,
    /// Connections accepted.
    pub connections_accepted: AtomicU64,
    /// Sessions opened.
    pub sessions_opened: AtomicU64,
    /// Malformed or refused control messages.
    pub malformed: AtomicU64,
    /// FLUSHes answered (successfully or not).
    pub flushes: AtomicU64,
    /// Bytes written back to durable volumes' backing stores by FLUSHes.
    pub written_back_bytes: AtomicU64,
    /// Write-backs that failed.
    pub writeback_failures: AtomicU64,
    /// FLUSH latency in seconds.
    pub flush_seconds: prometheus_client::metrics::histogram::Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Counters {
            registrations: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            auth_failures: AtomicU64::new(0),
            refused_opens: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            sessions_opened: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            written_back_bytes: AtomicU64::new(0),
            writeback_failures: AtomicU64::new(0),
            flush_seconds: prometheus_client::metrics::histogram::Histogram::new(crate::metrics::flush_buckets()),
        }
    }
}

/// Whom a session counts against for the per-host session cap: the host it named in AUTH, or,
/// for an initiator without host identities, its address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A named host.
    Host(Arc<str>),
    /// An anonymous initiator at this address.
    Anonymous(Option<std::net::IpAddr>),
}

impl Owner {
    /// The host's name; None for an anonymous initiator.
    pub fn host(&self) -> Option<&str> {
        match self {
            Owner::Host(h) => Some(h),
            Owner::Anonymous(_) => None,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Host(h) => write!(f, "host {h}"),
            Owner::Anonymous(Some(ip)) => write!(f, "anonymous initiators at {ip}"),
            Owner::Anonymous(None) => f.write_str("anonymous initiators"),
        }
    }
}

/// An open session.
#[derive(Debug)]
pub struct Session {
    /// Session id (not secret).
    pub id: u64,
    /// Token a further QP must present to join (secret).
    pub token: [u8; TOKEN_LEN],
    /// The protection domain all its QPs live in.
    pub pd: Pd,
    /// The volume it opened.
    pub volume: Arc<Volume>,
    /// How.
    pub mode: OpenMode,
    /// Features the opening connection negotiated; they hold for the connections that join.
    pub features: u64,
    /// Whom it counts against.
    pub owner: Owner,
    members: Mutex<Members>,
    /// Signalled when a member leaves.
    left: Condvar,
    registration: Mutex<Option<Mr>>,
    counters: Arc<Counters>,
}

/// The connections of a session (the opener and its joiners), by connection id.
#[derive(Debug, Default)]
struct Members {
    conns: Vec<u64>,
    /// A reconnect replaced the session: nobody may join any more.
    replaced: bool,
}

impl Session {
    /// Wraps a fresh registration of `volume` in `pd`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        pd: Pd,
        volume: Arc<Volume>,
        mode: OpenMode,
        mr: Mr,
        counters: Arc<Counters>,
        features: u64,
        owner: Owner,
    ) -> Session {
        counters.registrations.fetch_add(1, Ordering::SeqCst);
        counters.pinned_bytes.fetch_add(mr.len() as u64, Ordering::SeqCst);
        Session {
            id,
            token: random(),
            pd,
            volume,
            mode,
            features,
            owner,
            members: Mutex::default(),
            left: Condvar::new(),
            registration: Mutex::new(Some(mr)),
            counters,
        }
    }

    /// True if `token` is this session's (constant time).
    pub fn token_matches(&self, token: &[u8; TOKEN_LEN]) -> bool {
        self.token.ct_eq(token).into()
    }

    /// Remote address and rkey of the registration, while it exists.
    pub fn remote(&self) -> Option<(u64, u32)> {
        self.registration.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|mr| (mr.addr(), mr.rkey()))
    }

    /// Counts connection `conn` in (the opener, or a joiner once admitted). False if the
    /// session was replaced: the connection must not serve it.
    pub fn join(&self, conn: u64) -> bool {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if !m.replaced {
            m.conns.push(conn);
        }
        !m.replaced
    }

    /// Counts connection `conn` out, once it has destroyed its QP. True if it was the last.
    pub fn leave(&self, conn: u64) -> bool {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.conns.retain(|&c| c != conn);
        self.left.notify_all();
        m.conns.is_empty()
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.members.lock().unwrap_or_else(|p| p.into_inner()).conns.len()
    }

    /// For a reconnecting OPEN: refuses further joins, deregisters (see [`Session::release`])
    /// and returns the ids of the connections still serving the session, which the caller wakes
    /// so that they end.
    pub fn replace(&self) -> Vec<u64> {
        let conns = {
            let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
            m.replaced = true;
            m.conns.clone()
        };
        self.release();
        conns
    }

    /// True once a reconnect replaced the session.
    pub fn is_replaced(&self) -> bool {
        self.members.lock().unwrap_or_else(|p| p.into_inner()).replaced
    }

    /// Waits until every connection has left, at most `timeout`. True if they all did.
    pub fn wait_until_empty(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        while !m.conns.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            m = self.left.wait_timeout(m, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        true
    }

    /// Deregisters the volume and gives up the open mode (idempotent). After this no rkey of the
    /// session works.
    pub fn release(&self) {
        let mr = self.registration.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(mr) = mr {
            self.counters.registrations.fetch_sub(1, Ordering::SeqCst);
            self.counters.pinned_bytes.fetch_sub(mr.len() as u64, Ordering::SeqCst);
            drop(mr);
            self.volume.release(self.id, self.mode);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release();
    }
}

/// Random bytes from the OS.
pub fn random<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).expect("the OS random source failed");
    b
}

/// A fresh challenge nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
