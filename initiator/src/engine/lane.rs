//! A lane: one queue pair of a session, owned by one thread, running block requests on it.
//!
//! # A request's lifecycle
//!
//! Every request the lane holds is in exactly one [`State`], kept in its slot of one slab, and
//! only [`Lane::set_state`] changes it. Two ordering lists hold keys: `ready` (submission order:
//! requests with something to start or post) and `flushing` (FLUSH exchanges). A request on
//! neither waits for its pieces' completions, which name it by their `user_data`.
//!
//! ```text
//!  submit ─┬─ Read, Write, WriteZeroes (aligned; unaligned reads read the covering blocks)
//!          │    Posting{next, outstanding} ──all posted──> InFlight{outstanding} ──┐
//!          │    (a write first takes its shared hold)                              │
//!          ├─ partial-block write (read-modify-write)                              │
//!          │    Barrier ─older done─> WaitingForHold ─exclusive─> ReadingEdges ────┤
//!          │                                          edges read, bytes patched in │
//!          │                                            Posting{..} ─> InFlight{..}┤
//!          ├─ Flush: takes the session's dirty ranges (a flush sequence number)    │
//!          │    FlushQueued ─sent─> Flushing{tag, gen} ─FLUSHED─> WaitingEarlier ──┤
//!          │          ^  a reconnect (gen moved on): sent again     earlier ones   │
//!          │          └─────────────────────────────────────────── done ───────────┤
//!          └─ Discard, WriteZeroes done by the target (FEATURE_DISCARD, whole       │
//!             blocks): WaitingForHold ─exclusive─> FlushQueued ─sent─> Flushing ───┤
//!             (a DISCARD or WRITE_ZEROES per piece of at most MAX_ZERO_LEN; OK:    │
//!              the next piece, or done; a reconnect: the piece sent again)         v
//!    last piece done ─ fua ─> FlushQueued (its range) ... ─> finished, handed back by next()
//! ```
//!
//! A range the target zeroes is held exclusively from before it is sent until its last answer:
//! writes to it that were submitted earlier on the lane (and those of other lanes that hold it)
//! have completed (their data is in the target's memory, which the target then zeroes), and
//! writes submitted later wait for the answer, as for a read-modify-write. Reads take no hold:
//! one that overlaps it in time may see the old bytes or zeros.
//!
//! Nothing here waits: a hold that is not free, a send buffer that is not free, an earlier FLUSH
//! still running, are states that [`Lane::progress`] looks at again. What still blocks by
//! design: a reconnect attempt that falls due while submitting or reaping runs on the caller's
//! thread (see [`Reconnect`](crate::Reconnect)), and [`Lane::wait`] and the synchronous calls
//! wait, as their names say.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rblk_proto::{FlushedFlags, Message};

use crate::conn::Reply;
use crate::control::{self, Control};
use crate::holds::Hold;
use crate::io_state::{Earlier, FlushBody, Shared};
use crate::{Buffer, Direction, Done, Error, Geometry, InvalidReason, Queue, Result, DEFAULT_IO_TIMEOUT};

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write the request's data at `offset`.
    Write,
    /// Make `len` bytes at `offset` read as zeros. With a target that has
    /// [`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD) and whole blocks, the target zeroes
    /// them (a WRITE_ZEROES: nothing moves over the link) and, with `unmap`, may give a durable
    /// volume's backing blocks back; without `unmap` they stay allocated (Linux's `REQ_NOUNMAP`,
    /// NBD's `NO_HOLE`). Otherwise RDMA WRITEs from a zeroed registration.
    WriteZeroes {
        /// The backing store may free the blocks (a hole that reads zeros).
        unmap: bool,
    },
    /// Drop `len` bytes at `offset` (whole blocks): they read as zeros once it finished, the
    /// target zeroes them and a durable volume's backing store gives their blocks back. Needs a
    /// target with [`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD) ([`Lane::discards`]); else
    /// refused as [`InvalidReason::Unsupported`].
    Discard,
    /// Make every write completed so far durable: a FLUSH of exactly the ranges written since
    /// the last one; nothing is sent when there are none.
    Flush,
}

/// Where a request's bytes are.
#[derive(Debug, Default)]
pub enum Data {
    /// None (flush, zeroes), or not handed back.
    #[default]
    None,
    /// The caller's bytes, copied through the queue's registered buffers: a write's source, a
    /// read's destination (resized to the request's length).
    Bytes(Vec<u8>),
    /// A registered buffer of this lane's pool ([`Lane::alloc_buffer`]): the NIC reads or
    /// writes it directly, nothing is copied. The request must be block-aligned and at most
    /// [`Lane::max_piece`] bytes long.
    Registered(Buffer),
}

/// The rdma_cm event channels a lane's owner watches ([`Lane::cm_fds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmFds {
    /// The lane's queue pair's ([`Queue::cm_fd`](crate::Queue::cm_fd)) and the session's first
    /// queue pair's ([`Control::cm_fd`]); None where there is nothing to watch now (lost, in
    /// use by another thread, the in-memory fabric).
    pub fds: [Option<std::os::fd::RawFd>; 2],
    /// Changes whenever a reconnect replaces one of them. A wait that outlives a call (an
    /// io_uring POLL_ADD) on an older set never fires: cancel it and wait anew.
    pub generation: u64,
}

/// A block request.
#[derive(Debug)]
pub struct Request {
    /// The caller's value, echoed by its [`Finished`].
    pub tag: u64,
    /// What to do.
    pub op: IoOp,
    /// Byte offset (any: partial blocks are read-modify-written).
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// Force unit access: the write is durable when it finishes (write, then FLUSH of its range).
    pub fua: bool,
    /// The data.
    pub data: Data,
}

/// A finished request, with its data handed back (a read's bytes, a registered buffer).
#[derive(Debug)]
pub struct Finished {
    /// The request's tag.
    pub tag: u64,
    /// The request's operation.
    pub op: IoOp,
    /// Success, or the first failure among its pieces.
    pub result: Result<()>,
    /// The request's data.
    pub data: Data,
}

/// Where a request is (see the module documentation's drawing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// On `ready`: pieces to post; `next` bytes posted so far, `outstanding` on the queue.
    Posting { next: u64, outstanding: u32 },
    /// Every piece posted; `outstanding` still on the queue.
    InFlight { outstanding: u32 },
    /// A read-modify-write on `ready`, waiting for the lane's older requests to finish.
    Barrier,
    /// A read-modify-write on `ready`, waiting for its exclusive hold.
    WaitingForHold,
    /// A read-modify-write on `ready`, reading its partial edge blocks: `posted` of them so far,
    /// `outstanding` on the queue.
    ReadingEdges { posted: u8, outstanding: u32 },
    /// On `flushing`: a FLUSH (or a FUA write's) to send on the lane's queue pair.
    FlushQueued,
    /// On `flushing`: sent with `tag` on the queue pair of session generation `gen`.
    Flushing { tag: u32, gen: u64 },
    /// On `flushing`: FLUSHED; waiting for the session's earlier FLUSHes.
    WaitingEarlier,
}

