//! The admin control path: a unix socket on the target, off the RDMA network, through which
//! root adds, removes and lists volumes at run time (`rblk-target admin ...`), as SPDK's
//! JSON-RPC socket (`/var/tmp/spdk.sock`) does for nvmf_tgt.
//!
//! Access: the socket is created mode 0600 (under a umask, so it is never wider) in a
//! directory the daemon creates mode 0700 if missing: only its owner (root) can connect. The
//! peer's credentials (`SO_PEERCRED`) are checked too, both ways: the daemon answers only root
//! and its own user, whatever the socket's mode became, and a client (a successor taking the
//! volumes over too) talks only to a daemon run by root or by itself ([`check_peer`]). A start
//! refuses a path where another daemon's socket answers, and replaces a stale one.
//!
//! Protocol: one JSON object per line each way, [`VERSION`] in every request and reply.
//!
//! ```text
//! {"version":1,"op":"list"}
//! {"version":1,"op":"add","volume":{"name":"v1","size":"64M","path":"/srv/v1.img","allow":{"db1":"rw"}}}
//! {"version":1,"op":"remove","name":"v1"}
//! {"version":1,"op":"access"}
//! -> {"version":1,"ok":true,"message":"...","volumes":[{"name":..,"size":..,"sessions":..,"state":..},..]}
//! -> {"version":1,"ok":false,"error":"busy","message":"volume v1 has 1 open session(s): ..."}
//! ```
//!
//! `add` takes the fields of a `[[volume]]` of the config file; `access` answers with `access`:
//! the hosts, keys (short fingerprints) and access lists in force ([`crate::access_changes`]). Changes go through the same
//! code as a reload ([`crate::reload`]): an add is the configuration applied last plus that
//! volume, a remove the same without it, refused while sessions have it open. Each is saved in
//! `STATE_DIR/admin.toml` ([`crate::saved`]) before it applies (and the file restored if it
//! does not), so a restart, a SIGHUP and a handover keep it: they read that file with the
//! config file.
//!
//! A request line longer than [`MAX_LINE`] is refused and the connection closed; a client that
//! goes away before the end of its line changes nothing; a silent one is cut after
//! [`CLIENT_TIMEOUT`]. Each connection has its own thread; requests apply one at a time.

use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tracing::{debug, info, warn};

pub use crate::errors::{ClientError, SocketError};

use crate::config::FileVolume;
use crate::registry::Shared;
use crate::start::StartError;

/// The protocol version, in every request and reply.
pub const VERSION: u64 = 1;
/// Where `rblk-target` serves its admin socket unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/rblk-target/admin.sock";
/// The longest request line, in bytes.
pub const MAX_LINE: usize = 64 << 10;
/// How long a connection may stay silent.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "op", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// Every volume served, with its sessions and state.
    List,
    /// Serve a new volume.
    Add {
        /// As a `[[volume]]` of the config file.
        volume: FileVolume,
    },
    /// Stop serving a volume nobody has open.
    Remove {
        /// Its name.
        name: String,
    },
    /// Hand every volume to the service manager's file descriptor store and exit, for systemd
    /// to start the successor with them (see [`crate::handover`]).
    Handover {
        /// The volumes the successor's checks passed ([`crate::handover::preflight`]): the
        /// daemon refuses if it serves others now (one was added or removed meanwhile).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        expect: Option<Vec<Expected>>,
    },
    /// Who may get in and open what, keys by fingerprint only (`--check-config` compares a
    /// file with it: see [`crate::access_changes`]).
    Access,
    /// From a successor (`rblk-target --takeover`): hand every volume to it over this
    /// connection (see [`crate::handover`]); the state formats it reads.
    Takeover {
        /// State formats the successor reads.
        formats: Vec<u32>,
    },
}

/// A volume as the successor's checks saw it (see [`Request::Handover`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store of a durable volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

