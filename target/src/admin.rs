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
//! Protocol: JSON lines, in [`crate::admin_protocol`] (with the client).
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
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, PermissionsExt as _};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use tracing::{debug, info, warn};

pub use crate::admin_protocol::{
    check_peer, connect, request, request_line, request_on, Expected, Reply, Request, VolumeInfo, CLIENT_TIMEOUT,
    DEFAULT_SOCKET, MAX_LINE, VERSION,
};
pub use crate::errors::{ClientError, SocketError};

use crate::config::FileVolume;
use crate::registry::{Shared, StoreSink};
use crate::start::StartError;

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
    #[error("unknown op {0:?} (add, remove, resize, list, access or handover)")]
    UnknownOp(String),
    /// Add of a name already served.
    #[error("volume {0} exists")]
    Exists(String),
    /// Add with a relative backing path (the daemon cannot know the client's directory).
    #[error("the backing path {} is relative: give it absolute (rblk-target admin add makes it so)", .0.display())]
    RelativePath(std::path::PathBuf),
    /// Remove of a name not served.
    #[error("no volume {0}")]
    UnknownVolume(String),
    /// Remove of a volume with open sessions.
    #[error("volume {name} has {}: not removed (close them, then remove it)", crate::counted(*sessions, "open session"))]
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
    /// `resize` of a volume of the config file.
    #[error("volume {0} is in the config file: change its size there and reload (systemctl reload rblk-target)")]
    FromFile(String),
    /// `resize` could not change the size.
    #[error("volume {name} not resized: {why}")]
    NotResized {
        /// The volume.
        name: String,
        /// Why.
        why: String,
    },
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
            AdminError::Invalid(_) | AdminError::Config(_) | AdminError::RelativePath(_) => "invalid",
            AdminError::Refused { .. } => "refused",
            AdminError::ShuttingDown => "shutting_down",
            AdminError::Handover(_) => "handover",
            AdminError::Forbidden(_) => "forbidden",
            AdminError::Saved(_) => "saved",
            AdminError::FromFile(_) => "from_file",
            AdminError::NotResized { .. } => "not_resized",
        }
    }
}

/// The handover's entries, which the admin socket calls: [`crate::handover`] is a driver beside
/// this one, so the server hands them in ([`serve`]).
#[derive(Debug, Clone, Copy)]
pub struct Handovers {
    /// A successor's `takeover` request: the rest of the connection is the handover's.
    pub takeover: fn(&Arc<Shared>, BufReader<UnixStream>, &[u32]),
    /// `admin handover`: the descriptors go to the service manager's store through the sink,
    /// then the daemon exits; the reply's message, or why not.
    pub to_store: ToStore,
}

/// [`Handovers::to_store`].
pub type ToStore = fn(&Arc<Shared>, &StoreSink, Option<&[Expected]>) -> Result<String, String>;

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
pub fn serve(path: &Path, shared: Arc<Shared>, handovers: Handovers) -> Result<Serving, SocketError> {
    crate::config::check_admin_socket(path)?;
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
    let thread = thread::Builder::new()
        .name("rblk-admin".into())
        .spawn(move || accept(&accepting, &shared, handovers))
        .map_err(io)?;
    info!(path = %path.display(), "serving the admin socket");
    Ok(Serving { path: path.to_owned(), ino, listener, thread })
}

