//! An open session's control side: its link (the first queue pair: FLUSH, STATS, CLOSE,
//! keepalives; who the session is now; the reconnect loop), its geometry, and the I/O state
//! every queue of the session shares. [`Queue`](crate::Queue)s join the session through it;
//! a [`Volume`](crate::Volume) and an [`Engine`](crate::Engine) each hold one.
//!
//! Calls here run on the caller's thread and block for their exchange on the first queue pair
//! (one at a time: the link's lock). Lanes send their FLUSHes on their own queue pairs and only
//! [`try_keepalive`](Control::try_keepalive) here, which never waits for that lock.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use rblk_fabric::Pd;
use rblk_proto::{ErrorCode, FlushedFlags, Message, Opcode, OpenMode, Opened, StatsReply, VolumeFlags};

use crate::conn::{Conn, Reply};
use crate::io_state::{Earlier, FlushBody, FlushTicket, Shared};
use crate::link::{Link, Status};
use crate::{Direction, Error, Geometry, Result, Uri};

/// See the module documentation.
#[derive(Debug)]
pub struct Control {
    pub(crate) link: Arc<Link>,
    /// As opened; its size is the link's ([`Control::geo`]).
    geo: Geometry,
    /// As first opened (a reconnect keeps the geometry; [`Link::current`] has the session now).
    pub(crate) opened: Opened,
    pub(crate) mode: OpenMode,
    pub(crate) uri: Uri,
    pub(crate) io: Shared,
}

impl Control {
    pub(crate) fn new(link: Arc<Link>, geo: Geometry, opened: Opened, mode: OpenMode, uri: Uri, io: Shared) -> Control {
        Control { link, geo, opened, mode, uri, io }
    }

    /// Size, block size, largest I/O and read-only-ness, for access checks.
    pub fn geometry(&self) -> Geometry {
        self.geo()
    }

    /// The geometry now: the volume's size may have grown since it was opened.
    pub(crate) fn geo(&self) -> Geometry {
        Geometry { size: self.link.size(), ..self.geo }
    }

    /// What the target said about the volume when it was opened.
    pub fn flags(&self) -> VolumeFlags {
        self.opened.flags
    }

    /// True when the volume lives in RAM only: FLUSH orders, but nothing survives a target
    /// restart.
    pub fn is_volatile(&self) -> bool {
        self.opened.flags.contains(VolumeFlags::VOLATILE)
    }

    /// The URI it was opened by.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The target's address (of the control connection, now).
    pub fn addr(&self) -> SocketAddr {
        self.link.addr()
    }

    /// What a process taking over from this one needs to know of its session (see
    /// [`Session::take_over`](crate::Session::take_over)); it changes when the session reconnects.
    pub fn predecessor(&self) -> crate::Predecessor {
        let cur = self.link.current().opened;
        crate::Predecessor {
            session_id: cur.session_id,
            token: cur.token,
            size: cur.size,
            block_size: cur.block_size,
            max_io: cur.max_io,
            instance: cur.instance,
        }
    }

    /// The session's protection domain.
    pub fn pd(&self) -> Pd {
        self.link.pd().clone()
    }

    /// Makes everything written since the last flush durable: a FLUSH of the ranges every queue
    /// of the session completed writes to (nothing is sent when there are none), completed only
    /// once every FLUSH begun before it has completed. Returns whether the volume is volatile.
    pub fn flush(&self) -> Result<bool> {
        if let Some(e) = self.writes_lost() {
            return Err(e);
        }
        let ticket = self.io.begin_flush();
        self.run_flush(ticket)
    }

    /// Makes everything written so far durable, tracked or not: a FLUSH of the whole volume.
    pub fn flush_all(&self) -> Result<bool> {
        let ticket = self.io.begin_flush_all();
        self.run_flush(ticket)
    }

