//! Issue 43's traps in `rblk` that a host without RDMA or ublk shows: the real binary, run as
//! a user would, everything here decided before anything connects. (Trap 6, status on stdout,
//! is `fuse.rs`'s `mem_rblk_umount_says_what_it_did_on_stderr_only`; the key search, trap 10's
//! first item, is `key_search.rs`; trap 8, `-h`, is a unit test of the `rblk` crate.)
//!
//! What each would catch:
//! - `value_errors_say_what_is_wanted` (trap 7): clap's and the standard library's renderings
//!   (`300 is not in 0..=255`, `value was not a boolean`, `[possible values: true, false]`,
//!   `invalid IP address syntax`, `invalid socket address syntax`, `invalid digit found in
//!   string`) reaching a user instead of what the flag wants, or an OS error's `(os error N)`.
//! - `detach_says_the_driver_is_missing_once_in_words` (trap 7): libublk's own `Please run
//!   modprobe ublk_drv first` line and `(os error 2)` from `rblk detach`.
//! - `a_bad_uri_is_a_usage_error_for_every_front_end` (trap 10, exit codes): `rblk mount` and
//!   `rblk nbd` exiting 1 on a bad URI where every other command exits 2.
//! - `attach_depth_0_is_a_usage_error_before_the_driver_check` (trap 10): `--depth 0` refused
//!   only after root and the driver were checked (exit 1, after the wrong complaint).
//! - `local_paths_are_checked_before_connecting` (trap 10): `rblk mount URI /nonexistent` and
//!   `rblk nbd --listen unix:/nonexistent/x.sock` reporting the RDMA connect's error instead of
//!   the path.
//! - `write_refuses_a_terminal_on_stdin` (trap 10): `rblk write` with a terminal on stdin waiting
//!   silently for typing (here: connecting first) where `rblk read` refuses a terminal on stdout.
//! - `devices_exit_alike_in_text_and_json` (trap 10): `rblk devices` exiting 1 with no device
//!   while `-o json` exits 0 with `[]`.

use std::process::{Command, Output};

use rblk_tests::blockdev::rblk;

