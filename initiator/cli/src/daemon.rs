//! `--daemon` for the front ends that serve a volume (`rblk mount`, `rblk attach`).
//!
//! `--daemon` cannot fork (forking after memory registration breaks the registered pages, and
//! this crate has no unsafe code): it re-executes the binary with the same arguments plus a
//! hidden `--detached`, before any verbs resource exists. The detached process calls setsid and
//! reports readiness on its stdout, a pipe to the waiting parent: the lines to show the user,
//! then a sentinel line. Its stderr goes to the parent too until then, after which it is
//! /dev/null or `--log-file`.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};

/// `--daemon` and its companions, for the front ends that serve (flattened into their arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct DaemonArgs {
    /// Return once serving, leaving a background process to serve
    ///
    /// The detached process's pid is printed on stderr.
    #[arg(long)]
    pub daemon: bool,
    /// With --daemon: append the background process's log here
    ///
    /// Default: discarded.
    #[arg(long, value_name = "PATH", requires = "daemon")]
    pub log_file: Option<PathBuf>,
    /// Internal: this is the background process of --daemon.
    #[arg(long, hide = true)]
    pub detached: bool,
}

/// The detached process's last line on its stdout once it serves.
pub const READY: &str = "rblk: ready";

/// In the detached process, first thing: a session of its own (no controlling terminal, no
/// signals from the parent's one).
pub fn become_detached() -> anyhow::Result<()> {
    nix::unistd::setsid().context("setsid")?;
    Ok(())
}

/// `--daemon`: runs this command again, detached, relays what it prints until it is ready,
/// and returns its pid; fails (with its exit status) if it exits first.
pub fn spawn_detached(what: &str) -> anyhow::Result<u32> {
    let exe = std::env::current_exe().context("finding the rblk executable")?;
    let mut child = Command::new(&exe)
        .args(child_args(std::env::args_os().skip(1)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let pid = child.id();
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        bail!("the background process has no pipes");
    };
    // Its log until it is ready (it then points stderr elsewhere, which ends this relay).
    let relay = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
        }
    });
    let mut ready = false;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading from the background process")?;
        if line == READY {
            ready = true;
            break;
        }
        println!("{line}");
    }
    if ready {
        // Ends at once: the child points its stderr elsewhere right after READY.
        let _ = relay.join();
        return Ok(pid);
    }
    let status = child.wait().context("waiting for the background process")?;
    let _ = relay.join();
    bail!("the background process exited before {what} ({status})")
}

/// The detached process, once ready: stderr to the log file (or /dev/null), stdout to
/// /dev/null, so nothing writes into the pipes of a parent that has gone.
pub fn detach_stdio(log_file: Option<&Path>) -> anyhow::Result<()> {
    let null = || File::options().read(true).write(true).open("/dev/null").context("opening /dev/null");
    let log = match log_file {
        // Mode 0600 (logs name volumes, hosts and errors), never through a planted symlink.
        Some(path) => {
            rblk_fabric::private::append(path).with_context(|| format!("opening the log file {}", path.display()))?
        }
        None => null()?,
    };
    nix::unistd::dup2_stderr(&log).context("redirecting stderr")?;
    nix::unistd::dup2_stdout(null()?).context("redirecting stdout")?;
    Ok(())
}

/// The background process's arguments: ours plus --detached (which wins over --daemon; keeping
/// --daemon keeps the flags that require it, such as --log-file, valid).
pub fn child_args(args: impl Iterator<Item = OsString>) -> Vec<OsString> {
    args.chain([OsString::from("--detached")]).collect()
}
