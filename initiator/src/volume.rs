//! An open volume: the session's control side ([`Control`]: FLUSH, STATS, CLOSE, keepalives),
//! synchronous reads and writes through the block-I/O engine on a lane of its own, and further
//! queues.

use std::net::SocketAddr;
use std::sync::Arc;

use rblk_fabric::Pd;
use rblk_proto::{OpenMode, Opened, StatsReply, VolumeFlags};

use crate::conn::{Conn, Dest};
use crate::control::Control;
use crate::engine::Lane;
use crate::io_state::SessionIo;
use crate::link::Link;
use crate::{Direction, Geometry, Options, Queue, Result, Uri};

/// A volume opened by a [`Session`](crate::Session).
///
/// [`read_at`](Self::read_at) and [`write_at`](Self::write_at) take any block-aligned range
/// inside the volume and run it on the block-I/O engine ([`Lane`]), through a further queue pair
/// of the session opened at the first call: split into chunks no larger than the target's
/// largest I/O, a few in flight. For parallel, asynchronous I/O open [`Queue`]s with
/// [`queue`](Self::queue), or serve the volume with an [`Engine`](crate::Engine).
///
/// Dropping a volume disconnects; [`close`](Self::close) says goodbye first.
#[derive(Debug)]
pub struct Volume {
    // Declaration order is drop order: the data lane goes before the first QP.
    io: Option<Lane>,
    ctl: Control,
}