/// One volume in a list reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VolumeInfo {
    /// Name.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store of a durable volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Sessions that have it open.
    pub sessions: usize,
    /// `ok`, `failed` (a write-back failed: read-only now) or `refused` (could not be loaded).
    pub state: String,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// In the configuration applied last; false for one a reload removed while it was open
    /// (it goes once idle, at the next reload).
    pub configured: bool,
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reply {
    /// [`VERSION`].
    pub version: u64,
    /// Whether the request was carried out.
    pub ok: bool,
    /// Why not ([`AdminError::code`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What was done, or why not.
    pub message: String,
    /// The volumes, for a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<VolumeInfo>>,
    /// The access policy, for `access`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<crate::access_changes::Access>,
}

/// Why a request was not carried out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdminError {
    /// Not JSON, or not a request.
    #[error("malformed request: {0}")]
    Malformed(String),
    /// Longer than [`MAX_LINE`].
    #[error("request longer than {MAX_LINE} bytes")]
    TooLong,
    /// A version this daemon does not speak.
    #[error("protocol version {0} is not served (this daemon speaks version {VERSION})")]
    Version(String),
    /// An op this daemon does not know.
    #[error("unknown op {0:?} (add, remove, list, access or handover)")]
    UnknownOp(String),
    /// Add of a name already served.
    #[error("volume {0} exists")]
    Exists(String),
    /// Remove of a name not served.
    #[error("no volume {0}")]
    UnknownVolume(String),
    /// Remove of a volume with open sessions.
    #[error("volume {name} has {sessions} open session(s): not removed (close them, then remove it)")]
    Busy {
        /// Which.
        name: String,
        /// How many sessions.
        sessions: usize,
    },
    /// The volume's entry, or the configuration with it, does not check.
    #[error(transparent)]
    Invalid(StartError),
    /// The volume's entry does not check.
    #[error(transparent)]
    Config(crate::config::ConfigError),
    /// The volume could not be created or loaded.
    #[error("volume {name} not added: {reason}")]
    Refused {
        /// Which.
        name: String,
        /// Why.
        reason: String,
    },
    /// The target is stopping.
    #[error("the target is shutting down")]
    ShuttingDown,
    /// A handover cannot be done.
    #[error("no handover: {0}")]
    Handover(String),
    /// The client is neither root nor the daemon's user.
    #[error("not allowed: {0}: only root and the daemon's user may use the admin socket")]
    Forbidden(String),
    /// `STATE_DIR/admin.toml` could not be read or written: nothing changed.
    #[error(transparent)]
    Saved(crate::saved::SavedError),
}

impl AdminError {
    /// The reply's `error` field.
    pub fn code(&self) -> &'static str {
        match self {
            AdminError::Malformed(_) => "malformed",
            AdminError::TooLong => "too_long",
            AdminError::Version(_) => "version",
            AdminError::UnknownOp(_) => "unknown_op",
            AdminError::Exists(_) => "exists",
            AdminError::UnknownVolume(_) => "unknown_volume",
            AdminError::Busy { .. } => "busy",
            AdminError::Invalid(_) | AdminError::Config(_) => "invalid",
            AdminError::Refused { .. } => "refused",
            AdminError::ShuttingDown => "shutting_down",
            AdminError::Handover(_) => "handover",
            AdminError::Forbidden(_) => "forbidden",
            AdminError::Saved(_) => "saved",
        }
    }
}

/// Whether the process at the other end of `stream` may be trusted with the admin socket:
/// root or this process's own user (`SO_PEERCRED`, as the kernel recorded it at connect).
/// `Err` names the peer's uid.
pub fn check_peer(stream: &UnixStream) -> Result<(), String> {
    let creds = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("cannot read the peer's credentials: {e}"))?;
    peer_allowed(creds.uid(), nix::unistd::geteuid().as_raw())
}

fn peer_allowed(peer: u32, me: u32) -> Result<(), String> {
    if peer == 0 || peer == me {
        Ok(())
    } else {
        Err(format!("uid {peer} is neither root nor the daemon's user (uid {me})"))
    }
}

