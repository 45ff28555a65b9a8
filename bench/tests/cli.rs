//! rblk-bench's command line as a user meets it: the binary, without RDMA.

use std::process::Command;
use std::time::{Duration, Instant};

/// Catches a --json file opened only after the run: a bad path must fail at once, before the
/// connect (which here, with no RDMA device, would fail with another error, or in real use
/// after minutes of load).
#[test]
fn a_bad_json_path_fails_before_anything_runs() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-bench"))
        .args(["rblk://127.0.0.1:1/v", "--json", "/nonexistent-dir/report.json", "--runtime", "1", "-q"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("creating /nonexistent-dir/report.json"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(5), "at once: {:?}", start.elapsed());
}

/// The same for --log: its files are created before the connect.
#[test]
fn a_bad_log_prefix_fails_before_anything_runs() {
    let start = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-bench"))
        .args(["rblk://127.0.0.1:1/v", "--log", "/nonexistent-dir/run", "--log-interval", "100", "-q"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("creating the log /nonexistent-dir/run_iops.1.log"), "{stderr}");
    assert!(start.elapsed() < Duration::from_secs(5), "at once: {:?}", start.elapsed());
}

/// Issue 43, trap 1: a failed run wiped the last result (`--output prev.json` left 0 bytes) and
/// left empty log files. Now each result goes to a temporary file beside it, renamed only once
/// the run succeeded: here the connect fails (no target, no RDMA on this host), and the
/// previous report, the previous log and nothing else are in the directory afterwards.
#[test]
fn a_failed_run_keeps_the_last_result_and_leaves_no_files() {
    let dir = std::env::temp_dir().join(format!("rblk-bench-cli-{}-failed", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let report = dir.join("prev.json");
    std::fs::write(&report, "{\"the\": \"last good result\"}\n").unwrap();
    std::fs::write(dir.join("lg_iops.1.log"), "0, 100, 0, 4096, 0\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-bench"))
        .args(["rblk://127.0.0.1:1/v", "-o", "json", "--output"])
        .arg(&report)
        .arg("--log")
        .arg(dir.join("lg"))
        .args(["--runtime", "1", "-q"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the run must fail: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(&report).unwrap(), "{\"the\": \"last good result\"}\n");
    assert_eq!(std::fs::read_to_string(dir.join("lg_iops.1.log")).unwrap(), "0, 100, 0, 4096, 0\n");
    let mut left: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    left.sort();
    assert_eq!(left, ["lg_iops.1.log", "prev.json"], "no new or temporary file is left");
    let _ = std::fs::remove_dir_all(dir);
}
