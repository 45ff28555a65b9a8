//! Handing the volumes to a successor daemon: an upgrade (or a restart) that loses nothing and
//! reads or writes no volume data.
//!
//! Every volume's bytes live in a sealed memfd ([`crate::volume`]), and a durable volume's
//! backing store is claimed by its open file description ([`crate::persist`]). A handover
//! passes those descriptors, with a small versioned [`State`] record (names, sizes, backing
//! paths, instance identities, and whether a session could have written each volume since its
//! last whole write-back), to the successor, which maps the same pages and serves them under
//! the same instance identities. Initiators lose their connections, reconnect, find the same
//! instances and replay what was in flight; a durable volume's next FLUSH writes what its
//! initiators wrote, as it would have.
//!
//! Two ways, both asked for explicitly (SIGTERM stays a plain stop with a final flush):
//!
//! - **`rblk-target --takeover`** (any machine): the successor connects to the running daemon's
//!   admin socket and sends `{"version":1,"op":"takeover","formats":[1,2]}`. The daemon stops
//!   listening (the port is free), holds its volumes' write-backs (a FLUSH under way finishes;
//!   later ones wait), and sends the state and the descriptors (SCM_RIGHTS, [`rblk_fabric::fdpass`]).
//!   The successor checks them against its configuration, maps, binds the port and says
//!   `takeover-ready`; the old daemon answers `bye`, disconnects its sessions without a final
//!   flush and exits 0; only then does the successor accept connections. Until `bye` the old
//!   daemon holds every descriptor: a successor that refuses (`takeover-abort`), crashes or
//!   stays silent past the deadline leaves it listening and flushing again, having lost
//!   nothing. A successor whose old daemon vanishes before `bye` refuses to serve (it cannot
//!   know what the other did last), rather than half-serving.
//! - **`rblk-target admin handover`** (under systemd): the daemon does the same up to the
//!   descriptors, which it puts in the service manager's file descriptor store (`FDSTORE=1`,
//!   named `rblk-fd-N` and [`STATE_FDNAME`]), then exits with [`EXIT_HANDED_OVER`], which the
//!   unit lists in `RestartForceExitStatus=`. systemd starts the successor with the descriptors
//!   (`LISTEN_FDS`, `LISTEN_FDNAMES`); it takes the volumes from them, and once READY removes
//!   them from the store (`FDSTOREREMOVE=1`). A successor that fails before READY is restarted
//!   with the descriptors still stored.
//!
//! State formats: the successor names those it reads ([`FORMATS`]) and the old daemon writes the
//! newest of them it writes too; into the service manager's store, whose reader it does not
//! know, it writes the oldest that holds the state ([`State::oldest_format`]), so an older
//! successor reads it whenever it can.
//!
//! The successor refuses a state format it does not know, a `block_size` other than the
//! state's, and a configuration that changes a handed volume's size or backing path or lacks
//! one that `confirm_remove` does not list ([`check`]); volumes only in its configuration are
//! created or loaded as at a start, and confirmed volumes only in the state are removed once
//! the old daemon is gone, as a reload removes them (a durable one is flushed). `admin
//! handover` runs the same checks from the new binary before the daemon exits ([`preflight`]).
//!
//! Waits are bounded by silence, not size: each side gives up after [`SILENCE`] without a word
//! from the other, and the successor reports each volume it maps or loads, and every
//! [`PROGRESS_EVERY`] during one, so a large handover never times out.
//!
//! Memory windows, registrations and rkeys are the successor's own. So that the pause the
//! initiators see after `bye` holds nothing that grows with the volumes' size, the state names
//! the RDMA devices each volume was registered on for memory windows (format 2), and the
//! successor registers it there before it says ready, while the old daemon still serves
//! ([`Handed::register_ahead`]). Without them (a format 1 record, a volume nobody opened, the
//! service manager's store, where the old daemon is gone before the successor starts and
//! registering first would save nothing), and in per-session registration mode (each session's
//! own PD), registration happens at the first OPEN, as at a start.

use std::collections::HashMap;
use std::io::{BufRead as _, BufReader, Write as _};
use std::os::fd::{AsFd as _, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rblk_proto::VolumeId;
use tracing::{info, warn};

pub use crate::errors::{HandoverError, FORMAT, FORMATS};
pub use crate::notify::STATE_FDNAME;
pub use crate::registry::StoreSink;

use crate::admin_protocol::{self, Expected, Request, VERSION};
use crate::config::VolumeSpec;
use crate::persist::Backing;
use crate::registry::Shared;
use crate::volume::Volume;

/// The fd store names of the volumes' descriptors: this, then the index in [`State`].
pub const FD_PREFIX: &str = "rblk-fd-";
/// The exit status after a handover to the service manager (EX_TEMPFAIL): the unit lists it in
/// `RestartForceExitStatus=`, so systemd starts the successor at once.
pub const EXIT_HANDED_OVER: u8 = 75;
/// The longest a state record or a reply frame may be: a state record past it is refused
/// unread.
pub const MAX_FRAME: usize = 16 << 20;
/// How long either side of a handover waits without a word from the other (a reply, a
/// descriptor frame, a progress report, the verdict, `bye`) before it gives up; the old
/// daemon then serves on.
pub const SILENCE: Duration = Duration::from_secs(30);
/// The successor reports progress at least this often during one long step (mapping a large
/// volume, loading a durable one).
pub const PROGRESS_EVERY: Duration = Duration::from_secs(4);

/// What is handed over besides the descriptors.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct State {
    /// One of [`FORMATS`].
    pub format: u32,
    /// The old daemon's pid.
    pub pid: u32,
    /// The old daemon's version (`rblk-target X.Y.Z`), for the log.
    pub daemon: String,
    /// Its block size (a successor with another one refuses).
    pub block_size: u32,
    /// The volumes it served.
    pub volumes: Vec<HandedVolume>,
}

