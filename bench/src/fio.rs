//! `--output-format=json` and `json+`: fio's JSON layout, as fio 3.33 writes it, from the
//! figures of a run ([`Report`] and its [`Report::threads`]), so that fio's tools and scripts read
//! rblk-bench's results unchanged.
//!
//! Units and meanings are fio's: `bw` KiB/s, `bw_bytes` bytes/s, `runtime` ms, latencies ns.
//! What rblk-bench measures maps onto fio's fields as follows:
//! - `clat_ns` and `lat_ns` are the same measurement, from the submit call to the reap of the
//!   completion (rblk-bench stages and posts in one call, so it has no separate submission
//!   latency); `slat_ns` has `N` 0, as fio prints for engines where it does not time submission.
//!   Latencies come from HdrHistogram (3 significant digits): min, max, percentiles and the
//!   json+ `bins` (each bin keyed by the highest latency its bucket holds) are exact to 0.1%.
//! - `bw_min`... `iops_samples` are fio's per-job samples, one per 500 ms of the window (fio's
//!   default `bw_avg` and `iops_avg_time`).
//! - `usr_cpu`, `sys_cpu`, `ctx`, `majf`, `minf`: the job thread's own (getrusage of the thread)
//!   over its measured window.
//! - `trim` holds `--rw trim` and `randtrim`'s DISCARDs (zeros for other workloads); `sync` is
//!   all zeros: rblk-bench issues no fsync.
//! - Not written: `iodepth_level`, `iodepth_submit`, `iodepth_complete` (rblk-bench does not
//!   sample the queue depth of each submission) and `latency_depth`, `latency_target`,
//!   `latency_percentile`, `latency_window` (fio's latency_target mode, which rblk-bench lacks).
//!
//! `fio version` names rblk-bench (`rblk-bench-VERSION`), `time` is in UTC. rblk-bench's own
//! figures (the volume, the target's CPU, verification) are under the top-level key `rblk`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hdrhistogram::Histogram;
use serde::ser::SerializeMap as _;
use serde::Serialize;

use crate::command::Section;
use crate::report::{CpuUse, JobInfo, Report, ThreadReport, VerifyReport, VolumeInfo};
use crate::stats::{sample_stats, DirStats, Rates, ThreadUsage, DIRS, READ, TRIM, WRITE};

/// fio's default `percentile_list`.
pub const PERCENTILES: [f64; 17] =
    [1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99];

/// fio's errno for a verification failure (EILSEQ), in a job's `error`.
const EILSEQ: i32 = 84;

/// An object whose keys keep their order (fio's), unlike serde_json's map.
#[derive(Debug, Clone, Default)]
struct Ordered<T>(Vec<(String, T)>);

impl<T: Serialize> Serialize for Ordered<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

#[derive(Debug, Serialize)]
struct Document<'a> {
    #[serde(rename = "fio version")]
    fio_version: String,
    timestamp: u64,
    timestamp_ms: u64,
    time: String,
    #[serde(rename = "global options", skip_serializing_if = "is_empty")]
    global_options: Ordered<String>,
    jobs: Vec<Job>,
    rblk: Extras<'a>,
}

fn is_empty<T>(o: &Ordered<T>) -> bool {
    o.0.is_empty()
}

#[derive(Debug, Serialize)]
struct Job {
    jobname: String,
    groupid: u32,
    error: i32,
    eta: u64,
    elapsed: u64,
    #[serde(rename = "job options")]
    job_options: Ordered<String>,
    read: Dir,
    write: Dir,
    trim: Dir,
    sync: Sync,
    job_runtime: u64,
    usr_cpu: f64,
    sys_cpu: f64,
    ctx: u64,
    majf: u64,
    minf: u64,
    latency_ns: Ordered<f64>,
    latency_us: Ordered<f64>,
    latency_ms: Ordered<f64>,
}

#[derive(Debug, Serialize)]
struct Dir {
    io_bytes: u64,
    io_kbytes: u64,
    bw_bytes: u64,
    bw: u64,
    iops: f64,
    runtime: u64,
    total_ios: u64,
    short_ios: u64,
    drop_ios: u64,
    slat_ns: Lat,
    clat_ns: Lat,
    lat_ns: Lat,
    bw_min: u64,
    bw_max: u64,
    bw_agg: f64,
    bw_mean: f64,
    bw_dev: f64,
    bw_samples: u64,
    iops_min: u64,
    iops_max: u64,
    iops_mean: f64,
    iops_stddev: f64,
    iops_samples: u64,
}

#[derive(Debug, Serialize)]
struct Sync {
    total_ios: u64,
    lat_ns: Lat,
}

