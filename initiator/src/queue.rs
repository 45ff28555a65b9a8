//! A further queue pair of a session, for asynchronous I/O: submit, then reap or wait.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rblk_fabric::policy::POLL_BATCH;
use rblk_fabric::{channel, Chain};
use rblk_fabric::{Access, Completion, Endpoint, Local, Memory, Mr, Op, Pd, WcStatus, WorkRequest};
use rblk_proto::{
    ConnectData, Message, Opcode, Segments, FEATURE_KEEPALIVE, FEATURE_SESSION_KEEPALIVE, FEATURE_SOLICITED,
};

use crate::buffer::{Buffer, BufferPool};
use crate::conn::{self, Conn, Reply};
use crate::control::Control;
use crate::io_state::Shared;
use crate::link::{Current, Link, Status};
use crate::wait::Waiter;
use crate::{Direction, Error, Geometry, InvalidReason, Result};

/// Submissions posted with one doorbell.
const BATCH: usize = 16;

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

/// Where a queue operation is. Only [`Queue::set_state`] changes it, and with it the ordering
/// list the operation is on (`staged`, `parked`, `failed`) and the in-flight count.
///
/// ```text
///  stage ──> Staged ──commit──> Posted{gen} ──completion──> (handed back, slot freed)
///              │                    │
///              │ session down       │ queue pair lost
///              v                    v
///           Parked <────────────────┘ ──rejoin──> Staged
///              │ fast_io_fail_tmo / gave up       ^
///              v                                  │
///           Failed(error) <── post failed ────────┘ ──next reap──> (handed back, slot freed)
/// ```
#[derive(Debug)]
enum SlotState {
    /// Accepted; posted by the next commit (on `staged`).
    Staged,
    /// On the send queue of the queue pair of session generation `gen`.
    Posted { gen: u64 },
    /// Its queue pair was lost; posted again on the next one (on `parked`).
    Parked,
    /// Failed before or without reaching the NIC; handed back by the next reap (on `failed`).
    Failed(Error),
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
    state: SlotState,
    /// Work requests of it beyond the first: one more per segment boundary it crosses (see
    /// [`Queue::post_staged`]); set when posted.
    split: u8,
    /// Its work requests whose completion has not come yet, while posted.
    parts: u8,
}

/// Work requests a queue may have on its send queue beyond one per operation: the parts of
/// operations that cross a segment boundary of a volume that grew ([`rblk_proto::Segments`]).
/// An operation that would need more waits for others to complete.
pub(crate) const SPLIT_SLACK: u32 = 16;

/// One queue pair of a session that JOINed it, with a pool of registered buffers.
///
/// When the session loses its target, the operations in flight are not failed: they are
/// parked, and posted again on a new queue pair once the session has reconnected (see
/// [`Reconnect`](crate::Reconnect)). Until then [`wait`](Self::wait) waits for the session and
/// new submissions are parked too. They fail only after `fast_io_fail_tmo` or when the session
/// gives up.
#[derive(Debug)]
pub struct Queue {
    // Declaration order is drop order: the QP goes before the buffers it may still point at.
    conn: Conn,
    link: Arc<Link>,
    /// The session generation `conn` belongs to.
    gen: u64,
    /// The operations, by wr_id; at most `depth`, so keys stay below it.
    slots: slab::Slab<Slot>,
    pool: BufferPool,
    /// Slots in state Staged, in order.
    staged: Vec<u32>,
    /// Slots in state Failed.
    failed: Vec<u32>,
    /// Slots in state Parked: accepted but not on the wire, their queue pair was lost.
    parked: Vec<u32>,
    /// Slots Posted or Parked.
    in_flight: u32,
    /// Tags of control requests sent on this queue pair and not yet answered.
    awaiting: Vec<u32>,
    /// Their replies, for the caller to take ([`take_reply`](Queue::take_reply)).
    replies: VecDeque<(u32, Result<Reply>)>,
    depth: u32,
    /// As opened; its size is the link's ([`Queue::geometry`]).
    geo: Geometry,
    /// Where each segment of the volume is and this QP's rkey for it (one unless the volume
    /// grew: [`rblk_proto::FEATURE_SEGMENTS`]).
    segs: Segments,
    max_len: u64,
    io: Shared,
    /// A registered, zeroed region of `max_len` bytes for writes of zeroes (made at the first).
    zeros: Option<Mr>,
    /// Spin or sleep in [`wait`](Self::wait): the policy and its history.
    waiter: Waiter,
    /// The connection's last hearing from the target that the link was told of.
    noted_heard: Instant,
}

