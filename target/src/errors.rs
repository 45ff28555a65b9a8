//! The errors the daemon's modules hand each other, in one module below all of them: a start's
//! ([`StartError`]), a configuration's ([`ConfigError`]), `admin.toml`'s ([`SavedError`]), the
//! admin socket's ([`SocketError`], and its client's [`ClientError`]) and a handover's
//! ([`HandoverError`]). A configuration's check is part of a start and a start's checks are part
//! of reading a configuration, so these hold each other; each is re-exported where it arises
//! (`config::ConfigError`, `start::StartError`, ...). The limits their messages name are defined
//! here too, and re-exported where they apply.

use std::net::SocketAddr;
use std::path::PathBuf;

/// The least [`Config::listen_backlog`](crate::config::Config::listen_backlog) (the default is
/// [`rblk_fabric::policy::LISTEN_BACKLOG`]).
pub const MIN_LISTEN_BACKLOG: u32 = 1;
/// The most [`Config::listen_backlog`](crate::config::Config::listen_backlog).
pub const MAX_LISTEN_BACKLOG: u32 = 65_536;
/// The largest `admin.toml` read ([`crate::saved`]).
pub const MAX_SIZE: u64 = 1 << 20;

/// The newest format of a handover's state record ([`crate::handover::State`]) this daemon
/// writes and reads. A successor that does not know the format it is handed refuses the
/// handover (and the old daemon serves on). Raised when a field changes meaning or a field a
/// successor must understand is added. Format 2 (issue 41, once for three issues): each volume
/// holds a list of memory segments (memfd and length; one until volumes can grow), the
/// punches still to do in its backing store, and optionally the RDMA devices it is registered
/// on; format 1 holds one memfd and nothing else.
pub const FORMAT: u32 = 2;

