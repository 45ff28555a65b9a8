//! `rblk attach` and `rblk detach`: a volume as a Linux block device, `/dev/ublkbN`, through
//! ublk (the kernel's userspace block driver, `ublk_drv`) and libublk.
//!
//! Each ublk queue is served by one thread that owns one [`Lane`] (one queue pair of the
//! session) and the queue's io_uring. The ublk I/O buffers are the lane's registered buffer
//! pool, one region cut into per-tag buffers: the kernel copies a request's pages into (or out
//! of) the tag's buffer, and the NIC reads and writes that buffer with one-sided RDMA, so the
//! data is never copied in userspace. (Linux 6.12's ublk has no zero copy, so the kernel's copy
//! between the bio pages and the buffer remains.) The request path itself (descriptor, lane,
//! mailboxes, commit) is [`path`], which runs without libublk too. The thread waits for ublk
//! commands and RDMA completions in one loop (`QueueState::wait`). While the lane has requests
//! out, it spins over its io_uring and the lane's CQ for the session's wait policy's budget
//! (`--wait`, [`rblk_initiator::Wait`]: adaptive by default, twice the thread's usual wait, at
//! most 1 ms), and for that budget too while it has none (the next ublk command comes soon at
//! depth 1: a sleep for it costs a wake-up per request, which measured worse than the second
//! `io_uring_enter` the spin makes; docs/performance.md, "ublk: system calls per I/O"). Under
//! `--wait sleep` a thread whose lane has nothing out sleeps at once, the tags'
//! COMMIT_AND_FETCHes going to the kernel in the same `io_uring_enter`, without arming the CQ
//! (no completion can come). A spin that found nothing sleeps in `io_uring_enter`; with requests
//! out it first arms the completion channel and puts a POLL_ADD on it into the ring (linked to
//! a one-second timeout, since a reconnect replaces the channel; plus a millisecond timer while
//! a request waits for another lane, [`Lane::retry_after`]). A POLL_ADD on each of
//! the lane's rdma_cm channels ([`Lane::cm_fds`]) is always in the ring, so a target's disconnect
//! wakes the thread when it arrives, busy or asleep. A new ublk command
//! reaches the ring as task work that runs only when the thread enters the kernel; the ring's
//! IORING_SETUP_TASKRUN_FLAG tells the spin when to. A one-second timer runs keepalives, the
//! keepalive rule's loss detection and reconnecting; there is no extra thread per queue. The queue threads are named
//! `rblk-q0`, `rblk-q1`, ...; their sleeps are counted (`rblk_initiator_queue_sleeps_total`
//! with `--metrics`). While the session reconnects, requests wait (see `--ctrl-loss-tmo` and
//! `--fast-io-fail-tmo`).
//!
//! The device outlives its server: it is made with ublk user recovery (re-issuing what was in
//! flight) where the kernel has it, and the run entry keeps a [`Handover`]. When the serving
//! process dies, `rblk attach URI` (or `--recover DEV`) takes the device over
//! ([`Session::take_over`]: the dead session is resumed, the reconnect rules judge the volume
//! instance, and the first FLUSH covers the whole volume, since the dead process's dirty set
//! died with it), or removes it when nothing may continue. A flock per device
//! ([`list::DeviceClaim`]) marks it served.
//!
//! The device has a volatile write cache and FUA (`UBLK_ATTR_VOLATILE_CACHE | UBLK_ATTR_FUA`):
//! the kernel sends FLUSH (an fsync of the device or of a filesystem on it), which becomes a
//! FLUSH of exactly the ranges written since the last one, and FUA writes, which are a write
//! then a FLUSH of their range. Against a target with discard (`FEATURE_DISCARD`) the device
//! advertises DISCARD (granularity one block, one segment, up to `MAX_ZERO_LEN` per request) and
//! WRITE_ZEROES up to the same, both done by the target (nothing moves over the link; a
//! WRITE_ZEROES without `UBLK_IO_F_NOUNMAP` may free a durable volume's blocks, as Linux allows);
//! against an older target WRITE_ZEROES only, as RDMA WRITEs from a zeroed registration.

pub mod path;

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use io_uring::{opcode, squeue, types};
use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::with_task_io_ring_mut;
use libublk::io::{UblkDev, UblkQueue};
use libublk::{sys, BufDesc, UblkError, UblkFlags};
use rblk_initiator::{Chain, Continuity, Engine, Lane, OpenMode, Predecessor, Reconnect, Session, Wait, Waiter};

use crate::daemon::{self, READY};
use crate::list::{self, Entry};
use crate::stages::{Stage, StageLog};
use path::RequestPath;

/// The deepest queue: the kernel allows 4096 tags, a queue pair of the initiator 1024.
pub const MAX_DEPTH: u32 = if rblk_initiator::MAX_DEPTH < sys::UBLK_MAX_QUEUE_DEPTH {
    rblk_initiator::MAX_DEPTH
} else {
    sys::UBLK_MAX_QUEUE_DEPTH
};
/// The largest request, and each tag's registered buffer (less when the volume's largest I/O is
/// smaller).
const IO_BUF_BYTES: u32 = 512 << 10;
const CONTROL: &str = "/dev/ublk-control";
/// The environment variable that allows the hidden `--null-io`.
const ALLOW_NULL: &str = "RBLK_ALLOW_NULL";

/// Attach a volume as a block device, /dev/ublkbN (ublk), and print its path
///
/// The kernel's ublk driver hands each request of the block device to one of this process's
/// queue threads; each thread owns a queue pair of the session and serves its requests with
/// one-sided RDMA READs and WRITEs straight between the target's memory and the ublk I/O
/// buffers, which are registered with the NIC. fsync and FUA reach the target as FLUSHes of
/// exactly the ranges written since the last one.
///
/// Prints the device path (one line on stdout; with -o json an object with device, name and
/// pid), says on stderr which pid serves it, and serves in the foreground
/// until `rblk detach`, SIGINT or SIGTERM: then it removes the device, flushes and closes the
/// session. With --daemon it returns once the device exists, leaving a background process to
/// serve it.
///
/// Needs root and the ublk_drv module (modprobe ublk_drv). Choose it over `rblk nbd` and
/// `rblk mount` for filesystems and VMs: it is the fastest way to mount a volume.
///
/// When the volume grows on the target, the device grows with it at once where the kernel's
/// ublk driver can resize a device (UPDATE_SIZE, Linux 6.16 and later; then resize2fs or
/// xfs_growfs grows a mounted filesystem). On older kernels it keeps its size, and stderr says
/// so: detach and attach again to use the new size.
///
/// Examples:
///   rblk attach rblk://10.0.0.1/vol0 --daemon         # prints /dev/ublkb0 (also /dev/rblk/vol0)
///   mkfs.ext4 /dev/rblk/vol0 && mount /dev/rblk/vol0 /srv/data
///   umount /srv/data && rblk detach /dev/rblk/vol0
#[derive(Debug, clap::Args)]
#[command(verbatim_doc_comment)]
pub struct AttachArgs {
    /// The volume: rblk://HOST[:PORT]/VOLUME
    ///
    /// When a device of this URI exists whose serving process died (`rblk list` shows it dead),
    /// that device is taken over instead of a new one made.
    #[arg(required_unless_present = "recover", value_parser = crate::common::volume_uri_arg)]
    uri: Option<String>,
    /// Take over this device from its dead serving process
    ///
    /// /dev/ublkbN or its /dev/rblk/ name, with the URI, key file, host id, open mode and reconnect
    /// options it was attached with; queues and depth are the device's.
    #[arg(long, value_name = "DEV", conflicts_with_all = ["uri", "read_only", "exclusive"])]
    recover: Option<String>,
    /// The device's stable name, /dev/rblk/NAME [default: the volume's]
    ///
    /// A symlink to /dev/ublkbN for fstab and scripts, removed at detach. Default: the volume's
    /// name, with -1, -2, ... when another device has it.
    #[arg(long, value_name = "NAME", value_parser = link_name_arg)]
    name: Option<String>,
    /// ublk queues, each with its own thread and queue pair
    ///
    /// The kernel may give fewer: at most one per CPU.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = |t: &str| rblk_initiator::parse_bounded(t, 1, Some(64)).map(|n| n as u16))]
    queues: u16,
    /// Requests in flight per queue (1-1024)
    #[arg(long, value_name = "D", default_value_t = 64, value_parser = depth_arg)]
    depth: u32,
    /// Attach read-only: the device is read-only and the session too
    #[arg(long, conflicts_with = "exclusive")]
    read_only: bool,
    /// Open the volume exclusively: no other session may write it
    #[arg(long)]
    exclusive: bool,
    /// Not for use: completes every request at once without RDMA (reads return whatever the
    /// buffer holds, writes are dropped), for scripts/compare-rxe.sh's ceiling row (the same
    /// queue loop and wait policy with the RDMA step removed). Refused unless RBLK_ALLOW_NULL=1.
    #[arg(long, hide = true)]
    null_io: bool,
    /// Write each queue's request stage timestamps to FILE.qN
    ///
    /// Each queue thread's own timestamps of its requests' stages (taken from the kernel, staged,
    /// posted, finished, committed) and of its waits, written to FILE.q0, FILE.q1, ... when it
    /// stops, for scripts/stages-rxe.sh (see docs/timeline-rxe.md). Costs a timestamp per stage.
    #[arg(long, value_name = "FILE", value_parser = absolute_arg, hide_short_help = true)]
    stage_log: Option<PathBuf>,
    #[command(flatten)]
    format: crate::common::Format,
    #[command(flatten)]
    metrics: crate::metrics::MetricsArgs,
    #[command(flatten)]
    run: crate::daemon::DaemonArgs,
    #[command(flatten)]
    conn: crate::common::Connection,
    #[command(flatten, next_help_heading = "Reconnect")]
    reconnect: rblk_initiator::ReconnectArgs,
}

