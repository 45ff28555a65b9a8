//! The ranges written since the last FLUSH. The target cannot see one-sided writes, so the
//! initiator tells it what to write back. Shared by a volume and its queues; bounded: past
//! [`MAX_FLUSH_RANGES`] distinct ranges it falls back to "everything".

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

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

/// What a volume shares with its queues: the dirty ranges, and whether the target declared the
/// volume failed (a FLUSH answered VolumeFailed), after which writes fail as
/// [`Error::VolumeFailed`](crate::Error::VolumeFailed).
#[derive(Debug, Default)]
pub(crate) struct State {
    dirty: Mutex<Dirty>,
    /// What the FLUSH in progress covers (taken from `dirty`; back there if it fails).
    flushing: Mutex<Dirty>,
    failed: AtomicBool,
    /// Every lane's writes and read-modify-writes hold their blocks here.
    pub(crate) locks: crate::engine::RangeLocks,
    pub(crate) counters: crate::engine::Counters,
}

/// The state a volume shares with its queues.
pub(crate) type Shared = Arc<State>;

/// Records a completed write in `shared`.
pub(crate) fn record(shared: &Shared, offset: u64, len: u64) {
    shared.dirty.lock().unwrap_or_else(|p| p.into_inner()).add(offset, len);
}

/// Whether nothing was written since the last FLUSH.
pub(crate) fn is_clean(shared: &Shared) -> bool {
    *shared.dirty.lock().unwrap_or_else(|p| p.into_inner()) == Dirty::Ranges(Vec::new())
}

/// Bytes in the recorded ranges (None: too many to list, everything may be dirty).
pub(crate) fn pending_bytes(shared: &Shared) -> Option<u64> {
    match &*shared.dirty.lock().unwrap_or_else(|p| p.into_inner()) {
        Dirty::Ranges(v) => Some(v.iter().map(|&(s, e)| e - s).sum()),
        Dirty::All => None,
    }
}

/// Takes what is recorded for a FLUSH, leaving it empty; [`flush_done`] says how it went.
pub(crate) fn take_for_flush(shared: &Shared) -> Dirty {
    let taken = std::mem::take(&mut *shared.dirty.lock().unwrap_or_else(|p| p.into_inner()));
    *shared.flushing.lock().unwrap_or_else(|p| p.into_inner()) = taken.clone();
    taken
}

/// The FLUSH of [`take_for_flush`] ended: on failure its ranges go back, so that the next
/// flush covers them again.
pub(crate) fn flush_done(shared: &Shared, ok: bool) {
    let taken = std::mem::take(&mut *shared.flushing.lock().unwrap_or_else(|p| p.into_inner()));
    if !ok {
        shared.dirty.lock().unwrap_or_else(|p| p.into_inner()).merge(taken);
    }
}

/// The target lost every write not yet flushed (a durable volume's crash): forgets them, the
/// ranges of a FLUSH in progress included, and returns how many bytes they were (None: too
/// many ranges to count).
pub(crate) fn lose_all(shared: &Shared) -> Option<u64> {
    let mut dirty = std::mem::take(&mut *shared.dirty.lock().unwrap_or_else(|p| p.into_inner()));
    dirty.merge(std::mem::take(&mut *shared.flushing.lock().unwrap_or_else(|p| p.into_inner())));
    match dirty {
        Dirty::Ranges(v) => Some(v.iter().map(|&(s, e)| e - s).sum()),
        Dirty::All => None,
    }
}

/// Marks the volume failed.
pub(crate) fn set_failed(shared: &Shared) {
    shared.failed.store(true, Ordering::SeqCst);
}

/// Refuses a write to a failed volume before it is posted (the target revoked write access; a
/// posted write would only kill the connection).
pub(crate) fn check_writable(shared: &Shared, op: crate::Direction, offset: u64, len: u64) -> crate::Result<()> {
    if op == crate::Direction::Write && failed(shared) {
        return Err(crate::Error::VolumeFailed { op, offset, len });
    }
    Ok(())
}

/// Whether the target declared the volume failed.
pub(crate) fn failed(shared: &Shared) -> bool {
    shared.failed.load(Ordering::SeqCst)
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
