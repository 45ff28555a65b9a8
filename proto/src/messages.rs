//! The messages: wire bodies, the typed [`Message`], [`parse`] and [`Message::encode`].

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::header::{split, write_frame, HEADER_LEN};
use crate::{
    ChallengeFlags, EncodeError, ErrorCode, Flush, FlushedFlags, ListEntry, Opcode, OpenMode, ParseError, Range,
    Segment, Segments, VolumeFlags, ZeroFlags, MAC_LEN, MAX_ERROR_TEXT, MAX_FLUSH_RANGES, MAX_HOST_ID, MAX_SEGMENTS,
    MAX_VOLUME_NAME, NONCE_LEN, TARGET_ID_LEN, TOKEN_LEN,
};

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

/// A control message, parsed in place from a receive buffer or about to be encoded into a send
/// buffer. Borrowed fields (`name`, `text`, FLUSH's ranges) point into the buffer parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// Initiator → target, first message of a new session.
    Hello {
        /// The initiator's [`FEATURES`](crate::FEATURES). Unknown bits are legal: each side uses
        /// the intersection.
        features: u64,
    },
    /// Target → initiator, answers HELLO.
    Challenge {
        /// Whether AUTH must follow.
        flags: ChallengeFlags,
        /// The target's [`FEATURES`](crate::FEATURES).
        features: u64,
        /// Fresh random bytes the initiator's AUTH must MAC.
        nonce: [u8; NONCE_LEN],
    },
    /// Initiator → target: proof of a key. Without a host, HMAC-SHA256 of CHALLENGE's nonce
    /// under the target's shared key (the base message). With a host (only to a target that
    /// announced [`FEATURE_HOST_ID`](crate::FEATURE_HOST_ID)), HMAC-SHA256 of the nonce followed
    /// by the host's name, under that host's key (or the shared key), so that a MAC proves both
    /// the key and the identity and cannot be replayed on another connection.
    Auth {
        /// The MAC (zeros from a host without a key, to a target without keys: it only names
        /// itself).
        mac: [u8; MAC_LEN],
        /// The initiator's host identity: 1 to [`MAX_HOST_ID`] printable ASCII bytes (a
        /// hostname or an NVMe-style NQN).
        host: Option<&'a str>,
    },
    /// Initiator → target, with [`FEATURE_MUTUAL_AUTH`](crate::FEATURE_MUTUAL_AUTH): AUTH v2.
    /// On the wire it is AUTH with a zero MAC, the host tail, and a tail of the initiator's
    /// nonce and its v2 MAC ([`mutual_mac`](crate::mutual_mac) of the
    /// [`Transcript`](crate::Transcript), [`Direction::InitiatorToTarget`](crate::Direction)).
    MutualAuth {
        /// The initiator's host identity, as in [`Message::Auth`].
        host: &'a str,
        /// Fresh random bytes of the initiator's, which the target's proof must cover.
        nonce: [u8; NONCE_LEN],
        /// The v2 MAC.
        mac: [u8; MAC_LEN],
    },
    /// Initiator → target: open a volume.
    Open {
        /// Read-only, read-write or exclusive.
        mode: OpenMode,
        /// The volume's name: 1 to [`MAX_VOLUME_NAME`] bytes of UTF-8.
        name: &'a str,
        /// A reconnect: the session this one replaces. The target tears that session down (its
        /// QPs, its registration, its open) before it answers. Sent only to a target that
        /// announced [`FEATURE_RECONNECT`](crate::FEATURE_RECONNECT); without it the body is
        /// today's.
        resume: Option<Resume>,
    },
    /// Target → initiator, answers OPEN.
    Opened(Opened),
    /// Initiator → target, first message on a session's further QP.
    Join {
        /// From OPENED.
        session_id: u64,
        /// From OPENED.
        token: [u8; TOKEN_LEN],
    },
    /// Initiator → target: make these ranges durable.
    Flush(Flush<'a>),
    /// Target → initiator, answers FLUSH.
    Flushed {
        /// Whether the flush persisted anything.
        flags: FlushedFlags,
    },
    /// Initiator → target (with [`FEATURE_DISCARD`](crate::FEATURE_DISCARD), on an open
    /// read-write session): the `len` bytes at `offset` read as zeros after the answer (OK);
    /// the backing store may give their blocks back. `offset` and `len` are multiples of the
    /// volume's block size, `len` is 1 to [`MAX_ZERO_LEN`](crate::MAX_ZERO_LEN).
    Discard {
        /// Byte offset in the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Initiator → target (with [`FEATURE_DISCARD`](crate::FEATURE_DISCARD)): as
    /// [`Message::Discard`], with flags: the zeros stay allocated, and durable before the
    /// answer.
    WriteZeroes {
        /// Byte offset in the volume.
        offset: u64,
        /// Length in bytes.
        len: u64,
        /// [`ZeroFlags::NO_UNMAP`], [`ZeroFlags::FUA`].
        flags: ZeroFlags,
    },
    /// Initiator → target: ask for counters.
    Stats,
    /// Target → initiator, answers STATS.
    StatsReply(StatsReply),
    /// Initiator → target: end the session.
    Close,
    /// Either way, every [`KEEPALIVE_INTERVAL`](crate::KEEPALIVE_INTERVAL); not answered.
    Keepalive,
    /// Initiator → target (with [`FEATURE_LIST`](crate::FEATURE_LIST), after AUTH): the volumes
    /// this host may open, sorted by name, from the `start`th on.
    List {
        /// Index of the first volume wanted (0, then the count received so far).
        start: u32,
    },
    /// Target → initiator, answers LIST: as many entries from `start` as fit in a message.
    ListReply {
        /// Volumes the host may open in all.
        total: u32,
        /// Some of them, from `start` on.
        entries: &'a [ListEntry],
    },
    /// Target → initiator: success of AUTH, JOIN or CLOSE.
    Ok {
        /// The request acknowledged.
        answers: Opcode,
    },
    /// Target → initiator: success of JOIN in a session with
    /// [`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS). On the wire it is OK(JOIN) with a tail: the
    /// rkey of the window bound to the joining QP, which works on that QP only.
    Joined {
        /// The joining QP's rkey for the volume (at OPENED's `remote_addr`).
        rkey: u32,
        /// With [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS): every segment as the joining QP
        /// reaches it (the first one's rkey is `rkey`); None otherwise.
        segments: Option<Segments>,
    },
    /// Target → initiator (with [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS)), not answered:
    /// the open volume grew to `size` bytes; `segments` are all of its segments as the QP this
    /// arrives on reaches them (the new ones' windows already bound). Sent on every QP of every
    /// session of the volume.
    Resized {
        /// The volume's new size in bytes.
        size: u64,
        /// Its segments, as this QP reaches them.
        segments: Segments,
    },
    /// Target → initiator: success of a [`Message::MutualAuth`], sent only after the target
    /// verified it. On the wire it is OK(AUTH) with a tail: the target's identity and its proof
    /// of the key ([`mutual_mac`](crate::mutual_mac),
    /// [`Direction::TargetToInitiator`](crate::Direction), binding the identity too).
    AuthProof {
        /// The target's identity (random, made once: `STATE_DIR/target.id`).
        target_id: [u8; TARGET_ID_LEN],
        /// The target's v2 MAC.
        mac: [u8; MAC_LEN],
    },
    /// Target → initiator: a request failed.
    Error {
        /// Why.
        code: ErrorCode,
        /// Details for humans, at most [`MAX_ERROR_TEXT`] bytes (the encoder truncates).
        text: &'a str,
    },
}

/// OPENED's contents: what the initiator needs to read and write the volume directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// Address of the volume's first byte in the session's registration.
    pub remote_addr: u64,
    /// Volume size in bytes, a multiple of `block_size`.
    pub size: u64,
    /// Remote key of the registration; with [`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS), of the
    /// window bound to the QP OPENED arrived on (it works on no other QP).
    pub rkey: u32,
    /// I/O offsets and lengths are multiples of this power of two.
    pub block_size: u32,
    /// Largest single READ or WRITE in bytes, a multiple of `block_size`.
    pub max_io: u32,
    /// Volatile, read-only, exclusive.
    pub flags: VolumeFlags,
    /// Names the session in JOIN and in a join [`ConnectData`](crate::ConnectData).
    pub session_id: u64,
    /// Proves the session's further QPs belong to it.
    pub token: [u8; TOKEN_LEN],
    /// The identity of this instance of the volume's contents: it changes whenever they may
    /// have changed behind an initiator's back (a RAM volume's restart, a durable volume's crash
    /// or new backing store). Sent only to an initiator that announced
    /// [`FEATURE_RECONNECT`](crate::FEATURE_RECONNECT); `None` otherwise.
    pub instance: Option<VolumeId>,
    /// With [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS) (and `instance`, whose tail it
    /// follows): every segment of the volume as the QP OPENED arrived on reaches it, the first
    /// one at `remote_addr` under `rkey`; None otherwise (one segment: the whole volume there).
    pub segments: Option<Segments>,
}