    /// Makes `len` bytes at `offset` durable (FLUSH of that range, or of everything when the
    /// target lacks ranged flushes). Returns whether the volume is volatile.
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<bool> {
        self.geo().check_as("flush", Direction::Read, offset, len, None)?;
        let started = Instant::now();
        let result = self.send_flush(&FlushBody::range(offset, len, self.link.features()));
        self.io.count_flush(Some(started.elapsed()), result.is_ok());
        result
    }

    fn run_flush(&self, ticket: FlushTicket) -> Result<bool> {
        let started = Instant::now();
        let FlushTicket { seq, ranges } = ticket;
        let sent = ranges != crate::Dirty::default();
        let result =
            if sent { self.send_flush(&FlushBody::of(&ranges, self.link.features())) } else { Ok(self.is_volatile()) };
        self.io.end_flush(seq, result.is_ok());
        let result = result.and_then(|volatile| {
            // Ranges earlier FLUSHes took may still be written back on other queues.
            match self.io.wait_earlier(seq, Instant::now() + KEEPALIVE_BOUND) {
                Earlier::Clear => Ok(volatile),
                Earlier::Failed => Err(earlier_failed(self.link.addr())),
                Earlier::Running => Err(Error::Timeout {
                    op: "waiting for an earlier FLUSH",
                    addr: self.link.addr(),
                    after: started.elapsed(),
                }),
            }
        });
        self.io.forget_flush(seq);
        self.io.count_flush(sent.then(|| started.elapsed()), result.is_ok());
        result
    }

    /// The FLUSH exchange on the first queue pair.
    fn send_flush(&self, body: &FlushBody) -> Result<bool> {
        body.trace();
        // No deadline: a write-back can take minutes; the session's liveness bounds it.
        // Tells the session when this connection heard the target, and asks when it did.
        let heard = |ours| {
            self.link.note_heard(ours);
            self.link.heard()
        };
        let flags = self
            .link
            .control(|conn| {
                conn.expect_heard(&Message::Flush(body.message()), &heard, "FLUSHED", |r| match r {
                    Reply::Flushed(flags) => Some(flags),
                    _ => None,
                })
            })
            .and_then(|flags| match self.writes_lost() {
                // The target crashed while this FLUSH waited for the session.
                Some(e) => Err(e),
                None => Ok(flags),
            })
            .inspect_err(|e| self.note_flush_error(e))?;
        Ok(flags.contains(FlushedFlags::VOLATILE))
    }

    /// A FLUSH answered VolumeFailed: writes fail from now on.
    pub(crate) fn note_flush_error(&self, e: &Error) {
        note_flush_error(&self.io, e);
    }

    /// The write loss a reconnect found (a new durable instance), as the error of the FLUSH
    /// that sees it; the next ones do not.
    fn writes_lost(&self) -> Option<Error> {
        writes_lost(&self.link)
    }

    /// True once the target declared the volume failed (a FLUSH could not be made durable):
    /// writes then fail with [`Error::VolumeFailed`].
    pub fn failed(&self) -> bool {
        self.io.failed()
    }

    /// The target's counters.
    pub fn stats(&self) -> Result<StatsReply> {
        let timeout = self.link.opts().timeout;
        self.link.control(|conn| {
            conn.expect(&Message::Stats, Instant::now() + timeout, "STATS_REPLY", |r| match r {
                Reply::Stats(s) => Some(s),
                _ => None,
            })
        })
    }

    /// Housekeeping of the session's first queue pair: takes what arrived while idle
    /// (keepalives), sends a KEEPALIVE when one is due, notices a lost target, and runs a due
    /// reconnect attempt when the session is down. Fails once I/O fails (fast_io_fail_tmo) or
    /// the session is gone; while it reconnects it succeeds (the link logs what happens).
    pub fn keepalive(&self) -> Result<()> {
        self.link.drive();
        let gen = self.link.gen();
        match self.link.status(gen) {
            Status::Up | Status::Newer(_) => self.link.control_now(Conn::keepalive),
            Status::Waiting => {
                Err(Error::ConnectionLost { addr: self.link.addr(), reason: "the session is reconnecting".into() })
            }
            Status::FastFail(e) | Status::Failed(e) => Err(e),
        }
    }

