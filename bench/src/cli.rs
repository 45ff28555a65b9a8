//! The command line: fio's option names (and a job file instead of a URI), the output formats,
//! and the deprecated spellings of earlier versions.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rblk_initiator::Options;

use crate::command::Section;
use crate::jobfile::{self, JobOptions};
use crate::spec::{whole_number, BsSplit, Rate, Spec, Workload, MAX_IODEPTH, MAX_JOBS};
use crate::{Error, Result};

/// What `rblk-bench --help` says first (`-h` says the first line only).
const ABOUT: &str = "Load-test an rblk volume, like fio: jobs of queued one-sided RDMA READs and WRITEs";

const LONG_ABOUT: &str = "\
Load-test an rblk volume, like fio: jobs of queued one-sided RDMA READs and WRITEs.

Each job is a thread with its own queue pair of the session, keeping --iodepth I/Os of --bs bytes \
in flight in its own slice of the volume (the volume divided by --numjobs, at most --size), for \
--runtime or until it moved --size bytes, whichever comes first (--time_based: the whole runtime). \
Progress goes to stderr: one status line redrawn in place on a terminal, a plain line a second \
otherwise, both with the share done and the ETA. The report goes to stdout, or to --output FILE: \
fio-style text (-o normal), or fio's JSON layout (-o json, and -o json+ with the latency bins that \
fio_jsonplus_clat2csv reads).

Instead of a URI, a fio job file: `[global]` and job sections with fio's option names \
(filename=rblk://HOST/VOLUME, fio's `\\:` escaping of colons accepted; rw, rwmixread, rwmixwrite, \
bs, bssplit, rate, rate_iops, iodepth, numjobs, runtime, time_based, size, ramp_time, verify, \
randseed, stonewall, group_reporting, description). Sections run together, as fio runs them; a \
section with stonewall waits for the ones before it. fio options that do not apply to rblk-bench \
(ioengine, direct=1, buffered=0, thread, invalidate, norandommap, randrepeat, fsync_on_close, \
end_fsync, iodepth_batch*, iodepth_low, cpus_allowed*, cpumask, numa_*, clocksource, unlink) are \
accepted with one note each on stderr; direct=0 and buffered=1 (I/O through a page cache, which \
rblk-bench does not have) are refused, as are options it does not know. Errors name the file and \
line (jobs.fio:7: ...). With a job file the command line takes no job options.

--rate-iops and --rate (fio's rate_iops and rate) cap each job thread, as fio caps each job: \
--numjobs 4 --rate-iops 1000 does up to 4000 I/Os a second. `R,W` paces reads and writes \
separately (either may be empty: no limit; one value caps each direction); 0 is no limit. A job \
behind its pace catches up. --bssplit (fio's bssplit) draws each I/O's size: 4k/75:64k/25 makes \
three of four I/Os 4 KiB; a size without a share gets an equal part of what the others leave; \
`READS,WRITES` splits the directions apart. Offsets are multiples of the smallest size. bssplit \
overrides --bs; a trim part (third field) is not supported yet.

--verify writes a self-describing pattern in every block (its offset, a generation number and a \
checksum). Write workloads (write, randwrite) then read back and check every block they wrote; \
randrw also checks its reads of blocks it already wrote; read workloads check every block against \
the pattern a previous --verify write left (of --generation N if given, else of any generation). \
Any bad block is reported with its offset and the run exits with status 1.

