//! The ublk server's request path without libublk or the kernel, for the instruction count per
//! request (issue 45): `rblk attach`'s own tag tasks and queue loop step
//! ([`rblk::ublk::path`]) over one lane of the in-memory fabric against the in-process target
//! (64 MiB RAM volume), with registered 4 KiB buffers, fed made-up I/O descriptors: 4 KiB reads
//! or writes at random block-aligned offsets (xorshift, fixed seed 0x9e3779b97f4a7c15).
//!
//! ```text
//! rblk-ublk-path-bench --requests N (--scenario NAME | --rw read|write --depth D)
//! ```
//!
//! Scenarios: `randread-qd1`, `randwrite-qd1`, `randread-qd32`, `randwrite-qd32`. After a
//! warm-up of 256 requests it runs exactly N requests inside one call of
//! [`rblk_tests::ublk_path::insns_region`] (no clock, sleep or housekeeping inside: a
//! valgrind `--toggle-collect='*insns_region*'` counts that call only), then prints one line,
//! `SCENARIO requests=N committed=C failed=F wall_ns_per_req=W` (the wall time is taken outside
//! the region). Exits 1 when a request failed, 2 on a bad command line.

use std::process::ExitCode;
use std::time::Instant;

use libublk::sys;
use rblk_fabric::Fabric;
use rblk_initiator::{Engine, OpenMode, Options, Session};
use rblk_tests::target::{Spec, Target};
use rblk_tests::ublk_path::{insns_region, path, spawn_tags, FakeKernel};

const VOLUME: u64 = 64 << 20;
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
const WARMUP: u64 = 256;
const USAGE: &str = "usage: rblk-ublk-path-bench --requests N (--scenario randread-qd1|randwrite-qd1|randread-qd32|randwrite-qd32 | --rw read|write --depth D)";

#[derive(Debug, PartialEq, Eq)]
struct Args {
    requests: u64,
    write: bool,
    depth: u16,
}

impl Args {
    fn name(&self) -> String {
        format!("rand{}-qd{}", if self.write { "write" } else { "read" }, self.depth)
    }
}

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let (mut requests, mut write, mut depth) = (None, None, None);
    let mut it = argv.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--requests" => {
                let t = value("--requests")?;
                requests =
                    Some(t.parse().ok().filter(|&n| n > 0).ok_or(format!("--requests {t:?}: a positive number"))?);
            }
            "--rw" => {
                write = Some(match value("--rw")?.as_str() {
                    "read" => false,
                    "write" => true,
                    t => return Err(format!("--rw {t:?}: read or write")),
                });
            }
            "--depth" => {
                let t = value("--depth")?;
                let d = t.parse().ok().filter(|d| (1..=1024).contains(d));
                depth = Some(d.ok_or(format!("--depth {t:?}: a number from 1 to 1024"))?);
            }
            "--scenario" => {
                let t = value("--scenario")?;
                let (rw, d) = t
                    .strip_prefix("rand")
                    .and_then(|r| r.split_once("-qd"))
                    .filter(|(_, d)| ["1", "32"].contains(d))
                    .ok_or(format!(
                        "--scenario {t:?}: one of randread-qd1, randwrite-qd1, randread-qd32, randwrite-qd32"
                    ))?;
                write = Some(match rw {
                    "read" => false,
                    "write" => true,
                    _ => return Err(format!("--scenario {t:?}: randread-... or randwrite-...")),
                });
                depth = d.parse().ok();
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    match (requests, write, depth) {
        (Some(requests), Some(write), Some(depth)) => Ok(Args { requests, write, depth }),
        _ => Err(format!("--requests and a scenario (or --rw and --depth) are needed\n{USAGE}")),
    }
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e == USAGE => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rblk-ublk-path-bench: {e}");
            return ExitCode::from(2);
        }
    };
    let target = Target::start(Fabric::Mem, &Spec { volumes: vec![("v", VOLUME)], key: None });
    let opts = Options { fabric: target.fabric(), ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", target.addr()), &opts)
        .and_then(|s| s.open(OpenMode::ReadWrite))
        .unwrap_or_else(|e| panic!("connect and open the in-memory volume: {e}"));
    let engine = Engine::new(vol, 0).unwrap_or_else(|e| panic!("engine: {e}"));
    let op = if args.write { sys::UBLK_IO_OP_WRITE } else { sys::UBLK_IO_OP_READ };
    let (committed, failed, first, wall) = {
        let path = path(&engine, args.depth).unwrap_or_else(|e| panic!("a lane: {e}"));
        let k = FakeKernel::new(op, args.depth, VOLUME, SEED);
        let exe = smol::LocalExecutor::new();
        let tags = spawn_tags(&exe, &path, &k, args.depth);
        insns_region(&exe, &path, &k, WARMUP);
        let started = Instant::now();
        insns_region(&exe, &path, &k, args.requests);
        let wall = started.elapsed();
        k.stop();
        while exe.try_tick() {}
        drop(tags);
        let (failed, first) = k.failed();
        (k.committed() - WARMUP, failed, first, wall)
    };
    println!(
        "{} requests={} committed={committed} failed={failed} wall_ns_per_req={:.1}",
        args.name(),
        args.requests,
        wall.as_nanos() as f64 / args.requests as f64
    );
    drop(engine.close());
    if let Some(r) = first {
        eprintln!("rblk-ublk-path-bench: {failed} requests failed, the first with {r}");
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, String> {
        parse_args(args.iter().map(|s| s.to_string()))
    }

    /// The instruction gate's command lines. Would catch a scenario parsed to the wrong
    /// operation or depth, or a malformed one taken.
    #[test]
    fn command_lines() {
        let a = |requests, write, depth| Ok(Args { requests, write, depth });
        assert_eq!(parse(&["--requests", "100", "--scenario", "randwrite-qd32"]), a(100, true, 32));
        assert_eq!(parse(&["--scenario", "randread-qd1", "--requests", "7"]), a(7, false, 1));
        assert_eq!(parse(&["--requests", "5", "--rw", "write", "--depth", "8"]), a(5, true, 8));
        for bad in [
            &["--requests", "0", "--scenario", "randread-qd1"][..],
            &["--requests", "5"],
            &["--requests", "5", "--scenario", "randread-qd7"],
            &["--requests", "5", "--scenario", "seqread-qd1"],
            &["--requests", "5", "--rw", "trim", "--depth", "1"],
            &["--requests", "5", "--rw", "read", "--depth", "0"],
            &["--requests", "5", "--rw", "read", "--depth", "1", "--what"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
