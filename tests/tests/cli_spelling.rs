//! `rblk`'s spellings and exit codes as nvme-cli users expect them, run as a user would (the
//! real binary, on a host without RDMA: everything here is decided before anything connects).
//!
//! What each would catch:
//! - `listings_are_json_with_o_json_and_empty_is_not_an_error`: `-o json` ignored, or an empty
//!   listing that prints nothing or exits 1 (`rblk devices --json` once printed `[]` and exited 1).
//! - `yesterdays_spellings_work_and_say_what_replaces_them`: the `--json` and `rblk ls` aliases
//!   dropped (scripts break) or kept silently (nobody moves to the new spelling).
//! - `o_is_a_format_never_a_file`: `rblk read ... -o json` writing a file named `json`, or `-o
//!   FILE` failing without saying what to use.
//! - `a_bad_uri_is_a_usage_error`: URIs checked only after connecting, with exit 1 where clap's
//!   usage errors exit 2.
//! - `read_refuses_to_garble_a_terminal`: binary data written to a terminal.
//! - `ranges_are_said_in_words`: clap's `1 is not in 5..18446744073709551615` for a flag out of
//!   its range.
//! - `completions_come_from_the_binary`: `rblk completions SHELL` missing or stale (no
//!   `discover`).

use std::process::{Command, Output};

use rblk_tests::blockdev::rblk;

fn run(args: &[&str]) -> Output {
    Command::new(rblk()).args(args).output().expect("run rblk")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn listings_are_json_with_o_json_and_empty_is_not_an_error() {
    let dir = std::env::temp_dir().join(format!("rblk-cli-spelling-{}", std::process::id()));
    for args in [&["devices", "-o", "json"][..], &["list", "-o", "json"], &["list", "--output-format", "json"]] {
        let o = Command::new(rblk()).args(args).env("RBLK_RUN_DIR", &dir).output().unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        assert!(v.is_array(), "{args:?}: {v}");
    }
}

#[test]
fn yesterdays_spellings_work_and_say_what_replaces_them() {
    let new = run(&["devices", "-o", "json"]);
    let old = run(&["devices", "--json"]);
    assert_eq!(old.stdout, new.stdout, "--json prints what -o json prints");
    assert!(old.status.success());
    assert!(stderr(&old).contains("--json is deprecated; use -o json"), "{}", stderr(&old));
    assert!(!stderr(&new).contains("deprecated"), "{}", stderr(&new));
    // `ls` is `discover` (it then fails to connect here: no RDMA device; not a usage error).
    let ls = run(&["ls", "rblk://127.0.0.1:9", "--timeout", "1"]);
    assert!(stderr(&ls).contains("`rblk ls` is deprecated; use `rblk discover`"), "{}", stderr(&ls));
    assert_ne!(ls.status.code(), Some(2), "ls parses as discover: {}", stderr(&ls));
}

#[test]
fn o_is_a_format_never_a_file() {
    let read = run(&["read", "rblk://127.0.0.1/v", "--length", "4k", "-o", "out.bin"]);
    assert_eq!(read.status.code(), Some(2), "{}", stderr(&read));
    assert!(stderr(&read).contains("use --output out.bin"), "{}", stderr(&read));
    assert!(!std::path::Path::new("out.bin").exists());
    let info = run(&["info", "rblk://127.0.0.1/v", "-o", "report.json"]);
    assert_eq!(info.status.code(), Some(2));
    assert!(stderr(&info).contains("not an output format (normal or json); to write to a file use --output FILE"));
}

#[test]
fn a_bad_uri_is_a_usage_error() {
    for args in [&["info", "nfs://h/v"][..], &["read", "rblk://h", "--length", "4k"], &["attach", "h/v"]] {
        let o = run(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("URI"), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn read_refuses_to_garble_a_terminal() {
    // util-linux's script(1) gives the command a terminal for stdout.
    let cmd = format!("{} read rblk://127.0.0.1/v --length 4k", rblk());
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().expect("script(1) from util-linux");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("standard output is a terminal: give --output FILE, or --output -"), "{text}");
}

#[test]
fn completions_come_from_the_binary() {
    for shell in ["bash", "zsh", "fish"] {
        let o = run(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", stderr(&o));
        assert!(String::from_utf8_lossy(&o.stdout).contains("discover"), "{shell}");
    }
}

#[test]
fn ranges_are_said_in_words() {
    let o = run(&["attach", "rblk://h/v", "--queues", "65"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("65 is out of range: it must be between 1 and 64"), "{}", stderr(&o));
    let target = rblk_tests::daemon::bin("rblk-target");
    let o = Command::new(target).args(["--keepalive-timeout", "1", "--check-config"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("1 is too small: it must be at least 5"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(".."), "no Rust range in a message: {}", stderr(&o));
}
