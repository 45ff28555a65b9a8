//! The wire format of rblk's control channel: the messages initiator and target exchange with
//! SEND/RECV on their RC queue pairs, the private data of their rdma_cm connect requests, and the
//! channel's constants (port, buffer sizes and counts, keepalive timing).
//!
//! Every message is a 16-byte little-endian header (magic, version, opcode, length, tag) and a
//! `#[repr(C)]` body. [`parse`] checks all of it once, in place, and returns a typed
//! [`Message`] that borrows the bytes it was given (the fabric copies each received message out
//! of the registered receive buffer, which is reposted at once: no slice of NIC memory is ever
//! borrowed); [`Message::encode`] writes into a caller's send
//! buffer. Neither allocates nor does I/O. Whatever parses re-encodes to the same bytes, and
//! whatever encodes parses back to the same message. Text in a message (ERROR text, volume
//! names) is any UTF-8, controls included: show it to people through [`printable`].
//!
//! # Message flow
//!
//! ```text
//! first QP of a session    ConnectData::NewSession, then
//!                          HELLO -> CHALLENGE [-> AUTH(host) -> OK(AUTH)] -> OPEN -> OPENED
//!                          (with FEATURE_MUTUAL_AUTH: AUTH carries the initiator's nonce and v2 MAC,
//!                          OK(AUTH) the target's identity and proof: AUTH_PROOF)
//!                          (ConnectData::NewWindowSession asks for per-QP windows)
//! further QPs              ConnectData::Join { session_id, token }, then JOIN -> OK(JOIN)
//!                          (JOINED: OK(JOIN) with the QP's rkey, with FEATURE_WINDOWS)
//! any QP, once open        FLUSH -> FLUSHED, STATS -> STATS_REPLY, CLOSE -> OK(CLOSE)
//! after AUTH (discovery)   LIST(start) -> LIST_REPLY(total, entries) ... then CLOSE
//! both ways                KEEPALIVE every KEEPALIVE_INTERVAL on every QP, not answered
//! reconnect                HELLO -> ... -> OPEN(resume: old id + token) -> OPENED(instance)
//! any request              -> ERROR (ErrorCode + text) instead of its reply
//! a connect request        rejected busy: RejectData::Busy { retry_after_ms } as the reject's
//!                          private data (not negotiated: before HELLO; older peers ignore it)
//! ```
//!
//! A reply carries its request's tag. A receiver answers a message that does not parse with
//! ERROR [`ErrorCode::Malformed`] (or [`ErrorCode::VersionMismatch`]), taking the tag from
//! [`peek_tag`], and disconnects after [`MAX_MALFORMED`] of them. The [`Opcode`] docs list the
//! opcode values.
//!
//! # Example
//!
//! ```
//! use rblk_proto::{parse, Message, OpenMode, MSG_SIZE};
//!
//! let mut buf = [0u8; MSG_SIZE];
//! let len = Message::Open { mode: OpenMode::ReadWrite, name: "vol0", resume: None }.encode(7, &mut buf)?;
//!
//! let (tag, msg) = parse(&buf[..len])?;
//! assert_eq!(tag, 7);
//! assert_eq!(msg, Message::Open { mode: OpenMode::ReadWrite, name: "vol0", resume: None });
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Thread safety and cleanup
//!
//! Everything here is plain data: `Send`, `Sync`, `Copy`, nothing to close. A parsed
//! [`Message`] borrows the copy it was parsed from, so the borrow checker keeps that copy alive
//! and unchanged while a handler still looks at the message.
#![forbid(unsafe_code)]

use core::time::Duration;

mod auth;
mod connect;
mod duration;
mod error;
mod fields;
mod header;
mod messages;
mod printable;
mod segments;
mod size;

pub use auth::{auth_mac, mutual_mac, verify_auth_mac, verify_mutual_mac, Direction, Transcript};
pub use connect::{
    parse_connect_data, parse_reject_data, ConnectData, ConnectKind, RejectData, CONNECT_DATA_LEN, MAX_RETRY_AFTER_MS,
    REJECT_DATA_LEN,
};
pub use duration::{check_duration, format_duration, parse_duration, parse_duration_bounded, parse_duration_in};
pub use error::{EncodeError, ParseError};
pub use fields::{ChallengeFlags, ErrorCode, Flush, FlushedFlags, ListEntry, OpenMode, Range, VolumeFlags, ZeroFlags};
pub use header::{peek_tag, Opcode, HEADER_LEN};
pub use messages::{
    from_hex, is_valid_host_id, parse, to_hex, Message, Opened, Resume, StatsReply, VolumeId, MAX_LIST_ENTRIES,
};
pub use printable::printable;
pub use segments::{Segment, Segments, MAX_SEGMENTS};
pub use size::{check_aligned, parse_bounded, parse_size, parse_size_aligned, Bytes, SizeError, BLOCK_SIZE};

/// First field of every header and of [`ConnectData`]: the bytes `RBLK` read as a little-endian
/// u32.
pub const MAGIC: u32 = u32::from_le_bytes(*b"RBLK");

