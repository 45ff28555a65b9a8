//! `rblk`: the rblk client.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Client for rblk volumes served over RDMA by rblk-target.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List RDMA devices, their ports and the IP addresses that reach them.
    Devices,
}

fn main() -> ExitCode {
    match Args::parse().command {
        Command::Devices => match rblk_initiator::list_devices() {
            Ok(devs) if devs.is_empty() => {
                eprintln!("rblk: no RDMA device found");
                ExitCode::FAILURE
            }
            Ok(devs) => {
                for d in devs {
                    for p in d.ports {
                        let addrs: Vec<String> = p.addrs.iter().map(ToString::to_string).collect();
                        println!("{} port {} {} {}", d.name, p.port, p.state, addrs.join(","));
                    }
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("rblk: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