/// Remove a block device made by `rblk attach`
///
/// Asks the serving process to stop: it removes the device, flushes what was written since the
/// last flush and closes its session. Exits 1, after removing the device, if that last FLUSH
/// failed, and says how many bytes were not flushed. When the serving process is gone (killed),
/// deletes the device by its id. Refuses while the device is mounted.
#[derive(Debug, clap::Args)]
pub struct DetachArgs {
    /// The device (/dev/ublkbN or /dev/rblk/NAME) or the volume's URI
    target: String,
    /// Only remove the device when its serving process is dead
    ///
    /// Then what waits on it fails; while a process serves it, or when there is no such device, do
    /// nothing and exit 0. For `ExecStopPost=` of rblk-attach@.service.
    #[arg(long)]
    if_dead: bool,
    /// Give up waiting for the serving process after this long
    ///
    /// `60`, `2m`: a bare number is seconds; at most 1 day.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::common::timeout_arg)]
    timeout: Duration,
}

/// `--depth`: checked when the command line is parsed, before root or the driver is.
fn depth_arg(text: &str) -> Result<u32, String> {
    match text.trim().parse::<u32>() {
        Ok(d) if (1..=MAX_DEPTH).contains(&d) => Ok(d),
        _ => Err(format!(
            "--depth must be a whole number from 1 to {MAX_DEPTH} (requests in flight per queue), got {text:?}"
        )),
    }
}

/// A path made absolute now: the background process of `--daemon` works from `/`.
fn absolute_arg(text: &str) -> Result<PathBuf, String> {
    std::path::absolute(text).map_err(|e| format!("{text}: {e}"))
}

/// `rblk attach`.
pub fn attach(args: AttachArgs) -> anyhow::Result<()> {
    // Refusals that need no resource come first, before a background process or a session.
    preflight(&args)?;
    if args.run.daemon && !args.run.detached {
        // The background process printed the device and its own `pid N` before it was ready.
        daemon::spawn_detached("the device was attached")?;
        return Ok(());
    }
    if args.run.detached {
        daemon::become_detached()?;
    }
    serve(&args)
}

fn preflight(args: &AttachArgs) -> anyhow::Result<()> {
    if args.null_io && std::env::var_os(ALLOW_NULL).is_none_or(|v| v != "1") {
        bail!("this mode drops every write: it exists only for measurements and needs {ALLOW_NULL}=1");
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("rblk attach needs root: creating a ublk block device needs CAP_SYS_ADMIN");
    }
    if !Path::new(CONTROL).exists() {
        bail!("{CONTROL} is missing: the ublk driver is not loaded (modprobe ublk_drv)");
    }
    Ok(())
}

/// What a queue thread shares between its tasks.
struct QueueState {
    /// The request path: the lane, the tags' mailboxes ([`path`]).
    path: RequestPath,
    /// Spin or sleep: the session's wait policy, fed with this thread's waits.
    waiter: RefCell<Waiter>,
    /// The ring flags pending task work (`IORING_SETUP_TASKRUN_FLAG`): a spin enters the kernel
    /// only when a ublk command or another completion waits there. Without it, every pass does.
    taskrun_flag: bool,
    /// A POLL_ADD on the lane's completion channel is in the ring (and so the CQ is armed).
    polling: Cell<bool>,
    /// A POLL_ADD on each of the lane's rdma_cm channels ([`Lane::cm_fds`]) is in the ring.
    cm_polling: [Cell<bool>; 2],
    /// The [`generation`](rblk_initiator::engine::CmFds::generation) those polls are of.
    cm_generation: Cell<u64>,
    /// A retry timer for a request that waits for another lane is in the ring.
    retrying: Cell<bool>,
    /// The poll's linked timeout, and the retry timer's (the kernel reads them at submission).
    second: types::Timespec,
    retry: Cell<types::Timespec>,
}

/// `user_data` of this loop's own ring entries. Both libublk marks are set: its futures carry
/// only `Target`, ublk commands neither, so these never collide with its own.
const OWN: u64 = libublk::UblkUringData::Target as u64 | libublk::UblkUringData::NonAsync as u64;
const POLL_UD: u64 = OWN | 1;
const POLL_TIMEOUT_UD: u64 = OWN | 2;
const RETRY_UD: u64 = OWN | 3;
/// The POLL_ADDs on the lane's rdma_cm channels, one per [`Lane::cm_fds`] entry, and the
/// cancellations of those a reconnect left behind.
const CM_UD: [u64; 2] = [OWN | 4, OWN | 5];
const CM_CANCEL_UD: u64 = OWN | 6;

impl QueueState {
    fn note(&self, stage: Stage, arg: u16) {
        self.path.note(stage, arg);
    }

    fn deliver(&self) -> bool {
        self.path.deliver()
    }

    fn lane(&self) -> &RefCell<Lane> {
        self.path.lane()
    }

    /// Waits until there is work: a ublk command, another entry's completion (the timers, the
    /// completion channel's poll) or a finished request. It spins over the ring and the lane's
    /// CQ for the wait policy's budget, and only then arms the completion channel and sleeps in
    /// `io_uring_enter`, so a busy queue pays no wakeups and no re-arms. Err: the queue is going
    /// down.
    fn wait(&self, q: &UblkQueue<'_>) -> Result<bool, UblkError> {
        self.note(Stage::Wait, 0);
        self.watch_cm(q)?;
        let started = Instant::now();
        let (near, idle) = {
            let lane = self.lane().borrow();
            (lane.in_flight(), lane.pending() == 0)
        };
        let (mode, budget, adapts) = {
            let w = self.waiter.borrow();
            (w.mode(), w.budget(near), w.adapts(near))
        };
        // Nothing of the lane's to wait for: only the ring (the next ublk command, a timer,
        // rdma_cm) can bring work. Under `--wait sleep` the ring's new entries (the tags'
        // COMMIT_AND_FETCHes) go in with the sleep, one io_uring_enter, and the lane's CQ is
        // not armed (no completion can come; a re-arm and a channel read each cost a system
        // call on rxe). The other policies spin for the next command as for a completion.
        let sleep_now = sleeps_at_once(mode, idle, q.is_stopping());
        let (found, passes) = if sleep_now { (false, 0) } else { self.spin(q, started, budget)? };
        if !found {
            self.arm_for_sleep(q, !idle)?;
            // A request that finished before the arm raises no event: look once more.
            if !self.deliver() {
                self.lane().borrow().note_sleep();
                self.note(Stage::Sleep, 0);
                libublk::uring_poll_io_fn::<squeue::Entry>(q, None, 1)?;
                self.note(Stage::Woke, 0);
            }
        }
        if adapts {
            self.waiter.borrow_mut().record(started.elapsed());
        }
        self.note(Stage::WaitEnd, u16::try_from(passes).unwrap_or(u16::MAX));
        Ok(false)
    }

    /// Spins for `budget` until the ring has a completion or a request finished. Whatever the
    /// budget, posts the ring's new entries first (the tags' COMMIT_AND_FETCHes) unless the
    /// sleep that follows a zero budget would. Returns whether it found work, and how many
    /// passes it made (for the stage log).
    fn spin(&self, q: &UblkQueue<'_>, started: Instant, budget: Duration) -> Result<(bool, u32), UblkError> {
        if q.is_stopping() {
            return libublk::uring_poll_io_fn::<squeue::Entry>(q, None, 0).map(|_| (true, 0));
        }
        let zero = budget.is_zero();
        let mut passes = 0;
        loop {
            let ready = with_task_io_ring_mut(|r| -> Result<bool, UblkError> {
                // Posting, or collecting what the kernel holds as task work (a new ublk
                // command): an enter with nothing to wait for. A zero budget leaves both to the
                // sleep's enter.
                let post = passes == 0 && !r.submission().is_empty();
                let collect = r.completion().is_empty() && (!self.taskrun_flag || r.submission().taskrun());
                if !zero && (post || collect) {
                    let posting = u16::try_from(r.submission().len()).unwrap_or(u16::MAX);
                    r.submit().map_err(UblkError::IOError)?;
                    self.note(if post { Stage::EnterPost } else { Stage::EnterCollect }, posting);
                }
                Ok(!r.completion().is_empty())
            })?;
            passes += 1;
            if ready || self.deliver() {
                return Ok((true, passes));
            }
            if started.elapsed() >= budget {
                return Ok((false, passes));
            }
            std::hint::spin_loop();
        }
    }

