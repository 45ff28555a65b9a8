//! The transmission phase: requests in, simple replies out, pipelined.
//!
//! A reader thread parses requests (and a write's payload) off the stream and checks them
//! against the export; the connection's thread hands each to the client's [`Lane`] as one engine
//! [`Request`] as it arrives, and replies to each as soon as the lane hands it back finished, in
//! whatever order that happens (NBD allows it). The lane does the block work: pieces up to its
//! depth, read-modify-write of requests not aligned to the block size (alone, under range locks
//! of the whole session), FUA as write then FLUSH of its range, zeroes, and FLUSH of exactly the
//! ranges written since the last one (every write replied to so far; nothing sent when clean).

use std::io::{self, Read, Write};
use std::os::fd::AsFd as _;
use std::os::unix::net::UnixStream;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes as _;

use rblk_initiator::engine::{Data, EngineStats, Finished, IoOp, Request};
use rblk_initiator::Chain;

use super::device::{Device, SharedSize};
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
    /// The volume stopped completing operations (a timeout, a lost connection).
    DeviceFailed(rblk_initiator::Error),
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
            End::DeviceFailed(e) => write!(f, "the volume stopped answering: {}", Chain(e)),
        }
    }
}

/// Requests parsed ahead of the executor.
const CHANNEL: usize = 16;
/// Requests in progress at once.
const MAX_REQS: usize = 128;
/// Request data (write payloads, read replies) held by requests in progress, beyond the first.
const BUDGET: usize = 64 << 20;
/// How often the lane gets its housekeeping (rblk keepalives go every 2 s).
const TICK: Duration = Duration::from_secs(1);
/// How long the volume may take to complete anything while operations are outstanding.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// How a connection went.
#[derive(Debug)]
pub struct Summary {
    /// Why it ended.
    pub end: End,
    /// What the client's session did (taken before it closed).
    pub stats: EngineStats,
    /// Requests that failed on the volume.
    pub errors: u64,
}

/// From the reader thread.
enum Incoming {
    Request { handle: u64, op: Result<Op, Errno>, data: Vec<u8> },
    End(End),
}

/// Serves requests from `reader` with replies to `writer` until the client disconnects, then
/// closes the device. `close` runs once the replies are done, to unblock the reader (shut the
/// socket down); the reader thread has ended when this returns.
pub fn transmit(reader: impl Read + Send, writer: impl Write, dev: Device, close: impl FnOnce()) -> Summary {
    let (geo, size) = (dev.geometry(), dev.size());
    let (tx, rx) = mpsc::sync_channel(CHANNEL);
    let bell = match doorbell() {
        Ok(bell) => bell,
        Err(e) => {
            let stats = dev.stats();
            let _ = dev.close();
            return Summary { end: End::ReadFailed(e), stats, errors: 0 };
        }
    };
    let (ring, listen) = bell;
    thread::scope(|s| {
        let reader = thread::Builder::new()
            .name("rblk-nbd-reader".into())
            .spawn_scoped(s, move || read_requests(reader, geo, &size, &tx, &ring));
        let summary = match reader {
            Ok(_) => Exec::new(dev, writer, listen).run(rx),
            Err(e) => {
                let stats = dev.stats();
                let _ = dev.close();
                Summary { end: End::ReadFailed(e), stats, errors: 0 }
            }
        };
        close();
        summary
    })
}

/// A socket pair, both ends non-blocking: the reader thread writes a byte to the first after
/// each message it forwards, and the connection's thread, idle, sleeps on the second beside the
/// lane's rdma_cm channels ([`Lane::idle_wait`](rblk_initiator::Lane::idle_wait)).
fn doorbell() -> io::Result<(UnixStream, UnixStream)> {
    let (ring, listen) = UnixStream::pair()?;
    ring.set_nonblocking(true)?;
    listen.set_nonblocking(true)?;
    Ok((ring, listen))
}

