//! The fabric's error type. Every variant names the operation and the object it concerned.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::completion::WcStatus;

/// Result alias for fabric operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors from the fabric: verbs, rdma_cm, registration, completions and deadlines.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No RDMA device is present (or none matches the device filter).
    #[error("no RDMA device found{}", filter.as_ref().map(|f| format!(" matching {f:?}")).unwrap_or_default())]
    NoDevice {
        /// The `--device` filter in force, if any.
        filter: Option<String>,
    },
    /// A verbs call failed.
    #[error("{op} failed on {device}: {source}")]
    Verbs {
        /// The verb, e.g. `ibv_create_qp`.
        op: &'static str,
        /// The device it was called on.
        device: String,
        /// The OS error it returned.
        #[source]
        source: io::Error,
    },
    /// An rdma_cm call failed.
    #[error("{op} ({addr}) failed: {source}")]
    Cm {
        /// The call, e.g. `rdma_resolve_addr`.
        op: &'static str,
        /// The address it concerned.
        addr: AddrDisplay,
        /// The OS error it returned.
        #[source]
        source: io::Error,
    },
    /// The peer or the CM answered with an event we did not wait for (rejected, unreachable, ...).
    #[error("connection to {addr}: {event} (status {status}) while waiting for {expected}")]
    Connect {
        /// The remote address.
        addr: SocketAddr,
        /// The event that arrived instead.
        event: &'static str,
        /// The event's status (errno or CM reason).
        status: i32,
        /// What we waited for.
        expected: &'static str,
    },
    /// A deadline passed.
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// How long.
        after: Duration,
    },
    /// Memory registration failed.
    #[error(
        "registering {len} bytes on {device} failed: {source} \
         (RLIMIT_MEMLOCK is {memlock}; raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity in a \
         systemd unit, or run as root)"
    )]
    Register {
        /// Bytes to register.
        len: usize,
        /// Device.
        device: String,
        /// The current memlock limit, as text.
        memlock: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Mapping memory failed.
    #[error("mapping {len} bytes of memory failed: {source}")]
    Map {
        /// Bytes to map.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A work request completed with an error status.
    #[error("work request {wr_id:#x} failed: {status} (vendor error {vendor_err:#x})")]
    Completion {
        /// The work request id.
        wr_id: u64,
        /// Its completion status.
        status: WcStatus,
        /// Provider-specific detail.
        vendor_err: u32,
    },
    /// A local buffer range lies outside its memory region.
    #[error("{what}: range {offset}+{len} is outside the {size}-byte region")]
    OutOfRange {
        /// Which buffer.
        what: &'static str,
        /// Start of the range.
        offset: u64,
        /// Length of the range.
        len: u64,
        /// Size of the region.
        size: u64,
    },
    /// Posting would exceed the queue's depth. Callers reap completions and retry.
    #[error("{queue} queue full ({depth} outstanding)")]
    QueueFull {
        /// `send` or `recv`.
        queue: &'static str,
        /// The depth.
        depth: u32,
    },
    /// Private data for the CM exceeds what the transport carries.
    #[error("connection private data of {len} bytes exceeds {max}")]
    PrivateDataTooLong {
        /// Given length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// Objects from two different devices or fabrics were mixed.
    #[error("{0}")]
    Mismatch(String),
    /// The endpoint is not in a state that allows the call.
    #[error("endpoint to {peer} is {state}")]
    State {
        /// The peer.
        peer: AddrDisplay,
        /// Its state.
        state: &'static str,
    },
}

/// A socket address, or `-` when not known yet; for error messages.
#[derive(Debug, Clone, Copy)]
pub struct AddrDisplay(pub Option<SocketAddr>);

impl std::fmt::Display for AddrDisplay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("-"),
        }
    }
}

impl Error {
    /// True for a completion that failed with a remote access error (bad rkey, out of range,
    /// missing permission): the target enforced its registration.
    pub fn is_remote_access(&self) -> bool {
        matches!(self, Error::Completion { status, .. } if *status == WcStatus::REM_ACCESS_ERR)
    }
}

/// The soft RLIMIT_MEMLOCK in bytes; None when unlimited (or unknown).
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the rlimit we pass and reads nothing else.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
    (rc == 0 && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

/// The memlock limit as text, for registration errors.
pub(crate) fn memlock_text() -> String {
    match memlock_limit() {
        Some(bytes) => format!("{} KiB", bytes / 1024),
        None => "unlimited".into(),
    }
}
