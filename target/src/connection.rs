//! One connection's life: admission of an rdma_cm connect request ([`admit`]: its connect
//! data, its protection domain, its QP, the accept, and the worker that serves it), then its
//! turns on that worker ([`Connection::turn`]): control messages answered, keepalives sent, the
//! initiator's loss detected; the steps that may block (an OPEN, a CLOSE) handled off the worker
//! ([`Connection::run_parked`]); and the end ([`Connection::end`]: disconnect, and out of the
//! registry and its session).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::liveness::{Action, Cadence, Liveness, Rules};
use rblk_fabric::{Chain, Completion, Endpoint, QpConfig, Request, Waker};
use rblk_proto::{ConnectData, ErrorCode, Message, Opened, MSG_SIZE};
use tracing::{debug, info, info_span, warn};

use crate::admission::Shown;
use crate::config::Limits;
use crate::control::{self, After, Reply, State, WriteBack};
use crate::registry::{Shared, REPLACE_WAIT};
use crate::session::Session;

/// Completions a connection handles per turn, at most; then the others on its worker get
/// theirs before it gets another.
pub(crate) const BUDGET: usize = 16;

/// Where [`admit`] puts a connection: the workers ([`crate::worker`], a driver above this
/// module, implements it).
pub(crate) trait Placement {
    /// The worker a new connection goes to (`joins`: it JOINs a session).
    fn place(&self, joins: bool) -> usize;
    /// The waker of connection `conn` on worker `worker`.
    fn waker(&self, worker: usize, conn: u64) -> Waker;
    /// Hands new connection `conn` to worker `worker`.
    fn hand(&self, worker: usize, conn: Box<Connection>);
    /// A completion queue of worker `worker` on `pd`'s device with room for one more QP (made
    /// there if it has none), or None: the QP gets a CQ of its own (the in-memory fabric, or
    /// making one failed). With `receives` (`pd` is the device's memory-window domain, shared by
    /// every such session), the CQ has a shared receive queue in `pd` (made at its first such
    /// QP): the QP's control channel takes its receive buffers from there, not 64 KiB of its own.
    fn shared_cq(&self, worker: usize, pd: &rblk_fabric::Pd, receives: bool) -> Option<rblk_fabric::SharedCq>;
}

/// Why a connect request was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AdmitError {
    #[error("{}: bad connect data", rblk_fabric::AddrDisplay(*peer))]
    ConnectData {
        peer: Option<SocketAddr>,
        #[source]
        source: rblk_proto::ParseError,
    },
    #[error("{}: join of unknown session {session_id} or bad token", rblk_fabric::AddrDisplay(*peer))]
    UnknownSession { peer: Option<SocketAddr>, session_id: u64 },
    #[error("{}: join of session {session_id}, which ended (replaced by a reconnect, or revoked by a reload)", rblk_fabric::AddrDisplay(*peer))]
    Replaced { peer: Option<SocketAddr>, session_id: u64 },
    #[error("{}: {why}", rblk_fabric::AddrDisplay(*peer))]
    Crowded { peer: Option<SocketAddr>, why: crate::admission::Crowded },
    #[error("{}: {step}", rblk_fabric::AddrDisplay(*peer))]
    Fabric {
        peer: Option<SocketAddr>,
        step: &'static str,
        #[source]
        source: rblk_fabric::Error,
    },
}

/// Checks the connect data (`data`, parsed from `req`'s by the listener), creates the QP in the
/// right PD, accepts, and hands the connection to the worker with the fewest. A connection that
/// is not a JOIN takes a place among those that have not authenticated yet (see
/// [`crate::admission`]) first, before anything is allocated for it, and gives it back if it
/// cannot be set up.
pub(crate) fn admit(
    shared: &Arc<Shared>,
    workers: &dyn Placement,
    req: Request,
    data: Result<ConnectData, rblk_proto::ParseError>,
    conn: u64,
) -> Result<(), AdmitError> {
    let new = matches!(data, Ok(ConnectData::NewSession | ConnectData::NewWindowSession));
    if new {
        if let Err(why) = shared.admit_unauthenticated(conn, req.peer().map(|p| p.ip())) {
            shared.counters.crowded.fetch_add(1, Ordering::Relaxed);
            let peer = req.peer();
            let _ = req.reject();
            return Err(AdmitError::Crowded { peer, why });
        }
    }
    let admitted = set_up(shared, workers, req, data, conn);
    if admitted.is_err() && new {
        shared.authenticated_or_gone(conn);
    }
    admitted
}

