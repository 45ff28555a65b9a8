//! One connection's control protocol: a small state machine fed by received messages. It never
//! touches the data path; it hands out (and takes back) access to volume memory.

use std::sync::Arc;

use rblk_fabric::{Chain, Endpoint, Pd};
use rblk_proto::{
    ChallengeFlags, ErrorCode, Flush, FlushedFlags, Message, Opcode, OpenMode, Opened, ParseError, Resume, StatsReply,
    VolumeFlags, ZeroFlags, NONCE_LEN,
};

pub use crate::persist::FlushHook;
use crate::persist::Job;

use crate::access::{AccessError, Credential};
use crate::registry::{CapReached, Shared};
use crate::session::{self, Grant, Owner, Session};
use crate::volume::Registration;

/// Where a connection is in the protocol.
#[derive(Debug)]
pub enum State {
    /// New session: waiting for HELLO.
    Fresh {
        /// The PD this session will use.
        pd: Pd,
        /// The QP is in the target's window domain (the initiator asked for memory windows and
        /// the device has them): HELLO must announce [`rblk_proto::FEATURE_WINDOWS`], and the
        /// session gets a window per QP.
        windows: bool,
    },
    /// CHALLENGE sent.
    Challenged {
        /// The PD.
        pd: Pd,
        /// Nonce the AUTH must cover.
        nonce: [u8; NONCE_LEN],
        /// Negotiated features: HELLO's and [`rblk_proto::FEATURES`].
        features: u64,
        /// HELLO's and CHALLENGE's words as sent, which AUTH v2 binds.
        words: Words,
    },
    /// Authenticated (or no key configured): may OPEN.
    Ready {
        /// The PD.
        pd: Pd,
        /// Negotiated features.
        features: u64,
        /// The host AUTH named (None: anonymous).
        host: Option<Arc<str>>,
        /// What AUTH proved: OPEN and LIST are refused once a reload changed the key the host
        /// must prove.
        credential: Credential,
    },
    /// A further QP, admitted by its connect data, waiting for JOIN.
    Joining {
        /// The session it claims.
        session: Arc<Session>,
    },
    /// A further QP admitted past a JOIN cap (see [`Shared::join_cap_reached`]): its JOIN is
    /// answered with an ERROR saying which cap, and it ends. Until then it counts as a
    /// connection that opened nothing (its caps and timeout apply), not as its session's.
    JoinRefused {
        /// Why.
        reason: crate::registry::CapReached,
    },
    /// The volume is open (or joined).
    Open {
        /// The session.
        session: Arc<Session>,
    },
    /// CLOSE acknowledged; the connection ends once the reply is sent. Keeps the session (if
    /// any) so that the connection's end still counts it down and forgets it.
    Closed {
        /// The session it had.
        session: Option<Arc<Session>>,
    },
}

/// HELLO's and CHALLENGE's words as they went over the wire (AUTH v2's
/// [`Transcript`](rblk_proto::Transcript) covers them).
#[derive(Debug, Clone, Copy)]
pub struct Words {
    /// HELLO's features.
    pub hello: u64,
    /// CHALLENGE's flags.
    pub flags: u32,
    /// CHALLENGE's features.
    pub offered: u64,
}

/// A reply to send, built from values the handler owns.
#[derive(Debug)]
// An OPENED with its segments (issue 44) is about 300 bytes, moved a few times per control
// message: boxing it would allocate on the control path for nothing.
#[allow(clippy::large_enum_variant)]
pub enum Reply {
    /// Nothing to send.
    None,
    /// A message without borrowed data.
    Msg(Message<'static>),
    /// An ERROR.
    Error(ErrorCode, String),
    /// Nothing yet: the FLUSH's write-back runs; the reply is [`flushed`]'s once it finished.
    WriteBack(WriteBack),
    /// Nothing yet: a reconnecting OPEN ended the session it replaces, whose connections are
    /// still going. The connection handles the same OPEN again once they are gone (or
    /// [`REPLACE_WAIT`](crate::registry::REPLACE_WAIT) passed): the session is forgotten by
    /// then, so that pass opens the new one.
    Replacing(Arc<Session>),
    /// Nothing yet: the OPEN found its host at `max_sessions_per_host` with sessions not
    /// heard from for a keepalive interval, and probed them (see
    /// [`Shared::probe_silent_sessions`]). The connection handles the same OPEN again once
    /// they are gone or answered, or the probe's wait passed; that pass probes no more.
    Probing(Vec<Arc<Session>>),
    /// A LIST_REPLY.
    List {
        /// Volumes the host may open.
        total: u32,
        /// Those from the requested start on, as many as fit.
        entries: Vec<rblk_proto::ListEntry>,
    },
}

/// What the connection loop should do after a message.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    /// Keep serving.
    Continue,
    /// A malformed or refused request: counts towards the limit after which the connection is
    /// cut (its ERROR still goes out first). Refusals caused by the target's own state (a failed
    /// FLUSH, no resources) do not count.
    Refused,
    /// AUTH failed: counts like [`After::Refused`], and the connection holds the ERROR back
    /// for as long as [`Shared::auth_failed`] says.
    AuthFailed,
    /// Send the reply, then end the connection.
    Close,
}

