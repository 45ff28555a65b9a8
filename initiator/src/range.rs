//! The checks every access passes before anything is posted. A bad RDMA access (out of range,
//! no write permission) puts both ends' queue pairs into error, so the initiator refuses it here.

use rblk_proto::Opened;

use crate::{Direction, Error, InvalidReason, Result};

/// What OPENED said about a volume, as far as access checks need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Volume size in bytes, a multiple of `block_size`.
    pub size: u64,
    /// Offsets and lengths are multiples of this power of two.
    pub block_size: u32,
    /// Largest single RDMA READ or WRITE.
    pub max_io: u32,
    /// Whether writes are refused.
    pub read_only: bool,
}

impl Geometry {
    /// The geometry of an opened volume; read-only if the open was, or if the target says so.
    pub fn from_opened(opened: &Opened, read_only_open: bool) -> Geometry {
        Geometry {
            size: opened.size,
            block_size: opened.block_size,
            max_io: opened.max_io,
            read_only: read_only_open || opened.flags.contains(rblk_proto::VolumeFlags::READ_ONLY),
        }
    }

    /// Checks an access of `len` bytes at `offset`: not empty, aligned to the block size, inside
    /// the volume (overflow-safe), no write on a read-only volume, and, when `max_len` is given,
    /// not longer than that (a single queue operation passes `Some(max_io)`; synchronous calls
    /// that split into chunks pass `None`).
    pub fn check(&self, dir: Direction, offset: u64, len: u64, max_len: Option<u64>) -> Result<()> {
        let what = match dir {
            Direction::Read => "read",
            Direction::Write => "write",
        };
        self.check_as(what, dir, offset, len, max_len)
    }

    pub(crate) fn check_as(
        &self,
        what: &'static str,
        dir: Direction,
        offset: u64,
        len: u64,
        max_len: Option<u64>,
    ) -> Result<()> {
        let invalid = |reason| Err(Error::Invalid { what, offset, len, reason });
        let bs = u64::from(self.block_size);
        if len == 0 {
            return invalid(InvalidReason::ZeroLength);
        }
        if dir == Direction::Write && self.read_only {
            return invalid(InvalidReason::ReadOnly);
        }
        // A zero block size never comes out of proto's OPENED checks; treat it as 1 anyway.
        if bs > 1 && !offset.is_multiple_of(bs) {
            return invalid(InvalidReason::OffsetUnaligned { block_size: self.block_size });
        }
        if bs > 1 && !len.is_multiple_of(bs) {
            return invalid(InvalidReason::LengthUnaligned { block_size: self.block_size });
        }
        if let Some(max) = max_len {
            if len > max {
                return invalid(InvalidReason::TooLarge { max });
            }
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => invalid(InvalidReason::OutOfRange { size: self.size }),
        }
    }
}

#[cfg(test)]
mod tests {
    use rblk_proto::VolumeFlags;

    use super::*;

    const GEO: Geometry = Geometry { size: 1 << 20, block_size: 4096, max_io: 65536, read_only: false };

    fn reason(r: Result<()>) -> InvalidReason {
        match r {
            Err(Error::Invalid { reason, .. }) => reason,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn accepts_aligned_ranges_inside() {
        let max = Some(u64::from(GEO.max_io));
        GEO.check(Direction::Read, 0, 4096, max).unwrap();
        GEO.check(Direction::Write, (1 << 20) - 65536, 65536, max).unwrap();
        GEO.check(Direction::Read, 0, 1 << 20, None).unwrap();
    }

    #[test]
    fn refuses_with_reasons() {
        let max = Some(u64::from(GEO.max_io));
        let bs = 4096;
        assert_eq!(reason(GEO.check(Direction::Read, 0, 0, max)), InvalidReason::ZeroLength);
        assert_eq!(
            reason(GEO.check(Direction::Read, 512, 4096, max)),
            InvalidReason::OffsetUnaligned { block_size: bs }
        );
        assert_eq!(reason(GEO.check(Direction::Read, 0, 100, max)), InvalidReason::LengthUnaligned { block_size: bs });
        assert_eq!(reason(GEO.check(Direction::Read, 0, 65536 + 4096, max)), InvalidReason::TooLarge { max: 65536 });
        assert_eq!(reason(GEO.check(Direction::Read, 1 << 20, 4096, max)), InvalidReason::OutOfRange { size: 1 << 20 });
        assert_eq!(
            reason(GEO.check(Direction::Read, (1 << 20) - 4096, 8192, None)),
            InvalidReason::OutOfRange { size: 1 << 20 }
        );
        // offset + len overflows u64.
        let top = u64::MAX - 4095;
        assert_eq!(reason(GEO.check(Direction::Read, top, 8192, None)), InvalidReason::OutOfRange { size: 1 << 20 });
        let ro = Geometry { read_only: true, ..GEO };
        assert_eq!(reason(ro.check(Direction::Write, 0, 4096, max)), InvalidReason::ReadOnly);
        ro.check(Direction::Read, 0, 4096, max).unwrap();
    }

    #[test]
    fn messages_name_the_access() {
        let e = GEO.check(Direction::Write, 4096, 8192, None).map(|_| ()).and(GEO.check(
            Direction::Write,
            1 << 20,
            4096,
            None,
        ));
        assert_eq!(
            e.unwrap_err().to_string(),
            "invalid write of 4096 bytes at offset 1048576: the range ends past the end of the 1048576-byte volume"
        );
    }

    #[test]
    fn read_only_from_open_or_target() {
        let opened = Opened {
            remote_addr: 0,
            size: 8192,
            rkey: 1,
            block_size: 4096,
            max_io: 4096,
            flags: VolumeFlags::VOLATILE,
            session_id: 1,
            token: [0; 16],
            instance: None,
            segments: None,
        };
        assert!(!Geometry::from_opened(&opened, false).read_only);
        assert!(Geometry::from_opened(&opened, true).read_only);
        let ro = Opened { flags: VolumeFlags::READ_ONLY, ..opened };
        assert!(Geometry::from_opened(&ro, false).read_only);
    }
}