#[derive(Debug, Default, Serialize)]
struct Lat {
    min: u64,
    max: u64,
    mean: f64,
    stddev: f64,
    #[serde(rename = "N")]
    n: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    percentile: Option<Ordered<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    bins: Option<Ordered<u64>>,
}

/// rblk-bench's own figures: its version and command line, and per job section what fio has no
/// field for.
#[derive(Debug, Serialize)]
struct Extras<'a> {
    version: &'static str,
    command_line: &'a [String],
    sections: Vec<SectionExtras<'a>>,
}

#[derive(Debug, Serialize)]
struct SectionExtras<'a> {
    name: &'a str,
    groupid: u32,
    uri: &'a str,
    device: Option<&'a str>,
    volume: &'a VolumeInfo,
    /// The job's parameters with their defaults, as the deprecated layout's `job`.
    job: &'a JobInfo,
    /// Milliseconds since the epoch: the run's start (before connecting) and end.
    start_ms: u64,
    end_ms: u64,
    /// The measured window (the longest job's).
    elapsed_s: f64,
    /// rblk-bench's whole process's CPU over the section's window.
    cpu: Option<&'a CpuUse>,
    /// The target's CPU over it (from STATS).
    target_cpu: Option<&'a CpuUse>,
    verify: Option<&'a VerifyReport>,
}

/// One entry of `jobs`: a job (thread) of a section, or, with `group_reporting`, all of a group.
struct Figures {
    stats: [DirStats; DIRS],
    window: Duration,
    rates: Rates,
    usage: Option<ThreadUsage>,
}

impl Figures {
    fn of(t: &ThreadReport) -> Figures {
        Figures { stats: t.stats.clone(), window: t.window, rates: t.rates.clone(), usage: t.usage }
    }

    /// Several threads as one: counts and histograms added, the longest window, the samples of
    /// the same interval added (their bandwidth together), resource use added.
    fn merged<'a>(threads: impl Iterator<Item = &'a ThreadReport>) -> Figures {
        let mut f = Figures {
            stats: std::array::from_fn(|_| DirStats::new()),
            window: Duration::ZERO,
            rates: Rates::default(),
            usage: Some(ThreadUsage::default()),
        };
        for t in threads {
            for d in 0..DIRS {
                f.stats[d].add(&t.stats[d]);
                add_samples(&mut f.rates.bw[d], &t.rates.bw[d]);
                add_samples(&mut f.rates.iops[d], &t.rates.iops[d]);
            }
            f.window = f.window.max(t.window);
            f.usage = f.usage.zip(t.usage).map(|(a, b)| a.plus(&b));
        }
        f
    }
}

fn add_samples(sum: &mut Vec<f64>, xs: &[f64]) {
    if sum.len() < xs.len() {
        sum.resize(xs.len(), 0.0);
    }
    for (s, x) in sum.iter_mut().zip(xs) {
        *s += x;
    }
}