/// The connection a message arrived on.
#[derive(Debug, Clone, Copy)]
pub struct Peer {
    /// The connection's id.
    pub conn: u64,
    /// The initiator's address, where the fabric knows it.
    pub ip: Option<std::net::IpAddr>,
    /// Whether an OPEN at its host's session cap may probe the host's silent sessions first
    /// ([`Reply::Probing`]); false on that OPEN's second pass.
    pub probe: bool,
}

/// Handles one received message (raw bytes, parsed here) in `state`, on connection `conn`,
/// whose QP is `ep` (OPEN and JOIN bind memory windows to it).
pub fn handle(shared: &Shared, peer: &Peer, ep: &mut Endpoint, state: &mut State, bytes: &[u8]) -> (Reply, After) {
    let msg = match rblk_proto::parse(bytes) {
        Ok((_, msg)) => msg,
        Err(ParseError::Version { got, supported }) => {
            return (
                Reply::Error(
                    ErrorCode::VersionMismatch,
                    format!("protocol version {got} is not supported; this target speaks version {supported}"),
                ),
                After::Refused,
            );
        }
        Err(e) => return (Reply::Error(ErrorCode::Malformed, format!("malformed message: {e}")), After::Refused),
    };
    match (msg, &*state) {
        (Message::Keepalive, _) => (Reply::None, After::Continue),
        (Message::Hello { features }, State::Fresh { pd, windows }) => {
            // Windows only where the QP is in the window domain, and there they are a must: a
            // registration of the session's own in the shared domain would work on every QP.
            let offered =
                if *windows { rblk_proto::FEATURES } else { rblk_proto::FEATURES & !rblk_proto::FEATURE_WINDOWS };
            if *windows && features & rblk_proto::FEATURE_WINDOWS == 0 {
                let text = "the connect request asked for memory windows, but HELLO does not announce them".into();
                return (Reply::Error(ErrorCode::Unexpected, text), After::Close);
            }
            let nonce = session::nonce();
            let auth = shared.auth_required();
            let flags = if auth { ChallengeFlags::AUTH_REQUIRED } else { ChallengeFlags::empty() };
            let words = Words { hello: features, flags: flags.bits(), offered };
            *state = State::Challenged { pd: pd.clone(), nonce, features: features & offered, words };
            (Reply::Msg(Message::Challenge { flags, features: offered, nonce }), After::Continue)
        }
        (Message::Auth { host: Some(_), .. }, State::Challenged { features, .. })
            if features & rblk_proto::FEATURE_HOST_ID == 0 =>
        {
            let text = "AUTH names a host, but HELLO did not announce host identities".into();
            (Reply::Error(ErrorCode::Unexpected, text), After::Refused)
        }
        // Acknowledging it would tell a client its key was checked.
        (Message::Auth { host: None, .. }, State::Challenged { .. }) if !shared.auth_required() => (
            Reply::Error(
                ErrorCode::Unexpected,
                "this target has no key: AUTH is not expected (CHALLENGE said so)".into(),
            ),
            After::Refused,
        ),
        (Message::MutualAuth { .. }, State::Challenged { features, .. })
            if features & rblk_proto::FEATURE_MUTUAL_AUTH == 0 =>
        {
            let text = "AUTH v2, but HELLO did not announce mutual authentication".into();
            (Reply::Error(ErrorCode::Unexpected, text), After::Refused)
        }
        (Message::MutualAuth { .. }, State::Challenged { .. }) if !shared.auth_required() => (
            Reply::Error(
                ErrorCode::Unexpected,
                "this target has no key: AUTH is not expected (CHALLENGE said so)".into(),
            ),
            After::Refused,
        ),
        (
            Message::MutualAuth { host, nonce: initiator_nonce, mac },
            State::Challenged { pd, nonce, features, words },
        ) => {
            // The addresses as this side sees them: a relay in between sees others.
            let (Some(target_addr), Some(initiator_addr)) = (ep.local(), ep.peer()) else {
                let text = "AUTH v2 needs the connection's addresses, and the fabric does not know them".into();
                return (Reply::Error(ErrorCode::Unexpected, text), After::Refused);
            };
            let transcript = rblk_proto::Transcript {
                hello_features: words.hello,
                challenge_flags: words.flags,
                challenge_features: words.offered,
                target_nonce: *nonce,
                initiator_nonce,
                host,
                target_addr,
                initiator_addr,
            };
            let proved = {
                let policy = &shared.catalog().policy;
                let proof = policy.authenticate_mutual(&transcript, &mac, &shared.target_id);
                proof.map(|proof| (proof, policy.credential(Some(host)).mutual()))
            };
            match proved {
                Ok((proof, credential)) => {
                    shared.auth_succeeded(peer.ip);
                    let host = Some(Arc::from(host));
                    *state = State::Ready { pd: pd.clone(), features: *features, host, credential };
                    let reply = Message::AuthProof { target_id: shared.target_id, mac: proof };
                    (Reply::Msg(reply), After::Continue)
                }
                // auth_required() was true a moment ago: a reload took every key away since.
                Err(None) => (
                    Reply::Error(ErrorCode::Unexpected, "this target has no key: AUTH is not expected".into()),
                    After::Refused,
                ),
                Err(Some(e)) => {
                    tracing::warn!(peer = %crate::admission::Shown(peer.ip), host, "{e} (AUTH v2)");
                    (Reply::Error(ErrorCode::AuthFailed, e.public_text().into()), After::AuthFailed)
                }
            }
        }
        (Message::Auth { mac, host }, State::Challenged { pd, nonce, features, .. }) => {
            let authenticated = {
                let policy = &shared.catalog().policy;
                policy.authenticate(nonce, &mac, host).map(|()| policy.credential(host))
            };
            match authenticated {
                Ok(credential) => {
                    shared.auth_succeeded(peer.ip);
                    *state =
                        State::Ready { pd: pd.clone(), features: *features, host: host.map(Arc::from), credential };
                    (Reply::Msg(Message::Ok { answers: rblk_proto::Opcode::Auth }), After::Continue)
                }
                Err(e) => {
                    // The log says why; the initiator is told as little (see AuthError::public_text).
                    tracing::warn!(peer = %crate::admission::Shown(peer.ip), host, "{e}");
                    (Reply::Error(ErrorCode::AuthFailed, e.public_text().into()), After::AuthFailed)
                }
            }
        }
        (Message::List { .. }, state) if state.features() & rblk_proto::FEATURE_LIST == 0 && !state.is_fresh() => (
            Reply::Error(ErrorCode::Unexpected, "LIST, but HELLO did not announce the list feature".into()),
            After::Refused,
        ),
        (Message::Open { .. } | Message::List { .. }, State::Challenged { pd, features, .. })
            if !shared.auth_required() =>
        {
            // No key configured and no host named: HELLO was enough, for an anonymous host.
            *state = State::Ready { pd: pd.clone(), features: *features, host: None, credential: Credential::NONE };
            handle(shared, peer, ep, state, bytes)
        }
        (msg @ (Message::Open { .. } | Message::List { .. }), State::Challenged { .. }) => {
            let what = if matches!(msg, Message::Open { .. }) { "OPEN" } else { "LIST" };
            let text = format!("this target requires authentication (AUTH) before {what}");
            (Reply::Error(ErrorCode::AuthRequired, text), After::Refused)
        }
        (Message::Open { resume: Some(_), .. }, State::Ready { features, .. })
            if features & rblk_proto::FEATURE_RECONNECT == 0 =>
        {
            let text = "OPEN resumes a session, but HELLO did not announce the reconnect feature".into();
            (Reply::Error(ErrorCode::Unexpected, text), After::Refused)
        }
        (Message::Open { mode, name, resume }, State::Ready { pd, features, host, credential }) => {
            let host = host.clone();
            let owner = match &host {
                Some(h) => Owner::Host(Arc::clone(h)),
                None => Owner::Anonymous(peer.ip),
            };
            let opener = Opener {
                conn: peer.conn,
                pd: pd.clone(),
                features: *features,
                owner,
                credential: *credential,
                probe: peer.probe,
            };
            match open(shared, state, opener, mode, name, resume) {
                Ok(opened) => (opened, After::Continue),
                Err(Refusal { code, text, after, detail }) => {
                    shared.counters.refused_opens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let why = detail.as_deref().unwrap_or(&text);
                    tracing::warn!(peer = %crate::admission::Shown(peer.ip), host = host.as_deref(), volume = name, %mode, %code, "OPEN refused: {why}");
                    (Reply::Error(code, text), after)
                }
            }
        }
        (Message::Join { .. }, State::JoinRefused { reason }) => {
            shared.counters.refused_joins.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(peer = %crate::admission::Shown(peer.ip), "JOIN refused: {reason}");
            (Reply::Error(ErrorCode::NoResources, reason.to_string()), After::Close)
        }
        (Message::Join { session_id, token }, State::Joining { session }) => {
            if session.id != session_id || !session.token_matches(&token) {
                return (Reply::Error(ErrorCode::BadSession, "JOIN does not match the session".into()), After::Close);
            }
            if let Some(ended) = session.ended() {
                return (Reply::Error(ErrorCode::BadSession, format!("JOIN refused: {ended}")), After::Close);
            }
            let session = Arc::clone(session);
            let reply = if session.uses_windows() || session.segmented {
                // The connection binds the QP's windows, then fills in their rkeys, and the
                // segments for an initiator that knows them (see Connection::sync_windows).
                Message::Joined { rkey: 0, segments: None }
            } else {
                Message::Ok { answers: rblk_proto::Opcode::Join }
            };
            *state = State::Open { session };
            (Reply::Msg(reply), After::Continue)
        }
        (Message::List { start }, State::Ready { host, credential, .. }) => {
            if let Some(why) = shared.catalog().policy.revokes(host.as_deref(), credential, None) {
                return (Reply::Error(ErrorCode::AuthFailed, revoked_text(&why)), After::Close);
            }
            (list(shared, host.as_deref(), start), After::Continue)
        }
        (Message::List { start }, State::Open { session }) => {
            (list(shared, session.owner.host(), start), After::Continue)
        }
        // Counters only for peers that opened something.
        (Message::Stats, State::Open { session }) => (Reply::Msg(stats(shared, session)), After::Continue),
        (Message::Stats, _) => (Reply::Error(ErrorCode::NotOpen, "STATS before OPEN".into()), After::Refused),
        (Message::Flush(flush), State::Open { session }) => {
            let session = Arc::clone(session);
            (flush_volume(shared, ep, &session, flush), After::Continue)
        }
        (Message::Discard { offset, len }, State::Open { session })
            if state.features() & rblk_proto::FEATURE_DISCARD != 0 =>
        {
            let session = Arc::clone(session);
            zero_range(shared, ep, &session, offset, len, None)
        }
        (Message::WriteZeroes { offset, len, flags }, State::Open { session })
            if state.features() & rblk_proto::FEATURE_DISCARD != 0 =>
        {
            let session = Arc::clone(session);
            zero_range(shared, ep, &session, offset, len, Some(flags))
        }
        (Message::Close, State::Open { session }) => {
            session.release();
            *state = State::Closed { session: Some(Arc::clone(session)) };
            (Reply::Msg(Message::Ok { answers: rblk_proto::Opcode::Close }), After::Close)
        }
        (Message::Close, _) => {
            *state = State::Closed { session: state.session().cloned() };
            (Reply::Msg(Message::Ok { answers: rblk_proto::Opcode::Close }), After::Close)
        }
        (Message::Flush(_), _) => (Reply::Error(ErrorCode::NotOpen, "FLUSH before OPEN".into()), After::Refused),
        (msg, state) => (
            Reply::Error(
                ErrorCode::Unexpected,
                format!("{:?} is not expected in state {}", msg.opcode(), state.name()),
            ),
            After::Refused,
        ),
    }
}

