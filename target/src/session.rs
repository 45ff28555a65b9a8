//! Sessions: a protection domain shared by the session's QPs and, after OPEN, the session's
//! access to its volume ([`Grant`]): either a registration of its own, or one type 2B memory
//! window per QP over the volume's one shared registration; and the random values (nonces,
//! tokens) of the control protocol.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rblk_fabric::{Access, Chain, Endpoint, Mw, Pd, Waker};
use rblk_proto::{OpenMode, Segment, Segments, NONCE_LEN, TOKEN_LEN};
use subtle::ConstantTimeEq;

use crate::access::Credential;
use crate::counters::Counters;
use crate::volume::{Registration, Volume};

/// Whom a session counts against for the per-host session cap: the host it named in AUTH, or,
/// for an initiator without host identities, its address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A named host.
    Host(Arc<str>),
    /// An anonymous initiator at this address.
    Anonymous(Option<std::net::IpAddr>),
}

impl Owner {
    /// The host's name; None for an anonymous initiator.
    pub fn host(&self) -> Option<&str> {
        match self {
            Owner::Host(h) => Some(h),
            Owner::Anonymous(_) => None,
        }
    }
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Host(h) => write!(f, "host {h}"),
            Owner::Anonymous(Some(ip)) => write!(f, "anonymous initiators at {ip}"),
            Owner::Anonymous(None) => f.write_str("anonymous initiators"),
        }
    }
}

/// A memory window bound to one connection's QP over one segment of the volume, counted in
/// [`Counters::windows`]. Dropping it
/// deallocates it (`ibv_dealloc_mw`), which kills its rkey at once, from any thread, whether the
/// QP is alive or in error: that is how the target revokes a window (CLOSE, loss, replacement,
/// a failed volume, a connection leaving). If the deallocation fails, the rkey may still work,
/// but only through that QP: the failure is logged and counted
/// ([`Counters::window_dealloc_failures`]), and the connection is told to disconnect
/// ([`Session::window_stuck`]), which takes the rkey down with its QP.
#[derive(Debug)]
pub struct Window {
    conn: u64,
    /// The QP it is bound to.
    qpn: u32,
    /// The volume's segment it reaches.
    segment: usize,
    /// None once deallocated.
    mw: Option<Mw>,
    /// The segment's registration it is bound within (kept until the window is gone).
    region: Arc<Registration>,
    counters: Arc<Counters>,
    /// Wakes the connection, to disconnect it after a failed deallocation.
    waker: Waker,
    /// The session's connections whose window failed to deallocate.
    stuck: Arc<Mutex<Vec<u64>>>,
}

impl Window {
    /// Counts `mw`, bound to connection `conn`'s QP `ep` over segment `segment` (`region`), in.
    fn new(
        conn: u64,
        ep: &Endpoint,
        segment: usize,
        mw: Mw,
        region: Arc<Registration>,
        counters: Arc<Counters>,
        stuck: Arc<Mutex<Vec<u64>>>,
    ) -> Window {
        counters.windows.fetch_add(1, Ordering::SeqCst);
        Window { conn, qpn: ep.qp_num(), segment, mw: Some(mw), region, counters, waker: ep.waker(), stuck }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        self.counters.windows.fetch_sub(1, Ordering::SeqCst);
        let Some(mw) = self.mw.take() else { return };
        let (conn, qpn, segment, rkey) = (self.conn, self.qpn, self.segment, format_args!("{:#x}", mw.rkey()));
        match mw.dealloc() {
            Ok(()) => tracing::debug!(conn, qpn, segment, %rkey, "window revoked"),
            Err(e) => {
                self.counters.window_dealloc_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    conn,
                    qpn,
                    %rkey,
                    error = %Chain(&e),
                    "deallocating the memory window failed, so its rkey may still work: disconnecting conn {conn}, \
                     whose QP the window is bound to, so that the rkey dies with the QP"
                );
                self.stuck.lock().unwrap_or_else(|p| p.into_inner()).push(conn);
                self.waker.wake();
            }
        }
    }
}

