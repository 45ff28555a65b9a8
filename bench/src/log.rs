//! `--log PREFIX`: time series of every job's measured window, for pictures.
//!
//! Each job sends a [`Sample`] (a copy of its own cumulative [`DirStats`]) to the main thread
//! when the first reaped batch after an interval boundary completes, and once more at the end of
//! its measured window. The I/O path does nothing more than compare the batch's timestamp with
//! the next boundary: no lock, no atomic, no extra histogram per I/O. The main thread subtracts
//! a job's previous sample from its new one and writes that interval:
//!
//! - fio's log format (as `write_iops_log`, `write_bw_log`, `write_lat_log` with
//!   `log_avg_msec`): `PREFIX_iops.N.log`, `PREFIX_bw.N.log`, `PREFIX_lat.N.log` for job N
//!   (1-based, as fio numbers them), lines `msec, value, direction, blocksize, offset`. msec is
//!   the end of the interval since the job's measured window began; value is IOPS, KiB/s, or the
//!   mean latency in ns over the interval; direction 0 read, 1 write, 2 trim; blocksize `--bs`; offset 0.
//!   IOPS and bandwidth lines are written for every direction the workload does, zeros included;
//!   latency lines only for intervals with I/Os of that direction.
//! - `PREFIX.hlog`: a HdrHistogram interval log (V2 compressed histograms, latencies in ns),
//!   one histogram per interval, job and direction, tagged `read.N` / `write.N` / `trim.N`, readable by
//!   HdrHistogram's HistogramLogProcessor or HistogramLogAnalyzer.

