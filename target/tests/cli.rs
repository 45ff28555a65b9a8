//! The daemon's command line on a host without RDMA (this machine's kernel has none).

use std::process::Command;

#[test]
fn without_rdma_it_exits_non_zero_saying_no_device() {
    if !rblk_fabric::list_devices().unwrap().is_empty() {
        // On an RDMA host this test would start a real daemon; it belongs to RDMA-less hosts.
        panic!("this host has RDMA devices; run this test where there are none (CI host)");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no RDMA device found"), "stderr: {stderr}");
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).args(["--volume", "v:12345"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("multiple of 4096"), "stderr: {stderr}");
}

#[test]
fn help_explains_each_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--listen", "--device", "--volume", "--key-file", "--state-dir"] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn print_config_shows_the_state_dir() {
    let print = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rblk-target")).arg("--print-config").args(args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(print(&[]).contains("state_dir = \"/var/lib/rblk\""), "the default is shown");
    assert!(print(&["--state-dir", "/srv/rblk-state"]).contains("state_dir = \"/srv/rblk-state\""));
}