    /// Before a sleep: when `completions` (the lane has requests out), a POLL_ADD on the lane's
    /// completion channel (armed first), linked to a one-second timeout since a reconnect
    /// replaces the channel and a poll of the old one would never fire, unless one is in the
    /// ring already; and a short timer when a request waits for another lane (a range hold, an
    /// earlier FLUSH), which raises no event here ([`Lane::retry_after`]).
    fn arm_for_sleep(&self, q: &UblkQueue<'_>, completions: bool) -> Result<(), UblkError> {
        if self.path.is_broken() {
            return Ok(());
        }
        if completions && !self.polling.get() {
            if let Err(e) = self.lane().borrow_mut().arm() {
                self.path.set_broken();
                tracing::error!(error = %Chain(&e), "arming the completion channel failed: requests fail with EIO");
                return Ok(());
            }
            let fd = self.lane().borrow().event_fd();
            let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as _).build().flags(squeue::Flags::IO_LINK);
            q.ublk_submit_sqe_sync(poll.user_data(POLL_UD))?;
            let timeout = opcode::LinkTimeout::new(&self.second).build().user_data(POLL_TIMEOUT_UD);
            q.ublk_submit_sqe_sync(timeout)?;
            self.polling.set(true);
        }
        let retry = self.lane().borrow().retry_after();
        if let Some(d) = retry.filter(|_| !self.retrying.get()) {
            self.retry.set(types::Timespec::from(d));
            let timer = opcode::Timeout::new(self.retry.as_ptr()).build().user_data(RETRY_UD);
            q.ublk_submit_sqe_sync(timer)?;
            self.retrying.set(true);
        }
        Ok(())
    }

    /// A POLL_ADD on each of the lane's rdma_cm channels not yet in the ring, so that a
    /// disconnect wakes the thread when it arrives, busy or asleep; nothing to arm (a channel is
    /// readable while an event waits on it). A reconnect replaces the channels, and a poll of an
    /// old one would never fire: those of an older generation are cancelled, and the next wait
    /// polls the new ones.
    fn watch_cm(&self, q: &UblkQueue<'_>) -> Result<(), UblkError> {
        if self.path.is_broken() {
            return Ok(());
        }
        let cm = self.lane().borrow().cm_fds();
        let stale = self.cm_generation.replace(cm.generation) != cm.generation;
        for ((fd, polling), ud) in cm.fds.into_iter().zip(&self.cm_polling).zip(CM_UD) {
            if polling.get() {
                if stale {
                    q.ublk_submit_sqe_sync(opcode::AsyncCancel::new(ud).build().user_data(CM_CANCEL_UD))?;
                }
                continue;
            }
            let Some(fd) = fd else { continue };
            let poll = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as _).build();
            q.ublk_submit_sqe_sync(poll.user_data(ud))?;
            polling.set(true);
        }
        Ok(())
    }

    /// A completion of this loop's own entries, or of libublk's (its futures').
    fn completed(&self, cqe: &io_uring::cqueue::Entry) {
        match cqe.user_data() {
            POLL_UD => {
                self.polling.set(false);
                // EBADF: a reconnect replaced the queue pair (and closed its channel) before the
                // kernel took the poll; the next sleep polls the new channel.
                let r = cqe.result();
                if r < 0 && ![-libc::EINTR, -libc::ECANCELED, -libc::ETIME, -libc::EBADF].contains(&r) {
                    tracing::error!(errno = -r, "polling the completion channel failed");
                    self.path.set_broken();
                }
            }
            POLL_TIMEOUT_UD | CM_CANCEL_UD => {}
            RETRY_UD => self.retrying.set(false),
            ud if CM_UD.contains(&ud) => {
                let slot = usize::from(ud == CM_UD[1]);
                self.cm_polling[slot].set(false);
                // Readable: rdma_cm has an event. ECANCELED: a reconnect replaced the channel;
                // EBADF: it closed the channel first. Either way the next wait polls anew.
                let r = cqe.result();
                if r > 0 {
                    self.path.cm_event();
                } else if ![-libc::EINTR, -libc::ECANCELED, -libc::ETIME, -libc::EBADF].contains(&r) {
                    tracing::debug!(errno = -r, "polling an rdma_cm channel failed");
                }
            }
            data => libublk::uring_async::ublk_wake_task(data, cqe),
        }
    }
}

/// Whether a queue thread's wait skips the spin and sleeps in the `io_uring_enter` that posts
/// the ring's new entries: under `--wait sleep`, when its lane has nothing out (`idle`) and the
/// queue is not stopping. Adaptive spins for the next ublk command too: sleeping at once when
/// idle (one io_uring_enter per QD1 request instead of two) cost a wake-up per request and
/// measured slower at QD1 (issue 45; docs/performance.md, "ublk: system calls per I/O").
fn sleeps_at_once(mode: Wait, idle: bool, stopping: bool) -> bool {
    idle && mode == Wait::Sleep && !stopping
}

/// The kernel's side of the request path: libublk's queue, the buffers by address.
impl path::Kernel for UblkQueue<'_> {
    fn iod(&self, tag: u16) -> sys::ublksrv_io_desc {
        *self.get_iod(tag)
    }

    fn fetch(&self, tag: u16, buf: u64) -> impl Future<Output = Result<i32, UblkError>> {
        self.submit_io_prep_cmd(tag, BufDesc::RawAddress(buf as usize as *const u8), 0, None)
    }

    fn commit(&self, tag: u16, buf: u64, result: i32) -> impl Future<Output = Result<i32, UblkError>> {
        self.submit_io_commit_cmd(tag, BufDesc::RawAddress(buf as usize as *const u8), result)
    }
}

/// Every second: the lane's housekeeping (keepalives and loss detection on its queue pair and
/// the session's first one; while the session is lost, the reconnect and the rejoin), then
/// whatever that finished goes to the tags.
async fn ticker_task(q: &UblkQueue<'_>, st: &QueueState) {
    if !rblk_initiator::periodic_checks() {
        return;
    }
    let ts = types::Timespec::new().sec(1);
    loop {
        let _ = q.ublk_submit_sqe(opcode::Timeout::new(&ts).build()).await;
        if let Err(e) = st.lane().borrow_mut().tick() {
            tracing::debug!(error = %Chain(&e), "queue housekeeping failed");
        }
        st.deliver();
    }
}

fn queue_thread(qid: u16, dev: &UblkDev, lane: Option<Lane>, null_io: bool, stage_log: Option<&Path>) {
    // Named for ps, top and /proc/PID/task/*/comm: `rblk-q0`, `rblk-q1`, ...
    if let Ok(name) = std::ffi::CString::new(format!("rblk-q{qid}")) {
        let _ = nix::sys::prctl::set_name(&name);
    }
    let Some(lane) = lane else {
        tracing::error!(qid, "no queue pair for this ublk queue");
        dev.notify_buffer_registration_complete(true);
        return;
    };
    let depth = dev.dev_info.queue_depth;
    let taskrun_flag = match init_ring(dev) {
        Ok(flag) => flag,
        Err(e) => {
            tracing::error!(qid, error = %ublk_text(&e), "setting up the ublk queue's io_uring failed");
            dev.notify_buffer_registration_complete(true);
            return;
        }
    };
    let q = match UblkQueue::new(qid, dev) {
        Ok(q) => q,
        Err(e) => {
            tracing::error!(qid, error = %ublk_text(&e), "setting up the ublk queue failed");
            dev.notify_buffer_registration_complete(true);
            return;
        }
    };
    let st = QueueState {
        waiter: RefCell::new(lane.waiter()),
        path: RequestPath::new(lane, depth, null_io, stage_log.map(|base| StageLog::new(base, qid))),
        taskrun_flag,
        polling: Cell::new(false),
        cm_polling: [Cell::new(false), Cell::new(false)],
        cm_generation: Cell::new(0),
        retrying: Cell::new(false),
        second: types::Timespec::new().sec(1),
        retry: Cell::new(types::Timespec::new()),
    };
    let exe = smol::LocalExecutor::new();
    let mut tags = Vec::with_capacity(depth.into());
    for tag in 0..depth {
        let (q, st) = (&q, &st);
        tags.push(exe.spawn(async move {
            match path::tag_task(q, tag, &st.path).await {
                Ok(()) | Err(UblkError::QueueIsDown) => {}
                Err(e) => tracing::warn!(qid, tag, error = %ublk_text(&e), "ublk tag failed"),
            }
        }));
    }
    let ticker = exe.spawn(ticker_task(&q, &st));
    // Our buffers are our own (BufDesc::RawAddress): tell libublk they are in place.
    dev.notify_buffer_registration_complete(false);
    smol::block_on(exe.run(async {
        // Run the tags, then post what they submitted and hand out what finished, until quiet.
        let run_ops = || st.path.run_ops(|| exe.try_tick());
        let is_done = || tags.iter().all(|t| t.is_finished());
        let wait = || async { st.wait(&q) };
        let reap = |timed_out| {
            libublk::uring_async::ublk_reap_io_events_with_update_queue(&q, timed_out, None, |cqe| st.completed(cqe))
        };
        if let Err(e) = libublk::run_uring_tasks(wait, reap, run_ops, is_done).await {
            tracing::warn!(qid, error = %ublk_text(&e), "the ublk queue's event loop failed");
        }
    }));
    drop(ticker);
    if let Some(log) = st.path.stages() {
        match log.write() {
            Ok(path) => tracing::info!(qid, path = %path.display(), "stage log written"),
            Err(e) => tracing::warn!(qid, error = %e, "writing the stage log failed"),
        }
    }
    // The queue is down (our STOP, or the device deleted elsewhere): wake the main thread.
    let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGTERM);
}