/// fio's JSON document (`plus`: json+, with the latency bins) of `sections`, run as
/// `reports[i]` each; `global_options` as the job file's [global] gave them.
pub(crate) fn document(
    sections: &[Section],
    reports: &[Report],
    global_options: &[(String, String)],
    group_reporting: bool,
    plus: bool,
    command_line: &[String],
    now: SystemTime,
) -> String {
    let since_epoch = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let groups = sections.iter().map(|s| s.groupid + 1).max().unwrap_or(0);
    // Each group's bandwidth by direction in KiB/s, for `bw_agg` (a job's share of it).
    let group_bw: Vec<[f64; DIRS]> = (0..groups)
        .map(|g| {
            let threads = || sections.iter().zip(reports).filter(|(s, _)| s.groupid == g).flat_map(|(_, r)| &r.threads);
            let window = threads().map(|t| t.window).max().unwrap_or_default().as_secs_f64();
            let per = |d: usize| {
                let bytes: u64 = threads().map(|t| t.stats[d].bytes).sum();
                if window > 0.0 {
                    bytes as f64 / 1024.0 / window
                } else {
                    0.0
                }
            };
            std::array::from_fn(per)
        })
        .collect();
    let mut jobs = Vec::new();
    if group_reporting {
        for g in 0..groups {
            let members: Vec<usize> = (0..sections.len()).filter(|&i| sections[i].groupid == g).collect();
            let Some(&first) = members.first() else { continue };
            let figures = Figures::merged(members.iter().flat_map(|&i| &reports[i].threads));
            let error = members.iter().any(|&i| !reports[i].passed());
            let elapsed = members.iter().map(|&i| run_time(&reports[i])).max().unwrap_or_default();
            jobs.push(job(&sections[first], &figures, error, elapsed, group_bw[g as usize], plus));
        }
    } else {
        for (s, r) in sections.iter().zip(reports) {
            for t in &r.threads {
                jobs.push(job(s, &Figures::of(t), !r.passed(), run_time(r), group_bw[s.groupid as usize], plus));
            }
        }
    }
    let extras = Extras {
        version: env!("CARGO_PKG_VERSION"),
        command_line,
        sections: sections
            .iter()
            .zip(reports)
            .map(|(s, r)| SectionExtras {
                name: &s.name,
                groupid: s.groupid,
                uri: &r.uri,
                device: r.device.as_deref(),
                volume: &r.volume,
                job: &r.job,
                start_ms: millis(r.started),
                end_ms: millis(r.ended),
                elapsed_s: r.elapsed_s,
                cpu: r.cpu.as_ref(),
                target_cpu: r.target_cpu.as_ref(),
                verify: r.verify.as_ref(),
            })
            .collect(),
    };
    let doc = Document {
        fio_version: format!("rblk-bench-{}", env!("CARGO_PKG_VERSION")),
        timestamp: since_epoch.as_secs(),
        timestamp_ms: since_epoch.as_millis() as u64,
        time: ctime_utc(since_epoch.as_secs()),
        global_options: Ordered(global_options.to_vec()),
        jobs,
        rblk: extras,
    };
    let mut text = serde_json::to_string_pretty(&doc).expect("the document serializes");
    text.push('\n');
    text
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

/// From the run's start (connecting) to its end.
fn run_time(r: &Report) -> Duration {
    r.ended.duration_since(r.started).unwrap_or_default()
}

fn job(s: &Section, f: &Figures, failed: bool, elapsed: Duration, group_bw: [f64; DIRS], plus: bool) -> Job {
    let window_ms = f.window.as_millis() as u64;
    let cpu_share = |t: Duration| {
        let w = f.window.as_secs_f64();
        if w > 0.0 {
            t.as_secs_f64() / w * 100.0
        } else {
            0.0
        }
    };
    let usage = f.usage.unwrap_or_default();
    let all = {
        let mut h = f.stats[0].hist.clone();
        for d in &f.stats[1..] {
            h.add(&d.hist).expect("histograms with the same bounds");
        }
        h
    };
    let (latency_ns, latency_us, latency_ms) = latency_buckets(&all);
    Job {
        jobname: s.name.clone(),
        groupid: s.groupid,
        error: if failed { EILSEQ } else { 0 },
        eta: 0,
        elapsed: elapsed.as_secs_f64().round() as u64,
        job_options: Ordered(s.options.clone()),
        read: dir(&f.stats[READ], f.window, &f.rates.bw[READ], &f.rates.iops[READ], group_bw[READ], plus),
        write: dir(&f.stats[WRITE], f.window, &f.rates.bw[WRITE], &f.rates.iops[WRITE], group_bw[WRITE], plus),
        trim: dir(&f.stats[TRIM], f.window, &f.rates.bw[TRIM], &f.rates.iops[TRIM], group_bw[TRIM], plus),
        sync: Sync { total_ios: 0, lat_ns: Lat::default() },
        job_runtime: window_ms,
        usr_cpu: cpu_share(usage.user),
        sys_cpu: cpu_share(usage.system),
        ctx: usage.ctx,
        majf: usage.majf,
        minf: usage.minf,
        latency_ns,
        latency_us,
        latency_ms,
    }
}

fn dir(d: &DirStats, window: Duration, bw: &[f64], iops: &[f64], group_bw: f64, plus: bool) -> Dir {
    let secs = window.as_secs_f64();
    let moved = d.ios > 0 && secs > 0.0;
    let bw_bytes = if moved { (d.bytes as f64 / secs) as u64 } else { 0 };
    let (bw_min, bw_max, bw_mean, bw_dev) = sample_stats(bw);
    let (iops_min, iops_max, iops_mean, iops_stddev) = sample_stats(iops);
    let bw_agg = if group_bw > 0.0 { (bw_mean / group_bw * 100.0).min(100.0) } else { 0.0 };
    Dir {
        io_bytes: d.bytes,
        io_kbytes: d.bytes >> 10,
        bw_bytes,
        bw: bw_bytes >> 10,
        iops: if moved { d.ios as f64 / secs } else { 0.0 },
        runtime: if d.ios > 0 { window.as_millis() as u64 } else { 0 },
        total_ios: d.ios,
        short_ios: 0,
        drop_ios: 0,
        slat_ns: Lat::default(),
        clat_ns: lat(&d.hist, true, plus),
        lat_ns: lat(&d.hist, false, false),
        bw_min: bw_min.round() as u64,
        bw_max: bw_max.round() as u64,
        bw_agg,
        bw_mean,
        bw_dev,
        bw_samples: bw.len() as u64,
        iops_min: iops_min.round() as u64,
        iops_max: iops_max.round() as u64,
        iops_mean,
        iops_stddev,
        iops_samples: iops.len() as u64,
    }
}

/// fio's latency object; with `percentiles` fio's default list, with `bins` (json+) every
/// recorded bucket, keyed by the highest latency it holds.
fn lat(h: &Histogram<u64>, percentiles: bool, bins: bool) -> Lat {
    if h.is_empty() {
        return Lat::default();
    }
    Lat {
        min: h.min(),
        max: h.max(),
        mean: h.mean(),
        stddev: h.stdev(),
        n: h.len(),
        percentile: percentiles.then(|| {
            Ordered(PERCENTILES.iter().map(|&p| (format!("{p:.6}"), h.value_at_quantile(p / 100.0))).collect())
        }),
        bins: bins.then(|| {
            Ordered(h.iter_recorded().map(|v| (v.value_iterated_to().to_string(), v.count_at_value())).collect())
        }),
    }
}

/// fio's `latency_ns`, `latency_us` and `latency_ms`: the share (percent) of all I/Os whose
/// latency falls below each bound and at or above the one before (`>=2000` ms: the rest).
fn latency_buckets(h: &Histogram<u64>) -> (Ordered<f64>, Ordered<f64>, Ordered<f64>) {
    const BOUNDS: [u64; 10] = [2, 4, 10, 20, 50, 100, 250, 500, 750, 1000];
    // Upper bounds in ns, in order, each with its table and key.
    let mut bounds: Vec<(usize, String, u64)> = Vec::new();
    for (table, scale) in [(0, 1u64), (1, 1_000), (2, 1_000_000)] {
        for b in BOUNDS {
            bounds.push((table, b.to_string(), b * scale));
        }
    }
    bounds.push((2, "2000".into(), 2_000_000_000));
    bounds.push((2, ">=2000".into(), u64::MAX));
    let mut counts = vec![0u64; bounds.len()];
    for v in h.iter_recorded() {
        // Each bucket of the histogram counts once, by the highest latency it holds.
        let i = bounds.iter().position(|b| v.value_iterated_to() < b.2).unwrap_or(bounds.len() - 1);
        counts[i] += v.count_at_value();
    }
    let total = h.len().max(1) as f64;
    let mut tables = [Ordered::default(), Ordered::default(), Ordered::default()];
    for ((table, key, _), n) in bounds.into_iter().zip(counts) {
        tables[table].0.push((key, n as f64 * 100.0 / total));
    }
    let [ns, us, ms] = tables;
    (ns, us, ms)
}

/// `Thu Dec  3 09:08:11 2026`, as fio's `time` (ctime's layout), in UTC.
fn ctime_utc(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    let days = secs / 86_400;
    let rest = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{} {} {:>2} {:02}:{:02}:{:02} {year}",
        DAYS[(days % 7) as usize],
        MONTHS[(month - 1) as usize],
        day,
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ctime_layout_in_utc() {
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime_utc(1_796_288_891), "Thu Dec  3 09:08:11 2026");
        assert_eq!(ctime_utc(951_782_400), "Tue Feb 29 00:00:00 2000");
    }

    /// Catches buckets that count an I/O twice (adjacent ranges overlapping at HdrHistogram's
    /// resolution) or not at all, and fio's bucket meaning (below the key, at or above the key
    /// before) turned around.
    #[test]
    fn latency_buckets_add_up_to_all_ios() {
        let mut d = DirStats::new();
        for ns in [1u64, 3, 45, 999, 1000, 49_999, 50_000, 3_000_000_000] {
            d.record(Duration::from_nanos(ns), 4096);
        }
        let (ns, us, ms) = latency_buckets(&d.hist);
        let total: f64 = ns.0.iter().chain(&us.0).chain(&ms.0).map(|(_, p)| p).sum();
        assert!((total - 100.0).abs() < 1e-9, "{total}");
        let get = |o: &Ordered<f64>, k: &str| o.0.iter().find(|(key, _)| key == k).unwrap().1;
        assert_eq!(get(&ns, "2"), 12.5); // 1 ns
        assert_eq!(get(&ns, "4"), 12.5); // 3 ns
        assert_eq!(get(&ns, "50"), 12.5); // 45 ns
        assert_eq!(get(&ns, "1000"), 12.5); // 999 ns
        assert_eq!(get(&us, "2"), 12.5); // 1 us
        assert_eq!(get(&us, "50") + get(&us, "100"), 25.0); // 49.999 us, 50 us (to 0.1%)
        assert_eq!(get(&ms, ">=2000"), 12.5); // 3 s
    }
}
