//! One job: a thread that owns a queue and keeps `iodepth` I/Os in flight in its slice of the
//! volume, then (for writes under `--verify`) reads back every block it wrote.
//!
//! The hot path does not allocate: slots, buffers, timestamps and the completion array are made
//! before the start; I/Os use the queue's registered buffers without copies (`submit_*_buf`),
//! except that `--verify` copies its patterns in and out. Timestamps: one clock read per
//! submission batch and one per reaped batch, so a latency runs from the submit call to the reap
//! that saw it. A trim workload's job runs its queue as an engine lane ([`Lane::over`]), whose
//! discards are DISCARDs on the queue's own queue pair, held against its other requests as the
//! engine holds them.
//!
//! `bssplit` draws each I/O's length by its share (one more draw per I/O, only with more than
//! one size); offsets are multiples of the smallest. `rate_iops`/`rate` pace the job: an I/O
//! drawn before its time is held, and with nothing in flight the job sleeps until it is due.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use rblk_initiator::engine::{Data, Finished, IoOp, Request};
use rblk_initiator::{Buffer, Direction, Done, Lane, Queue};

use crate::log::Sample;
use crate::pattern::{self, Mismatch};
use crate::rng::Rng;
use crate::spec::Plan;
use crate::stats::{DirStats, Live, ThreadUsage, DIRS, READ, TRIM, WRITE};
use crate::{Error, Result};

/// A `user_data` bit: check the read's blocks against the pattern.
const CHECK: u64 = 1 << 32;
/// The slot index in `user_data`.
const SLOT: u64 = u32::MAX as u64;
/// Longest wait for one completion before the run fails.
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// Mismatches remembered (and printed) per job; all are counted.
pub(crate) const MISMATCHES_KEPT: usize = 10;

/// What the main thread hears from jobs.
#[derive(Debug)]
pub(crate) enum Event {
    /// `--log`: the job's figures so far, at an interval boundary or the window's end.
    Sample(Box<Sample>),
    /// The job's measured phase is over (the verify read-back may follow).
    Measured(u32),
    /// The job's thread ends (sent on drop, so also on errors and panics).
    Finished(u32),
}

/// What every job shares with the main thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) start: Barrier,
    /// Set by a failing job: the others stop submitting.
    pub(crate) abort: AtomicBool,
    pub(crate) live: Vec<Live>,
}

/// Verification results of a job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tally {
    pub(crate) blocks: u64,
    pub(crate) mismatches: u64,
    pub(crate) first: Vec<Mismatch>,
    /// Smallest and largest generation seen in good blocks.
    pub(crate) generations: Option<(u64, u64)>,
}

/// A job's results.
#[derive(Debug)]
pub(crate) struct Output {
    /// By direction.
    pub(crate) stats: [DirStats; DIRS],
    /// Length of the measured window.
    pub(crate) window: Duration,
    /// The thread's own resource use over the measured window.
    pub(crate) usage: Option<ThreadUsage>,
    pub(crate) tally: Tally,
}

/// Units of a slice written (and completed) in this run, for verification.
#[derive(Debug)]
struct Bitmap(Vec<u64>);

impl Bitmap {
    fn new(bits: u64) -> Bitmap {
        Bitmap(vec![0; bits.div_ceil(64) as usize])
    }
    fn set(&mut self, i: u64) {
        self.0[(i / 64) as usize] |= 1 << (i % 64);
    }
    fn get(&self, i: u64) -> bool {
        self.0[(i / 64) as usize] & (1 << (i % 64)) != 0
    }
    /// The first set bit at or after `from`.
    fn next_set(&self, from: u64) -> Option<u64> {
        let mut w = (from / 64) as usize;
        let mut bits = *self.0.get(w)? & (u64::MAX << (from % 64));
        loop {
            if bits != 0 {
                return Some(w as u64 * 64 + u64::from(bits.trailing_zeros()));
            }
            w += 1;
            bits = *self.0.get(w)?;
        }
    }
}

