//! A session's first QP: connect, HELLO, CHALLENGE/AUTH, then OPEN into a [`Volume`].

use std::net::SocketAddr;
use std::time::Instant;

use rblk_fabric::{Chain, Pd};
use rblk_proto::{
    ChallengeFlags, ConnectData, Message, Opcode, OpenMode, Opened, Resume, VolumeFlags, FEATURES, FEATURE_HOST_ID,
    FEATURE_KEEPALIVE, FEATURE_MUTUAL_AUTH, FEATURE_RECONNECT, FEATURE_SOLICITED, FEATURE_WINDOWS, MAC_LEN,
};

use crate::conn::{self, Conn, Dest, Reply};
use crate::link::Continuity;
use crate::{Error, Options, Result, ToUri, Uri, Volume};

/// An authenticated connection to a target, ready to open the URI's volume.
///
/// One session opens one volume: [`Session::open`] consumes it.
#[derive(Debug)]
pub struct Session {
    conn: Conn,
    uri: Uri,
    /// One per address of the URI; `at` is the one connected.
    dests: Vec<Dest>,
    at: usize,
    opts: Options,
    features: u64,
    authenticated: bool,
}

impl Session {
    /// Connects to the target named by `uri` (`rblk://HOST[:PORT][,HOST[:PORT]...]/VOLUME`:
    /// the first address that answers), says HELLO and authenticates with `opts.key` when the
    /// target requires it. Each exchange has `opts.timeout`. With
    /// [`Reconnect::connect_timeout`](crate::Reconnect::connect_timeout), a target that cannot be
    /// reached or does not listen yet is tried again until then ([`waits_for`]).
    pub fn connect(uri: &(impl ToUri + ?Sized), opts: &Options) -> Result<Session> {
        let patience = opts.reconnect.connect_timeout;
        let until = Instant::now() + patience;
        let mut attempt = 0u32;
        loop {
            let err = match Session::connect_once(uri, opts) {
                Err(e) if waits_for(&e) && Instant::now() < until => e,
                done => return done,
            };
            attempt += 1;
            let pause = crate::options::first_connect_pause(attempt, u64::from_le_bytes(rblk_fabric::random()))
                .min(until.saturating_duration_since(Instant::now()));
            tracing::warn!(
                attempt,
                error = %Chain(&err),
                "the target is not reachable yet: trying again in {} ms (--connect-timeout {})",
                pause.as_millis(),
                rblk_proto::format_duration(patience)
            );
            std::thread::sleep(pause);
        }
    }

    /// One attempt of [`Session::connect`].
    fn connect_once(uri: &(impl ToUri + ?Sized), opts: &Options) -> Result<Session> {
        let uri = uri.to_uri()?;
        let dests: Vec<Dest> = uri
            .resolve_all()?
            .into_iter()
            .map(|addr| Dest { fabric: opts.fabric, addr, route: opts.route(), spin: opts.spin, wait: opts.wait })
            .collect();
        // A target busy admitting others (a reconnect storm) says when to come back: within
        // the control timeout, the connect waits and tries again.
        let deadline = Instant::now() + opts.timeout;
        loop {
            let mut first_err = None;
            let mut busy: Option<std::time::Duration> = None;
            for (at, dest) in dests.iter().enumerate() {
                let span = tracing::debug_span!("session", addr = %dest.addr, volume = uri.volume());
                let _enter = span.enter();
                match handshake(dest, None, opts) {
                    Ok((conn, features, authenticated)) => {
                        return Ok(Session { conn, uri, dests, at, opts: opts.clone(), features, authenticated })
                    }
                    // A refusal is the target's answer: the other addresses reach the same target.
                    Err(e @ (Error::Auth { .. } | Error::Target { .. })) => return Err(e),
                    Err(e) => {
                        if let Some(after) = e.busy_for() {
                            busy = Some(busy.map_or(after, |b| b.min(after)));
                        }
                        if dests.len() > 1 {
                            tracing::warn!(addr = %dest.addr, error = %Chain(&e), "path failed; trying the next address");
                        }
                        first_err.get_or_insert(e);
                    }
                }
            }
            let err = first_err.expect("a URI has at least one address");
            let Some(after) = busy else { return Err(err) };
            let pause = crate::link::busy_pause(after, u64::from_le_bytes(rblk_fabric::random()));
            if Instant::now() + pause >= deadline {
                return Err(err);
            }
            tracing::info!(
                "the target is busy admitting other connections: connecting again in {} ms, as it asked",
                pause.as_millis()
            );
            std::thread::sleep(pause);
        }
    }