impl Volume {
    /// Chunks in flight at once in synchronous calls.
    pub(crate) const SYNC_DEPTH: u32 = 4;
    /// Largest chunk: bigger ones do not go faster, and pin memory.
    const CHUNK_MAX: u32 = 1 << 20;

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        conn: Conn,
        uri: Uri,
        dests: Vec<Dest>,
        at: usize,
        opts: Options,
        features: u64,
        mode: OpenMode,
        opened: Opened,
    ) -> Result<Volume> {
        let geo = Geometry::from_opened(&opened, mode == OpenMode::ReadOnly);
        let io = Arc::new(SessionIo::default());
        let name = uri.volume().to_owned();
        let link = Arc::new(Link::new(conn, dests, at, opts, features, mode, name, opened, Arc::clone(&io)));
        Ok(Volume { io: None, ctl: Control::new(link, geo, opened, mode, uri, io) })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.ctl.link.size()
    }

    /// Calls `hook` with the volume's new size in bytes whenever the target grows it (the
    /// target tells every session at once with [`rblk_proto::FEATURE_SEGMENTS`]; [`size`]
    /// and [`geometry`] follow), also for sessions of this volume's queues and engines. It runs
    /// on the thread that learns of it (one reaping a queue, or running a control exchange or
    /// a reconnect): it must not block; hand the size to a thread of your own for slow work
    /// (resizing a block device).
    ///
    /// [`size`]: Self::size
    /// [`geometry`]: Self::geometry
    pub fn on_resize(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        self.ctl.link.on_resize(std::sync::Arc::new(hook));
    }

    /// Offsets and lengths are multiples of this.
    pub fn block_size(&self) -> u32 {
        self.ctl.opened.block_size
    }

    /// Largest single RDMA READ or WRITE (a queue operation's limit).
    pub fn max_io(&self) -> u32 {
        self.ctl.opened.max_io
    }

    /// What the target says about the volume: volatile, read-only, exclusive.
    pub fn flags(&self) -> VolumeFlags {
        self.ctl.flags()
    }

    /// True when the volume lives in RAM only: FLUSH orders, but nothing survives a target
    /// restart.
    pub fn is_volatile(&self) -> bool {
        self.ctl.is_volatile()
    }

    /// True when each queue pair of the session has an rkey of its own, a type 2B memory window
    /// bound to it ([`rblk_proto::FEATURE_WINDOWS`]); false when the session has one registration
    /// and one rkey for all its queue pairs.
    pub fn memory_windows(&self) -> bool {
        self.ctl.link.features() & rblk_proto::FEATURE_WINDOWS != 0
    }

    /// How it was opened.
    pub fn mode(&self) -> OpenMode {
        self.ctl.mode
    }

    /// Whether writes are refused (read-only open, or the target says so).
    pub fn is_read_only(&self) -> bool {
        self.ctl.geo().read_only
    }

    /// Size, block size, largest I/O and read-only-ness, for access checks.
    pub fn geometry(&self) -> Geometry {
        self.ctl.geo()
    }

    /// The URI it was opened by.
    pub fn uri(&self) -> &Uri {
        &self.ctl.uri
    }

    /// The target's address (of the control connection, now).
    pub fn addr(&self) -> SocketAddr {
        self.ctl.addr()
    }

    /// The session's id (OPENED's; a reconnect makes a new session).
    pub fn session_id(&self) -> u64 {
        self.ctl.link.current().opened.session_id
    }

    /// The volume instance's identity the target reported (with FEATURE_RECONNECT).
    pub fn instance(&self) -> Option<rblk_proto::VolumeId> {
        self.ctl.link.current().opened.instance
    }

    /// What a process taking over from this one needs to know of its session (see
    /// [`Session::take_over`](crate::Session::take_over)); it changes when the session reconnects.
    pub fn predecessor(&self) -> crate::Predecessor {
        self.ctl.predecessor()
    }

    /// A successor's start ([`Session::take_over`](crate::Session::take_over)): everything is
    /// dirty, and the verdict on the predecessor's instance applies.
    pub(crate) fn take_over(&self, verdict: &crate::Continuity) {
        self.ctl.io.dirty_all();
        self.ctl.link.succeed(verdict);
    }

    /// How often the session reconnected after losing its target.
    pub fn reconnects(&self) -> u64 {
        self.ctl.link.reconnect_count()
    }

    /// Whether a lost session will be reconnected (the target supports it, and
    /// [`Reconnect::ctrl_loss_tmo`](crate::Reconnect::ctrl_loss_tmo) is not 0).
    pub fn can_reconnect(&self) -> bool {
        self.ctl.link.reconnects()
    }

    /// The volume's address and the rkey OPENED gave, for tests that post raw work requests. With
    /// [`memory_windows`](Self::memory_windows) that rkey works only on the session's first queue
    /// pair. A bad raw access puts both ends' QPs into error.
    pub fn remote(&self) -> (u64, u32) {
        let now = self.ctl.link.current().opened;
        (now.remote_addr, now.rkey)
    }

    /// The session's protection domain, for tests that register their own buffers.
    pub fn pd(&self) -> Pd {
        self.ctl.pd()
    }

    /// Checks a synchronous access ([`read_at`](Self::read_at) / [`write_at`](Self::write_at)):
    /// not empty, block-aligned, inside the volume, no write when read-only.
    pub fn check_range(&self, dir: Direction, offset: u64, len: u64) -> Result<()> {
        self.ctl.geo().check(dir, offset, len, None)?;
        self.ctl.io.check_writable(dir, offset, len)
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.check_range(Direction::Read, offset, buf.len() as u64)?;
        self.lane()?.read_at(buf, offset)
    }

    /// Writes `buf` at `offset`. The data is in target memory when this returns; call
    /// [`flush`](Self::flush) to make it durable.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<()> {
        self.check_range(Direction::Write, offset, buf.len() as u64)?;
        self.lane()?.write_at(buf, offset, false)
    }

    /// Makes `len` bytes at `offset` read as zeros, their blocks kept allocated; durable when
    /// this returns on a target with [`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD), which
    /// zeroes the range itself (see [`IoOp::WriteZeroes`](crate::engine::IoOp::WriteZeroes));
    /// otherwise written as zeros, durable after a [`flush`](Self::flush).
    pub fn write_zeroes(&mut self, offset: u64, len: u64) -> Result<()> {
        self.check_range(Direction::Write, offset, len)?;
        self.lane()?.write_zeroes(offset, len, false)
    }

    /// Discards `len` bytes at `offset` (whole blocks): they read as zeros when this returns,
    /// and a durable volume's backing store gives their blocks back (see
    /// [`IoOp::Discard`](crate::engine::IoOp::Discard)). Refused by a target without
    /// [`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD).
    pub fn discard(&mut self, offset: u64, len: u64) -> Result<()> {
        self.check_range(Direction::Write, offset, len)?;
        self.lane()?.discard(offset, len)
    }

    /// Whether the target zeroes and discards ranges itself (see [`Volume::discard`]).
    pub fn discards(&self) -> bool {
        self.ctl.link.features() & rblk_proto::FEATURE_DISCARD != 0
    }

    /// The lane of the synchronous calls, opened at the first.
    fn lane(&mut self) -> Result<&mut Lane> {
        if self.io.is_none() {
            let chunk = crate::engine::piece_size(&self.ctl.geo(), Self::CHUNK_MAX);
            let mut lane = Lane::new(Queue::connect(&self.ctl, Self::SYNC_DEPTH, chunk)?, None);
            lane.set_io_timeout(self.ctl.link.opts().io_timeout);
            self.io = Some(lane);
        }
        Ok(self.io.as_mut().expect("opened above"))
    }

    /// Makes everything written since the last flush durable: a FLUSH of the ranges this volume
    /// and its queues completed writes to (coalesced; the whole volume past
    /// [`MAX_FLUSH_RANGES`](rblk_proto::MAX_FLUSH_RANGES) ranges, or when the target lacks ranged
    /// flushes). Returns whether the volume is volatile, in which case the flush was only an
    /// ordering point.
    ///
    /// Writes made through [`Queue`]s are covered once their completions have been reaped: reap
    /// every queue's writes before calling this (the target cannot see one-sided writes). When
    /// nothing was written since the last flush, nothing is sent.
    pub fn flush(&mut self) -> Result<bool> {
        self.ctl.flush()
    }

    /// Makes everything written so far durable, tracked or not: a FLUSH of the whole volume.
    pub fn flush_all(&mut self) -> Result<bool> {
        self.ctl.flush_all()
    }

    /// Makes `len` bytes at `offset` durable (FLUSH of that range, or of everything when the
    /// target lacks ranged flushes). Returns whether the volume is volatile.
    pub fn flush_range(&mut self, offset: u64, len: u64) -> Result<bool> {
        self.ctl.flush_range(offset, len)
    }

    /// True once the target declared the volume failed (a FLUSH could not be made durable):
    /// writes then fail with [`Error::VolumeFailed`].
    pub fn failed(&self) -> bool {
        self.ctl.failed()
    }

    /// The target's counters.
    pub fn stats(&mut self) -> Result<StatsReply> {
        self.ctl.stats()
    }

    /// Housekeeping of the session's queue pairs (the first, and the data lane's once it has
    /// one): takes what arrived while idle (keepalives), sends a KEEPALIVE when one is due,
    /// notices a lost target, and runs a due reconnect attempt when the session is down. Call it
    /// every second or two while the volume has nothing else to do: the target ends a
    /// connection it has not heard from for 15 s. Fails once I/O fails (fast_io_fail_tmo) or
    /// the session is gone; while it reconnects it succeeds (the link logs what happens).
    pub fn keepalive(&mut self) -> Result<()> {
        if let Some(io) = &mut self.io {
            io.tick()?;
        }
        self.ctl.keepalive()
    }

    /// Ends the session: CLOSE, whose OK means the target has revoked the session's access to
    /// the volume (every queue's I/O fails from then on), then disconnect.
    ///
    /// While the session is lost and reconnecting, nothing is sent (there is nobody to tell).
    pub fn close(mut self) -> Result<()> {
        // The data lane goes first: CLOSE revokes the session's access.
        self.io = None;
        self.ctl.close()
    }

    /// Marks the session as closing: from now on, while the target is unreachable, I/O and
    /// flushes fail at once instead of waiting for a reconnect (a detach during an outage).
    pub fn begin_close(&self) {
        self.ctl.begin_close();
    }

    /// Opens a further queue pair of the session with `depth` operations in flight and a pool
    /// of `depth` buffers of [`max_io`](Self::max_io) bytes.
    pub fn queue(&self, depth: u32) -> Result<Queue> {
        self.queue_with(depth, self.ctl.opened.max_io as usize)
    }

    /// [`queue`](Self::queue) with pool buffers of `buf_size` bytes (a multiple of the block
    /// size, at most [`max_io`](Self::max_io)): smaller buffers pin less memory for small I/O.
    pub fn queue_with(&self, depth: u32, buf_size: usize) -> Result<Queue> {
        Queue::connect(&self.ctl, depth, buf_size)
    }
}

/// The session's control side, for an [`Engine`](crate::Engine): the volume's own lane closes.
impl From<Volume> for Control {
    fn from(mut vol: Volume) -> Control {
        vol.io = None;
        let Volume { ctl, .. } = vol;
        ctl
    }
}
