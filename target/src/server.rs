//! The daemon's entry point: [`Server::start`] (volumes loaded, the registry built, the
//! workers and the rdma_cm listener started), the [`Running`] handle (reload, shutdown), and
//! the listener thread, which hands each connect request to admission (its connection then
//! runs on a worker) and at shutdown stops the workers and flushes the volumes.
//!
//! The configuration and start types are re-exported here, where a program starting a target
//! looks for them.

pub use crate::config::{
    Config, AUTH_TIMEOUT, MAX_AUTH_DELAY, MAX_SESSIONS, MAX_SESSIONS_PER_HOST, MAX_UNOPENED, MAX_UNOPENED_PER_ADDR,
};
pub use crate::start::{Progress, StartError};

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::{Chain, Fabric, Listener, ListenerEvent};
use rblk_proto::{ConnectData, RejectData};
use tracing::{debug, info, warn};

use crate::admission::{Backlog, Verdict, ADMIT_PATIENCE};
use crate::connection;
use crate::handover::Handed;
use crate::identity;
use crate::registry::{final_flush, load_volume, log_serving, Catalog, Shared};
use crate::reload::ReloadReport;
use crate::volume::{LoadError, Volume};

/// The daemon.
#[derive(Debug)]
pub struct Server;

/// A running daemon.
#[derive(Debug)]
pub struct Running {
    addr: SocketAddr,
    pub(crate) shared: Arc<Shared>,
    listener: Option<thread::JoinHandle<()>>,
    /// The metrics endpoint (stopped with the target).
    metrics: Option<rblk_metrics::Endpoint>,
    /// The admin socket (see [`crate::admin`]).
    admin: Option<crate::admin::Serving>,
    /// After a takeover, until [`Running::finish_takeover`]: what waits for the old daemon to
    /// be gone.
    taken: Option<Box<Taken>>,
}

/// What a successor does once its old daemon is gone (see [`Running::finish_takeover`]).
#[derive(Debug)]
struct Taken {
    /// The old daemon's admin socket, which it removes at exit.
    old_socket: Option<std::path::PathBuf>,
    /// Handed volumes the configuration does not serve (confirm_remove lists them): removed as
    /// a reload removes them.
    leftovers: Vec<Volume>,
    /// The fd store names that held the handover.
    stored: Vec<String>,
    metrics: Option<SocketAddr>,
    admin_socket: Option<std::path::PathBuf>,
}

impl Server {
    /// Checks the configuration ([`Config::check`]), creates the volumes, binds the listener
    /// and starts serving. When it returns, the listener accepts connections.
    pub fn start(cfg: Config) -> Result<Running, StartError> {
        Server::start_with(cfg, &mut |_| {})
    }

