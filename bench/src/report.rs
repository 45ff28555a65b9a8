//! The results of a run: a fio-style text report and the same figures as JSON (the field names
//! are documented in the crate docs).

use std::fmt::Write as _;
use std::time::{Duration, SystemTime};

use rblk_initiator::{Bytes, Wait};
use serde::Serialize;

use crate::stats::{DirStats, Rates, ThreadUsage};

/// Everything a run measured. Serializes to the deprecated `--json` document (rblk-bench's own
/// layout); [`crate::fio`] writes fio's from the same figures and [`Report::threads`].
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// rblk's version (this crate's).
    pub rblk_version: String,
    /// The command line, one argument per element.
    pub command_line: Vec<String>,
    /// The volume's URI.
    pub uri: String,
    /// The RDMA device (`--device`, else the only one, else the one holding the target's
    /// address), or `None` when unknown.
    pub device: Option<String>,
    /// The volume.
    pub volume: VolumeInfo,
    /// The parameters.
    pub job: JobInfo,
    /// Length of the measured window in seconds (after the ramp; for `--size`, until the last
    /// job's last I/O).
    pub elapsed_s: f64,
    /// Reads in the measured window.
    pub read: DirReport,
    /// Writes in the measured window.
    pub write: DirReport,
    /// Discards in the measured window (`--rw trim` and `randtrim`; zeros otherwise, and then
    /// left out of the JSON, whose layout predates them).
    #[serde(skip_serializing_if = "DirReport::is_empty")]
    pub trim: DirReport,
    /// Every direction.
    pub total: Totals,
    /// rblk-bench's own CPU time over the measured window (all jobs and the main thread): what
    /// the initiator spends polling and posting. `None` only if the window was never marked.
    pub cpu: Option<CpuUse>,
    /// The target's CPU time over the measured window (from STATS), if the target answered.
    pub target_cpu: Option<CpuUse>,
    /// Verification results, with `--verify`.
    pub verify: Option<VerifyReport>,
    /// Each job's own figures, for fio's layout (job `j` at index `j`).
    #[serde(skip)]
    pub threads: Vec<ThreadReport>,
    /// When the run began (before connecting).
    #[serde(skip)]
    pub started: SystemTime,
    /// When it ended (the volume closed).
    #[serde(skip)]
    pub ended: SystemTime,
}

/// One job's (thread's) figures over its measured window: what fio reports per job.
#[derive(Debug, Clone)]
pub struct ThreadReport {
    /// By direction ([`crate::stats::DIRS`]: read, write, trim).
    pub(crate) stats: [DirStats; crate::stats::DIRS],
    pub(crate) window: Duration,
    pub(crate) rates: Rates,
    pub(crate) usage: Option<ThreadUsage>,
}

/// The volume as OPENED describes it.
#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    /// Bytes.
    pub size: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Largest I/O in bytes.
    pub max_io: u32,
    /// RAM only.
    pub volatile: bool,
}

/// The run's parameters.
#[derive(Debug, Clone, Serialize)]
pub struct JobInfo {
    /// `read`, `write`, `randread`, `randwrite` or `randrw`.
    pub rw: String,
    /// Percentage of reads.
    pub rwmixread: u8,
    /// Bytes per I/O.
    pub bs: u64,
    /// `--bssplit` as fio spells it (`4k/75:64k/25`), when given: it decides the sizes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bssplit: Option<String>,
    /// `--rate-iops` as fio spells it (`2000`, `R,W`), per job thread, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_iops: Option<String>,
    /// `--rate` in bytes per second as fio spells it (`1M`, `R,W`), per job thread, when given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Outstanding I/Os per job.
    pub iodepth: u32,
    /// Jobs.
    pub jobs: u32,
    /// `--runtime` in seconds, or `None` without one.
    pub runtime_s: Option<f64>,
    /// `--size` in bytes per job, or `None` without one.
    pub size: Option<u64>,
    /// `--time_based` (not in the `--json` document, which predates it).
    #[serde(skip)]
    pub time_based: bool,
    /// `--ramp` in seconds.
    pub ramp_s: f64,
    /// `--verify`.
    pub verify: bool,
    /// `--seed`.
    pub seed: u64,
    /// How long waits spin before sleeping, microseconds.
    pub spin_us: f64,
    /// `--wait`: sleep, adaptive or poll (`--poll`).
    pub wait: &'static str,
    /// Bytes of the volume each job works in.
    pub slice: u64,
}