/// How a session reaches its volume.
#[derive(Debug)]
pub enum Grant {
    /// Registrations of the volume in the session's own protection domain, each with one rkey
    /// for all its QPs (the fallback: devices without type 2B windows, initiators without
    /// [`rblk_proto::FEATURE_WINDOWS`]): one per segment for an initiator with
    /// [`rblk_proto::FEATURE_SEGMENTS`], else one over the whole volume as it opened it.
    Own(Vec<Registration>),
    /// Windows over the volume's shared registrations of its segments (no remote access of
    /// their own, see [`crate::volume::Volume::region`]), one bound to each of the session's
    /// QPs per segment, in segment order.
    Windows(Vec<Window>),
}

/// Why a window could not be bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BindError {
    /// The session was closed, replaced or its access revoked meanwhile.
    #[error("the session's access to the volume was revoked")]
    Revoked,
    /// The session has a registration of its own, not windows.
    #[error("the session does not use memory windows")]
    NoWindows,
    /// Allocating or binding the window failed.
    #[error("binding a memory window failed")]
    Fabric(#[source] rblk_fabric::Error),
}

/// The remote access a session opened `mode` gets: read-only opens read, the others write too.
pub fn remote_access(mode: OpenMode) -> Access {
    if mode == OpenMode::ReadOnly {
        Access::REMOTE_READ
    } else {
        Access::REMOTE_READ_WRITE
    }
}

/// The wr_id of a window bind on a connection's QP (not a control work request: the connection
/// loop checks its completion apart).
pub const BIND_WR_ID: u64 = 1;

/// An open session.
#[derive(Debug)]
pub struct Session {
    /// Session id (not secret).
    pub id: u64,
    /// Token a further QP must present to join (secret).
    pub token: [u8; TOKEN_LEN],
    /// The protection domain all its QPs live in.
    pub pd: Pd,
    /// The volume it opened.
    pub volume: Arc<Volume>,
    /// How.
    pub mode: OpenMode,
    /// Features the opening connection negotiated; they hold for the connections that join.
    pub features: u64,
    /// Its initiator knows segments ([`rblk_proto::FEATURE_SEGMENTS`], with the instance tail
    /// they follow): it reaches every segment and hears of grows. Else it reaches the volume as
    /// it opened it: `opened_size` bytes through one rkey per QP.
    pub segmented: bool,
    /// The size the volume had for the session at OPEN (an older initiator's, for good).
    pub opened_size: u64,
    /// Whom it counts against.
    pub owner: Owner,
    /// What its opening connection proved at AUTH (a reload that changes the key its host must
    /// prove ends the session: see [`crate::access::Policy::revokes`]).
    pub credential: Credential,
    members: Mutex<Members>,
    /// None once released: no rkey of the session works any more.
    grant: Mutex<Option<Grant>>,
    /// Whether the grant is [`Grant::Windows`] (kept after release, for STATS).
    windows: bool,
    counters: Arc<Counters>,
    /// Its FLUSHes whose write-back runs, and when the last one ended (see
    /// [`Session::flushes`]).
    flushes: Mutex<(usize, Option<std::time::Instant>)>,
    /// Connections whose window failed to deallocate (see [`Window`]).
    stuck: Arc<Mutex<Vec<u64>>>,
    /// When the initiator was last heard from on any of the session's connections, or a SEND
    /// of ours to it last completed: milliseconds on [`clock_ms`]'s clock.
    heard_ms: AtomicU64,
}

/// Milliseconds since the first call, on the monotonic clock: what [`Session::heard`] keeps
/// in an atomic.
fn clock_ms(at: Instant) -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    u64::try_from(at.saturating_duration_since(epoch).as_millis()).unwrap_or(u64::MAX)
}

/// The connections of a session (the opener and its joiners), by connection id.
#[derive(Debug, Default)]
struct Members {
    conns: Vec<u64>,
    /// Those of `conns` known to be going (their peer disconnected, or they ended here) but
    /// not torn down yet: they no longer count against the caps (see [`Session::depart`]).
    departed: Vec<u64>,
    /// Woken once the last connection left (see [`Session::when_empty`]).
    watchers: Vec<Waker>,
    /// Set once the session was ended from outside: nobody may join any more.
    ended: Option<Ended>,
}