fn set_up(
    shared: &Arc<Shared>,
    workers: &dyn Placement,
    req: Request,
    data: Result<ConnectData, rblk_proto::ParseError>,
    conn: u64,
) -> Result<(), AdmitError> {
    let peer = req.peer();
    let fabric = |step| move |source| AdmitError::Fabric { peer, step, source };
    // The admission's stages, timed (a debug line per connection: what the listener thread
    // spends on each connect request, in a reconnect storm one after another).
    let t0 = Instant::now();
    let (pd, state) = match data {
        Ok(data @ (ConnectData::NewSession | ConnectData::NewWindowSession)) => {
            let domain = match data {
                ConnectData::NewWindowSession => {
                    shared.window_domain(req.device()).map_err(fabric("allocating the window domain"))?
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
            Some(s) if s.token_matches(&token) => match shared.join_cap_reached(&s) {
                None => (s.pd.clone(), State::Joining { session: s }),
                // Answered at its JOIN: an ERROR the initiator shows, not a bare reject.
                Some(reason) => (s.pd.clone(), State::JoinRefused { reason }),
            },
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
    let t_pd = Instant::now();
    // Placed first: its QP's completions go to that worker's shared CQ.
    let worker = workers.place(state.joins());
    let cq = workers.shared_cq(worker, &pd, shared.is_window_domain(req.device(), &pd));
    let mut ep = req.into_endpoint_shared(&pd, &cfg, conn, cq.as_ref()).map_err(fabric("creating the queue pair"))?;
    let t_qp = Instant::now();
    let mut channel = Channel::for_endpoint(&ep).map_err(fabric("setting up the control channel"))?;
    let t_channel = Instant::now();
    channel.post_recvs(&mut ep).map_err(fabric("posting receives"))?;
    let t_recvs = Instant::now();
    ep.accept().map_err(fabric("accepting"))?;
    let t_accept = Instant::now();
    let us = |a: Instant, b: Instant| b.saturating_duration_since(a).as_micros();
    debug!(
        conn,
        pd_us = us(t0, t_pd),
        qp_us = us(t_pd, t_qp),
        channel_us = us(t_qp, t_channel),
        recvs_us = us(t_channel, t_recvs),
        accept_us = us(t_recvs, t_accept),
        "admission stages"
    );
    // Every wake-up of the connection (a disconnect, an eviction, its write-backs, its
    // session's end) goes through its worker.
    ep.set_waker(workers.waker(worker, conn));
    // The waker first: a reconnect that replaces the session after the join below wakes it.
    shared.add_connection(conn, ep.qp_num(), ep.waker());
    shared.counters.connections_accepted.fetch_add(1, Ordering::Relaxed);
    if let Some(s) = state.session() {
        if !s.join(conn) {
            shared.remove_connection(conn);
            return Err(AdmitError::Replaced { peer, session_id: s.id });
        }
        shared.connection_joined(conn, s);
    }
    let span = info_span!("conn", conn, peer = %Shown(ep.peer()), qpn = ep.qp_num());
    span.in_scope(|| info!(worker, "connected"));
    let peer = control::Peer { conn, ip: ep.peer().map(|p| p.ip()), probe: true };
    workers.hand(worker, Box::new(Connection::new(Arc::clone(shared), conn, peer, ep, channel, state, span)));
    Ok(())
}

/// Why a connection ends (logged as it disconnects).
pub(crate) type Reason = Cow<'static, str>;

/// Where a connection is in its life (where it is in the control protocol is its
/// [`control::State`]).
#[derive(Debug)]
enum Phase {
    /// Answering requests and sending keepalives.
    Serving,
    /// Its last reply is posted: it ends once every SEND of ours has completed (so that the
    /// ERROR a reply may carry is not lost to the disconnect), and no keepalive goes out meanwhile.
    Closing {
        /// Why it ends; None: the initiator's CLOSE.
        reason: Option<Reason>,
        /// The latest it waits for the SENDs; None: no limit but loss detection's.
        by: Option<Instant>,
    },
}

/// The target's loss detection (see [`Config::keepalive_timeout`]): only its own keepalives
/// are watched, one outstanding at a time, and loss is looked for at every wake-up.
///
/// [`Config::keepalive_timeout`]: crate::config::Config::keepalive_timeout
fn rules(timeout: Duration) -> Rules {
    Rules { interval: rblk_proto::KEEPALIVE_INTERVAL, timeout, cadence: Cadence::EveryPoll, one_keepalive: true }
}

/// One connection, driven by its worker ([`crate::worker`]): each [`turn`](Connection::turn)
/// answers what arrived (at most [`BUDGET`] completions), sends keepalives, detects the
/// initiator's loss (see [`Config::keepalive_timeout`](crate::config::Config::keepalive_timeout)),
/// and says when it wants its next turn. Nothing in a turn waits.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    conn: u64,
    peer: control::Peer,
    ep: Endpoint,
    channel: Channel,
    /// Its span (connection id, peer, QP number), entered for each turn.
    pub(crate) span: tracing::Span,
    /// Where it is in the control protocol.
    protocol: State,
    phase: Phase,
    /// Taken at admission: a reload's new limits apply to connections admitted after it.
    limits: Limits,
    /// The latest it may open (or join) a session.
    open_by: Instant,
    liveness: Liveness,
    /// SENDs posted and completed. SENDs complete in order: our keepalive is done once as many
    /// SENDs completed as had been posted up to and including it.
    sends_posted: u64,
    sends_done: u64,
    /// The number of our keepalive outstanding.
    keepalive: Option<u64>,
    /// Malformed or refused requests so far.
    malformed: u32,
    /// The registry was told it authenticated (see [`crate::admission`]).
    counted_open: bool,
    /// Our keepalives' tag.
    tag: u32,
    /// Keepalives sent since the initiator was last heard here (see
    /// [`Connection::quiet_for_flushes`]).
    unheard: usize,
    /// It came to join a session (its connect data named one), rather than to open one: once
    /// open, it is one of the session's JOINed connections.
    joins: bool,
    /// The initiator sent a KEEPALIVE on it: it keeps keepalives of its own even where it could
    /// share its session's (see [`Connection::shares_session_liveness`]).
    own_keepalives: bool,
    /// FLUSHes whose write-back runs (off the worker), with their tags, oldest first: they are
    /// answered in order, and keepalives go on meanwhile.
    flushes: VecDeque<(u32, WriteBack)>,
    /// Requests that arrived while an earlier one waits (a FLUSH's write-back, a held AUTH
    /// failure, a reconnect's replacement), other than FLUSH and KEEPALIVE: served once it is
    /// answered, in the order they came.
    deferred: VecDeque<Vec<u8>>,
    /// A request to handle off the worker ([`Connection::run_parked`]): its handling may block.
    parked: Option<Vec<u8>>,
    /// What [`Connection::run_parked`] made of it: the request, its reply and what follows.
    handled: Option<(Vec<u8>, Reply, After)>,
    /// An AUTH failure's ERROR held back until its instant (see [`Shared::auth_failed`]).
    held: Option<Held>,
    /// An OPEN waiting to be handled again: for the connections of the session it replaces
    /// to end, or for the silent sessions it probed at its host's cap.
    replacing: Option<Replacing>,
    /// Completions may be left: its last turn used up its budget.
    more: bool,
    /// Its QP was told its peer solicits ([`Connection::note_solicits`]).
    solicits: bool,
    /// Window binds posted whose completion was not taken yet (at most [`BIND_SLACK`]).
    binds: u32,
    /// OPENED or JOINED, waiting for the QP's windows to be bound (see
    /// [`Connection::sync_windows`]).
    unbound_reply: Option<(u32, Reply, After)>,
    /// The volume size the initiator was last told on this QP (OPENED, JOINED, RESIZED); 0
    /// before.
    told: u64,
}

/// Window binds a connection has on its send queue at once: the send queue's room beyond the
/// control channel's [`rblk_proto::SEND_COUNT`] SENDs, so its completion queue share holds
/// every completion (see `QpConfig` in [`admit`]).
const BIND_SLACK: u32 = 2;

/// An AUTH failure's reply, held back.
struct Held {
    until: Instant,
    tag: u32,
    reply: Reply,
    after: After,
}

/// An OPEN handled again once the sessions it waits for have no connection left, or at `by`:
/// a reconnect's old session, whose connections are ending (see [`Shared::replace_session`]),
/// or the silent sessions probed at its host's cap (see
/// [`Shared::probe_silent_sessions`]), whose vanished initiators' connections end.
struct Replacing {
    old: Vec<Arc<Session>>,
    by: Instant,
    open: Vec<u8>,
    /// Waiting for probed sessions (not a replaced one).
    probed: bool,
}

/// What a connection wants after a turn.
pub(crate) enum Turn {
    /// Its next turn at completions, a wake-up, or `until`; `more`: completions may be left
    /// (its budget ran out), so it runs again in the worker's next round.
    Wait { until: Instant, more: bool },
    /// It has a request whose handling may block: [`Connection::run_parked`] handles it off
    /// the worker, and the connection comes back to it for its next turn.
    Park,
    /// It ends ([`Connection::end`]).
    End(Reason),
}

/// How soon a connection that has nothing due is looked at again, at least (a keepalive due
/// while none may go out would otherwise make it due at once, again and again).
const MIN_TICK: Duration = Duration::from_millis(50);

/// Requests whose handling may block the worker (a volume's registration, a session's
/// deregistration): handled by [`Connection::run_parked`].
fn off_the_worker(bytes: &[u8]) -> bool {
    matches!(rblk_proto::parse(bytes), Ok((_, Message::Open { .. } | Message::Close)))
}

impl Connection {
    fn new(
        shared: Arc<Shared>,
        conn: u64,
        peer: control::Peer,
        ep: Endpoint,
        channel: Channel,
        state: State,
        span: tracing::Span,
    ) -> Self {
        let limits = shared.limits();
        let joins = state.joins();
        Connection {
            shared,
            conn,
            peer,
            ep,
            channel,
            span,
            protocol: state,
            phase: Phase::Serving,
            limits,
            // The connection was admitted at its connect request, just now.
            open_by: Instant::now() + limits.auth_timeout,
            liveness: Liveness::new(rules(limits.keepalive_timeout), Instant::now()),
            sends_posted: 0,
            sends_done: 0,
            keepalive: None,
            malformed: 0,
            counted_open: false,
            tag: 0,
            unheard: 0,
            joins,
            own_keepalives: false,
            flushes: VecDeque::new(),
            deferred: VecDeque::new(),
            parked: None,
            handled: None,
            held: None,
            replacing: None,
            more: false,
            solicits: false,
            binds: 0,
            unbound_reply: None,
            told: 0,
        }
    }

    /// The connection's id.
    pub(crate) fn id(&self) -> u64 {
        self.conn
    }

    /// Whether it came to JOIN a session (else it is a session's first, which carries the
    /// session's keepalives).
    pub(crate) fn joins(&self) -> bool {
        self.joins
    }

    /// The descriptor its worker waits on: readable once a completion arrived after the last
    /// turn armed it.
    pub(crate) fn event_fd(&self) -> std::os::fd::RawFd {
        self.ep.event_fd()
    }

    /// Whether its completions come through its worker's shared CQ (which the worker watches)
    /// rather than [`Connection::event_fd`].
    pub(crate) fn shares_cq(&self) -> bool {
        self.ep.shares_cq()
    }

    /// One turn: `woken` when a waker fired for it (see [`Connection::check_wakes`]).
    /// Messages are copied into `scratch` and handled from there: one buffer for every
    /// connection of a worker (two of their own were 8 KiB of each idle connection's memory).
    pub(crate) fn turn(&mut self, woken: bool, scratch: &mut [u8; MSG_SIZE]) -> Turn {
        match self.serve(woken, scratch) {
            Err(reason) => Turn::End(reason),
            Ok(()) if self.parked.is_some() => Turn::Park,
            Ok(()) => Turn::Wait { until: self.next_turn(), more: self.more },
        }
    }

    fn serve(&mut self, woken: bool, scratch: &mut [u8; MSG_SIZE]) -> Result<(), Reason> {
        if self.shared.is_shutting_down() {
            return Err("target shutting down".into());
        }
        if woken {
            self.check_wakes()?;
        }
        if let Some((request, reply, after)) = self.handled.take() {
            self.finish(&request, reply, after)?;
        }
        self.release_held()?;
        self.check_replacing();
        self.more = false;
        if self.parked.is_none() {
            self.poll(scratch)?;
        }
        self.answer_flushes()?;
        self.sync_windows()?;
        self.note_solicits();
        if !self.counted_open && self.protocol.past_auth(self.shared.auth_required()) {
            self.counted_open = true;
            self.shared.authenticated_or_gone(self.conn);
        }
        self.check_deadlines()?;
        self.check_liveness()
    }

    /// Arms the completion channel (a completion from now on makes it readable), then takes at
    /// most [`BUDGET`] completions: one busy peer does not keep its worker's other connections
    /// waiting.
    fn poll(&mut self, scratch: &mut [u8; MSG_SIZE]) -> Result<(), Reason> {
        let failed = |e: rblk_fabric::Error| {
            warn!(error = %Chain(&e), "completion wait failed");
            Reason::from("completion error")
        };
        self.ep.arm_events().map_err(failed)?;
        let mut taken = 0;
        while taken < BUDGET && self.parked.is_none() {
            let mut one = [Completion::EMPTY; 1];
            if self.ep.poll(&mut one).map_err(failed)? == 0 {
                return Ok(());
            }
            taken += 1;
            self.on_completion(&one[0], scratch)?;
        }
        self.more = taken == BUDGET;
        Ok(())
    }

    /// Once open (OPENED or OK(JOIN) sent) with [`rblk_proto::FEATURE_SOLICITED`] negotiated,
    /// its QP's completions other than solicited requests stop waking the worker
    /// ([`rblk_fabric::Endpoint::peer_solicits`]): they wait for the worker's next wake-up.
    /// Not before: the requests of the handshake (HELLO, a JOIN) may come unsolicited, and
    /// while this QP is loud its shared CQ wakes the worker for every completion.
    fn note_solicits(&mut self) {
        if !self.solicits && self.protocol.is_open() && self.protocol.features() & rblk_proto::FEATURE_SOLICITED != 0 {
            self.solicits = true;
            self.ep.peer_solicits();
        }
    }

    /// Why a waker fired: its window could not be deallocated, it was evicted, its session
    /// ended, or its peer disconnected (else a write-back of its finished, or a replaced
    /// session's last connection left).
    fn check_wakes(&mut self) -> Result<(), Reason> {
        if self.protocol.session().is_some_and(|s| s.window_stuck(self.conn)) {
            return Err("the memory window bound to its QP could not be deallocated: disconnecting, so that the \
                        window's rkey dies with the QP"
                .into());
        }
        let wakes = self.shared.take_wakes(self.conn);
        if let Some(what) = wakes.qp_failed {
            return Err(format!("the RDMA device reported its QP failed ({what})").into());
        }
        if wakes.evicted {
            return Err("evicted: too many connections that have not authenticated (the oldest of the address holding the most go first)".into());
        }
        if let Some(ended) = self.protocol.session().and_then(|s| s.ended()) {
            return Err(ended.to_string().into());
        }
        if wakes.disconnected {
            return Err("peer disconnected".into());
        }
        if wakes.probe {
            debug!("probed: its host is at its session cap and it was silent");
            self.liveness.probe(Instant::now(), crate::registry::PROBE_WAIT);
        }
        Ok(())
    }

    /// Off the worker (the slow-work thread): handles the parked request, which may block (an
    /// OPEN registers a volume, a CLOSE deregisters one). Its next turn sends the reply.
    pub(crate) fn run_parked(&mut self) {
        let Some(request) = self.parked.take() else { return };
        let _enter = self.span.clone().entered();
        let (reply, after) = control::handle(&self.shared, &self.peer, &mut self.ep, &mut self.protocol, &request);
        self.handled = Some((request, reply, after));
    }

    /// The next instant something is due: the open deadline, the closing limit, a held
    /// reply, a replacement's limit, or loss detection's next check.
    fn next_turn(&mut self) -> Instant {
        self.apply_liveness_rules(Instant::now());
        let next = [
            (!self.protocol.is_open()).then_some(self.open_by),
            self.closing_by(),
            self.held.as_ref().map(|h| h.until),
            self.replacing.as_ref().map(|r| r.by),
        ]
        .into_iter()
        .flatten()
        .fold(self.liveness.next_check(), Instant::min);
        let now = Instant::now();
        if next <= now {
            now + MIN_TICK
        } else {
            next
        }
    }

    /// Only an initiator that promised keepalives can be silent for too long.
    fn hears_keepalives(&self) -> bool {
        self.protocol.features() & rblk_proto::FEATURE_KEEPALIVE != 0
    }

    /// The session whose liveness this connection shares, if it does: it JOINed a session with
    /// [`rblk_proto::FEATURE_SESSION_KEEPALIVE`] and its initiator sent no KEEPALIVE on it. Then
    /// it sends no keepalives (a probe's aside) and its initiator's silence is the session's:
    /// the session's first connection carries the keepalives for all of them. Not while a FLUSH
    /// of its own waits: the initiator sends nothing on a connection that awaits a reply, and
    /// hears that its target is alive from our keepalives there (the session's other
    /// connections may be waiting for FLUSHes too, or not be looked at).
    fn shares_session_liveness(&self) -> Option<&Arc<Session>> {
        let features = rblk_proto::FEATURE_KEEPALIVE | rblk_proto::FEATURE_SESSION_KEEPALIVE;
        let shares = self.joins
            && self.protocol.is_open()
            && !self.own_keepalives
            && self.flushes.is_empty()
            && self.protocol.features() & features == features;
        self.protocol.session().filter(|_| shares)
    }

    /// Tells loss detection, before it is asked at `now`, whose keepalives count: a connection
    /// that shares its session's liveness sends none and was heard when the session was.
    fn apply_liveness_rules(&mut self, now: Instant) {
        self.liveness.expect_keepalives(self.hears_keepalives());
        let heard = self.shares_session_liveness().map(|s| now.checked_sub(s.silent_for(now)).unwrap_or(now));
        self.liveness.send_keepalives(heard.is_none());
        if let Some(t) = heard.filter(|&t| t > self.liveness.last_heard()) {
            self.liveness.heard(t);
        }
    }

    /// While a FLUSH of the session waits for its write-back, the initiator's silence is not
    /// loss, on any of the session's connections (see [`Session::flushes`]): it counts from the
    /// end of the last one. Returns true when it is another connection's FLUSH and half our
    /// RECV count of keepalives went unanswered here: then this one sends no more (an initiator
    /// that ticks none of its other queues until the FLUSH is answered reposts no RECVs there,
    /// and would hear the ones waiting in its CQ when it looks again; the FLUSH's own connection
    /// keeps the session watched).
    ///
    /// [`Session::flushes`]: crate::session::Session::flushes
    fn quiet_for_flushes(&mut self, now: Instant) -> bool {
        let Some(session) = self.protocol.session() else { return false };
        let (running, ended) = session.flushes();
        let heard = if running { Some(now) } else { ended };
        if let Some(t) = heard.filter(|&t| t > self.liveness.last_heard()) {
            self.liveness.heard(t);
        }
        running && self.flushes.is_empty() && self.unheard >= rblk_proto::RECV_COUNT / 2
    }

    fn closing_by(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closing { by, .. } => by,
            Phase::Serving => None,
        }
    }

    fn on_completion(&mut self, c: &Completion, scratch: &mut [u8; MSG_SIZE]) -> Result<(), Reason> {
        if !channel::is_control(c.wr_id) {
            // A window bind (the only other work this side posts): a failed one failed the
            // QP, and the reply behind it with the rkey is flushed.
            if !c.status.is_success() {
                warn!(status = ?c.status, wr_id = c.wr_id, "binding a memory window failed");
                return Err("binding a memory window failed".into());
            }
            self.binds = self.binds.saturating_sub(1);
            return Ok(());
        }
        match self.channel.on_completion(&mut self.ep, c, scratch) {
            Ok(Event::Sent) => self.on_sent(),
            Ok(Event::Received(len)) => self.on_message(&scratch[..len]),
            Err(e) => {
                debug!(error = %Chain(&e), "control completion failed");
                Err("connection lost".into())
            }
        }
    }

    /// One of our SENDs completed.
    fn on_sent(&mut self) -> Result<(), Reason> {
        self.sends_done += 1;
        if self.keepalive.is_some_and(|number| self.sends_done >= number) {
            self.keepalive = None;
            self.liveness.sends_done();
            // Acknowledged by the initiator's side: it is there (a probe's answer).
            if let Some(session) = self.protocol.session() {
                session.heard(Instant::now());
            }
        }
        if let Phase::Closing { reason, .. } = &mut self.phase {
            if self.channel.free_sends() == rblk_proto::SEND_COUNT {
                return Err(reason.take().unwrap_or_else(|| "closed by the initiator".into()));
            }
        }
        Ok(())
    }

    /// Whether an earlier request waits for its answer (a FLUSH's write-back, a held AUTH
    /// failure, a replacement, a request handled off the worker): later ones wait behind it.
    fn waiting(&self) -> bool {
        !self.flushes.is_empty() || self.held.is_some() || self.replacing.is_some() || self.parked.is_some()
    }

    /// A control message arrived: handle it and reply, or, behind a request that waits, keep it
    /// for later (only FLUSH and KEEPALIVE are handled at once: the initiator's other requests
    /// keep their order with its FLUSHes).
    fn on_message(&mut self, bytes: &[u8]) -> Result<(), Reason> {
        self.unheard = 0;
        let now = Instant::now();
        self.liveness.heard(now);
        if let Some(session) = self.protocol.session() {
            session.heard(now);
        }
        let parsed = rblk_proto::parse(bytes);
        if matches!(parsed, Ok((_, Message::Keepalive))) {
            self.own_keepalives = true;
            self.shared.counters.keepalives_received.fetch_add(1, Ordering::Relaxed);
        }
        let at_once = matches!(parsed, Ok((_, Message::Flush(_) | Message::Keepalive)))
            && self.held.is_none()
            && self.replacing.is_none();
        if self.waiting() && !at_once {
            // As many as our RECVs could hold when requests were served one at a time.
            if self.deferred.len() >= rblk_proto::RECV_COUNT {
                return Err("too many requests behind a FLUSH".into());
            }
            self.deferred.push_back(bytes.to_vec());
            return Ok(());
        }
        self.handle(bytes)
    }

    /// Answers the FLUSHes whose write-back finished (in order), then serves the requests that
    /// waited behind them.
    fn answer_flushes(&mut self) -> Result<(), Reason> {
        while let Some((tag, flush)) = self.flushes.front() {
            let Some(reply) = control::flushed(&self.shared, flush) else { break };
            let tag = *tag;
            self.flushes.pop_front();
            self.reply(tag, reply)?;
        }
        while !self.waiting() {
            let Some(bytes) = self.deferred.pop_front() else { break };
            self.handle(&bytes)?;
        }
        Ok(())
    }

    /// Handles one message and replies, or parks it for [`Connection::run_parked`].
    fn handle(&mut self, bytes: &[u8]) -> Result<(), Reason> {
        if off_the_worker(bytes) {
            self.parked = Some(bytes.to_vec());
            return Ok(());
        }
        let (reply, after) = control::handle(&self.shared, &self.peer, &mut self.ep, &mut self.protocol, bytes);
        self.finish(bytes, reply, after)
    }

    /// After `request` was handled: the reply goes out, unless a replacement or an AUTH
    /// failure's delay holds it back.
    fn finish(&mut self, request: &[u8], reply: Reply, after: After) -> Result<(), Reason> {
        if let Reply::Replacing(old) = reply {
            debug!(session = old.id, "waiting for the replaced session's connections to end");
            old.when_empty(self.ep.waker());
            let by = Instant::now() + REPLACE_WAIT;
            self.replacing = Some(Replacing { old: vec![old], by, open: request.to_vec(), probed: false });
            return Ok(());
        }
        if let Reply::Probing(old) = reply {
            debug!(sessions = old.len(), "at the host's session cap: waiting for its silent sessions' probes");
            for s in &old {
                s.when_empty(self.ep.waker());
            }
            // Their keepalives' wait, and a tick for their ends to be seen.
            let by = Instant::now() + crate::registry::PROBE_WAIT + MIN_TICK;
            self.replacing = Some(Replacing { old, by, open: request.to_vec(), probed: true });
            self.peer.probe = false;
            return Ok(());
        }
        // Time spent serving a request (an OPEN's registration of a large volume; a FLUSH's
        // write-back runs elsewhere) is neither the initiator's silence (it waits for our reply
        // meanwhile) nor a stuck keepalive of ours (its completion waits in the CQ, unpolled).
        let now = Instant::now();
        self.liveness.heard(now);
        self.liveness.send_progress(now);
        let tag = rblk_proto::peek_tag(request).unwrap_or(0);
        if after == After::AuthFailed {
            // Slows down key guessing; a timer of the connection's, nobody's thread.
            let delay = self.shared.auth_failed(self.peer.ip);
            if !delay.is_zero() {
                debug!(?delay, "holding back the AUTH failure");
                self.held = Some(Held { until: now + delay, tag, reply, after });
                return Ok(());
            }
        }
        self.answer(tag, reply, after)
    }

    /// Sends a held AUTH failure once its time came.
    fn release_held(&mut self) -> Result<(), Reason> {
        if self.held.as_ref().is_some_and(|h| Instant::now() >= h.until) {
            if let Some(Held { tag, reply, after, .. }) = self.held.take() {
                return self.answer(tag, reply, after);
            }
        }
        Ok(())
    }

    /// Once the replaced session's connections are gone (or the wait's limit passed), the OPEN
    /// is handled again (off the worker), and opens the new session.
    fn check_replacing(&mut self) {
        let Some(r) = &self.replacing else { return };
        // A probed session also counts as settled once its initiator answered.
        let settled = |s: &Arc<Session>| {
            s.live() == 0 || (r.probed && s.silent_for(Instant::now()) < crate::registry::PROBE_WAIT)
        };
        if !r.old.iter().all(settled) && Instant::now() < r.by {
            return;
        }
        if !r.probed {
            let old = &r.old[0];
            let left = old.connections();
            if left > 0 {
                warn!(
                    session = old.id,
                    left,
                    "connections of the replaced session did not end within {REPLACE_WAIT:?} (its rkey is revoked)"
                );
            }
            info!("session {} replaced by a reconnect", old.id);
        }
        self.parked = self.replacing.take().map(|r| r.open);
    }

    /// Keeps the QP's access to the volume whole: binds the windows it lacks (after OPEN or
    /// JOIN, or once the volume grew), one at a time within the send queue's slack
    /// ([`BIND_SLACK`]); once the last is posted, sends the OPENED or JOINED that waited for
    /// them, or, when the volume grew past what the initiator was told, a RESIZED to an
    /// initiator that knows segments (with this QP's rkeys). The QP executes its send queue in
    /// order, so each rkey works by the time the message naming it arrives.
    fn sync_windows(&mut self) -> Result<(), Reason> {
        let Some(session) = self.protocol.session().cloned() else { return Ok(()) };
        if session.uses_windows() {
            // Whether the QP has every window it should; unknown while the slack is full.
            let mut whole = false;
            while self.binds < BIND_SLACK {
                match session.bind_next(&mut self.ep, self.conn) {
                    Ok(true) => self.binds += 1,
                    Ok(false) => {
                        whole = true;
                        break;
                    }
                    // Revoked meanwhile: the session's end takes the connection down.
                    Err(crate::session::BindError::Revoked) => return Ok(()),
                    Err(e) => {
                        warn!(session = session.id, error = %Chain(&e), "binding a memory window failed");
                        if let Some((tag, ..)) = self.unbound_reply.take() {
                            let text = Chain(&e).to_string();
                            self.answer_now(tag, Reply::Error(ErrorCode::NoResources, text), After::Close)?;
                            return Ok(());
                        }
                        return Err("binding a memory window failed".into());
                    }
                }
            }
            if !whole && session.unbound(self.conn) {
                // Back as soon as a bind's completion frees the slack: a bind's completion is
                // no solicited event, so it may not wake the worker.
                self.more = true;
                return Ok(());
            }
        }
        if let Some((tag, reply, after)) = self.unbound_reply.take() {
            let Some((size, segments)) = session.reach(self.conn) else { return Ok(()) };
            let reply = match reply {
                Reply::Msg(Message::Opened(o)) => {
                    let first = segments.as_slice()[0];
                    let segments = session.segmented.then_some(segments);
                    Reply::Msg(Message::Opened(Opened {
                        remote_addr: first.remote_addr,
                        rkey: first.rkey,
                        size,
                        segments,
                        ..o
                    }))
                }
                Reply::Msg(Message::Joined { .. }) => {
                    let rkey = segments.as_slice()[0].rkey;
                    Reply::Msg(Message::Joined { rkey, segments: session.segmented.then_some(segments) })
                }
                other => other,
            };
            self.told = size;
            return self.answer_now(tag, reply, after);
        }
        // What the QP reaches is never more than the volume's size: only past what it was told
        // is there anything to tell (most turns stop at this comparison).
        if session.segmented && self.told > 0 && session.volume.size() > self.told {
            if let Some((size, segments)) = session.reach(self.conn).filter(|&(size, _)| size > self.told) {
                if self.channel.free_sends() == 0 {
                    self.more = true;
                    return Ok(());
                }
                debug!(session = session.id, size, "telling the initiator the volume grew");
                self.told = size;
                self.reply(0, Reply::Msg(Message::Resized { size, segments }))?;
            }
        }
        Ok(())
    }

    /// Replies, and does what `after` says; OPENED and JOINED wait for the QP's windows first
    /// ([`Connection::sync_windows`]).
    fn answer(&mut self, tag: u32, reply: Reply, after: After) -> Result<(), Reason> {
        if matches!(reply, Reply::Msg(Message::Opened(_) | Message::Joined { .. })) {
            self.unbound_reply = Some((tag, reply, after));
            return self.sync_windows();
        }
        self.answer_now(tag, reply, after)
    }

    fn answer_now(&mut self, tag: u32, reply: Reply, after: After) -> Result<(), Reason> {
        if matches!(after, After::Refused | After::AuthFailed) {
            // Counted before the reply goes out: whoever has the reply sees the count.
            self.shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
        }
        self.reply(tag, reply)?;
        match after {
            After::Continue => {}
            After::Refused | After::AuthFailed => {
                self.malformed += 1;
                if self.malformed > rblk_proto::MAX_MALFORMED && matches!(self.phase, Phase::Serving) {
                    // Once the ERROR just posted is out (or a second at most).
                    self.phase = Phase::Closing {
                        reason: Some("too many malformed or refused messages".into()),
                        by: Some(Instant::now() + Duration::from_secs(1)),
                    };
                }
            }
            After::Close => {
                if matches!(self.phase, Phase::Serving) {
                    self.phase = Phase::Closing { reason: None, by: None };
                }
            }
        }
        Ok(())
    }

    /// Sends `reply` to the request tagged `tag`.
    fn reply(&mut self, tag: u32, reply: Reply) -> Result<(), Reason> {
        let sent = match reply {
            Reply::None => Ok(false),
            Reply::WriteBack(flush) => {
                self.flushes.push_back((tag, flush));
                Ok(false)
            }
            // Handled in finish().
            Reply::Replacing(_) | Reply::Probing(_) => Ok(false),
            Reply::Msg(m) => self.channel.send(&mut self.ep, tag, &m).map(|()| true),
            Reply::List { total, entries } => {
                self.channel.send(&mut self.ep, tag, &Message::ListReply { total, entries: &entries }).map(|()| true)
            }
            Reply::Error(code, text) => {
                debug!(%code, %text, "error reply");
                self.channel.send(&mut self.ep, tag, &Message::Error { code, text: &text }).map(|()| true)
            }
        };
        match sent {
            Ok(posted) => {
                self.sends_posted += u64::from(posted);
                Ok(())
            }
            Err(e) => {
                warn!(error = %Chain(&e), "reply failed");
                Err("reply failed".into())
            }
        }
    }

    /// A closing connection past its limit, or one that opened nothing in time, ends.
    fn check_deadlines(&mut self) -> Result<(), Reason> {
        let now = Instant::now();
        if let Phase::Closing { reason, by: Some(by) } = &mut self.phase {
            if now >= *by {
                return Err(reason.take().unwrap_or_else(|| "closed".into()));
            }
        }
        if !self.protocol.is_open() && now >= self.open_by {
            return Err(
                format!("no session opened within {} s of connecting", self.limits.auth_timeout.as_secs()).into()
            );
        }
        Ok(())
    }

    /// Loss detection that does not rely on the transport's retry budget, and keepalives: one
    /// outstanding at a time. A peer that vanished without a disconnect makes a keepalive fail
    /// with a transport error, which ends the connection, or stay uncompleted.
    fn check_liveness(&mut self) -> Result<(), Reason> {
        let now = Instant::now();
        self.apply_liveness_rules(now);
        let quiet = self.quiet_for_flushes(now);
        let serving = matches!(self.phase, Phase::Serving) && !quiet;
        match self.liveness.poll(now, None, serving) {
            Action::Nothing => Ok(()),
            Action::Silent(silent) => Err(format!("initiator silent for {} s", silent.as_secs()).into()),
            Action::SendStuck(stuck) if self.liveness.probing() => Err(format!(
                "probed at its host's session cap: keepalive not acknowledged for {} ms (the initiator vanished)",
                stuck.as_millis()
            )
            .into()),
            Action::SendStuck(_) => {
                Err(format!("keepalive not completed for {} s", self.limits.keepalive_timeout.as_secs()).into())
            }
            Action::SendKeepalive => {
                self.tag = self.tag.wrapping_add(1);
                if self.channel.send(&mut self.ep, self.tag, &Message::Keepalive).is_ok() {
                    self.shared.counters.keepalives_sent.fetch_add(1, Ordering::Relaxed);
                    self.sends_posted += 1;
                    self.keepalive = Some(self.sends_posted);
                    self.unheard += 1;
                    self.liveness.send_posted(now);
                }
                Ok(())
            }
        }
    }

    /// Sends the peer a disconnect and moves the QP to the error state, at once; [`end`]
    /// does the rest (and does not disconnect twice).
    ///
    /// [`end`]: Connection::end
    pub(crate) fn disconnect(&mut self) {
        self.ep.disconnect();
        // From now on it no longer counts against its session's caps.
        if let Some(session) = self.protocol.session() {
            session.depart(self.conn);
        }
    }

    /// Disconnects, and takes the connection out of the registry and of its session (off the
    /// worker: destroying a QP, and deregistering a session's volume with its last connection,
    /// may take time).
    pub(crate) fn end(self, reason: Reason) {
        let _enter = self.span.clone().entered();
        info!(%reason, "disconnecting");
        let Connection { shared, conn, mut ep, channel, protocol, flushes, .. } = self;
        for (_, flush) in flushes {
            control::abandoned(&shared, flush);
        }
        if let Some(session) = protocol.session() {
            session.unbind(conn);
        }
        ep.disconnect();
        // The QP is destroyed before the session counts this connection out: a reconnect that
        // waits for that knows no old QP is left.
        drop(ep);
        drop(channel);
        shared.remove_connection(conn);
        shared.authenticated_or_gone(conn);
        if let Some(session) = protocol.session() {
            if session.leave(conn) && session.ended().is_none() {
                info!(session = session.id, "last connection gone: deregistering");
                shared.drop_session(session);
            }
        }
    }
}