/// FLUSH: RAM volumes answer at once (an ordering point, flagged volatile), and so do
/// read-only sessions (they wrote nothing: nothing of theirs to write back). For the others the
/// volume writes the ranges back and fdatasyncs off this thread ([`Reply::WriteBack`]; the
/// connection answers with [`flushed`] once that is done). A failed write-back fails the
/// volume for good.
fn flush_volume(shared: &Shared, ep: &Endpoint, session: &Arc<Session>, flush: Flush<'_>) -> Reply {
    let started = std::time::Instant::now();
    let volume = &session.volume;
    let size = volume.size();
    let ranges: Vec<(u64, u64)> = match flush {
        Flush::All => vec![(0, size)],
        Flush::Ranges(ranges) => {
            if let Some(r) = ranges.iter().find(|r| r.end().is_none_or(|end| end > size)) {
                let text = format!("flush range {}+{} is beyond the volume's {size} bytes", r.offset(), r.len());
                return Reply::Error(ErrorCode::OutOfRange, text);
            }
            ranges.iter().map(|r| (r.offset(), r.len())).collect()
        }
    };
    let hook = shared.fixed.flush_hook.as_ref();
    let answer = |reply: Reply| {
        shared.counters.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        shared.counters.flush_seconds.observe(started.elapsed().as_secs_f64());
        reply
    };
    if volume.backing.as_ref().is_some_and(|b| b.failed()) {
        // The write-back's error, with the backing store's path, is in the log; not for initiators.
        let text = format!("volume {} failed: writing it back failed earlier (see the target's log)", volume.name);
        return answer(Reply::Error(ErrorCode::VolumeFailed, text));
    }
    if session.mode == OpenMode::ReadOnly || (volume.is_volatile() && hook.is_none()) {
        let flags = if volume.is_volatile() { FlushedFlags::VOLATILE } else { FlushedFlags::empty() };
        return answer(Reply::Msg(Message::Flushed { flags }));
    }
    if let Some(hook) = hook {
        hook.arrived();
    }
    let bytes = ranges.iter().map(|(_, len)| len).sum();
    let jobs: Vec<Job> = ranges.iter().map(|&(offset, len)| Job::Store(offset, len)).collect();
    let ticket = volume.write_back(&jobs, ep.waker(), hook.cloned());
    let covered = match flush {
        Flush::All => None,
        Flush::Ranges(_) => Some(ranges.iter().map(|&(offset, len)| (offset, offset + len)).collect()),
    };
    session.flush_began();
    Reply::WriteBack(WriteBack {
        _session: Flushing(Arc::clone(session)),
        volume: Arc::clone(volume),
        ticket,
        answers: Opcode::Flush,
        bytes,
        covered,
        started,
    })
}