    /// Opens the URI's volume. A read-only open may be shared; read-write and exclusive opens
    /// depend on the target's rules ([`Error::Target`] with `BadMode` or `Busy` otherwise).
    pub fn open(mut self, mode: OpenMode) -> Result<Volume> {
        let name = self.uri.volume().to_owned();
        let opened = open_on(&mut self.conn, mode, &name, None, self.opts.timeout)?;
        tracing::debug!(addr = %self.addr(), volume = name, ?mode, session = opened.session_id, "opened");
        Volume::new(self.conn, self.uri, self.dests, self.at, self.opts, self.features, mode, opened)
    }

    /// Opens the URI's volume for a process that takes over from `prev`, one that served it and
    /// died (a ublk server's successor, `rblk attach` recovering a device). The OPEN resumes the
    /// predecessor's session, so the target ends it at once (an exclusive open is not refused
    /// for it; a session the target already forgot makes this a plain OPEN). The new session then
    /// follows the reconnect rules against what the predecessor had ([`Continuity`]): the same
    /// instance continues; a new instance of a durable volume makes the first FLUSH fail (the
    /// predecessor's unflushed writes are gone); anything else fails every I/O (the volume is
    /// returned with its session marked failed: new queues are refused).
    ///
    /// The target cannot see one-sided writes, and what the predecessor wrote and had not
    /// flushed died with it: so the first FLUSH covers the whole volume (on a durable volume, a
    /// whole-volume write-back; on a RAM volume the target answers it at once).
    ///
    /// Fails like [`open`](Self::open), and with [`Error::Protocol`] when the target cannot
    /// resume sessions (no FEATURE_RECONNECT).
    pub fn take_over(mut self, mode: OpenMode, prev: &Predecessor) -> Result<(Volume, Continuity)> {
        if self.features & FEATURE_RECONNECT == 0 {
            return Err(Error::Protocol {
                addr: self.addr(),
                expected: "a target that resumes sessions (FEATURE_RECONNECT)",
                got: "a target without it (an older rblk-target)".into(),
            });
        }
        let name = self.uri.volume().to_owned();
        let resume = Resume { session_id: prev.session_id, token: prev.token };
        let opened = open_on(&mut self.conn, mode, &name, Some(resume), self.opts.timeout)?;
        let volatile = opened.flags.contains(VolumeFlags::VOLATILE);
        let verdict = crate::link::continuity(&prev.opened(), &opened, volatile);
        tracing::debug!(addr = %self.addr(), volume = name, ?mode, session = opened.session_id, ?verdict, "took over");
        let vol = Volume::new(self.conn, self.uri, self.dests, self.at, self.opts, self.features, mode, opened)?;
        vol.take_over(&verdict);
        Ok((vol, verdict))
    }

    /// The volumes this host may open on the target (LIST: `nvme discover`'s counterpart), at
    /// most [`MAX_LISTED`],
    /// sorted by name, each with its size, whether it is volatile or failed, and the most this
    /// host may open it for. Registers and opens nothing. Fails with [`Error::Protocol`] on a
    /// target that predates LIST.
    pub fn list(&mut self) -> Result<Vec<crate::ListEntry>> {
        if self.features & rblk_proto::FEATURE_LIST == 0 {
            return Err(Error::Protocol {
                addr: self.addr(),
                expected: "a target with LIST",
                got: "a target without it (an older rblk-target)".into(),
            });
        }
        let mut all = Vec::new();
        loop {
            let start = u32::try_from(all.len()).unwrap_or(u32::MAX);
            let deadline = Instant::now() + self.opts.timeout;
            let (total, entries) = self.conn.expect(&Message::List { start }, deadline, "LIST_REPLY", |r| match r {
                Reply::List { total, entries } => Some((total, entries)),
                _ => None,
            })?;
            // The target's count is not trusted to size anything: past MAX_LISTED, or a reply
            // that goes beyond its own total, is refused, not followed.
            if total as usize > MAX_LISTED || all.len() + entries.len() > total as usize {
                let got = format!("a LIST reply of {} entries from {} of {total}", entries.len(), all.len());
                self.conn.break_with("bad LIST_REPLY");
                return Err(Error::Protocol {
                    addr: self.addr(),
                    expected: "at most MAX_LISTED (65536) volumes, no more than announced",
                    got,
                });
            }
            let done = entries.is_empty();
            all.extend(entries);
            if done || all.len() >= total as usize {
                return Ok(all);
            }
        }
    }

