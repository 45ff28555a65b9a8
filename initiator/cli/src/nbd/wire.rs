//! The NBD wire format (fixed newstyle handshake and simple replies), big-endian throughout.
//! Pure: no I/O. Messages are `#[repr(C)]` structs of zerocopy big-endian fields; requests are
//! parsed once into a typed [`Op`] with every offset, length and flag checked here.
//!
//! Reference: the NBD protocol specification (`doc/proto.md` of NetworkBlockDevice/nbd).

use zerocopy::big_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// `NBDMAGIC`: the first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: newstyle negotiation, and the magic of every option the client sends.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of the server's option replies.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flags (server).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the server can skip the 124 zero bytes after NBD_OPT_EXPORT_NAME.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: skip the 124 zero bytes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Option types.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

/// Info types (NBD_REP_INFO).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Command types.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;

/// Longest option payload accepted; longer ones are drained and refused (NBD_REP_ERR_TOO_BIG).
/// The longest legitimate one, NBD_OPT_GO with a 4096-byte name and every info type, is far
/// shorter.
pub const MAX_OPTION_LEN: u32 = 64 << 10;

/// Longest READ, WRITE or WRITE_ZEROES payload buffered (advertised as the maximum block
/// size; also the NBD reference client's limit).
pub const MAX_REQUEST: u32 = 32 << 20;

/// Bytes the server sends after NBD_OPT_EXPORT_NAME's reply unless NO_ZEROES was agreed.
pub const EXPORT_NAME_PAD: usize = 124;

/// The error values of simple replies (the NBD protocol's own numbering, which follows
/// Linux's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    /// A write to a read-only export (or volume).
    Perm = 1,
    /// The volume failed the operation.
    Io = 5,
    /// The server is out of memory.
    NoMem = 12,
    /// Malformed request: unknown command or flag, bad range for a read, too long.
    Inval = 22,
    /// A write past the end of the export.
    NoSpc = 28,
    /// The request is not supported.
    NotSup = 95,
    /// The server is shutting down.
    Shutdown = 108,
}

impl Errno {
    /// The value on the wire.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The NBD error for a system errno (from [`rblk_initiator::Error::errno`]): a read-only
    /// volume is EPERM, errors NBD has no value for are EIO.
    pub fn from_errno(errno: i32) -> Errno {
        match errno {
            libc::EPERM | libc::EROFS | libc::EACCES => Errno::Perm,
            libc::ENOMEM => Errno::NoMem,
            libc::EINVAL => Errno::Inval,
            libc::ENOSPC | libc::EFBIG => Errno::NoSpc,
            libc::ENOTSUP => Errno::NotSup,
            libc::ESHUTDOWN => Errno::Shutdown,
            _ => Errno::Io,
        }
    }
}

/// S: the greeting.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct Greeting {
    pub magic: U64,
    pub opt_magic: U64,
    pub flags: U16,
}

/// C: an option's header; `len` bytes of data follow.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OptionHeader {
    pub magic: U64,
    pub option: U32,
    pub len: U32,
}

/// S: an option reply's header; `len` bytes of data follow.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct OptionReplyHeader {
    pub magic: U64,
    pub option: U32,
    pub reply: U32,
    pub len: U32,
}

/// S: the reply to NBD_OPT_EXPORT_NAME (then 124 zero bytes unless NO_ZEROES).
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct ExportNameReply {
    pub size: U64,
    pub flags: U16,
}

/// NBD_REP_INFO data: NBD_INFO_EXPORT.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InfoExport {
    pub info: U16,
    pub size: U64,
    pub flags: U16,
}

/// NBD_REP_INFO data: NBD_INFO_BLOCK_SIZE.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct InfoBlockSize {
    pub info: U16,
    pub min: U32,
    pub preferred: U32,
    pub max: U32,
}