/// The queue's io_uring, made before libublk would make its own: as libublk's (COOP_TASKRUN:
/// the kernel interrupts nobody to post a completion; the thread runs that task work at its
/// next system call) and with IORING_SETUP_TASKRUN_FLAG, which flags such pending work in the
/// ring, so the spin in [`QueueState::wait`] enters the kernel exactly when a ublk command
/// waits there. Returns whether the kernel took the flag (5.19 and later).
fn init_ring(dev: &UblkDev) -> Result<bool, UblkError> {
    let (sq, cq) = (u32::from(dev.tgt.sq_depth), u32::from(dev.tgt.cq_depth));
    let mut flag = true;
    libublk::io::ublk_init_task_ring(|cell| {
        if cell.get().is_some() {
            return Ok(());
        }
        let build = |taskrun_flag: bool| {
            let mut b = io_uring::IoUring::builder();
            b.setup_cqsize(cq).setup_coop_taskrun();
            if taskrun_flag {
                b.setup_taskrun_flag();
            }
            b.build(sq)
        };
        let ring = build(true).or_else(|e| {
            tracing::debug!(error = %e, "no IORING_SETUP_TASKRUN_FLAG: the spin enters the kernel at every pass");
            flag = false;
            build(false)
        });
        cell.set(RefCell::new(ring.map_err(UblkError::IOError)?)).map_err(|_| UblkError::OtherError(-libc::EEXIST))
    })?;
    Ok(flag)
}

/// The device's parameters; `discards`: the target zeroes ranges itself (`FEATURE_DISCARD`).
fn params(size: u64, block_size: u32, io_buf: u32, read_only: bool, discards: bool) -> sys::ublk_params {
    let shift = block_size.trailing_zeros() as u8;
    let mut attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
    if read_only {
        attrs |= sys::UBLK_ATTR_READ_ONLY;
    }
    sys::ublk_params {
        types: sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD,
        basic: sys::ublk_param_basic {
            attrs,
            logical_bs_shift: shift,
            physical_bs_shift: shift,
            io_min_shift: shift,
            io_opt_shift: shift,
            max_sectors: io_buf >> 9,
            dev_sectors: size >> 9,
            ..Default::default()
        },
        // Without discard on the target, WRITE_ZEROES only: no discard sectors means no DISCARD
        // (the granularity must be set all the same). A request of the advertised size is one
        // DISCARD or WRITE_ZEROES on the wire (the kernel splits longer ones).
        discard: if discards {
            let max = (rblk_initiator::MAX_ZERO_LEN >> 9) as u32;
            sys::ublk_param_discard {
                discard_alignment: 0,
                discard_granularity: block_size,
                max_discard_sectors: max,
                max_write_zeroes_sectors: max,
                max_discard_segments: 1,
                ..Default::default()
            }
        } else {
            sys::ublk_param_discard {
                discard_granularity: block_size,
                max_discard_sectors: 0,
                max_write_zeroes_sectors: io_buf >> 9,
                max_discard_segments: 0,
                ..Default::default()
            }
        },
        ..Default::default()
    }
}

/// What `rblk attach` keeps in its run-directory entry for a process that takes its device over
/// when it dies (ublk user recovery, `rblk attach URI` again or `rblk attach --recover DEV`):
/// how to reach and open the volume, and what its session knew ([`Predecessor`]). Queue count
/// and depth come from the device. Rewritten when the session reconnects.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Handover {
    /// The volume (the device's URI).
    pub uri: String,
    /// `read-only`, `read-write` or `exclusive`.
    pub mode: String,
    /// `--key-file`, if given (otherwise the successor looks where `rblk` always looks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// `--no-key`: the successor connects without a key too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_key: bool,
    /// `--host-id`, if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_id: Option<String>,
    /// `--reconnect-delay`, in milliseconds.
    pub reconnect_delay_ms: u64,
    /// `--ctrl-loss-tmo` in milliseconds; None: forever.
    #[serde(default)]
    pub ctrl_loss_tmo_ms: Option<u64>,
    /// `--fast-io-fail-tmo` in milliseconds; None: off.
    #[serde(default)]
    pub fast_io_fail_tmo_ms: Option<u64>,
    /// The session: OPENED's id ...
    pub session_id: u64,
    /// ... and token (hex), so the successor's OPEN ends it.
    pub token: String,
    /// The volume's size, block size and largest I/O as opened.
    pub size: u64,
    /// See `size`.
    pub block_size: u32,
    /// See `size`.
    pub max_io: u32,
    /// The volume instance served (hex); None: the target reported none.
    #[serde(default)]
    pub instance: Option<String>,
}

impl Handover {
    fn new(uri: &str, mode: OpenMode, conn: &crate::common::Connection, r: Reconnect, prev: Predecessor) -> Handover {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut h = Handover {
            uri: uri.to_owned(),
            mode: mode.as_str().into(),
            key_file: conn.key_file.clone(),
            no_key: conn.no_key,
            host_id: conn.host_id.clone(),
            reconnect_delay_ms: ms(r.delay),
            ctrl_loss_tmo_ms: r.ctrl_loss_tmo.map(ms),
            fast_io_fail_tmo_ms: r.fast_io_fail_tmo.map(ms),
            session_id: 0,
            token: String::new(),
            size: 0,
            block_size: 0,
            max_io: 0,
            instance: None,
        };
        h.session(prev);
        h
    }

    /// The session now (a reconnect made a new one). A size the device grew to stays: the
    /// session's own is the size it opened.
    fn session(&mut self, p: Predecessor) {
        self.session_id = p.session_id;
        self.token = rblk_initiator::to_hex(&p.token);
        (self.size, self.block_size, self.max_io) = (p.size.max(self.size), p.block_size, p.max_io);
        self.instance = p.instance.map(|i| i.to_string());
    }

    /// The device grew to `size` bytes with its volume (UPDATE_SIZE): a successor takes it over
    /// only from a volume at least that large.
    fn grew(&mut self, size: u64) {
        self.size = self.size.max(size);
    }

    fn predecessor(&self) -> anyhow::Result<Predecessor> {
        let token = rblk_initiator::from_hex(&self.token).context("the run entry's session token is not valid hex")?;
        let instance = match &self.instance {
            Some(i) => {
                Some(rblk_initiator::VolumeId::from_hex(i).context("the run entry's volume instance is not valid")?)
            }
            None => None,
        };
        Ok(Predecessor {
            session_id: self.session_id,
            token,
            size: self.size,
            block_size: self.block_size,
            max_io: self.max_io,
            instance,
        })
    }

    fn mode(&self) -> anyhow::Result<OpenMode> {
        match OpenMode::ALL.iter().find(|m| m.as_str() == self.mode) {
            Some(mode) => Ok(*mode),
            None => bail!("the run entry's open mode {:?} is not read-only, read-write or exclusive", self.mode),
        }
    }

    fn reconnect(&self) -> Reconnect {
        let d = Duration::from_millis;
        Reconnect {
            delay: d(self.reconnect_delay_ms),
            ctrl_loss_tmo: self.ctrl_loss_tmo_ms.map(d),
            fast_io_fail_tmo: self.fast_io_fail_tmo_ms.map(d),
            // A takeover's connect is one attempt: the unit restarts it.
            connect_timeout: Duration::ZERO,
        }
    }
}

/// The ublk control flags for a new device: user recovery with re-issue of what was in flight,
/// where the driver has it (Linux 6.0 and later); none otherwise (the device dies with its
/// server, as before).
fn recovery_flags() -> u64 {
    let want = u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE);
    // Through ublk(): without the driver libublk would print its own line.
    match ublk("asking the ublk driver's features", || Ok(UblkCtrl::get_features())).ok().flatten() {
        Some(f) if f & want == want => want,
        _ => {
            tracing::warn!("this kernel's ublk driver has no user recovery: the device dies with this process");
            0
        }
    }
}

/// The ublk driver resizes a live device (`UBLK_U_CMD_UPDATE_SIZE`, Linux 6.16 and later).
const UPDATE_SIZE: u64 = sys::UBLK_F_UPDATE_SIZE as u64;

/// What a device does when its volume grew.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Follow {
    /// Nothing: the device has that many whole blocks already.
    Nothing,
    /// UPDATE_SIZE to this many bytes (whole blocks).
    Resize(u64),
    /// The driver cannot resize: say so, in this line.
    Keep(String),
}

/// What device `dev` of `old` bytes in blocks of `bs` does when its volume has `new` bytes, with
/// the ublk driver's features `features` (None: the driver did not say).
fn follow(features: Option<u64>, dev: &str, old: u64, new: u64, bs: u32) -> Follow {
    let bs = u64::from(bs.max(512));
    let whole = new / bs * bs;
    if whole <= old {
        Follow::Nothing
    } else if features.is_some_and(|f| f & UPDATE_SIZE != 0) {
        Follow::Resize(whole)
    } else {
        Follow::Keep(keeps_size(
            dev,
            old,
            new,
            "this kernel's ublk driver cannot resize a device: UPDATE_SIZE needs Linux 6.16 or later",
        ))
    }
}

/// The line said when device `dev` stays at `old` bytes while its volume has `new`.
fn keeps_size(dev: &str, old: u64, new: u64, why: &str) -> String {
    use crate::common::human;
    format!("volume grew to {}; {dev} keeps {} until it is attached again ({why})", human(new), human(old))
}

/// The device follows its volume's growth, from the thread that owns its control (the engine's
/// resize hook runs on a queue thread, which must not block: it hands the size over).
struct Grower {
    features: Option<u64>,
    dev: String,
    block_size: u32,
    /// The device's size now, in bytes.
    size: u64,
}

