//! The block-I/O engine: the one implementation of block semantics under every front end
//! (`rblk attach`'s ublk queues, the NBD server, the FUSE file, [`Volume::read_at`] and
//! [`Volume::write_at`]).
//!
//! - [`Lane`]: one queue pair of the session, owned by one thread. Requests of any offset and
//!   length ([`Request`]) are checked, split into pieces of at most the queue's largest operation,
//!   kept up to the queue's depth in flight, and handed back as [`Finished`] when their last
//!   piece completed. Partial blocks are read-modify-written under range locks shared by every
//!   lane of the session, so writes to different bytes of one block never undo each other. FUA
//!   is write, then FLUSH of that range. Writes of zeroes go out as RDMA WRITEs from a zeroed
//!   registration. Data is either the caller's bytes (copied through registered buffers) or a
//!   registered buffer of the lane's pool (zero copy: the NIC reads and writes it).
//! - [`Engine`]: a session shared by threads: the control queue pair (FLUSH, keepalives,
//!   CLOSE) behind a lock, a pool of lanes for the synchronous calls of any thread
//!   ([`Engine::read_at`], [`Engine::write_at`]), and further lanes for threads of their own
//!   ([`Engine::lane`]).
//! - Flush: the session tracks the ranges its writes covered since the last FLUSH
//!   ([`Dirty`](crate::Dirty)); a FLUSH lists exactly those, and nothing is sent when there are
//!   none.
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
mod locks;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

pub use lane::{Data, Finished, IoOp, Lane, Request};
pub(crate) use locks::RangeLocks;

use crate::{Error, Geometry, Result, Volume};

/// What the engine did so far (the whole session, every lane).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Read requests.
    pub reads: u64,
    /// Write requests (zeroes included).
    pub writes: u64,
    /// Writes that read partial blocks first.
    pub read_modify_writes: u64,
    /// FLUSH requests sent to the target.
    pub flushes: u64,
    /// Flushes that had nothing to flush (no write since the last FLUSH): nothing was sent.
    pub flushes_skipped: u64,
    /// Bytes read by requests that succeeded.
    pub read_bytes: u64,
    /// Bytes written (zeroes included) by requests that succeeded.
    pub written_bytes: u64,
    /// Requests that failed (reads, writes, flushes; refused ones included).
    pub errors: u64,
    /// Successful reconnects of the session.
    pub reconnects: u64,
}

impl std::ops::AddAssign for EngineStats {
    fn add_assign(&mut self, o: EngineStats) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.read_modify_writes += o.read_modify_writes;
        self.flushes += o.flushes;
        self.flushes_skipped += o.flushes_skipped;
        self.read_bytes += o.read_bytes;
        self.written_bytes += o.written_bytes;
        self.errors += o.errors;
        self.reconnects += o.reconnects;
    }
}

/// Whether a session is connected to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Up.
    Connected,
    /// Lost; reconnecting (I/O waits, or fails after fast_io_fail_tmo).
    Reconnecting,
    /// Gone for good: every I/O fails.
    Failed,
}

impl LinkState {
    /// Every state, in the order of their names.
    pub const ALL: [LinkState; 3] = [LinkState::Connected, LinkState::Reconnecting, LinkState::Failed];

    /// `connected`, `reconnecting` or `failed`.
    pub fn name(self) -> &'static str {
        match self {
            LinkState::Connected => "connected",
            LinkState::Reconnecting => "reconnecting",
            LinkState::Failed => "failed",
        }
    }
}

/// Upper bounds of the latency buckets, in microseconds: 1 us, 2 us, 4 us ... 2^25 us (about
/// 34 s); slower requests count in the last, unbounded bucket only.
pub const LATENCY_BUCKETS_US: [u64; 26] = {
    let mut b = [0u64; 26];
    let mut i = 0;
    while i < b.len() {
        b[i] = 1 << i;
        i += 1;
    }
    b
};

/// A latency histogram of lock-free counters: a request's completion is one atomic add on its
/// bucket, the sum and the count, no lock and no allocation.
#[derive(Debug)]
pub(crate) struct AtomicLatency {
    /// Per bucket of [`LATENCY_BUCKETS_US`] (not cumulative), and one more for slower ones.
    buckets: [AtomicU64; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: AtomicU64,
}

impl Default for AtomicLatency {
    fn default() -> Self {
        AtomicLatency { buckets: std::array::from_fn(|_| AtomicU64::new(0)), sum_ns: AtomicU64::new(0) }
    }
}

impl AtomicLatency {
    pub(crate) fn record(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        // The first bucket whose bound (2^i us) is at least the latency, rounded up to a us.
        let us = ns.div_ceil(1000).max(1);
        let i = (64 - (us - 1).leading_zeros()) as usize;
        self.buckets[i.min(LATENCY_BUCKETS_US.len())].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    fn snapshot(&self) -> Latency {
        Latency {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            sum_ns: self.sum_ns.load(Ordering::Relaxed),
        }
    }
}

/// A snapshot of one operation's latency histogram ([`EngineCounters::latency`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Latency {
    buckets: [u64; LATENCY_BUCKETS_US.len() + 1],
    sum_ns: u64,
}

impl Default for Latency {
    fn default() -> Self {
        Latency { buckets: [0; LATENCY_BUCKETS_US.len() + 1], sum_ns: 0 }
    }
}

impl Latency {
    /// Requests measured.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Their latencies added up.
    pub fn sum(&self) -> Duration {
        Duration::from_nanos(self.sum_ns)
    }

