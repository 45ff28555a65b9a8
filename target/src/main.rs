//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use clap::Parser;
use rblk_target::config::{parse_listen, read_key_file, VolumeSpec};
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
    let key = match &args.key_file {
        Some(path) => Some(read_key_file(path).map_err(anyhow::Error::msg)?),
        None => None,
    };
    let defaults = Config::default();
    let cfg = Config {
        listen: args.listen.unwrap_or(SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), rblk_proto::DEFAULT_PORT)),
        device: args.device,
        volumes: if args.volumes.is_empty() { defaults.volumes.clone() } else { args.volumes },
        key,
        ..defaults
    };
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let running = Server::start(cfg)?;
    eprintln!("rblk-target: listening on {}", running.local_addr());
    while !stop.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    tracing::info!("signal received: shutting down");
    running.shutdown();
    Ok(())
}