impl Grower {
    /// The volume has `new` bytes: resizes the device where the driver can, else says why it
    /// cannot (once per grow). Some(size): the device has that size now.
    fn grew(&mut self, c: &UblkCtrl, new: u64) -> Option<u64> {
        match follow(self.features, &self.dev, self.size, new, self.block_size) {
            Follow::Nothing => None,
            Follow::Keep(line) => {
                eprintln!("rblk: {line}");
                None
            }
            Follow::Resize(bytes) => {
                let started = Instant::now();
                match ublk(&format!("resizing {}", self.dev), || c.update_size(bytes)) {
                    Ok(_) => {
                        tracing::info!(dev = self.dev, took = ?started.elapsed(), "UPDATE_SIZE done");
                        eprintln!(
                            "rblk: volume grew to {}; {} follows: {}",
                            crate::common::human(new),
                            self.dev,
                            crate::common::human(bytes)
                        );
                        self.size = bytes;
                        Some(bytes)
                    }
                    Err(e) => {
                        eprintln!("rblk: {}", keeps_size(&self.dev, self.size, new, &format!("{e:#}")));
                        None
                    }
                }
            }
        }
    }
}

/// A dead server's device this attach takes over.
struct Found {
    /// Its run entry (and where it is).
    entry: Entry,
    path: PathBuf,
    dev_id: u32,
    handover: Handover,
    /// Held from here on: nobody else recovers it.
    claim: list::DeviceClaim,
}

/// The device to take over: `--recover DEV`'s (which must have a dead server), or for a URI the
/// device of a dead server of that URI that can be recovered. None: make a new device.
fn dead_server(args: &AttachArgs) -> anyhow::Result<Option<Found>> {
    let entries = list::entries();
    let candidates: Vec<&(PathBuf, Entry)> = entries
        .iter()
        .filter(|(_, e)| e.kind == "ublk" && e.dev_id.is_some())
        .filter(|(_, e)| match (&args.recover, &args.uri) {
            (Some(dev), _) => e.device.as_deref() == Some(dev.as_str()) || e.link.as_deref() == Some(dev.as_str()),
            (None, Some(uri)) => e.uri == *uri && e.handover.is_some() && !e.alive(),
            (None, None) => false,
        })
        .collect();
    let Some((path, entry)) = candidates.first().map(|(p, e)| (p.clone(), e.clone())) else {
        if let Some(dev) = &args.recover {
            bail!("{dev} is not a device attached by rblk attach (`rblk list` shows them)");
        }
        return Ok(None);
    };
    let dev_id = entry.dev_id.unwrap_or_default();
    let dev = entry.device.clone().unwrap_or_else(|| format!("/dev/ublkb{dev_id}"));
    let Some(handover) = entry.handover.clone() else {
        bail!("{dev} was made without ublk user recovery (an older rblk, or a kernel without it): it cannot be taken over; `rblk detach {dev}` removes it");
    };
    if !Path::new(&format!("/dev/ublkc{dev_id}")).exists() {
        // The device is gone (deleted, or the host rebooted): the entry is stale.
        let _ = std::fs::remove_file(&path);
        if args.recover.is_some() {
            bail!("{dev} no longer exists");
        }
        return Ok(None);
    }
    let claim = list::DeviceClaim::take(dev_id).map_err(|e| match e {
        list::ClaimError::Held(_) => {
            anyhow::anyhow!("{dev} is served by a live process, or another `rblk attach` is taking it over")
        }
        e => anyhow::Error::new(e),
    })?;
    Ok(Some(Found { entry, path, dev_id, handover, claim }))
}

/// Where the stable names live.
const LINK_DIR: &str = "/dev/rblk";

fn link_name_arg(name: &str) -> Result<String, String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    ok.then(|| name.to_owned())
        .ok_or_else(|| format!("{name:?}: a name of 1-64 letters, digits, '-', '_', '.' or '@', not starting with '.'"))
}

/// Makes `/dev/rblk/NAME` point at `dev`: `want` (kept for a device taken over), else the first
/// of `base`, `base-1`, ... that is free, or stale (pointing at a device that is gone), or
/// already `dev`'s. None (with a warning) when none can be made.
fn make_link(want: Option<&str>, base: &str, dev: &Path) -> Option<PathBuf> {
    let dir = Path::new(LINK_DIR);
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(error = %e, "cannot create {LINK_DIR}: the device has no stable name");
        return None;
    }
    let base = link_name_arg(base).unwrap_or_else(|_| base.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let candidates = want.map(PathBuf::from).into_iter().chain((0..100).map(|i| match i {
        0 => dir.join(&base),
        i => dir.join(format!("{base}-{i}")),
    }));
    for path in candidates {
        match std::fs::read_link(&path) {
            Ok(to) if to == dev => return Some(path),
            // Stale: its device is gone (a reboot, a device deleted behind rblk's back).
            Ok(to) if !to.exists() => {
                let _ = std::fs::remove_file(&path);
            }
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(_) => continue,
        }
        if std::os::unix::fs::symlink(dev, &path).is_ok() {
            return Some(path);
        }
    }
    tracing::warn!(name = base, "no free name under {LINK_DIR}: the device has no stable name");
    None
}

/// Removes the stable name `link` if it still points at `dev`.
fn remove_link(link: Option<&str>, dev: &str) {
    if let Some(l) = link {
        if std::fs::read_link(l).is_ok_and(|to| to == Path::new(dev)) {
            let _ = std::fs::remove_file(l);
        }
    }
}

fn serve(args: &AttachArgs) -> anyhow::Result<()> {
    if let Some(found) = dead_server(args)? {
        return recover(args, found);
    }
    let uri = args.uri.as_deref().context("a volume URI, or --recover DEV")?;
    let mode = crate::common::open_mode(args.read_only, args.exclusive);
    let reconnect = args.reconnect.reconnect();
    // The session and every queue pair exist before the device: a refused open or an unknown
    // volume leaves nothing behind.
    let vol = crate::common::open(uri, &args.conn, mode, reconnect)?;
    let handover = Handover::new(uri, mode, &args.conn, reconnect, vol.predecessor());
    run(args, vol, Shape { queues: args.queues, depth: args.depth, recover: None }, handover, None)
}

/// The device's queues, and the device taken over (its id) if it exists already.
struct Shape {
    queues: u16,
    depth: u32,
    recover: Option<(u32, list::DeviceClaim)>,
}

