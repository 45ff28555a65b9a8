//! The I/O state every queue of a session shares: what was written since the last FLUSH, the
//! FLUSHes in progress, whether the target declared the volume failed, the range holds, and
//! the counters.
//!
//! # Flush sequencing
//!
//! A FLUSH promises that every write completed before it was submitted, on any queue of the
//! session, is durable. Each FLUSH takes the dirty ranges recorded so far ([`SessionIo::begin_flush`]:
//! a sequence number and its own ranges) and sends exactly those. Ranges an earlier FLUSH took are
//! still being written back while it runs, so a FLUSH completes only once every earlier one has
//! ([`SessionIo::earlier`]), and fails if one of them failed. A FLUSH that fails puts its ranges
//! back ([`SessionIo::end_flush`]), so the next one covers them again.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rblk_proto::{Flush, Range, FEATURE_FLUSH_RANGES};

use crate::dirty::Dirty;
use crate::holds::RangeHolds;
use crate::stats::Counters;
use crate::{Direction, Error, Result};

/// A FLUSH the session has begun and not yet forgotten.
#[derive(Debug)]
enum Entry {
    /// Writing back these ranges.
    Running(Dirty),
    /// Answered FLUSHED; waiting for earlier FLUSHes before it completes.
    Answered,
    /// Failed (its ranges are dirty again); later FLUSHes that began while it ran fail too.
    Failed,
}

#[derive(Debug, Default)]
struct Book {
    dirty: Dirty,
    next_seq: u64,
    flushes: BTreeMap<u64, Entry>,
}

/// What the FLUSHes begun before one FLUSH say about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Earlier {
    /// One still runs: wait.
    Running,
    /// One failed: so does this one.
    Failed,
    /// All succeeded.
    Clear,
}

/// A FLUSH begun by [`SessionIo::begin_flush`]: its sequence number and the ranges it owns.
#[derive(Debug)]
pub(crate) struct FlushTicket {
    pub seq: u64,
    pub ranges: Dirty,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SessionIo {
    book: Mutex<Book>,
    /// Notified whenever a FLUSH ends.
    flush_ended: Condvar,
    failed: AtomicBool,
    /// Every lane's writes and read-modify-writes hold their blocks here.
    pub(crate) holds: RangeHolds,
    pub(crate) counters: Counters,
}

/// The state a session's queues share.
pub(crate) type Shared = Arc<SessionIo>;

impl SessionIo {
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a completed write: the next FLUSH covers it.
    pub(crate) fn record(&self, offset: u64, len: u64) {
        self.book().dirty.add(offset, len);
    }

    /// Bytes written and not yet durable: recorded, and taken by FLUSHes still running (None:
    /// too many ranges to count).
    pub(crate) fn pending_bytes(&self) -> Option<u64> {
        let b = self.book();
        let mut all = b.dirty.clone();
        for e in b.flushes.values() {
            if let Entry::Running(d) = e {
                all.merge(d.clone());
            }
        }
        match all {
            Dirty::Ranges(v) => Some(v.iter().map(|&(s, e)| e - s).sum()),
            Dirty::All => None,
        }
    }

    /// Begins a FLUSH: takes every range recorded so far (empty when clean).
    pub(crate) fn begin_flush(&self) -> FlushTicket {
        let mut b = self.book();
        let ranges = std::mem::take(&mut b.dirty);
        b.next_seq += 1;
        let seq = b.next_seq;
        b.flushes.insert(seq, Entry::Running(ranges.clone()));
        FlushTicket { seq, ranges }
    }

    /// Begins a FLUSH of everything (`flush_all`): takes the recorded ranges, as a FLUSH of the
    /// whole volume covers them.
    pub(crate) fn begin_flush_all(&self) -> FlushTicket {
        let mut t = self.begin_flush();
        t.ranges = Dirty::All;
        t
    }

    /// FLUSH `seq` got its answer: on failure its ranges are dirty again, and later FLUSHes
    /// that began while it ran fail with it.
    pub(crate) fn end_flush(&self, seq: u64, ok: bool) {
        let mut b = self.book();
        if let Some(Entry::Running(taken)) = b.flushes.remove(&seq) {
            if ok {
                b.flushes.insert(seq, Entry::Answered);
            } else {
                b.dirty.merge(taken);
                b.flushes.insert(seq, Entry::Failed);
            }
        } else if let Some(e) = b.flushes.get_mut(&seq) {
            if !ok {
                *e = Entry::Failed;
            }
        }
        drop(b);
        self.flush_ended.notify_all();
    }