--rw trim and randtrim discard (as fio's): each I/O is one DISCARD of --bs bytes (up to 256 MiB), \
which the target zeroes without moving data; they need a target with discard and take no --verify.

Sizes take 4k, 64k, 1.5M, 1G (k, M, G, T and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB, \
TB powers of 1000, refused unless whole 4096-byte blocks). Durations take ms, s, m, h, d and mixes \
(500ms, 15s, 2m, 1h30m; a bare number is seconds, except for --log-interval's milliseconds).

Deprecated, still working with a notice on stderr: --ramp (use --ramp_time), --json FILE \
(rblk-bench's earlier JSON layout, described below; use -o json --output FILE for fio's).";

/// Exit statuses, as `--help` and the man page give them.
const EXIT_STATUS: &str = "\
Exit status:
  0  the run completed (and --verify found every block good)
  1  the run failed (connecting, opening, an I/O, a file) or --verify found bad blocks
  2  usage: a bad flag, value, URI or job file (or one the volume cannot take)";

/// Load-test an rblk volume, like fio (`rblk-bench --help`).
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The volume (rblk://HOST[:PORT]/VOLUME) or a fio job file.
    #[arg(value_name = "URI|JOBFILE", required_unless_present = "filename", value_parser = target_arg)]
    pub target: Option<String>,
    /// The volume as fio names it, instead of URI.
    ///
    /// The volume as fio names it (fio's `\:` escaping accepted), instead of URI.
    #[arg(long, value_name = "URI", conflicts_with = "target", hide_short_help = true, value_parser = filename_arg)]
    pub filename: Option<String>,
    /// The job's name in the report [default: rblk-bench].
    #[arg(long, value_name = "NAME", hide_short_help = true)]
    pub name: Option<String>,
    /// read, write, randread, randwrite, randrw, trim or randtrim.
    ///
    /// The I/O pattern: read, write, randread, randwrite, randrw (--rwmixread), trim, randtrim
    /// (discards) [default: randread].
    #[arg(long, value_enum, value_name = "PATTERN", alias = "readwrite", hide_possible_values = true)]
    pub rw: Option<Workload>,
    /// Percentage of reads, for --rw randrw [default: 50].
    #[arg(long, value_name = "PCT", value_parser = percent_arg)]
    pub rwmixread: Option<u8>,
    /// Percentage of writes, for --rw randrw (100 - --rwmixread).
    ///
    /// Percentage of writes, for --rw randrw: the complement of --rwmixread. Given both, they
    /// must add up to 100.
    #[arg(long, value_name = "PCT", value_parser = percent_arg, hide_short_help = true)]
    pub rwmixwrite: Option<u8>,
    /// Bytes per I/O [default: 4k].
    ///
    /// Bytes per I/O: a multiple of the volume's block size, at most its largest I/O (a
    /// discard's: 256 MiB) [default: 4k].
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub bs: Option<u64>,
    /// I/O sizes and their shares, as fio's: 4k/75:64k/25.
    ///
    /// I/O sizes and their shares of the I/Os, as fio's bssplit: `4k/75:64k/25`; a size without
    /// a share gets an equal part of what the others leave; `READS,WRITES` splits the
    /// directions. Overrides --bs.
    #[arg(long, value_parser = bssplit_arg, value_name = "SPLIT")]
    pub bssplit: Option<BsSplit>,
    /// I/Os in flight per job, 1 to 1024 [default: 32].
    #[arg(long, value_name = "N", value_parser = iodepth_arg)]
    pub iodepth: Option<u32>,
    /// Threads, each with a queue pair [default: 1].
    ///
    /// Jobs: threads with a queue pair each, on disjoint slices of the volume, 1 to 256
    /// [default: 1].
    #[arg(long, visible_alias = "numjobs", value_name = "N", value_parser = jobs_arg)]
    pub jobs: Option<u32>,
    /// Measure for this long [default: 10s, unless --size].
    ///
    /// Measure for this long, after the ramp (a bare number is seconds) [default: 10s, unless
    /// --size is given].
    #[arg(long, value_parser = runtime_arg, value_name = "DURATION")]
    pub runtime: Option<Duration>,
    /// Run for the whole --runtime even when --size is moved.
    ///
    /// Run for the whole --runtime even when --size is moved (--size then bounds the region).
    #[arg(long = "time_based", alias = "time-based", requires = "runtime", hide_short_help = true)]
    pub time_based: bool,
    /// Bytes per job: its region, and what it moves (fio's size).
    ///
    /// Per job, as fio's size: the region of its slice it works in and, unless --time_based,
    /// the bytes it moves after the ramp; a multiple of --bs.
    #[arg(long, value_parser = nonzero_size_arg, value_name = "SIZE")]
    pub size: Option<u64>,
    /// Cap each job's I/Os per second (R,W: per direction).
    ///
    /// Cap each job thread's I/Os per second, as fio's rate_iops: `N` caps reads and writes
    /// each, `R,W` each direction on its own (an empty one: no limit); 0 is no limit.
    #[arg(long = "rate-iops", alias = "rate_iops", value_name = "IOPS", value_parser = rate_iops_arg)]
    pub rate_iops: Option<[Option<u64>; 2]>,
    /// Cap each job's bytes per second: 10M (R,W: per direction).
    ///
    /// Cap each job thread's bytes per second, as fio's rate: `10M` (powers of 1024, as fio),
    /// `R,W` per direction; 0 is no limit. With --rate-iops both caps hold.
    #[arg(long, value_name = "BYTES", value_parser = rate_arg)]
    pub rate: Option<[Option<u64>; 2]>,
    /// Run this long before measuring [default: 0s].
    ///
    /// Run this long before measuring (a bare number is seconds) [default: 0s].
    #[arg(long = "ramp_time", alias = "ramp-time", value_parser = run_time_arg, value_name = "DURATION", hide_short_help = true)]
    pub ramp_time: Option<Duration>,
    /// Deprecated spelling of --ramp_time.
    #[arg(long, hide = true, value_parser = run_time_arg, value_name = "DURATION", conflicts_with = "ramp_time")]
    pub ramp: Option<Duration>,
    /// Write a self-describing pattern and check every block read.
    ///
    /// Write a self-describing pattern and check every block read (semantics above).
    #[arg(long)]
    pub verify: bool,
    /// With --verify: the generation to write, or the one reads must find.
    ///
    /// With --verify: the generation to write, or the one reads must find [default: writes use
    /// a fresh one (microseconds since the epoch), reads accept any].
    #[arg(long, value_name = "N", requires = "verify", value_parser = whole_arg, hide_short_help = true)]
    pub generation: Option<u64>,
    /// Seed for offsets and the read/write mix [default: 1].
    ///
    /// Seed for offsets and the read/write mix: the same seed repeats the same I/Os [default: 1].
    #[arg(long, alias = "randseed", value_name = "N", value_parser = whole_arg, hide_short_help = true)]
    pub seed: Option<u64>,
    /// normal, json or json+ (fio's layouts).
    ///
    /// The report's format: normal (fio-style text), json (fio's JSON layout) or json+ (with
    /// fio's latency bins).
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = format_arg, default_value = "normal")]
    pub output_format: OutputFormat,
    /// Write the report to FILE, once the run succeeded.
    ///
    /// Write the report to FILE instead of stdout: a temporary file beside it is created before
    /// the run starts (a bad path fails at once) and renamed over FILE once the run succeeded;
    /// a failed run leaves FILE as it was.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// In fio's JSON, one entry per group instead of per job thread.
    ///
    /// In fio's JSON, one entry per group (job file sections between stonewalls) instead of one
    /// per job thread.
    #[arg(long = "group_reporting", alias = "group-reporting", hide_short_help = true)]
    pub group_reporting: bool,
    /// Deprecated: also write rblk-bench's earlier JSON report to FILE (`-`: to stdout, the text
    /// report then to stderr).
    #[arg(long, hide = true, value_name = "FILE", conflicts_with_all = ["output", "output_format"])]
    pub json: Option<PathBuf>,
    /// Write time series (fio's logs, a HdrHistogram log) under PREFIX.
    ///
    /// Write time series of the measured window under PREFIX, created before the run: per job N
    /// (from 1) fio-format PREFIX_iops.N.log, PREFIX_bw.N.log and PREFIX_lat.N.log (lines "msec,
    /// value, direction, blocksize, offset": IOPS, KiB/s, mean latency in ns per interval;
    /// direction 0 read, 1 write), and a HdrHistogram interval log PREFIX.hlog (ns, tags read.N,
    /// write.N). scripts/plot.py draws them. One job section only. Like --output, they appear
    /// once the run succeeded; a failed run leaves earlier ones as they were.
    #[arg(long, value_name = "PREFIX")]
    pub log: Option<PathBuf>,
    /// With --log: one line per this interval [default: 1s].
    ///
    /// With --log: one line per this interval, 10ms to 1h; a bare number is milliseconds, as
    /// fio's log_avg_msec (`250`, `250ms`, `2s`) [default: 1s]. Unlike fio there is no per-I/O
    /// logging: every line averages an interval.
    #[arg(long, value_name = "DURATION", requires = "log", value_parser = log_interval_arg, hide_short_help = true)]
    pub log_interval: Option<Duration>,
    /// No progress on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Key file, for targets that require one.
    ///
    /// Key file, for targets that require one: the target's shared key, or this host's own.
    /// Without it, as rblk: RBLK_KEY_FILE, then /etc/rblk/keys/HOST.key for the target's host
    /// (the first job's), the local target's /var/lib/rblk/target.key (for this host's
    /// addresses only), then /etc/rblk/target.key.
    #[arg(long, value_name = "PATH", help_heading = CONNECTION)]
    pub key_file: Option<PathBuf>,
    /// Connect without any key, even when one is found.
    ///
    /// For a target that serves anyone, which an initiator with a key refuses. Overrides
    /// RBLK_KEY_FILE; not with --key-file.
    #[arg(long, conflicts_with = "key_file", help_heading = CONNECTION, hide_short_help = true)]
    pub no_key: bool,
    /// This host's identity [default: the hostname].
    ///
    /// This host's identity for the target's access lists and per-host keys [default: the
    /// machine's hostname].
    #[arg(long, env = "RBLK_HOST_ID", value_name = "NAME", help_heading = CONNECTION,
          value_parser = |t: &str| rblk_initiator::check_host_id(t).map(|()| t.to_owned()))]
    pub host_id: Option<String>,
    /// Which target the key may be proved to.
    #[command(flatten, next_help_heading = CONNECTION)]
    pub trust: rblk_initiator::TrustArgs,
    /// Device, source address and type of service.
    #[command(flatten, next_help_heading = CONNECTION)]
    pub route: rblk_initiator::RouteArgs,
    /// Give up on each control exchange after this long.
    ///
    /// Give up on each control exchange (connect, open, STATS) after this long (a bare number
    /// is seconds; at most 1 day).
    #[arg(long, value_parser = |t: &str| rblk_initiator::parse_duration_bounded(t, Duration::from_millis(1), Some(rblk_initiator::MAX_TIMEOUT)), default_value = "10s", value_name = "DURATION", help_heading = CONNECTION)]
    pub timeout: Duration,
    /// What a job does when the session loses its target.
    #[command(flatten, next_help_heading = "Reconnect")]
    pub reconnect: rblk_initiator::ReconnectArgs,
}

