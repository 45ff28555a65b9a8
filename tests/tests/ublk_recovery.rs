//! ublk user recovery over rxe in the guest: the block device outlives its serving process.
//! `rblk attach` makes devices with UBLK_F_USER_RECOVERY(_REISSUE); when its process dies the
//! kernel keeps the device and holds its requests, and `rblk attach URI` again takes it over.
//!
//! What each would catch:
//! - `a_killed_server_is_taken_over_and_fio_on_ext4_sees_no_error`: the recovery itself (flags,
//!   START/END_USER_RECOVERY, the run entry's handover, the session resumed). Without it fio
//!   fails at the SIGKILL (the device dies with its server, as before) or the second attach makes
//!   a new device and ext4 is gone.
//! - `a_ram_volume_lost_across_a_target_restart_is_never_served_as_zeros`: the reconnect rules
//!   applied to the successor. Without them the successor serves the new, empty instance and
//!   ext4's blocks read back as zeros.
//! - `a_server_killed_mid_flush_loses_nothing_synced_across_a_target_crash`: the successor's
//!   first FLUSH covers the whole volume. Without that, the writes its predecessor completed
//!   and had not flushed are in no FLUSH the target ever gets (the successor knows nothing of
//!   them), `sync` says OK, and a target crash loses them.
//! - `with_the_target_down_waiting_io_fails_after_ctrl_loss_tmo_not_before`: the successor
//!   bounds its attempts by the predecessor's `--ctrl-loss-tmo`, and then removes the device.
//!
//! The guest kernel must have ublk_drv with user recovery (6.0 and later): on a kernel without
//! it every test here fails with that reason; none skips.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{self, attach, detach, fio_errors, rblk, ublk_drv};
use rblk_tests::daemon::Daemon;
use rblk_tests::rxe::rdma;
use rblk_tests::{scratch, sh};

const MIB: u64 = 1 << 20;

/// scripts/lib/test_recovery.py: the unit tests of scripts/takeover-rxe.sh's stage breakdown
/// (the attach's and target's log stamps, the trace tied to Unix time by its marker, fio's
/// completions), on recorded lines.
#[test]
fn the_takeover_scripts_analysis() {
    rblk_tests::python_unittest("test_recovery");
}

fn uri(d: &Daemon, vol: &str) -> String {
    format!("rblk://{}/{vol}", d.addr)
}

/// fio's longest write latency (submission to completion) in its terse (v3) output, in ms (field
/// 80): the longest a write waited, across the kill and the takeover.
fn write_lat_max_ms(terse: &str) -> f64 {
    let line = terse.lines().rev().find(|l| l.split(';').count() > 80).expect("terse line");
    let us: f64 = line.split(';').nth(79).and_then(|f| f.parse().ok()).expect("write lat max");
    us / 1000.0
}

