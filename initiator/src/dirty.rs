//! The ranges written since the last FLUSH. The target cannot see one-sided writes, so the
//! initiator tells it what to write back. Bounded: past [`MAX_FLUSH_RANGES`] distinct ranges it
//! falls back to "everything". The session's copy lives in its I/O state (`io_state.rs`).

use rblk_proto::MAX_FLUSH_RANGES;

/// What the next FLUSH must cover.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dirty {
    /// Sorted, disjoint, non-adjacent `(start, end)` byte ranges.
    Ranges(Vec<(u64, u64)>),
    /// Too many ranges to list: flush everything.
    All,
}

impl Default for Dirty {
    fn default() -> Self {
        Dirty::Ranges(Vec::new())
    }
}

impl Dirty {
    /// Records a completed write of `len` bytes at `offset`, merging with neighbours.
    pub fn add(&mut self, offset: u64, len: u64) {
        let Dirty::Ranges(v) = self else { return };
        if len == 0 {
            return;
        }
        let (mut start, mut end) = (offset, offset.saturating_add(len));
        // Ranges touching [start, end] (adjacent counts) merge into it.
        let first = v.partition_point(|&(_, e)| e < start);
        let last = v.partition_point(|&(s, _)| s <= end);
        if first < last {
            start = start.min(v[first].0);
            end = end.max(v[last - 1].1);
        }
        v.splice(first..last, [(start, end)]);
        if v.len() > MAX_FLUSH_RANGES {
            *self = Dirty::All;
        }
    }

    /// Puts back ranges a failed FLUSH did not cover.
    pub fn merge(&mut self, other: Dirty) {
        match other {
            Dirty::All => *self = Dirty::All,
            Dirty::Ranges(v) => v.into_iter().for_each(|(s, e)| self.add(s, e - s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(d: &Dirty) -> Vec<(u64, u64)> {
        match d {
            Dirty::Ranges(v) => v.clone(),
            Dirty::All => panic!("All"),
        }
    }

    #[test]
    fn merges_overlapping_and_adjacent() {
        let mut d = Dirty::default();
        d.add(8192, 4096);
        d.add(0, 4096);
        assert_eq!(ranges(&d), [(0, 4096), (8192, 12288)]);
        d.add(4096, 4096); // bridges both
        assert_eq!(ranges(&d), [(0, 12288)]);
        d.add(100, 10);
        d.add(20000, 0);
        assert_eq!(ranges(&d), [(0, 12288)]);
        d.add(1 << 20, 4096);
        d.add((1 << 20) - 4096, 8192);
        assert_eq!(ranges(&d), [(0, 12288), ((1 << 20) - 4096, (1 << 20) + 4096)]);
    }

    #[test]
    fn falls_back_to_all_past_the_limit() {
        let mut d = Dirty::default();
        for i in 0..MAX_FLUSH_RANGES as u64 {
            d.add(i * 8192, 4096);
        }
        assert_eq!(ranges(&d).len(), MAX_FLUSH_RANGES);
        d.add(1 << 40, 4096);
        assert_eq!(d, Dirty::All);
        d.add(0, 4096);
        assert_eq!(d, Dirty::All);
        let mut e = Dirty::default();
        e.merge(Dirty::All);
        assert_eq!(e, Dirty::All);
    }
}