fn accept(listener: &UnixListener, shared: &Arc<Shared>, handovers: Handovers) {
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
                if let Err(e) = thread::Builder::new()
                    .name("rblk-admin-conn".into())
                    .spawn(move || client(&shared, stream, handovers))
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
fn client(shared: &Arc<Shared>, stream: UnixStream, handovers: Handovers) {
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
            return (handovers.takeover)(shared, reader, &formats);
        }
        let reply = if line.last() == Some(&b'\n') {
            handle(shared, &line, handovers)
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
pub(crate) fn handle(shared: &Arc<Shared>, line: &[u8], handovers: Handovers) -> Reply {
    let result = parse(line).and_then(|request| {
        debug!(?request, "admin request");
        let access = (request == Request::Access).then(|| shared.access());
        run(shared, request, handovers).map(|(message, volumes)| (message, volumes, access))
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
            if !["list", "add", "remove", "resize", "access", "handover", "takeover"].contains(&op.as_str()) =>
        {
            return Err(AdminError::UnknownOp(op.clone()))
        }
        Some(serde_json::Value::String(_)) => {}
        _ => return Err(AdminError::Malformed("no \"op\" string field".into())),
    }
    serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| AdminError::Malformed(e.to_string()))
}

fn run(
    shared: &Arc<Shared>,
    request: Request,
    handovers: Handovers,
) -> Result<(String, Option<Vec<VolumeInfo>>), AdminError> {
    match request {
        Request::List => Ok((String::new(), Some(list(shared)))),
        // The reply's `access` (see handle).
        Request::Access => Ok((String::new(), None)),
        Request::Add { volume } => add(shared, &volume).map(|m| (m, None)),
        Request::Remove { name } => remove(shared, &name).map(|m| (m, None)),
        Request::Resize { name, size } => resize(shared, &name, size).map(|m| (m, None)),
        Request::Handover { expect } => handover(shared, expect.as_deref(), handovers).map(|m| (m, None)),
        // Handled by the connection (it carries descriptors); here only when malformed.
        Request::Takeover { .. } => Err(AdminError::Malformed("takeover ends its connection's requests".into())),
    }
}

fn handover(shared: &Arc<Shared>, expect: Option<&[Expected]>, handovers: Handovers) -> Result<String, AdminError> {
    let store = shared.fd_store.lock().unwrap_or_else(|p| p.into_inner());
    let Some(crate::registry::Sink(sink)) = store.as_ref() else {
        return Err(AdminError::Handover(
            "this daemon was not started by systemd with a file descriptor store (NOTIFY_SOCKET): start the \
             successor with `rblk-target --takeover` instead"
                .into(),
        ));
    };
    (handovers.to_store)(shared, sink, expect).map_err(AdminError::Handover)
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
    // Relative to whose directory? `rblk-target admin add` sends it absolute; admin.toml keeps
    // absolute paths only.
    if let Some(path) = v.path.as_deref().filter(|p| p.is_relative()) {
        return Err(AdminError::RelativePath(path.to_owned()));
    }
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

fn resize(shared: &Shared, name: &str, size: u64) -> Result<String, AdminError> {
    let mut current = shared.current.lock().unwrap_or_else(|p| p.into_inner());
    if shared.is_shutting_down() || shared.handed_over().is_some() {
        return Err(AdminError::ShuttingDown);
    }
    let Some(was) = shared.catalog().volumes.get(name).map(|v| v.size()) else {
        return Err(AdminError::UnknownVolume(name.to_owned()));
    };
    // A volume of the config file is the file's: a resize here would be undone by the next
    // reload of the file.
    if let Some(dir) = shared.fixed.state_dir.as_deref() {
        let saved = crate::saved::Saved::load(dir).map_err(AdminError::Saved)?;
        if !saved.volumes.iter().any(|v| v.name == name) {
            return Err(AdminError::FromFile(name.to_owned()));
        }
    }
    if size == was {
        return Ok(format!("volume {name} is {} already", rblk_proto::Bytes(size)));
    }
    let mut new = current.clone();
    let Some(spec) = new.volumes.iter_mut().find(|v| v.name == name) else {
        return Err(AdminError::UnknownVolume(name.to_owned()));
    };
    spec.size = size;
    // Saved before it applies: a grow that a crash interrupts is applied again at the start.
    let undo = save(shared, |s| s.resized(name, size))?;
    let report = match shared.apply(&mut current, new, &mut |_| {}) {
        Ok(report) => report,
        Err(e) => {
            undo.restore();
            return Err(AdminError::Invalid(e));
        }
    };
    if report.grown.iter().any(|(n, ..)| n == name) {
        return Ok(format!("grew volume {name} from {} to {}", rblk_proto::Bytes(was), rblk_proto::Bytes(size)));
    }
    if report.added.iter().any(|n| n == name) {
        return Ok(format!(
            "made volume {name} again at {} (it was {})",
            rblk_proto::Bytes(size),
            rblk_proto::Bytes(was)
        ));
    }
    undo.restore();
    let why = report
        .unchanged
        .iter()
        .chain(&report.refused)
        .find(|(n, _)| n == name)
        .map_or_else(|| "nothing changed".to_owned(), |(_, why)| why.clone());
    Err(AdminError::NotResized { name: name.to_owned(), why })
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
