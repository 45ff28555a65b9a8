//! One queue pair to the target: its endpoint, its control channel, and request/reply with tags.
//! Both the session's first QP and every [`Queue`](crate::Queue) are one of these.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rblk_fabric::channel::{self, Channel, Event};
use rblk_fabric::liveness::{Action, Cadence, Liveness, Rules};
use rblk_fabric::{Chain, Completion, DeviceInfo, Endpoint, Fabric, Pd, QpConfig, Route};
use rblk_proto::{
    ChallengeFlags, ConnectData, FlushedFlags, Message, Opcode, Opened, StatsReply, KEEPALIVE_INTERVAL,
    KEEPALIVE_TIMEOUT, MSG_SIZE, NONCE_LEN, RECV_COUNT, SEND_COUNT,
};

use crate::wait::Wait;
use crate::{Error, Result};

/// A reply, copied out of the receive buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
// An OPENED with its segments (issue 44) is about 300 bytes, moved a few times per control
// message: boxing it would allocate on the control path for nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Reply {
    Challenge {
        flags: ChallengeFlags,
        features: u64,
        nonce: [u8; NONCE_LEN],
    },
    Opened(Opened),
    Ok(Opcode),
    /// OK(JOIN) with the joining QP's window rkey, and its segments (with
    /// [`rblk_proto::FEATURE_SEGMENTS`]).
    Joined(u32, Option<rblk_proto::Segments>),
    /// OK(AUTH) with the target's identity and proof (AUTH v2).
    AuthProof {
        target_id: [u8; rblk_proto::TARGET_ID_LEN],
        mac: [u8; rblk_proto::MAC_LEN],
    },
    Flushed(FlushedFlags),
    Stats(StatsReply),
    List {
        total: u32,
        entries: Vec<rblk_proto::ListEntry>,
    },
}

impl Reply {
    pub(crate) fn name(&self) -> String {
        match self {
            Reply::Challenge { .. } => "CHALLENGE".into(),
            Reply::Opened(_) => "OPENED".into(),
            Reply::Ok(op) => format!("OK({op:?})"),
            Reply::Joined(..) => "OK(JOIN) with an rkey".into(),
            Reply::AuthProof { .. } => "OK(AUTH) with the target's proof".into(),
            Reply::Flushed(_) => "FLUSHED".into(),
            Reply::Stats(_) => "STATS_REPLY".into(),
            Reply::List { .. } => "LIST_REPLY".into(),
        }
    }
}

/// What a received control message meant to the waiter.
#[derive(Debug)]
// An OPENED with its segments (issue 44) is about 300 bytes, moved a few times per control
// message: boxing it would allocate on the control path for nothing.
#[allow(clippy::large_enum_variant)]
enum Received {
    /// A reply (or ERROR) with this tag.
    Reply(u32, Result<Reply>),
    /// KEEPALIVE or something unsolicited: nothing to do.
    Nothing,
}

/// Where and how to connect a session's QPs.
#[derive(Debug, Clone)]
pub(crate) struct Dest {
    pub(crate) fabric: Fabric,
    pub(crate) addr: SocketAddr,
    pub(crate) route: Route,
    pub(crate) spin: Duration,
    /// [`Options::wait`](crate::Options::wait).
    pub(crate) wait: Wait,
}