    /// FLUSH `seq` completed (or was abandoned): the session forgets it, unless it failed and a
    /// later FLUSH that began while it ran has not completed yet.
    pub(crate) fn forget_flush(&self, seq: u64) {
        let mut b = self.book();
        if matches!(b.flushes.get(&seq), Some(Entry::Running(_))) {
            // Abandoned before its answer: as failed.
            if let Some(Entry::Running(taken)) = b.flushes.remove(&seq) {
                b.dirty.merge(taken);
            }
            b.flushes.insert(seq, Entry::Failed);
        }
        if matches!(b.flushes.get(&seq), Some(Entry::Answered)) {
            b.flushes.remove(&seq);
        }
        // A failure matters only to FLUSHes that began after it and have not completed.
        let last_open = b.flushes.iter().rev().find(|(_, e)| !matches!(e, Entry::Failed)).map(|(&s, _)| s);
        b.flushes.retain(|&s, e| !matches!(e, Entry::Failed) || last_open.is_some_and(|l| s < l));
        drop(b);
        self.flush_ended.notify_all();
    }

    /// What the FLUSHes begun before `seq` say.
    pub(crate) fn earlier(&self, seq: u64) -> Earlier {
        let b = self.book();
        let mut result = Earlier::Clear;
        for (_, e) in b.flushes.range(..seq) {
            match e {
                Entry::Running(_) => return Earlier::Running,
                Entry::Failed => result = Earlier::Failed,
                Entry::Answered => {}
            }
        }
        result
    }

    /// Waits until no FLUSH begun before `seq` runs (a synchronous FLUSH whose earlier ones run
    /// on lanes of other threads), or `until`.
    pub(crate) fn wait_earlier(&self, seq: u64, until: Instant) -> Earlier {
        let mut b = self.book();
        loop {
            drop(b);
            let e = self.earlier(seq);
            let now = Instant::now();
            if e != Earlier::Running || now >= until {
                return e;
            }
            b = self.book();
            let wait = until.saturating_duration_since(now).min(Duration::from_millis(100));
            b = self.flush_ended.wait_timeout(b, wait).unwrap_or_else(PoisonError::into_inner).0;
        }
    }

    /// Everything may be unflushed (a process took over from one that died with its dirty
    /// set): the next FLUSH covers the whole volume.
    pub(crate) fn dirty_all(&self) {
        self.book().dirty = Dirty::All;
    }

    /// The target lost every write not yet flushed (a durable volume's crash): forgets them, the
    /// ranges of FLUSHes in progress included, and returns how many bytes they were (None: too
    /// many ranges to count).
    pub(crate) fn lose_all(&self) -> Option<u64> {
        let mut b = self.book();
        let mut lost = std::mem::take(&mut b.dirty);
        for e in b.flushes.values_mut() {
            if let Entry::Running(d) = e {
                lost.merge(std::mem::take(d));
            }
        }
        match lost {
            Dirty::Ranges(v) => Some(v.iter().map(|&(s, e)| e - s).sum()),
            Dirty::All => None,
        }
    }