/// The session a reconnecting OPEN replaces: OPENED's id and token of the old session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resume {
    /// The old session's id.
    pub session_id: u64,
    /// The old session's token (proves the OPEN may end that session).
    pub token: [u8; TOKEN_LEN],
}

/// A volume instance's identity (random bytes; see [`Opened::instance`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VolumeId(pub [u8; 16]);

impl core::fmt::Display for VolumeId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&to_hex(&self.0))
    }
}

impl VolumeId {
    /// Parses its [`Display`](core::fmt::Display) form: 32 hex digits.
    pub fn from_hex(text: &str) -> Option<VolumeId> {
        from_hex(text).map(VolumeId)
    }
}

/// `N` bytes from exactly `2 * N` hex digits (either case); None for anything else.
pub fn from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Bytes as lowercase hex digits, two per byte (what [`from_hex`] reads).
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl core::fmt::Debug for VolumeId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "VolumeId({self})")
    }
}

/// STATS_REPLY's contents: the target's counters, over all sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StatsReply {
    /// Memory registrations held.
    pub registrations: u64,
    /// Bytes pinned by them.
    pub pinned_bytes: u64,
    /// Sessions open.
    pub sessions: u64,
    /// Connections (QPs) open.
    pub connections: u64,
    /// User CPU time of the target process, microseconds.
    pub cpu_user_us: u64,
    /// System CPU time of the target process, microseconds.
    pub cpu_system_us: u64,
    /// Memory windows bound, target-wide: present when the asking session uses per-QP windows
    /// ([`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS)), absent for a session with a registration
    /// of its own (and from targets that predate windows).
    pub windows: Option<u64>,
}

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HelloBody {
    features: U64,
    reserved: U64,
}
const _: () = assert!(size_of::<HelloBody>() == 16);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ChallengeBody {
    flags: U32,
    reserved: U32,
    features: U64,
    nonce: [u8; NONCE_LEN],
}
const _: () = assert!(size_of::<ChallengeBody>() == 48);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct AuthBody {
    mac: [u8; MAC_LEN],
}
const _: () = assert!(size_of::<AuthBody>() == 32);

/// Follows [`AuthBody`] from an initiator with [`FEATURE_HOST_ID`](crate::FEATURE_HOST_ID).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct HostBody {
    host_len: u8,
    reserved: [u8; 7],
    /// `host_len` bytes of printable ASCII, then zeros.
    host: [u8; HOST_FIELD],
}
/// [`MAX_HOST_ID`] rounded up to a multiple of 8.
const HOST_FIELD: usize = MAX_HOST_ID.next_multiple_of(8);
const _: () = assert!(size_of::<HostBody>() == 232);

