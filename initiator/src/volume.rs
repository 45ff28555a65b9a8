//! An open volume: synchronous reads and writes through a registered bounce buffer on the
//! session's first QP, FLUSH, STATS, CLOSE, and further queues.

use std::net::SocketAddr;
use std::time::Instant;

use rblk_fabric::channel;
use rblk_fabric::{Access, Completion, Local, Memory, Mr, Op, Pd, WorkRequest};
use rblk_proto::{ErrorCode, Flush, FlushedFlags, Message, Opcode, OpenMode, Opened, Range, StatsReply, VolumeFlags};

use crate::conn::{Conn, Dest, Reply};
use crate::dirty::{self, Dirty};
use crate::{Direction, Error, Geometry, Options, Queue, Result, Uri};

/// A volume opened by a [`Session`](crate::Session).
///
/// [`read_at`](Self::read_at) and [`write_at`](Self::write_at) take any block-aligned range
/// inside the volume and split it into chunks no larger than the target's largest I/O, which go
/// out as RDMA READs and WRITEs from a registered bounce buffer, a few at a time. For parallel,
/// asynchronous I/O open [`Queue`]s with [`queue`](Self::queue).
///
/// Dropping a volume disconnects; [`close`](Self::close) says goodbye first.
#[derive(Debug)]
pub struct Volume {
    // Declaration order is drop order: the QP goes before the bounce buffer.
    conn: Conn,
    bounce: Mr,
    chunk: usize,
    geo: Geometry,
    opened: Opened,
    mode: OpenMode,
    uri: Uri,
    dest: Dest,
    opts: Options,
    features: u64,
    dirty: dirty::Shared,
}

/// A work request slot for filling in.
const NO_WR: WorkRequest<'static> = WorkRequest { wr_id: 0, op: Op::Send, local: Local::Inline(&[]), signaled: false };

impl Volume {
    /// Chunks in flight at once in synchronous calls.
    pub(crate) const BOUNCE_SLOTS: u32 = 4;
    /// Largest chunk: bigger ones do not go faster, and pin memory.
    const CHUNK_MAX: u32 = 1 << 20;

    pub(crate) fn new(
        mut conn: Conn,
        uri: Uri,
        dest: Dest,
        opts: Options,
        features: u64,
        mode: OpenMode,
        opened: Opened,
    ) -> Result<Volume> {
        if opened.remote_addr.checked_add(opened.size).is_none() {
            let got = format!("OPENED with address {:#x} and size {}", opened.remote_addr, opened.size);
            conn.break_with("bad OPENED");
            return Err(Error::Protocol { addr: dest.addr, expected: "a volume address range that fits 64 bits", got });
        }
        let geo = Geometry::from_opened(&opened, mode == OpenMode::ReadOnly);
        // max_io is a non-zero multiple of the block size (proto checks OPENED), and so is the
        // chunk: both are powers of two or multiples of one.
        let chunk = opened.max_io.min(Self::CHUNK_MAX.max(opened.block_size)) as usize;
        let fabric_err = |op, source| Error::Fabric { op, addr: dest.addr, source };
        let memory = Memory::anonymous(chunk * Self::BOUNCE_SLOTS as usize)
            .map_err(|e| fabric_err("mapping the bounce buffer", e))?;
        let bounce = conn
            .ep
            .pd()
            .register(&memory, Access::LOCAL)
            .map_err(|e| fabric_err("registering the bounce buffer", e))?;
        Ok(Volume {
            conn,
            bounce,
            chunk,
            geo,
            opened,
            mode,
            uri,
            dest,
            opts,
            features,
            dirty: dirty::Shared::default(),
        })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.opened.size
    }

    /// Offsets and lengths are multiples of this.
    pub fn block_size(&self) -> u32 {
        self.opened.block_size
    }

    /// Largest single RDMA READ or WRITE (a queue operation's limit).
    pub fn max_io(&self) -> u32 {
        self.opened.max_io
    }

    /// What the target says about the volume: volatile, read-only, exclusive.
    pub fn flags(&self) -> VolumeFlags {
        self.opened.flags
    }

    /// True when the volume lives in RAM only: FLUSH orders, but nothing survives a target
    /// restart.
    pub fn is_volatile(&self) -> bool {
        self.opened.flags.contains(VolumeFlags::VOLATILE)
    }