/// One volume in a [`State`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HandedVolume {
    /// Its name.
    pub name: String,
    /// Its size in bytes (its memfd's).
    pub size: u64,
    /// A durable volume's backing store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Its instance identity (32 hex digits): the successor serves the same instance.
    pub instance: String,
    /// Whether a session could have written it since it was last written back whole: the
    /// successor's final flush writes it back whole only then.
    pub written: bool,
    /// A write-back failed: it stays failed.
    pub failed: bool,
    /// Format 1: its memfd, an index into the descriptors (format 2 has [`segments`](Self::segments)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memfd: Option<usize>,
    /// Format 2: its memory, in order: each segment's memfd (an index into the descriptors) and
    /// length. One segment (volumes do not grow yet: a successor refuses more).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub segments: Vec<Segment>,
    /// Format 2: `(offset, len)` ranges zeroed in memory whose punch in the backing store is
    /// still to do; the successor punches them before it serves. Always empty from this
    /// daemon: zeroing runs in write-back passes, which a handover holds, so a DISCARD queued
    /// behind the hold is never answered here and its initiator sends it again to the successor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub punches: Vec<(u64, u64)>,
    /// Format 2: the RDMA devices the old daemon had the volume registered on for memory
    /// windows, for the successor to register it there before it says ready
    /// ([`Handed::register_ahead`]); None: not said (the successor registers at the first OPEN,
    /// as at a start). Advice only: a state that needs format 1 alone is written in it without
    /// them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Vec<String>>,
    /// Its backing store's descriptor: an index into the descriptors.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing: Option<usize>,
}

/// A segment of a volume's memory in a format 2 [`State`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Segment {
    /// Its memfd: an index into the descriptors.
    pub memfd: usize,
    /// Its length in bytes.
    pub len: u64,
}

impl HandedVolume {
    /// Its memory's segments (descriptor index and length, in order) and what its format says
    /// beyond them, checked: a format 1 entry has `memfd` (one segment, the whole volume) and
    /// nothing of format 2; a format 2 entry has 1 to [`rblk_proto::MAX_SEGMENTS`] segments, none
    /// empty, that add up to the volume, and no `memfd`.
    fn memory(&self, format: u32) -> Result<Vec<Segment>, String> {
        match (format, self.memfd, self.segments.as_slice()) {
            (1, Some(fd), []) if self.punches.is_empty() && self.devices.is_none() => {
                Ok(vec![Segment { memfd: fd, len: self.size }])
            }
            (1, _, _) => Err("a format 1 entry needs its memfd and has no segments, punches or devices".into()),
            (_, None, []) => Err("no memory segment".into()),
            (_, None, list) if list.len() > rblk_proto::MAX_SEGMENTS => {
                Err(format!("{} memory segments: at most {}", list.len(), rblk_proto::MAX_SEGMENTS))
            }
            (_, None, list) => {
                let total = list.iter().try_fold(0u64, |sum, g| (g.len > 0).then(|| sum.checked_add(g.len)).flatten());
                match total {
                    Some(total) if total == self.size => Ok(list.to_vec()),
                    Some(total) => Err(format!("its segments hold {total} bytes, not the volume's {}", self.size)),
                    None => Err("an empty memory segment".into()),
                }
            }
            (_, Some(_), _) => Err("a format 2 entry has segments, not a memfd".into()),
        }
    }

    /// Its punches, checked against its size: none empty, none past the end.
    fn checked_punches(&self) -> Result<&[(u64, u64)], String> {
        match self.punches.iter().find(|&&(o, l)| l == 0 || o.checked_add(l).is_none_or(|e| e > self.size)) {
            Some(&(o, l)) => Err(format!("a punch {o}+{l} outside the volume")),
            None => Ok(&self.punches),
        }
    }
}

impl State {
    /// The oldest format that holds this state (format 1 has one memfd per volume and no
    /// punches; the devices, advice only, are left out of it).
    pub fn oldest_format(&self) -> u32 {
        let simple = |v: &HandedVolume| v.segments.len() <= 1 && v.punches.is_empty();
        if self.volumes.iter().all(simple) {
            1
        } else {
            FORMAT
        }
    }

    /// This state written in `format` (one of [`FORMATS`], at least [`State::oldest_format`]).
    pub fn in_format(&self, format: u32) -> State {
        let mut s = self.clone();
        s.format = format;
        for v in &mut s.volumes {
            let memfd = v.memfd.or(v.segments.first().map(|g| g.memfd));
            if format == 1 {
                v.memfd = memfd;
                v.segments.clear();
                v.devices = None;
            } else {
                v.memfd = None;
                if v.segments.is_empty() {
                    v.segments = memfd.map(|memfd| Segment { memfd, len: v.size }).into_iter().collect();
                }
            }
        }
        s
    }
}

/// What the successor was handed: the state, the descriptors, and the way back to the old
/// daemon (None when they came from the service manager's store).
#[derive(Debug)]
pub struct Handed {
    state: State,
    /// Behind a lock so that a volume can be adopted while progress is reported.
    fds: std::sync::Mutex<Vec<Option<OwnedFd>>>,
    peer: Option<UnixStream>,
    /// The old daemon's admin socket, which goes when it exits.
    socket: Option<PathBuf>,
    /// The fd store names to remove once serving.
    stored: Vec<String>,
    started: Instant,
    /// How many volumes were handed over.
    handed: usize,
    /// The volumes taken ([`Handed::take`]) and the devices the state names for each.
    ahead: Vec<(String, Vec<String>)>,
}

impl Handed {
    /// Asks the daemon serving the admin socket at `socket` to hand its volumes over, and
    /// receives them. It has stopped listening and holds its write-backs when this returns Ok.
    pub fn request(socket: &Path) -> Result<Handed, HandoverError> {
        let started = Instant::now();
        let stream = admin_protocol::connect(socket).map_err(HandoverError::Connect)?;
        stream.set_read_timeout(Some(SILENCE)).map_err(HandoverError::Io)?;
        let line = serde_json::json!({"version": VERSION, "op": "takeover", "formats": FORMATS});
        let line = format!("{line}\n");
        (&stream).write_all(line.as_bytes()).map_err(HandoverError::Io)?;
        let (reply, mut fds) = recv_frame(&stream)?;
        let reply: TakeoverReply =
            serde_json::from_slice(&reply).map_err(|e| HandoverError::Malformed(format!("the reply: {e}")))?;
        if !reply.ok {
            return Err(HandoverError::Refused(reply.message));
        }
        while fds.len() < reply.fds {
            let (_, more) = recv_frame(&stream)?;
            if more.is_empty() {
                return Err(HandoverError::Malformed("a descriptor frame without descriptors".into()));
            }
            fds.extend(more);
        }
        let state = match reply.state.ok_or_else(|| HandoverError::Malformed("no state".into())).and_then(parse_state) {
            Ok(state) => state,
            Err(e) => {
                send_abort(&stream, &e.to_string());
                return Err(e);
            }
        };
        Ok(Handed {
            handed: state.volumes.len(),
            state,
            fds: std::sync::Mutex::new(fds.into_iter().map(Some).collect()),
            peer: Some(stream),
            socket: Some(socket.to_owned()),
            stored: Vec::new(),
            started,
            ahead: Vec::new(),
        })
    }

