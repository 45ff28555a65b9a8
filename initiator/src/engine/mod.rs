//! The block-I/O engine: the one implementation of block semantics under every front end
//! (`rblk attach`'s ublk queues, the NBD server, the FUSE file,
//! [`Volume::read_at`](crate::Volume::read_at) and [`Volume::write_at`](crate::Volume::write_at)).
//!
//! - [`Lane`]: one queue pair of the session, owned by one thread. Requests of any offset and
//!   length ([`Request`]) are checked, split into pieces of at most the queue's largest operation,
//!   kept up to the queue's depth in flight, and handed back as [`Finished`] when their last
//!   piece completed. Partial blocks are read-modify-written under range holds shared by every
//!   lane of the session, so writes to different bytes of one block never undo each other. FUA
//!   is write, then FLUSH of that range. Writes of zeroes go out as RDMA WRITEs from a zeroed
//!   registration. Data is either the caller's bytes (copied through registered buffers) or a
//!   registered buffer of the lane's pool (zero copy: the NIC reads and writes it).
//! - [`Engine`]: a session shared by threads: its [`Control`] (the first queue pair: FLUSH,
//!   STATS, CLOSE, keepalives), a pool of lanes for the synchronous calls of any thread
//!   ([`Engine::read_at`], [`Engine::write_at`]), and further lanes for threads of their own
//!   ([`Engine::lane`]).
//! - Flush: the session tracks the ranges its writes covered since the last FLUSH
//!   ([`Dirty`](crate::Dirty)); a FLUSH lists exactly those, and nothing is sent when there are
//!   none. A lane sends its FLUSHes (and FUA's) on its own queue pair, without waiting; a FLUSH
//!   completes once every FLUSH begun before it in the session has (one flush sequence).
//! - Threads: nothing of a lane blocks its owner's event loop except, by design, a reconnect
//!   attempt that falls due while it submits or reaps (see [`Reconnect`](crate::Reconnect)).
//!   Who keeps the session's first queue pair heard: every lane's [`Lane::tick`] tries it
//!   (skipping it while another thread holds it for an exchange, which hears the target
//!   meanwhile), and [`Engine::tick`] and [`Volume::keepalive`](crate::Volume::keepalive) do it
//!   for sessions without lanes. The lifecycle of a request is drawn in `lane.rs`.
//! - Errors: [`Error::errno`](crate::Error::errno) is the one errno mapping of every front end.
//!
//! ```no_run
//! use rblk_initiator::engine::{Data, Engine, IoOp, Request};
//! use rblk_initiator::{OpenMode, Options, Session};
//!
//! let vol = Session::connect("rblk://10.0.0.1/vol0", &Options::default())?.open(OpenMode::ReadWrite)?;
//! let engine = Engine::new(vol, 2)?;
//! engine.write_at(b"not a whole block", 100)?; // read-modify-write of block 0
//! let mut lane = engine.lane(32, 128 << 10)?;   // one per thread, asynchronous
//! lane.submit(Request { tag: 7, op: IoOp::Read, offset: 0, len: 4096, fua: false, data: Data::Bytes(Vec::new()) });
//! lane.wait()?;
//! let done = lane.next().expect("finished");
//! done.result?;
//! drop(lane);
//! engine.close()?; // FLUSH of what was written, then CLOSE
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod lane;

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use lane::{CmFds, Data, Finished, IoOp, Lane, Request};

pub use crate::control::Control;
use crate::io_state::Shared;
pub use crate::link::LinkState;
pub use crate::stats::{EngineStats, Latency, LATENCY_BUCKETS_US};
use crate::{Geometry, Queue, Result};

/// A handle on a session's counters ([`Engine::counters`]) that does not keep the session or
/// its connections alive: a metrics endpoint reads it while the session runs, and once more
/// after it closed.
#[derive(Debug, Clone)]
pub struct EngineCounters(Shared);

impl EngineCounters {
    /// The counters now.
    pub fn stats(&self) -> EngineStats {
        self.0.counters.snapshot()
    }

