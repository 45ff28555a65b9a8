//! One connection's life: admission of an rdma_cm connect request ([`admit`]: its connect
//! data, its protection domain, its QP, the accept, its thread), then the loop on that thread
//! ([`Connection`]): control messages answered, keepalives sent, the initiator's loss detected,
//! and the end (disconnect, and out of the registry and its session).

use std::borrow::Cow;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::liveness::{Action, Cadence, Liveness, Rules};
use rblk_fabric::{Chain, Completion, Endpoint, QpConfig, Request};
use rblk_proto::{ConnectData, Message, MSG_SIZE};
use tracing::{debug, info, info_span, warn};

use crate::config::Limits;
use crate::control::{self, After, Reply, State, WriteBack};
use crate::registry::Shared;

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
pub(crate) fn admit(shared: &Arc<Shared>, req: Request, conn: u64) -> Result<thread::JoinHandle<()>, AdmitError> {
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
        .spawn(move || serve(s, conn, ep, channel, state))
        .map_err(AdmitError::Thread)
}

/// An optional address as logs show it: the address, or `unknown` (never `Some(..)`).
pub(crate) struct Shown<T>(pub(crate) Option<T>);

impl<T: std::fmt::Display> std::fmt::Display for Shown<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("unknown"),
        }
    }
}

/// Why a connection ends (logged as it disconnects).
type Reason = Cow<'static, str>;

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

/// One connection, served by its own thread: sleep on the completion channel, answer control
/// messages, send keepalives, and end the connection when the initiator is lost (see
/// [`Config::keepalive_timeout`](crate::config::Config::keepalive_timeout)).
struct Connection {
    shared: Arc<Shared>,
    conn: u64,
    peer: control::Peer,
    ep: Endpoint,
    channel: Channel,
    /// Where it is in the control protocol.
    protocol: State,
    phase: Phase,
    /// Taken at admission: a reload's new limits apply to connections admitted after it.
    limits: Limits,
    /// The latest it may open (or join) a session.
    open_by: Instant,
    liveness: Liveness,
    buf: [u8; MSG_SIZE],
    /// SENDs posted and completed. SENDs complete in order: our keepalive is done once as many
    /// SENDs completed as had been posted up to and including it.
    sends_posted: u64,
    sends_done: u64,
    /// The number of our keepalive outstanding.
    keepalive: Option<u64>,
    /// Malformed or refused requests so far.
    malformed: u32,
    /// The registry was told it opened a session.
    counted_open: bool,
    /// Our keepalives' tag.
    tag: u32,
    /// Keepalives sent since the initiator was last heard here (see
    /// [`Connection::quiet_for_flushes`]).
    unheard: usize,
    /// FLUSHes whose write-back runs (off this thread), with their tags, oldest first: they are
    /// answered in order, and keepalives go on meanwhile.
    flushes: VecDeque<(u32, WriteBack)>,
    /// Requests that arrived behind a FLUSH whose write-back runs, other than FLUSH and
    /// KEEPALIVE: served once the FLUSHes are answered, in the order they came.
    deferred: VecDeque<Vec<u8>>,
}

/// Serves connection `conn` until it ends (see [`Connection`]).
fn serve(shared: Arc<Shared>, conn: u64, ep: Endpoint, channel: Channel, state: State) {
    let span = info_span!("conn", conn, peer = %crate::connection::Shown(ep.peer()), qpn = ep.qp_num());
    let peer = control::Peer { conn, ip: ep.peer().map(|p| p.ip()) };
    let _enter = span.enter();
    info!("connected");
    Connection::new(shared, conn, peer, ep, channel, state).run();
}

