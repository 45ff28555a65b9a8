//! Range locks over block ranges, shared by every lane of a session.
//!
//! A write holds its covering blocks *shared* while it is in flight: writes to the same blocks
//! may overlap, as on a disk. A read-modify-write of partial blocks holds them *exclusive*, from
//! reading the edges to the completion of its write, so no write to those blocks (aligned or
//! not, from any lane) lands in between and is undone by the write-back. Readers take no lock.
//!
//! Shared holds never wait inside the lock ([`RangeLocks::try_shared`]): a lane keeps polling its
//! completions while one of its requests waits, so a lane never blocks another one's progress.
//! Exclusive holds wait ([`RangeLocks::exclusive`]), and are only taken by a lane with nothing in
//! flight; new shared holds overlapping a waiting exclusive one are refused, so it is not starved.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

#[derive(Debug, Default)]
struct Held {
    /// (id, start, end, exclusive)
    ranges: Vec<(u64, u64, u64, bool)>,
    /// Exclusive requests waiting: (start, end).
    waiting: Vec<(u64, u64)>,
    next_id: u64,
}

/// Shared and exclusive holds on byte ranges `[start, end)`.
#[derive(Debug, Default)]
pub(crate) struct RangeLocks {
    held: Mutex<Held>,
    released: Condvar,
}

/// A hold, released by [`RangeLocks::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hold(u64);

fn overlaps(a: (u64, u64), s: u64, e: u64) -> bool {
    a.0 < e && s < a.1
}

impl RangeLocks {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A shared hold on `[start, end)`, unless an exclusive one overlaps (held or waiting).
    pub(crate) fn try_shared(&self, start: u64, end: u64) -> Option<Hold> {
        let mut h = self.lock();
        let blocked = h.ranges.iter().any(|&(_, s, e, x)| x && overlaps((s, e), start, end))
            || h.waiting.iter().any(|&w| overlaps(w, start, end));
        if blocked {
            return None;
        }
        h.next_id += 1;
        let id = h.next_id;
        h.ranges.push((id, start, end, false));
        Some(Hold(id))
    }

    /// An exclusive hold on `[start, end)`: waits until no hold overlaps it.
    pub(crate) fn exclusive(&self, start: u64, end: u64) -> Hold {
        let mut h = self.lock();
        h.waiting.push((start, end));
        while h.ranges.iter().any(|&(_, s, e, _)| overlaps((s, e), start, end)) {
            h = self.released.wait(h).unwrap_or_else(PoisonError::into_inner);
        }
        if let Some(i) = h.waiting.iter().position(|&w| w == (start, end)) {
            h.waiting.swap_remove(i);
        }
        h.next_id += 1;
        let id = h.next_id;
        h.ranges.push((id, start, end, true));
        Hold(id)
    }

    /// Waits up to `timeout` for some hold to be released (a lane whose request could not take
    /// its shared hold, with nothing else to do).
    pub(crate) fn wait_release(&self, timeout: Duration) {
        let h = self.lock();
        let _ = self.released.wait_timeout(h, timeout);
    }

    pub(crate) fn release(&self, hold: Hold) {
        let mut h = self.lock();
        if let Some(i) = h.ranges.iter().position(|r| r.0 == hold.0) {
            h.ranges.swap_remove(i);
        }
        drop(h);
        self.released.notify_all();
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn shared_holds_overlap_exclusive_ones_do_not() {
        let l = RangeLocks::default();
        let a = l.try_shared(0, 8192).unwrap();
        let b = l.try_shared(4096, 12288).expect("shared holds may overlap");
        l.release(a);
        l.release(b);
        let x = l.exclusive(0, 4096);
        assert!(l.try_shared(0, 4096).is_none(), "a write inside a read-modify-write's blocks");
        let c = l.try_shared(4096, 8192).expect("adjacent is not overlapping");
        l.release(x);
        l.release(c);
        assert_eq!(l.held(), 0);
    }

    #[test]
    fn exclusive_waits_for_overlapping_holds_and_blocks_new_ones() {
        let l = Arc::new(RangeLocks::default());
        let s = l.try_shared(0, 8192).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = {
            let l = Arc::clone(&l);
            std::thread::spawn(move || {
                let x = l.exclusive(4096, 8192);
                tx.send(()).unwrap();
                l.release(x);
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "exclusive granted over a shared hold");
        // While it waits, a new overlapping shared hold is refused (no starvation) ...
        assert!(l.try_shared(4096, 8192).is_none());
        // ... and a disjoint one is not.
        let d = l.try_shared(65536, 69632).unwrap();
        l.release(s);
        rx.recv_timeout(Duration::from_secs(5)).expect("granted once the shared hold is gone");
        t.join().unwrap();
        l.release(d);
        assert_eq!(l.held(), 0);
    }
}