    /// How it was opened.
    pub fn mode(&self) -> OpenMode {
        self.mode
    }

    /// Whether writes are refused (read-only open, or the target says so).
    pub fn is_read_only(&self) -> bool {
        self.geo.read_only
    }

    /// Size, block size, largest I/O and read-only-ness, for access checks.
    pub fn geometry(&self) -> Geometry {
        self.geo
    }

    /// The URI it was opened by.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The target's address.
    pub fn addr(&self) -> SocketAddr {
        self.dest.addr
    }

    /// The session's id (OPENED's).
    pub fn session_id(&self) -> u64 {
        self.opened.session_id
    }

    /// The volume's address and rkey in the session's registration, for tests that post raw
    /// work requests. A bad raw access puts both ends' QPs into error.
    pub fn remote(&self) -> (u64, u32) {
        (self.opened.remote_addr, self.opened.rkey)
    }

    /// The session's protection domain, for tests that register their own buffers.
    pub fn pd(&self) -> Pd {
        self.conn.ep.pd()
    }

    /// Checks a synchronous access ([`read_at`](Self::read_at) / [`write_at`](Self::write_at)):
    /// not empty, block-aligned, inside the volume, no write when read-only.
    pub fn check_range(&self, dir: Direction, offset: u64, len: u64) -> Result<()> {
        self.geo.check(dir, offset, len, None)?;
        dirty::check_writable(&self.dirty, dir, offset, len)
    }