/// Every state format this daemon reads, oldest first.
pub const FORMATS: [u32; 2] = [1, 2];

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// No usable RDMA device.
    #[error(transparent)]
    NoDevice(rblk_fabric::Error),
    /// A volume could not be created.
    #[error("volume {name}")]
    Volume {
        /// Which.
        name: String,
        /// Why.
        #[source]
        source: rblk_fabric::Error,
    },
    /// The same volume name twice.
    #[error("volume {0} is configured twice")]
    DuplicateVolume(String),
    /// A volume's name, size or backing path cannot work.
    #[error("volume {name}")]
    InvalidVolume {
        /// Which.
        name: String,
        /// Why.
        #[source]
        source: Box<ConfigError>,
    },
    /// Hosts or access lists do not make sense.
    #[error("access configuration")]
    Access(#[source] crate::access::PolicyError),
    /// A reload would widen access, and the file does not say `confirm_widen = true`.
    #[error(transparent)]
    Widens(#[from] crate::access_changes::Unconfirmed),
    /// The state directory (or a directory above it) is controlled by someone other than root
    /// or this user, who could plant a key or an identity record in it.
    #[error("state directory {} is refused", path.display())]
    StateDir {
        /// The state directory.
        path: std::path::PathBuf,
        /// Which component, and why.
        #[source]
        source: rblk_fabric::trusted::PathError,
    },
    /// A reload would remove RAM volumes that sessions wrote, and the file does not confirm it.
    #[error(
        "the configuration removes {} {} that sessions have written: their contents would be lost; \
         keep them in the configuration, or list them in confirm_remove = [...] to remove them",
        if .0.len() == 1 { "RAM volume" } else { "RAM volumes" },
        .0.join(", ")
    )]
    WouldLoseData(Vec<String>),
    /// A reload during a handover.
    #[error("a handover is under way: reload once it is over")]
    HandoverUnderWay,
    /// Every volume was refused.
    #[error("no volume to serve: {0}")]
    NoVolumes(String),
    /// The metrics endpoint could not listen.
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The admin socket could not be served.
    #[error(transparent)]
    Admin(SocketError),
    /// Taking the volumes over from the running daemon failed (it serves on, unless it went
    /// away).
    #[error(transparent)]
    Handover(#[from] HandoverError),
    /// The worker threads could not be started.
    #[error("cannot start the worker threads")]
    Workers(#[source] rblk_fabric::Error),
    /// Listening failed.
    #[error("cannot listen on {addr}")]
    Listen {
        /// Address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: rblk_fabric::Error,
    },
}

/// What is wrong with a flag, a config file or a setting in it. Each variant names the value or
/// the file; I/O and parse errors are the source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// Not a size, or not whole blocks (the message quotes the input).
    #[error(transparent)]
    Size(#[from] rblk_proto::SizeError),
    /// A volume name initiators could not send.
    #[error("{0:?}: a volume name is 1-64 characters of A-Z a-z 0-9 - _ .")]
    VolumeName(String),
    /// A volume size of zero (one that is not whole blocks is a [`ConfigError::Size`]).
    #[error("the size ({0}) must be a non-zero multiple of 4096")]
    VolumeSize(u64),
    /// `--volume` without a size.
    #[error("{0:?}: expected NAME:SIZE[:PATH], e.g. vol0:1G or v:1G:/srv/v.img")]
    VolumeSyntax(String),
    /// `--volume NAME:SIZE:` with nothing after the second colon.
    #[error("{0:?}: empty backing path after the second colon")]
    EmptyBackingPath(String),
    /// A `--volume` flag with a bad part.
    #[error("{spec:?}")]
    VolumeFlag {
        /// The flag's value.
        spec: String,
        /// What is wrong.
        #[source]
        source: Box<ConfigError>,
    },
    /// A `[[volume]]` entry with a bad part.
    #[error("volume {name}")]
    Volume {
        /// The volume.
        name: String,
        /// What is wrong.
        #[source]
        source: Box<ConfigError>,
    },
    /// Not a listening address.
    #[error("{0:?}: expected ADDR or ADDR:PORT, e.g. 10.0.0.1, 10.0.0.1:7420, [fe80::1]:7420")]
    Listen(String),
    /// Not a metrics address.
    #[error("metrics = {value:?}: expected ADDR:PORT, e.g. 127.0.0.1:9442")]
    Metrics {
        /// The value.
        value: String,
        /// Why.
        #[source]
        source: std::net::AddrParseError,
    },
    /// A key file that cannot be read.
    #[error("reading key file {}", path.display())]
    KeyFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The target's identity (`STATE_DIR/target.id`) cannot be read or made.
    #[error("the target identity {}: {reason}", path.display())]
    TargetId {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        reason: String,
    },
    /// The generated key could not be made.
    #[error("cannot create the key {}{}", path.display(), not_ours(source, "writable"))]
    KeyCreate {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The generated key exists but cannot be read.
    #[error("reading the key {}{}", path.display(), not_ours(source, "readable"))]
    KeyRead {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file cannot be read.
    #[error("reading config {}", path.display())]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The config file is not valid TOML of the right shape.
    #[error("config {}", path.display())]
    Parse {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A setting of the config file that does not work, with the file and the key named (a
    /// relative path in it was taken relative to the file's directory: the error shows it
    /// absolute).
    #[error("{}{}", file.display(), key.as_deref().map(|k| format!(": {k}")).unwrap_or_default())]
    InFile {
        /// The config file.
        file: std::path::PathBuf,
        /// The key, when the error does not name it itself.
        key: Option<String>,
        /// What is wrong.
        #[source]
        source: Box<ConfigError>,
    },
    /// A count limit of zero.
    #[error("{0} = 0: it must be at least 1")]
    ZeroCount(&'static str),
    /// A per-session JOIN cap below what initiators use.
    #[error(
        "max_joins_per_session = {got}: it must be at least {min} (rblk attach --queues takes up to 64, a queue \
         pair each)"
    )]
    JoinsPerSession {
        /// The value.
        got: usize,
        /// The least that works.
        min: usize,
    },
    /// A timeout that is not a duration, or out of its range (`open_timeout` from 1 s, a
    /// `keepalive_timeout` that two keepalive intervals fit in, both at most a day).
    #[error("{key}: {reason}")]
    Timeout {
        /// The key.
        key: &'static str,
        /// What is wrong, in words.
        reason: String,
    },
    /// A backing path that is a directory, a character device, ...
    #[error("backing store {} is neither a regular file nor a block device", .0.display())]
    BackingKind(std::path::PathBuf),
    /// A backing path through a directory or symlink someone other than root or this user
    /// controls ([`rblk_fabric::trusted::walk`]).
    #[error("backing store {} is refused", path.display())]
    BackingUntrusted {
        /// The backing path.
        path: std::path::PathBuf,
        /// Which component, and why.
        #[source]
        source: rblk_fabric::trusted::PathError,
    },
    /// A missing backing file whose directory cannot be used.
    #[error("backing store {} does not exist, and its directory {} cannot be used to create it", path.display(), parent.display())]
    BackingDir {
        /// The backing path.
        path: std::path::PathBuf,
        /// Its parent.
        parent: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A backing path that cannot be examined.
    #[error("backing store {}", path.display())]
    Backing {
        /// The backing path.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Two volumes on one backing store.
    #[error("backing store {} is volume {other}'s too", path.display())]
    BackingShared {
        /// The backing path.
        path: std::path::PathBuf,
        /// The other volume.
        other: String,
    },
    /// A listen backlog out of its range.
    #[error("listen_backlog = {0}: it must be between {MIN_LISTEN_BACKLOG} and {MAX_LISTEN_BACKLOG}")]
    ListenBacklog(u32),
    /// The checks of the whole configuration ([`Config::check`](crate::config::Config::check)).
    #[error(transparent)]
    Check(StartError),
    /// `STATE_DIR/admin.toml` (see [`crate::saved`]) cannot be used.
    #[error(transparent)]
    Saved(#[from] SavedError),
}

/// The hint for a generated key this user may not make or read: the state dir is root's.
fn not_ours(source: &std::io::Error, what: &str) -> String {
    use std::io::ErrorKind::{PermissionDenied, ReadOnlyFilesystem};
    let denied = source.raw_os_error().is_some() && matches!(source.kind(), PermissionDenied | ReadOnlyFilesystem);
    if denied {
        format!(
            ": the state directory is not {what} by this user (run as root, pass a --state-dir of its own, configure \
             key_file, or serve without keys with --allow-any-host)"
        )
    } else {
        String::new()
    }
}

/// Why `admin.toml` could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SavedError {
    /// It cannot be opened or read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Someone else could have written it.
    #[error("{}: {why}: refused (only root or the daemon's user may have written it)", path.display())]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is wrong, in words.
        why: String,
    },
    /// Larger than [`MAX_SIZE`].
    #[error("{}: larger than {MAX_SIZE} bytes: refused", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// Not TOML of the right shape.
    #[error("{}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A saved volume that does not check.
    #[error("{}", path.display())]
    Volume {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<ConfigError>,
    },
    /// A saved volume the config file has too, as another volume.
    #[error(
        "volume {name} is in the config file and in {} (added with `rblk-target admin add`) with another size or \
         path: remove it from one of them", path.display()
    )]
    Conflict {
        /// The file.
        path: PathBuf,
        /// The volume.
        name: String,
    },
    /// It cannot be written.
    #[error("writing {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Why the admin socket could not be served.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SocketError {
    /// Another daemon answers on the path.
    #[error("admin socket {0}: another rblk-target is serving it (stop it, or use --admin-socket)")]
    InUse(PathBuf),
    /// Something that is not a socket is at the path.
    #[error("admin socket {0}: exists and is not a socket")]
    NotASocket(PathBuf),
    /// Longer than a unix socket address holds.
    #[error("admin socket {0}: longer than the 107 bytes a unix socket path may have")]
    TooLong(PathBuf),
    /// Its directory exists and others could replace the socket in it.
    #[error("admin socket: its directory is not safe: {0}")]
    UnsafeDir(String),
    /// Creating or binding it failed.
    #[error("admin socket {path}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Why a client request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// Nothing at the path, or nothing answers.
    #[error("no rblk-target is serving {0} (is it running? with another --admin-socket?)")]
    NotRunning(PathBuf),
    /// The socket is not ours to use.
    #[error("permission denied on {0}: the admin socket is its owner's only (mode 0600): run as root")]
    PermissionDenied(PathBuf),
    /// The process serving the socket is neither root nor this user: not talked to.
    #[error("admin socket {0}: the process serving it is not to be trusted: {1}")]
    UntrustedServer(PathBuf, String),
    /// Talking to it failed.
    #[error("admin socket {path}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The reply was not one.
    #[error("admin socket {0}: the daemon's reply is not a reply: {1}")]
    BadReply(PathBuf, String),
    /// The daemon refused the request.
    #[error("{message}")]
    Refused {
        /// [`crate::admin::AdminError::code`].
        code: String,
        /// Why.
        message: String,
    },
}

/// Why a handover did not happen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandoverError {
    /// The old daemon cannot be reached.
    #[error("cannot reach the running daemon to take over from")]
    Connect(#[source] ClientError),
    /// The old daemon refused (it serves on).
    #[error("the running daemon refused the handover: {0}")]
    Refused(String),
    /// The state's format is not one this daemon reads.
    #[error("the handed state has format {0}, which this rblk-target does not read (it reads formats {FORMATS:?}): upgrade in steps, or restart")]
    Format(String),
    /// The state is not a state.
    #[error("the handed state is malformed: {0}")]
    Malformed(String),
    /// The configuration changes what a handover cannot change.
    #[error("the new configuration changes what a handover keeps: {0}; keep them as they are for the handover (a reload can remove and re-add a volume afterwards), or stop and start instead")]
    Changed(String),
    /// A handed volume could not be taken.
    #[error("cannot take volume {name}: {reason}")]
    Volume {
        /// Which.
        name: String,
        /// Why.
        reason: String,
    },
    /// Talking to the old daemon failed.
    #[error("the handover conversation failed: {0}")]
    Io(#[source] std::io::Error),
    /// `rblk-target admin handover`: the successor would refuse (the daemon serves on).
    #[error("the successor would not start: {0}; the running daemon serves on")]
    Successor(String),
    /// The old daemon went away before it confirmed.
    #[error("the old daemon went away before it confirmed the handover: not serving its volumes (nobody can tell what it did last); start it again, or start this one without --takeover")]
    OldDaemonGone,
}
