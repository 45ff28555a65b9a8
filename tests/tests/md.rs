//! Linux md over `rblk attach` devices of two targets, over rxe in the guest: a mirror that
//! loses a target and gets it back, and a stripe whose legs hold the data where md puts it.
//! Each target is its own `rblk-target` process on its own port of the rxe address, with a
//! durable volume on the scratch disk.
//!
//! What each would catch:
//! - `a_mirror_degrades_on_a_killed_target_and_re_adds_with_a_bitmap_resync`: fast_io_fail_tmo
//!   on the ublk path (without it the killed leg's I/O waits for the target and md never fails
//!   the leg: the degrade deadline fails), writes that fail instead of reaching the surviving leg
//!   (fio's errors and verify, e2fsck), a reconnect that does not bring the same device back or
//!   whose first FLUSH fails although the loss was reported by EIO (`mdadm --re-add` writes the
//!   superblock with FLUSH/FUA and fails), and a resync of more than the bitmap marks (the writes
//!   to the re-added leg are counted). The `check` pass catches legs that differ.
//! - `a_stripe_puts_each_chunk_on_its_leg_at_md_s_offset`: data written through the RAID0 array
//!   must be on the leg and at the offset md's layout (chunk size, data offset) says, read with
//!   `rblk read` of each leg's volume.
//!
//! The arrays, the mount and the devices are removed by guards, also when a test fails, so the
//! later tests of the guest find no md array holding a ublk device.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rblk_tests::blockdev::{attach, fio, fio_errors, rblk, ublk_drv, wait_child, Attached};
use rblk_tests::daemon::Daemon;
use rblk_tests::rxe::rdma;
use rblk_tests::{scratch, sh};

const MIB: u64 = 1 << 20;
/// Seconds without a connection before a leg's I/O fails.
const FAST_IO_FAIL_TMO: u64 = 3;

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs a command for a guard's cleanup: never panics (a guard may run while a test unwinds).
fn quietly(program: &str, args: &[&str]) {
    let _ = Command::new(program).args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

/// An attached leg, detached on drop.
struct Leg {
    a: Attached,
    /// `ublkbN`: its name under /sys/block and in md's `dev-NAME`.
    name: String,
    uri: String,
}

impl Leg {
    fn attach(uri: String, extra: &str) -> Leg {
        let a = attach(&uri, extra);
        let name = a.dev.trim_start_matches("/dev/").to_owned();
        Leg { a, name, uri }
    }

    /// Sectors written to the device so far (field 7 of /sys/block/NAME/stat).
    fn sectors_written(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/sys/block/{}/stat", self.name)).unwrap();
        stat.split_whitespace().nth(6).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("stat {stat:?}"))
    }
}