    /// Reads `buf.len()` bytes at `offset` into `buf`.
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(Direction::Read, offset, buf.len() as u64)?;
        let mut done = 0;
        while done < buf.len() {
            let batch = batch(&self.bounce, self.chunk, &self.opened, Direction::Read, offset, done, buf.len());
            let Batch { wrs, ranges, n, end } = batch;
            run(&mut self.conn, &self.opts, &wrs[..n], Direction::Read, &ranges[..n])?;
            for (slot, &(_, len)) in ranges[..n].iter().enumerate() {
                let at = done + slot * self.chunk;
                let dst = &mut buf[at..at + len as usize];
                self.bounce.memory().read_at(slot * self.chunk, dst).map_err(|e| self.local_err(e))?;
            }
            done = end;
        }
        Ok(())
    }

    /// Writes `buf` at `offset`. The data is in target memory when this returns; call
    /// [`flush`](Self::flush) to make it durable.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> Result<()> {
        self.conn.alive()?;
        self.check_range(Direction::Write, offset, buf.len() as u64)?;
        let mut done = 0;
        while done < buf.len() {
            let batch = batch(&self.bounce, self.chunk, &self.opened, Direction::Write, offset, done, buf.len());
            let Batch { wrs, ranges, n, end } = batch;
            for (slot, &(_, len)) in ranges[..n].iter().enumerate() {
                let at = done + slot * self.chunk;
                let src = &buf[at..at + len as usize];
                self.bounce.memory().write_at(slot * self.chunk, src).map_err(|e| self.local_err(e))?;
            }
            run(&mut self.conn, &self.opts, &wrs[..n], Direction::Write, &ranges[..n])?;
            dirty::record(&self.dirty, offset + done as u64, (end - done) as u64);
            done = end;
        }
        Ok(())
    }

    fn local_err(&self, source: rblk_fabric::Error) -> Error {
        Error::Fabric { op: "copying through the bounce buffer", addr: self.dest.addr, source }
    }

    /// Makes everything written since the last flush durable: a FLUSH of the ranges this volume
    /// and its queues completed writes to (coalesced; the whole volume past
    /// [`MAX_FLUSH_RANGES`](rblk_proto::MAX_FLUSH_RANGES) ranges, or when the target lacks ranged
    /// flushes). Returns whether the volume is volatile, in which case the flush was only an
    /// ordering point.
    ///
    /// Writes made through [`Queue`]s are covered once their completions have been reaped: reap
    /// every queue's writes before calling this (the target cannot see one-sided writes).
    pub fn flush(&mut self) -> Result<bool> {
        let pending = dirty::take(&self.dirty);
        let ranges: Vec<Range> = match &pending {
            Dirty::Ranges(v) => v.iter().map(|&(s, e)| Range::new(s, e - s)).collect(),
            Dirty::All => Vec::new(),
        };
        let flush = match pending {
            Dirty::Ranges(_) if self.features & rblk_proto::FEATURE_FLUSH_RANGES != 0 => Flush::Ranges(&ranges),
            _ => Flush::All,
        };
        let result = self.flush_with(flush);
        if result.is_err() {
            // Not durable: the next flush must cover these again.
            dirty::restore(&self.dirty, pending);
        }
        result
    }

    /// Makes everything written so far durable, tracked or not: a FLUSH of the whole volume.
    pub fn flush_all(&mut self) -> Result<bool> {
        let pending = dirty::take(&self.dirty);
        let result = self.flush_with(Flush::All);
        if result.is_err() {
            dirty::restore(&self.dirty, pending);
        }
        result
    }

    /// Makes `len` bytes at `offset` durable (FLUSH of that range, or of everything when the
    /// target lacks ranged flushes). Returns whether the volume is volatile.
    pub fn flush_range(&mut self, offset: u64, len: u64) -> Result<bool> {
        self.geo.check_as("flush", Direction::Read, offset, len, None)?;
        let ranges = [Range::new(offset, len)];
        if self.features & rblk_proto::FEATURE_FLUSH_RANGES != 0 {
            self.flush_with(Flush::Ranges(&ranges))
        } else {
            self.flush_with(Flush::All)
        }
    }

    fn flush_with(&mut self, flush: Flush<'_>) -> Result<bool> {
        let deadline = Instant::now() + self.opts.timeout;
        let flags = self
            .conn
            .expect(&Message::Flush(flush), deadline, "FLUSHED", |r| match r {
                Reply::Flushed(flags) => Some(flags),
                _ => None,
            })
            .inspect_err(|e| {
                if e.code() == Some(ErrorCode::VolumeFailed) {
                    dirty::set_failed(&self.dirty);
                }
            })?;
        Ok(flags.contains(FlushedFlags::VOLATILE))
    }

    /// True once the target declared the volume failed (a FLUSH could not be made durable):
    /// writes then fail with [`Error::VolumeFailed`].
    pub fn failed(&self) -> bool {
        dirty::failed(&self.dirty)
    }

    /// The target's counters.
    pub fn stats(&mut self) -> Result<StatsReply> {
        let deadline = Instant::now() + self.opts.timeout;
        self.conn.expect(&Message::Stats, deadline, "STATS_REPLY", |r| match r {
            Reply::Stats(s) => Some(s),
            _ => None,
        })
    }

    /// Handles what arrived while idle (keepalives) and sends a KEEPALIVE. A holder that does
    /// nothing else for long periods may call this every
    /// [`KEEPALIVE_INTERVAL`](rblk_proto::KEEPALIVE_INTERVAL).
    pub fn keepalive(&mut self) -> Result<()> {
        self.conn.keepalive()
    }

    /// Ends the session: CLOSE, whose OK means the target has revoked the session's access to
    /// the volume (every queue's I/O fails from then on), then disconnect.
    pub fn close(mut self) -> Result<()> {
        let deadline = Instant::now() + self.opts.timeout;
        self.conn.expect(&Message::Close, deadline, "OK(CLOSE)", |r| match r {
            Reply::Ok(Opcode::Close) => Some(()),
            _ => None,
        })
    }

    /// Opens a further queue pair of the session with `depth` operations in flight and a pool
    /// of `depth` buffers of [`max_io`](Self::max_io) bytes.
    pub fn queue(&self, depth: u32) -> Result<Queue> {
        self.queue_with(depth, self.opened.max_io as usize)
    }

    /// [`queue`](Self::queue) with pool buffers of `buf_size` bytes (a multiple of the block
    /// size, at most [`max_io`](Self::max_io)): smaller buffers pin less memory for small I/O.
    pub fn queue_with(&self, depth: u32, buf_size: usize) -> Result<Queue> {
        self.conn.alive()?;
        Queue::connect(self, depth, buf_size)
    }
}

/// What a queue needs of its volume to join the session.
pub(crate) struct QueueParts<'a> {
    pub dest: &'a Dest,
    pub pd: Pd,
    pub opts: &'a Options,
    pub geo: Geometry,
    pub opened: &'a Opened,
    pub dirty: &'a dirty::Shared,
}

