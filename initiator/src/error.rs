//! The initiator's error type. Every variant says which target, volume range or file it concerned.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rblk_fabric::WcStatus;
use rblk_proto::{ErrorCode, Opcode};

/// Result alias for the initiator.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which way data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Volume to initiator (RDMA READ).
    Read,
    /// Initiator to volume (RDMA WRITE).
    Write,
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Direction::Read => "read",
            Direction::Write => "write",
        })
    }
}

/// Why an access was refused before anything was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidReason {
    /// Zero bytes.
    ZeroLength,
    /// The offset is not a multiple of the block size.
    OffsetUnaligned {
        /// The volume's block size.
        block_size: u32,
    },
    /// The length is not a multiple of the block size.
    LengthUnaligned {
        /// The volume's block size.
        block_size: u32,
    },
    /// Longer than one operation may be.
    TooLarge {
        /// The largest length allowed.
        max: u64,
    },
    /// The range runs past the end of the volume (or past `u64::MAX`).
    OutOfRange {
        /// The volume's size in bytes.
        size: u64,
    },
    /// A write to a volume opened (or served) read-only.
    ReadOnly,
    /// The buffer is smaller than the access.
    BufferTooSmall {
        /// The buffer's size in bytes.
        size: u64,
    },
    /// The buffer belongs to another queue's pool.
    ForeignBuffer,
    /// A [`Done`](crate::Done) without data: not a successful read, its buffer was taken, or
    /// more bytes were asked for than were read.
    NoData,
    /// The target does not take this request (a DISCARD to a target without
    /// [`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD)).
    Unsupported,
}

impl fmt::Display for InvalidReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            InvalidReason::ZeroLength => f.write_str("the length is zero"),
            InvalidReason::OffsetUnaligned { block_size } => {
                write!(f, "the offset is not a multiple of the block size ({block_size} bytes)")
            }
            InvalidReason::LengthUnaligned { block_size } => {
                write!(f, "the length is not a multiple of the block size ({block_size} bytes)")
            }
            InvalidReason::TooLarge { max } => write!(f, "longer than one operation may be ({max} bytes)"),
            InvalidReason::OutOfRange { size } => write!(f, "the range ends past the end of the {size}-byte volume"),
            InvalidReason::ReadOnly => f.write_str("the volume is open read-only"),
            InvalidReason::BufferTooSmall { size } => write!(f, "the buffer holds only {size} bytes"),
            InvalidReason::ForeignBuffer => f.write_str("the buffer belongs to another queue"),
            InvalidReason::NoData => f.write_str("no data: not a successful read, or its buffer was taken"),
            InvalidReason::Unsupported => f.write_str("the target does not support it (an older rblk-target)"),
        }
    }
}

