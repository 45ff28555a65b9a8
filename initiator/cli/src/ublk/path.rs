//! The ublk server's request path, without libublk's queue or the kernel: what each tag's task
//! does with a request (the kernel's I/O descriptor becomes a [`Request`] staged on the queue's
//! [`Lane`]; [`RequestPath::deliver`] posts what the tags staged and hands finished requests
//! back to their tasks; the result is committed as the kernel expects, [`commit_result`]), and
//! the loop that runs the tasks until nothing moves ([`RequestPath::run_ops`]).
//!
//! `rblk attach`'s queue threads run it against libublk's queue ([`Kernel`] for
//! `UblkQueue`, in [`super`]); `rblk-ublk-path-bench` (rblk-tests) runs the same code against
//! made-up descriptors over the in-memory fabric, for the instruction count per request
//! (issue 45). There is one request path: both call [`tag_task`].

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use libublk::{sys, UblkError};
use rblk_initiator::engine::{Data, Finished, IoOp, Request};
use rblk_initiator::{Buffer, Chain, Lane};

use crate::stages::{Stage, StageLog};

/// What a tag's task needs of the kernel's side of a ublk queue: the I/O descriptor of the
/// tag's request, and the two commands that hand the kernel a buffer (by address, 0 for none)
/// and take the next request: FETCH first, then COMMIT_AND_FETCH with each result. Each returns
/// once the next request is there; `Err(UblkError::QueueIsDown)` when the queue stops.
pub trait Kernel {
    /// The tag's request, once a command returned.
    fn iod(&self, tag: u16) -> sys::ublksrv_io_desc;
    /// FETCH: the tag's first request.
    fn fetch(&self, tag: u16, buf: u64) -> impl Future<Output = Result<i32, UblkError>>;
    /// COMMIT_AND_FETCH: `result` for the tag's request, and its next.
    fn commit(&self, tag: u16, buf: u64, result: i32) -> impl Future<Output = Result<i32, UblkError>>;
}

/// Per tag: the request's result once its lane finished it, and the task waiting for it.
#[derive(Default)]
struct Mailbox {
    done: Cell<Option<Finished>>,
    waker: RefCell<Option<Waker>>,
}

struct Finish<'a>(&'a Mailbox);

