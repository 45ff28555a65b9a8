//! fio job files: `[global]` and job sections of `option=value` lines, with fio's option names.
//!
//! Each job section is a job of `numjobs` threads on the volume its `filename=` names (an
//! `rblk://` URI, with or without fio's `\:` escaping of colons). Sections run together, as fio
//! runs them; a section with `stonewall` (or `wait_for_previous`) waits for every section before
//! it to end and starts a new group. A `[global]` section's options apply to the sections after
//! it. Lines starting with `#` or `;` are comments.
//!
//! fio's options that do not apply to rblk-bench ([`IGNORED`]: the I/O engine, `direct`,
//! `thread`, CPU and NUMA placement...) are accepted with one note each on stderr naming the
//! file and line; a value that asks for what rblk-bench cannot do (`direct=0`, `buffered=1`: I/O
//! through a page cache) is refused. Options it does not know are refused, and every error names
//! the file and line (`jobs.fio:7: iodepth must be a whole number from 1 to 1024, got 0`).

use std::path::Path;
use std::time::Duration;

use clap::ValueEnum as _;

use crate::command::{Place, Section};
use crate::spec::{whole_number, BsSplit, Rate, Spec, Workload, MAX_IODEPTH, MAX_JOBS};
use crate::{Error, Result};

/// The options a job file's sections (and the command line) take, by fio's names.
pub const OPTIONS: &[&str] = &[
    "filename",
    "rw",
    "readwrite",
    "rwmixread",
    "rwmixwrite",
    "bs",
    "blocksize",
    "bssplit",
    "rate",
    "rate_iops",
    "iodepth",
    "numjobs",
    "runtime",
    "time_based",
    "size",
    "ramp_time",
    "verify",
    "generation",
    "randseed",
    "stonewall",
    "wait_for_previous",
    "group_reporting",
    "description",
];

/// fio's options that do not apply to rblk-bench, with why: accepted with a note, never
/// silently. (`direct=0` and `buffered=1` are refused: see [`JobOptions::set`].)
pub const IGNORED: &[(&str, &str)] = &[
    ("ioengine", "rblk-bench always does one-sided RDMA"),
    ("direct", "rblk-bench's I/O never passes a page cache"),
    ("buffered", "rblk-bench's I/O never passes a page cache"),
    ("invalidate", "rblk-bench's I/O never passes a page cache"),
    ("thread", "rblk-bench's jobs are always threads"),
    ("norandommap", "rblk-bench draws random offsets without a map, always"),
    ("randrepeat", "random offsets follow randseed (default 1)"),
    ("fsync_on_close", "rblk-bench sends no FLUSH at the end"),
    ("end_fsync", "rblk-bench sends no FLUSH at the end"),
    ("iodepth_batch", "rblk-bench batches submissions itself (a doorbell per 16)"),
    ("iodepth_batch_submit", "rblk-bench batches submissions itself (a doorbell per 16)"),
    ("iodepth_batch_complete", "rblk-bench reaps every completion available"),
    ("iodepth_batch_complete_min", "rblk-bench reaps every completion available"),
    ("iodepth_batch_complete_max", "rblk-bench reaps every completion available"),
    ("iodepth_low", "rblk-bench refills the queue at once"),
    ("cpus_allowed", "rblk-bench does not pin its threads (run it under taskset)"),
    ("cpus_allowed_policy", "rblk-bench does not pin its threads (run it under taskset)"),
    ("cpumask", "rblk-bench does not pin its threads (run it under taskset)"),
    ("numa_cpu_nodes", "rblk-bench does not place its threads (run it under numactl)"),
    ("numa_mem_policy", "rblk-bench does not place its memory (run it under numactl)"),
    ("clocksource", "rblk-bench takes its own timestamps (CLOCK_MONOTONIC)"),
    ("unlink", "rblk-bench makes no files"),
];

