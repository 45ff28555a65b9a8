//! What to run: the workload and its parameters ([`Spec`]), checked on their own and then
//! against the volume's geometry into a [`Plan`], before any I/O.

use std::fmt;
use std::time::Duration;

use rblk_initiator::{Geometry, MAX_DEPTH};

use crate::pattern;
use crate::{Error, Result};

/// Most jobs (threads, each with its own queue pair).
pub const MAX_JOBS: u32 = 256;

/// The I/O pattern (`--rw`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    #[value(name = "randread")]
    RandRead,
    /// Random writes.
    #[value(name = "randwrite")]
    RandWrite,
    /// Random reads and writes, --rwmixread percent reads.
    #[value(name = "randrw")]
    RandRw,
    /// Sequential discards (fio's `trim`): each I/O a DISCARD of --bs bytes, which the target
    /// zeroes; needs a target with discard.
    Trim,
    /// Random discards (fio's `randtrim`).
    #[value(name = "randtrim")]
    RandTrim,
}

impl Workload {
    /// Offsets drawn at random (else sequential).
    pub fn is_random(self) -> bool {
        matches!(self, Workload::RandRead | Workload::RandWrite | Workload::RandRw | Workload::RandTrim)
    }

    /// Whether the workload changes the volume (and so needs a read-write open).
    pub fn writes(self) -> bool {
        !matches!(self, Workload::Read | Workload::RandRead)
    }

    /// Whether the workload discards (and does nothing else).
    pub fn trims(self) -> bool {
        matches!(self, Workload::Trim | Workload::RandTrim)
    }

    /// The name `--rw` takes.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Read => "read",
            Workload::Write => "write",
            Workload::RandRead => "randread",
            Workload::RandWrite => "randwrite",
            Workload::RandRw => "randrw",
            Workload::Trim => "trim",
            Workload::RandTrim => "randtrim",
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Per-direction limits of a job (fio's `rate` and `rate_iops`): each job thread is paced on
/// its own, and a mixed job's reads and writes each against their own limit. `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rate {
    /// I/Os per second: reads, writes.
    pub iops: [Option<u64>; 2],
    /// Bytes per second: reads, writes.
    pub bytes: [Option<u64>; 2],
}

impl Rate {
    /// fio's `rate_iops` form: `N` (reads and writes each), `R,W` (either may be empty: no
    /// limit), whole I/Os per second; 0 is no limit, as in fio.
    pub fn parse_iops(text: &str) -> std::result::Result<[Option<u64>; 2], String> {
        per_direction(text, |t| whole_number(t, 0, u64::MAX).map_err(|e| format!("{e} (I/Os per second)")))
    }

    /// fio's `rate` form: as [`parse_iops`](Self::parse_iops), in bytes per second with size
    /// suffixes (`500k`, `10M`: powers of 1024, as fio's default kb_base).
    pub fn parse_bytes(text: &str) -> std::result::Result<[Option<u64>; 2], String> {
        per_direction(text, |t| {
            rblk_initiator::parse_size(t).map_err(|e| format!("must be bytes per second (500k, 10M): {e}"))
        })
    }

    /// `[reads, writes]` as fio spells it: `N` when both are the same, else `R,W`.
    pub fn text(v: [Option<u64>; 2], unit: impl Fn(u64) -> String) -> String {
        let one = |x: Option<u64>| x.map_or(String::new(), &unit);
        if v[0] == v[1] {
            one(v[0])
        } else {
            format!("{},{}", one(v[0]), one(v[1]))
        }
    }

    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.iops.iter().chain(&self.bytes).any(Option::is_some)
    }
}