/// Follows [`HostBody`] in AUTH v2 ([`Message::MutualAuth`]).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct MutualBody {
    nonce: [u8; NONCE_LEN],
    mac: [u8; MAC_LEN],
}
const _: () = assert!(size_of::<MutualBody>() == 64);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct OpenBody {
    mode: u8,
    name_len: u8,
    reserved: [u8; 6],
    /// `name_len` bytes of UTF-8, then zeros.
    name: [u8; MAX_VOLUME_NAME],
}
const _: () = assert!(size_of::<OpenBody>() == 72);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct OpenedBody {
    remote_addr: U64,
    size: U64,
    rkey: U32,
    block_size: U32,
    max_io: U32,
    flags: U32,
    session_id: U64,
    token: [u8; TOKEN_LEN],
}
const _: () = assert!(size_of::<OpenedBody>() == 56);

/// Follows [`OpenedBody`] for an initiator with [`FEATURE_RECONNECT`](crate::FEATURE_RECONNECT).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct InstanceBody {
    instance: [u8; 16],
}
const _: () = assert!(size_of::<InstanceBody>() == 16);

/// Followed by `count` [`SegmentEntry`]s: the segments tail of OPENED (after
/// [`InstanceBody`]) and JOINED (after [`JoinedBody`]), and RESIZED's list.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SegmentsHead {
    count: u8,
    reserved: [u8; 7],
    /// How far the segments reach ([`Segments::size`]).
    size: U64,
}
const _: () = assert!(size_of::<SegmentsHead>() == 16);

/// One [`Segment`] on the wire.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct SegmentEntry {
    offset: U64,
    remote_addr: U64,
    rkey: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<SegmentEntry>() == 24);

/// RESIZED's body: the new size, then a [`SegmentsHead`] and its entries.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ResizedBody {
    size: U64,
}
const _: () = assert!(size_of::<ResizedBody>() == 8);

/// A segments tail (a [`SegmentsHead`] and exactly its entries), checked.
/// `before`: the body's bytes before the tail, so that a length error counts the whole body.
fn parse_segments(opcode: Opcode, before: usize, tail: &[u8]) -> Result<Segments, ParseError> {
    let (head, entries) = SegmentsHead::ref_from_prefix(tail)
        .map_err(|_| bad_length(opcode, before + size_of::<SegmentsHead>(), before + tail.len()))?;
    zero(head.reserved == [0; 7], "segments.reserved")?;
    let count = usize::from(head.count);
    if count == 0 || count > MAX_SEGMENTS {
        return Err(ParseError::BadCount { field: "segments.count", count: count as u64, max: MAX_SEGMENTS as u64 });
    }
    let entries = <[SegmentEntry]>::ref_from_bytes(entries).ok().filter(|e| e.len() == count).ok_or_else(|| {
        let need = size_of::<SegmentsHead>() + count * size_of::<SegmentEntry>();
        bad_length(opcode, before + need, before + tail.len())
    })?;
    let mut list = [Segment::default(); MAX_SEGMENTS];
    for (out, e) in list.iter_mut().zip(entries) {
        zero(e.reserved.get() == 0, "segments.reserved")?;
        *out = Segment { offset: e.offset.get(), remote_addr: e.remote_addr.get(), rkey: e.rkey.get() };
    }
    Segments::new(&list[..count], head.size.get())
}

/// `body` split where a segments tail would start (`at`): the body before it, and the tail
/// parsed when there is one (OPENED's after its instance tail, JOINED's after its rkey).
fn segments_tail(opcode: Opcode, body: &[u8], at: usize) -> Result<(&[u8], Option<Segments>), ParseError> {
    match body.split_at_checked(at) {
        Some((before, tail)) if !tail.is_empty() => Ok((before, Some(parse_segments(opcode, at, tail)?))),
        _ => Ok((body, None)),
    }
}

/// The wire form of `segments`: its head and entries.
fn segments_bytes(segments: &Segments) -> (SegmentsHead, [SegmentEntry; MAX_SEGMENTS]) {
    let mut entries = [(); MAX_SEGMENTS].map(|()| SegmentEntry {
        offset: U64::ZERO,
        remote_addr: U64::ZERO,
        rkey: U32::ZERO,
        reserved: U32::ZERO,
    });
    for (out, s) in entries.iter_mut().zip(segments.as_slice()) {
        *out = SegmentEntry {
            offset: U64::new(s.offset),
            remote_addr: U64::new(s.remote_addr),
            rkey: U32::new(s.rkey),
            reserved: U32::ZERO,
        };
    }
    // Segments holds at most MAX_SEGMENTS, which fits a u8.
    let count = u8::try_from(segments.len()).unwrap_or(u8::MAX);
    (SegmentsHead { count, reserved: [0; 7], size: U64::new(segments.size()) }, entries)
}

/// JOIN's body, and the tail of a reconnecting OPEN (after [`OpenBody`]): a session's id and
/// token.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct JoinBody {
    session_id: U64,
    token: [u8; TOKEN_LEN],
}
const _: () = assert!(size_of::<JoinBody>() == 24);

/// DISCARD's and WRITE_ZEROES' body.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ZeroBody {
    offset: U64,
    len: U64,
    /// [`ZeroFlags`]; 0 in a DISCARD.
    flags: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<ZeroBody>() == 24);

/// Followed by `count` [`Range`]s.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct FlushHead {
    flags: U32,
    count: U32,
}
const _: () = assert!(size_of::<FlushHead>() == 8);

/// FLUSH's one flag: the whole volume (then `count` is 0).
const FLUSH_ALL: u32 = 1;

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct FlushedBody {
    flags: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<FlushedBody>() == 8);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct StatsReplyBody {
    registrations: U64,
    pinned_bytes: U64,
    sessions: U64,
    connections: U64,
    cpu_user_us: U64,
    cpu_system_us: U64,
}
const _: () = assert!(size_of::<StatsReplyBody>() == 48);

