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
        }
    }
}

fn invalid<T>(text: String) -> Result<T> {
    Err(Error::Invalid(text))
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

    /// Checks what does not depend on the volume.
    pub fn check(&self) -> Result<()> {
        if self.iodepth == 0 || self.iodepth > MAX_DEPTH {
            return invalid(format!("--iodepth must be between 1 and {MAX_DEPTH} (got {})", self.iodepth));
        }
        if self.jobs == 0 || self.jobs > MAX_JOBS {
            return invalid(format!("--jobs must be between 1 and {MAX_JOBS} (got {})", self.jobs));
        }
        if self.bs == 0 {
            return invalid("--bs must not be zero".into());
        }
        match self.rwmixread {
            Some(p) if p > 100 => return invalid(format!("--rwmixread is a percentage, 0 to 100 (got {p})")),
            Some(_) if self.workload != Workload::RandRw => {
                return invalid(format!("--rwmixread applies only to --rw randrw (not {})", self.workload))
            }
            _ => {}
        }
        if self.runtime.is_some_and(|d| d.is_zero()) {
            return invalid("--runtime must be longer than zero".into());
        }
        match self.size {
            Some(0) => return invalid("--size must not be zero".into()),
            Some(s) if s % self.bs != 0 => {
                return invalid(format!(
                    "--size {s} is not a multiple of --bs {} (each job transfers whole I/Os)",
                    self.bs
                ))
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
        Ok(())
    }

    /// Checks the spec against the volume and lays out the jobs' slices.
    pub fn plan(&self, geo: Geometry) -> Result<Plan> {
        self.check()?;
        let bs = self.bs;
        let block = u64::from(geo.block_size);
        if bs % block != 0 {
            return invalid(format!("--bs {bs} is not a multiple of the volume's block size ({block} bytes)"));
        }
        // A discard is one request of the control channel, up to its largest range.
        let max = if self.workload.trims() { rblk_initiator::MAX_ZERO_LEN } else { u64::from(geo.max_io) };
        if bs > max {
            let what = if self.workload.trims() { "discard (MAX_ZERO_LEN" } else { "I/O (max_io" };
            return invalid(format!("--bs {bs} is larger than the volume's largest {what} {max} bytes)"));
        }
        if let Some(size) = self.size {
            if size > geo.size {
                return invalid(format!("--size {size} is larger than the volume ({} bytes)", geo.size));
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
        // As fio's size: the job's region is at most `size` (a multiple of bs, checked above).
        let slice = (geo.size / u64::from(self.jobs) / bs * bs).min(self.size.unwrap_or(u64::MAX));
        if slice == 0 {
            return invalid(format!(
                "the volume ({} bytes) is too small for {} jobs of --bs {bs}: each job needs a slice of at least one I/O",
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
    /// I/O units (of `bs`) in each job's slice.
    pub fn units(&self) -> u64 {
        self.slice / self.spec.bs
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
            Err(Error::Invalid(text)) => assert!(text.contains(needle), "{needle:?} not in {text:?}"),
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
        refused(Spec { iodepth: 0, ..d.clone() }, GEO, "--iodepth must be between 1 and 1024 (got 0)");
        refused(Spec { iodepth: 4096, ..d.clone() }, GEO, "--iodepth must be between 1 and 1024");
        refused(Spec { jobs: 0, ..d.clone() }, GEO, "--jobs must be between 1");
        refused(Spec { size: Some(128 << 20), ..d.clone() }, GEO, "--size 134217728 is larger than the volume");
        refused(Spec { size: Some(6144), ..d.clone() }, GEO, "not a multiple of --bs 4096");
        refused(Spec { size: Some(0), ..d.clone() }, GEO, "--size must not be zero");
        refused(Spec { runtime: Some(Duration::ZERO), ..d.clone() }, GEO, "--runtime must be longer");
        refused(Spec { runtime: None, ..d.clone() }, GEO, "give --runtime or --size");
        refused(Spec { runtime: None, size: Some(4096), time_based: true, ..d.clone() }, GEO, "--time_based needs");
        refused(Spec { rwmixread: Some(70), ..d.clone() }, GEO, "--rwmixread applies only to --rw randrw");
        let rw = Spec { workload: Workload::RandRw, ..d.clone() };
        refused(Spec { rwmixread: Some(101), ..rw.clone() }, GEO, "0 to 100 (got 101)");
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