/// The heading of the options shared with `rblk`: how to reach and trust the target.
const CONNECTION: &str = "Connection";

/// The library's flags (shared with `rblk`, whose help they carry) with a one-line `-h`: the
/// library's text stays the long help. Those not named here are in `--help` only.
const SHORT_HELP: &[(&str, &str)] = &[("device", "Only use this RDMA device (mlx5_0, rxe0)")];

/// The command: clap's from the fields, with the about texts, the exit statuses, and a short
/// `-h` (one line per option, the rarer ones in `--help` only).
fn command() -> clap::Command {
    tune(<Args as clap::Args>::augment_args(clap::Command::new("rblk-bench")))
}

fn tune(cmd: clap::Command) -> clap::Command {
    let library = [
        "target_id",
        "known_targets",
        "allow_v1_target",
        "device",
        "source_addr",
        "tos",
        "memory_windows",
        "wait",
        "poll",
        "spin",
        "reconnect_delay",
        "ctrl_loss_tmo",
        "fast_io_fail_tmo",
        "connect_timeout",
    ];
    let mut cmd = cmd
        .version(env!("CARGO_PKG_VERSION"))
        .about(ABOUT)
        .long_about(LONG_ABOUT)
        .after_help(format!("{EXIT_STATUS}\n\nMore options, and what each does: rblk-bench --help"))
        .after_long_help(format!("{EXIT_STATUS}\n\n{}", include_str!("json.md")));
    for id in library {
        cmd = cmd.mut_arg(id, |a| {
            let a = match a.get_long_help().or(a.get_help()).cloned() {
                Some(long) => a.long_help(long),
                None => a,
            };
            match SHORT_HELP.iter().find(|(i, _)| *i == id) {
                Some((_, short)) => a.help(*short),
                None => a.hide_short_help(true),
            }
        });
    }
    cmd
}