/// fio's `r,w,t` form of a per-direction value; trims are not paced yet.
fn per_direction(
    text: &str,
    one: impl Fn(&str) -> std::result::Result<u64, String>,
) -> std::result::Result<[Option<u64>; 2], String> {
    let value = |p: &str| -> std::result::Result<Option<u64>, String> {
        let p = p.trim();
        if p.is_empty() {
            return Ok(None);
        }
        one(p).map(|n| (n > 0).then_some(n))
    };
    match text.split(',').collect::<Vec<_>>()[..] {
        [all] if all.trim().is_empty() => Err("needs a value".into()),
        [all] => {
            let v = value(all)?;
            Ok([v, v])
        }
        [r, w] => Ok([value(r)?, value(w)?]),
        [r, w, t] if t.trim().is_empty() => Ok([value(r)?, value(w)?]),
        [_, _, _] => {
            Err("a trim rate is not supported yet (reads and writes are paced): give READ or READ,WRITE".into())
        }
        _ => Err("at most READ,WRITE".into()),
    }
}

/// fio's `bssplit`: for reads and for writes, the I/O sizes and the share of I/Os (percent,
/// adding up to 100) each gets. `None` for a direction: every I/O of it is `bs`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BsSplit {
    /// Reads, writes: `(size, percent)`.
    pub dirs: [Option<Vec<(u64, u8)>>; 2],
}

impl BsSplit {
    /// Parses fio's form: `SIZE/PCT:SIZE/PCT...`, for reads and writes alike, or
    /// `READS,WRITES` (either may be empty: that direction uses `bs`). A size without a
    /// percentage shares what the others leave, equally (as fio does).
    pub fn parse(text: &str) -> std::result::Result<BsSplit, String> {
        let parts: Vec<&str> = text.split(',').collect();
        let list = |part: &str| -> std::result::Result<Option<Vec<(u64, u8)>>, String> {
            let part = part.trim();
            if part.is_empty() {
                return Ok(None);
            }
            let mut given = Vec::new();
            for entry in part.split(':') {
                let (size, pct) = match entry.split_once('/') {
                    Some((s, p)) => (s.trim(), Some(p.trim()).filter(|p| !p.is_empty())),
                    None => (entry.trim(), None),
                };
                let size = rblk_initiator::parse_size(size).map_err(|e| format!("{entry:?}: {e}"))?;
                if size == 0 {
                    return Err(format!("{entry:?}: a size of zero"));
                }
                let pct = match pct {
                    None => None,
                    Some(p) => Some(
                        p.parse::<u8>()
                            .ok()
                            .filter(|&p| p <= 100)
                            .ok_or_else(|| format!("{entry:?}: the share must be a percentage, 0 to 100"))?,
                    ),
                };
                given.push((size, pct));
            }
            let sum: u32 = given.iter().filter_map(|(_, p)| p.map(u32::from)).sum();
            let missing = given.iter().filter(|(_, p)| p.is_none()).count() as u32;
            if sum > 100 || (missing == 0 && sum != 100) {
                return Err(format!("{part:?}: the shares must add up to 100 (they add up to {sum})"));
            }
            // What the given shares leave, equally; the remainder of the division to the first.
            let share = (100 - sum).checked_div(missing).unwrap_or(0);
            let mut extra = (100 - sum).checked_rem(missing).unwrap_or(0);
            Ok(Some(
                given
                    .into_iter()
                    .map(|(s, p)| {
                        let p = p.unwrap_or_else(|| {
                            let e = u8::from(extra > 0);
                            extra = extra.saturating_sub(1);
                            share as u8 + e
                        });
                        (s, p)
                    })
                    .collect(),
            ))
        };
        match parts[..] {
            [all] => {
                let l = list(all)?.ok_or("no sizes given")?;
                Ok(BsSplit { dirs: [Some(l.clone()), Some(l)] })
            }
            [r, w] => Ok(BsSplit { dirs: [list(r)?, list(w)?] }),
            [r, w, t] if t.trim().is_empty() => Ok(BsSplit { dirs: [list(r)?, list(w)?] }),
            [_, _, _] => Err("a trim part is not supported yet (trims use bs): give READS or READS,WRITES".into()),
            _ => Err("at most READS,WRITES (two comma-separated lists)".into()),
        }
    }

    /// The sizes of direction `d` (0 reads, 1 writes) with their shares, `bs` where none given.
    pub fn sizes(&self, d: usize, bs: u64) -> Vec<(u64, u8)> {
        self.dirs[d].clone().unwrap_or_else(|| vec![(bs, 100)])
    }
}

