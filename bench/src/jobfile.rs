//! fio job files: `[global]` and job sections of `option=value` lines, with fio's option names.
//!
//! Each job section is a job of `numjobs` threads on the volume its `filename=` names (an
//! `rblk://` URI, with or without fio's `\:` escaping of colons). Sections run together, as fio
//! runs them; a section with `stonewall` (or `wait_for_previous`) waits for every section before
//! it to end and starts a new group. A `[global]` section's options apply to the sections after
//! it. Lines starting with `#` or `;` are comments. Options rblk-bench does not take are refused
//! with their name and line, as are values it cannot honour.

use std::path::Path;
use std::time::Duration;

use clap::ValueEnum as _;

use crate::command::Section;
use crate::spec::{Spec, Workload};
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
        }
    }

    /// Sets option `key` (fio's name) from its text: `None` for a bare `key` line.
    fn set(&mut self, key: &str, value: Option<&str>) -> std::result::Result<(), String> {
        let text = || value.ok_or_else(|| format!("option {key:?} needs a value ({key}=...)"));
        let number = |what: &str| -> std::result::Result<u64, String> {
            let v = text()?;
            v.parse().map_err(|_| format!("{key}={v}: not {what}"))
        };
        let size = || -> std::result::Result<u64, String> {
            let v = text()?;
            rblk_initiator::parse_size(v).map_err(|e| format!("{key}={v}: {e}"))
        };
        let duration = || -> std::result::Result<Duration, String> {
            let v = text()?;
            crate::cli::run_time_arg(v).map_err(|e| format!("{key}={v}: {e}"))
        };
        let percent = || -> std::result::Result<u8, String> {
            let n = number("a percentage")?;
            u8::try_from(n).ok().filter(|&p| p <= 100).ok_or_else(|| format!("{key}={n}: a percentage, 0 to 100"))
        };
        let count = || -> std::result::Result<u32, String> {
            u32::try_from(number("a whole number")?).map_err(|_| format!("{key}: too large"))
        };
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
            "iodepth" => self.iodepth = Some(count()?),
            "numjobs" => self.numjobs = Some(count()?),
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
            "generation" => self.generation = Some(number("a whole number")?),
            "randseed" => self.seed = Some(number("a whole number")?),
            "stonewall" | "wait_for_previous" => self.stonewall = boolean(key, value)?,
            // The file's, not a job's: read by the parser.
            "group_reporting" => {
                boolean(key, value)?;
            }
            "description" => {
                text()?;
            }
            _ => return Err(format!("unknown option {key:?} (rblk-bench takes {})", OPTIONS.join(", "))),
        }
        Ok(())
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
}

/// A job section being read: its name, header line, options and the line of its filename.
struct Open {
    name: String,
    line: usize,
    options: JobOptions,
    given: Vec<(String, String)>,
    filename_line: Option<usize>,
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

/// Parses a job file's text (`path` names it in errors).
pub(crate) fn parse(path: &Path, text: &str) -> Result<JobFile> {
    let err = |line: usize, what: String| Error::JobFile { path: path.to_owned(), line, what };
    let mut global = JobOptions::default();
    let mut global_filename_line = None;
    let mut global_options: Vec<(String, String)> = Vec::new();
    let mut in_global = false;
    let mut open: Option<Open> = None;
    let mut done: Vec<Open> = Vec::new();
    let mut group_reporting = false;
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
            if !in_global {
                if done.iter().any(|s| s.name == name) {
                    return Err(err(n, format!("a second section [{name}]: job names must differ")));
                }
                open = Some(Open {
                    name: name.to_owned(),
                    line: n,
                    options: global.clone(),
                    given: Vec::new(),
                    filename_line: global_filename_line,
                });
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
        if in_global {
            global.set(key, value).map_err(|e| err(n, e))?;
            if key == "filename" {
                global_filename_line = Some(n);
            }
            global_options.retain(|(k, _)| k != key);
            global_options.push(entry);
        } else if let Some(s) = open.as_mut() {
            s.options.set(key, value).map_err(|e| err(n, e))?;
            if key == "filename" {
                s.filename_line = Some(n);
            }
            s.given.retain(|(k, _)| k != key);
            s.given.push(entry);
        } else {
            return Err(err(n, format!("option {key:?} before any section ([global] or [JOBNAME])")));
        }
    }
    done.extend(open);
    if done.is_empty() {
        return Err(err(text.lines().count().max(1), "no job section ([JOBNAME]) in the file".into()));
    }
    let mut sections = Vec::new();
    let mut group = 0;
    for (k, s) in done.into_iter().enumerate() {
        if k > 0 && s.options.stonewall {
            group += 1;
        }
        let Some(uri) = s.options.filename.clone() else {
            return Err(err(
                s.line,
                format!("job {:?} has no filename= (the volume: rblk://HOST[:PORT]/VOLUME)", s.name),
            ));
        };
        if !uri.starts_with("rblk://") {
            return Err(err(
                s.filename_line.unwrap_or(s.line),
                format!("filename={uri}: rblk-bench runs on rblk volumes, rblk://HOST[:PORT]/VOLUME"),
            ));
        }
        let mut options = vec![("name".to_owned(), s.name.clone())];
        options.extend(s.given);
        sections.push(Section { name: s.name, groupid: group, uri, spec: s.options.spec(), options });
    }
    Ok(JobFile { sections, global_options, group_reporting })
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

    /// Catches unknown options passed over (a job file meant for another engine running with
    /// defaults) and refusals that do not say which option on which line.
    #[test]
    fn unknown_options_and_bad_values_are_refused_with_their_line() {
        let head = "[global]\nfilename=rblk://h/v\n[j]\n";
        refused(&format!("{head}rw=read\nioengine=libaio\n"), "t.fio, line 5: unknown option \"ioengine\"");
        refused(&format!("{head}direct=1\n"), "line 4: unknown option \"direct\"");
        refused(&format!("{head}rw=trimwrite\n"), "line 4: rw=trimwrite: rblk-bench does read, write");
        refused(&format!("{head}bs=4q\n"), "line 4: bs=4q:");
        refused(&format!("{head}runtime=soon\n"), "line 4: runtime=soon: \"soon\" is not a duration");
        refused(&format!("{head}rwmixread=101\n"), "line 4: rwmixread=101: a percentage");
        refused(&format!("{head}verify=md5\n"), "line 4: verify=md5: rblk-bench verifies with its own pattern");
        refused(&format!("{head}time_based=maybe\n"), "line 4: time_based=maybe");
        refused(&format!("{head}iodepth\n"), "line 4: option \"iodepth\" needs a value");
        refused("rw=read\n[j]\n", "line 1: option \"rw\" before any section");
        refused("[j\n", "line 1: \"[j\": a section without its ]");
        refused("[global]\nbs=4k\n", "line 2: no job section");
        refused("[j]\nrw=read\n", "line 1: job \"j\" has no filename=");
        refused("[j]\nfilename=/dev/sda\n", "line 2: filename=/dev/sda: rblk-bench runs on rblk volumes");
        refused("[j]\nfilename=rblk://h/v\n[j]\n", "line 3: a second section [j]");
    }
}
