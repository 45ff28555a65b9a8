//! The ublk server's request path ([`rblk::ublk::path`]) without the kernel: a made-up kernel
//! side ([`FakeKernel`]) hands each tag 4 KiB reads or writes at random block-aligned offsets
//! (xorshift, a fixed seed), as the ublk driver would in the tag's I/O descriptor, and takes the
//! results the tags commit. The tags' tasks ([`rblk::ublk::path::tag_task`], the server's own)
//! run on a smol executor as `rblk attach`'s queue threads run them, over a lane of the
//! in-memory fabric, with registered buffers and deferred posting.
//!
//! For `rblk-ublk-path-bench` and the instruction count per request (issue 45): [`insns_region`]
//! runs exactly N requests and nothing else.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libublk::{sys, UblkError};
use rblk::ublk::path::{tag_task, Kernel, RequestPath};
use rblk_initiator::Engine;
use smol::LocalExecutor;

use crate::workload::xorshift;

/// A request's size.
pub const BLOCK: u64 = 4096;

/// The kernel's side of one ublk queue, made up: `limit` requests are handed out in all, each
/// tag's next one when it commits the last (or fetches); tags beyond the limit wait.
#[derive(Debug)]
pub struct FakeKernel {
    op: u32,
    /// Offsets are whole blocks below this.
    blocks: u64,
    rng: Cell<u64>,
    iods: RefCell<Vec<sys::ublksrv_io_desc>>,
    issued: Cell<u64>,
    limit: Cell<u64>,
    committed: Cell<u64>,
    /// Commits whose result was not the request's length, and the first such result.
    failed: Cell<u64>,
    first_failure: Cell<Option<i32>>,
    /// Tags waiting for a request.
    parked: RefCell<Vec<Waker>>,
    /// The queue stops: every command fails with `QueueIsDown`.
    stopping: Cell<bool>,
}

impl FakeKernel {
    /// A queue of `depth` tags handing out `op` (`UBLK_IO_OP_READ` or `_WRITE`) requests over a
    /// volume of `size` bytes, offsets from `seed`.
    pub fn new(op: u32, depth: u16, size: u64, seed: u64) -> FakeKernel {
        FakeKernel {
            op,
            blocks: size / BLOCK,
            rng: Cell::new(seed.max(1)),
            iods: RefCell::new(vec![sys::ublksrv_io_desc::default(); depth.into()]),
            issued: Cell::new(0),
            limit: Cell::new(0),
            committed: Cell::new(0),
            failed: Cell::new(0),
            first_failure: Cell::new(None),
            parked: RefCell::new(Vec::new()),
            stopping: Cell::new(false),
        }
    }

    /// Hands out `n` more requests.
    pub fn allow(&self, n: u64) {
        self.limit.set(self.limit.get() + n);
        for w in self.parked.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Stops the queue: waiting tags end.
    pub fn stop(&self) {
        self.stopping.set(true);
        for w in self.parked.borrow_mut().drain(..) {
            w.wake();
        }
    }

    /// Results committed so far.
    pub fn committed(&self) -> u64 {
        self.committed.get()
    }

    /// Requests handed out so far.
    pub fn issued(&self) -> u64 {
        self.issued.get()
    }

    /// Commits that were not the request's length, and the first of them.
    pub fn failed(&self) -> (u64, Option<i32>) {
        (self.failed.get(), self.first_failure.get())
    }

    /// The tag's next request, if one may be handed out.
    fn next(&self, tag: u16) -> bool {
        if self.issued.get() >= self.limit.get() {
            return false;
        }
        self.issued.set(self.issued.get() + 1);
        let x = xorshift(self.rng.get());
        self.rng.set(x);
        let offset = x % self.blocks * BLOCK;
        self.iods.borrow_mut()[usize::from(tag)] = sys::ublksrv_io_desc {
            op_flags: self.op,
            nr_sectors: (BLOCK >> 9) as u32,
            start_sector: offset >> 9,
            addr: 0,
        };
        true
    }
}

/// A FETCH or COMMIT_AND_FETCH: ready when the tag has its next request.
struct NextRequest<'a> {
    k: &'a FakeKernel,
    tag: u16,
}

impl Future for NextRequest<'_> {
    type Output = Result<i32, UblkError>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.k.stopping.get() {
            return Poll::Ready(Err(UblkError::QueueIsDown));
        }
        if self.k.next(self.tag) {
            return Poll::Ready(Ok(0));
        }
        self.k.parked.borrow_mut().push(cx.waker().clone());
        Poll::Pending
    }
}

impl Kernel for FakeKernel {
    fn iod(&self, tag: u16) -> sys::ublksrv_io_desc {
        self.iods.borrow()[usize::from(tag)]
    }

    fn fetch(&self, tag: u16, _buf: u64) -> impl Future<Output = Result<i32, UblkError>> {
        NextRequest { k: self, tag }
    }

    fn commit(&self, tag: u16, _buf: u64, result: i32) -> impl Future<Output = Result<i32, UblkError>> {
        self.committed.set(self.committed.get() + 1);
        let len = self.iods.borrow()[usize::from(tag)].nr_sectors << 9;
        if result != len as i32 {
            self.failed.set(self.failed.get() + 1);
            if self.first_failure.get().is_none() {
                self.first_failure.set(Some(result));
            }
        }
        NextRequest { k: self, tag }
    }
}

/// Runs exactly `n` requests through `path`: hands them out, runs the tags' tasks and the
/// lane as the server's queue loop does ([`RequestPath::run_ops`]), busy, until all `n` are
/// committed. Nothing else inside: no clock, no sleep, no housekeeping (the in-memory fabric's
/// completions are polled, as the server's spin polls its CQ). Not inlined, so that
/// `valgrind --toggle-collect='*insns_region*'` counts exactly this.
#[inline(never)]
pub fn insns_region(exe: &LocalExecutor<'_>, path: &RequestPath, k: &FakeKernel, n: u64) {
    let until = k.committed() + n;
    k.allow(n);
    while k.committed() < until {
        path.run_ops(|| exe.try_tick());
    }
}

/// Spawns the tasks of `depth` tags on `exe` (the server's [`tag_task`]): each fetches and
/// waits for its first request.
pub fn spawn_tags<'a>(
    exe: &LocalExecutor<'a>,
    path: &'a RequestPath,
    k: &'a FakeKernel,
    depth: u16,
) -> Vec<smol::Task<Result<(), UblkError>>> {
    (0..depth).map(|tag| exe.spawn(tag_task(k, tag, path))).collect()
}

/// A request path over a new lane of `engine`, `depth` tags deep, with 4 KiB registered buffers.
pub fn path(engine: &Engine, depth: u16) -> Result<RequestPath, rblk_initiator::Error> {
    let lane = engine.lane(depth.into(), BLOCK as usize)?;
    Ok(RequestPath::new(lane, depth, false, None))
}