    /// The URI connected to.
    pub fn uri(&self) -> &Uri {
        &self.uri
    }

    /// The target's address (the URI's first that answered).
    pub fn addr(&self) -> SocketAddr {
        self.dests[self.at].addr
    }

    /// The protocol features both sides implement.
    pub fn features(&self) -> u64 {
        self.features
    }

    /// Whether the target required (and accepted) a key.
    pub fn authenticated(&self) -> bool {
        self.authenticated
    }
}

/// A session's first queue pair to `dest` (in `pd`, or a new PD on the device that reaches
/// it): connect, HELLO, and AUTH when the target asks. Returns the connection, the features both
/// sides implement, and whether the target required a key. The start of every session and of
/// every reconnect.
pub(crate) fn handshake(dest: &Dest, pd: Option<&Pd>, opts: &Options) -> Result<(Conn, u64, bool)> {
    let addr = dest.addr;
    let (mut conn, ours) = connect_first(dest, pd, opts)?;
    let ours = if opts.solicited_events { ours } else { ours & !FEATURE_SOLICITED };
    let ours = if opts.discard { ours } else { ours & !rblk_proto::FEATURE_DISCARD };
    let deadline = Instant::now() + opts.timeout;
    let (flags, offered, nonce) =
        conn.expect(&Message::Hello { features: ours }, deadline, "CHALLENGE", |r| match r {
            Reply::Challenge { flags, features, nonce } => Some((flags, features, nonce)),
            _ => None,
        })?;
    let features = ours & offered;
    conn.send_keepalives(features & FEATURE_KEEPALIVE != 0);
    conn.solicit(features & FEATURE_SOLICITED != 0);
    let authenticated = flags.contains(ChallengeFlags::AUTH_REQUIRED);
    // With host identities the initiator always names its host (access lists and caps use
    // it), MACing it with its key, or with zeros to a target that wants no key.
    let host = if features & FEATURE_HOST_ID != 0 {
        opts.host_id().map_err(|reason| Error::Auth { addr, reason })?
    } else {
        None
    };
    let key = opts.key_for(addr.ip());
    if let (Some((_, local)), false) = (key, authenticated) {
        if !local {
            // A target that asks for no key proves none: whoever answers at this address.
            let from = opts.key_file.as_ref().map_or_else(String::new, |f| format!(" from {}", f.display()));
            return Err(Error::Auth {
                addr,
                reason: format!(
                    "the target does not require a key, so it cannot prove it holds this one{from}: refusing to \
                     trust it (--no-key connects without a key, to targets that serve anyone)"
                ),
            });
        }
        tracing::warn!(%addr, "the target does not require a key: it serves anyone");
    }
    let key = key.filter(|_| authenticated).map(|(k, _)| k);
    if let Some(key) = key {
        if features & FEATURE_MUTUAL_AUTH != 0 {
            let words = Words { hello: ours, flags: flags.bits(), offered };
            mutual_auth(&mut conn, dest, opts, key, host.as_deref(), words, nonce)?;
        } else if opts.allow_v1_target {
            tracing::warn!(%addr, "the target cannot prove it holds the key (it predates mutual authentication): \
                                   allowed by --allow-v1-target");
            v1_auth(&mut conn, addr, rblk_proto::auth_mac(key, &nonce, host.as_deref()), host.as_deref(), opts)?;
        } else {
            return Err(Error::Auth {
                addr,
                reason: "the target cannot prove it holds the key (it predates mutual authentication, or \
                         something in between stripped it): upgrade rblk-target, or accept it with --allow-v1-target"
                    .into(),
            });
        }
    } else if authenticated {
        return Err(Error::Auth { addr, reason: opts.missing_key_reason() });
    } else if host.is_some() {
        // No key asked for: the host only names itself, with no MAC.
        v1_auth(&mut conn, addr, Some([0; MAC_LEN]), host.as_deref(), opts)?;
    }
    tracing::debug!(authenticated, features, "session started");
    Ok((conn, features, authenticated))
}

/// HELLO's and CHALLENGE's words as sent.
struct Words {
    hello: u64,
    flags: u32,
    offered: u64,
}

/// AUTH v1 with `mac` (None: the key cannot be used), answered by OK(AUTH).
fn v1_auth(
    conn: &mut Conn,
    addr: SocketAddr,
    mac: Option<[u8; MAC_LEN]>,
    host: Option<&str>,
    opts: &Options,
) -> Result<()> {
    let mac = mac.ok_or_else(|| Error::Auth { addr, reason: "unusable key".into() })?;
    let deadline = Instant::now() + opts.timeout;
    let acked = conn.expect(&Message::Auth { mac, host }, deadline, "OK(AUTH)", |r| match r {
        Reply::Ok(Opcode::Auth) => Some(()),
        _ => None,
    });
    acked.map_err(|e| refused(addr, e))
}

