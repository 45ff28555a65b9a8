//! Why a buffer did not parse, or a message could not be encoded.

use crate::Opcode;

/// A received buffer is not a valid message. Each variant names what was wrong, so the target can
/// log it and answer with [`ErrorCode::Malformed`](crate::ErrorCode::Malformed) (or
/// [`ErrorCode::VersionMismatch`](crate::ErrorCode::VersionMismatch)) and a useful text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// Fewer bytes than the header (or the header's `length`) says the message has.
    #[error("truncated message: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the message needs.
        need: usize,
        /// Bytes received.
        have: usize,
    },
    /// The header's `length` is smaller than the bytes received.
    #[error("header says {header} bytes but {received} were received")]
    LengthMismatch {
        /// The header's `length` field.
        header: u32,
        /// Bytes received.
        received: usize,
    },
    /// Not an rblk message (or connect request).
    #[error("bad magic {0:#010x}")]
    BadMagic(u32),
    /// The peer speaks another protocol version.
    #[error("protocol version {got} is not supported (this side speaks version {supported})")]
    Version {
        /// The peer's version.
        got: u16,
        /// Ours, [`VERSION`](crate::VERSION).
        supported: u16,
    },
    /// The header's opcode is not one of [`Opcode`].
    #[error("unknown opcode {0:#06x}")]
    UnknownOpcode(u16),
    /// The message's length does not match what its opcode (and counts) require.
    #[error("{opcode:?} must be {expected} bytes long, got {got}")]
    BadLength {
        /// The message's opcode.
        opcode: Opcode,
        /// Length the opcode and the message's own counts require.
        expected: usize,
        /// Length of the message.
        got: usize,
    },
    /// A field holds a value that its enum does not define.
    #[error("{field} has unknown value {value}")]
    BadEnum {
        /// Which field, as `message.field`.
        field: &'static str,
        /// The value received.
        value: u64,
    },
    /// A flags field has bits set that this version does not define.
    #[error("{field} has unknown bits {bits:#x}")]
    UnknownFlags {
        /// Which field, as `message.field`.
        field: &'static str,
        /// The unknown bits.
        bits: u64,
    },
    /// A count or length field is larger than allowed.
    #[error("{field} is {count}, more than the maximum {max}")]
    BadCount {
        /// Which field, as `message.field`.
        field: &'static str,
        /// The value received.
        count: u64,
        /// The largest value allowed.
        max: u64,
    },
    /// OPEN named no volume.
    #[error("empty volume name")]
    EmptyName,
    /// A text field is not UTF-8.
    #[error("{field} is not UTF-8")]
    BadUtf8 {
        /// Which field, as `message.field`.
        field: &'static str,
    },
    /// A FLUSH range is empty or runs past `u64::MAX`.
    #[error("bad flush range: offset {offset}, length {len}")]
    BadRange {
        /// The range's offset.
        offset: u64,
        /// The range's length.
        len: u64,
    },
    /// OPENED describes a volume no initiator could address: the block size is not a power of
    /// two, the size not a multiple of it, or the largest I/O not a non-zero multiple of it.
    #[error("bad volume geometry: size {size}, block size {block_size}, max I/O {max_io}")]
    BadGeometry {
        /// Volume size in bytes.
        size: u64,
        /// Block size in bytes.
        block_size: u32,
        /// Largest single I/O in bytes.
        max_io: u32,
    },
    /// A segment list ([`Segments`](crate::Segments)) a volume cannot have.
    #[error("bad segment list: {reason}")]
    BadSegments {
        /// What is wrong.
        reason: &'static str,
    },
    /// A reserved field or padding is not zero.
    #[error("{field} is reserved and must be zero")]
    Reserved {
        /// Which field, as `message.field`.
        field: &'static str,
    },
}

/// A [`Message`](crate::Message) or [`ConnectData`](crate::ConnectData) could not be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is too small. [`MSG_SIZE`](crate::MSG_SIZE) bytes always suffice.
    #[error("output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes the encoded message needs.
        need: usize,
        /// Bytes in the output buffer.
        have: usize,
    },
    /// The message holds a value the receiver would reject (an empty or too long volume name, too
    /// many or empty flush ranges, ...). The encoder runs the parser's own checks, so whatever it
    /// encodes parses back to the same message.
    #[error("the message would not parse")]
    Invalid(#[from] ParseError),
}
