//! Configuration of the daemon: [`Config`] (what a start or a reload applies; split into the
//! limits a reload changes and the settings only a restart changes), command-line syntax, and
//! the TOML config file.
//!
//! ```toml
//! listen = "10.0.0.1:7420"       # ADDR[:PORT]; default: every address, port 7420
//! metrics = "127.0.0.1:9442"     # Prometheus endpoint (GET /metrics); default: none
//! admin_socket = "/run/rblk-target/admin.sock"   # rblk-target admin (default); "none": off
//! device = "mlx5_0"              # accept connections on this RDMA device only
//! key_file = "/etc/rblk/key"     # shared key: any host that holds it may connect (without
//!                                # any key: STATE_DIR/target.key, made at the first start)
//! allow_any_host = false         # true: no key at all, every initiator gets in
//! confirm_widen = false          # true: a reload may widen access (allow_any_host, allow lists)
//! state_dir = "/var/lib/rblk"    # durable volumes' identities across clean shutdowns (default)
//! open_timeout = 10              # seconds a connection may take to open a session (default;
//!                                # or a string with units, "10s", "1m30s")
//! keepalive_timeout = "15s"      # silence (or a stuck keepalive) that ends one
//! max_unopened = 64              # connections that have not authenticated yet, in all
//! max_unopened_per_addr = 16     # ... and per peer address
//! max_sessions = 1024            # open sessions, in all
//! max_sessions_per_host = 64     # ... and per host (per address without host identities)
//! max_joins_per_session = 128    # further QPs (JOINs) of one session; at least 64
//! max_joins_per_host = 1024      # ... of one host's sessions
//! max_joins = 4096               # ... of every session
//! listen_backlog = 1024          # connect requests waiting to be taken (restart only)
//! memory_windows = true          # a window per QP over one registration per volume (default),
//!                                # where device and initiator support it; false: every session
//!                                # registers its volume in a protection domain of its own
//!
//! [[host]]
//! name = "db1.example.com"       # what the initiator sends (rblk --host-id; default hostname)
//! key_file = "/etc/rblk/hosts/db1.key"   # its own key (without: it proves the shared key)
//!
//! [[volume]]
//! name = "vol0"
//! size = "1G"                    # no allow list: open to every host that got in
//!
//! [[volume]]
//! name = "db"
//! size = "64G"
//! path = "/dev/nvme0n1"          # durable: backed by this file or block device
//! allow = { "db1.example.com" = "exclusive", "*" = "ro" }   # ro, rw or exclusive per host
//! ```
//!
//! Flags override the file; `--volume` flags replace its volume list.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::FileTypeExt as _;
use std::time::Duration;

use rblk_fabric::Fabric;

pub use crate::errors::{ConfigError, MAX_LISTEN_BACKLOG, MIN_LISTEN_BACKLOG};

use crate::access::{Acl, HostSpec, Policy};
use crate::errors::{SocketError, StartError};

/// Where durable volumes keep their instance identity across a clean shutdown, unless
/// `--state-dir` or the config's `state_dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/rblk";

/// The daemon's configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// Where to serve Prometheus metrics over HTTP (`GET /metrics`); None serves none.
    pub metrics: Option<SocketAddr>,
    /// The admin socket's path (see [`crate::admin`]); None serves none.
    pub admin_socket: Option<std::path::PathBuf>,
    /// Accept only connections arriving on this device.
    pub device: Option<String>,
    /// Volumes to serve.
    pub volumes: Vec<VolumeSpec>,
    /// Shared key: any host that proves it may connect. Without it and without host keys the
    /// target serves anyone: the daemon builds such a configuration only under
    /// `allow_any_host` ([`File::key_source`]).
    pub key: Option<Vec<u8>>,
    /// Known hosts and their own keys (see [`crate::access`]).
    pub hosts: Vec<HostSpec>,
    /// Every host must authenticate with AUTH v2 ([`rblk_proto::FEATURE_MUTUAL_AUTH`]); until
    /// this is on, initiators that predate it still answer any nonce with v1.
    pub require_mutual_auth: bool,
    /// The target's identity ([`rblk_proto::Message::AuthProof`]): `STATE_DIR/target.id` for
    /// the daemon ([`File::target_id`]); None: a random one for this process.
    pub target_id: Option<[u8; rblk_proto::TARGET_ID_LEN]>,
    /// Access lists by volume name; a volume without one is open to every host that got in.
    pub acls: HashMap<String, Acl>,
    /// Open sessions at most, in all.
    pub max_sessions: usize,
    /// Open sessions at most per host (per address for initiators without host identities).
    /// At the cap, an OPEN first probes the host's sessions not heard from for a keepalive
    /// interval and counts those that vanished out (see `registry::Shared::probe_silent_sessions`).
    pub max_sessions_per_host: usize,
    /// Connections JOINed to one session at most (every QP after its first; a JOIN past it is
    /// answered with an ERROR), like SPDK's `max_qpairs_per_ctrlr`. A config file may not set
    /// it below [`MIN_JOINS_PER_SESSION`].
    pub max_joins_per_session: usize,
    /// JOINed connections at most of one host's sessions (per address without host identities).
    pub max_joins_per_host: usize,
    /// JOINed connections at most, in all.
    pub max_joins: usize,
    /// The longest an AUTH failure's ERROR is held back (see [`crate::registry::Shared::auth_failed`]).
    pub max_auth_delay: Duration,
    /// Fabric to serve on.
    pub fabric: Fabric,
    /// Largest single I/O initiators may post.
    pub max_io: u32,
    /// Volume block size.
    pub block_size: u32,
    /// Where durable volumes keep their instance identity across a clean shutdown (see
    /// [`crate::identity`]); None keeps nothing, so they get a new one at every start.
    pub state_dir: Option<std::path::PathBuf>,
    /// A connection ends when the initiator sent nothing for this long (if it negotiated
    /// [`rblk_proto::FEATURE_KEEPALIVE`]), or when one of our keepalives stayed uncompleted
    /// for this long (always); with a session's last connection its registration goes.
    pub keepalive_timeout: Duration,
    /// A connection that has not opened (or joined) a session this long after its connect
    /// request is cut: unauthenticated and half-open connections hold a QP, a thread and
    /// registered buffers each.
    pub auth_timeout: Duration,
    /// Give each QP of a session its own type 2B memory window over one registration of the
    /// volume per device, where the device has such windows and the initiator asks for them
    /// ([`rblk_proto::FEATURE_WINDOWS`]); otherwise (and when false) each session registers the
    /// volume in a protection domain of its own.
    pub memory_windows: bool,
    /// Connections that have not authenticated yet (where no AUTH is asked: not opened a
    /// session), at most, in all and per peer address; decided at the connect request, before
    /// anything is allocated (see [`crate::admission`]). A new connection past the per-address
    /// cap evicts that address's oldest; past the cap in all, the oldest of the address holding
    /// the most; once half of it is held, one from an address already holding a place is
    /// dropped with a probability growing to 1 at the cap, as sshd's MaxStartups does. A
    /// connection that passed AUTH is never evicted for one that has not.
    pub max_unopened: usize,
    /// See [`Config::max_unopened`].
    pub max_unopened_per_addr: usize,
    /// A reload may widen access (see [`crate::access_changes`]): set only by the config file's
    /// `confirm_widen`, never by a flag, since a SIGHUP carries none.
    pub confirm_widen: bool,
    /// Volumes a reload (or a successor taking the volumes over) may remove although they
    /// would lose data: RAM volumes sessions could have written (see [`crate::reload`]).
    pub confirm_remove: Vec<String>,
    /// Connect requests that may wait for the daemon to take them (`rdma_listen`'s backlog;
    /// the kernel caps it at `net.rdma_ucm.max_backlog`): a reconnect storm past it is
    /// rejected. Between [`MIN_LISTEN_BACKLOG`] and [`MAX_LISTEN_BACKLOG`]; applies at start.
    pub listen_backlog: u32,
    /// Worker threads serving the connections, each many of them (each waits for all of its
    /// connections at once); at least 1. Default: [`default_workers`].
    pub workers: usize,
    /// A test hook: FLUSHes wait at it while it is held (see [`crate::persist::FlushHook`]). None in the daemon.
    #[doc(hidden)]
    pub flush_hook: Option<crate::persist::FlushHook>,
}