impl State {
    fn on_ready(self) -> bool {
        matches!(self, State::Posting { .. } | State::Barrier | State::WaitingForHold | State::ReadingEdges { .. })
    }

    fn on_flushing(self) -> bool {
        matches!(self, State::FlushQueued | State::Flushing { .. } | State::WaitingEarlier)
    }

    /// Pieces on the queue.
    fn outstanding(self) -> u32 {
        match self {
            State::Posting { outstanding, .. }
            | State::InFlight { outstanding }
            | State::ReadingEdges { outstanding, .. } => outstanding,
            _ => 0,
        }
    }
}

/// What kind of request, with what only that kind needs.
#[derive(Debug)]
enum Kind {
    /// A read; `trim`: it reads the covering blocks and the caller's bytes start this far in.
    Read { trim: Option<usize> },
    /// An aligned write (of the request's data, or of zeroes).
    Write,
    /// A write of partial blocks: the covering blocks (the request's range) are read at the
    /// `edges` into `scratch`, patched with the caller's bytes from `skip` on, and written back
    /// whole.
    /// (Boxed, as the FLUSH's body: the common kinds stay small, and a request moves a few
    /// times in its life.)
    ReadModifyWrite(Box<Rmw>),
    /// A FLUSH: the session's flush sequence number and what it sends (None: nothing to send).
    Flush { seq: u64, body: Option<Box<FlushBody>>, ended: bool },
    /// A DISCARD or WRITE_ZEROES the target does: `done` bytes answered so far (the piece sent
    /// is the next at most [`MAX_ZERO_LEN`](rblk_proto::MAX_ZERO_LEN) bytes from there).
    Zero { done: u64 },
}

/// What a read-modify-write needs besides its request.
#[derive(Debug)]
struct Rmw {
    /// The caller's bytes start this far into the covering blocks.
    skip: usize,
    /// The partial blocks at either end (one, when both ends are in the same block).
    edges: [Option<u64>; 2],
    /// The covering blocks: read at the edges, patched, written back.
    scratch: Vec<u8>,
}

/// One request in progress.
#[derive(Debug)]
struct Req {
    tag: u64,
    op: IoOp,
    /// For reads of covering blocks and read-modify-writes, the covering range.
    offset: u64,
    len: u64,
    fua: bool,
    data: Data,
    /// The caller's length (a trimmed read hands back this many bytes).
    want: u64,
    kind: Kind,
    state: State,
    error: Option<Error>,
    /// A write's shared hold, or a read-modify-write's exclusive one (or its request).
    hold: Option<Hold>,
    /// Submission order.
    seq: u64,
    /// When the caller submitted it (its latency is measured from here).
    started: Instant,
    /// When its FLUSH was first sent.
    flush_sent: Option<Instant>,
}

/// One queue pair of a session and the block requests running on it.
///
/// Requests of any offset and length go in with [`submit`](Self::submit); each is checked
/// against the volume, split into pieces of at most [`max_piece`](Self::max_piece) bytes, and
/// kept at most the queue's depth in flight; [`next`](Self::next) hands back finished ones, in
/// whatever order they finish. Requests that cover blocks only partly are read-modify-writes: they
/// wait until the lane's older requests finished and then hold their blocks exclusively against
/// every lane of the session; requests submitted after one start once it has posted its
/// write-back. A write holds its blocks shared while in flight, so a read-modify-write never
/// undoes it. FLUSH and FUA go to the target on this lane's own queue pair.
///
/// The owning thread drives it: [`wait`](Self::wait) blocks, [`progress`](Self::progress)
/// does not; [`event_fd`](Self::event_fd) and [`arm`](Self::arm) let an event loop of the
/// caller's (a ublk queue's io_uring) wait instead, with [`retry_after`](Self::retry_after) as
/// its timeout. The synchronous calls ([`read_at`](Self::read_at), [`write_at`](Self::write_at),
/// [`write_zeroes`](Self::write_zeroes), [`flush`](Self::flush)) are for a lane with no
/// requests of the caller's outstanding.
#[derive(Debug)]
pub struct Lane {
    q: Queue,
    /// The session's first queue pair, kept heard by [`tick`](Self::tick).
    control: Option<Arc<Control>>,
    io: Shared,
    max: u64,
    features: u64,
    reqs: slab::Slab<Req>,
    /// Keys of requests in a state [`State::on_ready`], in submission order.
    ready: VecDeque<usize>,
    /// Keys of requests in a state [`State::on_flushing`].
    flushing: Vec<usize>,
    finished: VecDeque<Finished>,
    done: Vec<Done>,
    io_timeout: Duration,
    /// Reused by the synchronous calls.
    scratch: Vec<u8>,
    next_seq: u64,
    /// Post only in progress(), not at every submit (an event loop that submits many requests
    /// per wakeup: one doorbell for all of them).
    defer_posts: bool,
    /// The last progress found a request waiting for a hold or an earlier FLUSH, which no
    /// completion of this lane's announces.
    blocked: bool,
}

fn bs(geo: &Geometry) -> u64 {
    u64::from(geo.block_size.max(1))
}

/// How soon an event loop should look again at a lane whose requests wait for another lane
/// (a hold, an earlier FLUSH).
const RETRY: Duration = Duration::from_millis(1);