/// Protocol version. Peers of different versions refuse each other with
/// [`ParseError::Version`] / [`ErrorCode::VersionMismatch`].
pub const VERSION: u16 = 1;

/// Feature bit: FLUSH takes byte ranges (not only [`Flush::All`]).
pub const FEATURE_FLUSH_RANGES: u64 = 1;

/// Feature bit: the initiator keeps RECVs posted on every QP and sends KEEPALIVE on each every
/// [`KEEPALIVE_INTERVAL`], busy or idle; the target then ends a connection it has heard nothing
/// from for [`KEEPALIVE_TIMEOUT`]. Without it the target only ends connections whose own
/// keepalive fails or stays uncompleted for [`KEEPALIVE_TIMEOUT`].
pub const FEATURE_KEEPALIVE: u64 = 2;

/// Feature bit: reconnect. A reconnecting OPEN carries the session it replaces
/// ([`Resume`]), which the target tears down before it answers, and OPENED carries the volume
/// instance's identity ([`Opened::instance`]). Without it OPEN and OPENED are the base messages
/// and an initiator does not reconnect.
pub const FEATURE_RECONNECT: u64 = 4;

/// Feature bit: host identities. The initiator always sends AUTH, naming its host
/// ([`Message::Auth`]'s `host`) and MACing the nonce and that name under the host's own key (or
/// the shared key); a target without keys takes the name as claimed. The target's per-volume
/// access lists and per-host session caps use the name. Without it AUTH is the base message (the
/// nonce under the shared key), sent only when CHALLENGE requires it, and the peer counts as an
/// anonymous host.
pub const FEATURE_HOST_ID: u64 = 8;

/// Feature bit: LIST. After AUTH (or HELLO, without keys) the initiator may ask which volumes
/// its host may open ([`Message::List`]); nothing is registered or opened. Without it the
/// target refuses LIST as unexpected.
pub const FEATURE_LIST: u64 = 16;

/// Feature bit: per-QP rkeys through type 2B memory windows. The target offers it only on a
/// connection that asked for it in its connect data ([`ConnectData::NewWindowSession`]) and
/// whose device has type 2B windows; the connection's QP then lives in the target's shared
/// protection domain, where a volume is registered once with no remote access of its own.
/// OPENED's rkey is a window bound to the QP OPENED arrives on and works on no other QP; each
/// JOIN is answered with [`Message::Joined`], the joining QP's own rkey; STATS_REPLY carries
/// the target's window count ([`StatsReply::windows`]). Without it the session gets one
/// registration in a protection domain of its own and one session-wide rkey.
pub const FEATURE_WINDOWS: u64 = 32;

/// Feature bit: mutual authentication (v2). AUTH carries a tail with the initiator's nonce and
/// a MAC ([`mutual_mac`], [`Direction::InitiatorToTarget`]) of a [`Transcript`]: the HELLO and
/// CHALLENGE words, both nonces, the host and both rdma_cm addresses, under a key derived for
/// that direction. The target answers with OK(AUTH) carrying its identity and its own proof
/// ([`Message::AuthProof`]), sent only after it verified the initiator. Without it AUTH is
/// today's v1 message (the nonce and host under the key itself) and nothing proves the target.
pub const FEATURE_MUTUAL_AUTH: u64 = 64;

/// Feature bit: DISCARD and WRITE_ZEROES ([`Message::Discard`], [`Message::WriteZeroes`]). An
/// open read-write session may ask the target to make a block-aligned range of at most
/// [`MAX_ZERO_LEN`] bytes read as zeros; the target zeroes it in its memory (and, for a durable
/// volume, gives the backing store's blocks back at the write-back that makes it durable, or
/// keeps them allocated with [`ZeroFlags::NO_UNMAP`]) and answers OK once the range reads as
/// zeros. A DISCARD reads as zeros too: what differs is only what the backing store keeps.
/// The initiator orders it like a write: no WRITE or READ of the range is in flight while it
/// is. Without the bit the target refuses both as unexpected, and an initiator zeroes by
/// writes and advertises no discard.
pub const FEATURE_DISCARD: u64 = 128;

/// The longest range one DISCARD or WRITE_ZEROES names: longer ones are split by the
/// initiator. The target zeroes a range's memory before it answers, so this bounds one
/// answer's wait (under a second for 256 MiB here, in a TCG guest).
pub const MAX_ZERO_LEN: u64 = 256 << 20;

/// Feature bit: segments, for volumes that grow. A volume's memory is 1 to [`MAX_SEGMENTS`]
/// segments, each registered on its own and so with an rkey of its own per QP
/// ([`Segments`]). OPENED and JOINED carry every segment's offset, address and rkey after
/// their other tails ([`Opened::segments`], [`Message::Joined`]'s `segments`); when the target
/// grows a volume it binds the new segment's window on each of the session's QPs and sends
/// each a [`Message::Resized`] with the new size and that QP's segments. The initiator splits
/// an I/O that crosses a segment boundary. Without the bit OPENED and JOINED are today's, no
/// RESIZED is sent, and a peer that reconnects after a grow keeps the size it opened
/// (the target serves it the range it opened).
pub const FEATURE_SEGMENTS: u64 = 256;