    /// The latency histogram of `op`'s requests (reads; writes and writes of zeroes; FLUSHes
    /// sent), from submission to completion.
    pub fn latency(&self, op: IoOp) -> Latency {
        let c = &self.0.counters;
        match op {
            IoOp::Read => c.read_latency.snapshot(),
            IoOp::Write | IoOp::WriteZeroes { .. } | IoOp::Discard => c.write_latency.snapshot(),
            IoOp::Flush => c.flush_latency.snapshot(),
        }
    }

    /// Whether the session is connected, reconnecting or gone.
    pub fn link_state(&self) -> LinkState {
        self.0.counters.link()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A session shared by threads: see the [module documentation](self).
#[derive(Debug)]
pub struct Engine {
    // Declaration order is drop order: the lanes go before the session's first queue pair.
    pool: Mutex<Pool>,
    control: Arc<Control>,
    returned: Condvar,
    io_timeout: Duration,
}

/// The shared lanes: those free now, and how many there are in all.
#[derive(Debug)]
struct Pool {
    free: Vec<Lane>,
    opened: usize,
}

/// Bytes per piece of the shared lanes (less when the volume's largest I/O is smaller).
const POOL_PIECE: u32 = 256 << 10;
/// Pieces in flight per shared lane.
const POOL_DEPTH: u32 = 6;

impl Engine {
    /// Serves `vol` (a [`Volume`](crate::Volume)) with `lanes` shared lanes for the synchronous
    /// calls, opened now. With 0, for front ends whose threads have lanes of their own
    /// ([`lane`](Self::lane)), one is opened only if a synchronous call needs it.
    pub fn new(vol: impl Into<Control>, lanes: u32) -> Result<Engine> {
        let control = Arc::new(vol.into());
        let piece = piece_size(&control.geo(), POOL_PIECE);
        let free = (0..lanes)
            .map(|_| Ok(Lane::new(Queue::connect(&control, POOL_DEPTH, piece)?, Some(Arc::clone(&control)))))
            .collect::<Result<Vec<_>>>()?;
        Ok(Engine {
            pool: Mutex::new(Pool { opened: free.len(), free }),
            control,
            returned: Condvar::new(),
            io_timeout: crate::DEFAULT_IO_TIMEOUT,
        })
    }

    /// Sets how long one synchronous call may go without a completion (default
    /// [`DEFAULT_IO_TIMEOUT`](crate::DEFAULT_IO_TIMEOUT)).
    pub fn with_io_timeout(mut self, timeout: Duration) -> Engine {
        self.io_timeout = timeout;
        for l in lock(&self.pool).free.iter_mut() {
            l.set_io_timeout(timeout);
        }
        self
    }

    /// A further lane of the session for one thread: `depth` pieces in flight, registered
    /// buffers of `buf_size` bytes (a multiple of the block size, at most the largest I/O).
    pub fn lane(&self, depth: u32, buf_size: usize) -> Result<Lane> {
        let q = Queue::connect(&self.control, depth, buf_size)?;
        let mut lane = Lane::new(q, Some(Arc::clone(&self.control)));
        lane.set_io_timeout(self.io_timeout);
        Ok(lane)
    }

    /// The session's control side (FLUSH, keepalives, STATS).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Size, block size, largest I/O, read-only.
    pub fn geometry(&self) -> Geometry {
        self.control.geo()
    }

    /// Calls `hook` with the volume's new size when the target grows it: see
    /// [`Volume::on_resize`](crate::Volume::on_resize).
    pub fn on_resize(&self, hook: impl Fn(u64) + Send + Sync + 'static) {
        self.control.link.on_resize(std::sync::Arc::new(hook));
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.control.geo().size
    }

    /// The volume's block size: accesses aligned to it need no read-modify-write.
    pub fn block_size(&self) -> u32 {
        self.control.geo().block_size
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.control.geo().read_only
    }

    /// Whether the volume lives in RAM only (a FLUSH then only orders).
    pub fn is_volatile(&self) -> bool {
        self.control.is_volatile()
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.control.addr()
    }

    /// The volume's URI.
    pub fn uri(&self) -> &crate::Uri {
        self.control.uri()
    }

    /// Shared lanes for the synchronous calls.
    pub fn queues(&self) -> usize {
        lock(&self.pool).opened
    }

    /// How often the session reconnected after losing its target.
    pub fn reconnects(&self) -> u64 {
        self.control.link.reconnect_count()
    }

    /// Counters of the whole session.
    pub fn stats(&self) -> EngineStats {
        self.control.io.counters.snapshot()
    }

    /// A handle on the session's counters, for a metrics endpoint: lock-free to read, and it
    /// keeps nothing of the session alive.
    pub fn counters(&self) -> EngineCounters {
        EngineCounters(Arc::clone(&self.control.io))
    }

    /// Bytes written and not yet flushed (a FLUSH would cover them), as tracked: an upper
    /// bound of what a crash of a durable target could lose.
    pub fn unflushed_bytes(&self) -> Option<u64> {
        self.control.unflushed_bytes()
    }

    /// Range holds and FLUSHes the session still keeps: `(holds, flushes)`, both 0 once every
    /// lane's requests are done. For tests that check nothing is left behind.
    #[doc(hidden)]
    pub fn leftovers(&self) -> (usize, usize) {
        self.control.io.leftovers()
    }

    /// Reads `buf.len()` bytes at `offset`, any offset and length inside the volume.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.borrow()?.read_at(buf, offset)
    }

    /// Writes `data` at `offset`, any offset and length inside the volume.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        self.borrow()?.write_at(data, offset, false)
    }