/// DISCARD (`flags` None) and WRITE_ZEROES ([`rblk_proto::FEATURE_DISCARD`]): refused from a
/// read-only session, for a range that is not whole blocks within the volume, and on a failed
/// volume; otherwise the volume's next write-back pass zeroes the range ([`Job::Zero`]: its
/// memory with stores, then its backing store's blocks, punched or, with `NO_UNMAP`, zeroed in
/// place), off this thread, and the connection answers OK once that pass finished, as it
/// answers a FLUSH ([`Reply::WriteBack`]). The pass fdatasyncs: on a durable volume the zeros
/// are durable at the answer, with `FUA` or without.
fn zero_range(
    shared: &Shared,
    ep: &Endpoint,
    session: &Arc<Session>,
    offset: u64,
    len: u64,
    flags: Option<ZeroFlags>,
) -> (Reply, After) {
    let volume = &session.volume;
    let (what, answers) = match flags {
        None => ("DISCARD", Opcode::Discard),
        Some(_) => ("WRITE_ZEROES", Opcode::WriteZeroes),
    };
    let refuse = |code, text: String| (Reply::Error(code, text), After::Refused);
    if session.mode == OpenMode::ReadOnly {
        return refuse(ErrorCode::ReadOnly, format!("{what}: volume {} is open read-only here", volume.name));
    }
    let (bs, size) = (u64::from(volume.block_size), volume.size());
    if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
        let text = format!("{what} {offset}+{len} is not whole blocks of volume {}'s {bs} bytes", volume.name);
        return refuse(ErrorCode::OutOfRange, text);
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        let text = format!("{what} {offset}+{len} runs past the end of volume {} ({size} bytes)", volume.name);
        return refuse(ErrorCode::OutOfRange, text);
    }
    if volume.failed() {
        let text = format!("volume {} failed: writing it back failed earlier (see the target's log)", volume.name);
        return (Reply::Error(ErrorCode::VolumeFailed, text), After::Continue);
    }
    let keep = flags.is_some_and(|f| f.contains(ZeroFlags::NO_UNMAP));
    let ticket = volume.write_back(&[Job::Zero { offset, len, keep }], ep.waker(), shared.fixed.flush_hook.clone());
    session.flush_began();
    let reply = Reply::WriteBack(WriteBack {
        _session: Flushing(Arc::clone(session)),
        volume: Arc::clone(volume),
        ticket,
        answers,
        bytes: len,
        covered: None,
        started: std::time::Instant::now(),
    });
    (reply, After::Continue)
}

