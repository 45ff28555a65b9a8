//! A volume as a byte-addressed file shared by threads: any offset and length, straight to
//! one-sided RDMA through a pool of queues, partial blocks read-modify-written.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::{Done, Error, InvalidReason, Queue, Result, Volume, DEFAULT_IO_TIMEOUT};

/// Bytes per queue operation (less when the volume's largest I/O is smaller).
const OP_SIZE: u32 = 256 << 10;
/// Largest request served in one go by the FUSE layer: 4 operations cover it.
const DEPTH: u32 = 6;

/// A [`Volume`] as a file of [`size`](Self::size) bytes that several threads read and write
/// at once, at any offset and length.
///
/// Each call borrows one of the pool's [`Queue`]s (waiting if all are busy), posts the covering
/// block-aligned operations (at most the queue's depth in flight) and waits for all their
/// completions before it returns, so a returned write is in target memory and recorded for the
/// next [`flush`](Self::flush). A write that covers a block only partly reads that block first
/// (read-modify-write); writes whose covering blocks overlap are serialized by a range lock, so
/// concurrent writes to different bytes of one block never undo each other. Reads take no lock:
/// a read racing a write of the same bytes sees old or new data, as on a disk.
///
/// The volume's own queue pair carries the control path only: FLUSH, keepalives, CLOSE.
#[derive(Debug)]
pub struct VolumeFile {
    size: u64,
    block_size: u32,
    read_only: bool,
    volatile: bool,
    io_timeout: Duration,
    queues: usize,
    addr: SocketAddr,
    vol: Mutex<Option<Volume>>,
    pool: Mutex<Vec<Worker>>,
    returned: Condvar,
    locks: RangeLocks,
    /// Writes completed, and the count the last successful flush covered.
    written: AtomicU64,
    flushed: AtomicU64,
    stats: Counters,
}

/// What a [`VolumeFile`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FileStats {
    /// read calls served.
    pub reads: u64,
    /// write calls served.
    pub writes: u64,
    /// writes that read a partial block first.
    pub read_modify_writes: u64,
    /// FLUSH requests sent to the target.
    pub flushes: u64,
    /// flush calls that had nothing to flush (no write since the last FLUSH).
    pub flushes_skipped: u64,
}

#[derive(Debug, Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    rmw: AtomicU64,
    flushes: AtomicU64,
    skipped: AtomicU64,
}

