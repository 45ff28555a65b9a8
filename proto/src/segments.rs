//! A volume's memory segments as one QP reaches them ([`FEATURE_SEGMENTS`](crate::FEATURE_SEGMENTS)).
//!
//! A volume that grows keeps its registered memory where it is (the NIC and every QP's windows
//! go on pointing at it) and gets a new segment for the added range: memory of its own, with a
//! registration of its own, so with an rkey of its own (a type 2B window binds within one
//! registration). An initiator reaches byte `offset` of the volume through the segment that
//! holds it, and splits an I/O that crosses from one segment into the next.

use crate::ParseError;

/// Most memory segments a volume has: it is created with one and grows by one at a time.
pub const MAX_SEGMENTS: usize = 8;

/// One segment: the volume's bytes from `offset` up to the next segment's offset (or the
/// volume's end) are at `remote_addr` onwards, under `rkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Segment {
    /// Where it starts in the volume, in bytes.
    pub offset: u64,
    /// The address of its first byte in the registration `rkey` names.
    pub remote_addr: u64,
    /// The rkey that reaches it from this QP.
    pub rkey: u32,
}

/// A volume's segments in order, and how far they reach: 1 to [`MAX_SEGMENTS`], the first at
/// offset 0, offsets strictly increasing, each below the size (checked when made, so every
/// value holds that). The size is the volume's as the message that carried them knew it: a
/// QP's segments reach that far, however much the volume grew since (another message tells).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Segments {
    count: u8,
    entries: [Segment; MAX_SEGMENTS],
    size: u64,
}

impl Segments {
    /// The segments `list` names, of a volume of `size` bytes, checked: 1 to [`MAX_SEGMENTS`],
    /// the first at 0, each starting after the one before, and (more than one) before `size`.
    pub fn new(list: &[Segment], size: u64) -> Result<Segments, ParseError> {
        if list.is_empty() || list.len() > MAX_SEGMENTS {
            return Err(ParseError::BadCount {
                field: "segments.count",
                count: list.len() as u64,
                max: MAX_SEGMENTS as u64,
            });
        }
        if list[0].offset != 0 || list.windows(2).any(|w| w[1].offset <= w[0].offset) {
            return Err(ParseError::BadSegments { reason: "offsets must start at 0 and increase" });
        }
        if list.len() > 1 && list[list.len() - 1].offset >= size {
            return Err(ParseError::BadSegments { reason: "a segment starts past the size they reach" });
        }
        let mut entries = [Segment::default(); MAX_SEGMENTS];
        entries[..list.len()].copy_from_slice(list);
        // The length was checked against MAX_SEGMENTS, which fits a u8.
        Ok(Segments { count: u8::try_from(list.len()).unwrap_or(u8::MAX), entries, size })
    }

    /// One segment: a volume of `size` bytes at `remote_addr` under `rkey` (one that never
    /// grew, or a peer without segments).
    pub fn one(remote_addr: u64, rkey: u32, size: u64) -> Segments {
        let mut entries = [Segment::default(); MAX_SEGMENTS];
        entries[0] = Segment { offset: 0, remote_addr, rkey };
        Segments { count: 1, entries, size }
    }

    /// How far they reach: the volume's size when the message carrying them was sent.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The segments, in order.
    pub fn as_slice(&self) -> &[Segment] {
        &self.entries[..usize::from(self.count)]
    }

    /// How many.
    pub fn len(&self) -> usize {
        usize::from(self.count)
    }

    /// Never: a volume has at least one segment. (For clippy's `len_without_is_empty`.)
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The segment that holds byte `offset`, and the bytes from `offset` to its end (the size
    /// for the last; 0 past it): an I/O at `offset` longer than that continues in the next
    /// segment.
    pub fn locate(&self, offset: u64) -> (&Segment, u64) {
        let list = self.as_slice();
        let i = list.partition_point(|s| s.offset <= offset).saturating_sub(1);
        let end = list.get(i + 1).map_or(self.size, |next| next.offset);
        (&list[i], end.saturating_sub(offset))
    }

    /// Checks the segments against a volume of `size` bytes in blocks of `block_size`: each
    /// starts inside the volume, on a block boundary.
    pub(crate) fn check(&self, size: u64, block_size: u32) -> Result<(), ParseError> {
        let block = u64::from(block_size.max(1));
        // One segment starts at 0, which any volume holds.
        if self.len() > 1 && self.as_slice().iter().any(|s| s.offset >= size || s.offset % block != 0) {
            return Err(ParseError::BadSegments { reason: "a segment starts past the volume's end or inside a block" });
        }
        Ok(())
    }
}

impl core::fmt::Debug for Segments {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Segments").field("size", &self.size).field("list", &self.as_slice()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(offset: u64) -> Segment {
        Segment { offset, remote_addr: 0x1000_0000 + offset, rkey: offset as u32 + 7 }
    }

    /// Catches an I/O sent to the wrong segment, or one that runs past a segment's end
    /// without being split: the boundaries, the bytes left in each, the last one's end.
    #[test]
    fn locate_finds_the_segment_and_its_end() {
        let size = 4 << 20;
        let s = Segments::new(&[seg(0), seg(1 << 20), seg(3 << 20)], size).unwrap();
        assert_eq!(s.locate(0), (&seg(0), 1 << 20));
        assert_eq!(s.locate((1 << 20) - 4096), (&seg(0), 4096));
        assert_eq!(s.locate(1 << 20), (&seg(1 << 20), 2 << 20));
        assert_eq!(s.locate((3 << 20) + 4096), (&seg(3 << 20), (1 << 20) - 4096));
        assert_eq!(s.locate(size).1, 0, "nothing past the size they reach");
        assert_eq!(
            Segments::one(5, 6, size).locate(12_288),
            (&Segment { offset: 0, remote_addr: 5, rkey: 6 }, size - 12_288)
        );
    }

    /// Catches a list a receiver could not use: empty, more than [`MAX_SEGMENTS`], not from 0,
    /// not increasing, starting past the end or inside a block.
    #[test]
    fn bad_lists_are_refused() {
        let big = 1 << 30;
        assert!(Segments::new(&[], big).is_err());
        assert!(Segments::new(&[seg(4096)], big).is_err(), "not from 0");
        assert!(Segments::new(&[seg(0), seg(8192), seg(8192)], big).is_err(), "not increasing");
        let nine: Vec<Segment> = (0..9).map(|i| seg(i * 4096)).collect();
        assert!(Segments::new(&nine, big).is_err());
        assert_eq!(Segments::new(&nine[..8], big).unwrap().len(), 8);
        assert!(Segments::new(&[seg(0), seg(8192)], 8192).is_err(), "starts at the end");
        let two = Segments::new(&[seg(0), seg(8192)], big).unwrap();
        assert!(two.check(8192, 4096).is_err(), "starts at the volume's end");
        assert!(two.check(16_384, 8192).is_ok());
        assert!(Segments::new(&[seg(0), seg(6144)], big).unwrap().check(16_384, 4096).is_err(), "inside a block");
    }
}
