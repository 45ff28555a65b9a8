//! The command line.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use rblk_initiator::Options;

use rblk_initiator::parse_duration;

use crate::spec::{Spec, Stop, Workload};
use crate::Result;

/// Load-test an rblk volume, like fio: jobs of queued one-sided RDMA READs and WRITEs.
///
/// Each job is a thread with its own queue pair of the session, keeping --iodepth I/Os of --bs
/// bytes in flight in its own slice of the volume (the volume divided by --jobs), for --runtime
/// or until it moved --size bytes. A progress line goes to stderr every second; the report (IOPS,
/// bandwidth, latency percentiles per direction, and the target's CPU time over the run) goes to
/// stdout, and with --json also to a file.
///
/// --verify writes a self-describing pattern in every block (its offset, a generation number
/// and a checksum). Write workloads (write, randwrite) then read back and check every block they
/// wrote; randrw also checks its reads of blocks it already wrote; read workloads check every
/// block against the pattern a previous --verify write left (of --generation N if given, else of
/// any generation). Any bad block is reported with its offset and the run exits with status 1.
///
/// Sizes take binary suffixes (4k, 64k, 1M, 1G); durations take s, ms, us, m (a bare number is
/// seconds).
#[derive(Debug, Parser)]
#[command(name = "rblk-bench", version, about, long_about, after_long_help = include_str!("json.md"))]
pub struct Args {
    /// The volume: rblk://HOST/VOLUME or rblk://HOST:PORT/VOLUME.
    pub uri: String,
    /// The I/O pattern.
    #[arg(long, value_enum, default_value_t = Workload::RandRead)]
    pub rw: Workload,
    /// Percentage of reads, for --rw randrw (default 50).
    #[arg(long, value_name = "PCT")]
    pub rwmixread: Option<u8>,
    /// Bytes per I/O: a multiple of the volume's block size, at most its largest I/O.
    #[arg(long, value_parser = size_arg, default_value = "4k", value_name = "SIZE")]
    pub bs: u64,
    /// I/Os in flight per job.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub iodepth: u32,
    /// Jobs: threads with a queue pair each, on disjoint slices of the volume.
    #[arg(long, visible_alias = "numjobs", default_value_t = 1, value_name = "N")]
    pub jobs: u32,
    /// Measure for this long (after the ramp) [default: 10s].
    #[arg(long, value_parser = parse_duration, conflicts_with = "size", value_name = "SECS")]
    pub runtime: Option<Duration>,
    /// Instead of a runtime: bytes each job transfers (after the ramp), a multiple of --bs.
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub size: Option<u64>,
    /// Run this long before measuring.
    #[arg(long, value_parser = parse_duration, default_value = "0", value_name = "SECS")]
    pub ramp: Duration,
    /// Write a self-describing pattern and check every block read (semantics in --help).
    #[arg(long)]
    pub verify: bool,
    /// With --verify: the generation to write, or the one reads must find [default: writes use
    /// a fresh one (microseconds since the epoch), reads accept any].
    #[arg(long, value_name = "N", requires = "verify")]
    pub generation: Option<u64>,
    /// Also write the report as JSON to FILE (fields in --help), created before the run starts.
    /// `-` writes the JSON to stdout and the text report to stderr.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write time series of the measured window under PREFIX, created before the run: per job N
    /// (from 1) fio-format PREFIX_iops.N.log, PREFIX_bw.N.log and PREFIX_lat.N.log (lines "msec,
    /// value, direction, blocksize, offset": IOPS, KiB/s, mean latency in ns per interval;
    /// direction 0 read, 1 write), and a HdrHistogram interval log PREFIX.hlog (ns, tags read.N,
    /// write.N). scripts/plot.py draws them.
    #[arg(long, value_name = "PREFIX")]
    pub log: Option<PathBuf>,
    /// With --log: one line per this many milliseconds (10 to 3600000) [default: 1000].
    /// Unlike fio's log_avg_msec there is no per-I/O logging: every line averages an interval.
    #[arg(long, value_name = "MS", requires = "log", value_parser = log_interval_arg)]
    pub log_interval: Option<Duration>,
    /// Seed for offsets and the read/write mix: the same seed repeats the same I/Os.
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub seed: u64,
    /// Key file, for targets that require one: the target's shared key, or this host's own.
    /// Default: /var/lib/rblk/target.key when it can be read (a target on this host).
    #[arg(long, env = "RBLK_KEY_FILE", value_name = "PATH")]
    pub key_file: Option<PathBuf>,
    /// This host's identity for the target's access lists and per-host keys [default: the
    /// machine's hostname].
    #[arg(long, env = "RBLK_HOST_ID", value_name = "NAME",
          value_parser = |t: &str| rblk_initiator::check_host_id(t).map(|()| t.to_owned()))]
    pub host_id: Option<String>,
    /// Device, source address and type of service.
    #[command(flatten)]
    pub route: rblk_initiator::RouteArgs,
    /// Give up on each control exchange (connect, open, STATS) after this many seconds.
    #[arg(long, default_value_t = 10, value_name = "SECS")]
    pub timeout: u64,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// What a job does when the session loses its target.
    #[command(flatten, next_help_heading = "Reconnect")]
    pub reconnect: rblk_initiator::ReconnectArgs,
}

