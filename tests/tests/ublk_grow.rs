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

use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{attach, detach, rblk, ublk_drv};
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

fn getsize64(dev: &str) -> u64 {
    sh(&format!("blockdev --getsize64 {dev}")).trim().parse().expect("blockdev --getsize64 prints a number")
}

/// The rblk client's JSON output of `args`.
fn rblk_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(rblk()).args(args).output().expect("run rblk");
    assert!(out.status.success(), "rblk {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("rblk {args:?} -o json: {e}"))
}

#[test]
#[ignore = "needs rxe and ublk_drv with UPDATE_SIZE: run by scripts/kernel-rxe.sh"]
fn ext4_grows_online_on_a_grown_ublk_device() {
    let started = Instant::now();
    ublk_drv();
    let features = libublk::ctrl::UblkCtrl::get_features().expect("the ublk driver reports its features");
    assert!(
        features & u64::from(libublk::sys::UBLK_F_UPDATE_SIZE) != 0,
        "this kernel's ublk driver has no UPDATE_SIZE (features {features:#x}; Linux 6.16 or later has it): \
         run this test on the newer guest kernel, scripts/kernel-rxe.sh ublk_grow"
    );
    let work = std::env::temp_dir().join(format!("rblk-ublk-grow-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o700)).unwrap();
    let socket = work.join("admin.sock");
    let d = Daemon::start(
        &rblk_tests::rxe::rdma(),
        &[&format!("--admin-socket={}", socket.display()), &format!("--state-dir={}", work.join("state").display())],
    );
    admin(&socket, &["add", "vol:256M"]);
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
    let sectors = format!("/sys/block/{}/size", a.dev.trim_start_matches("/dev/"));
    let dev_size = || std::fs::read_to_string(&sectors).unwrap().trim().parse::<u64>().unwrap() << 9;
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
    let run_dir = std::env::var_os("RBLK_RUN_DIR").map_or_else(|| PathBuf::from("/run/rblk"), PathBuf::from);
    let entry = run_dir.join(format!("ublk-{}.json", a.pid));
    let entry: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&entry).unwrap()).unwrap();
    assert_eq!(entry["handover"]["size"].as_u64(), Some(1280 * MIB), "{entry}");
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
