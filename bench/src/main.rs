//! `rblk-bench`: load-test an rblk volume.

use std::process::ExitCode;

use clap::Parser;

/// Load-test an rblk volume like fio (not available yet: it needs initiator sessions).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Volume URI, rblk://HOST[:PORT]/VOLUME.
    uri: String,
}

fn main() -> ExitCode {
    let args = Args::parse();
    eprintln!("rblk-bench: cannot run against {}: initiator sessions are not implemented yet", args.uri);
    ExitCode::FAILURE
}