    /// The first queue pair's rdma_cm event channel, for an event loop of the caller's: readable
    /// when the target disconnected (or died); then call [`cm_event`](Self::cm_event). None while
    /// another thread uses the queue pair (its exchange watches the channel itself), while the
    /// session is lost, and on the in-memory fabric. A reconnect replaces it: take it anew for
    /// each wait.
    pub fn cm_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.control_cm_fd()
    }

    /// [`cm_fd`](Self::cm_fd) was readable: takes rdma_cm's events and runs
    /// [`try_keepalive`](Self::try_keepalive), so a target that left is noticed now, and starts
    /// the reconnect at once (the first attempt is due as soon as the loss is seen).
    pub fn cm_event(&self) -> Result<()> {
        let _ = self.link.try_control_now(|conn| {
            conn.take_cm_events();
            Ok(())
        });
        let result = self.try_keepalive();
        self.link.drive();
        result
    }

    /// [`keepalive`](Self::keepalive) unless another thread is using the first queue pair (a
    /// FLUSH or STATS exchange, which takes the keepalives that arrive meanwhile): never waits
    /// for it. What lanes call from their event loops.
    pub fn try_keepalive(&self) -> Result<()> {
        self.link.drive();
        match self.link.status(self.link.gen()) {
            Status::Up | Status::Newer(_) => self.link.try_control_now(Conn::keepalive).unwrap_or(Ok(())),
            Status::Waiting => Ok(()),
            Status::FastFail(e) | Status::Failed(e) => Err(e),
        }
    }

    /// Ends the session: CLOSE, whose OK means the target has revoked the session's access to
    /// the volume (every queue's I/O fails from then on). While the session is lost and
    /// reconnecting, nothing is sent (there is nobody to tell).
    pub fn close(&self) -> Result<()> {
        self.link.begin_close();
        if !self.link.is_up() {
            tracing::debug!(addr = %self.link.addr(), "closing a session that is down: nothing to send");
            return Ok(());
        }
        let timeout = self.link.opts().timeout;
        self.link.control_now(|conn| {
            conn.expect(&Message::Close, Instant::now() + timeout, "OK(CLOSE)", |r| match r {
                Reply::Ok(Opcode::Close) => Some(()),
                _ => None,
            })
        })
    }

    /// Marks the session as closing: from now on, while the target is unreachable, I/O and
    /// flushes fail at once instead of waiting for a reconnect (a detach during an outage).
    pub fn begin_close(&self) {
        self.link.begin_close();
    }

    /// Bytes written and not yet flushed (a FLUSH would cover them), as tracked: an upper
    /// bound of what a crash of a durable target could lose.
    pub fn unflushed_bytes(&self) -> Option<u64> {
        self.io.pending_bytes()
    }
}

/// How long a synchronous FLUSH waits for earlier ones running on other queues: they are bounded
/// by their queues' liveness rule (and reconnect timeouts), not by this, which only keeps a
/// caller from waiting for ever on a lane whose thread stopped driving it.
const KEEPALIVE_BOUND: std::time::Duration = std::time::Duration::from_secs(3600);

/// The error of a FLUSH whose earlier FLUSH failed.
pub(crate) fn earlier_failed(addr: SocketAddr) -> Error {
    Error::EarlierFlushFailed { addr }
}

pub(crate) fn note_flush_error(io: &Shared, e: &Error) {
    if e.code() == Some(ErrorCode::VolumeFailed) {
        io.set_failed();
    }
}

pub(crate) fn writes_lost(link: &Link) -> Option<Error> {
    link.take_lost_writes().map(|lost| Error::WritesLost { addr: link.addr(), bytes: lost })
}
