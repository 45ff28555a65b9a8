//! Block devices made by `rblk attach` (ublk), for the guest tests: attach and detach through the
//! real binary, fio runs and fio's verdict.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::daemon::bin;

/// The `rblk` binary's path.
pub fn rblk() -> String {
    bin("rblk").display().to_string()
}

/// `rblk ARGS...` (with `-o json` or `--json` among them) that must succeed: its stdout as JSON. Panics with
/// rblk's stderr when it fails, or with what was wrong when it printed no JSON.
pub fn rblk_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(rblk()).args(args).output().expect("run rblk");
    assert!(out.status.success(), "rblk {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("rblk {args:?} printed no JSON ({e})"))
}

/// Loads ublk_drv; fails the test when the kernel has none.
pub fn ublk_drv() {
    let ok = Command::new("modprobe").arg("ublk_drv").status().is_ok_and(|s| s.success());
    assert!(
        ok && Path::new("/dev/ublk-control").exists(),
        "the guest kernel must have ublk_drv (Debian's 6.12 from bookworm-backports has it; 6.1 does not)"
    );
}

/// An attachment made with `rblk attach --daemon`.
#[derive(Debug)]
pub struct Attached {
    /// `/dev/ublkbN`.
    pub dev: String,
    /// The serving process.
    pub pid: u32,
}

/// `rblk attach URI --daemon EXTRA...`: the device and the serving process's pid. Checks that
/// stdout is exactly one line, the device (`losetup --find --show`'s manner), and takes the pid
/// from stderr's `rblk: pid N serves DEV`.
pub fn attach(uri: &str, extra: &str) -> Attached {
    let out = Command::new("bash")
        .args(["-c", &format!("{} attach {uri} --daemon {extra}", rblk())])
        .stdin(Stdio::null())
        .output()
        .expect("run rblk attach");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "rblk attach failed: {stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].starts_with("/dev/ublkb"),
        "stdout must be exactly the device: {stdout:?} (stderr {stderr:?})"
    );
    let dev = lines[0];
    let pid = stderr
        .lines()
        .find_map(|l| l.strip_prefix("rblk: pid ").and_then(|r| r.split_once(" serves ")))
        .and_then(|(p, _)| p.parse().ok())
        .unwrap_or_else(|| panic!("no 'rblk: pid N serves' in {stderr:?}"));
    assert!(Path::new(dev).exists(), "{dev} exists after attach");
    Attached { dev: dev.to_owned(), pid }
}

/// A test that fails while its device is attached detaches it, so the device cannot fail the
/// next test (a CI run once left `/dev/ublkb0` behind, and `ublk.rs`'s "no device left behind"
/// check failed on it). A passing test detaches it itself and checks what that prints.
impl Drop for Attached {
    fn drop(&mut self) {
        if std::thread::panicking() && Path::new(&self.dev).exists() {
            let _ = Command::new(rblk()).args(["detach", &self.dev]).stdin(Stdio::null()).output();
        }
    }
}

/// `rblk detach DEV`: its status lines (stderr); stdout must be empty.
pub fn detach(dev: &str) -> String {
    let out = Command::new(rblk()).args(["detach", dev]).stdin(Stdio::null()).output().expect("run rblk detach");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "rblk detach {dev} failed ({}): {stderr}", out.status);
    // Issue 43, trap 6: status lines go to stderr; detach has no result to print.
    assert!(stdout.is_empty(), "rblk detach {dev} printed on stdout: {stdout:?}");
    eprint!("{stderr}");
    stderr.into_owned()
}

/// The error count of fio's terse (v3) output: field 5 of its last line.
pub fn fio_errors(terse: &str) -> u64 {
    terse
        .lines()
        .rev()
        .find(|l| l.split(';').count() > 5)
        .and_then(|l| l.split(';').nth(4))
        .and_then(|e| e.parse().ok())
        .unwrap_or_else(|| panic!("no fio terse output in {terse:?}"))
}

/// fio on `dev` (a device or a file) with O_DIRECT and terse (v3) output on its piped stdout,
/// plus `extra` arguments; started, not waited for (see [`wait_child`]).
pub fn fio(dev: &str, extra: &[&str]) -> Child {
    Command::new("fio")
        .args(["--name=r", &format!("--filename={dev}"), "--ioengine=libaio", "--direct=1"])
        .args(["--group_reporting", "--output-format=terse", "--terse-version=3"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn fio")
}

/// fio writing `dev` in four jobs, each on its own `job_mib` MiB region, 4 KiB random writes at
/// QD16 paced to 150 a second per job (so the run spans the faults a test injects meanwhile),
/// every block verified (crc32c) at the end; started, not waited for.
pub fn fio_paced_verified_writes(dev: &str, job_mib: u64) -> Child {
    let (size, increment) = (format!("--size={job_mib}M"), format!("--offset_increment={job_mib}M"));
    fio(
        dev,
        &[
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=16",
            "--numjobs=4",
            &size,
            &increment,
            "--rate_iops=,150",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
        ],
    )
}

/// Waits for `child` at most `limit` (the test fails after that, naming `what`); its exit status
/// and stdout.
pub fn wait_child(child: &mut Child, limit: Duration, what: &str) -> std::process::Output {
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < limit, "{what} still runs after {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    if let Some(mut s) = child.stdout.take() {
        std::io::Read::read_to_string(&mut s, &mut out).unwrap();
    }
    let status = child.wait().unwrap();
    std::process::Output { status, stdout: out.into_bytes(), stderr: Vec::new() }
}