/// Checks that `path` can be an admin socket without touching it (`--check-config`).
pub fn check_path(path: &Path) -> Result<(), SocketError> {
    if path.as_os_str().len() > 107 {
        return Err(SocketError::TooLong(path.to_owned()));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if !m.file_type().is_socket() => return Err(SocketError::NotASocket(path.to_owned())),
        _ => {}
    }
    // An existing directory must be safe: whoever may write to it could replace the socket
    // (a missing one is made with mode 0700 by `serve`).
    match path.parent().filter(|d| !d.as_os_str().is_empty() && d.exists()) {
        Some(dir) => rblk_fabric::private::check_dir(dir, rblk_fabric::private::DirUse::OwnerWrites)
            .map_err(SocketError::UnsafeDir),
        None => Ok(()),
    }
}

/// The admin socket being served.
#[derive(Debug)]
pub struct Serving {
    path: PathBuf,
    /// Its inode, so that stop removes only our own socket.
    ino: u64,
    listener: UnixListener,
    thread: thread::JoinHandle<()>,
}

impl Serving {
    /// Where.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting (requests under way finish on their threads) and removes the socket.
    pub fn stop(self) {
        self.close(true);
    }

    /// Stops accepting and leaves the socket file where it is: after a handover, whose
    /// successor waits until this socket refuses connections and then replaces the file. Were
    /// this daemon to remove it, its check of the inode and its removal could fall on either
    /// side of the successor's replacement and remove the successor's socket (seen in CI: the
    /// next takeover found no daemon at the path).
    pub fn stop_for_successor(self) {
        self.close(false);
    }

    fn close(self, remove: bool) {
        // Wakes the blocked accept (Linux returns EINVAL from it).
        let _ = nix::sys::socket::shutdown(self.listener.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        let _ = self.thread.join();
        if remove && std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Binds the admin socket at `path` (see the module docs) and serves it on a thread.
pub fn serve(path: &Path, shared: Arc<Shared>) -> Result<Serving, SocketError> {
    check_path(path)?;
    let io = |source| SocketError::Io { path: path.to_owned(), source };
    if std::fs::symlink_metadata(path).is_ok() {
        match UnixStream::connect(path) {
            Ok(_) => return Err(SocketError::InUse(path.to_owned())),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                warn!(path = %path.display(), "removing a stale admin socket (its daemon is gone)");
                std::fs::remove_file(path).map_err(io)?;
            }
            Err(e) => return Err(io(e)),
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io)?;
    }
    // Process-wide for the moment of the bind: a file another thread creates meanwhile is
    // only made narrower.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(io)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    let ino = std::fs::symlink_metadata(path).map_err(io)?.ino();
    let accepting = listener.try_clone().map_err(io)?;
    let thread =
        thread::Builder::new().name("rblk-admin".into()).spawn(move || accept(&accepting, &shared)).map_err(io)?;
    info!(path = %path.display(), "serving the admin socket");
    Ok(Serving { path: path.to_owned(), ino, listener, thread })
}

fn accept(listener: &UnixListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.is_shutting_down() {
            break;
        }
        match stream {
            Ok(stream) => {
                if let Err(why) = check_peer(&stream) {
                    warn!("admin socket: refusing a connection: {why}");
                    let reply = refusal(&AdminError::Forbidden(why));
                    let mut text = serde_json::to_vec(&reply).unwrap_or_default();
                    text.push(b'\n');
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = (&stream).write_all(&text);
                    continue;
                }
                let shared = Arc::clone(shared);
                if let Err(e) =
                    thread::Builder::new().name("rblk-admin-conn".into()).spawn(move || client(&shared, stream))
                {
                    warn!(error = %e, "cannot start an admin connection's thread");
                }
            }
            // EINVAL after the shutdown in Serving::stop.
            Err(_) if shared.is_shutting_down() => break,
            Err(e) => {
                warn!(error = %e, "admin socket accept failed");
                thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// One connection: requests until EOF.
fn client(shared: &Arc<Shared>, stream: UnixStream) {
    let _ = stream.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CLIENT_TIMEOUT));
    let Ok(mut out) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = Vec::new();
        match (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => {
                debug!(error = %e, "admin connection ended");
                return;
            }
        }
        if let Ok(Request::Takeover { formats }) = parse(&line) {
            // The connection is the handover's from here on.
            let _ = reader.get_ref().set_write_timeout(None);
            return crate::handover::give(shared, reader, &formats);
        }
        let reply = if line.last() == Some(&b'\n') {
            handle(shared, &line)
        } else if line.len() > MAX_LINE {
            refusal(&AdminError::TooLong)
        } else {
            debug!("admin client went away mid-request: nothing done");
            return;
        };
        let mut text = serde_json::to_vec(&reply).unwrap_or_default();
        text.push(b'\n');
        if out.write_all(&text).is_err() || line.last() != Some(&b'\n') {
            return;
        }
    }
}

fn refusal(e: &AdminError) -> Reply {
    // The whole chain: the client prints the message alone.
    let message = rblk_fabric::Chain(e).to_string();
    Reply { version: VERSION, ok: false, error: Some(e.code().to_owned()), message, volumes: None, access: None }
}

/// Parses and carries out one request line.
pub(crate) fn handle(shared: &Arc<Shared>, line: &[u8]) -> Reply {
    let result = parse(line).and_then(|request| {
        debug!(?request, "admin request");
        let access = (request == Request::Access).then(|| shared.access());
        run(shared, request).map(|(message, volumes)| (message, volumes, access))
    });
    match result {
        Ok((message, volumes, access)) => {
            if !message.is_empty() {
                info!("admin: {message}");
            }
            Reply { version: VERSION, ok: true, error: None, message, volumes, access }
        }
        Err(e) => {
            warn!(error = %e, "admin request refused");
            refusal(&e)
        }
    }
}

/// A request line: a JSON object with `version` and `op`.
pub fn parse(line: &[u8]) -> Result<Request, AdminError> {
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| AdminError::Malformed(e.to_string()))?;
    let serde_json::Value::Object(mut map) = value else {
        return Err(AdminError::Malformed("a request is a JSON object".into()));
    };
    match map.remove("version") {
        Some(serde_json::Value::Number(n)) if n.as_u64() == Some(VERSION) => {}
        Some(v) => return Err(AdminError::Version(v.to_string())),
        None => return Err(AdminError::Malformed("no \"version\" field".into())),
    }
    match map.get("op") {
        Some(serde_json::Value::String(op))
            if !["list", "add", "remove", "access", "handover", "takeover"].contains(&op.as_str()) =>
        {
            return Err(AdminError::UnknownOp(op.clone()))
        }
        Some(serde_json::Value::String(_)) => {}
        _ => return Err(AdminError::Malformed("no \"op\" string field".into())),
    }
    serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| AdminError::Malformed(e.to_string()))
}

