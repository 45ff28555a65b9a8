//! A client process for rblk's tests over rxe (a second initiator, one to SIGKILL).
//!
//! ```text
//! rblk-test-client pair URI --mine OFF:LEN:SEED --other OFF:LEN:SEED --barrier DIR
//!     write `mine` with 4 queues at depth 16, then wait until the peer process wrote `other`
//!     (files in DIR), then verify both regions
//! rblk-test-client hammer URI --region OFF:LEN:SEED
//!     write the region over and over until killed; prints "hammering" once I/O runs
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use rblk_initiator::{OpenMode, Options, Session};
use rblk_tests::workload::{self, Region};

fn arg(args: &[String], name: &str) -> Result<String, String> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].clone()).ok_or(format!("missing {name}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("pair") => pair(&args),
        Some("hammer") => hammer(&args),
        _ => Err("usage: rblk-test-client pair|hammer URI ...".into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rblk-test-client: {e}");
            ExitCode::FAILURE
        }
    }
}

fn open(uri: &str) -> Result<rblk_initiator::Volume, String> {
    let session = Session::connect(uri, &Options::default()).map_err(|e| format!("connect {uri}: {e}"))?;
    session.open(OpenMode::ReadWrite).map_err(|e| format!("open: {e}"))
}

fn pair(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let mine: Region = arg(args, "--mine")?.parse()?;
    let other: Region = arg(args, "--other")?.parse()?;
    let barrier = PathBuf::from(arg(args, "--barrier")?);
    let vol = open(uri)?;
    workload::pair(&vol, mine, other, &barrier)?;
    println!("verified {mine} and {other}");
    Ok(())
}

fn hammer(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let region: Region = arg(args, "--region")?.parse()?;
    let vol = open(uri)?;
    println!("hammering");
    loop {
        workload::run(workload::queues(&vol, 2, 16), region, false)?;
    }
}