    /// The handover in the service manager's store, among the descriptors passed at start
    /// (`LISTEN_FDS`); None when there is no state record. Stray `rblk-fd-N` descriptors
    /// without a state record are closed and removed from the store.
    pub fn from_store(passed: Vec<(String, OwnedFd)>) -> Result<Option<Handed>, HandoverError> {
        let mut state = None;
        let mut by_index = HashMap::new();
        let mut stored = Vec::new();
        for (name, fd) in passed {
            if name == STATE_FDNAME {
                state = Some(fd);
            } else if let Some(i) = name.strip_prefix(FD_PREFIX).and_then(|i| i.parse::<usize>().ok()) {
                by_index.insert(i, fd);
            } else {
                warn!(name, "ignoring a descriptor passed at start that is not rblk-target's");
                continue;
            }
            stored.push(name);
        }
        let Some(state) = state else {
            if !stored.is_empty() {
                warn!(count = stored.len(), "descriptors of an unfinished handover without its state: dropped");
                crate::handover::forget_stored(&stored);
            }
            return Ok(None);
        };
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut std::io::Read::take(std::fs::File::from(state), MAX_FRAME as u64 + 1),
            &mut text,
        )
        .map_err(|e| HandoverError::Malformed(format!("the state record cannot be read: {e}")))?;
        if text.len() > MAX_FRAME {
            return Err(HandoverError::Malformed(format!(
                "the state record is larger than {MAX_FRAME} bytes: refused unread"
            )));
        }
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| HandoverError::Malformed(format!("the state record: {e}")))?;
        let state = parse_state(value)?;
        let count = by_index.keys().max().map_or(0, |m| m + 1);
        let fds = std::sync::Mutex::new((0..count).map(|i| by_index.remove(&i)).collect());
        let handed = state.volumes.len();
        Ok(Some(Handed {
            state,
            fds,
            peer: None,
            socket: None,
            stored,
            started: Instant::now(),
            handed,
            ahead: Vec::new(),
        }))
    }

    /// The state handed over.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// The fd store names to remove once the successor serves (see [`forget_stored`]).
    pub fn stored_names(&self) -> &[String] {
        &self.stored
    }

    /// Tells the old daemon the handover is off (it serves on), with the reason.
    pub(crate) fn abort(&mut self, reason: &str) {
        if let Some(peer) = self.peer.take() {
            send_abort(&peer, reason);
        }
    }

    /// Tells the old daemon the successor is ready to accept connections, and waits for its
    /// `bye`: after it, the old daemon disconnects its sessions and exits.
    pub(crate) fn ready(&mut self) -> Result<(), HandoverError> {
        let Some(peer) = self.peer.as_ref() else { return Ok(()) };
        let line = format!("{{\"version\":{},\"op\":\"takeover-ready\"}}\n", VERSION);
        let _ = peer.set_read_timeout(Some(SILENCE));
        if (&*peer).write_all(line.as_bytes()).is_err() {
            return Err(HandoverError::OldDaemonGone);
        }
        match recv_frame(peer) {
            Ok((bye, _)) if serde_json::from_slice::<TakeoverReply>(&bye).is_ok_and(|r| r.ok) => {
                info!(
                    pid = self.state.pid,
                    took = ?self.started.elapsed(),
                    "took over {} from {}",
                    crate::counted(self.handed, "volume"),
                    self.state.daemon
                );
                Ok(())
            }
            _ => Err(HandoverError::OldDaemonGone),
        }
    }

    /// Checks the state against the configuration the successor starts with ([`check`]).
    pub fn check(&self, cfg: &crate::config::Config) -> Result<(), HandoverError> {
        let handed: Vec<VolumeSpec> = self
            .state
            .volumes
            .iter()
            .map(|h| VolumeSpec { name: h.name.clone(), size: h.size, path: h.path.clone() })
            .collect();
        check(self.state.block_size, &handed, cfg)
    }

    /// Tells the old daemon the successor is making progress (`what`), so that it keeps
    /// waiting ([`SILENCE`]). Nothing after a handover from the fd store.
    pub(crate) fn progress(&self, what: &str) {
        if let Some(peer) = &self.peer {
            let line = serde_json::json!({"version": VERSION, "op": "takeover-progress", "what": what});
            let _ = (&*peer).write_all(format!("{line}\n").as_bytes());
        }
    }

    /// Runs `f`, one step that may take long, reporting `what` at once and every
    /// [`PROGRESS_EVERY`] until it returns.
    pub(crate) fn step<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        self.progress(what);
        let Some(peer) = self.peer.as_ref().and_then(|p| p.try_clone().ok()) else { return f() };
        let (done, ticks) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|scope| {
            scope.spawn(move || {
                let started = Instant::now();
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = ticks.recv_timeout(PROGRESS_EVERY) {
                    let line = serde_json::json!({
                        "version": VERSION, "op": "takeover-progress",
                        "what": format!("{what} ({} s)", started.elapsed().as_secs()),
                    });
                    if (&peer).write_all(format!("{line}\n").as_bytes()).is_err() {
                        break;
                    }
                }
            });
            let out = f();
            drop(done);
            out
        })
    }

    /// Takes handed volume `name`: its memory mapped from its memfd (the same pages), its
    /// backing store adopted with its claim. None when the state has no such volume.
    pub(crate) fn take(&mut self, name: &str) -> Option<Result<Volume, HandoverError>> {
        let i = self.state.volumes.iter().position(|h| h.name == name)?;
        let h = self.state.volumes.remove(i);
        if let Some(devices) = h.devices.clone().filter(|d| !d.is_empty()) {
            self.ahead.push((h.name.clone(), devices));
        }
        let what = format!("mapping volume {} ({} bytes)", h.name, h.size);
        Some(self.step(&what, || self.adopt(h)))
    }

    /// Registers each volume taken ([`Handed::take`]) for memory windows on the devices the
    /// old daemon had it registered on, in `shared`'s window domain there, before the successor
    /// says ready: the pinning, which grows with the volume, happens while the old daemon still
    /// serves, and the first OPEN after `bye` finds the registration made. Reports progress as
    /// every step does ([`Handed::step`]). A device this daemon does not serve (another
    /// `device =`, windows off, no type 2B windows, gone) is skipped, and a registration that
    /// fails is left to the first OPEN, which reports it as at a start. Per-session
    /// registration (devices or initiators without windows) happens in each session's own PD
    /// at its OPEN: nothing here.
    pub(crate) fn register_ahead(&self, shared: &Shared) {
        let started = Instant::now();
        let mut registered = 0;
        for (name, devices) in &self.ahead {
            let Some(volume) = shared.catalog().volumes.get(name).cloned() else { continue };
            for device in devices {
                if shared.fixed.device.as_ref().is_some_and(|d| d != device) {
                    info!(volume = %name, device, "not registering ahead: this daemon serves another device");
                    continue;
                }
                let what = format!("registering volume {name} ({}) on {device}", rblk_proto::Bytes(volume.size()));
                let done = self.step(&what, || match shared.window_domain(device)? {
                    // Every segment (regions register in order up to the last).
                    Some(pd) => volume.region(&pd, &shared.counters, volume.segment_count() - 1).map(|_| true),
                    None => Ok(false),
                });
                match done {
                    Ok(true) => registered += 1,
                    Ok(false) => info!(volume = %name, device, "not registering ahead: no memory windows here"),
                    Err(e) => warn!(
                        volume = %name,
                        device,
                        error = %rblk_fabric::Chain(&e),
                        "registering ahead failed: the volume's first OPEN registers it"
                    ),
                }
            }
        }
        if registered > 0 {
            info!(
                registered,
                took = ?started.elapsed(),
                "registered the handed volumes ahead, before saying ready: the first OPENs pin nothing"
            );
        }
    }

    /// The handed volumes the successor's configuration did not take ([`Handed::take`]):
    /// those it confirmed removing ([`check`] refuses the others).
    pub(crate) fn take_rest(&mut self) -> Vec<Result<Volume, HandoverError>> {
        let rest = std::mem::take(&mut self.state.volumes);
        rest.into_iter()
            .map(|h| {
                let what = format!("mapping volume {} to remove it", h.name);
                self.step(&what, || self.adopt(h))
            })
            .collect()
    }

    fn adopt(&self, h: HandedVolume) -> Result<Volume, HandoverError> {
        let fail = |reason: String| HandoverError::Volume { name: h.name.clone(), reason };
        let fd = |i: usize| {
            let mut fds = self.fds.lock().unwrap_or_else(|p| p.into_inner());
            fds.get_mut(i).and_then(Option::take).ok_or_else(|| fail(format!("descriptor {i} is missing")))
        };
        let listed = h.memory(self.state.format).map_err(fail)?;
        let memfds = listed.iter().map(|g| fd(g.memfd)).collect::<Result<Vec<_>, _>>()?;
        let punches = h.checked_punches().map_err(fail)?.to_vec();
        let backing_fd = h.backing.map(fd).transpose()?;
        let instance = VolumeId::from_hex(&h.instance).ok_or_else(|| fail(format!("bad instance {:?}", h.instance)))?;
        let reserve = usize::try_from(crate::volume::reserve_for(h.size)).map_err(|_| fail("too large".into()))?;
        let mapped = |e: rblk_fabric::Error| fail(rblk_fabric::Chain(&e).to_string());
        // Each segment checked (sealed, its size) and mapped after the one before.
        let reservation = rblk_fabric::Reservation::new(reserve).map_err(mapped)?;
        let mut segments = Vec::with_capacity(listed.len());
        for (g, memfd) in listed.iter().zip(memfds) {
            let len = usize::try_from(g.len).map_err(|_| fail("too large".into()))?;
            segments.push(rblk_fabric::Memory::from_memfd_in(&h.name, memfd, len, &reservation).map_err(mapped)?);
        }
        let memory = rblk_fabric::Memory::span(&reservation, segments).map_err(mapped)?;
        let backing = match (&h.path, backing_fd) {
            (Some(path), Some(fd)) => Some(
                Backing::adopt(path, std::fs::File::from(fd), h.size, h.failed)
                    .map_err(|e| fail(rblk_fabric::Chain(&e).to_string()))?,
            ),
            (None, None) => None,
            _ => return Err(fail("a backing path without its descriptor, or the reverse".into())),
        };
        if !punches.is_empty() {
            // Zeroed in the memory already; the backing store's punches, before anyone reads it.
            let jobs: Vec<crate::persist::Job> =
                punches.iter().map(|&(offset, len)| crate::persist::Job::Zero { offset, len, keep: false }).collect();
            match &backing {
                Some(b) => b.apply(&memory, &jobs).map_err(|e| fail(format!("its pending punches: {e}")))?,
                None => jobs.iter().try_for_each(|j| j.zero_memory(&memory)).map_err(|e| fail(e.to_string()))?,
            }
            info!(volume = %h.name, count = punches.len(), "the old daemon's pending punches done");
        }
        info!(volume = %h.name, instance = %instance, written = h.written, "taking the volume over: the same pages and instance");
        Ok(Volume::adopt(&h.name, memory, self.state.block_size, backing, instance, h.written))
    }

    /// The old daemon's admin socket, which it removes when it exits.
    pub(crate) fn old_socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }
}