/// Feature bit: session keepalives. A connection that JOINed a session keeps no keepalives of
/// its own while it shares the session's fate: neither side sends KEEPALIVE on it, and its
/// silence is the session's (nothing heard on any of the session's connections for
/// [`KEEPALIVE_TIMEOUT`]), so the session's first connection carries the keepalives for all of
/// them. The initiator opts a JOINed connection out by sending KEEPALIVE on it (one through
/// another address than the session's first, whose path may fail alone): from the first one
/// the target sends its own there and judges its silence alone, as without the bit. Without it
/// every connection keeps its own keepalives ([`FEATURE_KEEPALIVE`]).
pub const FEATURE_SESSION_KEEPALIVE: u64 = 512;

/// Feature bit: solicited events. The initiator sets the solicited-event flag
/// (`IBV_SEND_SOLICITED`) on every SEND but KEEPALIVE: on a session's first connection from the
/// first SEND after CHALLENGE, on a JOINed one from the first after OK(JOIN). The target may then
/// arm its completion queues to wake only for solicited completions (and errors): a KEEPALIVE
/// that arrives, and the completions of its own SENDs, are taken at its next wake-up (a request,
/// or its own timers: at most a keepalive interval later) instead of each waking it. Nothing in
/// a message changes. Without it every completion wakes the target, as before.
pub const FEATURE_SOLICITED: u64 = 1024;

/// The features this version implements, sent in HELLO and CHALLENGE. Each side uses the
/// intersection of both sets.
pub const FEATURES: u64 = FEATURE_FLUSH_RANGES
    | FEATURE_KEEPALIVE
    | FEATURE_RECONNECT
    | FEATURE_HOST_ID
    | FEATURE_LIST
    | FEATURE_WINDOWS
    | FEATURE_MUTUAL_AUTH
    | FEATURE_DISCARD
    | FEATURE_SEGMENTS
    | FEATURE_SESSION_KEEPALIVE
    | FEATURE_SOLICITED;

/// TCP-style port the target listens on through rdma_cm.
pub const DEFAULT_PORT: u16 = 7420;

/// Size of the largest control message.
pub const MSG_SIZE: usize = 4096;

/// Size of each posted receive buffer: any message fits.
pub const RECV_BUF_SIZE: usize = MSG_SIZE;

/// Receive buffers posted per QP, so the peer may have this many messages in flight.
pub const RECV_COUNT: usize = 16;

/// Send buffers (and send queue slots for control messages) per QP.
pub const SEND_COUNT: usize = 16;

/// Most ranges one FLUSH carries: as many as fit in [`MSG_SIZE`].
pub const MAX_FLUSH_RANGES: usize = (MSG_SIZE - HEADER_LEN - size_of::<messages::FlushHead>()) / size_of::<Range>();

/// Both sides send KEEPALIVE this often on every connection, one outstanding at a time (the
/// initiator only with [`FEATURE_KEEPALIVE`]; with [`FEATURE_SESSION_KEEPALIVE`] not on JOINed
/// connections that share the session's). It is never answered: what matters is that the
/// SEND completes and that the peer hears something.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(2);

/// The longest a vanished peer may go unnoticed. Either side ends a connection whose keepalive
/// SEND has not completed for this long, or on which nothing arrived for this long (the target
/// only from initiators with [`FEATURE_KEEPALIVE`]). This does not rely on the transport's retry
/// budget: rxe treats a retry count of 7 as "retry forever".
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(15);

/// Malformed messages tolerated on a connection; the next one disconnects it.
pub const MAX_MALFORMED: u32 = 4;

/// Longest volume name in bytes.
pub const MAX_VOLUME_NAME: usize = 64;

/// Longest host identity in bytes (NVMe's longest NQN).
pub const MAX_HOST_ID: usize = 223;

/// Longest ERROR text in bytes: as much as fits in [`MSG_SIZE`].
pub const MAX_ERROR_TEXT: usize = MSG_SIZE - HEADER_LEN - size_of::<messages::ErrorHead>();

/// Bytes in CHALLENGE's nonce.
pub const NONCE_LEN: usize = 32;

/// Bytes in AUTH's MAC (HMAC-SHA256).
pub const MAC_LEN: usize = 32;

/// Bytes in a session token.
pub const TOKEN_LEN: usize = 16;

/// Length of a target's identity ([`Message::AuthProof`]): random bytes the target makes once
/// (`STATE_DIR/target.id`), which initiators pin per address.
pub const TARGET_ID_LEN: usize = 16;

const _: () = {
    assert!(MAX_FLUSH_RANGES == 254);
    assert!(MAX_FLUSH_RANGES <= u32::MAX as usize);
    assert!(MAX_ERROR_TEXT <= u16::MAX as usize);
    assert!(MAX_VOLUME_NAME <= u8::MAX as usize);
    assert!(KEEPALIVE_TIMEOUT.as_secs() > 2 * KEEPALIVE_INTERVAL.as_secs());
};