/// The reader thread: parses, checks and forwards requests until DISC, EOF or a bad magic.
fn read_requests(r: impl Read, geo: ExportGeometry, size: &SharedSize, tx: &SyncSender<Incoming>, bell: &UnixStream) {
    let send = |msg| {
        let sent = tx.send(msg).is_ok();
        // Full: a ring is pending already.
        let _ = (&*bell).write(&[1]);
        sent
    };
    forward_requests(r, geo, size, send);
}

/// Checks each request against `geo` with the size `size` has when it arrives: a grown
/// volume's new range is served from then on.
fn forward_requests(mut r: impl Read, geo: ExportGeometry, size: &SharedSize, send: impl Fn(Incoming) -> bool) {
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
        let op = hdr.check(&ExportGeometry { size: size.get(), ..geo });
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
        if !send(Incoming::Request { handle: hdr.handle.get(), op, data }) || disc {
            // The executor is gone, or the client may send nothing after DISC.
            return;
        }
    };
    send(Incoming::End(end));
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

/// A request in progress, at its index in the table (the engine request's tag).
#[derive(Debug)]
struct InProgress {
    handle: u64,
    /// Bytes it holds (a write's payload, a read's reply).
    bytes: usize,
}

/// The connection's thread: owns the device and the writer.
struct Exec<W: Write> {
    dev: Device,
    w: io::BufWriter<W>,
    reqs: Vec<Option<InProgress>>,
    free: Vec<usize>,
    /// Bytes held by requests in progress.
    buffered: usize,
    /// Volume errors seen (the first is logged as a warning).
    errors: u64,
    /// Replying failed (the client is gone): nothing more is written.
    writer_dead: bool,
    write_err: Option<io::Error>,
    next_tick: Instant,
    /// Rung by the reader thread at each message ([`doorbell`]).
    bell: UnixStream,
}

impl<W: Write> Exec<W> {
    fn new(mut dev: Device, writer: W, bell: UnixStream) -> Self {
        dev.lane().set_io_timeout(IO_TIMEOUT);
        Exec {
            dev,
            w: io::BufWriter::with_capacity(256 << 10, writer),
            reqs: Vec::new(),
            free: Vec::new(),
            buffered: 0,
            errors: 0,
            writer_dead: false,
            write_err: None,
            next_tick: Instant::now() + TICK,
            bell,
        }
    }

    fn in_progress(&self) -> usize {
        self.reqs.len() - self.free.len()
    }

    fn can_accept(&self) -> bool {
        self.in_progress() < MAX_REQS && (self.buffered < BUDGET || self.in_progress() == 0)
    }

