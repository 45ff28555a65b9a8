//! A session's link to its target, shared by its control queue pair and every [`Queue`]: who
//! the session is now (id, token, rkey), whether it is up, and the one reconnect loop.
//!
//! Any queue pair that sees the session fail (an error completion, keepalives stopping, a
//! failed control exchange) reports it with [`Link::lost`]. From then on every user of the link
//! waits in [`Link::wait_change`] (or polls [`Link::status`]) while one of them at a time runs a
//! reconnect attempt every [`Reconnect::delay`](crate::Reconnect::delay): a fresh connection, HELLO and AUTH, then OPEN
//! naming the old session, which the target tears down before it answers. A successful attempt
//! bumps the generation; queues then join the new session and post again what was in flight.
//!
//! The volume instance's identity in OPENED decides what a reconnect may continue: the same
//! instance continues; a new instance of a RAM volume ends the session ("contents lost"); a new
//! instance of a durable volume lost the writes not yet flushed, so the next FLUSH fails
//! ([`Link::take_lost_writes`]) unless I/O has already failed since the loss.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rblk_fabric::{Chain, Pd};
use rblk_proto::{ErrorCode, OpenMode, Opened, Resume, FEATURE_RECONNECT};

use crate::conn::{Conn, Dest};
use crate::io_state::Shared;
use crate::{Error, Options, Result};

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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The session as it is now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Current {
    /// Bumped by every successful reconnect.
    pub gen: u64,
    pub opened: Opened,
}

/// What a user of the link should do.
#[derive(Debug)]
pub(crate) enum Status {
    /// The session of this generation is up.
    Up,
    /// The session reconnected: join the new one.
    Newer(Current),
    /// Lost; reconnecting. I/O waits.
    Waiting,
    /// Lost for longer than fast_io_fail_tmo: I/O fails, reconnecting goes on.
    FastFail(Error),
    /// Gone for good: every I/O fails.
    Failed(Error),
}

#[derive(Debug)]
enum Health {
    Up,
    Down(Outage),
    Failed(String),
}

#[derive(Debug)]
struct Outage {
    since: Instant,
    reason: String,
    next_attempt: Instant,
    attempts: u32,
    /// I/O failed during this outage (fast_io_fail_tmo): a write loss is already reported.
    io_failed: bool,
}

#[derive(Debug)]
struct Inner {
    gen: u64,
    opened: Opened,
    /// The control connection's address, in `Link::dests`.
    at: usize,
    health: Health,
    /// Unflushed bytes a new durable instance lost (None inside: too many ranges to count):
    /// the next FLUSH fails.
    lost_writes: Option<Option<u64>>,
    /// Closing: waiting for a reconnect is pointless.
    closing: bool,
}

/// What a new session of a volume may continue from an old one: the rule a reconnect follows,
/// and a process that takes a device over from one that died ([`crate::Session::take_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Continuity {
    /// The same instance of the volume's contents: everything continues.
    Same,
    /// A new instance of a durable volume (the target crashed, or its store changed): every
    /// write not yet flushed is gone, so the next FLUSH fails.
    WritesLost,
    /// Nothing may continue (a RAM volume's contents are gone, the volume changed, or its
    /// identity cannot be checked): every I/O fails, with this reason.
    Refused(String),
}

