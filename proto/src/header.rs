//! The 16-byte header in front of every message, and the opcodes it names.

use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::fields::wire_enum;
use crate::{EncodeError, ParseError, MAGIC, MSG_SIZE, VERSION};

/// Every message starts with this. Its layout is the same in every protocol version, so a peer
/// of another version is recognised and answered.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(crate) struct Header {
    pub(crate) magic: U32,
    pub(crate) version: U16,
    pub(crate) opcode: U16,
    /// Bytes of the whole message, header included.
    pub(crate) length: U32,
    /// Chosen by the sender of a request; the reply echoes it.
    pub(crate) tag: U32,
}
const _: () = assert!(size_of::<Header>() == 16);

/// Bytes in the message header.
pub const HEADER_LEN: usize = size_of::<Header>();

wire_enum! {
    /// What a message is. Values are stable: requests have the high bit clear, replies set it,
    /// and a request's specific reply is the request's value with the high bit set.
    ///
    /// | opcode | value | from | body bytes | answered by |
    /// |---|---|---|---|---|
    /// | `Hello` | `0x0001` | initiator | 16 | `Challenge` |
    /// | `Auth` | `0x0002` | initiator | 32 | `Ok` |
    /// | `Open` | `0x0003` | initiator | 72 | `Opened` |
    /// | `Join` | `0x0004` | initiator | 24 | `Ok` |
    /// | `Flush` | `0x0005` | initiator | 8 + 16 × ranges | `Flushed` |
    /// | `Stats` | `0x0006` | initiator | 0 | `StatsReply` |
    /// | `Close` | `0x0007` | initiator | 0 | `Ok` |
    /// | `Keepalive` | `0x0008` | either | 0 | nothing |
    /// | `List` | `0x0009` | initiator | 8 | `ListReply` (only with [`FEATURE_LIST`](crate::FEATURE_LIST)) |
    /// | `Discard` | `0x000a` | initiator | 24 | `Ok` (only with [`FEATURE_DISCARD`](crate::FEATURE_DISCARD)) |
    /// | `WriteZeroes` | `0x000b` | initiator | 24 | `Ok` (only with [`FEATURE_DISCARD`](crate::FEATURE_DISCARD)) |
    /// | `Resized` | `0x000c` | target | 24 + 24 × segments | nothing (only with [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS)) |
    /// | `Ok` | `0x8000` | target | 8 | |
    /// | `Challenge` | `0x8001` | target | 48 | |
    /// | `Opened` | `0x8003` | target | 56 | |
    /// | `Flushed` | `0x8005` | target | 8 | |
    /// | `StatsReply` | `0x8006` | target | 48 | |
    /// | `ListReply` | `0x8009` | target | 8 + 80 per volume | |
    /// | `Error` | `0x80ff` | target | 8 + text | |
    ///
    /// Any request may instead be answered by `Error`.
    Opcode: u16, ParseError::UnknownOpcode;
    /// Start a session (first message on a session's first QP).
    Hello = 0x0001,
    /// Answer CHALLENGE's nonce.
    Auth = 0x0002,
    /// Open a volume.
    Open = 0x0003,
    /// Attach a further QP to a session (first message on it).
    Join = 0x0004,
    /// Make written ranges durable.
    Flush = 0x0005,
    /// Ask for the target's counters.
    Stats = 0x0006,
    /// End the session.
    Close = 0x0007,
    /// Liveness, sent by both sides every [`KEEPALIVE_INTERVAL`](crate::KEEPALIVE_INTERVAL).
    Keepalive = 0x0008,
    /// Ask which volumes this host may open (after AUTH; registers nothing).
    List = 0x0009,
    /// Drop a range's contents: it reads as zeros after the answer.
    Discard = 0x000a,
    /// Make a range read as zeros.
    WriteZeroes = 0x000b,
    /// Target → initiator, not answered: the open volume grew (with
    /// [`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS)).
    Resized = 0x000c,
    /// Acknowledges AUTH, JOIN, CLOSE, DISCARD or WRITE_ZEROES.
    Ok = 0x8000,
    /// Answers HELLO.
    Challenge = 0x8001,
    /// Answers OPEN.
    Opened = 0x8003,
    /// Answers FLUSH.
    Flushed = 0x8005,
    /// Answers STATS.
    StatsReply = 0x8006,
    /// Answers LIST.
    ListReply = 0x8009,
    /// Refuses a request.
    Error = 0x80ff,
}

impl Opcode {
    /// Whether the target sends this opcode in answer to a request.
    pub const fn is_reply(self) -> bool {
        self as u16 & 0x8000 != 0
    }

    /// Whether OK is the success reply to this request.
    pub const fn is_acked_by_ok(self) -> bool {
        matches!(self, Self::Auth | Self::Join | Self::Close | Self::Discard | Self::WriteZeroes)
    }
}

/// The tag of a buffer that starts with an rblk header, however broken the rest is, so a
/// receiver can echo it in its ERROR reply. `None` if the buffer is shorter than a header or its
/// magic is wrong.
pub fn peek_tag(buf: &[u8]) -> Option<u32> {
    let (header, _) = Header::ref_from_prefix(buf).ok()?;
    (header.magic.get() == MAGIC).then(|| header.tag.get())
}

/// Checks the header of a whole received message and splits off its body.
pub(crate) fn split(buf: &[u8]) -> Result<(u16, u32, &[u8]), ParseError> {
    let have = buf.len();
    let (header, body) = Header::ref_from_prefix(buf).map_err(|_| ParseError::Truncated { need: HEADER_LEN, have })?;
    if header.magic.get() != MAGIC {
        return Err(ParseError::BadMagic(header.magic.get()));
    }
    if header.version.get() != VERSION {
        return Err(ParseError::Version { got: header.version.get(), supported: VERSION });
    }
    let length = header.length.get();
    let need = usize::try_from(length).unwrap_or(usize::MAX);
    if need > have {
        return Err(ParseError::Truncated { need, have });
    }
    if need < have {
        return Err(ParseError::LengthMismatch { header: length, received: have });
    }
    Ok((header.opcode.get(), header.tag.get(), body))
}

/// Writes header and body `parts` to the front of `out`; returns the message's length.
pub(crate) fn write_frame(opcode: Opcode, tag: u32, parts: &[&[u8]], out: &mut [u8]) -> Result<usize, EncodeError> {
    let need = HEADER_LEN + parts.iter().map(|part| part.len()).sum::<usize>();
    let have = out.len();
    // Callers have validated every count, so every message fits a receive buffer.
    debug_assert!(need <= MSG_SIZE);
    let out = out.get_mut(..need).ok_or(EncodeError::BufferTooSmall { need, have })?;
    let header = Header {
        magic: U32::new(MAGIC),
        version: U16::new(VERSION),
        opcode: U16::new(opcode.into()),
        length: U32::new(u32::try_from(need).unwrap_or(u32::MAX)),
        tag: U32::new(tag),
    };
    let mut rest = out;
    for part in core::iter::once(header.as_bytes()).chain(parts.iter().copied()) {
        // `rest` is exactly as long as the parts, so this split is always in bounds.
        let (head, tail) = core::mem::take(&mut rest).split_at_mut(part.len());
        head.copy_from_slice(part);
        rest = tail;
    }
    Ok(need)
}