/// Why a session was ended from outside, before its connections went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// A reconnecting OPEN replaced it.
    Replaced,
    /// A reload revoked its access.
    Revoked,
}

impl std::fmt::Display for Ended {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ended::Replaced => "session replaced by a reconnect",
            Ended::Revoked => "session's access revoked by a reload",
        })
    }
}

impl Session {
    /// A session of `volume` opened `mode`, reaching it through `grant` (its QPs in `pd`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: u64,
        pd: Pd,
        volume: Arc<Volume>,
        mode: OpenMode,
        grant: Grant,
        counters: Arc<Counters>,
        features: u64,
        owner: Owner,
        credential: Credential,
        opened_size: u64,
    ) -> Session {
        let windows = matches!(grant, Grant::Windows(_));
        Session {
            id,
            token: random(),
            pd,
            volume,
            mode,
            features,
            segmented: segmented(features),
            opened_size,
            owner,
            credential,
            members: Mutex::default(),
            grant: Mutex::new(Some(grant)),
            windows,
            counters,
            flushes: Mutex::default(),
            stuck: Arc::default(),
            heard_ms: AtomicU64::new(clock_ms(Instant::now())),
        }
    }

    /// The initiator was heard from at `at` on one of the session's connections (a message,
    /// or the completion of a SEND of ours, which its side acknowledged).
    pub fn heard(&self, at: Instant) {
        self.heard_ms.fetch_max(clock_ms(at), Ordering::Relaxed);
    }

    /// How long the session's initiator has not been heard from, at `now`.
    pub fn silent_for(&self, now: Instant) -> Duration {
        Duration::from_millis(clock_ms(now).saturating_sub(self.heard_ms.load(Ordering::Relaxed)))
    }

    /// Whether the window bound to connection `conn`'s QP failed to deallocate: its rkey may
    /// still work through that QP, so the connection must end (destroying its QP) now.
    pub fn window_stuck(&self, conn: u64) -> bool {
        self.stuck.lock().unwrap_or_else(|p| p.into_inner()).contains(&conn)
    }

    /// A FLUSH of the session's waits for its write-back (until [`Session::flush_ended`]).
    pub fn flush_began(&self) {
        self.flushes.lock().unwrap_or_else(|p| p.into_inner()).0 += 1;
    }

    /// A FLUSH of the session was answered or given up.
    pub fn flush_ended(&self) {
        let mut f = self.flushes.lock().unwrap_or_else(|p| p.into_inner());
        f.0 = f.0.saturating_sub(1);
        f.1 = Some(std::time::Instant::now());
    }

    /// Whether a FLUSH of the session waits for its write-back, and when the last one ended.
    /// An initiator that waits for a FLUSH may tick none of its other queue pairs meanwhile
    /// (a synchronous `Volume` has one thread), so the session's silence then, on any of its
    /// connections, is not loss.
    pub fn flushes(&self) -> (bool, Option<std::time::Instant>) {
        let f = self.flushes.lock().unwrap_or_else(|p| p.into_inner());
        (f.0 > 0, f.1)
    }

    /// Whether its QPs get a window each ([`Grant::Windows`]).
    pub fn uses_windows(&self) -> bool {
        self.windows
    }

    /// True if `token` is this session's (constant time).
    pub fn token_matches(&self, token: &[u8; TOKEN_LEN]) -> bool {
        self.token.ct_eq(token).into()
    }

    /// How many of the volume's segments the session reaches: all of them for an initiator that
    /// knows segments, the first one for an older initiator with windows (whose volume had one
    /// when it opened), its one registration's for an older one without.
    fn wanted(&self) -> usize {
        if self.segmented {
            self.volume.segment_count()
        } else {
            1
        }
    }

    /// Binds the next window connection `conn`'s QP `ep` lacks (read-only or read-write as the
    /// session was opened): over the lowest segment not yet bound to it, as work request
    /// [`BIND_WR_ID`]. False when it has all it should have ([`Session::wanted`]). The caller
    /// posts one at a time within its send queue's slack and sends the message that carries
    /// the rkeys ([`Session::reach`]) after the last: a QP executes its send queue in order, so
    /// the rkeys work by the time the initiator has them; a failed bind fails the QP, and with
    /// it that message.
    pub fn bind_next(&self, ep: &mut Endpoint, conn: u64) -> Result<bool, BindError> {
        let wanted = self.wanted();
        let mut grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Grant::Windows(bound)) = &mut *grant else {
            return Err(if grant.is_some() { BindError::NoWindows } else { BindError::Revoked });
        };
        let next = bound.iter().filter(|w| w.conn == conn).count();
        if next >= wanted {
            return Ok(false);
        }
        let region = self.volume.region(&self.pd, &self.counters, next).map_err(BindError::Fabric)?;
        let mr = region.mr();
        let mut mw = self.pd.alloc_mw().map_err(BindError::Fabric)?;
        ep.bind_mw(BIND_WR_ID, &mut mw, mr, 0, mr.len() as u64, remote_access(self.mode)).map_err(BindError::Fabric)?;
        let (counters, stuck) = (Arc::clone(&self.counters), Arc::clone(&self.stuck));
        bound.push(Window::new(conn, ep, next, mw, Arc::clone(&region), counters, stuck));
        Ok(true)
    }

    /// Whether connection `conn` lacks windows it should have ([`Session::bind_next`]).
    pub fn unbound(&self, conn: u64) -> bool {
        let wanted = self.wanted();
        match &*self.grant.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(Grant::Windows(bound)) => bound.iter().filter(|w| w.conn == conn).count() < wanted,
            _ => false,
        }
    }

    /// What connection `conn`'s QP reaches now: the volume's size as far as it reaches, and
    /// each segment's offset, address and rkey (a window's for this QP, or the session's own
    /// registration's). An older initiator's is the size it opened, through one segment. None
    /// once released, or while the QP has no window yet.
    pub fn reach(&self, conn: u64) -> Option<(u64, Segments)> {
        let offsets = self.volume.segment_offsets();
        let grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
        let list: Vec<(u64, u64, u32)> = match grant.as_ref()? {
            Grant::Own(regs) => regs.iter().map(|r| (r.mr().len() as u64, r.mr().addr(), r.mr().rkey())).collect(),
            Grant::Windows(bound) => {
                let mut mine: Vec<&Window> = bound.iter().filter(|w| w.conn == conn).collect();
                mine.sort_by_key(|w| w.segment);
                mine.iter()
                    .filter_map(|w| Some((w.region.mr().len() as u64, w.region.mr().addr(), w.mw.as_ref()?.rkey())))
                    .collect()
            }
        };
        if list.is_empty() {
            return None;
        }
        if !self.segmented {
            let (_, addr, rkey) = list[0];
            return Some((self.opened_size, Segments::one(addr, rkey, self.opened_size)));
        }
        let size = list.iter().map(|&(len, ..)| len).sum();
        let segs: Vec<Segment> = list
            .iter()
            .zip(offsets)
            .map(|(&(_, remote_addr, rkey), offset)| Segment { offset, remote_addr, rkey })
            .collect();
        Some((size, Segments::new(&segs, size).ok()?))
    }

    /// After the volume grew: a session with registrations of its own that knows segments
    /// registers the new ones in its protection domain (windows are bound by each connection:
    /// [`Session::bind_next`]).
    pub fn register_grown(&self) -> rblk_fabric::Result<()> {
        if !self.segmented {
            return Ok(());
        }
        let segments = self.volume.segments();
        let mut grant = self.grant.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Grant::Own(regs)) = &mut *grant else { return Ok(()) };
        while regs.len() < segments.len() {
            let mr = self.pd.register(&segments[regs.len()], remote_access(self.mode))?;
            regs.push(Registration::new(mr, Arc::clone(&self.counters)));
        }
        Ok(())
    }

    /// Counts connection `conn` in (the opener, or a joiner once admitted). False if the
    /// session was ended (replaced or revoked): the connection must not serve it.
    pub fn join(&self, conn: u64) -> bool {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if m.ended.is_none() {
            m.conns.push(conn);
        }
        m.ended.is_none()
    }

    /// Revokes the window bound to connection `conn`'s QP, if any: before that QP is destroyed
    /// (a bound window holds its QP; rxe's QP destroy waits for it).
    pub fn unbind(&self, conn: u64) {
        if let Some(Grant::Windows(bound)) = &mut *self.grant.lock().unwrap_or_else(|p| p.into_inner()) {
            bound.retain(|w| w.conn != conn);
        }
    }

    /// Connection `conn` is going (its peer disconnected, or it ended here) but is not torn
    /// down yet: from now on it no longer counts against the caps ([`Session::live`]), so a
    /// host that dropped sessions can open as many again at once. False if it is no member.
    pub fn depart(&self, conn: u64) -> bool {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        let member = m.conns.contains(&conn);
        if member && !m.departed.contains(&conn) {
            m.departed.push(conn);
        }
        member
    }

    /// Connections that count against the caps: the members not known to be going.
    pub fn live(&self) -> usize {
        let m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.conns.len().saturating_sub(m.departed.len())
    }

    /// The members not known to be going.
    pub fn live_connections(&self) -> Vec<u64> {
        let m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.conns.iter().copied().filter(|c| !m.departed.contains(c)).collect()
    }

    /// Counts connection `conn` out, once it has destroyed its QP. True if it was the last.
    pub fn leave(&self, conn: u64) -> bool {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        m.conns.retain(|&c| c != conn);
        m.departed.retain(|&c| c != conn);
        if m.conns.is_empty() {
            for w in m.watchers.drain(..) {
                w.wake();
            }
        }
        m.conns.is_empty()
    }

    /// Wakes `waker` once every connection has left (at once if none is left): how a
    /// reconnecting OPEN waits for the session it replaces without holding its thread.
    pub fn when_empty(&self, waker: Waker) {
        let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
        if m.conns.is_empty() {
            waker.wake();
        } else {
            m.watchers.push(waker);
        }
    }

    /// Live connections.
    pub fn connections(&self) -> usize {
        self.members.lock().unwrap_or_else(|p| p.into_inner()).conns.len()
    }

    /// For a reconnecting OPEN or a reload that revokes it: refuses further joins, deregisters
    /// (see [`Session::release`]) and returns the ids of the connections still serving the
    /// session, which the caller wakes so that they end.
    pub fn end(&self, how: Ended) -> Vec<u64> {
        let conns = {
            let mut m = self.members.lock().unwrap_or_else(|p| p.into_inner());
            m.ended.get_or_insert(how);
            m.conns.clone()
        };
        self.release();
        conns
    }

    /// Whether (and why) the session was ended from outside.
    pub fn ended(&self) -> Option<Ended> {
        self.members.lock().unwrap_or_else(|p| p.into_inner()).ended
    }

    /// Revokes the session's access (deregisters its own registration, or deallocates its
    /// windows) and gives up the open mode (idempotent). After this no rkey of the session works.
    pub fn release(&self) {
        let grant = self.grant.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(grant) = grant {
            drop(grant);
            self.volume.release(self.id, self.mode);
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.release();
    }
}

/// Whether an initiator with `features` knows segments: [`rblk_proto::FEATURE_SEGMENTS`], and
/// [`rblk_proto::FEATURE_RECONNECT`], whose instance tail the segments tail follows.
pub fn segmented(features: u64) -> bool {
    let both = rblk_proto::FEATURE_SEGMENTS | rblk_proto::FEATURE_RECONNECT;
    features & both == both
}

pub use rblk_fabric::random;

/// A fresh challenge nonce.
pub fn nonce() -> [u8; NONCE_LEN] {
    random()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_differ() {
        assert_ne!(nonce(), nonce());
    }
}