use std::io::{self, BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
use hdrhistogram::serialization::V2DeflateSerializer;

use crate::pending::Pending;
use crate::spec::Spec;
use crate::stats::{DirStats, DIRS, DIR_NAMES};
use crate::{Error, Result};

/// The shortest `--log-interval`: each sample copies the job's histograms (about 200 KiB).
pub const MIN_LOG_INTERVAL: Duration = Duration::from_millis(10);
/// The longest `--log-interval`: an hour.
pub const MAX_LOG_INTERVAL: Duration = Duration::from_secs(3600);
/// `--log` without `--log-interval`: one line per second, as the progress line.
pub const DEFAULT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// What a job sends at an interval boundary: its cumulative figures so far.
#[derive(Debug)]
pub(crate) struct Sample {
    pub(crate) job: u32,
    /// Since the job's measured window began.
    pub(crate) at: Duration,
    /// By direction.
    pub(crate) stats: [DirStats; DIRS],
}

/// One log file being written: in place once the run succeeded ([`Logs::commit`]), removed if
/// it did not ([`Pending`]).
#[derive(Debug)]
struct Out {
    path: PathBuf,
    file: BufWriter<Pending>,
}

impl Out {
    fn create(path: PathBuf) -> Result<Out> {
        match Pending::create(&path) {
            Ok(f) => Ok(Out { path, file: BufWriter::new(f) }),
            Err(source) => Err(Error::Log { what: "creating", path, source }),
        }
    }

    fn commit(self) -> Result<()> {
        let Out { path, file } = self;
        file.into_inner()
            .map_err(std::io::IntoInnerError::into_error)
            .and_then(Pending::commit)
            .map_err(|source| Error::Log { what: "writing", path, source })
    }
}

#[derive(Debug)]
struct JobLogs {
    iops: Out,
    bw: Out,
    lat: Out,
    /// The previous sample's time and figures.
    prev: (Duration, [DirStats; DIRS]),
}

/// The open log files of a run: create them before the run ([`Logs::create`]), hand them to
/// [`Run::run_with_logs`](crate::Run::run_with_logs), then put them in place
/// ([`Logs::commit`]).
#[derive(Debug)]
pub struct Logs {
    interval: Duration,
    bs: u64,
    /// Directions the workload does ([`Spec::dirs`]).
    dirs: [bool; DIRS],
    jobs: Vec<JobLogs>,
    hlog: Out,
    /// The first write error; the run goes on and [`Logs::finish`] returns it.
    error: Option<Error>,
}

/// The log files `PREFIX` names for `jobs` jobs, in the order [`Logs::create`] makes them.
pub fn log_paths(prefix: &Path, jobs: u32) -> Vec<PathBuf> {
    let mut paths = Vec::new();
    for n in 1..=jobs {
        for kind in ["iops", "bw", "lat"] {
            paths.push(with_suffix(prefix, &format!("_{kind}.{n}.log")));
        }
    }
    paths.push(with_suffix(prefix, ".hlog"));
    paths
}

fn with_suffix(prefix: &Path, suffix: &str) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Checks `--log-interval`.
pub fn check_interval(interval: Duration) -> Result<()> {
    rblk_initiator::check_duration(interval, MIN_LOG_INTERVAL, Some(MAX_LOG_INTERVAL))
        .map_err(|e| Error::Invalid(format!("--log-interval: {e}")))
}

impl Logs {
    /// Creates (truncating) every log file of `spec`'s jobs under `prefix`, sampled every
    /// `interval`. Fails on a bad interval or the first file that cannot be created.
    pub fn create(prefix: &Path, interval: Duration, spec: &Spec) -> Result<Logs> {
        check_interval(interval)?;
        let mut paths = log_paths(prefix, spec.jobs).into_iter();
        let mut jobs = Vec::with_capacity(spec.jobs as usize);
        for _ in 0..spec.jobs {
            let mut next = || Out::create(paths.next().expect("three logs per job"));
            jobs.push(JobLogs {
                iops: next()?,
                bw: next()?,
                lat: next()?,
                prev: (Duration::ZERO, std::array::from_fn(|_| DirStats::new())),
            });
        }
        let hlog = Out::create(paths.next().expect("the hlog"))?;
        Ok(Logs { interval, bs: spec.bs, dirs: spec.dirs(), jobs, hlog, error: None })
    }

    /// Refuses logs made for another number of jobs or another workload than `spec`'s.
    pub(crate) fn check(&self, spec: &Spec) -> Result<()> {
        if self.jobs.len() != spec.jobs as usize || self.bs != spec.bs || self.dirs != spec.dirs() {
            return Err(Error::Invalid("the logs were made for another --jobs, --bs or --rw".into()));
        }
        Ok(())
    }

    /// The sampling interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The files being written.
    pub fn paths(&self) -> Vec<&Path> {
        let mut v = Vec::new();
        for j in &self.jobs {
            v.extend([j.iops.path.as_path(), j.bw.path.as_path(), j.lat.path.as_path()]);
        }
        v.push(&self.hlog.path);
        v
    }

    /// Writes the hlog's header: the measured window starts about now.
    pub(crate) fn begin(&mut self, start: SystemTime, comment: &str) {
        let r = IntervalLogWriterBuilder::new()
            .add_comment(comment)
            .add_comment("latencies in nanoseconds; tags read.N and write.N: job N (1-based), direction")
            .with_start_time(start)
            .with_base_time(start)
            .begin_log_with(&mut self.hlog.file, &mut V2DeflateSerializer::new())
            .map(drop);
        if let Err(source) = r {
            self.fail("writing", &self.hlog.path.clone(), source);
        }
    }

    fn fail(&mut self, what: &'static str, path: &Path, source: io::Error) {
        if self.error.is_none() {
            self.error = Some(Error::Log { what, path: path.to_owned(), source });
        }
    }

    /// Writes the interval from the job's previous sample to this one.
    pub(crate) fn record(&mut self, s: Sample) {
        if let Err((what, path, e)) = self.write(s) {
            self.fail(what, &path, e);
        }
    }

    fn write(&mut self, s: Sample) -> std::result::Result<(), (&'static str, PathBuf, io::Error)> {
        let n = s.job + 1;
        let j = &mut self.jobs[s.job as usize];
        let (t0, prev) = &j.prev;
        let dt = s.at.saturating_sub(*t0);
        if dt.is_zero() {
            return Ok(());
        }
        let ms = s.at.as_millis();
        let secs = dt.as_secs_f64();
        let bs = self.bs;
        for d in 0..DIRS {
            if !self.dirs[d] {
                continue;
            }
            let (now, before) = (&s.stats[d], &prev[d]);
            let ios = now.ios - before.ios;
            let bytes = now.bytes - before.bytes;
            let iops = (ios as f64 / secs).round() as u64;
            let kib_s = (bytes as f64 / 1024.0 / secs).round() as u64;
            let io = |o: &mut Out, v: u64| {
                writeln!(o.file, "{ms}, {v}, {d}, {bs}, 0").map_err(|e| ("writing", o.path.clone(), e))
            };
            io(&mut j.iops, iops)?;
            io(&mut j.bw, kib_s)?;
            if ios > 0 {
                let mut h = now.hist.clone();
                // `before` is an earlier state of the same histogram: every count only grew.
                h.subtract(&before.hist).expect("a later histogram holds the earlier one");
                io(&mut j.lat, h.mean().round() as u64)?;
                let name = format!("{}.{n}", DIR_NAMES[d]);
                let tag = Tag::new(&name).expect("no commas or spaces in the tag");
                IntervalLogWriterBuilder::new()
                    .begin_log_with(&mut self.hlog.file, &mut V2DeflateSerializer::new())
                    .and_then(|mut w| {
                        w.write_histogram(&h, *t0, dt, Some(tag)).map_err(|e| match e {
                            hdrhistogram::serialization::interval_log::IntervalLogWriterError::IoError(e) => e,
                            e
                            @ hdrhistogram::serialization::interval_log::IntervalLogWriterError::SerializeError(_) => {
                                io::Error::other(e.to_string())
                            }
                        })
                    })
                    .map_err(|e| ("writing", self.hlog.path.clone(), e))?;
            }
        }
        j.prev = (s.at, s.stats);
        Ok(())
    }

    /// Flushes every file; the first error of the run if any.
    /// Puts every log file in place, once the whole run succeeded: until then each is a
    /// temporary file beside it, and logs dropped without this (a failed run) leave nothing of
    /// their own and the previous run's files as they were.
    pub fn commit(self) -> Result<()> {
        for j in self.jobs {
            for o in [j.iops, j.bw, j.lat] {
                o.commit()?;
            }
        }
        self.hlog.commit()
    }

    pub(crate) fn finish(&mut self) -> Result<()> {
        for j in &mut self.jobs {
            for o in [&mut j.iops, &mut j.bw, &mut j.lat] {
                if let Err(e) = o.file.flush() {
                    if self.error.is_none() {
                        self.error = Some(Error::Log { what: "writing", path: o.path.clone(), source: e });
                    }
                }
            }
        }
        if let Err(e) = self.hlog.file.flush() {
            self.fail("writing", &self.hlog.path.clone(), e);
        }
        self.error.take().map_or(Ok(()), Err)
    }
}
