//! The threads that serve connections: a fixed set of workers ([`Config::workers`]), each
//! owning many connections and waiting on all of them at once (one epoll over their completion
//! channels and one [`WakeQueue`] that carries which connection a waker is for), with their
//! deadlines in one [`Timers`] heap; and one slow-work thread, which takes the steps that may
//! block (an OPEN's registration of a volume, a CLOSE's deregistration, a connection's
//! teardown) so that no worker waits for them.
//!
//! A new connection goes to the worker with the fewest ([`fewest`]); it stays there. Each round
//! a worker gives every connection that is ready (a completion, a wake-up, a deadline) one
//! [`Connection::turn`] of at most [`BUDGET`] completions, so one busy peer cannot starve the
//! others on its worker.
//!
//! Threads of the daemon: `workers`, the listener, the slow-work thread, the admin socket's and
//! the main thread, and for a while: a write-back thread per volume while its FLUSHes run, a
//! thread per admin connection, and a thread that loads a durable volume (its io_uring worker,
//! `iou-wrk`, goes with it: on a thread that stays it stayed too).
//!
//! [`Config::workers`]: crate::config::Config::workers
//! [`BUDGET`]: crate::connection::BUDGET

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::poller::{Poller, WakeQueue};
use rblk_fabric::{Chain, Waker};
use tracing::warn;

use crate::connection::{Connection, Placement, Turn};
use crate::registry::Shared;

/// The wake-up tag that means "look at the inbox" (connection ids start at 1 and count up).
const INBOX: u64 = u64::MAX;

/// The poller tag of a worker's `i`th shared CQ: `CQ_TAGS - i`, counting down below [`INBOX`].
const CQ_TAGS: u64 = u64::MAX - 1;
/// At most this many shared CQs per worker (tags above `CQ_TAGS - MAX_CQS` are CQs').
const MAX_CQS: u64 = 1 << 20;

fn is_cq_tag(tag: u64) -> bool {
    tag <= CQ_TAGS && tag > CQ_TAGS - MAX_CQS
}

/// QPs per shared CQ: 256 x 34 entries (each QP's send and receive depths) = 8,704 entries,
/// within every device's `max_cqe` we know of (rxe's is 32,767). A worker makes another CQ
/// when its CQs on a device are full.
const CQ_ROOM: usize = 256;

/// Back-off after a failed epoll wait.
const BACKOFF: Duration = Duration::from_millis(10);

/// A worker sleeping until a deadline wakes at the next multiple of this (on one clock for
/// every worker), never earlier: the deadlines of a grain share a wake-up. Without it each
/// connection's keepalive woke its worker on its own; at 2,000 idle QPs the wake-ups (each a
/// context switch, 30% of the target's samples under TCG) cost more than the keepalives'
/// system calls. A keepalive sent up to this late, and a connection whose keepalive is due just
/// after a grain starts its next interval a grain later, so the connections' schedules settle
/// on the grid, and their keepalives go out together. 200 ms, not 50 (which it was): with
/// solicited events the grid's ticks were most of an idle worker's wake-ups, and at 200 ms the
/// target took 3.4-4.4% of a core at 2,000 idle QPs against 6.3-6.8% (one boot, 17:27Z). What
/// waits for the grid has seconds to spare: keepalives every 2 s against a 15 s timeout, a
/// held AUTH failure, open and close deadlines, a probe's 2 s; requests and wakers do not.
const TIMER_GRAIN: Duration = Duration::from_millis(200);

/// `at` rounded up to the next multiple of `grain` since `epoch` (`at` itself when it is one,
/// `epoch` when `at` is before it).
fn coarsen(at: Instant, epoch: Instant, grain: Duration) -> Instant {
    let since = at.saturating_duration_since(epoch).as_nanos();
    let grain_ns = grain.as_nanos().max(1);
    let up = since.div_ceil(grain_ns).saturating_mul(grain_ns);
    epoch + Duration::from_nanos(u64::try_from(up).unwrap_or(u64::MAX))
}