impl Config {
    /// Connections the caps allow at once: unopened ones, sessions' first QPs, and JOINs.
    pub fn max_connections(&self) -> u64 {
        let n = |c: usize| u64::try_from(c).unwrap_or(u64::MAX);
        n(self.max_unopened).saturating_add(n(self.max_sessions)).saturating_add(n(self.max_joins))
    }

    /// File descriptors the daemon may need with every cap reached, about: [`FDS_BASE`],
    /// [`FDS_PER_CONNECTION`] per connection, and a backing store and its io_uring per volume
    /// (judged against the limits by [`crate::resources::judge`]).
    pub fn descriptors_needed(&self) -> u64 {
        let volumes = u64::try_from(self.volumes.len()).unwrap_or(u64::MAX);
        FDS_BASE
            .saturating_add(volumes.saturating_mul(2))
            .saturating_add(self.max_connections().saturating_mul(FDS_PER_CONNECTION))
    }
}

/// The most worker threads [`default_workers`] picks.
pub const MAX_DEFAULT_WORKERS: usize = 4;

/// Default [`Config::workers`]: the CPUs this process may run on (its affinity mask), at most
/// [`MAX_DEFAULT_WORKERS`], at least 1.
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get).clamp(1, MAX_DEFAULT_WORKERS)
}

/// Default [`Config::auth_timeout`].
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Default [`Config::max_unopened`].
pub const MAX_UNOPENED: usize = 64;
/// Default [`Config::max_unopened_per_addr`].
pub const MAX_UNOPENED_PER_ADDR: usize = 16;
/// Default [`Config::max_sessions`].
pub const MAX_SESSIONS: usize = 1024;
/// Default [`Config::max_sessions_per_host`].
pub const MAX_SESSIONS_PER_HOST: usize = 64;
/// Default [`Config::max_joins_per_session`].
pub const MAX_JOINS_PER_SESSION: usize = 128;
/// The least [`Config::max_joins_per_session`] a config file or flag may set: `rblk attach
/// --queues` goes up to 64, a QP per queue.
pub const MIN_JOINS_PER_SESSION: usize = 64;
/// Default [`Config::max_joins_per_host`].
pub const MAX_JOINS_PER_HOST: usize = 1024;
/// Default [`Config::max_joins`].
pub const MAX_JOINS: usize = 4096;
/// File descriptors one connection may hold, at worst: its completion channel. Over verbs a
/// connection's completions go to its worker's shared CQ (one completion channel per 256 QPs,
/// `rblk_fabric::SharedCq`), so it holds none; only one that gets a CQ of its own (a shared CQ
/// could not be made) holds a channel. Its waker is its worker's (one eventfd per worker), its
/// rdma_cm id has none of its own (a passive id's events come on the listener's event channel),
/// and its QP and protection domain live in the device's context, opened once per device.
/// Before the worker loops it was 3 (a channel and a waker's socketpair): 1,000 idle sessions
/// held 3,013 descriptors, and 2,000 QPs on shared CQs hold 29 in all (issue 40's measurements).
pub const FDS_PER_CONNECTION: u64 = 1;
/// File descriptors the daemon holds besides connections and volumes (listener, admin socket,
/// metrics, the RDMA devices, standard streams, ...).
pub const FDS_BASE: u64 = 64;
/// Default [`Config::max_auth_delay`].
pub const MAX_AUTH_DELAY: Duration = Duration::from_secs(2);
/// The shortest `open_timeout` (`--open-timeout`).
pub const MIN_OPEN_TIMEOUT: Duration = Duration::from_secs(1);
/// The shortest `keepalive_timeout` (`--keepalive-timeout`): two keepalive intervals and a
/// second, so that peers are not cut between keepalives.
pub const MIN_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2 * rblk_proto::KEEPALIVE_INTERVAL.as_secs() + 1);
/// The longest `open_timeout` and `keepalive_timeout`.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), rblk_proto::DEFAULT_PORT),
            metrics: None,
            admin_socket: None,
            device: None,
            volumes: vec![VolumeSpec { name: "vol0".into(), size: 1 << 30, path: None }],
            key: None,
            hosts: Vec::new(),
            require_mutual_auth: false,
            target_id: None,
            acls: HashMap::new(),
            max_sessions: MAX_SESSIONS,
            max_sessions_per_host: MAX_SESSIONS_PER_HOST,
            max_joins_per_session: MAX_JOINS_PER_SESSION,
            max_joins_per_host: MAX_JOINS_PER_HOST,
            max_joins: MAX_JOINS,
            max_auth_delay: MAX_AUTH_DELAY,
            fabric: Fabric::Verbs,
            max_io: 1 << 20,
            block_size: rblk_proto::BLOCK_SIZE,
            state_dir: None,
            keepalive_timeout: rblk_proto::KEEPALIVE_TIMEOUT,
            auth_timeout: AUTH_TIMEOUT,
            max_unopened: MAX_UNOPENED,
            max_unopened_per_addr: MAX_UNOPENED_PER_ADDR,
            memory_windows: true,
            listen_backlog: rblk_fabric::policy::LISTEN_BACKLOG,
            confirm_widen: false,
            confirm_remove: Vec::new(),
            workers: default_workers(),
            flush_hook: None,
        }
    }
}

/// The limits a reload changes; connections take the timeouts when they are admitted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub(crate) keepalive_timeout: Duration,
    pub(crate) auth_timeout: Duration,
    pub(crate) max_unopened: usize,
    pub(crate) max_unopened_per_addr: usize,
    pub(crate) max_sessions: usize,
    pub(crate) max_sessions_per_host: usize,
    pub(crate) max_joins_per_session: usize,
    pub(crate) max_joins_per_host: usize,
    pub(crate) max_joins: usize,
    pub(crate) max_auth_delay: Duration,
}

impl Limits {
    pub(crate) fn of(cfg: &Config) -> Limits {
        Limits {
            keepalive_timeout: cfg.keepalive_timeout,
            auth_timeout: cfg.auth_timeout,
            max_unopened: cfg.max_unopened.max(1),
            max_unopened_per_addr: cfg.max_unopened_per_addr.max(1),
            max_sessions: cfg.max_sessions.max(1),
            max_sessions_per_host: cfg.max_sessions_per_host.max(1),
            max_joins_per_session: cfg.max_joins_per_session,
            max_joins_per_host: cfg.max_joins_per_host,
            max_joins: cfg.max_joins,
            max_auth_delay: cfg.max_auth_delay,
        }
    }
}

/// The settings a reload cannot change (see [`crate::reload`]).
#[derive(Debug, Clone)]
pub(crate) struct Fixed {
    pub(crate) listen: SocketAddr,
    pub(crate) metrics: Option<SocketAddr>,
    pub(crate) admin_socket: Option<std::path::PathBuf>,
    pub(crate) device: Option<String>,
    pub(crate) fabric: Fabric,
    pub(crate) state_dir: Option<std::path::PathBuf>,
    pub(crate) block_size: u32,
    pub(crate) max_io: u32,
    pub(crate) memory_windows: bool,
    pub(crate) listen_backlog: u32,
    pub(crate) workers: usize,
    pub(crate) flush_hook: Option<crate::persist::FlushHook>,
}

impl Fixed {
    pub(crate) fn of(cfg: &Config) -> Fixed {
        Fixed {
            listen: cfg.listen,
            metrics: cfg.metrics,
            admin_socket: cfg.admin_socket.clone(),
            device: cfg.device.clone(),
            fabric: cfg.fabric,
            state_dir: cfg.state_dir.clone(),
            block_size: cfg.block_size,
            max_io: cfg.max_io,
            memory_windows: cfg.memory_windows,
            listen_backlog: cfg.listen_backlog,
            workers: cfg.workers,
            flush_hook: cfg.flush_hook.clone(),
        }
    }
}