/// One job's options as given, before defaults.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobOptions {
    pub(crate) filename: Option<String>,
    pub(crate) rw: Option<Workload>,
    pub(crate) rwmixread: Option<u8>,
    pub(crate) bs: Option<u64>,
    pub(crate) iodepth: Option<u32>,
    pub(crate) numjobs: Option<u32>,
    pub(crate) runtime: Option<Duration>,
    pub(crate) time_based: bool,
    pub(crate) size: Option<u64>,
    pub(crate) ramp_time: Option<Duration>,
    pub(crate) verify: bool,
    pub(crate) generation: Option<u64>,
    pub(crate) seed: Option<u64>,
    pub(crate) stonewall: bool,
    pub(crate) rate: Rate,
    pub(crate) bssplit: Option<BsSplit>,
}

impl JobOptions {
    /// The run's parameters, with rblk-bench's defaults (the command line's) for what is not
    /// given: randread, bs 4k, iodepth 32, 1 job, 10 s unless a size is given.
    pub(crate) fn spec(&self) -> Spec {
        let d = Spec::default();
        Spec {
            workload: self.rw.unwrap_or(d.workload),
            rwmixread: self.rwmixread,
            bs: self.bs.unwrap_or(d.bs),
            iodepth: self.iodepth.unwrap_or(d.iodepth),
            jobs: self.numjobs.unwrap_or(d.jobs),
            runtime: match (self.runtime, self.size) {
                (None, None) => d.runtime,
                (r, _) => r,
            },
            size: self.size,
            time_based: self.time_based,
            ramp: self.ramp_time.unwrap_or(d.ramp),
            verify: self.verify,
            generation: self.generation,
            seed: self.seed.unwrap_or(d.seed),
            rate: self.rate,
            bssplit: self.bssplit.clone(),
        }
    }

    /// Sets option `key` (fio's name) from its text: `None` for a bare `key` line. Returns the
    /// note for an option of [`IGNORED`].
    fn set(&mut self, key: &str, value: Option<&str>) -> std::result::Result<Option<String>, String> {
        let text = || value.ok_or_else(|| format!("option {key:?} needs a value ({key}=...)"));
        let whole = |lo: u64, hi: u64| -> std::result::Result<u64, String> {
            let v = text()?;
            whole_number(v, lo, hi).map_err(|e| format!("{key} {e}, got {v}"))
        };
        let size = || -> std::result::Result<u64, String> {
            let v = text()?;
            rblk_initiator::parse_size(v).map_err(|e| format!("{key}={v}: {e}"))
        };
        let duration = || -> std::result::Result<Duration, String> {
            let v = text()?;
            crate::cli::run_time_arg(v).map_err(|e| format!("{key}={v}: {e}"))
        };
        let percent = || whole(0, 100).map(|p| p as u8);
        match key {
            "filename" => self.filename = Some(unescape(text()?)),
            "rw" | "readwrite" => {
                let v = text()?;
                let w = Workload::from_str(v, false).map_err(|_| {
                    format!("{key}={v}: rblk-bench does read, write, randread, randwrite, randrw, trim and randtrim")
                })?;
                self.rw = Some(w);
            }
            "rwmixread" => self.rwmixread = Some(percent()?),
            "rwmixwrite" => self.rwmixread = Some(100 - percent()?),
            "bs" | "blocksize" => self.bs = Some(size()?),
            "bssplit" => {
                let v = text()?;
                self.bssplit = Some(BsSplit::parse(v).map_err(|e| format!("bssplit={v}: {e}"))?);
            }
            "rate_iops" => {
                let v = text()?;
                self.rate.iops = Rate::parse_iops(v).map_err(|e| format!("rate_iops={v}: {e}"))?;
            }
            "rate" => {
                let v = text()?;
                self.rate.bytes = Rate::parse_bytes(v).map_err(|e| format!("rate={v}: {e}"))?;
            }
            "iodepth" => self.iodepth = Some(whole(1, u64::from(MAX_IODEPTH))? as u32),
            "numjobs" => self.numjobs = Some(whole(1, u64::from(MAX_JOBS))? as u32),
            "runtime" => self.runtime = Some(duration()?),
            "time_based" => self.time_based = boolean(key, value)?,
            "size" => self.size = Some(size()?),
            "ramp_time" => self.ramp_time = Some(duration()?),
            "verify" => {
                self.verify = match value {
                    None | Some("1" | "rblk") => true,
                    Some("0" | "none") => false,
                    Some(v) => {
                        return Err(format!(
                            "verify={v}: rblk-bench verifies with its own pattern (offset, generation, \
                             checksum in every block): write verify, or verify=0"
                        ))
                    }
                }
            }
            "generation" => self.generation = Some(whole(0, u64::MAX)?),
            "randseed" => self.seed = Some(whole(0, u64::MAX)?),
            "stonewall" | "wait_for_previous" => self.stonewall = boolean(key, value)?,
            // The file's, not a job's: read by the parser.
            "group_reporting" => {
                boolean(key, value)?;
            }
            "description" => {
                text()?;
            }
            // Asking for I/O through a page cache: results rblk-bench cannot give.
            "direct" | "buffered" if boolean(key, value)? == (key == "buffered") => {
                let v = value.map_or(String::new(), |v| format!("={v}"));
                let want = if key == "direct" { "direct=1" } else { "buffered=0" };
                return Err(format!(
                    "{key}{v} asks for I/O through a page cache, which rblk-bench does not have: remove it, or \
                     write {want}"
                ));
            }
            _ => match IGNORED.iter().find(|(k, _)| *k == key) {
                Some((_, why)) => {
                    let given = value.map_or_else(|| key.to_owned(), |v| format!("{key}={v}"));
                    return Ok(Some(format!("{given} ignored: {why}")));
                }
                None => {
                    return Err(format!(
                        "unknown option {key:?} (rblk-bench takes {}; and ignores {})",
                        OPTIONS.join(", "),
                        IGNORED.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
                    ))
                }
            },
        }
        Ok(None)
    }
}

