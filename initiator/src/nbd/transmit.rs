//! The transmission phase: requests in, simple replies out, pipelined.
//!
//! A reader thread parses requests (and a write's payload) off the stream and checks them
//! against the export; the connection's thread submits their block-aligned pieces to the
//! device's queue as they arrive, up to its depth, and replies to each request as soon as its
//! last piece completed, in whatever order that happens (NBD allows it). Requests not aligned to
//! the block size are barriers: they wait until nothing else is in flight, then run alone as a
//! read-modify-write of their partial blocks, so two clients' writes to neighbouring sectors of
//! one block cannot undo each other within a connection. FLUSH flushes what completed (every
//! write replied to so far); FUA writes flush after their own completion, before their reply.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes as _;

use super::device::{BlockDevice, ReadOut};
use super::wire::{self, Errno, ExportGeometry, Op, RequestHeader};

/// How a connection's transmission phase ended.
#[derive(Debug)]
pub enum End {
    /// The client sent NBD_CMD_DISC.
    Disconnect,
    /// The client closed the connection (or the server shut down reading).
    Closed,
    /// Reading from the client failed.
    ReadFailed(io::Error),
    /// The client broke the protocol (bad request magic): hard disconnect.
    Violation(String),
    /// Writing a reply failed: the client is gone.
    WriteFailed(io::Error),
    /// The device stopped completing operations.
    DeviceFailed(io::Error),
}

impl End {
    /// True for the endings a client asks for.
    pub fn is_clean(&self) -> bool {
        matches!(self, End::Disconnect | End::Closed)
    }
}

impl std::fmt::Display for End {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            End::Disconnect => f.write_str("the client disconnected (NBD_CMD_DISC)"),
            End::Closed => f.write_str("the connection closed"),
            End::ReadFailed(e) => write!(f, "reading a request failed: {e}"),
            End::Violation(why) => write!(f, "protocol violation: {why}"),
            End::WriteFailed(e) => write!(f, "writing a reply failed: {e}"),
            End::DeviceFailed(e) => write!(f, "the volume stopped answering: {e}"),
        }
    }
}

/// Requests parsed ahead of the executor.
const CHANNEL: usize = 16;
/// Requests in progress at once.
const MAX_REQS: usize = 128;
/// Request data (write payloads, read replies) held by requests in progress, beyond the first.
const BUDGET: usize = 64 << 20;
/// How often the device gets its housekeeping (rblk keepalives go every 2 s).
const TICK: Duration = Duration::from_secs(1);
/// How long the device may take to complete anything while operations are outstanding.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// From the reader thread.
enum Incoming {
    Request { handle: u64, op: Result<Op, Errno>, data: Vec<u8> },
    End(End),
}

/// Serves requests from `reader` with replies to `writer` until the client disconnects, then
/// closes the device. `close` runs once the replies are done, to unblock the reader (shut the
/// socket down); the reader thread has ended when this returns.
pub fn transmit<D: BlockDevice>(reader: impl Read + Send, writer: impl Write, dev: D, close: impl FnOnce()) -> End {
    let geo = dev.geometry();
    let (tx, rx) = mpsc::sync_channel(CHANNEL);
    thread::scope(|s| {
        let reader = thread::Builder::new()
            .name("rblk-nbd-reader".into())
            .spawn_scoped(s, move || read_requests(reader, geo, &tx));
        let end = match reader {
            Ok(_) => Exec::new(dev, writer).run(rx),
            Err(e) => {
                let mut dev = dev;
                let _ = dev.close();
                End::ReadFailed(e)
            }
        };
        close();
        end
    })
}