/// Follows [`StatsReplyBody`] for a session with [`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct StatsWindowsBody {
    windows: U64,
}
const _: () = assert!(size_of::<StatsWindowsBody>() == 8);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct OkBody {
    answers: U16,
    reserved: [u8; 6],
}
const _: () = assert!(size_of::<OkBody>() == 8);

/// Follows [`OkBody`] answering JOIN with [`FEATURE_WINDOWS`](crate::FEATURE_WINDOWS)
/// ([`Message::Joined`]).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct JoinedBody {
    rkey: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<JoinedBody>() == 8);

/// Follows [`OkBody`] answering AUTH v2 ([`Message::AuthProof`]).
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ProofBody {
    target_id: [u8; TARGET_ID_LEN],
    mac: [u8; MAC_LEN],
}
const _: () = assert!(size_of::<ProofBody>() == 48);

#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct ListBody {
    start: U32,
    reserved: U32,
}
const _: () = assert!(size_of::<ListBody>() == 8);

/// Followed by `count` [`ListEntry`]s.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct ListHead {
    total: U32,
    count: U32,
}
const _: () = assert!(size_of::<ListHead>() == 8);

/// Most entries one LIST_REPLY carries.
pub const MAX_LIST_ENTRIES: usize = (crate::MSG_SIZE - HEADER_LEN - size_of::<ListHead>()) / size_of::<ListEntry>();

/// Followed by `text_len` bytes of UTF-8.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct ErrorHead {
    status: U32,
    text_len: U16,
    reserved: [u8; 2],
}
const _: () = assert!(size_of::<ErrorHead>() == 8);

/// Parses one received message: `buf` is exactly the bytes received. Returns the header's tag
/// and the message. Every length, count, enum, flag, reserved field and string is checked, so
/// a message that parses is one [`Message::encode`] produces, byte for byte.
pub fn parse(buf: &[u8]) -> Result<(u32, Message<'_>), ParseError> {
    let (opcode, tag, body) = split(buf)?;
    let opcode = Opcode::try_from(opcode)?;
    Ok((tag, parse_body(opcode, body)?))
}