/// Compares the volume `new` opened with the one `old` had; `volatile`: the volume lives in RAM.
/// A volume that grew meanwhile continues (with [`rblk_proto::FEATURE_SEGMENTS`] the target
/// tells its size as it is now; without, it keeps the session's).
pub(crate) fn continuity(old: &Opened, new: &Opened, volatile: bool) -> Continuity {
    if new.size < old.size || new.block_size != old.block_size || new.max_io < old.max_io {
        Continuity::Refused(format!(
            "the volume changed while the session was lost ({} bytes in blocks of {} became {} in blocks of {})",
            old.size, old.block_size, new.size, new.block_size
        ))
    } else if new.instance.is_none() || old.instance.is_none() {
        Continuity::Refused(
            "the target does not report the volume's identity: cannot tell it is the same volume".into(),
        )
    } else if new.instance != old.instance && volatile {
        Continuity::Refused("volume contents lost: the target restarted and the volume is volatile".into())
    } else if new.instance != old.instance {
        Continuity::WritesLost
    } else {
        Continuity::Same
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(crate) struct Link {
    opts: Options,
    dests: Vec<Dest>,
    name: String,
    mode: OpenMode,
    /// Every QP, buffer pool and channel of the session lives in this PD, across reconnects.
    pd: Pd,
    features: u64,
    volatile: bool,
    /// See [`Link::reconnects`]; fixed at the start (queues ask at every commit).
    reconnects: bool,
    shared: Shared,
    state: Mutex<Inner>,
    changed: Condvar,
    /// The session's first queue pair (FLUSH, STATS, CLOSE, keepalives); replaced by a reconnect.
    control: Mutex<Conn>,
    /// Held by the one thread running a reconnect attempt.
    attempting: Mutex<()>,
    gen: AtomicU64,
    /// Mirrors `Health::Up` (queues look at every commit).
    up: AtomicBool,
    next_queue: AtomicUsize,
    /// When the target was last heard on any of the session's connections, in ns since `epoch`.
    heard_ns: AtomicU64,
    epoch: Instant,
    /// The volume's size now: OPENED's, grown by RESIZED or a reconnect ([`Link::grew`]).
    size: AtomicU64,
    /// Called with the new size when the volume grew ([`Link::on_resize`]).
    hooks: Mutex<Hooks>,
}

/// A callback told the volume's new size in bytes ([`Link::on_resize`]).
pub(crate) type ResizeHook = std::sync::Arc<dyn Fn(u64) + Send + Sync>;

/// The resize callbacks of a link.
#[derive(Default)]
struct Hooks(Vec<ResizeHook>);

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} resize hooks", self.0.len())
    }
}

/// Target refusals that a retry will not change: the session ends at once.
fn is_final(e: &Error) -> bool {
    match e {
        Error::Auth { .. } => true,
        Error::Target { code, .. } => matches!(
            code,
            ErrorCode::NoSuchVolume
                | ErrorCode::VolumeFailed
                | ErrorCode::AuthFailed
                | ErrorCode::AuthRequired
                | ErrorCode::BadMode
                | ErrorCode::ReadOnly
                | ErrorCode::VersionMismatch
        ),
        _ => false,
    }
}

/// The pause before the next attempt after a busy reject that asked for `after`: `after`
/// within +-5% (`draw`, uniform), at least 1 ms.
pub(crate) fn busy_pause(after: Duration, draw: u64) -> Duration {
    let spread = after.as_nanos() / 10;
    let offset = (spread * u128::from(draw)) >> 64;
    let nanos = after.as_nanos() - spread / 2 + offset;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX)).max(Duration::from_millis(1))
}

/// The longest one step of a reconnect attempt (resolve, connect, HELLO, AUTH) may take.
const ATTEMPT_STEP: Duration = Duration::from_secs(3);

fn secs(d: Duration) -> String {
    format!("{} s", d.as_secs_f64().round())
}