fn run(args: &[&str]) -> Output {
    Command::new(rblk()).args(args).env_remove("RBLK_KEY_FILE").output().expect("run rblk")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit 2 (a usage error) with `words` on stderr and none of clap's or Rust's own texts.
fn usage_error(args: &[&str], words: &str) {
    let o = run(args);
    let text = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {text}");
    assert!(text.contains(words), "{args:?}: {text}");
    for rust in ["..=", "not a boolean", "possible values", "syntax", "invalid digit", "os error"] {
        assert!(!text.contains(rust), "{args:?}: {rust:?} in {text}");
    }
}

#[test]
fn value_errors_say_what_is_wanted() {
    usage_error(&["info", "rblk://h/v", "--tos", "300"], "--tos must be a whole number from 0 to 255");
    usage_error(&["info", "rblk://h/v", "--memory-windows", "maybe"], "expected on or off, got \"maybe\"");
    usage_error(&["info", "rblk://h/v", "--source-addr", "eth0"], "--source-addr takes an IP address");
    usage_error(&["nbd", "rblk://h/v", "--metrics", "9100"], "--metrics takes an IP address and a port");
    usage_error(&["attach", "rblk://h/v", "--depth", "x"], "--depth must be a whole number from 1 to 1024");
    let help = run(&["info", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(help.status.success() && text.contains("--memory-windows <on|off>"), "{text}");
    assert!(!text.contains("possible values: true, false"), "{text}");
    // Off still parses, in every spelling a user may try.
    for off in ["off", "false", "no", "0"] {
        let o = run(&["info", "rblk://h/v", "--memory-windows", off, "--timeout", "1"]);
        assert_ne!(o.status.code(), Some(2), "--memory-windows {off}: {}", stderr(&o));
        // It got to the connect, whose failure here (no RDMA device) is said without Rust's
        // `(os error 19)`.
        assert!(!stderr(&o).contains("os error"), "{}", stderr(&o));
    }
}

/// Run as root (as CI does): `rblk detach` refuses other users before it reaches the driver.
#[test]
fn detach_says_the_driver_is_missing_once_in_words() {
    let uid = Command::new("id").arg("-u").output().expect("id -u");
    assert_eq!(String::from_utf8_lossy(&uid.stdout).trim(), "0", "this test runs rblk detach as root");
    let o = run(&["detach", "/dev/ublkb4093"]);
    let text = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(o.stdout.is_empty(), "{text}");
    assert!(!text.contains("Please run") && !text.contains("os error"), "libublk's or Rust's text: {text}");
    if std::path::Path::new("/dev/ublk-control").exists() {
        assert!(text.contains("/dev/ublkb4093: no such ublk device"), "{text}");
    } else {
        assert_eq!(text, "rblk: opening /dev/ublkb4093: the ublk driver is not loaded (modprobe ublk_drv)\n");
    }
}

/// Trap 10's exit codes: a bad URI is a usage error (exit 2) for `mount` and `nbd` too, as for
/// `info`, `read` and `attach` (it was exit 1, after the key search).
#[test]
fn a_bad_uri_is_a_usage_error_for_every_front_end() {
    usage_error(&["mount", "nfs://h/v", "/mnt"], "URI");
    usage_error(&["nbd", "rblk://h"], "URI");
}

#[test]
fn attach_depth_0_is_a_usage_error_before_the_driver_check() {
    usage_error(&["attach", "rblk://h/v", "--depth", "0"], "--depth must be a whole number from 1 to 1024");
    usage_error(&["attach", "rblk://h/v", "--depth", "1025"], "(requests in flight per queue), got \"1025\"");
}

#[test]
fn local_paths_are_checked_before_connecting() {
    let missing = std::env::temp_dir().join(format!("rblk-cli-traps-{}-missing", std::process::id()));
    let m = missing.to_str().unwrap();
    let listen = format!("unix:{m}/x.sock");
    let cases = [
        (vec!["mount", "rblk://127.0.0.1:9/v", m], format!("the mount point {m} does not exist")),
        (vec!["mount", "rblk://127.0.0.1:9/v", "/etc/hostname"], "/etc/hostname is not a directory".into()),
        (vec!["nbd", "rblk://127.0.0.1:9/v", "--listen", &listen], format!("the directory {m} does not exist")),
    ];
    for (args, words) in cases {
        let o = run(&[&args[..], &["--timeout", "1"]].concat());
        let text = stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {text}");
        assert!(text.contains(&words), "{args:?}: {text}");
        assert!(!text.to_lowercase().contains("rdma"), "{args:?} connected before checking the path: {text}");
    }
}

#[test]
fn write_refuses_a_terminal_on_stdin() {
    // util-linux's script(1) gives the command a terminal for stdin and stdout; timeout(1) ends
    // a command that waits for typing.
    let cmd = format!("timeout 20 {} write rblk://127.0.0.1:9/v --offset 0 --timeout 1", rblk());
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().expect("script(1) from util-linux");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("standard input is a terminal: give --input FILE or pipe the data in"), "{text}");
    assert!(!text.to_lowercase().contains("rdma"), "connected before refusing the terminal: {text}");
}

#[test]
fn devices_exit_alike_in_text_and_json() {
    let text = run(&["devices"]);
    let json = run(&["devices", "-o", "json"]);
    assert_eq!(text.status.code(), json.status.code(), "text: {}; json: {}", stderr(&text), stderr(&json));
    let listed: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    if listed.as_array().is_some_and(Vec::is_empty) {
        assert_eq!(json.status.code(), Some(0), "an empty listing is no error");
        assert!(text.stdout.is_empty(), "{}", String::from_utf8_lossy(&text.stdout));
        assert!(stderr(&text).contains("no RDMA device found"), "the reason: {}", stderr(&text));
    }
}