/// C: a transmission request; a WRITE's `len` bytes of data follow.
#[derive(Debug, Clone, Copy, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RequestHeader {
    pub magic: U32,
    pub flags: U16,
    pub kind: U16,
    pub handle: U64,
    pub offset: U64,
    pub len: U32,
}

/// S: a simple reply; a successful READ's data follows.
#[derive(Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SimpleReply {
    pub magic: U32,
    pub error: U32,
    pub handle: U64,
}

const _: () = {
    assert!(size_of::<Greeting>() == 18);
    assert!(size_of::<OptionHeader>() == 16);
    assert!(size_of::<OptionReplyHeader>() == 20);
    assert!(size_of::<ExportNameReply>() == 10);
    assert!(size_of::<InfoExport>() == 12);
    assert!(size_of::<InfoBlockSize>() == 14);
    assert!(size_of::<RequestHeader>() == 28);
    assert!(size_of::<SimpleReply>() == 16);
};

/// The greeting of a fixed newstyle server that can skip the zero padding.
pub fn greeting() -> Greeting {
    Greeting {
        magic: NBDMAGIC.into(),
        opt_magic: IHAVEOPT.into(),
        flags: (FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).into(),
    }
}

/// An option reply header for `len` bytes of data.
pub fn option_reply(option: u32, reply: u32, len: usize) -> OptionReplyHeader {
    // Callers pass data of at most a few KiB (names, messages, infos).
    let len = u32::try_from(len).unwrap_or(u32::MAX);
    OptionReplyHeader { magic: OPT_REPLY_MAGIC.into(), option: option.into(), reply: reply.into(), len: len.into() }
}

/// A simple reply header.
pub fn simple_reply(handle: u64, error: Option<Errno>) -> SimpleReply {
    SimpleReply { magic: SIMPLE_REPLY_MAGIC.into(), error: error.map_or(0, Errno::code).into(), handle: handle.into() }
}

/// What an export looks like to NBD clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportGeometry {
    /// Bytes.
    pub size: u64,
    /// The volume's block size: requests not aligned to it need a read-modify-write.
    pub block_size: u32,
    /// Writes are refused (EPERM).
    pub read_only: bool,
    /// The target zeroes ranges itself (`FEATURE_DISCARD`): TRIM is advertised, and
    /// WRITE_ZEROES is fast (moves nothing).
    pub discards: bool,
}

impl ExportGeometry {
    /// The transmission flags for this export: flush and FUA always; WRITE_ZEROES and
    /// FAST_ZERO when writable (a fast zero fails at once with ENOTSUP where the target cannot
    /// zero by itself, as `qemu-img convert` expects), and TRIM when the target can; multi-conn
    /// when every client's flush covers every connection's writes.
    pub fn transmission_flags(&self, multi_conn: bool) -> u16 {
        let mut flags = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA;
        if self.read_only {
            flags |= TFLAG_READ_ONLY;
        } else {
            flags |= TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
            if self.discards {
                flags |= TFLAG_SEND_TRIM;
            }
        }
        if multi_conn {
            flags |= TFLAG_CAN_MULTI_CONN;
        }
        flags
    }

    /// NBD_INFO_BLOCK_SIZE: the minimum is the volume's block size when the client asked for
    /// block sizes (so it avoids our read-modify-write), else 1, since a client that did not ask
    /// may send anything, and unaligned requests work anyway. Minimum and preferred must be
    /// powers of two, the minimum at most 64 KiB, the preferred at least 512.
    pub fn block_size_info(&self, requested: bool) -> InfoBlockSize {
        let bs = self.block_size.max(1);
        let min = if requested && bs.is_power_of_two() { bs.min(64 << 10) } else { 1 };
        let preferred = if bs.is_power_of_two() { bs.max(4096) } else { 4096 };
        InfoBlockSize {
            info: INFO_BLOCK_SIZE.into(),
            min: min.into(),
            preferred: preferred.into(),
            max: MAX_REQUEST.into(),
        }
    }
}

/// NBD_OPT_INFO and NBD_OPT_GO data: the export name and the info types asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub infos: Vec<u16>,
}

