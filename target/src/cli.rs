//! `rblk-target`'s command line, in the library so that `rblk-dist` can generate its man page
//! and completions from the same definition as `--help`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::access::{BadGrant, Grant};
use rblk_fabric::Chain;

use crate::config::{
    parse_listen, ConfigError, File, FileVolume, VolumeSpec, DEFAULT_STATE_DIR, MAX_LISTEN_BACKLOG, MAX_TIMEOUT,
    MIN_KEEPALIVE_TIMEOUT, MIN_LISTEN_BACKLOG, MIN_OPEN_TIMEOUT,
};

/// Serve block volumes held in registered memory over RDMA (InfiniBand, RoCEv2, rxe).
///
/// Initiators connect with rdma_cm, authenticate, open a volume and then read and write it with
/// one-sided RDMA READ and WRITE: the daemon's CPU never touches the data path. Stop it with
/// SIGINT or SIGTERM: it disconnects its peers, deregisters its memory, flushes durable volumes
/// and exits 0. SIGHUP reloads the configuration (the --config file again, with the same
/// flags on top): volumes added and removed (a removed volume that is still open stays until
/// a later reload finds it idle), hosts, keys, access lists and limits; a configuration that
/// does not check changes nothing. Under systemd (Type=notify) it reports readiness once it
/// accepts connections, and its progress while it loads volumes.
///
/// Live volumes: `rblk-target admin add|remove|list` talks to the running daemon over its
/// admin socket (--admin-socket, root only). Those changes are saved in STATE_DIR/admin.toml,
/// which every start, SIGHUP and successor reads with the config file. A SIGHUP that would
/// remove a RAM volume holding data is refused unless the config file's confirm_remove lists it.
///
/// See rblk-target.toml(5) for the config file's keys, keys and host identities, limits and
/// the systemd units (docs/configuration.md in rblk's source).
#[derive(Debug, Parser)]
#[command(version, args_conflicts_with_subcommands = true)]
pub struct Args {
    /// Talk to a running daemon instead of being one.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Where to listen (default: every address, port 7420).
    ///
    /// Address to listen on, ADDR[:PORT] (IPv6 in brackets). Default: every address, port 7420.
    #[arg(long, value_parser = |s: &str| parse_listen(s).map_err(|e| Chain(&e).to_string()), value_name = "ADDR[:PORT]")]
    pub listen: Option<SocketAddr>,
    /// Serve Prometheus metrics at http://ADDR:PORT/metrics.
    ///
    /// Serve Prometheus metrics (rblk_target_*) over HTTP at http://ADDR:PORT/metrics. Bind
    /// it to a management address: the endpoint has no authentication. Default: none.
    #[arg(long, value_name = "ADDR:PORT", value_parser = |s: &str| s.parse::<SocketAddr>().map_err(|e| format!("{s:?}: {e} (e.g. 127.0.0.1:9442)")))]
    pub metrics: Option<SocketAddr>,
    /// The socket `rblk-target admin` talks to, or none.
    ///
    /// The admin socket (a unix socket, mode 0600: root only) through which `rblk-target admin`
    /// adds, removes and lists volumes at run time; "none" serves none. Refused if another
    /// daemon serves the path; a stale socket is replaced. Default: /run/rblk-target/admin.sock.
    #[arg(long, value_name = "PATH|none")]
    pub admin_socket: Option<PathBuf>,
    /// Accept connections on this RDMA device only.
    ///
    /// Only accept connections arriving on this RDMA device (e.g. mlx5_0, rxe0).
    #[arg(long, value_name = "NAME")]
    pub device: Option<String>,
    /// A volume: RAM, or durable with a PATH; repeatable.
    ///
    /// A volume NAME:SIZE[:PATH] (size like 64M, 1.5G or 64GiB, powers of 1024; 4096KB,
    /// powers of 1000: whole 4096-byte blocks either way). Repeatable.
    /// Without PATH a RAM volume (volatile). With PATH (everything after the second colon) a
    /// durable volume backed by that file (created and sized if missing) or block device: loaded
    /// at start, written back on FLUSH, flushed on shutdown. Default, without --config: one
    /// 1 GiB RAM volume vol0 (a config file without volumes starts with none).
    #[arg(long = "volume", value_name = "NAME:SIZE[:PATH]", value_parser = volume_arg)]
    pub volumes: Vec<VolumeSpec>,
    /// The shared key initiators must prove.
    ///
    /// Shared key file: initiators must prove they hold the same key (HMAC-SHA256 over a nonce
    /// and their host name) before they may open anything. At least 32 bytes on one line, mode
    /// 0600, owned by root or this user (make one with `rblk-target gen-key FILE`). Hosts with
    /// their own keys are set in the config file. Without any key configured the daemon uses STATE_DIR/target.key, made at
    /// its first start; `rblk` on the same host finds it there.
    #[arg(long, env = "RBLK_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// Serve every initiator when no key is configured.
    ///
    /// Serve without authentication when no key is configured: every initiator that reaches
    /// the port may open every volume without an access list (the protocol's keyless sequence,
    /// HELLO then OPEN). Warned about at every start.
    #[arg(long)]
    pub allow_any_host: bool,
    /// Keys and identities (default: /var/lib/rblk).
    ///
    /// Directory where durable volumes keep their instance identity across a clean shutdown
    /// (one small file per volume, removed at start: after a crash, or when the backing store
    /// was replaced or resized, the identity is new, and reconnecting initiators report their
    /// unflushed writes as lost). Default: /var/lib/rblk.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Cut a connection that opens nothing this long.
    ///
    /// A connection that has not opened (or joined) a session this long after its connect
    /// request is cut (unauthenticated and half-open ones too): 1s to 1d, a bare number is
    /// seconds [default: 10s].
    #[arg(long, value_name = "DURATION", value_parser = |t: &str| rblk_proto::parse_duration_bounded(t, MIN_OPEN_TIMEOUT, Some(MAX_TIMEOUT)))]
    pub open_timeout: Option<Duration>,
    /// End a connection silent this long.
    ///
    /// End a connection when an initiator that promised keepalives sent nothing for this long,
    /// or when one of the target's keepalives stayed uncompleted that long; a session goes with
    /// its last connection: 5s to 1d, a bare number is seconds [default: 15s].
    #[arg(long, value_name = "DURATION", value_parser = |t: &str| rblk_proto::parse_duration_bounded(t, MIN_KEEPALIVE_TIMEOUT, Some(MAX_TIMEOUT)))]
    pub keepalive_timeout: Option<Duration>,
    /// Connections not yet authenticated, at most (64).
    ///
    /// Connections that have not authenticated yet (without keys: not opened a session), at
    /// most: past it a new one evicts the oldest of the address holding the most; from half of
    /// it, one from an address already waiting is dropped with a rising probability (sshd's
    /// MaxStartups). Default: 64.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_unopened: Option<u64>,
    /// The same, per peer address (16).
    ///
    /// The same, per peer address. Default: 16.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_unopened_per_addr: Option<u64>,
    /// Worker threads (default: the CPUs, at most 4).
    ///
    /// Worker threads serving the connections, each many of them; worker i is pinned to the
    /// i-th CPU the daemon may run on. Default: the CPUs the daemon may run on, at most 4.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub workers: Option<u64>,
    /// Open sessions at most (1024).
    ///
    /// Open sessions at most; past it OPEN is refused (out of resources). Default: 1024.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_sessions: Option<u64>,
    /// Open sessions per host at most (64).
    ///
    /// Open sessions at most per host (per address for initiators that send no host identity).
    /// At the cap, the host's sessions silent for 2 s are probed first, and those whose
    /// initiator vanished make room. Default: 64.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_sessions_per_host: Option<u64>,
    /// Further queue pairs per session at most (128).
    ///
    /// JOINed connections (every queue pair of a session after its first) at most per
    /// session; past it JOIN is refused (out of resources). At least 64 (`rblk attach --queues`
    /// takes up to 64). Default: 128.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 64, None))]
    pub max_joins_per_session: Option<u64>,
    /// Further queue pairs per host at most (1024).
    ///
    /// JOINed connections at most of one host's sessions. Default: 1024.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_joins_per_host: Option<u64>,
    /// Further queue pairs in all at most (4096).
    ///
    /// JOINed connections at most, in all. Default: 4096.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, 1, None))]
    pub max_joins: Option<u64>,
    /// A memory window per QP, or a registration per session.
    ///
    /// Memory windows (on, the default): where the RDMA device has type 2B windows and the
    /// initiator asks for them, each volume is registered once (at its first such OPEN on the
    /// device) and every QP of a session gets a window of its own over it, an rkey that works on
    /// that QP only and dies at CLOSE. Off: every session registers its volume in a protection
    /// domain of its own, as for devices and initiators without windows (pins the volume once
    /// per session). Applies at start only.
    #[arg(long, value_name = "on|off", value_parser = on_off)]
    pub memory_windows: Option<bool>,
    /// Connect requests that may wait (1024).
    ///
    /// Connect requests that may wait for the daemon to take them (rdma_listen's backlog),
    /// 1 to 65536: past it the kernel rejects new ones, and their initiators retry later. The
    /// kernel caps it at net.rdma_ucm.max_backlog (1024 unless raised with sysctl;
    /// --check-config warns when it is lower). Applies at start only. Default: 1024.
    #[arg(long, value_name = "N", value_parser = |t: &str| rblk_proto::parse_bounded(t, MIN_LISTEN_BACKLOG.into(), Some(MAX_LISTEN_BACKLOG.into())))]
    pub listen_backlog: Option<u64>,
    /// The TOML config file (see rblk-target.toml(5)).
    ///
    /// A TOML config file: keys listen, metrics, admin_socket, device, key_file, allow_any_host, require_mutual_auth, state_dir, the limits above
    /// (open_timeout, keepalive_timeout, max_unopened, ...), memory_windows, listen_backlog, confirm_widen, [[host]] tables (name, key_file, require_mutual_auth)
    /// and [[volume]] tables (name, size, optional path and allow = { HOST = "ro"|"rw"|
    /// "exclusive", "*" = ... }). Hosts and access lists are set only here. Flags override it;
    /// --volume flags replace its volumes. Relative paths in the file are relative to the file's
    /// directory (--print-config shows them absolute); paths given as flags stay relative to the
    /// working directory. Every key: rblk-target.toml(5).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Print the effective configuration and exit.
    ///
    /// Print the effective configuration (file plus flags) as TOML and exit; exits non-zero,
    /// printing nothing, if it does not pass the checks of --check-config.
    #[arg(long)]
    pub print_config: bool,
    /// Check the configuration without RDMA hardware, and exit.
    ///
    /// Check the effective configuration (file plus flags) without RDMA hardware and exit:
    /// addresses, sizes, duplicate volumes, key files (readable, non-empty), backing paths
    /// (the file or device exists, or its directory does), host names and access lists. With a
    /// daemon serving the admin socket, also prints the access changes a reload would make there,
    /// and fails where that reload would be refused (it widens access, and the file does not say
    /// confirm_widen = true). Warns, without failing, when the caps need more file
    /// descriptors, tasks or pinned memory than this process's hard limits allow (the daemon
    /// raises its soft limits to the hard ones at start). Prints "configuration OK" and exits 0,
    /// or prints the reason and exits non-zero.
    #[arg(long, conflicts_with = "print_config")]
    pub check_config: bool,
    /// Take the volumes over from the running daemon (an upgrade).
    ///
    /// Take the volumes over from the daemon serving the admin socket (--admin-socket, or the
    /// config's), instead of creating and loading them: an upgrade that loses nothing and
    /// copies no volume data. The running daemon stops listening and hands over its volumes'
    /// memory and backing stores; this one maps the same pages, serves the same volume
    /// instances, and the old one disconnects its sessions and exits 0 (initiators reconnect
    /// and replay). A configuration that changes a served volume's size or backing path, or
    /// the block size, or drops a served volume (unless confirm_remove lists it), is refused
    /// and the old daemon serves on, as it does if this one fails before it is ready. Under
    /// systemd use `rblk-target admin handover` instead.
    #[arg(long, conflicts_with_all = ["print_config", "check_config"])]
    pub takeover: bool,
}