/// How a connected QP is used.
pub(crate) struct Conn {
    // Declaration order is drop order: the QP goes before the buffers it may still point at.
    pub(crate) ep: Endpoint,
    chan: Channel,
    pub(crate) addr: SocketAddr,
    pub(crate) spin: Duration,
    pub(crate) wait: Wait,
    next_tag: u32,
    rx: Box<[u8; MSG_SIZE]>,
    /// Why the connection is unusable, once it is.
    broken: Option<String>,
    /// Loss detection ([`RULES`]): the target sends KEEPALIVE every KEEPALIVE_INTERVAL, so
    /// silence for KEEPALIVE_TIMEOUT means it is gone; so does a SEND of ours without progress
    /// (none of them completed) for as long, even if the transport keeps retrying.
    liveness: Liveness,
    /// Send KEEPALIVE ourselves (the target announced FEATURE_KEEPALIVE).
    keepalives: bool,
    /// A JOINed connection that shares its session's liveness (see
    /// [`Conn::share_session_liveness`]).
    shares: bool,
    /// A request of ours waits for its reply (see [`Conn::set_awaiting`]).
    awaiting: bool,
    /// Broken, its queue pair not cleaned up yet (see [`Conn::mark_broken`]).
    cleanup: bool,
    /// When rdma_cm's events are next looked at (see [`DISCONNECT_CHECK`]).
    next_disconnect_check: Instant,
    /// Over verbs (a port whose state [`Conn::break_with`] can ask).
    verbs: bool,
    /// The last RESIZED that arrived and was not taken yet ([`Conn::take_resized`]).
    resized: Option<(u64, rblk_proto::Segments)>,
}

/// How often a connection asks rdma_cm whether the target disconnected when nothing told it to:
/// a fallback. A disconnect is an event: the endpoint's CM channel ([`Conn::cm_fd`]) is watched
/// by every wait of the connection's owner ([`Endpoint::wait`] itself, the front ends' event
/// loops, which then call [`Conn::take_cm_events`]), and the check looks at what they found
/// without a system call. Asking rdma_cm costs one, and queues run the check on every reap: at
/// depth 1 that was a system call per I/O (under TCG a good part of a round trip).
const DISCONNECT_CHECK: Duration = Duration::from_millis(100);

/// The environment variable that turns the initiator's periodic loss detection off
/// ([`periodic_checks`]).
pub const NO_TICKS_ENV: &str = "RBLK_TEST_NO_TICKS";

/// Whether the initiator looks for a lost target by time, as well as from events: the
/// [`DISCONNECT_CHECK`] fallback, the keepalive rule (silence, a stuck SEND) and the front ends'
/// ticks. False when the environment has `RBLK_TEST_NO_TICKS=1` (read once), for tests that prove
/// a loss is seen from its event alone (docs/tests.md); never for production. Keepalives are
/// still sent when a reap finds one due.
pub fn periodic_checks() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(NO_TICKS_ENV).is_none_or(|v| v != "1"))
}

/// The initiator's loss detection: every SEND watched, a KEEPALIVE at every interval whatever is
/// outstanding, and loss looked for only then (the check runs on every reap).
const RULES: Rules = Rules {
    interval: KEEPALIVE_INTERVAL,
    timeout: KEEPALIVE_TIMEOUT,
    cadence: Cadence::KeepaliveDue,
    one_keepalive: false,
};

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("addr", &self.addr)
            .field("qpn", &self.ep.qp_num())
            .field("broken", &self.broken)
            .finish_non_exhaustive()
    }
}

/// Send queue slots for `data` outstanding data operations plus the control channel's sends.
pub(crate) fn qp_config(data: u32) -> QpConfig {
    // Room for the parts of operations split at segment boundaries, too.
    let send_depth = data + crate::queue::SPLIT_SLACK + SEND_COUNT as u32;
    QpConfig { send_depth, recv_depth: RECV_COUNT as u32, ..QpConfig::default() }
}

impl Conn {
    /// Resolves, posts the control RECVs, and connects with `data` as private data.
    pub(crate) fn connect(
        dest: &Dest,
        pd: Option<&Pd>,
        cfg: &QpConfig,
        data: ConnectData,
        deadline: Instant,
    ) -> Result<Conn> {
        let Dest { fabric, addr, ref route, spin, wait } = *dest;
        let connect_err = |source| Error::Connect { addr, source };
        let mut ep = Endpoint::resolve(fabric, addr, pd, route, cfg, deadline).map_err(connect_err)?;
        let mut chan = Channel::new(&ep.pd()).map_err(connect_err)?;
        // RECVs first: the target may SEND (a keepalive) as soon as it accepts.
        chan.post_recvs(&mut ep).map_err(connect_err)?;
        ep.connect(&data.to_bytes(), deadline).map_err(connect_err)?;
        tracing::debug!(%addr, qpn = ep.qp_num(), kind = ?data.kind(), "connected");
        let now = Instant::now();
        Ok(Conn {
            ep,
            chan,
            addr,
            spin,
            wait,
            next_tag: 1,
            rx: Box::new([0; MSG_SIZE]),
            broken: None,
            liveness: Liveness::new(RULES, now),
            keepalives: false,
            shares: false,
            awaiting: false,
            cleanup: false,
            next_disconnect_check: now,
            verbs: matches!(fabric, Fabric::Verbs),
            resized: None,
        })
    }