/// One queue and what a call needs with it.
#[derive(Debug)]
struct Worker {
    q: Queue,
    done: Vec<Done>,
    /// The covering blocks of an unaligned access.
    scratch: Vec<u8>,
    /// Tags this call's operations, so completions of an earlier call that timed out are
    /// recognized and dropped.
    call: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl VolumeFile {
    /// Opens `queues` further queue pairs of `vol`'s session (at least one) and serves the
    /// volume through them.
    pub fn new(vol: Volume, queues: u32) -> Result<VolumeFile> {
        let bs = vol.block_size();
        let op = (OP_SIZE.min(vol.max_io()) / bs).max(1) * bs;
        let pool = (0..queues.max(1))
            .map(|_| {
                let q = vol.queue_with(DEPTH, op as usize)?;
                let done = std::iter::repeat_with(Done::default).take(DEPTH as usize).collect();
                Ok(Worker { q, done, scratch: Vec::new(), call: 0 })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(VolumeFile {
            size: vol.size(),
            block_size: bs,
            read_only: vol.is_read_only(),
            volatile: vol.is_volatile(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            queues: pool.len(),
            addr: vol.addr(),
            vol: Mutex::new(Some(vol)),
            pool: Mutex::new(pool),
            returned: Condvar::new(),
            locks: RangeLocks::default(),
            written: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
            stats: Counters::default(),
        })
    }

    /// Sets how long one call may wait for its operations (default
    /// [`DEFAULT_IO_TIMEOUT`](crate::DEFAULT_IO_TIMEOUT)).
    pub fn with_io_timeout(mut self, timeout: Duration) -> VolumeFile {
        self.io_timeout = timeout;
        self
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The volume's block size: accesses aligned to it need no read-modify-write.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Whether the volume lives in RAM only (a FLUSH then only orders).
    pub fn is_volatile(&self) -> bool {
        self.volatile
    }

    /// Queues in the pool.
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// Counters.
    pub fn stats(&self) -> FileStats {
        let s = &self.stats;
        FileStats {
            reads: s.reads.load(Ordering::Relaxed),
            writes: s.writes.load(Ordering::Relaxed),
            read_modify_writes: s.rmw.load(Ordering::Relaxed),
            flushes: s.flushes.load(Ordering::Relaxed),
            flushes_skipped: s.skipped.load(Ordering::Relaxed),
        }
    }

    /// Reads up to `len` bytes at `offset` and hands them to `f` (fewer at the end of the
    /// volume, none at or past it). Returns what `f` returns.
    pub fn read_with<T>(&self, offset: u64, len: usize, f: impl FnOnce(&[u8]) -> T) -> Result<T> {
        let len = clamp(self.size, offset, len);
        if len == 0 {
            return Ok(f(&[]));
        }
        self.stats.reads.fetch_add(1, Ordering::Relaxed);
        let (start, end) = self.cover(offset, len);
        let mut w = self.borrow();
        let mut scratch = std::mem::take(&mut w.scratch);
        scratch.resize((end - start) as usize, 0);
        let read = w.read_blocks(start, &mut scratch, self.io_timeout);
        let from = (offset - start) as usize;
        let out = read.map(|()| f(&scratch[from..from + len]));
        w.scratch = scratch;
        out
    }

    /// Reads into `buf` at `offset`; returns the bytes read (fewer at the end of the volume).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        self.read_with(offset, buf.len(), |data| {
            buf[..data.len()].copy_from_slice(data);
            data.len()
        })
    }

    /// Writes `data` at `offset`; returns the bytes written, fewer when the volume ends first.
    /// A write starting at or past the end is refused ([`InvalidReason::OutOfRange`]).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<usize> {
        if self.read_only {
            let reason = InvalidReason::ReadOnly;
            return Err(Error::Invalid { what: "write", offset, len: data.len() as u64, reason });
        }
        if data.is_empty() {
            return Ok(0);
        }
        let len = clamp(self.size, offset, data.len());
        if len == 0 {
            let reason = InvalidReason::OutOfRange { size: self.size };
            return Err(Error::Invalid { what: "write", offset, len: data.len() as u64, reason });
        }
        let data = &data[..len];
        self.stats.writes.fetch_add(1, Ordering::Relaxed);
        let (start, end) = self.cover(offset, len);
        let _range = self.locks.lock(start, end);
        let mut w = self.borrow();
        let result = if start == offset && end == offset + len as u64 {
            w.write_blocks(start, data, self.io_timeout)
        } else {
            self.stats.rmw.fetch_add(1, Ordering::Relaxed);
            w.read_modify_write(start, end, offset, data, self.block_size, self.io_timeout)
        };
        // Counted even when some operations failed: those that completed are recorded as dirty.
        self.written.fetch_add(1, Ordering::SeqCst);
        result.map(|()| len)
    }

    /// Makes every write that returned before this call durable: a FLUSH of the ranges written
    /// since the last one (nothing is sent when there were no writes). Returns whether the
    /// volume is volatile.
    pub fn flush(&self) -> Result<bool> {
        let written = self.written.load(Ordering::SeqCst);
        if written == self.flushed.load(Ordering::SeqCst) {
            self.stats.skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(self.volatile);
        }
        let mut vol = lock(&self.vol);
        let vol = vol.as_mut().ok_or_else(|| self.closed())?;
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        let volatile = vol.flush()?;
        self.flushed.fetch_max(written, Ordering::SeqCst);
        Ok(volatile)
    }

    /// Housekeeping, every couple of seconds while the file is served: a KEEPALIVE on the
    /// volume's queue pair, and the control messages (the target's keepalives) of idle queues.
    pub fn tick(&self) -> Result<()> {
        if let Ok(mut pool) = self.pool.try_lock() {
            for w in pool.iter_mut() {
                w.q.reap(&mut []);
            }
        }
        let mut vol = lock(&self.vol);
        vol.as_mut().ok_or_else(|| self.closed())?.keepalive()
    }

    /// Flushes what was written since the last flush, closes the queues, then the session
    /// (CLOSE). Returns whether the volume is volatile.
    pub fn close(self) -> Result<bool> {
        let flushed = self.flush();
        // Queues go first: CLOSE revokes the session's access to the volume.
        lock(&self.pool).clear();
        let vol = lock(&self.vol).take();
        let closed = vol.map_or(Ok(()), Volume::close);
        let volatile = flushed?;
        closed?;
        Ok(volatile)
    }

    /// The block-aligned range covering `len` bytes at `offset` (inside the volume).
    fn cover(&self, offset: u64, len: usize) -> (u64, u64) {
        let bs = u64::from(self.block_size);
        let start = offset / bs * bs;
        // The volume's size is a multiple of the block size, so this stays inside it.
        let end = (offset + len as u64).div_ceil(bs) * bs;
        (start, end)
    }

    fn closed(&self) -> Error {
        Error::ConnectionLost { addr: self.addr, reason: "the session is closed".into() }
    }

    fn borrow(&self) -> Borrowed<'_> {
        let mut pool = lock(&self.pool);
        loop {
            if let Some(w) = pool.pop() {
                return Borrowed { file: self, worker: Some(w) };
            }
            pool = self.returned.wait(pool).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Bytes of an access of `len` at `offset` that lie inside a volume of `size` bytes.
fn clamp(size: u64, offset: u64, len: usize) -> usize {
    if offset >= size {
        return 0;
    }
    len.min(usize::try_from(size - offset).unwrap_or(usize::MAX))
}

/// A worker borrowed from the pool; goes back on drop.
struct Borrowed<'a> {
    file: &'a VolumeFile,
    worker: Option<Worker>,
}

impl std::ops::Deref for Borrowed<'_> {
    type Target = Worker;
    fn deref(&self) -> &Worker {
        self.worker.as_ref().expect("borrowed worker")
    }
}

impl std::ops::DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut Worker {
        self.worker.as_mut().expect("borrowed worker")
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            lock(&self.file.pool).push(w);
            self.file.returned.notify_one();
        }
    }
}

