//! The binary's work, callable in-process ([`execute`]): parse, run every section of the
//! invocation (a job file's groups one after another, the sections of a group together), and
//! write the report in the format asked for.

use std::fmt;
use std::io::{self, Write};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use rblk_initiator::{Fabric, Options};

use crate::cli::{Args, Invocation, OutputFormat};
use crate::log::Logs;
use crate::pending::Pending;
use crate::progress::Progress;
use crate::report::Report;
use crate::run::Run;
use crate::spec::Spec;
use crate::{fio, Error, Result};

/// One job section: a job of `spec.jobs` threads on one volume. The command line makes one; a
/// job file one per `[JOBNAME]`.
#[derive(Debug, Clone)]
pub struct Section {
    /// The job's name (fio's `jobname`).
    pub name: String,
    /// Its group: sections of a group run together, groups one after another (`stonewall`).
    pub groupid: u32,
    /// The volume.
    pub uri: String,
    /// What to run.
    pub spec: Spec,
    /// The options as given (fio's `job options`), `name` first.
    pub options: Vec<(String, String)>,
    /// Where a job file's section is, for its errors.
    pub(crate) place: Option<Place>,
}

/// A job file's section: the file, the section's name and header line, and each option's line.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) path: std::path::PathBuf,
    pub(crate) name: String,
    pub(crate) line: usize,
    /// By the option names errors use ([`Error::Value`]'s), latest last.
    pub(crate) lines: Vec<(String, usize)>,
}

impl Place {
    /// `e` as an error of this section: a refused value at its option's line, another
    /// refusal at the section's, named as the file names options; a failure of the run names
    /// the job.
    pub(crate) fn error(&self, e: Error) -> Error {
        let at = |what: String, line: usize| Error::JobFile { path: self.path.clone(), line, what };
        match e {
            Error::Value { option, text } => {
                let line = self.lines.iter().rev().find(|(k, _)| k == option).map_or(self.line, |&(_, n)| n);
                at(fio_names(&text), line)
            }
            Error::Invalid(text) => at(format!("job {:?}: {}", self.name, fio_names(&text)), self.line),
            e => Error::Section { name: self.name.clone(), source: Box::new(e) },
        }
    }
}

/// A message naming options as flags (`--iodepth`), naming them as a job file does.
fn fio_names(text: &str) -> String {
    text.replace("--jobs", "numjobs").replace("--numjobs", "numjobs").replace("--seed", "randseed").replace("--", "")
}

/// A shared writer: stdout, stderr, a file, or a buffer (tests).
#[derive(Clone)]
pub struct Sink(Arc<Mutex<Box<dyn Write + Send>>>);

impl fmt::Debug for Sink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Sink")
    }
}

impl Sink {
    /// Writes to `w`.
    pub fn new(w: impl Write + Send + 'static) -> Sink {
        Sink(Arc::new(Mutex::new(Box::new(w))))
    }

    /// A buffer, and the bytes written to it.
    pub fn buffer() -> (Sink, Arc<Mutex<Vec<u8>>>) {
        #[derive(Debug)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap_or_else(PoisonError::into_inner).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let bytes = Arc::new(Mutex::new(Vec::new()));
        (Sink::new(Buf(Arc::clone(&bytes))), bytes)
    }

    /// A line, flushed; errors (a closed pipe) are ignored, as eprintln's would panic.
    pub(crate) fn line(&self, text: &str) {
        let mut w = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(w, "{text}").and_then(|()| w.flush());
    }
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).flush()
    }
}

/// Where an invocation runs: the fabric, its output streams, and whether stderr is a terminal.
#[derive(Debug, Clone)]
pub struct Env {
    /// Verbs for the binary; tests run the in-memory fabric.
    pub fabric: Fabric,
    /// The command line, for the reports.
    pub command_line: Vec<String>,
    /// The report (unless `--output`).
    pub stdout: Sink,
    /// Notices, warnings and, off a terminal, the progress lines.
    pub stderr: Sink,
    /// stderr is a terminal: progress is one redrawn status line (indicatif) on it.
    pub terminal: bool,
}

impl Env {
    /// The process's own: verbs, its arguments, its stdout and stderr.
    pub fn process() -> Env {
        Env {
            fabric: Fabric::Verbs,
            command_line: std::env::args().collect(),
            stdout: Sink::new(io::stdout()),
            stderr: Sink::new(io::stderr()),
            terminal: io::IsTerminal::is_terminal(&io::stderr()),
        }
    }
}

/// A result file, written whole once the run succeeded ([`Pending`]).
fn create(path: &Path) -> Result<Pending> {
    Pending::create(path).map_err(|source| Error::File { what: "creating", path: path.to_owned(), source })
}

/// Writes `text` into `file` and puts it in place.
fn commit(mut file: Pending, text: &str) -> Result<()> {
    let path = file.path().to_owned();
    file.write_all(text.as_bytes()).and_then(|()| file.commit()).map_err(|source| Error::File {
        what: "writing",
        path,
        source,
    })
}

fn write_all(sink: &Sink, path: Option<&Path>, text: &str) -> Result<()> {
    let mut w = sink.clone();
    w.write_all(text.as_bytes()).and_then(|()| w.flush()).map_err(|source| Error::File {
        what: "writing",
        path: path.map_or_else(|| "stdout".into(), Path::to_owned),
        source,
    })
}