    /// The volume's new size and this QP's segments, if a RESIZED arrived since the last call
    /// (the target grew the volume: [`rblk_proto::Message::Resized`]).
    pub(crate) fn take_resized(&mut self) -> Option<(u64, rblk_proto::Segments)> {
        self.resized.take()
    }

    /// Sends KEEPALIVE every KEEPALIVE_INTERVAL from now on (the target announced
    /// FEATURE_KEEPALIVE and then ends connections it does not hear from).
    pub(crate) fn send_keepalives(&mut self, on: bool) {
        self.keepalives = on;
    }

    /// With `on`, every SEND but KEEPALIVE from now on carries the solicited-event flag
    /// ([`rblk_proto::FEATURE_SOLICITED`], negotiated): the target wakes for our requests, and
    /// takes our keepalives at its own pace.
    pub(crate) fn solicit(&mut self, on: bool) {
        self.chan.solicit(on);
    }

    /// Makes this JOINed connection share its session's liveness
    /// ([`rblk_proto::FEATURE_SESSION_KEEPALIVE`]): it sends no KEEPALIVE, and the target's
    /// silence here is not loss as long as the session hears from the target elsewhere
    /// (`session_heard` of [`check_liveness_in`](Self::check_liveness_in)), where the session's
    /// first connection carries the keepalives.
    pub(crate) fn share_session_liveness(&mut self) {
        self.shares = true;
        self.keepalives = false;
    }

    /// Whether the session's hearing of the target counts as this connection's: while a reply
    /// is awaited here ([`Conn::set_awaiting`]), and always once it shares the session's
    /// liveness ([`Conn::share_session_liveness`]). Then callers pass `session_heard` to
    /// [`check_liveness_in`](Self::check_liveness_in).
    pub(crate) fn hears_through_session(&self) -> bool {
        self.awaiting || self.shares
    }

    /// Whether a request sent on this connection waits for its reply. While the target writes a
    /// FLUSH back (off its connection thread) it keeps serving this connection: it sends its
    /// keepalives here, takes ours at once, and holds other requests until the FLUSH is answered.
    /// So the target stays heard here; its silence still is not loss as long as the session is
    /// heard on its other connections (`session_heard` of
    /// [`check_liveness_in`](Self::check_liveness_in)), which covers a target that answers
    /// nothing while a request runs (one that wrote back on its connection thread). No KEEPALIVEs
    /// are sent meanwhile: the target counts the session's running write-back as hearing from
    /// us, and such an older target would take no RECV for them (they would stall on RNR). A
    /// FLUSH is thus bounded by the session's liveness, not by a timeout of its own.
    pub(crate) fn set_awaiting(&mut self, awaiting: bool) {
        self.awaiting = awaiting;
    }

    /// When a message from the target last arrived on this connection.
    pub(crate) fn heard(&self) -> Instant {
        self.liveness.last_heard()
    }

    /// The connection's loss detection and keepalives, after its completions were taken: a
    /// KEEPALIVE when one is due, and the connection broken when the target disconnected, went
    /// silent or a SEND of ours stopped completing for KEEPALIVE_TIMEOUT. `session_heard` is
    /// when the session last heard from the target on any connection (it counts while a reply is awaited here, and
    /// always on a connection that shares its session's liveness).
    pub(crate) fn check_liveness_in(&mut self, session_heard: Option<Instant>) -> Result<()> {
        let checked = self.check_liveness_reporting_first(session_heard);
        if checked.is_err() {
            self.finish_break();
        }
        checked
    }