/// The grid [`TIMER_GRAIN`] counts from: one for the process.
fn timer_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// The index of the worker with the fewest connections, of those the one with the fewest
/// session firsts (the first of those): `counts` gives each worker's (connections, firsts to
/// count; zeros for a JOIN). A new connection goes there, so connection counts stay within 1 of
/// each other as connections come, and a session's first goes where the fewest are. Without
/// the second key, sessions of two QPs on two workers put every first on worker 0 and every
/// JOIN on worker 1: balanced QPs, and one worker carrying every keepalive.
pub(crate) fn fewest(counts: impl IntoIterator<Item = (usize, usize)>) -> usize {
    counts.into_iter().enumerate().min_by_key(|&(i, (n, firsts))| (n, firsts, i)).map_or(0, |(i, _)| i)
}

/// A worker's connection deadlines: a heap keyed by instant, with one live entry per
/// connection (the one [`Timers::set`] last gave it); older entries are skipped when they
/// come up.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    live: HashMap<u64, Instant>,
}

impl Timers {
    /// Connection `id`'s next deadline is `at` (replacing the one it had).
    pub(crate) fn set(&mut self, id: u64, at: Instant) {
        if self.live.insert(id, at) == Some(at) {
            return;
        }
        self.heap.push(Reverse((at, id)));
        // Deadlines that move at every message leave stale entries behind: rebuild before
        // they outnumber the live ones by much.
        if self.heap.len() > 2 * self.live.len() + 64 {
            self.heap = self.live.iter().map(|(&id, &at)| Reverse((at, id))).collect();
        }
    }

    /// Connection `id` has no deadline any more.
    pub(crate) fn forget(&mut self, id: u64) {
        self.live.remove(&id);
    }

    /// The earliest live deadline.
    pub(crate) fn next(&mut self) -> Option<Instant> {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if self.live.get(&id) == Some(&at) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Appends the connections whose deadline is at or before `now` to `due`, and forgets
    /// those deadlines.
    pub(crate) fn due(&mut self, now: Instant, due: &mut Vec<u64>) {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if at > now {
                break;
            }
            self.heap.pop();
            if self.live.get(&id) == Some(&at) {
                self.live.remove(&id);
                due.push(id);
            }
        }
    }
}

/// What other threads reach a worker by: its wake-up queue, the connections handed to it, and
/// how many it owns.
#[derive(Debug)]
struct Handle {
    queue: Arc<WakeQueue>,
    // Boxed as everywhere else a connection goes (the slow-work thread, the worker's map): a
    // hand-over moves a pointer, not the connection.
    #[allow(clippy::vec_box)]
    inbox: Mutex<Vec<Box<Connection>>>,
    count: AtomicUsize,
    /// Of those, sessions' firsts (not JOINs): they carry their sessions' keepalives.
    firsts: AtomicUsize,
    /// What the worker waits on (its wake-up queue, its shared CQs, connections' own CQs).
    poller: Arc<Poller>,
    /// Its shared CQs, by device; the `i`th is watched with tag `CQ_TAGS - i`.
    cqs: Mutex<Vec<(String, rblk_fabric::SharedCq)>>,
}

