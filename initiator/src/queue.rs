//! A further queue pair of a session, for asynchronous I/O: submit, then reap or wait.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rblk_fabric::channel;
use rblk_fabric::policy::POLL_BATCH;
use rblk_fabric::{Access, Completion, Endpoint, Local, Memory, Mr, Op, Pd, WcStatus, WorkRequest};
use rblk_proto::{ConnectData, Message, Opcode};

use crate::buffer::{Buffer, BufferPool};
use crate::conn::{self, Conn, Reply};
use crate::dirty;
use crate::{Direction, Error, Geometry, InvalidReason, Result};

/// Submissions posted with one doorbell.
const BATCH: usize = 16;

/// The longest a low-depth wait spins before sleeping.
pub const MAX_ADAPTIVE_SPIN: Duration = Duration::from_millis(1);

/// The deepest queue: bounds the memory pinned by its pool and the send queue asked of the NIC.
pub const MAX_DEPTH: u32 = 1024;

/// A work request slot for filling in.
const NO_WR: WorkRequest<'static> = WorkRequest { wr_id: 0, op: Op::Send, local: Local::Inline(&[]), signaled: false };

/// A finished queue operation, filled in by [`Queue::reap`] and [`Queue::wait`].
///
/// A read's data sits in the registered buffer the Done holds: copy it out with
/// [`read_data`](Self::read_data). That buffer returns to the queue's pool when the Done is
/// dropped, overwritten by the next reap, or [`release`](Self::release)d; until then the pool has
/// one buffer less.
#[derive(Debug)]
pub struct Done {
    /// The caller's value from the submission.
    pub user_data: u64,
    /// Success, or why the operation failed.
    pub result: Result<()>,
    /// Read or write.
    pub dir: Direction,
    /// Volume offset.
    pub offset: u64,
    /// Bytes.
    pub len: u32,
    buffer: Option<Buffer>,
}

impl Default for Done {
    fn default() -> Self {
        Done { user_data: 0, result: Ok(()), dir: Direction::Read, offset: 0, len: 0, buffer: None }
    }
}

impl Done {
    /// Whether the operation succeeded.
    pub fn is_ok(&self) -> bool {
        self.result.is_ok()
    }

    /// Copies the first `dst.len()` bytes a successful read brought in into `dst`.
    pub fn read_data(&self, dst: &mut [u8]) -> Result<()> {
        match &self.buffer {
            Some(buf) if self.dir == Direction::Read && self.result.is_ok() && dst.len() <= self.len as usize => {
                buf.read_at(0, dst)
            }
            _ => Err(Error::Invalid {
                what: "read data",
                offset: self.offset,
                len: dst.len() as u64,
                reason: InvalidReason::NoData,
            }),
        }
    }

    /// The buffer the operation used, when the caller gets it back: a read's, or the caller's
    /// own for the `_buf` submissions.
    pub fn buffer(&self) -> Option<&Buffer> {
        self.buffer.as_ref()
    }

    /// Takes the buffer, to reuse it for another `_buf` submission.
    pub fn take_buffer(&mut self) -> Option<Buffer> {
        self.buffer.take()
    }

    /// Returns the buffer to the pool now.
    pub fn release(&mut self) {
        self.buffer = None;
    }
}

#[derive(Debug)]
struct Slot {
    user_data: u64,
    dir: Direction,
    offset: u64,
    len: u32,
    /// None: a write of zeroes from the queue's zeroed registration.
    buffer: Option<Buffer>,
    /// Hand the buffer back in the Done (reads, and caller-provided buffers).
    give_back: bool,
    /// Set when the operation failed before it reached the NIC.
    failed: Option<Error>,
}

/// One queue pair of a session that JOINed it, with a pool of registered buffers.
///
/// Submissions are staged and posted with one doorbell at the next [`reap`](Self::reap),
/// [`wait`](Self::wait) or [`commit`](Self::commit) (or once 16 of them are staged).
/// At most `depth` operations are outstanding (submitted and not yet reaped): one more is
/// [`Error::QueueFull`]. Every access is checked before it is staged.
///
/// A queue is owned by one thread, which submits and reaps: there are no hidden threads. It may
/// be moved to another thread. Writes are in target memory once reaped;
/// [`Volume::flush`](crate::Volume::flush) after reaping them makes them durable. Dropping the queue disconnects
/// its QP; the session and its other queues carry on.
#[derive(Debug)]
pub struct Queue {
    // Declaration order is drop order: the QP goes before the buffers it may still point at.
    conn: Conn,
    slots: Vec<Option<Slot>>,
    pool: BufferPool,
    free_slots: Vec<u32>,
    staged: Vec<u32>,
    failed: Vec<u32>,
    in_flight: u32,
    depth: u32,
    geo: Geometry,
    remote_addr: u64,
    rkey: u32,
    max_len: u64,
    dirty: dirty::Shared,
    /// A registered, zeroed region of `max_len` bytes for writes of zeroes (made at the first).
    zeros: Option<Mr>,
    /// Average time a low-depth wait took to see a completion, in ns (0: none yet).
    wait_ns: u64,
}