/// A further queue pair of the session `cur` through the next address of the link's round
/// robin (the others in turn when it fails): connect with the join data, then JOIN. Returns it
/// with the segments it reaches: with its own windows' rkeys (JOINED carries them in a session
/// with memory windows, and every segment with FEATURE_SEGMENTS), or the session's (OPENED's).
fn join(link: &Link, cur: &Current, depth: u32) -> Result<(Conn, Segments)> {
    let (id, token) = (cur.opened.session_id, cur.opened.token);
    let mut first = None;
    for attempt in 0..link.dest_count() {
        let dest = link.dest_for_queue(attempt);
        let deadline = Instant::now() + link.opts().timeout;
        let joined = Conn::connect(
            dest,
            Some(link.pd()),
            &conn::qp_config(depth),
            ConnectData::Join { session_id: id, token },
            deadline,
        )
        .and_then(|mut conn| {
            let msg = Message::Join { session_id: id, token };
            let segs = conn.expect(&msg, deadline, "OK(JOIN)", |r| match r {
                Reply::Ok(Opcode::Join) => Some(cur.opened.all_segments()),
                Reply::Joined(_, Some(segs)) => Some(segs),
                Reply::Joined(rkey, None) => Some(Segments::one(cur.opened.remote_addr, rkey, cur.opened.size)),
                _ => None,
            })?;
            conn.send_keepalives(link.features() & FEATURE_KEEPALIVE != 0);
            conn.solicit(link.features() & FEATURE_SOLICITED != 0);
            // Through the session's first connection's address, it shares that path and its
            // fate; through another, whose path may fail alone, it keeps its own keepalives.
            let session_level = FEATURE_KEEPALIVE | FEATURE_SESSION_KEEPALIVE;
            let shares = link.opts().session_keepalives && dest.addr == link.addr();
            if link.features() & session_level == session_level && shares {
                conn.share_session_liveness();
            }
            Ok((conn, segs))
        });
        match joined {
            Ok(joined) => {
                link.queue_joined();
                return Ok(joined);
            }
            Err(e) => {
                tracing::debug!(addr = %dest.addr, error = %Chain(&e), "joining the session failed");
                first.get_or_insert(e);
            }
        }
    }
    Err(first.expect("a link has at least one address"))
}