impl Worker {
    /// Reads the block-aligned range at `offset` into `out`.
    fn read_blocks(&mut self, offset: u64, out: &mut [u8], timeout: Duration) -> Result<()> {
        let max = self.q.max_len() as usize;
        let total = out.len();
        let chunks = total.div_ceil(max);
        self.pump(
            chunks,
            timeout,
            |q, i, tag| {
                let len = max.min(total - i * max) as u32;
                q.submit_read(offset + (i * max) as u64, len, tag)
            },
            |i, d| {
                let at = i * max;
                let len = max.min(out.len() - at);
                d.read_data(&mut out[at..at + len])
            },
        )
    }

    /// Writes the block-aligned `data` at `offset`.
    fn write_blocks(&mut self, offset: u64, data: &[u8], timeout: Duration) -> Result<()> {
        let max = self.q.max_len() as usize;
        let chunks = data.len().div_ceil(max);
        self.pump(
            chunks,
            timeout,
            |q, i, tag| {
                let at = i * max;
                let len = max.min(data.len() - at);
                q.submit_write(offset + at as u64, &data[at..at + len], tag)
            },
            |_, _| Ok(()),
        )
    }

    /// Writes `data` at `offset` inside the covering blocks `start..end`: reads the partial first
    /// and last blocks, patches `data` in, writes the whole range.
    fn read_modify_write(
        &mut self,
        start: u64,
        end: u64,
        offset: u64,
        data: &[u8],
        block_size: u32,
        timeout: Duration,
    ) -> Result<()> {
        let bs = u64::from(block_size);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.resize((end - start) as usize, 0);
        let mut edges: Vec<u64> = Vec::with_capacity(2);
        if offset != start {
            edges.push(start);
        }
        let last = end - bs;
        if offset + data.len() as u64 != end && edges.last() != Some(&last) {
            edges.push(last);
        }
        let read = {
            let scratch = &mut scratch;
            let edges = &edges;
            self.pump(
                edges.len(),
                timeout,
                |q, i, tag| q.submit_read(edges[i], block_size, tag),
                |i, d| {
                    let at = (edges[i] - start) as usize;
                    d.read_data(&mut scratch[at..at + block_size as usize])
                },
            )
        };
        let result = read.and_then(|()| {
            let at = (offset - start) as usize;
            scratch[at..at + data.len()].copy_from_slice(data);
            self.write_blocks(start, &scratch, timeout)
        });
        self.scratch = scratch;
        result
    }