impl clap::CommandFactory for Args {
    fn command() -> clap::Command {
        command()
    }
    fn command_for_update() -> clap::Command {
        tune(<Args as clap::Args>::augment_args_for_update(clap::Command::new("rblk-bench")))
    }
}

impl Parser for Args {}

/// `--output-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// fio-style text.
    Normal,
    /// fio's JSON layout.
    Json,
    /// fio's JSON layout with the latency bins (`clat_ns.bins`).
    JsonPlus,
}

/// `-o` is the format, as in fio: a value that is not one (a file name, as `-o` meant in other
/// tools) says where files go.
fn format_arg(text: &str) -> std::result::Result<OutputFormat, String> {
    match text {
        "normal" => Ok(OutputFormat::Normal),
        "json" => Ok(OutputFormat::Json),
        "json+" => Ok(OutputFormat::JsonPlus),
        "terse" => Err("terse is fio's; rblk-bench writes normal, json or json+".into()),
        t if t.contains(',') => Err("one format at a time: normal, json or json+".into()),
        _ => Err("not an output format (normal, json, json+); to write the report to a file, use --output FILE".into()),
    }
}

/// `--log-interval`: a bare number stays milliseconds, as it was before units and as fio's
/// log_avg_msec is (scripts pass `--log-interval 100`).
fn log_interval_arg(text: &str) -> std::result::Result<Duration, String> {
    let d = rblk_initiator::parse_duration_in(text, Duration::from_millis(1))?;
    rblk_initiator::check_duration(d, crate::log::MIN_LOG_INTERVAL, Some(crate::log::MAX_LOG_INTERVAL))?;
    Ok(d)
}

/// `--runtime`, `--ramp_time`: at most a year (an `Instant` plus it must not overflow).
pub(crate) fn run_time_arg(text: &str) -> std::result::Result<Duration, String> {
    rblk_initiator::parse_duration_bounded(text, Duration::ZERO, Some(MAX_RUN_TIME))
}

/// The longest `--runtime` and `--ramp_time`.
pub(crate) const MAX_RUN_TIME: Duration = Duration::from_secs(365 * 86_400);

fn size_arg(text: &str) -> std::result::Result<u64, String> {
    let n = rblk_initiator::parse_size(text).map_err(|e| e.to_string())?;
    if n == 0 {
        return Err("must be more than zero bytes".into());
    }
    Ok(n)
}

fn nonzero_size_arg(text: &str) -> std::result::Result<u64, String> {
    size_arg(text)
}

/// `--runtime`: longer than zero.
fn runtime_arg(text: &str) -> std::result::Result<Duration, String> {
    let d = run_time_arg(text)?;
    if d.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(d)
}

/// URI|JOBFILE: what looks like a URI must be one (a usage error, exit 2, before anything
/// connects); anything else is a job file's path.
fn target_arg(text: &str) -> std::result::Result<String, String> {
    if text.contains("://") {
        filename_arg(text)
    } else {
        Ok(text.to_owned())
    }
}

/// `--filename`: a volume URI, fio's `\:` escaping accepted.
fn filename_arg(text: &str) -> std::result::Result<String, String> {
    rblk_initiator::Uri::parse(&jobfile::unescape(text)).map(|_| text.to_owned()).map_err(|e| e.to_string())
}

fn percent_arg(text: &str) -> std::result::Result<u8, String> {
    whole_number(text, 0, 100).map(|p| p as u8)
}

fn iodepth_arg(text: &str) -> std::result::Result<u32, String> {
    whole_number(text, 1, u64::from(MAX_IODEPTH)).map(|n| n as u32)
}

fn jobs_arg(text: &str) -> std::result::Result<u32, String> {
    whole_number(text, 1, u64::from(MAX_JOBS)).map(|n| n as u32)
}

fn whole_arg(text: &str) -> std::result::Result<u64, String> {
    whole_number(text, 0, u64::MAX)
}

fn bssplit_arg(text: &str) -> std::result::Result<BsSplit, String> {
    BsSplit::parse(text)
}

fn rate_iops_arg(text: &str) -> std::result::Result<[Option<u64>; 2], String> {
    Rate::parse_iops(text)
}

fn rate_arg(text: &str) -> std::result::Result<[Option<u64>; 2], String> {
    Rate::parse_bytes(text)
}

/// 4096 -> "4k", 1048576 -> "1M", 6000 -> "6000": a size as fio's options spell it.
pub(crate) fn size_text(n: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "k")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// 10 s -> "10s", 0.5 s -> "500ms", 20 us -> "20us".
fn duration_text(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}us", d.as_micros())
    }
}

