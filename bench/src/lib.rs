//! rblk-bench: a fio-style load generator for rblk volumes, on the initiator library.
//!
//! A run opens one session and the volume (read-only for read workloads), then gives each of
//! `--jobs` threads its own [`Queue`](rblk_initiator::Queue) of the session (`queue_with(iodepth,
//! bs)`) and its own slice of the volume (the volume divided by the number of jobs, rounded down
//! to whole I/Os). Every job keeps `iodepth` I/Os in flight: sequential workloads walk their
//! slice and wrap, random ones draw bs-aligned offsets uniformly from it (SplitMix64 seeded by
//! `--seed` and the job number). A run measures for `--runtime` (default 10 s) or until each
//! job moved `--size` bytes, whichever comes first (`--time_based`: the whole runtime, `--size`
//! then only bounds each job's region), after an optional `--ramp_time`.
//!
//! # Speaking fio
//!
//! The command line takes fio's option names, and a fio job file instead of a URI (`[global]` and
//! job sections with `filename=rblk://...`; sections run together, `stonewall` starts a new
//! group that waits for the ones before it; fio's options that do not apply, such as
//! `ioengine` and `direct=1`, are noted on stderr and ignored, and every error names the file
//! and line). `rate_iops` and `rate` ([`Rate`]) pace each job thread, reads and writes apart;
//! `bssplit` ([`BsSplit`]) draws each I/O's size by its share. [`execute`] is the binary's work, callable
//! in-process. `-o json` and `-o json+` write fio's JSON layout ([`fio`] says how rblk-bench's
//! figures map onto fio's fields); the deprecated `--json FILE` still writes rblk-bench's
//! earlier layout, the [`Report`] serialized.
//!
//! ```no_run
//! use rblk_bench::{Run, Spec, Workload};
//! use rblk_initiator::Options;
//!
//! let spec = Spec { workload: Workload::RandWrite, iodepth: 16, verify: true, ..Spec::default() };
//! let report = Run::default().run("rblk://10.0.0.1/vol0", &Options::default(), &spec)?;
//! print!("{}", report.text());
//! assert!(report.passed());
//! # Ok::<(), rblk_bench::Error>(())
//! ```
//!
//! # The hot path
//!
//! Nothing is allocated per I/O: each job takes all of its queue's registered buffers up front
//! and submits them with the zero-copy `submit_read_buf` / `submit_write_buf` (only `--verify`
//! copies its patterns in and out). Submissions are staged and posted together (the queue rings
//! one doorbell per 16), and each wait reaps every completion available. Latency runs from the
//! submit call to the reap that returned the completion, with one clock read per submitted batch
//! and one per reaped batch, into `hdrhistogram`s (nanoseconds, 3 significant figures), reported
//! in microseconds.
//!
//! # Verification (`--verify`)
//!
//! Every block written carries the pattern of [`pattern`]: magic, its own volume offset, a
//! generation number, a checksum, and filler derived from offset and generation.
//!
//! - `write`, `randwrite`: blocks are written with generation `--generation N` (default: a
//!   fresh number, microseconds since the epoch, printed in the report). After the measured
//!   window each job reads back every block it wrote and checks it, offset and generation
//!   included (this read-back is not part of the figures).
//! - `randrw`: as above; in addition, reads of blocks the job already wrote in this run are
//!   checked as they complete (reads of blocks not yet written in this run are not).
//! - `read`, `randread`: every block read must hold the pattern for its offset; with
//!   `--generation N` it must be generation N, otherwise any generation is accepted (the
//!   report shows the range found).
//!
//! Any bad block (zeros, foreign data, torn, misplaced, or stale) is counted, the first ten per
//! job are printed with their offsets, and [`Report::passed`] turns false (the binary exits 1).
//!
//! # Time series (`--log`)
//!
//! [`Logs`] writes fio-format IOPS, bandwidth and latency logs per job and a HdrHistogram
//! interval log, one interval per `--log-interval`: each job sends a copy of its own
//! histograms to the main thread at the first reaped batch past an interval boundary (the hot
//! path only compares a timestamp it already took), and the main thread writes the difference
//! to the job's previous copy. Use [`Run::run_with_logs`], then [`Logs::commit`]: the files
//! appear once the run succeeded, and a failed run leaves the previous ones as they were (as
//! `--output` does).
//!
//! # Threads and cleanup
//!
//! [`Run::run`] blocks: the calling thread starts the jobs, reports progress to its [`Slot`] of
//! a [`Progress`] and takes fio's bandwidth and IOPS samples (twice a second, from the jobs'
//! counters), takes the target's STATS and keeps the volume's own connection alive; the jobs'
//! threads end before it returns, and the volume is closed after every queue is gone. A job
//! file's concurrent sections each run on a thread of their own, with their own session.
//!
//! # JSON
//!
//! ```text
#![doc = include_str!("json.md")]
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cli;
mod command;
mod error;
pub mod fio;
mod job;
mod jobfile;
mod log;
pub mod pattern;
mod pending;
mod progress;
mod report;
mod rng;
mod run;
mod spec;
mod stats;

pub use cli::{Args, OutputFormat};
pub use command::{execute, Env, Section, Sink};
pub use error::{Error, Result};
pub use jobfile::{IGNORED as JOB_FILE_IGNORED, OPTIONS as JOB_FILE_OPTIONS};
pub use log::{check_interval, log_paths, Logs, DEFAULT_LOG_INTERVAL, MAX_LOG_INTERVAL, MIN_LOG_INTERVAL};
pub use progress::{Progress, Slot};
pub use rblk_initiator::parse_duration;
pub use report::{
    CpuUse, DirReport, JobInfo, Latency, MismatchReport, Report, ThreadReport, Totals, VerifyReport, VolumeInfo,
};
pub use run::Run;
pub use spec::{BsSplit, Plan, Rate, Spec, Stop, Workload, MAX_IODEPTH, MAX_JOBS};