fn run(shared: &Arc<Shared>, request: Request) -> Result<(String, Option<Vec<VolumeInfo>>), AdminError> {
    match request {
        Request::List => Ok((String::new(), Some(list(shared)))),
        // The reply's `access` (see handle).
        Request::Access => Ok((String::new(), None)),
        Request::Add { volume } => add(shared, &volume).map(|m| (m, None)),
        Request::Remove { name } => remove(shared, &name).map(|m| (m, None)),
        Request::Handover { expect } => handover(shared, expect.as_deref()).map(|m| (m, None)),
        // Handled by the connection (it carries descriptors); here only when malformed.
        Request::Takeover { .. } => Err(AdminError::Malformed("takeover ends its connection's requests".into())),
    }
}

fn handover(shared: &Arc<Shared>, expect: Option<&[Expected]>) -> Result<String, AdminError> {
    let store = shared.fd_store.lock().unwrap_or_else(|p| p.into_inner());
    let Some(crate::registry::Sink(sink)) = store.as_ref() else {
        return Err(AdminError::Handover(
            "this daemon was not started by systemd with a file descriptor store (NOTIFY_SOCKET): start the \
             successor with `rblk-target --takeover` instead"
                .into(),
        ));
    };
    crate::handover::give_to_store(shared, sink, expect).map_err(AdminError::Handover)
}