fn log_interval_arg(text: &str) -> std::result::Result<Duration, String> {
    let ms: u64 = text.parse().map_err(|_| format!("not a whole number of milliseconds: {text:?}"))?;
    let d = Duration::from_millis(ms);
    crate::log::check_interval(d).map_err(|e| e.to_string())?;
    Ok(d)
}

fn size_arg(text: &str) -> std::result::Result<u64, String> {
    rblk_initiator::parse_size(text).map_err(|e| e.to_string())
}

impl Args {
    /// The run's parameters.
    pub fn spec(&self) -> Spec {
        Spec {
            workload: self.rw,
            rwmixread: self.rwmixread,
            bs: self.bs,
            iodepth: self.iodepth,
            jobs: self.jobs,
            stop: match (self.size, self.runtime) {
                (Some(size), _) => Stop::Size(size),
                (None, Some(runtime)) => Stop::Runtime(runtime),
                (None, None) => Spec::default().stop,
            },
            ramp: self.ramp,
            verify: self.verify,
            generation: self.generation,
            seed: self.seed,
        }
    }

    /// `--log`: the prefix and the interval.
    pub fn log(&self) -> Option<(&std::path::Path, Duration)> {
        Some((self.log.as_deref()?, self.log_interval.unwrap_or(crate::log::DEFAULT_LOG_INTERVAL)))
    }

    /// How to connect.
    pub fn options(&self) -> Result<Options> {
        let (key, key_files_tried) =
            Options::find_key(self.key_file.as_deref()).map_err(crate::Error::initiator("reading the key file"))?;
        let defaults = Options::default();
        let mut options = Options {
            key,
            key_files_tried,
            host_id: self.host_id.clone(),
            timeout: Duration::from_secs(self.timeout),
            reconnect: self.reconnect.reconnect(),
            ..defaults
        };
        self.route.apply(&mut options);
        Ok(options)
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
        assert_eq!(a.spec().stop, Stop::Runtime(Duration::from_secs(10)));
        assert_eq!(a.options().unwrap().spin, Options::default().spin);
        assert_eq!(a.options().unwrap().wait, rblk_initiator::Wait::Adaptive, "no polling unless asked");
    }

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
            "--ramp",
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
            (s.stop, s.ramp, s.verify, s.generation, s.seed),
            (Stop::Size(1 << 30), Duration::from_millis(500), true, Some(9), 3)
        );
        assert_eq!(a.options().unwrap().spin, Duration::from_micros(50));
        assert_eq!(a.options().unwrap().wait, rblk_initiator::Wait::Poll);
        assert_eq!(a.log(), None);
        let a = parse(&["rblk://h/v", "--log", "out/x"]).unwrap();
        assert_eq!(a.log(), Some((std::path::Path::new("out/x"), Duration::from_secs(1))));
        let a = parse(&["rblk://h/v", "--log", "x", "--log-interval", "250"]).unwrap();
        assert_eq!(a.log(), Some((std::path::Path::new("x"), Duration::from_millis(250))));
        let a = parse(&["rblk://h/v", "--runtime", "2.5"]).unwrap();
        assert_eq!(a.spec().stop, Stop::Runtime(Duration::from_millis(2500)));
    }

    #[test]
    fn refuses_bad_syntax() {
        for (args, needle) in [
            (&["rblk://h/v", "--rw", "sideways"][..], "sideways"),
            (&["rblk://h/v", "--bs", "4x"][..], "unknown suffix"),
            (&["rblk://h/v", "--runtime", "5", "--size", "1M"][..], "cannot be used with"),
            (&["rblk://h/v", "--generation", "3"][..], "--verify"),
            (&["rblk://h/v", "--iodepth", "-1"][..], "-1"),
            (&["rblk://h/v", "--runtime", "soon"][..], "bad duration"),
            (&[][..], "URI"),
            (&["rblk://h/v", "--log-interval", "100"][..], "--log"),
            (&["rblk://h/v", "--log", "p", "--log-interval", "0"][..], "10 to 3600000 ms (got 0 ms)"),
            (&["rblk://h/v", "--log", "p", "--log-interval", "3600001"][..], "10 to 3600000 ms"),
            (&["rblk://h/v", "--log", "p", "--log-interval", "1s"][..], "milliseconds"),
        ] {
            let e = parse(args).expect_err("refused").to_string();
            assert!(e.contains(needle), "{args:?}: {needle:?} not in {e}");
        }
    }

    #[test]
    fn help_documents_the_json_fields() {
        let help = Args::command().render_long_help().to_string();
        for field in ["share_of_core", "lat_us", "p99_9", "first_mismatches", "command_line", "rblk_version"] {
            assert!(help.contains(field), "--help lacks {field}");
        }
    }
}