impl Queue {
    /// Joins `vol`'s session with a further QP.
    pub(crate) fn connect(vol: &crate::Volume, depth: u32, buf_size: usize) -> Result<Queue> {
        let parts = vol.queue_parts();
        let (dest, pd, opts, geo, opened) = (parts.dest, &parts.pd, parts.opts, parts.geo, parts.opened);
        let dirty = std::sync::Arc::clone(parts.dirty);
        let bad = |what, len: u64, reason| Err(Error::Invalid { what, offset: 0, len, reason });
        match depth {
            0 => return bad("queue depth", 0, InvalidReason::ZeroLength),
            d if d > MAX_DEPTH => {
                return bad("queue depth", d.into(), InvalidReason::TooLarge { max: MAX_DEPTH.into() })
            }
            _ => {}
        }
        let size = buf_size as u64;
        if size == 0 {
            return bad("queue buffer size", 0, InvalidReason::ZeroLength);
        }
        if size % u64::from(geo.block_size) != 0 {
            return bad("queue buffer size", size, InvalidReason::LengthUnaligned { block_size: geo.block_size });
        }
        if size > u64::from(geo.max_io) {
            return bad("queue buffer size", size, InvalidReason::TooLarge { max: geo.max_io.into() });
        }

        let deadline = Instant::now() + opts.timeout;
        let join = ConnectData::Join { session_id: opened.session_id, token: opened.token };
        let mut conn = Conn::connect(dest, Some(pd), &conn::qp_config(depth), join, deadline)?;
        let msg = Message::Join { session_id: opened.session_id, token: opened.token };
        conn.expect(&msg, deadline, "OK(JOIN)", |r| matches!(r, Reply::Ok(Opcode::Join)).then_some(()))?;
        let pool = BufferPool::new(pd, depth as usize, buf_size).map_err(|source| Error::Fabric {
            op: "registering the queue's buffer pool",
            addr: dest.addr,
            source,
        })?;
        tracing::debug!(addr = %dest.addr, qpn = conn.ep.qp_num(), depth, buf_size, "queue joined");
        Ok(Queue {
            conn,
            slots: (0..depth).map(|_| None).collect(),
            pool,
            free_slots: (0..depth).rev().collect(),
            staged: Vec::with_capacity(depth as usize),
            failed: Vec::with_capacity(depth as usize),
            in_flight: 0,
            depth,
            geo,
            remote_addr: opened.remote_addr,
            rkey: opened.rkey,
            max_len: size,
            dirty,
            zeros: None,
            wait_ns: 0,
        })
    }

    /// Operations allowed outstanding.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Operations submitted and not yet reaped.
    pub fn outstanding(&self) -> u32 {
        self.depth - self.free_slots.len() as u32
    }

    /// The queue's buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The volume's geometry, for access checks.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The largest single operation: the volume's largest I/O, or the pool's buffer size if
    /// smaller.
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// Checks one queue operation: not empty, block-aligned, at most [`max_len`](Self::max_len),
    /// inside the volume, no write when read-only.
    pub fn check_range(&self, dir: Direction, offset: u64, len: u64) -> Result<()> {
        self.geo.check(dir, offset, len, Some(self.max_len))?;
        dirty::check_writable(&self.dirty, dir, offset, len)
    }

    /// A buffer from the pool for the zero-copy submissions; fill it with
    /// [`Buffer::write_at`].
    pub fn alloc_buffer(&self) -> Result<Buffer> {
        self.pool.get()
    }

    /// The session's protection domain.
    pub fn pd(&self) -> Pd {
        self.conn.ep.pd()
    }

