//! A whole run: connect, open, plan, one queue per job, start the jobs together, print progress,
//! take the target's STATS around the measured window, and gather the report.

use std::io::Write as _;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rblk_initiator::{Chain, OpenMode, Options, Session, StatsReply, Volume};

use crate::job::{Event, Job, Output, Shared, Tally};
use crate::log::Logs;
use crate::report::{
    dir_report, human_count, CpuUse, JobInfo, MismatchReport, Report, Totals, VerifyReport, VolumeInfo,
};
use crate::spec::{Plan, Spec, Stop};
use crate::stats::{DirStats, Live};
use crate::{Error, Result};

/// How a run reports while it runs.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Print a progress line on stderr every second.
    pub progress: bool,
    /// The command line, for the report.
    pub command_line: Vec<String>,
}

/// A generation no earlier run used: microseconds since the Unix epoch.
fn fresh_generation() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_micros() as u64)
}

/// A point of the measured window: when, this process's CPU time, and the target's STATS
/// (`None`, with a warning, if it failed).
struct Mark {
    at: Instant,
    own: (Duration, Duration),
    target: Option<StatsReply>,
}

impl Mark {
    fn take(vol: &mut Volume) -> Mark {
        let target = match vol.stats() {
            Ok(s) => Some(s),
            Err(e) => {
                eprintln!("rblk-bench: warning: STATS failed, target CPU unknown: {}", Chain(&e));
                None
            }
        };
        Mark { at: Instant::now(), own: rblk_initiator::process_cpu_time(), target }
    }
}

/// CPU use between two marks, from user and system time at each.
fn cpu_use(before: (Duration, Duration), after: (Duration, Duration), wall: Duration) -> CpuUse {
    let user_s = after.0.saturating_sub(before.0).as_secs_f64();
    let system_s = after.1.saturating_sub(before.1).as_secs_f64();
    let wall_s = wall.as_secs_f64();
    let share_of_core = if wall_s > 0.0 { (user_s + system_s) / wall_s } else { 0.0 };
    CpuUse { user_s, system_s, wall_s, share_of_core }
}

impl Run {
    /// Runs `spec` against the volume at `uri`. Arguments are checked before connecting (and
    /// against the volume before any I/O). Verification mismatches do not make this fail: see
    /// [`Report::passed`].
    pub fn run(&self, uri: &str, options: &Options, spec: &Spec) -> Result<Report> {
        self.run_with_logs(uri, options, spec, None)
    }

