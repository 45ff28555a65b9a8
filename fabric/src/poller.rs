//! Waiting on many connections at once: [`Poller`] (epoll over descriptors such as
//! [`Endpoint::event_fd`](crate::Endpoint::event_fd), each with a token of the caller's), and
//! [`WakeQueue`] (one eventfd that many [`Waker`]s share, each waking with a tag of its own), so
//! that one thread serves many endpoints and other threads reach any one of them.
//!
//! ```
//! use rblk_fabric::poller::{Poller, WakeQueue};
//!
//! # fn main() -> rblk_fabric::Result<()> {
//! let poller = Poller::new()?;
//! let queue = WakeQueue::new()?;
//! poller.add(queue.fd(), u64::MAX)?;
//! queue.waker(7).wake();
//! let mut ready = Vec::new();
//! poller.wait(&mut ready, None)?;
//! assert_eq!(ready, [u64::MAX]);
//! let mut tags = Vec::new();
//! queue.take(&mut tags);
//! assert_eq!(tags, [7]);
//! # Ok(()) }
//! ```
//!
//! Threads: a [`Poller`] is waited on by one thread; adding and removing descriptors is safe
//! from any. A [`WakeQueue`]'s wakers may be used from any thread.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::{Error, Result, Waker};

/// Descriptors reported per `epoll_wait`.
const BATCH: usize = 64;

/// An epoll instance: level-triggered readiness of the descriptors added, each reported with
/// its token.
#[derive(Debug)]
pub struct Poller {
    epfd: OwnedFd,
}

fn os(op: &'static str) -> Error {
    Error::Os { op, source: std::io::Error::last_os_error() }
}

impl Poller {
    /// A new epoll instance.
    pub fn new() -> Result<Poller> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(os("epoll_create1"));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Poller { epfd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, what: &'static str) -> Result<()> {
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call (ignored for DEL).
        let rc = unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) };
        if rc != 0 {
            return Err(os(what));
        }
        Ok(())
    }

    /// Reports `fd` with `token` whenever it is readable. The caller keeps `fd` open until it
    /// [`removes`](Self::remove) it.
    pub fn add(&self, fd: RawFd, token: u64) -> Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, "epoll_ctl(ADD)")
    }

    /// Stops reporting `fd`.
    pub fn remove(&self, fd: RawFd) -> Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, "epoll_ctl(DEL)")
    }

    /// Waits until a descriptor is readable or `deadline` passes (None: until one is), and
    /// appends the tokens of the readable ones to `ready` (none: the deadline, or a signal).
    pub fn wait(&self, ready: &mut Vec<u64>, deadline: Option<Instant>) -> Result<()> {
        let timeout_ms = match deadline {
            None => -1,
            // Rounded up, so that it never returns before the deadline.
            Some(d) => i32::try_from(d.saturating_duration_since(Instant::now()).as_micros().div_ceil(1000))
                .unwrap_or(i32::MAX),
        };
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; BATCH];
        // SAFETY: `events` has room for BATCH entries, and the kernel writes at most that many.
        let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), events.as_mut_ptr(), BATCH as i32, timeout_ms) };
        if n < 0 {
            let source = std::io::Error::last_os_error();
            if source.kind() == std::io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(Error::Os { op: "epoll_wait", source });
        }
        ready.extend(events[..n as usize].iter().map(|e| e.u64));
        Ok(())
    }
}

/// One eventfd shared by many [`Waker`]s: each wakes with its tag, and the waiting thread
/// [`takes`](Self::take) the tags once the descriptor is readable.
#[derive(Debug)]
pub struct WakeQueue {
    fd: OwnedFd,
    tags: Mutex<Vec<u64>>,
}

impl WakeQueue {
    /// A new queue (one eventfd).
    pub fn new() -> Result<Arc<WakeQueue>> {
        // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(os("eventfd"));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        Ok(Arc::new(WakeQueue { fd: unsafe { OwnedFd::from_raw_fd(fd) }, tags: Mutex::default() }))
    }

    /// The descriptor that is readable while tags wait (for a [`Poller`]).
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// A waker that queues `tag`.
    pub fn waker(self: &Arc<Self>, tag: u64) -> Waker {
        Waker::tagged(Arc::clone(self), tag)
    }

    /// Queues `tag` and makes the descriptor readable.
    pub fn wake(&self, tag: u64) {
        let mut tags = self.tags.lock().unwrap_or_else(|p| p.into_inner());
        let first = tags.is_empty();
        tags.push(tag);
        drop(tags);
        if first {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a valid buffer to our eventfd. A full counter
            // (EAGAIN) is readable already, which is all a wake-up needs.
            let _ = unsafe { libc::write(self.fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Appends the tags queued since the last call to `out` (each once, in the order woken)
    /// and makes the descriptor unreadable until the next wake-up.
    pub fn take(&self, out: &mut Vec<u64>) {
        let mut tags = self.tags.lock().unwrap_or_else(|p| p.into_inner());
        let mut count = [0u8; 8];
        // SAFETY: reads at most 8 bytes into a valid buffer from our non-blocking eventfd.
        let _ = unsafe { libc::read(self.fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        for tag in tags.drain(..) {
            if !out.contains(&tag) {
                out.push(tag);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_arrive_once_each_and_the_descriptor_quiets() {
        let poller = Poller::new().unwrap();
        let queue = WakeQueue::new().unwrap();
        poller.add(queue.fd(), 99).unwrap();
        let (a, b) = (queue.waker(1), queue.waker(2));
        let t = std::thread::spawn(move || {
            a.wake();
            b.wake();
            a.wake();
        });
        t.join().unwrap();
        let mut ready = Vec::new();
        poller.wait(&mut ready, None).unwrap();
        assert_eq!(ready, [99]);
        let mut tags = Vec::new();
        queue.take(&mut tags);
        assert_eq!(tags, [1, 2]);
        ready.clear();
        poller.wait(&mut ready, Some(Instant::now())).unwrap();
        assert!(ready.is_empty(), "taken: nothing readable until the next wake-up");
        poller.remove(queue.fd()).unwrap();
        queue.wake(3);
        poller.wait(&mut ready, Some(Instant::now())).unwrap();
        assert!(ready.is_empty(), "removed descriptors are not reported");
    }
}