/// fio's `rate_iops` and `rate` for one job: I/O `n` of a direction may start at `n / iops`
/// seconds after the job's start, and once the bytes before it took their time at the byte
/// rate. A job that is behind catches up (as fio's linear rate process does).
#[derive(Debug)]
struct Pace {
    start: Instant,
    iops: [Option<u64>; 2],
    bytes: [Option<u64>; 2],
    ios: [u64; 2],
    moved: [u64; 2],
}

impl Pace {
    /// When the next I/O of direction `d` (read or write) may start.
    fn due(&self, d: usize) -> Instant {
        let after = |n: u64, per_s: u64| {
            Duration::from_nanos((u128::from(n) * 1_000_000_000 / u128::from(per_s)).min(u128::from(u64::MAX)) as u64)
        };
        let mut at = self.start;
        if let Some(r) = self.iops[d] {
            at = at.max(self.start + after(self.ios[d], r));
        }
        if let Some(b) = self.bytes[d] {
            at = at.max(self.start + after(self.moved[d], b));
        }
        at
    }

    fn issued(&mut self, d: usize, len: u64) {
        self.ios[d] += 1;
        self.moved[d] += len;
    }
}

/// The I/O sizes of a direction, by cumulative share: `(len, up to this percent)`.
type Sizes = Vec<(u32, u8)>;

struct Completed {
    /// Its direction's index ([`DIRS`]).
    dir: usize,
    len: u64,
    sent: Instant,
}

/// Where a job's I/Os go: its queue (reads and writes), or an engine lane over it (discards).
/// One per job, made once: the queue is not boxed, being on every I/O's path.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Io {
    Queue(Queue),
    Lane {
        lane: Box<Lane>,
        /// What the last wait handed back.
        finished: Vec<Finished>,
        /// Each slot's offset, for errors.
        offsets: Vec<u64>,
    },
}

/// Sends [`Event::Finished`] when the job's thread ends, however it ends.
struct FinishGuard<'a>(u32, &'a Sender<Event>);

impl Drop for FinishGuard<'_> {
    fn drop(&mut self) {
        let _ = self.1.send(Event::Finished(self.0));
    }
}

/// A job, ready to run on its own thread.
#[derive(Debug)]
pub(crate) struct Job {
    index: u32,
    io: Io,
    bufs: Vec<Buffer>,
    slots: Vec<u32>,
    sent: Vec<Instant>,
    done: Vec<Done>,
    depth: u32,
    outstanding: u32,
    /// Bytes of the I/Os in flight.
    in_flight: u64,
    /// The smallest I/O: offsets are multiples of it, trims and the verify read-back use it.
    min: u64,
    /// Reads' and writes' sizes (`bs`, or fio's `bssplit`).
    sizes: [Sizes; 2],
    block: usize,
    base: u64,
    /// Bytes of the job's slice.
    slice: u64,
    rng: Rng,
    /// The next sequential offset in the slice.
    cursor: u64,
    /// `rate_iops`, `rate`.
    pace: Option<Pace>,
    /// An I/O drawn but held back by the pace: `(direction, offset, len)`.
    held: Option<(usize, u64, u32)>,
    read_percent: u8,
    random: bool,
    verify: bool,
    /// Generation written.
    generation: u64,
    /// Generation reads expect (`None`: any).
    expect: Option<u64>,
    /// Units written this run; present when verifying a workload that writes.
    written: Option<Bitmap>,
    /// One I/O's bytes, for patterns (empty without --verify).
    scratch: Vec<u8>,
    stats: [DirStats; DIRS],
    tally: Tally,
    /// Every I/O is a discard (`--rw trim` and `randtrim`).
    trims: bool,
    /// `--log-interval`, with `--log`.
    log_interval: Option<Duration>,
}