fn parse_body(opcode: Opcode, body: &[u8]) -> Result<Message<'_>, ParseError> {
    Ok(match opcode {
        Opcode::Hello => {
            let b: &HelloBody = fixed(opcode, body)?;
            zero(b.reserved.get() == 0, "hello.reserved")?;
            Message::Hello { features: b.features.get() }
        }
        Opcode::Challenge => {
            let b: &ChallengeBody = fixed(opcode, body)?;
            zero(b.reserved.get() == 0, "challenge.reserved")?;
            Message::Challenge {
                flags: ChallengeFlags::parse(b.flags.get())?,
                features: b.features.get(),
                nonce: b.nonce,
            }
        }
        Opcode::Auth => {
            let v2 = size_of::<AuthBody>() + size_of::<HostBody>() + size_of::<MutualBody>();
            if body.len() == v2 {
                let (b, rest) = body.split_at(size_of::<AuthBody>());
                let (h, m) = rest.split_at(size_of::<HostBody>());
                let (b, h, m): (&AuthBody, &HostBody, &MutualBody) =
                    (fixed(opcode, b)?, fixed(opcode, h)?, fixed(opcode, m)?);
                zero(b.mac == [0; MAC_LEN], "auth.mac (v2 carries its MAC in the tail)")?;
                return Ok(Message::MutualAuth { host: parse_host(h)?, nonce: m.nonce, mac: m.mac });
            }
            let (b, host) = with_tail::<AuthBody, HostBody>(opcode, body)?;
            Message::Auth { mac: b.mac, host: host.map(parse_host).transpose()? }
        }
        Opcode::Open => {
            let (b, resume) = with_tail::<OpenBody, JoinBody>(opcode, body)?;
            zero(b.reserved == [0; 6], "open.reserved")?;
            let mode = OpenMode::try_from(b.mode)?;
            let (name, padding) = b.name.split_at_checked(b.name_len.into()).ok_or(ParseError::BadCount {
                field: "open.name_len",
                count: b.name_len.into(),
                max: MAX_VOLUME_NAME as u64,
            })?;
            zero(padding.iter().all(|&byte| byte == 0), "open.name padding")?;
            let resume = resume.map(|r| Resume { session_id: r.session_id.get(), token: r.token });
            Message::Open { mode, name: check_name(name)?, resume }
        }
        Opcode::Opened => {
            // The segments tail follows the instance tail.
            let (body, segments) = segments_tail(opcode, body, size_of::<OpenedBody>() + size_of::<InstanceBody>())?;
            let (b, instance) = with_tail::<OpenedBody, InstanceBody>(opcode, body)?;
            let opened = Opened {
                remote_addr: b.remote_addr.get(),
                size: b.size.get(),
                rkey: b.rkey.get(),
                block_size: b.block_size.get(),
                max_io: b.max_io.get(),
                flags: VolumeFlags::parse(b.flags.get())?,
                session_id: b.session_id.get(),
                token: b.token,
                instance: instance.map(|i| VolumeId(i.instance)),
                segments,
            };
            opened.check()?;
            Message::Opened(opened)
        }
        Opcode::Join => {
            let b: &JoinBody = fixed(opcode, body)?;
            Message::Join { session_id: b.session_id.get(), token: b.token }
        }
        Opcode::Flush => {
            let (head, rest) =
                FlushHead::ref_from_prefix(body).map_err(|_| bad_length(opcode, size_of::<FlushHead>(), body.len()))?;
            let flags = head.flags.get();
            if flags & !FLUSH_ALL != 0 {
                return Err(ParseError::UnknownFlags { field: "flush.flags", bits: (flags & !FLUSH_ALL).into() });
            }
            let count = head.count.get();
            let max = if flags == FLUSH_ALL { 0 } else { MAX_FLUSH_RANGES };
            let elems = usize::try_from(count).ok().filter(|&n| n <= max).ok_or(ParseError::BadCount {
                field: "flush.count",
                count: count.into(),
                max: max as u64,
            })?;
            let ranges = <[Range]>::ref_from_bytes_with_elems(rest, elems)
                .map_err(|_| bad_length(opcode, size_of::<FlushHead>() + elems * size_of::<Range>(), body.len()))?;
            if flags == FLUSH_ALL {
                Message::Flush(Flush::All)
            } else {
                ranges.iter().try_for_each(Range::check)?;
                Message::Flush(Flush::Ranges(ranges))
            }
        }
        Opcode::Discard | Opcode::WriteZeroes => {
            let b: &ZeroBody = fixed(opcode, body)?;
            zero(b.reserved.get() == 0, "zero.reserved")?;
            let (offset, len) = (b.offset.get(), b.len.get());
            check_zero_range(offset, len)?;
            if opcode == Opcode::Discard {
                zero(b.flags.get() == 0, "discard.flags")?;
                Message::Discard { offset, len }
            } else {
                Message::WriteZeroes { offset, len, flags: ZeroFlags::parse(b.flags.get())? }
            }
        }
        Opcode::Flushed => {
            let b: &FlushedBody = fixed(opcode, body)?;
            zero(b.reserved.get() == 0, "flushed.reserved")?;
            Message::Flushed { flags: FlushedFlags::parse(b.flags.get())? }
        }
        Opcode::Stats => empty(opcode, body, Message::Stats)?,
        Opcode::StatsReply => {
            let (b, windows) = with_tail::<StatsReplyBody, StatsWindowsBody>(opcode, body)?;
            Message::StatsReply(StatsReply {
                registrations: b.registrations.get(),
                pinned_bytes: b.pinned_bytes.get(),
                sessions: b.sessions.get(),
                connections: b.connections.get(),
                cpu_user_us: b.cpu_user_us.get(),
                cpu_system_us: b.cpu_system_us.get(),
                windows: windows.map(|w| w.windows.get()),
            })
        }
        Opcode::List => {
            let b: &ListBody = fixed(opcode, body)?;
            zero(b.reserved.get() == 0, "list.reserved")?;
            Message::List { start: b.start.get() }
        }
        Opcode::ListReply => {
            let (head, rest) =
                ListHead::ref_from_prefix(body).map_err(|_| bad_length(opcode, size_of::<ListHead>(), body.len()))?;
            let count = head.count.get();
            let elems = usize::try_from(count).ok().filter(|&n| n <= MAX_LIST_ENTRIES).ok_or(ParseError::BadCount {
                field: "list.count",
                count: count.into(),
                max: MAX_LIST_ENTRIES as u64,
            })?;
            let entries = <[ListEntry]>::ref_from_bytes_with_elems(rest, elems)
                .map_err(|_| bad_length(opcode, size_of::<ListHead>() + elems * size_of::<ListEntry>(), body.len()))?;
            entries.iter().try_for_each(ListEntry::check)?;
            Message::ListReply { total: head.total.get(), entries }
        }
        Opcode::Close => empty(opcode, body, Message::Close)?,
        Opcode::Keepalive => empty(opcode, body, Message::Keepalive)?,
        // AUTH's answer with a proof; a JOINED with segments may be as long (its answers field
        // names JOIN).
        Opcode::Ok
            if body.len() == size_of::<OkBody>() + size_of::<ProofBody>()
                && OkBody::ref_from_prefix(body).is_ok_and(|(b, _)| b.answers.get() == u16::from(Opcode::Auth)) =>
        {
            let (b, p) = body.split_at(size_of::<OkBody>());
            let (b, p): (&OkBody, &ProofBody) = (fixed(opcode, b)?, fixed(opcode, p)?);
            zero(b.reserved == [0; 6], "ok.reserved")?;
            // Only AUTH's answer carries a proof.
            if b.answers.get() != u16::from(Opcode::Auth) {
                return Err(bad_length(opcode, size_of::<OkBody>(), body.len()));
            }
            Message::AuthProof { target_id: p.target_id, mac: p.mac }
        }
        Opcode::Ok => {
            // JOINED's segments tail follows its rkey.
            let split = size_of::<OkBody>() + size_of::<JoinedBody>();
            let (body, segments) = segments_tail(opcode, body, split)?;
            let (b, joined) = with_tail::<OkBody, JoinedBody>(opcode, body)?;
            zero(b.reserved == [0; 6], "ok.reserved")?;
            let bad = ParseError::BadEnum { field: "ok.answers", value: b.answers.get().into() };
            let answers = Opcode::try_from(b.answers.get()).map_err(|_| bad)?;
            check_answers(answers)?;
            match joined {
                None if segments.is_none() => Message::Ok { answers },
                None => return Err(bad_length(opcode, size_of::<OkBody>(), split)),
                Some(j) => {
                    // Only JOIN's answer carries an rkey.
                    if answers != Opcode::Join {
                        return Err(bad_length(opcode, size_of::<OkBody>(), body.len()));
                    }
                    zero(j.reserved.get() == 0, "joined.reserved")?;
                    let rkey = j.rkey.get();
                    if segments.is_some_and(|s| s.as_slice()[0].rkey != rkey) {
                        return Err(ParseError::BadSegments { reason: "the first segment's rkey is not JOINED's" });
                    }
                    Message::Joined { rkey, segments }
                }
            }
        }
        Opcode::Resized => {
            let (b, tail) = ResizedBody::ref_from_prefix(body)
                .map_err(|_| bad_length(opcode, size_of::<ResizedBody>(), body.len()))?;
            let size = b.size.get();
            let segments = parse_segments(opcode, size_of::<ResizedBody>(), tail)?;
            check_resized(size, &segments)?;
            Message::Resized { size, segments }
        }
        Opcode::Error => {
            let (head, text) =
                ErrorHead::ref_from_prefix(body).map_err(|_| bad_length(opcode, size_of::<ErrorHead>(), body.len()))?;
            zero(head.reserved == [0; 2], "error.reserved")?;
            let code = ErrorCode::try_from(head.status.get())?;
            let len = usize::from(head.text_len.get());
            if len > MAX_ERROR_TEXT {
                return Err(ParseError::BadCount {
                    field: "error.text_len",
                    count: len as u64,
                    max: MAX_ERROR_TEXT as u64,
                });
            }
            if text.len() != len {
                return Err(bad_length(opcode, size_of::<ErrorHead>() + len, body.len()));
            }
            let text = core::str::from_utf8(text).map_err(|_| ParseError::BadUtf8 { field: "error.text" })?;
            Message::Error { code, text }
        }
    })
}

