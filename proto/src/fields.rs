//! Typed field values: the enums and flag sets messages carry, and FLUSH's [`Range`].

use core::fmt;
use core::ops::BitOr;

use zerocopy::little_endian::U64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ParseError;

/// An enum with explicit wire values and a total `TryFrom` that rejects every other value.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $name:ident: $repr:ty, $err:expr;
        $($(#[$vmeta:meta])* $variant:ident = $value:literal,)+
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr($repr)]
        pub enum $name {
            $($(#[$vmeta])* $variant = $value,)+
        }

        impl $name {
            /// Every value, in wire order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];
        }

        impl TryFrom<$repr> for $name {
            type Error = ParseError;

            fn try_from(value: $repr) -> Result<Self, ParseError> {
                match value {
                    $($value => Ok(Self::$variant),)+
                    _ => Err(($err)(value)),
                }
            }
        }

        impl From<$name> for $repr {
            fn from(value: $name) -> $repr {
                value as $repr
            }
        }
    };
}
pub(crate) use wire_enum;

/// A set of flag bits. Only the defined bits can be set: [`from_bits`](Self::from_bits) refuses
/// others, so a parsed value never carries bits this version does not understand.
macro_rules! wire_flags {
    (
        $(#[$meta:meta])*
        $name:ident: $repr:ty, $field:literal;
        $($(#[$fmeta:meta])* $flag:ident = $value:literal,)+
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name($repr);

        impl $name {
            $($(#[$fmeta])* pub const $flag: Self = Self($value);)+
            const NAMES: &'static [(&'static str, $repr)] = &[$((stringify!($flag), $value)),+];

            /// No flag set.
            pub const fn empty() -> Self {
                Self(0)
            }

            /// Every flag this version defines.
            pub const fn all() -> Self {
                Self(0 $(| $value)+)
            }

            /// The wire bits.
            pub const fn bits(self) -> $repr {
                self.0
            }

            /// The flags of `bits`, or `None` if it has bits this version does not define.
            pub const fn from_bits(bits: $repr) -> Option<Self> {
                if bits & !Self::all().0 == 0 {
                    Some(Self(bits))
                } else {
                    None
                }
            }

            /// Whether every flag of `other` is set in `self`.
            pub const fn contains(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// Whether no flag is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }

            pub(crate) fn parse(bits: $repr) -> Result<Self, ParseError> {
                Self::from_bits(bits).ok_or(ParseError::UnknownFlags {
                    field: $field,
                    bits: (bits & !Self::all().0).into(),
                })
            }
        }

        impl BitOr for $name {
            type Output = Self;

            fn bitor(self, other: Self) -> Self {
                Self(self.0 | other.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let mut set = Self::NAMES.iter().filter(|(_, bit)| self.0 & bit != 0);
                f.write_str(concat!(stringify!($name), "("))?;
                if let Some((first, _)) = set.next() {
                    f.write_str(first)?;
                }
                for (name, _) in set {
                    write!(f, " | {name}")?;
                }
                f.write_str(")")
            }
        }
    };
}

wire_enum! {
    /// How OPEN asks for a volume.
    OpenMode: u8, |value: u8| ParseError::BadEnum { field: "open.mode", value: value.into() };
    /// Read only; any number of sessions may hold it.
    ReadOnly = 1,
    /// Read and write, shared with other readers and writers (block-device semantics).
    ReadWrite = 2,
    /// Read and write, and no other session may open the volume for writing while it is held.
    Exclusive = 3,
}

impl OpenMode {
    /// The mode as users name it (`rblk --read-only`, `--exclusive`, logs): `read-only`,
    /// `read-write` or `exclusive`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read-only",
            Self::ReadWrite => "read-write",
            Self::Exclusive => "exclusive",
        }
    }
}

impl fmt::Display for OpenMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

wire_enum! {
    /// Why the target refused a request (ERROR's `status`).
    ///
    /// Values are stable; new codes are only added. 0 is not a code, so a zeroed buffer is not
    /// mistaken for one.
    ErrorCode: u32, |value: u32| ParseError::BadEnum { field: "error.status", value: value.into() };
    /// The request did not parse (the text says why).
    Malformed = 1,
    /// The initiator speaks another protocol version.
    VersionMismatch = 2,
    /// A key is configured and the initiator asked for something before AUTH.
    AuthRequired = 3,
    /// AUTH's MAC is wrong.
    AuthFailed = 4,
    /// OPEN named a volume the target does not have.
    NoSuchVolume = 5,
    /// OPEN's mode is not allowed for this volume (for example read-write on a read-only one).
    BadMode = 6,
    /// The volume is held exclusively by another session.
    Busy = 7,
    /// The request needs an open volume and the session has none.
    NotOpen = 8,
    /// JOIN or a join connect named an unknown session or a wrong token.
    BadSession = 9,
    /// The volume is open read-only.
    ReadOnly = 10,
    /// Persisting the volume failed; it no longer accepts writes or flushes until restart.
    VolumeFailed = 11,
    /// A FLUSH range lies outside the volume.
    OutOfRange = 12,
    /// The target hit an internal error.
    Internal = 13,
    /// A valid message that is not expected now (a second HELLO, a reply sent as a request, ...).
    Unexpected = 14,
    /// The target is out of a resource (memlock limit, protection domains, sessions).
    NoResources = 15,
    /// The target is shutting down.
    ShuttingDown = 16,
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Malformed => "malformed request",
            Self::VersionMismatch => "protocol version mismatch",
            Self::AuthRequired => "authentication required",
            Self::AuthFailed => "authentication failed",
            Self::NoSuchVolume => "no such volume",
            Self::BadMode => "open mode not allowed",
            Self::Busy => "volume is opened exclusively by another session",
            Self::NotOpen => "no volume open",
            Self::BadSession => "unknown session or wrong token",
            Self::ReadOnly => "volume is open read-only",
            Self::VolumeFailed => "volume failed",
            Self::OutOfRange => "range outside the volume",
            Self::Internal => "internal error",
            Self::Unexpected => "unexpected message",
            Self::NoResources => "out of resources",
            Self::ShuttingDown => "target is shutting down",
        })
    }
}

wire_flags! {
    /// CHALLENGE's flags.
    ChallengeFlags: u32, "challenge.flags";
    /// The target has a key: the initiator must answer with AUTH before anything else.
    AUTH_REQUIRED = 1,
}

wire_flags! {
    /// What OPENED says about the volume.
    VolumeFlags: u32, "opened.flags";
    /// The volume lives in RAM only: FLUSH orders but does not persist.
    VOLATILE = 1,
    /// The session may only read (no remote-write access on the rkey).
    READ_ONLY = 2,
    /// The session holds the volume exclusively.
    EXCLUSIVE = 4,
}

wire_flags! {
    /// FLUSHED's flags.
    FlushedFlags: u32, "flushed.flags";
    /// Nothing was persisted because the volume is RAM only; the flush was an ordering point.
    VOLATILE = 1,
}

wire_flags! {
    /// WRITE_ZEROES' flags (DISCARD has none).
    ZeroFlags: u32, "zero.flags";
    /// The zeros must be allocated (a later write must not fail for space): the target zeroes
    /// the backing store's range in place instead of punching it (ublk's
    /// `UBLK_IO_F_NOUNMAP`, NBD's `NBD_CMD_FLAG_NO_HOLE`).
    NO_UNMAP = 1,
    /// Durable before the answer, as a FLUSH of the range after it would make it.
    FUA = 2,
}

/// One byte range of a FLUSH, as it lies on the wire (`offset`, `len`: two little-endian u64).
///
/// Parsed FLUSH messages borrow their ranges in place from the receive buffer.
#[derive(Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Range {
    offset: U64,
    len: U64,
}
const _: () = assert!(size_of::<Range>() == 16);