/// Figures of one direction.
#[derive(Debug, Clone, Serialize)]
pub struct DirReport {
    /// I/Os completed in the window.
    pub ios: u64,
    /// Bytes moved in the window.
    pub bytes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB (2^20 bytes) per second.
    pub bw_mib_s: f64,
    /// MB (10^6 bytes) per second.
    pub bw_mb_s: f64,
    /// Latency from submission to reap, or `None` without I/Os.
    pub lat_us: Option<Latency>,
    /// The latency distribution, for a CDF: `[latency_us, fraction of I/Os at or below it]`
    /// pairs in increasing order, ending at `[max, 1.0]` (HdrHistogram's percentile
    /// distribution, 5 steps per halving of the tail); empty without I/Os.
    pub lat_cdf: Vec<[f64; 2]>,
}

impl DirReport {
    /// No I/O of this direction completed.
    pub fn is_empty(&self) -> bool {
        self.ios == 0
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Latency {
    /// Smallest.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p99_9: f64,
    /// 99.99th percentile.
    pub p99_99: f64,
    /// Largest.
    pub max: f64,
}

/// Both directions together.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    /// I/Os.
    pub ios: u64,
    /// Bytes.
    pub bytes: u64,
    /// I/Os per second.
    pub iops: f64,
    /// MiB per second.
    pub bw_mib_s: f64,
    /// MB per second.
    pub bw_mb_s: f64,
}

/// A process's CPU time over the measured window: rblk-bench's own (from `getrusage`), or the
/// target's (from the STATS taken at the start and at the end of the window).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct CpuUse {
    /// User time, seconds.
    pub user_s: f64,
    /// System time, seconds.
    pub system_s: f64,
    /// Wall time between the two marks, seconds.
    pub wall_s: f64,
    /// (user + system) / wall: 0.01 is 1% of one core.
    pub share_of_core: f64,
}

/// What `--verify` found.
#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    /// The generation written, or required of reads (`None`: reads accepted any).
    pub generation: Option<u64>,
    /// Smallest and largest generation found in good blocks.
    pub generations_seen: Option<[u64; 2]>,
    /// Blocks (of the volume's block size) checked.
    pub blocks_checked: u64,
    /// Blocks that failed.
    pub mismatches: u64,
    /// The first failures (up to 10 per job).
    pub first_mismatches: Vec<MismatchReport>,
}

/// One failed block.
#[derive(Debug, Clone, Serialize)]
pub struct MismatchReport {
    /// Its volume offset.
    pub offset: u64,
    /// What is wrong.
    pub problem: String,
}

impl Report {
    /// False when `--verify` found a bad block.
    pub fn passed(&self) -> bool {
        self.verify.as_ref().is_none_or(|v| v.mismatches == 0)
    }