/// The reader thread: parses, checks and forwards requests until DISC, EOF or a bad magic.
fn read_requests(mut r: impl Read, geo: ExportGeometry, tx: &SyncSender<Incoming>) {
    let end = loop {
        let mut raw = [0u8; 28];
        match read_header(&mut r, &mut raw) {
            Ok(true) => {}
            Ok(false) => break End::Closed,
            Err(e) => break End::ReadFailed(e),
        }
        let hdr = match RequestHeader::parse(&raw) {
            Ok(hdr) => hdr,
            Err(e) => break End::Violation(e.to_string()),
        };
        let op = hdr.check(&geo);
        let mut data = Vec::new();
        let read = match op {
            Ok(Op::Write { len, .. }) => {
                data = vec![0; len as usize];
                r.read_exact(&mut data)
            }
            // A refused write's payload is still on the wire.
            _ => drain(&mut r, hdr.payload_len().into()),
        };
        if let Err(e) = read {
            break End::ReadFailed(e);
        }
        let disc = op == Ok(Op::Disc);
        if tx.send(Incoming::Request { handle: hdr.handle.get(), op, data }).is_err() || disc {
            // The executor is gone, or the client may send nothing after DISC.
            return;
        }
    };
    let _ = tx.send(Incoming::End(end));
}

/// Fills `buf`; `false` on a clean EOF before its first byte.
fn read_header(r: &mut impl Read, buf: &mut [u8; 28]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed mid-request")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and drops `len` bytes.
pub fn drain(r: &mut impl Read, len: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(len), &mut io::sink())?;
    if copied < len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the connection closed mid-request"));
    }
    Ok(())
}

/// The errno a failed device operation becomes.
fn errno(e: &io::Error) -> Errno {
    match e.kind() {
        io::ErrorKind::InvalidInput => Errno::Inval,
        io::ErrorKind::PermissionDenied => Errno::Perm,
        _ => Errno::Io,
    }
}

/// A request in progress.
#[derive(Debug)]
struct Req {
    handle: u64,
    kind: Kind,
    offset: u64,
    len: usize,
    fua: bool,
    /// Bytes handed to the device so far.
    submitted: usize,
    /// Pieces in flight.
    outstanding: usize,
    /// Still in the submission queue (it has unsubmitted pieces and no error).
    queued: bool,
    error: Option<Errno>,
}

#[derive(Debug)]
enum Kind {
    /// The reply's data, filled in as pieces complete.
    Read(Vec<u8>),
    Write(Vec<u8>),
    Zeroes,
}

impl Req {
    /// Bytes it holds.
    fn bytes(&self) -> usize {
        match &self.kind {
            Kind::Read(b) | Kind::Write(b) => b.len(),
            Kind::Zeroes => 0,
        }
    }
}

/// One piece of a request on the device: its request and where in it.
#[derive(Debug, Clone, Copy)]
struct Piece {
    req: usize,
    at: usize,
    len: usize,
}

/// Requests and pieces in flight (everything but the device and the writer).
#[derive(Debug)]
struct State {
    reqs: Vec<Option<Req>>,
    free_reqs: Vec<usize>,
    pieces: Vec<Option<Piece>>,
    free_pieces: Vec<usize>,
    /// Requests with pieces left to submit, oldest first.
    queue: VecDeque<usize>,
    /// Requests whose last piece completed: to reply to.
    finished: Vec<usize>,
    in_flight: usize,
    buffered: usize,
    /// Device errors seen (the first is logged as a warning).
    errors: u64,
}

impl State {
    fn in_progress(&self) -> usize {
        self.reqs.len() - self.free_reqs.len()
    }

    fn can_accept(&self) -> bool {
        self.in_progress() < MAX_REQS && (self.buffered < BUDGET || self.in_progress() == 0)
    }

    fn start(&mut self, handle: u64, op: Op, data: Vec<u8>) {
        let (kind, offset, len, fua) = match op {
            Op::Read { offset, len } => (Kind::Read(vec![0; len as usize]), offset, len as usize, false),
            Op::Write { offset, len, fua } => (Kind::Write(data), offset, len as usize, fua),
            Op::WriteZeroes { offset, len, fua } => (Kind::Zeroes, offset, len as usize, fua),
            Op::Flush | Op::Disc => unreachable!("only data requests are started"),
        };
        let req = Req { handle, kind, offset, len, fua, submitted: 0, outstanding: 0, queued: true, error: None };
        self.buffered += req.bytes();
        let index = match self.free_reqs.pop() {
            Some(i) => {
                self.reqs[i] = Some(req);
                i
            }
            None => {
                self.reqs.push(Some(req));
                self.reqs.len() - 1
            }
        };
        self.queue.push_back(index);
    }