/// Tells the old daemon at the other end of `peer` that the handover is off (it serves on).
fn send_abort(peer: &UnixStream, reason: &str) {
    let line = serde_json::json!({"version": VERSION, "op": "takeover-abort", "reason": reason});
    let _ = (&*peer).write_all(format!("{line}\n").as_bytes());
}

/// The reply frame of a takeover request, and the `bye` frame.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct TakeoverReply {
    version: u64,
    ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    message: String,
    /// The state, as JSON (its format is checked before it is read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<serde_json::Value>,
    /// How many descriptors follow (with this frame and the next ones).
    #[serde(default)]
    fds: usize,
}

/// Reads a state record, refusing a format not in [`FORMATS`] before anything else.
pub fn parse_state(value: serde_json::Value) -> Result<State, HandoverError> {
    match value.get("format") {
        Some(f) if f.as_u64().is_some_and(|f| FORMATS.iter().any(|&k| u64::from(k) == f)) => {}
        Some(f) => return Err(HandoverError::Format(f.to_string())),
        None => return Err(HandoverError::Malformed("no format".into())),
    }
    serde_json::from_value(value).map_err(|e| HandoverError::Malformed(e.to_string()))
}

/// `rblk-target admin handover`, run by the successor's binary: before it asks the daemon
/// serving `socket` to hand its volumes to the service manager and exit, the checks the
/// successor will run ([`check_successor`]) against the daemon's arguments (its
/// `/proc/PID/cmdline`, the PID from `SO_PEERCRED`; systemd starts the successor with the
/// same `ExecStart=`) and the volumes it serves. Returns those volumes, for the daemon to
/// refuse if they changed meanwhile ([`Request::Handover`]).
pub fn preflight(socket: &Path) -> Result<Vec<Expected>, HandoverError> {
    let stream = admin_protocol::connect(socket).map_err(HandoverError::Connect)?;
    let creds = nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| HandoverError::Io(e.into()))?;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", creds.pid())).map_err(HandoverError::Io)?;
    let argv: Vec<std::ffi::OsString> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| std::ffi::OsStr::from_bytes(a).to_owned())
        .collect();
    let reply = admin_protocol::request_on(stream, socket, &Request::List).map_err(HandoverError::Connect)?;
    let served: Vec<Expected> = reply
        .volumes
        .unwrap_or_default()
        .into_iter()
        .filter(|v| v.state != "refused")
        .map(|v| Expected { name: v.name, size: v.size, path: v.path })
        .collect();
    check_successor(&argv, &served)?;
    Ok(served)
}

