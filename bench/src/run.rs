//! A whole run: connect, open, plan, one queue per job, start the jobs together, print progress,
//! take the target's STATS around the measured window, and gather the report.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Barrier;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rblk_initiator::{Chain, OpenMode, Options, Session, StatsReply, Volume};

use crate::cli::size_text;
use crate::job::{Event, Job, Output, Shared, Tally};
use crate::log::Logs;
use crate::progress::{Phase, Slot, Snapshot};
use crate::report::{
    dir_report, CpuUse, JobInfo, MismatchReport, Report, ThreadReport, Totals, VerifyReport, VolumeInfo,
};
use crate::spec::{Plan, Rate, Spec};
use crate::stats::{DirStats, Live, Rates, DIRS, SAMPLE_INTERVAL};
use crate::{Error, Result};

/// How a run reports while it runs.
#[derive(Debug, Clone, Default)]
pub struct Run {
    /// Where progress goes (`None`: nowhere; warnings then go to stderr).
    pub progress: Option<Slot>,
    /// The command line, for the report.
    pub command_line: Vec<String>,
}

/// A job's I/Os and bytes so far, by direction.
type Counts = ([u64; DIRS], [u64; DIRS]);

/// What the main thread measured while the jobs ran.
struct Watched {
    /// rblk-bench's own CPU and the target's over the window (when both marks were taken).
    cpu: (Option<CpuUse>, Option<CpuUse>),
    /// Each job's bandwidth and IOPS samples.
    rates: Vec<Rates>,
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
    fn take(run: &Run, vol: &mut Volume) -> Mark {
        let target = match vol.stats() {
            Ok(s) => Some(s),
            Err(e) => {
                run.warn(&format!("STATS failed, target CPU unknown: {}", Chain(&e)));
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
    /// Prints a warning on stderr (without breaking a status line).
    fn warn(&self, text: &str) {
        let line = format!("rblk-bench: warning: {text}");
        match &self.progress {
            Some(p) => p.println(&line),
            None => eprintln!("{line}"),
        }
    }

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
        let started = SystemTime::now();
        let session = Session::connect(uri, options).map_err(|e| Error::Connect(Box::new(e)))?;
        let mode = if spec.workload.writes() { OpenMode::ReadWrite } else { OpenMode::ReadOnly };
        let mut vol = session.open(mode).map_err(Error::initiator(format!("opening {uri}")))?;
        let plan = spec.plan(vol.geometry())?;
        let generation = spec.generation.unwrap_or_else(fresh_generation);
        let expect = if spec.workload.writes() { Some(generation) } else { spec.generation };
        let mut jobs = Vec::with_capacity(spec.jobs as usize);
        for j in 0..spec.jobs {
            let q = vol
                .queue_with(spec.iodepth, spec.max_bs() as usize)
                .map_err(Error::initiator(format!("opening the queue of job {j}")))?;
            jobs.push(Job::new(j, q, &plan, generation, expect, logs.as_ref().map(|l| l.interval()))?);
        }
        let shared = Shared {
            start: Barrier::new(jobs.len() + 1),
            abort: AtomicBool::new(false),
            live: (0..spec.jobs).map(|_| Live::default()).collect(),
        };
        let (tx, rx) = mpsc::channel();
        let initial = Mark::take(self, &mut vol);
        let (outputs, watched) = std::thread::scope(|s| {
            let handles: Vec<_> = jobs
                .into_iter()
                .map(|job| {
                    let (plan, shared, tx) = (&plan, &shared, tx.clone());
                    s.spawn(move || job.run(plan, shared, &tx))
                })
                .collect();
            drop(tx);
            let watched = self.watch(&mut vol, &plan, &shared, &rx, initial, logs.as_deref_mut());
            let outputs: Vec<Result<Output>> = handles
                .into_iter()
                .enumerate()
                .map(|(j, h)| h.join().unwrap_or(Err(Error::Panicked { job: j as u32 })))
                .collect();
            (outputs, watched)
        });
        let outputs = outputs.into_iter().collect::<Result<Vec<_>>>()?;
        let mut report = self.report(options, &plan, &vol, &outputs, watched, generation);
        if let Err(e) = vol.close() {
            self.warn(&format!("closing the volume: {}", Chain(&e)));
        }
        if let Some(l) = logs {
            l.finish()?;
        }
        report.started = started;
        report.ended = SystemTime::now();
        Ok(report)
    }

    /// The main thread while the jobs run: starts them, reports progress twice a second, takes
    /// fio's bandwidth and IOPS samples of each job (every 500 ms of its window), keeps the
    /// volume's own connection alive, takes STATS at the start and the end of the measured
    /// window, and writes the jobs' samples into `logs`.
    fn watch(
        &self,
        vol: &mut Volume,
        plan: &Plan,
        shared: &Shared,
        rx: &mpsc::Receiver<Event>,
        initial: Mark,
        mut logs: Option<&mut Logs>,
    ) -> Watched {
        let spec = &plan.spec;
        let jobs = spec.jobs as usize;
        shared.start.wait();
        let start = Instant::now();
        if let Some(l) = logs.as_deref_mut() {
            let mut comment =
                format!("rblk-bench: rw={} bs={} iodepth={} jobs={}", spec.workload, spec.bs, spec.iodepth, spec.jobs);
            if !self.command_line.is_empty() {
                comment = format!("{}\n{comment}", self.command_line.join(" "));
            }
            l.begin(SystemTime::now() + spec.ramp, &comment);
        }
        let ramp_end = start + spec.ramp;
        let stop = spec.stop();
        let window_end = stop.runtime.map(|d| ramp_end + d);
        // Directions sampled: those the workload does, as fio.
        let dirs = spec.dirs();
        let mut before = spec.ramp.is_zero().then_some(initial);
        let mut after = None;
        let (mut measured, mut finished) = (vec![false; jobs], vec![false; jobs]);
        let mut rates = vec![Rates::default(); jobs];
        // The samples' previous point per job (from the window's start), and the next tick.
        let mut sampled: Option<(Instant, Vec<Counts>)> =
            spec.ramp.is_zero().then(|| (start, vec![([0; DIRS], [0; DIRS]); jobs]));
        // All jobs' bytes when the window began (for a size's ETA).
        let mut window_base = spec.ramp.is_zero().then_some(0);
        let mut next_tick = start + SAMPLE_INTERVAL;
        let mut next_keepalive = start + KEEPALIVE;
        loop {
            // Wake at the ramp's end too: the window's marks and first samples count from there.
            let wake = if sampled.is_none() { next_tick.min(ramp_end) } else { next_tick };
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
            if before.is_none() && now >= ramp_end && after.is_none() {
                before = Some(Mark::take(self, vol));
            }
            if sampled.is_none() && now >= ramp_end {
                // The window begins: the samples count from here, every 500 ms.
                let live: Vec<_> = shared.live.iter().map(|l| l.get()).collect();
                window_base = Some(live.iter().map(|(_, b)| b.iter().sum::<u64>()).sum());
                sampled = Some((now, live));
                next_tick = now + SAMPLE_INTERVAL;
            }
            if after.is_none() && measured.iter().all(|&m| m) {
                after = Some(Mark::take(self, vol));
            }
            if finished.iter().all(|&f| f) {
                break;
            }
            if now >= next_tick {
                // After a stall, the next tick is the next one ahead (a sample spans the stall).
                while next_tick <= now {
                    next_tick += SAMPLE_INTERVAL;
                }
                if let Some((at, last)) = sampled.as_mut() {
                    let dt = (now - *at).as_secs_f64();
                    for (j, prev) in last.iter_mut().enumerate() {
                        if measured[j] {
                            continue;
                        }
                        let (ios, bytes) = shared.live[j].get();
                        for d in (0..DIRS).filter(|&d| dirs[d]) {
                            rates[j].iops[d].push((ios[d] - prev.0[d]) as f64 / dt);
                            rates[j].bw[d].push((bytes[d] - prev.1[d]) as f64 / 1024.0 / dt);
                        }
                        *prev = (ios, bytes);
                    }
                    *at = now;
                }
                if let Some(p) = &self.progress {
                    p.update(self.snapshot(shared, plan, now, ramp_end, window_end, window_base, after.is_some()));
                }
            }
            if now >= next_keepalive {
                next_keepalive += KEEPALIVE;
                if let Err(e) = vol.keepalive() {
                    self.warn(&format!("keepalive on the volume's connection failed: {}", Chain(&e)));
                }
            }
        }
        if let Some(p) = &self.progress {
            let mut s = self.snapshot(shared, plan, Instant::now(), ramp_end, window_end, window_base, true);
            s.remaining = Some(Duration::ZERO);
            p.finish(s);
        }
        let (Some(b), Some(a)) = (before, after) else { return Watched { cpu: (None, None), rates } };
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
        Watched { cpu: (Some(cpu_use(b.own, a.own, wall)), target), rates }
    }

    /// The run's progress for the status line: its counters (all phases), its phase, and the
    /// time it has left (by the runtime, or by the rate so far for a size).
    #[allow(clippy::too_many_arguments)]
    fn snapshot(
        &self,
        shared: &Shared,
        plan: &Plan,
        now: Instant,
        ramp_end: Instant,
        window_end: Option<Instant>,
        window_base: Option<u64>,
        measured: bool,
    ) -> Snapshot {
        let (mut ios, mut bytes) = ([0u64; DIRS], [0u64; DIRS]);
        for l in &shared.live {
            let (i, b) = l.get();
            for d in 0..DIRS {
                ios[d] += i[d];
                bytes[d] += b[d];
            }
        }
        let spec = &plan.spec;
        let stop = spec.stop();
        let (phase, remaining) = if measured {
            (Phase::ReadBack, None)
        } else if now < ramp_end {
            let rest = ramp_end - now;
            (Phase::Ramp, if stop.bytes.is_none() { stop.runtime.map(|d| rest + d) } else { None })
        } else {
            let by_time = window_end.map(|e| e.saturating_duration_since(now));
            // By the size: the bytes left, at the rate since the window began.
            let by_size = stop.bytes.zip(window_base).and_then(|(per_job, base)| {
                let done = bytes.iter().sum::<u64>().saturating_sub(base);
                let rate = done as f64 / now.saturating_duration_since(ramp_end).as_secs_f64().max(1e-3);
                let left = (per_job * u64::from(spec.jobs)).saturating_sub(done);
                (rate > 0.0).then(|| Duration::from_secs_f64(left as f64 / rate))
            });
            let remaining = match (by_time, by_size) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            (Phase::Measure, remaining)
        };
        Snapshot { ios, bytes, phase, remaining }
    }

    fn report(
        &self,
        options: &Options,
        plan: &Plan,
        vol: &Volume,
        outputs: &[Output],
        watched: Watched,
        generation: u64,
    ) -> Report {
        let Watched { cpu: (cpu, target_cpu), rates } = watched;
        let spec = &plan.spec;
        let mut sums: [DirStats; DIRS] = std::array::from_fn(|_| DirStats::new());
        let mut tally = Tally::default();
        let mut window = Duration::ZERO;
        for o in outputs {
            for (sum, d) in sums.iter_mut().zip(&o.stats) {
                sum.add(d);
            }
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
        let [read, write, trim] = sums.each_ref().map(|d| dir_report(d, elapsed_s));
        let (ios, bytes) = (read.ios + write.ios + trim.ios, read.bytes + write.bytes + trim.bytes);
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
                bssplit: spec.bssplit.as_ref().map(ToString::to_string),
                rate_iops: spec
                    .rate
                    .iops
                    .iter()
                    .any(Option::is_some)
                    .then(|| Rate::text(spec.rate.iops, |n| n.to_string())),
                rate: spec.rate.bytes.iter().any(Option::is_some).then(|| Rate::text(spec.rate.bytes, size_text)),
                iodepth: spec.iodepth,
                jobs: spec.jobs,
                runtime_s: spec.runtime.map(|d| d.as_secs_f64()),
                size: spec.size,
                time_based: spec.time_based,
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
            trim,
            total,
            cpu,
            target_cpu,
            verify,
            threads: outputs
                .iter()
                .zip(rates)
                .map(|(o, rates)| ThreadReport { stats: o.stats.clone(), window: o.window, rates, usage: o.usage })
                .collect(),
            started: SystemTime::UNIX_EPOCH,
            ended: SystemTime::UNIX_EPOCH,
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