impl Queue {
    /// Joins `ctl`'s session with a further QP.
    pub(crate) fn connect(ctl: &Control, depth: u32, buf_size: usize) -> Result<Queue> {
        let (link, geo, dirty) = (Arc::clone(&ctl.link), ctl.geo(), Arc::clone(&ctl.io));
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
        if !size.is_multiple_of(u64::from(geo.block_size)) {
            return bad("queue buffer size", size, InvalidReason::LengthUnaligned { block_size: geo.block_size });
        }
        if size > u64::from(geo.max_io) {
            return bad("queue buffer size", size, InvalidReason::TooLarge { max: geo.max_io.into() });
        }
        let cur = loop {
            match link.status(link.gen()) {
                Status::Up => break link.current(),
                Status::Newer(cur) => break cur,
                Status::Waiting => {
                    // A queue opened while the session reconnects waits for it like I/O does.
                    if let Status::FastFail(e) | Status::Failed(e) =
                        link.wait_change(link.gen(), Instant::now() + link.opts().timeout)
                    {
                        return Err(e);
                    }
                }
                Status::FastFail(e) | Status::Failed(e) => return Err(e),
            }
        };
        let joined = match join(&link, &cur, depth) {
            Ok(joined) => joined,
            // The target no longer knows the session (it reaped it: its first queue pair went
            // silent, say): a reconnecting session gets a new one, and the queue joins that.
            Err(e) if link.reconnects() => {
                link.lost(cur.gen, &format!("joining a queue failed: {}", Chain(&e)));
                match link.wait_change(cur.gen, Instant::now() + link.opts().timeout) {
                    Status::Newer(now) => {
                        let joined = join(&link, &now, depth)?;
                        return Queue::finish_connect(link, geo, dirty, joined, now, depth, buf_size);
                    }
                    Status::FastFail(e) | Status::Failed(e) => return Err(e),
                    Status::Up | Status::Waiting => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        Queue::finish_connect(link, geo, dirty, joined, cur, depth, buf_size)
    }

    fn finish_connect(
        link: Arc<Link>,
        geo: Geometry,
        io: Shared,
        (conn, segs): (Conn, Segments),
        cur: Current,
        depth: u32,
        buf_size: usize,
    ) -> Result<Queue> {
        let size = buf_size as u64;
        let addr = conn.addr;
        let pool = BufferPool::new(link.pd(), depth as usize, buf_size).map_err(|source| Error::Fabric {
            op: "registering the queue's buffer pool",
            addr,
            source,
        })?;
        let waiter = Waiter::new(conn.wait, conn.spin);
        tracing::debug!(%addr, qpn = conn.ep.qp_num(), depth, buf_size, "queue joined");
        Ok(Queue {
            conn,
            link,
            gen: cur.gen,
            slots: slab::Slab::with_capacity(depth as usize),
            pool,
            staged: Vec::with_capacity(depth as usize),
            failed: Vec::with_capacity(depth as usize),
            parked: Vec::with_capacity(depth as usize),
            in_flight: 0,
            awaiting: Vec::new(),
            replies: VecDeque::new(),
            depth,
            geo,
            segs,
            max_len: size,
            io,
            zeros: None,
            waiter,
            noted_heard: Instant::now(),
        })
    }

    /// The session's wait policy ([`Options::wait`](crate::Options::wait)), with no history: for
    /// an event loop that owns this queue and waits for more than its completions.
    pub fn waiter(&self) -> Waiter {
        self.waiter.fresh()
    }

    /// Operations allowed outstanding.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Operations submitted and not yet reaped.
    pub fn outstanding(&self) -> u32 {
        self.slots.len() as u32
    }

    /// The queue's buffer pool.
    pub fn pool(&self) -> &BufferPool {
        &self.pool
    }

    /// The volume's geometry, for access checks: its size as it is now (it may have grown).
    pub fn geometry(&self) -> Geometry {
        Geometry { size: self.link.size(), ..self.geo }
    }

    /// The largest single operation: the volume's largest I/O, or the pool's buffer size if
    /// smaller.
    pub fn max_len(&self) -> u64 {
        self.max_len
    }

    /// Checks one queue operation: not empty, block-aligned, at most [`max_len`](Self::max_len),
    /// inside the volume, no write when read-only.
    pub fn check_range(&self, dir: Direction, offset: u64, len: u64) -> Result<()> {
        self.geometry().check(dir, offset, len, Some(self.max_len))?;
        self.io.check_writable(dir, offset, len)
    }

    /// A buffer from the pool for the zero-copy submissions; fill it with
    /// [`Buffer::write_at`].
    pub fn alloc_buffer(&self) -> Result<Buffer> {
        self.pool.get()
    }

    /// The session's protection domain.
    pub fn pd(&self) -> Pd {
        self.link.pd().clone()
    }

    /// The queue's endpoint, for tests that post raw work requests (with wr_ids of their own
    /// above `u32::MAX`, which reap ignores). A bad raw access puts both ends' QPs into error.
    /// A caller that polls it must hand every completion it polled to
    /// [`raw_polled`](Self::raw_polled).
    pub fn endpoint_mut(&mut self) -> &mut Endpoint {
        &mut self.conn.ep
    }

    /// For callers that poll [`endpoint_mut`](Self::endpoint_mut) themselves: takes the
    /// queue's own control traffic out of `wcs` (the target's keepalives and replies; their
    /// receive buffers are posted again) and keeps the queue's liveness (its keepalives go out
    /// when due). Without it a raw poller drops the control channel's completions, the
    /// receive queue runs dry, and the target cuts the connection after its keepalive timeout.
    pub fn raw_polled(&mut self, wcs: &[Completion]) {
        for c in wcs.iter().filter(|c| channel::is_control(c.wr_id)) {
            self.on_control(c);
        }
        self.check_liveness();
    }

    /// The volume's address and this queue's rkey (with memory windows its own QP's: it works
    /// on [`endpoint_mut`](Self::endpoint_mut) only), for tests that post raw work requests:
    /// those of its first segment (a volume that grew has more: [`segments`](Self::segments)).
    pub fn remote(&self) -> (u64, u32) {
        let first = self.segs.as_slice()[0];
        (first.remote_addr, first.rkey)
    }

    /// Every segment of the volume as this queue reaches it, for tests that post raw work
    /// requests.
    pub fn segments(&self) -> Segments {
        self.segs
    }

    /// Reads `len` bytes at `offset` into a pool buffer; the [`Done`] holds it.
    pub fn submit_read(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.accepting()?;
        self.check_range(Direction::Read, offset, len.into())?;
        self.stage_read(offset, len, user_data)
    }

    /// Writes a copy of `data` at `offset`, through a pool buffer.
    pub fn submit_write(&mut self, offset: u64, data: &[u8], user_data: u64) -> Result<()> {
        self.accepting()?;
        self.check_range(Direction::Write, offset, data.len() as u64)?;
        self.stage_write(offset, data, user_data)
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
        self.accepting()?;
        self.check_range(dir, offset, len.into())?;
        if !self.pool.owns(&buffer) {
            let what = "buffer";
            return Err(Error::Invalid { what, offset, len: len.into(), reason: InvalidReason::ForeignBuffer });
        }
        self.stage_buf(dir, offset, len, buffer, user_data)
    }

    /// Writes `len` zero bytes at `offset` from a zeroed registration of the queue's (made at
    /// the first call): no buffer of the pool is used and nothing is copied.
    pub fn submit_zeroes(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.accepting()?;
        self.check_range(Direction::Write, offset, len.into())?;
        self.stage_zeroes(offset, len, user_data)
    }

    // The engine's entries: it checked range, alignment, length and buffer ownership once, at
    // submission to its lane. What can change since (the session failing fast, the volume
    // failed) is guarded here, at posting.

    /// [`submit_read`](Self::submit_read) of an access the caller checked.
    pub(crate) fn stage_read(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.guard(Direction::Read, offset, len)?;
        let buffer = self.pool.get()?;
        self.stage(Slot::new(user_data, Direction::Read, offset, len, Some(buffer), true));
        Ok(())
    }

    /// [`submit_write`](Self::submit_write) of an access the caller checked.
    pub(crate) fn stage_write(&mut self, offset: u64, data: &[u8], user_data: u64) -> Result<()> {
        let len = data.len() as u32;
        self.guard(Direction::Write, offset, len)?;
        let buffer = self.pool.get()?;
        buffer.write_at(0, data)?;
        self.stage(Slot::new(user_data, Direction::Write, offset, len, Some(buffer), false));
        Ok(())
    }

    /// [`submit_read_buf`](Self::submit_read_buf) or [`submit_write_buf`](Self::submit_write_buf)
    /// of an access and a buffer the caller checked.
    pub(crate) fn stage_buf(
        &mut self,
        dir: Direction,
        offset: u64,
        len: u32,
        buffer: Buffer,
        user_data: u64,
    ) -> Result<()> {
        self.guard(dir, offset, len)?;
        self.stage(Slot::new(user_data, dir, offset, len, Some(buffer), true));
        Ok(())
    }

    /// [`submit_zeroes`](Self::submit_zeroes) of an access the caller checked.
    pub(crate) fn stage_zeroes(&mut self, offset: u64, len: u32, user_data: u64) -> Result<()> {
        self.guard(Direction::Write, offset, len)?;
        if self.zeros.is_none() {
            let addr = self.conn.addr;
            let err = |source| Error::Fabric { op: "registering the queue's zeroed region", addr, source };
            let memory = Memory::anonymous(self.max_len as usize).map_err(err)?;
            self.zeros = Some(self.link.pd().register(&memory, Access::LOCAL).map_err(err)?);
        }
        self.stage(Slot::new(user_data, Direction::Write, offset, len, None, false));
        Ok(())
    }

    /// What may have changed since a checked access was submitted: the session (failing fast,
    /// gone), the volume (failed: writes refused), room on the queue.
    fn guard(&mut self, dir: Direction, offset: u64, len: u32) -> Result<()> {
        self.accepting()?;
        self.io.check_writable(dir, offset, len.into())?;
        if self.slots.len() as u32 >= self.depth {
            return Err(Error::QueueFull { depth: self.depth });
        }
        Ok(())
    }

    /// Slots free for submissions.
    pub fn free_slots(&self) -> u32 {
        self.depth - self.slots.len() as u32
    }

    /// Sends a control request on this queue pair without waiting: its tag, or `None` when it
    /// cannot go out now (every send buffer in flight, or the session reconnecting: try again
    /// later; after a reconnect, the [`generation`](Self::generation) changes and requests sent
    /// before are lost). The reply comes back through [`take_reply`](Self::take_reply).
    pub(crate) fn post_control(&mut self, msg: &rblk_proto::Message<'_>) -> Result<Option<u32>> {
        if self.down() {
            return match self.accepting() {
                Ok(()) => Ok(None),
                Err(e) => Err(e),
            };
        }
        match self.conn.post_request(msg) {
            Ok(Some(tag)) => {
                self.awaiting.push(tag);
                Ok(Some(tag))
            }
            Ok(None) => Ok(None),
            Err(e) if self.link.reconnects() => {
                self.lose(&Chain(&e).to_string());
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// A reply to a control request of [`post_control`](Self::post_control), with its tag.
    pub(crate) fn take_reply(&mut self) -> Option<(u32, Result<Reply>)> {
        self.replies.pop_front()
    }

    /// The session generation this queue's queue pair belongs to: a reconnect moves it on.
    pub(crate) fn generation(&self) -> u64 {
        self.gen
    }

    /// Control requests sent and not yet answered.
    pub(crate) fn awaiting_replies(&self) -> usize {
        self.awaiting.len()
    }

    /// The link, for the engine's FLUSHes (features, write losses found by a reconnect).
    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    /// The descriptor of the queue's completion channel, for a caller's own event loop (io_uring
    /// POLL_ADD, epoll) instead of [`wait`](Self::wait): readable once a completion arrives after
    /// [`arm`](Self::arm). [`reap`](Self::reap) then takes the completions. A reconnect replaces
    /// the queue pair and with it this descriptor: wait for it with a timeout and take it anew
    /// each time.
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.conn.ep.event_fd()
    }

    /// The queue pair's rdma_cm event channel, for the same event loop as
    /// [`event_fd`](Self::event_fd): readable when rdma_cm has an event for it (the target
    /// disconnected or died: the kernel disconnects for a process that dies), and then call
    /// [`cm_event`](Self::cm_event). It needs no arming. [`wait`](Self::wait) watches it
    /// itself. None while the queue pair is lost, and on the in-memory fabric. A reconnect
    /// replaces it too: take it anew for each wait.
    pub fn cm_fd(&self) -> Option<std::os::fd::RawFd> {
        self.conn.cm_fd()
    }

    /// [`cm_fd`](Self::cm_fd) was readable: takes rdma_cm's events, and if the target left,
    /// the queue pair is lost (its operations are parked, or fail without reconnecting) and the
    /// first reconnect attempt runs now, as the next [`tick`](Self::tick) would run it. The
    /// [`Done`]s come from the next reap.
    pub fn cm_event(&mut self) {
        self.conn.take_cm_events();
        self.tick();
        if self.down() {
            self.recover(None);
        }
    }

    /// Asks for an event at the next completion. Reap once more after arming, before waiting
    /// for [`event_fd`](Self::event_fd): a completion that arrived before the arm raises none.
    pub fn arm(&mut self) -> Result<()> {
        let addr = self.conn.addr;
        self.conn.ep.arm_events().map_err(|source| Error::Fabric { op: "arming the completion queue", addr, source })
    }

    /// Operations submitted and not yet completed (posted, or parked while the session
    /// reconnects).
    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Operations waiting for the session to reconnect.
    pub fn parked(&self) -> u32 {
        self.parked.len() as u32
    }

    /// The queue pair's number (a reconnect replaces the queue pair).
    pub fn qp_num(&self) -> u32 {
        self.conn.ep.qp_num()
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.conn.addr
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.io
    }

    /// New operations are accepted while the queue pair works and while the session
    /// reconnects (they are parked); refused once I/O fails (fast_io_fail_tmo) or the session
    /// gave up. The same tells a lane whether a control reply can still come.
    pub(crate) fn accepting(&mut self) -> Result<()> {
        if self.conn.alive().is_ok() || !self.link.reconnects() {
            return self.conn.alive();
        }
        // Reconnecting goes on while I/O fails fast: new I/O runs the attempts that are due.
        self.link.drive();
        match self.link.status(self.gen) {
            Status::Up | Status::Newer(_) | Status::Waiting => Ok(()),
            Status::FastFail(e) => {
                self.link.note_io_failed();
                Err(e)
            }
            Status::Failed(e) => Err(e),
        }
    }

    fn stage(&mut self, slot: Slot) {
        let index = self.slots.insert(slot) as u32;
        self.set_state(index, SlotState::Staged);
        if self.staged.len() >= BATCH {
            self.commit();
        }
    }

    /// The one transition of a slot's state: moves it onto the ordering list of its new state
    /// and keeps the in-flight count. (Lists are drained whole by the step that moves every
    /// entry on: commit, rejoin, the reap of failed slots.)
    fn set_state(&mut self, index: u32, to: SlotState) {
        let Some(slot) = self.slots.get_mut(index as usize) else { return };
        let was_in_flight = matches!(slot.state, SlotState::Posted { .. } | SlotState::Parked);
        let list = match &to {
            SlotState::Staged => Some(&mut self.staged),
            SlotState::Parked => Some(&mut self.parked),
            SlotState::Failed(_) => Some(&mut self.failed),
            SlotState::Posted { .. } => None,
        };
        let now_in_flight = matches!(to, SlotState::Posted { .. } | SlotState::Parked);
        if let Some(list) = list {
            list.push(index);
        }
        slot.state = to;
        match (was_in_flight, now_in_flight) {
            (false, true) => self.in_flight += 1,
            (true, false) => self.in_flight -= 1,
            _ => {}
        }
    }

    /// The slots on the wire of the current queue pair.
    fn posted_slots(&self) -> Vec<u32> {
        let posted = self.slots.iter().filter(|(_, s)| matches!(s.state, SlotState::Posted { .. }));
        posted.map(|(i, _)| i as u32).collect()
    }

    /// Frees a slot whose operation is handed back.
    fn take_slot(&mut self, index: u32) -> Slot {
        let slot = self.slots.remove(index as usize);
        if matches!(slot.state, SlotState::Posted { .. } | SlotState::Parked) {
            self.in_flight -= 1;
        }
        slot
    }

    /// Checks that every slot's state matches the list it is on, and the in-flight count: for
    /// tests and debug builds. Returns what is wrong.
    pub(crate) fn check_invariants(&self) -> std::result::Result<(), String> {
        let on = |list: &[u32], name: &str, ok: fn(&SlotState) -> bool| -> std::result::Result<(), String> {
            for &i in list {
                match self.slots.get(i as usize) {
                    Some(s) if ok(&s.state) => {}
                    Some(s) => return Err(format!("slot {i} on {name} is {:?}", s.state)),
                    None => return Err(format!("free slot {i} on {name}")),
                }
            }
            Ok(())
        };
        on(&self.staged, "staged", |s| matches!(s, SlotState::Staged))?;
        on(&self.parked, "parked", |s| matches!(s, SlotState::Parked))?;
        on(&self.failed, "failed", |s| matches!(s, SlotState::Failed(_)))?;
        let lists = self.staged.len() + self.parked.len() + self.failed.len();
        let listed = self.slots.iter().filter(|(_, s)| !matches!(s.state, SlotState::Posted { .. })).count();
        if lists != listed {
            return Err(format!("{lists} slots on lists, {listed} in listed states (one on two lists?)"));
        }
        if let Some((i, _)) =
            self.slots.iter().find(|(_, s)| matches!(s.state, SlotState::Posted { gen } if gen != self.gen))
        {
            return Err(format!("slot {i} posted on a queue pair of an older session generation"));
        }
        let flying =
            self.slots.iter().filter(|(_, s)| matches!(s.state, SlotState::Posted { .. } | SlotState::Parked)).count();
        if flying as u32 != self.in_flight {
            return Err(format!("in_flight {} but {flying} slots posted or parked", self.in_flight));
        }
        Ok(())
    }

    /// Operations on the wire of the current queue pair.
    fn posted(&self) -> u32 {
        self.in_flight - self.parked.len() as u32
    }

    /// True while the session is lost and reconnecting (or this queue has not yet joined the
    /// new one). Moves everything of a queue pair the session left behind to `parked`.
    fn down(&mut self) -> bool {
        if !self.link.reconnects() {
            return false;
        }
        if self.conn.alive().is_ok() && (self.gen != self.link.gen() || !self.link.is_up()) {
            self.lose("the session was lost on another queue pair");
        }
        self.conn.is_broken()
    }

    /// This queue pair is lost: the session reconnects, and what was on the wire is parked
    /// to be posted again on the next queue pair (the old one's completions are never taken:
    /// the NIC let go of its buffers when the QP went to error, and it is destroyed before
    /// they are posted again).
    fn lose(&mut self, reason: &str) {
        // Reported first (the loss line), then the queue pair cleaned up.
        self.link.lost(self.gen, reason);
        self.conn.break_with(reason);
        // Replies to what was sent on it never come: the senders send again on the next one.
        self.awaiting.clear();
        let posted = self.posted_slots();
        for i in posted {
            self.set_state(i, SlotState::Parked);
        }
    }

    /// Brings a down queue back: joins the session's new generation and posts the parked
    /// operations again, or fails them once the link says I/O fails. Waits until `until` for
    /// the session (running due reconnect attempts); `None`: only what can be done now.
    fn recover(&mut self, until: Option<Instant>) {
        loop {
            let status = match until {
                None => {
                    self.link.drive();
                    self.link.status(self.gen)
                }
                Some(t) => self.link.wait_change(self.gen, t),
            };
            match status {
                Status::Newer(cur) => match self.rejoin(cur) {
                    Ok(()) => return,
                    Err(e) => {
                        self.link.lost(cur.gen, &format!("joining the new session failed: {}", Chain(&e)));
                        if until.is_none() {
                            return;
                        }
                    }
                },
                // Our generation is current, so the link has not seen our loss yet.
                Status::Up => {
                    let reason = self.conn.alive().err().map(|e| Chain(&e).to_string()).unwrap_or_default();
                    self.link.lost(self.gen, &reason);
                    if until.is_none() {
                        return;
                    }
                }
                Status::Waiting => return,
                Status::FastFail(e) => {
                    if !self.parked.is_empty() {
                        self.link.note_io_failed();
                        self.fail_parked(&e);
                    }
                    return;
                }
                Status::Failed(e) => {
                    self.fail_parked(&e);
                    return;
                }
            }
        }
    }

    fn fail_parked(&mut self, e: &Error) {
        for index in std::mem::take(&mut self.parked) {
            self.set_state(index, SlotState::Failed(clone_error(e)));
        }
    }

    /// A new queue pair in the session `cur`; the parked operations go out on it first.
    fn rejoin(&mut self, cur: Current) -> Result<()> {
        let (conn, segs) = join(&self.link, &cur, self.depth)?;
        tracing::debug!(
            addr = %conn.addr,
            qpn = conn.ep.qp_num(),
            replayed = self.parked.len(),
            "queue joined the reconnected session"
        );
        // The old queue pair is destroyed here, before its buffers are posted again.
        self.conn = conn;
        self.gen = cur.gen;
        self.segs = segs;
        let staged = std::mem::take(&mut self.staged);
        for index in std::mem::take(&mut self.parked) {
            self.set_state(index, SlotState::Staged);
        }
        for index in staged {
            self.set_state(index, SlotState::Staged);
        }
        self.commit();
        Ok(())
    }

    /// Posts every staged submission, with one doorbell per 16. While the session reconnects
    /// they are parked instead. A failure to post fails those operations (their [`Done`]s report
    /// it) and the queue, or with reconnecting, loses the queue pair.
    pub fn commit(&mut self) {
        if self.staged.is_empty() {
            return;
        }
        // The list goes back, emptied, at the end: its capacity is kept, so staging allocates
        // nothing per operation.
        let mut staged = std::mem::take(&mut self.staged);
        if self.down() {
            for &index in &staged {
                self.set_state(index, SlotState::Parked);
            }
        } else {
            self.post_staged(&staged);
        }
        staged.clear();
        // Those that wait for room on the send queue (see post_staged), in their order.
        staged.append(&mut self.staged);
        self.staged = staged;
    }

    /// Posts `staged` (taken off the list), in chunks of [`BATCH`] with one doorbell each. An
    /// operation that crosses a segment boundary (a volume that grew) goes out as one work
    /// request per segment, each with that segment's rkey, within [`SPLIT_SLACK`] extra work
    /// requests on the send queue; one that finds no room is staged again, for a later commit.
    fn post_staged(&mut self, staged: &[u32]) {
        let mut extra = self.split_in_flight();
        for chunk in staged.chunks(BATCH) {
            if let Err(e) = self.conn.alive() {
                let reason = Chain(&e).to_string();
                for &index in chunk {
                    let to = if self.link.reconnects() { SlotState::Parked } else { self.lost_error(&reason) };
                    self.set_state(index, to);
                }
                continue;
            }
            let Queue { conn, slots, segs, zeros, staged: restage, .. } = self;
            let mut wrs = [NO_WR; 2 * BATCH];
            let mut n = 0;
            // Each posted operation's index and parts.
            let mut sent: [(u32, u8); BATCH] = [(0, 0); BATCH];
            let mut taken = 0;
            for &index in chunk {
                let Some(slot) = slots.get(index as usize) else { continue };
                let (mr, base) = match (&slot.buffer, zeros.as_ref()) {
                    (Some(b), _) => b.region(),
                    (None, Some(z)) => (z, 0),
                    // stage_zeroes registers the region before it stages.
                    (None, None) => continue,
                };
                // The parts: one per segment the range touches. The range was checked against
                // the volume when staged, and every OPENED (a reconnect's too) was refused
                // unless address + size fits 64 bits (open_on).
                let mut parts: [(u64, u32, u32); rblk_proto::MAX_SEGMENTS] = [(0, 0, 0); rblk_proto::MAX_SEGMENTS];
                let (mut off, mut left, mut count) = (slot.offset, u64::from(slot.len), 0);
                while left > 0 && count < parts.len() {
                    let (seg, room) = segs.locate(off);
                    if room == 0 {
                        break;
                    }
                    let len = left.min(room);
                    parts[count] = (seg.remote_addr + (off - seg.offset), seg.rkey, len as u32);
                    count += 1;
                    off += len;
                    left -= len;
                }
                let split = count.saturating_sub(1) as u32;
                // Past what this QP's segments reach: the volume grew, and another QP heard it
                // first; this one's RESIZED (with the rkey) is on its way. Or no room for the
                // parts on the send queue. Either way it waits, staged, in order.
                if left > 0 || (split > 0 && (extra + split > SPLIT_SLACK || n + count > wrs.len())) {
                    restage.push(index);
                    continue;
                }
                extra += split;
                let mut local_at = base;
                for &(remote_addr, rkey, len) in &parts[..count] {
                    let op = match slot.dir {
                        Direction::Read => Op::Read { remote_addr, rkey },
                        Direction::Write => Op::Write { remote_addr, rkey },
                    };
                    let local = Local::Region { mr, offset: local_at, len };
                    wrs[n] = WorkRequest { wr_id: index.into(), op, local, signaled: true };
                    n += 1;
                    local_at += len as usize;
                }
                sent[taken] = (index, count as u8);
                taken += 1;
            }
            let posted = conn.ep.post(&wrs[..n]);
            let sent = &sent[..taken];
            for &(index, parts) in sent {
                if let Some(slot) = self.slots.get_mut(index as usize) {
                    (slot.split, slot.parts) = (parts.saturating_sub(1), parts);
                }
            }
            let sent = sent.iter().map(|&(index, _)| index);
            match posted {
                Ok(()) => {
                    let gen = self.gen;
                    for index in sent {
                        self.set_state(index, SlotState::Posted { gen });
                    }
                }
                Err(source) => {
                    let reason = format!("posting RDMA work requests failed: {}", Chain(&source));
                    if self.link.reconnects() {
                        self.lose(&reason);
                        for index in sent {
                            self.set_state(index, SlotState::Parked);
                        }
                    } else {
                        self.conn.break_with(reason.clone());
                        for index in sent {
                            let to = self.lost_error(&reason);
                            self.set_state(index, to);
                        }
                    }
                }
            }
        }
    }

    /// Extra work requests on the send queue now: the parts of posted operations beyond their
    /// first (see [`SPLIT_SLACK`]). Counted only when a volume has grown (one segment: none).
    fn split_in_flight(&self) -> u32 {
        if self.segs.len() == 1 {
            return 0;
        }
        let posted = self.slots.iter().filter(|(_, s)| matches!(s.state, SlotState::Posted { .. }));
        posted.map(|(_, s)| u32::from(s.split)).sum()
    }

    fn lost_error(&self, reason: &str) -> SlotState {
        SlotState::Failed(Error::ConnectionLost { addr: self.conn.addr, reason: reason.to_owned() })
    }

    /// Posts what is staged, then fills `done` with finished operations without waiting.
    /// Returns how many it filled. Also the queue's housekeeping: keepalives, loss detection,
    /// and while the session is down, a due reconnect attempt and the rejoin.
    pub fn reap(&mut self, done: &mut [Done]) -> usize {
        self.commit();
        if self.down() {
            self.recover(None);
        }
        let mut k = self.take_failed(done);
        while k < done.len() && self.posted() > 0 && !self.conn.is_broken() {
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
        if self.posted() == 0 {
            self.drain_control();
        }
        self.check_liveness();
        k
    }

    /// [`reap`](Self::reap) for a queue with nothing to hand back: the housekeeping of an idle
    /// queue (call it every second or two when nothing else polls the queue).
    pub fn tick(&mut self) {
        let _ = self.reap(&mut []);
    }

    /// Like [`reap`](Self::reap), but waits (spinning briefly, then sleeping) until at least one
    /// operation finished or the target disconnected ([`cm_fd`](Self::cm_fd)). Returns 0 at once when nothing is outstanding, and
    /// [`Error::Timeout`] if `deadline` passes first (the operations stay outstanding). While
    /// the session reconnects it waits for that instead and returns 0 at `deadline`: the
    /// operations are held, not timed out.
    pub fn wait(&mut self, done: &mut [Done], deadline: Instant) -> Result<usize> {
        let started = Instant::now();
        let mut k = self.reap(done);
        let adaptive = self.waiter.adapts(self.in_flight);
        let spin = self.waiter.budget(self.in_flight);
        let mut slept = false;
        // Staged operations left after a commit wait for this QP's RESIZED or for room on its
        // send queue (see post_staged): completions bring either.
        while k == 0
            && self.replies.is_empty()
            && (self.in_flight > 0 || !self.awaiting.is_empty() || !self.staged.is_empty())
            && !done.is_empty()
        {
            self.commit();
            if self.down() {
                self.recover(Some(deadline));
                k += self.take_failed(&mut done[k..]);
                if self.down() || Instant::now() >= deadline {
                    return Ok(k);
                }
                continue;
            }
            let mut wcs = [Completion::EMPTY; POLL_BATCH];
            let want = done.len().min(POLL_BATCH);
            slept = true;
            let until = deadline.min(self.conn.next_check());
            let n = match self.conn.ep.wait(&mut wcs[..want], spin, until) {
                Ok(n) => n,
                Err(source) => {
                    self.poll_failed(source);
                    return Ok(self.take_failed(done));
                }
            };
            self.process(&wcs[..n], done, &mut k);
            k += self.take_failed(&mut done[k..]);
            if k == 0 && n == 0 {
                self.check_liveness();
                if Instant::now() >= deadline && (self.in_flight == 0 || self.down()) {
                    // Only control replies awaited (a FLUSH's write-back may take minutes: the
                    // liveness rule bounds it), or held while the session reconnects.
                    return Ok(0);
                }
                if Instant::now() >= deadline {
                    let op = "waiting for queue completions";
                    return Err(Error::Timeout { op, addr: self.conn.addr, after: started.elapsed() });
                }
            }
        }
        if adaptive && slept && k > 0 {
            self.waiter.record(started.elapsed());
        }
        Ok(k)
    }

    /// Waits until the session is back (and this queue rejoined it), I/O fails, or
    /// `deadline`: for callers that wait for parked operations without a [`Done`] to fill.
    pub fn wait_session(&mut self, deadline: Instant) {
        if self.down() {
            self.recover(Some(deadline));
        }
    }

    /// Keepalives and loss detection of the queue pair (a lost one parks its operations).
    fn check_liveness(&mut self) {
        if self.conn.is_broken() {
            return;
        }
        // This runs at every reap: the session-wide figures are touched only when they matter.
        let heard = self.conn.heard();
        if heard != self.noted_heard {
            self.noted_heard = heard;
            self.link.note_heard(heard);
        }
        let awaiting = !self.awaiting.is_empty();
        self.conn.set_awaiting(awaiting);
        let elsewhere = self.conn.hears_through_session();
        if let Err(e) = self.conn.check_liveness_reporting_first(elsewhere.then(|| self.link.heard())) {
            if self.link.reconnects() {
                self.lose(&Chain(&e).to_string());
            }
            // Otherwise the QP goes to error now: its operations complete flushed and fail.
            self.conn.finish_break();
        }
    }

    fn process(&mut self, wcs: &[Completion], done: &mut [Done], k: &mut usize) {
        for c in wcs {
            if self.conn.is_broken() && self.link.reconnects() {
                // Parked with the rest when the queue pair was lost.
                return;
            }
            if channel::is_control(c.wr_id) {
                self.on_control(c);
                continue;
            }
            // Only slots on the wire: not raw work requests, nor operations already failed.
            let index = u32::try_from(c.wr_id)
                .ok()
                .filter(|&i| self.slots.get(i as usize).is_some_and(|s| matches!(s.state, SlotState::Posted { .. })));
            let Some(index) = index else {
                tracing::debug!(wr_id = c.wr_id, "completion of a raw work request ignored");
                continue;
            };
            if !c.status.is_success() && self.link.reconnects() {
                // The session is lost: this operation and every other on the wire wait for the
                // next queue pair.
                let s = &self.slots[index as usize];
                let e = Error::completion(s.dir, s.offset, s.len.into(), c);
                self.lose(&Chain(&e).to_string());
                return;
            }
            if c.status.is_success() {
                // An operation split at a segment boundary is done with its last part.
                let slot = &mut self.slots[index as usize];
                if slot.parts > 1 {
                    slot.parts -= 1;
                    continue;
                }
            }
            let slot = self.take_slot(index);
            let result = if c.status.is_success() {
                if slot.dir == Direction::Write {
                    // Completed, so the next FLUSH of the volume covers it.
                    self.io.record(slot.offset, slot.len.into());
                }
                Ok(())
            } else if c.status == WcStatus::WR_FLUSH_ERR && self.conn.is_broken() {
                self.conn.alive()
            } else {
                let e = Error::completion(slot.dir, slot.offset, slot.len.into(), c);
                self.conn.break_with(Chain(&e).to_string());
                Err(e)
            };
            // `k` < done.len(): callers poll at most as many completions as there is room.
            done[*k] = finish(slot, result);
            *k += 1;
        }
    }

    /// A control completion: a reply goes to the request that sent it (by tag); a failure
    /// breaks the connection, and the data completions then report it.
    fn on_control(&mut self, c: &Completion) {
        let taken = self.conn.on_control_completion(c);
        if let Some((size, segs)) = self.conn.take_resized() {
            // This QP's rkeys for the grown volume (its new windows were bound before the
            // target sent this), then everyone hears the size.
            self.segs = segs;
            self.link.grew(size);
        }
        match taken {
            Ok(None) => {}
            Ok(Some((tag, reply))) => match self.awaiting.iter().position(|&t| t == tag) {
                Some(i) => {
                    self.awaiting.swap_remove(i);
                    self.replies.push_back((tag, reply));
                }
                None => self.conn.unsolicited(tag, &reply),
            },
            Err(e) => {
                if self.link.reconnects() {
                    self.lose(&Chain(&e).to_string());
                }
            }
        }
    }

    /// Drains completions of the control channel while no data is in flight.
    fn drain_control(&mut self) {
        if self.conn.is_broken() {
            return;
        }
        let mut wcs = [Completion::EMPTY; POLL_BATCH];
        while let Ok(n) = self.conn.ep.poll(&mut wcs) {
            for c in &wcs[..n] {
                if channel::is_control(c.wr_id) {
                    self.on_control(c);
                    if self.conn.is_broken() {
                        return;
                    }
                }
            }
            if n < wcs.len() {
                break;
            }
        }
    }

    /// Polling itself failed: the QP is moved to error (so the NIC lets go of every buffer) and
    /// every operation in flight fails, or with reconnecting, waits for the next queue pair.
    fn poll_failed(&mut self, source: rblk_fabric::Error) {
        let reason = format!("polling completions failed: {}", Chain(&source));
        if self.link.reconnects() {
            self.lose(&reason);
            return;
        }
        self.conn.break_with(reason.clone());
        let posted = self.posted_slots();
        for index in posted {
            let to = self.lost_error(&reason);
            self.set_state(index, to);
        }
    }

    fn take_failed(&mut self, done: &mut [Done]) -> usize {
        let n = self.failed.len().min(done.len());
        let taken: Vec<u32> = self.failed.drain(..n).collect();
        for (d, index) in done.iter_mut().zip(taken) {
            let mut slot = self.take_slot(index);
            let result = match std::mem::replace(&mut slot.state, SlotState::Staged) {
                SlotState::Failed(e) => Err(e),
                _ => Ok(()),
            };
            *d = finish(slot, result);
        }
        n
    }
}

impl Slot {
    fn new(user_data: u64, dir: Direction, offset: u64, len: u32, buffer: Option<Buffer>, give_back: bool) -> Slot {
        Slot { user_data, dir, offset, len, buffer, give_back, state: SlotState::Staged, split: 0, parts: 0 }
    }
}

/// The same error again, for each of several operations it fails (errors are not Clone).
fn clone_error(e: &Error) -> Error {
    match e {
        Error::ConnectionLost { addr, reason } => Error::ConnectionLost { addr: *addr, reason: reason.clone() },
        other => Error::ConnectionLost { addr: SocketAddr::from(([0, 0, 0, 0], 0)), reason: other.to_string() },
    }
}

fn finish(slot: Slot, result: Result<()>) -> Done {
    let Slot { user_data, dir, offset, len, buffer, give_back, .. } = slot;
    Done { user_data, result, dir, offset, len, buffer: buffer.filter(|_| give_back) }
}