/// What the successor started with `argv` would do with the volumes `served`: refused (the
/// daemon serves on) if its arguments do not parse, its configuration (with
/// `STATE_DIR/admin.toml`) does not pass `--check-config` (which the unit's `ExecStartPre=`
/// runs), or it would drop or change a volume ([`check`]).
pub fn check_successor(argv: &[std::ffi::OsString], served: &[Expected]) -> Result<(), HandoverError> {
    let cfg = successor_config(argv)?;
    let handed: Vec<VolumeSpec> =
        served.iter().map(|v| VolumeSpec { name: v.name.clone(), size: v.size, path: v.path.clone() }).collect();
    check(cfg.block_size, &handed, &cfg)
}

/// The configuration a daemon started with `argv` builds (the config file, `admin.toml`, the
/// flags), checked as `--check-config` checks it; refused with the reason.
pub fn successor_config(argv: &[std::ffi::OsString]) -> Result<crate::config::Config, HandoverError> {
    use clap::Parser as _;
    let refuse = |why: String| HandoverError::Successor(why);
    let shown = argv.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" ");
    let args = crate::cli::Args::try_parse_from(argv)
        .map_err(|e| refuse(format!("it does not take the daemon's arguments ({shown}): {}", e.kind())))?;
    if args.command.is_some() || args.print_config || args.check_config {
        return Err(refuse(format!("the daemon's arguments ({shown}) do not start a daemon")));
    }
    let file = args.effective().map_err(|e| refuse(rblk_fabric::Chain(&e).to_string()))?;
    let cfg = file.as_checked().server_config().map_err(|e| refuse(rblk_fabric::Chain(&e).to_string()))?;
    let policy = cfg.check().map_err(|e| refuse(rblk_fabric::Chain(&e).to_string()))?;
    let errors: Vec<String> = crate::lint::lint(&cfg, &policy, crate::lint::Memory::of_this_host())
        .into_iter()
        .filter(|f| f.level == crate::lint::Level::Error)
        .map(|f| f.text)
        .collect();
    if !errors.is_empty() {
        return Err(refuse(format!("--check-config fails: {}", errors.join("; "))));
    }
    Ok(cfg)
}

/// The successor's checks of the volumes a daemon hands over (`block_size`, `handed`) against
/// the configuration it starts with: the same block size, every handed volume kept with the
/// same backing path and the same size or a larger one (the successor grows it once adopted),
/// or dropped only when `confirm_remove` lists it. Run by the
/// successor before it serves, and by `rblk-target admin handover` before it asks the daemon
/// to exit ([`preflight`]).
pub fn check(block_size: u32, handed: &[VolumeSpec], cfg: &crate::config::Config) -> Result<(), HandoverError> {
    let mut changed = Vec::new();
    if cfg.block_size != block_size {
        changed.push(format!("block_size {block_size} -> {}", cfg.block_size));
    }
    for h in handed {
        let Some(v) = cfg.volumes.iter().find(|v| v.name == h.name) else {
            if !cfg.confirm_remove.contains(&h.name) {
                changed.push(format!(
                    "volume {} is not in the configuration (in neither the config file nor admin.toml: add it, or \
                     list it in confirm_remove to drop it and its contents)",
                    h.name
                ));
            }
            continue;
        };
        // A larger size is a grow, which the successor applies once it adopted the volume.
        if v.size < h.size {
            changed.push(format!("volume {} size {} -> {} (a served volume cannot shrink)", h.name, h.size, v.size));
        }
        let same_path = match (&h.path, &v.path) {
            (None, None) => true,
            (Some(a), Some(b)) => canonical(a) == canonical(b),
            _ => false,
        };
        if !same_path {
            let show = |p: &Option<PathBuf>| p.as_ref().map_or_else(|| "RAM".to_owned(), |p| p.display().to_string());
            changed.push(format!("volume {} backing {} -> {}", h.name, show(&h.path), show(&v.path)));
        }
    }
    if changed.is_empty() {
        Ok(())
    } else {
        Err(HandoverError::Changed(changed.join(", ")))
    }
}

fn send_frame(stream: &UnixStream, payload: &[u8], fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
    let mut bytes = (payload.len() as u32).to_le_bytes().to_vec();
    bytes.extend_from_slice(payload);
    rblk_fabric::fdpass::send(stream, &bytes, fds)
}

