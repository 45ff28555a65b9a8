//! The rdma_cm listener and the connection threads.

pub use crate::config::{
    Config, AUTH_TIMEOUT, MAX_AUTH_DELAY, MAX_SESSIONS, MAX_SESSIONS_PER_HOST, MAX_UNOPENED, MAX_UNOPENED_PER_ADDR,
};
pub use crate::start::{Progress, StartError};

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::{Chain, Completion, Endpoint, Fabric, Listener, ListenerEvent, QpConfig, Request, Waker};
use rblk_proto::{ConnectData, Message, Resume, MSG_SIZE};
use tracing::{debug, info, info_span, warn};

use crate::access::Policy;
use crate::config::{Fixed, Limits, VolumeSpec};
use crate::control::{self, After, Reply, State};
use crate::identity;
use crate::persist::Backing;
use crate::session::{self, Counters, Owner, Session};
use crate::volume::{LoadError, Volume};

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

/// State shared by the listener and the connection threads.
#[derive(Debug)]
pub struct Shared {
    /// Behind a lock rather than swapped atomically (arc-swap): an OPEN holds it for reading
    /// from its look-up until its session is recorded, so a reload that takes it for writing
    /// sees every session of a volume it is about to remove, and no OPEN finds one removed.
    pub(crate) catalog: RwLock<Catalog>,
    pub(crate) limits: RwLock<Limits>,
    /// Largest I/O.
    pub max_io: u32,
    /// Registration counters.
    pub counters: Arc<Counters>,
    pub(crate) identity: identity::Store,
    sessions: Mutex<HashMap<u64, Arc<Session>>>,
    /// The window domain of each device connections arrived on: the one protection domain of
    /// the window sessions' QPs, windows and volume registrations there (the IB spec wants
    /// window, registration and QP in one PD; isolation comes from the windows being bound to one
    /// QP each, over registrations without remote access). None: the device has no type 2B
    /// windows, or they are off.
    domains: Mutex<HashMap<String, Option<rblk_fabric::Pd>>>,
    conns: Mutex<HashMap<u64, Waker>>,
    /// Connections not yet in a session, oldest first, with their peer's address.
    unopened: Mutex<std::collections::VecDeque<(u64, Option<IpAddr>)>>,
    /// Connections told to end to make room (see [`Config::max_unopened`]).
    evicted: Mutex<std::collections::HashSet<u64>>,
    /// Recent AUTH failures by peer address: how many, and the last one's time.
    auth_failures: Mutex<HashMap<Option<IpAddr>, (u32, Instant)>>,
    next_id: AtomicU64,
    shutdown: AtomicBool,
    /// What it started with that only a restart changes.
    pub(crate) fixed: Fixed,
    /// The configuration applied last (at start, by a reload or an admin request); held while
    /// one of them applies another, so they take turns.
    pub(crate) current: Mutex<Config>,
}

impl Shared {
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