/// Every volume served and every one refused, by name.
pub(crate) fn list(shared: &Shared) -> Vec<VolumeInfo> {
    let current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    let catalog = shared.catalog();
    let configured = |name: &str| current.volumes.iter().any(|v| v.name == name);
    let mut out: Vec<VolumeInfo> = catalog
        .volumes
        .values()
        .map(|v| VolumeInfo {
            name: v.name.clone(),
            size: v.size(),
            path: v.backing.as_ref().map(|b| b.path().to_owned()),
            sessions: catalog.sessions_of(&v.name),
            state: if v.backing.as_ref().is_some_and(|b| b.failed()) { "failed" } else { "ok" }.into(),
            reason: None,
            configured: configured(&v.name),
        })
        .collect();
    for (name, why) in &catalog.refused {
        let spec = current.volumes.iter().find(|v| v.name == *name);
        out.push(VolumeInfo {
            name: name.clone(),
            size: spec.map_or(0, |s| s.size),
            path: spec.and_then(|s| s.path.clone()),
            sessions: 0,
            state: "refused".into(),
            reason: Some(why.clone()),
            configured: spec.is_some(),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

fn add(shared: &Shared, v: &FileVolume) -> Result<String, AdminError> {
    let spec = v.spec().map_err(AdminError::Config)?;
    let size = spec.size;
    let mut current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    if shared.is_shutting_down() || shared.handed_over().is_some() {
        return Err(AdminError::ShuttingDown);
    }
    if shared.catalog().volumes.contains_key(&v.name) || current.volumes.iter().any(|c| c.name == v.name) {
        return Err(AdminError::Exists(v.name.clone()));
    }
    let mut new = current.clone();
    new.volumes.push(spec);
    if !v.allow.is_empty() {
        new.acls.insert(v.name.clone(), v.allow.clone());
    }
    let undo = save(shared, |s| s.added(v))?;
    let report = match shared.apply(&mut current, new, &mut |_| {}) {
        Ok(report) => report,
        Err(e) => {
            undo.restore();
            return Err(AdminError::Invalid(e));
        }
    };
    if let Some((_, why)) = report.refused.iter().find(|(name, _)| *name == v.name) {
        // Not kept for a later retry, as a refused volume of the file would be.
        current.volumes.retain(|c| c.name != v.name);
        current.acls.remove(&v.name);
        shared.catalog.write().unwrap_or_else(|p| p.into_inner()).refused.remove(&v.name);
        undo.restore();
        return Err(AdminError::Refused { name: v.name.clone(), reason: why.clone() });
    }
    let what = v.path.as_ref().map_or_else(|| "RAM, volatile".to_owned(), |p| format!("durable, {}", p.display()));
    Ok(format!("added volume {} ({size} bytes, {what})", v.name))
}

fn remove(shared: &Shared, name: &str) -> Result<String, AdminError> {
    let mut current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    if shared.is_shutting_down() || shared.handed_over().is_some() {
        return Err(AdminError::ShuttingDown);
    }
    let (served, sessions) = {
        let catalog = shared.catalog();
        (catalog.volumes.contains_key(name), catalog.sessions_of(name))
    };
    if !served {
        // A configured volume that could not be loaded: forgotten.
        if current.volumes.iter().any(|v| v.name == name) {
            save(shared, |s| s.removed(name))?;
            current.volumes.retain(|v| v.name != name);
            current.acls.remove(name);
            shared.catalog.write().unwrap_or_else(|p| p.into_inner()).refused.remove(name);
            return Ok(format!("removed volume {name} (it had been refused)"));
        }
        return Err(AdminError::UnknownVolume(name.to_owned()));
    }
    if sessions > 0 {
        return Err(AdminError::Busy { name: name.to_owned(), sessions });
    }
    let before = current.clone();
    let mut new = current.clone();
    new.volumes.retain(|v| v.name != name);
    new.acls.remove(name);
    // Removed by name: what it holds goes with it, as asked.
    new.confirm_remove.push(name.to_owned());
    let undo = save(shared, |s| s.removed(name))?;
    // The last volume may go too: a target may serve none (an empty config starts empty, and
    // `admin add` fills it).
    let report = match shared.apply(&mut current, new, &mut |_| {}) {
        Ok(report) => report,
        Err(e) => {
            undo.restore();
            return Err(AdminError::Invalid(e));
        }
    };
    current.confirm_remove = before.confirm_remove.clone();
    if let Some((_, sessions)) = report.busy.iter().find(|(n, _)| n == name) {
        // Opened just now: it stays, and stays configured (no removal pending).
        *current = before;
        undo.restore();
        return Err(AdminError::Busy { name: name.to_owned(), sessions: *sessions });
    }
    Ok(format!("removed volume {name}"))
}

/// What `STATE_DIR/admin.toml` held before a change, to put back if the change does not apply.
struct Undo<'a> {
    dir: Option<&'a Path>,
    before: crate::saved::Saved,
}

impl Undo<'_> {
    fn restore(self) {
        if let Some(dir) = self.dir {
            if let Err(e) = self.before.store(dir) {
                tracing::error!(
                    "cannot restore {}: {}",
                    crate::saved::Saved::path(dir).display(),
                    rblk_fabric::Chain(&e)
                );
            }
        }
    }
}

/// Saves a change to `STATE_DIR/admin.toml` before it applies (nothing without a state dir);
/// an error changes nothing.
fn save(shared: &Shared, change: impl FnOnce(&mut crate::saved::Saved)) -> Result<Undo<'_>, AdminError> {
    let Some(dir) = shared.fixed.state_dir.as_deref() else {
        return Ok(Undo { dir: None, before: crate::saved::Saved::default() });
    };
    let before = crate::saved::Saved::load(dir).map_err(AdminError::Saved)?;
    let mut after = before.clone();
    change(&mut after);
    after.store(dir).map_err(AdminError::Saved)?;
    Ok(Undo { dir: Some(dir), before })
}

fn client_error(path: &Path, source: std::io::Error) -> ClientError {
    match source.kind() {
        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
            ClientError::NotRunning(path.to_owned())
        }
        std::io::ErrorKind::PermissionDenied => ClientError::PermissionDenied(path.to_owned()),
        _ => ClientError::Io { path: path.to_owned(), source },
    }
}