fn recv_frame(stream: &UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), HandoverError> {
    let mut len = [0u8; 4];
    let gone = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            HandoverError::OldDaemonGone
        } else {
            HandoverError::Io(e)
        }
    };
    let mut fds = rblk_fabric::fdpass::recv(stream, &mut len).map_err(gone)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(HandoverError::Malformed(format!("a frame of {len} bytes")));
    }
    let mut payload = vec![0u8; len];
    if len > 0 {
        fds.extend(rblk_fabric::fdpass::recv(stream, &mut payload).map_err(gone)?);
    }
    Ok((payload, fds))
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned())
}

/// Removes `names` from the service manager's fd store (`FDSTOREREMOVE=1`), e.g. once the
/// successor serves what they held. Nothing without `NOTIFY_SOCKET`.
pub fn forget_stored(names: &[String]) {
    for name in names {
        let states = [sd_notify::NotifyState::FdStoreRemove, sd_notify::NotifyState::FdName(name)];
        if let Err(e) = sd_notify::notify(false, &states) {
            warn!(name, error = %e, "cannot remove a descriptor from the service manager's store");
        }
    }
}

// ---- The old daemon's side ----

/// Everything the old daemon holds still for the handover: the volumes (their write-backs
/// held) and the state describing them.
struct Prepared {
    volumes: Vec<Arc<Volume>>,
    /// Each volume's segments as the state lists them (a grow after this changes neither).
    segments: Vec<Vec<Arc<rblk_fabric::Memory>>>,
    state: State,
}

impl Prepared {
    fn fds(&self) -> Vec<BorrowedFd<'_>> {
        let mut fds = Vec::new();
        for (v, segments) in self.volumes.iter().zip(&self.segments) {
            fds.extend(segments.iter().filter_map(|m| m.fd()));
            if let Some(b) = &v.backing {
                fds.push(b.file().as_fd());
            }
        }
        fds
    }
}

/// Stops listening and holds every volume's write-backs (waiting for the passes under way),
/// then describes the volumes. Undone by [`resume`].
fn prepare(shared: &Arc<Shared>) -> Result<Prepared, String> {
    shared.set_port_open(false)?;
    let mut volumes: Vec<Arc<Volume>> = shared.catalog().volumes.values().cloned().collect();
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    for v in &volumes {
        v.hold_write_back();
    }
    let mut handed = Vec::new();
    let mut memories = Vec::new();
    let mut next = 0;
    for v in &volumes {
        let memory = v.memory();
        let mine = memory.segments();
        if mine.is_empty() || mine.iter().any(|m| m.fd().is_none()) {
            resume(shared, &volumes);
            return Err(format!("volume {}'s memory is not a memfd", v.name));
        }
        // The descriptors' order is Prepared::fds's: each segment's memfd, then the backing store.
        let segments: Vec<Segment> =
            mine.iter().enumerate().map(|(i, m)| Segment { memfd: next + i, len: m.len() as u64 }).collect();
        memories.push(mine.to_vec());
        next += segments.len();
        let backing = v.backing.as_ref().map(|_| next);
        next += usize::from(backing.is_some());
        handed.push(HandedVolume {
            name: v.name.clone(),
            size: memory.len() as u64,
            path: v.backing.as_ref().map(|b| b.path().to_owned()),
            instance: v.instance.to_string(),
            written: v.written(),
            failed: v.failed(),
            memfd: None,
            segments,
            punches: Vec::new(),
            devices: Some(v.registered_on()).filter(|d| !d.is_empty()),
            backing,
        });
    }
    let state = State {
        format: FORMAT,
        pid: std::process::id(),
        daemon: format!("rblk-target {}", env!("CARGO_PKG_VERSION")),
        block_size: shared.fixed.block_size,
        volumes: handed,
    };
    Ok(Prepared { volumes, segments: memories, state })
}

/// Undoes [`prepare`]: the write-backs run again, the port reopens.
fn resume(shared: &Arc<Shared>, volumes: &[Arc<Volume>]) {
    for v in volumes {
        v.release_write_back();
    }
    if shared.is_shutting_down() {
        // The listener thread is stopping and reopens nothing.
        return;
    }
    if let Err(e) = shared.set_port_open(true) {
        tracing::error!("cannot listen again after the handover fell through (the listener retries): {e}");
    }
    info!("serving on: listening and flushing again");
}

fn reply_frame(ok: bool, error: Option<&str>, message: &str, state: Option<&State>, fds: usize) -> Vec<u8> {
    let reply = TakeoverReply {
        version: VERSION,
        ok,
        error: error.map(str::to_owned),
        message: message.to_owned(),
        state: state.map(|s| serde_json::to_value(s).unwrap_or_default()),
        fds,
    };
    serde_json::to_vec(&reply).unwrap_or_default()
}

/// The old daemon's side of `--takeover` (the admin connection's request was `takeover`):
/// prepare, send, wait for the verdict, then either finish (the daemon exits) or serve on.
pub(crate) fn give(shared: &Arc<Shared>, mut reader: BufReader<UnixStream>, formats: &[u32]) {
    let out = reader.get_ref().try_clone();
    let Ok(out) = out else { return };
    let refuse = |code: &str, message: &str| {
        warn!("takeover refused: {message}");
        let _ = send_frame(&out, &reply_frame(false, Some(code), message, None, 0), &[]);
    };
    // The newest format both read (the state is made below; format 1 holds all of it today).
    let Some(&format) = FORMATS.iter().rev().find(|f| formats.contains(f)) else {
        let text = format!("this daemon hands over state formats {FORMATS:?}; the successor reads {formats:?}");
        return refuse("format", &text);
    };
    // No reload or admin change while the volumes are being handed over.
    let _current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    if shared.is_shutting_down() || shared.handed_over().is_some() {
        return refuse("shutting_down", "the target is shutting down");
    }
    info!("a successor asks to take the volumes over: stopping listening, holding write-backs");
    let prepared = match prepare(shared) {
        Ok(p) => p,
        Err(e) => return refuse("refused", &format!("cannot prepare the handover: {e}")),
    };
    if format < prepared.state.oldest_format() {
        resume(shared, &prepared.volumes);
        let text = format!(
            "the volumes need state format {}; the successor reads {formats:?}",
            prepared.state.oldest_format()
        );
        return refuse("format", &text);
    }
    let fds = prepared.fds();
    let bytes: u64 = prepared.volumes.iter().map(|v| v.size()).sum();
    let message = format!("handing over {}", crate::counted(prepared.volumes.len(), "volume"));
    let sent = (|| {
        let mut chunks = fds.chunks(rblk_fabric::fdpass::MAX_FDS);
        let first = chunks.next().unwrap_or(&[]);
        let state = prepared.state.in_format(format);
        send_frame(&out, &reply_frame(true, None, &message, Some(&state), fds.len()), first)?;
        for chunk in chunks {
            send_frame(&out, b"+", chunk)?;
        }
        Ok::<(), std::io::Error>(())
    })();
    if let Err(e) = sent {
        warn!(error = %e, "the successor went away while the volumes were sent");
        return resume(shared, &prepared.volumes);
    }
    let verdict = verdict(shared, &mut reader, bytes);
    if let Err(why) = verdict {
        warn!("the handover fell through ({why}): nothing was lost");
        return resume(shared, &prepared.volumes);
    }
    // From here on this daemon writes nothing back: the successor owns the volumes.
    shared.finish_handover(0);
    let _ = send_frame(&out, &reply_frame(true, None, "bye", None, 0), &[]);
    info!("the successor is ready: disconnecting and exiting without a final flush");
    shared.exit_after_handover();
}

