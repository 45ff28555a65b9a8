//! The daemon's entry point: [`Server::start`] (volumes loaded, the registry built, the
//! rdma_cm listener started), the [`Running`] handle (reload, shutdown), the listener thread,
//! and the connection threads it starts.
//!
//! The configuration and start types are re-exported here, where a program starting a target
//! looks for them.

pub use crate::config::{
    Config, AUTH_TIMEOUT, MAX_AUTH_DELAY, MAX_SESSIONS, MAX_SESSIONS_PER_HOST, MAX_UNOPENED, MAX_UNOPENED_PER_ADDR,
};
pub use crate::start::{Progress, StartError};

use std::borrow::Cow;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::{Chain, Completion, Endpoint, Fabric, Listener, ListenerEvent, QpConfig, Request, Waker};
use rblk_proto::{ConnectData, Message, MSG_SIZE};
use tracing::{debug, info, info_span, warn};

use crate::control::{self, After, Reply, State};
use crate::identity;
use crate::registry::{final_flush, load_volume, log_serving, warn_memlock, Catalog, Shared};
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
    wake_listener: Waker,
    /// The metrics endpoint (stopped with the target).
    metrics: Option<rblk_metrics::Endpoint>,
    /// The admin socket (see [`crate::admin`]).
    admin: Option<crate::admin::Serving>,
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
        let catalog = Catalog { volumes, refused, policy, specs };
        let shared = Arc::new(Shared::new(&cfg, catalog, identity));
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

    /// Applies `new` (see [`crate::reload`]). Errors (nothing changed) when `new` does not pass
    /// [`Config::check`].
    pub fn reload(&self, new: Config) -> Result<ReloadReport, StartError> {
        self.reload_with(new, &mut |_| {})
    }

    /// [`Running::reload`], telling `progress` about each volume before it is loaded.
    pub fn reload_with(&self, new: Config, progress: &mut dyn FnMut(Progress<'_>)) -> Result<ReloadReport, StartError> {
        let mut current = self.shared.current.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.apply(&mut current, new, progress)
    }

    fn stop(&mut self) {
        self.shared.shut_down();
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

/// How long the listener sleeps without events (a waker ends it early).
const IDLE: Duration = Duration::from_secs(3600);
/// Back-off after a failed listener wait.
const BACKOFF: Duration = Duration::from_millis(200);

fn listen(shared: &Arc<Shared>, listener: &Listener) {
    let mut threads: Vec<thread::JoinHandle<()>> = Vec::new();
    let mut next_conn = 1u64;
    while !shared.is_shutting_down() {
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
                shared.wake_connection(conn);
            }
            ListenerEvent::Established { conn } => debug!(conn, "established"),
            ListenerEvent::Other { conn, event } => debug!(conn, event, "CM event"),
        }
        threads.retain(|t| !t.is_finished());
    }
    shared.wake_connections();
    for t in threads {
        let _ = t.join();
    }
    for s in shared.take_sessions() {
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
    shared.add_connection(conn, ep.waker());
    shared.counters.connections_accepted.fetch_add(1, Ordering::Relaxed);
    if state.session().is_none() {
        shared.admit_unopened(conn, peer.map(|p| p.ip()));
    }
    if let Some(s) = state.session() {
        if !s.join(conn) {
            shared.remove_connection(conn);
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
        if shared.is_shutting_down() {
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
        if ep.take_wake() && !shared.is_shutting_down() {
            if shared.take_evicted(conn) {
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
    shared.remove_connection(conn);
    shared.opened_or_gone(conn);
    shared.take_evicted(conn);
    if let Some(session) = state.session() {
        if session.leave(conn) && !session.is_replaced() {
            info!(session = session.id, "last connection gone: deregistering");
            shared.drop_session(session);
        }
    }
}
