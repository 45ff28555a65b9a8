//! The registry every thread of the daemon shares ([`Shared`]): the volumes served and who may
//! open them ([`Catalog`]), the limits in force, the open sessions, the live connections and
//! those not yet in a session, recent AUTH failures, and the configuration applied last. Also
//! what starting and reloading do to it: volumes loaded, logged, flushed one last time.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use rblk_fabric::{Chain, Waker};
use rblk_proto::Resume;
use tracing::{info, warn};

use crate::access::Policy;
use crate::access_changes::{Access, AccessChange};
use crate::config::{Config, Fixed, Limits, VolumeSpec};
use crate::counters::Counters;
use crate::identity;
use crate::persist::Backing;
use crate::reload::ReloadReport;
use crate::session::{self, Ended, Owner, Session};
use crate::start::{Progress, StartError};
use crate::volume::{LoadError, Volume};

/// How long a probed connection's keepalive may stay unacknowledged before it ends (see
/// [`Shared::probe_silent_sessions`]): one keepalive interval. An RC SEND to a live peer is
/// acknowledged by its NIC within a round trip, whatever its initiator's process is doing.
pub const PROBE_WAIT: Duration = rblk_proto::KEEPALIVE_INTERVAL;

/// Why a connection was woken from outside its loop ([`Shared::wake_connection`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// rdma_cm reported its peer's disconnect.
    Disconnected,
    /// It was evicted to make room for connections not authenticated yet.
    Evicted,
    /// Its host is at the session cap and it was silent: see
    /// [`Shared::probe_silent_sessions`].
    Probe,
    /// Its session was ended (replaced or revoked): it reads why from the session.
    SessionEnded,
    /// Its RDMA device reported its QP in the error state (an asynchronous event, named).
    QpFailed(&'static str),
    /// Its session's volume grew: it binds its new window and tells its initiator.
    Grew,
}

/// What [`Shared::wake_connection`] recorded for a connection since its last turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Wakes {
    pub(crate) disconnected: bool,
    pub(crate) evicted: bool,
    pub(crate) probe: bool,
    /// The device's event that failed its QP.
    pub(crate) qp_failed: Option<&'static str>,
}

/// A live connection in [`Shared`]'s table.
#[derive(Debug)]
struct Live {
    /// Its QP's number (what a device's event about the QP names).
    qpn: u32,
    waker: Waker,
    wakes: Wakes,
    /// Its session, once it opened or joined one.
    session: std::sync::Weak<Session>,
}

/// A session cap that a new session would pass; the refusal's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CapReached {
    /// `max_sessions`.
    #[error("the target has {open} sessions open, its maximum (max_sessions)")]
    Target {
        /// Sessions open.
        open: usize,
    },
    /// `max_sessions_per_host`.
    #[error("{owner} have {open} sessions open, the most one host may (max_sessions_per_host)")]
    Host {
        /// The host (or the anonymous initiators of one address).
        owner: String,
        /// Its sessions open.
        open: usize,
    },
    /// `max_joins_per_session`.
    #[error(
        "session {session} has {joined} connections joined to its first, the most one session may \
         (max_joins_per_session)"
    )]
    SessionJoins {
        /// The session.
        session: u64,
        /// Its connections after the first.
        joined: usize,
    },
    /// `max_joins_per_host`.
    #[error("{owner} have {joined} connections joined to their sessions, the most one host may (max_joins_per_host)")]
    HostJoins {
        /// The host (or the anonymous initiators of one address).
        owner: String,
        /// Its sessions' connections after their first.
        joined: usize,
    },
    /// `max_joins`.
    #[error("the target has {joined} connections joined to sessions, its maximum (max_joins)")]
    TargetJoins {
        /// Every session's connections after its first.
        joined: usize,
    },
}

/// What a reload changes: the volumes served and who may open them, replaced together.
#[derive(Debug)]
pub struct Catalog {
    /// Volumes by name.
    pub volumes: HashMap<String, Arc<Volume>>,
    /// Volumes that could not be loaded, with the reason (OPEN reports it).
    pub refused: HashMap<String, String>,
    /// Keys and access lists.
    pub policy: Policy,
    /// How each served volume was configured (a reload compares).
    pub(crate) specs: HashMap<String, VolumeSpec>,
}

impl Catalog {
    /// Sessions (open or still closing) that hold volume `name`: nothing else holds it but the
    /// catalog, and while the catalog is locked no OPEN is under way.
    pub fn sessions_of(&self, name: &str) -> usize {
        self.volumes.get(name).map_or(0, |v| Arc::strong_count(v) - 1)
    }
}