/// Everything that can go wrong between an initiator and a target.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The URI does not have the form `rblk://HOST[:PORT]/VOLUME`.
    #[error("bad URI {uri:?}: {reason} (expected rblk://HOST[:PORT]/VOLUME)")]
    Uri {
        /// The URI given.
        uri: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The URI's host name did not resolve.
    #[error("resolving {host}")]
    Resolve {
        /// The host name.
        host: String,
        /// The resolver's error.
        #[source]
        source: io::Error,
    },
    /// A size like `4k` or `1G` did not parse, or is not whole blocks (its message quotes the
    /// input).
    #[error(transparent)]
    Size(#[from] rblk_proto::SizeError),
    /// The key file could not be read, or is empty.
    #[error("key file {}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// Why it is unusable.
        #[source]
        source: io::Error,
    },
    /// Resolving, creating or connecting a queue pair to the target failed (includes the
    /// target refusing a join's connect request).
    #[error("connecting to {addr}")]
    Connect {
        /// The target.
        addr: SocketAddr,
        /// The fabric's error.
        #[source]
        source: rblk_fabric::Error,
    },
    /// A fabric call on an established connection failed (registration, posting, polling).
    #[error("{op} (target {addr})")]
    Fabric {
        /// What we did.
        op: &'static str,
        /// The target.
        addr: SocketAddr,
        /// The fabric's error.
        #[source]
        source: rblk_fabric::Error,
    },
    /// The target sent something the protocol does not allow here.
    #[error("protocol error from {addr}: expected {expected}, got {got}")]
    Protocol {
        /// The target.
        addr: SocketAddr,
        /// What we waited for.
        expected: &'static str,
        /// What came instead.
        got: String,
    },
    /// The target refused a request with ERROR.
    #[error("target {addr} refused {}: {code}: {text}", request_name(*request))]
    Target {
        /// The target.
        addr: SocketAddr,
        /// The request it refused.
        request: Opcode,
        /// Its error code.
        code: ErrorCode,
        /// Its explanation, with control characters escaped ([`rblk_proto::printable`]): safe
        /// to print.
        text: String,
    },
    /// Authentication is impossible or failed.
    #[error("authenticating with {addr}: {reason}")]
    Auth {
        /// The target.
        addr: SocketAddr,
        /// What happened.
        reason: String,
    },
    /// An RDMA READ or WRITE completed with an error.
    #[error("{op} of {len} bytes at offset {offset} failed")]
    Io {
        /// Read or write.
        op: Direction,
        /// Volume offset.
        offset: u64,
        /// Bytes.
        len: u64,
        /// The completion error.
        #[source]
        source: rblk_fabric::Error,
    },
    /// The target's NIC refused an RDMA READ or WRITE (remote access error): its registration
    /// for this session is gone (volume closed, session reaped, volume failed) or does not allow
    /// the access. The connection is unusable afterwards.
    #[error(
        "{op} of {len} bytes at offset {offset}: remote access error: the target refused the access \
         (its registration was revoked: volume closed or failed, or session reaped)"
    )]
    RemoteAccess {
        /// Read or write.
        op: Direction,
        /// Volume offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// The target declared the volume failed: a FLUSH could not be made durable (its backing
    /// store failed), so it revoked write access. Reads still work; restart the target.
    #[error(
        "{op} of {len} bytes at offset {offset}: volume failed: the target could not write it to its backing \
         store and no longer accepts writes"
    )]
    VolumeFailed {
        /// Read or write.
        op: Direction,
        /// Volume offset.
        offset: u64,
        /// Bytes.
        len: u64,
    },
    /// The connection failed earlier (a failed completion, a timeout, a disconnect) and can no
    /// longer be used.
    #[error("connection to {addr} lost: {reason}")]
    ConnectionLost {
        /// The target.
        addr: SocketAddr,
        /// What broke it.
        reason: String,
    },
    /// A FLUSH could not keep its promise: the target crashed (its durable volume came back as a
    /// new instance) after these writes completed and before they were flushed, so they are
    /// gone. The next FLUSH does not report them again.
    #[error(
        "flush failed: the target at {addr} crashed and lost {} of writes that were not yet flushed",
        bytes.map_or("an unknown amount".to_owned(), |b| format!("{b} bytes"))
    )]
    WritesLost {
        /// The target.
        addr: SocketAddr,
        /// Bytes written since the last flush (None: too many ranges to count).
        bytes: Option<u64>,
    },
    /// A FLUSH begun earlier in the session failed while this one waited for it: the writes it
    /// covered are dirty again, and the next FLUSH sends them.
    #[error("an earlier FLUSH to {addr} failed: writes completed before this FLUSH are not all durable")]
    EarlierFlushFailed {
        /// The target.
        addr: SocketAddr,
    },
    /// An access refused before anything was posted: one bad access would put both ends' queue
    /// pairs into error.
    #[error("invalid {what} of {len} bytes at offset {offset}: {reason}")]
    Invalid {
        /// `read`, `write`, `flush`, `buffer access`, ...
        what: &'static str,
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Why.
        reason: InvalidReason,
    },
    /// The queue has `depth` operations outstanding; reap completions first.
    #[error("queue full: {depth} operations outstanding (reap completions first)")]
    QueueFull {
        /// The queue's depth.
        depth: u32,
    },
    /// Every buffer of the queue's pool is in flight or held (by a [`Done`](crate::Done) or the
    /// caller).
    #[error("all {count} buffers of the queue's pool are in use (drop or release the Done values holding them)")]
    NoBuffer {
        /// Buffers in the pool.
        count: usize,
    },
    /// A deadline passed.
    #[error("{op} (target {addr}) timed out after {}", rblk_proto::format_duration(*after))]
    Timeout {
        /// What was waited for.
        op: &'static str,
        /// The target.
        addr: SocketAddr,
        /// How long.
        after: Duration,
    },
}

/// A request's name as the protocol documents it.
fn request_name(op: Opcode) -> &'static str {
    match op {
        Opcode::Hello => "HELLO",
        Opcode::Auth => "AUTH",
        Opcode::Open => "OPEN",
        Opcode::Join => "JOIN",
        Opcode::Flush => "FLUSH",
        Opcode::Discard => "DISCARD",
        Opcode::WriteZeroes => "WRITE_ZEROES",
        Opcode::Stats => "STATS",
        Opcode::Close => "CLOSE",
        _ => "a request",
    }
}

/// Linux errno values (the front ends are Linux interfaces).
const EIO: i32 = 5;
const EINVAL: i32 = 22;
const ENOSPC: i32 = 28;
const EROFS: i32 = 30;
const EOPNOTSUPP: i32 = 95;

/// [`Error::busy_for`] on the fabric's own error: how long a target that rejected a connect
/// request busy asked the peer to wait; None for every other error, a plain reject included.
pub fn busy_after(e: &rblk_fabric::Error) -> Option<Duration> {
    let rblk_fabric::Error::Rejected { private_data: Some(data), .. } = e else { return None };
    let rblk_proto::RejectData::Busy { retry_after_ms } = rblk_proto::parse_reject_data(&data[..])?;
    Some(Duration::from_millis(u64::from(retry_after_ms)))
}