    /// Makes `len` bytes at `offset` read as zeros, any offset and length inside the volume,
    /// their blocks kept allocated (see [`IoOp::WriteZeroes`]).
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.borrow()?.write_zeroes(offset, len, false)
    }

    /// Discards `len` bytes at `offset`, whole blocks: they read as zeros when this returns
    /// (see [`IoOp::Discard`]).
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.borrow()?.discard(offset, len)
    }

    /// Whether the target zeroes and discards ranges itself
    /// ([`FEATURE_DISCARD`](rblk_proto::FEATURE_DISCARD)): [`Engine::discard`] works, and
    /// zeroing whole blocks moves nothing over the link.
    pub fn discards(&self) -> bool {
        self.control.link.features() & rblk_proto::FEATURE_DISCARD != 0
    }

    /// Makes every write completed before this call durable: a FLUSH of the ranges written
    /// since the last one, or nothing when there were none. Returns whether the volume is
    /// volatile.
    pub fn flush(&self) -> Result<bool> {
        self.control.flush()
    }

    /// Housekeeping, every couple of seconds: the idle shared lanes' keepalives and loss
    /// detection, and a KEEPALIVE on the first queue pair unless another thread is using it (a
    /// FLUSH, which hears the target meanwhile): it never waits for the FLUSH.
    pub fn tick(&self) -> Result<()> {
        if let Ok(mut pool) = self.pool.try_lock() {
            for l in pool.free.iter_mut() {
                let _ = l.tick();
            }
        }
        self.control.try_keepalive()
    }

    /// The rdma_cm event channels of the session's first queue pair and of the idle shared
    /// lanes, for a thread that runs [`tick`](Self::tick): when one is readable, call
    /// [`cm_event`](Self::cm_event), and a lost target is noticed then, not at the next tick.
    /// A reconnect replaces them: take them anew for each wait.
    pub fn cm_fds(&self) -> Vec<std::os::fd::RawFd> {
        let mut fds: Vec<_> = self.control.cm_fd().into_iter().collect();
        if let Ok(pool) = self.pool.try_lock() {
            fds.extend(pool.free.iter().flat_map(|l| l.cm_fds().fds[0]));
        }
        fds
    }

    /// One of [`cm_fds`](Self::cm_fds) was readable: the idle shared lanes' and the first
    /// queue pair's [`Lane::cm_event`], never waiting for a lane in use (its caller's wait
    /// watches it). A lost target is the session's to handle (its reconnect has started): only
    /// logged, as [`Lane::cm_event`] does.
    pub fn cm_event(&self) {
        if let Ok(mut pool) = self.pool.try_lock() {
            for l in pool.free.iter_mut() {
                let _ = l.cm_event();
            }
        }
        if let Err(e) = self.control.cm_event() {
            tracing::debug!(error = %rblk_fabric::Chain(&e), "the session's first queue pair: rdma_cm event");
        }
    }

    /// For a thread that runs [`tick`](Self::tick): sleeps until `wake` (its own descriptor)
    /// is readable or `deadline`, handling the session's rdma_cm events meanwhile
    /// ([`cm_fds`](Self::cm_fds), [`cm_event`](Self::cm_event)). True when `wake` is readable.
    pub fn idle_wait(&self, wake: std::os::fd::BorrowedFd<'_>, deadline: std::time::Instant) -> Result<bool> {
        use std::os::fd::AsRawFd as _;
        let mut fds = self.cm_fds();
        fds.insert(0, wake.as_raw_fd());
        // The first queue pair's completion channel too: a message of the target's (RESIZED:
        // the volume grew) is taken when it arrives, not at the next tick. Armed, then polled
        // once more, so nothing that arrived before the arm waits for it.
        let control = self.control.link.arm_control();
        if control.is_some() {
            let _ = self.control.try_keepalive();
        }
        fds.extend(control);
        match rblk_fabric::wait_readable(&fds, deadline) {
            Ok(Some(0)) => Ok(true),
            Ok(Some(i)) if control.is_some() && i == fds.len() - 1 => {
                let _ = self.control.try_keepalive();
                Ok(false)
            }
            Ok(Some(_)) => {
                self.cm_event();
                Ok(false)
            }
            Ok(None) => Ok(false),
            Err(source) => {
                Err(crate::Error::Fabric { op: "waiting for rdma_cm events", addr: self.control.addr(), source })
            }
        }
    }

    /// Flushes what was written since the last flush, closes the shared lanes, then the
    /// session (CLOSE). Lanes handed out must be dropped first. Returns whether the volume is
    /// volatile.
    pub fn close(self) -> Result<bool> {
        // While the target is unreachable nothing waits for a reconnect any more: the flush
        // fails at once (and says what was not flushed) instead of holding the close.
        self.control.begin_close();
        let flushed = self.flush();
        // Queues go first: CLOSE revokes the session's access to the volume.
        lock(&self.pool).free.clear();
        let closed = self.control.close();
        let volatile = flushed?;
        closed?;
        Ok(volatile)
    }

    fn borrow(&self) -> Result<Borrowed<'_>> {
        let mut pool = lock(&self.pool);
        loop {
            if let Some(l) = pool.free.pop() {
                return Ok(Borrowed { engine: self, lane: Some(l) });
            }
            if pool.opened == 0 {
                // Made with no shared lane: the first synchronous call opens one.
                let lane = self.lane(POOL_DEPTH, piece_size(&self.control.geo(), POOL_PIECE))?;
                pool.opened = 1;
                return Ok(Borrowed { engine: self, lane: Some(lane) });
            }
            pool = self.returned.wait(pool).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// The largest piece for lanes whose buffers should be about `want` bytes: `want`, at most the
/// volume's largest I/O, rounded down to its block size (at least one block).
pub fn piece_size(geo: &Geometry, want: u32) -> usize {
    let bs = geo.block_size.max(1);
    ((want.min(geo.max_io) / bs).max(1) * bs) as usize
}

/// A lane borrowed from the pool; goes back on drop.
struct Borrowed<'a> {
    engine: &'a Engine,
    lane: Option<Lane>,
}

impl std::ops::Deref for Borrowed<'_> {
    type Target = Lane;
    fn deref(&self) -> &Lane {
        self.lane.as_ref().expect("borrowed lane")
    }
}

impl std::ops::DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut Lane {
        self.lane.as_mut().expect("borrowed lane")
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lane.take() {
            lock(&self.engine.pool).free.push(l);
            self.engine.returned.notify_one();
        }
    }
}