impl fmt::Display for BsSplit {
    /// fio's spelling: `4k/75:64k/25`, or `READS,WRITES` when they differ.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let list = |l: &Option<Vec<(u64, u8)>>| {
            l.as_ref().map_or(String::new(), |l| {
                l.iter().map(|(s, p)| format!("{}/{p}", crate::cli::size_text(*s))).collect::<Vec<_>>().join(":")
            })
        };
        let [r, w] = &self.dirs;
        if r == w {
            f.write_str(&list(r))
        } else {
            write!(f, "{},{}", list(r), list(w))
        }
    }
}

/// When a job's measured window ends: after `runtime`, or after moving `bytes`, whichever
/// comes first (at least one is set). See [`Spec::stop`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stop {
    /// After this long (measured after the ramp).
    pub runtime: Option<Duration>,
    /// After transferring this many bytes (counted after the ramp), per job.
    pub bytes: Option<u64>,
}

/// A run's parameters, as given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// The I/O pattern.
    pub workload: Workload,
    /// Percentage of reads for [`Workload::RandRw`] (`None`: 50); refused for other workloads.
    pub rwmixread: Option<u8>,
    /// Bytes per I/O.
    pub bs: u64,
    /// I/Os outstanding per job.
    pub iodepth: u32,
    /// Jobs: threads with a queue each, on disjoint slices of the volume.
    pub jobs: u32,
    /// Measure this long after the ramp (fio's `runtime`); `None`: until `size` is moved.
    pub runtime: Option<Duration>,
    /// Bytes per job, as fio's `size`: the region of its slice a job works in and, unless
    /// `time_based`, the bytes it moves after the ramp (the first of this and `runtime` ends the
    /// window).
    pub size: Option<u64>,
    /// fio's `time_based`: run for the whole `runtime` even when `size` is moved (`size` then
    /// only bounds the region).
    pub time_based: bool,
    /// Run this long before measuring.
    pub ramp: Duration,
    /// Write the self-describing pattern and check every block read (see the crate docs).
    pub verify: bool,
    /// The generation written, or expected by reads; `None`: a fresh one for writes, any for reads.
    pub generation: Option<u64>,
    /// Seeds the offsets and the read/write mix.
    pub seed: u64,
    /// fio's `rate_iops` and `rate`, per job thread.
    pub rate: Rate,
    /// fio's `bssplit`: I/O sizes and their shares, instead of `bs` alone.
    pub bssplit: Option<BsSplit>,
}

impl Default for Spec {
    /// 4 KiB random reads at depth 32, one job, 10 s.
    fn default() -> Self {
        Spec {
            workload: Workload::RandRead,
            rwmixread: None,
            bs: 4096,
            iodepth: 32,
            jobs: 1,
            runtime: Some(Duration::from_secs(10)),
            size: None,
            time_based: false,
            ramp: Duration::ZERO,
            verify: false,
            generation: None,
            seed: 1,
            rate: Rate::default(),
            bssplit: None,
        }
    }
}

fn invalid<T>(text: String) -> Result<T> {
    Err(Error::Invalid(text))
}

/// A refusal of one option's value: `text` names it as a flag (`--iodepth ...`).
fn bad_value<T>(option: &'static str, text: String) -> Result<T> {
    Err(Error::Value { option, text })
}

/// Most I/Os in flight per job.
pub const MAX_IODEPTH: u32 = MAX_DEPTH;

/// `text` as a whole number from `lo` to `hi`, or what is wanted ("must be a whole number from
/// 1 to 1024"): the one wording of the command line's value parsers and the job file's.
pub(crate) fn whole_number(text: &str, lo: u64, hi: u64) -> std::result::Result<u64, String> {
    let wanted = || {
        if hi == u64::MAX {
            format!("must be a whole number from {lo} up")
        } else {
            format!("must be a whole number from {lo} to {hi}")
        }
    };
    text.trim().parse::<u64>().ok().filter(|n| (lo..=hi).contains(n)).ok_or_else(wanted)
}