    /// `(upper bound in seconds, requests in this bucket)` for each of [`LATENCY_BUCKETS_US`]
    /// (not cumulative: a request counts in the first bucket it fits), then `(f64::INFINITY,
    /// slower ones)`.
    pub fn buckets(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let bounds = LATENCY_BUCKETS_US.iter().map(|&us| us as f64 / 1e6).chain([f64::INFINITY]);
        bounds.zip(self.buckets.iter().copied())
    }
}

impl std::ops::AddAssign for Latency {
    fn add_assign(&mut self, o: Latency) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets) {
            *a += b;
        }
        self.sum_ns += o.sum_ns;
    }
}

/// The session-wide counters behind [`EngineStats`]: lock-free, updated on the I/O path.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub rmw: AtomicU64,
    pub flushes: AtomicU64,
    pub skipped: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub errors: AtomicU64,
    /// Successful reconnects (the link counts them here).
    pub reconnects: AtomicU64,
    /// The link's [`LinkState`], as its index in [`LinkState::ALL`].
    pub link: AtomicU8,
    pub read_latency: AtomicLatency,
    pub write_latency: AtomicLatency,
    /// FLUSHes sent (skipped ones take no time worth measuring).
    pub flush_latency: AtomicLatency,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> EngineStats {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        EngineStats {
            reads: load(&self.reads),
            writes: load(&self.writes),
            read_modify_writes: load(&self.rmw),
            flushes: load(&self.flushes),
            flushes_skipped: load(&self.skipped),
            read_bytes: load(&self.read_bytes),
            written_bytes: load(&self.written_bytes),
            errors: load(&self.errors),
            reconnects: load(&self.reconnects),
        }
    }

    pub(crate) fn set_link(&self, state: LinkState) {
        self.link.store(state as u8, Ordering::Relaxed);
    }
}