    /// Runs `chunks` operations through the queue, at most its depth in flight: `submit(q, i,
    /// tag)` posts operation `i`, `complete(i, done)` takes its successful result. Waits for
    /// every posted operation, even after an error, so the queue is idle again on return
    /// (unless the wait itself times out). Returns the first error.
    fn pump(
        &mut self,
        chunks: usize,
        timeout: Duration,
        mut submit: impl FnMut(&mut Queue, usize, u64) -> Result<()>,
        mut complete: impl FnMut(usize, &Done) -> Result<()>,
    ) -> Result<()> {
        self.call = (self.call + 1) & 0xFFFF_FFFF;
        let call = self.call;
        let deadline = Instant::now() + timeout;
        let (mut next, mut pending) = (0usize, 0usize);
        let mut first_err = None;
        loop {
            while first_err.is_none() && next < chunks && self.q.outstanding() < self.q.depth() {
                match submit(&mut self.q, next, (call << 32) | next as u64) {
                    Ok(()) => {
                        pending += 1;
                        next += 1;
                    }
                    Err(e) => first_err = Some(e),
                }
            }
            if pending == 0 {
                break;
            }
            let n = self.q.wait(&mut self.done, deadline)?;
            if n == 0 {
                // Nothing outstanding although we count some: never expected; do not spin.
                let reason = InvalidReason::NoData;
                first_err.get_or_insert(Error::Invalid { what: "queue completion", offset: 0, len: 0, reason });
                break;
            }
            for d in &mut self.done[..n] {
                if d.user_data >> 32 != call {
                    d.release(); // an earlier, timed-out call's
                    continue;
                }
                pending -= 1;
                let index = (d.user_data & 0xFFFF_FFFF) as usize;
                match std::mem::replace(&mut d.result, Ok(())) {
                    Ok(()) => {
                        if let Err(e) = complete(index, d) {
                            first_err.get_or_insert(e);
                        }
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
                d.release();
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Byte ranges being written; a writer waits while its range overlaps one.
#[derive(Debug, Default)]
struct RangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
    released: Condvar,
}

impl RangeLocks {
    fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        let mut held = lock(&self.held);
        while held.iter().any(|&(s, e)| s < end && start < e) {
            held = self.released.wait(held).unwrap_or_else(PoisonError::into_inner);
        }
        held.push((start, end));
        RangeGuard { locks: self, range: (start, end) }
    }
}

struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = lock(&self.locks.held);
        if let Some(i) = held.iter().position(|&r| r == self.range) {
            held.swap_remove(i);
        }
        self.locks.released.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn clamps_at_the_end() {
        assert_eq!(clamp(8192, 0, 100), 100);
        assert_eq!(clamp(8192, 8100, 100), 92);
        assert_eq!(clamp(8192, 8192, 100), 0);
        assert_eq!(clamp(8192, u64::MAX, 100), 0);
    }

    #[test]
    fn range_locks_exclude_overlaps_only() {
        let locks = Arc::new(RangeLocks::default());
        let a = locks.lock(0, 8192);
        let b = locks.lock(8192, 16384); // adjacent: no overlap
        let (tx, rx) = std::sync::mpsc::channel();
        let t = {
            let locks = Arc::clone(&locks);
            std::thread::spawn(move || {
                let _c = locks.lock(4096, 12288);
                tx.send(()).unwrap();
            })
        };
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "overlapping lock granted");
        drop(a);
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err(), "still overlaps the second");
        drop(b);
        rx.recv_timeout(Duration::from_secs(5)).expect("granted once both are released");
        t.join().unwrap();
    }
}