    /// Logs a device error: the first as a warning, the rest quietly.
    fn note(&mut self, e: &io::Error) {
        self.errors += 1;
        if self.errors == 1 {
            tracing::warn!(error = %e, "volume I/O failed: replying with errors");
        } else {
            tracing::debug!(error = %e, "volume I/O failed");
        }
    }

    fn error(&mut self, req: usize, e: &io::Error) {
        self.note(e);
        if let Some(r) = self.reqs[req].as_mut() {
            r.error.get_or_insert(errno(e));
        }
    }

    /// A piece completed.
    fn on_done(&mut self, tag: u64, result: io::Result<&dyn ReadOut>) {
        let Some(piece) = usize::try_from(tag).ok().and_then(|t| self.pieces.get_mut(t)).and_then(Option::take) else {
            tracing::warn!(tag, "completion of an unknown operation ignored");
            return;
        };
        self.free_pieces.push(tag as usize);
        self.in_flight -= 1;
        match result {
            Err(e) => self.error(piece.req, &e),
            Ok(out) => {
                let Some(req) = self.reqs[piece.req].as_mut() else { return };
                if let Kind::Read(buf) = &mut req.kind {
                    if let Err(e) = out.copy_to(&mut buf[piece.at..piece.at + piece.len]) {
                        self.error(piece.req, &e);
                    }
                }
            }
        }
        let Some(req) = self.reqs[piece.req].as_mut() else { return };
        req.outstanding -= 1;
        if req.outstanding == 0 && !req.queued {
            self.finished.push(piece.req);
        }
    }
}

/// Where a synchronous write's bytes come from.
#[derive(Debug, Clone, Copy)]
enum Src<'a> {
    Data(&'a [u8]),
    Zeroes(usize),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Data(d) => d.len(),
            Src::Zeroes(n) => *n,
        }
    }

    fn slice<'z>(&'z self, zeros: &'z [u8], at: usize, n: usize) -> &'z [u8] {
        match self {
            Src::Data(d) => &d[at..at + n],
            Src::Zeroes(_) => &zeros[..n],
        }
    }
}

/// A synchronous operation's failure: the operation's (reply with an error), or the device's
/// (it stopped completing: the connection ends).
enum Fail {
    Op(io::Error),
    Device(io::Error),
}

/// The connection's thread: owns the device and the writer.
struct Exec<D, W: Write> {
    dev: D,
    w: io::BufWriter<W>,
    st: State,
    geo: ExportGeometry,
    zeros: Vec<u8>,
    /// Replying failed (the client is gone): nothing more is written.
    writer_dead: bool,
    write_err: Option<io::Error>,
    next_tick: Instant,
}

impl<D: BlockDevice, W: Write> Exec<D, W> {
    fn new(dev: D, writer: W) -> Self {
        let depth = dev.depth().max(1);
        let st = State {
            reqs: Vec::new(),
            free_reqs: Vec::new(),
            pieces: vec![None; depth],
            free_pieces: (0..depth).rev().collect(),
            queue: VecDeque::new(),
            finished: Vec::new(),
            in_flight: 0,
            buffered: 0,
            errors: 0,
        };
        let zeros = vec![0; dev.max_op()];
        Exec {
            geo: dev.geometry(),
            dev,
            w: io::BufWriter::with_capacity(256 << 10, writer),
            st,
            zeros,
            writer_dead: false,
            write_err: None,
            next_tick: Instant::now() + TICK,
        }
    }