/// A FLUSH, DISCARD or WRITE_ZEROES whose write-back pass runs (see
/// [`Volume::write_back`](crate::volume::Volume::write_back)).
#[derive(Debug)]
pub struct WriteBack {
    _session: Flushing,
    volume: Arc<crate::volume::Volume>,
    ticket: crate::persist::Ticket,
    /// The request it answers.
    answers: Opcode,
    /// The bytes it asked for.
    bytes: u64,
    /// Its `(start, end)` ranges, None for the whole volume (for the [`FlushHook`]).
    covered: Option<Vec<(u64, u64)>>,
    started: std::time::Instant,
}

/// Counts a FLUSH as its session's until it is answered or given up (see [`Session::flushes`]).
#[derive(Debug)]
struct Flushing(Arc<Session>);

impl Drop for Flushing {
    fn drop(&mut self) {
        self.0.flush_ended();
    }
}

/// The reply to `flush` once its write-back finished; None while it runs.
pub(crate) fn flushed(shared: &Shared, flush: &WriteBack) -> Option<Reply> {
    let result = flush.volume.written_back(flush.ticket)?;
    let volume = &flush.volume;
    if flush.answers != Opcode::Flush {
        return Some(zeroed(shared, flush, result));
    }
    let reply = match result {
        Ok(()) if volume.is_volatile() => Reply::Msg(Message::Flushed { flags: FlushedFlags::VOLATILE }),
        Ok(()) => {
            shared.counters.written_back_bytes.fetch_add(flush.bytes, std::sync::atomic::Ordering::Relaxed);
            Reply::Msg(Message::Flushed { flags: FlushedFlags::empty() })
        }
        Err(e) => {
            shared.counters.writeback_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // The error names the backing store and the OS's reason: the log's, not the initiator's.
            tracing::warn!(volume = %volume.name, error = %e, "FLUSH failed: the volume fails");
            shared.fail_volume(volume);
            let text = format!("volume {} failed: writing it back failed (see the target's log)", volume.name);
            Reply::Error(ErrorCode::VolumeFailed, text)
        }
    };
    if let Some(hook) = &shared.fixed.flush_hook {
        hook.answered_with(flush.covered.clone(), matches!(reply, Reply::Msg(Message::Flushed { .. })));
    }
    let c = &shared.counters;
    c.flushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    c.flush_seconds.observe(flush.started.elapsed().as_secs_f64());
    Some(reply)
}