/// State shared by the listener, the workers and the other threads of the daemon.
#[derive(Debug)]
pub struct Shared {
    /// Behind a lock rather than swapped atomically (arc-swap): an OPEN holds it for reading
    /// from its look-up until its session is recorded, so a reload that takes it for writing
    /// sees every session of a volume it is about to remove, and no OPEN finds one removed.
    pub(crate) catalog: RwLock<Catalog>,
    pub(crate) limits: RwLock<Limits>,
    /// Largest I/O.
    pub max_io: u32,
    /// What AUTH v2's proof names (see [`Config::target_id`]).
    pub target_id: [u8; rblk_proto::TARGET_ID_LEN],
    /// Registration counters.
    pub counters: Arc<Counters>,
    pub(crate) identity: identity::Store,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// The size each recent session of an initiator without segments opened, and its token,
    /// by session id, for its reconnect (see [`Shared::resumed_size`]).
    replaced_sizes: Mutex<HashMap<u64, ([u8; rblk_proto::TOKEN_LEN], u64)>>,
    /// The window domain of each device connections arrived on: the one protection domain of
    /// the window sessions' QPs, windows and volume registrations there (the IB spec wants
    /// window, registration and QP in one PD; isolation comes from the windows being bound to one
    /// QP each, over registrations without remote access). None: the device has no type 2B
    /// windows, or they are off.
    domains: Mutex<HashMap<String, Option<rblk_fabric::Pd>>>,
    /// Live connections: how to wake each, why it was woken, its session.
    conns: Mutex<HashMap<u64, Live>>,
    /// Connections not yet in a session, oldest first, with their peer's address.
    unopened: Mutex<crate::admission::Pool>,
    /// Recent AUTH failures by peer address: how many, and the last one's time.
    auth_failures: Mutex<HashMap<Option<IpAddr>, (u32, Instant)>>,
    next_id: AtomicU64,
    shutdown: AtomicBool,
    /// What it started with that only a restart changes.
    pub(crate) fixed: Fixed,
    /// The configuration applied last (at start, by a reload or an admin request); held while
    /// one of them applies another, so they take turns.
    pub(crate) current: Mutex<Config>,
    /// Whether the rdma_cm port should be open, and whether it is (the listener thread
    /// follows; a handover closes it).
    port: Mutex<Port>,
    port_changed: Condvar,
    /// Wakes the listener thread.
    pub(crate) listener_waker: Waker,
    /// Set once the volumes were handed to a successor: the exit status (no final flush, no
    /// identity kept: the successor serves them).
    handed_over: std::sync::OnceLock<u8>,
    /// Called once the volumes were handed over (the daemon exits).
    on_handed_over: Mutex<Option<Callback>>,
    /// Where `admin handover` puts the descriptors (the service manager's store).
    pub(crate) fd_store: Mutex<Option<Sink>>,
}

/// Whether the rdma_cm port should be and is open, and why it could not be reopened.
#[derive(Debug)]
struct Port {
    want_open: bool,
    open: bool,
    error: Option<String>,
}

/// A callback kept in [`Shared`].
pub(crate) struct Callback(pub Box<dyn FnOnce() + Send>);

impl std::fmt::Debug for Callback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Callback")
    }
}

/// Where the descriptors of a handover to the service manager go: one call per descriptor
/// with its fd store name, the state record last. The daemon's is `FDSTORE=1` through
/// `NOTIFY_SOCKET`; tests collect them.
pub type StoreSink = Box<dyn Fn(&str, std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> + Send + Sync>;

/// The fd store sink kept in [`Shared`].
pub(crate) struct Sink(pub StoreSink);

impl std::fmt::Debug for Sink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sink")
    }
}

/// How long a handover waits for the listener thread to close the port.
const PORT_WAIT: Duration = Duration::from_secs(10);

impl Shared {
    /// The registry of a target starting with `cfg`, serving `catalog`; `listener_waker` wakes
    /// its listener thread.
    pub(crate) fn new(cfg: &Config, catalog: Catalog, identity: identity::Store, listener_waker: Waker) -> Shared {
        Shared {
            catalog: RwLock::new(catalog),
            limits: RwLock::new(Limits::of(cfg)),
            max_io: cfg.max_io,
            target_id: cfg.target_id.unwrap_or_else(session::random),
            counters: Arc::default(),
            identity,
            unopened: Mutex::default(),
            auth_failures: Mutex::default(),
            sessions: Mutex::default(),
            replaced_sizes: Mutex::default(),
            domains: Mutex::default(),
            conns: Mutex::default(),
            // Ids of sessions from before a restart rarely name a live one (their tokens would
            // not match anyway): a resume from then is an ordinary OPEN.
            next_id: AtomicU64::new((u64::from_le_bytes(session::random()) >> 1).max(1)),
            shutdown: AtomicBool::new(false),
            fixed: Fixed::of(cfg),
            current: Mutex::new(cfg.clone()),
            port: Mutex::new(Port { want_open: true, open: true, error: None }),
            port_changed: Condvar::new(),
            listener_waker,
            handed_over: std::sync::OnceLock::new(),
            on_handed_over: Mutex::default(),
            fd_store: Mutex::default(),
        }
    }