/// The option an error about `key` is filed under (the name [`Spec::check`] uses).
fn canonical(key: &str) -> &str {
    match key {
        "readwrite" => "rw",
        "blocksize" => "bs",
        "rwmixwrite" => "rwmixread",
        "wait_for_previous" => "stonewall",
        "rate_iops" => "rate",
        k => k,
    }
}

/// fio escapes the colons of a file name (`rblk\://host\:7420/v`), which it would otherwise
/// split at; both spellings mean the same URI.
pub(crate) fn unescape(name: &str) -> String {
    name.replace("\\:", ":")
}

fn boolean(key: &str, value: Option<&str>) -> std::result::Result<bool, String> {
    match value {
        None | Some("1" | "true" | "on" | "yes") => Ok(true),
        Some("0" | "false" | "off" | "no") => Ok(false),
        Some(v) => Err(format!("{key}={v}: expected 1 or 0 (or {key} alone)")),
    }
}

/// A parsed job file.
#[derive(Debug, Clone)]
pub(crate) struct JobFile {
    /// The job sections, in order, with their groups.
    pub(crate) sections: Vec<Section>,
    /// What `[global]` sections set, as written.
    pub(crate) global_options: Vec<(String, String)>,
    /// `group_reporting` anywhere in the file.
    pub(crate) group_reporting: bool,
    /// One note per option accepted and ignored (`jobs.fio:3: ioengine=libaio ignored: ...`).
    pub(crate) notes: Vec<String>,
}

/// The options of a scope (`[global]` or a job section) being read.
#[derive(Debug, Clone, Default)]
struct Scope {
    options: JobOptions,
    /// The line of each option, by [`canonical`] name (a section starts with `[global]`'s).
    lines: Vec<(String, usize)>,
    /// The `rwmixread`/`rwmixwrite` this scope itself gave: name, value, line.
    mix: Option<(String, u8, usize)>,
}

impl Scope {
    fn line_of(&self, key: &str) -> Option<usize> {
        self.lines.iter().rev().find(|(k, _)| k == key).map(|&(_, n)| n)
    }
}