/// AUTH's host tail.
fn parse_host(h: &HostBody) -> Result<&str, ParseError> {
    zero(h.reserved == [0; 7], "auth.reserved")?;
    let (name, padding) = h.host.split_at_checked(h.host_len.into()).ok_or(ParseError::BadCount {
        field: "auth.host_len",
        count: h.host_len.into(),
        max: MAX_HOST_ID as u64,
    })?;
    zero(padding.iter().all(|&byte| byte == 0), "auth.host padding")?;
    check_host(name)
}

/// The whole body as a `T`, or the length error naming what the opcode needs.
fn fixed<T: FromBytes + KnownLayout + Immutable>(opcode: Opcode, body: &[u8]) -> Result<&T, ParseError> {
    T::ref_from_bytes(body).map_err(|_| bad_length(opcode, size_of::<T>(), body.len()))
}

/// A fixed body `T`, optionally followed by a fixed extension `X` (a feature's addition).
fn with_tail<T, X>(opcode: Opcode, body: &[u8]) -> Result<(&T, Option<&X>), ParseError>
where
    T: FromBytes + KnownLayout + Immutable,
    X: FromBytes + KnownLayout + Immutable,
{
    if body.len() == size_of::<T>() + size_of::<X>() {
        let (t, x) = body.split_at(size_of::<T>());
        return Ok((fixed(opcode, t)?, Some(fixed(opcode, x)?)));
    }
    Ok((fixed(opcode, body)?, None))
}

fn empty<'a>(opcode: Opcode, body: &[u8], msg: Message<'a>) -> Result<Message<'a>, ParseError> {
    if body.is_empty() {
        Ok(msg)
    } else {
        Err(bad_length(opcode, 0, body.len()))
    }
}

fn bad_length(opcode: Opcode, expected_body: usize, got_body: usize) -> ParseError {
    ParseError::BadLength { opcode, expected: HEADER_LEN + expected_body, got: HEADER_LEN + got_body }
}

fn zero(is_zero: bool, field: &'static str) -> Result<(), ParseError> {
    if is_zero {
        Ok(())
    } else {
        Err(ParseError::Reserved { field })
    }
}

fn check_name(name: &[u8]) -> Result<&str, ParseError> {
    if name.is_empty() {
        return Err(ParseError::EmptyName);
    }
    if name.len() > MAX_VOLUME_NAME {
        return Err(ParseError::BadCount {
            field: "open.name_len",
            count: name.len() as u64,
            max: MAX_VOLUME_NAME as u64,
        });
    }
    core::str::from_utf8(name).map_err(|_| ParseError::BadUtf8 { field: "open.name" })
}

/// A host identity: 1 to [`MAX_HOST_ID`] bytes of printable ASCII without spaces.
fn check_host(host: &[u8]) -> Result<&str, ParseError> {
    if host.is_empty() || host.len() > MAX_HOST_ID {
        return Err(ParseError::BadCount { field: "auth.host_len", count: host.len() as u64, max: MAX_HOST_ID as u64 });
    }
    if !host.iter().all(u8::is_ascii_graphic) {
        return Err(ParseError::BadUtf8 { field: "auth.host" });
    }
    core::str::from_utf8(host).map_err(|_| ParseError::BadUtf8 { field: "auth.host" })
}

/// Whether `host` is a valid host identity (see [`Message::Auth`]).
pub fn is_valid_host_id(host: &str) -> bool {
    check_host(host.as_bytes()).is_ok()
}

fn check_ranges(ranges: &[Range]) -> Result<(), ParseError> {
    if ranges.len() > MAX_FLUSH_RANGES {
        return Err(ParseError::BadCount {
            field: "flush.count",
            count: ranges.len() as u64,
            max: MAX_FLUSH_RANGES as u64,
        });
    }
    ranges.iter().try_for_each(Range::check)
}

/// A DISCARD's or WRITE_ZEROES' range: 1 to [`MAX_ZERO_LEN`](crate::MAX_ZERO_LEN) bytes that do
/// not run past `u64::MAX` (the target checks it against the volume: its size, its blocks).
fn check_zero_range(offset: u64, len: u64) -> Result<(), ParseError> {
    Range::new(offset, len).check()?;
    if len > crate::MAX_ZERO_LEN {
        return Err(ParseError::BadCount { field: "zero.len", count: len, max: crate::MAX_ZERO_LEN });
    }
    Ok(())
}

fn check_answers(answers: Opcode) -> Result<(), ParseError> {
    if answers.is_acked_by_ok() {
        Ok(())
    } else {
        Err(ParseError::BadEnum { field: "ok.answers", value: u16::from(answers).into() })
    }
}

/// RESIZED's size and segments: a size every segment starts inside (alignment is the
/// receiver's to check against its block size).
fn check_resized(size: u64, segments: &Segments) -> Result<(), ParseError> {
    if segments.size() != size {
        return Err(ParseError::BadSegments { reason: "the segments do not reach the new size" });
    }
    Ok(())
}