impl Volume {
    pub(crate) fn queue_parts(&self) -> QueueParts<'_> {
        QueueParts {
            dest: &self.dest,
            pd: self.conn.ep.pd(),
            opts: &self.opts,
            geo: self.geo,
            opened: &self.opened,
            dirty: &self.dirty,
        }
    }
}

struct Batch<'a> {
    wrs: [WorkRequest<'a>; Volume::BOUNCE_SLOTS as usize],
    /// Volume offset and length of each.
    ranges: [(u64, u64); Volume::BOUNCE_SLOTS as usize],
    n: usize,
    /// Bytes of the access done after this batch.
    end: usize,
}

/// The next up to BOUNCE_SLOTS chunks of an access of `total` bytes at `offset`, starting
/// `done` bytes in.
fn batch<'a>(
    bounce: &'a Mr,
    chunk: usize,
    opened: &Opened,
    dir: Direction,
    offset: u64,
    mut done: usize,
    total: usize,
) -> Batch<'a> {
    let mut b = Batch {
        wrs: [NO_WR; Volume::BOUNCE_SLOTS as usize],
        ranges: [(0, 0); Volume::BOUNCE_SLOTS as usize],
        n: 0,
        end: 0,
    };
    while b.n < b.wrs.len() && done < total {
        let len = chunk.min(total - done);
        let at = offset + done as u64;
        // Checked at open: remote_addr + size fits, and at + len <= size.
        let remote_addr = opened.remote_addr + at;
        let rkey = opened.rkey;
        let op = match dir {
            Direction::Read => Op::Read { remote_addr, rkey },
            Direction::Write => Op::Write { remote_addr, rkey },
        };
        let local = Local::Region { mr: bounce, offset: b.n * chunk, len: len as u32 };
        b.wrs[b.n] = WorkRequest { wr_id: b.n as u64, op, local, signaled: true };
        b.ranges[b.n] = (at, len as u64);
        b.n += 1;
        done += len;
    }
    b.end = done;
    b
}

/// Posts `wrs` (wr_ids are indexes into `ranges`) and waits for all their completions. On an
/// error the connection breaks, and waiting goes on until the NIC has let go of every buffer.
fn run(conn: &mut Conn, opts: &Options, wrs: &[WorkRequest<'_>], dir: Direction, ranges: &[(u64, u64)]) -> Result<()> {
    let started = Instant::now();
    let deadline = started + opts.io_timeout;
    if let Err(source) = conn.ep.post(wrs) {
        conn.break_with(format!("posting RDMA work requests failed: {source}"));
        return Err(Error::Fabric { op: "posting RDMA work requests", addr: conn.addr, source });
    }
    let mut pending = wrs.len();
    let mut first_err = None;
    let mut out = [Completion::EMPTY; Volume::BOUNCE_SLOTS as usize + 4];
    while pending > 0 {
        let n = match conn.ep.wait(&mut out, conn.spin, deadline) {
            Ok(n) => n,
            Err(source) => {
                conn.break_with(format!("waiting for completions failed: {source}"));
                return Err(Error::Fabric { op: "waiting for RDMA completions", addr: conn.addr, source });
            }
        };
        if n == 0 && Instant::now() >= deadline {
            let op = match dir {
                Direction::Read => "RDMA READ",
                Direction::Write => "RDMA WRITE",
            };
            conn.break_with(format!("{op} timed out"));
            return Err(first_err.unwrap_or(Error::Timeout { op, addr: conn.addr, after: started.elapsed() }));
        }
        for c in &out[..n] {
            if channel::is_control(c.wr_id) {
                if let Err(e) = conn.on_control_completion(c) {
                    first_err.get_or_insert(e);
                }
                continue;
            }
            pending = pending.saturating_sub(1);
            if !c.status.is_success() && first_err.is_none() {
                let (offset, len) = ranges.get(c.wr_id as usize).copied().unwrap_or_default();
                let e = Error::completion(dir, offset, len, c);
                conn.break_with(e.to_string());
                first_err = Some(e);
            }
        }
    }
    first_err.map_or(Ok(()), Err)
}