impl Spec {
    /// The share of reads in percent: 100 for read workloads, 0 for write and trim workloads.
    pub fn read_percent(&self) -> u8 {
        match self.workload {
            Workload::Read | Workload::RandRead => 100,
            Workload::Write | Workload::RandWrite | Workload::Trim | Workload::RandTrim => 0,
            Workload::RandRw => self.rwmixread.unwrap_or(50),
        }
    }

    /// The directions the workload does, by index ([`crate::stats::DIRS`]: read, write, trim).
    pub(crate) fn dirs(&self) -> [bool; crate::stats::DIRS] {
        if self.workload.trims() {
            return [false, false, true];
        }
        let read = self.read_percent();
        [read > 0, read < 100, false]
    }

    /// When each job's measured window ends.
    pub fn stop(&self) -> Stop {
        Stop { runtime: self.runtime, bytes: if self.time_based { None } else { self.size } }
    }

    /// The smallest I/O (`bs`, or the smallest size of `bssplit`): offsets are multiples of it.
    pub fn min_bs(&self) -> u64 {
        self.sizes().map(|(s, _)| s).min().unwrap_or(self.bs)
    }

    /// The largest I/O: the size of the jobs' buffers.
    pub fn max_bs(&self) -> u64 {
        self.sizes().map(|(s, _)| s).max().unwrap_or(self.bs)
    }

