//! `rblk-target`: serve volumes in registered memory over RDMA.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use rblk_target::config::{parse_listen, VolumeSpec};

/// Serve block volumes held in registered memory over RDMA (InfiniBand, RoCEv2, rxe).
///
/// Initiators connect with rdma_cm, authenticate, open a volume and then read and write it with
/// one-sided RDMA READ and WRITE: the daemon's CPU never touches the data path.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
struct Args {
    /// Address to listen on, ADDR[:PORT] (IPv6 in brackets). Default: every address, port 7420.
    #[arg(long, value_parser = parse_listen)]
    listen: Option<SocketAddr>,
    /// Only accept connections arriving on this RDMA device (e.g. mlx5_0, rxe0).
    #[arg(long)]
    device: Option<String>,
    /// A RAM volume NAME:SIZE (size like 64M or 1G, a multiple of 4096). Repeatable.
    /// Default: one 1 GiB volume named vol0.
    #[arg(long = "volume", value_name = "NAME:SIZE")]
    volumes: Vec<VolumeSpec>,
    /// Pre-shared key file: initiators must prove they hold the same key (HMAC) before opening.
    #[arg(long, env = "RBLK_KEY_FILE")]
    key_file: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let devices = match rblk_fabric::list_devices() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rblk-target: {e}");
            return ExitCode::FAILURE;
        }
    };
    let usable = devices.iter().any(|d| args.device.as_ref().is_none_or(|want| *want == d.name));
    if !usable {
        let err = rblk_fabric::Error::NoDevice { filter: args.device.clone() };
        eprintln!("rblk-target: {err}; on a host without an RDMA NIC, run it in the rxe guest (scripts/rxe-guest.sh)");
        return ExitCode::FAILURE;
    }
    tracing::info!(?args.listen, devices = devices.len(), "RDMA devices present");
    eprintln!("rblk-target: the control protocol is not implemented yet (issue: target daemon and initiator library)");
    ExitCode::FAILURE
}