impl Opened {
    /// Its segments: the list OPENED carried, or the one segment of a target without
    /// [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS).
    pub fn all_segments(&self) -> Segments {
        self.segments.unwrap_or_else(|| Segments::one(self.remote_addr, self.rkey, self.size))
    }

    fn check(&self) -> Result<(), ParseError> {
        let bs = self.block_size;
        let ok = bs.is_power_of_two()
            && self.size.is_multiple_of(u64::from(bs))
            && self.max_io != 0
            && self.max_io.is_multiple_of(bs);
        if !ok {
            return Err(ParseError::BadGeometry { size: self.size, block_size: bs, max_io: self.max_io });
        }
        if let Some(segments) = &self.segments {
            if self.instance.is_none() {
                return Err(ParseError::BadSegments { reason: "segments follow the instance tail" });
            }
            let first = segments.as_slice()[0];
            if (first.remote_addr, first.rkey) != (self.remote_addr, self.rkey) {
                return Err(ParseError::BadSegments { reason: "the first segment is not OPENED's address and rkey" });
            }
            if segments.size() != self.size {
                return Err(ParseError::BadSegments { reason: "the segments do not reach the volume's size" });
            }
            segments.check(self.size, bs)?;
        }
        Ok(())
    }
}

/// AUTH's host tail for `host`.
fn host_body(host: &str) -> Result<HostBody, EncodeError> {
    let host = check_host(host.as_bytes())?;
    let mut tail = HostBody { host_len: 0, reserved: [0; 7], host: [0; HOST_FIELD] };
    // check_host bounded the length by MAX_HOST_ID, which fits a u8.
    tail.host_len = u8::try_from(host.len()).unwrap_or(u8::MAX);
    let (dst, _) = tail.host.split_at_mut(host.len());
    dst.copy_from_slice(host.as_bytes());
    Ok(tail)
}

/// `text` cut to at most `max` bytes, on a char boundary.
fn truncate(text: &str, max: usize) -> &str {
    (0..=text.len().min(max)).rev().find_map(|end| text.get(..end)).unwrap_or_default()
}