impl Future for Finish<'_> {
    type Output = Finished;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Finished> {
        match self.0.done.take() {
            Some(f) => Poll::Ready(f),
            None => {
                *self.0.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// A queue's request path: its lane, a mailbox per tag, and whether the lane is broken.
pub struct RequestPath {
    lane: RefCell<Lane>,
    mailboxes: Vec<Mailbox>,
    /// The lane failed to progress (its queue pair is gone): every request fails.
    broken: Cell<bool>,
    /// `--null-io`: requests complete at once, without RDMA.
    null_io: bool,
    /// One of the lane's rdma_cm channels was readable: the lane takes rdma_cm's events at the
    /// next delivery.
    cm_event: Cell<bool>,
    /// `--stage-log`.
    stages: Option<StageLog>,
}

impl std::fmt::Debug for RequestPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestPath")
            .field("tags", &self.mailboxes.len())
            .field("broken", &self.broken.get())
            .field("null_io", &self.null_io)
            .finish_non_exhaustive()
    }
}

impl RequestPath {
    /// The path of a queue of `depth` tags over `lane`, which posts only when
    /// [`deliver`](Self::deliver) says so (one doorbell for every tag's request).
    pub fn new(mut lane: Lane, depth: u16, null_io: bool, stages: Option<StageLog>) -> RequestPath {
        lane.set_deferred_posting(true);
        RequestPath {
            lane: RefCell::new(lane),
            mailboxes: (0..depth).map(|_| Mailbox::default()).collect(),
            broken: Cell::new(false),
            null_io,
            cm_event: Cell::new(false),
            stages,
        }
    }

    /// The lane, for the queue's event loop (its channels, its wait policy, its housekeeping).
    pub fn lane(&self) -> &RefCell<Lane> {
        &self.lane
    }

    /// Whether the lane broke: requests fail with EIO.
    pub fn is_broken(&self) -> bool {
        self.broken.get()
    }

    /// The lane broke (the caller logged why): requests fail with EIO from now on.
    pub fn set_broken(&self) {
        self.broken.set(true);
    }

    /// rdma_cm has an event for the lane: the next delivery takes it.
    pub fn cm_event(&self) {
        self.cm_event.set(true);
    }

    /// The stage log, if kept.
    pub fn stages(&self) -> Option<&StageLog> {
        self.stages.as_ref()
    }

    /// Notes a stage in the stage log, if kept.
    pub fn note(&self, stage: Stage, arg: u16) {
        if let Some(log) = &self.stages {
            log.note(stage, arg);
        }
    }

    /// Posts what the tags submitted and hands finished requests to their tags' tasks. Returns
    /// whether it woke any.
    pub fn deliver(&self) -> bool {
        let mut lane = self.lane.borrow_mut();
        let before = self.stages.is_some().then(|| lane.in_flight());
        // A lost target is noticed (and the reconnect started) when rdma_cm says so.
        let progressed = if self.cm_event.take() { lane.cm_event() } else { lane.progress() };
        if let Some(posted) = before.and_then(|b| lane.in_flight().checked_sub(b)).filter(|&n| n > 0) {
            self.note(Stage::Posted, u16::try_from(posted).unwrap_or(u16::MAX));
        }
        if let Err(e) = progressed {
            if !self.broken.replace(true) {
                tracing::error!(error = %Chain(&e), "the queue pair failed: requests fail with EIO");
            }
        }
        let mut woke = false;
        while let Some(f) = lane.next() {
            let Some(slot) = usize::try_from(f.tag).ok().and_then(|t| self.mailboxes.get(t)) else { continue };
            self.note(Stage::Done, f.tag as u16);
            slot.done.set(Some(f));
            if let Some(w) = slot.waker.borrow_mut().take() {
                w.wake();
                woke = true;
            }
        }
        woke
    }

    /// Runs the woken tasks (`tick`: one task of the executor, false when none is ready), then
    /// posts what they submitted and hands out what finished, until nothing moves.
    pub fn run_ops(&self, mut tick: impl FnMut() -> bool) {
        self.note(Stage::RunOps, 0);
        loop {
            while tick() {}
            if !self.deliver() {
                break;
            }
        }
        self.note(Stage::RunOpsEnd, 0);
    }
}

/// What a ublk request asks for: the operation and whether it moves data through the tag's
/// buffer; None for an operation rblk does not serve.
fn operation(iod: &sys::ublksrv_io_desc) -> Option<(IoOp, bool)> {
    match iod.op_flags & 0xff {
        sys::UBLK_IO_OP_READ => Some((IoOp::Read, true)),
        sys::UBLK_IO_OP_WRITE => Some((IoOp::Write, true)),
        sys::UBLK_IO_OP_FLUSH => Some((IoOp::Flush, false)),
        sys::UBLK_IO_OP_WRITE_ZEROES => {
            Some((IoOp::WriteZeroes { unmap: iod.op_flags & sys::UBLK_IO_F_NOUNMAP == 0 }, false))
        }
        sys::UBLK_IO_OP_DISCARD => Some((IoOp::Discard, false)),
        _ => None,
    }
}

/// The result a ublk request commits: bytes for reads and writes, 0 for flush and zeroes, or
/// -errno.
pub fn commit_result(f: &Finished, len: u32) -> i32 {
    match (&f.result, f.op) {
        (Ok(()), IoOp::Read | IoOp::Write) => len as i32,
        (Ok(()), _) => 0,
        (Err(e), _) => -e.errno(),
    }
}

/// One tag: FETCH, then for each request: hand it to the lane, wait, COMMIT_AND_FETCH. Returns
/// when a command fails (`QueueIsDown`: the queue stopped).
pub async fn tag_task<K: Kernel>(k: &K, tag: u16, path: &RequestPath) -> Result<(), UblkError> {
    let mut buf: Option<Buffer> = path.lane.borrow().alloc_buffer();
    let addr = |b: &Option<Buffer>| b.as_ref().map_or(0, Buffer::addr);
    k.fetch(tag, addr(&buf)).await?;
    loop {
        path.note(Stage::Seen, tag);
        let iod = k.iod(tag);
        let fua = iod.op_flags & sys::UBLK_IO_F_FUA != 0;
        let offset = iod.start_sector << 9;
        let len = iod.nr_sectors << 9;
        let res = match operation(&iod) {
            None => -libc::EOPNOTSUPP,
            Some((IoOp::Read | IoOp::Write, _)) if path.null_io => len as i32,
            Some(_) if path.null_io => 0,
            Some(_) if path.broken.get() => -libc::EIO,
            Some((_, true)) if buf.is_none() => -libc::ENOMEM,
            Some((op, with_buf)) => {
                let data = if with_buf { buf.take().map_or(Data::None, Data::Registered) } else { Data::None };
                let r = Request { tag: tag.into(), op, offset, len: len.into(), fua, data };
                // Staged only: the event loop posts every tag's request with one doorbell.
                path.lane.borrow_mut().submit(r);
                path.note(Stage::Submitted, tag);
                let mut f = Finish(&path.mailboxes[tag as usize]).await;
                if let Data::Registered(b) = std::mem::take(&mut f.data) {
                    buf = Some(b);
                }
                commit_result(&f, len)
            }
        };
        if buf.is_none() {
            // The buffer went back to the pool with a failed submission: take one again.
            buf = path.lane.borrow().alloc_buffer();
        }
        path.note(Stage::Resumed, tag);
        k.commit(tag, addr(&buf), res).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_commit_as_the_kernel_expects() {
        let ok = |op| Finished { tag: 0, op, result: Ok(()), data: Data::None };
        assert_eq!(commit_result(&ok(IoOp::Read), 8192), 8192);
        assert_eq!(commit_result(&ok(IoOp::Flush), 0), 0);
        assert_eq!(commit_result(&ok(IoOp::WriteZeroes { unmap: false }), 4096), 0);
        let err = rblk_initiator::Error::Invalid {
            what: "write",
            offset: 0,
            len: 4096,
            reason: rblk_initiator::InvalidReason::ReadOnly,
        };
        let f = Finished { tag: 0, op: IoOp::Write, result: Err(err), data: Data::None };
        assert_eq!(commit_result(&f, 4096), -libc::EROFS);
    }

    /// Would catch an operation mapped to the wrong request, or WRITE_ZEROES's NOUNMAP lost.
    #[test]
    fn descriptors_become_the_operations_they_name() {
        let iod = |op_flags| sys::ublksrv_io_desc { op_flags, ..Default::default() };
        assert_eq!(operation(&iod(sys::UBLK_IO_OP_READ)), Some((IoOp::Read, true)));
        assert_eq!(operation(&iod(sys::UBLK_IO_OP_WRITE | sys::UBLK_IO_F_FUA)), Some((IoOp::Write, true)));
        assert_eq!(operation(&iod(sys::UBLK_IO_OP_FLUSH)), Some((IoOp::Flush, false)));
        assert_eq!(operation(&iod(sys::UBLK_IO_OP_DISCARD)), Some((IoOp::Discard, false)));
        assert_eq!(operation(&iod(sys::UBLK_IO_OP_WRITE_ZEROES)), Some((IoOp::WriteZeroes { unmap: true }, false)));
        assert_eq!(
            operation(&iod(sys::UBLK_IO_OP_WRITE_ZEROES | sys::UBLK_IO_F_NOUNMAP)),
            Some((IoOp::WriteZeroes { unmap: false }, false))
        );
        assert_eq!(operation(&iod(0xfe)), None);
    }
}