    /// The report as fio users know it.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let j = &self.job;
        let mut stop = Vec::new();
        if let Some(r) = j.runtime_s {
            stop.push(format!("runtime={r}s"));
        }
        if let Some(size) = j.size {
            stop.push(format!("size={:#.1}", Bytes(size)));
        }
        if j.time_based {
            stop.push("time_based".into());
        }
        let stop = stop.join(" ");
        let mut mix = if j.rw == "randrw" { format!(" rwmixread={}", j.rwmixread) } else { String::new() };
        let bs = match &j.bssplit {
            Some(split) => format!("bssplit={split}"),
            None => format!("bs={:#.1}", Bytes(j.bs)),
        };
        for (name, v) in [("rate_iops", &j.rate_iops), ("rate", &j.rate)] {
            if let Some(v) = v {
                mix.push_str(&format!(" {name}={v}"));
            }
        }
        let _ = writeln!(
            s,
            "rblk-bench: rw={}{mix} {bs} iodepth={} jobs={} {stop}{}{}{}",
            j.rw,
            j.iodepth,
            j.jobs,
            if j.ramp_s > 0.0 { format!(" ramp={}s", j.ramp_s) } else { String::new() },
            if j.verify { " verify" } else { "" },
            if j.wait == Wait::default().name() { String::new() } else { format!(" wait={}", j.wait) },
        );
        let v = &self.volume;
        let _ = writeln!(
            s,
            "  volume {} ({:#.1}, block {}, max_io {:#.1}{}){}",
            self.uri,
            Bytes(v.size),
            v.block_size,
            Bytes(v.max_io.into()),
            if v.volatile { ", volatile" } else { "" },
            self.device.as_deref().map(|d| format!(" via {d}")).unwrap_or_default(),
        );
        for (name, d) in [("read", &self.read), ("write", &self.write), ("trim", &self.trim)] {
            let Some(lat) = &d.lat_us else { continue };
            let _ = writeln!(
                s,
                "  {name}: IOPS={}, BW={:.1}MiB/s ({:.1}MB/s)({:#.1}/{:.1}s)",
                human_count(d.iops),
                d.bw_mib_s,
                d.bw_mb_s,
                Bytes(d.bytes),
                self.elapsed_s
            );
            let _ = writeln!(s, "    lat (usec): min={:.1}, avg={:.1}, max={:.1}", lat.min, lat.mean, lat.max);
            let _ = writeln!(
                s,
                "    lat percentiles (usec): 50.00th=[{:.1}], 90.00th=[{:.1}], 99.00th=[{:.1}], 99.90th=[{:.1}], 99.99th=[{:.1}]",
                lat.p50, lat.p90, lat.p99, lat.p99_9, lat.p99_99
            );
        }
        if [&self.read, &self.write, &self.trim].iter().filter(|d| d.ios > 0).count() > 1 {
            let t = &self.total;
            let _ =
                writeln!(s, "  total: IOPS={}, BW={:.1}MiB/s ({:.1}MB/s)", human_count(t.iops), t.bw_mib_s, t.bw_mb_s);
        }
        if self.total.ios == 0 {
            let _ = writeln!(s, "  no I/O completed in the measured window");
        }
        if let Some(c) = &self.cpu {
            let _ = writeln!(
                s,
                "  cpu: {:.1}% of one core (user {:.3}s, sys {:.3}s over {:.1}s)",
                c.share_of_core * 100.0,
                c.user_s,
                c.system_s,
                c.wall_s
            );
        }
        match &self.target_cpu {
            Some(c) => {
                let _ = writeln!(
                    s,
                    "  target cpu: {:.3}% of one core (user {:.3}s, sys {:.3}s over {:.1}s)",
                    c.share_of_core * 100.0,
                    c.user_s,
                    c.system_s,
                    c.wall_s
                );
            }
            None => {
                let _ = writeln!(s, "  target cpu: unknown (STATS failed)");
            }
        }
        if let Some(v) = &self.verify {
            let generation = match (v.generation, v.generations_seen) {
                (Some(g), _) => format!("generation {g}"),
                (None, Some([lo, hi])) if lo == hi => format!("generation {lo} found"),
                (None, Some([lo, hi])) => format!("generations {lo}..{hi} found"),
                (None, None) => "no good block".into(),
            };
            let verdict = if v.mismatches == 0 { "OK" } else { "FAILED" };
            let _ =
                writeln!(s, "  verify: {verdict}: {} of {} blocks bad ({generation})", v.mismatches, v.blocks_checked);
            for m in &v.first_mismatches {
                let _ = writeln!(s, "    offset {} ({:#x}): {}", m.offset, m.offset, m.problem);
            }
            if v.mismatches > v.first_mismatches.len() as u64 {
                let _ = writeln!(s, "    ... and {} more", v.mismatches - v.first_mismatches.len() as u64);
            }
        }
        s
    }
}

