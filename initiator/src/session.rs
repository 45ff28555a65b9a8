//! A session's first QP: connect, HELLO, CHALLENGE/AUTH, then OPEN into a [`Volume`].

use std::net::SocketAddr;
use std::time::Instant;

use rblk_fabric::{Chain, Pd};
use rblk_proto::{
    ChallengeFlags, ConnectData, Message, Opcode, OpenMode, Opened, Resume, VolumeFlags, FEATURES, FEATURE_HOST_ID,
    FEATURE_KEEPALIVE, FEATURE_RECONNECT, FEATURE_WINDOWS, MAC_LEN,
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
    /// target requires it. Each exchange has `opts.timeout`.
    pub fn connect(uri: &(impl ToUri + ?Sized), opts: &Options) -> Result<Session> {
        let uri = uri.to_uri()?;
        let dests: Vec<Dest> = uri
            .resolve_all()?
            .into_iter()
            .map(|addr| Dest { fabric: opts.fabric, addr, route: opts.route(), spin: opts.spin, wait: opts.wait })
            .collect();
        let mut first_err = None;
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
                    if dests.len() > 1 {
                        tracing::warn!(addr = %dest.addr, error = %Chain(&e), "path failed; trying the next address");
                    }
                    first_err.get_or_insert(e);
                }
            }
        }
        Err(first_err.expect("a URI has at least one address"))
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
    let deadline = Instant::now() + opts.timeout;
    let (flags, features, nonce) =
        conn.expect(&Message::Hello { features: ours }, deadline, "CHALLENGE", |r| match r {
            Reply::Challenge { flags, features, nonce } => Some((flags, features, nonce)),
            _ => None,
        })?;
    let features = ours & features;
    conn.send_keepalives(features & FEATURE_KEEPALIVE != 0);
    let authenticated = flags.contains(ChallengeFlags::AUTH_REQUIRED);
    // With host identities the initiator always names its host (access lists and caps use
    // it), MACing it with its key, or with zeros to a target that wants no key.
    let host = if features & FEATURE_HOST_ID != 0 {
        opts.host_id().map_err(|reason| Error::Auth { addr, reason })?
    } else {
        None
    };
    if authenticated || host.is_some() {
        let mac = match (opts.key.as_deref(), authenticated) {
            (Some(key), _) => rblk_proto::auth_mac(key, &nonce, host.as_deref())
                .ok_or_else(|| Error::Auth { addr, reason: "unusable key".into() })?,
            (None, false) => [0; MAC_LEN],
            (None, true) => {
                return Err(Error::Auth { addr, reason: opts.missing_key_reason() });
            }
        };
        let deadline = Instant::now() + opts.timeout;
        let acked = conn.expect(&Message::Auth { mac, host: host.as_deref() }, deadline, "OK(AUTH)", |r| match r {
            Reply::Ok(Opcode::Auth) => Some(()),
            _ => None,
        });
        match acked {
            Ok(()) => {}
            Err(Error::Target { code, text, .. }) => {
                let why = if text.is_empty() { code.to_string() } else { text };
                return Err(Error::Auth { addr, reason: format!("the target refused authentication ({why})") });
            }
            Err(e) => return Err(e),
        }
    }
    if !authenticated && opts.key.is_some() {
        tracing::warn!(%addr, "the target does not require a key: it serves anyone");
    }
    tracing::debug!(authenticated, features, "session started");
    Ok((conn, features, authenticated))
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
            Err(Error::Connect { source: rblk_fabric::Error::Connect { event: "REJECTED", .. }, .. }) => {
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
        }
    }
}