    /// The queue's endpoint, for tests that post raw work requests (with wr_ids of their own
    /// above `u32::MAX`, which reap ignores). A bad raw access puts both ends' QPs into error.
    pub fn endpoint_mut(&mut self) -> &mut Endpoint {
        &mut self.conn.ep
    }

    /// Reads `len` bytes at `offset` into a pool buffer; the [`Done`] holds it.
    pub fn submit_read(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(Direction::Read, offset, len.into())?;
        let slot = self.slot()?;
        let buffer = self.take_pool_buffer(slot)?;
        let buffer = Some(buffer);
        self.stage(slot, Slot { user_data, dir: Direction::Read, offset, len, buffer, give_back: true, failed: None });
        Ok(())
    }

    /// Writes a copy of `data` at `offset`, through a pool buffer.
    pub fn submit_write(&mut self, offset: u64, data: &[u8], user_data: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(Direction::Write, offset, data.len() as u64)?;
        let slot = self.slot()?;
        let buffer = self.take_pool_buffer(slot)?;
        buffer.write_at(0, data)?;
        let len = data.len() as u32;
        let buffer = Some(buffer);
        self.stage(
            slot,
            Slot { user_data, dir: Direction::Write, offset, len, buffer, give_back: false, failed: None },
        );
        Ok(())
    }

    /// Reads `len` bytes at `offset` into `buffer` (from [`alloc_buffer`](Self::alloc_buffer)),
    /// which the [`Done`] hands back. On an error the buffer returns to the pool.
    pub fn submit_read_buf(&mut self, offset: u64, len: u32, buffer: Buffer, user_data: u64) -> Result<()> {
        self.submit_buf(Direction::Read, offset, len, buffer, user_data)
    }

    /// Writes the first `len` bytes of `buffer` at `offset`, without a copy; the [`Done`] hands
    /// the buffer back. On an error the buffer returns to the pool.
    pub fn submit_write_buf(&mut self, offset: u64, len: u32, buffer: Buffer, user_data: u64) -> Result<()> {
        self.submit_buf(Direction::Write, offset, len, buffer, user_data)
    }

    fn submit_buf(&mut self, dir: Direction, offset: u64, len: u32, buffer: Buffer, user_data: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(dir, offset, len.into())?;
        if !self.pool.owns(&buffer) {
            let what = "buffer";
            return Err(Error::Invalid { what, offset, len: len.into(), reason: InvalidReason::ForeignBuffer });
        }
        let slot = self.slot()?;
        let buffer = Some(buffer);
        self.stage(slot, Slot { user_data, dir, offset, len, buffer, give_back: true, failed: None });
        Ok(())
    }

    /// Writes `len` zero bytes at `offset` from a zeroed registration of the queue's (made at
    /// the first call): no buffer of the pool is used and nothing is copied.
    pub fn submit_zeroes(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(Direction::Write, offset, len.into())?;
        if self.zeros.is_none() {
            let addr = self.conn.addr;
            let err = |source| Error::Fabric { op: "registering the queue's zeroed region", addr, source };
            let memory = Memory::anonymous(self.max_len as usize).map_err(err)?;
            self.zeros = Some(self.conn.ep.pd().register(&memory, Access::LOCAL).map_err(err)?);
        }
        let slot = self.slot()?;
        let dir = Direction::Write;
        self.stage(slot, Slot { user_data, dir, offset, len, buffer: None, give_back: false, failed: None });
        Ok(())
    }