impl Handle {
    /// Hands `conn` (new, or back from the slow-work thread) to the worker.
    fn deliver(&self, conn: Box<Connection>) {
        self.inbox.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
        self.queue.wake(INBOX);
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("conn", &self.id()).finish()
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// The workers and the slow-work thread.
#[derive(Debug)]
pub(crate) struct Workers {
    handles: Vec<Arc<Handle>>,
    threads: Vec<thread::JoinHandle<()>>,
    slow: Option<(mpsc::Sender<Job>, thread::JoinHandle<()>)>,
}

impl Workers {
    /// Starts `n` workers (at least 1) and the slow-work thread.
    pub(crate) fn start(shared: &Arc<Shared>, n: usize) -> Result<Workers, rblk_fabric::Error> {
        let (tx, rx) = mpsc::channel::<Job>();
        let slow = thread::Builder::new()
            .name("rblk-slow".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .map_err(|source| rblk_fabric::Error::Os { op: "spawning the slow-work thread", source })?;
        let mut workers = Workers { handles: Vec::new(), threads: Vec::new(), slow: Some((tx.clone(), slow)) };
        let cpus = allowed_cpus();
        for i in 0..n.max(1) {
            let poller = Arc::new(Poller::new()?);
            let handle = Arc::new(Handle {
                queue: WakeQueue::new()?,
                inbox: Mutex::default(),
                count: AtomicUsize::new(0),
                firsts: AtomicUsize::new(0),
                poller: Arc::clone(&poller),
                cqs: Mutex::default(),
            });
            poller.add(handle.queue.fd(), INBOX)?;
            let worker = Worker {
                shared: Arc::clone(shared),
                handle: Arc::clone(&handle),
                poller,
                conns: HashMap::new(),
                timers: Timers::default(),
                more: Vec::new(),
                slow: tx.clone(),
                scratch: Box::new([0; rblk_proto::MSG_SIZE]),
            };
            // Worker i runs on the ith CPU of the daemon's affinity mask (wrapping), as SPDK's
            // reactors do: its connections' state stays in one CPU's caches.
            let cpu = (!cpus.is_empty()).then(|| cpus[i % cpus.len()]);
            // Pinned before `start` returns: nothing runs on it unpinned.
            let (pinned_tx, pinned) = mpsc::channel::<()>();
            let t = thread::Builder::new()
                .name(format!("rblk-worker-{i}"))
                .spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to(cpu);
                    }
                    let _ = pinned_tx.send(());
                    worker.run()
                })
                .map_err(|source| rblk_fabric::Error::Os { op: "spawning a worker thread", source })?;
            let _ = pinned.recv();
            workers.handles.push(handle);
            workers.threads.push(t);
        }
        Ok(workers)
    }

    /// At shutdown (the registry says so): wakes the workers, which end their connections,
    /// and waits until every connection's teardown is done.
    pub(crate) fn stop(mut self) {
        for h in &self.handles {
            h.queue.wake(INBOX);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some((tx, slow)) = self.slow.take() {
            drop(tx);
            let _ = slow.join();
        }
        // Connections that came back from the slow-work thread after their worker stopped.
        for h in &self.handles {
            for conn in h.inbox.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
                conn.end("target shutting down".into());
            }
        }
    }
}

impl Placement for Workers {
    /// The worker a new connection goes to: the one with the fewest, and for a session's first
    /// of those the one with the fewest firsts.
    fn place(&self, joins: bool) -> usize {
        let firsts = |h: &Handle| if joins { 0 } else { h.firsts.load(Ordering::Relaxed) };
        fewest(self.handles.iter().map(|h| (h.count.load(Ordering::Relaxed), firsts(h))))
    }

    /// The waker of connection `conn` on worker `worker`.
    fn waker(&self, worker: usize, conn: u64) -> Waker {
        self.handles[worker].queue.waker(conn)
    }

    /// Hands new connection `conn` to worker `worker`.
    fn hand(&self, worker: usize, conn: Box<Connection>) {
        let h = &self.handles[worker];
        h.count.fetch_add(1, Ordering::Relaxed);
        if !conn.joins() {
            h.firsts.fetch_add(1, Ordering::Relaxed);
        }
        h.deliver(conn);
    }

