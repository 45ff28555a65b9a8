//! A client process for rblk's tests over rxe (a second initiator, one to SIGKILL).
//!
//! ```text
//! rblk-test-client pair URI --mine OFF:LEN:SEED --other OFF:LEN:SEED --barrier DIR
//!     write `mine` with 4 queues at depth 16, then wait until the peer process wrote `other`
//!     (files in DIR), then verify both regions
//! rblk-test-client hammer URI --region OFF:LEN:SEED
//!     write the region over and over until killed; prints "hammering" once I/O runs
//! rblk-test-client open-time URI --count N
//!     connect, OPEN (read-only) and close N sessions one after the other; prints
//!     "open_ms p50 P min MIN max MAX rate R" (R: sessions opened and closed per second)
//! rblk-test-client hold URI --sessions N
//!     open N read-only sessions, print "held N", and keep them until stdin closes
//! rblk-test-client raw-lat URI --count N
//!     N 4 KiB RDMA READs one at a time, posted and busy-polled straight on a queue's endpoint
//!     (the fabric layer only: no queue slots, engine or bench around it); prints its latency
//!     as rblk-bench's JSON report does: {"read": {"ios": N, "lat_us": {"min", "p50", "p99"}}}
//! ```
//! (`open-time` and `hold` are scripts/scale-rxe.sh's drivers, `raw-lat` compare-rxe.sh's.)

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
        Some("open-time") => open_time(&args),
        Some("hold") => hold(&args),
        Some("raw-lat") => raw_lat(&args),
        _ => Err("usage: rblk-test-client pair|hammer|open-time|hold|raw-lat URI ...".into()),
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

fn count(args: &[String], name: &str) -> Result<usize, String> {
    let text = arg(args, name)?;
    text.parse().ok().filter(|&n| n > 0).ok_or(format!("{name} {text:?}: expected a positive number"))
}

fn open_ro(uri: &str) -> Result<rblk_initiator::Volume, String> {
    let session = Session::connect(uri, &Options::default()).map_err(|e| format!("connect {uri}: {e}"))?;
    session.open(OpenMode::ReadOnly).map_err(|e| format!("open: {e}"))
}

fn open_time(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--count")?;
    let started = std::time::Instant::now();
    let mut ms = Vec::with_capacity(n);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let vol = open_ro(uri)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        vol.close().map_err(|e| format!("close: {e}"))?;
    }
    let rate = n as f64 / started.elapsed().as_secs_f64();
    ms.sort_by(f64::total_cmp);
    println!("open_ms p50 {:.1} min {:.1} max {:.1} rate {rate:.2}", ms[n / 2], ms[0], ms[n - 1]);
    Ok(())
}

fn raw_lat(args: &[String]) -> Result<(), String> {
    use rblk_fabric::{Access, Completion, Local, Memory, Op, WorkRequest};
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--count")?;
    let vol = open_ro(uri)?;
    let mut queue = vol.queue(1).map_err(|e| format!("queue: {e}"))?;
    let (raddr, rkey) = queue.remote();
    let span = vol.size().min(256 << 20) / 4096;
    let buf = vol
        .pd()
        .register(&Memory::anonymous(4096).map_err(|e| e.to_string())?, Access::LOCAL)
        .map_err(|e| e.to_string())?;
    let ep = queue.endpoint_mut();
    let mut out = [Completion::EMPTY; 4];
    let mut us = Vec::with_capacity(n);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for i in 0..n as u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let wr = WorkRequest {
            wr_id: (1 << 40) + i,
            op: Op::Read { remote_addr: raddr + (x % span) * 4096, rkey },
            local: Local::Region { mr: &buf, offset: 0, len: 4096 },
            signaled: true,
        };
        let t = std::time::Instant::now();
        ep.post(&[wr]).map_err(|e| format!("post: {e}"))?;
        loop {
            let got = ep.poll(&mut out).map_err(|e| format!("poll: {e}"))?;
            if let Some(c) = out[..got].iter().find(|c| c.wr_id == (1 << 40) + i) {
                c.ok().map_err(|e| format!("read: {e}"))?;
                break;
            }
        }
        us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    println!(
        r#"{{"read": {{"ios": {n}, "lat_us": {{"min": {:.3}, "p50": {:.3}, "p99": {:.3}}}}}}}"#,
        us[0],
        us[n / 2],
        us[n * 99 / 100]
    );
    Ok(())
}

fn hold(args: &[String]) -> Result<(), String> {
    let uri = args.get(2).ok_or("missing URI")?;
    let n = count(args, "--sessions")?;
    let held = (0..n).map(|_| open_ro(uri)).collect::<Result<Vec<_>, _>>()?;
    println!("held {}", held.len());
    let _ = std::io::Read::read_to_end(&mut std::io::stdin(), &mut Vec::new());
    Ok(())
}
