//! The fabric's error type. Every variant names the operation and the object it concerned.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::completion::WcStatus;

/// Result alias for fabric operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A reject's private data: at most what a CM reject carries (148 bytes), zero padded.
pub type RejectBytes = [u8; 148];

/// `data` as a reject's private data (the excess beyond 148 bytes cut, as the CM would), None
/// when the reject carried none.
pub(crate) fn reject_data(data: &[u8]) -> Option<Box<RejectBytes>> {
    if data.is_empty() {
        return None;
    }
    let mut out = Box::new([0u8; 148]);
    let n = data.len().min(out.len());
    out[..n].copy_from_slice(&data[..n]);
    Some(out)
}

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
    #[error("{op} failed on {device}")]
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
    #[error("{op}{} failed", addr.0.map(|a| format!(" ({a})")).unwrap_or_default())]
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
    /// The peer rejected the connection.
    #[error("connection to {addr}: REJECTED (status {status}) while waiting for {expected}")]
    Rejected {
        /// The remote address.
        addr: SocketAddr,
        /// The CM's reject reason.
        status: i32,
        /// What we waited for.
        expected: &'static str,
        /// The private data the reject carried, zero padded to [`RejectBytes`]'s size as
        /// rdma_cm pads it (None without any): the target's reason, read with
        /// `rblk_proto::parse_reject_data`. Boxed, so the error stays small.
        private_data: Option<Box<RejectBytes>>,
    },
    /// A deadline passed.
    #[error("{op} timed out after {}", rblk_proto::format_duration(*after))]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// How long.
        after: Duration,
    },
    /// Memory registration failed.
    #[error(
        "registering {len} bytes on {device} failed (RLIMIT_MEMLOCK is {memlock}; raise it with \
         `ulimit -l unlimited`, LimitMEMLOCK=infinity in a systemd unit, or run as root)"
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
    #[error("mapping {len} bytes of memory failed")]
    Map {
        /// Bytes to map.
        len: usize,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Creating, sizing or sealing a memfd failed.
    #[error("{op} for memfd {name:?} ({len} bytes) failed")]
    Memfd {
        /// The call, e.g. `memfd_create`.
        op: &'static str,
        /// The memfd's name.
        name: String,
        /// Its size in bytes.
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
    /// An operating-system call outside verbs and rdma_cm failed (a socket pair for a waker,
    /// polling descriptors).
    #[error("{op} failed")]
    Os {
        /// The call and what it was for.
        op: &'static str,
        /// The OS error it returned.
        #[source]
        source: io::Error,
    },
    /// A control message could not be encoded (a bug in the caller: a field out of range).
    #[error("encoding a {opcode:?} message failed")]
    Encode {
        /// The message's opcode.
        opcode: rblk_proto::Opcode,
        /// Why.
        #[source]
        source: rblk_proto::EncodeError,
    },
    /// A control message is larger than a control buffer.
    #[error("a {len}-byte control message is larger than the {max}-byte control buffers")]
    MessageTooLarge {
        /// Its length.
        len: usize,
        /// The buffers' size.
        max: usize,
    },
    /// A completion arrived that no posted work request of this kind can produce.
    #[error("unexpected control completion (work request {wr_id:#x}, opcode {opcode:?})")]
    UnexpectedCompletion {
        /// Its work request id.
        wr_id: u64,
        /// Its opcode.
        opcode: crate::completion::WcOpcode,
    },
    /// The address is served by another RDMA device than the one asked for (`--device`).
    #[error("{addr} is reached through RDMA device {found}, not {wanted}")]
    WrongDevice {
        /// The local (listening) or remote address.
        addr: SocketAddr,
        /// The device rdma_cm chose for it.
        found: Box<str>,
        /// The device asked for.
        wanted: Box<str>,
    },
    /// A connection and a protection domain are on different RDMA devices.
    #[error("{what} is on RDMA device {found}, but the protection domain is on {pd}")]
    PdDevice {
        /// The connection, e.g. `the connect request` or `the route to 10.0.0.1:4791`.
        what: Box<str>,
        /// Its device.
        found: Box<str>,
        /// The protection domain's device.
        pd: Box<str>,
    },
    /// The source address given to connect from is not of the destination's address family.
    #[error("cannot connect from {source_addr} to {dst}: the addresses are of different families")]
    SourceFamily {
        /// The source address asked for.
        source_addr: std::net::IpAddr,
        /// The destination.
        dst: SocketAddr,
    },
    /// The device (or fabric) does not have a feature asked for.
    #[error("{device} does not support {what}")]
    Unsupported {
        /// The feature.
        what: &'static str,
        /// The device.
        device: String,
    },
    /// Objects of the verbs fabric and the in-memory fabric were mixed.
    #[error("{what} and the protection domain are on different fabrics (verbs and in-memory)")]
    OtherFabric {
        /// The other object.
        what: &'static str,
    },
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

/// This process's CPU time so far: (user, system), from `getrusage(RUSAGE_SELF)`; zero if that
/// fails. The target reports it in STATS and rblk-bench reports its own, as fio's `cpu:` line.
pub fn process_cpu_time() -> (std::time::Duration, std::time::Duration) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the rusage we pass and reads nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Default::default();
    }
    let d = |t: libc::timeval| {
        std::time::Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_usec).unwrap_or(0) * 1000)
    };
    (d(u.ru_utime), d(u.ru_stime))
}

