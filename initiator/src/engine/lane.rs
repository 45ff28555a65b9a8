//! A lane: one queue pair of a session, owned by one thread, running block requests on it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::locks::Hold;
use super::Control;
use crate::dirty::{self, Shared};
use crate::{Buffer, Direction, Done, Error, Geometry, InvalidReason, Queue, Result, DEFAULT_IO_TIMEOUT};

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    /// Read `len` bytes at `offset`.
    Read,
    /// Write the request's data at `offset`.
    Write,
    /// Write `len` zero bytes at `offset` (RDMA WRITEs from a zeroed registration).
    WriteZeroes,
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

/// One request in progress.
#[derive(Debug)]
struct Req {
    tag: u64,
    op: IoOp,
    offset: u64,
    len: u64,
    fua: bool,
    data: Data,
    /// Bytes handed to the queue so far.
    submitted: u64,
    /// Pieces in flight.
    outstanding: u32,
    error: Option<Error>,
    hold: Option<Hold>,
    /// Part of a read-modify-write, which holds the blocks exclusively: no lock of its own, and
    /// its result goes to the read-modify-write, not to the caller.
    internal: bool,
    /// A read of covering blocks: the caller's bytes start here.
    trim: Option<usize>,
    /// The caller's length for a trimmed read.
    want: usize,
    /// The data is a registered buffer of the caller's, lent to the queue while in flight.
    registered: bool,
    /// Submission order (0 for the parts of a read-modify-write, which run as soon as they can).
    seq: u64,
    /// When the caller submitted it (its latency is measured from here).
    started: Instant,
}

/// One piece of a request on the queue.
#[derive(Debug, Clone, Copy)]
struct Piece {
    req: usize,
    at: u64,
    len: u64,
}

/// One queue pair of a session and the block requests running on it.
///
/// Requests of any offset and length go in with [`submit`](Self::submit); each is checked
/// against the volume, split into pieces of at most [`max_piece`](Self::max_piece) bytes, and
/// kept at most the queue's depth in flight; [`next`](Self::next) hands back finished ones, in
/// whatever order they finish. Requests that cover blocks only partly are read-modify-writes: they
/// wait until the lane has nothing else in flight and then run alone, holding their blocks
/// exclusively against every lane of the session. A write holds its blocks shared while in
/// flight, so a read-modify-write never undoes it.
///
/// The owning thread drives it: [`wait`](Self::wait) blocks, [`progress`](Self::progress)
/// does not; [`event_fd`](Self::event_fd) and [`arm`](Self::arm) let an event loop of the
/// caller's (a ublk queue's io_uring) wait instead. The synchronous calls ([`read_at`](Self::read_at),
/// [`write_at`](Self::write_at), [`write_zeroes`](Self::write_zeroes), [`flush`](Self::flush)) are for a
/// lane with no requests of the caller's outstanding.
#[derive(Debug)]
pub struct Lane {
    q: Queue,
    control: Option<Arc<Control>>,
    shared: Shared,
    geo: Geometry,
    max: u64,
    reqs: Vec<Option<Req>>,
    free_reqs: Vec<usize>,
    pieces: Vec<Option<Piece>>,
    free_pieces: Vec<usize>,
    /// Requests with pieces left to submit, oldest first.
    ready: VecDeque<usize>,
    /// Partial-block writes waiting for the lane to be idle.
    barrier: VecDeque<usize>,
    finished: VecDeque<Finished>,
    /// Finished parts of the running read-modify-write.
    internal_done: Vec<(usize, Result<()>, Data)>,
    done: Vec<Done>,
    io_timeout: Duration,
    /// Reused by the synchronous calls.
    scratch: Vec<u8>,
    next_seq: u64,
    /// Post only in progress(), not at every submit (an event loop that submits many requests
    /// per wakeup: one doorbell for all of them).
    defer_posts: bool,
}

fn bs(geo: &Geometry) -> u64 {
    u64::from(geo.block_size.max(1))
}

