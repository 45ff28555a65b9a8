//! `rblk attach` follows a grown volume (issue 44): on a kernel whose ublk driver has
//! UPDATE_SIZE (Linux 6.16 and later), the device grows at once and ext4 on it grows online.
//!
//! Not in CI (its guest runs 6.12, whose driver cannot resize a device): this file is a test
//! target with `test = false` (tests/Cargo.toml), so `cargo test` and scripts/test.sh never
//! build or run it; scripts/kernel-rxe.sh names it (`scripts/kernel-rxe.sh ublk_grow`), builds
//! it and runs it on trixie-backports' kernel. On a driver without UPDATE_SIZE it fails, with
//! that reason; it never skips.
//!
//! - `ext4_grows_online_on_a_grown_ublk_device`: would catch UPDATE_SIZE not sent (the device
//!   keeps 256 MiB), sent in the wrong unit (bytes as sectors: the device's size is wrong), the
//!   resize hook not heard by the device's thread, the run entry keeping the old size (a
//!   takeover would check the volume against it), `rblk info`/`discover` showing the old size,
//!   and I/O past the old end failing or landing in the wrong place (resize2fs, the files
//!   written after the grow and the checksums of all of them).
//! - `a_device_taken_over_after_a_grow_catches_up`: a server stopped (SIGSTOP) before it could
//!   hear the grow, then SIGKILLed: its successor (`rblk attach URI` again) finds the device at
//!   the old size and the volume grown, and resizes the device; killed again, the next successor
//!   agrees on the new size from the run entry. Would catch a successor that serves a grown
//!   volume on a device of the old size without resizing it, a takeover refused because the
//!   volume grew, a run entry without the new size, and data lost across either takeover.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{attach, detach, rblk_json, ublk_drv};
use rblk_tests::daemon::{bin, Daemon};
use rblk_tests::sh;

const MIB: u64 = 1 << 20;

