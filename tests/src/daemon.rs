//! The real `rblk-target` binary as a child process, for tests in the guest.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use crate::rxe::Rdma;

/// Where the binaries are: `RBLK_BIN_DIR`, else the cargo build dir next to the test executable.
pub fn bin(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("RBLK_BIN_DIR") {
        return PathBuf::from(dir).join(name);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // build/<profile>/deps/<test> -> build/<profile>/<name>
    exe.parent().and_then(|p| p.parent()).expect("build dir").join(name)
}

/// A running `rblk-target`; SIGTERM and wait on drop.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its stderr lines so far are forwarded to the test's stderr.
    _log: std::thread::JoinHandle<()>,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    /// Its `--config` file, if it was started with one.
    config: Option<PathBuf>,
}

/// `--admin-socket none` unless the test chose one: daemons of one test run side by side, and
/// the default path is one per host. And `--allow-any-host`: tests without a key of their own
/// connect without one, as before keys became the default (keys a test configures still
/// apply); [`Daemon::start_as_configured`] starts the daemon with `args` alone.
fn defaults(args: &[&str]) -> Vec<&'static str> {
    let mut defaults = vec!["--allow-any-host"];
    if !args.iter().any(|a| a.starts_with("--admin-socket")) {
        defaults.extend(["--admin-socket", "none"]);
    }
    defaults
}

/// A port unlikely to collide between tests of one run.
fn port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 2000) as u16 * 10;
    base + NEXT.fetch_add(1, Ordering::Relaxed) % 10
}

impl Daemon {
    /// Starts `rblk-target --listen ADDR:PORT` with `args`, and waits until it listens.
    pub fn start(rdma: &Rdma, args: &[&str]) -> Daemon {
        Daemon::start_at(SocketAddr::new(rdma.addr, port()), args)
    }

    /// [`Daemon::start`] on a given address (a restart where the last one listened).
    pub fn start_at(addr: SocketAddr, args: &[&str]) -> Daemon {
        Daemon::start_exactly(addr, &[&defaults(args)[..], args].concat())
    }

    /// Starts `rblk-target --listen ADDR:PORT` with `args` and nothing else (no
    /// `--allow-any-host`, the default admin socket), and waits until it listens.
    pub fn start_as_configured(rdma: &Rdma, args: &[&str]) -> Daemon {
        Daemon::start_exactly(SocketAddr::new(rdma.addr, port()), args)
    }

    /// [`Daemon::start_at`] of the binary at `program` (a copy elsewhere: an upgrade).
    pub fn start_program_at(program: &std::path::Path, addr: SocketAddr, args: &[&str]) -> Daemon {
        Daemon::start_program(program, addr, &[&defaults(args)[..], args].concat())
    }

    fn start_exactly(addr: SocketAddr, args: &[&str]) -> Daemon {
        Daemon::start_program(&bin("rblk-target"), addr, args)
    }