impl Lane {
    pub(crate) fn new(q: Queue, control: Option<Arc<Control>>) -> Lane {
        let depth = q.depth() as usize;
        let shared = Arc::clone(q.shared());
        let geo = q.geometry();
        let max = q.max_len();
        Lane {
            q,
            control,
            shared,
            geo,
            max,
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            pieces: vec![None; depth],
            free_pieces: (0..depth).rev().collect(),
            ready: VecDeque::new(),
            barrier: VecDeque::new(),
            finished: VecDeque::new(),
            internal_done: Vec::new(),
            done: std::iter::repeat_with(Done::default).take(depth).collect(),
            io_timeout: DEFAULT_IO_TIMEOUT,
            scratch: Vec::new(),
            next_seq: 1,
            defer_posts: false,
        }
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

    /// The volume's geometry.
    pub fn geometry(&self) -> Geometry {
        self.geo
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
        self.reqs.len() - self.free_reqs.len() + self.finished.len()
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

    /// Housekeeping, every second or so while the owning thread has nothing else to do: the
    /// queue's keepalives and loss detection ([`Queue::tick`]: while the session is lost, a due
    /// reconnect attempt and the rejoin), and the same for the session's first queue pair.
    pub fn tick(&mut self) -> Result<()> {
        self.q.tick();
        match &self.control {
            Some(c) => c.keepalive(),
            None => Ok(()),
        }
    }

    /// Starts a request. Requests that fail their checks finish at once with the reason.
    pub fn submit(&mut self, r: Request) {
        let started = Instant::now();
        if let Err(e) = self.check(&r) {
            self.finish(Finished { tag: r.tag, op: r.op, result: Err(e), data: r.data }, 0, None);
            return;
        }
        if r.op == IoOp::Flush {
            // The control path counts and times FLUSHes, of every front end.
            let result = self.flush_now(None);
            self.finished.push_back(Finished { tag: r.tag, op: r.op, result, data: r.data });
            return;
        }
        let bs = bs(&self.geo);
        let (start, end) = (r.offset / bs * bs, (r.offset + r.len).div_ceil(bs) * bs);
        let aligned = start == r.offset && end == r.offset + r.len;
        let registered = matches!(r.data, Data::Registered(_));
        let mut req = Req {
            tag: r.tag,
            op: r.op,
            offset: r.offset,
            len: r.len,
            fua: r.fua,
            data: r.data,
            submitted: 0,
            outstanding: 0,
            error: None,
            hold: None,
            internal: false,
            trim: None,
            want: r.len as usize,
            registered,
            seq: self.next_seq,
            started,
        };
        self.next_seq += 1;
        if r.op == IoOp::Read {
            if let Data::Bytes(v) = &mut req.data {
                v.resize((end - start) as usize, 0);
            }
            if !aligned {
                // Read the covering blocks; the caller gets its bytes from inside them.
                req.trim = Some((r.offset - start) as usize);
                req.offset = start;
                req.len = end - start;
            }
        }
        let index = self.insert(req);
        if aligned || r.op == IoOp::Read {
            self.ready.push_back(index);
        } else {
            self.barrier.push_back(index);
        }
        if !self.defer_posts {
            self.pump();
        }
    }

    fn check(&self, r: &Request) -> Result<()> {
        let dir = if r.op == IoOp::Read { Direction::Read } else { Direction::Write };
        let what = match r.op {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::WriteZeroes => "write of zeroes",
            IoOp::Flush => return Ok(()),
        };
        let bs = bs(&self.geo);
        let invalid = |reason| Err(Error::Invalid { what, offset: r.offset, len: r.len, reason });
        if r.len == 0 {
            return invalid(InvalidReason::ZeroLength);
        }
        // The covering blocks must lie inside the volume (its size is a multiple of the block size).
        let Some(end) = r.offset.checked_add(r.len) else {
            return invalid(InvalidReason::OutOfRange { size: self.geo.size });
        };
        let (start, end) = (r.offset / bs * bs, end.div_ceil(bs) * bs);
        self.geo.check_as(what, dir, start, end - start, None)?;
        dirty::check_writable(&self.shared, dir, start, end - start)?;
        match (&r.data, r.op) {
            (Data::Registered(b), IoOp::Read | IoOp::Write) => {
                if start != r.offset || end != r.offset + r.len {
                    return invalid(InvalidReason::OffsetUnaligned { block_size: self.geo.block_size });
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
            (Data::Bytes(_), _) | (Data::None, IoOp::WriteZeroes) => {}
            _ => return invalid(InvalidReason::NoData),
        }
        if r.fua && self.control.is_none() {
            return invalid(InvalidReason::NoData);
        }
        Ok(())
    }

    fn insert(&mut self, req: Req) -> usize {
        match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i] = Some(req);
                i
            }
            None => {
                self.reqs.push(Some(req));
                self.reqs.len() - 1
            }
        }
    }

    /// Hands the next finished request back.
    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends, it empties
    pub fn next(&mut self) -> Option<Finished> {
        self.finished.pop_front()
    }

    /// Does what can be done without waiting: posts pieces, takes completions, runs a waiting
    /// read-modify-write once the lane is idle (that one waits for its own I/O).
    pub fn progress(&mut self) -> Result<()> {
        self.pump();
        self.reap(false, Instant::now())?;
        self.run_barrier()
    }

    /// Waits until a request finished (or none is pending), or `io_timeout` passes without
    /// any completion ([`Error::Timeout`]; the requests stay in progress).
    pub fn wait(&mut self) -> Result<()> {
        loop {
            self.progress()?;
            if !self.finished.is_empty() || self.pending() == 0 {
                return Ok(());
            }
            if self.q.in_flight() > 0 {
                let deadline = Instant::now() + self.io_timeout;
                self.reap(true, deadline)?;
            } else if !self.ready.is_empty() {
                // The head waits for a read-modify-write of another lane to release its blocks.
                self.shared.locks.wait_release(Duration::from_millis(5));
            }
        }
    }

    /// Posts pieces of ready requests while the queue has room.
    fn pump(&mut self) {
        // The oldest waiting read-modify-write's submission order.
        let barrier_seq = self.barrier.front().and_then(|&b| self.reqs[b].as_ref()).map(|b| b.seq);
        while let Some(&index) = self.ready.front() {
            let Some(req) = self.reqs[index].as_mut() else {
                self.ready.pop_front();
                continue;
            };
            if req.error.is_some() || req.submitted == req.len {
                self.ready.pop_front();
                if req.outstanding == 0 {
                    self.complete(index);
                }
                continue;
            }
            // A waiting read-modify-write runs once the lane is idle: nothing submitted after it
            // starts before it, or a steady stream of requests would starve it.
            if req.seq != 0 && barrier_seq.is_some_and(|b| req.seq > b) {
                break;
            }
            if req.op != IoOp::Read && !req.internal && req.hold.is_none() {
                match self.shared.locks.try_shared(req.offset, req.offset + req.len) {
                    Some(h) => req.hold = Some(h),
                    // In order: nothing behind it overtakes it.
                    None => break,
                }
            }
            let Some(tag) = self.free_pieces.pop() else { break };
            let at = req.submitted;
            let n = self.max.min(req.len - at);
            let offset = req.offset + at;
            let started = match (req.op, &mut req.data) {
                (IoOp::Read, Data::Registered(_)) | (IoOp::Write, Data::Registered(_)) => {
                    let Data::Registered(buf) = std::mem::take(&mut req.data) else { unreachable!() };
                    if req.op == IoOp::Read {
                        self.q.submit_read_buf(offset, n as u32, buf, tag as u64)
                    } else {
                        self.q.submit_write_buf(offset, n as u32, buf, tag as u64)
                    }
                }
                (IoOp::Read, _) => self.q.submit_read(offset, n as u32, tag as u64),
                (IoOp::Write, Data::Bytes(v)) => {
                    self.q.submit_write(offset, &v[at as usize..(at + n) as usize], tag as u64)
                }
                (IoOp::WriteZeroes, _) => self.q.submit_zeroes(offset, n as u32, tag as u64),
                _ => Err(Error::Invalid { what: "request", offset, len: n, reason: InvalidReason::NoData }),
            };
            match started {
                Ok(()) => {
                    req.submitted += n;
                    req.outstanding += 1;
                    self.pieces[tag] = Some(Piece { req: index, at, len: n });
                }
                Err(e) => {
                    self.free_pieces.push(tag);
                    req.error.get_or_insert(e);
                }
            }
        }
        self.q.commit();
    }

    /// Takes completions (waiting for at least one until `deadline` if `block`).
    fn reap(&mut self, block: bool, deadline: Instant) -> Result<()> {
        let n = if block { self.q.wait(&mut self.done, deadline)? } else { self.q.reap(&mut self.done) };
        for i in 0..n {
            let mut d = std::mem::take(&mut self.done[i]);
            self.on_done(&mut d);
        }
        if n > 0 {
            self.pump();
        }
        Ok(())
    }

    fn on_done(&mut self, d: &mut Done) {
        let Some(piece) = usize::try_from(d.user_data).ok().and_then(|t| self.pieces.get_mut(t)).and_then(Option::take)
        else {
            tracing::warn!(tag = d.user_data, "completion of an unknown piece ignored");
            return;
        };
        self.free_pieces.push(d.user_data as usize);
        let Some(req) = self.reqs[piece.req].as_mut() else { return };
        req.outstanding -= 1;
        if req.registered {
            // The caller's registered buffer comes back (after success or failure alike).
            if let Some(buf) = d.take_buffer() {
                req.data = Data::Registered(buf);
            }
        }
        match std::mem::replace(&mut d.result, Ok(())) {
            Err(e) => {
                req.error.get_or_insert(e);
            }
            Ok(()) => {
                if let Data::Bytes(v) = &mut req.data {
                    if req.op == IoOp::Read {
                        let (a, b) = (piece.at as usize, (piece.at + piece.len) as usize);
                        if let Err(e) = d.read_data(&mut v[a..b]) {
                            req.error.get_or_insert(e);
                        }
                    }
                }
            }
        }
        d.release();
        if req.outstanding == 0 && (req.submitted == req.len || req.error.is_some()) {
            self.ready.retain(|&i| i != piece.req);
            self.complete(piece.req);
        }
    }

    /// A request's last piece is done: release its blocks, flush for FUA, hand it back.
    fn complete(&mut self, index: usize) {
        let Some(mut req) = self.reqs[index].take() else { return };
        self.free_reqs.push(index);
        if let Some(h) = req.hold.take() {
            self.shared.locks.release(h);
        }
        let mut result = req.error.take().map_or(Ok(()), Err);
        if req.internal {
            self.internal_done.push((index, result, req.data));
            return;
        }
        if result.is_ok() && req.fua {
            result = self.flush_now(Some((req.offset, req.len))).map(|_| ());
        }
        if let (Some(skip), Data::Bytes(v)) = (req.trim, &mut req.data) {
            v.copy_within(skip..skip + req.want, 0);
            v.truncate(req.want);
        }
        self.finish(Finished { tag: req.tag, op: req.op, result, data: req.data }, req.want as u64, Some(req.started));
    }

    /// Hands a caller's request back, counted: completed, bytes, errors, latency (lock-free).
    fn finish(&mut self, f: Finished, bytes: u64, started: Option<Instant>) {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.shared.counters;
        let (count, moved, latency) = match f.op {
            IoOp::Read => (&c.reads, &c.read_bytes, &c.read_latency),
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

    fn flush_now(&mut self, range: Option<(u64, u64)>) -> Result<()> {
        let control = self.control.as_ref().ok_or(Error::Invalid {
            what: "flush",
            offset: 0,
            len: 0,
            reason: InvalidReason::NoData,
        })?;
        match range {
            None => control.flush().map(|_| ()),
            Some((offset, len)) => control.flush_range(offset, len).map(|_| ()),
        }
    }

    /// Runs the oldest waiting read-modify-write, once nothing else is in flight.
    fn run_barrier(&mut self) -> Result<()> {
        loop {
            let Some(&index) = self.barrier.front() else { return Ok(()) };
            let seq = self.reqs[index].as_ref().map_or(0, |r| r.seq);
            // Everything submitted before it has finished.
            let older_ready = self.ready.iter().any(|&i| self.reqs[i].as_ref().is_some_and(|r| r.seq < seq));
            if self.q.in_flight() > 0 || older_ready {
                return Ok(());
            }
            self.barrier.pop_front();
            let Some(mut req) = self.reqs[index].take() else { continue };
            self.free_reqs.push(index);
            let result = self.read_modify_write(&req);
            let bs = bs(&self.geo);
            let (start, end) = (req.offset / bs * bs, (req.offset + req.len).div_ceil(bs) * bs);
            let result = match result {
                // The FLUSH covers the blocks written back.
                Ok(()) if req.fua => self.flush_now(Some((start, end - start))),
                other => other,
            };
            if let Err(e) = &result {
                if matches!(e, Error::Timeout { .. }) {
                    // The queue stopped completing: the lane is unusable; say so to the caller.
                    let f = Finished { tag: req.tag, op: req.op, result, data: req.data };
                    self.finish(f, req.len, Some(req.started));
                    return Err(Error::ConnectionLost {
                        addr: self.q.addr(),
                        reason: "a read-modify-write timed out".into(),
                    });
                }
            }
            let data = std::mem::take(&mut req.data);
            self.finish(Finished { tag: req.tag, op: req.op, result, data }, req.len, Some(req.started));
        }
    }

    /// A write of partial blocks: holds the covering blocks exclusively, reads the partial edge
    /// blocks, patches the caller's bytes in and writes the covering range back.
    fn read_modify_write(&mut self, req: &Req) -> Result<()> {
        self.shared.counters.rmw.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bs = bs(&self.geo);
        let (start, end) = (req.offset / bs * bs, (req.offset + req.len).div_ceil(bs) * bs);
        let hold = self.shared.locks.exclusive(start, end);
        let result = self.rmw_locked(req, start, end, bs);
        self.shared.locks.release(hold);
        result
    }

    fn rmw_locked(&mut self, req: &Req, start: u64, end: u64, bs: u64) -> Result<()> {
        let mut scratch = vec![0u8; (end - start) as usize];
        let mut edges = Vec::with_capacity(2);
        if req.offset != start {
            edges.push(start);
        }
        if req.offset + req.len != end && edges.last() != Some(&(end - bs)) {
            edges.push(end - bs);
        }
        let reads: Vec<(usize, u64)> = edges
            .iter()
            .map(|&at| (self.internal(IoOp::Read, at, bs, Data::Bytes(vec![0; bs as usize])), at))
            .collect();
        for (index, at) in reads {
            let data = self.run_internal(index)?;
            if let Data::Bytes(v) = data {
                let o = (at - start) as usize;
                scratch[o..o + bs as usize].copy_from_slice(&v);
            }
        }
        let o = (req.offset - start) as usize;
        match &req.data {
            Data::Bytes(v) => scratch[o..o + req.len as usize].copy_from_slice(v),
            _ => scratch[o..o + req.len as usize].fill(0),
        }
        let index = self.internal(IoOp::Write, start, end - start, Data::Bytes(scratch));
        self.run_internal(index).map(|_| ())
    }

    fn internal(&mut self, op: IoOp, offset: u64, len: u64, data: Data) -> usize {
        let req = Req {
            tag: 0,
            op,
            offset,
            len,
            fua: false,
            data,
            submitted: 0,
            outstanding: 0,
            error: None,
            hold: None,
            internal: true,
            trim: None,
            want: len as usize,
            registered: false,
            seq: 0,
            started: Instant::now(),
        };
        let index = self.insert(req);
        // First in line: requests held back behind a later read-modify-write must not hold back
        // the parts of the one running now.
        self.ready.push_front(index);
        index
    }

    /// Drives the lane until internal request `index` finished.
    fn run_internal(&mut self, index: usize) -> Result<Data> {
        loop {
            self.pump();
            if let Some(i) = self.internal_done.iter().position(|d| d.0 == index) {
                let (_, result, data) = self.internal_done.swap_remove(i);
                return result.map(|()| data);
            }
            let deadline = Instant::now() + self.io_timeout;
            if self.q.in_flight() == 0 {
                // Nothing could be posted and nothing completes: never expected.
                return Err(Error::Invalid {
                    what: "read-modify-write",
                    offset: 0,
                    len: 0,
                    reason: InvalidReason::NoData,
                });
            }
            self.reap(true, deadline)?;
        }
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

    /// Writes `len` zero bytes at `offset`.
    pub fn write_zeroes(&mut self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.run(Request { tag: u64::MAX, op: IoOp::WriteZeroes, offset, len, fua, data: Data::None }).result
    }

    /// Makes every completed write durable (a FLUSH of the dirty ranges; none when clean).
    pub fn flush(&mut self) -> Result<()> {
        self.run(Request { tag: u64::MAX, op: IoOp::Flush, offset: 0, len: 0, fua: false, data: Data::None }).result
    }
}