    fn session_cap(&self, sessions: &HashMap<u64, Arc<Session>>, owner: &Owner) -> Option<CapReached> {
        let limits = self.limits();
        if sessions.len() >= limits.max_sessions {
            return Some(CapReached::Target { open: sessions.len() });
        }
        let mine = sessions.values().filter(|s| s.owner == *owner).count();
        (mine >= limits.max_sessions_per_host).then(|| CapReached::Host { owner: owner.to_string(), open: mine })
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
    /// Records connection `conn` from `ip` as not yet in a session, first evicting the oldest
    /// such connections past the caps.
    fn admit_unopened(&self, conn: u64, ip: Option<IpAddr>) {
        let limits = self.limits();
        let mut unopened = self.unopened.lock().unwrap_or_else(|p| p.into_inner());
        let mut evict = Vec::new();
        while unopened.iter().filter(|(_, a)| *a == ip).count() >= limits.max_unopened_per_addr {
            let Some(i) = unopened.iter().position(|(_, a)| *a == ip) else { break };
            evict.extend(unopened.remove(i));
        }
        while unopened.len() >= limits.max_unopened {
            evict.extend(unopened.pop_front());
        }
        unopened.push_back((conn, ip));
        drop(unopened);
        for (old, addr) in evict {
            warn!(conn = old, peer = ?addr, "evicting a connection that opened nothing, to make room for conn {conn}");
            self.evicted.lock().unwrap_or_else(|p| p.into_inner()).insert(old);
            if let Some(w) = self.conns.lock().unwrap_or_else(|p| p.into_inner()).get(&old) {
                w.wake();
            }
        }
    }

    /// Connection `conn` is in a session now, or gone.
    fn opened_or_gone(&self, conn: u64) {
        self.unopened.lock().unwrap_or_else(|p| p.into_inner()).retain(|(c, _)| *c != conn);
    }

    /// Open sessions.
    pub fn session_count(&self) -> usize {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// Live connections.
    pub fn connection_count(&self) -> usize {
        self.conns.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
    /// The window domain of `req`'s device (see [`Shared::domains`]), made at the first
    /// connection that asks for windows on it; None where windows are off or the device has
    /// none.
    fn window_domain(&self, req: &Request) -> rblk_fabric::Result<Option<rblk_fabric::Pd>> {
        if !self.fixed.memory_windows {
            return Ok(None);
        }
        let mut domains = self.domains.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = domains.get(req.device()) {
            return Ok(d.clone());
        }
        let pd = req.alloc_pd()?;
        let domain = pd.type2_windows().then_some(pd);
        if domain.is_some() {
            info!(device = req.device(), "memory windows: one registration per volume, one window per QP");
        } else {
            info!(
                device = req.device(),
                "the device has no type 2B memory windows: each session registers its volume in a PD of its own"
            );
        }
        domains.insert(req.device().to_owned(), domain.clone());
        Ok(domain)
    }

    fn session(&self, id: u64) -> Option<Arc<Session>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }
    fn drop_session(&self, s: &Arc<Session>) {
        s.release();
        self.forget_session(s);
    }
    /// Removes `s` from the table (not a later session that happens to have its id).
    fn forget_session(&self, s: &Arc<Session>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        if sessions.get(&s.id).is_some_and(|t| Arc::ptr_eq(t, s)) {
            sessions.remove(&s.id);
        }
    }

    /// A reconnecting OPEN: ends the session `resume` names, if it is alive and the token is
    /// its, before the new session is opened, so that no late WRITE through the old session can
    /// land after the initiator's replay. Its registration goes at once (its rkey stops working,
    /// its open mode is released); its connections are woken and end, destroying their QPs,
    /// and this waits (at most [`REPLACE_WAIT`]) until they have. Any other resume (the target
    /// restarted, the session is gone, a wrong token) touches nothing.
    pub fn replace_session(&self, resume: &Resume) {
        let Some(old) = self.session(resume.session_id).filter(|s| s.token_matches(&resume.token)) else {
            info!(
                session = resume.session_id,
                "resume names no live session here (the target restarted, or it ended): nothing to replace"
            );
            return;
        };
        let conns = old.replace();
        self.forget_session(&old);
        {
            let wakers = self.conns.lock().unwrap_or_else(|p| p.into_inner());
            for conn in &conns {
                if let Some(w) = wakers.get(conn) {
                    w.wake();
                }
            }
        }
        if !old.wait_until_empty(REPLACE_WAIT) {
            warn!(
                session = old.id,
                left = old.connections(),
                "connections of the replaced session did not end within {REPLACE_WAIT:?} (its rkey is revoked)"
            );
        }
        info!("session {} replaced by a reconnect", old.id);
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

/// The daemon.
#[derive(Debug)]
pub struct Server;

/// A running daemon.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    pub(crate) shared: Arc<Shared>,
    listener: Option<thread::JoinHandle<()>>,
    wake_listener: Waker,
    /// The metrics endpoint (stopped with the target).
    metrics: Option<rblk_metrics::Endpoint>,
    /// The admin socket (see [`crate::admin`]).
    admin: Option<crate::admin::Serving>,
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
/// next start (or re-add) may present the same instance.
pub(crate) fn final_flush(identity: &identity::Store, v: &Volume) {
    let Some(b) = v.backing.as_ref().filter(|b| !b.failed()) else { return };
    match b.flush(&v.memory, &[(0, v.size())]) {
        Ok(()) => {
            info!(volume = %v.name, "flushed to {}", b.path().display());
            match b.fingerprint() {
                Ok(fp) => {
                    identity.save(&v.name, &fp, v.instance);
                }
                Err(e) => {
                    warn!(volume = %v.name, error = %e, "cannot examine the backing store: its identity is not kept")
                }
            }
        }
        Err(e) => tracing::error!(volume = %v.name, error = %Chain(&e), "final flush failed"),
    }
}

impl Server {
    /// Checks the configuration ([`Config::check`]), creates the volumes, binds the listener
    /// and starts serving. When it returns, the listener accepts connections.
    pub fn start(cfg: Config) -> Result<Running, StartError> {
        Server::start_with(cfg, &mut |_| {})
    }

    /// [`Server::start`], telling `progress` about each volume before it is created or loaded.
    pub fn start_with(cfg: Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Running, StartError> {
        // Configuration mistakes first: a host without RDMA reports them as such.
        let policy = cfg.check()?;
        if cfg.fabric == Fabric::Verbs {
            let devices = rblk_fabric::list_devices().map_err(StartError::NoDevice)?;
            if !devices.iter().any(|d| cfg.device.as_ref().is_none_or(|want| *want == d.name)) {
                return Err(StartError::NoDevice(rblk_fabric::Error::NoDevice { filter: cfg.device.clone() }));
            }
        }
        let identity = identity::Store::new(cfg.state_dir.clone());
        let mut volumes = HashMap::new();
        let mut refused = HashMap::new();
        let mut specs = HashMap::new();
        let count = cfg.volumes.len();
        for (i, v) in cfg.volumes.iter().enumerate() {
            let durable = v.path.is_some();
            progress(Progress::Loading { name: &v.name, index: i + 1, count, size: v.size, durable });
            match load_volume(v, cfg.block_size, &identity) {
                Ok(vol) => {
                    volumes.insert(v.name.clone(), Arc::new(vol));
                    specs.insert(v.name.clone(), v.clone());
                }
                Err(LoadError::Memory(source)) => return Err(StartError::Volume { name: v.name.clone(), source }),
                // A bad backing store refuses that volume, not the daemon.
                Err(LoadError::Backing(e)) => {
                    let reason = Chain(&e).to_string();
                    tracing::error!(volume = %v.name, "refusing the volume: {reason}");
                    refused.insert(v.name.clone(), reason);
                }
            }
        }
        if volumes.is_empty() {
            return Err(StartError::NoVolumes(refused.into_values().collect::<Vec<_>>().join("; ")));
        }
        let listener = Listener::bind(cfg.fabric, cfg.listen, cfg.device.as_deref())
            .map_err(|source| StartError::Listen { addr: cfg.listen, source })?;
        let addr = listener.local_addr().unwrap_or(cfg.listen);
        let fixed = Fixed::of(&cfg);
        let shared = Arc::new(Shared {
            catalog: RwLock::new(Catalog { volumes, refused, policy, specs }),
            limits: RwLock::new(Limits::of(&cfg)),
            max_io: cfg.max_io,
            counters: Arc::default(),
            identity,
            unopened: Mutex::default(),
            evicted: Mutex::default(),
            auth_failures: Mutex::default(),
            sessions: Mutex::default(),
            domains: Mutex::default(),
            conns: Mutex::default(),
            // Ids of sessions from before a restart rarely name a live one (their tokens would
            // not match anyway): a resume from then is an ordinary OPEN.
            next_id: AtomicU64::new((u64::from_le_bytes(session::random()) >> 1).max(1)),
            shutdown: AtomicBool::new(false),
            fixed,
            current: Mutex::new(cfg.clone()),
        });
        if !shared.auth_required() {
            warn!("no --key-file and no host keys: this target serves ANY initiator that can reach {addr}");
        }
        for v in shared.catalog().volumes.values() {
            log_serving(v);
        }
        warn_memlock(&shared);
        let metrics = match cfg.metrics {
            Some(at) => {
                let s = Arc::clone(&shared);
                let endpoint = rblk_metrics::Endpoint::serve(at, move || crate::metrics::render(&s))
                    .map_err(|source| StartError::Metrics { addr: at, source })?;
                let bound = endpoint.local_addr();
                info!(%bound, "serving metrics at http://{bound}/metrics");
                Some(endpoint)
            }
            None => None,
        };
        let admin = match &cfg.admin_socket {
            Some(path) => Some(crate::admin::serve(path, Arc::clone(&shared)).map_err(StartError::Admin)?),
            None => None,
        };
        let s = Arc::clone(&shared);
        let wake_listener = listener.waker();
        let listener = thread::Builder::new()
            .name("rblk-listener".into())
            .spawn(move || listen(&s, &listener))
            .expect("spawning the listener thread");
        info!(%addr, "listening");
        Ok(Running { addr, shared, listener: Some(listener), wake_listener, metrics, admin })
    }
}

impl Running {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the metrics endpoint listens, if there is one.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().map(rblk_metrics::Endpoint::local_addr)
    }

    /// The names of the volumes served, sorted.
    pub fn volumes(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.catalog().volumes.keys().cloned().collect();
        names.sort_unstable();
        names
    }

    /// Open sessions.
    pub fn session_count(&self) -> usize {
        self.shared.session_count()
    }

    /// Live connections.
    pub fn connection_count(&self) -> usize {
        self.shared.connection_count()
    }

    /// Bytes of the durable volumes served (what a shutdown writes back).
    pub fn durable_bytes(&self) -> u64 {
        self.shared.catalog().volumes.values().filter(|v| v.backing.is_some()).map(|v| v.size()).sum()
    }

    /// Current registrations and pinned bytes.
    pub fn registrations(&self) -> (u64, u64) {
        let c = &self.shared.counters;
        (c.registrations.load(Ordering::SeqCst), c.pinned_bytes.load(Ordering::SeqCst))
    }

    /// Stops: disconnects every peer, deregisters everything, joins the threads.
    pub fn shutdown(mut self) {
        self.stop();
    }

    /// Where the admin socket is, if there is one.
    pub fn admin_socket(&self) -> Option<&std::path::Path> {
        self.admin.as_ref().map(crate::admin::Serving::path)
    }

    fn stop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        if let Some(admin) = self.admin.take() {
            admin.stop();
        }
        self.wake_listener.wake();
        if let Some(t) = self.listener.take() {
            let _ = t.join();
        }
        // Wakes its accept and joins its thread.
        self.metrics.take();
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop();
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

/// The longest a reconnecting OPEN waits for the replaced session's connections to end.
pub const REPLACE_WAIT: Duration = Duration::from_secs(5);

/// How long the listener sleeps without events (a waker ends it early).
const IDLE: Duration = Duration::from_secs(3600);
/// Back-off after a failed listener wait.
const BACKOFF: Duration = Duration::from_millis(200);

fn listen(shared: &Arc<Shared>, listener: &Listener) {
    let mut threads: Vec<thread::JoinHandle<()>> = Vec::new();
    let mut next_conn = 1u64;
    while !shared.shutdown.load(Ordering::SeqCst) {
        // Sleeps until a CM event or the shutdown waker: nothing to do while idle.
        let event = match listener.next_event(Some(Instant::now() + IDLE)) {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            Err(e) => {
                warn!(error = %Chain(&e), "listener event failed");
                thread::sleep(BACKOFF);
                continue;
            }
        };
        match event {
            ListenerEvent::Request(req) => {
                let conn = next_conn;
                next_conn += 1;
                match admit(shared, req, conn) {
                    Ok(t) => threads.push(t),
                    Err(e) => warn!(conn, error = %Chain(&e), "connection refused"),
                }
            }
            ListenerEvent::Disconnected { conn } => {
                debug!(conn, "peer disconnected");
                if let Some(w) = shared.conns.lock().unwrap_or_else(|p| p.into_inner()).get(&conn) {
                    w.wake();
                }
            }
            ListenerEvent::Established { conn } => debug!(conn, "established"),
            ListenerEvent::Other { conn, event } => debug!(conn, event, "CM event"),
        }
        threads.retain(|t| !t.is_finished());
    }
    for w in shared.conns.lock().unwrap_or_else(|p| p.into_inner()).values() {
        w.wake();
    }
    for t in threads {
        let _ = t.join();
    }
    let sessions: Vec<_> = shared.sessions.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
    for (_, s) in sessions {
        s.release();
    }
    // Graceful shutdown keeps everything written, flushed or not.
    let volumes: Vec<Arc<Volume>> = shared.catalog().volumes.values().cloned().collect();
    for v in volumes {
        final_flush(&shared.identity, &v);
    }
    info!("shut down");
}

/// Why a connect request was refused.
#[derive(Debug, thiserror::Error)]
enum AdmitError {
    #[error("{}: bad connect data", rblk_fabric::AddrDisplay(*peer))]
    ConnectData {
        peer: Option<SocketAddr>,
        #[source]
        source: rblk_proto::ParseError,
    },
    #[error("{}: join of unknown session {session_id} or bad token", rblk_fabric::AddrDisplay(*peer))]
    UnknownSession { peer: Option<SocketAddr>, session_id: u64 },
    #[error("{}: join of session {session_id} that a reconnect replaced", rblk_fabric::AddrDisplay(*peer))]
    Replaced { peer: Option<SocketAddr>, session_id: u64 },
    #[error("{}: {step}", rblk_fabric::AddrDisplay(*peer))]
    Fabric {
        peer: Option<SocketAddr>,
        step: &'static str,
        #[source]
        source: rblk_fabric::Error,
    },
    #[error("no thread for the connection")]
    Thread(#[source] std::io::Error),
}

/// Checks the connect data, creates the QP in the right PD, accepts, and starts the thread.
fn admit(shared: &Arc<Shared>, req: Request, conn: u64) -> Result<thread::JoinHandle<()>, AdmitError> {
    let peer = req.peer();
    let fabric = |step| move |source| AdmitError::Fabric { peer, step, source };
    let (pd, state) = match rblk_proto::parse_connect_data(req.private_data()) {
        Ok(data @ (ConnectData::NewSession | ConnectData::NewWindowSession)) => {
            let domain = match data {
                ConnectData::NewWindowSession => {
                    shared.window_domain(&req).map_err(fabric("allocating the window domain"))?
                }
                _ => None,
            };
            let windows = domain.is_some();
            let pd = match domain {
                Some(pd) => pd,
                None => req.alloc_pd().map_err(fabric("allocating a protection domain"))?,
            };
            (pd.clone(), State::Fresh { pd, windows })
        }
        Ok(ConnectData::Join { session_id, token }) => match shared.session(session_id) {
            Some(s) if s.token_matches(&token) => (s.pd.clone(), State::Joining { session: s }),
            _ => {
                let _ = req.reject();
                return Err(AdmitError::UnknownSession { peer, session_id });
            }
        },
        Err(source) => {
            let _ = req.reject();
            return Err(AdmitError::ConnectData { peer, source });
        }
    };
    let cfg = QpConfig {
        send_depth: rblk_proto::SEND_COUNT as u32 + 2,
        recv_depth: rblk_proto::RECV_COUNT as u32,
        max_inline: 128,
    };
    let mut ep = req.into_endpoint(&pd, &cfg, conn).map_err(fabric("creating the queue pair"))?;
    let mut channel = Channel::new(&pd).map_err(fabric("setting up the control channel"))?;
    channel.post_recvs(&mut ep).map_err(fabric("posting receives"))?;
    ep.accept().map_err(fabric("accepting"))?;
    // The waker first: a reconnect that replaces the session after the join below wakes it.
    shared.conns.lock().unwrap_or_else(|p| p.into_inner()).insert(conn, ep.waker());
    shared.counters.connections_accepted.fetch_add(1, Ordering::Relaxed);
    if state.session().is_none() {
        shared.admit_unopened(conn, peer.map(|p| p.ip()));
    }
    if let Some(s) = state.session() {
        if !s.join(conn) {
            shared.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&conn);
            return Err(AdmitError::Replaced { peer, session_id: s.id });
        }
    }
    let s = Arc::clone(shared);
    thread::Builder::new()
        .name(format!("rblk-conn-{conn}"))
        .spawn(move || serve(&s, conn, ep, channel, state))
        .map_err(AdmitError::Thread)
}

/// One connection: sleep on the completion channel, answer control messages, send keepalives,
/// and end the connection when the initiator is lost (see [`Config::keepalive_timeout`]).
fn serve(shared: &Arc<Shared>, conn: u64, mut ep: Endpoint, mut channel: Channel, mut state: State) {
    let span = info_span!("conn", conn, peer = ?ep.peer(), qpn = ep.qp_num());
    let peer = control::Peer { conn, ip: ep.peer().map(|p| p.ip()) };
    let _enter = span.enter();
    info!("connected");
    // Taken now: a reload's new limits apply to connections admitted after it.
    let limits = shared.limits();
    let timeout = limits.keepalive_timeout;
    // The connection was admitted at its connect request, just now.
    let open_by = Instant::now() + limits.auth_timeout;
    let mut out = [Completion::EMPTY; 16];
    let mut buf = [0u8; MSG_SIZE];
    let mut malformed = 0u32;
    let mut last_heard = Instant::now();
    let mut keepalive_due = Instant::now() + rblk_proto::KEEPALIVE_INTERVAL;
    // SENDs complete in order: our keepalive is done once as many SENDs completed as had been
    // posted up to and including it. (Its number, and when it was posted.)
    let (mut sends_posted, mut sends_done) = (0u64, 0u64);
    let mut keepalive: Option<(u64, Instant)> = None;
    let mut closing = false;
    // Set when the connection ends after its last reply: why, and the latest it waits for the
    // reply's SEND to complete (so that the ERROR it carries is not lost to the disconnect).
    let mut ending: Option<Cow<'static, str>> = None;
    let mut closing_by: Option<Instant> = None;
    let mut counted_open = false;
    let mut tag = 0u32;
    let reason: Cow<'static, str> = 'conn: loop {
        if shared.shutdown.load(Ordering::SeqCst) {
            break "target shutting down".into();
        }
        // Only an initiator that promised keepalives can be silent for too long.
        let hears_keepalives = state.features() & rblk_proto::FEATURE_KEEPALIVE != 0;
        let deadline = [
            Some(keepalive_due),
            hears_keepalives.then(|| last_heard + timeout),
            keepalive.map(|(_, posted)| posted + timeout),
            (!state.is_open()).then_some(open_by),
            closing_by,
        ]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(keepalive_due);
        let n = match ep.wait(&mut out, Duration::ZERO, deadline) {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %Chain(&e), "completion wait failed");
                break "completion error".into();
            }
        };
        if ep.take_wake() && !shared.shutdown.load(Ordering::SeqCst) {
            if shared.evicted.lock().unwrap_or_else(|p| p.into_inner()).remove(&conn) {
                break "evicted: too many connections that opened nothing (the oldest go first)".into();
            }
            if state.session().is_some_and(|s| s.is_replaced()) {
                break "session replaced by a reconnect".into();
            }
            break "peer disconnected".into();
        }
        for c in &out[..n] {
            if !channel::is_control(c.wr_id) {
                // A window bind (the only other work this side posts): a failed one failed the
                // QP, and the reply behind it with the rkey is flushed.
                if !c.status.is_success() {
                    warn!(status = ?c.status, wr_id = c.wr_id, "binding a memory window failed");
                    break 'conn "binding a memory window failed".into();
                }
                continue;
            }
            match channel.on_completion(&mut ep, c, &mut buf) {
                Ok(Event::Sent) => {
                    sends_done += 1;
                    if keepalive.is_some_and(|(number, _)| sends_done >= number) {
                        keepalive = None;
                    }
                    if closing && channel.free_sends() == rblk_proto::SEND_COUNT {
                        break 'conn ending.take().unwrap_or_else(|| "closed by the initiator".into());
                    }
                }
                Ok(Event::Received(len)) => {
                    let (reply, after) = control::handle(shared, &peer, &mut ep, &mut state, &buf[..len]);
                    // Time spent serving a request (a FLUSH's write-back can take minutes) is
                    // neither the initiator's silence (it waits for our reply meanwhile) nor a
                    // stuck keepalive of ours (its completion waits in the CQ, unpolled).
                    last_heard = Instant::now();
                    if let Some((number, _)) = keepalive {
                        keepalive = Some((number, last_heard));
                    }
                    if after == After::AuthFailed {
                        // Slows down key guessing; the connection's own thread is the one held.
                        let delay = shared.auth_failed(peer.ip);
                        if !delay.is_zero() {
                            debug!(?delay, "holding back the AUTH failure");
                            thread::sleep(delay);
                        }
                    }
                    let reply_tag = rblk_proto::peek_tag(&buf[..len]).unwrap_or(0);
                    let sent = match reply {
                        Reply::None => Ok(false),
                        Reply::Msg(m) => channel.send(&mut ep, reply_tag, &m).map(|()| true),
                        Reply::List { total, entries } => channel
                            .send(&mut ep, reply_tag, &Message::ListReply { total, entries: &entries })
                            .map(|()| true),
                        Reply::Error(code, text) => {
                            debug!(?code, %text, "error reply");
                            channel.send(&mut ep, reply_tag, &Message::Error { code, text: &text }).map(|()| true)
                        }
                    };
                    match sent {
                        Ok(posted) => sends_posted += u64::from(posted),
                        Err(e) => {
                            warn!(error = %Chain(&e), "reply failed");
                            break 'conn "reply failed".into();
                        }
                    }
                    match after {
                        After::Continue => {}
                        After::Refused | After::AuthFailed => {
                            shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
                            malformed += 1;
                            if malformed > rblk_proto::MAX_MALFORMED && !closing {
                                // Once the ERROR just posted is out (or a second at most).
                                closing = true;
                                ending = Some("too many malformed or refused messages".into());
                                closing_by = Some(Instant::now() + Duration::from_secs(1));
                            }
                        }
                        After::Close => closing = true,
                    }
                }
                Err(e) => {
                    debug!(error = %Chain(&e), "control completion failed");
                    break 'conn "connection lost".into();
                }
            }
        }
        if !counted_open && state.is_open() {
            counted_open = true;
            shared.opened_or_gone(conn);
        }
        let now = Instant::now();
        if closing_by.is_some_and(|by| now >= by) {
            break ending.take().unwrap_or_else(|| "closed".into());
        }
        if !state.is_open() && now >= open_by {
            break format!("no session opened within {} s of connecting", limits.auth_timeout.as_secs()).into();
        }
        // Loss detection that does not rely on the transport's retry budget (rxe retries for
        // ever with a retry count of 7; a peer without RECVs posted stalls a SEND for ever).
        let now = Instant::now();
        if state.features() & rblk_proto::FEATURE_KEEPALIVE != 0 && now >= last_heard + timeout {
            break format!("initiator silent for {} s", now.duration_since(last_heard).as_secs()).into();
        }
        if keepalive.is_some_and(|(_, posted)| now >= posted + timeout) {
            break format!("keepalive not completed for {} s", timeout.as_secs()).into();
        }
        // Keepalive: one outstanding at a time. A peer that vanished without a disconnect makes
        // it fail with a transport error, which ends the connection above, or stay uncompleted.
        if now >= keepalive_due && !closing {
            keepalive_due = now + rblk_proto::KEEPALIVE_INTERVAL;
            if keepalive.is_none() {
                tag = tag.wrapping_add(1);
                if channel.send(&mut ep, tag, &Message::Keepalive).is_ok() {
                    sends_posted += 1;
                    keepalive = Some((sends_posted, now));
                }
            }
        }
    };
    info!(%reason, "disconnecting");
    if let Some(session) = state.session() {
        session.unbind(conn);
    }
    ep.disconnect();
    // The QP is destroyed before the session counts this connection out: a reconnect that
    // waits for that knows no old QP is left.
    drop(ep);
    drop(channel);
    shared.conns.lock().unwrap_or_else(|p| p.into_inner()).remove(&conn);
    shared.opened_or_gone(conn);
    shared.evicted.lock().unwrap_or_else(|p| p.into_inner()).remove(&conn);
    if let Some(session) = state.session() {
        if session.leave(conn) && !session.is_replaced() {
            info!(session = session.id, "last connection gone: deregistering");
            shared.drop_session(session);
        }
    }
}