    /// One of worker `worker`'s shared CQs on `device` with room, or a new one (watched by the
    /// worker from now on). None on the in-memory fabric, or if one cannot be made (the QP
    /// then gets a CQ of its own, as before shared CQs).
    fn shared_cq(&self, worker: usize, pd: &rblk_fabric::Pd, receives: bool) -> Option<rblk_fabric::SharedCq> {
        let device = pd.device();
        let h = &self.handles[worker];
        let mut cqs = h.cqs.lock().unwrap_or_else(|p| p.into_inner());
        // The first window QP on a CQ gives it a shared receive queue in the window domain; a
        // QP of another PD keeps receive buffers of its own.
        let with_receives = |cq: rblk_fabric::SharedCq| {
            if receives {
                if let Err(e) = cq.share_receives(pd) {
                    warn!(worker, device, error = %Chain(&e), "cannot make a shared receive queue: QPs keep their own buffers");
                }
            }
            Some(cq)
        };
        if let Some((_, cq)) = cqs.iter().find(|(d, cq)| d == device && cq.has_room()) {
            return with_receives(cq.clone());
        }
        let per_qp = rblk_proto::SEND_COUNT as u32 + 2 + rblk_proto::RECV_COUNT as u32;
        // Its completion vector: the device's `worker`th (wrapping), so the workers' CQ
        // interrupts spread over the device's vectors as the workers over the CPUs.
        let cq = match rblk_fabric::SharedCq::new(pd, CQ_ROOM, per_qp, worker as u32) {
            Ok(cq) => cq?,
            Err(e) => {
                warn!(worker, device, error = %Chain(&e), "cannot make a shared completion queue: the QP gets its own");
                return None;
            }
        };
        let tag = CQ_TAGS - cqs.len() as u64;
        if cqs.len() as u64 >= MAX_CQS {
            return None;
        }
        if let Err(e) = h.poller.add(cq.fd(), tag) {
            warn!(worker, device, error = %Chain(&e), "cannot watch a shared completion queue: the QP gets its own");
            return None;
        }
        // Its receive queue's low-water event wakes the worker, which routes what holds its
        // buffers to their connections (they read them and post them again).
        cq.set_waker(h.queue.waker(INBOX));
        cqs.push((device.to_owned(), cq.clone()));
        with_receives(cq)
    }
}

/// The CPUs this process may run on (its affinity mask, as systemd's `CPUAffinity=` or
/// `taskset` set it), in order; empty if it cannot be read.
fn allowed_cpus() -> Vec<usize> {
    use nix::sched::{sched_getaffinity, CpuSet};
    let Ok(set) = sched_getaffinity(nix::unistd::Pid::from_raw(0)) else { return Vec::new() };
    (0..CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false)).collect()
}

/// Pins the calling thread to `cpu` (a warning if it cannot: it then runs wherever it may).
fn pin_to(cpu: usize) {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut set = CpuSet::new();
    let pinned = set.set(cpu).and_then(|()| sched_setaffinity(nix::unistd::Pid::from_raw(0), &set));
    if let Err(e) = pinned {
        warn!(cpu, error = %e, "cannot pin a worker to its CPU: it runs on any CPU of the mask");
    }
}

/// One round's turns, each connection once (with whether a waker fired for it), in order:
/// woken, then readable, then deadlines, then those with completions left; the [`INBOX`] tag
/// is no connection's.
fn round(woken: &[u64], ready: &[u64], due: &[u64], more: &[u64]) -> Vec<(u64, bool)> {
    let mut round: Vec<(u64, bool)> = Vec::with_capacity(woken.len() + ready.len() + due.len() + more.len());
    let mut index: HashMap<u64, usize> = HashMap::with_capacity(round.capacity());
    let woken_ids = woken.iter().map(|&id| (id, true));
    let others = ready.iter().chain(due).chain(more).map(|&id| (id, false));
    for (id, woke) in woken_ids.chain(others).filter(|&(id, _)| id != INBOX) {
        match index.entry(id) {
            std::collections::hash_map::Entry::Occupied(e) => round[*e.get()].1 |= woke,
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(round.len());
                round.push((id, woke));
            }
        }
    }
    round
}