    fn start_program(program: &std::path::Path, addr: SocketAddr, args: &[&str]) -> Daemon {
        let mut child = Command::new(program)
            .arg("--listen")
            .arg(addr.to_string())
            .args(args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rblk-target (is RBLK_BIN_DIR right?)");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, rx) = mpsc::channel();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        let log = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rblk-target] {line}");
                kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line.clone());
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            panic!("rblk-target did not start listening on {addr}");
        }
        Daemon { child, addr, _log: log, lines, config: config_arg(args) }
    }

    /// Starts `rblk-target --listen ADDR:PORT` with `args` and extra environment `env` (e.g.
    /// NOTIFY_SOCKET), and returns at once, before it listens: for tests that watch the
    /// start themselves.
    pub fn spawn_with_env(rdma: &Rdma, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Daemon {
        let addr = SocketAddr::new(rdma.addr, port());
        let mut child = Command::new(bin("rblk-target"))
            .arg("--listen")
            .arg(addr.to_string())
            .args(defaults(args))
            .args(args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn rblk-target (is RBLK_BIN_DIR right?)");
        let stderr = child.stderr.take().expect("stderr");
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = std::sync::Arc::clone(&lines);
        let log = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("[rblk-target] {line}");
                kept.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(line);
            }
        });
        Daemon { child, addr, _log: log, lines, config: config_arg(args) }
    }

    /// Waits until a log line contains all of `words`, at most `within`; false if none did.
    pub fn wait_log(&self, words: &[&str], within: Duration) -> bool {
        let deadline = std::time::Instant::now() + within;
        while std::time::Instant::now() < deadline {
            if !self.log_lines(words).is_empty() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    /// Writes `toml` to its `--config` file and sends SIGHUP: the daemon's line saying the
    /// reload's outcome, Ok for `configuration reloaded: REPORT`, Err for `reload refused: WHY`.
    pub fn reload(&self, toml: &str) -> Result<String, String> {
        const DONE: [&str; 2] = ["rblk-target: configuration reloaded", "rblk-target: reload refused"];
        let path = self.config.as_ref().expect("the daemon was started with --config");
        let before: usize = DONE.iter().map(|d| self.log_lines(&[d]).len()).sum();
        std::fs::write(path, toml).expect("write the config file");
        self.signal("HUP");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let lines = self.log_lines(&[]);
            let done: Vec<&String> = lines.iter().filter(|l| DONE.iter().any(|d| l.starts_with(d))).collect();
            if let Some(line) = done.get(before) {
                return if line.starts_with(DONE[0]) { Ok((*line).clone()) } else { Err((*line).clone()) };
            }
            assert!(std::time::Instant::now() < deadline, "no reload outcome logged within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `signal` (a name for kill(1): HUP, TERM, ...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {}", self.child.id());
    }

    /// Its log lines so far that contain all of `words`.
    pub fn log_lines(&self, words: &[&str]) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        lines.iter().filter(|l| words.iter().all(|w| l.contains(w))).cloned().collect()
    }

    /// The daemon's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `VmPin` of the daemon, in kB (pages pinned by registrations).
    pub fn vm_pin_kb(&self) -> u64 {
        self.status("VmPin")
    }

    /// The number in field `name` of the daemon's /proc/PID/status (a `kB` unit dropped).
    fn status(&self, name: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).expect("daemon status");
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/PID/status"))
    }

    /// Protection domains the daemon holds (`rdma res show pd`): one per live session, plus one
    /// per connection still negotiating.
    pub fn pd_count(&self) -> usize {
        self.rdma_res("pd")
    }

    /// Times the daemon's threads named `prefix`* went to sleep waiting (the sum of their
    /// `voluntary_ctxt_switches`): for a worker, its wake-ups.
    pub fn sleeps_of(&self, prefix: &str) -> u64 {
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).expect("daemon threads");
        tasks
            .filter_map(|e| e.ok())
            .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with(prefix)))
            .filter_map(|e| std::fs::read_to_string(e.path().join("status")).ok())
            .filter_map(|st| {
                st.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:")?.trim().parse::<u64>().ok())
            })
            .sum()
    }

    /// Threads of the daemon (`Threads:` of /proc/PID/status).
    pub fn threads(&self) -> u64 {
        self.status("Threads")
    }

    /// The daemon's RDMA resources of `kind` (`rdma res show KIND`: pd, mr, qp, cq).
    pub fn rdma_res(&self, kind: &str) -> usize {
        let out = Command::new("rdma").args(["res", "show", kind]).output().expect("rdma res show");
        // The kernel names the allocating thread, so match any of the daemon's threads.
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .expect("daemon threads")
            .filter_map(|e| e.ok().map(|e| format!(" pid {} ", e.file_name().to_string_lossy())))
            .collect();
        String::from_utf8_lossy(&out.stdout).lines().filter(|l| tids.iter().any(|t| l.contains(t.as_str()))).count()
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    /// Waits (at most `within`) for it to exit on its own; None if it did not.
    pub fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return Some(s);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL (a crash), then the exit status.
    pub fn kill(mut self) -> std::process::ExitStatus {
        let _ = self.child.kill();
        self.child.wait().expect("wait")
    }

    /// SIGTERM, then the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        self.terminate()
    }

    fn terminate(&mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        for _ in 0..300 {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                return s;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        self.child.wait().expect("wait")
    }
}

/// The value of `--config` in `args`.
fn config_arg(args: &[&str]) -> Option<PathBuf> {
    args.iter().position(|a| *a == "--config").and_then(|i| args.get(i + 1)).map(PathBuf::from)
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}