/// The reply to a DISCARD or WRITE_ZEROES whose pass finished with `result`.
fn zeroed(shared: &Shared, zero: &WriteBack, result: std::io::Result<()>) -> Reply {
    let volume = &zero.volume;
    let c = &shared.counters;
    match result {
        Ok(()) => {
            let z = &volume.zeroed;
            let counter = if zero.answers == Opcode::Discard { &z.discarded } else { &z.zeroed };
            counter.fetch_add(zero.bytes, std::sync::atomic::Ordering::Relaxed);
            Reply::Msg(Message::Ok { answers: zero.answers })
        }
        Err(e) => {
            c.writeback_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(volume = %volume.name, error = %e, request = ?zero.answers, "zeroing failed: the volume fails");
            shared.fail_volume(volume);
            let text =
                format!("volume {} failed: zeroing its backing store failed (see the target's log)", volume.name);
            Reply::Error(ErrorCode::VolumeFailed, text)
        }
    }
}

/// A FLUSH, DISCARD or WRITE_ZEROES given up (its connection ended before its pass finished).
pub(crate) fn abandoned(shared: &Shared, flush: WriteBack) {
    // Only a FLUSH was counted as waiting at the hook (a DISCARD's or WRITE_ZEROES' pass is held
    // by it all the same, but not counted).
    if let Some(hook) = shared.fixed.flush_hook.as_ref().filter(|_| flush.answers == Opcode::Flush) {
        hook.gone();
    }
}

/// An OPEN refused: the ERROR the initiator gets, and what the log says when that is more.
struct Refusal {
    code: ErrorCode,
    text: String,
    after: After,
    /// What the log says instead of `text` (a reason the initiator is not told).
    detail: Option<String>,
}

impl Refusal {
    /// Refused, as `After::Refused` (counts towards cutting the connection).
    fn new(code: ErrorCode, text: impl Into<String>) -> Refusal {
        Refusal { code, text: text.into(), after: After::Refused, detail: None }
    }

    /// Refused for want of resources: does not count towards cutting the connection.
    fn resources(text: impl Into<String>) -> Refusal {
        Refusal { after: After::Continue, ..Refusal::new(ErrorCode::NoResources, text) }
    }

    /// The log says `detail`; the initiator gets the text only.
    fn logging(self, detail: String) -> Refusal {
        Refusal { detail: Some(detail), ..self }
    }
}

/// The connection that opens a session.
struct Opener {
    conn: u64,
    pd: Pd,
    features: u64,
    owner: Owner,
    credential: Credential,
    /// See [`Peer::probe`].
    probe: bool,
}

/// The refusal of a connection that authenticated before a reload changed the key its host
/// must prove (see [`crate::access::Policy::revokes`]).
fn revoked_text(why: &crate::access::Revoked) -> String {
    format!("{why}: the target's keys changed since this connection authenticated; connect again")
}