    fn run(mut self, rx: Receiver<Incoming>) -> Summary {
        let mut end: Option<End> = None;
        let end = loop {
            self.maybe_tick();
            // Take requests while there is room, blocking only when nothing else is to be done.
            while end.is_none() && self.can_accept() {
                let msg = if self.in_progress() == 0 {
                    self.flush_replies();
                    match self.next_idle(&rx) {
                        Some(msg) => msg,
                        None => break,
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
                    Incoming::Request { handle, op: Ok(op), data } => self.start(handle, op, data),
                }
                if self.writer_dead {
                    break;
                }
            }
            if end.is_none() && self.writer_dead {
                let e = self.write_err.take().unwrap_or_else(|| io::Error::other("the client is gone"));
                end = Some(End::WriteFailed(e));
            }
            self.finish();
            if self.in_progress() > 0 {
                // Replies ready go out before waiting: the client may be waiting for them.
                self.flush_replies();
                if let Err(e) = self.dev.lane().wait() {
                    break End::DeviceFailed(e);
                }
                if !self.finish() && self.dev.lane().pending() == 0 {
                    // Never expected: the lane holds nothing of ours, yet requests are open.
                    let reason = format!("{} NBD requests lost track of", self.in_progress());
                    break End::DeviceFailed(rblk_initiator::Error::ConnectionLost { addr: self.dev.addr(), reason });
                }
                continue;
            }
            if let Some(end) = end.take() {
                break end;
            }
        };
        drop(rx);
        self.flush_replies();
        if let End::DeviceFailed(e) = &end {
            tracing::error!(error = %Chain(e), "the volume stopped completing I/O: closing the connection");
        }
        let Exec { dev, errors, .. } = self;
        let stats = dev.stats();
        if let Err(e) = dev.close() {
            tracing::warn!(error = %Chain(&e), "closing the rblk session failed");
        }
        Summary { end, stats, errors }
    }

    /// With nothing in progress: the reader's next message, or None at the next tick or after
    /// the lane took rdma_cm's events (a lost target is noticed when rdma_cm says so).
    fn next_idle(&mut self, rx: &Receiver<Incoming>) -> Option<Incoming> {
        let deadline =
            if rblk_initiator::periodic_checks() { self.next_tick } else { Instant::now() + Duration::from_secs(3600) };
        loop {
            match rx.try_recv() {
                Ok(msg) => return Some(msg),
                Err(TryRecvError::Disconnected) => return Some(Incoming::End(End::Closed)),
                Err(TryRecvError::Empty) => {}
            }
            match self.idle_wait(deadline) {
                Ok(true) => while matches!((&self.bell).read(&mut [0u8; 64]), Ok(n) if n > 0) {},
                Ok(false) => return None,
                Err(e) => {
                    tracing::debug!(error = %Chain(&e), "waiting for requests and rdma_cm events failed");
                    return match rx.recv_timeout(self.next_tick.saturating_duration_since(Instant::now())) {
                        Ok(msg) => Some(msg),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => Some(Incoming::End(End::Closed)),
                    };
                }
            }
        }
    }

    /// [`Lane::idle_wait`](rblk_initiator::Lane::idle_wait) with the lane's completion channel
    /// armed too: a completion while idle (the target's RESIZED) is taken at once, so a grow
    /// reaches the size-change callback now, not at the next tick. True when the doorbell rang.
    fn idle_wait(&mut self, deadline: Instant) -> rblk_initiator::Result<bool> {
        use std::os::fd::AsRawFd as _;
        let bell = self.bell.as_raw_fd();
        let lane = self.dev.lane();
        if lane.arm().is_err() {
            return lane.idle_wait(self.bell.as_fd(), deadline);
        }
        // A completion that landed before the arm raised no event.
        lane.progress()?;
        let mut fds = [bell, lane.event_fd(), bell, bell];
        let mut n = 2;
        for fd in lane.cm_fds().fds.into_iter().flatten() {
            fds[n] = fd;
            n += 1;
        }
        match rblk_fabric::wait_readable(&fds[..n], deadline) {
            Ok(Some(0)) => Ok(true),
            Ok(Some(1)) => lane.progress().map(|()| false),
            Ok(Some(_)) => lane.cm_event().map(|()| false),
            Ok(None) => Ok(false),
            // The library's own wait says what failed.
            Err(_) => lane.idle_wait(self.bell.as_fd(), deadline),
        }
    }

    /// The lane's housekeeping (keepalives), every [`TICK`].
    fn maybe_tick(&mut self) {
        if rblk_initiator::periodic_checks() && Instant::now() >= self.next_tick {
            if let Err(e) = self.dev.lane().tick() {
                tracing::debug!(error = %Chain(&e), "volume housekeeping failed");
            }
            self.next_tick = Instant::now() + TICK;
        }
    }

    /// Hands a request to the lane as one engine request, tagged with its table index.
    fn start(&mut self, handle: u64, op: Op, data: Vec<u8>) {
        let (op, offset, len, fua, data) = match op {
            Op::Read { offset, len } => (IoOp::Read, offset, len, false, Data::Bytes(Vec::new())),
            Op::Write { offset, len, fua } => (IoOp::Write, offset, len, fua, Data::Bytes(data)),
            Op::WriteZeroes { offset, len, fua, unmap } => (IoOp::WriteZeroes { unmap }, offset, len, fua, Data::None),
            Op::Trim { offset, len, fua } => {
                // The whole blocks inside the range: a discard is advice, and the edges keep
                // their bytes (what a device with this granularity does).
                let bs = u64::from(self.dev.geometry().block_size.max(1));
                let (start, end) = (offset.div_ceil(bs) * bs, (offset + u64::from(len)) / bs * bs);
                if end <= start {
                    self.reply(handle, None, None);
                    return;
                }
                (IoOp::Discard, start, (end - start) as u32, fua, Data::None)
            }
            Op::Flush => (IoOp::Flush, 0, 0, false, Data::None),
            Op::Disc => unreachable!("DISC is not a request of the volume's"),
        };
        let bytes = if matches!(op, IoOp::Read | IoOp::Write) { len as usize } else { 0 };
        let index = match self.free.pop() {
            Some(i) => i,
            None => {
                self.reqs.push(None);
                self.reqs.len() - 1
            }
        };
        self.reqs[index] = Some(InProgress { handle, bytes });
        self.buffered += bytes;
        self.dev.lane().submit(Request { tag: index as u64, op, offset, len: len.into(), fua, data });
    }

    /// Replies to the requests the lane handed back; whether there were any.
    fn finish(&mut self) -> bool {
        let mut any = false;
        while let Some(f) = self.dev.lane().next() {
            any = true;
            self.finished(f);
        }
        any
    }

    fn finished(&mut self, f: Finished) {
        let Some(req) = usize::try_from(f.tag).ok().and_then(|i| self.reqs.get_mut(i)).and_then(Option::take) else {
            tracing::warn!(tag = f.tag, "a finished request of nobody's ignored");
            return;
        };
        self.free.push(f.tag as usize);
        self.buffered -= req.bytes;
        match (f.result, f.data) {
            (Ok(()), Data::Bytes(buf)) if f.op == IoOp::Read => self.reply(req.handle, None, Some(&buf)),
            (Ok(()), _) => self.reply(req.handle, None, None),
            (Err(e), _) => {
                self.errors += 1;
                if self.errors == 1 {
                    tracing::warn!(error = %Chain(&e), "volume I/O failed: replying with errors");
                } else {
                    tracing::debug!(error = %Chain(&e), "volume I/O failed");
                }
                self.reply(req.handle, Some(Errno::from_errno(e.errno())), None);
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
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    fn request(kind: u16, handle: u64, offset: u64, len: u32) -> Vec<u8> {
        let r = RequestHeader {
            magic: wire::REQUEST_MAGIC.into(),
            flags: 0.into(),
            kind: kind.into(),
            handle: handle.into(),
            offset: offset.into(),
            len: len.into(),
        };
        r.as_bytes().to_vec()
    }

    /// A read and a write just past the old end are refused (EINVAL, ENOSPC) while the export
    /// has its old size and served once it grew, with nothing else changed: catches request
    /// checks that keep the size the connection started with.
    #[test]
    fn the_range_check_follows_a_size_change() {
        const OLD: u64 = 1 << 20;
        let geo = ExportGeometry { size: OLD, block_size: 4096, read_only: false, discards: true };
        let size = SharedSize::new(OLD);
        let mut wire = Vec::new();
        for handle in [1, 3] {
            wire.extend(request(wire::CMD_READ, handle, OLD, 4096));
            wire.extend(request(wire::CMD_WRITE, handle + 1, OLD, 4096));
            wire.extend([0xab; 4096]);
        }
        let seen = Mutex::new(Vec::new());
        forward_requests(&wire[..], geo, &size, |msg| {
            if let Incoming::Request { handle, op, data } = msg {
                seen.lock().unwrap().push((handle, op, data.len()));
                // The volume grows between the first pair and the second.
                if handle == 2 {
                    assert!(size.grow_to(2 * OLD));
                }
            }
            true
        });
        let seen = seen.into_inner().unwrap();
        assert_eq!(
            seen,
            [
                (1, Err(Errno::Inval), 0),
                (2, Err(Errno::NoSpc), 0),
                (3, Ok(Op::Read { offset: OLD, len: 4096 }), 0),
                (4, Ok(Op::Write { offset: OLD, len: 4096, fua: false }), 4096),
            ]
        );
    }
}