/// Connects to the admin socket at `path`.
pub fn connect(path: &Path) -> Result<UnixStream, ClientError> {
    let stream = UnixStream::connect(path).map_err(|e| client_error(path, e))?;
    check_peer(&stream).map_err(|why| ClientError::UntrustedServer(path.to_owned(), why))?;
    Ok(stream)
}

/// Sends `request` to the admin socket at `path` and returns the daemon's reply if it carried
/// the request out.
pub fn request(path: &Path, request: &Request) -> Result<Reply, ClientError> {
    request_on(connect(path)?, path, request)
}

/// [`request`] on a connection made with [`connect`] to `path`.
pub fn request_on(stream: UnixStream, path: &Path, request: &Request) -> Result<Reply, ClientError> {
    let mut value = serde_json::to_value(request).map_err(|e| ClientError::BadReply(path.to_owned(), e.to_string()))?;
    if let serde_json::Value::Object(map) = &mut value {
        map.insert("version".into(), VERSION.into());
    }
    let reply = line_on(stream, path, value.to_string().as_bytes())?;
    let reply: Reply =
        serde_json::from_str(&reply).map_err(|e| ClientError::BadReply(path.to_owned(), e.to_string()))?;
    if reply.ok {
        Ok(reply)
    } else {
        Err(ClientError::Refused { code: reply.error.unwrap_or_default(), message: reply.message })
    }
}

/// Sends one raw line (a newline is added) and returns the reply line (tests send bad ones).
pub fn request_line(path: &Path, line: &[u8]) -> Result<String, ClientError> {
    line_on(connect(path)?, path, line)
}

fn line_on(mut stream: UnixStream, path: &Path, line: &[u8]) -> Result<String, ClientError> {
    let io = |source| client_error(path, source);
    // A durable volume's load can take minutes.
    stream.set_read_timeout(None).map_err(io)?;
    let mut text = line.to_vec();
    text.push(b'\n');
    // A daemon that refuses the connection (see `accept`) may answer and close before the
    // request is written: its answer says why, better than the broken pipe.
    let wrote = stream.write_all(&text);
    let mut reply = String::new();
    let read = BufReader::new(stream).read_line(&mut reply);
    if reply.is_empty() {
        wrote.map_err(io)?;
        read.map_err(io)?;
        return Err(ClientError::BadReply(path.to_owned(), "the daemon closed the connection".into()));
    }
    Ok(reply)
}