pub(crate) fn dir_report(d: &DirStats, elapsed_s: f64) -> DirReport {
    let rate = |x: u64| if elapsed_s > 0.0 { x as f64 / elapsed_s } else { 0.0 };
    let us = |ns: u64| ns as f64 / 1000.0;
    let h = &d.hist;
    let lat_us = (d.ios > 0).then(|| Latency {
        min: us(h.min()),
        mean: h.mean() / 1000.0,
        p50: us(h.value_at_quantile(0.5)),
        p90: us(h.value_at_quantile(0.9)),
        p99: us(h.value_at_quantile(0.99)),
        p99_9: us(h.value_at_quantile(0.999)),
        p99_99: us(h.value_at_quantile(0.9999)),
        max: us(h.max()),
    });
    let mut lat_cdf: Vec<[f64; 2]> = Vec::new();
    if d.ios > 0 {
        for v in h.iter_quantiles(5) {
            let point = [us(h.highest_equivalent(v.value_iterated_to())), v.quantile()];
            match lat_cdf.last_mut() {
                Some(last) if last[0] == point[0] => *last = point,
                _ => lat_cdf.push(point),
            }
        }
    }
    DirReport {
        lat_cdf,
        ios: d.ios,
        bytes: d.bytes,
        iops: rate(d.ios),
        bw_mib_s: rate(d.bytes) / (1u64 << 20) as f64,
        bw_mb_s: rate(d.bytes) / 1e6,
        lat_us,
    }
}

/// 18300.0 -> "18.3k", as fio prints rates.
pub(crate) fn human_count(x: f64) -> String {
    match x {
        x if x >= 1e6 => format!("{:.2}M", x / 1e6),
        x if x >= 1e4 => format!("{:.1}k", x / 1e3),
        x if x >= 1e3 => format!("{:.2}k", x / 1e3),
        x => format!("{x:.0}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdf_rises_to_the_maximum() {
        let mut d = DirStats::new();
        for us in 1..=1000u64 {
            d.record(std::time::Duration::from_micros(us), 4096);
        }
        let r = dir_report(&d, 1.0);
        let cdf = &r.lat_cdf;
        assert!(cdf.len() > 20, "{cdf:?}");
        assert!(cdf.windows(2).all(|w| w[0][0] < w[1][0] && w[0][1] <= w[1][1]), "{cdf:?}");
        let [max, top] = *cdf.last().unwrap();
        assert_eq!(top, 1.0);
        assert!((max - r.lat_us.unwrap().max).abs() < 1e-9, "{max}");
        // Half of the I/Os took at most 500 us (within the histogram's 3 digits).
        let half = cdf.iter().find(|p| p[1] >= 0.5).unwrap();
        assert!((499.0..=501.0).contains(&half[0]), "{half:?}");
        assert!(dir_report(&DirStats::new(), 1.0).lat_cdf.is_empty());
    }

    #[test]
    fn human_units() {
        assert_eq!(human_count(18_312.0), "18.3k");
        assert_eq!(human_count(1_234.0), "1.23k");
        assert_eq!(human_count(999.4), "999");
        assert_eq!(human_count(2_500_000.0), "2.50M");
        // Byte counts are the project's one formatter, fio's way (no space, one decimal).
        for (n, want) in
            [(4096, "4KiB"), (1 << 30, "1GiB"), (1536, "1.5KiB"), (100, "100B"), (3 << 20 | 4096, "3.0MiB")]
        {
            assert_eq!(format!("{:#.1}", Bytes(n)), want);
        }
    }
}