/// A volume's size: `4096`, `64k`, `1.5G`, `64GiB` (powers of 1024), `4096KB` (powers of 1000),
/// whole blocks of [`BLOCK_SIZE`](rblk_proto::BLOCK_SIZE): the project's one size parser,
/// [`rblk_proto::parse_size_aligned`], with a message that quotes the input.
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    Ok(rblk_proto::parse_size_aligned(s, rblk_proto::BLOCK_SIZE.into())?)
}

/// `--volume NAME:SIZE[:PATH]`: a RAM volume, or a durable one backed by the file or block
/// device at PATH (everything after the second colon).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSpec {
    /// Name initiators open it by.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Backing store, for a durable volume.
    pub path: Option<std::path::PathBuf>,
}

impl VolumeSpec {
    /// A checked spec: the name 1-64 characters of `A-Z a-z 0-9 - _ .`, the size a non-zero
    /// multiple of 4096.
    pub fn new(name: &str, size: u64, path: Option<std::path::PathBuf>) -> Result<VolumeSpec, ConfigError> {
        if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(ConfigError::VolumeName(name.to_owned()));
        }
        if size == 0 {
            return Err(ConfigError::VolumeSize(size));
        }
        rblk_proto::check_aligned(None, size, rblk_proto::BLOCK_SIZE.into())?;
        Ok(VolumeSpec { name: name.to_owned(), size, path })
    }
}

impl std::str::FromStr for VolumeSpec {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let (name, rest) = s.split_once(':').ok_or_else(|| ConfigError::VolumeSyntax(s.to_owned()))?;
        let (size, path) = match rest.split_once(':') {
            Some((_, "")) => return Err(ConfigError::EmptyBackingPath(s.to_owned())),
            Some((size, path)) => (size, Some(std::path::PathBuf::from(path))),
            None => (rest, None),
        };
        let flag = |e: ConfigError| ConfigError::VolumeFlag { spec: s.to_owned(), source: Box::new(e) };
        VolumeSpec::new(name, parse_size(size).map_err(flag)?, path).map_err(flag)
    }
}

/// A volume's size in the config file: bytes as an integer (`size = 1073741824`) or a string
/// with an optional suffix (`size = "1G"`, see [`parse_size`]). Printed back as it was given.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Size {
    /// `size = 1073741824`.
    Bytes(u64),
    /// `size = "1G"`.
    Text(String),
}

impl Size {
    /// In bytes.
    pub fn bytes(&self) -> Result<u64, ConfigError> {
        match self {
            Size::Bytes(n) => Ok(*n),
            Size::Text(s) => parse_size(s),
        }
    }
}

impl Default for Size {
    fn default() -> Size {
        Size::Bytes(0)
    }
}

impl From<u64> for Size {
    fn from(n: u64) -> Size {
        Size::Bytes(n)
    }
}

impl From<&str> for Size {
    fn from(s: &str) -> Size {
        Size::Text(s.to_owned())
    }
}

// By hand rather than `#[serde(untagged)]`: an untagged enum's error names no value.
impl<'de> serde::Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a size: bytes as an integer (1073741824) or a string like \"64M\" or \"1G\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size::Bytes(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Size, E> {
                u64::try_from(n).map(Size::Bytes).map_err(|_| E::custom(format!("size {n} is negative")))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                Ok(Size::Text(s.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// A timeout in the config file: seconds as an integer (`keepalive_timeout = 15`) or a
/// duration with units (`keepalive_timeout = "15s"`, `"1m30s"`, see
/// [`rblk_proto::parse_duration`]). Printed back as it was given.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(untagged)]
pub enum Timeout {
    /// `keepalive_timeout = 15`.
    Seconds(u64),
    /// `keepalive_timeout = "15s"`.
    Text(String),
}

impl Timeout {
    /// The duration, or why the text is not one.
    pub fn duration(&self) -> Result<Duration, String> {
        match self {
            Timeout::Seconds(n) => Ok(Duration::from_secs(*n)),
            Timeout::Text(s) => rblk_proto::parse_duration(s),
        }
    }
}

/// A flag's duration for the file: whole seconds as an integer, as the file has always said
/// them; anything finer as text (`1500ms`).
impl From<Duration> for Timeout {
    fn from(d: Duration) -> Timeout {
        if d.subsec_nanos() == 0 {
            Timeout::Seconds(d.as_secs())
        } else {
            Timeout::Text(rblk_proto::format_duration(d).replace(' ', ""))
        }
    }
}

impl<'de> serde::Deserialize<'de> for Timeout {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Timeout, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Timeout;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a duration: seconds as an integer (15) or a string like \"15s\", \"500ms\" or \"2m\"")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Timeout, E> {
                Ok(Timeout::Seconds(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<Timeout, E> {
                u64::try_from(n).map(Timeout::Seconds).map_err(|_| E::custom(format!("duration {n} is negative")))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Timeout, E> {
                Ok(Timeout::Text(s.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// Whether an admin socket path means "serve none": `none`, `off` or empty.
pub fn is_off(path: &std::path::Path) -> bool {
    ["", "none", "off"].iter().any(|off| path.as_os_str() == *off)
}

/// `--listen ADDR[:PORT]`, IPv6 in brackets; the port defaults to the protocol's.
pub fn parse_listen(s: &str) -> Result<SocketAddr, ConfigError> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let ip = s.trim_start_matches('[').trim_end_matches(']');
    ip.parse::<std::net::IpAddr>()
        .map(|ip| SocketAddr::new(ip, rblk_proto::DEFAULT_PORT))
        .map_err(|_| ConfigError::Listen(s.to_owned()))
}

/// Reads a key file with the project's one reader ([`rblk_fabric::keyfile::read`]): at least
/// [`MIN_KEY_LEN`](rblk_fabric::keyfile::MIN_KEY_LEN) bytes without trailing whitespace, in a
/// file that group and others cannot read.
pub fn read_key_file(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    rblk_fabric::keyfile::read(path).map_err(|source| ConfigError::KeyFile { path: path.to_owned(), source })
}

/// The key file the daemon makes and uses when no key is configured and any host is not
/// allowed: `STATE_DIR/target.key`.
pub const GENERATED_KEY: &str = "target.key";

/// The target's identity, in the state dir: 32 hexadecimal digits (see [`File::target_id`]).
pub const TARGET_ID: &str = "target.id";

/// Where the daemon's key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `key_file` or `[[host]]` keys, as configured.
    Configured,
    /// The generated key in the state dir, made at the first start (see [`GENERATED_KEY`]).
    Generated(std::path::PathBuf),
    /// No key: `allow_any_host`, every initiator that reaches the port gets in.
    AnyHost,
}

/// The config file (`--config`). Unknown keys are errors.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// `ADDR[:PORT]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `ADDR:PORT` of the Prometheus endpoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// Path of the admin socket; `none` (or `off`, or empty) serves none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_socket: Option<std::path::PathBuf>,
    /// RDMA device filter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// Pre-shared key file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<std::path::PathBuf>,
    /// Serve without keys when none is configured (instead of the generated key).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allow_any_host: Option<bool>,
    /// Refuse v1 AUTH from every host: only initiators that also prove the connection and
    /// check the target's proof get in.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_mutual_auth: Option<bool>,
    /// State directory (durable volumes' identities).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<std::path::PathBuf>,
    /// How long a connection may take to open (or join) a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub open_timeout: Option<Timeout>,
    /// Initiator silence, or an uncompleted keepalive, that ends a connection.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keepalive_timeout: Option<Timeout>,
    /// Connections that have not opened a session yet, at most.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_unopened: Option<usize>,
    /// ... per peer address.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_unopened_per_addr: Option<usize>,
    /// Open sessions at most.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<usize>,
    /// ... per host.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_host: Option<usize>,
    /// JOINed connections at most per session.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_joins_per_session: Option<usize>,
    /// ... of one host's sessions.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_joins_per_host: Option<usize>,
    /// ... in all.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub max_joins: Option<usize>,
    /// Memory windows where the device and the initiator have them (default true).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_windows: Option<bool>,
    /// `rdma_listen`'s backlog (default 1024).
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub listen_backlog: Option<u32>,
    /// Worker threads serving the connections.
    #[serde(default, deserialize_with = "whole::option", skip_serializing_if = "Option::is_none")]
    pub workers: Option<usize>,
    /// A reload may widen access (authentication off, an allow list removed, `*` added).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub confirm_widen: Option<bool>,
    /// Volumes a reload or a handover may remove although their contents go with them (RAM
    /// volumes that sessions wrote).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confirm_remove: Vec<String>,
    /// Known hosts.
    #[serde(default, rename = "host", skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<FileHost>,
    /// Volumes.
    #[serde(default, rename = "volume", skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<FileVolume>,
    /// The file this came from (absolute), for errors; None for flags alone.
    #[serde(skip)]
    pub origin: Option<std::path::PathBuf>,
    /// The path keys (`key_file`, `state_dir`, `admin_socket`) a flag or a default set, not
    /// the file, so that an error about them does not blame the file.
    #[serde(skip)]
    pub not_from_file: Vec<&'static str>,
}

/// The config file's counts: serde's own say "expected usize".
mod whole {
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{Error, Unexpected, Visitor};

    /// An optional whole number that fits `T`.
    pub(super) fn option<'de, D: serde::Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<Option<T>, D::Error> {
        struct Whole<T>(PhantomData<T>);
        impl<T: TryFrom<u64>> Visitor<'_> for Whole<T> {
            type Value = Option<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number, without quotes (e.g. 64)")
            }
            fn visit_u64<E: Error>(self, n: u64) -> Result<Self::Value, E> {
                T::try_from(n).map(Some).map_err(|_| E::invalid_value(Unexpected::Unsigned(n), &"a smaller number"))
            }
            fn visit_i64<E: Error>(self, n: i64) -> Result<Self::Value, E> {
                let n = u64::try_from(n).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))?;
                self.visit_u64(n)
            }
        }
        d.deserialize_any(Whole(PhantomData))
    }
}

/// One `[[volume]]` of the config file.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileVolume {
    /// Name.
    pub name: String,
    /// Size: `"1G"`, or bytes as an integer.
    pub size: Size,
    /// Backing store of a durable volume.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<std::path::PathBuf>,
    /// Who may open it, and how; empty: every host that got in.
    #[serde(default, skip_serializing_if = "Acl::is_empty")]
    pub allow: Acl,
}