    fn run(mut self, rx: Receiver<Incoming>) -> End {
        let mut end: Option<End> = None;
        let mut barrier: Option<(u64, Op, Vec<u8>)> = None;
        let end = loop {
            self.maybe_tick();
            // Take requests while there is room, blocking only when nothing else is to be done.
            while end.is_none() && barrier.is_none() && self.st.can_accept() {
                let idle = self.st.in_flight == 0 && self.st.queue.is_empty();
                let msg = if idle {
                    self.flush_replies();
                    match rx.recv_timeout(self.next_tick.saturating_duration_since(Instant::now())) {
                        Ok(msg) => msg,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => Incoming::End(End::Closed),
                    }
                } else {
                    match rx.try_recv() {
                        Ok(msg) => msg,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => Incoming::End(End::Closed),
                    }
                };
                match msg {
                    Incoming::End(e) => end = Some(e),
                    Incoming::Request { handle, op: Err(e), .. } => {
                        tracing::debug!(handle, error = ?e, "request refused");
                        self.reply(handle, Some(e), None);
                    }
                    Incoming::Request { op: Ok(Op::Disc), .. } => end = Some(End::Disconnect),
                    Incoming::Request { handle, op: Ok(Op::Flush), .. } => {
                        let result = self.dev.flush();
                        self.reply_result(handle, result, None);
                    }
                    Incoming::Request { handle, op: Ok(op), data } => {
                        if self.aligned(op) {
                            self.st.start(handle, op, data);
                        } else {
                            barrier = Some((handle, op, data));
                        }
                    }
                }
                if self.writer_dead {
                    break;
                }
            }
            if end.is_none() && self.writer_dead {
                let e = self.write_err.take().unwrap_or_else(|| io::Error::other("the client is gone"));
                end = Some(End::WriteFailed(e));
            }
            self.submit();
            self.finish();
            if self.st.in_flight > 0 {
                // Replies ready go out before waiting: the client may be waiting for them.
                self.flush_replies();
                let Exec { dev, st, .. } = &mut self;
                if let Err(e) = dev.complete(Instant::now() + IO_TIMEOUT, &mut |tag, r| st.on_done(tag, r)) {
                    break End::DeviceFailed(e);
                }
                self.finish();
                continue;
            }
            if let Some((handle, op, data)) = barrier.take() {
                self.flush_replies();
                match self.unaligned(op, &data) {
                    Ok(buf) => self.reply(handle, None, buf.as_deref()),
                    Err(Fail::Op(e)) => {
                        self.st.note(&e);
                        self.reply(handle, Some(errno(&e)), None);
                    }
                    Err(Fail::Device(e)) => break End::DeviceFailed(e),
                }
                continue;
            }
            if self.st.in_progress() == 0 {
                if let Some(end) = end.take() {
                    break end;
                }
            }
        };
        drop(rx);
        self.flush_replies();
        if let End::DeviceFailed(e) = &end {
            tracing::error!(error = %e, "the volume stopped completing I/O: closing the connection");
        }
        if let Err(e) = self.dev.close() {
            tracing::warn!(error = %e, "closing the rblk session failed");
        }
        end
    }

    /// The device's housekeeping, every [`TICK`].
    fn maybe_tick(&mut self) {
        if Instant::now() >= self.next_tick {
            if let Err(e) = self.dev.tick() {
                tracing::debug!(error = %e, "device housekeeping failed");
            }
            self.next_tick = Instant::now() + TICK;
        }
    }

    fn aligned(&self, op: Op) -> bool {
        let bs = u64::from(self.geo.block_size.max(1));
        match op {
            Op::Read { offset, len } | Op::Write { offset, len, .. } | Op::WriteZeroes { offset, len, .. } => {
                offset % bs == 0 && u64::from(len) % bs == 0
            }
            Op::Flush | Op::Disc => true,
        }
    }

