//! `rblk-bench`: load-test an rblk volume.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser;
use rblk_bench::{Args, Logs, Run};

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(io::stderr)
        .with_ansi(io::IsTerminal::is_terminal(&io::stderr()))
        .init();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("rblk-bench: verification FAILED (bad blocks listed above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("rblk-bench: {}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, each once.
fn error_text(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

/// Runs the benchmark; `Ok(false)` when verification found bad blocks.
fn run(args: &Args) -> anyhow::Result<bool> {
    let spec = args.spec();
    // Refuse bad arguments before connecting (the volume's limits are checked after opening).
    spec.check()?;
    let options = args.options()?;
    // Created before the run, so that a bad path is found before minutes of load, not after.
    // `-` is stdout: the JSON goes there alone, the text report to stderr.
    let mut json: Option<Box<dyn Write>> = match args.json.as_deref() {
        None => None,
        Some(p) if p == Path::new("-") => Some(Box::new(io::stdout())),
        Some(p) => Some(Box::new(File::create(p).with_context(|| format!("creating {}", p.display()))?)),
    };
    // The logs too.
    let mut logs = match args.log() {
        Some((prefix, interval)) => Some(Logs::create(prefix, interval, &spec)?),
        None => None,
    };
    let run = Run { progress: !args.quiet, command_line: std::env::args().collect() };
    let report = run.run_with_logs(&args.uri, &options, &spec, logs.as_mut())?;
    if args.json.as_deref() == Some(Path::new("-")) {
        eprint!("{}", report.text());
    } else {
        print!("{}", report.text());
    }
    if let Some(out) = &mut json {
        let text = serde_json::to_string_pretty(&report).context("encoding the JSON report")?;
        out.write_all((text + "\n").as_bytes()).and_then(|()| out.flush()).context("writing the JSON report")?;
    }
    Ok(report.passed())
}