/// `rblk-target` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Add, remove and list volumes of the running daemon, through its admin socket.
    ///
    /// Changes apply at once, by the same rules as a SIGHUP reload (a volume with open
    /// sessions is not removed), and are saved in STATE_DIR/admin.toml, which starts, reloads
    /// and handovers read with the config file. Exits non-zero with the daemon's reason when it
    /// refuses.
    Admin(Admin),
    /// Write a new key to FILE (mode 0600) for initiators to prove.
    ///
    /// 64 hex digits (256 random bits) and a newline, mode 0600. Refuses to overwrite an existing file. Copy it (keeping mode 0600) to the initiators
    /// that may connect and name it with their --key-file.
    GenKey {
        /// Where to write it.
        file: PathBuf,
    },
}

/// `rblk-target admin`.
#[derive(Debug, clap::Args)]
pub struct Admin {
    /// The daemon's admin socket.
    ///
    /// Default: /run/rblk-target/admin.sock, or RBLK_ADMIN_SOCKET.
    #[arg(long, global = true, value_name = "PATH", env = "RBLK_ADMIN_SOCKET", default_value = crate::admin_protocol::DEFAULT_SOCKET, hide_default_value = true, hide_env = true)]
    pub socket: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub op: AdminOp,
}

/// `rblk-target admin` operations.
#[derive(Debug, clap::Subcommand)]
pub enum AdminOp {
    /// Serve a new volume, in RAM or backed by PATH.
    ///
    /// A RAM volume, or a durable one backed by PATH (loaded before initiators can open it). A
    /// relative PATH is this directory's: it is sent to the daemon absolute.
    Add {
        /// NAME:SIZE[:PATH], as --volume.
        #[arg(value_name = "NAME:SIZE[:PATH]", value_parser = volume_arg)]
        volume: VolumeSpec,
        /// Who may open it (HOST * for any host); repeatable.
        ///
        /// HOST=ro|rw|exclusive (HOST * for any host); repeatable. Without
        /// any: every host that got in, as a [[volume]] without allow: every host that proved
        /// a key (every host only under --allow-any-host).
        #[arg(long = "allow", value_name = "HOST=MODE", value_parser = parse_allow)]
        allow: Vec<(String, Grant)>,
    },
    /// Stop serving a volume; refused while sessions have it open.
    ///
    /// A durable volume is flushed first.
    Remove {
        /// Its name.
        name: String,
    },
    /// Grow a volume added with `add` while it is served.
    ///
    /// Initiators that know of grows learn the new size at once; older ones keep the size they
    /// opened until they open the volume again.
    /// Nothing in the volume moves or is copied: the added range is new memory. A volume grows
    /// at most 7 times while served (8 memory segments). A smaller SIZE makes the volume again
    /// at that size, refused while sessions have it open (and for a RAM volume holding data:
    /// remove it and add it again). STATE_DIR/admin.toml is rewritten before the answer; for a
    /// volume of the config file, change the file and reload instead.
    Resize {
        /// Its name.
        name: String,
        /// The new size: bytes, or with a suffix (K, M, G, T: powers of 1024).
        #[arg(value_parser = size_arg)]
        size: u64,
    },
    /// Hand every volume to a successor started by systemd (an upgrade).
    ///
    /// Hands every volume to a successor through systemd's file descriptor store and exits with
    /// status 75, which the unit lists in RestartForceExitStatus=: systemd starts the new
    /// binary, which takes the volumes (the same memory, backing stores and instances) instead
    /// of loading them; initiators reconnect and replay. Nothing is written back or read. For
    /// a daemon run by systemd (rblk-target.service); elsewhere start the successor with
    /// `rblk-target --takeover`. Run it with the new binary: first it runs the successor's
    /// checks (the daemon's arguments, --check-config, every served volume kept with its size
    /// and path), and on a refusal the daemon serves on.
    Handover,
    /// The volumes served: size, open sessions, state.
    List {
        /// Output format: normal or json.
        ///
        /// normal: a table; json: the daemon's list as it sent it, for scripts (as rblk's and
        /// nvme-cli's -o).
        #[arg(short = 'o', long, value_name = "FORMAT", value_enum, default_value_t = Format::Normal, hide_possible_values = true)]
        output_format: Format,
        /// The same as -o json.
        #[arg(long, conflicts_with = "output_format")]
        json: bool,
    },
}

