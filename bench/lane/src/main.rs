//! A host micro-benchmark of the block-I/O engine's [`Lane`]: nanoseconds per 4 KiB request,
//! wall clock and process CPU, over the in-memory fabric against the in-process target (64 MiB
//! RAM volume), so that no NIC, kernel or network shows up in the figures: only the lane's
//! bookkeeping, the queue under it and the in-memory fabric's copies.
//!
//! Workloads, each at random block-aligned offsets (xorshift), `depth` requests kept in flight:
//! - `randread-qd32-registered`, `randwrite-qd32-registered`, and the same at QD1: zero copy, as
//!   `rblk attach` drives its lanes (`Data::Registered` buffers from `Lane::alloc_buffer`,
//!   deferred posting, `progress` then `next` in a busy loop, each buffer resubmitted when its
//!   request comes back);
//! - `randwrite-qd32-bytes`: the copying path (`Data::Bytes`).
//!
//! Each runs a warm-up, then `--rounds` rounds (default 5) of `--requests` requests (default
//! 200000 at QD32, 50000 at QD1), each after an untimed FLUSH (so that every round starts with no
//! write ranges recorded), and reports per round wall ns/request and process CPU
//! ns/request (`getrusage`: every thread of the process, the in-process target's included), then
//! the median and the spread (min-max) of the rounds. `--json` prints one JSON object per line
//! instead of the table. Nothing is verified beyond every request finishing `Ok`.
//!
//! ```text
//! cargo run --release -p rblk-lane-bench -- --rounds 5 [--requests N] [--json]
//! ```
//!
//! Its numbers are for ratios within one run on one machine (this tree against another, built and
//! run one after the other), never absolute claims about rblk's speed.
//!
//! `--insns WORKLOAD --requests N` is scripts/insns.sh's counted run under callgrind: a cycle of
//! warm-up, then N requests of the workload in cycles of 128 with a FLUSH after each; callgrind
//! collects inside `Driver::insns_region_lane` only, which holds no clock and no spin. It prints
//! one line (`WORKLOAD N requests`) and measures nothing itself.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rblk_fabric::Fabric;
use rblk_initiator::engine::{Data, Finished, IoOp, Request};
use rblk_initiator::{process_cpu_time, Engine, Lane, OpenMode, Options, Session};
use rblk_target::config::VolumeSpec;
use rblk_target::server::{Config, Server};

const BLOCK: u64 = 4096;
const VOLUME: u64 = 64 << 20;
const USAGE: &str = "usage: rblk-lane-bench [--rounds R] [--requests N] [--json]\n       \
                     rblk-lane-bench --insns WORKLOAD --requests N";
/// `--insns`: requests between two FLUSHes (outside the counted region), so that a write's
/// record of its range costs what it costs between FLUSHes, not what it costs once the ranges
/// overflowed into "everything" (past `MAX_FLUSH_RANGES`, about 250). `--requests` must be a
/// multiple of it.
const INSNS_CYCLE: u64 = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Buffers {
    Registered,
    Bytes,
}

#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    op: IoOp,
    depth: u32,
    buffers: Buffers,
}

const WORKLOADS: [Workload; 5] = [
    Workload { name: "randread-qd32-registered", op: IoOp::Read, depth: 32, buffers: Buffers::Registered },
    Workload { name: "randwrite-qd32-registered", op: IoOp::Write, depth: 32, buffers: Buffers::Registered },
    Workload { name: "randread-qd1-registered", op: IoOp::Read, depth: 1, buffers: Buffers::Registered },
    Workload { name: "randwrite-qd1-registered", op: IoOp::Write, depth: 1, buffers: Buffers::Registered },
    Workload { name: "randwrite-qd32-bytes", op: IoOp::Write, depth: 32, buffers: Buffers::Bytes },
];

#[derive(Debug)]
struct Args {
    rounds: usize,
    requests: Option<u64>,
    json: bool,
    /// `--insns`: the workload whose instructions scripts/insns.sh counts.
    insns: Option<&'static Workload>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args { rounds: 5, requests: None, json: false, insns: None };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<u64, String> {
            let text = it.next().ok_or(format!("{name} needs a value"))?;
            text.parse().ok().filter(|&n| n > 0).ok_or(format!("{name} {text:?}: expected a positive number"))
        };
        match a.as_str() {
            "--rounds" => args.rounds = number("--rounds")? as usize,
            "--requests" => args.requests = Some(number("--requests")?),
            "--json" => args.json = true,
            "--insns" => {
                let name = it.next().ok_or("--insns needs a workload")?;
                let w = WORKLOADS.iter().find(|w| w.name == name);
                let names: Vec<&str> = WORKLOADS.iter().map(|w| w.name).collect();
                args.insns = Some(w.ok_or(format!("--insns {name:?}: expected one of {}", names.join(", ")))?);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {a:?}\n{USAGE}")),
        }
    }
    if args.insns.is_some() {
        match args.requests {
            Some(n) if n % INSNS_CYCLE == 0 => {}
            _ => return Err(format!("--insns needs --requests N, a multiple of {INSNS_CYCLE}")),
        }
    }
    Ok(args)
}