fn open(
    shared: &Shared,
    state: &mut State,
    opener: Opener,
    mode: OpenMode,
    name: &str,
    resume: Option<Resume>,
) -> Result<Reply, Refusal> {
    let Opener { conn, pd, features, owner, credential, probe } = opener;
    // Before anything else: the old session's exclusive open must not make this one Busy.
    if let Some(old) = resume.as_ref().and_then(|resume| shared.replace_session(resume)) {
        return Ok(Reply::Replacing(old));
    }
    // Held until the session is recorded: a reload removes no volume under an OPEN, and
    // revokes (see Shared::apply) every session recorded before it changes the policy.
    let catalog = shared.catalog();
    let host = owner.host();
    if let Some(why) = catalog.policy.revokes(host, &credential, None) {
        return Err(Refusal { after: After::Close, ..Refusal::new(ErrorCode::AuthFailed, revoked_text(&why)) });
    }
    // A name this host may not see is answered as one that does not exist, byte for byte, so
    // that names cannot be probed; and the answer lists nothing (LIST lists what it may see).
    // The name is the initiator's (any UTF-8): escaped, or a newline in it would forge a line
    // in the log ("OPEN refused: ..."), and an escape would drive the reader's terminal.
    let no_such = || Refusal::new(ErrorCode::NoSuchVolume, format!("no such volume {}", rblk_proto::printable(name)));
    if !catalog.volumes.contains_key(name) && !catalog.refused.contains_key(name) {
        return Err(no_such());
    }
    match catalog.policy.may_open(name, host, mode) {
        Ok(()) => {}
        Err(e @ AccessError::NotListed { .. }) => {
            return Err(no_such().logging(format!("{e} (answered as no such volume)")))
        }
        // A listed host may hear what its grant is.
        Err(e) => return Err(Refusal::new(ErrorCode::BadMode, e.to_string())),
    }
    if let Some(reason) = catalog.refused.get(name) {
        // The reason names the backing store and the OS's error: the log's, not the initiator's.
        let text = format!("volume {name} is unavailable (see the target's log)");
        return Err(
            Refusal::new(ErrorCode::VolumeFailed, text).logging(format!("volume {name} is unavailable: {reason}"))
        );
    }
    let Some(volume) = catalog.volumes.get(name) else { return Err(no_such()) };
    if let Some(full) = shared.session_cap_reached(&owner) {
        if let (CapReached::Host { .. }, true) = (&full, probe) {
            let silent = shared.probe_silent_sessions(&owner);
            if !silent.is_empty() {
                return Ok(Reply::Probing(silent));
            }
        }
        return Err(Refusal::resources(full.to_string()));
    }
    if volume.failed() && mode != OpenMode::ReadOnly {
        let text = format!("volume {name} failed (its backing store could not be written): read-only opens only");
        return Err(Refusal::new(ErrorCode::VolumeFailed, text));
    }
    let id = shared.next_session_id();
    if let Err(busy) = volume.acquire(id, mode) {
        return Err(Refusal::new(ErrorCode::Busy, busy.0));
    }
    let counters = Arc::clone(&shared.counters);
    let segmented = session::segmented(features);
    let segments = volume.segments();
    // An older initiator reaches the volume through one rkey per QP: a window binds within one
    // segment, so once the volume has grown it gets a registration of its own over all of them.
    let windows = features & rblk_proto::FEATURE_WINDOWS != 0 && (segmented || segments.len() == 1);
    // An older initiator resuming a session keeps the size that session had (a grow since
    // would otherwise look like another volume to it, and fail its I/O).
    let opened_size = match resume.as_ref().and_then(|r| shared.resumed_size(r)) {
        Some(was) if !segmented => was.min(volume.size()),
        _ => volume.size(),
    };
    let access = session::remote_access(mode);
    let own =
        |m: &Arc<rblk_fabric::Memory>| pd.register(m, access).map(|mr| Registration::new(mr, Arc::clone(&counters)));
    let grant = if windows {
        // Every segment registered now, off the worker: the connection binds its windows.
        volume.region(&pd, &counters, segments.len() - 1).map(|_| Grant::Windows(Vec::new()))
    } else if segmented {
        segments.iter().map(own).collect::<rblk_fabric::Result<Vec<_>>>().map(Grant::Own)
    } else {
        own(&volume.memory()).map(|r| Grant::Own(vec![r]))
    };
    let grant = match grant {
        Ok(grant) => grant,
        Err(e) => {
            volume.release(id, mode);
            tracing::warn!(volume = name, error = %Chain(&e), "registration failed");
            return Err(Refusal::resources(Chain(&e).to_string()));
        }
    };
    // From here on the session gives the open mode back when it is dropped.
    let session = Arc::new(Session::new(
        id,
        pd,
        Arc::clone(volume),
        mode,
        grant,
        counters,
        features,
        owner,
        credential,
        opened_size,
    ));
    // With windows the connection binds them before OPENED goes out, and fills in the rkeys
    // then (see Connection::sync_windows); a registration's are known now.
    let (remote_addr, rkey) = session.reach(conn).map_or((0, 0), |(_, segs)| {
        let first = segs.as_slice()[0];
        (first.remote_addr, first.rkey)
    });
    let mut flags = if volume.is_volatile() { VolumeFlags::VOLATILE } else { VolumeFlags::empty() };
    if mode == OpenMode::ReadOnly {
        flags = flags | VolumeFlags::READ_ONLY;
    }
    if mode == OpenMode::Exclusive {
        flags = flags | VolumeFlags::EXCLUSIVE;
    }
    let opened = Opened {
        remote_addr,
        size: opened_size,
        rkey,
        block_size: volume.block_size,
        max_io: shared.max_io,
        flags,
        session_id: id,
        token: session.token,
        // Only a peer that knows the tail gets it: older ones parse the base body.
        instance: (features & rblk_proto::FEATURE_RECONNECT != 0).then_some(volume.instance),
        segments: None,
    };
    // Checked again atomically: another connection may have opened one meanwhile.
    if let Err(full) = shared.add_session(Arc::clone(&session)) {
        return Err(Refusal::resources(full.to_string()));
    }
    shared.counters.sessions_opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let access = if windows { "a memory window per QP" } else { "a registration of its own" };
    tracing::info!(volume = name, %mode, session = id, owner = %session.owner, "opened, with {access}");
    session.join(conn);
    shared.connection_joined(conn, &session);
    *state = State::Open { session };
    Ok(Reply::Msg(Message::Opened(opened)))
}