impl Link {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        control: Conn,
        dests: Vec<Dest>,
        at: usize,
        opts: Options,
        features: u64,
        mode: OpenMode,
        name: String,
        opened: Opened,
        shared: Shared,
    ) -> Link {
        let pd = control.ep.pd();
        let volatile = opened.flags.contains(rblk_proto::VolumeFlags::VOLATILE);
        let reconnects = features & FEATURE_RECONNECT != 0
            && opened.instance.is_some()
            && opts.reconnect.ctrl_loss_tmo != Some(Duration::ZERO);
        Link {
            opts,
            dests,
            name,
            mode,
            pd,
            features,
            volatile,
            reconnects,
            shared,
            state: Mutex::new(Inner { gen: 0, opened, at, health: Health::Up, lost_writes: None, closing: false }),
            changed: Condvar::new(),
            control: Mutex::new(control),
            attempting: Mutex::new(()),
            gen: AtomicU64::new(0),
            up: AtomicBool::new(true),
            next_queue: AtomicUsize::new(at + 1),
            heard_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            size: AtomicU64::new(opened.size),
            hooks: Mutex::default(),
        }
    }

    /// The volume's size now (cheap: checks read it for every access past the size they knew).
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// Calls `hook` with the volume's new size whenever it grows, on the thread that learns it
    /// (one that reaps a queue, or runs a control exchange or a reconnect): it must not block.
    pub(crate) fn on_resize(&self, hook: ResizeHook) {
        lock(&self.hooks).0.push(hook);
    }

    /// The target says the volume has `size` bytes now (a RESIZED, or a reconnect's OPENED):
    /// a larger size is taken, and the hooks are told; a smaller or equal one changes nothing.
    pub(crate) fn grew(&self, size: u64) {
        let was = self.size.fetch_max(size, Ordering::AcqRel);
        if size <= was {
            return;
        }
        tracing::info!(volume = self.name, "the volume grew from {} to {} bytes", was, size);
        let hooks: Vec<ResizeHook> = lock(&self.hooks).0.clone();
        for hook in hooks {
            hook(size);
        }
    }

    /// Sets the session's health, mirrored lock-free for the metrics ([`LinkState`]).
    fn set_health(&self, st: &mut Inner, health: Health) {
        self.shared.counters.set_link(match health {
            Health::Up => LinkState::Connected,
            Health::Down(_) => LinkState::Reconnecting,
            Health::Failed(_) => LinkState::Failed,
        });
        st.health = health;
    }

    /// Whether a lost session is reconnected at all: the target can (FEATURE_RECONNECT and a
    /// volume identity to check) and ctrl_loss_tmo is not 0.
    pub(crate) fn reconnects(&self) -> bool {
        self.reconnects
    }

    /// Successful reconnects so far.
    pub(crate) fn reconnect_count(&self) -> u64 {
        self.shared.counters.reconnects.load(Ordering::Relaxed)
    }

    pub(crate) fn pd(&self) -> &Pd {
        &self.pd
    }

    pub(crate) fn opts(&self) -> &Options {
        &self.opts
    }

    pub(crate) fn features(&self) -> u64 {
        self.features
    }

    /// The current generation (cheap: queues compare it at every reap).
    pub(crate) fn gen(&self) -> u64 {
        self.gen.load(Ordering::Acquire)
    }

    pub(crate) fn current(&self) -> Current {
        let st = lock(&self.state);
        Current { gen: st.gen, opened: st.opened }
    }

    /// The control connection's address.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.dests[lock(&self.state).at].addr
    }

    /// The address a new queue should join through: the session's queues are spread over
    /// every address of the URI, starting after the control connection's.
    pub(crate) fn dest_for_queue(&self, attempt: usize) -> &Dest {
        let i = self.next_queue.load(Ordering::Relaxed) + attempt;
        &self.dests[i % self.dests.len()]
    }

    /// A connection of the session heard from the target at `at`.
    pub(crate) fn note_heard(&self, at: Instant) {
        let ns = u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        self.heard_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// When the target was last heard on any connection of the session (as far as their owners
    /// told: [`note_heard`](Self::note_heard)).
    pub(crate) fn heard(&self) -> Instant {
        self.epoch + Duration::from_nanos(self.heard_ns.load(Ordering::Relaxed))
    }

    /// Moves the round robin on (a queue joined).
    pub(crate) fn queue_joined(&self) {
        self.next_queue.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn dest_count(&self) -> usize {
        self.dests.len()
    }

    /// A queue pair of generation `gen` saw the session fail.
    pub(crate) fn lost(&self, gen: u64, reason: &str) {
        let reconnects = self.reconnects();
        let mut st = lock(&self.state);
        if st.gen != gen || !matches!(st.health, Health::Up) {
            return;
        }
        let now = Instant::now();
        if reconnects {
            tracing::warn!(
                volume = self.name,
                addr = %self.dests[st.at].addr,
                "the session to the target was lost ({reason}); reconnecting about every {}",
                secs(self.opts.reconnect.delay)
            );
            self.set_health(
                &mut st,
                Health::Down(Outage {
                    since: now,
                    reason: reason.to_owned(),
                    next_attempt: now,
                    attempts: 0,
                    io_failed: false,
                }),
            );
        } else {
            self.set_health(&mut st, Health::Failed(format!("the session to the target was lost: {reason}")));
        }
        self.up.store(false, Ordering::Release);
        drop(st);
        self.changed.notify_all();
    }

    /// What a user of generation `gen` should do now (expires the timeouts).
    pub(crate) fn status(&self, gen: u64) -> Status {
        let mut st = lock(&self.state);
        let addr = self.dests[st.at].addr;
        let policy = self.opts.reconnect;
        if let Health::Down(o) = &st.health {
            let down = o.since.elapsed();
            if policy.ctrl_loss_tmo.is_some_and(|t| down >= t) {
                let reason =
                    format!("gave up reconnecting after {} (ctrl_loss_tmo); last error: {}", secs(down), o.reason);
                tracing::error!(volume = self.name, %addr, "{reason}");
                self.set_health(&mut st, Health::Failed(reason));
                self.changed.notify_all();
            } else if st.closing {
                let reason = format!("the session is closing and the target is unreachable ({})", o.reason);
                return Status::Failed(Error::ConnectionLost { addr, reason });
            } else if let Some(t) = policy.fast_io_fail_tmo.filter(|&t| down >= t) {
                let reason = format!(
                    "no connection for {} (fast_io_fail_tmo {}): I/O fails while reconnecting goes on; last \
                     error: {}",
                    secs(down),
                    secs(t),
                    o.reason
                );
                return Status::FastFail(Error::ConnectionLost { addr, reason });
            } else {
                return Status::Waiting;
            }
        }
        match &st.health {
            Health::Failed(reason) => Status::Failed(Error::ConnectionLost { addr, reason: reason.clone() }),
            _ if st.gen != gen => Status::Newer(Current { gen: st.gen, opened: st.opened }),
            _ => Status::Up,
        }
    }

    /// I/O failed during the outage (fast_io_fail_tmo): a loss of unflushed writes found at
    /// the reconnect counts as reported.
    pub(crate) fn note_io_failed(&self) {
        if let Health::Down(o) = &mut lock(&self.state).health {
            o.io_failed = true;
        }
    }

    /// Closing: from now on an outage fails waiting at once instead of waiting to reconnect.
    pub(crate) fn begin_close(&self) {
        lock(&self.state).closing = true;
        self.changed.notify_all();
    }

    /// Whether the link is up (for CLOSE: nothing to say goodbye to otherwise).
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Takes the write loss a reconnect found (a new durable instance): the FLUSH that sees it
    /// fails, the next ones do not.
    pub(crate) fn take_lost_writes(&self) -> Option<Option<u64>> {
        lock(&self.state).lost_writes.take()
    }

    /// A process taking a device over from one that died found `verdict` (see
    /// [`crate::Session::take_over`]): a new durable instance makes the next FLUSH fail (how
    /// much was lost is unknown), a refusal fails every I/O.
    pub(crate) fn succeed(&self, verdict: &Continuity) {
        let mut st = lock(&self.state);
        match verdict {
            Continuity::Same => {}
            Continuity::WritesLost => st.lost_writes = Some(None),
            Continuity::Refused(reason) => {
                tracing::error!(volume = self.name, "{reason}");
                self.set_health(&mut st, Health::Failed(reason.clone()));
            }
        }
        drop(st);
        self.changed.notify_all();
    }

    /// Runs a reconnect attempt if one is due and nobody else runs one. Blocks for as long as
    /// the attempt takes (each exchange has `Options::timeout`).
    pub(crate) fn drive(&self) {
        let due = match &lock(&self.state).health {
            Health::Down(o) => Instant::now() >= o.next_attempt,
            _ => false,
        };
        if !due {
            return;
        }
        let Ok(_attempt) = self.attempting.try_lock() else { return };
        self.attempt();
    }

    /// Waits until the status for generation `gen` is not [`Status::Waiting`], or `until`;
    /// runs the reconnect attempts that fall due meanwhile.
    pub(crate) fn wait_change(&self, gen: u64, until: Instant) -> Status {
        loop {
            self.drive();
            let status = self.status(gen);
            let now = Instant::now();
            if !matches!(status, Status::Waiting) || now >= until {
                return status;
            }
            let st = lock(&self.state);
            let next = match &st.health {
                Health::Down(o) => o.next_attempt.max(now + Duration::from_millis(10)),
                _ => continue,
            };
            // Wake for the next attempt, for fast_io_fail_tmo and ctrl_loss_tmo, or at `until`.
            let mut wake = next.min(until);
            if let Health::Down(o) = &st.health {
                let p = self.opts.reconnect;
                for t in [p.fast_io_fail_tmo, p.ctrl_loss_tmo].into_iter().flatten() {
                    let at = o.since + t;
                    if at > now {
                        wake = wake.min(at);
                    }
                }
            }
            let _ = self.changed.wait_timeout(st, wake.saturating_duration_since(now));
        }
    }

    /// Runs `f` on the control connection, waiting for (and driving) a reconnect when the
    /// session is down, and running `f` again on the new connection if the session was lost
    /// under it. `f`'s own errors (a target's ERROR) come back as they are.
    pub(crate) fn control<T>(&self, mut f: impl FnMut(&mut Conn) -> Result<T>) -> Result<T> {
        loop {
            let gen = self.gen();
            match self.wait_change(gen, Instant::now() + Duration::from_secs(3600)) {
                Status::Up | Status::Newer(_) => {}
                Status::Waiting => continue,
                Status::FastFail(e) => {
                    self.note_io_failed();
                    return Err(e);
                }
                Status::Failed(e) => return Err(e),
            }
            let mut conn = lock(&self.control);
            if self.gen() != gen {
                continue;
            }
            let result = f(&mut conn);
            self.note_heard(conn.heard());
            if let Some((size, _)) = conn.take_resized() {
                self.grew(size);
            }
            if result.is_err() && conn.is_broken() && self.reconnects() {
                let reason = result.as_ref().err().map(ToString::to_string).unwrap_or_default();
                drop(conn);
                self.lost(gen, &reason);
                continue;
            }
            return result;
        }
    }

    /// Runs `f` on the control connection without waiting for a reconnect (CLOSE, keepalives).
    pub(crate) fn control_now<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let gen = self.gen();
        let conn = lock(&self.control);
        self.run_control(gen, conn, f)
    }

    /// [`control_now`](Self::control_now) if nobody else uses the control connection; `None`
    /// (and nothing done) if someone does.
    pub(crate) fn try_control_now<T>(&self, f: impl FnOnce(&mut Conn) -> Result<T>) -> Option<Result<T>> {
        let gen = self.gen();
        let conn = match self.control.try_lock() {
            Ok(conn) => conn,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(self.run_control(gen, conn, f))
    }

    fn run_control<T>(
        &self,
        gen: u64,
        mut conn: MutexGuard<'_, Conn>,
        f: impl FnOnce(&mut Conn) -> Result<T>,
    ) -> Result<T> {
        let result = f(&mut conn);
        self.note_heard(conn.heard());
        if let Some((size, _)) = conn.take_resized() {
            self.grew(size);
        }
        if result.is_err() && conn.is_broken() {
            let reason = result.as_ref().err().map(ToString::to_string).unwrap_or_default();
            drop(conn);
            // Reported first, then the queue pair cleaned up (a no-op if `f` did, or if a
            // reconnect replaced the connection meanwhile). Never waited for: a thread that holds
            // the connection now (a reconnect replacing it) leaves it to be dropped whole.
            self.lost(gen, &reason);
            if let Ok(mut conn) = self.control.try_lock() {
                conn.finish_break();
            }
        }
        result
    }

    /// Arms the control connection's completion channel and returns its descriptor, readable
    /// once a completion arrived (a message of the target's), unless another thread uses the
    /// connection now or the session is down (None).
    pub(crate) fn arm_control(&self) -> Option<std::os::fd::RawFd> {
        if !self.is_up() {
            return None;
        }
        let mut conn = self.control.try_lock().ok()?;
        conn.ep.arm_events().ok()?;
        Some(conn.ep.event_fd())
    }

    /// The control connection's CM event channel ([`Conn::cm_fd`]), unless another thread
    /// uses the connection now (its exchange's wait watches the channel itself).
    pub(crate) fn control_cm_fd(&self) -> Option<std::os::fd::RawFd> {
        self.control.try_lock().ok().and_then(|c| c.cm_fd())
    }

    /// One reconnect attempt over every address in turn, starting with the last one that
    /// worked. The caller holds `attempting`.
    fn attempt(&self) {
        let (old, start) = {
            let st = lock(&self.state);
            (st.opened, st.at)
        };
        let started = Instant::now();
        let resume = Resume { session_id: old.session_id, token: old.token };
        let mut last: Option<Error> = None;
        // The soonest a target that rejected us busy asked us to come back.
        let mut busy: Option<Duration> = None;
        for k in 0..self.dests.len() {
            let at = (start + k) % self.dests.len();
            let dest = &self.dests[at];
            match self.reopen(dest, resume) {
                Ok((conn, opened)) => {
                    self.reopened(conn, opened, at, old, started);
                    return;
                }
                Err(e) if is_final(&e) => {
                    let reason = format!("the target refused the reconnect: {}", Chain(&e));
                    tracing::error!(volume = self.name, addr = %dest.addr, "{reason}");
                    self.set_health(&mut lock(&self.state), Health::Failed(reason));
                    self.changed.notify_all();
                    return;
                }
                Err(e) => {
                    tracing::debug!(volume = self.name, addr = %dest.addr, error = %Chain(&e), "reconnect attempt failed");
                    if let Some(after) = e.busy_for() {
                        busy = Some(busy.map_or(after, |b| b.min(after)));
                    }
                    last = Some(e);
                }
            }
        }
        let mut st = lock(&self.state);
        if let Health::Down(o) = &mut st.health {
            o.attempts += 1;
            // A target busy admitting others (a reconnect storm) said when it expects to have
            // room for us: its slots are spread already, so only a little jitter here. Else
            // the reconnect delay.
            let pause = match busy {
                Some(after) => busy_pause(after, u64::from_le_bytes(rblk_fabric::random())),
                None => self.opts.reconnect.next_pause(),
            };
            o.next_attempt = Instant::now() + pause;
            if let Some(e) = last {
                o.reason = Chain(&e).to_string();
            }
            if let Some(after) = busy {
                o.reason =
                    format!("the target is busy admitting other connections and asked for {} ms", after.as_millis());
            }
            tracing::warn!(
                volume = self.name,
                attempt = o.attempts,
                down = %secs(o.since.elapsed()),
                "reconnecting failed ({}); next attempt in {}",
                o.reason,
                secs(pause)
            );
        }
        drop(st);
        self.changed.notify_all();
    }

    /// A new first queue pair to `dest`: HELLO, AUTH, OPEN naming the old session. Each step
    /// has at most [`ATTEMPT_STEP`]: an address that went away must not hold the attempt (and
    /// the other addresses) for a whole control timeout.
    fn reopen(&self, dest: &Dest, resume: Resume) -> Result<(Conn, Opened)> {
        let opts = Options { timeout: self.opts.timeout.min(ATTEMPT_STEP), ..self.opts.clone() };
        let (mut conn, features, _) = crate::session::handshake(dest, Some(&self.pd), &opts)?;
        if features & FEATURE_RECONNECT == 0 {
            return Err(Error::Auth {
                addr: dest.addr,
                reason: "the target no longer supports reconnecting (FEATURE_RECONNECT)".into(),
            });
        }
        // OPEN may wait for the target to tear the old session down: the whole control timeout.
        let opened = crate::session::open_on(&mut conn, self.mode, &self.name, Some(resume), self.opts.timeout)?;
        Ok((conn, opened))
    }

    /// Checks the new session against the old one and, if it may continue, makes it current.
    fn reopened(&self, conn: Conn, opened: Opened, at: usize, old: Opened, started: Instant) {
        let addr = conn.addr;
        let (io_failed, down) = match &lock(&self.state).health {
            Health::Down(o) => (o.io_failed, o.since.elapsed()),
            _ => return,
        };
        let verdict = continuity(&old, &opened, self.volatile);
        if let Continuity::Refused(reason) = verdict {
            tracing::error!(volume = self.name, %addr, "{reason}");
            self.set_health(&mut lock(&self.state), Health::Failed(reason));
            self.changed.notify_all();
            return;
        }
        let mut lost_writes = None;
        if verdict == Continuity::WritesLost {
            // A durable volume that crashed (or whose store was replaced): every write not yet
            // flushed is gone.
            let lost = self.shared.lose_all();
            let amount = lost.map_or("an unknown number of".to_owned(), |b| b.to_string());
            if lost == Some(0) {
                tracing::warn!(
                    volume = self.name,
                    %addr,
                    "the volume is a new instance (the target crashed or its store changed); nothing unflushed was lost"
                );
            } else if io_failed {
                tracing::error!(
                    volume = self.name,
                    %addr,
                    "the target lost {amount} bytes of writes that were not flushed (it crashed); already reported \
                     by failed I/O"
                );
            } else {
                tracing::error!(
                    volume = self.name,
                    %addr,
                    "the target lost {amount} bytes of writes that were not flushed (it crashed): the next flush fails"
                );
                lost_writes = Some(lost);
            }
        }
        // The new control connection first: once the generation moves, users take it at once.
        // The old one goes; the target has already torn its session down.
        *lock(&self.control) = conn;
        let mut st = lock(&self.state);
        st.gen += 1;
        st.opened = opened;
        st.at = at;
        self.set_health(&mut st, Health::Up);
        self.up.store(true, Ordering::Release);
        if lost_writes.is_some() {
            st.lost_writes = lost_writes;
        }
        self.gen.store(st.gen, Ordering::Release);
        drop(st);
        self.shared.counters.reconnects.fetch_add(1, Ordering::Relaxed);
        self.grew(opened.size);
        tracing::warn!(
            volume = self.name,
            %addr,
            session = opened.session_id,
            "reconnected after {} without a session (the attempt took {:.0} ms)",
            secs(down),
            started.elapsed().as_secs_f64() * 1e3
        );
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A busy target's come-back time is kept to within 5% (its slots are spread already), and
    /// never becomes a busy loop.
    #[test]
    fn a_busy_pause_stays_near_what_the_target_asked() {
        let after = Duration::from_millis(1000);
        assert_eq!(busy_pause(after, 0), Duration::from_millis(950));
        assert_eq!(busy_pause(after, u64::MAX), Duration::from_millis(1050) - Duration::from_nanos(1));
        assert_eq!(busy_pause(after, 1 << 63), after);
        assert_eq!(busy_pause(Duration::ZERO, 7), Duration::from_millis(1));
    }
}