    /// Asks the listener thread to close (false) or reopen (true) the rdma_cm port and waits
    /// until it did; closing fails if the listener does not answer within [`PORT_WAIT`].
    /// Reopening that fails is retried by the listener; the error is returned.
    pub(crate) fn set_port_open(&self, open: bool) -> Result<(), String> {
        let mut port = self.port.lock().unwrap_or_else(|p| p.into_inner());
        port.want_open = open;
        port.error = None;
        self.listener_waker.wake();
        let deadline = Instant::now() + PORT_WAIT;
        while port.open != open && port.error.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "the listener did not {} the port within {PORT_WAIT:?}",
                    if open { "reopen" } else { "close" }
                ));
            }
            port = self.port_changed.wait_timeout(port, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        port.error.clone().map_or(Ok(()), Err)
    }

    /// Whether a handover is under way (it closed the port and has not reopened it).
    pub(crate) fn handing_over(&self) -> bool {
        !self.port.lock().unwrap_or_else(|p| p.into_inner()).want_open
    }

    /// The listener thread: makes `listener`'s port what [`Shared::set_port_open`] asked for.
    /// Returns true while a reopen failed (to retry soon).
    pub(crate) fn sync_port(&self, listener: &mut rblk_fabric::Listener) -> bool {
        let mut port = self.port.lock().unwrap_or_else(|p| p.into_inner());
        if port.want_open == port.open {
            return false;
        }
        if port.want_open {
            match listener.reopen_port() {
                Ok(()) => {
                    port.open = true;
                    port.error = None;
                    info!("listening again");
                }
                Err(e) => port.error = Some(Chain(&e).to_string()),
            }
        } else {
            listener.close_port();
            port.open = false;
            info!("stopped listening: the port is free for a successor");
        }
        self.port_changed.notify_all();
        port.want_open != port.open
    }

    /// The volumes were handed to a successor: this daemon will exit with `status` and must
    /// not write them back or keep their identities.
    pub(crate) fn finish_handover(&self, status: u8) {
        let _ = self.handed_over.set(status);
    }

    /// After [`Shared::finish_handover`]: tells whoever runs the daemon to stop it.
    pub(crate) fn exit_after_handover(&self) {
        if let Some(Callback(f)) = self.on_handed_over.lock().unwrap_or_else(|p| p.into_inner()).take() {
            f();
        }
    }

    /// The exit status, once the volumes were handed over.
    pub fn handed_over(&self) -> Option<u8> {
        self.handed_over.get().copied()
    }

    /// Runs `f` once the volumes were handed over (at once if they were).
    pub(crate) fn on_handed_over(&self, f: Box<dyn FnOnce() + Send>) {
        *self.on_handed_over.lock().unwrap_or_else(|p| p.into_inner()) = Some(Callback(f));
        if self.handed_over().is_some() {
            self.exit_after_handover();
        }
    }

    /// The volumes and the access policy, for reading (do not hold it across waits: a reload
    /// waits for it).
    pub fn catalog(&self) -> RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn limits(&self) -> Limits {
        *self.limits.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether initiators must AUTH (see [`Policy::auth_required`]).
    pub fn auth_required(&self) -> bool {
        self.catalog().policy.auth_required()
    }

    /// Whether the target is shutting down.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    /// The target shuts down: the listener and every connection end at their next wake-up.
    pub(crate) fn shut_down(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
    }

    /// Records live connection `conn`, woken through `waker` (a disconnect, an eviction, a
    /// replacement of its session, a shutdown).
    pub(crate) fn add_connection(&self, conn: u64, qpn: u32, waker: Waker) {
        let live = Live { qpn, waker, wakes: Wakes::default(), session: std::sync::Weak::new() };
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(conn, live);
    }

    /// Connection `conn` is gone.
    pub(crate) fn remove_connection(&self, conn: u64) {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&conn);
    }

    /// Connection `conn` serves session `s` now (it opened it, or joined it): a disconnect
    /// the listener hears for it counts it out of the session's caps at once.
    pub(crate) fn connection_joined(&self, conn: u64, s: &Arc<Session>) {
        if let Some(live) = self.conns.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&conn) {
            live.session = Arc::downgrade(s);
        }
    }

    /// The one way to reach connection `conn` from outside its worker's loop: records why and
    /// wakes it (its next turn reads why with [`Shared::take_wakes`]). A disconnect also counts
    /// it out of its session's caps now ([`Session::depart`]), not once its teardown ran, so a
    /// host's OPEN that follows its DISCONNECTED never finds the session it dropped counted.
    pub(crate) fn wake_connection(&self, conn: u64, why: Wake) {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        let Some(live) = conns.get_mut(&conn) else { return };
        match why {
            Wake::Disconnected => {
                live.wakes.disconnected = true;
                if let Some(s) = live.session.upgrade() {
                    s.depart(conn);
                }
            }
            Wake::Evicted => live.wakes.evicted = true,
            Wake::Probe => live.wakes.probe = true,
            Wake::SessionEnded | Wake::Grew => {}
            Wake::QpFailed(what) => live.wakes.qp_failed = Some(what),
        }
        live.waker.wake();
    }

    /// An RDMA device's asynchronous event: counted and logged; a QP's error ends its
    /// connection at once (its QP is in the error state; otherwise only a failed completion or
    /// the keepalives would tell, up to `keepalive_timeout` later).
    pub(crate) fn device_event(&self, e: &rblk_fabric::DeviceEvent) {
        use rblk_fabric::DeviceEventKind as K;
        self.counters.device_events.fetch_add(1, Ordering::Relaxed);
        let device = e.device.as_str();
        match e.kind {
            K::QpFailed { qp_num } => match self.connection_of_qp(qp_num) {
                Some(conn) => {
                    warn!(device, qpn = qp_num, conn, "{} on a connection's QP: ending it", e.what);
                    self.wake_connection(conn, Wake::QpFailed(e.what));
                }
                None => warn!(device, qpn = qp_num, "{} on a QP no connection holds", e.what),
            },
            K::Qp { qp_num } => tracing::debug!(device, qpn = qp_num, "device event: {}", e.what),
            K::Port { port, active: Some(false) } => {
                warn!(device, port, "{}: its connections fail until it is back", e.what);
            }
            K::Port { port, active: Some(true) } => info!(device, port, "{}", e.what),
            K::Port { port, active: None } => info!(device, port, "device event: {}", e.what),
            K::CqFailed => {
                tracing::error!(device, "{}: the QPs on that completion queue stop completing", e.what);
            }
            K::DeviceFatal => tracing::error!(device, "{}: every connection on it is lost", e.what),
            K::SrqLimit => tracing::debug!(device, "device event: {}", e.what),
            K::Other => warn!(device, "device event: {}", e.what),
        }
    }

    /// The live connection whose QP is number `qpn`, if any (a scan: device events are rare).
    pub(crate) fn connection_of_qp(&self, qpn: u32) -> Option<u64> {
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.iter().find(|(_, live)| live.qpn == qpn).map(|(&conn, _)| conn)
    }

    /// Why connection `conn` was woken from outside since it last asked; forgets it.
    pub(crate) fn take_wakes(&self, conn: u64) -> Wakes {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.get_mut(&conn).map(|live| std::mem::take(&mut live.wakes)).unwrap_or_default()
    }

    /// Every session, taken out of the table (at shutdown).
    pub(crate) fn take_sessions(&self) -> Vec<Arc<Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).drain().map(|(_, s)| s).collect()
    }

    /// A fresh session id.
    pub fn next_session_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
    /// Records an opened session so further QPs can join it, unless that would pass a session
    /// cap (then the reason).
    pub fn add_session(&self, s: Arc<Session>) -> Result<(), CapReached> {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(full) = self.session_cap(&sessions, &s.owner) {
            return Err(full);
        }
        sessions.insert(s.id, s);
        Ok(())
    }

    /// Whether a new session of `owner` would pass a cap: the reason, if so. OPEN asks before
    /// it registers anything; [`Shared::add_session`] asks again, atomically.
    pub fn session_cap_reached(&self, owner: &Owner) -> Option<CapReached> {
        self.session_cap(&self.sessions.lock().unwrap_or_else(|p| p.into_inner()), owner)
    }

    /// Sessions count while a connection of theirs is not known to be going
    /// ([`Session::live`]).
    fn session_cap(&self, sessions: &HashMap<u64, Arc<Session>>, owner: &Owner) -> Option<CapReached> {
        let limits = self.limits();
        let (mut open, mut mine) = (0, 0);
        for s in sessions.values().filter(|s| s.live() > 0) {
            open += 1;
            mine += usize::from(s.owner == *owner);
        }
        if open >= limits.max_sessions {
            return Some(CapReached::Target { open });
        }
        (mine >= limits.max_sessions_per_host).then(|| CapReached::Host { owner: owner.to_string(), open: mine })
    }

    /// Whether one more connection joining `s` would pass a JOIN cap: the reason, if so. A
    /// session's connections after its first count as joined. Only the listener thread admits
    /// connections, so between this answer and the join nothing else joins.
    pub fn join_cap_reached(&self, s: &Session) -> Option<CapReached> {
        let limits = self.limits();
        let joined = |s: &Session| s.live().saturating_sub(1);
        let mine = joined(s);
        if mine >= limits.max_joins_per_session {
            return Some(CapReached::SessionJoins { session: s.id, joined: mine });
        }
        let (mut host, mut all) = (0, 0);
        for t in self.sessions.lock().unwrap_or_else(|p| p.into_inner()).values() {
            let j = joined(t);
            all += j;
            if t.owner == s.owner {
                host += j;
            }
        }
        if all >= limits.max_joins {
            return Some(CapReached::TargetJoins { joined: all });
        }
        (host >= limits.max_joins_per_host).then(|| CapReached::HostJoins { owner: s.owner.to_string(), joined: host })
    }

    /// At `owner`'s session cap: asks every connection of the owner's sessions not heard from
    /// for [`rblk_proto::KEEPALIVE_INTERVAL`] whether its initiator is still there
    /// ([`Wake::Probe`]: a keepalive of the connection's unacknowledged for [`PROBE_WAIT`]
    /// ends it). Returns the sessions probed: the OPEN that asked is handled again once they
    /// are gone or the wait passed. A host that vanished without a disconnect would otherwise
    /// hold its places until [`Config::keepalive_timeout`].
    pub(crate) fn probe_silent_sessions(&self, owner: &Owner) -> Vec<Arc<Session>> {
        let now = Instant::now();
        let silent: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| s.owner == *owner && s.live() > 0 && s.silent_for(now) >= rblk_proto::KEEPALIVE_INTERVAL)
            .cloned()
            .collect();
        for s in &silent {
            for conn in s.live_connections() {
                self.wake_connection(conn, Wake::Probe);
            }
        }
        silent
    }

    /// An AUTH from `ip` failed: how long to hold its ERROR back. The first failure is answered
    /// at once; each further one within [`AUTH_FAILURE_MEMORY`] of the last doubles the delay,
    /// from 250 ms up to [`Config::max_auth_delay`]. Nothing is refused for it, so an honest host that
    /// mistyped its key gets in once it has the right one.
    pub fn auth_failed(&self, ip: Option<IpAddr>) -> Duration {
        self.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
        let mut failures = self.auth_failures.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        failures.retain(|_, (_, last)| now.duration_since(*last) < AUTH_FAILURE_MEMORY);
        let (count, last) = failures.entry(ip).or_insert((0, now));
        *count = count.saturating_add(1);
        *last = now;
        let doublings = count.saturating_sub(2).min(8);
        if *count == 1 {
            Duration::ZERO
        } else {
            (Duration::from_millis(250) * (1 << doublings)).min(self.limits().max_auth_delay)
        }
    }

    /// An AUTH from `ip` succeeded: its failures are forgotten.
    pub fn auth_succeeded(&self, ip: Option<IpAddr>) {
        self.auth_failures.lock().unwrap_or_else(|p| p.into_inner()).remove(&ip);
    }
    /// Admits connection `conn` from `ip`, which has not authenticated yet, to the pool of such
    /// connections (see [`crate::admission`]), or says why not; evicts the connections it
    /// displaces. Called at the connect request, before anything is allocated for it.
    pub(crate) fn admit_unauthenticated(&self, conn: u64, ip: Option<IpAddr>) -> Result<(), crate::admission::Crowded> {
        let limits = self.limits();
        let evict = self.unopened.lock().unwrap_or_else(|p| p.into_inner()).admit(
            conn,
            ip,
            limits.max_unopened,
            limits.max_unopened_per_addr,
            crate::admission::roll(),
        )?;
        for (old, addr) in evict {
            warn!(conn = old, peer = %crate::admission::Shown(addr), "evicting a connection that has not authenticated, to make room for conn {conn}");
            self.wake_connection(old, Wake::Evicted);
        }
        Ok(())
    }

    /// Connection `conn` authenticated (where no AUTH is asked: opened a session), or is gone:
    /// it leaves the pool of connections that have not.
    pub(crate) fn authenticated_or_gone(&self, conn: u64) {
        self.unopened.lock().unwrap_or_else(|p| p.into_inner()).leave(conn);
    }

    /// Open sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// Live connections.
    pub fn connection_count(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// The window domain of `device` (see [`Shared::domains`]), made at the first connection
    /// that asks for windows on it, or by a successor that registers its handed volumes ahead
    /// ([`crate::handover::Handed::register_ahead`]); None where windows are off or the device
    /// has none.
    pub(crate) fn window_domain(&self, device: &str) -> rblk_fabric::Result<Option<rblk_fabric::Pd>> {
        if !self.fixed.memory_windows {
            return Ok(None);
        }
        let mut domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = domains.get(device) {
            return Ok(d.clone());
        }
        let pd = rblk_fabric::Pd::alloc(self.fixed.fabric, device)?;
        let domain = pd.type2_windows().then_some(pd);
        if domain.is_some() {
            info!(device, "memory windows: one registration per volume, one window per QP");
        } else {
            info!(
                device,
                "the device has no type 2B memory windows: each session registers its volume in a PD of its own"
            );
        }
        domains.insert(device.to_owned(), domain.clone());
        Ok(domain)
    }

    /// Whether `pd` is `device`'s memory-window domain (shared by every window session there).
    pub(crate) fn is_window_domain(&self, device: &str, pd: &rblk_fabric::Pd) -> bool {
        let domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        domains.get(device).and_then(Option::as_ref).is_some_and(|d| d.same_as(pd))
    }

    pub(crate) fn session(&self, id: u64) -> Option<Arc<Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }
    pub(crate) fn drop_session(&self, s: &Arc<Session>) {
        s.release();
        self.forget_session(s);
    }
    /// Removes `s` from the table (not a later session that happens to have its id). An
    /// initiator without segments that reconnects gets the size the session had: kept here.
    fn forget_session(&self, s: &Arc<Session>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions.get(&s.id).is_some_and(|t| Arc::ptr_eq(t, s)) {
            sessions.remove(&s.id);
            if !s.segmented {
                let mut sizes = self.replaced_sizes.lock().unwrap_or_else(|p| p.into_inner());
                // Each is taken by the reconnect's OPEN; those of sessions nobody resumes are
                // dropped with the rest once there are many (an old initiator that resumes one
                // of them then gets the volume's size, as before grows existed).
                if sizes.len() >= 4096 {
                    sizes.clear();
                }
                sizes.insert(s.id, (s.token, s.opened_size));
            }
        }
    }

    /// A reconnecting OPEN: ends the session `resume` names, if it is alive and the token is
    /// its, before the new session is opened, so that no late WRITE through the old session can
    /// land after the initiator's replay. Its registration goes at once (its rkey stops working,
    /// its open mode is released); its connections are woken and end, destroying their QPs.
    /// Returns the session when connections of it are left: the OPEN is answered once they are
    /// gone (see [`Session::when_empty`]), or [`REPLACE_WAIT`] passed, without holding a
    /// thread meanwhile (the connection's worker may own the old QPs). Any other resume (the
    /// target restarted, the session is gone, a wrong token) touches nothing.
    pub fn replace_session(&self, resume: &Resume) -> Option<Arc<Session>> {
        let Some(old) = self.session(resume.session_id).filter(|s| s.token_matches(&resume.token)) else {
            info!(
                session = resume.session_id,
                "resume names no live session here (the target restarted, or it ended): nothing to replace"
            );
            return None;
        };
        self.end_session(&old, Ended::Replaced);
        if old.connections() > 0 {
            return Some(old);
        }
        info!("session {} replaced by a reconnect", old.id);
        None
    }

    /// The size the session `resume` names had at its OPEN, if it ended here and the token is
    /// its: an initiator that does not know segments resumes at it, even if the volume grew
    /// meanwhile.
    pub(crate) fn resumed_size(&self, resume: &Resume) -> Option<u64> {
        let mut sizes = self.replaced_sizes.lock().unwrap_or_else(|p| p.into_inner());
        let (token, size) = sizes.get(&resume.session_id)?;
        let theirs: bool = subtle::ConstantTimeEq::ct_eq(&token[..], &resume.token[..]).into();
        if !theirs {
            return None;
        }
        let size = *size;
        sizes.remove(&resume.session_id);
        Some(size)
    }

    /// Grows served volume `volume` to `size` bytes ([`Volume::grow`]), then gets its sessions
    /// there: registers the new segment for the window sessions on each device and in the own
    /// protection domain of each session with registrations that knows segments, and wakes
    /// every connection of every session of the volume, which binds its new window and tells
    /// its initiator ([`rblk_proto::Message::Resized`]). Sessions of initiators that do not
    /// know segments keep the size they opened.
    pub(crate) fn grow_volume(&self, volume: &Arc<Volume>, size: u64) -> Result<(), crate::volume::GrowError> {
        volume.grow(size)?;
        let last = volume.segment_count() - 1;
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|s| Arc::ptr_eq(&s.volume, volume))
            .cloned()
            .collect();
        let mut registered: Vec<String> = Vec::new();
        for s in &sessions {
            let done = if s.uses_windows() && s.segmented {
                if registered.iter().any(|d| d == s.pd.device()) {
                    Ok(())
                } else {
                    registered.push(s.pd.device().to_owned());
                    volume.region(&s.pd, &self.counters, last).map(|_| ())
                }
            } else {
                s.register_grown()
            };
            if let Err(e) = done {
                // Its connections find the segment missing when they bind (and fail), or
                // keep the size they were told.
                warn!(session = s.id, volume = %volume.name, error = %Chain(&e), "registering the added segment failed");
            }
            for conn in s.live_connections() {
                self.wake_connection(conn, Wake::Grew);
            }
        }
        Ok(())
    }

    /// Ends session `s` from outside (see [`Session::end`]): its rkeys die now, it is
    /// forgotten (a JOIN to it finds nothing), and its connections are woken, to end.
    fn end_session(&self, s: &Arc<Session>, how: Ended) {
        let conns = s.end(how);
        self.forget_session(s);
        for conn in conns {
            self.wake_connection(conn, Wake::SessionEnded);
        }
    }

    /// After a reload installed `policy` (the caller holds the catalog for writing, so no OPEN
    /// is under way): ends every session the policy no longer admits ([`Policy::revokes`]), as
    /// SPDK's `nvmf_subsystem_remove_host` disconnects the host. Returns them, for the report.
    fn revoke(&self, policy: &Policy) -> Vec<(u64, String)> {
        let sessions: Vec<Arc<Session>> =
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        let mut released = Vec::new();
        for s in sessions {
            let open = Some((s.volume.name.as_str(), s.mode));
            let Some(why) = policy.revokes(s.owner.host(), &s.credential, open) else { continue };
            self.end_session(&s, Ended::Revoked);
            warn!(session = s.id, owner = %s.owner, volume = %s.volume.name, "reload: session released: {why}");
            released.push((s.id, format!("session {} of volume {} ({}): {why}", s.id, s.volume.name, s.owner)));
        }
        released.sort_unstable();
        released
    }

    /// Who may get in and open what now (keys by fingerprint): the volumes served and those
    /// that could not be loaded, with their access lists.
    pub fn access(&self) -> Access {
        let catalog = self.catalog();
        catalog.policy.snapshot(catalog.volumes.keys().chain(catalog.refused.keys()).map(String::as_str))
    }

    /// After a failed write-back: revokes the access of every read-write session of `volume`
    /// (deallocates its windows, or deregisters its registration), so writers get remote access
    /// errors instead of writing into data that will not be kept.
    pub fn fail_volume(&self, volume: &Arc<Volume>) {
        let sessions: Vec<Arc<Session>> =
            self.sessions.lock().unwrap_or_else(|p| p.into_inner()).values().cloned().collect();
        for s in sessions.iter().filter(|s| Arc::ptr_eq(&s.volume, volume) && s.mode != rblk_proto::OpenMode::ReadOnly)
        {
            warn!(session = s.id, volume = %volume.name, "revoking write access: the volume failed");
            s.release();
        }
    }
}