/// The next value of Marsaglia's xorshift64 (13, 7, 17): random offsets, the same in every run.
fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// One round's cost per request.
#[derive(Debug, Clone, Copy)]
struct Round {
    wall_ns: f64,
    cpu_ns: f64,
}

fn cpu_now() -> Duration {
    let (user, system) = process_cpu_time();
    user + system
}

/// Keeps `depth` requests in flight on a lane until `count` have finished.
#[derive(Debug)]
struct Driver {
    lane: Lane,
    op: IoOp,
    buffers: Buffers,
    /// Data of requests not in flight: registered buffers or byte vectors, `depth` in all.
    idle: Vec<Data>,
    rng: u64,
    tag: u64,
    last_tick: Instant,
}

impl Driver {
    fn new(engine: &Engine, w: &Workload) -> Driver {
        let mut lane = engine.lane(w.depth, BLOCK as usize).expect("open a lane");
        lane.set_deferred_posting(true);
        let mut d = Driver {
            lane,
            op: w.op,
            buffers: w.buffers,
            idle: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
            tag: 0,
            last_tick: Instant::now(),
        };
        d.idle = (0..w.depth).map(|_| d.fresh()).collect();
        d
    }

    /// New data for a request, when none came back.
    fn fresh(&self) -> Data {
        match self.buffers {
            Buffers::Registered => Data::Registered(self.lane.alloc_buffer().expect("a buffer of the lane's pool")),
            Buffers::Bytes => Data::Bytes(vec![0x5a; BLOCK as usize]),
        }
    }

    fn submit(&mut self, data: Data) {
        self.rng = xorshift(self.rng);
        let offset = self.rng % (VOLUME / BLOCK) * BLOCK;
        self.tag += 1;
        self.lane.submit(Request { tag: self.tag, op: self.op, offset, len: BLOCK, fua: false, data });
    }

    /// Runs `count` requests and returns when all finished, every buffer back in `idle`.
    fn run(&mut self, count: u64) {
        let mut submitted = 0;
        while submitted < count {
            let Some(data) = self.idle.pop() else { break };
            self.submit(data);
            submitted += 1;
        }
        let mut finished = 0;
        let mut idle_spins = 0u32;
        let mut last_done = Instant::now();
        while finished < count {
            self.lane.progress().unwrap_or_else(|e| panic!("progress: {e}"));
            let before = finished;
            while let Some(f) = self.lane.next() {
                self.recycle(f, &mut submitted, count);
                finished += 1;
                if finished % 65536 == 0 {
                    self.tick_if_due();
                }
            }
            // A lane that stops finishing anything is a failure, not a slow run.
            if finished == before {
                idle_spins += 1;
                if idle_spins.is_multiple_of(1 << 20) && last_done.elapsed() > Duration::from_secs(30) {
                    panic!("no request finished for 30 s ({finished} of {count} done)");
                }
            } else {
                last_done = Instant::now();
            }
        }
    }

    /// A finished request's data goes to the next request, or back to `idle` once `count` were
    /// submitted.
    fn recycle(&mut self, mut f: Finished, submitted: &mut u64, count: u64) {
        if let Err(e) = &f.result {
            panic!("{:?} request {} failed: {e}", f.op, f.tag);
        }
        let data = match std::mem::take(&mut f.data) {
            // Not handed back (the buffer went back to its pool): take new data.
            Data::None => self.fresh(),
            data => data,
        };
        if *submitted < count {
            self.submit(data);
            *submitted += 1;
        } else {
            self.idle.push(data);
        }
    }

    /// `--insns`: a cycle of warm-up, then `count` requests in cycles of [`INSNS_CYCLE`], each
    /// write cycle followed by a FLUSH outside the counted region, on a thread of its own: a
    /// pattern that toggles the in-memory fabric out of the region toggles it in wherever this
    /// thread calls it outside, and what the FLUSH copies would count against every request.
    fn insns(&mut self, engine: &Engine, count: u64) {
        for _ in 0..=count / INSNS_CYCLE {
            let finished = self.insns_region_lane(INSNS_CYCLE);
            if finished != INSNS_CYCLE {
                panic!("the lane stopped finishing requests: {finished} of {INSNS_CYCLE} finished");
            }
            if !matches!(self.op, IoOp::Write) {
                continue;
            }
            std::thread::scope(|s| {
                s.spawn(|| engine.flush().unwrap_or_else(|e| panic!("flush: {e}")));
            });
        }
    }

    /// The region scripts/insns.sh counts (callgrind collects only inside a function whose name
    /// has `insns_region`: keep it in the name and out of line): `count` requests, `depth` in
    /// flight, each buffer resubmitted when its request comes back, as [`run`](Self::run) does
    /// but without a clock. Over the in-memory fabric a work request runs inside `post`, on this
    /// thread, so each `progress` finds the completions of what it posted and nothing spins.
    /// Returns how many finished; it stops early when a `progress` finished nothing.
    #[inline(never)]
    fn insns_region_lane(&mut self, count: u64) -> u64 {
        let mut submitted = 0;
        while submitted < count {
            let Some(data) = self.idle.pop() else { break };
            self.submit(data);
            submitted += 1;
        }
        let mut finished = 0;
        while finished < count {
            self.lane.progress().unwrap_or_else(|e| panic!("progress: {e}"));
            let before = finished;
            while let Some(f) = self.lane.next() {
                self.recycle(f, &mut submitted, count);
                finished += 1;
            }
            if finished == before {
                break;
            }
        }
        finished
    }