impl Connection {
    fn new(shared: Arc<Shared>, conn: u64, peer: control::Peer, ep: Endpoint, channel: Channel, state: State) -> Self {
        let limits = shared.limits();
        Connection {
            shared,
            conn,
            peer,
            ep,
            channel,
            protocol: state,
            phase: Phase::Serving,
            limits,
            // The connection was admitted at its connect request, just now.
            open_by: Instant::now() + limits.auth_timeout,
            liveness: Liveness::new(rules(limits.keepalive_timeout), Instant::now()),
            buf: [0u8; MSG_SIZE],
            sends_posted: 0,
            sends_done: 0,
            keepalive: None,
            malformed: 0,
            counted_open: false,
            tag: 0,
            unheard: 0,
            flushes: VecDeque::new(),
            deferred: VecDeque::new(),
        }
    }

    /// Serves until the connection ends, then ends it.
    fn run(mut self) {
        let reason = loop {
            if let Err(reason) = self.step() {
                break reason;
            }
        };
        self.end(reason);
    }

    /// One wake-up: what completed, then the deadlines and loss detection.
    fn step(&mut self) -> Result<(), Reason> {
        if self.shared.is_shutting_down() {
            return Err("target shutting down".into());
        }
        let mut out = [Completion::EMPTY; 16];
        let n = self.wait(&mut out)?;
        for c in &out[..n] {
            self.on_completion(c)?;
        }
        self.answer_flushes()?;
        if !self.counted_open && self.protocol.is_open() {
            self.counted_open = true;
            self.shared.opened_or_gone(self.conn);
        }
        self.check_deadlines()?;
        self.check_liveness()
    }