/// Creates a RAM volume, or opens and loads a durable one (taking its kept identity), before
/// it is served.
pub(crate) fn load_volume(v: &VolumeSpec, block_size: u32, identity: &identity::Store) -> Result<Volume, LoadError> {
    match &v.path {
        None => Volume::new(&v.name, v.size, block_size).map_err(LoadError::Memory),
        Some(path) => {
            let b = Backing::open(path, v.size)?;
            // Taken (and its record removed) before anything is served.
            let instance = identity.take(&v.name, b.fingerprint().ok().as_ref());
            let mut vol = Volume::durable(&v.name, v.size, block_size, b)?;
            vol.instance = instance;
            Ok(vol)
        }
    }
}

/// Logs that `v` is served now.
pub(crate) fn log_serving(v: &Volume) {
    match &v.backing {
        None => info!(volume = %v.name, size = v.size(), "serving RAM volume (volatile)"),
        Some(b) => info!(volume = %v.name, size = v.size(), path = %b.path().display(), "serving durable volume"),
    }
}

/// The final flush of a durable volume nobody can write any more (shutdown, or removal at a
/// reload): everything to its backing store, then its identity kept in the state dir, so the
/// next start (or re-add) may present the same instance. A volume no session could write since
/// it was loaded (or last written back whole) is not rewritten: its backing store holds it.
pub(crate) fn final_flush(identity: &identity::Store, v: &Volume) {
    let Some(b) = v.backing.as_ref().filter(|b| !b.failed()) else { return };
    let result = if v.written() {
        b.flush(&v.memory(), &[(0, v.size())]).inspect(|()| {
            v.written_back_whole();
            info!(volume = %v.name, "flushed to {}", b.path().display());
        })
    } else {
        info!(volume = %v.name, "nobody could write it since it was loaded: {} is not rewritten", b.path().display());
        Ok(())
    };
    match result {
        Ok(()) => match b.fingerprint() {
            Ok(fp) => {
                identity.save(&v.name, &fp, v.instance);
            }
            Err(e) => {
                warn!(volume = %v.name, error = %e, "cannot examine the backing store: its identity is not kept")
            }
        },
        Err(e) => tracing::error!(volume = %v.name, error = %Chain(&e), "final flush failed"),
    }
}