    /// Keepalives, once a second at most: a long round must not look like a lost initiator.
    fn tick_if_due(&mut self) {
        if self.last_tick.elapsed() >= Duration::from_secs(1) {
            self.lane.tick().unwrap_or_else(|e| panic!("tick: {e}"));
            self.last_tick = Instant::now();
        }
    }

    fn measure(&mut self, engine: &Engine, count: u64) -> Round {
        // Writes record their ranges for the next FLUSH, at a cost that depends on how many are
        // recorded already: every round starts from none, so rounds compare.
        engine.flush().unwrap_or_else(|e| panic!("flush: {e}"));
        self.tick_if_due();
        let (wall, cpu) = (Instant::now(), cpu_now());
        self.run(count);
        let (wall, cpu) = (wall.elapsed(), cpu_now().saturating_sub(cpu));
        let per = |d: Duration| d.as_nanos() as f64 / count as f64;
        Round { wall_ns: per(wall), cpu_ns: per(cpu) }
    }
}

/// Median, min and max.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
    (median, v[0], v[n - 1])
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rblk-lane-bench: {e}");
            return ExitCode::from(2);
        }
    };
    // The in-process target on a free port of the in-memory fabric's own address table.
    let cfg = Config {
        listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
        volumes: vec![VolumeSpec { name: "v".into(), size: VOLUME, path: None }],
        fabric: Fabric::Mem,
        ..Config::default()
    };
    let target =
        Server::start(cfg).unwrap_or_else(|e| panic!("start the in-process target: {}", rblk_fabric::Chain(&e)));
    let opts = Options { fabric: Fabric::Mem, ..Options::default() };
    let vol = Session::connect(&format!("rblk://{}/v", target.local_addr()), &opts)
        .and_then(|s| s.open(OpenMode::ReadWrite))
        .unwrap_or_else(|e| panic!("connect and open the in-memory volume: {e}"));
    let engine = Engine::new(vol, 0).unwrap_or_else(|e| panic!("engine: {e}"));

    if let Some(w) = args.insns {
        let count = args.requests.expect("checked by parse_args");
        Driver::new(&engine, w).insns(&engine, count);
        drop(engine.close());
        println!("{} {count} requests", w.name);
        return ExitCode::SUCCESS;
    }

    let mut summary = Vec::new();
    if !args.json {
        println!("{:<26} {:>5} {:>9} {:>12} {:>12}", "workload", "round", "requests", "wall ns/req", "cpu ns/req");
    }
    for w in &WORKLOADS {
        let count = args.requests.unwrap_or(if w.depth == 1 { 50_000 } else { 200_000 });
        let mut d = Driver::new(&engine, w);
        d.measure(&engine, (count / 4).max(1000));
        let mut rounds = Vec::with_capacity(args.rounds);
        for i in 1..=args.rounds {
            let r = d.measure(&engine, count);
            if args.json {
                println!(
                    "{{\"type\":\"round\",\"workload\":\"{}\",\"round\":{i},\"requests\":{count},\
                     \"wall_ns_per_req\":{:.1},\"cpu_ns_per_req\":{:.1}}}",
                    w.name, r.wall_ns, r.cpu_ns
                );
            } else {
                println!("{:<26} {:>5} {:>9} {:>12.1} {:>12.1}", w.name, i, count, r.wall_ns, r.cpu_ns);
            }
            rounds.push(r);
        }
        let wall = spread(rounds.iter().map(|r| r.wall_ns).collect());
        let cpu = spread(rounds.iter().map(|r| r.cpu_ns).collect());
        summary.push((w.name, w.depth, count, wall, cpu));
    }
    drop(engine.close());

    if !args.json {
        println!();
        println!("median of {} rounds (min-max), ns per 4 KiB request", args.rounds);
        println!("{:<26} {:>28} {:>28}", "workload", "wall", "cpu");
    }
    for (name, depth, count, wall, cpu) in summary {
        if args.json {
            println!(
                "{{\"type\":\"summary\",\"workload\":\"{name}\",\"depth\":{depth},\"requests\":{count},\
                 \"rounds\":{},\"wall_ns_per_req\":{{\"median\":{:.1},\"min\":{:.1},\"max\":{:.1}}},\
                 \"cpu_ns_per_req\":{{\"median\":{:.1},\"min\":{:.1},\"max\":{:.1}}}}}",
                args.rounds, wall.0, wall.1, wall.2, cpu.0, cpu.1, cpu.2
            );
        } else {
            let cell = |(m, lo, hi): (f64, f64, f64)| format!("{m:.1} ({lo:.1}-{hi:.1})");
            println!("{:<26} {:>28} {:>28}", name, cell(wall), cell(cpu));
        }
    }
    ExitCode::SUCCESS
}