    /// Every size the workload's directions use, with its share (bs alone without bssplit).
    fn sizes(&self) -> impl Iterator<Item = (u64, u8)> + '_ {
        let dirs = self.dirs();
        (0..2).filter(move |&d| dirs[d]).flat_map(move |d| match &self.bssplit {
            Some(b) => b.sizes(d, self.bs),
            None => vec![(self.bs, 100)],
        })
    }

    /// Checks what does not depend on the volume.
    pub fn check(&self) -> Result<()> {
        if self.iodepth == 0 || self.iodepth > MAX_DEPTH {
            return bad_value(
                "iodepth",
                format!("--iodepth must be a whole number from 1 to {MAX_DEPTH}, got {}", self.iodepth),
            );
        }
        if self.jobs == 0 || self.jobs > MAX_JOBS {
            return bad_value(
                "numjobs",
                format!("--numjobs must be a whole number from 1 to {MAX_JOBS}, got {}", self.jobs),
            );
        }
        if self.bs == 0 {
            return bad_value("bs", "--bs must not be zero".into());
        }
        match self.rwmixread {
            Some(p) if p > 100 => {
                return bad_value("rwmixread", format!("--rwmixread must be a percentage, 0 to 100, got {p}"))
            }
            Some(_) if self.workload != Workload::RandRw => {
                return bad_value(
                    "rwmixread",
                    format!("--rwmixread and --rwmixwrite apply only to --rw randrw (not {})", self.workload),
                )
            }
            _ => {}
        }
        if let Some(b) = &self.bssplit {
            if self.workload.trims() {
                return bad_value("bssplit", format!("--bssplit: --rw {}'s discards use --bs alone", self.workload));
            }
            if b.dirs.iter().flatten().flatten().any(|&(s, _)| s == 0) {
                return bad_value("bssplit", "--bssplit: a size of zero".into());
            }
            let min = self.min_bs();
            if let Some(s) = b.dirs.iter().flatten().flatten().map(|&(s, _)| s).find(|s| s % min != 0) {
                return bad_value(
                    "bssplit",
                    format!("--bssplit: {s} is not a multiple of its smallest size {min} (offsets are)"),
                );
            }
        }
        if self.runtime.is_some_and(|d| d.is_zero()) {
            return bad_value("runtime", "--runtime must be longer than zero".into());
        }
        let min = self.min_bs();
        match self.size {
            Some(0) => return bad_value("size", "--size must not be zero".into()),
            Some(s) if s % min != 0 => {
                let of = if self.bssplit.is_some() { "the smallest size of --bssplit" } else { "--bs" };
                return bad_value(
                    "size",
                    format!("--size {s} is not a multiple of {of}, {min} (each job transfers whole I/Os)"),
                );
            }
            None if self.runtime.is_none() => {
                return invalid("give --runtime or --size: nothing would end the run".into())
            }
            _ => {}
        }
        if self.time_based && self.runtime.is_none() {
            return invalid("--time_based needs --runtime (without one it would never end)".into());
        }
        if self.generation.is_some() && !self.verify {
            return invalid("--generation only means something with --verify".into());
        }
        if self.verify && self.workload.trims() {
            return invalid(format!("--verify checks data written or read; --rw {} has none", self.workload));
        }
        if self.rate.is_set() && self.workload.trims() {
            return invalid(format!(
                "--rate and --rate-iops pace reads and writes; pacing --rw {}'s discards is not supported yet",
                self.workload
            ));
        }
        Ok(())
    }

    /// Checks the spec against the volume and lays out the jobs' slices.
    pub fn plan(&self, geo: Geometry) -> Result<Plan> {
        self.check()?;
        let block = u64::from(geo.block_size);
        // A discard is one request of the control channel, up to its largest range.
        let max = if self.workload.trims() { rblk_initiator::MAX_ZERO_LEN } else { u64::from(geo.max_io) };
        let (option, flag) = if self.bssplit.is_some() { ("bssplit", "--bssplit: a size of") } else { ("bs", "--bs") };
        for bs in [self.min_bs(), self.max_bs()] {
            if bs % block != 0 {
                return bad_value(
                    option,
                    format!("{flag} {bs} is not a multiple of the volume's block size ({block} bytes)"),
                );
            }
            if bs > max {
                let what = if self.workload.trims() { "discard (MAX_ZERO_LEN" } else { "I/O (max_io" };
                return bad_value(
                    option,
                    format!("{flag} {bs} is larger than the volume's largest {what} {max} bytes)"),
                );
            }
        }
        if let Some(size) = self.size {
            if size > geo.size {
                return bad_value("size", format!("--size {size} is larger than the volume ({} bytes)", geo.size));
            }
        }
        if self.workload.writes() && geo.read_only {
            return invalid(format!("--rw {} writes, but the volume is read-only", self.workload));
        }
        if self.verify && (block < pattern::MIN_BLOCK as u64 || block % 8 != 0) {
            return invalid(format!(
                "--verify needs blocks of at least {} bytes, a multiple of 8 (the volume's are {block})",
                pattern::MIN_BLOCK
            ));
        }
        // As fio's size: the job's region is at most `size` (a multiple of the smallest I/O,
        // checked above), in whole smallest I/Os, and holds at least the largest.
        let (min, max) = (self.min_bs(), self.max_bs());
        let slice = (geo.size / u64::from(self.jobs) / min * min).min(self.size.unwrap_or(u64::MAX));
        if slice < max {
            return invalid(format!(
                "the volume ({} bytes) is too small for {} jobs of {max}-byte I/Os: each job needs a slice of at least one I/O",
                geo.size, self.jobs
            ));
        }
        Ok(Plan { spec: self.clone(), geometry: geo, slice })
    }
}

/// A spec checked against a volume: job `j` works in bytes `j * slice .. j * slice + slice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The parameters.
    pub spec: Spec,
    /// The volume's.
    pub geometry: Geometry,
    /// Bytes of the volume each job works in (a multiple of `bs`).
    pub slice: u64,
}

impl Plan {
    /// Units of the smallest I/O in each job's slice (offsets are multiples of it).
    pub fn units(&self) -> u64 {
        self.slice / self.spec.min_bs()
    }