impl Message<'_> {
    /// The message's opcode.
    pub const fn opcode(&self) -> Opcode {
        match self {
            Self::Hello { .. } => Opcode::Hello,
            Self::Challenge { .. } => Opcode::Challenge,
            Self::Auth { .. } | Self::MutualAuth { .. } => Opcode::Auth,
            Self::Open { .. } => Opcode::Open,
            Self::Opened(_) => Opcode::Opened,
            Self::Join { .. } => Opcode::Join,
            Self::Flush(_) => Opcode::Flush,
            Self::Flushed { .. } => Opcode::Flushed,
            Self::Discard { .. } => Opcode::Discard,
            Self::WriteZeroes { .. } => Opcode::WriteZeroes,
            Self::Stats => Opcode::Stats,
            Self::StatsReply(_) => Opcode::StatsReply,
            Self::Close => Opcode::Close,
            Self::Keepalive => Opcode::Keepalive,
            Self::List { .. } => Opcode::List,
            Self::ListReply { .. } => Opcode::ListReply,
            Self::Ok { .. } | Self::Joined { .. } | Self::AuthProof { .. } => Opcode::Ok,
            Self::Resized { .. } => Opcode::Resized,
            Self::Error { .. } => Opcode::Error,
        }
    }

    /// Encodes the message with `tag` into the front of `out` and returns its length.
    ///
    /// Refuses values the receiver would reject (an empty or too long name, too many or empty
    /// ranges, an impossible geometry, an OK for a request OK does not answer) and truncates an
    /// ERROR's text to [`MAX_ERROR_TEXT`] bytes. [`MSG_SIZE`](crate::MSG_SIZE) bytes always
    /// suffice.
    pub fn encode(&self, tag: u32, out: &mut [u8]) -> Result<usize, EncodeError> {
        let opcode = self.opcode();
        let mut frame = |parts: &[&[u8]]| write_frame(opcode, tag, parts, out);
        match *self {
            Self::Hello { features } => {
                frame(&[HelloBody { features: U64::new(features), reserved: U64::ZERO }.as_bytes()])
            }
            Self::Challenge { flags, features, nonce } => frame(&[ChallengeBody {
                flags: U32::new(flags.bits()),
                reserved: U32::ZERO,
                features: U64::new(features),
                nonce,
            }
            .as_bytes()]),
            Self::Auth { mac, host: None } => frame(&[AuthBody { mac }.as_bytes()]),
            Self::Auth { mac, host: Some(host) } => frame(&[AuthBody { mac }.as_bytes(), host_body(host)?.as_bytes()]),
            Self::MutualAuth { host, nonce, mac } => frame(&[
                AuthBody { mac: [0; MAC_LEN] }.as_bytes(),
                host_body(host)?.as_bytes(),
                MutualBody { nonce, mac }.as_bytes(),
            ]),
            Self::Open { mode, name, resume } => {
                let name = check_name(name.as_bytes())?;
                let mut body =
                    OpenBody { mode: mode.into(), name_len: 0, reserved: [0; 6], name: [0; MAX_VOLUME_NAME] };
                // check_name bounded the length by MAX_VOLUME_NAME, which fits a u8.
                body.name_len = u8::try_from(name.len()).unwrap_or(u8::MAX);
                let (dst, _) = body.name.split_at_mut(name.len());
                dst.copy_from_slice(name.as_bytes());
                match resume {
                    None => frame(&[body.as_bytes()]),
                    Some(r) => {
                        let tail = JoinBody { session_id: U64::new(r.session_id), token: r.token };
                        frame(&[body.as_bytes(), tail.as_bytes()])
                    }
                }
            }
            Self::Opened(o) => {
                o.check()?;
                let head = OpenedBody {
                    remote_addr: U64::new(o.remote_addr),
                    size: U64::new(o.size),
                    rkey: U32::new(o.rkey),
                    block_size: U32::new(o.block_size),
                    max_io: U32::new(o.max_io),
                    flags: U32::new(o.flags.bits()),
                    session_id: U64::new(o.session_id),
                    token: o.token,
                };
                match (o.instance, o.segments) {
                    (None, _) => frame(&[head.as_bytes()]),
                    (Some(VolumeId(instance)), None) => frame(&[head.as_bytes(), InstanceBody { instance }.as_bytes()]),
                    (Some(VolumeId(instance)), Some(segments)) => {
                        let (seg_head, entries) = segments_bytes(&segments);
                        frame(&[
                            head.as_bytes(),
                            InstanceBody { instance }.as_bytes(),
                            seg_head.as_bytes(),
                            entries[..segments.len()].as_bytes(),
                        ])
                    }
                }
            }
            Self::Join { session_id, token } => {
                frame(&[JoinBody { session_id: U64::new(session_id), token }.as_bytes()])
            }
            Self::Flush(Flush::All) => frame(&[FlushHead { flags: U32::new(FLUSH_ALL), count: U32::ZERO }.as_bytes()]),
            Self::Flush(Flush::Ranges(ranges)) => {
                check_ranges(ranges)?;
                // check_ranges bounded the count by MAX_FLUSH_RANGES, which fits a u32.
                let count = U32::new(u32::try_from(ranges.len()).unwrap_or(u32::MAX));
                frame(&[FlushHead { flags: U32::ZERO, count }.as_bytes(), ranges.as_bytes()])
            }
            Self::Flushed { flags } => {
                frame(&[FlushedBody { flags: U32::new(flags.bits()), reserved: U32::ZERO }.as_bytes()])
            }
            Self::Discard { offset, len } => {
                check_zero_range(offset, len)?;
                frame(&[ZeroBody {
                    offset: U64::new(offset),
                    len: U64::new(len),
                    flags: U32::ZERO,
                    reserved: U32::ZERO,
                }
                .as_bytes()])
            }
            Self::WriteZeroes { offset, len, flags } => {
                check_zero_range(offset, len)?;
                let body = ZeroBody {
                    offset: U64::new(offset),
                    len: U64::new(len),
                    flags: U32::new(flags.bits()),
                    reserved: U32::ZERO,
                };
                frame(&[body.as_bytes()])
            }
            Self::Stats | Self::Close | Self::Keepalive => frame(&[]),
            Self::List { start } => frame(&[ListBody { start: U32::new(start), reserved: U32::ZERO }.as_bytes()]),
            Self::ListReply { total, entries } => {
                if entries.len() > MAX_LIST_ENTRIES {
                    return Err(ParseError::BadCount {
                        field: "list.count",
                        count: entries.len() as u64,
                        max: MAX_LIST_ENTRIES as u64,
                    }
                    .into());
                }
                entries.iter().try_for_each(ListEntry::check)?;
                let count = U32::new(u32::try_from(entries.len()).unwrap_or(u32::MAX));
                frame(&[ListHead { total: U32::new(total), count }.as_bytes(), entries.as_bytes()])
            }
            Self::StatsReply(s) => {
                let head = StatsReplyBody {
                    registrations: U64::new(s.registrations),
                    pinned_bytes: U64::new(s.pinned_bytes),
                    sessions: U64::new(s.sessions),
                    connections: U64::new(s.connections),
                    cpu_user_us: U64::new(s.cpu_user_us),
                    cpu_system_us: U64::new(s.cpu_system_us),
                };
                match s.windows {
                    None => frame(&[head.as_bytes()]),
                    Some(w) => frame(&[head.as_bytes(), StatsWindowsBody { windows: U64::new(w) }.as_bytes()]),
                }
            }
            Self::Ok { answers } => {
                check_answers(answers)?;
                frame(&[OkBody { answers: U16::new(answers.into()), reserved: [0; 6] }.as_bytes()])
            }
            Self::AuthProof { target_id, mac } => frame(&[
                OkBody { answers: U16::new(Opcode::Auth.into()), reserved: [0; 6] }.as_bytes(),
                ProofBody { target_id, mac }.as_bytes(),
            ]),
            Self::Joined { rkey, segments: None } => frame(&[
                OkBody { answers: U16::new(Opcode::Join.into()), reserved: [0; 6] }.as_bytes(),
                JoinedBody { rkey: U32::new(rkey), reserved: U32::ZERO }.as_bytes(),
            ]),
            Self::Joined { rkey, segments: Some(segments) } => {
                if segments.as_slice()[0].rkey != rkey {
                    return Err(ParseError::BadSegments { reason: "the first segment's rkey is not JOINED's" }.into());
                }
                let (seg_head, entries) = segments_bytes(&segments);
                frame(&[
                    OkBody { answers: U16::new(Opcode::Join.into()), reserved: [0; 6] }.as_bytes(),
                    JoinedBody { rkey: U32::new(rkey), reserved: U32::ZERO }.as_bytes(),
                    seg_head.as_bytes(),
                    entries[..segments.len()].as_bytes(),
                ])
            }
            Self::Resized { size, segments } => {
                check_resized(size, &segments)?;
                let (seg_head, entries) = segments_bytes(&segments);
                frame(&[
                    ResizedBody { size: U64::new(size) }.as_bytes(),
                    seg_head.as_bytes(),
                    entries[..segments.len()].as_bytes(),
                ])
            }
            Self::Error { code, text } => {
                let text = truncate(text, MAX_ERROR_TEXT);
                // MAX_ERROR_TEXT fits a u16.
                let text_len = U16::new(u16::try_from(text.len()).unwrap_or(u16::MAX));
                let head = ErrorHead { status: U32::new(code.into()), text_len, reserved: [0; 2] };
                frame(&[head.as_bytes(), text.as_bytes()])
            }
        }
    }
}