/// `-o`: how `admin list` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table.
    Normal,
    /// JSON.
    Json,
}

/// `on` or `off` (also true/false, yes/no, 1/0), for switches that take a value.
fn on_off(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" => Ok(true),
        "off" | "false" | "no" | "0" => Ok(false),
        _ => Err(format!("{text:?}: use on or off")),
    }
}

impl Args {
    /// The effective configuration: the file, then the flags on top (at start and at each
    /// reload). The default volume vol0 only when there is neither a config file nor a
    /// `--volume`: a config file without volumes starts empty.
    pub fn effective(&self) -> Result<File, ConfigError> {
        let mut file = match &self.config {
            Some(path) => File::read(path)?,
            None => File::default(),
        };
        if let Some(listen) = self.listen {
            file.listen = Some(listen.to_string());
        }
        if let Some(metrics) = self.metrics {
            file.metrics = Some(metrics.to_string());
        }
        if self.admin_socket.is_some() {
            file.admin_socket.clone_from(&self.admin_socket);
            file.not_from_file.push("admin_socket");
        }
        if file.admin_socket.is_none() {
            file.admin_socket = Some(crate::admin_protocol::DEFAULT_SOCKET.into());
            file.not_from_file.push("admin_socket");
        }
        if self.device.is_some() {
            file.device.clone_from(&self.device);
        }
        if self.key_file.is_some() {
            file.key_file.clone_from(&self.key_file);
            file.not_from_file.push("key_file");
        }
        if self.allow_any_host {
            file.allow_any_host = Some(true);
        }
        if self.state_dir.is_some() {
            file.state_dir.clone_from(&self.state_dir);
            file.not_from_file.push("state_dir");
        }
        let limits = [
            (&mut file.max_unopened, self.max_unopened),
            (&mut file.max_unopened_per_addr, self.max_unopened_per_addr),
            (&mut file.max_sessions, self.max_sessions),
            (&mut file.max_sessions_per_host, self.max_sessions_per_host),
            (&mut file.max_joins_per_session, self.max_joins_per_session),
            (&mut file.max_joins_per_host, self.max_joins_per_host),
            (&mut file.max_joins, self.max_joins),
            (&mut file.workers, self.workers),
        ];
        for (field, flag) in limits {
            if let Some(n) = flag {
                *field = Some(usize::try_from(n).unwrap_or(usize::MAX));
            }
        }
        if let Some(d) = self.open_timeout {
            file.open_timeout = Some(d.into());
        }
        if let Some(d) = self.keepalive_timeout {
            file.keepalive_timeout = Some(d.into());
        }
        if self.memory_windows.is_some() {
            file.memory_windows = self.memory_windows;
        }
        if let Some(n) = self.listen_backlog {
            file.listen_backlog = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if file.state_dir.is_none() {
            file.state_dir = Some(DEFAULT_STATE_DIR.into());
            file.not_from_file.push("state_dir");
        }
        if !self.volumes.is_empty() {
            file.volumes = self
                .volumes
                .iter()
                .map(|v| FileVolume {
                    name: v.name.clone(),
                    size: v.size.into(),
                    path: v.path.clone(),
                    ..FileVolume::default()
                })
                .collect();
        } else if self.config.is_none() {
            file.volumes = vec![FileVolume { name: "vol0".into(), size: "1G".into(), ..FileVolume::default() }];
        }
        // What `rblk-target admin add|remove` saved.
        if let Some(dir) = file.state_dir.clone() {
            crate::saved::Saved::load(&dir)?.apply_to(&mut file, &dir)?;
        }
        Ok(file)
    }
}

/// A size, as the config file writes them.
fn size_arg(s: &str) -> Result<u64, String> {
    crate::config::parse_size(s).map_err(|e| Chain(&e).to_string())
}

/// `--volume`, with the whole error chain in clap's message.
fn volume_arg(s: &str) -> Result<VolumeSpec, String> {
    s.parse::<VolumeSpec>().map_err(|e| Chain(&e).to_string())
}

fn parse_allow(s: &str) -> Result<(String, Grant), String> {
    let (host, mode) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected HOST=ro|rw|exclusive"))?;
    Ok((host.to_owned(), mode.parse().map_err(|e: BadGrant| e.to_string())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effective(args: &[&str]) -> File {
        Args::try_parse_from([&["rblk-target"], args].concat()).unwrap().effective().unwrap()
    }

    /// Would catch `--listen-backlog` not overriding the file's, or out-of-range values taken.
    #[test]
    fn listen_backlog_flag() {
        assert_eq!(effective(&["--listen-backlog", "8"]).listen_backlog, Some(8));
        assert_eq!(effective(&[]).listen_backlog, None, "the default comes from Config");
        for bad in ["0", "65537", "many"] {
            assert!(Args::try_parse_from(["rblk-target", "--listen-backlog", bad]).is_err(), "{bad}");
        }
    }

    /// Would catch: the default vol0 served next to a config file's volumes, or instead of an
    /// empty config's none (so that a daemon meant to get its volumes through `admin add`
    /// serves a 1 GiB volume nobody asked for).
    #[test]
    fn vol0_only_without_config_and_volume_flags() {
        let names = |f: &File| f.volumes.iter().map(|v| v.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&effective(&[])), ["vol0"], "no config, no --volume");
        assert_eq!(names(&effective(&["--volume", "a:4k"])), ["a"]);
        let dir = std::env::temp_dir().join(format!("rblk-cli-effective-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.toml");
        std::fs::write(&empty, "").unwrap();
        let empty = empty.to_str().unwrap();
        assert!(effective(&["--config", empty]).volumes.is_empty(), "an empty config starts empty");
        let cfg = effective(&["--config", empty, "--allow-any-host", "--state-dir", "/nonexistent"]);
        let server = cfg.server_config().expect("an empty config is a valid one");
        assert!(server.volumes.is_empty());
        let hosts = dir.join("hosts.toml");
        std::fs::write(&hosts, "[[host]]\nname = \"db1\"\n").unwrap();
        assert!(effective(&["--config", hosts.to_str().unwrap()]).volumes.is_empty(), "hosts but no volumes");
        assert_eq!(names(&effective(&["--config", empty, "--volume", "b:4k"])), ["b"]);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