impl FileVolume {
    /// The entry as a checked volume; errors name the volume.
    pub fn spec(&self) -> Result<VolumeSpec, ConfigError> {
        let named = |e: ConfigError| ConfigError::Volume { name: self.name.clone(), source: Box::new(e) };
        let size = self.size.bytes().map_err(named)?;
        VolumeSpec::new(&self.name, size, self.path.clone()).map_err(named)
    }
}

/// One `[[host]]` of the config file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FileHost {
    /// Its identity.
    pub name: String,
    /// Its own key file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_file: Option<std::path::PathBuf>,
    /// Refuse this host's v1 AUTH.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub require_mutual_auth: Option<bool>,
}

impl File {
    /// Reads and parses a config file. Its relative paths (`key_file`, each `[[host]]`'s
    /// `key_file`, each `[[volume]]`'s `path`, `state_dir`, `admin_socket`) are taken relative
    /// to the file's directory, not to the working directory of whoever reads it (the unit runs
    /// in `/`, a check by hand wherever its user is), and become absolute here: what a start,
    /// a reload, `--check-config` and `--print-config` see is the same.
    pub fn read(path: &std::path::Path) -> Result<File, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        let mut file: File =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.to_owned(), source: Box::new(e) })?;
        let path = std::path::absolute(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        file.resolve_paths(path.parent().unwrap_or(std::path::Path::new("/")));
        file.origin = Some(path);
        Ok(file)
    }

    /// Makes every relative path of the file absolute, relative to `dir` (see [`File::read`]).
    fn resolve_paths(&mut self, dir: &std::path::Path) {
        let paths = self
            .key_file
            .iter_mut()
            .chain(self.state_dir.iter_mut())
            // "none" (or "off", or empty) serves no socket: not a path.
            .chain(self.admin_socket.iter_mut().filter(|p| !is_off(p)))
            .chain(self.hosts.iter_mut().filter_map(|h| h.key_file.as_mut()))
            .chain(self.volumes.iter_mut().filter_map(|v| v.path.as_mut()));
        for p in paths.filter(|p| p.is_relative() && !p.as_os_str().is_empty()) {
            *p = dir.join(&*p);
        }
    }

    /// The volumes, checked like `--volume` flags.
    pub fn volume_specs(&self) -> Result<Vec<VolumeSpec>, ConfigError> {
        self.volumes.iter().map(FileVolume::spec).collect()
    }

    /// Refuses limits that cannot work: zero counts or timeouts, and a keepalive timeout that
    /// two keepalive intervals do not fit in (peers would be cut between keepalives).
    pub fn check_limits(&self) -> Result<(), ConfigError> {
        let counts = [
            ("max_unopened", self.max_unopened),
            ("max_unopened_per_addr", self.max_unopened_per_addr),
            ("max_sessions", self.max_sessions),
            ("max_sessions_per_host", self.max_sessions_per_host),
            ("max_joins_per_host", self.max_joins_per_host),
            ("max_joins", self.max_joins),
            ("workers", self.workers),
        ];
        if let Some((key, _)) = counts.iter().find(|(_, n)| *n == Some(0)) {
            return Err(ConfigError::ZeroCount(key));
        }
        if let Some(got) = self.max_joins_per_session.filter(|&n| n < MIN_JOINS_PER_SESSION) {
            return Err(ConfigError::JoinsPerSession { got, min: MIN_JOINS_PER_SESSION });
        }
        if let Some(got) = self.listen_backlog.filter(|n| !(MIN_LISTEN_BACKLOG..=MAX_LISTEN_BACKLOG).contains(n)) {
            return Err(ConfigError::ListenBacklog(got));
        }
        self.timeouts().map(|_| ())
    }

    /// `open_timeout` and `keepalive_timeout` (None: not set), parsed and checked against
    /// their ranges ([`MIN_OPEN_TIMEOUT`], [`MIN_KEEPALIVE_TIMEOUT`], [`MAX_TIMEOUT`]).
    pub fn timeouts(&self) -> Result<(Option<Duration>, Option<Duration>), ConfigError> {
        let check = |key: &'static str, value: &Option<Timeout>, min: Duration| {
            value
                .as_ref()
                .map(|t| {
                    let d = t.duration().map_err(|reason| ConfigError::Timeout { key, reason })?;
                    rblk_proto::check_duration(d, min, Some(MAX_TIMEOUT))
                        .map(|()| d)
                        .map_err(|reason| ConfigError::Timeout { key, reason })
                })
                .transpose()
        };
        Ok((
            check("open_timeout", &self.open_timeout, MIN_OPEN_TIMEOUT)?,
            check("keepalive_timeout", &self.keepalive_timeout, MIN_KEEPALIVE_TIMEOUT)?,
        ))
    }

    /// The hosts, with their key files read.
    pub fn host_specs(&self) -> Result<Vec<HostSpec>, ConfigError> {
        self.hosts
            .iter()
            .map(|h| {
                let key = h
                    .key_file
                    .as_deref()
                    .map(read_key_file)
                    .transpose()
                    .map_err(|e| self.in_file("host", Some(format!("[[host]] {}: key_file", h.name)), e))?;
                Ok(HostSpec { name: h.name.clone(), key, require_mutual_auth: h.require_mutual_auth == Some(true) })
            })
            .collect()
    }

    /// The volumes' access lists (volumes with one only).
    pub fn acls(&self) -> std::collections::HashMap<String, Acl> {
        self.volumes.iter().filter(|v| !v.allow.is_empty()).map(|v| (v.name.clone(), v.allow.clone())).collect()
    }

    /// The daemon's configuration from this file (key files read, everything checked, with
    /// [`Config::check`] too); anything the file leaves out has [`Config::default`]'s value,
    /// the state dir too.
    pub fn server_config(&self) -> Result<Config, ConfigError> {
        self.check_limits()?;
        let (open_timeout, keepalive_timeout) = self.timeouts()?;
        let defaults = Config::default();
        let cfg = Config {
            listen: self.listen.as_deref().map_or(Ok(defaults.listen), parse_listen)?,
            metrics: self
                .metrics
                .as_deref()
                .map(|m| m.parse().map_err(|source| ConfigError::Metrics { value: m.to_owned(), source }))
                .transpose()?,
            admin_socket: self.admin_socket.clone().filter(|p| !is_off(p)),
            device: self.device.clone(),
            volumes: self.volume_specs()?,
            key: match self.key_source() {
                KeySource::Generated(path) => Some(
                    rblk_fabric::keyfile::read(&path)
                        .map_err(|source| self.in_file("state_dir", None, ConfigError::KeyRead { path, source }))?,
                ),
                _ => self
                    .key_file
                    .as_deref()
                    .map(read_key_file)
                    .transpose()
                    .map_err(|e| self.in_file("key_file", Some("key_file".into()), e))?,
            },
            hosts: self.host_specs()?,
            require_mutual_auth: self.require_mutual_auth == Some(true),
            target_id: self.target_id()?,
            acls: self.acls(),
            state_dir: self.state_dir.clone(),
            auth_timeout: open_timeout.unwrap_or(defaults.auth_timeout),
            keepalive_timeout: keepalive_timeout.unwrap_or(defaults.keepalive_timeout),
            max_unopened: self.max_unopened.unwrap_or(defaults.max_unopened),
            max_unopened_per_addr: self.max_unopened_per_addr.unwrap_or(defaults.max_unopened_per_addr),
            max_sessions: self.max_sessions.unwrap_or(defaults.max_sessions),
            max_sessions_per_host: self.max_sessions_per_host.unwrap_or(defaults.max_sessions_per_host),
            max_joins_per_session: self.max_joins_per_session.unwrap_or(defaults.max_joins_per_session),
            max_joins_per_host: self.max_joins_per_host.unwrap_or(defaults.max_joins_per_host),
            max_joins: self.max_joins.unwrap_or(defaults.max_joins),
            memory_windows: self.memory_windows.unwrap_or(defaults.memory_windows),
            listen_backlog: self.listen_backlog.unwrap_or(defaults.listen_backlog),
            confirm_widen: self.confirm_widen.unwrap_or(defaults.confirm_widen),
            confirm_remove: self.confirm_remove.clone(),
            workers: self.workers.unwrap_or(defaults.workers).max(1),
            ..defaults
        };
        cfg.check().map_err(|e| {
            // A volume's errors name the volume (which may come from admin.toml) and its path.
            let key = match &e {
                StartError::Admin(_) => "admin_socket",
                StartError::StateDir { .. } => "state_dir",
                _ => return ConfigError::Check(e),
            };
            self.in_file(key, Some(key.to_owned()), ConfigError::Check(e))
        })?;
        Ok(cfg)
    }

    /// `e`, about the setting `key`, with the config file named when the setting came from
    /// it (not from a flag): `detail` names the key where `e` does not.
    fn in_file(&self, key: &'static str, detail: Option<String>, e: ConfigError) -> ConfigError {
        match &self.origin {
            Some(file) if !self.not_from_file.contains(&key) => {
                ConfigError::InFile { file: file.clone(), key: detail, source: Box::new(e) }
            }
            _ => e,
        }
    }

    /// Where the key comes from: configured (`key_file`, or a `[[host]]` with a `key_file`),
    /// none under `allow_any_host`, else the generated `STATE_DIR/target.key`.
    pub fn key_source(&self) -> KeySource {
        if self.key_file.is_some() || self.hosts.iter().any(|h| h.key_file.is_some()) {
            KeySource::Configured
        } else if self.allow_any_host == Some(true) {
            KeySource::AnyHost
        } else {
            let dir = self.state_dir.as_deref().unwrap_or(std::path::Path::new(DEFAULT_STATE_DIR));
            KeySource::Generated(dir.join(GENERATED_KEY))
        }
    }

    /// This file as `--check-config` checks it: a generated key the first start would make
    /// is not made for the check (its absence is no error).
    pub fn as_checked(&self) -> File {
        let mut checked = self.clone();
        if let KeySource::Generated(path) = self.key_source() {
            if !path.exists() {
                checked.allow_any_host = Some(true);
            }
        }
        checked
    }

    /// Makes the generated key if this configuration uses it and it does not exist yet (a
    /// start does this before [`File::server_config`]); true when it was made now. An existing
    /// file is never replaced; a bad one is refused when it is read.
    pub fn generate_key(&self) -> Result<bool, ConfigError> {
        let KeySource::Generated(path) = self.key_source() else { return Ok(false) };
        if let Some(dir) = path.parent() {
            rblk_fabric::trusted::ensure_dir(dir)
                .map_err(|e| ConfigError::KeyCreate { path: path.clone(), source: e.into() })?;
        }
        match rblk_fabric::keyfile::generate(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(source) => Err(ConfigError::KeyCreate { path, source }),
        }
    }

    /// The target's identity from `STATE_DIR/target.id` ([`TARGET_ID`]), if it was made (a
    /// start makes it first, with [`File::generate_target_id`]); None leaves a random one for
    /// the process (`--check-config` before the first start).
    pub fn target_id(&self) -> Result<Option<[u8; rblk_proto::TARGET_ID_LEN]>, ConfigError> {
        use std::io::Read;
        let path = self.target_id_path();
        let err = |reason: String| ConfigError::TargetId { path: path.clone(), reason };
        let walked = match rblk_fabric::trusted::walk(&path, rblk_fabric::trusted::Last::Private) {
            Ok(w) if w.stat().is_some() => w,
            Ok(_) => return Ok(None),
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(err(e.to_string())),
        };
        let mut text = String::new();
        walked
            .open(rblk_fabric::trusted::OFlag::O_RDONLY)
            .and_then(|f| f.take(64).read_to_string(&mut text))
            .map_err(|e| err(e.to_string()))?;
        rblk_proto::from_hex::<{ rblk_proto::TARGET_ID_LEN }>(text.trim())
            .map(Some)
            .ok_or_else(|| err("not 32 hexadecimal digits".into()))
    }

    /// Makes `STATE_DIR/target.id` if it does not exist yet (a start does this with the key);
    /// true when it was made now. It is not a secret: initiators pin it (per address) and are
    /// told it after they proved the key.
    pub fn generate_target_id(&self) -> Result<bool, ConfigError> {
        use std::io::Write;
        let path = self.target_id_path();
        let err = |reason: String| ConfigError::TargetId { path: path.clone(), reason };
        if let Some(dir) = path.parent() {
            rblk_fabric::trusted::ensure_dir(dir).map_err(|e| err(e.to_string()))?;
        }
        let walked =
            rblk_fabric::trusted::walk(&path, rblk_fabric::trusted::Last::Private).map_err(|e| err(e.to_string()))?;
        if walked.stat().is_some() {
            return Ok(false);
        }
        let id: [u8; rblk_proto::TARGET_ID_LEN] = rblk_fabric::random();
        let written = walked.create(0o644).and_then(|mut f| {
            f.write_all(format!("{}\n", rblk_proto::to_hex(&id)).as_bytes())?;
            f.sync_all()
        });
        match written {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => {
                // Never leave a half-written identity behind for the next start to refuse.
                let _ = std::fs::remove_file(&path);
                Err(err(e.to_string()))
            }
        }
    }

    fn target_id_path(&self) -> std::path::PathBuf {
        self.state_dir.as_deref().unwrap_or(std::path::Path::new(DEFAULT_STATE_DIR)).join(TARGET_ID)
    }

    /// The effective configuration as TOML (`--print-config`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
    }

    /// This file with every setting it leaves out filled in with the value a start uses
    /// ([`Config::default`]), so `--print-config` shows everything in effect, as `sshd -T`
    /// does, in a form `--config` reads back. Settings whose default is "none" (`metrics`,
    /// `device`, `key_file`) stay out; [`File::unset_notes`] says what that means.
    pub fn with_defaults(&self) -> File {
        let d = Config::default();
        let mut f = self.clone();
        f.listen.get_or_insert_with(|| d.listen.to_string());
        f.allow_any_host.get_or_insert(false);
        f.require_mutual_auth.get_or_insert(false);
        f.state_dir.get_or_insert_with(|| std::path::PathBuf::from(DEFAULT_STATE_DIR));
        f.open_timeout.get_or_insert_with(|| d.auth_timeout.into());
        f.keepalive_timeout.get_or_insert_with(|| d.keepalive_timeout.into());
        f.max_unopened.get_or_insert(d.max_unopened);
        f.max_unopened_per_addr.get_or_insert(d.max_unopened_per_addr);
        f.max_sessions.get_or_insert(d.max_sessions);
        f.max_sessions_per_host.get_or_insert(d.max_sessions_per_host);
        f.max_joins_per_session.get_or_insert(d.max_joins_per_session);
        f.max_joins_per_host.get_or_insert(d.max_joins_per_host);
        f.max_joins.get_or_insert(d.max_joins);
        f.memory_windows.get_or_insert(d.memory_windows);
        f.listen_backlog.get_or_insert(d.listen_backlog);
        f.workers.get_or_insert(d.workers);
        f
    }

    /// What the settings left out of [`File::with_defaults`] mean, as TOML comments.
    pub fn unset_notes(&self) -> String {
        let mut notes = String::new();
        if self.metrics.is_none() {
            notes.push_str("# metrics: not served (metrics = \"ADDR:PORT\" serves Prometheus metrics)\n");
        }
        if self.device.is_none() {
            notes.push_str("# device: connections on every RDMA device are accepted\n");
        }
        if let KeySource::Generated(path) = self.key_source() {
            notes.push_str(&format!(
                "# key_file: none configured: initiators must prove the generated {}\n",
                path.display()
            ));
        }
        notes
    }
}