    /// Only an initiator that promised keepalives can be silent for too long.
    fn hears_keepalives(&self) -> bool {
        self.protocol.features() & rblk_proto::FEATURE_KEEPALIVE != 0
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

    /// Sleeps until completions arrive, a waker wakes it, or the next instant something is due.
    fn wait(&mut self, out: &mut [Completion]) -> Result<usize, Reason> {
        self.liveness.expect_keepalives(self.hears_keepalives());
        let deadline = [(!self.protocol.is_open()).then_some(self.open_by), self.closing_by()]
            .into_iter()
            .flatten()
            .fold(self.liveness.next_check(), Instant::min);
        let n = match self.ep.wait(out, Duration::ZERO, deadline) {
            Ok(n) => n,
            Err(e) => {
                warn!(error = %Chain(&e), "completion wait failed");
                return Err("completion error".into());
            }
        };
        if self.ep.take_wake() && !self.shared.is_shutting_down() {
            if self.protocol.session().is_some_and(|s| s.window_stuck(self.conn)) {
                return Err("the memory window bound to its QP could not be deallocated: disconnecting, so that \
                            the window's rkey dies with the QP"
                    .into());
            }
            if self.shared.take_evicted(self.conn) {
                return Err("evicted: too many connections that opened nothing (the oldest go first)".into());
            }
            if let Some(ended) = self.protocol.session().and_then(|s| s.ended()) {
                return Err(ended.to_string().into());
            }
            if self.shared.take_woken(self.conn) {
                return Err("peer disconnected".into());
            }
            // Else a write-back of ours finished.
        }
        Ok(n)
    }

    fn on_completion(&mut self, c: &Completion) -> Result<(), Reason> {
        if !channel::is_control(c.wr_id) {
            // A window bind (the only other work this side posts): a failed one failed the
            // QP, and the reply behind it with the rkey is flushed.
            if !c.status.is_success() {
                warn!(status = ?c.status, wr_id = c.wr_id, "binding a memory window failed");
                return Err("binding a memory window failed".into());
            }
            return Ok(());
        }
        match self.channel.on_completion(&mut self.ep, c, &mut self.buf) {
            Ok(Event::Sent) => self.on_sent(),
            Ok(Event::Received(len)) => self.on_message(len),
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
        }
        if let Phase::Closing { reason, .. } = &mut self.phase {
            if self.channel.free_sends() == rblk_proto::SEND_COUNT {
                return Err(reason.take().unwrap_or_else(|| "closed by the initiator".into()));
            }
        }
        Ok(())
    }

    /// A control message of `len` bytes arrived in the buffer: handle it and reply, or, behind a
    /// FLUSH whose write-back runs, keep it for later (only FLUSH and KEEPALIVE are handled at
    /// once: the initiator's other requests keep their order with its FLUSHes).
    fn on_message(&mut self, len: usize) -> Result<(), Reason> {
        self.unheard = 0;
        let bytes = &self.buf[..len];
        if !self.flushes.is_empty()
            && !matches!(rblk_proto::parse(bytes), Ok((_, Message::Flush(_) | Message::Keepalive)))
        {
            // As many as our RECVs could hold when requests were served one at a time.
            if self.deferred.len() >= rblk_proto::RECV_COUNT {
                return Err("too many requests behind a FLUSH".into());
            }
            self.deferred.push_back(bytes.to_vec());
            return Ok(());
        }
        let bytes = self.buf;
        self.handle(&bytes[..len])
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
        while self.flushes.is_empty() {
            let Some(bytes) = self.deferred.pop_front() else { break };
            self.handle(&bytes)?;
        }
        Ok(())
    }

    /// Handles one message and replies.
    fn handle(&mut self, bytes: &[u8]) -> Result<(), Reason> {
        let len = bytes.len();
        let (reply, after) = control::handle(&self.shared, &self.peer, &mut self.ep, &mut self.protocol, bytes);
        // Time spent serving a request (an OPEN's registration of a large volume; a FLUSH's
        // write-back runs elsewhere) is neither the initiator's silence (it waits for our reply
        // meanwhile) nor a stuck keepalive of ours (its completion waits in the CQ, unpolled).
        let now = Instant::now();
        self.liveness.heard(now);
        self.liveness.send_progress(now);
        if after == After::AuthFailed {
            // Slows down key guessing; the connection's own thread is the one held.
            let delay = self.shared.auth_failed(self.peer.ip);
            if !delay.is_zero() {
                debug!(?delay, "holding back the AUTH failure");
                thread::sleep(delay);
            }
        }
        if matches!(after, After::Refused | After::AuthFailed) {
            // Counted before the reply goes out: whoever has the reply sees the count.
            self.shared.counters.malformed.fetch_add(1, Ordering::Relaxed);
        }
        let reply_tag = rblk_proto::peek_tag(&bytes[..len]).unwrap_or(0);
        self.reply(reply_tag, reply)?;
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
            Reply::Msg(m) => self.channel.send(&mut self.ep, tag, &m).map(|()| true),
            Reply::List { total, entries } => {
                self.channel.send(&mut self.ep, tag, &Message::ListReply { total, entries: &entries }).map(|()| true)
            }
            Reply::Error(code, text) => {
                debug!(?code, %text, "error reply");
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
        self.liveness.expect_keepalives(self.hears_keepalives());
        let quiet = self.quiet_for_flushes(now);
        let serving = matches!(self.phase, Phase::Serving) && !quiet;
        match self.liveness.poll(now, None, serving) {
            Action::Nothing => Ok(()),
            Action::Silent(silent) => Err(format!("initiator silent for {} s", silent.as_secs()).into()),
            Action::SendStuck(_) => {
                Err(format!("keepalive not completed for {} s", self.limits.keepalive_timeout.as_secs()).into())
            }
            Action::SendKeepalive => {
                self.tag = self.tag.wrapping_add(1);
                if self.channel.send(&mut self.ep, self.tag, &Message::Keepalive).is_ok() {
                    self.sends_posted += 1;
                    self.keepalive = Some(self.sends_posted);
                    self.unheard += 1;
                    self.liveness.send_posted(now);
                }
                Ok(())
            }
        }
    }

    /// Disconnects, and takes the connection out of the registry and of its session.
    fn end(self, reason: Reason) {
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
        shared.opened_or_gone(conn);
        shared.take_evicted(conn);
        shared.take_woken(conn);
        if let Some(session) = protocol.session() {
            if session.leave(conn) && session.ended().is_none() {
                info!(session = session.id, "last connection gone: deregistering");
                shared.drop_session(session);
            }
        }
    }
}