impl Error {
    /// How long the target asked us to wait before connecting again, when it rejected the
    /// connect request busy ([`rblk_proto::RejectData::Busy`]; capped at
    /// [`rblk_proto::MAX_RETRY_AFTER_MS`]). None for every other error, a plain reject included.
    pub fn busy_for(&self) -> Option<Duration> {
        let Error::Connect { source, .. } = self else { return None };
        busy_after(source)
    }

    /// The target's error code, for [`Error::Target`].
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Target { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The errno a block front end (ublk, NBD, FUSE) reports for this error: the one mapping
    /// every front end uses. Refused accesses: EROFS for writes to a read-only volume, ENOSPC past
    /// its end, EINVAL otherwise; EROFS too for writes to a volume the target declared failed (it
    /// revoked write access); everything else (lost connections, failed RDMA, timeouts, target
    /// errors) is EIO.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Invalid { reason: InvalidReason::ReadOnly, .. } => EROFS,
            Error::Invalid { reason: InvalidReason::OutOfRange { .. }, .. } => ENOSPC,
            Error::Invalid { reason: InvalidReason::Unsupported, .. } => EOPNOTSUPP,
            Error::Invalid { .. } => EINVAL,
            Error::VolumeFailed { .. } => EROFS,
            _ => EIO,
        }
    }

    /// True for errors after which the connection cannot be used any more. (A timed-out
    /// synchronous call or control exchange breaks its connection too: the next call reports
    /// [`Error::ConnectionLost`].)
    pub fn is_fatal(&self) -> bool {
        matches!(self, Error::Io { .. } | Error::RemoteAccess { .. } | Error::ConnectionLost { .. })
    }

    /// The error for an RDMA completion that failed.
    pub(crate) fn completion(op: Direction, offset: u64, len: u64, c: &rblk_fabric::Completion) -> Error {
        if c.status == WcStatus::REM_ACCESS_ERR {
            return Error::RemoteAccess { op, offset, len };
        }
        let source = rblk_fabric::Error::Completion { wr_id: c.wr_id, status: c.status, vendor_err: c.vendor_err };
        Error::Io { op, offset, len, source }
    }
}

#[cfg(test)]
mod tests {
    use rblk_fabric::{Completion, WcStatus};

    use super::*;

    /// Only a REJECTED whose data says busy is a busy reject: not a plain reject, another
    /// event with the same bytes, or another error.
    #[test]
    fn busy_for_reads_only_a_busy_reject() {
        let addr: SocketAddr = "10.0.0.1:4420".parse().unwrap();
        let rejected = |data: Vec<u8>| Error::Connect {
            addr,
            source: rblk_fabric::Error::Rejected {
                addr,
                status: 28,
                expected: "connection response",
                private_data: (!data.is_empty()).then(|| {
                    let mut padded = Box::new([0u8; 148]);
                    padded[..data.len()].copy_from_slice(&data);
                    padded
                }),
            },
        };
        let busy = rblk_proto::RejectData::Busy { retry_after_ms: 700 }.to_bytes().to_vec();
        assert_eq!(rejected(busy.clone()).busy_for(), Some(Duration::from_millis(700)));
        assert_eq!(rejected(Vec::new()).busy_for(), None);
        assert_eq!(rejected(vec![0; 148]).busy_for(), None);
        let unreachable = rblk_fabric::Error::Connect { addr, event: "UNREACHABLE", status: 0, expected: "route" };
        assert_eq!(Error::Connect { addr, source: unreachable }.busy_for(), None);
        assert_eq!(Error::Timeout { op: "x", addr, after: Duration::from_secs(1) }.busy_for(), None);
    }

    #[test]
    fn remote_access_says_so() {
        let c = Completion { status: WcStatus::REM_ACCESS_ERR, ..Completion::EMPTY };
        let e = Error::completion(Direction::Write, 8192, 4096, &c);
        assert!(matches!(e, Error::RemoteAccess { op: Direction::Write, offset: 8192, len: 4096 }));
        assert!(e.to_string().contains("remote access error"), "{e}");
        assert!(e.is_fatal());

        let c = Completion { status: WcStatus::RETRY_EXC_ERR, ..Completion::EMPTY };
        let e = Error::completion(Direction::Read, 0, 4096, &c);
        assert_eq!(e.to_string(), "read of 4096 bytes at offset 0 failed");
        let text = rblk_fabric::Chain(&e).to_string();
        assert!(text.contains("RETRY_EXC_ERR") && text.starts_with("read of 4096"), "{text}");
    }

    #[test]
    fn invalid_messages() {
        let e = Error::Invalid {
            what: "write",
            offset: 4096,
            len: 512,
            reason: InvalidReason::LengthUnaligned { block_size: 4096 },
        };
        assert_eq!(
            e.to_string(),
            "invalid write of 512 bytes at offset 4096: the length is not a multiple of the block size (4096 bytes)"
        );
    }
}