impl Config {
    /// Every check of the configuration that needs no hardware, so that `--check-config` on a
    /// host without RDMA finds what a start would refuse (no volume is fine: `rblk-target admin
    /// add` adds them later): valid names and
    /// sizes (multiples of the block size); no volume twice; backing paths that can work (an
    /// existing file or block device, or a missing file in an existing directory) and no
    /// backing store shared by two volumes; a non-empty shared key; host names and access
    /// lists (of configured volumes only); an admin socket path that fits a socket address
    /// and holds nothing but a socket; a state directory that only root and this user control.
    /// [`crate::server::Server::start`] and
    /// [`crate::server::Running::reload`] run it first; returns the checked access policy.
    ///
    /// A backing store that exists but cannot be opened or is too small is found only when
    /// the volume is loaded, and refuses that volume, not the daemon.
    pub fn check(&self) -> Result<Policy, StartError> {
        let mut names = std::collections::HashSet::new();
        let mut backings: std::collections::HashMap<std::path::PathBuf, &str> = std::collections::HashMap::new();
        for v in &self.volumes {
            let invalid = |e: ConfigError| StartError::InvalidVolume { name: v.name.clone(), source: Box::new(e) };
            VolumeSpec::new(&v.name, v.size, None).map_err(invalid)?;
            rblk_proto::check_aligned(None, v.size, self.block_size.into()).map_err(|e| invalid(e.into()))?;
            if !names.insert(v.name.as_str()) {
                return Err(StartError::DuplicateVolume(v.name.clone()));
            }
            if let Some(path) = &v.path {
                check_backing_path(path).map_err(invalid)?;
                let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
                if let Some(other) = backings.insert(key, &v.name) {
                    return Err(invalid(ConfigError::BackingShared { path: path.clone(), other: other.to_owned() }));
                }
            }
        }
        if let Some(path) = &self.admin_socket {
            check_admin_socket(path).map_err(StartError::Admin)?;
        }
        if let Some(dir) = &self.state_dir {
            // Its records and key are trusted as they are: nobody else may be able to plant them.
            rblk_fabric::trusted::check_dir_path(dir)
                .map_err(|source| StartError::StateDir { path: dir.clone(), source })?;
        }
        if self.key.as_ref().is_some_and(Vec::is_empty) {
            return Err(StartError::Access(crate::access::PolicyError::EmptySharedKey));
        }
        let names: Vec<&str> = self.volumes.iter().map(|v| v.name.as_str()).collect();
        let mut policy =
            Policy::new(self.key.clone(), &self.hosts, self.acls.clone(), &names).map_err(StartError::Access)?;
        policy.require_mutual_auth(self.require_mutual_auth);
        Ok(policy)
    }
}