/// One worker thread's state.
struct Worker {
    shared: Arc<Shared>,
    handle: Arc<Handle>,
    poller: Arc<Poller>,
    conns: HashMap<u64, Box<Connection>>,
    timers: Timers,
    /// Connections whose budget ran out: they run again in the next round, without waiting.
    more: Vec<u64>,
    slow: mpsc::Sender<Job>,
    /// Where each turn's messages are copied and handled from (see [`Connection::turn`]).
    scratch: Box<[u8; rblk_proto::MSG_SIZE]>,
}

impl Worker {
    fn run(mut self) {
        let mut ready = Vec::new();
        let mut woken = Vec::new();
        let mut due = Vec::new();
        while !self.shared.is_shutting_down() {
            let deadline = if self.more.is_empty() {
                self.timers.next().map(|at| coarsen(at, timer_epoch(), TIMER_GRAIN))
            } else {
                Some(Instant::now())
            };
            ready.clear();
            if let Err(e) = self.poller.wait(&mut ready, deadline) {
                warn!(error = %Chain(&e), "worker wait failed");
                thread::sleep(BACKOFF);
            }
            self.collect_cqs(&mut ready);
            woken.clear();
            if ready.contains(&INBOX) {
                self.handle.queue.take(&mut woken);
            }
            if woken.contains(&INBOX) {
                self.take_inbox(&mut woken);
            }
            due.clear();
            self.timers.due(Instant::now(), &mut due);
            // One turn each per round: woken first (they carry news), then completions, then
            // deadlines, then those with completions left from the last round.
            let more = std::mem::take(&mut self.more);
            for (id, woken) in round(&woken, &ready, &due, &more) {
                self.turn(id, woken);
            }
        }
        for id in self.conns.keys().copied().collect::<Vec<_>>() {
            if let Some(conn) = self.remove(id) {
                self.end(conn, "target shutting down".into());
            }
        }
    }

    /// Replaces the shared CQs' tags in `ready` by the connections they have completions for:
    /// a CQ that raised its event is collected (the event taken, the CQ armed again), every
    /// other one polled, for the completions that raised none (a CQ whose QPs' peers all
    /// solicit is armed for their requests only: see [`rblk_fabric::Endpoint::peer_solicits`]),
    /// so a wake-up for one request, a deadline or a waker takes every keepalive that arrived
    /// meanwhile.
    fn collect_cqs(&self, ready: &mut Vec<u64>) {
        let cqs = self.handle.cqs.lock().unwrap_or_else(|p| p.into_inner());
        if cqs.is_empty() {
            return;
        }
        // `collect` and `poll` append connection ids, never CQ tags: a tag in `ready` is one
        // this wake brought.
        for (i, (device, cq)) in cqs.iter().enumerate() {
            let got = if ready.contains(&(CQ_TAGS - i as u64)) { cq.collect(ready) } else { cq.poll(ready) };
            if let Err(e) = got {
                warn!(device, error = %Chain(&e), "shared completion queue failed");
            }
        }
        ready.retain(|&t| !is_cq_tag(t));
    }