/// Parses NBD_OPT_INFO / NBD_OPT_GO data: 32-bit name length, name, 16-bit count, infos. `None`
/// when the lengths do not add up or the name is not UTF-8 (NBD_REP_ERR_INVALID).
pub fn parse_info_request(data: &[u8]) -> Option<InfoRequest> {
    let (name_len, rest) = data.split_first_chunk::<4>()?;
    let name_len = usize::try_from(u32::from_be_bytes(*name_len)).ok()?;
    if name_len > rest.len() {
        return None;
    }
    let (name, rest) = rest.split_at(name_len);
    let (count, rest) = rest.split_first_chunk::<2>()?;
    let count = usize::from(u16::from_be_bytes(*count));
    if rest.len() != count * 2 {
        return None;
    }
    let infos = rest.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    let name = String::from_utf8(name.to_vec()).ok()?;
    Some(InfoRequest { name, infos })
}

/// A request, checked against the export: what to do, or the error to reply with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Read `len` bytes at `offset` (inside the export, at most [`MAX_REQUEST`]).
    Read { offset: u64, len: u32 },
    /// Write the `len` bytes that follow at `offset`; flush before replying when `fua`.
    Write { offset: u64, len: u32, fua: bool },
    /// Write `len` zero bytes at `offset` (any length inside the export); `unmap`: the blocks
    /// may be freed (no `NO_HOLE`).
    WriteZeroes { offset: u64, len: u32, fua: bool, unmap: bool },
    /// Discard `len` bytes at `offset` (the whole blocks inside them; any length inside the
    /// export).
    Trim { offset: u64, len: u32, fua: bool },
    /// Make every write replied to so far durable.
    Flush,
    /// Finish what is in flight and close: no reply.
    Disc,
}

/// Why a request header cannot be handled at all: the stream cannot be trusted any more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("bad request magic {0:#010x} (expected {REQUEST_MAGIC:#010x})")]
pub struct BadMagic(pub u32);

impl RequestHeader {
    /// Parses the 28 bytes of a request header; a bad magic means a hard disconnect.
    pub fn parse(bytes: &[u8; 28]) -> Result<RequestHeader, BadMagic> {
        // 28 bytes always make a header: every field is a plain big-endian integer.
        let hdr = RequestHeader::read_from_bytes(bytes).map_err(|_| BadMagic(0))?;
        match hdr.magic.get() {
            REQUEST_MAGIC => Ok(hdr),
            other => Err(BadMagic(other)),
        }
    }

    /// Bytes of data that follow this header on the wire: a WRITE's payload, whether or not
    /// the write is valid (it must be drained either way).
    pub fn payload_len(&self) -> u32 {
        if self.kind.get() == CMD_WRITE {
            self.len.get()
        } else {
            0
        }
    }