/// LIST: the volumes `host` may open in some mode, sorted by name, with the most it may open
/// each for; from the `start`th on, as many as fit in one reply. Registers and opens nothing.
fn list(shared: &Shared, host: Option<&str>, start: u32) -> Reply {
    let catalog = shared.catalog();
    let mut names: Vec<&String> = catalog.volumes.keys().collect();
    names.sort_unstable();
    let mut visible = Vec::new();
    for name in names {
        let volume = &catalog.volumes[name];
        let grant = [OpenMode::Exclusive, OpenMode::ReadWrite, OpenMode::ReadOnly]
            .into_iter()
            .find(|&m| catalog.policy.may_open(name, host, m).is_ok());
        let Some(mut grant) = grant else { continue };
        let mut flags = if volume.is_volatile() { rblk_proto::ListEntry::VOLATILE } else { 0 };
        if volume.failed() {
            flags |= rblk_proto::ListEntry::FAILED;
            grant = OpenMode::ReadOnly;
        }
        visible.extend(rblk_proto::ListEntry::new(name, volume.size(), flags, grant));
    }
    let total = u32::try_from(visible.len()).unwrap_or(u32::MAX);
    let entries = visible.into_iter().skip(start as usize).take(rblk_proto::MAX_LIST_ENTRIES).collect();
    Reply::List { total, entries }
}

fn stats(shared: &Shared, session: &Session) -> Message<'static> {
    let (user, system) = cpu_time_us();
    Message::StatsReply(StatsReply {
        registrations: shared.counters.registrations.load(std::sync::atomic::Ordering::SeqCst),
        pinned_bytes: shared.counters.pinned_bytes.load(std::sync::atomic::Ordering::SeqCst),
        sessions: shared.session_count() as u64,
        connections: shared.connection_count() as u64,
        cpu_user_us: user,
        cpu_system_us: system,
        windows: session.uses_windows().then(|| shared.counters.windows.load(std::sync::atomic::Ordering::SeqCst)),
    })
}

/// The daemon's CPU time so far, user and system, in microseconds.
pub fn cpu_time_us() -> (u64, u64) {
    let (user, system) = rblk_fabric::process_cpu_time();
    let us = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
    (us(user), us(system))
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Fresh { .. } => "fresh (expecting HELLO)",
            State::Challenged { .. } => "challenged (expecting AUTH or OPEN)",
            State::Ready { .. } => "authenticated (expecting OPEN)",
            State::Joining { .. } | State::JoinRefused { .. } => "joining (expecting JOIN)",
            State::Open { .. } => "open",
            State::Closed { .. } => "closed",
        }
    }

    /// Before HELLO.
    pub fn is_fresh(&self) -> bool {
        matches!(self, State::Fresh { .. })
    }

    /// Whether the connection is past AUTH (see [`crate::admission`]): authenticated, or,
    /// where no AUTH is asked (`auth_required` false), in a session. A JOIN is past it from
    /// its connect request on (its session's token).
    pub fn past_auth(&self, auth_required: bool) -> bool {
        match self {
            State::Ready { .. } => auth_required,
            State::Joining { .. } | State::JoinRefused { .. } | State::Open { .. } | State::Closed { .. } => true,
            State::Fresh { .. } | State::Challenged { .. } => false,
        }
    }

    /// Whether the connection came to JOIN a session (admitted to one, or refused at its cap):
    /// else it is a session's first.
    pub fn joins(&self) -> bool {
        matches!(self, State::Joining { .. } | State::JoinRefused { .. })
    }

    /// Whether the connection belongs to an open session (opened or joined), or is closing.
    pub fn is_open(&self) -> bool {
        matches!(self, State::Open { .. } | State::Closed { .. })
    }

    /// Features negotiated in HELLO: the connection's own, or its session's (JOINed
    /// connections do no HELLO). None before HELLO.
    pub fn features(&self) -> u64 {
        match self {
            State::Fresh { .. } | State::JoinRefused { .. } => 0,
            State::Challenged { features, .. } | State::Ready { features, .. } => *features,
            State::Open { session } | State::Joining { session } => session.features,
            State::Closed { session } => session.as_ref().map_or(0, |s| s.features),
        }
    }

    /// The session, once open.
    pub fn session(&self) -> Option<&Arc<Session>> {
        match self {
            State::Open { session } | State::Joining { session } => Some(session),
            State::Closed { session } => session.as_ref(),
            _ => None,
        }
    }
}
