//! io_uring transfers between volume memory and its backing file: the one module of the daemon
//! with `unsafe`, because the kernel reads and writes our memory asynchronously.
//!
//! Every transfer submits at most `depth` I/Os of at most `chunk` bytes, resubmits the rest of a
//! short transfer, and reaps every completion before it returns, also on error: no I/O into the
//! memory outlives the call.

use std::io;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};
use rblk_fabric::Memory;

/// Direction of a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Backing store into memory.
    Load,
    /// Memory into backing store.
    Store,
}

/// An io_uring instance sized for `depth` transfers in flight.
pub struct Ring {
    ring: IoUring,
    depth: usize,
    /// Tests: make this many waits fail as if io_uring_enter had.
    #[cfg(test)]
    fail_waits: u32,
}

impl std::fmt::Debug for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ring").field("depth", &self.depth).finish()
    }
}

#[cfg(test)]
thread_local! {
    /// Tests: the next ring made on this thread fails this many waits (see `Ring::fail_waits`),
    /// for rings made inside the code under test.
    pub(crate) static FAIL_WAITS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

struct Pending {
    offset: u64,
    len: u64,
}

impl Ring {
    /// Sets up a ring for `depth` I/Os in flight.
    pub fn new(depth: u32) -> io::Result<Ring> {
        Ok(Ring {
            ring: IoUring::new(depth.next_power_of_two())?,
            depth: depth as usize,
            #[cfg(test)]
            fail_waits: FAIL_WAITS.take(),
        })
    }

    /// Moves every `(offset, len)` range (byte offsets valid both in `memory` and in the file
    /// `fd`) in direction `dir`, in pieces of at most `chunk` bytes, calling `progress` with the
    /// bytes completed so far. The first error is returned once nothing is in flight.
    pub fn transfer(
        &mut self,
        fd: RawFd,
        memory: &Memory,
        ranges: &[(u64, u64)],
        dir: Dir,
        chunk: u64,
        mut progress: impl FnMut(u64),
    ) -> io::Result<()> {
        for &(offset, len) in ranges {
            let end = offset.checked_add(len).filter(|&e| e <= memory.len() as u64);
            if end.is_none() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("range {offset}+{len} outside memory"),
                ));
            }
        }
        // Pieces still to submit, and the slots of those in flight (user_data = slot index).
        let mut todo: Vec<Pending> = ranges
            .iter()
            .rev()
            .flat_map(|&(offset, len)| {
                (0..len.div_ceil(chunk))
                    .rev()
                    .map(move |i| Pending { offset: offset + i * chunk, len: chunk.min(len - i * chunk) })
            })
            .collect();
        let mut slots: Vec<Option<Pending>> = (0..self.depth).map(|_| None).collect();
        let mut in_flight = 0usize;
        let mut done = 0u64;
        let mut first_err: Option<io::Error> = None;
        loop {
            // Submit while there is room (and no error yet).
            while first_err.is_none() && in_flight < self.depth {
                let Some(p) = todo.pop() else { break };
                let slot = slots.iter().position(Option::is_none).expect("a free slot while in_flight < depth");
                let len = u32::try_from(p.len).expect("chunks fit in u32");
                // The pointer stays inside `memory` (ranges were checked above).
                let buf = memory.as_ptr().wrapping_add(p.offset as usize);
                let entry = match dir {
                    Dir::Load => opcode::Read::new(types::Fd(fd), buf, len).offset(p.offset).build(),
                    Dir::Store => opcode::Write::new(types::Fd(fd), buf.cast_const(), len).offset(p.offset).build(),
                }
                .user_data(slot as u64);
                // SAFETY: the buffer lies within `memory` (checked above), which outlives this call,
                // and we reap every submitted entry before returning, so the kernel never
                // touches it after we are gone. `fd` is open for the whole call (caller's file).
                if unsafe { self.ring.submission().push(&entry) }.is_err() {
                    // Cannot happen (the ring has room for `depth`), but never return with I/O
                    // in flight: stop submitting and drain.
                    first_err = Some(io::Error::other("io_uring submission queue full"));
                    break;
                }
                slots[slot] = Some(p);
                in_flight += 1;
            }
            if in_flight == 0 {
                break;
            }
            if let Err(e) = self.wait_one() {
                // Never return with I/O in flight into `memory`: stop submitting, keep reaping.
                first_err.get_or_insert(e);
                self.wait_drain();
            }
            let completed: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
            for (slot, res) in completed {
                let Some(p) = slots.get_mut(slot as usize).and_then(Option::take) else { continue };
                in_flight -= 1;
                match res {
                    r if r < 0 => {
                        let e = io::Error::from_raw_os_error(-r);
                        first_err.get_or_insert(io::Error::new(
                            e.kind(),
                            format!("{} of {} bytes at offset {}: {e}", verb(dir), p.len, p.offset),
                        ));
                    }
                    0 => {
                        first_err.get_or_insert(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{} at offset {}: end of file (backing store too small?)", verb(dir), p.offset),
                        ));
                    }
                    n => {
                        let n = n as u64;
                        done += n;
                        progress(done);
                        if n < p.len {
                            // Short transfer: the rest goes round again.
                            todo.push(Pending { offset: p.offset + n, len: p.len - n });
                        }
                    }
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// After a failed wait, with entries still in flight: waits until one completes however
    /// io_uring_enter behaves, backing off between tries. It may wait for ever, but returning
    /// with the kernel still writing into the caller's memory is not an option.
    fn wait_drain(&mut self) {
        let mut pause = std::time::Duration::from_micros(100);
        let mut warned = false;
        while self.ring.completion().is_empty() {
            match self.wait_one() {
                Ok(()) => return,
                Err(e) => {
                    if !warned {
                        tracing::error!(error = %e, "io_uring wait failed with I/O in flight; waiting for it to drain");
                        warned = true;
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(std::time::Duration::from_millis(100));
                }
            }
        }
    }

    /// Submits and waits for at least one completion, retrying interruptions.
    fn wait_one(&mut self) -> io::Result<()> {
        #[cfg(test)]
        if self.fail_waits > 0 {
            self.fail_waits -= 1;
            // Submit what is queued, as a failing io_uring_enter may have, then fail.
            self.ring.submit()?;
            return Err(io::Error::from_raw_os_error(libc::EFAULT));
        }
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// `fdatasync(fd)` through the ring.
    pub fn fdatasync(&mut self, fd: RawFd) -> io::Result<()> {
        let entry = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build().user_data(u64::MAX);
        // SAFETY: an fsync entry references no memory; `fd` stays open for the call.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        loop {
            if self.wait_one().is_err() {
                // The fsync's own completion says how it went; it must not be left behind for
                // the next transfer to take.
                self.wait_drain();
            }
            if let Some(c) = self.ring.completion().find(|c| c.user_data() == u64::MAX) {
                return if c.result() < 0 { Err(io::Error::from_raw_os_error(-c.result())) } else { Ok(()) };
            }
        }
    }
}

fn verb(dir: Dir) -> &'static str {
    match dir {
        Dir::Load => "reading",
        Dir::Store => "writing",
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn store_and_load_round_trip_with_many_chunks() {
        let dir = std::env::temp_dir().join(format!("rblk-uring-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("backing");
        let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        let mem = Memory::anonymous(1 << 20).unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
        mem.write_at(0, &data).unwrap();
        let mut ring = Ring::new(4).unwrap();
        let mut seen = 0;
        ring.transfer(file.as_raw_fd(), &mem, &[(0, 1 << 19), (1 << 19, 1 << 19)], Dir::Store, 64 << 10, |d| seen = d)
            .unwrap();
        assert_eq!(seen, 1 << 20);
        ring.fdatasync(file.as_raw_fd()).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), data);

        let back = Memory::anonymous(1 << 20).unwrap();
        ring.transfer(file.as_raw_fd(), &back, &[(0, 1 << 20)], Dir::Load, 128 << 10, |_| {}).unwrap();
        let mut got = vec![0u8; 1 << 20];
        back.read_at(0, &mut got).unwrap();
        assert_eq!(got, data);

        // A wait that fails after a submit: the error comes back only once every submitted
        // entry completed (the data of every piece is in the file), never with I/O in flight.
        let mut ring = Ring::new(4).unwrap();
        ring.fail_waits = 1;
        let err = ring
            .transfer(file.as_raw_fd(), &mem, &[(0, 1 << 20)], Dir::Store, 64 << 10, |_| {})
            .expect_err("the injected wait failure");
        assert_eq!(err.raw_os_error(), Some(libc::EFAULT));
        assert!(ring.ring.submission().is_empty(), "nothing left to submit");
        // Had transfer returned with entries in flight, their completions would show up now.
        std::thread::sleep(std::time::Duration::from_millis(50));
        ring.ring.submit().unwrap();
        assert!(ring.ring.completion().is_empty(), "every completion was reaped before the error returned");
        let mut ring = Ring::new(4).unwrap();

        // Reading past the end of the file is an error, not silence.
        let big = Memory::anonymous(2 << 20).unwrap();
        let err = ring.transfer(file.as_raw_fd(), &big, &[(0, 2 << 20)], Dir::Load, 1 << 20, |_| {}).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(ring.transfer(file.as_raw_fd(), &mem, &[(1 << 20, 1)], Dir::Store, 4096, |_| {}).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }
}