/// Takes a dead server's device over: a session that resumes the predecessor's (retried as a
/// reconnect is, until `--ctrl-loss-tmo` of the predecessor's options), judged by the reconnect
/// rules, then START_USER_RECOVERY and this process's queues. Where nothing may continue (the
/// contents are lost, the target stayed unreachable), the device is removed, failing what
/// waits on it, as nvme-rdma removes a controller after ctrl_loss_tmo.
fn recover(args: &AttachArgs, found: Found) -> anyhow::Result<()> {
    let Found { entry, path, dev_id, handover, claim } = found;
    let dev = entry.device.clone().unwrap_or_else(|| format!("/dev/ublkb{dev_id}"));
    // The recovery's stages, timed in the log (scripts/takeover-rxe.sh reads them).
    tracing::info!(%dev, "recovery: found the dead server's device");
    // Ours replaces the dead entry at once: `rblk list` shows the device recovering, and if
    // this process dies too the next one finds what it needs.
    let mut registered = list::register(Entry { state: "recovering".into(), ..entry.served_by_me() });
    let _ = std::fs::remove_file(&path);
    let mode = handover.mode()?;
    let reconnect = handover.reconnect();
    let prev = handover.predecessor()?;
    let mut conn = args.conn.clone();
    conn.key_file = conn.key_file.or_else(|| handover.key_file.clone());
    conn.host_id = conn.host_id.or_else(|| handover.host_id.clone());
    conn.no_key |= handover.no_key && conn.key_file.is_none();
    let opts = conn.options(&handover.uri, reconnect)?;
    eprintln!("rblk: taking over {dev} ({}) from its dead server", handover.uri);
    // A stop (systemctl stop) while the target cannot be reached removes the device: a stopped
    // unit leaves no device whose requests wait for nobody.
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .context("installing signal handlers")?;
    let started = Instant::now();
    let mut stopped = None;
    let taken = loop {
        if let Some(sig) = stopped.or_else(|| signals.pending().next()) {
            let reason = format!("stopped by signal {sig} before the target could be reached");
            let _ = give_up(dev_id, &dev, registered.as_mut(), &reason);
            eprintln!("rblk: removed {dev}: {reason}");
            return Ok(());
        }
        match Session::connect(handover.uri.as_str(), &opts).and_then(|s| s.take_over(mode, &prev)) {
            Ok(taken) => break Ok(taken),
            Err(e) if reconnect.ctrl_loss_tmo.is_some_and(|t| started.elapsed() >= t) => {
                break Err(format!(
                    "gave up reaching the target after {:.0} s (ctrl-loss-tmo): {}",
                    started.elapsed().as_secs_f64(),
                    Chain(&e)
                ))
            }
            Err(e) => {
                tracing::warn!(error = %Chain(&e), "taking the session over failed; next attempt in {:?}", reconnect.delay);
                let next = Instant::now() + reconnect.delay;
                while stopped.is_none() && Instant::now() < next {
                    stopped = signals.pending().next();
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        }
    };
    drop(signals);
    tracing::info!(took = ?started.elapsed(), ok = taken.is_ok(), "recovery: session taken over");
    let vol = match taken {
        Ok((_, Continuity::Refused(reason))) | Err(reason) => {
            return give_up(dev_id, &dev, registered.as_mut(), &reason);
        }
        Ok((vol, verdict)) => {
            if verdict == Continuity::WritesLost {
                eprintln!(
                    "rblk: the volume is a new instance (the target crashed): writes its dead server had not \
                     flushed are lost, and the first flush fails"
                );
            }
            vol
        }
    };
    let ctrl = ublk(&format!("opening {dev}"), || UblkCtrl::new_simple(dev_id as i32))?;
    let info = ctrl.dev_info();
    if info.flags & u64::from(sys::UBLK_F_USER_RECOVERY) == 0 {
        bail!("{dev} was made without ublk user recovery: it cannot be taken over");
    }
    ublk(&format!("START_USER_RECOVERY of {dev}"), || ctrl.start_user_recover())?;
    tracing::info!("recovery: START_USER_RECOVERY done");
    drop(ctrl);
    let handover = Handover::new(&handover.uri, mode, &conn, reconnect, vol.predecessor());
    let shape = Shape { queues: info.nr_hw_queues, depth: info.queue_depth.into(), recover: Some((dev_id, claim)) };
    run(args, vol, shape, handover, registered)
}

/// The device's size in bytes, as the driver has it (GET_PARAMS).
fn device_size(c: &UblkCtrl) -> Option<u64> {
    let mut p = sys::ublk_params::default();
    c.get_params(&mut p).ok()?;
    Some(p.basic.dev_sectors << 9)
}

/// Device `e` grew to `size` bytes: its run entry's handover says so (a successor then agrees
/// on the size).
fn record_growth(e: &mut Entry, size: u64) {
    if let Some(h) = e.handover.as_mut() {
        h.grew(size);
    }
}

/// Nothing may continue on a dead server's device: remove it (what waits on it fails), and
/// leave the entry as a failure `rblk list` shows.
fn give_up(dev_id: u32, dev: &str, reg: Option<&mut list::Registration>, reason: &str) -> anyhow::Result<()> {
    if let Ok(c) = ublk(dev, || UblkCtrl::new_simple(dev_id as i32)) {
        let _ = c.kill_dev();
        let _ = c.del_dev();
    }
    remove_link(reg.as_ref().and_then(|r| r.entry().link.clone()).as_deref(), dev);
    if let Some(reg) = reg {
        reg.update(|e| e.state = format!("failed: {reason}"));
        reg.keep();
    }
    bail!("removed {dev}, whose server had died: {reason}")
}

/// Serves `vol` as the ublk device: a new one, or the one `shape.recover` names (after
/// START_USER_RECOVERY), until `rblk detach`, SIGINT or SIGTERM.
fn run(
    args: &AttachArgs,
    vol: rblk_initiator::Volume,
    shape: Shape,
    handover: Handover,
    registered: Option<list::Registration>,
) -> anyhow::Result<()> {
    let (size, bs, read_only, discards) = (vol.size(), vol.block_size(), vol.is_read_only(), vol.discards());
    if !(512..=4096).contains(&bs) {
        bail!("the volume's block size is {bs} bytes: a ublk device takes 512 to 4096");
    }
    if size % 512 != 0 || size < u64::from(bs) {
        bail!("the volume's size ({size} bytes) cannot be a block device");
    }
    let io_buf = (IO_BUF_BYTES.min(vol.max_io()) / 4096).max(1) * 4096;
    let describe = format!(
        "{} ({}, block size {bs}, {}, {})",
        vol.uri(),
        crate::common::human(size),
        if read_only { "read-only" } else { "read-write" },
        if vol.is_volatile() { "volatile" } else { "durable" },
    );
    // No shared lanes: every queue thread has its own.
    let engine = Arc::new(Engine::new(vol, 0)?);
    // A grown volume's size, from the queue thread that heard it to the device's thread.
    let (grew_tx, grew_rx) = std::sync::mpsc::channel::<u64>();
    engine.on_resize(move |size| {
        let _ = grew_tx.send(size);
    });
    let grew_rx = Mutex::new(grew_rx);
    let features = ublk("asking the ublk driver's features", || Ok(UblkCtrl::get_features())).ok().flatten();
    let metrics = crate::metrics::Metrics::new(engine.uri());
    let _counted = metrics.add(engine.counters());
    let _endpoint = args.metrics.serve(&metrics)?;
    let lanes = (0..shape.queues)
        .map(|_| engine.lane(shape.depth, io_buf as usize).map(Some))
        .collect::<Result<Vec<_>, _>>()
        .context("opening the queue pairs")?;
    let lanes = Arc::new(Mutex::new(lanes));

    let (recovering, _claim) = match shape.recover {
        Some((id, claim)) => (Some(id), Some(claim)),
        None => (None, None),
    };
    let ctrl = ublk("creating the ublk device", || match recovering {
        None => UblkCtrlBuilder::default()
            .name("rblk")
            .id(-1)
            .nr_queues(shape.queues)
            .depth(shape.depth as u16)
            .io_buf_bytes(io_buf)
            .ctrl_flags(recovery_flags())
            .dev_flags(UblkFlags::UBLK_DEV_F_ADD_DEV)
            .build(),
        // The device's own queues and depth (GET_DEV_INFO), as the driver will report them.
        Some(id) => UblkCtrlBuilder::default()
            .name("rblk")
            .id(id as i32)
            .nr_queues(shape.queues)
            .depth(shape.depth as u16)
            .io_buf_bytes(io_buf)
            .dev_flags(UblkFlags::UBLK_DEV_F_RECOVER_DEV)
            .build(),
    })?;
    let dev_id = ctrl.dev_info().dev_id;
    let recoverable = ctrl.dev_info().flags & u64::from(sys::UBLK_F_USER_RECOVERY) != 0;
    // A new device is ours from the start; a recovered one was claimed before START_USER_RECOVERY.
    let _claim = match _claim {
        Some(c) => c,
        None => {
            let claim = list::DeviceClaim::take(dev_id).context("claiming the new device")?;
            list::forget_earlier(dev_id);
            claim
        }
    };
    let bdev = PathBuf::from(ctrl.get_bdev_path());
    let mut grower = Grower { features, dev: bdev.display().to_string(), block_size: bs, size };
    let kept = registered.as_ref().and_then(|r| r.entry().link.clone());
    let volume_name = engine.uri().volume().to_owned();
    let link = make_link(kept.as_deref(), args.name.as_deref().unwrap_or(&volume_name), &bdev);
    let link_text = link.as_ref().map(|l| l.display().to_string());
    let bdev_text = bdev.display().to_string();

    let signals = signal_hook::iterator::Signals::new([libc::SIGINT, libc::SIGTERM, libc::SIGHUP])
        .context("installing signal handlers")?;
    let entry = |e: Entry| Entry {
        dev_id: Some(dev_id),
        state: "serving".into(),
        link: link_text.clone(),
        handover: recoverable.then(|| handover.clone()),
        ..e.device(Some(&bdev))
    };
    let registered = match registered {
        Some(mut r) => {
            r.update(|e| *e = entry(e.clone()));
            Some(r)
        }
        None => list::register(entry(Entry::new("ublk", &handover.uri))),
    };
    let registered = Arc::new(Mutex::new(registered));

    let tgt_init = move |dev: &mut UblkDev| {
        dev.tgt.dev_size = size;
        dev.tgt.params = params(size, bs, dev.dev_info.max_io_buf_bytes.min(io_buf), read_only, discards);
        // Room for each queue's POLL_ADDs and timers beside its tags.
        let d = dev.dev_info.queue_depth;
        dev.tgt.sq_depth = d.saturating_add(16);
        dev.tgt.cq_depth = d.saturating_add(16);
        Ok(())
    };
    let q_lanes = Arc::clone(&lanes);
    let null_io = args.null_io;
    let stage_log = args.stage_log.clone();
    let q_fn = move |qid: u16, dev: &UblkDev| {
        let lane = q_lanes.lock().unwrap_or_else(PoisonError::into_inner).get_mut(qid as usize).and_then(Option::take);
        queue_thread(qid, dev, lane, null_io, stage_log.as_deref());
    };
    let (detached, log_file) = (args.run.detached, args.run.log_file.clone());
    let ready = Arc::new(Mutex::new(None::<anyhow::Error>));
    let ready_err = Arc::clone(&ready);
    let (served, reg) = (Arc::clone(&engine), Arc::clone(&registered));
    let verb = if recovering.is_some() { "took over" } else { "attached" };
    let named = link_text.as_ref().map_or_else(String::new, |l| format!(" ({l})"));
    let (json, bdev_shown, link_shown) = (args.format.json(), bdev_text.clone(), link_text.clone());
    let device_fn = move |c: &UblkCtrl| {
        if verb == "took over" {
            tracing::info!(dev = %bdev.display(), "recovery: serving again (END_USER_RECOVERY done)");
        }
        let mut out = std::io::stdout().lock();
        // Exactly one line on stdout, as `losetup --find --show` prints: the device (or JSON).
        let line = if json {
            serde_json::json!({ "device": bdev_shown, "name": link_shown, "pid": std::process::id() }).to_string()
        } else {
            bdev_shown.clone()
        };
        let shown = writeln!(out, "{line}")
            .and_then(|()| {
                eprintln!("rblk: {verb} {describe} as {}{named}", bdev.display());
                eprintln!("rblk: pid {} serves {}", std::process::id(), bdev.display());
                if detached {
                    writeln!(out, "{READY}")
                } else {
                    eprintln!("rblk: serving until `rblk detach {}` or Ctrl-C", bdev.display());
                    Ok(())
                }
            })
            .and_then(|()| out.flush());
        drop(out);
        // Type=notify units: the device exists (systemctl start returns now, and fails when
        // this process exits before).
        let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]);
        if let Err(e) = shown.map_err(anyhow::Error::from).and_then(|()| {
            if detached {
                daemon::detach_stdio(log_file.as_deref())
            } else {
                Ok(())
            }
        }) {
            *ready_err.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
        }
        // Until a signal: keep the run entry's session current (a reconnect makes a new one),
        // so a successor resumes the right one, and the device's size that of its volume.
        let mut signals = signals;
        let mut last = served.control().predecessor();
        let grew_rx = grew_rx.into_inner().unwrap_or_else(PoisonError::into_inner);
        // The volume may have grown before the hook was there, or while a dead predecessor
        // served the device (which kept the size it had).
        if let Some(now) = device_size(c) {
            grower.size = now;
        }
        let mut grown = Some(served.size());
        'serving: loop {
            if let Some(sig) = signals.pending().next() {
                tracing::info!(signal = sig, "stopping the device");
                break 'serving;
            }
            if let Some(new) = grown.take() {
                if let Some(bytes) = grower.grew(c, new) {
                    if let Some(r) = reg.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                        r.update(|e| record_growth(e, bytes));
                    }
                }
            }
            let now = served.control().predecessor();
            if now != last && recoverable {
                last = now;
                if let Some(r) = reg.lock().unwrap_or_else(PoisonError::into_inner).as_mut() {
                    r.update(|e| {
                        if let Some(h) = e.handover.as_mut() {
                            h.session(now);
                        }
                    });
                }
            }
            if let Ok(new) = grew_rx.recv_timeout(Duration::from_millis(200)) {
                // The newest of what queued up meanwhile.
                grown = Some(grew_rx.try_iter().fold(new, u64::max));
            }
        }
        let _ = c.kill_dev();
    };
    let ran = ctrl.run_target(tgt_init, q_fn, device_fn);
    let mut registered = registered.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(reg) = registered.as_mut() {
        reg.update(|e| e.state = "stopping".into());
    }
    if recovering.is_some() {
        // A control that took a device over does not delete it when dropped.
        let _ = ctrl.del_dev();
    }
    drop(ctrl); // DEL_DEV: the device is gone
    remove_link(link_text.as_deref(), &bdev_text);
    drop(lanes);
    if let Err(e) = ran {
        bail!("starting the ublk device: {}", ublk_text(&e));
    }
    if let Some(e) = ready.lock().unwrap_or_else(PoisonError::into_inner).take() {
        tracing::warn!(error = %e, "reporting readiness failed");
    }
    let engine = Arc::try_unwrap(engine).map_err(|_| anyhow::anyhow!("a queue thread still holds the session"))?;
    let unflushed = engine.unflushed_bytes();
    let stats = engine.stats();
    match engine.close() {
        Ok(volatile) => {
            let note = if volatile { "the volume is volatile (RAM only)" } else { "flushed to durable storage" };
            eprintln!(
                "rblk: detached: {} reads, {} writes, {} discards, {} flushes sent ({} with nothing to flush); {note}",
                stats.reads, stats.writes, stats.discards, stats.flushes, stats.flushes_skipped
            );
            Ok(())
        }
        Err(e) => {
            let bytes = unflushed.map_or_else(|| "an unknown number of".to_owned(), |b| b.to_string());
            if let Some(reg) = registered.as_mut() {
                reg.update(|en| {
                    en.state = format!("failed: the final flush failed: {}", Chain(&e));
                    en.unflushed_bytes = unflushed;
                });
                reg.keep();
            }
            Err(anyhow::Error::new(e)
                .context(format!("the device is removed, but {bytes} bytes written were not flushed")))
        }
    }
}

