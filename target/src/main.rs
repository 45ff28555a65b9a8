//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rblk_target::config::{parse_listen, File as ConfigFile, FileVolume, VolumeSpec, DEFAULT_STATE_DIR};
use rblk_target::notify;
use rblk_target::server::{Running, Server, StartError};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

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
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Address to listen on, ADDR[:PORT] (IPv6 in brackets). Default: every address, port 7420.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR[:PORT]")]
    listen: Option<SocketAddr>,
    /// Only accept connections arriving on this RDMA device (e.g. mlx5_0, rxe0).
    #[arg(long, value_name = "NAME")]
    device: Option<String>,
    /// A volume NAME:SIZE[:PATH] (size like 64M or 1G, a multiple of 4096). Repeatable.
    /// Without PATH a RAM volume (volatile). With PATH (everything after the second colon) a
    /// durable volume backed by that file (created and sized if missing) or block device: loaded
    /// at start, written back on FLUSH, flushed on shutdown. Default: one 1 GiB RAM volume vol0.
    #[arg(long = "volume", value_name = "NAME:SIZE[:PATH]")]
    volumes: Vec<VolumeSpec>,
    /// Shared key file: initiators must prove they hold the same key (HMAC-SHA256 over a nonce
    /// and their host name) before they may open anything. Hosts with their own keys are set in
    /// the config file. Without any key the daemon serves anyone.
    #[arg(long, env = "RBLK_KEY_FILE", value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// Directory where durable volumes keep their instance identity across a clean shutdown
    /// (one small file per volume, removed at start: after a crash, or when the backing store
    /// was replaced or resized, the identity is new, and reconnecting initiators report their
    /// unflushed writes as lost). Default: /var/lib/rblk.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A connection that has not opened (or joined) a session this many seconds after its
    /// connect request is cut (unauthenticated and half-open ones too). Default: 10.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    open_timeout: Option<u64>,
    /// End a connection when an initiator that promised keepalives sent nothing for this many
    /// seconds, or when one of the target's keepalives stayed uncompleted that long; a session
    /// goes with its last connection. Default: 15.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(5..))]
    keepalive_timeout: Option<u64>,
    /// Connections that have not opened a session yet, at most (past it, a new one evicts the
    /// oldest, as sshd's MaxStartups). Default: 64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_unopened: Option<u64>,
    /// The same, per peer address. Default: 16.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_unopened_per_addr: Option<u64>,
    /// Open sessions at most; past it OPEN is refused (out of resources). Default: 1024.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions: Option<u64>,
    /// Open sessions at most per host (per address for initiators that send no host identity).
    /// Default: 64.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    max_sessions_per_host: Option<u64>,
    /// A TOML config file: keys listen, device, key_file, state_dir, the limits above
    /// (open_timeout, keepalive_timeout, max_unopened, ...), [[host]] tables (name, key_file)
    /// and [[volume]] tables (name, size, optional path and allow = { HOST = "ro"|"rw"|
    /// "exclusive", "*" = ... }). Hosts and access lists are set only here. Flags override it;
    /// --volume flags replace its volumes.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration (file plus flags) as TOML and exit; exits non-zero,
    /// printing nothing, if it does not pass the checks of --check-config.
    #[arg(long)]
    print_config: bool,
    /// Check the effective configuration (file plus flags) without RDMA hardware and exit:
    /// addresses, sizes, duplicate volumes, key files (readable, non-empty), backing paths
    /// (the file or device exists, or its directory does), host names and access lists.
    /// Prints "configuration OK" and exits 0, or prints the reason and exits non-zero.
    #[arg(long, conflicts_with = "print_config")]
    check_config: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblk-target: {e:#}");
            if e.downcast_ref::<StartError>().is_some_and(|e| matches!(e, StartError::NoDevice(_))) {
                eprintln!("rblk-target: {}", rblk_fabric::why_no_device());
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let file = effective(&args)?;
    if args.print_config || args.check_config {
        // Checked like a start would, so that a bad file does not print and exit 0.
        file.server_config().map_err(anyhow::Error::msg)?;
        if args.check_config {
            println!("configuration OK");
        } else {
            print!("{}", file.to_toml());
        }
        return Ok(());
    }
    let cfg = file.server_config().map_err(anyhow::Error::msg)?;
    // Before the start: a signal during a long volume load waits instead of killing us, and
    // SIGHUP no longer ends the daemon.
    let mut signals =
        signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]).context("installing signal handlers")?;
    let running = Server::start_with(cfg, &mut notify::progress)?;
    eprintln!("rblk-target: listening on {}", running.local_addr());
    notify::ready(&notify::serving(running.volumes().len(), running.local_addr()));
    // Sleeps until a signal arrives: an idle daemon uses no CPU.
    for signal in signals.forever() {
        if signal == SIGHUP {
            reload(&args, &running);
            continue;
        }
        tracing::info!(signal, "signal received: shutting down");
        break;
    }
    notify::stopping(running.durable_bytes());
    running.shutdown();
    Ok(())
}