    /// Counts a FLUSH that ended: sent (and how long it took) or skipped, and whether it failed.
    pub(crate) fn count_flush(&self, sent: Option<Duration>, ok: bool) {
        let c = &self.counters;
        match sent {
            Some(took) => {
                c.flushes.fetch_add(1, Ordering::Relaxed);
                c.flush_latency.record(took);
            }
            None => {
                c.skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Marks the volume failed (a FLUSH answered VolumeFailed).
    pub(crate) fn set_failed(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Whether the target declared the volume failed.
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// Refuses a write to a failed volume before it is posted (the target revoked write access; a
    /// posted write would only kill the connection).
    pub(crate) fn check_writable(&self, op: Direction, offset: u64, len: u64) -> Result<()> {
        if op == Direction::Write && self.failed() {
            return Err(Error::VolumeFailed { op, offset, len });
        }
        Ok(())
    }

    /// Holds, FLUSHes and dirty ranges left: `(holds, flushes running or remembered)`.
    pub(crate) fn leftovers(&self) -> (usize, usize) {
        (self.holds.count(), self.book().flushes.len())
    }
}

/// What one FLUSH message covers: listed ranges, or the whole volume (too many ranges, or a
/// target without [`FEATURE_FLUSH_RANGES`]). Owned, so a FLUSH can be sent again after a
/// reconnect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FlushBody {
    ranges: Vec<Range>,
    all: bool,
}

impl FlushBody {
    /// The FLUSH of `dirty` to a target with `features`.
    pub(crate) fn of(dirty: &Dirty, features: u64) -> FlushBody {
        match dirty {
            Dirty::Ranges(v) if features & FEATURE_FLUSH_RANGES != 0 => {
                FlushBody { ranges: v.iter().map(|&(s, e)| Range::new(s, e - s)).collect(), all: false }
            }
            _ => FlushBody { ranges: Vec::new(), all: true },
        }
    }

    /// The FLUSH of one range (FUA).
    pub(crate) fn range(offset: u64, len: u64, features: u64) -> FlushBody {
        FlushBody::of(&Dirty::Ranges(vec![(offset, offset + len)]), features)
    }

    pub(crate) fn message(&self) -> Flush<'_> {
        if self.all {
            Flush::All
        } else {
            Flush::Ranges(&self.ranges)
        }
    }

    /// Logs what it covers (one debug line per FLUSH, never per I/O).
    pub(crate) fn trace(&self) {
        if self.all {
            tracing::debug!("FLUSH of the whole volume");
        } else {
            let bytes = self.ranges.iter().map(|r| r.len()).sum::<u64>();
            tracing::debug!(ranges = self.ranges.len(), bytes, "FLUSH");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_waits_for_earlier_ones_and_fails_with_them() {
        let io = SessionIo::default();
        io.record(0, 4096);
        let a = io.begin_flush();
        assert_eq!(a.ranges, Dirty::Ranges(vec![(0, 4096)]));
        io.record(8192, 4096);
        let b = io.begin_flush();
        assert_eq!(b.ranges, Dirty::Ranges(vec![(8192, 12288)]), "each FLUSH owns what it took");
        let c = io.begin_flush();
        assert_eq!(c.ranges, Dirty::default());
        // c has nothing to send: answered at once, it waits for a and b.
        io.end_flush(c.seq, true);
        assert_eq!(io.earlier(a.seq), Earlier::Clear);
        assert_eq!(io.earlier(b.seq), Earlier::Running);
        io.end_flush(b.seq, true);
        assert_eq!(io.earlier(c.seq), Earlier::Running, "a is still writing back");
        io.end_flush(a.seq, false);
        io.forget_flush(a.seq);
        assert_eq!(io.earlier(b.seq), Earlier::Failed);
        assert_eq!(io.earlier(c.seq), Earlier::Failed, "a's failure is kept while c waits");
        assert_ne!(io.pending_bytes(), Some(0));
        io.forget_flush(b.seq);
        io.forget_flush(c.seq);
        // a's ranges are dirty again; nothing else is remembered.
        let d = io.begin_flush();
        assert_eq!(d.ranges, Dirty::Ranges(vec![(0, 4096)]));
        assert_eq!(io.earlier(d.seq), Earlier::Clear, "no open FLUSH needs the old failure");
        io.end_flush(d.seq, true);
        io.forget_flush(d.seq);
        assert_eq!(io.leftovers(), (0, 0));
        assert_eq!(io.pending_bytes(), Some(0));
    }

    #[test]
    fn a_loss_forgets_running_flushes_ranges() {
        let io = SessionIo::default();
        io.record(0, 4096);
        let a = io.begin_flush();
        io.record(4096, 4096);
        assert_eq!(io.pending_bytes(), Some(8192));
        assert_eq!(io.lose_all(), Some(8192));
        io.end_flush(a.seq, false);
        io.forget_flush(a.seq);
        assert_eq!(io.begin_flush().ranges, Dirty::default(), "lost writes are not flushed again");
    }
}
