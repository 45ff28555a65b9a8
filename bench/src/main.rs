//! `rblk-bench`: load-test an rblk volume.

use std::io;
use std::process::ExitCode;

use clap::Parser;
use rblk_bench::{execute, Args, Env};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
    match execute(&args, &Env::process()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("rblk-bench: verification FAILED (bad blocks listed above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            let code = e.exit_code();
            let no_device = e.no_device();
            // The error and its causes, each once, as `rblk` prints them.
            eprintln!("rblk-bench: {:#}", anyhow::Error::new(e));
            if no_device {
                eprintln!("rblk-bench: no RDMA device reaches that address here (`rblk devices` lists them)");
            }
            ExitCode::from(code)
        }
    }
}