/// What an invocation runs: one section from the command line, or a job file's.
#[derive(Debug, Clone)]
pub(crate) struct Invocation {
    pub(crate) sections: Vec<Section>,
    /// A job file's [global] options, as written.
    pub(crate) global_options: Vec<(String, String)>,
    pub(crate) group_reporting: bool,
    /// A job file's notes: the options it gave that do not apply, one line each.
    pub(crate) notes: Vec<String>,
}

impl Args {
    /// Notices for the deprecated spellings used, one line each.
    pub fn deprecations(&self) -> Vec<String> {
        let mut v = Vec::new();
        if self.ramp.is_some() {
            v.push("--ramp is deprecated, use --ramp_time (the same meaning)".to_owned());
        }
        if self.json.is_some() {
            v.push(
                "--json is deprecated: it writes rblk-bench's earlier JSON layout; use -o json --output FILE for \
                 fio's layout"
                    .to_owned(),
            );
        }
        v
    }

    /// The job options given, as a job file's section would give them, and their fio names
    /// and values for the report's "job options".
    fn job_options(&self) -> (JobOptions, Vec<(String, String)>) {
        let rwmixread = self.rwmixread.or(self.rwmixwrite.map(|w| 100 - w));
        let rate = Rate { iops: self.rate_iops.unwrap_or_default(), bytes: self.rate.unwrap_or_default() };
        let o = JobOptions {
            filename: None,
            rw: self.rw,
            rwmixread,
            bs: self.bs,
            iodepth: self.iodepth,
            numjobs: self.jobs,
            runtime: self.runtime,
            time_based: self.time_based,
            size: self.size,
            ramp_time: self.ramp_time.or(self.ramp),
            verify: self.verify,
            generation: self.generation,
            seed: self.seed,
            stonewall: false,
            rate,
            bssplit: self.bssplit.clone(),
        };
        let mut given: Vec<(&str, Option<String>)> = vec![
            ("rw", o.rw.map(|w| w.name().to_owned())),
            ("rwmixread", self.rwmixread.map(|p| p.to_string())),
            ("rwmixwrite", self.rwmixwrite.map(|p| p.to_string())),
            ("bs", o.bs.map(size_text)),
            ("bssplit", o.bssplit.as_ref().map(BsSplit::to_string)),
            ("rate_iops", self.rate_iops.map(|r| Rate::text(r, |n| n.to_string()))),
            ("rate", self.rate.map(|r| Rate::text(r, size_text))),
            ("iodepth", o.iodepth.map(|n| n.to_string())),
            ("numjobs", o.numjobs.map(|n| n.to_string())),
            ("runtime", o.runtime.map(duration_text)),
            ("time_based", o.time_based.then(String::new)),
            ("size", o.size.map(size_text)),
            ("ramp_time", o.ramp_time.map(duration_text)),
            ("verify", o.verify.then(String::new)),
            ("generation", o.generation.map(|g| g.to_string())),
            ("randseed", o.seed.map(|s| s.to_string())),
        ];
        given.retain(|(_, v)| v.is_some());
        let given = given.into_iter().map(|(k, v)| (k.to_owned(), v.unwrap_or_default())).collect();
        (o, given)
    }

    /// The run's parameters from the command line (rblk-bench's defaults for what is not given).
    pub fn spec(&self) -> Spec {
        self.job_options().0.spec()
    }

    /// What to run: the command line's one section, or the job file's.
    pub(crate) fn invocation(&self) -> Result<Invocation> {
        if let (Some(r), Some(w)) = (self.rwmixread, self.rwmixwrite) {
            if u16::from(r) + u16::from(w) != 100 {
                return Err(Error::Value {
                    option: "rwmixread",
                    text: format!(
                        "--rwmixread {r} and --rwmixwrite {w} contradict each other: they must add up to 100"
                    ),
                });
            }
        }
        let (options, given) = self.job_options();
        let uri = |t: &str| jobfile::unescape(t);
        match (self.target.as_deref(), self.filename.as_deref()) {
            (Some(t), _) if !t.contains("://") => {
                if let Some((flag, _)) = given.first() {
                    return Err(Error::Invalid(format!(
                        "{} is a job option: with a job file, set it in the file ([global] or a job section)",
                        cli_flag(flag)
                    )));
                }
                if self.name.is_some() {
                    return Err(Error::Invalid("--name: with a job file, its sections name the jobs".into()));
                }
                let path = PathBuf::from(t);
                if !path.exists() {
                    return Err(Error::Invalid(format!(
                        "{t}: no such job file (nor a volume URI: rblk://HOST[:PORT]/VOLUME)"
                    )));
                }
                let file = jobfile::read(&path)?;
                Ok(Invocation {
                    sections: file.sections,
                    global_options: file.global_options,
                    group_reporting: file.group_reporting || self.group_reporting,
                    notes: file.notes,
                })
            }
            (t, f) => {
                let uri = uri(t.or(f).expect("clap requires URI or --filename"));
                let name = self.name.clone().unwrap_or_else(|| "rblk-bench".into());
                let mut job_options = vec![("name".to_owned(), name.clone())];
                if let Some(f) = f {
                    job_options.push(("filename".into(), f.to_owned()));
                }
                job_options.extend(given);
                let section =
                    Section { name, groupid: 0, uri, spec: options.spec(), options: job_options, place: None };
                Ok(Invocation {
                    sections: vec![section],
                    global_options: Vec::new(),
                    group_reporting: self.group_reporting,
                    notes: Vec::new(),
                })
            }
        }
    }

