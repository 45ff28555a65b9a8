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
//! - `sizes_take_fractions_and_both_unit_families`: `1.5M` refused, `1MB` taken as 2^20 (or as
//!   10^6, which is not whole blocks) instead of refused with a usage error that says why and
//!   what to write, a fraction of a byte taken; in rblk-target, rblk and rblk-bench alike.
//! - `durations_take_units_and_bare_seconds`: `30s`, `1m30s` or `1500ms` refused, a bare
//!   number no longer seconds, a bad duration taken or refused with exit 1 (not a usage error)
//!   or without words; the config file's `keepalive_timeout = "30s"` refused, or integers.

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
    assert!(stderr(&o).contains("1 s is out of range: it must be between 5 s and 1 day"), "{}", stderr(&o));
    assert!(!stderr(&o).contains(".."), "no Rust range in a message: {}", stderr(&o));
}

fn target(args: &[&str]) -> Output {
    Command::new(rblk_tests::daemon::bin("rblk-target")).args(args).output().expect("run rblk-target")
}

fn bench(args: &[&str]) -> Output {
    Command::new(rblk_tests::daemon::bin("rblk-bench")).args(args).output().expect("run rblk-bench")
}

/// The effective configuration, printed by rblk-target without RDMA hardware.
fn print_config(args: &[&str]) -> String {
    let o = target(&[&["--print-config", "--allow-any-host", "--admin-socket", "none"][..], args].concat());
    assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A usage error (exit 2) whose message says `needle`.
fn usage_error(o: &Output, needle: &str) {
    assert_eq!(o.status.code(), Some(2), "{needle:?}: {}", stderr(o));
    assert!(stderr(o).contains(needle), "{needle:?} not in {}", stderr(o));
}

const ONE_MB: &str =
    "\"1MB\" is 1000000 bytes, not a multiple of the block size 4096: use 1MiB (binary) or a multiple of 4096";

#[test]
fn sizes_take_fractions_and_both_unit_families() {
    // rblk-target: volume sizes, decided before any RDMA device is looked for.
    assert!(print_config(&["--volume", "v:1.5M"]).contains("size = 1572864"));
    assert!(print_config(&["--volume", "v:2MiB"]).contains("size = 2097152"));
    assert!(print_config(&["--volume", "v:4096KB"]).contains("size = 4096000"), "decimal, whole blocks");
    usage_error(&target(&["--print-config", "--volume", "v:1MB"]), ONE_MB);
    usage_error(
        &target(&["--check-config", "--volume", "v:6k"]),
        "\"6k\" is 6144 bytes, not a multiple of the block size 4096",
    );
    usage_error(&target(&["--check-config", "--volume", "v:0.3k"]), "\"0.3k\" is not a whole number of bytes");
    // rblk: a decimal size is taken (the read then fails to connect: no RDMA here, exit 1) ...
    let o = run(&["read", "rblk://127.0.0.1:9/v", "--length", "1.5M", "--timeout", "1", "--output", "/dev/null"]);
    assert_ne!(o.status.code(), Some(2), "1.5M is a size: {}", stderr(&o));
    // ... 1MB is not, and neither is an unknown suffix.
    usage_error(&run(&["read", "rblk://127.0.0.1/v", "--length", "1MB"]), ONE_MB);
    usage_error(&run(&["write", "rblk://127.0.0.1/v", "--offset", "4x"]), "\"4x\" is not a size: unknown suffix");
    // rblk-bench: the same parser.
    usage_error(&bench(&["rblk://127.0.0.1/v", "--bs", "1MB"]), ONE_MB);
    usage_error(&bench(&["rblk://127.0.0.1/v", "--size", "1.5"]), "\"1.5\" is not a whole number of bytes");
}

#[test]
fn durations_take_units_and_bare_seconds() {
    // rblk-target's flags: units, and a bare number is still seconds (printed as the file
    // says seconds: an integer; finer than a second: with its unit).
    assert!(print_config(&["--keepalive-timeout", "30s"]).contains("keepalive_timeout = 30\n"));
    let text = print_config(&["--keepalive-timeout", "1m30s", "--open-timeout", "1500ms"]);
    assert!(text.contains("keepalive_timeout = 90\n") && text.contains("open_timeout = \"1500ms\""), "{text}");
    assert!(print_config(&["--open-timeout", "12"]).contains("open_timeout = 12\n"));
    let o = target(&["--check-config", "--keepalive-timeout", "soon"]);
    usage_error(&o, "\"soon\" is not a duration: it does not start with a number");
    assert!(stderr(&o).contains("a bare number is seconds"), "{}", stderr(&o));
    usage_error(
        &target(&["--check-config", "--open-timeout", "2d"]),
        "2 days is out of range: it must be between 1 s and 1 day",
    );

    // The config file: integers as before, and strings with units.
    let dir = std::env::temp_dir().join(format!("rblk-cli-durations-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = |text: &str| {
        let path = dir.join("target.toml");
        std::fs::write(&path, text).unwrap();
        target(&["--print-config", "--allow-any-host", "--admin-socket", "none", "--config", path.to_str().unwrap()])
    };
    let o = config("keepalive_timeout = \"30s\"\nopen_timeout = 5\n");
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("keepalive_timeout = \"30s\"") && text.contains("open_timeout = 5\n"), "{text}");
    let o = config("keepalive_timeout = \"4s\"\n");
    assert!(!o.status.success(), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(
        stderr(&o).contains("keepalive_timeout: 4 s is out of range: it must be between 5 s and 1 day"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);

    // rblk: --timeout with a unit is taken (then the connection fails: exit 1, not 2).
    let o = run(&["info", "rblk://127.0.0.1:9/v", "--timeout", "1500ms"]);
    assert_ne!(o.status.code(), Some(2), "{}", stderr(&o));
    usage_error(
        &run(&["info", "rblk://127.0.0.1/v", "--timeout", "2x"]),
        "\"2x\" is not a duration: unknown unit \"x\"",
    );
    usage_error(
        &run(&["attach", "rblk://127.0.0.1/v", "--ctrl-loss-tmo", "2d"]),
        "2 days is too long: it must be at most 1 day, or -1 for forever",
    );
    usage_error(
        &run(&["detach", "/dev/ublkb0", "--timeout", "0"]),
        "0 s is out of range: it must be between 1 ms and 1 day",
    );
    // rblk-bench: units and fio's spellings (the run then fails to connect: exit 1, not 2).
    let o = bench(&["rblk://127.0.0.1:9/v", "--runtime", "1", "--ramp-time", "1.5s", "--reconnect_delay", "500ms"]);
    assert_ne!(o.status.code(), Some(2), "{}", stderr(&o));
    usage_error(&bench(&["rblk://127.0.0.1/v", "--runtime", "soon"]), "\"soon\" is not a duration");
    usage_error(&bench(&["rblk://127.0.0.1/v", "--log", "x", "--log-interval", "5"]), "5 ms is out of range");
}