impl Lane {
    pub(crate) fn new(q: Queue, control: Option<Arc<Control>>) -> Lane {
        let depth = q.depth() as usize;
        let io = Arc::clone(q.shared());
        let max = q.max_len();
        let features = q.link().features();
        Lane {
            q,
            control,
            io,
            max,
            features,
            reqs: slab::Slab::with_capacity(depth),
            ready: VecDeque::with_capacity(depth),
            flushing: Vec::new(),
            finished: VecDeque::with_capacity(depth),
            done: std::iter::repeat_with(Done::default).take(depth).collect(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            scratch: Vec::new(),
            next_seq: 1,
            defer_posts: false,
            blocked: false,
        }
    }

    /// A lane over `q`, a queue of a [`Volume`](crate::Volume) (which keeps the session's first
    /// queue pair heard: [`Volume::keepalive`](crate::Volume::keepalive)), for callers that want
    /// the engine's requests (discards, any offset and length) on a queue of their own.
    pub fn over(q: Queue) -> Lane {
        Lane::new(q, None)
    }

    /// Sets how long a wait may go without any completion while pieces are in flight (default
    /// [`DEFAULT_IO_TIMEOUT`]).
    pub fn set_io_timeout(&mut self, timeout: Duration) {
        self.io_timeout = timeout;
    }

    /// With `true`, [`submit`](Self::submit) only stages a request's pieces; they are posted,
    /// with one doorbell per batch, by the next [`progress`](Self::progress) or
    /// [`wait`](Self::wait). For event loops that take many requests per wakeup.
    pub fn set_deferred_posting(&mut self, defer: bool) {
        self.defer_posts = defer;
    }

    /// The volume's geometry (its size as it is now: it may have grown).
    pub fn geometry(&self) -> Geometry {
        self.q.geometry()
    }

    fn geo(&self) -> Geometry {
        self.q.geometry()
    }

    /// The largest piece: requests longer than this are split.
    pub fn max_piece(&self) -> u64 {
        self.max
    }

    /// The number of the lane's queue pair: tests inject faults by it (the in-memory fabric's
    /// `fail_next` and `sever`).
    pub fn qp_num(&self) -> u32 {
        self.q.qp_num()
    }

    /// Pieces in flight at most.
    pub fn depth(&self) -> u32 {
        self.q.depth()
    }

    /// A buffer of this lane's registered pool, for [`Data::Registered`] requests.
    pub fn alloc_buffer(&self) -> Option<Buffer> {
        self.q.pool().alloc()
    }

    /// Requests submitted and not yet handed back by [`next`](Self::next).
    pub fn pending(&self) -> usize {
        self.reqs.len() + self.finished.len()
    }

    /// Pieces on the queue.
    pub fn in_flight(&self) -> u32 {
        self.q.in_flight()
    }

    /// The completion channel's descriptor, readable once a completion arrives after
    /// [`arm`](Self::arm).
    pub fn event_fd(&self) -> std::os::fd::RawFd {
        self.q.event_fd()
    }

    /// Asks for an event at the next completion. Call [`progress`](Self::progress) once more
    /// afterwards, then wait for [`event_fd`](Self::event_fd).
    pub fn arm(&mut self) -> Result<()> {
        self.q.arm()
    }

    /// The rdma_cm event channels whose loss matters to this lane, for the event loop that
    /// waits for [`event_fd`](Self::event_fd): when one is readable, call
    /// [`cm_event`](Self::cm_event), and a lost target is noticed when rdma_cm says so, not at
    /// the next [`tick`](Self::tick). Unlike the completion channel they need no arming.
    pub fn cm_fds(&self) -> CmFds {
        let gen = self.q.generation() + self.q.link().gen();
        CmFds { fds: [self.q.cm_fd(), self.control.as_ref().and_then(|c| c.cm_fd())], generation: gen }
    }

    /// One of [`cm_fds`](Self::cm_fds) was readable: takes rdma_cm's events on both queue
    /// pairs; a target that left is noticed now (requests wait for the reconnect, which starts
    /// at once, or fail), and then what can progress does ([`next`](Self::next) hands back
    /// what finished). An error is the lane's own ([`progress`](Self::progress)'s): the loss of
    /// the session's first queue pair is the session's to handle (the reconnect, which has
    /// started), and is only logged here. (Returned as an error, it made the ublk server fail
    /// every later request with EIO at a takeover.)
    pub fn cm_event(&mut self) -> Result<()> {
        self.q.cm_event();
        if let Some(Err(e)) = self.control.as_ref().map(|c| c.cm_event()) {
            tracing::debug!(error = %rblk_fabric::Chain(&e), "the session's first queue pair: rdma_cm event");
        }
        self.progress()
    }

    /// For the thread that owns this lane while nothing is in flight and it waits for work of
    /// its own: sleeps until `wake` (its own descriptor: a socket, a pipe) is readable or
    /// `deadline`, handling the lane's rdma_cm events meanwhile ([`cm_fds`](Self::cm_fds),
    /// [`cm_event`](Self::cm_event)), so a lost target is noticed when it is lost. True when
    /// `wake` is readable; false at `deadline` or after a CM event (look at
    /// [`next`](Self::next), then wait again).
    pub fn idle_wait(&mut self, wake: std::os::fd::BorrowedFd<'_>, deadline: Instant) -> Result<bool> {
        use std::os::fd::AsRawFd as _;
        // The lane's own completion channel too: a message of the target's (RESIZED: the
        // volume grew) is taken when it arrives, not at the next tick. Armed, then polled once
        // more, so nothing that arrived before the arm waits for it.
        self.q.arm()?;
        self.q.tick();
        let mut fds = [wake.as_raw_fd(); 4];
        fds[1] = self.q.event_fd();
        let mut n = 2;
        for fd in self.cm_fds().fds.into_iter().flatten() {
            fds[n] = fd;
            n += 1;
        }
        match rblk_fabric::wait_readable(&fds[..n], deadline) {
            Ok(Some(0)) => Ok(true),
            Ok(Some(1)) => {
                self.q.tick();
                Ok(false)
            }
            Ok(Some(_)) => self.cm_event().map(|()| false),
            Ok(None) => Ok(false),
            Err(source) => {
                Err(Error::Fabric { op: "waiting for work and rdma_cm events", addr: self.q.addr(), source })
            }
        }
    }

    /// When an event loop waiting for [`event_fd`](Self::event_fd) should call
    /// [`progress`](Self::progress) again even without an event: a request waits for another
    /// lane (a range hold, an earlier FLUSH), which raises no event here. `None`: only events.
    pub fn retry_after(&self) -> Option<Duration> {
        self.blocked.then_some(RETRY)
    }

    /// Housekeeping, every second or so while the owning thread has nothing else to do: the
    /// queue's keepalives and loss detection ([`Queue::tick`]: while the session is lost, a due
    /// reconnect attempt and the rejoin), and the same for the session's first queue pair unless
    /// another thread is using it (a FLUSH or STATS exchange, which hears the target meanwhile).
    /// Then what can progress does.
    pub fn tick(&mut self) -> Result<()> {
        self.q.tick();
        let first = match &self.control {
            Some(c) => c.try_keepalive(),
            None => Ok(()),
        };
        self.progress()?;
        first
    }

    /// Starts a request. Requests that fail their checks finish at once with the reason.
    pub fn submit(&mut self, r: Request) {
        let started = Instant::now();
        if let Err(e) = self.check(&r) {
            self.hand_back(Finished { tag: r.tag, op: r.op, result: Err(e), data: r.data }, 0, None);
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let bs = bs(&self.geo());
        // A FLUSH's offset and length mean nothing (ublk passes whatever the iod holds).
        let (start, end) = match r.op {
            IoOp::Flush => (0, 0),
            _ => (r.offset / bs * bs, (r.offset + r.len).div_ceil(bs) * bs),
        };
        let aligned = start == r.offset && end == r.offset + r.len;
        let mut req = Req {
            tag: r.tag,
            op: r.op,
            offset: r.offset,
            len: r.len,
            fua: r.fua,
            data: r.data,
            want: r.len,
            kind: Kind::Write,
            state: State::Posting { next: 0, outstanding: 0 },
            error: None,
            hold: None,
            seq,
            started,
            flush_sent: None,
        };
        match r.op {
            IoOp::Flush => {
                if let Some(e) = control::writes_lost(self.q.link()) {
                    self.io.count_flush(None, false);
                    self.finished.push_back(Finished { tag: r.tag, op: r.op, result: Err(e), data: req.data });
                    return;
                }
                let ticket = self.io.begin_flush();
                let sends = ticket.ranges != crate::Dirty::default();
                let body = sends.then(|| Box::new(FlushBody::of(&ticket.ranges, self.features)));
                if !sends {
                    // Nothing of its own to write back: answered now, it waits for earlier ones.
                    self.io.end_flush(ticket.seq, true);
                }
                req.kind = Kind::Flush { seq: ticket.seq, body, ended: !sends };
                req.state = if sends { State::FlushQueued } else { State::WaitingEarlier };
            }
            IoOp::Read => {
                if let Data::Bytes(v) = &mut req.data {
                    v.resize((end - start) as usize, 0);
                }
                if !aligned {
                    req.kind = Kind::Read { trim: Some((r.offset - start) as usize) };
                    req.offset = start;
                    req.len = end - start;
                } else {
                    req.kind = Kind::Read { trim: None };
                }
            }
            IoOp::Discard | IoOp::WriteZeroes { .. } if aligned && self.discards() => {
                // Held exclusively (from the state's first step), then sent.
                req.kind = Kind::Zero { done: 0 };
                req.state = State::WaitingForHold;
            }
            IoOp::Write | IoOp::WriteZeroes { .. } if aligned => {}
            IoOp::Discard => unreachable!("check() refuses an unaligned discard, or one to a target without it"),
            IoOp::Write | IoOp::WriteZeroes { .. } => {
                let mut edges = [None; 2];
                if r.offset != start {
                    edges[0] = Some(start);
                }
                if r.offset + r.len != end && Some(end - bs) != edges[0] {
                    edges[1] = Some(end - bs);
                }
                req.kind = Kind::ReadModifyWrite(Box::new(Rmw {
                    skip: (r.offset - start) as usize,
                    edges,
                    scratch: Vec::new(),
                }));
                req.offset = start;
                req.len = end - start;
                req.state = State::Barrier;
            }
        }
        self.admit(req);
        if !self.defer_posts {
            self.pump();
        }
    }

    /// The one check of a request: range, alignment, length, buffer ownership. The queue trusts
    /// it; what can change before posting is guarded there.
    fn check(&self, r: &Request) -> Result<()> {
        let dir = if r.op == IoOp::Read { Direction::Read } else { Direction::Write };
        let what = match r.op {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::WriteZeroes { .. } => "write of zeroes",
            IoOp::Discard => "discard",
            IoOp::Flush => return Ok(()),
        };
        let bs = bs(&self.geo());
        let invalid = |reason| Err(Error::Invalid { what, offset: r.offset, len: r.len, reason });
        if r.len == 0 {
            return invalid(InvalidReason::ZeroLength);
        }
        // The covering blocks must lie inside the volume (its size is a multiple of the block size).
        let Some(end) = r.offset.checked_add(r.len) else {
            return invalid(InvalidReason::OutOfRange { size: self.geo().size });
        };
        let (start, end) = (r.offset / bs * bs, end.div_ceil(bs) * bs);
        self.geo().check_as(what, dir, start, end - start, None)?;
        self.io.check_writable(dir, start, end - start)?;
        if r.op == IoOp::Discard {
            if start != r.offset {
                return invalid(InvalidReason::OffsetUnaligned { block_size: self.geo().block_size });
            }
            if end != r.offset + r.len {
                return invalid(InvalidReason::LengthUnaligned { block_size: self.geo().block_size });
            }
            if !self.discards() {
                return invalid(InvalidReason::Unsupported);
            }
        }
        match (&r.data, r.op) {
            (Data::Registered(b), IoOp::Read | IoOp::Write) => {
                if start != r.offset || end != r.offset + r.len {
                    return invalid(InvalidReason::OffsetUnaligned { block_size: self.geo().block_size });
                }
                if r.len > self.max || r.len > b.len() as u64 {
                    return invalid(InvalidReason::TooLarge { max: self.max.min(b.len() as u64) });
                }
                if !self.q.pool().owns(b) {
                    return invalid(InvalidReason::ForeignBuffer);
                }
            }
            (Data::Bytes(v), IoOp::Write) if v.len() as u64 != r.len => {
                return invalid(InvalidReason::BufferTooSmall { size: v.len() as u64 });
            }
            (Data::Bytes(_), _) | (Data::None, IoOp::WriteZeroes { .. } | IoOp::Discard) => {}
            _ => return invalid(InvalidReason::NoData),
        }
        Ok(())
    }

    /// A new request joins the lane in its first state, on that state's list.
    fn admit(&mut self, req: Req) {
        let state = req.state;
        let key = self.reqs.insert(req);
        if state.on_ready() {
            self.ready.push_back(key);
        } else if state.on_flushing() {
            self.flushing.push(key);
        }
        self.debug_check(state, state);
    }

    /// The one transition of a request's state: moves its key onto the ordering list of the new
    /// state (off the old one) and checks, in debug builds, that lists and states agree.
    fn set_state(&mut self, key: usize, to: State) {
        let Some(req) = self.reqs.get_mut(key) else { return };
        let from = req.state;
        req.state = to;
        if from.on_ready() != to.on_ready() {
            if to.on_ready() {
                self.ready.push_back(key);
            } else if self.ready.front() == Some(&key) {
                // The usual case: the head of `ready` is posted.
                self.ready.pop_front();
            } else if let Some(i) = self.ready.iter().position(|&k| k == key) {
                self.ready.remove(i);
            }
        }
        if from.on_flushing() != to.on_flushing() {
            if to.on_flushing() {
                self.flushing.push(key);
            } else if let Some(i) = self.flushing.iter().position(|&k| k == key) {
                self.flushing.swap_remove(i);
            }
        }
        self.debug_check(from, to);
    }

    fn debug_check(&self, from: State, to: State) {
        if cfg!(debug_assertions) {
            if let Err(e) = self.check_lists() {
                panic!("lane lists disagree with states after {from:?} -> {to:?}: {e}");
            }
        }
    }

    fn check_lists(&self) -> std::result::Result<(), String> {
        for (name, list, ok) in [
            ("ready", self.ready.iter().copied().collect::<Vec<_>>(), State::on_ready as fn(State) -> bool),
            ("flushing", self.flushing.clone(), State::on_flushing),
        ] {
            for k in &list {
                match self.reqs.get(*k) {
                    Some(r) if ok(r.state) => {}
                    Some(r) => return Err(format!("request {k} on {name} is {:?}", r.state)),
                    None => return Err(format!("finished request {k} still on {name}")),
                }
            }
            let listed = self.reqs.iter().filter(|(_, r)| ok(r.state)).count();
            if listed != list.len() {
                return Err(format!("{} on {name}, {listed} requests in its states", list.len()));
            }
        }
        Ok(())
    }

    /// Checks the lane's invariants, for tests stepping it: every request on the list of its
    /// state and on no other; the queue's in-flight count equals the pieces requests have on it;
    /// the queue's own slot states and lists agree. Returns what is wrong.
    #[doc(hidden)]
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        self.check_lists()?;
        let pieces: u32 = self.reqs.iter().map(|(_, r)| r.state.outstanding()).sum();
        // Every slot of the queue is a piece not yet handed back (posted, parked, or failed
        // and waiting for the next reap).
        if pieces != self.q.outstanding() {
            return Err(format!("requests have {pieces} pieces on the queue, which holds {}", self.q.outstanding()));
        }
        // A range the target zeroes is sent only while it is held exclusively, and stays held
        // until its last answer.
        for (k, r) in &self.reqs {
            if let Kind::Zero { done } = r.kind {
                let held = r.hold.as_ref().is_some_and(|h| self.io.holds.is_granted(h));
                if r.state.on_flushing() && !held {
                    return Err(format!("request {k} is sent to be zeroed without its exclusive hold"));
                }
                if done >= r.len {
                    return Err(format!("request {k} has every piece answered ({done} bytes) and is not finished"));
                }
            }
        }
        self.q.check_invariants()
    }

    /// The session's wait policy ([`Options::wait`](crate::Options::wait)) for the event loop
    /// that owns this lane, with no history.
    pub fn waiter(&self) -> crate::Waiter {
        self.q.waiter()
    }

    /// Counts a wait of the lane's owning thread that went to sleep ([`EngineStats::sleeps`](crate::EngineStats::sleeps)).
    pub fn note_sleep(&self) {
        self.io.counters.sleeps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// Hands the next finished request back.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends, it empties
    pub fn next(&mut self) -> Option<Finished> {
        self.finished.pop_front()
    }

    /// Does what can be done without waiting: posts pieces, takes completions and replies, moves
    /// FLUSHes and read-modify-writes on.
    pub fn progress(&mut self) -> Result<()> {
        self.pump();
        self.reap(false, Instant::now())
    }

    /// Waits until a request finished (or none is pending), or `io_timeout` passes without
    /// any completion while pieces are in flight ([`Error::Timeout`]; the requests stay in
    /// progress). A FLUSH is waited for as long as the target is heard (the queue's liveness
    /// rule), not `io_timeout`: a write-back can take minutes.
    pub fn wait(&mut self) -> Result<()> {
        loop {
            self.progress()?;
            if !self.finished.is_empty() || self.pending() == 0 {
                return Ok(());
            }
            if self.q.in_flight() > 0 || self.q.awaiting_replies() > 0 {
                let deadline = Instant::now() + self.io_timeout;
                self.reap(true, deadline)?;
            } else if self.blocked {
                // A request waits for another lane: for a hold, or for an earlier FLUSH.
                self.io.holds.wait_release(Duration::from_millis(5));
            } else if self.q.parked() > 0 || !self.flushing.is_empty() {
                // Parked while the session reconnects, or a FLUSH waiting for it.
                self.q.wait_session(Instant::now() + Duration::from_millis(100));
            }
        }
    }

    /// Moves what can move without waiting: requests on `ready` (in order; a blocked head blocks
    /// the rest, so nothing overtakes it) and FLUSHes.
    fn pump(&mut self) {
        self.blocked = false;
        let mut i = 0;
        while i < self.ready.len() {
            let key = self.ready[i];
            match self.advance(key) {
                Step::Moved | Step::Stay => {}
                Step::Blocked => {
                    self.blocked = true;
                    break;
                }
                Step::Full => break,
            }
            // A request that left `ready` makes room at `i`; one that stays is passed.
            if self.ready.get(i) == Some(&key) {
                i += 1;
            }
        }
        self.q.commit();
        let mut j = 0;
        while j < self.flushing.len() {
            let key = self.flushing[j];
            self.advance_flush(key);
            if self.flushing.get(j) == Some(&key) {
                j += 1;
            }
        }
    }

    /// Moves request `key` on `ready` as far as it can go now.
    fn advance(&mut self, key: usize) -> Step {
        let Some(req) = self.reqs.get(key) else { return Step::Moved };
        match req.state {
            State::Barrier => {
                let seq = req.seq;
                let older =
                    self.reqs.iter().any(|(k, r)| k != key && r.seq < seq && !matches!(r.kind, Kind::Flush { .. }));
                if older {
                    return Step::Blocked;
                }
                self.io.counters.rmw.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let hold = self.io.holds.request_exclusive(req.offset, req.offset + req.len);
                self.reqs[key].hold = Some(hold);
                self.set_state(key, State::WaitingForHold);
                self.advance(key)
            }
            State::WaitingForHold => {
                if req.hold.is_none() {
                    // A range the target zeroes asks for its hold here, in submission order.
                    let hold = self.io.holds.request_exclusive(req.offset, req.offset + req.len);
                    self.reqs[key].hold = Some(hold);
                }
                let req = &self.reqs[key];
                let granted = req.hold.as_ref().is_some_and(|h| self.io.holds.try_grant(h));
                if !granted {
                    return Step::Blocked;
                }
                if matches!(req.kind, Kind::Zero { .. }) {
                    self.set_state(key, State::FlushQueued);
                    self.advance_flush(key);
                    return Step::Moved;
                }
                let req = &mut self.reqs[key];
                if let Kind::ReadModifyWrite(rmw) = &mut req.kind {
                    rmw.scratch = vec![0; req.len as usize];
                }
                self.set_state(key, State::ReadingEdges { posted: 0, outstanding: 0 });
                self.advance(key)
            }
            State::ReadingEdges { posted, outstanding } => {
                let Kind::ReadModifyWrite(rmw) = &req.kind else { unreachable!() };
                let edges = rmw.edges;
                let mut posted = posted;
                let mut outstanding = outstanding;
                let bs = bs(&self.geo()) as u32;
                while (posted as usize) < edges.len() {
                    let Some(at) = edges[posted as usize] else {
                        posted += 1;
                        continue;
                    };
                    if self.q.free_slots() == 0 {
                        self.reqs[key].state = State::ReadingEdges { posted, outstanding };
                        return Step::Full;
                    }
                    if let Err(e) = self.q.stage_read(at, bs, key as u64) {
                        self.reqs[key].error.get_or_insert(e);
                        return self.stop_posting(key, outstanding);
                    }
                    posted += 1;
                    outstanding += 1;
                }
                self.reqs[key].state = State::ReadingEdges { posted, outstanding };
                if outstanding == 0 {
                    self.patch(key);
                    return self.advance(key);
                }
                Step::Stay
            }
            State::Posting { next, outstanding } => self.post_pieces(key, next, outstanding),
            other => unreachable!("{other:?} on ready"),
        }
    }

    /// Posts request `key`'s pieces from byte `next` while the queue has room.
    fn post_pieces(&mut self, key: usize, mut next: u64, mut outstanding: u32) -> Step {
        let req = &mut self.reqs[key];
        let writes = req.op != IoOp::Read;
        if writes && req.hold.is_none() && next == 0 {
            match self.io.holds.try_shared(req.offset, req.offset + req.len) {
                Some(h) => req.hold = Some(h),
                // In order: nothing behind it overtakes it.
                None => return Step::Blocked,
            }
        }
        while next < req.len {
            if self.q.free_slots() == 0 {
                req.state = State::Posting { next, outstanding };
                return Step::Full;
            }
            let n = self.max.min(req.len - next);
            let offset = req.offset + next;
            let staged = match (&req.kind, req.op, &mut req.data) {
                (Kind::ReadModifyWrite(rmw), _, _) => {
                    self.q.stage_write(offset, &rmw.scratch[next as usize..(next + n) as usize], key as u64)
                }
                (_, IoOp::Read, Data::Registered(_)) | (_, IoOp::Write, Data::Registered(_)) => {
                    let Data::Registered(buf) = std::mem::take(&mut req.data) else { unreachable!() };
                    let dir = if req.op == IoOp::Read { Direction::Read } else { Direction::Write };
                    self.q.stage_buf(dir, offset, n as u32, buf, key as u64)
                }
                (_, IoOp::Read, _) => self.q.stage_read(offset, n as u32, key as u64),
                (_, IoOp::Write, Data::Bytes(v)) => {
                    self.q.stage_write(offset, &v[next as usize..(next + n) as usize], key as u64)
                }
                (_, IoOp::WriteZeroes { .. }, _) => self.q.stage_zeroes(offset, n as u32, key as u64),
                _ => Err(Error::Invalid { what: "request", offset, len: n, reason: InvalidReason::NoData }),
            };
            if let Err(e) = staged {
                req.error.get_or_insert(e);
                return self.stop_posting(key, outstanding);
            }
            next += n;
            outstanding += 1;
        }
        self.set_state(key, State::InFlight { outstanding });
        Step::Moved
    }

    /// A request stops posting after an error: it finishes once its pieces on the queue did.
    fn stop_posting(&mut self, key: usize, outstanding: u32) -> Step {
        if outstanding == 0 {
            self.set_state(key, State::InFlight { outstanding: 0 });
            self.complete(key);
        } else {
            self.set_state(key, State::InFlight { outstanding });
        }
        Step::Moved
    }

    /// A read-modify-write read its edges: the caller's bytes go into the covering blocks, which
    /// are then written back whole.
    fn patch(&mut self, key: usize) {
        let req = &mut self.reqs[key];
        if req.error.is_some() {
            self.stop_posting(key, 0);
            return;
        }
        let len = req.want as usize;
        if let Kind::ReadModifyWrite(rmw) = &mut req.kind {
            let o = rmw.skip;
            match &req.data {
                Data::Bytes(v) => rmw.scratch[o..o + len].copy_from_slice(v),
                _ => rmw.scratch[o..o + len].fill(0),
            }
        }
        self.set_state(key, State::Posting { next: 0, outstanding: 0 });
    }

    /// Moves FLUSH `key` on as far as it can go now.
    fn advance_flush(&mut self, key: usize) {
        let Some(req) = self.reqs.get(key) else { return };
        match req.state {
            State::FlushQueued => self.send_flush(key),
            State::Flushing { gen, .. } if gen != self.q.generation() => {
                // Sent on a queue pair a reconnect replaced: the reply never comes. Sending it
                // again is safe (a FLUSH only writes back), and it counts once.
                self.set_state(key, State::FlushQueued);
                self.send_flush(key);
            }
            State::Flushing { .. } => {
                // Its queue pair is gone for good (no reconnect, or I/O failing fast): the reply
                // never comes.
                if let Err(e) = self.q.accepting() {
                    self.flush_answered(key, Err(e));
                }
            }
            State::WaitingEarlier => {
                let Kind::Flush { seq, .. } = req.kind else { unreachable!("a FUA never waits for earlier flushes") };
                match self.io.earlier(seq) {
                    Earlier::Running => self.blocked = true,
                    Earlier::Clear => self.finish_flush(key, Ok(())),
                    Earlier::Failed => {
                        let e = control::earlier_failed(self.q.addr());
                        self.finish_flush(key, Err(e));
                    }
                }
            }
            other => unreachable!("{other:?} on flushing"),
        }
    }

    fn send_flush(&mut self, key: usize) {
        let req = &self.reqs[key];
        let fua_body;
        let msg = match &req.kind {
            Kind::Zero { done } => zero_message(req, *done),
            Kind::Flush { body: Some(b), .. } => {
                b.trace();
                Message::Flush(b.message())
            }
            _ => {
                fua_body = FlushBody::range(req.offset, req.len, self.features);
                fua_body.trace();
                Message::Flush(fua_body.message())
            }
        };
        match self.q.post_control(&msg) {
            Ok(Some(tag)) => {
                let gen = self.q.generation();
                let req = &mut self.reqs[key];
                req.flush_sent.get_or_insert_with(Instant::now);
                self.set_state(key, State::Flushing { tag, gen });
            }
            // No send buffer free, or the session reconnecting: again at the next progress.
            Ok(None) => {}
            Err(e) => self.flush_answered(key, Err(e)),
        }
    }

    /// The target answered the DISCARD or WRITE_ZEROES piece of request `key` (or sending it
    /// failed): the next piece, or the request is over (its hold released).
    fn zero_answered(&mut self, key: usize, answer: Result<()>) {
        let req = &mut self.reqs[key];
        let Kind::Zero { done } = &mut req.kind else { unreachable!("a zeroing request") };
        if answer.is_ok() {
            *done += req.len.saturating_sub(*done).min(rblk_proto::MAX_ZERO_LEN);
            if *done < req.len {
                self.set_state(key, State::FlushQueued);
                self.send_flush(key);
                return;
            }
        }
        self.flushing.retain(|&k| k != key);
        let mut req = self.reqs.remove(key);
        if let Some(h) = req.hold.take() {
            self.io.holds.release(h);
        }
        self.finish_request(req, answer);
    }

    /// The target answered FLUSH request `key` (or sending it failed).
    fn flush_answered(&mut self, key: usize, answer: Result<FlushedFlags>) {
        if matches!(self.reqs[key].kind, Kind::Zero { .. }) {
            return self.zero_answered(key, answer.map(|_| ()));
        }
        let answer = answer.and_then(|flags| match control::writes_lost(self.q.link()) {
            // The target crashed while this FLUSH waited for the session.
            Some(e) => Err(e),
            None => Ok(flags),
        });
        if let Err(e) = &answer {
            control::note_flush_error(&self.io, e);
        }
        let req = &self.reqs[key];
        match (&req.kind, answer) {
            (Kind::Flush { .. }, Ok(_)) => {
                self.end_flush(key, true);
                self.set_state(key, State::WaitingEarlier);
                self.advance_flush(key);
            }
            (_, result) => self.finish_flush(key, result.map(|_| ())),
        }
    }

    /// Ends FLUSH request `key` in the session's sequence (once): on failure its ranges are dirty
    /// again.
    fn end_flush(&mut self, key: usize, ok: bool) {
        if let Some(Req { kind: Kind::Flush { seq, ended, .. }, .. }) = self.reqs.get_mut(key) {
            if !*ended {
                *ended = true;
                self.io.end_flush(*seq, ok);
            }
        }
    }

    /// A FLUSH, or a FUA write's FLUSH, is over.
    fn finish_flush(&mut self, key: usize, result: Result<()>) {
        self.end_flush(key, result.is_ok());
        let req = self.reqs.remove(key);
        if let Kind::Flush { seq, .. } = req.kind {
            self.io.forget_flush(seq);
        }
        if req.state.on_flushing() {
            self.flushing.retain(|&k| k != key);
        }
        let took = req.flush_sent.map(|t| t.elapsed());
        if req.op == IoOp::Flush {
            self.io.count_flush(took, result.is_ok());
            self.finished.push_back(Finished { tag: req.tag, op: req.op, result, data: req.data });
        } else {
            // A FUA write: counted as a write, and its FLUSH as a FLUSH sent.
            self.io.count_flush(Some(took.unwrap_or_default()), result.is_ok());
            self.finish_request(req, result);
        }
    }

    /// Takes completions (waiting for at least one until `deadline` if `block`) and replies.
    fn reap(&mut self, block: bool, deadline: Instant) -> Result<()> {
        let n = if block { self.q.wait(&mut self.done, deadline)? } else { self.q.reap(&mut self.done) };
        for i in 0..n {
            let mut d = std::mem::take(&mut self.done[i]);
            self.on_done(&mut d);
        }
        while let Some((tag, reply)) = self.q.take_reply() {
            let key = self
                .flushing
                .iter()
                .copied()
                .find(|&k| self.reqs[k].state == State::Flushing { tag, gen: self.q.generation() });
            let Some(key) = key else {
                tracing::debug!(tag, "reply to a FLUSH sent before a reconnect ignored");
                continue;
            };
            let req = &self.reqs[key];
            let (request, expected) = match (&req.kind, req.op) {
                (Kind::Zero { .. }, IoOp::Discard) => (rblk_proto::Opcode::Discard, "OK(DISCARD)"),
                (Kind::Zero { .. }, _) => (rblk_proto::Opcode::WriteZeroes, "OK(WRITE_ZEROES)"),
                _ => (rblk_proto::Opcode::Flush, "FLUSHED"),
            };
            let answer = reply.and_then(|r| match r {
                Reply::Flushed(flags) if request == rblk_proto::Opcode::Flush => Ok(flags),
                Reply::Ok(op) if op == request => Ok(FlushedFlags::empty()),
                other => Err(Error::Protocol { addr: self.q.addr(), expected, got: other.name() }),
            });
            let answer = answer.map_err(|e| match e {
                Error::Target { addr, code, text, .. } => Error::Target { addr, request, code, text },
                other => other,
            });
            self.flush_answered(key, answer);
        }
        // Completions free slots and end holds; replies end FLUSHes: whatever waited may move.
        self.pump();
        Ok(())
    }

    fn on_done(&mut self, d: &mut Done) {
        let key = usize::try_from(d.user_data).ok().filter(|&k| self.reqs.contains(k));
        let Some(key) = key else {
            tracing::warn!(user_data = d.user_data, "completion of an unknown request ignored");
            return;
        };
        let req = &mut self.reqs[key];
        let state = match req.state {
            State::Posting { next, outstanding } => State::Posting { next, outstanding: outstanding - 1 },
            State::InFlight { outstanding } => State::InFlight { outstanding: outstanding - 1 },
            State::ReadingEdges { posted, outstanding } => State::ReadingEdges { posted, outstanding: outstanding - 1 },
            other => unreachable!("a completion for a request in {other:?}"),
        };
        req.state = state;
        // The caller's registered buffer comes back (after success or failure alike). Other
        // buffers a Done holds are the pool's: a read's data, copied out below.
        if matches!(req.data, Data::None) && matches!(req.kind, Kind::Read { .. } | Kind::Write) {
            if let Some(buf) = d.take_buffer() {
                req.data = Data::Registered(buf);
            }
        }
        match std::mem::replace(&mut d.result, Ok(())) {
            Err(e) => {
                req.error.get_or_insert(e);
            }
            Ok(()) => {
                // A read into bytes of ours: a read-modify-write's edges, or the caller's bytes.
                let into = match (&mut req.kind, &mut req.data) {
                    (Kind::ReadModifyWrite(rmw), _) => Some(&mut rmw.scratch),
                    (_, Data::Bytes(v)) => Some(v),
                    _ => None,
                };
                if let (Direction::Read, Some(into)) = (d.dir, into) {
                    let o = (d.offset - req.offset) as usize;
                    if let Err(e) = d.read_data(&mut into[o..o + d.len as usize]) {
                        req.error.get_or_insert(e);
                    }
                }
            }
        }
        d.release();
        match state {
            // patch() finishes it instead when an edge read failed.
            State::ReadingEdges { posted, outstanding: 0 } if posted as usize == 2 => self.patch(key),
            State::InFlight { outstanding: 0 } => self.complete(key),
            State::Posting { outstanding: 0, .. } if self.reqs[key].error.is_some() => {
                self.stop_posting(key, 0);
            }
            _ => {}
        }
    }

    /// A request's last piece is done: release its blocks, send FUA's FLUSH, or hand it back.
    fn complete(&mut self, key: usize) {
        let req = &mut self.reqs[key];
        if let Some(h) = req.hold.take() {
            self.io.holds.release(h);
        }
        if req.error.is_none() && req.fua {
            // The FLUSH covers the blocks written (a read-modify-write's: all it wrote back).
            self.set_state(key, State::FlushQueued);
            self.advance_flush(key);
            return;
        }
        let mut req = self.reqs.remove(key);
        let result = req.error.take().map_or(Ok(()), Err);
        self.finish_request(req, result);
    }

    /// Hands a caller's request back: its data trimmed, counted.
    fn finish_request(&mut self, mut req: Req, result: Result<()>) {
        if let (Kind::Read { trim: Some(skip) }, Data::Bytes(v)) = (&req.kind, &mut req.data) {
            v.copy_within(*skip..*skip + req.want as usize, 0);
            v.truncate(req.want as usize);
        }
        let data = std::mem::take(&mut req.data);
        self.hand_back(Finished { tag: req.tag, op: req.op, result, data }, req.want, Some(req.started));
    }

    /// Hands a caller's request back, counted: completed, bytes, errors, latency (lock-free).
    fn hand_back(&mut self, f: Finished, bytes: u64, started: Option<Instant>) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.io.counters;
        let (count, moved, latency) = match f.op {
            IoOp::Read => (&c.reads, &c.read_bytes, &c.read_latency),
            IoOp::Discard => (&c.discards, &c.discarded_bytes, &c.write_latency),
            _ => (&c.writes, &c.written_bytes, &c.write_latency),
        };
        match &f.result {
            Ok(()) => {
                moved.fetch_add(bytes, Relaxed);
            }
            Err(_) => {
                c.errors.fetch_add(1, Relaxed);
            }
        }
        // Refused at submission: an error, not a request that ran.
        if let Some(started) = started {
            count.fetch_add(1, Relaxed);
            latency.record(started.elapsed());
        }
        self.finished.push_back(f);
    }

    /// Runs one request to its end (the lane must have no other requests of the caller's).
    pub fn run(&mut self, r: Request) -> Finished {
        let tag = r.tag;
        let op = r.op;
        self.submit(r);
        loop {
            if let Some(i) = self.finished.iter().position(|f| f.tag == tag) {
                return self.finished.remove(i).expect("present");
            }
            if let Err(e) = self.wait() {
                return Finished { tag, op, result: Err(e), data: Data::None };
            }
        }
    }

    /// Reads `buf.len()` bytes at `offset` (any offset and length inside the volume).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<()> {
        let scratch = std::mem::take(&mut self.scratch);
        let r = Request {
            tag: u64::MAX,
            op: IoOp::Read,
            offset,
            len: buf.len() as u64,
            fua: false,
            data: Data::Bytes(scratch),
        };
        let f = self.run(r);
        let result = f.result.and_then(|()| match &f.data {
            Data::Bytes(v) => {
                buf.copy_from_slice(&v[..buf.len()]);
                Ok(())
            }
            _ => Err(Error::Invalid { what: "read", offset, len: buf.len() as u64, reason: InvalidReason::NoData }),
        });
        if let Data::Bytes(v) = f.data {
            self.scratch = v;
        }
        result
    }