    /// The first byte of job `job`'s slice.
    pub fn base(&self, job: u32) -> u64 {
        u64::from(job) * self.slice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEO: Geometry = Geometry { size: 64 << 20, block_size: 4096, max_io: 1 << 20, read_only: false };

    fn refused(spec: Spec, geo: Geometry, needle: &str) {
        match spec.plan(geo) {
            Err(Error::Invalid(text) | Error::Value { text, .. }) => {
                assert!(text.contains(needle), "{needle:?} not in {text:?}")
            }
            other => panic!("expected a refusal containing {needle:?}, got {other:?}"),
        }
    }

    #[test]
    fn defaults_plan() {
        let plan = Spec::default().plan(GEO).unwrap();
        assert_eq!(plan.slice, 64 << 20);
        assert_eq!(plan.units(), (64 << 20) / 4096);
        let four = Spec { jobs: 3, bs: 65536, ..Spec::default() }.plan(GEO).unwrap();
        assert_eq!(four.slice % 65536, 0);
        assert!(four.slice * 3 <= GEO.size && four.base(2) + four.slice <= GEO.size);
    }

    #[test]
    fn refuses_bad_arguments_with_reasons() {
        let d = Spec::default();
        refused(Spec { bs: 6144, ..d.clone() }, GEO, "--bs 6144 is not a multiple of the volume's block size (4096");
        refused(Spec { bs: 2 << 20, ..d.clone() }, GEO, "larger than the volume's largest I/O (max_io 1048576");
        refused(Spec { bs: 0, ..d.clone() }, GEO, "--bs must not be zero");
        refused(Spec { iodepth: 0, ..d.clone() }, GEO, "--iodepth must be a whole number from 1 to 1024, got 0");
        refused(Spec { iodepth: 4096, ..d.clone() }, GEO, "--iodepth must be a whole number from 1 to 1024");
        refused(Spec { jobs: 0, ..d.clone() }, GEO, "--numjobs must be a whole number from 1");
        refused(Spec { size: Some(128 << 20), ..d.clone() }, GEO, "--size 134217728 is larger than the volume");
        refused(Spec { size: Some(6144), ..d.clone() }, GEO, "not a multiple of --bs, 4096");
        refused(Spec { size: Some(0), ..d.clone() }, GEO, "--size must not be zero");
        refused(Spec { runtime: Some(Duration::ZERO), ..d.clone() }, GEO, "--runtime must be longer");
        refused(Spec { runtime: None, ..d.clone() }, GEO, "give --runtime or --size");
        refused(Spec { runtime: None, size: Some(4096), time_based: true, ..d.clone() }, GEO, "--time_based needs");
        refused(
            Spec { rwmixread: Some(70), ..d.clone() },
            GEO,
            "--rwmixread and --rwmixwrite apply only to --rw randrw",
        );
        let rw = Spec { workload: Workload::RandRw, ..d.clone() };
        refused(Spec { rwmixread: Some(101), ..rw.clone() }, GEO, "0 to 100, got 101");
        assert_eq!(Spec { rwmixread: Some(70), ..rw.clone() }.plan(GEO).unwrap().spec.read_percent(), 70);
        assert_eq!(rw.read_percent(), 50);
        refused(Spec { generation: Some(3), ..d.clone() }, GEO, "--generation only means something with --verify");
        let ro = Geometry { read_only: true, ..GEO };
        refused(Spec { workload: Workload::Write, ..d.clone() }, ro, "the volume is read-only");
        Spec { workload: Workload::Read, ..d.clone() }.plan(ro).unwrap();
        // fio's size: the region, and the amount unless time_based.
        let sized = Spec { size: Some(1 << 20), ..d.clone() };
        assert_eq!(sized.plan(GEO).unwrap().slice, 1 << 20);
        let ten = Some(Duration::from_secs(10));
        assert_eq!(sized.stop(), Stop { runtime: ten, bytes: Some(1 << 20) });
        assert_eq!(Spec { time_based: true, ..sized.clone() }.stop(), Stop { runtime: ten, bytes: None });
        assert_eq!(Spec { runtime: None, ..sized }.stop(), Stop { runtime: None, bytes: Some(1 << 20) });
        let tiny = Geometry { size: 3 * 4096, ..GEO };
        refused(Spec { jobs: 4, ..d.clone() }, tiny, "too small for 4 jobs");
        let small_blocks = Geometry { block_size: 32, ..GEO };
        refused(Spec { verify: true, ..d.clone() }, small_blocks, "--verify needs blocks of at least 64");
    }
}