    /// Hands the queued requests' pieces to the device while it has room.
    fn submit(&mut self) {
        let max = self.dev.max_op();
        while let Some(&index) = self.st.queue.front() {
            let Some(req) = self.st.reqs[index].as_mut() else {
                self.st.queue.pop_front();
                continue;
            };
            if req.error.is_some() || req.submitted == req.len {
                req.queued = false;
                if req.outstanding == 0 {
                    self.st.finished.push(index);
                }
                self.st.queue.pop_front();
                continue;
            }
            let Some(tag) = self.st.free_pieces.pop() else { break };
            let (at, n) = (req.submitted, max.min(req.len - req.submitted));
            let offset = req.offset + at as u64;
            let started = match &req.kind {
                Kind::Read(_) => self.dev.submit_read(tag as u64, offset, n),
                Kind::Write(data) => self.dev.submit_write(tag as u64, offset, &data[at..at + n]),
                Kind::Zeroes => self.dev.submit_write(tag as u64, offset, &self.zeros[..n]),
            };
            match started {
                Ok(()) => {
                    req.submitted += n;
                    req.outstanding += 1;
                    self.st.pieces[tag] = Some(Piece { req: index, at, len: n });
                    self.st.in_flight += 1;
                }
                Err(e) => {
                    self.st.free_pieces.push(tag);
                    self.st.error(index, &e);
                }
            }
        }
    }

    /// Replies to the requests whose last piece completed (flushing first for FUA).
    fn finish(&mut self) {
        let finished = std::mem::take(&mut self.st.finished);
        for &index in &finished {
            let Some(req) = self.st.reqs[index].take() else { continue };
            self.st.free_reqs.push(index);
            self.st.buffered -= req.bytes();
            let mut error = req.error;
            if error.is_none() && req.fua {
                if let Err(e) = self.dev.flush() {
                    self.st.error(index, &e);
                    error = Some(errno(&e));
                }
            }
            match (&req.kind, error) {
                (Kind::Read(buf), None) => self.reply(req.handle, None, Some(buf)),
                (_, error) => self.reply(req.handle, error, None),
            }
        }
        // Keep the allocation.
        self.st.finished = finished;
        self.st.finished.clear();
    }

    fn reply_result(&mut self, handle: u64, result: io::Result<()>, data: Option<&[u8]>) {
        match result {
            Ok(()) => self.reply(handle, None, data),
            Err(e) => {
                tracing::warn!(handle, error = %e, "flush failed");
                self.reply(handle, Some(errno(&e)), None);
            }
        }
    }

    /// Writes a simple reply (with a read's data); after a failure, nothing more.
    fn reply(&mut self, handle: u64, error: Option<Errno>, data: Option<&[u8]>) {
        if self.writer_dead {
            return;
        }
        let hdr = wire::simple_reply(handle, error);
        let written = self.w.write_all(hdr.as_bytes()).and_then(|()| match (error, data) {
            (None, Some(d)) => self.w.write_all(d),
            _ => Ok(()),
        });
        if let Err(e) = written {
            self.writer_dead = true;
            self.write_err = Some(e);
        }
    }

    fn flush_replies(&mut self) {
        if !self.writer_dead {
            if let Err(e) = self.w.flush() {
                self.writer_dead = true;
                self.write_err = Some(e);
            }
        }
    }

    /// Runs a request that is not block-aligned, alone: reads through an aligned bounce
    /// buffer; writes read-modify-write their partial first and last blocks.
    fn unaligned(&mut self, op: Op, data: &[u8]) -> Result<Option<Vec<u8>>, Fail> {
        let bs = u64::from(self.geo.block_size);
        match op {
            Op::Read { offset, len } => {
                let start = offset / bs * bs;
                let end = (offset + u64::from(len)).div_ceil(bs) * bs;
                let mut bounce = vec![0; (end - start) as usize];
                self.sync_read(start, &mut bounce)?;
                let at = (offset - start) as usize;
                bounce.copy_within(at..at + len as usize, 0);
                bounce.truncate(len as usize);
                Ok(Some(bounce))
            }
            Op::Write { offset, fua, .. } => {
                self.write_any(offset, Src::Data(data))?;
                self.flush_if(fua)
            }
            Op::WriteZeroes { offset, len, fua } => {
                self.write_any(offset, Src::Zeroes(len as usize))?;
                self.flush_if(fua)
            }
            Op::Flush | Op::Disc => Ok(None),
        }
    }