    /// The descriptor of the queue's completion channel, for a caller's own event loop (io_uring
    /// POLL_ADD, epoll) instead of [`wait`](Self::wait): readable once a completion arrives after
    /// [`arm`](Self::arm). [`reap`](Self::reap) then takes the completions.
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.conn.ep.event_fd()
    }

    /// Asks for an event at the next completion. Reap once more after arming, before waiting
    /// for [`event_fd`](Self::event_fd): a completion that arrived before the arm raises none.
    pub fn arm(&mut self) -> Result<()> {
        let addr = self.conn.addr;
        self.conn.ep.arm_events().map_err(|source| Error::Fabric { op: "arming the completion queue", addr, source })
    }

    /// Operations posted and not yet completed.
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// The queue pair's number.
    pub fn qp_num(&self) -> u32 {
        self.conn.ep.qp_num()
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.conn.addr
    }

    pub(crate) fn shared(&self) -> &dirty::Shared {
        &self.dirty
    }

    fn slot(&mut self) -> Result<u32> {
        self.free_slots.pop().ok_or(Error::QueueFull { depth: self.depth })
    }

    fn take_pool_buffer(&mut self, slot: u32) -> Result<Buffer> {
        self.pool.get().inspect_err(|_| self.free_slots.push(slot))
    }

    fn stage(&mut self, index: u32, slot: Slot) {
        self.slots[index as usize] = Some(slot);
        self.staged.push(index);
        if self.staged.len() >= BATCH {
            self.commit();
        }
    }

    /// Posts every staged submission, with one doorbell per 16. A failure to post fails
    /// those operations (their [`Done`]s report it) and the queue.
    pub fn commit(&mut self) {
        let Queue { conn, slots, staged, failed, in_flight, remote_addr, rkey, zeros, .. } = self;
        for chunk in staged.chunks(BATCH) {
            if let Err(e) = conn.alive() {
                fail_all(slots, failed, chunk, conn.addr, &e.to_string());
                continue;
            }
            let mut wrs = [NO_WR; BATCH];
            for (wr, &index) in wrs.iter_mut().zip(chunk) {
                let Some(slot) = &slots[index as usize] else { continue };
                let (mr, base) = match (&slot.buffer, zeros.as_ref()) {
                    (Some(b), _) => b.region(),
                    (None, Some(z)) => (z, 0),
                    // submit_zeroes registers the region before it stages.
                    (None, None) => continue,
                };
                // The range was checked against the volume when staged.
                let remote_addr = *remote_addr + slot.offset;
                let op = match slot.dir {
                    Direction::Read => Op::Read { remote_addr, rkey: *rkey },
                    Direction::Write => Op::Write { remote_addr, rkey: *rkey },
                };
                let local = Local::Region { mr, offset: base, len: slot.len };
                *wr = WorkRequest { wr_id: index.into(), op, local, signaled: true };
            }
            match conn.ep.post(&wrs[..chunk.len()]) {
                Ok(()) => *in_flight += chunk.len() as u32,
                Err(source) => {
                    let reason = format!("posting RDMA work requests failed: {source}");
                    conn.break_with(reason.clone());
                    fail_all(slots, failed, chunk, conn.addr, &reason);
                }
            }
        }
        staged.clear();
    }

    /// Posts what is staged, then fills `done` with finished operations without waiting.
    /// Returns how many it filled.
    pub fn reap(&mut self, done: &mut [Done]) -> usize {
        self.commit();
        let mut k = self.take_failed(done);
        while k < done.len() && self.in_flight > 0 {
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            let want = (done.len() - k).min(POLL_BATCH);
            let n = match self.conn.ep.poll(&mut wcs[..want]) {
                Ok(n) => n,
                Err(source) => {
                    self.poll_failed(source);
                    return k + self.take_failed(&mut done[k..]);
                }
            };
            self.process(&wcs[..n], done, &mut k);
            if n < want {
                break;
            }
        }
        // Completions of control messages alone (keepalives) still need taking when idle.
        if self.in_flight == 0 {
            self.drain_control();
        }
        k
    }

    /// Like [`reap`](Self::reap), but waits (spinning briefly, then sleeping) until at least one
    /// operation finished. Returns 0 at once when nothing is outstanding, and
    /// [`Error::Timeout`] if `deadline` passes first (the operations stay outstanding).
    pub fn wait(&mut self, done: &mut [Done], deadline: Instant) -> Result<usize> {
        let started = Instant::now();
        let mut k = self.reap(done);
        let low_depth = self.in_flight <= 2;
        let spin = self.spin(low_depth);
        let mut slept = false;
        while k == 0 && self.in_flight > 0 && !done.is_empty() {
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            let want = done.len().min(POLL_BATCH);
            slept = true;
            let n = match self.conn.ep.wait(&mut wcs[..want], spin, deadline) {
                Ok(n) => n,
                Err(source) => {
                    self.poll_failed(source);
                    return Ok(self.take_failed(done));
                }
            };
            self.process(&wcs[..n], done, &mut k);
            if k == 0 && n == 0 && Instant::now() >= deadline {
                let op = "waiting for queue completions";
                return Err(Error::Timeout { op, addr: self.conn.addr, after: started.elapsed() });
            }
        }
        if low_depth && slept && k > 0 {
            // Moving average (1/8) of how long a low-depth wait takes to see its completion.
            let t = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.wait_ns = if self.wait_ns == 0 { t } else { self.wait_ns - self.wait_ns / 8 + t / 8 };
        }
        Ok(k)
    }

    /// How long to spin before sleeping on the completion channel. At depth 1-2 a sleep costs a
    /// wakeup per I/O, so spin for twice the usual wait (at most [`MAX_ADAPTIVE_SPIN`], at least
    /// [`Options::spin`](crate::Options::spin)); deeper queues always have completions coming and
    /// use `Options::spin`, leaving the CPU to others.
    fn spin(&self, low_depth: bool) -> Duration {
        let base = self.conn.spin;
        if !low_depth {
            return base;
        }
        base.max(Duration::from_nanos(self.wait_ns.saturating_mul(2)).min(MAX_ADAPTIVE_SPIN))
    }

    fn process(&mut self, wcs: &[Completion], done: &mut [Done], k: &mut usize) {
        for c in wcs {
            if channel::is_control(c.wr_id) {
                // A failure breaks the connection; the data completions then report it.
                let _ = self.conn.on_control_completion(c);
                continue;
            }
            // Only slots in flight: not raw work requests, nor operations already failed.
            let in_flight = usize::try_from(c.wr_id)
                .ok()
                .and_then(|i| self.slots.get_mut(i))
                .filter(|s| s.as_ref().is_some_and(|s| s.failed.is_none()))
                .and_then(Option::take);
            let Some(slot) = in_flight else {
                tracing::debug!(wr_id = c.wr_id, "completion of a raw work request ignored");
                continue;
            };
            self.in_flight -= 1;
            self.free_slots.push(c.wr_id as u32);
            let result = if c.status.is_success() {
                if slot.dir == Direction::Write {
                    // Completed, so the next FLUSH of the volume covers it.
                    dirty::record(&self.dirty, slot.offset, slot.len.into());
                }
                Ok(())
            } else if c.status == WcStatus::WR_FLUSH_ERR && self.conn.is_broken() {
                self.conn.alive()
            } else {
                let e = Error::completion(slot.dir, slot.offset, slot.len.into(), c);
                self.conn.break_with(e.to_string());
                Err(e)
            };
            // `k` < done.len(): callers poll at most as many completions as there is room.
            done[*k] = finish(slot, result);
            *k += 1;
        }
    }

    /// Drains completions of the control channel while no data is in flight.
    fn drain_control(&mut self) {
        let mut wcs = [Completion::EMPTY; POLL_BATCH];
        while let Ok(n) = self.conn.ep.poll(&mut wcs) {
            for c in &wcs[..n] {
                if channel::is_control(c.wr_id) {
                    let _ = self.conn.on_control_completion(c);
                }
            }
            if n < wcs.len() {
                break;
            }
        }
    }

    /// Polling itself failed: the QP is moved to error (so the NIC lets go of every buffer) and
    /// every operation in flight fails.
    fn poll_failed(&mut self, source: rblk_fabric::Error) {
        let reason = format!("polling completions failed: {source}");
        self.conn.break_with(reason.clone());
        let in_flight: Vec<u32> =
            (0..self.depth).filter(|i| self.slots[*i as usize].as_ref().is_some_and(|s| s.failed.is_none())).collect();
        fail_all(&mut self.slots, &mut self.failed, &in_flight, self.conn.addr, &reason);
        self.in_flight = 0;
    }

    fn take_failed(&mut self, done: &mut [Done]) -> usize {
        let n = self.failed.len().min(done.len());
        for (d, index) in done.iter_mut().zip(self.failed.drain(..n)) {
            if let Some(mut slot) = self.slots[index as usize].take() {
                let result = slot.failed.take().map_or(Ok(()), Err);
                *d = finish(slot, result);
                self.free_slots.push(index);
            }
        }
        n
    }
}

fn finish(slot: Slot, result: Result<()>) -> Done {
    let Slot { user_data, dir, offset, len, buffer, give_back, .. } = slot;
    Done { user_data, result, dir, offset, len, buffer: buffer.filter(|_| give_back) }
}

/// Marks the operations in `indexes` failed (the connection is lost), for reaping.
fn fail_all(slots: &mut [Option<Slot>], failed: &mut Vec<u32>, indexes: &[u32], addr: SocketAddr, reason: &str) {
    for &index in indexes {
        if let Some(slot) = slots[index as usize].as_mut() {
            slot.failed = Some(Error::ConnectionLost { addr, reason: reason.to_owned() });
            failed.push(index);
        }
    }
}