/// Registrations pin memory and count against RLIMIT_MEMLOCK (root is exempt): say so up front
/// rather than at the first OPEN.
pub(crate) fn warn_memlock(shared: &Shared) {
    let largest = shared.catalog().volumes.values().map(|v| v.size()).max().unwrap_or(0);
    if let Some(limit) = rblk_fabric::memlock_limit() {
        if !nix::unistd::Uid::effective().is_root() && limit < largest {
            warn!(
                limit,
                largest_volume = largest,
                "RLIMIT_MEMLOCK is below the largest volume: OPEN will fail to register it; raise it with \
                 `ulimit -l unlimited` or LimitMEMLOCK=infinity (with memory windows a volume is pinned once per \
                 device; without, once per session)"
            );
        }
    }
}

/// How long an address's AUTH failures are remembered after its last one.
pub const AUTH_FAILURE_MEMORY: Duration = Duration::from_secs(60);

/// The longest a reconnecting OPEN waits for the replaced session's connections to end (see
/// [`Shared::replace_session`]).
pub const REPLACE_WAIT: Duration = Duration::from_secs(5);

impl Shared {
    /// Applies `new` in place of `current` (the configuration applied last, locked by the
    /// caller: [`Running::reload_with`](crate::server::Running::reload_with), or an admin
    /// request that changed one volume of it), which becomes `new` unless `new` does not pass [`Config::check`]. The one place volumes
    /// are added and removed at run time (the rules: [`crate::reload`]).
    pub(crate) fn apply(
        &self,
        current: &mut Config,
        mut new: Config,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<ReloadReport, StartError> {
        let mut policy = new.check()?;
        let shared = self;
        let mut report = ReloadReport::default();
        // Before anything changes: a widening the file does not confirm changes nothing.
        let access = policy.snapshot(new.volumes.iter().map(|v| v.name.as_str()));
        report.access = crate::access_changes::check(&self.access(), &access, new.confirm_widen)?;
        if report.access.iter().any(AccessChange::widens) {
            warn!("reload: widening access, as confirm_widen = true allows");
        }
        let fixed = &self.fixed;
        let differs = [
            ("listen", new.listen != fixed.listen),
            ("metrics", new.metrics != fixed.metrics),
            ("admin_socket", new.admin_socket != fixed.admin_socket),
            ("device", new.device != fixed.device),
            ("state_dir", new.state_dir != fixed.state_dir),
            ("block_size", new.block_size != fixed.block_size),
            ("max_io", new.max_io != fixed.max_io),
            ("memory_windows", new.memory_windows != fixed.memory_windows),
            ("listen_backlog", new.listen_backlog != fixed.listen_backlog),
            ("workers", new.workers != fixed.workers),
        ];
        for (setting, _) in differs.iter().filter(|(_, d)| *d) {
            warn!("reload: {setting} changed, which only a restart applies");
            report.needs_restart.push((*setting).to_owned());
        }
        let wanted: HashMap<&str, &crate::config::VolumeSpec> =
            new.volumes.iter().map(|v| (v.name.as_str(), v)).collect();

        // Grows (applied once OPEN may go on), and volumes made again smaller.
        let mut grows: Vec<(String, u64, u64)> = Vec::new();
        let mut shrunk: Vec<Arc<Volume>> = Vec::new();
        // Removals, the new policy and limits, in one step for OPEN.
        let (gone, to_load) = {
            let mut catalog = shared.catalog.write().unwrap_or_else(|p| p.into_inner());
            // RAM volumes whose contents would go with them: only when the file says so.
            // A shrink makes the volume again: the same rule (one with sessions is refused below).
            let shrinks = |v: &Volume| {
                wanted.get(v.name.as_str()).is_some_and(|spec| {
                    spec.size < v.size() && catalog.specs.get(&v.name).is_some_and(|was| was.path == spec.path)
                })
            };
            let mut losing: Vec<String> = catalog
                .volumes
                .values()
                .filter(|v| (!wanted.contains_key(v.name.as_str()) || shrinks(v)) && v.is_volatile() && v.written())
                .filter(|v| catalog.sessions_of(&v.name) == 0 && !new.confirm_remove.contains(&v.name))
                .map(|v| v.name.clone())
                .collect();
            if !losing.is_empty() {
                losing.sort_unstable();
                return Err(StartError::WouldLoseData(losing));
            }
            let mut gone: Vec<Arc<Volume>> = Vec::new();
            let mut names: Vec<String> = catalog.volumes.keys().cloned().collect();
            names.sort_unstable();
            for name in names {
                if wanted.contains_key(name.as_str()) {
                    continue;
                }
                let sessions = catalog.sessions_of(&name);
                if sessions > 0 {
                    warn!(
                        volume = %name,
                        sessions,
                        "the configuration removes volume {name}, but it has {sessions} open session(s): still served; \
                         the next reload tries again"
                    );
                    policy.keep_acl(&name, catalog.policy.acl(&name).cloned());
                    report.busy.push((name, sessions));
                } else if let Some(v) = catalog.volumes.remove(&name) {
                    catalog.specs.remove(&name);
                    gone.push(v);
                }
            }
            for (name, spec) in &wanted {
                let Some(was) = catalog.specs.get(*name) else { continue };
                if was.path != spec.path {
                    let show = |p: &Option<std::path::PathBuf>| {
                        p.as_ref().map_or_else(|| "RAM".to_owned(), |p| p.display().to_string())
                    };
                    let mut what = format!("path {} -> {}", show(&was.path), show(&spec.path));
                    if was.size != spec.size {
                        what = format!("size {} -> {}, {what}", was.size, spec.size);
                    }
                    warn!(volume = %name, "reload: {what}: not applied to a served volume (remove it, reload, add it again)");
                    report.unchanged.push(((*name).to_owned(), what));
                } else if spec.size > was.size {
                    grows.push(((*name).to_owned(), was.size, spec.size));
                } else if spec.size < was.size {
                    let sessions = catalog.sessions_of(name);
                    let what = format!("size {} -> {}", was.size, spec.size);
                    if sessions > 0 {
                        let what = format!(
                            "{what}: a volume cannot shrink while it has {}",
                            crate::counted(sessions, "open session")
                        );
                        warn!(volume = %name, "reload: {what}");
                        report.unchanged.push(((*name).to_owned(), what));
                    } else if let Some(v) = catalog.volumes.remove(*name) {
                        // Made again at its new size below, as a removal and an addition (a RAM
                        // volume holding data needs confirm_remove, checked above).
                        catalog.specs.remove(*name);
                        info!(volume = %name, "reload: {what}: made again at the new size");
                        shrunk.push(v);
                    }
                }
            }
            catalog.refused.retain(|name, _| wanted.contains_key(name.as_str()));
            catalog.policy = policy;
            report.released = shared.revoke(&catalog.policy);
            *shared.limits.write().unwrap_or_else(|p| p.into_inner()) = Limits::of(&new);
            let to_load: Vec<crate::config::VolumeSpec> =
                new.volumes.iter().filter(|v| !catalog.volumes.contains_key(&v.name)).cloned().collect();
            (gone, to_load)
        };

        // Nobody can open these any more, and nobody has them open.
        for v in shrunk {
            final_flush(&shared.identity, &v);
        }
        for (name, was, size) in grows {
            let Some(v) = shared.catalog().volumes.get(&name).cloned() else { continue };
            match shared.grow_volume(&v, size) {
                Ok(()) => {
                    let mut catalog = shared.catalog.write().unwrap_or_else(|p| p.into_inner());
                    if let Some(spec) = catalog.specs.get_mut(&name) {
                        spec.size = size;
                    }
                    report.grown.push((name, was, size));
                }
                Err(e) => {
                    let what = format!("size {was} -> {size}: {}", Chain(&e));
                    warn!(volume = %name, "reload: not grown: {what}");
                    // The configuration applied keeps the size served.
                    if let Some(spec) = new.volumes.iter_mut().find(|s| s.name == name) {
                        spec.size = was;
                    }
                    report.unchanged.push((name, what));
                }
            }
        }
        for v in gone {
            final_flush(&shared.identity, &v);
            info!(volume = %v.name, "volume removed");
            report.removed.push(v.name.clone());
        }

        // Backing stores of the volumes still served (a removal just now freed its own).
        let in_use: Vec<std::path::PathBuf> =
            shared.catalog().volumes.values().filter_map(|v| v.backing.as_ref().map(|b| canonical(b.path()))).collect();
        let count = to_load.len();
        let mut loaded = Vec::new();
        for (i, v) in to_load.iter().enumerate() {
            let durable = v.path.is_some();
            if let Some(path) = v.path.as_deref().filter(|p| in_use.contains(&canonical(p))) {
                let why = format!("backing store {} is still used by a served volume", path.display());
                warn!(volume = %v.name, "reload: not adding the volume: {why}");
                report.refused.push((v.name.clone(), why));
                continue;
            }
            progress(Progress::Loading { name: &v.name, index: i + 1, count, size: v.size, durable });
            match load_volume(v, fixed.block_size, &shared.identity) {
                Ok(vol) => loaded.push((v.clone(), Arc::new(vol))),
                Err(e) => {
                    let why = match e {
                        LoadError::Memory(e) => format!("cannot map its memory: {}", Chain(&e)),
                        LoadError::Backing(e) => Chain(&e).to_string(),
                    };
                    tracing::error!(volume = %v.name, "reload: refusing the volume: {why}");
                    report.refused.push((v.name.clone(), why));
                }
            }
        }
        {
            let mut catalog = shared.catalog.write().unwrap_or_else(|p| p.into_inner());
            for (name, why) in &report.refused {
                catalog.refused.insert(name.clone(), why.clone());
            }
            for (spec, vol) in loaded {
                log_serving(&vol);
                report.added.push(spec.name.clone());
                catalog.refused.remove(&spec.name);
                catalog.volumes.insert(spec.name.clone(), vol);
                catalog.specs.insert(spec.name.clone(), spec);
            }
        }
        warn_memlock(shared);
        info!(%report, "configuration reloaded");
        *current = new;
        Ok(report)
    }
}

fn canonical(p: &std::path::Path) -> std::path::PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}