/// Puts the calling thread in the SCHED_IDLE class: from now on it runs only when no other thread
/// of the machine wants the CPU. For work nobody waits for that would otherwise take the CPU from
/// those who do: a daemon that handed its volumes over unpins and unmaps them (its exit) while
/// its initiators reconnect to the successor on the same cores.
pub fn run_only_when_idle() -> std::io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler reads the sched_param we pass (valid for the call) and changes
    // only the calling thread's scheduling (pid 0); on failure it changes nothing.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The memlock limit as text, for registration errors.
pub(crate) fn memlock_text() -> String {
    match memlock_limit() {
        Some(bytes) => rblk_proto::Bytes(bytes).to_string(),
        None => "unlimited".into(),
    }
}

/// An error and its causes as one line, `error: cause: root cause`, for log lines and messages
/// that must say everything. rblk's errors follow the standard rule that Display does not repeat
/// the source's text (the source is reachable through [`std::error::Error::source`]), so a
/// message built from `{e}` alone says only the outermost step; `{}` of a `Chain` says all of
/// them, once each. Binaries print `anyhow::Error` with `{:#}`, which is the same.
#[derive(Clone, Copy)]
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(c) = cause {
            write!(f, ": {c}")?;
            cause = c.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    /// Issue 43, trap 7: catches Rust renderings in what users read: an rdma_cm error without
    /// an address said `rdma_create_event_channel (-) failed`, a timeout `after 1.5s` in
    /// Duration's Debug form.
    #[test]
    fn errors_read_as_words() {
        let cm = Error::Cm { op: "rdma_create_event_channel", addr: AddrDisplay(None), source: io::Error::other("x") };
        assert_eq!(cm.to_string(), "rdma_create_event_channel failed");
        let addr: SocketAddr = "10.0.0.1:7420".parse().unwrap();
        let cm = Error::Cm { op: "rdma_resolve_addr", addr: AddrDisplay(Some(addr)), source: io::Error::other("x") };
        assert_eq!(cm.to_string(), "rdma_resolve_addr (10.0.0.1:7420) failed");
        let t = Error::Timeout { op: "connect", after: std::time::Duration::from_millis(1500) };
        assert_eq!(t.to_string(), "connect timed out after 1500 ms");
    }

    use super::*;

    /// Each cause is said once: Display leaves the source out, Chain adds it.
    #[test]
    fn chain_says_each_cause_once() {
        let e = Error::Verbs { op: "ibv_create_qp", device: "rxe0".into(), source: io::Error::from_raw_os_error(12) };
        assert_eq!(e.to_string(), "ibv_create_qp failed on rxe0");
        let text = Chain(&e).to_string();
        let os = io::Error::from_raw_os_error(12).to_string();
        assert_eq!(text, format!("ibv_create_qp failed on rxe0: {os}"));
        assert_eq!(text.matches(&os).count(), 1);
    }
}