impl Range {
    /// The `len` bytes at `offset`. Valid on the wire only when `len > 0` and the range does
    /// not run past `u64::MAX`; the encoder and the parser check that.
    pub const fn new(offset: u64, len: u64) -> Self {
        Self { offset: U64::new(offset), len: U64::new(len) }
    }

    /// Byte offset in the volume.
    pub const fn offset(&self) -> u64 {
        self.offset.get()
    }

    /// Length in bytes.
    pub const fn len(&self) -> u64 {
        self.len.get()
    }

    /// Whether the range is empty (never true for a parsed range).
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// One past the last byte (never `None` for a parsed range).
    pub const fn end(&self) -> Option<u64> {
        self.offset().checked_add(self.len())
    }

    pub(crate) fn check(&self) -> Result<(), ParseError> {
        match self.end() {
            Some(_) if !self.is_empty() => Ok(()),
            _ => Err(ParseError::BadRange { offset: self.offset(), len: self.len() }),
        }
    }
}

impl fmt::Debug for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Range").field("offset", &self.offset()).field("len", &self.len()).finish()
    }
}

/// What a FLUSH covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush<'a> {
    /// The whole volume.
    All,
    /// These ranges, at most [`MAX_FLUSH_RANGES`](crate::MAX_FLUSH_RANGES), none empty. No
    /// ranges is valid: nothing was written since the last flush, and the reply is an ordering
    /// point.
    Ranges(&'a [Range]),
}