    /// [`check_liveness_in`](Self::check_liveness_in), except that a disconnect found leaves
    /// the connection [marked](Self::mark_broken) only: the caller reports the loss, then calls
    /// [`finish_break`](Self::finish_break).
    pub(crate) fn check_liveness_reporting_first(&mut self, session_heard: Option<Instant>) -> Result<()> {
        self.alive()?;
        let now = Instant::now();
        self.check_disconnect(now)?;
        let heard_elsewhere = session_heard.filter(|_| self.hears_through_session());
        let reason = match self.liveness.poll(now, heard_elsewhere, self.keepalives && !self.awaiting) {
            Action::Nothing => return Ok(()),
            Action::Silent(_) | Action::SendStuck(_) if !periodic_checks() => return Ok(()),
            Action::Silent(silent) => {
                format!("nothing from the target for {} s (keepalives stopped)", silent.as_secs())
            }
            Action::SendStuck(stuck) => format!("a SEND to the target has not completed for {} s", stuck.as_secs()),
            Action::SendKeepalive => {
                let tag = self.tag();
                return match self.post_send(tag, &Message::Keepalive) {
                    // Control messages are in flight anyway: the target hears from us.
                    Ok(()) | Err(rblk_fabric::Error::QueueFull { .. }) => Ok(()),
                    Err(source) => {
                        self.break_with(format!("sending KEEPALIVE failed: {}", Chain(&source)));
                        Err(Error::Fabric { op: "sending KEEPALIVE", addr: self.addr, source })
                    }
                };
            }
        };
        self.break_with(reason.clone());
        Err(Error::ConnectionLost { addr: self.addr, reason })
    }

    /// Breaks the connection if the target disconnected: a target that went away cleanly (or
    /// whose process died: the kernel disconnects for it) said so, and its QP would only fail
    /// once the retries run out. What the waits took from the CM channel is looked at every
    /// time; rdma_cm itself is asked at most every [`DISCONNECT_CHECK`] (never without
    /// [`periodic_checks`]).
    fn check_disconnect(&mut self, now: Instant) -> Result<()> {
        let mut gone = self.ep.peer_gone();
        if !gone && now >= self.next_disconnect_check && periodic_checks() {
            self.next_disconnect_check = now + DISCONNECT_CHECK;
            gone = self.ep.peer_disconnected();
        }
        if !gone {
            return Ok(());
        }
        let reason = "the target disconnected".to_owned();
        self.mark_broken(reason.clone());
        Err(Error::ConnectionLost { addr: self.addr, reason })
    }

    /// The endpoint's CM event channel while the connection works: readable when rdma_cm has
    /// an event for it (see [`Endpoint::cm_fd`]); then call
    /// [`take_cm_events`](Self::take_cm_events).
    pub(crate) fn cm_fd(&self) -> Option<std::os::fd::RawFd> {
        self.ep.cm_fd()
    }

    /// Takes the events waiting on the CM channel (its descriptor was readable): the next
    /// liveness check acts on a disconnect among them.
    pub(crate) fn take_cm_events(&mut self) {
        if !self.is_broken() {
            self.ep.peer_disconnected();
        }
    }

    /// When [`check_liveness_in`](Self::check_liveness_in) next has something to do.
    pub(crate) fn next_check(&self) -> Instant {
        self.liveness.next_check()
    }

    /// Posts a SEND; the first one posted while none is outstanding starts the stuck clock.
    fn post_send(&mut self, tag: u32, msg: &Message<'_>) -> rblk_fabric::Result<()> {
        let started = (!self.liveness.send_outstanding()).then(Instant::now);
        self.chan.send(&mut self.ep, tag, msg)?;
        if let Some(now) = started {
            self.liveness.send_posted(now);
        }
        Ok(())
    }