    /// Writes `data` at `offset` (any offset and length inside the volume); with `fua`, it is
    /// durable when this returns.
    pub fn write_at(&mut self, data: &[u8], offset: u64, fua: bool) -> Result<()> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.extend_from_slice(data);
        let r =
            Request { tag: u64::MAX, op: IoOp::Write, offset, len: data.len() as u64, fua, data: Data::Bytes(scratch) };
        let f = self.run(r);
        if let Data::Bytes(v) = f.data {
            self.scratch = v;
        }
        f.result
    }

    /// Makes `len` bytes at `offset` read as zeros, their blocks kept allocated (see
    /// [`IoOp::WriteZeroes`]); with `fua`, durable when this returns.
    pub fn write_zeroes(&mut self, offset: u64, len: u64, fua: bool) -> Result<()> {
        let op = IoOp::WriteZeroes { unmap: false };
        self.run(Request { tag: u64::MAX, op, offset, len, fua, data: Data::None }).result
    }

    /// Discards `len` bytes at `offset`, whole blocks (see [`IoOp::Discard`]).
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.run(Request { tag: u64::MAX, op: IoOp::Discard, offset, len, fua: false, data: Data::None }).result
    }

    /// Whether the target zeroes ranges itself ([`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD)):
    /// [`IoOp::Discard`] works, and [`IoOp::WriteZeroes`] of whole blocks moves nothing.
    pub fn discards(&self) -> bool {
        self.features & rblk_proto::FEATURE_DISCARD != 0
    }

    /// Makes every completed write durable (a FLUSH of the dirty ranges; none when clean).
    pub fn flush(&mut self) -> Result<()> {
        self.run(Request { tag: u64::MAX, op: IoOp::Flush, offset: 0, len: 0, fua: false, data: Data::None }).result
    }
}

