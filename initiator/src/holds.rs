//! Range holds on byte ranges, shared by every lane of a session.
//!
//! A write holds its covering blocks *shared* while it is in flight: writes to the same blocks
//! may overlap, as on a disk. A read-modify-write of partial blocks holds them *exclusive*, from
//! reading the edges to the completion of its write-back, so no write to those blocks (aligned or
//! not, from any lane) lands in between and is undone by the write-back. A range the target
//! zeroes (DISCARD, WRITE_ZEROES) is held exclusive from before it is sent until its answer, so
//! no write is in flight to it meanwhile. Readers take no hold.
//!
//! Nothing here waits: a lane whose request cannot have its hold yet keeps it in its state and
//! asks again at its next progress, so one lane's hold never stops another lane's event loop.
//! An exclusive request queues ([`RangeHolds::request_exclusive`]); while it waits, new shared
//! holds overlapping it are refused and older overlapping exclusive requests go first, so it is
//! not starved. [`RangeHolds::wait_release`] is for a caller that has nothing else to do.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Shared,
    Exclusive,
    /// An exclusive request not granted yet.
    Waiting,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    id: u64,
    start: u64,
    end: u64,
    kind: Kind,
}

impl Entry {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.start < end && start < self.end
    }
}

#[derive(Debug, Default)]
struct Held {
    entries: Vec<Entry>,
    next_id: u64,
}

/// Shared and exclusive holds on byte ranges `[start, end)`.
#[derive(Debug, Default)]
pub(crate) struct RangeHolds {
    held: Mutex<Held>,
    released: Condvar,
}

/// A hold, or an exclusive request waiting for one; ended by [`RangeHolds::release`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Hold(u64);

impl RangeHolds {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A shared hold on `[start, end)`, unless an exclusive one overlaps (held or waiting).
    pub(crate) fn try_shared(&self, start: u64, end: u64) -> Option<Hold> {
        let mut h = self.lock();
        let blocked = h.entries.iter().any(|e| e.kind != Kind::Shared && e.overlaps(start, end));
        if blocked {
            return None;
        }
        h.next_id += 1;
        let id = h.next_id;
        h.entries.push(Entry { id, start, end, kind: Kind::Shared });
        Some(Hold(id))
    }

    /// Queues an exclusive request for `[start, end)`; [`try_grant`](Self::try_grant) tells when
    /// it is held.
    pub(crate) fn request_exclusive(&self, start: u64, end: u64) -> Hold {
        let mut h = self.lock();
        h.next_id += 1;
        let id = h.next_id;
        h.entries.push(Entry { id, start, end, kind: Kind::Waiting });
        Hold(id)
    }

    /// Whether the exclusive request `hold` is held now: granted once no hold overlaps it and no
    /// older overlapping exclusive request waits.
    pub(crate) fn try_grant(&self, hold: &Hold) -> bool {
        let mut h = self.lock();
        let Some(i) = h.entries.iter().position(|e| e.id == hold.0) else { return false };
        let me = h.entries[i];
        match me.kind {
            Kind::Exclusive => return true,
            Kind::Shared => return false,
            Kind::Waiting => {}
        }
        let blocked = h
            .entries
            .iter()
            .any(|e| e.id != me.id && e.overlaps(me.start, me.end) && (e.kind != Kind::Waiting || e.id < me.id));
        if blocked {
            return false;
        }
        h.entries[i].kind = Kind::Exclusive;
        true
    }

    /// Whether `hold` is an exclusive hold granted (for invariant checks: grants nothing).
    pub(crate) fn is_granted(&self, hold: &Hold) -> bool {
        self.lock().entries.iter().any(|e| e.id == hold.0 && e.kind == Kind::Exclusive)
    }

    /// Waits up to `timeout` for some hold to be released (a caller whose request could not
    /// have its hold, with nothing else to do).
    pub(crate) fn wait_release(&self, timeout: Duration) {
        let h = self.lock();
        let _ = self.released.wait_timeout(h, timeout);
    }

    /// Ends a hold, or withdraws an exclusive request.
    pub(crate) fn release(&self, hold: Hold) {
        let mut h = self.lock();
        if let Some(i) = h.entries.iter().position(|e| e.id == hold.0) {
            h.entries.swap_remove(i);
        }
        drop(h);
        self.released.notify_all();
    }

    /// Holds and waiting requests (tests check that nothing is left behind).
    pub(crate) fn count(&self) -> usize {
        self.lock().entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_holds_overlap_exclusive_ones_do_not() {
        let l = RangeHolds::default();
        let a = l.try_shared(0, 8192).unwrap();
        let b = l.try_shared(4096, 12288).expect("shared holds may overlap");
        l.release(a);
        l.release(b);
        let x = l.request_exclusive(0, 4096);
        assert!(l.try_grant(&x));
        assert!(l.try_shared(0, 4096).is_none(), "a write inside a read-modify-write's blocks");
        let c = l.try_shared(4096, 8192).expect("adjacent is not overlapping");
        l.release(x);
        l.release(c);
        assert_eq!(l.count(), 0);
    }

    #[test]
    fn exclusive_waits_for_overlapping_holds_and_blocks_new_ones() {
        let l = RangeHolds::default();
        let s = l.try_shared(0, 8192).unwrap();
        let x = l.request_exclusive(4096, 8192);
        assert!(!l.try_grant(&x), "exclusive granted over a shared hold");
        // While it waits, a new overlapping shared hold is refused (no starvation) ...
        assert!(l.try_shared(4096, 8192).is_none());
        // ... and a disjoint one is not.
        let d = l.try_shared(65536, 69632).unwrap();
        // A younger overlapping exclusive request goes after it.
        let y = l.request_exclusive(0, 8192);
        l.release(s);
        assert!(!l.try_grant(&y), "younger request overtook an older one");
        assert!(l.try_grant(&x), "granted once the shared hold is gone");
        assert!(!l.try_grant(&y));
        l.release(x);
        assert!(l.try_grant(&y));
        l.release(y);
        l.release(d);
        assert_eq!(l.count(), 0);
    }
}