/// An ERROR answering AUTH as the reason authentication failed.
fn refused(addr: SocketAddr, e: Error) -> Error {
    match e {
        Error::Target { code, text, .. } => {
            let why = if text.is_empty() { code.to_string() } else { text };
            Error::Auth { addr, reason: format!("the target refused authentication ({why})") }
        }
        e => e,
    }
}

/// AUTH v2: proves `key` over the whole exchange and this connection's addresses, then checks
/// the target's proof and its identity (given, or pinned for the address).
fn mutual_auth(
    conn: &mut Conn,
    dest: &Dest,
    opts: &Options,
    key: &[u8],
    host: Option<&str>,
    words: Words,
    target_nonce: [u8; rblk_proto::NONCE_LEN],
) -> Result<()> {
    use rblk_proto::Direction;
    let addr = dest.addr;
    let host = host.ok_or_else(|| Error::Auth {
        addr,
        reason: "mutual authentication names this host, and it has no usable hostname: give --host-id".into(),
    })?;
    // The addresses as this side sees them: a relay in between sees others.
    let (Some(target_addr), Some(initiator_addr)) = (conn.ep.peer(), conn.ep.local()) else {
        return Err(Error::Auth { addr, reason: "the connection's addresses are unknown".into() });
    };
    let transcript = rblk_proto::Transcript {
        hello_features: words.hello,
        challenge_flags: words.flags,
        challenge_features: words.offered,
        target_nonce,
        initiator_nonce: rblk_fabric::random(),
        host,
        target_addr,
        initiator_addr,
    };
    let mac = rblk_proto::mutual_mac(key, Direction::InitiatorToTarget, &transcript, None)
        .ok_or_else(|| Error::Auth { addr, reason: "unusable key".into() })?;
    let deadline = Instant::now() + opts.timeout;
    let msg = Message::MutualAuth { host, nonce: transcript.initiator_nonce, mac };
    let (target_id, proof) = conn
        .expect(&msg, deadline, "OK(AUTH) with the target's proof", |r| match r {
            Reply::AuthProof { target_id, mac } => Some((target_id, mac)),
            _ => None,
        })
        .map_err(|e| refused(addr, e))?;
    if !rblk_proto::verify_mutual_mac(key, Direction::TargetToInitiator, &transcript, Some(&target_id), &proof) {
        return Err(Error::Auth {
            addr,
            reason: "the target's proof is wrong: it does not hold this key, or something in between changed the \
                     exchange"
                .into(),
        });
    }
    check_identity(addr, opts, &target_id)
}

/// The target's identity must be `--target-id`, else the one pinned for its address; an
/// address seen for the first time is pinned.
fn check_identity(addr: SocketAddr, opts: &Options, got: &[u8; rblk_proto::TARGET_ID_LEN]) -> Result<()> {
    use crate::trust::{lookup, pin, Pin, PinError};
    let changed = |expected: &[u8; rblk_proto::TARGET_ID_LEN], source: String| Error::Auth {
        addr,
        reason: format!(
            "TARGET IDENTITY CHANGED: the target proved the key as {}, but {source} says {}. Another holder of \
             the key may be answering at this address. If the target's state directory was replaced on purpose, \
             remove that line (or give --target-id)",
            rblk_proto::to_hex(got),
            rblk_proto::to_hex(expected)
        ),
    };
    if let Some(expected) = &opts.target_id {
        return if expected == got { Ok(()) } else { Err(changed(expected, "--target-id".into())) };
    }
    let Some(path) = &opts.known_targets else { return Ok(()) };
    let pinned = match lookup(path, addr) {
        Ok(pin) => pin,
        Err(PinError::Unreadable(why)) => {
            tracing::warn!(%addr, "{why}: the target's identity is not checked (give --known-targets or --target-id)");
            return Ok(());
        }
        Err(PinError::Bad(reason)) => return Err(Error::Auth { addr, reason }),
    };
    match pinned {
        Pin::Known(expected, _) if &expected == got => Ok(()),
        Pin::Known(expected, line) => Err(changed(&expected, format!("{}:{line}", path.display()))),
        Pin::Unknown => {
            match pin(path, addr, got) {
                Ok(()) => {
                    tracing::info!(%addr, target_id = %rblk_proto::to_hex(got), path = %path.display(), "pinned the target's identity")
                }
                Err(e) => tracing::warn!(%addr, path = %path.display(), "cannot pin the target's identity: {e}"),
            }
            Ok(())
        }
    }
}