fn admin(socket: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(bin("rblk-target"))
        .arg("admin")
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .expect("run rblk-target admin");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rblk-target admin {args:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The daemon with an admin socket and a state dir in `work`, and a RAM volume `vol` of `size`
/// added with `admin add`.
fn daemon_with(work: &std::path::Path, size: &str) -> (Daemon, PathBuf) {
    let _ = std::fs::remove_dir_all(work);
    std::fs::create_dir_all(work).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = work.join("admin.sock");
    let d = Daemon::start(
        &rblk_tests::rxe::rdma(),
        &[&format!("--admin-socket={}", socket.display()), &format!("--state-dir={}", work.join("state").display())],
    );
    admin(&socket, &["add", &format!("vol:{size}")]);
    (d, socket)
}

/// This driver must resize live devices: fails, with the reason, where it cannot.
fn update_size_required() {
    ublk_drv();
    let features = libublk::ctrl::UblkCtrl::get_features().expect("the ublk driver reports its features");
    assert!(
        features & u64::from(libublk::sys::UBLK_F_UPDATE_SIZE) != 0,
        "this kernel's ublk driver has no UPDATE_SIZE (features {features:#x}; Linux 6.16 or later has it): \
         run this test on the newer guest kernel, scripts/kernel-rxe.sh ublk_grow"
    );
}

/// The device's size in bytes, from sysfs (cheap enough to poll under TCG).
fn dev_size(dev: &str) -> u64 {
    let sectors = format!("/sys/block/{}/size", dev.trim_start_matches("/dev/"));
    std::fs::read_to_string(sectors).unwrap().trim().parse::<u64>().unwrap() << 9
}

/// The handover size in the run entry of the server `pid`.
fn entry_size(pid: u32) -> Option<u64> {
    let run_dir = std::env::var_os("RBLK_RUN_DIR").map_or_else(|| PathBuf::from("/run/rblk"), PathBuf::from);
    let text = std::fs::read_to_string(run_dir.join(format!("ublk-{pid}.json"))).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["handover"]["size"].as_u64()
}

fn getsize64(dev: &str) -> u64 {
    sh(&format!("blockdev --getsize64 {dev}")).trim().parse().expect("blockdev --getsize64 prints a number")
}

#[test]
#[ignore = "needs rxe and ublk_drv with UPDATE_SIZE: run by scripts/kernel-rxe.sh"]
fn ext4_grows_online_on_a_grown_ublk_device() {
    let started = Instant::now();
    update_size_required();
    let work = std::env::temp_dir().join(format!("rblk-ublk-grow-{}", std::process::id()));
    let (d, socket) = daemon_with(&work, "256M");
    let uri = format!("rblk://{}/vol", d.addr);
    let log = work.join("attach.log");
    let a = attach(&uri, &format!("--queues 2 --log-file {}", log.display()));
    assert_eq!(getsize64(&a.dev), 256 * MIB);

    let dir = work.join("mnt");
    let sums = work.join("sums");
    sh(&format!(
        "mkfs.ext4 -q {dev}; mkdir -p {dir}; mount {dev} {dir}
         for i in $(seq 1 12); do head -c $((8 * 1048576 + i)) /dev/urandom > {dir}/before$i; done
         (cd {dir} && sha256sum before* > {sums}); sync",
        dev = a.dev,
        dir = dir.display(),
        sums = sums.display()
    ));

    // Polled in sysfs (a blockdev process per poll costs 0.1 s or more under TCG), then
    // checked with blockdev.
    let dev_size = || dev_size(&a.dev);
    let asked = Instant::now();
    admin(&socket, &["resize", "vol", "1280M"]);
    let answered = asked.elapsed();
    let mut size = dev_size();
    while size != 1280 * MIB && asked.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
        size = dev_size();
    }
    let seen = asked.elapsed();
    assert_eq!(size, 1280 * MIB, "{} still has {size} bytes {seen:?} after the resize", a.dev);
    assert_eq!(getsize64(&a.dev), 1280 * MIB);
    // For the note, past libtest's capture (which takes eprintln!'s output of a passing test).
    let _ = writeln!(
        std::io::stderr(),
        "ublk grow: `rblk-target admin resize` answered after {answered:?} (its process start included); \
         the device had 1280 MiB after {seen:?}"
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    let line = format!("rblk: volume grew to 1280 MiB; {} follows: 1280 MiB", a.dev);
    assert!(said.contains(&line), "the attach log lacks {line:?}: {said}");

    // The run entry: a takeover checks the volume against the grown size.
    assert_eq!(entry_size(a.pid), Some(1280 * MIB));
    // rblk info and discover open fresh sessions: they show the new size.
    assert_eq!(rblk_json(&["info", &uri, "-o", "json"])["size"].as_u64(), Some(1280 * MIB));
    let listed = rblk_json(&["discover", &format!("rblk://{}", d.addr), "-o", "json"]);
    let vol = listed.as_array().and_then(|v| v.iter().find(|v| v["name"] == "vol")).expect("discover lists vol");
    assert_eq!(vol["size"].as_u64(), Some(1280 * MIB), "{listed}");

    // ext4 grows online and takes files past the old end (288 MiB in all: more than the old
    // 256 MiB); everything reads back.
    sh(&format!(
        "resize2fs {dev}
         test $(df --output=size -B1M {dir} | tail -1) -gt 1000
         for i in $(seq 1 24); do head -c $((8 * 1048576 + i)) /dev/urandom > {dir}/after$i; done
         (cd {dir} && sha256sum after* >> {sums}); sync
         umount {dir}; echo 3 > /proc/sys/vm/drop_caches
         mount {dev} {dir}; (cd {dir} && sha256sum --check --quiet {sums})
         test $(ls {dir}/before* {dir}/after* | wc -l) = 36 && test $(wc -l < {sums}) = 36
         umount {dir}; e2fsck -fn {dev}",
        dev = a.dev,
        dir = dir.display(),
        sums = sums.display()
    ));
    detach(&a.dev);
    let status = d.stop();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&work);
    let _ = writeln!(std::io::stderr(), "ublk grow test: {:?}", started.elapsed());
}

#[test]
#[ignore = "needs rxe and ublk_drv with UPDATE_SIZE: run by scripts/kernel-rxe.sh"]
fn a_device_taken_over_after_a_grow_catches_up() {
    update_size_required();
    let work = std::env::temp_dir().join(format!("rblk-ublk-grow-takeover-{}", std::process::id()));
    let (d, socket) = daemon_with(&work, "64M");
    let uri = format!("rblk://{}/vol", d.addr);
    let a = attach(&uri, "");
    let (head, tail) = (work.join("head"), work.join("tail"));
    sh(&format!(
        "head -c 1M /dev/urandom > {head}; dd if={head} of={dev} bs=1M oflag=direct status=none",
        head = head.display(),
        dev = a.dev
    ));
    // Stopped, the server cannot hear the grow; killed, it never will.
    sh(&format!("kill -STOP {}", a.pid));
    admin(&socket, &["resize", "vol", "96M"]);
    sh(&format!("kill -KILL {}", a.pid));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(dev_size(&a.dev), 64 * MIB, "nobody resized the device yet");
    let b = attach(&uri, "");
    assert_eq!(b.dev, a.dev, "the device is taken over, not a new one made");
    let start = Instant::now();
    while dev_size(&b.dev) != 96 * MIB && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(dev_size(&b.dev), 96 * MIB, "the successor did not resize the device");
    let deadline = Instant::now() + Duration::from_secs(5);
    while entry_size(b.pid) != Some(96 * MIB) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(entry_size(b.pid), Some(96 * MIB), "the successor's run entry");
    sh(&format!(
        "dd if={dev} bs=1M count=1 iflag=direct status=none | cmp - {head}
         head -c 1M /dev/urandom > {tail}; dd if={tail} of={dev} bs=1M seek=95 oflag=direct status=none",
        head = head.display(),
        tail = tail.display(),
        dev = b.dev
    ));
    // Killed after the grow: the next successor agrees on the size.
    sh(&format!("kill -KILL {}", b.pid));
    std::thread::sleep(Duration::from_millis(200));
    let c = attach(&uri, "");
    assert_eq!(c.dev, a.dev);
    assert_eq!(dev_size(&c.dev), 96 * MIB);
    assert_eq!(entry_size(c.pid), Some(96 * MIB));
    sh(&format!(
        "dd if={dev} bs=1M count=1 iflag=direct status=none | cmp - {head}
         dd if={dev} bs=1M skip=95 count=1 iflag=direct status=none | cmp - {tail}",
        head = head.display(),
        tail = tail.display(),
        dev = c.dev
    ));
    detach(&c.dev);
    let status = d.stop();
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&work);
}