/// `rblk detach`.
pub fn detach(args: DetachArgs) -> anyhow::Result<()> {
    let entries = list::entries();
    let want = &args.target;
    let dev_id_of = |p: &str| p.strip_prefix("/dev/ublkb").and_then(|n| n.parse::<u32>().ok());
    let found = entries.iter().find(|(_, e)| {
        e.kind == "ublk"
            && (e.device.as_deref() == Some(want.as_str())
                || e.link.as_deref() == Some(want.as_str())
                || e.uri == *want)
    });
    let (path, entry) = match found {
        Some((p, e)) => (Some(p.clone()), Some(e.clone())),
        None => (None, None),
    };
    let dev_id = entry.as_ref().and_then(|e| e.dev_id).or_else(|| dev_id_of(want));
    let found_link = entry.as_ref().and_then(|e| e.link.clone());
    let Some(dev_id) = dev_id else {
        if args.if_dead {
            return Ok(());
        }
        bail!("{want} is not a device attached by rblk attach (`rblk list` shows them)");
    };
    let dev = format!("/dev/ublkb{dev_id}");
    if let Some(m) = mounted_at(&dev) {
        bail!("{dev} is mounted at {m}: unmount it first");
    }
    if !nix::unistd::geteuid().is_root() {
        bail!("rblk detach needs root (ublk devices need CAP_SYS_ADMIN)");
    }
    // Alive: its pid runs and, for servers that claim their device (those with a handover), the
    // claim is held, so a dead server's pid reused by another process is not signalled.
    let serving =
        |e: &Entry| e.alive() && e.state != "dead" && (e.handover.is_none() || list::DeviceClaim::held(dev_id));
    match entry.filter(serving) {
        Some(_) if args.if_dead => Ok(()),
        Some(e) => {
            // The server removes the device, flushes and closes on SIGTERM.
            let pid = nix::unistd::Pid::from_raw(e.pid as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
                .with_context(|| format!("signalling the serving process {}", e.pid))?;
            let deadline = Instant::now() + args.timeout;
            while e.alive() {
                if Instant::now() > deadline {
                    bail!(
                        "the serving process {} did not stop within {}",
                        e.pid,
                        rblk_initiator::format_duration(args.timeout)
                    );
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            // A failed final flush leaves its entry behind, with what was lost.
            let left = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
            if let Some(p) = &path {
                let _ = std::fs::remove_file(p);
            }
            let failed =
                left.and_then(|t| serde_json::from_str::<Entry>(&t).ok()).filter(|e| e.state.starts_with("failed"));
            if let Some(f) = failed {
                let bytes = f.unflushed_bytes.map_or_else(|| "an unknown number of".to_owned(), |b| b.to_string());
                bail!("removed {dev}, but {bytes} bytes written were not flushed ({})", f.state);
            }
            eprintln!("rblk: detached {dev}");
            Ok(())
        }
        None if args.if_dead && !Path::new(&format!("/dev/ublkc{dev_id}")).exists() => Ok(()),
        None => {
            // The serving process is gone (killed): delete the device by its id.
            let c = ublk(&format!("opening {dev}"), || UblkCtrl::new_simple(dev_id as i32))?;
            let _ = c.kill_dev();
            ublk(&format!("deleting {dev}"), || c.del_dev())?;
            remove_link(found_link.as_deref(), &dev);
            if let Some(p) = &path {
                let _ = std::fs::remove_file(p);
            }
            eprintln!("rblk: deleted {dev} (its serving process had died: writes it had not flushed may be lost)");
            Ok(())
        }
    }
}

/// What a missing /dev/ublk-control means.
const DRIVER_NOT_LOADED: &str = "the ublk driver is not loaded (modprobe ublk_drv)";

/// Runs a libublk control call for `what` ("opening /dev/ublkb3"): every call of rblk's goes
/// through here or [`ublk_text`]. The driver is checked for first, because libublk prints its
/// own `Please run modprobe ublk_drv` on stderr and fails with a bare ENOENT without it.
fn ublk<T>(what: &str, call: impl FnOnce() -> Result<T, UblkError>) -> anyhow::Result<T> {
    if !Path::new(CONTROL).exists() {
        bail!("{what}: {DRIVER_NOT_LOADED}");
    }
    call().map_err(|e| anyhow::anyhow!("{what}: {}", ublk_text(&e)))
}

/// A libublk error in words, the one place they are made: what an errno means for a ublk
/// device (the driver missing, a device that does not exist, root needed), else the errno's
/// own description; never a Debug rendering, libublk's terse text or `(os error N)`.
fn ublk_text(e: &UblkError) -> String {
    let errno = match e {
        UblkError::OtherError(n) | UblkError::UringIOError(n) => Some(n.abs()),
        UblkError::IOError(io) => io.raw_os_error(),
        _ => None,
    };
    match (errno, e) {
        (Some(libc::ENOENT), _) if !Path::new(CONTROL).exists() => DRIVER_NOT_LOADED.into(),
        (Some(libc::ENOENT | libc::ENODEV), _) => "no such ublk device".into(),
        (Some(libc::EPERM | libc::EACCES), _) => "permission denied: ublk devices need root (CAP_SYS_ADMIN)".into(),
        (Some(libc::EBUSY), _) => "the device is busy".into(),
        (Some(libc::EEXIST), _) => "a ublk device with that id exists already".into(),
        (Some(libc::EOPNOTSUPP), _) => "this kernel's ublk driver does not support it".into(),
        (Some(n), _) => nix::errno::Errno::from_raw(n).desc().to_lowercase(),
        (None, UblkError::UringTimeout) => "the ublk driver did not answer in time".into(),
        (None, UblkError::QueueIsDown) => "the device's queue is down (it is being removed)".into(),
        (None, UblkError::InvalidVal) => "the ublk driver cannot take these parameters".into(),
        (None, UblkError::JsonError(_)) => "libublk's state file of the device cannot be read or written".into(),
        (None, UblkError::UringIoQueued) => "the request is still queued".into(),
        (None, UblkError::IOError(io)) => io.kind().to_string(),
        (None, _) => "the ublk driver failed".into(),
    }
}

/// Where `dev` is mounted, if it is.
fn mounted_at(dev: &str) -> Option<String> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    mounts.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next() == Some(dev)).then(|| f.next().unwrap_or("?").to_owned())
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn parse(args: &[&str]) -> Result<AttachArgs, String> {
        let argv = ["rblk", "attach"].iter().chain(args);
        match crate::cli::Args::try_parse_from(argv).map_err(|e| e.to_string())?.command {
            crate::cli::Command::Attach(a) => Ok(a),
            other => Err(format!("{other:?}")),
        }
    }

    /// Issue 43, trap 7: libublk's errors in words. Would catch `(os error N)`, libublk's own
    /// texts (`other failure`, `Invalid input`) or a Debug rendering reaching a user.
    #[test]
    fn ublk_errors_are_words() {
        let io = |n| UblkError::IOError(std::io::Error::from_raw_os_error(n));
        assert_eq!(
            ublk_text(&UblkError::OtherError(-libc::EPERM)),
            "permission denied: ublk devices need root (CAP_SYS_ADMIN)"
        );
        assert_eq!(ublk_text(&io(libc::ENODEV)), "no such ublk device");
        assert_eq!(ublk_text(&UblkError::UringIOError(-libc::EBUSY)), "the device is busy");
        assert_eq!(ublk_text(&UblkError::OtherError(-libc::ENOMEM)), "out of memory");
        assert_eq!(ublk_text(&UblkError::InvalidVal), "the ublk driver cannot take these parameters");
        let missing = ublk_text(&UblkError::OtherError(-libc::ENOENT));
        if Path::new(CONTROL).exists() {
            assert_eq!(missing, "no such ublk device");
        } else {
            assert_eq!(missing, DRIVER_NOT_LOADED);
            let e = ublk("opening /dev/ublkb0", || -> Result<(), UblkError> {
                unreachable!("the driver is checked first")
            });
            assert_eq!(format!("{:#}", e.unwrap_err()), format!("opening /dev/ublkb0: {DRIVER_NOT_LOADED}"));
        }
    }

    /// Under `--wait sleep` the COMMIT_AND_FETCH and the wait for the next request are one
    /// io_uring_enter; adaptive and poll spin for the next request. Would catch an idle
    /// adaptive wait sleeping at once (a wake-up per QD1 request), `--wait sleep` spinning, or a
    /// busy lane's wait sleeping before its spin.
    #[test]
    fn an_idle_lane_sleeps_at_once_only_under_the_sleep_policy() {
        assert!(!sleeps_at_once(Wait::Adaptive, true, false));
        assert!(sleeps_at_once(Wait::Sleep, true, false));
        assert!(!sleeps_at_once(Wait::Poll, true, false));
        for mode in [Wait::Adaptive, Wait::Sleep, Wait::Poll] {
            assert!(!sleeps_at_once(mode, false, false), "{mode}: requests out, the spin comes first");
            assert!(!sleeps_at_once(mode, true, true), "{mode}: a stopping queue drains");
        }
    }

    #[test]
    fn attach_flags() {
        let a = parse(&["rblk://h/v", "--queues", "2", "--depth", "32", "--exclusive", "--daemon"]).unwrap();
        assert_eq!((a.queues, a.depth, a.exclusive, a.run.daemon, a.read_only), (2, 32, true, true, false));
        let d = parse(&["rblk://h/v"]).unwrap();
        assert_eq!((d.queues, d.depth), (1, 64));
        assert!(parse(&["rblk://h/v", "--read-only", "--exclusive"]).is_err());
        assert!(parse(&["rblk://h/v", "--queues", "0"]).is_err());
        assert!(parse(&["rblk://h/v", "--log-file", "/l"]).is_err(), "--log-file needs --daemon");
    }

    #[test]
    fn params_keep_flush_fua_and_zeroes_and_discard_where_the_target_has_it() {
        let p = params(64 << 20, 4096, 512 << 10, false, false);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_VOLATILE_CACHE, sys::UBLK_ATTR_VOLATILE_CACHE);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_FUA, sys::UBLK_ATTR_FUA);
        assert_eq!(p.basic.attrs & sys::UBLK_ATTR_READ_ONLY, 0);
        assert_eq!((p.basic.logical_bs_shift, p.basic.max_sectors, p.basic.dev_sectors), (12, 1024, 131072));
        assert_eq!((p.discard.max_discard_sectors, p.discard.max_write_zeroes_sectors), (0, 1024));
        assert_ne!(p.discard.discard_granularity, 0, "the kernel refuses a zero granularity");
        let ro = params(64 << 20, 512, 4096, true, false);
        assert_eq!(ro.basic.attrs & sys::UBLK_ATTR_READ_ONLY, sys::UBLK_ATTR_READ_ONLY);
        assert_eq!(ro.basic.logical_bs_shift, 9);
        // A target with discard: DISCARD and WRITE_ZEROES of up to MAX_ZERO_LEN, one segment.
        let d = params(64 << 20, 4096, 512 << 10, false, true);
        let max = (rblk_initiator::MAX_ZERO_LEN >> 9) as u32;
        assert_eq!((d.discard.max_discard_sectors, d.discard.max_write_zeroes_sectors), (max, max));
        assert_eq!(
            (d.discard.discard_granularity, d.discard.discard_alignment, d.discard.max_discard_segments),
            (4096, 0, 1)
        );
    }

    /// Issue 44: what a device does when its volume grows, from the driver's features. Would
    /// catch UPDATE_SIZE sent to a driver without it (6.12 answers EINVAL or worse), a size
    /// that is not whole blocks sent (libublk refuses it, the driver would take it), a grow
    /// not said where the device cannot follow, or the line losing the device, the sizes or
    /// what to do.
    #[test]
    fn a_grown_volume_resizes_the_device_only_where_the_driver_can() {
        const MIB: u64 = 1 << 20;
        let with = Some(UPDATE_SIZE | u64::from(sys::UBLK_F_USER_RECOVERY));
        let dev = "/dev/ublkb3";
        assert_eq!(follow(with, dev, 256 * MIB, 1280 * MIB, 4096), Follow::Resize(1280 * MIB));
        assert_eq!(follow(with, dev, 256 * MIB, 256 * MIB, 4096), Follow::Nothing, "not grown");
        assert_eq!(follow(with, dev, 256 * MIB, 128 * MIB, 4096), Follow::Nothing, "a device never shrinks");
        assert_eq!(follow(with, dev, 256 * MIB, 256 * MIB + 4095, 4096), Follow::Nothing, "no whole block more");
        assert_eq!(follow(with, dev, 256 * MIB, 256 * MIB + 5000, 4096), Follow::Resize(256 * MIB + 4096));
        assert_eq!(follow(with, dev, 256 * MIB, 256 * MIB + 1000, 512), Follow::Resize(256 * MIB + 512));
        let line = "volume grew to 1280 MiB; /dev/ublkb3 keeps 256 MiB until it is attached again (this kernel's \
                    ublk driver cannot resize a device: UPDATE_SIZE needs Linux 6.16 or later)";
        for without in [None, Some(0), Some(u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE))] {
            assert_eq!(follow(without, dev, 256 * MIB, 1280 * MIB, 4096), Follow::Keep(line.into()), "{without:?}");
            assert_eq!(follow(without, dev, 256 * MIB, 256 * MIB, 4096), Follow::Nothing, "{without:?}");
        }
    }

    /// Issue 44: a device that grew says so in its run entry, so a successor's takeover checks
    /// the volume against the size the device has. Would catch the entry keeping the opened
    /// size, a reconnect's session update putting the opened size back, or the size lost in
    /// the entry's JSON.
    #[test]
    fn a_grown_devices_run_entry_keeps_its_size_through_the_file_and_reconnects() {
        let prev = |size| Predecessor {
            session_id: 7,
            token: [5; 16],
            size,
            block_size: 4096,
            max_io: 1 << 20,
            instance: Some(rblk_initiator::VolumeId::from_hex("00112233445566778899aabbccddeeff").unwrap()),
        };
        let conn = parse(&["rblk://h/v"]).unwrap().conn;
        let handover = Handover::new("rblk://h/v", OpenMode::ReadWrite, &conn, Reconnect::default(), prev(256 << 20));
        let mut entry = Entry { dev_id: Some(3), handover: Some(handover), ..Entry::new("ublk", "rblk://h/v") };
        record_growth(&mut entry, 1280 << 20);
        let text = serde_json::to_string_pretty(&entry).unwrap();
        let back: Entry = serde_json::from_str(&text).unwrap();
        assert_eq!(back, entry);
        let mut h = back.handover.unwrap();
        assert_eq!(h.predecessor().unwrap().size, 1280 << 20, "{text}");
        // A reconnect made a new session, which knows the size it opened.
        h.session(Predecessor { session_id: 8, ..prev(256 << 20) });
        assert_eq!((h.session_id, h.size), (8, 1280 << 20));
        // A successor that opened after the grow: its own size.
        h.session(prev(2048 << 20));
        assert_eq!(h.size, 2048 << 20);
        // Without a handover (no user recovery) there is nothing to record.
        let mut plain = Entry::new("ublk", "rblk://h/v");
        record_growth(&mut plain, 1 << 30);
        assert_eq!(plain.handover, None);
    }
}