/// A job section being read: its name, header line, options as set and as written.
struct Open {
    name: String,
    line: usize,
    scope: Scope,
    given: Vec<(String, String)>,
}

/// Reads the job file at `path`.
pub(crate) fn read(path: &Path) -> Result<JobFile> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::File {
        what: "reading the job file",
        path: path.to_owned(),
        source,
    })?;
    parse(path, &text)
}

/// Parses a job file's text (`path` names it in errors and notes).
pub(crate) fn parse(path: &Path, text: &str) -> Result<JobFile> {
    let err = |line: usize, what: String| Error::JobFile { path: path.to_owned(), line, what };
    let mut global = Scope::default();
    let mut global_options: Vec<(String, String)> = Vec::new();
    let mut in_global = false;
    let mut open: Option<Open> = None;
    let mut done: Vec<Open> = Vec::new();
    let mut group_reporting = false;
    let mut notes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(rest) = line.strip_prefix('[') {
            let name = rest.strip_suffix(']').ok_or_else(|| err(n, format!("{line:?}: a section without its ]")))?;
            let name = name.trim();
            if name.is_empty() {
                return Err(err(n, "a section without a name ([])".into()));
            }
            done.extend(open.take());
            in_global = name == "global";
            if in_global {
                global.mix = None;
            } else {
                if done.iter().any(|s| s.name == name) {
                    return Err(err(n, format!("a second section [{name}]: job names must differ")));
                }
                let scope = Scope { mix: None, ..global.clone() };
                open = Some(Open { name: name.to_owned(), line: n, scope, given: Vec::new() });
            }
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (line, None),
        };
        let entry = (key.to_owned(), value.unwrap_or_default().to_owned());
        if key == "group_reporting" {
            group_reporting = boolean(key, value).map_err(|e| err(n, e))?;
        }
        let (scope, written) = if in_global {
            (&mut global, &mut global_options)
        } else if let Some(s) = open.as_mut() {
            (&mut s.scope, &mut s.given)
        } else {
            return Err(err(n, format!("option {key:?} before any section ([global] or [JOBNAME])")));
        };
        if let Some(note) = scope.options.set(key, value).map_err(|e| err(n, e))? {
            notes.push(format!("{}:{n}: {note}", path.display()));
        }
        if matches!(key, "rwmixread" | "rwmixwrite") {
            let given = scope.options.rwmixread.map(|r| if key == "rwmixread" { r } else { 100 - r });
            let given = given.expect("just set");
            if let Some((other, v, at)) = &scope.mix {
                if other != key && u16::from(*v) + u16::from(given) != 100 {
                    return Err(err(
                        n,
                        format!("{key}={given} contradicts {other}={v} (line {at}): they must add up to 100"),
                    ));
                }
            }
            scope.mix = Some((key.to_owned(), given, n));
        }
        scope.lines.push((canonical(key).to_owned(), n));
        written.retain(|(k, _)| k != key);
        written.push(entry);
    }
    done.extend(open);
    if done.is_empty() {
        return Err(err(text.lines().count().max(1), "no job section ([JOBNAME]) in the file".into()));
    }
    let mut sections = Vec::new();
    let mut group = 0;
    for (k, s) in done.into_iter().enumerate() {
        let o = &s.scope.options;
        if k > 0 && o.stonewall {
            group += 1;
        }
        let Some(uri) = o.filename.clone() else {
            return Err(err(
                s.line,
                format!("job {:?} has no filename= (the volume: rblk://HOST[:PORT]/VOLUME)", s.name),
            ));
        };
        let at = s.scope.line_of("filename").unwrap_or(s.line);
        if !uri.starts_with("rblk://") {
            return Err(err(at, format!("filename={uri}: rblk-bench runs on rblk volumes, rblk://HOST[:PORT]/VOLUME")));
        }
        if let Err(e) = rblk_initiator::Uri::parse(&uri) {
            return Err(err(at, format!("filename={uri}: {e}")));
        }
        let spec = o.spec();
        let lines = s.scope.lines.clone();
        let place = Place { path: path.to_owned(), name: s.name.clone(), line: s.line, lines };
        spec.check().map_err(|e| place.error(e))?;
        // fio's rule: bssplit decides the sizes; a bs it leaves unused is said to be.
        if let (Some(b), Some(at)) = (&o.bssplit, s.scope.line_of("bs")) {
            let dirs = spec.dirs();
            if (0..2).all(|d| !dirs[d] || b.dirs[d].is_some()) {
                let note = format!("{}:{at}: bs ignored: bssplit sets the sizes", path.display());
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
        }
        let mut options = vec![("name".to_owned(), s.name.clone())];
        options.extend(s.given);
        sections.push(Section { name: s.name, groupid: group, uri, spec, options, place: Some(place) });
    }
    Ok(JobFile { sections, global_options, group_reporting, notes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<JobFile> {
        parse(Path::new("t.fio"), text)
    }

    fn refused(text: &str, needle: &str) {
        match parsed(text) {
            Err(e @ Error::JobFile { .. }) => assert!(e.to_string().contains(needle), "{needle:?} not in {e}"),
            other => panic!("expected a refusal with {needle:?}, got {other:?}"),
        }
    }

    /// Catches [global] options not reaching the jobs after it, a job's own options leaking
    /// into the next one, stonewall not starting a new group, and fio's spellings (escaped
    /// colons, rwmixwrite, blocksize, bare booleans) not meaning what they mean in fio.
    #[test]
    fn globals_jobs_and_groups() {
        let f = parsed(
            "; a comment\n[global]\nfilename=rblk\\://10.0.0.1\\:7420/v\nbs=64k\nruntime=2\ngroup_reporting\n\n\
             [a]\nrw=randread\niodepth=8\n# another\n[b]\nreadwrite=randrw\nrwmixwrite=30\nblocksize=8k\n\
             [c]\nstonewall\nrw=write\nsize=1M\ntime_based\nnumjobs=2\nfilename=rblk://h/w\n",
        )
        .unwrap();
        assert!(f.group_reporting);
        assert_eq!(f.global_options[0], ("filename".into(), "rblk\\://10.0.0.1\\:7420/v".into()));
        let [a, b, c] = &f.sections[..] else { panic!("{f:?}") };
        assert_eq!((a.name.as_str(), a.groupid, b.groupid, c.groupid), ("a", 0, 0, 1));
        assert_eq!((a.uri.as_str(), c.uri.as_str()), ("rblk://10.0.0.1:7420/v", "rblk://h/w"));
        assert_eq!((a.spec.workload, a.spec.bs, a.spec.iodepth), (Workload::RandRead, 65536, 8));
        assert_eq!(a.spec.runtime, Some(Duration::from_secs(2)));
        assert_eq!(
            (b.spec.workload, b.spec.rwmixread, b.spec.bs, b.spec.iodepth),
            (Workload::RandRw, Some(70), 8192, 32)
        );
        assert_eq!((c.spec.size, c.spec.time_based, c.spec.jobs), (Some(1 << 20), true, 2));
        assert_eq!(
            a.options,
            [("name".into(), "a".into()), ("rw".into(), "randread".into()), ("iodepth".into(), "8".into())]
        );
    }

    /// Issue 43, trap 5: unknown options passed over (a job file meant for another engine
    /// running with defaults), and refusals that do not name the file and line (`t.fio:5:`), or
    /// name an option as a flag (`--iodepth`) where the file has `iodepth=`.
    #[test]
    fn unknown_options_and_bad_values_are_refused_with_their_line() {
        let head = "[global]\nfilename=rblk://h/v\n[j]\n";
        refused(&format!("{head}rw=read\nlog_avg_msec=100\n"), "t.fio:5: unknown option \"log_avg_msec\"");
        refused(&format!("{head}rw=trimwrite\n"), "t.fio:4: rw=trimwrite: rblk-bench does read, write");
        refused(&format!("{head}bs=4q\n"), "t.fio:4: bs=4q:");
        refused(&format!("{head}runtime=soon\n"), "t.fio:4: runtime=soon: \"soon\" is not a duration");
        refused(&format!("{head}rwmixread=101\n"), "t.fio:4: rwmixread must be a whole number from 0 to 100, got 101");
        refused(&format!("{head}verify=md5\n"), "t.fio:4: verify=md5: rblk-bench verifies with its own pattern");
        refused(&format!("{head}time_based=maybe\n"), "t.fio:4: time_based=maybe");
        refused(&format!("{head}iodepth\n"), "t.fio:4: option \"iodepth\" needs a value");
        refused(&format!("{head}iodepth=0\n"), "t.fio:4: iodepth must be a whole number from 1 to 1024, got 0");
        refused(&format!("{head}numjobs=300\n"), "t.fio:4: numjobs must be a whole number from 1 to 256, got 300");
        refused(&format!("{head}randseed=x\n"), "t.fio:4: randseed must be a whole number from 0 up, got x");
        refused("rw=read\n[j]\n", "t.fio:1: option \"rw\" before any section");
        refused("[j\n", "t.fio:1: \"[j\": a section without its ]");
        refused("[global]\nbs=4k\n", "t.fio:2: no job section");
        refused("[j]\nrw=read\n", "t.fio:1: job \"j\" has no filename=");
        refused("[j]\nfilename=/dev/sda\n", "t.fio:2: filename=/dev/sda: rblk-bench runs on rblk volumes");
        refused("[j]\nfilename=rblk://h/v\n[j]\n", "t.fio:3: a second section [j]");
        refused("[global]\nfilename=rblk://h\n[j]\n", "t.fio:2: filename=rblk://h: bad URI \"rblk://h\": no /VOLUME");
        // Checks across options: at the line of the option refused (from [global] too), or the
        // section's when no one option is to blame; options named as the file names them.
        refused(
            "[global]\nbs=4k\nsize=6k\n[j]\nfilename=rblk://h/v\n",
            "t.fio:3: size 6144 is not a multiple of bs, 4096",
        );
        refused(
            &format!("{head}rw=randread\nrwmixread=70\n"),
            "t.fio:5: rwmixread and rwmixwrite apply only to rw randrw",
        );
        refused(&format!("{head}runtime=0\n"), "t.fio:4: runtime must be longer than zero");
        refused(&format!("{head}generation=3\n"), "t.fio:3: job \"j\": generation only means something with verify");
    }

    /// Issue 43, trap 5: fio's options that do not apply (ioengine, direct, thread...) refused
    /// at the first line of a fio user's file, or (the other way) accepted silently. Each gives
    /// one note naming file and line; a value rblk-bench cannot honour (I/O through a page
    /// cache) is refused.
    #[test]
    fn options_that_do_not_apply_are_accepted_with_one_note_each() {
        let f = parsed(
            "[global]\nioengine=libaio\ndirect=1\nthread\nfilename=rblk://h/v\n[a]\nnorandommap\n[b]\nbuffered=0\n",
        )
        .unwrap();
        assert_eq!(
            f.notes,
            [
                "t.fio:2: ioengine=libaio ignored: rblk-bench always does one-sided RDMA",
                "t.fio:3: direct=1 ignored: rblk-bench's I/O never passes a page cache",
                "t.fio:4: thread ignored: rblk-bench's jobs are always threads",
                "t.fio:7: norandommap ignored: rblk-bench draws random offsets without a map, always",
                "t.fio:9: buffered=0 ignored: rblk-bench's I/O never passes a page cache",
            ]
        );
        assert_eq!(f.sections.len(), 2);
        refused("[j]\nfilename=rblk://h/v\ndirect=0\n", "t.fio:3: direct=0 asks for I/O through a page cache");
        refused("[j]\nfilename=rblk://h/v\nbuffered\n", "t.fio:3: buffered asks for I/O through a page cache");
        refused("[j]\nfilename=rblk://h/v\ndirect=maybe\n", "t.fio:3: direct=maybe: expected 1 or 0");
        for (key, _) in IGNORED {
            let value = if *key == "buffered" { 0 } else { 1 };
            let text = format!("[j]\nfilename=rblk://h/v\n{key}={value}\n");
            let f = parsed(&text).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert_eq!(f.notes.len(), 1, "{key}: {:?}", f.notes);
        }
    }

    /// Issue 43, trap 5: rate_iops, rate, bssplit and rwmixwrite parsed into the spec (a test
    /// of the engine checks they are honoured): fio's `r,w` forms, a missing share filled as
    /// fio fills it, a trim part refused as not supported yet, and rwmixread and rwmixwrite
    /// that contradict each other in one section refused (fio lets the later line win).
    #[test]
    fn rates_bssplit_and_rwmixwrite() {
        let f = parsed(
            "[global]\nfilename=rblk://h/v\nbs=8k\nrwmixread=60\n[a]\nrw=randrw\nrate_iops=2000\nrate=1M,\n\
             bssplit=4k/50:8k/:64k/\n[b]\nrw=randrw\nrwmixwrite=30\nrate_iops=,500\nbssplit=4k/100,16k/10:32k/90\n",
        )
        .unwrap();
        let [a, b] = &f.sections[..] else { panic!("{f:?}") };
        assert_eq!(a.spec.rate, Rate { iops: [Some(2000), Some(2000)], bytes: [Some(1 << 20), None] });
        assert_eq!(a.spec.bssplit.as_ref().unwrap().dirs[0], Some(vec![(4096, 50), (8192, 25), (65536, 25)]));
        assert_eq!(a.spec.bssplit.as_ref().unwrap().to_string(), "4k/50:8k/25:64k/25");
        assert_eq!(
            (a.spec.read_percent(), b.spec.read_percent()),
            (60, 70),
            "a section's rwmixwrite overrides [global]"
        );
        assert_eq!(b.spec.rate, Rate { iops: [None, Some(500)], bytes: [None, None] });
        let split = b.spec.bssplit.as_ref().unwrap();
        assert_eq!(split.dirs, [Some(vec![(4096, 100)]), Some(vec![(16384, 10), (32768, 90)])]);
        assert_eq!((b.spec.min_bs(), b.spec.max_bs()), (4096, 32768));
        assert_eq!(f.notes, ["t.fio:3: bs ignored: bssplit sets the sizes"]);
        let head = "[global]\nfilename=rblk://h/v\n[j]\nrw=randrw\n";
        refused(
            &format!("{head}rwmixread=70\nrwmixwrite=40\n"),
            "t.fio:6: rwmixwrite=40 contradicts rwmixread=70 (line 5)",
        );
        parsed(&format!("{head}rwmixread=70\nrwmixwrite=30\n")).unwrap();
        refused(&format!("{head}rate_iops=1,2,3\n"), "t.fio:5: rate_iops=1,2,3: a trim rate is not supported yet");
        refused(&format!("{head}rate=fast\n"), "t.fio:5: rate=fast: must be bytes per second");
        refused(
            &format!("{head}bssplit=4k/60:8k/60\n"),
            "t.fio:5: bssplit=4k/60:8k/60: \"4k/60:8k/60\": the shares must add up to 100",
        );
        refused(&format!("{head}bssplit=4k/50\n"), "add up to 100 (they add up to 50)");
        refused(
            &format!("{head}bssplit=4k/50:8k/50,,4k\n"),
            "t.fio:5: bssplit=4k/50:8k/50,,4k: a trim part is not supported yet",
        );
        refused(
            &format!("{head}bssplit=4k/50:6k/50\n"),
            "t.fio:5: bssplit: 6144 is not a multiple of its smallest size 4096",
        );
        let t = parsed("[j]\nfilename=rblk://h/v\nrw=trim\nbssplit=4k/50:8k/50\n");
        assert!(t.unwrap_err().to_string().contains("t.fio:4: bssplit: rw trim's discards use bs alone"));
    }
}