/// `rblk attach URI` without --daemon's parsing: its output and whether it succeeded.
fn try_attach(uri: &str, extra: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", &format!("{} attach {uri} --daemon {extra} 2>&1", rblk())])
        .output()
        .expect("run rblk attach");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_killed_server_is_taken_over_and_fio_on_ext4_sees_no_error() {
    ublk_drv();
    let rdma = rdma();
    let args = scratch::durable("d", 256 * MIB, "recovery");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start(&rdma, &args);
    let a = attach(&uri(&d, "d"), "");
    let mnt = scratch::dir().join("recovery-mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    sh(&format!("mkfs.ext4 -q -F {} && mount {} {}", a.dev, a.dev, mnt.display()));
    // Writes with fsyncs (FLUSHes inside the kill window), then reads everything back.
    let file = mnt.join("f");
    let mut fio = blockdev::fio(
        &file.display().to_string(),
        &["--rw=randwrite", "--bs=4k", "--iodepth=8", "--size=12M", "--verify=crc32c", "--fsync=16"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert!(fio.try_wait().unwrap().is_none(), "fio ended before the kill: give it more to write");
    sh(&format!("kill -KILL {}", a.pid));
    let killed = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    assert!(Path::new(&a.dev).exists(), "the device outlives its server");
    let b = attach(&uri(&d, "d"), "");
    let took = killed.elapsed();
    assert_eq!(b.dev, a.dev, "the same device is taken over, not a new one made");
    assert_ne!(b.pid, a.pid);
    let out = blockdev::wait_child(&mut fio, Duration::from_secs(240), "fio across the takeover");
    let terse = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed: {terse}");
    assert_eq!(fio_errors(&terse), 0, "{terse}");
    let gap = write_lat_max_ms(&terse);
    println!(
        "takeover: attach returned {:.0} ms after the SIGKILL; longest write wait {gap:.0} ms",
        took.as_secs_f64() * 1e3
    );
    sh(&format!("umount {}", mnt.display()));
    let fsck = Command::new("e2fsck").args(["-fn", &a.dev]).output().unwrap();
    assert!(fsck.status.success(), "e2fsck after the takeover: {}", String::from_utf8_lossy(&fsck.stdout));
    let list = sh(&format!("{} list -o json", rblk()));
    let listed: serde_json::Value = serde_json::from_str(&list).unwrap();
    let states: Vec<_> = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["device"] == a.dev.as_str())
        .map(|e| e["state"].clone())
        .collect();
    assert_eq!(states, ["serving"], "one entry for the device, its successor's: {list}");
    detach(&a.dev);
    assert!(!Path::new(&a.dev).exists());
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_ram_volume_lost_across_a_target_restart_is_never_served_as_zeros() {
    ublk_drv();
    let rdma = rdma();
    let d = Daemon::start(&rdma, &["--volume", "r:16M"]);
    let addr = d.addr;
    let a = attach(&uri(&d, "r"), "");
    sh(&format!("head -c 1M /dev/urandom | dd of={} bs=1M oflag=direct status=none", a.dev));
    sh(&format!("kill -KILL {}", a.pid));
    // A reader that waits on the device while it has no server.
    let mut reader = Command::new("dd")
        .args([&format!("if={}", a.dev), "of=/dev/null", "bs=4k", "count=256", "iflag=direct", "status=none"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(d.kill().code() != Some(0));
    let d = Daemon::start_at(addr, &["--volume", "r:16M"]);
    let (ok, out) = try_attach(&uri(&d, "r"), "");
    assert!(!ok, "a successor must not serve a RAM volume's new instance: {out}");
    assert!(out.contains("volume contents lost"), "{out}");
    let status = blockdev::wait_child(&mut reader, Duration::from_secs(30), "the waiting reader").status;
    assert!(!status.success(), "the waiting read failed instead of reading the new volume's zeros");
    assert!(!Path::new(&a.dev).exists(), "the device is removed");
    let list = sh(&format!("{} list -o json", rblk()));
    assert!(list.contains("contents lost"), "rblk list shows why: {list}");
    drop(d);
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn with_the_target_down_waiting_io_fails_after_ctrl_loss_tmo_not_before() {
    ublk_drv();
    let rdma = rdma();
    let d = Daemon::start(&rdma, &["--volume", "w:16M"]);
    let u = uri(&d, "w");
    let a = attach(&u, "--ctrl-loss-tmo 10 --reconnect-delay 1");
    sh(&format!("kill -KILL {}", a.pid));
    let mut reader = Command::new("dd")
        .args([&format!("if={}", a.dev), "of=/dev/null", "bs=4k", "count=1", "iflag=direct", "status=none"])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(d.kill().code() != Some(0));
    let started = Instant::now();
    let (ok, out) = try_attach(&u, "");
    let took = started.elapsed();
    assert!(!ok, "{out}");
    assert!(out.contains("ctrl-loss-tmo"), "{out}");
    assert!(took >= Duration::from_secs(10), "gave up after {took:?}, before ctrl-loss-tmo");
    let status = blockdev::wait_child(&mut reader, Duration::from_secs(20), "the waiting reader").status;
    assert!(!status.success(), "the waiting read fails once the successor gives up");
    assert!(started.elapsed() >= Duration::from_secs(10), "the read failed before ctrl-loss-tmo");
    assert!(!Path::new(&a.dev).exists(), "the device is removed");
}

/// `rblk read` of `len` bytes at `offset` of `uri`.
fn read_back(uri: &str, offset: u64, len: u64) -> Vec<u8> {
    let out = Command::new(rblk())
        .args(["read", uri, "--offset", &offset.to_string(), "--length", &len.to_string()])
        .output()
        .expect("rblk read");
    assert!(out.status.success(), "rblk read: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_server_killed_mid_flush_loses_nothing_synced_across_a_target_crash() {
    ublk_drv();
    let rdma = rdma();
    // Each write to the backing device takes 2 s: a FLUSH's write-back is still running when
    // the server is killed. (700 ms was too little under TCG: once in a CI run, the `dd` of R1,
    // an exec over 9p and a 1 MiB write through ublk, outlasted the FLUSH.)
    let disk = scratch::SlowDisk::new("midflush", 8 * MIB, 2000);
    let state = scratch::dir().join("midflush.state");
    let _ = std::fs::remove_dir_all(&state);
    let spec = format!("m:{}:{}", 8 * MIB, disk.path.display());
    let args = ["--volume", spec.as_str(), "--state-dir", state.to_str().unwrap()];
    let d = Daemon::start(&rdma, &args);
    let (addr, u) = (d.addr, uri(&d, "m"));
    let a = attach(&u, "");
    let write = |offset_mib: u64, seed: &str| {
        sh(&format!(
            "dd if=<(yes {seed}) of={} bs=1M count=1 iflag=fullblock seek={offset_mib} oflag=direct status=none",
            a.dev
        ));
    };
    write(0, "r0");
    // FLUSH of R0: its write-back is slow.
    let mut first_sync = Command::new("sync").arg(&a.dev).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // R1 completes while that FLUSH runs: dirty in the server only, in no FLUSH yet.
    write(2, "r1");
    assert!(first_sync.try_wait().unwrap().is_none(), "the FLUSH ended before the kill: the disk is not slow enough");
    sh(&format!("kill -KILL {}", a.pid));
    let b = attach(&u, "");
    assert_eq!(b.dev, a.dev);
    let s1 = blockdev::wait_child(&mut first_sync, Duration::from_secs(60), "the re-issued FLUSH").status;
    assert!(s1.success(), "the FLUSH in flight at the kill fails: {s1}");
    // What the filesystem would do next: FLUSH again for what it wrote since (R1).
    sh(&format!("sync {}", a.dev));
    // The target crashes (no write-back at stop): only what FLUSHes wrote back is on the disk.
    assert!(d.kill().code() != Some(0));
    let d = Daemon::start_at(addr, &args);
    let r0 = read_back(&u, 0, MIB);
    let r1 = read_back(&u, 2 * MIB, MIB);
    assert!(r0.starts_with(b"r0\nr0\n"), "R0 lost: {:?}", &r0[..16]);
    assert!(r1.starts_with(b"r1\nr1\n"), "R1, synced after the takeover, lost: {:?}", &r1[..16]);
    sh(&format!("{} detach {}", rblk(), a.dev));
    drop(d);
}