/// Connects a session's first queue pair, asking for memory windows if `opts` does, and returns
/// it with the features to announce in HELLO. A target that predates windows refuses the
/// connect data that asks for them (the kind does not parse there), so a refused request is
/// tried once more the old way.
fn connect_first(dest: &Dest, pd: Option<&Pd>, opts: &Options) -> Result<(Conn, u64)> {
    let cfg = conn::qp_config(Volume::SYNC_DEPTH);
    if opts.memory_windows {
        let deadline = Instant::now() + opts.timeout;
        match Conn::connect(dest, pd, &cfg, ConnectData::NewWindowSession, deadline) {
            Ok(conn) => return Ok((conn, FEATURES)),
            // A target that is busy admitting others rejects any request: not a reason to go
            // without windows.
            Err(e) if e.busy_for().is_some() => return Err(e),
            Err(Error::Connect { source: rblk_fabric::Error::Rejected { .. }, .. }) => {
                tracing::debug!(addr = %dest.addr, "the target refused a windows connect request: connecting without");
            }
            Err(e) => return Err(e),
        }
    }
    let deadline = Instant::now() + opts.timeout;
    let conn = Conn::connect(dest, pd, &cfg, ConnectData::NewSession, deadline)?;
    Ok((conn, FEATURES & !FEATURE_WINDOWS))
}

/// The most volumes [`Session::list`] takes from one target: a target's LIST total beyond it is
/// refused, so that a hostile one cannot grow the initiator's memory without bound.
pub const MAX_LISTED: usize = 1 << 16;

/// OPEN of `name` on a session's first queue pair; `resume` names the session a reconnect
/// replaces. Refuses an OPENED whose address range does not fit 64 bits.
pub(crate) fn open_on(
    conn: &mut Conn,
    mode: OpenMode,
    name: &str,
    resume: Option<Resume>,
    timeout: std::time::Duration,
) -> Result<Opened> {
    let deadline = Instant::now() + timeout;
    let opened = conn.expect(&Message::Open { mode, name, resume }, deadline, "OPENED", |r| match r {
        Reply::Opened(o) => Some(o),
        _ => None,
    })?;
    // Every OPENED, a reconnect's and a takeover's too: the data path adds offsets below `size`
    // to `remote_addr` unchecked.
    if opened.remote_addr.checked_add(opened.size).is_none() {
        let got = format!("OPENED with address {:#x} and size {}", opened.remote_addr, opened.size);
        conn.break_with("bad OPENED");
        return Err(Error::Protocol { addr: conn.addr, expected: "a volume address range that fits 64 bits", got });
    }
    Ok(opened)
}

/// What a process that served a volume knew about its session, kept (by `rblk attach`, in its
/// run-directory entry) for a process that takes over when it dies: [`Session::take_over`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Predecessor {
    /// Its session (OPENED's id; a reconnect makes a new one).
    pub session_id: u64,
    /// Its session's token: lets the successor's OPEN end that session.
    pub token: [u8; rblk_proto::TOKEN_LEN],
    /// The volume's size in bytes.
    pub size: u64,
    /// The volume's block size.
    pub block_size: u32,
    /// The volume's largest I/O.
    pub max_io: u32,
    /// The volume instance it served; None: the target reported none.
    pub instance: Option<rblk_proto::VolumeId>,
}

impl Predecessor {
    /// As an OPENED, for the reconnect rules.
    fn opened(&self) -> Opened {
        Opened {
            remote_addr: 0,
            size: self.size,
            rkey: 0,
            block_size: self.block_size,
            max_io: self.max_io,
            flags: VolumeFlags::empty(),
            session_id: self.session_id,
            token: self.token,
            instance: self.instance,
            segments: None,
        }
    }
}

/// Whether a first connect that failed with `e` is worth another attempt within
/// `--connect-timeout`: the target could not be reached, did not listen, did not answer in time,
/// or its name did not resolve yet. A refusal (authentication, access, a bad request) or a
/// local error (a key file, the URI) is an answer, and ends the wait.
pub(crate) fn waits_for(e: &Error) -> bool {
    matches!(e, Error::Connect { .. } | Error::Resolve { .. } | Error::Timeout { .. } | Error::ConnectionLost { .. })
}