/// One volume of a LIST_REPLY, as it lies on the wire: its size, flags (bit 0 volatile, bit 1
/// failed), the most the asking host may open it for (1 read-only, 2 read-write, 3 exclusive)
/// and its name (1 to [`MAX_VOLUME_NAME`](crate::MAX_VOLUME_NAME) bytes of UTF-8, then zeros).
///
/// Parsed LIST_REPLY messages borrow their entries in place from the receive buffer.
#[derive(Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ListEntry {
    size: U64,
    flags: u8,
    grant: u8,
    name_len: u8,
    reserved: [u8; 5],
    name: [u8; crate::MAX_VOLUME_NAME],
}
const _: () = assert!(size_of::<ListEntry>() == 80);

impl ListEntry {
    /// Flag: the volume is RAM only.
    pub const VOLATILE: u8 = 1;
    /// Flag: the volume failed (its backing store could not be written): read-only opens only.
    pub const FAILED: u8 = 2;

    /// An entry; None if the name is empty or longer than MAX_VOLUME_NAME bytes, or `grant`
    /// is not an open mode.
    pub fn new(name: &str, size: u64, flags: u8, grant: OpenMode) -> Option<Self> {
        if name.is_empty() || name.len() > crate::MAX_VOLUME_NAME || flags & !(Self::VOLATILE | Self::FAILED) != 0 {
            return None;
        }
        let mut e = ListEntry {
            size: U64::new(size),
            flags,
            grant: grant.into(),
            name_len: u8::try_from(name.len()).ok()?,
            reserved: [0; 5],
            name: [0; crate::MAX_VOLUME_NAME],
        };
        e.name[..name.len()].copy_from_slice(name.as_bytes());
        Some(e)
    }

    /// The volume's name.
    pub fn name(&self) -> &str {
        // Checked when parsed or built: a valid length and UTF-8.
        core::str::from_utf8(&self.name[..usize::from(self.name_len).min(crate::MAX_VOLUME_NAME)]).unwrap_or("")
    }

    /// Size in bytes.
    pub const fn size(&self) -> u64 {
        self.size.get()
    }

    /// RAM only.
    pub const fn is_volatile(&self) -> bool {
        self.flags & Self::VOLATILE != 0
    }

    /// Failed (read-only opens only).
    pub const fn is_failed(&self) -> bool {
        self.flags & Self::FAILED != 0
    }

    /// The most the asking host may open it for.
    pub fn grant(&self) -> OpenMode {
        OpenMode::try_from(self.grant).unwrap_or(OpenMode::ReadOnly)
    }

    pub(crate) fn check(&self) -> Result<(), ParseError> {
        if self.flags & !(Self::VOLATILE | Self::FAILED) != 0 {
            return Err(ParseError::UnknownFlags { field: "list.flags", bits: u64::from(self.flags & !3) });
        }
        OpenMode::try_from(self.grant)?;
        let len = usize::from(self.name_len);
        if len == 0 {
            return Err(ParseError::EmptyName);
        }
        let (name, padding) = self.name.split_at_checked(len).ok_or(ParseError::BadCount {
            field: "list.name_len",
            count: len as u64,
            max: crate::MAX_VOLUME_NAME as u64,
        })?;
        if self.reserved != [0; 5] {
            return Err(ParseError::Reserved { field: "list.reserved" });
        }
        if padding.iter().any(|&b| b != 0) {
            return Err(ParseError::Reserved { field: "list.name padding" });
        }
        core::str::from_utf8(name).map_err(|_| ParseError::BadUtf8 { field: "list.name" })?;
        Ok(())
    }
}

impl core::fmt::Debug for ListEntry {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ListEntry")
            .field("name", &self.name())
            .field("size", &self.size())
            .field("flags", &self.flags)
            .field("grant", &self.grant)
            .finish()
    }
}
