//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rblk_target::config::{parse_listen, read_key_file, File as ConfigFile, FileVolume, VolumeSpec, DEFAULT_STATE_DIR};
use rblk_target::server::{Config, Server, StartError};

/// Serve block volumes held in registered memory over RDMA (InfiniBand, RoCEv2, rxe).
///
/// Initiators connect with rdma_cm, authenticate, open a volume and then read and write it with
/// one-sided RDMA READ and WRITE: the daemon's CPU never touches the data path. Stop it with
/// SIGINT or SIGTERM: it disconnects its peers, deregisters its memory and exits 0.
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
    /// Pre-shared key file: initiators must prove they hold the same key (HMAC-SHA256 over a
    /// nonce) before they may open anything. Without it the daemon serves anyone.
    #[arg(long, env = "RBLK_KEY_FILE", value_name = "PATH")]
    key_file: Option<PathBuf>,
    /// Directory where durable volumes keep their instance identity across a clean shutdown
    /// (one small file per volume, removed at start: after a crash, or when the backing store
    /// was replaced or resized, the identity is new, and reconnecting initiators report their
    /// unflushed writes as lost). Default: /var/lib/rblk.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// A TOML config file (keys listen, device, key_file, state_dir and [[volume]] tables with
    /// name, size and optional path). Flags override it; --volume flags replace its volumes.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Print the effective configuration (file plus flags) as TOML and exit.
    #[arg(long)]
    print_config: bool,
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
                eprintln!("rblk-target: on a host without an RDMA NIC, run it in the rxe guest (scripts/rxe-guest.sh)");
            }
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    // The file, then the flags on top.
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
    if file.state_dir.is_none() {
        file.state_dir = Some(DEFAULT_STATE_DIR.into());
    }
    if !args.volumes.is_empty() {
        file.volumes = args
            .volumes
            .iter()
            .map(|v| FileVolume { name: v.name.clone(), size: v.size.to_string(), path: v.path.clone() })
            .collect();
    }
    if file.volumes.is_empty() {
        file.volumes = vec![FileVolume { name: "vol0".into(), size: "1G".into(), path: None }];
    }
    if args.print_config {
        print!("{}", file.to_toml());
        return Ok(());
    }
    let listen = match &file.listen {
        Some(text) => parse_listen(text).map_err(anyhow::Error::msg)?,
        None => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), rblk_proto::DEFAULT_PORT),
    };
    let key = match &file.key_file {
        Some(path) => Some(read_key_file(path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let cfg = Config {
        listen,
        device: file.device.clone(),
        volumes: file.volume_specs().map_err(anyhow::Error::msg)?,
        key,
        state_dir: file.state_dir.clone(),
        ..Config::default()
    };
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])
        .context("installing signal handlers")?;
    let running = Server::start(cfg)?;
    eprintln!("rblk-target: listening on {}", running.local_addr());
    // Sleeps until a signal arrives: an idle daemon uses no CPU.
    let signal = signals.forever().next();
    tracing::info!(?signal, "signal received: shutting down");
    running.shutdown();
    Ok(())
}