    /// [`Server::start`], telling `progress` about each volume before it is created or loaded.
    pub fn start_with(cfg: Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<Running, StartError> {
        Server::start_inner(cfg, progress, None)
    }

    /// Starts as the successor of the daemon that handed its volumes over (see
    /// [`crate::handover`]): the handed volumes the configuration serves are taken (the same
    /// pages, backing stores and instances), the others created or loaded as at a start. When
    /// it returns, the listener accepts connections and the old daemon is exiting; call
    /// [`Running::finish_takeover`] next. On an error the old daemon (when there is one to
    /// tell) serves on.
    pub fn take_over(
        cfg: Config,
        mut handed: Handed,
        progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<Running, StartError> {
        if let Err(e) = handed.check(&cfg) {
            handed.abort(&e.to_string());
            return Err(e.into());
        }
        let started = Server::start_inner(cfg, progress, Some(&mut handed));
        if let Err(e) = &started {
            handed.abort(&Chain(e).to_string());
        }
        started
    }

    fn start_inner(
        cfg: Config,
        progress: &mut dyn FnMut(Progress<'_>),
        mut handed: Option<&mut Handed>,
    ) -> Result<Running, StartError> {
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
            if let Some(taken) = handed.as_deref_mut().and_then(|h| h.take(&v.name)) {
                let taken = taken?;
                let mut spec = v.clone();
                // A configuration that grew the volume: adopted first, then grown (nobody has it
                // open yet). A grow that fails leaves it served at the size handed over.
                if v.size > taken.size() {
                    if let Err(e) = taken.grow(v.size) {
                        tracing::warn!(
                            volume = %v.name,
                            "served at the {} handed over, not grown to {}: {}",
                            rblk_proto::Bytes(taken.size()),
                            rblk_proto::Bytes(v.size),
                            Chain(&e)
                        );
                        spec.size = taken.size();
                    }
                }
                volumes.insert(v.name.clone(), Arc::new(taken));
                specs.insert(v.name.clone(), spec);
                continue;
            }
            let load = || load_volume(v, cfg.block_size, &identity);
            let loaded = match handed.as_deref() {
                Some(h) => h.step(&format!("creating or loading volume {} ({} bytes)", v.name, v.size), load),
                None => load(),
            };
            match loaded {
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
        if volumes.is_empty() && !refused.is_empty() {
            return Err(StartError::NoVolumes(refused.into_values().collect::<Vec<_>>().join("; ")));
        }
        let leftovers = match handed.as_deref_mut() {
            Some(h) => h.take_rest().into_iter().collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let mut listener = Listener::bind_backlog(cfg.fabric, cfg.listen, cfg.device.as_deref(), cfg.listen_backlog)
            .map_err(|source| StartError::Listen { addr: cfg.listen, source })?;
        let addr = listener.local_addr().unwrap_or(cfg.listen);
        let catalog = Catalog { volumes, refused, policy, specs };
        let shared = Arc::new(Shared::new(&cfg, catalog, identity, listener.waker()));
        if !shared.auth_required() {
            warn!("no --key-file and no host keys: this target serves ANY initiator that can reach {addr}");
        }
        for v in shared.catalog().volumes.values() {
            log_serving(v);
        }
        for text in crate::resources::warnings(&cfg) {
            warn!("{text}");
        }
        // A successor serves its metrics and admin socket once the old daemon let them go
        // (Running::finish_takeover).
        let (metrics, admin, taken) = match handed {
            None => (serve_metrics(&shared, cfg.metrics)?, serve_admin(&shared, cfg.admin_socket.as_deref())?, None),
            Some(h) => {
                // The pinning that grows with the volumes, while the old daemon still serves.
                h.register_ahead(&shared);
                // The point of no return: the old daemon disconnects and exits once it answers.
                h.ready()?;
                let taken = Taken {
                    old_socket: h.old_socket().map(Path::to_owned),
                    leftovers,
                    stored: h.stored_names().to_vec(),
                    metrics: cfg.metrics,
                    admin_socket: cfg.admin_socket.clone(),
                };
                (None, None, Some(Box::new(taken)))
            }
        };
        let workers = crate::worker::Workers::start(&shared, cfg.workers).map_err(StartError::Workers)?;
        let s = Arc::clone(&shared);
        let listener = thread::Builder::new()
            .name("rblk-listener".into())
            .spawn(move || listen(&s, &mut listener, workers))
            .expect("spawning the listener thread");
        info!(%addr, "listening");
        Ok(Running { addr, shared, listener: Some(listener), metrics, admin, taken })
    }
}

fn serve_metrics(shared: &Arc<Shared>, at: Option<SocketAddr>) -> Result<Option<rblk_metrics::Endpoint>, StartError> {
    let Some(at) = at else { return Ok(None) };
    let s = Arc::clone(shared);
    let endpoint = rblk_metrics::Endpoint::serve(at, move || crate::metrics::render(&s))
        .map_err(|source| StartError::Metrics { addr: at, source })?;
    let bound = endpoint.local_addr();
    info!(%bound, "serving metrics at http://{bound}/metrics");
    Ok(Some(endpoint))
}

/// What the admin socket's handover requests run: the old daemon's side of a handover.
const HANDOVERS: crate::admin::Handovers =
    crate::admin::Handovers { takeover: crate::handover::give, to_store: crate::handover::give_to_store };

fn serve_admin(shared: &Arc<Shared>, path: Option<&Path>) -> Result<Option<crate::admin::Serving>, StartError> {
    match path {
        Some(path) => Ok(Some(crate::admin::serve(path, Arc::clone(shared), HANDOVERS).map_err(StartError::Admin)?)),
        None => Ok(None),
    }
}

/// How long a successor waits for its old daemon's admin socket to go.
const OLD_SOCKET_WAIT: Duration = Duration::from_secs(60);

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

    /// Bytes FLUSHes wrote back to durable volumes (the `written_back_bytes` metric).
    pub fn written_back_bytes(&self) -> u64 {
        self.shared.counters.written_back_bytes.load(Ordering::SeqCst)
    }

    /// Memory windows whose deallocation failed (the `window_dealloc_failures` metric).
    pub fn window_dealloc_failures(&self) -> u64 {
        self.shared.counters.window_dealloc_failures.load(Ordering::SeqCst)
    }

    /// Asynchronous events of the RDMA devices taken (the `device_events` metric).
    pub fn device_events(&self) -> u64 {
        self.shared.counters.device_events.load(Ordering::SeqCst)
    }

    /// Connect requests rejected busy, told when to come back (the `busy_connects` metric).
    pub fn busy_connects(&self) -> u64 {
        self.shared.counters.busy_connects.load(Ordering::SeqCst)
    }

    /// KEEPALIVEs sent and received, on every connection (the `keepalives_sent` and
    /// `keepalives_received` metrics).
    pub fn keepalives(&self) -> (u64, u64) {
        let c = &self.shared.counters;
        (c.keepalives_sent.load(Ordering::SeqCst), c.keepalives_received.load(Ordering::SeqCst))
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

    /// After [`Server::take_over`]: waits (at most a minute) until the old daemon removed its
    /// admin socket at exit, then serves the metrics endpoint and the admin socket, and removes
    /// the handed volumes the configuration does not serve (a durable one is flushed, as a
    /// reload removes it). Returns the fd store names that held the handover, to be removed
    /// from the store now that this daemon serves ([`crate::handover::forget_stored`]).
    /// Failures here are logged, not fatal: the volumes are served already.
    pub fn finish_takeover(&mut self) -> Vec<String> {
        let Some(taken) = self.taken.take() else { return Vec::new() };
        if let Some(old) = &taken.old_socket {
            let deadline = Instant::now() + OLD_SOCKET_WAIT;
            while std::os::unix::net::UnixStream::connect(old).is_ok() && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
        match serve_metrics(&self.shared, taken.metrics) {
            Ok(m) => self.metrics = m,
            Err(e) => tracing::error!("after the takeover: {}", Chain(&e)),
        }
        match serve_admin(&self.shared, taken.admin_socket.as_deref()) {
            Ok(a) => self.admin = a,
            Err(e) => tracing::error!("after the takeover: {}", Chain(&e)),
        }
        for v in taken.leftovers {
            final_flush(&self.shared.identity, &v);
            info!(volume = %v.name, "handed over but not in the configuration: removed");
        }
        taken.stored
    }

    /// The exit status once the volumes were handed to a successor (0 after `--takeover`,
    /// [`crate::handover::EXIT_HANDED_OVER`] after a handover to the service manager).
    pub fn handed_over(&self) -> Option<u8> {
        self.shared.handed_over()
    }

    /// Runs `f` (once) when the volumes were handed to a successor: the daemon should then
    /// [`Running::shutdown`], which disconnects the sessions without a final flush.
    pub fn on_handed_over(&self, f: impl FnOnce() + Send + 'static) {
        self.shared.on_handed_over(Box::new(f));
    }

    /// Where `rblk-target admin handover` puts the descriptors: the service manager's file
    /// descriptor store (the daemon's `FDSTORE=1`); without one it is refused.
    pub fn set_fd_store(&self, sink: crate::registry::StoreSink) {
        *self.shared.fd_store.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::registry::Sink(sink));
    }

    /// Where the admin socket is, if there is one.
    pub fn admin_socket(&self) -> Option<&std::path::Path> {
        self.admin.as_ref().map(crate::admin::Serving::path)
    }

    /// Applies `new` (see [`crate::reload`]). Errors (nothing changed) when `new` does not pass
    /// [`Config::check`].
    pub fn reload(&self, new: Config) -> Result<ReloadReport, StartError> {
        self.reload_with(new, &mut |_| {})
    }

    /// [`Running::reload`], telling `progress` about each volume before it is loaded.
    /// Refused while a handover is under way, rather than waiting for it (a SIGHUP must not
    /// keep the daemon from its next signal).
    pub fn reload_with(&self, new: Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<ReloadReport, StartError> {
        let mut current = loop {
            match self.shared.current.try_lock() {
                Ok(c) => break c,
                Err(std::sync::TryLockError::Poisoned(p)) => break p.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) if self.shared.handing_over() => {
                    return Err(StartError::HandoverUnderWay)
                }
                // An admin request applying: its turn first.
                Err(std::sync::TryLockError::WouldBlock) => thread::sleep(Duration::from_millis(10)),
            }
        };
        self.shared.apply(&mut current, new, progress)
    }

    fn stop(&mut self) {
        self.shared.shut_down();
        if let Some(admin) = self.admin.take() {
            match self.shared.handed_over() {
                Some(_) => admin.stop_for_successor(),
                None => admin.stop(),
            }
        }
        self.shared.listener_waker.wake();
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

/// One CM or device event: a request joins the backlog (or is turned away busy), the rest is
/// handled at once.
fn on_event(shared: &Arc<Shared>, event: ListenerEvent, backlog: &mut Backlog<Waiting>, busy: &mut Refusals) {
    match event {
        ListenerEvent::Request(req) => {
            // Parsed once, here: the backlog queues JOINs first, and admission reads it.
            let data = rblk_proto::parse_connect_data(req.private_data());
            let join = matches!(data, Ok(ConnectData::Join { .. }));
            if let Verdict::Busy((req, _), after) = backlog.push((req, data), Instant::now(), join) {
                turn_away(shared, req, after, busy);
            }
        }
        ListenerEvent::Disconnected { conn } => {
            debug!(conn, "peer disconnected");
            shared.wake_connection(conn, crate::registry::Wake::Disconnected);
        }
        ListenerEvent::Established { conn } => debug!(conn, "established"),
        ListenerEvent::Other { conn, event } => debug!(conn, event, "CM event"),
        ListenerEvent::Device(e) => shared.device_event(&e),
    }
}

/// A connect request in the listener's backlog, with its connect data parsed.
type Waiting = (rblk_fabric::Request, Result<ConnectData, rblk_proto::ParseError>);

/// Rejects `req` busy, telling it to connect again after `after` (see [`Backlog`]).
fn turn_away(shared: &Shared, req: rblk_fabric::Request, after: Duration, busy: &mut Refusals) {
    shared.counters.busy_connects.fetch_add(1, Ordering::Relaxed);
    let peer = req.peer();
    let retry_after_ms = u32::try_from(after.as_millis()).unwrap_or(u32::MAX);
    let _ = req.reject_with(&RejectData::Busy { retry_after_ms }.to_bytes());
    let told = format!("{}: told to come back in {retry_after_ms} ms", rblk_fabric::AddrDisplay(peer));
    busy.note(None, "connection refused: busy admitting others", &told);
}

/// How long the listener sleeps without events (a waker ends it early).
const IDLE: Duration = Duration::from_secs(3600);
/// Back-off after a failed listener wait.
const BACKOFF: Duration = Duration::from_millis(200);

/// How often, at most, the listener warns of connect requests dropped early or rejected late
/// (see [`Refusals`]).
const CROWDED_WARN_EVERY: Duration = Duration::from_secs(10);

/// Events read off the CM channel in a row before the listener admits the next request: it
/// drains the channel (a storm queues thousands) without being held from admitting forever.
const DRAIN_MAX: usize = 4096;

/// Warns of refused connect requests, at most once per [`CROWDED_WARN_EVERY`] for each kind
/// (a flood or a storm would otherwise write a line per request).
#[derive(Default)]
struct Refusals {
    since_warning: u64,
    warned: Option<Instant>,
}

impl Refusals {
    fn note(&mut self, conn: Option<u64>, what: &str, error: &dyn std::fmt::Display) {
        self.since_warning += 1;
        if self.warned.is_none_or(|w| w.elapsed() >= CROWDED_WARN_EVERY) {
            warn!(conn, %error, "{what} ({} so, since the last such warning)", self.since_warning);
            (self.since_warning, self.warned) = (0, Some(Instant::now()));
        } else {
            debug!(conn, %error, "{what}");
        }
    }
}

fn listen(shared: &Arc<Shared>, listener: &mut Listener, workers: crate::worker::Workers) {
    let mut next_conn = 1u64;
    let (mut crowded, mut busy) = (Refusals::default(), Refusals::default());
    let mut backlog = Backlog::new(ADMIT_PATIENCE);
    let mut late = Vec::new();
    while !shared.is_shutting_down() {
        // A handover closes the port and, if it falls through, reopens it (retried until it
        // works).
        let retry = shared.sync_port(listener);
        // Sleeps until a CM event or the shutdown waker while nothing waits to be admitted.
        let wait = backlog.is_empty().then(|| Instant::now() + if retry { BACKOFF } else { IDLE });
        match listener.next_event(wait) {
            Ok(Some(e)) => on_event(shared, e, &mut backlog, &mut busy),
            Ok(None) => {}
            Err(e) => {
                warn!(error = %Chain(&e), "listener event failed");
                thread::sleep(BACKOFF);
                continue;
            }
        }
        // Every other event already there: disconnects reach their connections at once, and
        // each request's wait is counted from about when it arrived.
        for _ in 0..DRAIN_MAX {
            match listener.next_event(None) {
                Ok(Some(e)) => on_event(shared, e, &mut backlog, &mut busy),
                Ok(None) | Err(_) => break,
            }
        }
        // A handover under way closed the port: what waits goes too, as at a closed port (its
        // initiators come back to the successor, or to this daemon if the handover falls
        // through and it listens again).
        if shared.handing_over() {
            for (req, _) in backlog.take_all() {
                let _ = req.reject();
            }
            continue;
        }
        let next = backlog.next(Instant::now(), &mut late);
        for ((req, _), after) in late.drain(..) {
            turn_away(shared, req, after, &mut busy);
        }
        let Some(((req, data), join)) = next else { continue };
        let conn = next_conn;
        next_conn += 1;
        let started = Instant::now();
        match connection::admit(shared, &workers, req, data, conn) {
            Err(e @ connection::AdmitError::Crowded { .. }) => {
                crowded.note(Some(conn), "connection refused", &Chain(&e));
            }
            Err(e) => warn!(conn, error = %Chain(&e), "connection refused"),
            Ok(()) => backlog.admitted(started.elapsed(), join),
        }
    }
    // Every connection ends, its QP destroyed, before the sessions are released.
    workers.stop();
    for s in shared.take_sessions() {
        s.release();
    }
    // A handover under way decides first (it holds the configuration lock until the successor
    // answered): either the volumes were handed over, or this daemon keeps them and flushes.
    let decided = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    drop(decided);
    if shared.handed_over().is_some() {
        // The successor serves the same pages and writes them back when asked.
        info!("shut down after handing the volumes over: nothing written back here");
        // What is left (unpinning and unmapping the volumes as this thread lets go of them)
        // yields the CPU to the initiators reconnecting to the successor.
        if let Err(e) = rblk_fabric::run_only_when_idle() {
            tracing::debug!(error = %e, "SCHED_IDLE for the teardown");
        }
        return;
    }
    // Graceful shutdown keeps everything written, flushed or not.
    let volumes: Vec<Arc<Volume>> = shared.catalog().volumes.values().cloned().collect();
    for v in volumes {
        final_flush(&shared.identity, &v);
    }
    info!("shut down");
}