/// SIGHUP: the configuration again, from the file and the same flags, applied to `running`.
fn reload(args: &Args, running: &Running) {
    tracing::info!("SIGHUP: reloading the configuration");
    notify::reloading();
    let result = effective(args)
        .and_then(|file| file.server_config().map_err(anyhow::Error::msg))
        .and_then(|cfg| running.reload_with(cfg, &mut notify::progress).map_err(anyhow::Error::from));
    let mut status = notify::serving(running.volumes().len(), running.local_addr());
    match result {
        Ok(report) => {
            eprintln!("rblk-target: configuration reloaded: {report}");
            if !report.busy.is_empty() {
                let busy: Vec<&str> = report.busy.iter().map(|(name, _)| name.as_str()).collect();
                status.push_str(&format!(" (removal waits for open sessions: {})", busy.join(", ")));
            }
        }
        Err(e) => {
            tracing::error!("reload refused, nothing changed: {e:#}");
            eprintln!("rblk-target: reload refused, nothing changed: {e:#}");
            status.push_str(&format!(" (last reload refused: {e:#})"));
        }
    }
    notify::ready(&status);
}

/// The effective configuration: the file, then the flags on top (at start and at each reload).
fn effective(args: &Args) -> anyhow::Result<ConfigFile> {
    let mut file = match &args.config {
        Some(path) => ConfigFile::read(path).map_err(anyhow::Error::msg)?,
        None => ConfigFile::default(),
    };
    if let Some(listen) = args.listen {
        file.listen = Some(listen.to_string());
    }
    if args.device.is_some() {
        file.device.clone_from(&args.device);
    }
    if args.key_file.is_some() {
        file.key_file.clone_from(&args.key_file);
    }
    if args.state_dir.is_some() {
        file.state_dir.clone_from(&args.state_dir);
    }
    let limits = [
        (&mut file.max_unopened, args.max_unopened),
        (&mut file.max_unopened_per_addr, args.max_unopened_per_addr),
        (&mut file.max_sessions, args.max_sessions),
        (&mut file.max_sessions_per_host, args.max_sessions_per_host),
    ];
    for (field, flag) in limits {
        if let Some(n) = flag {
            *field = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
    if args.open_timeout.is_some() {
        file.open_timeout = args.open_timeout;
    }
    if args.keepalive_timeout.is_some() {
        file.keepalive_timeout = args.keepalive_timeout;
    }
    if file.state_dir.is_none() {
        file.state_dir = Some(DEFAULT_STATE_DIR.into());
    }
    if !args.volumes.is_empty() {
        file.volumes = args
            .volumes
            .iter()
            .map(|v| FileVolume {
                name: v.name.clone(),
                size: v.size.into(),
                path: v.path.clone(),
                ..FileVolume::default()
            })
            .collect();
    }
    if file.volumes.is_empty() {
        file.volumes = vec![FileVolume { name: "vol0".into(), size: "1G".into(), ..FileVolume::default() }];
    }
    Ok(file)
}