impl Job {
    /// Prepares job `index` of `plan` on `q`: takes every buffer of its pool, sizes every table.
    pub(crate) fn new(
        index: u32,
        q: Queue,
        plan: &Plan,
        generation: u64,
        expect: Option<u64>,
        log_interval: Option<Duration>,
    ) -> Result<Job> {
        let spec = &plan.spec;
        let depth = spec.iodepth;
        let trims = spec.workload.trims();
        // Discards move no data: no buffers.
        let bufs = (0..if trims { 0 } else { depth })
            .map(|_| q.alloc_buffer())
            .collect::<rblk_initiator::Result<Vec<_>>>()
            .map_err(Error::initiator(format!("taking the buffers of job {index}'s queue")))?;
        let io = if trims {
            let lane = Box::new(Lane::over(q));
            if !lane.discards() {
                return Err(Error::Invalid(format!(
                    "--rw {}: the target does not support DISCARD (an older rblk-target)",
                    spec.workload
                )));
            }
            Io::Lane { lane, finished: Vec::with_capacity(depth as usize), offsets: vec![0; depth as usize] }
        } else {
            Io::Queue(q)
        };
        let verify = spec.verify;
        let sizes = std::array::from_fn(|d| {
            let given = spec.bssplit.as_ref().map_or_else(|| vec![(spec.bs, 100)], |b| b.sizes(d, spec.bs));
            let mut sum = 0u8;
            given
                .into_iter()
                .filter(|&(_, p)| p > 0)
                .map(|(len, p)| {
                    sum += p;
                    (len as u32, sum)
                })
                .collect()
        });
        let pace = spec.rate.is_set().then(|| Pace {
            start: Instant::now(),
            iops: spec.rate.iops,
            bytes: spec.rate.bytes,
            ios: [0; 2],
            moved: [0; 2],
        });
        let seed = spec.seed ^ u64::from(index + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Ok(Job {
            index,
            io,
            bufs,
            slots: (0..depth).rev().collect(),
            sent: vec![Instant::now(); depth as usize],
            done: std::iter::repeat_with(Done::default).take(depth as usize).collect(),
            depth,
            outstanding: 0,
            in_flight: 0,
            min: spec.min_bs(),
            sizes,
            block: plan.geometry.block_size as usize,
            base: plan.base(index),
            slice: plan.slice,
            rng: Rng::new(seed),
            cursor: 0,
            pace,
            held: None,
            read_percent: spec.read_percent(),
            random: spec.workload.is_random(),
            verify,
            generation,
            expect,
            written: (verify && spec.workload.writes()).then(|| Bitmap::new(plan.units())),
            scratch: if verify { vec![0; spec.max_bs() as usize] } else { Vec::new() },
            stats: std::array::from_fn(|_| DirStats::new()),
            tally: Tally::default(),
            trims,
            log_interval,
        })
    }

    /// Waits for the start, runs the measured phase (reporting [`Event::Measured`]), then the
    /// verify read-back if any. On an error the other jobs are told to stop.
    pub(crate) fn run(mut self, plan: &Plan, shared: &Shared, events: &Sender<Event>) -> Result<Output> {
        let _finished = FinishGuard(self.index, events);
        shared.start.wait();
        let result = self.measured(plan, shared, events).and_then(|measured| {
            let _ = events.send(Event::Measured(self.index));
            if self.written.is_some() {
                self.read_back(shared)?;
            }
            Ok(measured)
        });
        match result {
            Ok((window, usage)) => Ok(Output { stats: self.stats, window, usage, tally: self.tally }),
            Err(e) => {
                shared.abort.store(true, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// The workload, until the runtime passed or the size is transferred, whichever is first.
    /// Returns the length of the measured window (after the ramp) and the thread's resource use
    /// over it. With `--log`, sends a [`Sample`] after the first reaped batch past each interval
    /// boundary and one at the window's end.
    fn measured(
        &mut self,
        plan: &Plan,
        shared: &Shared,
        events: &Sender<Event>,
    ) -> Result<(Duration, Option<ThreadUsage>)> {
        let live = &shared.live[self.index as usize];
        let start = Instant::now();
        let ramp_end = start + plan.spec.ramp;
        let stop = plan.spec.stop();
        let end = stop.runtime.map(|d| ramp_end + d);
        let target = stop.bytes.unwrap_or(u64::MAX);
        if let Some(p) = &mut self.pace {
            p.start = start;
        }
        // Two getrusage calls per job: at the window's start and at its end.
        let mut usage_start = None;
        // Bytes completed in the measured window.
        let mut measured = 0u64;
        let mut last = ramp_end;
        let mut next_sample = self.log_interval.map(|i| ramp_end + i);
        loop {
            let now = Instant::now();
            let ramping = now < ramp_end;
            if !ramping && usage_start.is_none() {
                usage_start = Some(ThreadUsage::now());
            }
            let open = !shared.abort.load(Ordering::Relaxed) && end.is_none_or(|e| now < e);
            let mut paced = None;
            while open && self.outstanding < self.depth && (ramping || measured + self.in_flight < target) {
                let (dir, offset, len) = match self.held.take() {
                    Some(op) => op,
                    None => self.next_op(),
                };
                if let Some(p) = &mut self.pace {
                    let due = p.due(dir);
                    if due > now {
                        self.held = Some((dir, offset, len));
                        paced = Some(due);
                        break;
                    }
                    p.issued(dir, u64::from(len));
                }
                let check = self.verify && dir == READ && self.all_written(offset, len);
                self.submit(dir, offset, len, check, now)?;
            }
            if self.outstanding == 0 {
                match paced {
                    // Nothing in flight, the next I/O not due yet: sleep until it is (briefly
                    // at a time, so that an abort or the end is seen).
                    Some(due) => {
                        let until = end.map_or(due, |e| due.min(e));
                        std::thread::sleep(until.saturating_duration_since(now).min(Duration::from_millis(50)));
                        continue;
                    }
                    None => break,
                }
            }
            let k = self.wait(now)?;
            let t = Instant::now();
            let in_window = t >= ramp_end && end.is_none_or(|e| t <= e);
            let (mut ios, mut bytes) = ([0u64; DIRS], [0u64; DIRS]);
            for i in 0..k {
                let c = self.complete(i)?;
                let d = c.dir;
                ios[d] += 1;
                bytes[d] += c.len;
                if in_window {
                    self.stats[d].record(t - c.sent, c.len);
                    measured += c.len;
                    last = t;
                }
            }
            live.add(ios, bytes);
            if let (Some(next), Some(interval)) = (next_sample, self.log_interval) {
                if in_window && t >= next {
                    self.sample(events, t - ramp_end);
                    // A stall may have passed several boundaries: the next one is after `t`.
                    let behind = (t - next).as_nanos() / interval.as_nanos();
                    next_sample = Some(next + interval * (behind as u32 + 1));
                }
            }
        }
        let usage = match (usage_start.flatten(), ThreadUsage::now()) {
            (Some(a), Some(b)) => Some(b.since(&a)),
            _ => None,
        };
        // Ended by the size: until the last I/O; by the runtime: the whole runtime.
        let window = match end {
            Some(e) if measured < target => e - ramp_end,
            _ => last - ramp_end,
        };
        if self.log_interval.is_some() {
            self.sample(events, window);
        }
        Ok((window, usage))
    }

    /// Sends the figures so far (a copy: once per interval, not per I/O).
    fn sample(&self, events: &Sender<Event>, at: Duration) {
        let stats = self.stats.clone();
        let _ = events.send(Event::Sample(Box::new(Sample { job: self.index, at, stats })));
    }

    /// Reads back every unit this job wrote and checks it.
    fn read_back(&mut self, shared: &Shared) -> Result<()> {
        let live = &shared.live[self.index as usize];
        let Some(written) = self.written.take() else { return Ok(()) };
        let mut next = written.next_set(0);
        loop {
            let now = Instant::now();
            while self.outstanding < self.depth && !shared.abort.load(Ordering::Relaxed) {
                let Some(unit) = next else { break };
                self.submit(READ, self.base + unit * self.min, self.min as u32, true, now)?;
                next = written.next_set(unit + 1);
            }
            if self.outstanding == 0 {
                return Ok(());
            }
            let k = self.wait(now)?;
            for i in 0..k {
                self.complete(i)?;
            }
            live.add([k as u64, 0, 0], [k as u64 * self.min, 0, 0]);
        }
    }

    /// The next I/O: its direction's index, its offset in the volume and its length.
    fn next_op(&mut self) -> (usize, u64, u32) {
        let dir = match self.read_percent {
            _ if self.trims => TRIM,
            100 => READ,
            0 => WRITE,
            p => {
                if self.rng.below(100) < u64::from(p) {
                    READ
                } else {
                    WRITE
                }
            }
        };
        let len = match self.sizes.get(dir).map(Vec::as_slice) {
            None => self.min as u32,
            Some([(len, _)]) => *len,
            Some(sizes) => {
                let r = self.rng.below(100) as u8;
                sizes.iter().find(|&&(_, upto)| r < upto).map_or(sizes[sizes.len() - 1].0, |&(len, _)| len)
            }
        };
        let offset = if self.random {
            // Every offset, a multiple of the smallest I/O, at which this one fits.
            self.rng.below((self.slice - u64::from(len)) / self.min + 1) * self.min
        } else {
            if self.cursor + u64::from(len) > self.slice {
                self.cursor = 0;
            }
            let o = self.cursor;
            self.cursor += u64::from(len);
            o
        };
        (dir, self.base + offset, len)
    }

    /// Whether this job wrote (in this run) every unit of `len` bytes at `offset`, or does not
    /// keep track (then every read is checked).
    fn all_written(&self, offset: u64, len: u32) -> bool {
        let Some(w) = &self.written else { return true };
        let first = (offset - self.base) / self.min;
        (first..first + u64::from(len) / self.min).all(|u| w.get(u))
    }

    /// The error of this job doing `what`. Call it inside `map_err(|e| ...)` so the message is
    /// only formatted on failure: the hot path does not allocate.
    fn io_err(&self, what: String, source: rblk_initiator::Error) -> Error {
        Error::Job { job: self.index, what, source: Box::new(source) }
    }

    fn submit(&mut self, dir: usize, offset: u64, bs: u32, check: bool, now: Instant) -> Result<()> {
        // Fewer than `depth` outstanding: a slot (and for data, its buffer) is free.
        let slot = self.slots.pop().expect("a free slot below the queue depth");
        let mut tag = u64::from(slot);
        let submitted = match (&mut self.io, dir) {
            (Io::Lane { lane, offsets, .. }, TRIM) => {
                offsets[slot as usize] = offset;
                let len = u64::from(bs);
                lane.submit(Request { tag, op: IoOp::Discard, offset, len, fua: false, data: Data::None });
                Ok(())
            }
            (Io::Queue(q), READ) => {
                if check {
                    tag |= CHECK;
                }
                let buf = self.bufs.pop().expect("a free buffer below the queue depth");
                q.submit_read_buf(offset, bs, buf, tag)
            }
            (Io::Queue(_), _) => {
                let buf = self.bufs.pop().expect("a free buffer below the queue depth");
                if self.verify {
                    let data = &mut self.scratch[..bs as usize];
                    pattern::fill_blocks(data, offset, self.generation, self.block);
                    buf.write_at(0, &self.scratch[..bs as usize])
                        .map_err(|e| self.io_err(format!("filling the pattern for {offset}"), e))?;
                }
                let Io::Queue(q) = &mut self.io else { unreachable!("matched above") };
                q.submit_write_buf(offset, bs, buf, tag)
            }
            (Io::Lane { .. }, _) => unreachable!("a trim workload's job only discards"),
        };
        let what = crate::stats::DIR_NAMES[dir];
        submitted.map_err(|e| self.io_err(format!("submitting a {what} of {bs} bytes at offset {offset}"), e))?;
        self.sent[slot as usize] = now;
        self.outstanding += 1;
        self.in_flight += u64::from(bs);
        Ok(())
    }

    /// Waits for at least one completion (posting what is staged first).
    fn wait(&mut self, now: Instant) -> Result<usize> {
        let waited = match &mut self.io {
            Io::Queue(q) => q.wait(&mut self.done, now + WAIT_LIMIT),
            Io::Lane { lane, finished, .. } => {
                finished.clear();
                lane.wait().map(|()| {
                    finished.extend(std::iter::from_fn(|| lane.next()));
                    finished.len()
                })
            }
        };
        waited.map_err(|e| self.io_err(format!("waiting for completions ({} outstanding)", self.outstanding), e))
    }

    /// Takes the `i`-th reaped completion: its buffer and slot go back to the free lists, a
    /// failed I/O fails the job, a read marked for checking is verified.
    fn complete(&mut self, i: usize) -> Result<Completed> {
        if let Io::Lane { finished, offsets, .. } = &mut self.io {
            let f = &mut finished[i];
            let slot = f.tag as u32;
            let result = std::mem::replace(&mut f.result, Ok(()));
            let offset = offsets[slot as usize];
            self.slots.push(slot);
            self.outstanding -= 1;
            let (len, sent) = (self.min, self.sent[slot as usize]);
            self.in_flight -= len;
            result.map_err(|source| self.io_err(format!("discard of {len} bytes at offset {offset}"), source))?;
            return Ok(Completed { dir: TRIM, len, sent });
        }
        let d = &mut self.done[i];
        let slot = (d.user_data & SLOT) as u32;
        let check = d.user_data & CHECK != 0;
        let (dir, offset, len) = (d.dir, d.offset, u64::from(d.len));
        // The _buf submissions hand their buffer back, failed or not.
        let buf = d.take_buffer().expect("a _buf submission's completion holds its buffer");
        let result = std::mem::replace(&mut d.result, Ok(()));
        self.slots.push(slot);
        self.outstanding -= 1;
        self.in_flight -= len;
        let sent = self.sent[slot as usize];
        if let Err(source) = result {
            self.bufs.push(buf);
            return Err(self.io_err(format!("{dir} of {len} bytes at offset {offset}"), source));
        }
        let dir = if dir == Direction::Read { READ } else { WRITE };
        if check {
            let copied = buf.read_at(0, &mut self.scratch[..len as usize]);
            self.bufs.push(buf);
            copied.map_err(|e| self.io_err(format!("copying the data read at {offset}"), e))?;
            self.check(offset, len as usize);
        } else {
            self.bufs.push(buf);
        }
        if dir == WRITE {
            if let Some(w) = self.written.as_mut() {
                let first = (offset - self.base) / self.min;
                for u in first..first + len / self.min {
                    w.set(u);
                }
            }
        }
        Ok(Completed { dir, len, sent })
    }

    fn check(&mut self, offset: u64, len: usize) {
        for (i, block) in self.scratch[..len].chunks_exact(self.block).enumerate() {
            let at = offset + (i * self.block) as u64;
            self.tally.blocks += 1;
            match pattern::check(block, at, self.expect) {
                Ok(g) => {
                    let (lo, hi) = self.tally.generations.unwrap_or((g, g));
                    self.tally.generations = Some((lo.min(g), hi.max(g)));
                }
                Err(m) => {
                    self.tally.mismatches += 1;
                    if self.tally.first.len() < MISMATCHES_KEPT {
                        eprintln!("rblk-bench: verify: job {}: {m}", self.index);
                        self.tally.first.push(m);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap() {
        let mut b = Bitmap::new(200);
        assert_eq!(b.next_set(0), None);
        for i in [0, 63, 64, 130, 199] {
            b.set(i);
        }
        assert!(b.get(63) && b.get(130) && !b.get(1));
        let mut seen = Vec::new();
        let mut at = b.next_set(0);
        while let Some(i) = at {
            seen.push(i);
            at = b.next_set(i + 1);
        }
        assert_eq!(seen, [0, 63, 64, 130, 199]);
        assert_eq!(b.next_set(200), None);
    }
}