    /// [`Run::run`], writing the time series of [`Logs`] (made for the same `spec`) as it goes.
    /// A log that cannot be written fails the run at its end (the I/O is not stopped).
    pub fn run_with_logs(
        &self,
        uri: &str,
        options: &Options,
        spec: &Spec,
        mut logs: Option<&mut Logs>,
    ) -> Result<Report> {
        spec.check()?;
        if let Some(l) = logs.as_deref() {
            l.check(spec)?;
        }
        let session = Session::connect(uri, options).map_err(Error::initiator(format!("connecting to {uri}")))?;
        let mode = if spec.workload.writes() { OpenMode::ReadWrite } else { OpenMode::ReadOnly };
        let mut vol = session.open(mode).map_err(Error::initiator(format!("opening {uri}")))?;
        let plan = spec.plan(vol.geometry())?;
        let generation = spec.generation.unwrap_or_else(fresh_generation);
        let expect = if spec.workload.writes() { Some(generation) } else { spec.generation };
        let mut jobs = Vec::with_capacity(spec.jobs as usize);
        for j in 0..spec.jobs {
            let q = vol
                .queue_with(spec.iodepth, spec.bs as usize)
                .map_err(Error::initiator(format!("opening the queue of job {j}")))?;
            jobs.push(Job::new(j, q, &plan, generation, expect, logs.as_ref().map(|l| l.interval()))?);
        }
        let shared = Shared {
            start: Barrier::new(jobs.len() + 1),
            abort: AtomicBool::new(false),
            live: (0..spec.jobs).map(|_| Live::default()).collect(),
        };
        let (tx, rx) = mpsc::channel();
        let initial = Mark::take(&mut vol);
        let (outputs, cpu) = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let (plan, shared, tx) = (&plan, &shared, tx.clone());
                    s.spawn(move || job.run(plan, shared, &tx))
                })
                .collect();
            drop(tx);
            let cpu = self.watch(&mut vol, &plan, &shared, &rx, initial, logs.as_deref_mut());
            let outputs: Vec<Result<Output>> = handles
                .into_iter()
                .enumerate()
                .map(|(j, h)| h.join().unwrap_or(Err(Error::Panicked { job: j as u32 })))
                .collect();
            (outputs, cpu)
        });
        let outputs = outputs.into_iter().collect::<Result<Vec<_>>>()?;
        let report = self.report(options, &plan, &vol, &outputs, cpu, generation);
        if let Err(e) = vol.close() {
            eprintln!("rblk-bench: warning: closing the volume: {}", Chain(&e));
        }
        if let Some(l) = logs {
            l.finish()?;
        }
        Ok(report)
    }

    /// The main thread while the jobs run: starts them, prints progress every second, keeps the
    /// volume's own connection alive and takes STATS at the start and the end of the measured
    /// window, and writes the jobs' samples into `logs`. Returns the CPU use of this process and
    /// of the target (if STATS answered) over the window.
    fn watch(
        &self,
        vol: &mut Volume,
        plan: &Plan,
        shared: &Shared,
        rx: &mpsc::Receiver<Event>,
        initial: Mark,
        mut logs: Option<&mut Logs>,
    ) -> (Option<CpuUse>, Option<CpuUse>) {
        let jobs = plan.spec.jobs as usize;
        shared.start.wait();
        let start = Instant::now();
        if let Some(l) = logs.as_deref_mut() {
            let s = &plan.spec;
            let mut comment =
                format!("rblk-bench: rw={} bs={} iodepth={} jobs={}", s.workload, s.bs, s.iodepth, s.jobs);
            if !self.command_line.is_empty() {
                comment = format!("{}\n{comment}", self.command_line.join(" "));
            }
            l.begin(SystemTime::now() + s.ramp, &comment);
        }
        let ramp_end = start + plan.spec.ramp;
        let mut before = plan.spec.ramp.is_zero().then_some(initial);
        let mut after = None;
        let (mut measured, mut finished) = (vec![false; jobs], vec![false; jobs]);
        let tick = Duration::from_secs(1);
        let mut next_tick = start + tick;
        let mut next_keepalive = start + KEEPALIVE;
        let mut last = ([0u64; 2], [0u64; 2], start);
        loop {
            let mut wake = next_tick;
            if !plan.spec.ramp.is_zero() && before.is_none() && Instant::now() < ramp_end {
                wake = wake.min(ramp_end);
            }
            match rx.recv_timeout(wake.saturating_duration_since(Instant::now())) {
                Ok(Event::Sample(sample)) => {
                    if let Some(l) = logs.as_deref_mut() {
                        l.record(*sample);
                    }
                }
                Ok(Event::Measured(j)) => measured[j as usize] = true,
                Ok(Event::Finished(j)) => {
                    measured[j as usize] = true;
                    finished[j as usize] = true;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => finished.fill(true),
            }
            let now = Instant::now();
            if before.is_none() && !plan.spec.ramp.is_zero() && now >= ramp_end && after.is_none() {
                before = Some(Mark::take(vol));
            }
            if after.is_none() && measured.iter().all(|&m| m) {
                after = Some(Mark::take(vol));
            }
            if finished.iter().all(|&f| f) {
                break;
            }
            if now >= next_tick {
                next_tick += tick;
                if self.progress {
                    let phase = if now < ramp_end {
                        " [ramp]"
                    } else if after.is_some() {
                        " [verify read-back]"
                    } else {
                        ""
                    };
                    last = progress_line(shared, start, now, last, phase);
                }
            }
            if now >= next_keepalive {
                next_keepalive += KEEPALIVE;
                if let Err(e) = vol.keepalive() {
                    eprintln!("rblk-bench: warning: keepalive on the volume's connection failed: {}", Chain(&e));
                }
            }
        }
        let (Some(b), Some(a)) = (before, after) else { return (None, None) };
        let wall = a.at - b.at;
        let target = match (b.target, a.target) {
            (Some(tb), Some(ta)) => {
                let us = Duration::from_micros;
                let (before, after) =
                    ((us(tb.cpu_user_us), us(tb.cpu_system_us)), (us(ta.cpu_user_us), us(ta.cpu_system_us)));
                Some(cpu_use(before, after, wall))
            }
            _ => None,
        };
        (Some(cpu_use(b.own, a.own, wall)), target)
    }

    fn report(
        &self,
        options: &Options,
        plan: &Plan,
        vol: &Volume,
        outputs: &[Output],
        (cpu, target_cpu): (Option<CpuUse>, Option<CpuUse>),
        generation: u64,
    ) -> Report {
        let spec = &plan.spec;
        let (mut read, mut write) = (DirStats::new(), DirStats::new());
        let mut tally = Tally::default();
        let mut window = Duration::ZERO;
        for o in outputs {
            read.add(&o.read);
            write.add(&o.write);
            window = window.max(o.window);
            tally.blocks += o.tally.blocks;
            tally.mismatches += o.tally.mismatches;
            tally.first.extend_from_slice(&o.tally.first);
            tally.generations = match (tally.generations, o.tally.generations) {
                (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
                (x, y) => x.or(y),
            };
        }
        let elapsed_s = window.as_secs_f64();
        let (read, write) = (dir_report(&read, elapsed_s), dir_report(&write, elapsed_s));
        let (ios, bytes) = (read.ios + write.ios, read.bytes + write.bytes);
        let rate = |x: u64| if elapsed_s > 0.0 { x as f64 / elapsed_s } else { 0.0 };
        let total = Totals {
            ios,
            bytes,
            iops: rate(ios),
            bw_mib_s: rate(bytes) / (1u64 << 20) as f64,
            bw_mb_s: rate(bytes) / 1e6,
        };
        let verify = spec.verify.then(|| VerifyReport {
            generation: if spec.workload.writes() { Some(generation) } else { spec.generation },
            generations_seen: tally.generations.map(|(a, b)| [a, b]),
            blocks_checked: tally.blocks,
            mismatches: tally.mismatches,
            first_mismatches: tally
                .first
                .iter()
                .map(|m| MismatchReport { offset: m.offset, problem: m.problem.to_string() })
                .collect(),
        });
        let geo = vol.geometry();
        Report {
            rblk_version: env!("CARGO_PKG_VERSION").into(),
            command_line: self.command_line.clone(),
            uri: vol.uri().to_string(),
            device: device_name(options, vol),
            volume: VolumeInfo {
                size: geo.size,
                block_size: geo.block_size,
                max_io: geo.max_io,
                volatile: vol.is_volatile(),
            },
            job: JobInfo {
                rw: spec.workload.name().into(),
                rwmixread: spec.read_percent(),
                bs: spec.bs,
                iodepth: spec.iodepth,
                jobs: spec.jobs,
                runtime_s: match spec.stop {
                    Stop::Runtime(d) => Some(d.as_secs_f64()),
                    Stop::Size(_) => None,
                },
                size: match spec.stop {
                    Stop::Size(s) => Some(s),
                    Stop::Runtime(_) => None,
                },
                ramp_s: spec.ramp.as_secs_f64(),
                verify: spec.verify,
                seed: spec.seed,
                spin_us: options.spin.as_secs_f64() * 1e6,
                wait: options.wait.name(),
                slice: plan.slice,
            },
            elapsed_s,
            read,
            write,
            total,
            cpu,
            target_cpu,
            verify,
        }
    }
}

/// The volume's own connection carries no I/O during a run: keep it alive at the protocol's
/// keepalive interval (2 s), so its receive buffers are reposted and the target hears from us.
const KEEPALIVE: Duration = Duration::from_secs(2);

/// The device: `--device`, else the only device, else the one whose port holds the target's
/// address (a loopback run). The library does not say which device a session uses.
fn device_name(options: &Options, vol: &Volume) -> Option<String> {
    if let Some(d) = &options.device {
        return Some(d.clone());
    }
    let devices = rblk_initiator::list_devices().ok()?;
    if let [only] = devices.as_slice() {
        return Some(only.name.clone());
    }
    let ip = vol.addr().ip();
    devices.iter().find(|d| d.ports.iter().any(|p| p.addrs.contains(&ip))).map(|d| d.name.clone())
}

/// Prints one progress line on stderr: rates since the previous line.
fn progress_line(
    shared: &Shared,
    start: Instant,
    now: Instant,
    last: ([u64; 2], [u64; 2], Instant),
    phase: &str,
) -> ([u64; 2], [u64; 2], Instant) {
    let (mut ios, mut bytes) = ([0u64; 2], [0u64; 2]);
    for l in &shared.live {
        let (i, b) = l.get();
        for d in 0..2 {
            ios[d] += i[d];
            bytes[d] += b[d];
        }
    }
    let dt = (now - last.2).as_secs_f64().max(1e-9);
    let rate = |d: usize| (ios[d] - last.0[d]) as f64 / dt;
    let bps = ((bytes[0] + bytes[1]) - (last.1[0] + last.1[1])) as f64 / dt;
    let (mib, mb) = (bps / (1u64 << 20) as f64, bps / 1e6);
    let mut err = std::io::stderr().lock();
    let _ = writeln!(
        err,
        "rblk-bench: {:>5.1}s: {} IOPS (read {}, write {}), {mib:.1} MiB/s ({mb:.1} MB/s){phase}",
        (now - start).as_secs_f64(),
        human_count(rate(0) + rate(1)),
        human_count(rate(0)),
        human_count(rate(1)),
    );
    (ios, bytes, now)
}