impl Drop for Leg {
    /// Detaches, retrying while the device is still held (md releasing it): a leg left attached
    /// would break the ublk tests that run after these in the same boot.
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = Command::new(rblk()).args(["detach", &self.a.dev]).stdin(Stdio::null()).output();
            if !std::path::Path::new(&self.a.dev).exists() {
                return;
            }
            if Instant::now() > deadline {
                let why = out.map(|o| String::from_utf8_lossy(&o.stderr).into_owned()).unwrap_or_default();
                eprintln!("md.rs: {} is still attached after 20 s: {why}", self.a.dev);
                return;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// An md array, stopped on drop, its legs' superblocks wiped (nothing may assemble it again
/// from them later in the boot).
struct Md {
    dev: String,
    sys: String,
    legs: Vec<String>,
}

impl Md {
    fn create(name: &str, options: &str, legs: &[&Leg]) -> Md {
        let dev = format!("/dev/{name}");
        let devs: Vec<&str> = legs.iter().map(|l| l.a.dev.as_str()).collect();
        sh("modprobe -a raid0 raid1");
        sh(&format!(
            "mdadm --create {dev} --run --metadata=1.2 {options} --raid-devices={} {}",
            devs.len(),
            devs.join(" ")
        ));
        Md { dev, sys: format!("/sys/block/{name}/md"), legs: devs.iter().map(|d| (*d).to_owned()).collect() }
    }

    fn attr(&self, name: &str) -> String {
        std::fs::read_to_string(format!("{}/{name}", self.sys)).unwrap_or_default().trim().to_owned()
    }

    /// The state of `leg` in the array ("" once removed).
    fn leg_state(&self, leg: &Leg) -> String {
        self.attr(&format!("dev-{}/state", leg.name))
    }

    /// Waits (at most `limit`) until no resync, recovery or check runs; how long it took.
    fn wait_idle(&self, limit: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let action = self.attr("sync_action");
            if action == "idle" && self.attr("sync_completed") == "none" {
                return t0.elapsed();
            }
            assert!(t0.elapsed() < limit, "{} still runs {action} after {limit:?}: {}", self.dev, mdstat());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Md {
    fn drop(&mut self) {
        quietly("mdadm", &["--stop", &self.dev]);
        for leg in &self.legs {
            quietly("mdadm", &["--zero-superblock", leg]);
        }
    }
}

fn mdstat() -> String {
    std::fs::read_to_string("/proc/mdstat").unwrap_or_default()
}

/// A target with a fresh durable volume `v` of `size` on the scratch disk.
fn target(tag: &str, size: u64) -> (Daemon, Vec<String>) {
    let a = scratch::durable("v", size, &format!("md-{tag}"));
    (Daemon::start(&rdma(), &args(&a)), a)
}

/// Removes the test's backing files and state directories from the scratch disk when the test
/// ends (pass or fail): the disk is shared with the other durability tests of the boot.
struct ScratchFiles(&'static [&'static str]);

impl Drop for ScratchFiles {
    fn drop(&mut self) {
        let dir = scratch::dir();
        for tag in self.0 {
            let _ = std::fs::remove_file(dir.join(format!("md-{tag}.img")));
            let _ = std::fs::remove_dir_all(dir.join(format!("md-{tag}.state")));
        }
    }
}

fn uri(d: &Daemon) -> String {
    format!("rblk://{}/v", d.addr)
}

/// `(bits, dirty bits, bytes a bit covers)` of the write-intent bitmap on `dev` (`mdadm -X`).
fn bitmap_dirty(dev: &str) -> (u64, u64, u64) {
    // md writes the bitmap around the page cache: drop what an earlier read left there.
    let out = sh(&format!("blockdev --flushbufs {dev}; mdadm -X {dev}"));
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|rest| rest.trim_start().strip_prefix(':'))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {key} in mdadm -X: {out}"))
            .to_owned()
    };
    // "Bitmap : 128 bits (chunks), 12 dirty (9.4%)"; "Chunksize : 1 MB"
    let bitmap = field("Bitmap");
    let words: Vec<&str> = bitmap.split_whitespace().collect();
    let bits = words[0].parse().unwrap_or_else(|_| panic!("bitmap {bitmap:?}"));
    let dirty = words[3].parse().unwrap_or_else(|_| panic!("bitmap {bitmap:?}"));
    let chunk = field("Chunksize");
    let (n, unit) = chunk.split_once(' ').unwrap_or_else(|| panic!("chunk size {chunk:?}"));
    let unit = match unit {
        "KB" => 1 << 10,
        "MB" => MIB,
        "GB" => 1 << 30,
        _ => panic!("chunk size {chunk:?}"),
    };
    (bits, dirty, n.parse::<u64>().unwrap() * unit)
}

/// A running fio, killed on drop (a failed test must not leave it holding the mount).
struct Job(std::process::Child);

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A mount point, unmounted on drop (before the array it is on is stopped).
struct Mount(String);

impl Drop for Mount {
    fn drop(&mut self) {
        quietly("umount", &[&self.0]);
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_mirror_degrades_on_a_killed_target_and_re_adds_with_a_bitmap_resync() {
    ublk_drv();
    let _files = ScratchFiles(&["mirror-a", "mirror-b"]);
    let size = 128 * MIB;
    let (da, _) = target("mirror-a", size);
    let (db, b_args) = target("mirror-b", size);
    let addr_b = db.addr;
    let log = format!("/tmp/rblk-md-mirror-{}.log", std::process::id());
    let _ = std::fs::remove_file(&log);
    let extra = format!("--reconnect-delay 1 --fast-io-fail-tmo {FAST_IO_FAIL_TMO} --ctrl-loss-tmo 300");
    let a = Leg::attach(uri(&da), &extra);
    let b = Leg::attach(uri(&db), &format!("{extra} --log-file {log}"));
    // Fresh volumes read as zeroes on both legs: nothing to sync at the start. A 1 MiB bitmap
    // chunk, so that the bitmap tells regions apart on a small volume.
    let md = Md::create("md100", "--level=1 --assume-clean --bitmap=internal --bitmap-chunk=1M", &[&a, &b]);
    let dir = format!("/tmp/rblk-md-{}", std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    // Inode tables and journal written now: no lazy init writing in the background later.
    sh(&format!("mkfs.ext4 -q -E lazy_itable_init=0,lazy_journal_init=0 {dev}; mount {dev} {dir}", dev = md.dev));
    let mnt = Mount(dir.clone());
    // 16 MiB of paced random writes (300/s, ~14 s), every block verified at the end.
    let file = format!("{dir}/fio");
    let mut job = Job(fio(
        &file,
        &[
            "--size=16M",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=8",
            "--rate_iops=,300",
            "--verify=crc32c",
            "--verify_fatal=1",
            "--do_verify=1",
        ],
    ));
    std::thread::sleep(Duration::from_secs(4));
    assert!(job.0.try_wait().unwrap().is_none(), "fio ended before the kill");
    let t0 = Instant::now();
    assert!(!db.kill().success());
    // md marks the leg faulty once its writes fail: fast_io_fail_tmo after the loss.
    let deadline = Duration::from_secs(FAST_IO_FAIL_TMO + 7);
    while !md.leg_state(&b).contains("faulty") {
        assert!(
            t0.elapsed() < deadline,
            "md did not fail the killed leg within {deadline:?} (state {:?}): {}",
            md.leg_state(&b),
            mdstat()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let degraded_after = t0.elapsed();
    eprintln!(
        "md: SIGKILL of a target to its leg faulty in md: {degraded_after:?} (fast_io_fail_tmo {FAST_IO_FAIL_TMO} s)"
    );
    assert_eq!(md.attr("degraded"), "1", "{}", mdstat());
    // fio goes on on the surviving leg and finishes without an error.
    let out = wait_child(&mut job.0, Duration::from_secs(180), "fio");
    let terse = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "fio failed: {terse}");
    assert_eq!(fio_errors(&terse), 0, "fio reported errors: {terse}");
    drop(mnt);
    sh(&format!("e2fsck -fn {}", md.dev));

    // The target comes back; the session reconnects on its own, to the same device.
    let db = Daemon::start_at(addr_b, &args(&b_args));
    let t = Instant::now();
    while !std::fs::read_to_string(&log).unwrap_or_default().contains("reconnected after") {
        assert!(t.elapsed() < Duration::from_secs(60), "the leg did not reconnect: {log}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (bits, dirty, chunk) = bitmap_dirty(&a.a.dev);
    assert!(dirty > 0, "writes while degraded left no dirty bit in the bitmap");
    let written = b.sectors_written();
    let t = Instant::now();
    sh(&format!("mdadm {dev} --remove {leg}; mdadm {dev} --re-add {leg}", dev = md.dev, leg = b.a.dev));
    // Recovery starts asynchronously: wait until the leg is in the array again, then for idle.
    while md.attr("degraded") != "0" {
        assert!(t.elapsed() < Duration::from_secs(120), "the re-added leg did not recover: {}", mdstat());
        std::thread::sleep(Duration::from_millis(50));
    }
    let resync = t.elapsed() + md.wait_idle(Duration::from_secs(60));
    let resynced = (b.sectors_written() - written) * 512;
    eprintln!(
        "md: re-add resynced {resynced} bytes ({} MiB) to the leg in {resync:?}; the bitmap had {dirty} of {bits} \
         chunks of {} KiB dirty; {}",
        resynced / MIB,
        chunk >> 10,
        mdstat()
    );
    assert!(md.leg_state(&b).contains("in_sync"), "the re-added leg is in sync: {}", md.leg_state(&b));
    // Only the dirty chunks (plus the superblock and bitmap updates), far less than the leg.
    assert!(resynced <= dirty * chunk + MIB, "resynced {resynced} bytes for {dirty} dirty chunks of {chunk}");
    assert!(dirty * 2 < bits && resynced < size / 2, "the resync covered most of the leg ({resynced} bytes)");
    // "active" until md's safe mode delay passes without writes.
    let t = Instant::now();
    while md.attr("array_state") != "clean" {
        assert!(t.elapsed() < Duration::from_secs(10), "the array is {}: {}", md.attr("array_state"), mdstat());
        std::thread::sleep(Duration::from_millis(100));
    }

    // Both legs hold the same data.
    let t = Instant::now();
    std::fs::write(format!("{}/sync_action", md.sys), "check").unwrap();
    let _ = Command::new("mdadm").args(["--wait", &md.dev]).status();
    md.wait_idle(Duration::from_secs(120));
    let mismatches = md.attr("mismatch_cnt");
    eprintln!("md: check pass in {:?}: mismatch_cnt {mismatches}", t.elapsed());
    assert_eq!(mismatches, "0", "the legs differ after the resync");
    sh(&format!("e2fsck -fn {}", md.dev));
    drop(md);
    drop((a, b));
    drop((da, db));
}

#[test]
#[ignore = "needs rxe: run in the guest by scripts/test.sh"]
fn a_stripe_puts_each_chunk_on_its_leg_at_md_s_offset() {
    ublk_drv();
    let _files = ScratchFiles(&["stripe-a", "stripe-b"]);
    let (da, _) = target("stripe-a", 64 * MIB);
    let (db, _) = target("stripe-b", 64 * MIB);
    let legs = [Leg::attach(uri(&da), ""), Leg::attach(uri(&db), "")];
    let md = Md::create("md101", "--level=0 --chunk=64K", &[&legs[0], &legs[1]]);
    let chunk: u64 = md.attr("chunk_size").parse().unwrap();
    assert_eq!(chunk, 64 << 10);
    // Each leg's slot in the array and where md's data starts on it (sectors).
    let layout: Vec<(u64, u64)> = legs
        .iter()
        .map(|l| {
            let slot = md.attr(&format!("dev-{}/slot", l.name)).parse().unwrap();
            let offset: u64 = md.attr(&format!("dev-{}/offset", l.name)).parse().unwrap();
            (slot, offset * 512)
        })
        .collect();
    eprintln!("md: stripe legs (slot, data offset): {layout:?}");
    let tmp = format!("/tmp/rblk-md-stripe-{}", std::process::id());
    // Chunks 0, 1, 5 and 10 of the array, each its own random bytes, through the array.
    let chunks = [0u64, 1, 5, 10];
    for k in chunks {
        sh(&format!(
            "head -c {chunk} /dev/urandom > {tmp}-{k}; dd if={tmp}-{k} of={dev} bs={chunk} seek={k} oflag=direct \
             conv=fsync status=none",
            dev = md.dev
        ));
    }
    // Chunk k is on the leg in slot k % 2, at its data offset plus (k / 2) chunks.
    for k in chunks {
        let (leg, &(_, data_offset)) =
            legs.iter().zip(&layout).find(|(_, (slot, _))| *slot == k % 2).expect("a leg in each slot");
        let at = data_offset + k / 2 * chunk;
        sh(&format!(
            "{r} read {u} --offset {at} --length {chunk} --output {tmp}-back; cmp {tmp}-{k} {tmp}-back",
            r = rblk(),
            u = leg.uri
        ));
    }
    sh(&format!("rm -f {tmp}-*"));
    assert!(!Path::new(&format!("{tmp}-0")).exists());
    drop(md);
    drop(legs);
    drop((da, db));
}