    fn flush_if(&mut self, fua: bool) -> Result<Option<Vec<u8>>, Fail> {
        if fua {
            self.dev.flush().map_err(Fail::Op)?;
        }
        Ok(None)
    }

    /// Writes `src` at any `offset`: partial blocks at either end by read-modify-write, the
    /// aligned middle directly.
    fn write_any(&mut self, offset: u64, src: Src<'_>) -> Result<(), Fail> {
        let bs = u64::from(self.geo.block_size);
        let end = offset + src.len() as u64;
        let mut at = offset;
        while at < end {
            let block = at / bs * bs;
            let upto = if at % bs != 0 || end - at < bs { end.min(block + bs) } else { end / bs * bs };
            let piece = (at - offset) as usize..(upto - offset) as usize;
            if at % bs == 0 && upto % bs == 0 {
                let middle = match src {
                    Src::Data(d) => Src::Data(&d[piece]),
                    Src::Zeroes(_) => Src::Zeroes(piece.len()),
                };
                self.sync_write(at, middle)?;
            } else {
                let mut buf = vec![0; bs as usize];
                self.sync_read(block, &mut buf)?;
                let inner = (at - block) as usize;
                if let Src::Data(d) = src {
                    buf[inner..inner + piece.len()].copy_from_slice(&d[piece]);
                } else {
                    buf[inner..inner + piece.len()].fill(0);
                }
                self.sync_write(block, Src::Data(&buf))?;
            }
            at = upto;
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes (aligned) at `offset`, up to the device's depth at a time.
    fn sync_read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Fail> {
        let (max, depth) = (self.dev.max_op(), self.dev.depth().max(1));
        let mut base = 0;
        while base < buf.len() {
            self.maybe_tick();
            let window = &mut buf[base..];
            let (mut at, mut outstanding, mut failed) = (0, 0usize, None);
            while outstanding < depth && at < window.len() {
                let n = max.min(window.len() - at);
                match self.dev.submit_read(at as u64, offset + (base + at) as u64, n) {
                    Ok(()) => outstanding += 1,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                at += n;
            }
            while outstanding > 0 {
                let deadline = Instant::now() + IO_TIMEOUT;
                let copied = self.dev.complete(deadline, &mut |tag, r| {
                    outstanding -= 1;
                    let a = tag as usize;
                    let n = max.min(window.len() - a);
                    if let Err(e) = r.and_then(|out| out.copy_to(&mut window[a..a + n])) {
                        failed.get_or_insert(e);
                    }
                });
                copied.map_err(Fail::Device)?;
            }
            if let Some(e) = failed {
                return Err(Fail::Op(e));
            }
            base += at;
        }
        Ok(())
    }

    /// Writes `src` (aligned) at `offset`, up to the device's depth at a time.
    fn sync_write(&mut self, offset: u64, src: Src<'_>) -> Result<(), Fail> {
        let (max, depth) = (self.dev.max_op(), self.dev.depth().max(1));
        let total = src.len();
        let mut base = 0;
        while base < total {
            self.maybe_tick();
            let (mut at, mut outstanding, mut failed) = (base, 0usize, None);
            while outstanding < depth && at < total {
                let n = max.min(total - at);
                match self.dev.submit_write(0, offset + at as u64, src.slice(&self.zeros, at, n)) {
                    Ok(()) => outstanding += 1,
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
                at += n;
            }
            while outstanding > 0 {
                let deadline = Instant::now() + IO_TIMEOUT;
                let written = self.dev.complete(deadline, &mut |_, r| {
                    outstanding -= 1;
                    if let Err(e) = r {
                        failed.get_or_insert(e);
                    }
                });
                written.map_err(Fail::Device)?;
            }
            if let Some(e) = failed {
                return Err(Fail::Op(e));
            }
            base = at;
        }
        Ok(())
    }
}
