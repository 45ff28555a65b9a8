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
