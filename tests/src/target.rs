//! A target under test: the real daemon process over rxe, or the same server in-process over the
//! in-memory fabric, behind one interface so each scenario runs on both.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::DirBuilderExt as _;
use std::sync::atomic::{AtomicU16, Ordering};

use rblk_fabric::Fabric;
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Running, Server};

use crate::daemon::Daemon;
use crate::rxe;

/// What to serve.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// `(name, size)` of each RAM volume.
    pub volumes: Vec<(&'static str, u64)>,
    /// Pre-shared key.
    pub key: Option<Vec<u8>>,
}

/// A running target.
#[derive(Debug)]
pub enum Target {
    /// `rblk-target` as a child process, over verbs.
    Process(Daemon),
    /// The server in this process, over the in-memory fabric.
    InProcess(Running),
}

impl Target {
    /// Starts a target on `fabric`: over verbs, the daemon binary on the rxe device; in memory,
    /// the server in-process on a fresh address.
    pub fn start(fabric: Fabric, spec: &Spec) -> Target {
        match fabric {
            Fabric::Verbs => {
                let rdma = rxe::rdma();
                let mut args: Vec<String> = Vec::new();
                for (name, size) in &spec.volumes {
                    args.push("--volume".into());
                    args.push(format!("{name}:{size}"));
                }
                if let Some(key) = &spec.key {
                    let path = std::env::temp_dir().join(format!("rblk-key-{}-{}", std::process::id(), next_port()));
                    write_key_file(&path, key);
                    args.push("--key-file".into());
                    args.push(path.display().to_string());
                }
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Target::Process(Daemon::start(&rdma, &args))
            }
            Fabric::Mem => {
                let cfg = Config {
                    listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), next_port()),
                    volumes: spec
                        .volumes
                        .iter()
                        .map(|(n, s)| VolumeSpec { name: (*n).into(), size: *s, path: None })
                        .collect(),
                    key: spec.key.as_deref().map(|k| k.trim_ascii_end().to_vec()),
                    fabric: Fabric::Mem,
                    ..Config::default()
                };
                Target::InProcess(Server::start(cfg).expect("start in-process target"))
            }
        }
    }

    /// Starts a target on `fabric` from a config file's text (hosts, access lists, limits,
    /// volumes): over verbs the daemon with `--config`, in memory the server built from the
    /// same file by the same code ([`rblk_target::config::File::server_config`]).
    pub fn start_with_config(fabric: Fabric, toml: &str) -> Target {
        match fabric {
            Fabric::Verbs => {
                let rdma = rxe::rdma();
                let path =
                    std::env::temp_dir().join(format!("rblk-config-{}-{}.toml", std::process::id(), next_port()));
                std::fs::write(&path, toml).expect("write config file");
                let path = path.display().to_string();
                // A state dir of the test process's own: the daemon refuses one others may write (/tmp).
                let state = std::env::temp_dir().join(format!("rblk-state-{}", std::process::id()));
                std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&state).expect("state dir");
                let state = state.display().to_string();
                Target::Process(Daemon::start(&rdma, &["--config", &path, "--state-dir", &state]))
            }
            Fabric::Mem => {
                let mut file: rblk_target::config::File = toml::from_str(toml).expect("test config parses");
                // As the daemon under Daemon::start: keys only where the test configures them.
                file.allow_any_host.get_or_insert(true);
                let cfg = file.server_config().expect("test config is valid");
                let cfg = Config {
                    listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), next_port()),
                    fabric: Fabric::Mem,
                    state_dir: None,
                    ..cfg
                };
                Target::InProcess(Server::start(cfg).expect("start in-process target"))
            }
        }
    }

    /// Applies a config file's text again, as a SIGHUP does: over verbs the daemon's `--config`
    /// file rewritten and SIGHUP sent (see [`Daemon::reload`]), in memory the same file built
    /// as [`Target::start_with_config`] builds it and [`Running::reload`]. Ok: what the reload
    /// did (the report as the daemon logs it); Err: why it was refused, nothing changed.
    pub fn reload(&self, toml: &str) -> Result<String, String> {
        match self {
            Target::Process(d) => d.reload(toml),
            Target::InProcess(r) => {
                let mut file: rblk_target::config::File = toml::from_str(toml).expect("test config parses");
                file.allow_any_host.get_or_insert(true);
                let cfg = file.server_config().expect("test config is valid");
                let cfg = Config { listen: r.local_addr(), fabric: Fabric::Mem, state_dir: None, ..cfg };
                r.reload(cfg).map(|report| report.to_string()).map_err(|e| rblk_fabric::Chain(&e).to_string())
            }
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        match self {
            Target::Process(d) => d.addr,
            Target::InProcess(r) => r.local_addr(),
        }
    }

    /// The fabric it serves on.
    pub fn fabric(&self) -> Fabric {
        match self {
            Target::Process(_) => Fabric::Verbs,
            Target::InProcess(_) => Fabric::Mem,
        }
    }

    /// Protection domains a daemon process holds (`rdma res show pd`), where the OS tracks them.
    pub fn pd_count(&self) -> Option<usize> {
        match self {
            Target::Process(d) => Some(d.pd_count()),
            Target::InProcess(_) => None,
        }
    }

    /// Pages the daemon has pinned (kB), where the OS tracks them (a real daemon process).
    pub fn vm_pin_kb(&self) -> Option<u64> {
        match self {
            Target::Process(d) => Some(d.vm_pin_kb()),
            Target::InProcess(_) => None,
        }
    }
}

/// Writes a key file as the daemon accepts it: mode 0600.
pub fn write_key_file(path: &std::path::Path, key: &[u8]) {
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("key file");
    std::io::Write::write_all(&mut f, key).expect("write key file");
}

fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(30000);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