    /// Takes the connections handed over (new, or back from the slow-work thread): they are
    /// watched from now on, and get a turn this round (as woken: news may wait for them).
    fn take_inbox(&mut self, woken: &mut Vec<u64>) {
        let conns: Vec<Box<Connection>> =
            std::mem::take(&mut *self.handle.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        for conn in conns {
            let id = conn.id();
            if conn.shares_cq() {
                // Its completions come through its shared CQ, which is watched already.
            } else if let Err(e) = self.poller.add(conn.event_fd(), id) {
                warn!(conn = id, error = %Chain(&e), "cannot watch the connection");
                self.end(conn, "cannot watch its completions".into());
                continue;
            }
            self.conns.insert(id, conn);
            if !woken.contains(&id) {
                woken.push(id);
            }
        }
    }

    fn turn(&mut self, id: u64, woken: bool) {
        // Parked (off the worker) or gone: nothing to do here.
        let Some(conn) = self.conns.get_mut(&id) else { return };
        // The connection's span, entered for its turn: moved out and back (a clone and its
        // close went through the tracing registry at every turn, 4% of an idle target's samples).
        let span = std::mem::replace(&mut conn.span, tracing::Span::none());
        let turn = {
            let _enter = span.enter();
            conn.turn(woken, &mut self.scratch)
        };
        conn.span = span;
        match turn {
            Turn::Wait { until, more } => {
                self.timers.set(id, until);
                if more {
                    self.more.push(id);
                }
            }
            Turn::Park => {
                let Some(mut conn) = self.remove(id) else { return };
                let handle = Arc::clone(&self.handle);
                self.submit(move || {
                    conn.run_parked();
                    handle.deliver(conn);
                });
            }
            Turn::End(reason) => {
                if let Some(conn) = self.remove(id) {
                    self.end(conn, reason);
                }
            }
        }
    }

    /// Takes connection `id` off this worker's watch (it is parked, or ends).
    fn remove(&mut self, id: u64) -> Option<Box<Connection>> {
        let conn = self.conns.remove(&id)?;
        self.timers.forget(id);
        self.more.retain(|&m| m != id);
        if conn.shares_cq() {
            return Some(conn);
        }
        if let Err(e) = self.poller.remove(conn.event_fd()) {
            warn!(conn = id, error = %Chain(&e), "cannot stop watching the connection");
        }
        Some(conn)
    }

    /// Ends `conn`: its disconnect goes out now, the rest of its teardown (destroying the QP,
    /// perhaps deregistering its session's volume) on the slow-work thread. The peer learns at
    /// once that it must reconnect, not after the teardowns queued before this one (at a
    /// shutdown or a takeover, every connection's).
    fn end(&mut self, mut conn: Box<Connection>, reason: crate::connection::Reason) {
        self.handle.count.fetch_sub(1, Ordering::Relaxed);
        if !conn.joins() {
            self.handle.firsts.fetch_sub(1, Ordering::Relaxed);
        }
        conn.disconnect();
        self.submit(move || conn.end(reason));
    }

    fn submit(&self, job: impl FnOnce() + Send + 'static) {
        if let Err(mpsc::SendError(job)) = self.slow.send(Box::new(job)) {
            // Only at shutdown, once the slow-work thread stopped: here, then.
            job();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a wake-up before a deadline (a connection's turn would find nothing due and ask
    /// again: a busy loop), and deadlines of one grain that do not share a wake-up.
    #[test]
    fn deadlines_are_rounded_up_to_the_grain() {
        let ms = Duration::from_millis;
        let t0 = Instant::now();
        let grain = ms(50);
        assert_eq!(coarsen(t0, t0, grain), t0, "on the grid: unchanged");
        assert_eq!(coarsen(t0 + ms(1), t0, grain), t0 + ms(50));
        assert_eq!(coarsen(t0 + ms(49), t0, grain), t0 + ms(50), "one grain, one wake-up");
        assert_eq!(coarsen(t0 + ms(50), t0, grain), t0 + ms(50));
        assert_eq!(coarsen(t0 + ms(2051), t0, grain), t0 + ms(2100));
        for n in 0..1000u64 {
            let at = t0 + Duration::from_micros(n * 997);
            let woken = coarsen(at, t0, grain);
            assert!(woken >= at && woken - at < grain, "{n}: woken {woken:?} for {at:?}");
        }
        assert_eq!(coarsen(t0, t0 + ms(10), grain), t0 + ms(10), "before the epoch: the epoch");
    }

    /// Catches a round that gives a connection two turns (before, a linear search per entry
    /// kept them apart: quadratic in the connections ready at once), loses one, or puts the
    /// inbox among them.
    #[test]
    fn a_round_gives_each_connection_one_turn() {
        let r = round(&[3, INBOX, 5, 3], &[INBOX, 5, 7, 3], &[9, 7], &[7, 11]);
        assert_eq!(r, [(3, true), (5, true), (7, false), (9, false), (11, false)]);
        assert!(round(&[], &[], &[], &[]).is_empty());
    }

    /// Catches a heap that fires a deadline a connection no longer has, or loses the one it has.
    #[test]
    fn timers_fire_each_connection_at_its_latest_deadline_only() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut t = Timers::default();
        t.set(1, t0 + 5 * s);
        t.set(2, t0 + 3 * s);
        t.set(1, t0 + 2 * s); // moved earlier: the 5 s entry is stale
        t.set(3, t0 + 4 * s);
        t.set(3, t0 + 9 * s); // moved later: the 4 s entry is stale
        t.set(4, t0 + s);
        t.forget(4);
        assert_eq!(t.next(), Some(t0 + 2 * s));
        let mut due = Vec::new();
        t.due(t0 + 4 * s, &mut due);
        assert_eq!(due, [1, 2], "in deadline order, the forgotten and moved ones skipped");
        due.clear();
        t.due(t0 + 6 * s, &mut due);
        assert!(due.is_empty(), "1's old 5 s deadline is stale: {due:?}");
        assert_eq!(t.next(), Some(t0 + 9 * s));
        t.due(t0 + 9 * s, &mut due);
        assert_eq!(due, [3]);
        assert_eq!(t.next(), None);
    }

    /// Catches stale entries piling up without bound when a deadline moves at every message.
    #[test]
    fn timers_stay_small_when_deadlines_keep_moving() {
        let t0 = Instant::now();
        let mut t = Timers::default();
        for i in 0..10_000u32 {
            t.set(1, t0 + Duration::from_millis(u64::from(i)));
            t.set(2, t0 + Duration::from_secs(60));
        }
        assert!(t.heap.len() <= 2 * t.live.len() + 65, "{} entries for 2 connections", t.heap.len());
        assert_eq!(t.next(), Some(t0 + Duration::from_millis(9_999)));
    }

    /// Catches placement that ignores the counts: as connections come (and some go), the
    /// workers' counts stay within 1 of each other, whatever the order they came in.
    #[test]
    fn placement_keeps_counts_within_one() {
        let mut counts = [0usize; 4];
        let of = |counts: &[usize; 4]| counts.map(|n| (n, 0));
        for _ in 0..103 {
            let i = fewest(of(&counts));
            counts[i] += 1;
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{counts:?}");
        }
        // Connections of worker 2 go; the next ones fill it up before any other gets one.
        counts[2] -= 10;
        for _ in 0..10 {
            assert_eq!(fewest(of(&counts)), 2);
            counts[2] += 1;
        }
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(hi - lo <= 1, "{counts:?}");
        assert_eq!(fewest([(0usize, 0usize); 0]), 0, "no workers: the first");
    }

    /// Catches sessions' firsts piling on one worker: sessions of two QPs (a first, then its
    /// JOIN) on two workers put every first on worker 0 when only connections count (measured:
    /// at 1,000 sessions x 2, worker 0 took about 97% of the target's idle samples). Firsts and
    /// connections both stay within 1 across workers.
    #[test]
    fn sessions_firsts_spread_over_the_workers_too() {
        for workers in [2usize, 3, 4] {
            let (mut conns, mut firsts) = (vec![0usize; workers], vec![0usize; workers]);
            for session in 0..100 {
                for joins in [false, true] {
                    let i = fewest(conns.iter().zip(&firsts).map(|(&n, &f)| (n, if joins { 0 } else { f })));
                    conns[i] += 1;
                    firsts[i] += usize::from(!joins);
                }
                let spread = |v: &[usize]| v.iter().max().unwrap() - v.iter().min().unwrap();
                assert!(spread(&conns) <= 1, "{workers} workers, session {session}: connections {conns:?}");
                assert!(spread(&firsts) <= 1, "{workers} workers, session {session}: firsts {firsts:?}");
            }
        }
    }
}