    /// Checks the request against the export (the errors the NBD spec asks for): unknown
    /// commands and flags are EINVAL, writes to a read-only export EPERM, writes past the end
    /// ENOSPC, reads past the end EINVAL, zero or over-long lengths EINVAL. FUA is accepted on
    /// every command (clients are known to set it anywhere); FLUSH and DISC ignore their
    /// reserved offset and length.
    pub fn check(&self, geo: &ExportGeometry) -> Result<Op, Errno> {
        let (flags, offset, len) = (self.flags.get(), self.offset.get(), self.len.get());
        let fua = flags & CMD_FLAG_FUA != 0;
        let allowed = match self.kind.get() {
            CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_READ | CMD_WRITE | CMD_FLUSH => CMD_FLAG_FUA,
            // Not advertised without discard on the target: unknown, then.
            CMD_TRIM if geo.discards => CMD_FLAG_FUA,
            // DISC ends the connection whatever its flags say.
            CMD_DISC => u16::MAX,
            _ => return Err(Errno::Inval),
        };
        if flags & !allowed != 0 {
            return Err(Errno::Inval);
        }
        let writes = matches!(self.kind.get(), CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM);
        if writes && geo.read_only {
            return Err(Errno::Perm);
        }
        let inside = offset.checked_add(len.into()).is_some_and(|end| end <= geo.size);
        match self.kind.get() {
            CMD_DISC => Ok(Op::Disc),
            CMD_FLUSH => Ok(Op::Flush),
            _ if len == 0 => Err(Errno::Inval),
            _ if !inside && writes => Err(Errno::NoSpc),
            _ if !inside => Err(Errno::Inval),
            // A fast zero the target cannot do by itself would be writes: refused at once.
            CMD_WRITE_ZEROES if flags & CMD_FLAG_FAST_ZERO != 0 && !geo.discards => Err(Errno::NotSup),
            CMD_WRITE_ZEROES => Ok(Op::WriteZeroes { offset, len, fua, unmap: flags & CMD_FLAG_NO_HOLE == 0 }),
            CMD_TRIM => Ok(Op::Trim { offset, len, fua }),
            _ if len > MAX_REQUEST => Err(Errno::Inval),
            CMD_READ => Ok(Op::Read { offset, len }),
            _ => Ok(Op::Write { offset, len, fua }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: u16, flags: u16, offset: u64, len: u32) -> RequestHeader {
        RequestHeader {
            magic: REQUEST_MAGIC.into(),
            flags: flags.into(),
            kind: kind.into(),
            handle: 7.into(),
            offset: offset.into(),
            len: len.into(),
        }
    }

    const GEO: ExportGeometry = ExportGeometry { size: 1 << 20, block_size: 4096, read_only: false, discards: true };
    const RO: ExportGeometry = ExportGeometry { read_only: true, ..GEO };
    /// An export of a target without discard.
    const OLD: ExportGeometry = ExportGeometry { discards: false, ..GEO };

    #[test]
    fn layouts_are_big_endian() {
        assert_eq!(
            greeting().as_bytes(),
            [b'N', b'B', b'D', b'M', b'A', b'G', b'I', b'C', b'I', b'H', b'A', b'V', b'E', b'O', b'P', b'T', 0, 3]
        );
        let r = simple_reply(0x0102_0304_0506_0708, Some(Errno::Inval));
        assert_eq!(r.as_bytes(), [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22, 1, 2, 3, 4, 5, 6, 7, 8]);
        let o = option_reply(OPT_GO, REP_ERR_UNSUP, 5);
        assert_eq!(o.as_bytes()[..8], 0x0003_e889_0455_65a9u64.to_be_bytes());
        assert_eq!(o.as_bytes()[8..], [0, 0, 0, 7, 0x80, 0, 0, 1, 0, 0, 0, 5]);
    }

    #[test]
    fn request_headers_parse() {
        let bytes: [u8; 28] = header(CMD_WRITE, CMD_FLAG_FUA, 4096, 512).as_bytes().try_into().unwrap();
        assert_eq!(bytes[..4], [0x25, 0x60, 0x95, 0x13]);
        let h = RequestHeader::parse(&bytes).unwrap();
        assert_eq!((h.kind.get(), h.handle.get(), h.offset.get(), h.len.get()), (CMD_WRITE, 7, 4096, 512));
        assert_eq!(h.payload_len(), 512);
        assert_eq!(h.check(&GEO), Ok(Op::Write { offset: 4096, len: 512, fua: true }));
        let mut bad = bytes;
        bad[0] = 0x26;
        assert_eq!(RequestHeader::parse(&bad).unwrap_err(), BadMagic(0x2660_9513));
    }

    #[test]
    fn requests_are_checked_against_the_export() {
        let size = GEO.size;
        let cases: &[(RequestHeader, ExportGeometry, Result<Op, Errno>)] = &[
            (header(CMD_READ, 0, 0, 4096), GEO, Ok(Op::Read { offset: 0, len: 4096 })),
            (header(CMD_READ, 0, 1, 3), GEO, Ok(Op::Read { offset: 1, len: 3 })),
            (header(CMD_READ, 0, size - 512, 512), GEO, Ok(Op::Read { offset: size - 512, len: 512 })),
            (header(CMD_READ, 0, size, 512), GEO, Err(Errno::Inval)),
            (header(CMD_READ, 0, size - 512, 1024), GEO, Err(Errno::Inval)),
            (header(CMD_READ, 0, u64::MAX - 10, 4096), GEO, Err(Errno::Inval)),
            (header(CMD_READ, 0, 0, 0), GEO, Err(Errno::Inval)),
            (header(CMD_READ, CMD_FLAG_NO_HOLE, 0, 4096), GEO, Err(Errno::Inval)),
            (header(CMD_READ, CMD_FLAG_FUA, 0, 4096), GEO, Ok(Op::Read { offset: 0, len: 4096 })),
            (header(CMD_WRITE, 0, size, 512), GEO, Err(Errno::NoSpc)),
            (header(CMD_WRITE, 0, u64::MAX, 1), GEO, Err(Errno::NoSpc)),
            (header(CMD_WRITE, 0, 0, 512), RO, Err(Errno::Perm)),
            (header(CMD_WRITE, 0, 0, 0), GEO, Err(Errno::Inval)),
            (header(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 1 << 20), GEO, {
                Ok(Op::WriteZeroes { offset: 0, len: 1 << 20, fua: false, unmap: false })
            }),
            (header(CMD_WRITE_ZEROES, CMD_FLAG_FUA, 0, 4096), GEO, {
                Ok(Op::WriteZeroes { offset: 0, len: 4096, fua: true, unmap: true })
            }),
            (header(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096), GEO, {
                Ok(Op::WriteZeroes { offset: 0, len: 4096, fua: false, unmap: true })
            }),
            (header(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 4096), OLD, Err(Errno::NotSup)),
            (
                header(CMD_WRITE_ZEROES, 0, 0, 4096),
                OLD,
                Ok(Op::WriteZeroes { offset: 0, len: 4096, fua: false, unmap: true }),
            ),
            (header(CMD_WRITE_ZEROES, 0, 0, 4096), RO, Err(Errno::Perm)),
            (header(CMD_WRITE_ZEROES, 1 << 5, 0, 4096), GEO, Err(Errno::Inval)),
            (header(CMD_TRIM, 0, 100, 10000), GEO, Ok(Op::Trim { offset: 100, len: 10000, fua: false })),
            (header(CMD_TRIM, CMD_FLAG_FUA, 0, u32::MAX), ExportGeometry { size: 1 << 40, ..GEO }, {
                Ok(Op::Trim { offset: 0, len: u32::MAX, fua: true })
            }),
            (header(CMD_TRIM, 0, size, 4096), GEO, Err(Errno::NoSpc)),
            (header(CMD_TRIM, 0, 0, 4096), RO, Err(Errno::Perm)),
            (header(CMD_TRIM, 0, 0, 4096), OLD, Err(Errno::Inval)),
            (header(CMD_TRIM, CMD_FLAG_NO_HOLE, 0, 4096), GEO, Err(Errno::Inval)),
            (header(CMD_FLUSH, 0, 0, 0), GEO, Ok(Op::Flush)),
            (header(CMD_FLUSH, 0, 12, 34), RO, Ok(Op::Flush)),
            (header(CMD_DISC, 0, 0, 0), GEO, Ok(Op::Disc)),
            (header(5, 0, 0, 4096), GEO, Err(Errno::Inval)),
            (header(7, 0, 0, 4096), GEO, Err(Errno::Inval)),
            (header(999, 0, 0, 0), GEO, Err(Errno::Inval)),
        ];
        for (i, (h, geo, want)) in cases.iter().enumerate() {
            assert_eq!(h.check(geo), *want, "case {i}: {h:?}");
        }
        let big = ExportGeometry { size: 1 << 40, ..GEO };
        assert_eq!(header(CMD_READ, 0, 0, MAX_REQUEST + 1).check(&big), Err(Errno::Inval));
        assert_eq!(header(CMD_WRITE, 0, 0, MAX_REQUEST + 1).check(&big), Err(Errno::Inval));
        assert_eq!(header(CMD_WRITE, 0, 0, MAX_REQUEST + 1).payload_len(), MAX_REQUEST + 1);
        assert_eq!(header(CMD_READ, 0, 0, 4096).payload_len(), 0);
    }

    #[test]
    fn info_requests_parse() {
        let mut data = 3u32.to_be_bytes().to_vec();
        data.extend_from_slice(b"vol");
        data.extend_from_slice(&2u16.to_be_bytes());
        data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        data.extend_from_slice(&INFO_NAME.to_be_bytes());
        let req = parse_info_request(&data).unwrap();
        assert_eq!(req, InfoRequest { name: "vol".into(), infos: vec![INFO_BLOCK_SIZE, INFO_NAME] });
        assert_eq!(
            parse_info_request(&[0, 0, 0, 0, 0, 0]).unwrap(),
            InfoRequest { name: String::new(), infos: vec![] }
        );
        // Lengths that do not add up, truncation, a name longer than the data, bad UTF-8.
        assert_eq!(parse_info_request(&data[..data.len() - 1]), None);
        assert_eq!(parse_info_request(&[data.as_slice(), &[0]].concat()), None);
        assert_eq!(parse_info_request(&[0, 0, 0]), None);
        assert_eq!(parse_info_request(&[0xff, 0xff, 0xff, 0xff, 0, 0]), None);
        assert_eq!(parse_info_request(&[0, 0, 0, 1, 0xff, 0, 0]), None);
    }

    #[test]
    fn errnos_map_to_nbd_errors() {
        let cases = [
            (libc::EPERM, Errno::Perm),
            (libc::EROFS, Errno::Perm),
            (libc::EIO, Errno::Io),
            (libc::ENOMEM, Errno::NoMem),
            (libc::EINVAL, Errno::Inval),
            (libc::ENOSPC, Errno::NoSpc),
            (libc::ENOTSUP, Errno::NotSup),
            (libc::ESHUTDOWN, Errno::Shutdown),
            (libc::ETIMEDOUT, Errno::Io),
            (0, Errno::Io),
        ];
        for (errno, want) in cases {
            assert_eq!(Errno::from_errno(errno), want, "errno {errno}");
        }
        assert_eq!([Errno::Perm, Errno::Io, Errno::Inval, Errno::NoSpc].map(Errno::code), [1, 5, 22, 28]);
        assert_eq!([Errno::NoMem, Errno::NotSup, Errno::Shutdown].map(Errno::code), [12, 95, 108]);
        // The initiator's refusals, as the engine reports them.
        let ro = rblk_initiator::Error::Invalid {
            what: "write",
            offset: 0,
            len: 1,
            reason: rblk_initiator::InvalidReason::ReadOnly,
        };
        assert_eq!(Errno::from_errno(ro.errno()), Errno::Perm);
    }

    #[test]
    fn flags_and_block_sizes() {
        let rw = OLD.transmission_flags(false);
        let zeroes = TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
        assert_eq!(rw, TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | zeroes);
        assert_eq!(GEO.transmission_flags(false), rw | TFLAG_SEND_TRIM, "TRIM where the target discards");
        let ro = RO.transmission_flags(true);
        assert_eq!(ro, TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_READ_ONLY | TFLAG_CAN_MULTI_CONN);
        let b = GEO.block_size_info(true);
        assert_eq!((b.min.get(), b.preferred.get(), b.max.get()), (4096, 4096, MAX_REQUEST));
        assert_eq!(GEO.block_size_info(false).min.get(), 1);
        let small = ExportGeometry { block_size: 512, ..GEO };
        assert_eq!((small.block_size_info(true).min.get(), small.block_size_info(true).preferred.get()), (512, 4096));
    }
}