    /// Fails with [`Error::ConnectionLost`] once the connection broke.
    pub(crate) fn alive(&self) -> Result<()> {
        match &self.broken {
            None => Ok(()),
            Some(reason) => Err(Error::ConnectionLost { addr: self.addr, reason: reason.clone() }),
        }
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Marks the connection unusable and moves the QP to error, so the NIC lets go of every
    /// buffer still posted (they complete flushed).
    ///
    /// While the local port is down (a link flap) no disconnect request is sent: rxe cannot
    /// route it, and a CM message it cannot route moves the device's GSI QP (QP1) to the error
    /// state for good, after which no rdma_cm connection on the device works again, this
    /// session's reconnects included (scripts/flap-rxe.sh). The request then goes when the
    /// connection is dropped (rdma_destroy_id sends it), which a reconnect does once the link is
    /// back.
    pub(crate) fn break_with(&mut self, reason: impl Into<String>) {
        self.mark_broken(reason);
        self.finish_break();
    }

    /// The first half of [`break_with`](Self::break_with): the connection is unusable from now
    /// on ([`alive`](Self::alive) fails), but its queue pair is left as it is until
    /// [`finish_break`](Self::finish_break), so that whoever noticed the loss can report it
    /// first: the cleanup is two or three system calls, which under TCG put milliseconds
    /// between rdma_cm's event and the loss line (docs/performance.md, a lost target).
    fn mark_broken(&mut self, reason: impl Into<String>) {
        if self.broken.is_none() {
            let reason = reason.into();
            tracing::debug!(addr = %self.addr, qpn = self.ep.qp_num(), %reason, "connection broken");
            self.broken = Some(reason);
            self.cleanup = true;
        }
    }

    /// The second half of [`break_with`](Self::break_with), once: the queue pair to the error
    /// state (everything posted completes flushed), with a disconnect request unless the local
    /// port is down. Nothing when the connection is not broken or was cleaned up already.
    pub(crate) fn finish_break(&mut self) {
        if !std::mem::take(&mut self.cleanup) {
            return;
        }
        if self.verbs && port_down(&self.ep) {
            tracing::debug!(addr = %self.addr, qpn = self.ep.qp_num(), "the port is down: no disconnect request");
            self.ep.vanish();
        } else {
            self.ep.disconnect();
        }
    }

    fn tag(&mut self) -> u32 {
        let tag = self.next_tag;
        // Tag 0 is never used, so a zeroed buffer never matches.
        self.next_tag = self.next_tag.wrapping_add(1).max(1);
        tag
    }

    /// Sends `msg` and waits for the reply with its tag until `deadline`, handling everything
    /// else that arrives meanwhile (keepalives, completions of our SENDs). ERROR becomes
    /// [`Error::Target`]. Only call this with no data operation outstanding on the QP.
    pub(crate) fn call(&mut self, msg: &Message<'_>, deadline: Instant) -> Result<Reply> {
        self.call_checked(msg, deadline, None)
    }

    /// [`call`](Self::call) for a request whose answer may take minutes (FLUSH): no deadline of
    /// its own; it fails when the target is no longer heard, on this connection or, while the
    /// reply is awaited, on any of the session's (`session_heard`, see
    /// [`set_awaiting`](Self::set_awaiting)). `session_heard` is told, about once a second, when
    /// this connection last heard the target, and answers when the session did.
    pub(crate) fn call_heard(
        &mut self,
        msg: &Message<'_>,
        session_heard: &dyn Fn(Instant) -> Instant,
    ) -> Result<Reply> {
        self.awaiting = true;
        let forever = Instant::now() + Duration::from_secs(100 * 365 * 86400);
        let result = self.call_checked(msg, forever, Some(session_heard));
        self.awaiting = false;
        result
    }

    fn call_checked(
        &mut self,
        msg: &Message<'_>,
        deadline: Instant,
        session_heard: Option<&dyn Fn(Instant) -> Instant>,
    ) -> Result<Reply> {
        self.alive()?;
        let started = Instant::now();
        let request = msg.opcode();
        let tag = self.tag();
        loop {
            match self.post_send(tag, msg) {
                Ok(()) => break,
                // Every send buffer in flight: their completions free them.
                Err(rblk_fabric::Error::QueueFull { .. }) => {
                    // Nothing can answer a request not yet sent: whatever arrives is stale.
                    self.wait_one(deadline, started, request)?;
                }
                Err(source) => {
                    self.break_with(format!("sending {request:?} failed: {}", Chain(&source)));
                    return Err(Error::Fabric { op: "sending a control message", addr: self.addr, source });
                }
            }
        }
        loop {
            // With a liveness rule instead of a deadline, look at it every second.
            let step = session_heard.map(|_| deadline.min(Instant::now() + Duration::from_secs(1)));
            match self.wait_one(step.unwrap_or(deadline), started, request) {
                Ok(Some((got, reply))) => {
                    if got == tag {
                        return reply;
                    }
                    tracing::debug!(addr = %self.addr, tag = got, want = tag, "reply to an earlier request ignored");
                }
                Ok(None) => {}
                Err(e) => return Err(e),
            }
            if let Some(heard) = session_heard {
                // Ours goes to the session too: its JOINed connections that share its liveness
                // hear nothing of their own meanwhile.
                self.check_liveness_in(Some(heard(self.liveness.last_heard())))?;
            }
        }
    }

    /// Waits for one completion and handles it; `Some` when it was a reply.
    fn wait_one(
        &mut self,
        deadline: Instant,
        started: Instant,
        request: Opcode,
    ) -> Result<Option<(u32, Result<Reply>)>> {
        let mut out = [Completion::EMPTY; 1];
        let n = match self.ep.wait(&mut out, self.spin, deadline) {
            Ok(n) => n,
            Err(source) => {
                self.break_with(format!("waiting for completions failed: {}", Chain(&source)));
                return Err(Error::Fabric { op: "waiting for a control reply", addr: self.addr, source });
            }
        };
        if n == 0 {
            // The wait ended at the target's disconnect.
            if let Err(e) = self.check_disconnect(Instant::now()) {
                self.finish_break();
                return Err(e);
            }
            if Instant::now() >= deadline && !self.awaiting {
                self.break_with(format!("no reply to {request:?} in time"));
                return Err(Error::Timeout { op: reply_name(request), addr: self.addr, after: started.elapsed() });
            }
            return Ok(None);
        }
        if !channel::is_control(out[0].wr_id) {
            tracing::warn!(addr = %self.addr, wr_id = out[0].wr_id, "data completion while no data was outstanding");
            return Ok(None);
        }
        match self.on_control(&out[0])? {
            Received::Reply(tag, reply) => Ok(Some((tag, reply))),
            Received::Nothing => Ok(None),
        }
    }

    /// Handles a control completion taken by a data waiter: keepalives are dropped; a reply (or
    /// ERROR) comes back with its tag, for the request that sent it. A failed control completion
    /// breaks the connection.
    pub(crate) fn on_control_completion(&mut self, c: &Completion) -> Result<Option<(u32, Result<Reply>)>> {
        match self.on_control(c)? {
            Received::Nothing => Ok(None),
            Received::Reply(tag, reply) => Ok(Some((tag, reply))),
        }
    }

    /// Logs a reply that no request of ours waits for.
    pub(crate) fn unsolicited(&self, tag: u32, reply: &Result<Reply>) {
        tracing::warn!(addr = %self.addr, tag, ?reply, "unsolicited message from the target ignored");
    }

    /// Sends `msg` without waiting for its reply, which a data waiter later takes with its tag
    /// ([`on_control_completion`](Self::on_control_completion)). `None` while every send buffer is
    /// in flight (their completions free them).
    pub(crate) fn post_request(&mut self, msg: &Message<'_>) -> Result<Option<u32>> {
        self.alive()?;
        let tag = self.tag();
        match self.post_send(tag, msg) {
            Ok(()) => Ok(Some(tag)),
            Err(rblk_fabric::Error::QueueFull { .. }) => Ok(None),
            Err(source) => {
                let request = msg.opcode();
                self.break_with(format!("sending {request:?} failed: {}", Chain(&source)));
                Err(Error::Fabric { op: "sending a control message", addr: self.addr, source })
            }
        }
    }

    fn on_control(&mut self, c: &Completion) -> Result<Received> {
        let len = match self.chan.on_completion(&mut self.ep, c, &mut self.rx) {
            Ok(Event::Sent) => {
                if self.chan.free_sends() == SEND_COUNT {
                    self.liveness.sends_done();
                } else {
                    self.liveness.send_progress(Instant::now());
                }
                return Ok(Received::Nothing);
            }
            Ok(Event::Received(len)) => {
                self.liveness.heard(Instant::now());
                len
            }
            Err(source) => {
                let reason = format!("control channel failed: {}", Chain(&source));
                self.break_with(reason.clone());
                return Err(Error::ConnectionLost { addr: self.addr, reason });
            }
        };
        let (tag, msg) = match rblk_proto::parse(&self.rx[..len]) {
            Ok(parsed) => parsed,
            Err(e) => {
                let tag = rblk_proto::peek_tag(&self.rx[..len]).unwrap_or(0);
                let err = Error::Protocol { addr: self.addr, expected: "a valid message", got: e.to_string() };
                return Ok(Received::Reply(tag, Err(err)));
            }
        };
        let reply = match msg {
            Message::Keepalive => return Ok(Received::Nothing),
            Message::Challenge { flags, features, nonce } => Ok(Reply::Challenge { flags, features, nonce }),
            Message::Opened(opened) => Ok(Reply::Opened(opened)),
            Message::Ok { answers } => Ok(Reply::Ok(answers)),
            Message::Joined { rkey, segments } => Ok(Reply::Joined(rkey, segments)),
            Message::Resized { size, segments } => {
                // Unsolicited: the owner of the connection takes it ([`Conn::take_resized`]).
                self.resized = Some((size, segments));
                return Ok(Received::Nothing);
            }
            Message::AuthProof { target_id, mac } => Ok(Reply::AuthProof { target_id, mac }),
            Message::Flushed { flags } => Ok(Reply::Flushed(flags)),
            Message::StatsReply(stats) => Ok(Reply::Stats(stats)),
            Message::ListReply { total, entries } => Ok(Reply::List { total, entries: entries.to_vec() }),
            Message::Error { code, text } => Err(Error::Target {
                addr: self.addr,
                // Filled in with the request by `expect`, which knows it.
                request: Opcode::Error,
                code,
                // Escaped here, once, for every front end that shows it (a target's text may
                // hold terminal escapes).
                text: rblk_proto::printable(text).into_owned(),
            }),
            other => Err(Error::Protocol {
                addr: self.addr,
                expected: "a reply",
                got: format!("{:?} (a request)", other.opcode()),
            }),
        };
        Ok(Received::Reply(tag, reply))
    }

    /// Takes whatever completed (on a QP with no data outstanding), then runs the loss
    /// detection and keepalives ([`check_liveness_in`](Self::check_liveness_in)).
    pub(crate) fn keepalive(&mut self) -> Result<()> {
        self.alive()?;
        let mut out = [Completion::EMPTY; RECV_COUNT];
        loop {
            let n = match self.ep.poll(&mut out) {
                Ok(n) => n,
                Err(source) => {
                    self.break_with(format!("polling failed: {}", Chain(&source)));
                    return Err(Error::Fabric { op: "polling completions", addr: self.addr, source });
                }
            };
            for c in &out[..n] {
                if channel::is_control(c.wr_id) {
                    if let Some((tag, reply)) = self.on_control_completion(c)? {
                        self.unsolicited(tag, &reply);
                    }
                }
            }
            if n < out.len() {
                break;
            }
        }
        // The caller reports a loss, then cleans up ([`Link::run_control`](crate::link)).
        self.check_liveness_reporting_first(None)
    }

    /// [`call`](Self::call), then checks the reply is the one `request` expects.
    pub(crate) fn expect<T>(
        &mut self,
        msg: &Message<'_>,
        deadline: Instant,
        expected: &'static str,
        pick: impl FnOnce(Reply) -> Option<T>,
    ) -> Result<T> {
        let reply = self.call(msg, deadline);
        self.picked(msg.opcode(), reply, expected, pick)
    }

    /// [`call_heard`](Self::call_heard), then checks the reply is the one `request` expects.
    pub(crate) fn expect_heard<T>(
        &mut self,
        msg: &Message<'_>,
        session_heard: &dyn Fn(Instant) -> Instant,
        expected: &'static str,
        pick: impl FnOnce(Reply) -> Option<T>,
    ) -> Result<T> {
        let reply = self.call_heard(msg, session_heard);
        self.picked(msg.opcode(), reply, expected, pick)
    }

    fn picked<T>(
        &self,
        request: Opcode,
        reply: Result<Reply>,
        expected: &'static str,
        pick: impl FnOnce(Reply) -> Option<T>,
    ) -> Result<T> {
        match reply {
            Ok(reply) => {
                let got = reply.name();
                pick(reply).ok_or(Error::Protocol { addr: self.addr, expected, got })
            }
            Err(Error::Target { addr, code, text, .. }) => Err(Error::Target { addr, request, code, text }),
            Err(e) => Err(e),
        }
    }
}

/// Whether the port `ep` uses is known to be down. Asked only when a connection breaks.
fn port_down(ep: &Endpoint) -> bool {
    rblk_fabric::list_devices().is_ok_and(|devices| listed_down(&devices, ep.pd().device(), ep.port()))
}

/// Whether `devices` lists `port` of `device` as not ACTIVE; a device or port not listed counts
/// as up (the disconnect request is sent, as before).
fn listed_down(devices: &[DeviceInfo], device: &str, port: u8) -> bool {
    let found = devices.iter().find(|d| d.name == device).and_then(|d| d.ports.iter().find(|p| p.port == port));
    found.is_some_and(|p| !p.active)
}

fn reply_name(request: Opcode) -> &'static str {
    match request {
        Opcode::Hello => "waiting for CHALLENGE",
        Opcode::Auth => "waiting for OK(AUTH)",
        Opcode::Open => "waiting for OPENED",
        Opcode::Join => "waiting for OK(JOIN)",
        Opcode::Flush => "waiting for FLUSHED",
        Opcode::Stats => "waiting for STATS_REPLY",
        Opcode::Close => "waiting for OK(CLOSE)",
        _ => "waiting for a reply",
    }
}