/// A backing path that can work: an existing regular file or block device, or a file to be
/// created in an existing directory, on a path no one but root and this user controls (the walk
/// [`crate::persist::Backing::open`] takes).
fn check_backing_path(path: &std::path::Path) -> Result<(), ConfigError> {
    let walked = match rblk_fabric::trusted::walk(path, rblk_fabric::trusted::Last::Any) {
        Ok(w) => w,
        Err(e) if e.is_not_found() => {
            let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
            return Err(ConfigError::BackingDir { path: path.to_owned(), parent: parent.to_owned(), source: e.into() });
        }
        Err(source) => return Err(ConfigError::BackingUntrusted { path: path.to_owned(), source }),
    };
    let kind = walked.stat().map(|st| st.st_mode & libc::S_IFMT);
    match kind {
        None | Some(libc::S_IFREG | libc::S_IFBLK) => Ok(()),
        Some(_) => Err(ConfigError::BackingKind(path.to_owned())),
    }
}

/// Checks that `path` can be an admin socket ([`crate::admin`]) without touching it
/// (`--check-config`).
pub fn check_admin_socket(path: &std::path::Path) -> Result<(), SocketError> {
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

#[cfg(test)]
mod tests {
    use rblk_fabric::Chain;

    use super::*;

    #[test]
    fn config_file() {
        let f: File = toml::from_str(
            "listen = \"10.0.0.1\"\nstate_dir = \"/s\"\n[[volume]]\nname = \"a\"\nsize = \"64M\"\n[[volume]]\nname = \"b\"\nsize = \"1G\"\npath = \"/x:y\"\n",
        )
        .unwrap();
        let v = f.volume_specs().unwrap();
        assert_eq!(v[0], VolumeSpec { name: "a".into(), size: 64 << 20, path: None });
        assert_eq!(v[1].path.as_deref(), Some(std::path::Path::new("/x:y")));
        assert_eq!(f.state_dir.as_deref(), Some(std::path::Path::new("/s")));
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        assert!(toml::from_str::<File>("lisen = \"x\"").is_err(), "unknown keys are refused");
        let bad: File = toml::from_str("[[volume]]\nname = \"a\"\nsize = \"12345\"").unwrap();
        assert!(bad.volume_specs().is_err());
    }

    /// The README's example parses (paths aside) and means what it says.
    #[test]
    fn the_readme_example() {
        let readme = include_str!("../../README.md");
        let start = readme.find("# /etc/rblk/target.toml").expect("the README's config example");
        let text = &readme[start..start + readme[start..].find("```").expect("its end")];
        let f: File = toml::from_str(text).expect("the README's example parses");
        assert_eq!(f.hosts.len(), 2);
        assert_eq!(f.acls()["db"]["backup"], crate::access::Grant::ReadOnly);
        assert!(!f.acls().contains_key("scratch"));
    }

    #[test]
    fn hosts_access_lists_and_limits() {
        let text = "max_sessions_per_host = 2\nopen_timeout = 3\n[[host]]\nname = \"db1\"\n[[volume]]\nname = \"a\"\nsize = \"4k\"\nallow = { db1 = \"exclusive\", \"*\" = \"ro\" }\n[[volume]]\nname = \"b\"\nsize = \"4k\"\n";
        let f: File = toml::from_str(text).unwrap();
        assert_eq!((f.max_sessions_per_host, f.open_timeout.clone()), (Some(2), Some(Timeout::Seconds(3))));
        assert_eq!(f.host_specs().unwrap(), vec![HostSpec { name: "db1".into(), key: None, ..HostSpec::default() }]);
        let acls = f.acls();
        assert_eq!(acls.len(), 1, "only volumes with a list");
        assert_eq!(acls["a"]["db1"], crate::access::Grant::Exclusive);
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        let bad = toml::from_str::<File>("[[volume]]\nname = \"a\"\nsize = \"4k\"\nallow = { db1 = \"write\" }");
        assert!(bad.unwrap_err().to_string().contains("use ro, rw or exclusive"));
        assert!(toml::from_str::<File>("max_sessions = 0").unwrap().check_limits().is_err());
        assert!(toml::from_str::<File>("keepalive_timeout = 4").unwrap().check_limits().is_err());
        assert!(toml::from_str::<File>("keepalive_timeout = 5").unwrap().check_limits().is_ok());
        let missing: File = toml::from_str("[[host]]\nname = \"h\"\nkey_file = \"/nonexistent/k\"").unwrap();
        assert!(matches!(missing.host_specs().unwrap_err(), ConfigError::KeyFile { path, .. } if path.ends_with("k")));
    }

    /// Would catch: the JOIN caps not read from the file (or not printed back), a per-session
    /// cap below what `rblk attach --queues` needs accepted, or the caps not counted in the
    /// connections and descriptors they allow.
    #[test]
    fn join_caps_and_descriptors() {
        let f: File = toml::from_str(
            "max_joins_per_session = 64
max_joins_per_host = 10
max_joins = 20
",
        )
        .unwrap();
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        let cfg = File { allow_any_host: Some(true), ..f }.server_config().unwrap();
        assert_eq!((cfg.max_joins_per_session, cfg.max_joins_per_host, cfg.max_joins), (64, 10, 20));
        let low = toml::from_str::<File>("max_joins_per_session = 63").unwrap().check_limits().unwrap_err();
        assert!(low.to_string().contains("at least 64"), "{low}");
        assert!(toml::from_str::<File>("max_joins = 0").unwrap().check_limits().is_err());
        let d = Config::default();
        assert_eq!(d.max_joins_per_session, 128);
        assert_eq!(d.max_connections(), 64 + 1024 + 4096);
        assert_eq!(d.descriptors_needed(), FDS_BASE + 2 + (64 + 1024 + 4096) * FDS_PER_CONNECTION);
    }

    /// Would catch: `listen_backlog` not read from the file (or not printed back, or not in
    /// `--print-config`'s defaults), a backlog of 0 or one past the bound accepted.
    #[test]
    fn listen_backlog_is_read_and_bounded() {
        let f: File = toml::from_str("listen_backlog = 4096\nallow_any_host = true").unwrap();
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        assert_eq!(f.server_config().unwrap().listen_backlog, 4096);
        assert_eq!(Config::default().listen_backlog, 1024);
        assert!(File::default().with_defaults().to_toml().contains("listen_backlog = 1024"));
        for bad in [0, MAX_LISTEN_BACKLOG + 1] {
            let err = toml::from_str::<File>(&format!("listen_backlog = {bad}")).unwrap().check_limits().unwrap_err();
            assert_eq!(err.to_string(), format!("listen_backlog = {bad}: it must be between 1 and 65536"));
        }
    }

    /// Would catch: integer sizes refused (only strings parsed), or printed back as strings.
    #[test]
    fn integer_and_text_sizes() {
        let f: File =
            toml::from_str("[[volume]]\nname = \"a\"\nsize = 1073741824\n[[volume]]\nname = \"b\"\nsize = \"1G\"\n")
                .unwrap();
        let v = f.volume_specs().unwrap();
        assert_eq!((v[0].size, v[1].size), (1 << 30, 1 << 30));
        assert!(f.to_toml().contains("size = 1073741824") && f.to_toml().contains("size = \"1G\""), "{}", f.to_toml());
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        let negative = toml::from_str::<File>("[[volume]]\nname = \"a\"\nsize = -4096").unwrap_err().to_string();
        assert!(negative.contains("negative"), "{negative}");
        let float = toml::from_str::<File>("[[volume]]\nname = \"a\"\nsize = 1.5").unwrap_err().to_string();
        assert!(float.contains("a size"), "{float}");
        let odd: File = toml::from_str("[[volume]]\nname = \"a\"\nsize = 12345").unwrap();
        assert!(Chain(&odd.volume_specs().unwrap_err()).to_string().contains("multiple of 4096"));
    }

    /// Would catch: a timeout with units refused in the file (or integers no longer taken),
    /// either printed back otherwise than given, or one out of range taken.
    #[test]
    fn timeouts_take_seconds_or_units() {
        let f: File = toml::from_str("open_timeout = 3\nkeepalive_timeout = \"1m30s\"\n").unwrap();
        assert_eq!(f.timeouts().unwrap(), (Some(Duration::from_secs(3)), Some(Duration::from_secs(90))));
        assert!(f.to_toml().contains("open_timeout = 3\n") && f.to_toml().contains("keepalive_timeout = \"1m30s\""));
        assert_eq!(toml::from_str::<File>(&f.to_toml()).unwrap(), f);
        let cfg = File { allow_any_host: Some(true), ..f }.server_config().unwrap();
        assert_eq!((cfg.auth_timeout, cfg.keepalive_timeout), (Duration::from_secs(3), Duration::from_secs(90)));
        let err = |text: &str| toml::from_str::<File>(text).unwrap().check_limits().unwrap_err().to_string();
        assert_eq!(
            err("keepalive_timeout = \"4s\""),
            "keepalive_timeout: 4 s is out of range: it must be between 5 s and 1 day"
        );
        assert_eq!(err("open_timeout = 0"), "open_timeout: 0 s is out of range: it must be between 1 s and 1 day");
        assert!(err("open_timeout = \"soon\"").starts_with("open_timeout: \"soon\" is not a duration"));
        assert!(err("keepalive_timeout = \"2d\"").contains("2 days is out of range"));
        let float = toml::from_str::<File>("open_timeout = 1.5").unwrap_err().to_string();
        assert!(float.contains("a duration"), "{float}");
        assert_eq!(Timeout::from(Duration::from_secs(30)), Timeout::Seconds(30));
        assert_eq!(Timeout::from(Duration::from_millis(1500)), Timeout::Text("1500ms".into()));
    }

    /// Would catch: a check that only a start (after the RDMA device probe) makes, so that
    /// --check-config and --print-config pass a configuration the daemon refuses.
    #[test]
    fn server_config_checks_everything_without_hardware() {
        let dir = std::env::temp_dir().join(format!("rblk-config-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let check = |text: &str| {
            let text = format!("allow_any_host = true\n{text}");
            toml::from_str::<File>(&text).unwrap().server_config().map(|_| ()).map_err(|e| Chain(&e).to_string())
        };
        let vol = |name: &str, extra: &str| format!("[[volume]]\nname = \"{name}\"\nsize = \"4k\"\n{extra}\n");
        assert_eq!(check(&(vol("a", "") + &vol("a", ""))), Err("volume a is configured twice".into()));
        let key = dir.join("no-such.key");
        let err = check(&format!("key_file = \"{}\"\n{}", key.display(), vol("a", ""))).unwrap_err();
        assert!(err.contains("no-such.key"), "the missing key file is named: {err}");
        let empty = dir.join("empty.key");
        std::fs::write(&empty, "\n").unwrap();
        std::fs::set_permissions(&empty, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let err = check(&format!("key_file = \"{}\"\n{}", empty.display(), vol("a", ""))).unwrap_err();
        assert!(err.contains("empty"), "{err}");
        let err = check(&format!("listen = \"10.0.0.1:abc\"\n{}", vol("a", ""))).unwrap_err();
        assert!(err.contains("10.0.0.1:abc"), "{err}");
        let err = check(&vol("a", "path = \"/nonexistent-rblk/dir/a.img\"")).unwrap_err();
        assert!(err.contains("/nonexistent-rblk/dir"), "a backing file in a missing directory: {err}");
        let err = check(&vol("a", &format!("path = \"{}\"", dir.display()))).unwrap_err();
        assert!(err.contains("neither a regular file nor a block device"), "{err}");
        let img = format!("path = \"{}\"", dir.join("a.img").display());
        assert_eq!(check(&vol("a", &img)), Ok(()), "a new file in an existing directory");
        let err = check(&(vol("a", &img) + &vol("b", &img))).unwrap_err();
        assert!(err.contains("volume a's too"), "two volumes on one backing store: {err}");
        let err = check(&format!("[[host]]\nname = \"a b\"\n{}", vol("a", ""))).unwrap_err();
        assert!(err.contains("host name"), "{err}");
        // Access lists name configured volumes (the file can only put them on volumes; a
        // Config built by hand can name any).
        let acls = [("gone".to_owned(), Acl::from([("h".to_owned(), crate::access::Grant::ReadOnly)]))].into();
        let cfg = Config { acls, ..Config::default() };
        assert!(rblk_fabric::Chain(&cfg.check().unwrap_err())
            .to_string()
            .contains("\"gone\", which is not configured"));
        assert!(Config { volumes: Vec::new(), ..Config::default() }.check().is_ok(), "an empty config starts empty");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Would catch: a daemon without any key configured serving anyone (instead of the key it
    /// makes in the state dir), a short or group-readable key accepted at start, a bad
    /// generated key replaced by a new one, or --allow-any-host not opening the target.
    #[test]
    fn keys_at_start() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("rblk-config-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let state = dir.join("state");
        let file = |extra: &str| {
            let text = format!("state_dir = {:?}\n{extra}\n[[volume]]\nname = \"a\"\nsize = \"4k\"\n", state);
            toml::from_str::<File>(&text).unwrap()
        };
        let generated = state.join(GENERATED_KEY);
        let closed = file("");
        assert_eq!(closed.key_source(), KeySource::Generated(generated.clone()));
        assert!(closed.server_config().is_err(), "no key made yet: refused, not open");
        assert!(closed.generate_key().unwrap(), "made at the first start (and its directory)");
        let key = closed.server_config().unwrap().key.expect("the generated key is required");
        assert_eq!(key.len(), 64);
        assert!(!closed.generate_key().unwrap(), "kept at the next start");
        assert_eq!(closed.server_config().unwrap().key, Some(key));
        std::fs::set_permissions(&generated, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = Chain(&closed.server_config().unwrap_err()).to_string();
        assert!(err.contains("target.key") && err.contains("chmod 600"), "{err}");
        assert!(!closed.generate_key().unwrap(), "an existing bad key is not replaced");
        assert_eq!(std::fs::metadata(&generated).unwrap().permissions().mode() & 0o777, 0o644);

        let open = file("allow_any_host = true");
        assert_eq!(open.key_source(), KeySource::AnyHost);
        assert!(!open.server_config().unwrap().check().unwrap().auth_required(), "serves anyone");

        let short = dir.join("short.key");
        std::fs::write(&short, "0123456789abcdef0123456789abcde\n").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o600)).unwrap();
        let keyed = file(&format!("key_file = {short:?}"));
        assert_eq!(keyed.key_source(), KeySource::Configured);
        let err = Chain(&keyed.server_config().unwrap_err()).to_string();
        assert!(err.contains("short.key") && err.contains("fewer than 32") && err.contains("gen-key"), "{err}");
        let host = file(&format!("[[host]]\nname = \"db1\"\nkey_file = {short:?}"));
        assert_eq!(host.key_source(), KeySource::Configured, "a host key is a configured key");
        assert!(Chain(&host.server_config().unwrap_err()).to_string().contains("fewer than 32"));

        // A state dir this user cannot write names --state-dir (root writes anywhere).
        if !nix::unistd::geteuid().is_root() {
            let locked = dir.join("locked");
            std::fs::create_dir_all(&locked).unwrap();
            std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o500)).unwrap();
            let f = toml::from_str::<File>(&format!("state_dir = {locked:?}")).unwrap();
            let err = Chain(&f.generate_key().unwrap_err()).to_string();
            assert!(err.contains("--state-dir") && err.contains("not writable"), "{err}");
            std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 64 << 10);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("4096KB").unwrap(), 4_096_000);
        let e = parse_size("1X").unwrap_err();
        assert!(matches!(&e, ConfigError::Size(_)) && e.to_string().starts_with("\"1X\" is not a size"), "{e}");
        let e = parse_size("1MB").unwrap_err().to_string();
        assert!(e.contains("not a multiple of the block size 4096: use 1MiB (binary)"), "{e}");
        assert!(parse_size("6k").unwrap_err().to_string().contains("6144 bytes, not a multiple"));
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999T").is_err());
    }

    #[test]
    fn volumes_and_addresses() {
        assert_eq!("v:64M".parse::<VolumeSpec>().unwrap(), VolumeSpec { name: "v".into(), size: 64 << 20, path: None });
        let d: VolumeSpec = "d:1G:/srv/a:b.img".parse().unwrap();
        assert_eq!(d.path.as_deref(), Some(std::path::Path::new("/srv/a:b.img")));
        assert!("d:1G:".parse::<VolumeSpec>().is_err());
        assert!("v".parse::<VolumeSpec>().is_err());
        let e = "v:100".parse::<VolumeSpec>().unwrap_err();
        assert_eq!(
            Chain(&e).to_string(),
            "\"v:100\": 100 is not a multiple of the block size 4096: use a multiple of 4096"
        );
        let e = "v:0".parse::<VolumeSpec>().unwrap_err();
        assert_eq!(Chain(&e).to_string(), "\"v:0\": the size (0) must be a non-zero multiple of 4096");
        assert!("a b:1G".parse::<VolumeSpec>().is_err());
        assert_eq!(parse_listen("10.0.0.1").unwrap().port(), rblk_proto::DEFAULT_PORT);
        assert_eq!(parse_listen("10.0.0.1:9").unwrap().port(), 9);
        assert_eq!(parse_listen("[::1]:9").unwrap().port(), 9);
        assert!(parse_listen("[::1]").unwrap().is_ipv6());
        assert!(parse_listen("nope").is_err());
    }

    /// Would catch an identity that changes between starts (every pin would then cry wolf), one
    /// made again over an existing file, or one adopted from a file another user planted.
    #[test]
    fn the_target_identity_is_made_once_and_only_trusted_files_are_read() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("rblk-config-id-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let f = toml::from_str::<File>(&format!("state_dir = {:?}", dir.join("state"))).unwrap();
        assert_eq!(f.target_id().unwrap(), None, "none before the first start");
        assert!(f.generate_target_id().unwrap());
        let id = f.target_id().unwrap().expect("made");
        assert!(!f.generate_target_id().unwrap(), "kept");
        assert_eq!(f.target_id().unwrap(), Some(id));
        let path = dir.join("state").join(TARGET_ID);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(f.target_id().is_err(), "a file others may write is not this target's identity");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&path, "nothex\n").unwrap();
        assert!(Chain(&f.target_id().unwrap_err()).to_string().contains("32 hexadecimal digits"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