/// A handle on a session's counters ([`Engine::counters`]) that does not keep the session or
/// its connections alive: a metrics endpoint reads it while the session runs, and once more
/// after it closed.
#[derive(Debug, Clone)]
pub struct EngineCounters(crate::dirty::Shared);

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
            IoOp::Write | IoOp::WriteZeroes => c.write_latency.snapshot(),
            IoOp::Flush => c.flush_latency.snapshot(),
        }
    }

    /// Whether the session is connected, reconnecting or gone.
    pub fn link_state(&self) -> LinkState {
        LinkState::ALL
            .get(usize::from(self.0.counters.link.load(Ordering::Relaxed)))
            .copied()
            .unwrap_or(LinkState::Failed)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The session's first queue pair, shared by its lanes for FLUSH and keepalives.
#[derive(Debug)]
pub struct Control {
    vol: Mutex<Option<Volume>>,
    addr: SocketAddr,
}

impl Control {
    fn with<T>(&self, f: impl FnOnce(&mut Volume) -> Result<T>) -> Result<T> {
        let mut vol = lock(&self.vol);
        let vol = vol
            .as_mut()
            .ok_or_else(|| Error::ConnectionLost { addr: self.addr, reason: "the session is closed".into() })?;
        f(vol)
    }

    /// FLUSH of the ranges written since the last one (none sent when clean). Returns whether
    /// the volume is volatile.
    pub fn flush(&self) -> Result<bool> {
        self.with(Volume::flush)
    }

    /// FLUSH of one range (FUA).
    pub fn flush_range(&self, offset: u64, len: u64) -> Result<bool> {
        self.with(|v| v.flush_range(offset, len))
    }

    /// A KEEPALIVE on the first queue pair.
    pub fn keepalive(&self) -> Result<()> {
        self.with(Volume::keepalive)
    }

    /// The target's counters.
    pub fn stats(&self) -> Result<rblk_proto::StatsReply> {
        self.with(Volume::stats)
    }
}

/// A session shared by threads: see the [module documentation](self).
#[derive(Debug)]
pub struct Engine {
    control: Arc<Control>,
    shared: crate::dirty::Shared,
    geo: Geometry,
    volatile: bool,
    addr: SocketAddr,
    uri: crate::Uri,
    pool: Mutex<Pool>,
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
    /// Serves `vol` with `lanes` shared lanes for the synchronous calls, opened now. With 0,
    /// for front ends whose threads have lanes of their own ([`lane`](Self::lane)), one is
    /// opened only if a synchronous call needs it.
    pub fn new(vol: Volume, lanes: u32) -> Result<Engine> {
        let shared = vol.shared();
        let geo = vol.geometry();
        let control = Arc::new(Control { addr: vol.addr(), vol: Mutex::new(None) });
        let piece = piece_size(&geo, POOL_PIECE);
        let free = (0..lanes)
            .map(|_| Ok(Lane::new(vol.queue_with(POOL_DEPTH, piece)?, Some(Arc::clone(&control)))))
            .collect::<Result<Vec<_>>>()?;
        let (volatile, addr, uri) = (vol.is_volatile(), vol.addr(), vol.uri().clone());
        *lock(&control.vol) = Some(vol);
        Ok(Engine {
            control,
            shared,
            geo,
            volatile,
            addr,
            uri,
            pool: Mutex::new(Pool { opened: free.len(), free }),
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
        let q = self.control.with(|v| v.queue_with(depth, buf_size))?;
        let mut lane = Lane::new(q, Some(Arc::clone(&self.control)));
        lane.set_io_timeout(self.io_timeout);
        Ok(lane)
    }

    /// The session's control queue pair (FLUSH, keepalives, STATS).
    pub fn control(&self) -> &Arc<Control> {
        &self.control
    }

    /// Size, block size, largest I/O, read-only.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.geo.size
    }

    /// The volume's block size: accesses aligned to it need no read-modify-write.
    pub fn block_size(&self) -> u32 {
        self.geo.block_size
    }

    /// Whether writes are refused.
    pub fn is_read_only(&self) -> bool {
        self.geo.read_only
    }

    /// Whether the volume lives in RAM only (a FLUSH then only orders).
    pub fn is_volatile(&self) -> bool {
        self.volatile
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The volume's URI.
    pub fn uri(&self) -> &crate::Uri {
        &self.uri
    }

    /// Shared lanes for the synchronous calls.
    pub fn queues(&self) -> usize {
        lock(&self.pool).opened
    }

    /// How often the session reconnected after losing its target.
    pub fn reconnects(&self) -> u64 {
        self.shared.counters.reconnects.load(Ordering::Relaxed)
    }

    /// Counters of the whole session.
    pub fn stats(&self) -> EngineStats {
        self.shared.counters.snapshot()
    }

    /// A handle on the session's counters, for a metrics endpoint: lock-free to read, and it
    /// keeps nothing of the session alive.
    pub fn counters(&self) -> EngineCounters {
        EngineCounters(Arc::clone(&self.shared))
    }

    /// Bytes written and not yet flushed (a FLUSH would cover them), as tracked: an upper
    /// bound of what a crash of a durable target could lose.
    pub fn unflushed_bytes(&self) -> Option<u64> {
        crate::dirty::pending_bytes(&self.shared)
    }

    /// Reads `buf.len()` bytes at `offset`, any offset and length inside the volume.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.borrow()?.read_at(buf, offset)
    }

    /// Writes `data` at `offset`, any offset and length inside the volume.
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<()> {
        self.borrow()?.write_at(data, offset, false)
    }

    /// Makes every write completed before this call durable: a FLUSH of the ranges written
    /// since the last one, or nothing when there were none. Returns whether the volume is
    /// volatile.
    pub fn flush(&self) -> Result<bool> {
        self.control.flush()
    }

    /// Housekeeping, every couple of seconds: a KEEPALIVE, and the control messages of idle
    /// shared lanes.
    pub fn tick(&self) -> Result<()> {
        if let Ok(mut pool) = self.pool.try_lock() {
            for l in pool.free.iter_mut() {
                let _ = l.progress();
            }
        }
        self.control.keepalive()
    }

    /// Flushes what was written since the last flush, closes the shared lanes, then the
    /// session (CLOSE). Lanes handed out must be dropped first. Returns whether the volume is
    /// volatile.
    pub fn close(self) -> Result<bool> {
        // While the target is unreachable nothing waits for a reconnect any more: the flush
        // fails at once (and says what was not flushed) instead of holding the close.
        if let Some(v) = lock(&self.control.vol).as_ref() {
            v.begin_close();
        }
        let flushed = self.flush();
        // Queues go first: CLOSE revokes the session's access to the volume.
        lock(&self.pool).free.clear();
        let vol = lock(&self.control.vol).take();
        let closed = vol.map_or(Ok(()), Volume::close);
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
                let lane = self.lane(POOL_DEPTH, piece_size(&self.geo, POOL_PIECE))?;
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