/// Waits for the successor's verdict: `takeover-ready`, or `takeover-abort`; its progress
/// reports (`takeover-progress`) keep the wait going, [`SILENCE`] without any ends it, so the
/// wait does not grow with the volumes' size. A stop that began meanwhile ends it at the next
/// report: the volumes stay here (its final flush waits for this decision: see
/// server::listen), and the successor, told nothing, refuses.
fn verdict(shared: &Shared, reader: &mut BufReader<UnixStream>, bytes: u64) -> Result<(), String> {
    let _ = reader.get_ref().set_read_timeout(Some(SILENCE));
    loop {
        let mut line = String::new();
        let heard = match reader.read_line(&mut line) {
            Ok(0) => Err("the successor went away before it was ready".to_owned()),
            Ok(_) => match serde_json::from_str::<serde_json::Value>(&line) {
                Ok(v) if v["op"] == "takeover-ready" => Ok(true),
                Ok(v) if v["op"] == "takeover-progress" => {
                    tracing::debug!(bytes, "successor: {}", v["what"].as_str().unwrap_or("progress"));
                    Ok(false)
                }
                Ok(v) if v["op"] == "takeover-abort" => {
                    Err(format!("the successor refused: {}", v["reason"].as_str().unwrap_or("no reason given")))
                }
                _ => Err(format!("the successor said something else: {}", line.trim())),
            },
            Err(e) => Err(format!("no word from the successor for {SILENCE:?}: {e}")),
        };
        if shared.is_shutting_down() {
            return Err("this daemon is stopping".to_owned());
        }
        if heard? {
            return Ok(());
        }
    }
}

/// The old daemon's side of `admin handover` under systemd: the descriptors and a state
/// record go to the service manager's store through `sink`; then the daemon exits with
/// [`EXIT_HANDED_OVER`]. Returns the reply's message.
pub(crate) fn give_to_store(
    shared: &Arc<Shared>,
    sink: &StoreSink,
    expect: Option<&[Expected]>,
) -> Result<String, String> {
    let _current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    if shared.is_shutting_down() || shared.handed_over().is_some() {
        return Err("the target is shutting down".into());
    }
    if let Some(expect) = expect {
        let mut served: Vec<Expected> = shared
            .catalog()
            .volumes
            .values()
            .map(|v| Expected {
                name: v.name.clone(),
                size: v.size(),
                path: v.backing.as_ref().map(|b| b.path().to_owned()),
            })
            .collect();
        served.sort_by(|a, b| a.name.cmp(&b.name));
        let mut expect = expect.to_vec();
        expect.sort_by(|a, b| a.name.cmp(&b.name));
        if served != expect {
            return Err("the volumes served changed since the successor's checks (an admin add or remove, a \
                        reload): run `rblk-target admin handover` again"
                .into());
        }
    }
    let prepared = prepare(shared)?;
    let pushed = (|| {
        // Its reader is not known: the oldest format that holds the state.
        let record = state_memfd(&prepared.state.in_format(prepared.state.oldest_format()))?;
        for (i, fd) in prepared.fds().into_iter().enumerate() {
            sink(&format!("{FD_PREFIX}{i}"), fd)?;
        }
        sink(STATE_FDNAME, record.as_fd())
    })();
    if let Err(e) = pushed {
        resume(shared, &prepared.volumes);
        return Err(format!(
            "the service manager did not take the descriptors ({e}): is FileDescriptorStoreMax= set in the unit?"
        ));
    }
    shared.finish_handover(EXIT_HANDED_OVER);
    shared.exit_after_handover();
    Ok(format!(
        "handed {} to the service manager: exiting with status {EXIT_HANDED_OVER}, and systemd starts the \
         successor with them (RestartForceExitStatus={EXIT_HANDED_OVER})",
        crate::counted(prepared.volumes.len(), "volume")
    ))
}