    /// `--log`: the prefix and the interval.
    pub fn log(&self) -> Option<(&std::path::Path, Duration)> {
        Some((self.log.as_deref()?, self.log_interval.unwrap_or(crate::log::DEFAULT_LOG_INTERVAL)))
    }

    /// How to connect, without a target to find a key for (`--key-file`, `RBLK_KEY_FILE`,
    /// the local target's key, /etc/rblk/target.key).
    pub fn options(&self) -> Result<Options> {
        self.options_for(None)
    }

    /// How to connect to `target`: its key found as rblk finds it (also
    /// /etc/rblk/keys/HOST.key for the target's host).
    pub fn options_for(&self, target: Option<&rblk_initiator::Uri>) -> Result<Options> {
        let defaults = Options::default();
        let mut options = Options {
            host_id: self.host_id.clone(),
            timeout: self.timeout,
            reconnect: self.reconnect.reconnect(),
            ..defaults
        };
        // The library's error names the file, as rblk reports it.
        if let Some(root) = std::env::var_os(rblk_initiator::KEY_ROOT_ENV).filter(|r| !r.is_empty()) {
            options.key_root = root.into();
        }
        if self.no_key {
            options.no_key();
        } else {
            options.find_key_for(self.key_file.as_deref(), target).map_err(|e| Error::Connect(Box::new(e)))?;
        }
        self.route.apply(&mut options);
        self.trust.apply(&mut options);
        Ok(options)
    }
}