/// The DISCARD or WRITE_ZEROES of zeroing request `req`'s piece from `done` bytes in.
fn zero_message(req: &Req, done: u64) -> Message<'static> {
    let (offset, len) = (req.offset + done, req.len.saturating_sub(done).min(rblk_proto::MAX_ZERO_LEN));
    match req.op {
        IoOp::WriteZeroes { unmap } => {
            let mut flags = rblk_proto::ZeroFlags::empty();
            if !unmap {
                flags = flags | rblk_proto::ZeroFlags::NO_UNMAP;
            }
            if req.fua {
                flags = flags | rblk_proto::ZeroFlags::FUA;
            }
            Message::WriteZeroes { offset, len, flags }
        }
        _ => Message::Discard { offset, len },
    }
}

/// What [`Lane::advance`] did with a request on `ready`.
enum Step {
    /// It left `ready` (all posted, or finished).
    Moved,
    /// It stays on `ready` and does not block the ones behind it (its pieces wait for
    /// completions).
    Stay,
    /// It waits for another lane (a hold): nothing behind it may overtake it.
    Blocked,
    /// The queue is full.
    Full,
}

impl Drop for Lane {
    /// Holds and FLUSHes of requests still here end with the lane, so no other lane waits for
    /// them.
    fn drop(&mut self) {
        let keys: Vec<usize> = self.reqs.iter().map(|(k, _)| k).collect();
        for key in keys {
            if let Kind::Flush { seq, .. } = self.reqs[key].kind {
                self.io.forget_flush(seq);
            }
            if let Some(h) = self.reqs[key].hold.take() {
                self.io.holds.release(h);
            }
        }
    }
}