/// The state record as a sealed memfd, read from its start.
fn state_memfd(state: &State) -> std::io::Result<std::fs::File> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create("rblk-handover-state", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(&serde_json::to_vec(state).map_err(std::io::Error::other)?)?;
    std::io::Seek::rewind(&mut file)?;
    let seals = nix::fcntl::SealFlag::F_SEAL_SHRINK
        | nix::fcntl::SealFlag::F_SEAL_GROW
        | nix::fcntl::SealFlag::F_SEAL_WRITE
        | nix::fcntl::SealFlag::F_SEAL_SEAL;
    nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_ADD_SEALS(seals))?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches a state record read without bound (a huge or endless descriptor in the fd store
    /// would exhaust the successor's memory before anything is checked): past [`MAX_FRAME`]
    /// it is refused, with a clear error, unread.
    #[test]
    fn a_state_record_past_the_cap_is_refused() {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let record = std::fs::File::from(memfd_create("rblk-test-state", MFdFlags::MFD_CLOEXEC).unwrap());
        let mut text = format!("{{\"format\":{FORMAT},\"pad\":\"").into_bytes();
        text.resize(MAX_FRAME + 1, b'x');
        (&record).write_all(&text).unwrap();
        std::io::Seek::rewind(&mut &record).unwrap();
        let err = Handed::from_store(vec![(STATE_FDNAME.to_owned(), record.into())]).unwrap_err();
        assert!(err.to_string().contains(&format!("larger than {MAX_FRAME} bytes")), "{err}");
    }

    /// Catches a successor that would read a state record of a format it does not know (it
    /// would serve volumes with fields it misreads).
    #[test]
    fn an_unknown_state_format_is_refused_before_it_is_read() {
        let e = parse_state(serde_json::json!({"format": 3, "anything": "else"})).unwrap_err();
        assert!(matches!(e, HandoverError::Format(ref f) if f == "3"), "{e}");
        assert!(e.to_string().contains("format 3") && e.to_string().contains("reads formats [1, 2]"), "{e}");
        assert!(matches!(parse_state(serde_json::json!({"pid": 1})), Err(HandoverError::Malformed(_))));
        let s = State { format: FORMAT, pid: 7, daemon: "d".into(), block_size: 4096, volumes: vec![] };
        assert_eq!(parse_state(serde_json::to_value(&s).unwrap()).unwrap(), s);
    }

    fn volume(segments: Vec<Segment>) -> HandedVolume {
        HandedVolume {
            name: "v".into(),
            size: 1 << 20,
            path: None,
            instance: "00".repeat(16),
            written: true,
            failed: false,
            memfd: None,
            segments,
            punches: Vec::new(),
            devices: None,
            backing: None,
        }
    }

    /// Format 2 (issue 41): a record of the previous release (format 1, as it wrote it) still
    /// adopts; a format 2 record says the same in segments and round-trips, several segments
    /// too (issue 44); what this daemon cannot serve (more than 8 segments, segments that do
    /// not add up to the volume, an empty one, a punch past its end, a format 1 entry with
    /// format 2's fields) is refused with the reason. Catches a successor
    /// that misreads either format, and a store record written in a format an older successor
    /// cannot read when format 1 would have held it.
    #[test]
    fn both_formats_read_and_the_oldest_that_holds_the_state_is_chosen() {
        let old = serde_json::json!({"format": 1, "pid": 9, "daemon": "rblk-target 0.1.0", "block_size": 4096,
            "volumes": [{"name": "v", "size": 1048576, "instance": "00".repeat(16), "written": false,
                         "failed": false, "memfd": 0, "path": "/d.img", "backing": 1}]});
        let s = parse_state(old).expect("a format 1 record");
        let whole = vec![Segment { memfd: 0, len: 1 << 20 }];
        assert_eq!(s.volumes[0].memory(1), Ok(whole.clone()));
        assert_eq!(s.volumes[0].backing, Some(1));
        let two = s.in_format(2);
        assert_eq!(
            (two.volumes[0].memfd, two.volumes[0].segments.as_slice()),
            (None, &[Segment { memfd: 0, len: 1 << 20 }][..])
        );
        assert_eq!(two.volumes[0].memory(2), Ok(whole));
        assert_eq!(parse_state(serde_json::to_value(&two).unwrap()).unwrap(), two);
        assert_eq!(two.in_format(1).volumes[0], s.volumes[0], "back to format 1 unchanged");
        assert_eq!(two.oldest_format(), 1, "one segment, no punches, no devices: format 1 holds it");

        // Issue 44: a grown volume's segments, in order, adding up to its size.
        let halves = vec![Segment { memfd: 0, len: 1 << 19 }, Segment { memfd: 1, len: 1 << 19 }];
        let mut v = volume(halves.clone());
        assert_eq!(v.memory(2), Ok(halves));
        v.segments = (0..9).map(|i| Segment { memfd: i, len: (1 << 20) / 8 }).collect();
        assert!(v.memory(2).unwrap_err().contains("at most 8"));
        v.segments = vec![Segment { memfd: 0, len: 4096 }];
        assert!(v.memory(2).unwrap_err().contains("hold 4096 bytes, not the volume's 1048576"));
        v.segments = vec![Segment { memfd: 0, len: 1 << 20 }, Segment { memfd: 1, len: 0 }];
        assert!(v.memory(2).unwrap_err().contains("empty"));
        v.segments = vec![Segment { memfd: 0, len: 1 << 20 }];
        v.punches = vec![(0, 4096), ((1 << 20) - 4096, 8192)];
        assert!(v.checked_punches().unwrap_err().contains("outside the volume"));
        v.punches = vec![(0, 4096)];
        assert_eq!(v.checked_punches().unwrap(), &[(0, 4096)]);
        assert!(v.memory(1).is_err(), "a format 1 entry with punches");
        let state = State { format: 2, pid: 1, daemon: "d".into(), block_size: 4096, volumes: vec![v] };
        assert_eq!(state.oldest_format(), 2, "pending punches need format 2");
    }

    /// Issue 42: the devices a volume was registered on round-trip in format 2, and are advice
    /// only: they do not make a state need format 2, and format 1 (an older successor, the
    /// service manager's store) leaves them out, so that reader gets today's record and
    /// registers at the first OPEN. Catches a state with devices that an older successor could
    /// not read, and devices lost from a format 2 record.
    #[test]
    fn the_devices_round_trip_in_format_2_and_format_1_leaves_them_out() {
        let mut v = volume(vec![Segment { memfd: 0, len: 1 << 20 }]);
        v.devices = Some(vec!["mlx5_0".into(), "rxe0".into()]);
        let state = State { format: 2, pid: 1, daemon: "d".into(), block_size: 4096, volumes: vec![v] };
        let read = parse_state(serde_json::to_value(&state).unwrap()).unwrap();
        assert_eq!(read, state);
        assert_eq!(read.volumes[0].devices.as_deref(), Some(&["mlx5_0".to_owned(), "rxe0".to_owned()][..]));
        assert_eq!(state.oldest_format(), 1, "devices alone need no format 2");
        let one = state.in_format(1);
        assert_eq!(one.volumes[0].devices, None);
        assert_eq!(
            one.volumes[0].memory(1),
            Ok(vec![Segment { memfd: 0, len: 1 << 20 }]),
            "a format 1 reader adopts it"
        );
        let text = serde_json::to_string(&one).unwrap();
        assert!(!text.contains("devices") && !text.contains("segments"), "{text}");
        assert_eq!(one.in_format(2).volumes[0].devices, None, "what format 1 left out stays out");
    }
}