/// The command-line flag of a job option's fio name.
fn cli_flag(fio_name: &str) -> String {
    match fio_name {
        "numjobs" => "--numjobs".into(),
        "randseed" => "--seed".into(),
        "rate_iops" => "--rate-iops".into(),
        other => format!("--{other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    fn parse(args: &[&str]) -> std::result::Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("rblk-bench").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_are_4k_randread_depth_32_one_job_10s() {
        let a = parse(&["rblk://h/v"]).unwrap();
        assert_eq!(a.spec(), Spec::default());
        assert_eq!(a.spec().runtime, Some(Duration::from_secs(10)));
        assert_eq!(a.options().unwrap().spin, Options::default().spin);
        assert_eq!(a.options().unwrap().wait, rblk_initiator::Wait::Adaptive, "no polling unless asked");
        assert_eq!(a.output_format, OutputFormat::Normal);
        assert!(a.deprecations().is_empty());
    }

    /// Catches a fio spelling that is refused or means something else than in fio.
    #[test]
    fn parses_fio_style_arguments() {
        let a = parse(&[
            "rblk://h/v",
            "--rw",
            "randrw",
            "--rwmixread",
            "70",
            "--bs",
            "64k",
            "--iodepth",
            "8",
            "--numjobs",
            "4",
            "--size",
            "1G",
            "--ramp_time",
            "500ms",
            "--verify",
            "--generation",
            "9",
            "--seed",
            "3",
            "--spin",
            "50us",
            "--poll",
        ])
        .unwrap();
        let s = a.spec();
        assert_eq!((s.workload, s.rwmixread, s.bs, s.iodepth, s.jobs), (Workload::RandRw, Some(70), 65536, 8, 4));
        assert_eq!(
            (s.runtime, s.size, s.ramp, s.verify, s.generation, s.seed),
            (None, Some(1 << 30), Duration::from_millis(500), true, Some(9), 3)
        );
        assert_eq!(a.options().unwrap().spin, Duration::from_micros(50));
        assert_eq!(a.options().unwrap().wait, rblk_initiator::Wait::Poll);
        assert_eq!(a.log(), None);
        let a = parse(&["rblk://h/v", "--log", "out/x"]).unwrap();
        assert_eq!(a.log(), Some((std::path::Path::new("out/x"), Duration::from_secs(1))));
        let a = parse(&["rblk://h/v", "--log", "x", "--log-interval", "250"]).unwrap();
        assert_eq!(a.log(), Some((std::path::Path::new("x"), Duration::from_millis(250))));
        let a = parse(&["rblk://h/v", "--log", "x", "--log-interval", "2s"]).unwrap();
        assert_eq!(a.log(), Some((std::path::Path::new("x"), Duration::from_secs(2))));
        let a = parse(&["rblk://h/v", "--bs", "1.5M", "--size", "4096KB", "--reconnect-delay", "500ms"]).unwrap();
        assert_eq!((a.spec().bs, a.spec().size), (3 << 19, Some(4_096_000)));
        assert_eq!(a.options().unwrap().reconnect.delay, Duration::from_millis(500));
        let a = parse(&["rblk://h/v", "--runtime", "2.5", "--timeout", "1500ms"]).unwrap();
        assert_eq!(a.spec().runtime, Some(Duration::from_millis(2500)));
        assert_eq!(a.options().unwrap().timeout, Duration::from_millis(1500));
        assert_eq!(parse(&["rblk://h/v", "--timeout", "3"]).unwrap().timeout, Duration::from_secs(3));
        for (args, format) in [
            (&["-o", "json"][..], OutputFormat::Json),
            (&["--output-format=json+"][..], OutputFormat::JsonPlus),
            (&["--output-format", "normal"][..], OutputFormat::Normal),
        ] {
            assert_eq!(parse(&[&["rblk://h/v"][..], args].concat()).unwrap().output_format, format, "{args:?}");
        }
        let a = parse(&["--filename=rblk\\://h\\:7420/v", "--time_based", "--runtime", "2m", "--size", "4M"]).unwrap();
        let inv = a.invocation().unwrap();
        assert_eq!(inv.sections[0].uri, "rblk://h:7420/v");
        let s = &inv.sections[0].spec;
        assert_eq!((s.runtime, s.size, s.time_based), (Some(Duration::from_secs(120)), Some(4 << 20), true));
        let a = parse(&["rblk://h/v", "--output", "r.json", "-o", "json", "--group_reporting", "--name", "x"]).unwrap();
        assert_eq!((a.output.as_deref(), a.group_reporting), (Some(std::path::Path::new("r.json")), true));
        assert_eq!(a.invocation().unwrap().sections[0].options[0], ("name".into(), "x".into()));
    }

    /// Catches the old spellings breaking scripts (refused, or taking another meaning) and
    /// the notice that tells their users what to write instead going missing.
    #[test]
    fn deprecated_spellings_keep_their_meaning_and_say_so() {
        let old = parse(&["rblk://h/v", "--ramp", "2s", "--json", "r.json"]).unwrap();
        let new = parse(&["rblk://h/v", "--ramp_time", "2s"]).unwrap();
        assert_eq!(old.spec(), new.spec());
        assert_eq!(old.json.as_deref(), Some(std::path::Path::new("r.json")));
        let notices = old.deprecations();
        assert_eq!(notices.len(), 2, "{notices:?}");
        assert!(notices[0].contains("--ramp is deprecated, use --ramp_time"), "{notices:?}");
        assert!(notices[1].contains("--json is deprecated") && notices[1].contains("-o json --output FILE"));
        assert!(new.deprecations().is_empty());
        let help = Args::command().render_long_help().to_string();
        assert!(!help.contains("--ramp <") && !help.contains("--json <"), "the old spellings are hidden:\n{help}");
    }

    #[test]
    fn refuses_bad_syntax() {
        for (args, needle) in [
            (&["rblk://h/v", "--rw", "sideways"][..], "sideways"),
            (&["rblk://h/v", "--bs", "4x"][..], "unknown suffix"),
            (&["rblk://h/v", "--generation", "3"][..], "--verify"),
            (&["rblk://h/v", "--iodepth", "-1"][..], "-1"),
            (&["rblk://h/v", "--runtime", "soon"][..], "\"soon\" is not a duration"),
            (&["rblk://h/v", "--runtime", "400d"][..], "400 days is too long: it must be at most 365 days"),
            (&["rblk://h/v", "--timeout", "0"][..], "0 s is out of range: it must be between 1 ms and 1 day"),
            (&["rblk://h/v", "--bs", "1MB"][..], "not a multiple of the block size 4096: use 1MiB (binary)"),
            (&[][..], "URI"),
            (&["rblk://h/v", "--log-interval", "100"][..], "--log"),
            (
                &["rblk://h/v", "--log", "p", "--log-interval", "0"][..],
                "0 s is out of range: it must be between 10 ms and 1 h",
            ),
            (&["rblk://h/v", "--log", "p", "--log-interval", "3600001"][..], "3600001 ms is out of range"),
            (&["rblk://h/v", "--log", "p", "--log-interval", "soon"][..], "a bare number is milliseconds"),
            (&["rblk://h/v", "-o", "report.json"][..], "use --output FILE"),
            (&["rblk://h/v", "--output-format", "out.txt"][..], "use --output FILE"),
            (&["rblk://h/v", "-o", "terse"][..], "terse is fio's"),
            (&["rblk://h/v", "-o", "normal,json"][..], "one format at a time"),
            (&["rblk://h/v", "--ramp", "1", "--ramp_time", "1"][..], "cannot be used with"),
            (&["rblk://h/v", "--json", "a", "--output", "b"][..], "cannot be used with"),
            (&["rblk://h/v", "--json", "a", "-o", "json"][..], "cannot be used with"),
            (&["rblk://h/v", "--time_based"][..], "--runtime"),
            (&["rblk://h/v", "--filename", "rblk://h/w"][..], "cannot be used with"),
        ] {
            let e = parse(args).expect_err("refused").to_string();
            assert!(e.contains(needle), "{args:?}: {needle:?} not in {e}");
        }
    }

    /// Catches a job file run with command-line job options silently ignored (or silently
    /// overriding the file).
    #[test]
    fn a_job_file_takes_no_job_options_on_the_command_line() {
        for (args, needle) in [
            (&["jobs.fio", "--rw", "read"][..], "--rw is a job option"),
            (&["jobs.fio", "--rate-iops", "100"][..], "--rate-iops is a job option"),
            (&["jobs.fio", "--numjobs", "2"][..], "--numjobs is a job option"),
            (&["jobs.fio", "--name", "x"][..], "--name"),
        ] {
            let e = parse(args).unwrap().invocation().expect_err("refused").to_string();
            assert!(e.contains(needle), "{args:?}: {needle:?} not in {e}");
        }
    }

    /// Issue 43, trap 8: `-h` was a wall (49 lines, options of 150 to 540 columns). `--help`
    /// must keep the prose (the library's connection flags included) and say the exit
    /// statuses. Catches connection options outside their heading, and prose lost with the
    /// one-line summaries. (The size of every `-h`, at most 100 columns and 40 lines, is
    /// rblk-dist's `every_short_help_fits_100_columns_and_40_lines`, for all three binaries.)
    #[test]
    fn connection_options_under_their_heading_and_prose_in_long_help() {
        let mut cmd = Args::command();
        cmd.build();
        let short = cmd.render_help().to_string();
        let connection = &short[short.find("Connection:").expect("a Connection heading")..];
        for flag in ["--key-file", "--host-id", "--device", "--timeout"] {
            assert!(connection.contains(flag), "{flag} not under Connection:\n{short}");
        }
        assert!(short.contains("Exit status:") && short.contains("  2  usage"), "{short}");
        let long = cmd.render_long_help().to_string();
        let connection = &long[long.find("Connection:").unwrap()..long.find("Reconnect:").unwrap()];
        for flag in ["--target-id", "--known-targets", "--source-addr", "--tos", "--spin", "--timeout"] {
            assert!(connection.contains(flag), "{flag} not under Connection in --help");
        }
        for prose in ["RDMA_OPTION_ID_TOS", "a temporary file beside it", "Exit status:", "clat_ns", "catches up"] {
            assert!(long.contains(prose), "--help lacks {prose:?}");
        }
    }

    /// Issue 43, traps 5 and 7: the flags of fio's rate_iops, rate, bssplit and rwmixwrite
    /// reach the spec (and the report's job options, as fio echoes them); bad numbers are
    /// refused by clap (exit 2) saying what is wanted, not `invalid digit found in string`.
    #[test]
    fn rate_bssplit_and_rwmixwrite_flags_and_what_bad_values_want() {
        let a = parse(&["rblk://h/v", "--rate-iops", "2000", "--rate", "1M,2M", "--bssplit", "4k/75:64k/25"]).unwrap();
        let s = a.spec();
        assert_eq!(s.rate.iops, [Some(2000), Some(2000)]);
        assert_eq!(s.rate.bytes, [Some(1 << 20), Some(2 << 20)]);
        assert_eq!(s.bssplit.as_ref().unwrap().dirs[1], Some(vec![(4096, 75), (65536, 25)]));
        let options = &a.invocation().unwrap().sections[0].options;
        for (k, v) in [("rate_iops", "2000"), ("rate", "1M,2M"), ("bssplit", "4k/75:64k/25")] {
            assert!(options.contains(&(k.into(), v.into())), "{k}={v} not in {options:?}");
        }
        assert_eq!(parse(&["rblk://h/v", "--rate_iops", ",300"]).unwrap().spec().rate.iops, [None, Some(300)]);
        let a = parse(&["rblk://h/v", "--rw", "randrw", "--rwmixwrite", "30"]).unwrap();
        assert_eq!(a.spec().read_percent(), 70);
        parse(&["rblk://h/v", "--rw", "randrw", "--rwmixwrite", "30", "--rwmixread", "70"])
            .unwrap()
            .invocation()
            .unwrap();
        let e = parse(&["rblk://h/v", "--rw", "randrw", "--rwmixwrite", "40", "--rwmixread", "70"])
            .unwrap()
            .invocation()
            .unwrap_err();
        assert!(e.to_string().contains("--rwmixread 70 and --rwmixwrite 40 contradict each other"), "{e}");
        assert_eq!(e.exit_code(), 2);
        for (args, needle) in [
            (
                &["--generation", "x", "--verify"][..],
                "invalid value 'x' for '--generation <N>': must be a whole number from 0 up",
            ),
            (&["--iodepth", "0"][..], "invalid value '0' for '--iodepth <N>': must be a whole number from 1 to 1024"),
            (&["--numjobs", "999"][..], "must be a whole number from 1 to 256"),
            (&["--rwmixread", "150"][..], "must be a whole number from 0 to 100"),
            (&["--seed=-3"][..], "must be a whole number from 0 up"),
            (&["--bs", "0"][..], "must be more than zero bytes"),
            (&["--runtime", "0"][..], "must be longer than zero"),
            (&["--rate-iops", "fast"][..], "must be a whole number from 0 up (I/Os per second)"),
            (&["--rate", "1,2,3"][..], "a trim rate is not supported yet"),
            (&["--bssplit", "4k/80:8k/30"][..], "the shares must add up to 100"),
        ] {
            let e = parse(&[&["rblk://h/v"][..], args].concat()).expect_err("refused");
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(needle), "{args:?}: {needle:?} not in {e}");
        }
        let e = parse(&["rblk://h"]).unwrap_err();
        assert!(e.to_string().contains("no /VOLUME after the host"), "{e}");
    }

    #[test]
    fn help_documents_the_json_fields() {
        let help = Args::command().render_long_help().to_string();
        for field in
            ["clat_ns", "bw_bytes", "\"fio version\"", "target_cpu", "share_of_core", "lat_us", "first_mismatches"]
        {
            assert!(help.contains(field), "--help lacks {field}");
        }
    }
}