/// Runs `args` as the binary does; `Ok(false)` when verification found bad blocks.
/// Deprecation notices go to `env.stderr` first; bad arguments and output files that cannot be
/// created fail before anything connects.
pub fn execute(args: &Args, env: &Env) -> Result<bool> {
    for notice in args.deprecations() {
        env.stderr.line(&format!("rblk-bench: {notice}"));
    }
    let inv = args.invocation()?;
    for note in &inv.notes {
        env.stderr.line(&format!("rblk-bench: {note}"));
    }
    let in_section = |s: &Section, e: Error| -> Error {
        match &s.place {
            Some(p) => p.error(e),
            None => e,
        }
    };
    for s in &inv.sections {
        s.spec.check().map_err(|e| in_section(s, e))?;
    }
    // One set of options for every section: the key is the first section's target's (a job
    // file names one target as a rule; --key-file picks one for all).
    let first = inv.sections.first().and_then(|s| rblk_initiator::Uri::parse(&s.uri).ok());
    let options = Options { fabric: env.fabric, ..args.options_for(first.as_ref())? };
    let many = inv.sections.len() > 1;
    if args.json.is_some() && many {
        return Err(Error::Invalid(
            "--json writes one job's report in rblk-bench's earlier layout; use -o json for a job file".into(),
        ));
    }
    // Created before the run, so that a bad path is found before minutes of load, not after.
    let legacy = match args.json.as_deref() {
        None => None,
        Some(p) if p == Path::new("-") => Some(None),
        Some(p) => Some(Some(create(p)?)),
    };
    let out = args.output.as_deref().map(create).transpose()?;
    let mut logs = match args.log() {
        Some(_) if many => {
            return Err(Error::Invalid(format!(
                "--log writes the time series of one job section; this job file has {}",
                inv.sections.len()
            )))
        }
        Some((prefix, interval)) => Some(Logs::create(prefix, interval, &inv.sections[0].spec)?),
        None => None,
    };
    let progress = (!args.quiet).then(|| {
        let plan = inv.sections.iter().map(|s| (s.groupid, expected(&s.spec))).collect();
        if env.terminal {
            Progress::terminal(plan)
        } else {
            Progress::lines(env.stderr.clone(), plan)
        }
    });
    let result = run_all(&inv, &options, progress.as_ref(), logs.as_mut(), env, in_section);
    if let Some(p) = &progress {
        p.clear();
    }
    let reports = result?;
    if let Some(l) = logs {
        l.commit()?;
    }
    let passed = reports.iter().all(Report::passed);
    let text = || {
        if many {
            inv.sections
                .iter()
                .zip(&reports)
                .map(|(s, r)| format!("{}: (groupid={}, jobs={})\n{}", s.name, s.groupid, s.spec.jobs, r.text()))
                .collect::<String>()
        } else {
            reports[0].text()
        }
    };
    if let Some(file) = legacy {
        let json = serde_json::to_string_pretty(&reports[0]).expect("the report serializes") + "\n";
        match file {
            None => {
                write_all(&env.stderr, None, &text())?;
                write_all(&env.stdout, None, &json)?;
            }
            Some(file) => {
                write_all(&env.stdout, None, &text())?;
                commit(file, &json)?;
            }
        }
        return Ok(passed);
    }
    let body = match args.output_format {
        OutputFormat::Normal => text(),
        f => fio::document(
            &inv.sections,
            &reports,
            &inv.global_options,
            inv.group_reporting,
            f == OutputFormat::JsonPlus,
            &env.command_line,
            SystemTime::now(),
        ),
    };
    match out {
        Some(file) => commit(file, &body)?,
        None => write_all(&env.stdout, None, &body)?,
    }
    Ok(passed)
}

/// A section's expected length, for the ETA: ramp + runtime, unless its size decides.
fn expected(spec: &Spec) -> Option<Duration> {
    spec.stop().runtime.map(|r| spec.ramp + r)
}

/// Runs the groups one after another, the sections of a group together (each on its own
/// thread, with its own session); the first error ends the invocation after its group.
fn run_all(
    inv: &Invocation,
    options: &Options,
    progress: Option<&Arc<Progress>>,
    mut logs: Option<&mut Logs>,
    env: &Env,
    in_section: impl Fn(&Section, Error) -> Error + Sync,
) -> Result<Vec<Report>> {
    let run = |i: usize, logs: Option<&mut Logs>| -> Result<Report> {
        let s = &inv.sections[i];
        let run = Run { progress: progress.map(|p| p.slot(i)), command_line: env.command_line.clone() };
        run.run_with_logs(&s.uri, options, &s.spec, logs).map_err(|e| in_section(s, e))
    };
    let groups = inv.sections.iter().map(|s| s.groupid + 1).max().unwrap_or(0);
    let mut reports: Vec<Option<Report>> = vec![None; inv.sections.len()];
    for g in 0..groups {
        let members: Vec<usize> = (0..inv.sections.len()).filter(|&i| inv.sections[i].groupid == g).collect();
        let results: Vec<(usize, Result<Report>)> = if let [only] = members[..] {
            vec![(only, run(only, logs.take()))]
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = members.iter().map(|&i| (i, scope.spawn(move || run(i, None)))).collect();
                handles.into_iter().map(|(i, h)| (i, h.join().unwrap_or(Err(Error::Panicked { job: 0 })))).collect()
            })
        };
        for (i, r) in results {
            reports[i] = Some(r?);
        }
    }
    Ok(reports.into_iter().map(|r| r.expect("every section ran")).collect())
}