#[cfg(test)]
mod tests {
    use rblk_fabric::{DeviceInfo, PortInfo};

    use super::listed_down;

    fn device(name: &str, ports: &[(u8, bool)]) -> DeviceInfo {
        let ports = ports
            .iter()
            .map(|&(port, active)| PortInfo {
                port,
                active,
                state: if active { "Active" } else { "Down" }.into(),
                addrs: Vec::new(),
                link_layer: "Ethernet".into(),
                active_mtu: 4096,
                netdevs: Vec::new(),
                gid_types: Vec::new(),
            })
            .collect();
        DeviceInfo { name: name.into(), ports }
    }

    #[test]
    fn only_the_connections_own_port_that_is_not_active_counts_as_down() {
        let devices = [device("rxe0", &[(1, true)]), device("mlx5_0", &[(1, true), (2, false)])];
        assert!(listed_down(&devices, "mlx5_0", 2));
        assert!(!listed_down(&devices, "mlx5_0", 1), "the device's other port is down, not this one");
        assert!(!listed_down(&devices, "rxe0", 1));
        assert!(!listed_down(&devices, "rxe1", 1), "an unknown device counts as up");
        assert!(!listed_down(&devices, "rxe0", 2), "an unknown port counts as up");
        assert!(!listed_down(&[], "rxe0", 1));
    }
}
